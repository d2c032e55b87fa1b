#!/usr/bin/env bash
# chat.sh - `hotmoe chat` driven through stdin, as a script (or a user typing) would: forged tiny
# models of every architecture (random weights, so the replies are noise; what is checked is the
# plumbing): multi-turn conversations keep the KV cache (each turn reuses at least everything
# the previous turn processed as prompt), /exit and end of input quit, the first rendered prompt
# is exactly the template's text (expected strings written by hand from forge's templates, see
# tests/tokenizer/test_chat.c), greedy replies are reproducible, and bad input gets one line.
#   bash tests/cli/chat.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/chat_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

for p in tiny-qwen3moe tiny-mixtral tiny-olmoe tiny-gpt-oss tiny-qwen2moe; do
  "$bin" forge --preset $p --type q8_0 --no-hf -q -o "$tmp/$p.gguf" || bad "forge $p"
done

# turns: the reused count of turn k+1 must cover the prompt tokens the cache held after turn k
# (reused + new of turn k); replies are generated into the cache as well.
check_reuse() { # FILE NAME
  python3 - "$1" "$2" <<'EOF'
import re, sys
turns = [tuple(map(int, m)) for m in re.findall(r"\[turn \d+: prompt (\d+) new tokens \((\d+) reused", open(sys.argv[1], errors="replace").read())]
if len(turns) != 3:
    sys.exit(f"{sys.argv[2]}: expected 3 turns, got {len(turns)}")
for (n0, r0), (n1, r1) in zip(turns, turns[1:]):
    if r1 < r0 + n0:
        sys.exit(f"{sys.argv[2]}: turn reused {r1} < {r0 + n0} cached prompt tokens")
if turns[0][1] != 0:
    sys.exit(f"{sys.argv[2]}: first turn reused {turns[0][1]}")
EOF
}

conv=$'Hello there\nHow are you?\nTell me more\n'
for p in tiny-qwen3moe tiny-olmoe tiny-gpt-oss tiny-qwen2moe; do
  printf '%s' "$conv" | "$bin" chat -m "$tmp/$p.gguf" -sys "Be brief." -n 6 --temp 0 -t 2 -v \
    >"$tmp/$p.out" 2>"$tmp/$p.err"
  expect "$p: exit 0" test $? -eq 0
  expect "$p: cache reused across turns" check_reuse "$tmp/$p.err" $p
done
# mixtral: forge's (original Mixtral) template has no system role
printf '%s' "$conv" | "$bin" chat -m "$tmp/tiny-mixtral.gguf" -n 6 --temp 0 -t 2 -v \
  >"$tmp/mix.out" 2>"$tmp/mix.err"
expect "mixtral: exit 0" test $? -eq 0
expect "mixtral: cache reused" check_reuse "$tmp/mix.err" mixtral

# first rendered prompt, exactly
first_prompt() { # ERRFILE -> the text between the first [prompt] and [/prompt] lines, then "|"
  python3 -c 'import sys; t = open(sys.argv[1], errors="replace").read(); s = t.index("[prompt]\n") + 9; sys.stdout.write(t[s:t.index("\n[/prompt]", s)] + "|")' "$1"
}
expect "qwen3 prompt" test "$(first_prompt "$tmp/tiny-qwen3moe.err")" == \
  $'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n|'
expect "qwen2 prompt" test "$(first_prompt "$tmp/tiny-qwen2moe.err")" == \
  $'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n|'
expect "olmoe prompt" test "$(first_prompt "$tmp/tiny-olmoe.err")" == \
  $'<|endoftext|><|system|>\nBe brief.\n<|user|>\nHello there\n<|assistant|>\n|'
expect "mixtral prompt" test "$(first_prompt "$tmp/mix.err")" == '<s>[INST] Hello there [/INST]|'
expect "gpt-oss prompt: developer message" test "$(first_prompt "$tmp/tiny-gpt-oss.err")" == \
  $'<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nBe brief.<|end|><|start|>user<|message|>Hello there<|end|><|start|>assistant|'

