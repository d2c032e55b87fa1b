#!/usr/bin/env bash
# llama_flags.sh - the llama.cpp flags users type, on `hotmoe run` (and chat through -cnv): a
# typo gets the nearest flag; flags hotmoe does not follow say so (-fa off, --no-mmap, -tb) or
# are refused (--override-kv); -e/--no-escape, -r, --chat-template, -cnv, --mlock, -sp and
# --ignore-eos do what llama-cli does with them. A forged tiny model (random weights): what is
# checked is the plumbing.
#   bash tests/cli/llama_flags.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/llama_flags_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

m=$tmp/olmoe.gguf
"$bin" forge --preset tiny-olmoe --type q8_0 --no-hf -q -o "$m" || bad "forge"
run() { "$bin" run -m "$m" -t 2 --temp 0 "$@"; }

run -p hi -n 2 --ignore-eso >/dev/null 2>"$tmp/e1"
expect "typo: exit 2" test $? -eq 2
expect "typo: the nearest flag named" grep -q "did you mean '--ignore-eos'" "$tmp/e1"
run -p hi -n 2 --revers x >/dev/null 2>"$tmp/e1"
expect "cut short: the flag it starts named" grep -q "did you mean '--reverse-prompt'" "$tmp/e1"
run -p hi -n 2 --temperature 0.5 >/dev/null 2>"$tmp/e1"
expect "a word added: the flag it starts with named" grep -q "did you mean '--temp'" "$tmp/e1"
run -p hi -n 2 --frobnicate >/dev/null 2>"$tmp/e2"
expect "far from every flag: no suggestion" sh -c "! grep -q 'did you mean' '$tmp/e2'"
run -p hi -n 2 --override-kv tokenizer.ggml.add_bos_token=bool:false >/dev/null 2>"$tmp/e3"
expect "--override-kv: refused (exit 2)" test $? -eq 2
expect "--override-kv: says why" grep -q "does not override model metadata" "$tmp/e3"
run -p hi -n 2 -fa off --no-mmap -tb 7 >/dev/null 2>"$tmp/e4"
expect "-fa off --no-mmap -tb: exit 0" test $? -eq 0
expect "-fa off: said" grep -q -- "-fa off: hotmoe's attention is always computed fused" "$tmp/e4"
expect "--no-mmap: said" grep -q -- "--no-mmap: hotmoe always maps" "$tmp/e4"
expect "-tb: said" grep -q -- "-tb 7: prompts use the -t threads" "$tmp/e4"
run -p hi -n 2 -fa -ngl 0 >/dev/null 2>"$tmp/e5"
expect "-fa without a value, then a flag: exit 0" test $? -eq 0
run -p hi -n 2 -fa sometimes >/dev/null 2>"$tmp/e6"
expect "-fa bad value: exit 2" test $? -eq 2
run -p 'a\tb\x41' -n 0 >"$tmp/o7" 2>/dev/null
expect "-e (default): escapes processed" test "$(head -c 4 "$tmp/o7")" = "$(printf 'a\tbA')"
run -p 'a\tb' -n 0 --no-escape >"$tmp/o8" 2>/dev/null
expect "--no-escape: taken literally" test "$(head -c 4 "$tmp/o8")" = 'a\tb'
run -p hi -n 16 --no-display-prompt >"$tmp/o9" 2>/dev/null
first=$(head -c 4 "$tmp/o9") # the first piece or more
run -p hi -n 16 --no-display-prompt -r "$first" >"$tmp/o10" 2>/dev/null
expect "-r: generation stops once the output ends with it" \
  test "$(wc -c <"$tmp/o10")" -lt "$(wc -c <"$tmp/o9")" -a "$(head -c 4 "$tmp/o10")" = "$first"
run -p hello -n 1 --chat-template chatml >"$tmp/o11" 2>/dev/null
expect "--chat-template: the prompt as a user message with the generation prompt" \
  grep -q '<|im_start|>assistant' "$tmp/o11"
run -p hello -n 1 --chat-template nonsense >/dev/null 2>"$tmp/e12"
expect "--chat-template unknown: exit 1" test $? -eq 1
expect "--chat-template unknown: names the templates" grep -q "chatml" "$tmp/e12"
printf 'hi\n' | run -cnv -p "SYSTEM TEXT" -n 2 -v >/dev/null 2>"$tmp/e13"
expect "-cnv: a chat session (exit 0)" test $? -eq 0
expect "-cnv: -p is the system prompt" grep -q "SYSTEM TEXT" "$tmp/e13"
run -p hi -n 2 --mlock -sp --ignore-eos >/dev/null 2>"$tmp/e14"
expect "--mlock -sp --ignore-eos: exit 0" test $? -eq 0
run -p hi -n 4 --ignore-eos -v >/dev/null 2>"$tmp/e15"
expect "-v: debug lines (the engine's set-up)" grep -q "run: .*context .* tokens, batch" "$tmp/e15"

cli_summary llama_flags.sh
