#!/usr/bin/env bash
# eval_quality.sh - held-out perplexity and readable-English rate of the trained model per GGUF
# type (docs/TRAINED_MODEL.md, "Evaluation"). CPU only; runs here.
#   bash tools/train/eval_quality.sh [-o TABLE.md] HFDIR HELDOUT.txt [EVAL_JSON]
# For each type of TYPES (default: f16 q8_0 q4_k_m mxfp4):
#   - `hotmoe convert HFDIR --type T` (WORK/demo-moe-T.gguf), its size in bytes;
#   - `hotmoe perplexity -c 512 --score-all` on HELDOUT.txt with its "<|endoftext|>" separator
#     lines made blank lines (hotmoe tokenizes the text as text: the literal separator would
#     cost several tokens the model never saw as text): non-overlapping windows of 512 tokens,
#     every token after a window's first scored, which is how tools/train/train.py's eval.json counts
#     (its windows hold the separator token instead: the token counts differ slightly);
#   - the three prompts of tools/train/prompts.txt continued by scripts/demo.sh (64 tokens, its
#     sampling settings and seed), and the share of dictionary words (tools/train/wordrate.py).
# Prints a markdown table (type, bytes, perplexity, ratio to f16, within 2 %, word rate, the
# perplexity command), then eval.json's figures when EVAL_JSON is given (the trainer's held-out
# perplexity on the GPU in bf16 autocast, and the unigram baseline on the same tokens), then the
# sample continuations. -o writes the same text to TABLE.md.
# Environment: HOTMOE_BIN (default: build/release/hotmoe, built if missing), WORK (default
# /tmp/eval_quality), TYPES, CHUNKS (at most this many windows per type: a quick look; default
# all), THREADS (default: all CPUs).
set -euo pipefail
table_out=""
if [ "${1:-}" = "-o" ]; then
  [ $# -ge 2 ] || { echo "eval_quality: -o needs a file" >&2; exit 2; }
  table_out=$(realpath -m -- "$2")
  shift 2
fi
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: bash tools/train/eval_quality.sh [-o TABLE.md] HFDIR HELDOUT.txt [EVAL_JSON]" >&2
  exit 2
fi
hf=$(realpath -- "$1")
held=$(realpath -- "$2")
evj=${3:+$(realpath -- "$3")}
[ -f "$hf/config.json" ] || { echo "eval_quality: $hf/config.json missing (not an HF folder?)" >&2; exit 1; }
[ -s "$held" ] || { echo "eval_quality: $held missing or empty" >&2; exit 1; }
[ -z "$evj" ] || [ -s "$evj" ] || { echo "eval_quality: $evj missing or empty" >&2; exit 1; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
work=${WORK:-/tmp/eval_quality}
mkdir -p "$work"
types=${TYPES:-f16 q8_0 q4_k_m mxfp4}
threads=${THREADS:-$(nproc)}
bin=${HOTMOE_BIN:+$(realpath -m -- "$HOTMOE_BIN")}
if [ -z "$bin" ]; then
  bin=$root/build/release/hotmoe
  if [ ! -x "$bin" ]; then
    echo "building $bin" >&2
    cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build/release -j"$(nproc)" --target hotmoe >/dev/null
  fi
fi
[ -x "$bin" ] || { echo "eval_quality: no hotmoe binary at $bin" >&2; exit 1; }

plain=$work/heldout-plain.txt
awk '$0 == "<|endoftext|>" { print ""; next } { print }' "$held" >"$plain"
chunks=()
[ -n "${CHUNKS:-}" ] && chunks=(--chunks "$CHUNKS")
ppl_args=(-c 512 --score-all -t "$threads" "${chunks[@]}")

out=$work/table.md
: >"$out"
say() { printf '%s\n' "$*" | tee -a "$out"; }
samples=$work/samples.md
: >"$samples"
f16_ppl=""
rows=()
for t in $types; do
  m=$work/demo-moe-$t.gguf
  "$bin" convert "$hf" -o "$m" --type "$t" -q
  bytes=$(stat -c %s "$m")
  t1=$(date +%s)
  "$bin" perplexity -m "$m" -f "$plain" "${ppl_args[@]}" >"$work/ppl-$t.out" 2>"$work/ppl-$t.err" ||
    { tail -3 "$work/ppl-$t.err" >&2; echo "eval_quality: perplexity failed for $t" >&2; exit 1; }
  ppl=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1/p' "$work/ppl-$t.out")
  err=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\2/p' "$work/ppl-$t.out")
  scored=$(sed -n 's/.* \([0-9]*\) tokens scored in .*/\1/p' "$work/ppl-$t.err")
  [ -n "$ppl" ] || { echo "eval_quality: no perplexity in $work/ppl-$t.out" >&2; exit 1; }
  [ "$t" = f16 ] && f16_ppl=$ppl
  # the three prompts as the demo continues them
  : >"$work/gen-$t.txt"
  {
    echo "### $t"
    echo
  } >>"$samples"
  while IFS= read -r p; do
    [ -n "$p" ] || continue
    g=$(DEMO_MODEL=$m DEMO_PROMPT=$p HOTMOE_BIN=$bin bash scripts/demo.sh --no-display-prompt \
      -t "$threads" 2>"$work/demo-$t.err" | sed '1,/^$/d' | tr -d '\000')
    printf '%s\n' "$g" >>"$work/gen-$t.txt"
    {
      printf '> **%s**%s\n' "$p" "$(printf '%s' "$g" | tr '\n' ' ')"
      echo
    } >>"$samples"
  done <tools/train/prompts.txt
  wr=$(python3 tools/train/wordrate.py --json "$work/gen-$t.txt" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.3f (%d/%d)" % (d["rate"], d["hits"], d["words"]))')
  rows+=("$t|$bytes|$ppl|$err|$scored|$wr|$(($(date +%s) - t1))")
  echo "$t: $bytes bytes, ppl $ppl +/- $err over $scored tokens, word rate $wr" >&2
done

say "Held-out perplexity (\`hotmoe perplexity -c 512 --score-all -t $threads${CHUNKS:+ --chunks $CHUNKS}\`, CPU," \
  "f16 KV cache) of $(basename "$held") with its separator lines blank ($(stat -c %s "$plain") bytes)," \
  "converted from $(basename "$hf") by \`hotmoe convert --type T\`; word rate: dictionary words" \
  "among the words of the three fixed prompts' continuations (scripts/demo.sh settings)."
say ""
say "| type | file bytes | perplexity | ratio to f16 | within 2 % | tokens scored | word rate | seconds |"
say "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |"
for r in "${rows[@]}"; do
  IFS='|' read -r t bytes ppl err scored wr secs <<<"$r"
  ratio=- within=-
  if [ -n "$f16_ppl" ]; then
    ratio=$(python3 -c "print('%.4f' % ($ppl / $f16_ppl))")
    within=$(python3 -c "print('yes' if $ppl / $f16_ppl <= 1.02 else 'no')")
  fi
  say "| $t | $bytes | $ppl ± $err | $ratio | $within | $scored | $wr | $secs |"
done
say ""
say "Command per type: \`hotmoe perplexity -m demo-moe-T.gguf -f heldout-plain.txt ${ppl_args[*]}\`"
if [ -n "$evj" ]; then
  say ""
  python3 - "$evj" <<'EOF' | tee -a "$out"
import json, sys
e = json.load(open(sys.argv[1]))
def g(k, f="%.4f"):
    return f % e[k] if k in e else "?"
print("The trainer's evaluation (%s: transformers on the GPU, bf16 autocast, every non-overlapping "
      "512-token window of the tokenized held-out split, %s tokens scored):" % (sys.argv[1].split("/")[-1], g("heldout_tokens", "%d")))
print("")
print("| model | loss (nats/token) | perplexity | bits per byte |")
print("| --- | ---: | ---: | ---: |")
print("| trained model (trainer) | %s | %s | %s |" % (g("heldout_loss"), g("heldout_ppl", "%.3f"), g("heldout_bits_per_byte", "%.3f")))
print("| unigram baseline (train-token frequencies, add-one) | %s | %s | %s |" % (g("unigram_loss"), g("unigram_ppl", "%.1f"), g("unigram_bits_per_byte", "%.3f")))
EOF
fi
say ""
say "Sample continuations (scripts/demo.sh settings; the prompt in bold):"
say ""
tee -a "$out" <"$samples"
if [ -n "$table_out" ]; then
  cp "$out" "$table_out"
  echo "eval_quality: written to $table_out" >&2
fi
