#!/usr/bin/env python3
"""Reference goldens from HuggingFace transformers for hotmoe's forged tiny models.

Runs on the GPU machine (PyTorch + transformers; the reference itself computes on its CPU in
float64, see README). For every (preset, type) below it forges the GGUF and its HF copy with
`hotmoe forge --seed 42` (the HF copy holds the GGUF's dequantised weights, so quantised models
are referenced in float arithmetic on exactly the values the GGUF decodes to), loads the HF copy
with AutoModelForCausalLM (eager attention) and writes one golden file per model:

  - for each fixed prompt (token ids, built by make_prompts below): argmax and top1-top2 margin
    of the logits at every position; for f32 models also the full logits of every position;
  - a greedy 64-token continuation of every prompt (argmax, lowest id on ties; no EOS stop),
    and the margin at each step;
  - the perplexity of a text (tests/model/golden/ppl_text.txt) tokenised by the HF tokenizer:
    the ids, the NLL of every predicted token, and the perplexity.

The golden file format (text header + raw little-endian arrays) is described in
tests/model/golden/README.md. Usage (the README gives the exact command that made the goldens):

    python3 tools/reference/hf_logits.py --hotmoe BIN --work DIR --out DIR [--only PRESET-TYPE]
    python3 tools/reference/hf_logits.py --dry-run ...   # no torch: fake logits, tests the plumbing
    python3 tools/reference/hf_logits.py --dump FILE      # print a golden file's header
"""
import argparse
import array
import datetime
import hashlib
import math
import os
import platform
import random
import subprocess
import sys
import time

SEED = 42
N_GREEDY = 64
MODELS = [
    ("tiny-qwen3moe", ["f32", "q8_0", "q4_k_m"]),
    ("tiny-mixtral", ["f32", "q8_0", "q4_k_m"]),
    ("tiny-olmoe", ["f32", "q8_0", "q4_k_m"]),
    ("tiny-gpt-oss", ["f32", "q8_0", "q4_k_m", "mxfp4"]),
    ("tiny-qwen2moe", ["f32", "q8_0", "q4_k_m"]),
]
ID_LO, ID_HI = 3, 960  # ordinary tokens of every tiny vocabulary (specials sit at >= 984)


def lcg_ids(seed, n, lo=ID_LO, hi=ID_HI):
    """n ids in [lo, hi): x <- x*6364136223846793005 + 1442695040888963407 (mod 2^64),
    id = lo + (x >> 33) % (hi - lo). Written down so a C test could rebuild them."""
    x, out = seed, []
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(lo + (x >> 33) % (hi - lo))
    return out


def make_prompts(bos):
    """Four prompts; the last one (100 tokens) runs far past tiny-gpt-oss's 8-token window."""
    motif = lcg_ids(4, 8)
    return [
        ("bos_random", [bos] + lcg_ids(1, 39)),
        ("random", lcg_ids(2, 32)),
        ("bos_repeat", [bos] + motif * 4),
        ("bos_long", [bos] + lcg_ids(3, 99)),
    ]


class GoldenWriter:
    """Text header ("key value" lines, then "array NAME TYPE SHAPE OFFSET" lines, then "end"),
    then the arrays' bytes (little-endian f32 / i32), each at its OFFSET from the byte after
    "end\\n"."""

    def __init__(self):
        self.keys, self.arrays, self.blob = [], [], bytearray()

    def kv(self, key, value):
        value = str(value)
        assert " " not in key and "\n" not in value and key not in [k for k, _ in self.keys]
        self.keys.append((key, value))

    def arr(self, name, typ, shape, values):
        n = 1
        for d in shape:
            n *= d
        if hasattr(values, "numpy"):  # a torch tensor
            import torch
            t = values.detach().to("cpu", torch.float32 if typ == "f32" else torch.int32)
            data = t.contiguous().numpy().tobytes()
        else:
            a = array.array("f" if typ == "f32" else "i", values)
            data = a.tobytes()
        assert len(data) == 4 * n, (name, len(data), n)
        self.arrays.append((name, typ, "x".join(str(d) for d in shape), len(self.blob)))
        self.blob += data

    def write(self, path):
        assert sys.byteorder == "little"
        lines = ["hotmoe-golden 1"] + [f"{k} {v}" for k, v in self.keys]
        lines += [f"array {n} {t} {s} {o}" for n, t, s, o in self.arrays] + ["end"]
        with open(path + ".tmp", "wb") as f:
            f.write(("\n".join(lines) + "\n").encode())
            f.write(self.blob)
        os.replace(path + ".tmp", path)


def read_header(path):
    with open(path, "rb") as f:
        head = []
        while True:
            line = f.readline().decode().rstrip("\n")
            head.append(line)
            if line == "end" or not line:
                return head


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def forge(hotmoe, work, preset, typ):
    gguf = os.path.join(work, f"{preset}-{typ}.gguf")
    hf = os.path.join(work, f"{preset}-{typ}-hf")
    subprocess.run([hotmoe, "forge", "--preset", preset, "--type", typ, "--seed", str(SEED),
                    "-o", gguf, "--hf", hf, "-q"], check=True)
    return gguf, hf


