#!/usr/bin/env bash
# errors.sh - input the commands must refuse with one clear line and a non-zero exit status
# instead of answering with something else than asked: -p together with -f (run, logits,
# tokenize), -m, -p or -f given twice, an unknown --reasoning-effort (chat; low, medium and high
# are rendered into the harmony prompt), and a model file that cannot be opened (missing, a
# directory, empty, truncated) for every command that takes -m, where the line must name the
# file. (perplexity's own refusals are in test_perplexity.c.)
#   bash tests/cli/errors.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/errors_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

# refuses DESCRIPTION STATUS TEXT CMD...: CMD exits with STATUS and its stderr contains TEXT
refuses() {
  local d=$1 want=$2 text=$3
  shift 3
  "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    bad "$d: exit $rc, expected $want; stderr: $(head -c 300 "$tmp/err")"
  elif ! grep -qF -- "$text" "$tmp/err"; then
    bad "$d: stderr lacks '$text': $(head -c 300 "$tmp/err")"
  else
    ok
  fi
}

m=$tmp/olmoe.gguf
"$bin" forge --preset tiny-olmoe --type q8_0 --no-hf -q -o "$m" >/dev/null 2>&1
expect "forge olmoe" test -s "$m"
printf 'one prompt\nanother prompt\n' >"$tmp/text.txt"

# ---- -p with -f: one of them would be dropped ----
refuses "run -p -f" 2 "-p and -f both given; use one" \
  "$bin" run -m "$m" -p hello -f "$tmp/text.txt" -n 1
refuses "run -f -p (other order)" 2 "-p and -f both given; use one" \
  "$bin" run -m "$m" -f "$tmp/text.txt" --prompt=hello -n 1
refuses "logits -p -f" 2 "-p and -f both given; use one" \
  "$bin" logits -m "$m" -p hello -f "$tmp/text.txt" -o "$tmp/o.bin"
refuses "tokenize -p -f" 2 "-p and -f both given; use one" \
  "$bin" tokenize -m "$m" -p hello -f "$tmp/text.txt"

# ---- a repeated -m, -p or -f ----
for cmd in run chat perplexity logits learn tokenize; do
  refuses "$cmd -m twice" 2 "-m given twice" "$bin" $cmd -m "$m" -m "$tmp/other.gguf"
done
# bench takes several models as llama-bench does: the missing one is named
refuses "bench -m twice: each model, the missing one named" 1 "other.gguf" "$bin" bench -m "$m" -m "$tmp/other.gguf" -p 8 -n 0 -r 1
refuses "--model twice" 2 "-m given twice" "$bin" run --model="$m" --model "$m" -p hi
refuses "run -p twice" 2 "-p given twice" "$bin" run -m "$m" -p one -p two -n 1
refuses "learn -f twice" 2 "-f given twice" \
  "$bin" learn -m "$m" -f "$tmp/text.txt" -f "$tmp/text.txt" -o "$tmp/l.json"

# ---- --reasoning-effort: low, medium or high only ----
refuses "chat --reasoning-effort extreme" 2 \
  "--reasoning-effort 'extreme' is not one of low, medium, high" \
  "$bin" chat -m "$m" --reasoning-effort extreme
refuses "chat --reasoning-effort HIGH" 2 "--reasoning-effort 'HIGH' is not one of" \
  "$bin" chat -m "$m" --reasoning-effort=HIGH
refuses "chat --reasoning-effort ''" 2 "--reasoning-effort '' is not one of" \
  "$bin" chat -m "$m" --reasoning-effort ""
g=$tmp/gpt-oss.gguf
"$bin" forge --preset tiny-gpt-oss --type q8_0 --no-hf -q -o "$g" >/dev/null 2>&1
expect "forge gpt-oss" test -s "$g"
for level in low medium high; do
  printf 'Hello\n' | "$bin" chat -m "$g" --reasoning-effort $level -n 2 --temp 0 -t 2 -v \
    >"$tmp/chat.out" 2>"$tmp/chat.err"
  expect "chat --reasoning-effort $level: exit 0" test $? -eq 0
  expect "chat --reasoning-effort $level: in the prompt" grep -q "Reasoning: $level" "$tmp/chat.err"
done

# ---- a model file that cannot be opened: the error names it ----
mkdir -p "$tmp/dir.gguf"
: >"$tmp/empty.gguf"
head -c $(($(stat -c %s "$m") / 2)) "$m" >"$tmp/trunc.gguf"
head -c 100 "$m" >"$tmp/short.gguf"
args_of() { # the arguments a command needs besides -m to reach the model
  case $1 in
  run) echo "-p hello -n 1" ;;
  tokenize) echo "-p hello" ;;
  chat) echo "-n 1" ;;
  bench) echo "-p 4 -n 2 -r 1" ;;
  perplexity) echo "-f $tmp/text.txt" ;;
  logits) echo "--ids 1,2 -o $tmp/o.bin" ;;
  learn) echo "-f $tmp/text.txt -o $tmp/l.json" ;;
  esac
}
for cmd in run chat bench perplexity logits learn tokenize; do
  a=$(args_of $cmd)
  for f in "$tmp/missing.gguf" "$tmp/dir.gguf" "$tmp/empty.gguf" "$tmp/trunc.gguf" \
    "$tmp/short.gguf"; do
    refuses "$cmd -m $(basename "$f")" 1 "$f" "$bin" $cmd -m "$f" $a
  done
done
# the line says what is wrong, too
refuses "missing: why" 1 "No such file" "$bin" run -m "$tmp/missing.gguf" -p hi
refuses "directory: why" 1 "not a regular file" "$bin" run -m "$tmp/dir.gguf" -p hi
refuses "empty: why" 1 "empty" "$bin" run -m "$tmp/empty.gguf" -p hi
cli_summary errors