# greedy is reproducible; a seed makes sampling reproducible
printf '%s' "$conv" | "$bin" chat -m "$tmp/tiny-qwen3moe.gguf" -sys "Be brief." -n 6 --temp 0 -t 1 >"$tmp/again.out" 2>/dev/null
expect "greedy reproducible (1 vs 2 threads)" cmp -s "$tmp/tiny-qwen3moe.out" "$tmp/again.out"
for i in 1 2; do
  printf '%s' "$conv" | "$bin" chat -m "$tmp/tiny-olmoe.gguf" -n 10 --temp 1.0 -s 7 >"$tmp/seed$i.out" 2>/dev/null
done
expect "seeded sampling reproducible" cmp -s "$tmp/seed1.out" "$tmp/seed2.out"

# /exit quits: nothing after it is read
printf 'one\n/exit\ntwo\n' | "$bin" chat -m "$tmp/tiny-olmoe.gguf" -n 3 --temp 0 -v >/dev/null 2>"$tmp/exit.err"
expect "/exit: exit 0" test $? -eq 0
expect "/exit: one turn" test "$(grep -c '^\[turn ' "$tmp/exit.err")" -eq 1
# a line ending in \ continues the message
printf 'line one\\\nline two\n' | "$bin" chat -m "$tmp/tiny-olmoe.gguf" -n 2 --temp 0 -v >/dev/null 2>"$tmp/cont.err"
expect "continuation line" test "$(first_prompt "$tmp/cont.err")" == $'<|endoftext|><|user|>\nline one\nline two\n<|assistant|>\n|'
# empty input: exits cleanly
"$bin" chat -m "$tmp/tiny-olmoe.gguf" </dev/null >/dev/null 2>&1
expect "EOF at once: exit 0" test $? -eq 0

# bad input: one line, status 2 (usage) or 1
one_line() { test "$(wc -l <"$1")" -eq 1; }
"$bin" chat -m "$tmp/tiny-mixtral.gguf" -sys "x" </dev/null >/dev/null 2>"$tmp/e1"
expect "mixtral -sys: exit 2" test $? -eq 2
expect "mixtral -sys: names the override" grep -q -- "--chat-template mistral" "$tmp/e1"
expect "mixtral -sys: one line" one_line "$tmp/e1"
printf 'hi\n' | "$bin" chat -m "$tmp/tiny-mixtral.gguf" -sys "Be brief." --chat-template mistral -n 2 --temp 0 -v >/dev/null 2>"$tmp/e2"
expect "mixtral --chat-template mistral: system folded in" grep -q '^<s> \[INST\] Be brief\.$' "$tmp/e2"
"$bin" chat -m "$tmp/tiny-olmoe.gguf" --chat-template bogus </dev/null >/dev/null 2>"$tmp/e3"
expect "unknown template: exit 2" test $? -eq 2
expect "unknown template: lists names" grep -q "chatml, harmony, mistral, mistral-legacy, tulu" "$tmp/e3"
"$bin" chat -m "$tmp/tiny-olmoe.gguf" --bogus-flag </dev/null >/dev/null 2>"$tmp/e4"
expect "unknown flag: exit 2" test $? -eq 2
expect "unknown flag: one line" one_line "$tmp/e4"
"$bin" chat -m "$tmp/tiny-olmoe.gguf" --temp abc </dev/null >/dev/null 2>"$tmp/e5"
expect "bad number: exit 2" test $? -eq 2
"$bin" chat -m "$tmp/nonexistent.gguf" </dev/null >/dev/null 2>"$tmp/e6"
expect "missing model: exit 1" test $? -eq 1
expect "missing model: one line" one_line "$tmp/e6"
printf 'hi\n' | "$bin" chat -m "$tmp/tiny-olmoe.gguf" -c 16 -n 2 -sys "$(printf 'word %.0s' {1..40})" >/dev/null 2>"$tmp/e7"
expect "a message longer than the context: the session goes on (exit 0)" test $? -eq 0
expect "context: says so" grep -q "no longer fit the context" "$tmp/e7"
# context shift: 6 turns of ~20 tokens in a context of 96: the oldest turns go, every turn runs
printf 'one two three four five six seven\n%.0s' {1..6} | "$bin" chat -m "$tmp/tiny-olmoe.gguf" \
  -c 96 -n 8 --temp 0 -sys "Be brief." -v >/dev/null 2>"$tmp/e9"