class FakeModel:
    """--dry-run stand-in: deterministic pseudo-logits, so the plumbing runs without torch."""

    def __init__(self, vocab):
        self.vocab = vocab

    def row(self, ids):
        r = random.Random(hash(tuple(ids)) & 0xFFFFFFFF)
        return [r.gauss(0.0, 1.0) for _ in range(self.vocab)]

    def logits(self, ids):
        return [self.row(ids[: i + 1]) for i in range(len(ids))]


def top2(row):
    """(argmax with the lowest id on ties, top1 - top2) of a list of floats."""
    best, b1, b2 = 0, -math.inf, -math.inf
    for i, v in enumerate(row):
        if v > b1:
            best, b2, b1 = i, b1, v
        elif v > b2:
            b2 = v
    return best, b1 - b2


class TorchRunner:
    """Loads the HF copy, runs forward passes in float64 (float32 as a cross-check)."""

    def __init__(self, hf_dir):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
        self.torch = torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        # eager attention and eager (per-expert loop) experts: the reference implementations,
        # and the only experts backend that runs in float64 (grouped_mm refuses doubles)
        kw = dict(attn_implementation="eager", output_loading_info=True, dtype=torch.float32)
        self.experts_impl = "eager"
        try:
            model, info = AutoModelForCausalLM.from_pretrained(hf_dir, experts_implementation="eager",
                                                               **kw)
        except Exception as e:  # noqa: BLE001 - older transformers: no experts backends
            print(f"{hf_dir}: experts_implementation not accepted ({e!r})", flush=True)
            self.experts_impl = "default"
            model, info = AutoModelForCausalLM.from_pretrained(hf_dir, **kw)
        bad = [k for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)]
        if bad:
            raise RuntimeError(f"{hf_dir}: loading info {[(k, info[k]) for k in bad]}")
        model.eval()
        self.m32 = model
        self.cls = type(model).__name__
        self.versions = f"transformers-{transformers.__version__} torch-{torch.__version__}"
        self.tok = AutoTokenizer.from_pretrained(hf_dir)
        self.config = model.config
        import copy
        self.m64 = copy.deepcopy(model).double()
        self.dtype = "float64"
        try:  # float64 where the model's code allows it; else say float32
            probe = self._fwd(self.m64, [self.config.bos_token_id or 0, 5, 6, 7])
            if probe.dtype != torch.float64 or not bool(torch.isfinite(probe).all()):
                raise RuntimeError(f"float64 probe gave {probe.dtype}")
        except Exception as e:  # noqa: BLE001
            print(f"{hf_dir}: float64 failed ({e!r}), using float32", flush=True)
            self.m64, self.dtype = self.m32, "float32"

    def _fwd(self, model, ids):
        torch = self.torch
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long)
            return model(input_ids=x, use_cache=False).logits[0]

    def logits64(self, ids):
        return self._fwd(self.m64, ids)

    def logits32(self, ids):
        return self._fwd(self.m32, ids)


def top2_tensor(t):
    """argmax (first index of the max: torch.argmax's documented tie rule) and top1 - top2."""
    import torch
    am = torch.argmax(t, dim=-1)
    v = torch.topk(t, 2, dim=-1).values
    return am, (v[..., 0] - v[..., 1])


