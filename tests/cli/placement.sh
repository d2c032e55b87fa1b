#!/usr/bin/env bash
# placement.sh - the placement flags of every command that builds a context (run, chat, bench,
# perplexity, logits, learn): -ngl, -cmoe/--cpu-moe, -ncmoe/--n-cpu-moe, -ot/--override-tensor
# and --vram-budget are in --help; bad values are one line and exit 2 (the -ot errors are the
# planner's, given once the model is loaded); bench takes -ot as llama-bench (';' between
# overrides, one set per run) and prints the placement columns and JSON fields. Without a GPU
# (a build without CUDA, or no device) the flags are accepted with one line saying the GPU
# placement is ignored, the logits are the CPU's to the byte, and --gpu-strict exits 1.
# bench runs a tiered plan (-ngl 99, layer 0's experts in RAM by -ot) on either machine (its JSON
# row names the backend), and so does a partial -ngl (-ngl 3: layers 0-1 on the CPU, the rest on
# the GPU); on a GPU a plan with a later layer's attention on the host alone is refused.
#   bash tests/cli/placement.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/placement_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

one_line() { test "$(wc -l <"$1")" -eq 1; }

# ---- help ----
for cmd in run chat bench perplexity logits learn; do
  h=$("$bin" $cmd --help 2>&1)
  for flag in "-ngl, --n-gpu-layers N" "-cmoe, --cpu-moe" "-ncmoe, --n-cpu-moe N" \
    "-ot, --override-tensor REGEX=DEV" "--vram-budget MiB" "--gpu-strict"; do
    expect "$cmd --help lists $flag" grep -qF -- "$flag" <<<"$h"
  done
done

# ---- bad values: one line, exit 2 (before the model is read) ----
bad_value() { # DESCRIPTION PATTERN ARGS...
  local d=$1 pat=$2
  shift 2
  "$bin" run -m "$tmp/none.gguf" -p hi "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  expect "$d: exit 2" test $rc -eq 2
  expect "$d: one line" one_line "$tmp/err"
  expect "$d: message" grep -qF -- "$pat" "$tmp/err"
}
bad_value "--n-cpu-moe -1" "--n-cpu-moe must be >= 0" --n-cpu-moe -1
bad_value "-ncmoe x" "flag '-ncmoe' needs an integer, got 'x'" -ncmoe x
bad_value "--vram-budget 0" "--vram-budget must be >= 1 (MiB)" --vram-budget 0
bad_value "--vram-budget 8G" "flag '--vram-budget' needs an integer, got '8G'" --vram-budget 8G
bad_value "-ngl -3" "-ngl must be >= 0" -ngl -3
bad_value "-ot without value" "flag '-ot' needs a value" -ot
bad_value "--cpu-moe=1" "flag '--cpu-moe' takes no value" --cpu-moe=1

# ---- a model ----
m=$tmp/q.gguf
"$bin" forge --preset tiny-qwen3moe --type q8_0 --no-hf -q -o "$m" >/dev/null 2>&1
expect "forge" test -s "$m"

# bad -ot: the planner's message, exit 2
bad_ot() { # DESCRIPTION PATTERN OT
  "$bin" logits -m "$m" --ids 5,6 -o "$tmp/x.bin" -t 2 -ngl 99 -ot "$3" 2>"$tmp/err"
  local rc=$?
  expect "$1: exit 2" test $rc -eq 2
  expect "$1: one line" one_line "$tmp/err"
  expect "$1: message" grep -qF -- "$2" "$tmp/err"
}
bad_ot "-ot unknown device" "-ot 'x=GPU': unknown device 'GPU' (known: CPU, CUDA0)" 'x=GPU'
bad_ot "-ot bad regex" "-ot 'blk\\.(1=CPU': bad regex 'blk\\.(1'" 'blk\.(1=CPU'
bad_ot "-ot no =" "-ot 'blk': expected REGEX=DEVICE" 'a=CPU,blk'