expect "context shift: exit 0" test $? -eq 0
expect "context shift: said" grep -q '^\[context shift: the oldest 2 messages dropped\]' "$tmp/e9"
expect "context shift: all 6 turns ran" grep -q '^\[turn 6:' "$tmp/e9"
# a recurrent state cannot be cut (docs/HYBRID.md): tiny-qwen3next's turns go back to the
# checkpoint the previous prompt left (its tokens reused, the reply read again); a context
# shift re-reads the conversation; every turn runs
"$bin" forge --preset tiny-qwen3next --type f32 --no-hf -q -o "$tmp/tiny-qwen3next.gguf" || bad "forge qwen3next"
printf 'one two three four five six seven\n%.0s' {1..6} | "$bin" chat -m "$tmp/tiny-qwen3next.gguf" \
  -c 96 -n 8 --temp 0 -sys "Be brief." -v >/dev/null 2>"$tmp/e9h"
expect "hybrid: exit 0" test $? -eq 0
expect "hybrid: context shift said" grep -q '^\[context shift: the oldest 2 messages dropped\]' "$tmp/e9h"
expect "hybrid: all 6 turns ran" grep -q '^\[turn 6:' "$tmp/e9h"
expect "hybrid: turn 2 reuses the first prompt" grep -Eq '^\[turn 2: prompt [0-9]+ new tokens \([1-9][0-9]* reused' "$tmp/e9h"
# commands: /help, /save (JSON with the messages), /clear (the next turn reuses nothing)
printf 'hello\n/help\n/save %s\n/clear\nagain\n' "$tmp/conv.json" | "$bin" chat \
  -m "$tmp/tiny-olmoe.gguf" -n 3 --temp 0 -sys "Be brief." -v >/dev/null 2>"$tmp/e10"
expect "commands: exit 0" test $? -eq 0
expect "/help lists /save" grep -q '/save FILE' "$tmp/e10"
expect "/save: three messages" python3 -c "import json,sys; m=json.load(open(sys.argv[1]))['messages']; sys.exit(0 if [x['role'] for x in m]==['system','user','assistant'] and m[1]['content']=='hello' else 1)" "$tmp/conv.json"
expect "/clear: the next turn starts from an empty cache" grep -q '^\[turn 2: prompt [0-9]* new tokens (0 reused' "$tmp/e10"
# -r: a reply stops once its text ends with the reverse prompt (the first character of a greedy
# reply, found from a run without it)
printf 'hello\n' | "$bin" chat -m "$tmp/tiny-olmoe.gguf" -n 12 --temp 0 >"$tmp/r0.out" 2>/dev/null
first=$(head -c 1 "$tmp/r0.out")
printf 'hello\n' | "$bin" chat -m "$tmp/tiny-olmoe.gguf" -n 12 --temp 0 -r "$first" >"$tmp/r1.out" 2>/dev/null
expect "-r: the reply stops at its text" test "$(head -c 1 "$tmp/r1.out")" = "$first" -a "$(wc -c <"$tmp/r1.out")" -lt "$(wc -c <"$tmp/r0.out")"
printf '\xff\xfe\nhello\n' | "$bin" chat -m "$tmp/tiny-olmoe.gguf" -n 2 --temp 0 -v >/dev/null 2>"$tmp/e8"
expect "invalid UTF-8 turn: session goes on" test $? -eq 0
expect "invalid UTF-8 turn: reported" grep -q "UTF-8" "$tmp/e8"
expect "invalid UTF-8 turn: next turn runs" grep -q '^\[turn 1:' "$tmp/e8"

# a terminal (script(1) gives one): libedit's line editing, the up arrow recalls the last message
if command -v script >/dev/null && "$bin" chat --help >/dev/null 2>&1; then
  printf 'hello\n\033[A\n/exit\n' | timeout 60 script -q -c "'$bin' chat -m '$tmp/tiny-olmoe.gguf' -n 2 --temp 0 -v" /dev/null >"$tmp/pty" 2>&1
  expect "terminal: exit 0" test $? -eq 0
  if ldd "$bin" 2>/dev/null | grep -q libedit; then
    expect "terminal: the up arrow sends the last message again (turn 2)" grep -aq '^\[turn 2:' "$tmp/pty"
  fi
fi

cli_summary chat.sh
