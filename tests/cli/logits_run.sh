#!/usr/bin/env bash
# logits_run.sh - `hotmoe logits` and `hotmoe run` as a user runs them on a forged tiny model:
# the logits file layout of docs/LOGITS.md (magic, header length, JSON header, data at a
# multiple of 64, n_rows x n_vocab f32), .npy output, --last equal to the last row of --all,
# -p and --ids giving the same logits for the same ids, determinism, run's streamed text and
# speed lines, and bad input answered with one line and exit code 1 or 2 (a model too large for
# the RAM, with HOTMOE_RAM_MIB pretending a small machine, says how much it needs), and the
# pool profile that HOTMOE_POOL_PROF=1 logs.
#   bash tests/cli/logits_run.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/logits_run_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"
# little-endian u32 at byte offset $2 of file $1
u32() { od -An -tu4 -j "$2" -N4 "$1" | tr -d ' '; }

m=$tmp/olmoe.gguf
"$bin" forge --preset tiny-olmoe --type f32 --no-hf -q -o "$m" >/dev/null 2>&1
expect "forge" test -s "$m"

# ---- hotmoe logits: all rows ----
"$bin" logits -m "$m" --ids 5,6,7,8,9 -o "$tmp/all.bin" -t 2 2>"$tmp/err"
expect "logits --ids: exit 0" test $? -eq 0
expect "magic" test "$(head -c 8 "$tmp/all.bin")" = "HMLOGIT1"
hl=$(u32 "$tmp/all.bin" 8)
off=$((12 + hl))
expect "data offset multiple of 64" test $((off % 64)) -eq 0
hdr=$(head -c "$off" "$tmp/all.bin" | tail -c +13)
expect "header n_rows" grep -q '"n_rows":5' <<<"$hdr"
expect "header n_vocab" grep -q '"n_vocab":1024' <<<"$hdr"
expect "header ids" grep -q '"ids":\[5,6,7,8,9\]' <<<"$hdr"
expect "header dtype" grep -q '"dtype":"f32"' <<<"$hdr"
size=$(stat -c %s "$tmp/all.bin")
expect "size = header + 5 x 1024 f32" test "$size" -eq $((off + 5 * 1024 * 4))

# ---- --last equals the last row of --all; deterministic; 1 thread == 2 threads ----
"$bin" logits -m "$m" --ids 5,6,7,8,9 -o "$tmp/last.bin" --last -t 1 2>/dev/null
hl2=$(u32 "$tmp/last.bin" 8)
tail -c 4096 "$tmp/all.bin" >"$tmp/a_last"
tail -c +$((12 + hl2 + 1)) "$tmp/last.bin" >"$tmp/b_last"
expect "--last: one row" test "$(stat -c %s "$tmp/b_last")" -eq 4096
expect "--last == last row of --all (1 vs 2 threads)" cmp -s "$tmp/a_last" "$tmp/b_last"
"$bin" logits -m "$m" --ids 5,6,7,8,9 -o "$tmp/all2.bin" -t 2 2>/dev/null
expect "deterministic" cmp -s "$tmp/all.bin" "$tmp/all2.bin"

# ---- .npy ----
"$bin" logits -m "$m" --ids 5,6,7 -o "$tmp/l.npy" 2>/dev/null
expect "npy magic" test "$(head -c 6 "$tmp/l.npy" | tail -c 5)" = "NUMPY"
expect "npy shape" grep -aq "'shape': (3, 1024)" "$tmp/l.npy"
nl=$(od -An -tu2 -j 8 -N2 "$tmp/l.npy" | tr -d ' ')
expect "npy size" test "$(stat -c %s "$tmp/l.npy")" -eq $((10 + nl + 3 * 1024 * 4))
expect "npy data == raw data" cmp -s <(tail -c 12288 "$tmp/l.npy") \
  <(tail -c +$((off + 1)) "$tmp/all.bin" | head -c 12288)

