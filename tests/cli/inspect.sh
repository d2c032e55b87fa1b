#!/usr/bin/env bash
# inspect.sh - `hotmoe inspect` as a user runs it: text and --json reports of the committed tiny
# MoE seed (fuzz/gguf/corpus/v3_moe_tiny.gguf, written by tests/gguf/test_gguf_seeds.c) and of a
# GGUF that this script writes itself with Python's struct module (an unknown architecture, a
# 100-string array, MoE layers with different expert counts), plus the error cases.
#   bash tests/cli/inspect.sh HOTMOE_BIN TMPDIR      (run from the repository root)
#
# Expected numbers, worked out by hand from the GGUF block sizes (q8_0: 34 bytes per 32 values,
# q4_0: 18 bytes per 32, f16: 2 bytes, f32: 4 bytes):
#   tiny MoE: per MoE layer gate_exps + up_exps are q8_0 [32, 1, 2] = 2 blocks = 68 bytes each,
#   down_exps q4_0 [32, 1, 2] = 36 bytes, so one expert is 34 + 34 + 18 = 86 bytes; two MoE
#   layers -> 2 * (68 + 68 + 36) = 344 bytes of routed experts; all 22 tensors sum to 1264.
#   python file: f32 [4, 3, 5] = 240 bytes, 5 experts -> 48 bytes each, x3 tensors = 144 bytes
#   per expert in blk.0; blk.1 has f32 [4, 3, 4] (4 experts) -> also 144 bytes per expert.
set -u
bin=$1
tmp=$2/inspect_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

tiny=fuzz/gguf/corpus/v3_moe_tiny.gguf

# ---- text report ----
"$bin" inspect "$tiny" >"$tmp/text" 2>"$tmp/err"
expect "text: exit 0" test $? -eq 0
expect "text: stderr empty" test ! -s "$tmp/err"
for want in "GGUF version 3, alignment 32, 3680 bytes" \
  'general.architecture                         string      "qwen3moe"' \
  'tokenizer.ggml.tokens                        arr[string] [24 strings] ["t0", "t1", "t2", "t3", ...]' \
  "tensors: 22, 1264 bytes" \
  "experts                 6              344" \
  "shared_experts          2               68" \
  "dense_ffn               3              102" \
  "routed experts: 2 layers (blk.1 .. blk.2) x 2 experts, 86 bytes" \
  "everything on GPU   VRAM 1.23 KiB" \
  "experts in RAM      VRAM 920 B + host RAM 344 B"; do
  expect "text contains: $want" grep -qF -- "$want" "$tmp/text"
done
expect "text without --tensors has no tensor list" bash -c "! grep -q 'blk.1.ffn_down_exps.weight' '$tmp/text'"

"$bin" inspect --tensors "$tiny" >"$tmp/tensors"
expect "--tensors: exit 0" test $? -eq 0
expect "--tensors lists the down experts" \
  grep -qE '^  blk\.1\.ffn_down_exps\.weight +q4_0 +\[32, 1, 2\] +36  experts$' "$tmp/tensors"
expect "--tensors lists 22 tensors" test "$(grep -cE '^  [a-z0-9_.]+\.weight +[a-z0-9_]+ +\[' "$tmp/tensors")" -eq 22

"$bin" inspect fuzz/gguf/corpus/v2_types.gguf >"$tmp/v2"
expect "v2 file: exit 0" test $? -eq 0
expect "v2 file: version shown" grep -qF "GGUF version 2" "$tmp/v2"

# ---- JSON report ----
"$bin" inspect "$tiny" --json >"$tmp/json"
expect "--json: exit 0" test $? -eq 0
expect "--json: tiny MoE numbers" python3 - "$tmp/json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["version"] == 3 and r["alignment"] == 32 and r["file_size"] == 3680, r
assert r["tensor_count"] == 22 and len(r["tensors"]) == 22
assert r["tensor_bytes"] == 1264 == sum(t["bytes"] for t in r["tensors"])
cats = r["categories"]
for name, c in cats.items():
    assert c["bytes"] == sum(t["bytes"] for t in r["tensors"] if t["category"] == name), name
    assert c["tensors"] == sum(1 for t in r["tensors"] if t["category"] == name), name
assert cats["experts"]["bytes"] == 344 and cats["router"]["tensors"] == 2
e = r["experts"]
assert e["moe_layers"] == 2 and e["uniform"] and e["n_expert"] == 2 and e["bytes_per_expert"] == 86
assert [l["layer"] for l in e["layers"]] == [1, 2]
t = r["tiers"]
assert t["all_gpu"]["vram"] == 1264
assert t["experts_in_ram"]["vram"] == 1264 - 344 and t["experts_in_ram"]["host_ram"] == 344
md = {m["key"]: m for m in r["metadata"]}
tok = md["tokenizer.ggml.tokens"]
assert tok["type"] == "array" and tok["elem_type"] == "string" and tok["n"] == 24
assert tok["value"][:3] == ["t0", "t1", "t2"] and len(tok["value"]) == 24 and "truncated" not in tok
assert md["qwen3moe.rope.freq_base"]["value"] == 10000 and md["qwen3moe.expert_count"]["value"] == 2
d = [x for x in r["tensors"] if x["name"] == "blk.2.ffn_down_exps.weight"][0]
assert d["type"] == "q4_0" and d["shape"] == [32, 1, 2] and d["bytes"] == 36 and d["offset"] % 32 == 0
EOF

