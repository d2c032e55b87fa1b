#!/usr/bin/env bash
# forge.sh - `hotmoe forge` as a user runs it: --list, a tiny forge with its HF copy, the
# default output names, determinism from the command line, the simulation mode, fused gate/up
# experts (--fuse-gate-up), and bad flags or presets answered with one line on stderr and exit
# code 2.
#   bash tests/cli/forge.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/forge_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

# ---- --list ----
"$bin" forge --list >"$tmp/list" 2>"$tmp/err"
expect "list: exit 0" test $? -eq 0
for p in qwen3-30b-a3b gpt-oss-20b gpt-oss-120b mixtral-8x7b olmoe-1b-7b qwen1.5-moe-a2.7b \
  tiny-qwen3moe tiny-mixtral tiny-olmoe tiny-gpt-oss tiny-qwen2moe; do
  expect "list: $p" grep -q "^$p " "$tmp/list"
done
# qwen3-30b-a3b: 30.53B parameters, 17.28 GiB as Q4_K_M (a llama.cpp file of that layout is 17.28 GiB)
expect "list: qwen3 params and q4_k_m size" grep -Eq "^qwen3-30b-a3b +qwen3moe +30.53B .* 17.28Gi" "$tmp/list"

# ---- a tiny forge, default HF copy next to it ----
(cd "$tmp" && "$bin" forge --preset tiny-olmoe --type q8_0 --seed 3 -o a.gguf 2>"$tmp/err1")
expect "forge: exit 0" test $? -eq 0
expect "forge: gguf written" test -s "$tmp/a.gguf"
expect "forge: magic" test "$(head -c 4 "$tmp/a.gguf")" = "GGUF"
for f in model.safetensors config.json tokenizer.json tokenizer_config.json generation_config.json; do
  expect "forge: hf $f" test -s "$tmp/a-hf/$f"
done
expect "forge: summary line" grep -q "wrote a.gguf: tiny-olmoe (olmoe) q8_0" "$tmp/err1"
expect "forge: config class" grep -q '"OlmoeForCausalLM"' "$tmp/a-hf/config.json"

# same seed -> same bytes; other seed -> other bytes; --no-hf; default name
(cd "$tmp" && "$bin" forge --preset tiny-olmoe --type q8_0 --seed 3 -o b.gguf --no-hf -q 2>"$tmp/err2")
expect "forge: quiet is silent" test ! -s "$tmp/err2"
expect "forge: same seed same bytes" cmp -s "$tmp/a.gguf" "$tmp/b.gguf"
expect "forge: --no-hf" test ! -e "$tmp/b-hf"
(cd "$tmp" && "$bin" forge --preset tiny-olmoe --type q8_0 --seed 4 -o c.gguf --no-hf -q)
expect "forge: other seed other bytes" test "$(cmp -s "$tmp/a.gguf" "$tmp/c.gguf"; echo $?)" = 1
(cd "$tmp" && "$bin" forge --preset tiny-gpt-oss --type mxfp4 -q --n-layer 2)
expect "forge: default name" test -s "$tmp/tiny-gpt-oss-mxfp4.gguf"
expect "forge: default hf dir" test -s "$tmp/tiny-gpt-oss-mxfp4-hf/model.safetensors"
expect "forge: override in config" grep -q '"num_hidden_layers": 2' "$tmp/tiny-gpt-oss-mxfp4-hf/config.json"

# ---- simulation ----
"$bin" forge --preset tiny-qwen3moe --skew zipf:1.5 --simulate 4,8 --sim-samples 200 >"$tmp/sim" 2>&1
expect "simulate: exit 0" test $? -eq 0
expect "simulate: two lines" test "$(grep -c 'hit rate' "$tmp/sim")" -eq 2

# ---- --fuse-gate-up: one ffn_gate_up_exps per layer instead of gate and up ----
"$bin" forge --preset tiny-gemma4moe --type q8_0 --fuse-gate-up --no-hf -q -o "$tmp/fused.gguf" 2>"$tmp/err"
expect "fused: exit 0" test $? -eq 0
"$bin" inspect "$tmp/fused.gguf" --tensors >"$tmp/fused.txt" 2>&1
expect "fused: gate_up per layer" test "$(grep -c 'ffn_gate_up_exps' "$tmp/fused.txt")" -eq 4
expect "fused: no separate up" test "$(grep -c 'ffn_up_exps' "$tmp/fused.txt")" -eq 0
rm -f "$tmp/fused.gguf"

# ---- errors: one line on stderr, exit 2 ----
err_case() {
  local d=$1 want=$2
  shift 2
  (cd "$tmp" && "$bin" forge "$@" >"$tmp/out" 2>"$tmp/err")
  local rc=$?
  expect "$d: exit 2" test $rc -eq 2
  expect "$d: one line" test "$(wc -l <"$tmp/err")" -eq 1
  expect "$d: message" grep -q -- "$want" "$tmp/err"
}
err_case "unknown preset" "unknown preset 'nope'" --preset nope
err_case "unknown type" "unknown type mix 'q3_k'" --preset tiny-olmoe --type q3_k
err_case "unknown flag" "unknown option '--bogus'" --preset tiny-olmoe --bogus
err_case "missing value" "--seed needs a value" --preset tiny-olmoe --seed
err_case "bad seed" "--seed wants" --preset tiny-olmoe --seed -5
err_case "bad skew" "--skew wants zipf:S" --preset tiny-olmoe --skew pareto:1
err_case "no preset" "--preset NAME is required" --type q8_0
err_case "bad override" "--n-expert wants an integer" --preset tiny-olmoe --n-expert 1
err_case "inconsistent override" "n_expert_used" --preset tiny-olmoe --n-expert-used 9
err_case "fused gate/up elsewhere" "--fuse-gate-up: llama.cpp reads" --preset tiny-olmoe \
  --fuse-gate-up
expect "errors wrote nothing" test ! -e "$tmp/tiny-olmoe-q4_k_m.gguf"

# unwritable output: one line, exit 1
(cd "$tmp" && "$bin" forge --preset tiny-olmoe -o /nonexistent-dir/x.gguf 2>"$tmp/err")
rc=$?
expect "unwritable: exit 1" test $rc -eq 1
expect "unwritable: one line" test "$(wc -l <"$tmp/err")" -eq 1

rm -rf "$tmp"
cli_summary