# ---- no GPU: accepted, one line, the CPU's logits; --gpu-strict refuses ----
"$bin" logits -m "$m" --ids 5,6,7,8 -o "$tmp/cpu.bin" -t 2 2>/dev/null
expect "cpu logits" test -s "$tmp/cpu.bin"
"$bin" logits -m "$m" --ids 5,6,7,8 -o "$tmp/probe.bin" -t 2 -ngl 99 --cpu-moe 2>"$tmp/probe"
gpu_here=1
grep -q "is ignored; running on the CPU only" "$tmp/probe" && [ "${HOTMOE_EXPECT_GPU:-0}" != 1 ] && gpu_here=0
if [ $gpu_here = 0 ]; then
  run_ignored() { # DESCRIPTION FLAGS...
    local d=$1
    shift
    "$bin" logits -m "$m" --ids 5,6,7,8 -o "$tmp/f.bin" -t 2 "$@" 2>"$tmp/err"
    local rc=$?
    expect "$d: exit 0" test $rc -eq 0
    expect "$d: one line" test "$(grep -c "the GPU placement (.*) is ignored; running on the CPU only" "$tmp/err")" -eq 1
    expect "$d: the line's reason" grep -qE "GPU unavailable \((built without CUDA|no CUDA device)\)" "$tmp/err"
    expect "$d: nothing else" one_line "$tmp/err"
    expect "$d: CPU logits" cmp -s "$tmp/cpu.bin" "$tmp/f.bin"
  }
  run_ignored "-ngl 99" -ngl 99
  run_ignored "-ngl 99 --cpu-moe" -ngl 99 --cpu-moe
  run_ignored "-ngl 3 -ncmoe 2" -ngl 3 -ncmoe 2
  run_ignored "-ot twice" -ngl 99 -ot 'blk\.0\.ffn_up_exps=CPU' --override-tensor 'blk\.1\.ffn_.*_exps=CPU,blk\.2\.attn_q\.weight=CUDA0'
  expect "-ot twice: joined with ','" grep -qF -- "-ot 'blk\\.0\\.ffn_up_exps=CPU,blk\\.1\\.ffn_.*_exps=CPU,blk\\.2\\.attn_q\\.weight=CUDA0')" "$tmp/err"
  run_ignored "--vram-budget" -ngl 99 --vram-budget 8192
  expect "--vram-budget: named" grep -qF -- "(-ngl 99 --vram-budget 8192)" "$tmp/err"
  "$bin" logits -m "$m" --ids 5,6,7,8 -o "$tmp/h.bin" -t 2 -ngl 0 --cpu-moe 2>"$tmp/err"
  expect "-ngl 0 --cpu-moe: exit 0, silent" test $? -eq 0 -a ! -s "$tmp/err"
  expect "-ngl 0 --cpu-moe: CPU logits" cmp -s "$tmp/cpu.bin" "$tmp/h.bin"
  "$bin" logits -m "$m" --ids 5,6,7,8 -o "$tmp/s.bin" -t 2 -ngl 99 --cpu-moe --gpu-strict 2>"$tmp/err"
  expect "strict: exit 1" test $? -eq 1
  expect "strict: one line" one_line "$tmp/err"
  expect "strict: reason" grep -qE -- "GPU required \(--gpu-strict\) but unavailable: (built without CUDA|no CUDA device)" "$tmp/err"
  HOTMOE_LOG=debug "$bin" logits -m "$m" --ids 5,6 -o "$tmp/d.bin" -t 2 -ngl 99 -ncmoe 3 2>"$tmp/err"
  expect "debug: the report" grep -qF "hotmoe debug: placement: as asked (-ngl 99 --n-cpu-moe 3)" "$tmp/err"
  expect "debug: its experts line" grep -qF "routed experts: device slots in layers 3; host only in layers 0-2" "$tmp/err"
else
  echo "placement: a GPU runs here: the no-GPU checks are test_context_placement_gpu's"
fi

# ---- bench: llama-bench's -ot, the columns and JSON fields ----
"$bin" bench -m "$m" -p 8 -n 2 -r 1 -t 2 -ot 'a=CPU,b=CPU' >/dev/null 2>"$tmp/err"
expect "bench -ot with ',': exit 2" test $? -eq 2
expect "bench -ot with ',': says ';'" grep -qF "separate overrides with ';'" "$tmp/err"
"$bin" bench -m "$m" -p 8 -n 2 -r 1 -t 2 -ot 'a=CPU' -ot 'b=CPU' >/dev/null 2>"$tmp/err"
expect "bench -ot twice: exit 2" test $? -eq 2
"$bin" bench -m "$m" -p 8 -n 2 -r 1 -t 2 -ngl 99 -ncmoe 2 --cpu-moe \
  -ot 'blk\.0\.ffn_up_exps=CPU;blk\.1\.ffn_up_exps=CPU' >"$tmp/md" 2>"$tmp/md.err"