# ---- a file written here, independently of hotmoe's writer ----
py="$tmp/mystery.gguf"
python3 - "$py" <<'EOF'
import struct, sys
def s(x): b = x.encode(); return struct.pack("<Q", len(b)) + b
kv = [s("general.architecture") + struct.pack("<I", 8) + s("mystery"),
      s("tok.list") + struct.pack("<II", 9, 8) + struct.pack("<Q", 100) + b"".join(s("w%d" % i) for i in range(100)),
      s("odd.i32") + struct.pack("<II", 9, 5) + struct.pack("<Q", 3) + struct.pack("<3i", 7, -8, 9),
      s("odd.nested") + struct.pack("<II", 9, 9) + struct.pack("<Q", 2)
        + struct.pack("<IQ", 4, 2) + struct.pack("<2I", 1, 2) + struct.pack("<IQ", 8, 1) + s("x")]
tensors = [("blk.0.ffn_gate_exps.weight", [4, 3, 5]), ("blk.0.ffn_up_exps.weight", [4, 3, 5]),
           ("blk.0.ffn_down_exps.weight", [3, 4, 5]), ("blk.1.ffn_gate_exps.weight", [4, 3, 4]),
           ("blk.1.ffn_up_exps.weight", [4, 3, 4]), ("blk.1.ffn_down_exps.weight", [3, 4, 4]),
           ("weird.thing", [8])]
info, off, data = b"", 0, b""
for name, ne in tensors:
    size = 4
    for n in ne: size *= n
    info += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
    info += struct.pack("<IQ", 0, off)
    data += b"\x00" * size + b"\x00" * ((-size) % 32)
    off += size + (-size) % 32
head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + info
open(sys.argv[1], "wb").write(head + b"\x00" * ((-len(head)) % 32) + data)
EOF
"$bin" inspect "$py" >"$tmp/ptext"
expect "python file: exit 0" test $? -eq 0
for want in "tok.list                                     arr[string] [100 strings] [\"w0\", \"w1\", \"w2\", \"w3\", ...]" \
  "odd.i32                                      arr[i32]    [7, -8, 9]" \
  'odd.nested                                   arr[array]  [[1, 2], ["x"]]' \
  "routed experts: 2 layers, bytes per expert per layer:" \
  "blk.0           5 experts x 144 bytes" \
  "blk.1           4 experts x 144 bytes" \
  "other                   1               32"; do
  expect "python file text contains: $want" grep -qF -- "$want" "$tmp/ptext"
done
"$bin" inspect --json "$py" >"$tmp/pjson"
expect "python file --json" python3 - "$tmp/pjson" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
md = {m["key"]: m for m in r["metadata"]}
assert md["general.architecture"]["value"] == "mystery"
tl = md["tok.list"]
assert tl["n"] == 100 and len(tl["value"]) == 64 and tl["truncated"] is True and tl["value"][63] == "w63"
assert md["odd.nested"]["value"] == [[1, 2], ["x"]]
e = r["experts"]
assert e["moe_layers"] == 2 and e["uniform"] is False
assert [(l["layer"], l["n_expert"], l["bytes_per_expert"]) for l in e["layers"]] == [(0, 5, 144), (1, 4, 144)]
assert r["categories"]["experts"]["bytes"] == 3 * 240 + 3 * 192
assert r["categories"]["other"]["bytes"] == 32
EOF

# ---- errors ----
errcase() { # DESCRIPTION EXPECTED_RC PATTERN ARGS...
  local d=$1 rc=$2 pat=$3
  shift 3
  "$bin" inspect "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  expect "$d: exit $rc (got $got)" test "$got" -eq "$rc"
  expect "$d: one line on stderr" test "$(wc -l <"$tmp/err")" -eq 1
  expect "$d: message matches '$pat'" grep -qE -- "$pat" "$tmp/err"
  expect "$d: nothing on stdout" test ! -s "$tmp/out"
}
errcase "missing file" 1 "^hotmoe inspect: $tmp/nope.gguf: .*No such file" "$tmp/nope.gguf"
echo "hello, not a model" >"$tmp/text.gguf"
errcase "not GGUF" 1 "^hotmoe inspect: $tmp/text.gguf: .*not a GGUF file" "$tmp/text.gguf"
head -c 2000 "$tiny" >"$tmp/cut.gguf"
errcase "truncated" 1 "^hotmoe inspect: $tmp/cut.gguf: gguf: tensor [0-9]+ '.*': data \[offset [0-9]+, size [0-9]+\] extends past end of file" "$tmp/cut.gguf"
errcase "directory" 1 "^hotmoe inspect: $tmp: " "$tmp"
errcase "unknown flag" 2 "unknown option '--bogus'" "$tiny" --bogus
errcase "no file" 2 "no file given"
errcase "two files" 2 "one file at a time" "$tiny" "$tiny"
"$bin" inspect --help >"$tmp/help"
expect "--help: exit 0" test $? -eq 0
expect "--help: usage on stdout" grep -qF "usage: hotmoe inspect FILE" "$tmp/help"

cli_summary
