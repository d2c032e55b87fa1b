#!/usr/bin/env bash
# convert.sh - `hotmoe convert` as a user runs it: --help, a forged HF twin converted back (the
# tensor bytes equal forge's; tests/convert/test_convert.c compares every key and tensor), usage
# errors (exit 2) and a bad checkpoint (exit 1, one line naming the file); the hybrids and
# gemma4 convert and run (qwen35moe without mtp.*: its MTP block left out, said so).
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

# the hybrids: qwen3next's twin, and qwen35moe's as transformers saves it (no mtp.*), which
# converts without its MTP block and says so; and gemma4's twin; all run
for h in tiny-qwen3next tiny-qwen35moe tiny-gemma4moe; do
  arch=${h#tiny-}
  [ "$h" = tiny-gemma4moe ] && arch=gemma4
  "$bin" forge --preset $h --type f32 -o "$tmp/$h.gguf" --hf "$tmp/$h-hf" -q
  "$bin" convert "$tmp/$h-hf" -o "$tmp/$h-q8.gguf" --type q8_0 2>"$tmp/$h.err"
  expect "$h: convert exit 0" test $? -eq 0
  expect "$h: summary" grep -q "wrote .*$h-q8.gguf ($arch, q8_0" "$tmp/$h.err"
  "$bin" run -m "$tmp/$h-q8.gguf" -p "the cat" -n 4 --temp 0 -t 2 >"$tmp/$h.out" 2>"$tmp/$h.run"
  expect "$h: hotmoe run on the converted file" test $? -eq 0
done
expect "tiny-qwen35moe: the MTP block left out, said" grep -q "no mtp.\* tensors: the GGUF has no MTP block" "$tmp/tiny-qwen35moe.err"
expect "tiny-qwen3next: no MTP note" test "$(grep -c "MTP" "$tmp/tiny-qwen3next.err")" -eq 0

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