def run_model(args, preset, typ, text):
    t0 = time.time()
    gguf, hf = forge(args.hotmoe, args.work, preset, typ)
    w = GoldenWriter()
    w.kv("preset", preset)
    w.kv("type", typ)
    w.kv("seed", SEED)
    w.kv("forge", f"hotmoe forge --preset {preset} --type {typ} --seed {SEED}")
    w.kv("gguf_sha256", sha256_file(gguf))
    w.kv("gguf_size", os.path.getsize(gguf))
    w.kv("hf_safetensors_sha256", sha256_file(os.path.join(hf, "model.safetensors")))
    if args.dry_run:
        import json
        cfg = json.load(open(os.path.join(hf, "config.json")))
        vocab, bos = cfg["vocab_size"], cfg["bos_token_id"]
        fake = FakeModel(vocab)
        w.kv("reference", "FAKE-dry-run")
        w.kv("compute_dtype", "none")
        text_ids = [bos] + lcg_ids(9, 300)
    else:
        r = TorchRunner(hf)
        vocab, bos = r.config.vocab_size, r.config.bos_token_id
        w.kv("reference", r.versions)
        w.kv("hf_class", r.cls)
        w.kv("compute_dtype", r.dtype)
        w.kv("compute_device", "cpu")
        w.kv("attn_implementation", "eager")
        w.kv("experts_implementation", r.experts_impl)
        text_ids = r.tok.encode(text, add_special_tokens=True)
    w.kv("n_vocab", vocab)
    w.kv("bos", bos)
    w.kv("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    w.kv("host", platform.node() or "?")
    prompts = make_prompts(bos)
    w.kv("n_prompts", len(prompts))
    w.kv("n_greedy", N_GREEDY)
    full = typ == "f32"
    w.kv("has_logits", int(full))
    max32 = 0.0
    for k, (name, ids) in enumerate(prompts):
        w.kv(f"p{k}.name", name)
        w.arr(f"p{k}.ids", "i32", [len(ids)], ids)
        if args.dry_run:
            lg = fake.logits(ids)
            am, mg = zip(*[top2(row) for row in lg])
            if full:
                w.arr(f"p{k}.logits", "f32", [len(ids), vocab], [v for row in lg for v in row])
            w.arr(f"p{k}.argmax", "i32", [len(ids)], am)
            w.arr(f"p{k}.margin", "f32", [len(ids)], mg)
            seq, gm = list(ids), []
            for _ in range(N_GREEDY):
                a, m = top2(fake.row(seq))
                seq.append(a)
                gm.append(m)
        else:
            lg = r.logits64(ids)
            lg32 = r.logits32(ids)
            max32 = max(max32, float((lg32.double() - lg).abs().max()))
            am, mg = top2_tensor(lg)
            if full:
                w.arr(f"p{k}.logits", "f32", [len(ids), vocab], lg)
                w.kv(f"p{k}.logits_std", repr(float(lg.std())))
            w.arr(f"p{k}.argmax", "i32", [len(ids)], am)
            w.arr(f"p{k}.margin", "f32", [len(ids)], mg)
            seq, gm = list(ids), []
            a, m = int(am[-1]), float(mg[-1])
            for step in range(N_GREEDY):
                if step:
                    a_t, m_t = top2_tensor(r.logits64(seq)[-1])
                    a, m = int(a_t), float(m_t)
                seq.append(a)
                gm.append(m)
        w.arr(f"p{k}.greedy", "i32", [N_GREEDY], seq[len(ids):])
        w.arr(f"p{k}.greedy_margin", "f32", [N_GREEDY], gm)
    # perplexity over one context holding the whole text: token i+1 predicted from 0..i
    if args.dry_run:
        lg = fake.logits(text_ids)
        nll = []
        for i in range(len(text_ids) - 1):
            row = lg[i]
            mx = max(row)
            lse = mx + math.log(sum(math.exp(v - mx) for v in row))
            nll.append(lse - row[text_ids[i + 1]])
        nll_sum = sum(nll)
    else:
        import torch
        lg = r.logits64(text_ids)
        lp = torch.log_softmax(lg, dim=-1)
        tgt = torch.tensor(text_ids[1:], dtype=torch.long)
        nll_t = -lp[:-1].gather(1, tgt[:, None])[:, 0]
        nll_sum = float(nll_t.sum())
        nll = nll_t
        w.kv("f32_vs_f64_max_abs", repr(max32))
    n = len(text_ids) - 1
    w.kv("ppl_text", "tests/model/golden/ppl_text.txt")
    w.kv("ppl_text_sha256", hashlib.sha256(text.encode()).hexdigest())
    w.kv("ppl_n_scored", n)
    w.kv("ppl_nll_sum", repr(nll_sum))
    w.kv("ppl", repr(math.exp(nll_sum / n)))
    w.arr("ppl.ids", "i32", [len(text_ids)], text_ids)
    w.arr("ppl.nll", "f32", [n], nll)
    w.kv("seconds", f"{time.time() - t0:.1f}")
    out = os.path.join(args.out, f"{preset}-{typ}.golden")
    w.write(out)
    print(f"{preset}-{typ}: {time.time() - t0:.1f}s ppl {math.exp(nll_sum / n):.4f} "
          f"f32-vs-f64 {max32:.3g} -> {out}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hotmoe", default="build/h9/hotmoe")
    ap.add_argument("--work", default="/tmp/hf_logits_work")
    ap.add_argument("--out", default="tests/model/golden")
    ap.add_argument("--text", default="tests/model/golden/ppl_text.txt")
    ap.add_argument("--only", action="append", help="PRESET-TYPE (repeatable)")
    ap.add_argument("--preset", action="append", help="PRESET (repeatable)")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--dump")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.dump:
        print("\n".join(read_header(args.dump)))
        return 0
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    text = open(args.text, encoding="utf-8").read()
    if not args.dry_run:
        import torch
        if args.threads:
            torch.set_num_threads(args.threads)
        print("torch", torch.__version__, "threads", torch.get_num_threads(), flush=True)
    bad = 0
    for preset, types in MODELS:
        for typ in types:
            if args.only and f"{preset}-{typ}" not in args.only:
                continue
            if args.preset and preset not in args.preset:
                continue
            try:
                run_model(args, preset, typ, text)
            except Exception as e:  # noqa: BLE001 - one line per failure, go on with the rest
                import traceback
                traceback.print_exc()
                print(f"FAILED {preset}-{typ}: {e!r}"[:2000], flush=True)
                bad += 1
    print(f"done, {bad} failed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