# ---- -p TEXT: same logits as --ids of the ids it names ----
"$bin" logits -m "$m" -p "the cat" -o "$tmp/p.bin" 2>/dev/null
expect "logits -p: exit 0" test $? -eq 0
ids=$(head -c 4096 "$tmp/p.bin" | grep -ao '"ids":\[[0-9,]*\]' | sed 's/.*\[//; s/\]//')
expect "-p produced ids" test -n "$ids"
"$bin" logits -m "$m" --ids "$ids" -o "$tmp/q.bin" 2>/dev/null
expect "-p == --ids" cmp -s <(tail -c 8192 "$tmp/p.bin") <(tail -c 8192 "$tmp/q.bin")

# ---- bad input ----
"$bin" logits -m "$m" --ids 5,6 2>"$tmp/err"
expect "no -o: exit 2" test $? -eq 2
"$bin" logits -m "$m" --ids 5,x -o "$tmp/x.bin" 2>"$tmp/err"
expect "bad --ids: exit 2" test $? -eq 2
expect "bad --ids: one line" test "$(wc -l <"$tmp/err")" -eq 1
"$bin" logits -m "$m" --ids 5,99999 -o "$tmp/x.bin" 2>"$tmp/err"
expect "id out of vocabulary: exit 1" test $? -eq 1
expect "id out of vocabulary: named" grep -q "99999" "$tmp/err"
"$bin" logits -m "$tmp/missing.gguf" --ids 5 -o "$tmp/x.bin" 2>"$tmp/err"
expect "missing model: exit 1" test $? -eq 1
expect "missing model: one line" test "$(wc -l <"$tmp/err")" -eq 1

# ---- hotmoe run ----
"$bin" run -m "$m" -p "the cat" -n 12 --temp 0 -t 2 >"$tmp/out" 2>"$tmp/err"
expect "run: exit 0" test $? -eq 0
expect "run: echoes the prompt" grep -q "^the cat" "$tmp/out"
expect "run: prompt speed" grep -Eq "^prompt: .* tok/s" "$tmp/err"
expect "run: generation speed" grep -Eq "^generation: +12 tokens .* tok/s" "$tmp/err"
"$bin" run -m "$m" -p "the cat" -n 12 --temp 0 -t 1 >"$tmp/out2" 2>/dev/null
# the pool profile (HOTMOE_POOL_PROF=1): a line per job kind and the time between jobs, the
# same text
HOTMOE_POOL_PROF=1 "$bin" run -m "$m" -p "the cat" -n 12 --temp 0 -t 2 >"$tmp/out3" 2>"$tmp/prof"
expect "pool profile: job kinds" grep -q "pool profile: job kind 0 (.* stages): [0-9]* calls" "$tmp/prof"
expect "pool profile: between jobs" grep -q "s in jobs, .* s between them" "$tmp/prof"
expect "pool profile: same text" cmp -s "$tmp/out" "$tmp/out3"
expect "run: greedy is deterministic across thread counts" cmp -s "$tmp/out" "$tmp/out2"
"$bin" run -m "$m" -p "the cat" -n 5 -c 3 >/dev/null 2>"$tmp/err"
expect "run: prompt longer than the context: exit 1" test $? -eq 1
expect "run: prompt longer than the context: says so" grep -q "context" "$tmp/err"

# ---- the expert tracer counts the same on 1 thread (layers as pool jobs of their own) and on 3
# (a decode step as one pool job: the routing, and its record, in a `then` step) ----
"$bin" run -m "$m" -p "the cat" -n 8 --temp 0 -t 1 --expert-trace-output "$tmp/tr1.json" \
  >/dev/null 2>&1
"$bin" run -m "$m" -p "the cat" -n 8 --temp 0 -t 3 --expert-trace-output "$tmp/tr3.json" \
  >/dev/null 2>&1
expect "tracer: same counts on 1 and 3 threads" cmp -s "$tmp/tr1.json" "$tmp/tr3.json"

