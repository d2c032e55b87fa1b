#!/usr/bin/env bash
# convert.sh - `hotmoe convert` as a user runs it: --help, a forged HF twin converted back (the
# tensor bytes equal forge's; tests/convert/test_convert.c compares every key and tensor), usage
# errors (exit 2) and a bad checkpoint (exit 1, one line naming the file).
#   bash tests/cli/convert.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tmp=$2/convert_sh
rm -rf "$tmp"
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

"$bin" convert --help >"$tmp/help"
expect "help: exit 0" test $? -eq 0
expect "help: usage" grep -q "usage: hotmoe convert DIR -o OUT.gguf" "$tmp/help"
expect "help: archs" grep -q "GptOssForCausalLM" "$tmp/help"
"$bin" --help | grep -q "^  convert "
expect "listed in hotmoe --help" test $? -eq 0

"$bin" forge --preset tiny-qwen2moe --type f32 -o "$tmp/a.gguf" --hf "$tmp/a-hf" -q
"$bin" forge --preset tiny-qwen2moe --type q4_k_m -o "$tmp/q.gguf" --no-hf -q
"$bin" convert "$tmp/a-hf" -o "$tmp/c.gguf" --type q4_k_m --name tiny-qwen2moe 2>"$tmp/err"
expect "convert: exit 0" test $? -eq 0
expect "convert: summary" grep -q "wrote .*c.gguf (qwen2moe, q4_k_m" "$tmp/err"
# the files differ only by forge's general.source.forge key: same size minus that key's bytes
"$bin" inspect "$tmp/q.gguf" --tensors >"$tmp/iq" 2>&1
"$bin" inspect "$tmp/c.gguf" --tensors >"$tmp/ic" 2>&1
expect "convert: same tensor table" diff <(grep -E "^ *blk\.|token_embd|output" "$tmp/iq") <(grep -E "^ *blk\.|token_embd|output" "$tmp/ic")

"$bin" convert "$tmp/a-hf" 2>"$tmp/e1"
expect "no -o: exit 2" test $? -eq 2
"$bin" convert "$tmp/a-hf" -o "$tmp/x.gguf" --type q3 2>"$tmp/e2"
expect "bad type: exit 2" test $? -eq 2
expect "bad type: names it" grep -q "unknown --type 'q3'" "$tmp/e2"
"$bin" convert "$tmp/nowhere" -o "$tmp/x.gguf" 2>"$tmp/e3"
expect "no config: exit 1" test $? -eq 1
expect "no config: one line naming config.json" test "$(grep -c "nowhere/config.json: missing" "$tmp/e3")" -eq 1
expect "no config: no output" test ! -e "$tmp/x.gguf"

rm -rf "$tmp"
cli_summary
