#!/usr/bin/env bash
# check_forge_vocabs.sh - cross-checks hotmoe's tokenizer on forge's tiny vocabularies against the
# JS tokenizer (@lenml/tokenizers 3.7.2, a transformers.js fork) reading forge's HF tokenizer.json:
# the ids of tests/tokenizer/data/{mixed,adversarial}.txt (whole and per line, added tokens parsed)
# must agree.
# Covers the olmo (GPT-2 regex) and forge's SPM vocabularies, which have no npm package.
#   bash tools/tokenizer/check_forge_vocabs.sh BUILD_DIR NPM_DIR   (from the repository root)
set -eu
build=$1
npm=$2
tmp=$(mktemp -d)
gcc -std=c11 -D_DEFAULT_SOURCE -Isrc -O2 tools/tokenizer/encode_cases.c "$build/libhotmoe.a" -lm -lpthread -o "$tmp/encode_cases"
rc=0
for p in tiny-olmoe tiny-mixtral tiny-qwen3moe tiny-gpt-oss tiny-qwen2moe; do
  "$build/hotmoe" forge --preset "$p" --type q8_0 -o "$tmp/$p.gguf" --hf "$tmp/$p-hf" > /dev/null 2>&1
  for text in mixed adversarial; do
    "$tmp/encode_cases" "$tmp/$p.gguf" tests/tokenizer/data/$text.txt > "$tmp/$p.hotmoe"
    NPM_DIR=$npm node tools/tokenizer/js_encode_cases.mjs "$tmp/$p-hf" tests/tokenizer/data/$text.txt > "$tmp/$p.js"
    n=$(diff "$tmp/$p.hotmoe" "$tmp/$p.js" | grep -c '^<' || true)
    echo "$p $text: $(wc -l < "$tmp/$p.js") cases, $n differ"
    [ "$n" -eq 0 ] || rc=1
  done
done
rm -rf "$tmp"
exit $rc