# ---- --repack: the q4_K, q6_K, q8_0 and mxfp4 matrices also held repacked by eights
# (quant_x8.h) give the same logits, one token at a time (the repacked path) and in a batch, on
# 1 and 3 threads (qwen3moe q4_k_m: q4_K and q6_K; gpt-oss mxfp4: mxfp4 experts, q8_0 the rest);
# where the fast kernel cannot run (HOTMOE_ISA=avx2) the weights stay as they are and the run
# says so ----
q=$tmp/q3.gguf
"$bin" forge --preset tiny-qwen3moe --type q4_k_m --no-hf -q -o "$q" >/dev/null 2>&1
g=$tmp/goss.gguf
"$bin" forge --preset tiny-gpt-oss --type mxfp4 --no-hf -q -o "$g" >/dev/null 2>&1
for f in "$q" "$g"; do
  for t in 1 3; do
    for ub in 1 512; do
      "$bin" logits -m "$f" -p "the cat sat on the mat and then" -ub $ub -t $t -o "$tmp/p.bin" 2>/dev/null
      "$bin" logits -m "$f" -p "the cat sat on the mat and then" -ub $ub -t $t --repack \
        -o "$tmp/r.bin" 2>/dev/null
      expect "--repack: same logits ($(basename "$f") -t $t -ub $ub)" cmp -s "$tmp/p.bin" "$tmp/r.bin"
    done
  done
done
"$bin" logits -m "$q" -p "the cat sat on the mat and then" -ub 1 -t 2 -o "$tmp/p.bin" 2>/dev/null
HOTMOE_ISA=avx2 "$bin" logits -m "$q" -p "the cat sat on the mat and then" -ub 1 -t 2 -rtr \
  -o "$tmp/r.bin" 2>"$tmp/err"
expect "--repack without the fast kernel: same logits" cmp -s "$tmp/p.bin" "$tmp/r.bin"
expect "--repack without the fast kernel: says so" grep -q "repack" "$tmp/err"
"$bin" logits -m "$q" -p "the cat sat on the mat and then" -ub 1 -t 2 -rtr -ngl 99 \
  -o "$tmp/r.bin" 2>"$tmp/err"
expect "--repack with -ngl: says it is ignored" grep -q "ignored with -ngl" "$tmp/err"
# repacking releases the file's pages of each matrix it copies: RAM for the weights plus a little
# (not twice the weights) is enough, and the logits stay the same
ram=$(( $(stat -c %s "$q") / 1048576 + 2 ))
HOTMOE_RAM_MIB=$ram "$bin" logits -m "$q" -p "the cat sat on the mat and then" -ub 1 -t 2 -c 64 \
  --repack -o "$tmp/r.bin" 2>"$tmp/err"
expect "--repack in RAM for the weights + 2 MiB: exit 0" test $? -eq 0
expect "--repack in RAM for the weights + 2 MiB: same logits" cmp -s "$tmp/p.bin" "$tmp/r.bin"
HOTMOE_RAM_MIB=1 "$bin" logits -m "$q" -p "the" -t 2 --repack -o "$tmp/r.bin" 2>"$tmp/err"
expect "--repack too large for RAM: says so" grep -q "for its weights and repacking them (--repack)" "$tmp/err"

# ---- a model too large for this machine's RAM (HOTMOE_RAM_MIB pretends the RAM size) ----
HOTMOE_RAM_MIB=1 "$bin" run -m "$m" -p hi -n 2 >/dev/null 2>"$tmp/err"
expect "too large for RAM: exit 1" test $? -eq 1
expect "too large for RAM: says what the weights need" \
  grep -q "model needs [0-9.]* MiB of RAM for its weights but this machine has 1.0 MiB" "$tmp/err"
HOTMOE_RAM_MIB=$(( $(stat -c %s "$m") / 1048576 + 1 )) "$bin" run -m "$m" -p hi -n 2 -c 4096 \
  >/dev/null 2>"$tmp/err"
expect "weights fit, cache does not: exit 1" test $? -eq 1
expect "weights fit, cache does not: says weights + cache for -c" \
  grep -q "model needs .* of RAM (weights .* + KV cache and buffers .* for -c 4096) but this machine has" "$tmp/err"

rm -rf "$tmp"
cli_summary