expect "bench md: exit 0" test $? -eq 0
expect "bench md: header" grep -qE '^\| model +\| +size \| +params \| backend +\| ngl \| n_cpu_moe \| cpu_moe \| threads \| ot +\| +test \| +t/s \|$' "$tmp/md"
expect "bench md: pp row" grep -qE '^\| qwen3moe .* \|  99 \| +2 \| +1 \| +2 \| blk\\\.0\\\.ffn_up_exps=CPU;blk\\\.1\\\.ffn_up_exps=CPU \| +pp8 \|' "$tmp/md"
# a plan that runs on a GPU too: every layer's attention there, layer 0's three expert tensors
# in RAM (the tiered plan; without a GPU the CPU runs it after the one line)
ot0='blk\.0\.ffn_(up|gate|down)_exps=CPU'
"$bin" bench -m "$m" -p 8 -n 0 -r 1 -t 2 -ngl 99 -ot "$ot0" --vram-budget 4096 -o json \
  >"$tmp/json" 2>"$tmp/json.err"
expect "bench json: exit 0" test $? -eq 0
check_json() { # FILE NGL OT BACKEND
  python3 - "$@" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
r = rows[0]
assert r["n_gpu_layers"] == int(sys.argv[2]) and r["n_cpu_moe"] == 0 and r["cpu_moe"] is False, r
assert r["tensor_buft_overrides"] == sys.argv[3], r
assert r["vram_budget_mib"] == 4096, r
assert r["backends"] == sys.argv[4], r
assert r["test"] == "pp8" and r["avg_ts"] > 0, r
EOF
}
backend=CPU
[ $gpu_here = 1 ] && backend=CUDA
expect "bench json: placement fields ($backend)" check_json "$tmp/json" 99 "$ot0" $backend
# -ngl 3 leaves layers 0-1 wholly on the host: a GPU runs that split plan (layers 0-1 on the CPU,
# the rest on the GPU; the row's backend CUDA); without one the CPU runs it after the one line and
# the row keeps -ngl 3
ot1='blk\.0\.ffn_up_exps=CPU'
"$bin" bench -m "$m" -p 8 -n 0 -r 1 -t 2 -ngl 3 -ot "$ot1" --vram-budget 4096 -o json \
  >"$tmp/json3" 2>"$tmp/json3.err"
rc=$?
if [ $gpu_here = 1 ]; then
  expect "bench -ngl 3 on a GPU: exit 0" test $rc -eq 0
  expect "bench -ngl 3 on a GPU: fields" check_json "$tmp/json3" 3 "$ot1" CUDA
  # the attention of layer 1 alone on the host (layer 0's on the GPU): refused (exit 1, what
  # to use instead, no table)
  ot2='blk\.1\.attn_q\.weight=CPU'
  "$bin" bench -m "$m" -p 8 -n 0 -r 1 -t 2 -ngl 99 -ot "$ot2" --vram-budget 4096 -o json \
    >"$tmp/json4" 2>"$tmp/json4.err"
  expect "bench -ot attn_q=CPU on a GPU: exit 1" test $? -eq 1
  expect "bench -ot attn_q=CPU on a GPU: nothing on stdout" test ! -s "$tmp/json4"
  expect "bench -ot attn_q=CPU on a GPU: the layers" grep -qF "hotmoe bench: placement -ngl 99 -ot '$ot2' --vram-budget 4096: the attention of layers 1 would run on the host" "$tmp/json4.err"
  expect "bench -ot attn_q=CPU on a GPU: what to use" grep -qF "use -ngl N alone, -ngl 99 --cpu-moe" "$tmp/json4.err"
else
  expect "bench -ngl 3 without a GPU: exit 0" test $rc -eq 0
  expect "bench -ngl 3 without a GPU: the line" grep -qF "the GPU placement (-ngl 3 -ot '$ot1' --vram-budget 4096) is ignored" "$tmp/json3.err"
  expect "bench -ngl 3 without a GPU: fields" check_json "$tmp/json3" 3 "$ot1" CPU
fi
"$bin" bench -m "$m" -p 8 -n 0 -r 1 -t 2 -o json >"$tmp/json0" 2>/dev/null
check_json0() {
  python3 - "$1" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["n_gpu_layers"] == 0 and r["tensor_buft_overrides"] == "none" and r["vram_budget_mib"] == 0, r
EOF
}
expect "bench json: defaults" check_json0 "$tmp/json0"

cli_summary placement
