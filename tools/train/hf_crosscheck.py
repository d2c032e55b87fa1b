#!/usr/bin/env python3
"""hf_crosscheck.py - hotmoe against HuggingFace transformers on a trained HF checkpoint.

The bar (docs/TRAINED_MODEL.md, "Verification"): the f32 GGUF that `hotmoe convert` makes of
the folder, run on the CPU with an f32 KV cache, gives transformers' greedy continuation for
64 tokens, and logits within 1e-4 x the standard deviation of transformers' logits at every
position; so does the GPU engine (-ngl 99) with its f32 KV cache. --gpu-kv f16 runs the GPU with
its default f16 cache instead: its logit figure is then reported (no bar) and its greedy tokens
must match.

DESIGN. For each prompt of tools/train/prompts.txt:
  1. the reference (transformers float32 on the CPU, eager attention and experts, as
     tools/reference/hf_logits.py loads a model; float64 beside it where the model allows)
     tokenizes the prompt and generates 64 tokens greedily (argmax, lowest id on ties, no stop
     at end tokens), then gives the logits of every position of prompt + continuation;
  2. per engine (CPU: -ctk f32 -ctv f32; GPU: -ngl 99 -ctk f32 -ctv f32), `hotmoe logits --all` of the same
     ids: max over positions of max|hotmoe - reference| / std(reference row) ("max rel"), and
     whether the argmax at each of the 64 steps is the reference's token (teacher-forced);
  3. per engine, `hotmoe run --temp 0 -n 64` from the prompt text: its own greedy continuation,
     compared as text with the bytes hotmoe prints for the reference's tokens (the GGUF's
     vocabulary decoded as src/tokenizer/tok_decode.c does: control and unused tokens print
     nothing), up to the first end-of-generation token, where hotmoe stops; the first
     differing token is the first whose decoded prefix the texts do not share.
  Also: hotmoe's tokenization of the prompt equals the reference's (`hotmoe tokenize`).
Verdict per prompt: an engine PASSes when the tokenizations agree, max rel <= 1e-4, the 64
teacher-forced argmaxes and the run's text equal the reference's (the GPU with --gpu-kv f16:
the run's text and the argmaxes only). Overall PASS when every prompt passes on
every engine that ran (--gpu auto skips the GPU where there is none, and says so).

--reference hotmoe (no torch: this machine) stands in hotmoe's own CPU f32-KV logits for
transformers, greedy by one `hotmoe logits --last` per step, optionally with --fake-noise X
(each reference row plus X x its std x a seeded Gaussian): it tests everything but torch.

    python3 tools/train/hf_crosscheck.py --hotmoe BIN --hf HFDIR [--work DIR] [--out DIR]
        [--reference hf|hotmoe] [--gpu auto|on|off] [--threads N] [--fake-noise X]
    bash tools/train/hf_crosscheck.sh HFDIR            # the device command (builds hotmoe)
Writes crosscheck.json and crosscheck.txt to --out (default $OUT when set). Last line:
"hf_crosscheck: PASS ..." or "hf_crosscheck: FAIL (...)"; exit status 0 on PASS, 1 otherwise.
"""
import argparse
import array
import codecs
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
PROMPTS = os.path.join(HERE, "prompts.txt")
N_GEN = 64
BAR = 1e-4
# control tokens hotmoe ends generation at (src/tokenizer/tok_vocab.c, llama.cpp's list)
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|endoftext|>",
             "<|eom_id|>", "<end_of_turn>", "<|end_of_text|>", "</s>"}
ENGINES = [  # name, hotmoe arguments, KV cache type, logits bar (None: reported only)
    ("cpu", ["-ctk", "f32", "-ctv", "f32"], "f32", BAR),
    ("gpu", ["-ngl", "99", "--gpu-strict", "-ctk", "f32", "-ctv", "f32"], "f32", BAR),
]
GPU_F16 = ("gpu", ["-ngl", "99", "--gpu-strict"], "f16", None)  # --gpu-kv f16


def log(msg):
    print(msg, flush=True)


class HotmoeError(RuntimeError):
    pass


# ------------------------------------------------------------------ text of token ids

def bytes_to_unicode():
    """GPT-2's byte -> printable character table (byte-level BPE vocabularies)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path, wanted):
    """The metadata values named in wanted (a set of keys) of a GGUF file; arrays as lists."""
    out = {}
    with open(path, "rb") as f:
        def rd(fmt):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) != n:
                raise RuntimeError(f"{path}: truncated GGUF header")
            return struct.unpack(fmt, b)[0]

        def rstr():
            n = rd("<Q")
            b = f.read(n)
            if len(b) != n:
                raise RuntimeError(f"{path}: truncated GGUF header")
            return b.decode("utf-8", "replace")

        def value(t, keep):
            if t == 8:
                return rstr()
            if t == 9:
                et, n = rd("<I"), rd("<Q")
                if not keep and et in GGUF_SCALARS:  # skip a scalar array without decoding it
                    f.seek(n * struct.calcsize(GGUF_SCALARS[et]), 1)
                    return None
                return [value(et, keep) for _ in range(n)]
            if t not in GGUF_SCALARS:
                raise RuntimeError(f"{path}: GGUF value type {t} unknown")
            return rd(GGUF_SCALARS[t])

        if f.read(4) != b"GGUF":
            raise RuntimeError(f"{path}: not a GGUF file")
        rd("<I")  # version
        rd("<Q")  # tensors
        for _ in range(rd("<Q")):
            k = rstr()
            v = value(rd("<I"), k in wanted)
            if k in wanted:
                out[k] = v
    return out


class GgufText:
    """Token ids -> the bytes `hotmoe run` prints for them, from the GGUF's vocabulary (byte-level
    BPE, as src/tokenizer/tok_decode.c: NORMAL pieces' GPT-2 byte symbols back to bytes, other
    characters kept; USER_DEFINED as written; CONTROL and UNUSED nothing), and hotmoe's
    end-of-generation tokens (eos, eot, eom, and the control tokens named in EOG_TEXTS)."""

    CONTROL, USER_DEFINED, UNUSED = 3, 4, 5

    def __init__(self, gguf):
        keys = {"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"}
        md = gguf_metadata(gguf, keys)
        if md.get("tokenizer.ggml.model") != "gpt2":
            raise RuntimeError(f"{gguf}: tokenizer model {md.get('tokenizer.ggml.model')!r}; "
                               "this check decodes byte-level BPE (gpt2) vocabularies only")
        self.tokens = md["tokenizer.ggml.tokens"]
        self.types = md.get("tokenizer.ggml.token_type") or [1] * len(self.tokens)
        self.u2b = {c: b for b, c in bytes_to_unicode().items()}
        self.eog = {md[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                    "tokenizer.ggml.eom_token_id") if k in md}
        self.eog |= {i for i, t in enumerate(self.tokens)
                     if t in EOG_TEXTS and self.types[i] == self.CONTROL}

    def raw(self, ids):
        out = bytearray()
        for i in ids:
            if not 0 <= i < len(self.tokens):
                raise RuntimeError(f"token id {i} is outside the vocabulary ({len(self.tokens)})")
            t, s = self.types[i], self.tokens[i]
            if t in (self.CONTROL, self.UNUSED):
                continue
            if t == self.USER_DEFINED:
                out += s.encode("utf-8")
                continue
            for ch in s:
                b = self.u2b.get(ch)
                out += bytes([b]) if b is not None else ch.encode("utf-8")
        return bytes(out)

    def text(self, ids):
        return self.raw(ids).decode("utf-8", "replace")

    def until_eog(self, ids):
        """ids up to (without) the first end-of-generation token, and that token's step."""
        for k, i in enumerate(ids):
            if i in self.eog:
                return ids[:k], k
        return list(ids), None

    def first_text_diff(self, ids, text):
        """None when ids decode to text; else the index of the token whose output holds the
        first character where they differ (a streaming UTF-8 decoder, as hotmoe's, holds back
        an incomplete character until its last byte); len(ids) when text only runs longer."""
        full = self.text(ids)
        if full == text:
            return None
        c = next((i for i, (a, b) in enumerate(zip(full, text)) if a != b),
                 min(len(full), len(text)))
        d = codecs.getincrementaldecoder("utf-8")("replace")
        n = 0
        for k, i in enumerate(ids):
            n += len(d.decode(self.raw([i])))
            if n > c:
                return k
        return len(ids)


# ------------------------------------------------------------------ hotmoe

def hm(cmd, what, on_gpu=False):
    """Runs hotmoe; its stdout. on_gpu: an error when hotmoe says it fell back to the CPU."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = r.stderr.decode("utf-8", "replace").strip().splitlines()
    if r.returncode != 0:
        raise HotmoeError(f"{what}: exit {r.returncode}: {' | '.join(err[-3:])}")
    if on_gpu:
        fell = [ln for ln in err if "running on the CPU" in ln or
                (ln.startswith("generation:") and "GPU" not in ln)]
        if fell:
            raise HotmoeError(f"{what}: not on the GPU: {fell[0]}")
    return r.stdout.decode("utf-8", "replace")


def read_logits(path):
    """A hotmoe logits file (docs/LOGITS.md): (header dict, flat array('f'))."""
    with open(path, "rb") as f:
        b = f.read()
    if b[:8] != b"HMLOGIT1":
        raise HotmoeError(f"{path}: not a hotmoe logits file")
    hl = struct.unpack_from("<I", b, 8)[0]
    h = json.loads(b[12:12 + hl])
    a = array.array("f")
    a.frombytes(b[12 + hl:])
    if sys.byteorder != "little":
        a.byteswap()
    if len(a) != h["n_rows"] * h["n_vocab"]:
        raise HotmoeError(f"{path}: {len(a)} floats, header says {h['n_rows']}x{h['n_vocab']}")
    return h, a


class Hotmoe:
    def __init__(self, binary, gguf, work, threads):
        self.bin, self.gguf, self.work, self.threads = binary, gguf, work, threads
        self.n_calls = 0

    def tokenize(self, text):
        out = hm([self.bin, "tokenize", "-m", self.gguf, "-p", text, "--ids-only"],
                 "hotmoe tokenize")
        return [int(x) for x in json.loads(out.strip())]

    def logits(self, ids, engine_args, last=False):
        """Rows of logits: list of array('f'), one per position (one row with last)."""
        self.n_calls += 1
        out = os.path.join(self.work, f"logits-{self.n_calls}.bin")
        cmd = [self.bin, "logits", "-m", self.gguf, "--ids", ",".join(map(str, ids)),
               "--last" if last else "--all", "-o", out, "-c", str(len(ids)),
               "-t", str(self.threads)] + engine_args
        hm(cmd, "hotmoe logits " + " ".join(engine_args), on_gpu="-ngl" in engine_args)
        h, a = read_logits(out)
        os.remove(out)
        n_rows, v = h["n_rows"], h["n_vocab"]
        if h.get("ids") != list(ids) or n_rows != (1 if last else len(ids)):
            raise HotmoeError(f"{out}: ids or rows differ from the request")
        return [a[r * v:(r + 1) * v] for r in range(n_rows)]

    def run_greedy(self, prompt, n, n_ctx, engine_args):
        """hotmoe run's own greedy continuation: the generated text (prompt not echoed)."""
        out = hm([self.bin, "run", "-m", self.gguf, "-p", prompt, "-n", str(n), "--temp", "0",
                  "--seed", "1", "--no-display-prompt", "-c", str(n_ctx),
                  "-t", str(self.threads)] + engine_args, "hotmoe run " + " ".join(engine_args),
                 on_gpu="-ngl" in engine_args)
        return out[:-1] if out.endswith("\n") else out  # run ends its text with one newline


# ------------------------------------------------------------------ comparison maths

def argmax(row):
    """Index of the largest value, the lowest one on ties (torch.argmax's rule)."""
    best, bv = 0, row[0]
    for i in range(1, len(row)):
        if row[i] > bv:
            best, bv = i, row[i]
    return best


def margin(row):
    """top1 - top2 of a row."""
    b1 = b2 = -math.inf
    for v in row:
        if v > b1:
            b1, b2 = v, b1
        elif v > b2:
            b2 = v
    return b1 - b2


def std_of(row):
    """Population standard deviation of a row, in float64."""
    n = len(row)
    m = math.fsum(row) / n
    return math.sqrt(math.fsum((x - m) * (x - m) for x in row) / n)


def rel_diff(rows, ref_rows):
    """Per position: max|rows - ref| / std(ref row). NaN anywhere gives NaN (never skipped)."""
    out = []
    for h, r in zip(rows, ref_rows):
        if len(h) != len(r):
            raise RuntimeError(f"rows of {len(h)} and {len(r)} logits")
        m = 0.0
        for x, y in zip(h, r):
            d = abs(x - y)
            if d != d:
                m = d
                break
            if d > m:
                m = d
        sd = std_of(r)
        out.append(m / sd if sd > 0 else math.inf)
    return out


def nan_max(values):
    m = 0.0
    for v in values:
        if v != v:
            return v
        m = max(m, v)
    return m


def forced_first_diff(rows, n_prompt, gen):
    """First step k whose argmax (row n_prompt - 1 + k) is not gen[k]; None when all agree."""
    for k, t in enumerate(gen):
        if argmax(rows[n_prompt - 1 + k]) != t:
            return k
    return None


# ------------------------------------------------------------------ references

class HFReference:
    """transformers float32 (and float64 where allowed) on the CPU: hf_logits.TorchRunner."""

    def __init__(self, hf_dir, threads):
        import torch  # the only place torch is needed
        sys.path.insert(0, os.path.join(REPO, "tools", "reference"))
        import hf_logits  # noqa: E402 - TorchRunner: eager attention and experts, TF32 off
        if threads:
            torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.torch = torch
        self.r = hf_logits.TorchRunner(hf_dir)
        self.info = (f"transformers {self.r.cls} float32 on the CPU (eager attention, experts "
                     f"{self.r.experts_impl}; float64 "
                     f"{'beside it' if self.r.dtype == 'float64' else 'refused: float32 only'}); "
                     f"{self.r.versions}")

    def encode(self, text):
        return list(self.r.tok.encode(text, add_special_tokens=True))

    def decode(self, ids):
        return self.r.tok.decode(ids, skip_special_tokens=True,
                                 clean_up_tokenization_spaces=False)

    def greedy(self, ids, n):
        """(n greedy tokens, the float32 logits row of each step)."""
        seq, steps = list(ids), []
        for _ in range(n):
            row = self.r.logits32(seq)[-1]
            steps.append(array.array("d", row.double().tolist()))
            seq.append(int(self.torch.argmax(row)))  # first index of the max
        return seq[len(ids):], steps

    def rows(self, ids):
        """{dtype: [array('d') per position]}: float32, and float64 where allowed."""
        out = {"float32": self.r.logits32(ids)}
        if self.r.dtype == "float64":
            out["float64"] = self.r.logits64(ids)
        return {k: [array.array("d", row.double().tolist()) for row in v] for k, v in out.items()}


class HotmoeReference:
    """No torch: hotmoe's own CPU f32-KV logits stand in for transformers (tests the rest)."""

    def __init__(self, hot, noise):
        self.hot, self.noise = hot, noise
        self.info = ("FAKE: hotmoe CPU f32 KV as the reference" +
                     (f", rows + {noise:g} x std x N(0,1)" if noise else ""))

    def encode(self, text):
        return self.hot.tokenize(text)

    def decode(self, ids):
        return None

    def _noisy(self, row, position):
        """row + noise x std(row) x N(0,1), the Gaussians a function of the position alone, so
        greedy's rows and rows()'s rows get the same noise."""
        r = array.array("d", row)
        if self.noise:
            rng = random.Random(position)
            s = self.noise * std_of(r)
            for j in range(len(r)):
                r[j] += s * rng.gauss(0.0, 1.0)
        return r

    def greedy(self, ids, n):
        seq, steps = list(ids), []
        for _ in range(n):
            steps.append(self._noisy(self.hot.logits(seq, ENGINES[0][1], last=True)[0],
                                     len(seq) - 1))
            seq.append(argmax(steps[-1]))
        return seq[len(ids):], steps

    def rows(self, ids):
        return {"float32": [self._noisy(r, i)
                            for i, r in enumerate(self.hot.logits(ids, ENGINES[0][1]))]}


# ------------------------------------------------------------------ main

def gpu_present():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return False
    r = subprocess.run([exe, "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return r.returncode == 0 and b"GPU" in r.stdout


def check_engine(hot, dec, ref32, p, engine):
    """One engine on one prompt: (the figures and the verdict as a dict, hotmoe's rows)."""
    name, eargs, kv, bar = engine
    ids, gen, n = p["ids"], p["gen"], len(p["ids"])
    e = {"kv": kv, "args": " ".join(eargs)}
    rows = hot.logits(ids + gen, eargs)
    rel = rel_diff(rows, ref32)
    e["max_rel"] = nan_max(rel)
    e["max_rel_position"] = next(i for i, v in enumerate(rel) if v == e["max_rel"] or v != v)
    e["max_rel_steps"] = nan_max(rel[n - 1:n - 1 + len(gen)])
    k = forced_first_diff(rows, n, gen)
    e["forced_first_diff"] = k
    text = hot.run_greedy(p["prompt"], len(gen), n + len(gen) + 16, eargs)
    e["run_text"] = text
    k2 = dec.first_text_diff(p["gen_until_eog"], text)
    e["run_first_diff"] = k2
    e["tokens_equal"] = k2 is None
    if k2 is not None and k2 < len(gen):
        e["ref_margin_at_run_diff"] = p["margins"][k2]
    ok = k is None and k2 is None
    if bar is not None:
        ok = ok and p["tokenizer_equal"] and e["max_rel"] <= bar  # NaN fails
    e["pass"] = ok
    return e, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hotmoe", required=True, help="the hotmoe binary (CUDA build for the GPU)")
    ap.add_argument("--hf", required=True, help="the HF folder (config.json, model.safetensors, "
                    "tokenizer.json, ...)")
    ap.add_argument("--gguf", help="use this f32 GGUF instead of converting --hf")
    ap.add_argument("--work", default="/tmp/hf_crosscheck")
    ap.add_argument("--out", default=os.environ.get("OUT") or None,
                    help="results folder (default: $OUT if set)")
    ap.add_argument("--reference", choices=["hf", "hotmoe"], default="hf")
    ap.add_argument("--gpu-kv", choices=["f32", "f16"], default="f32",
                    help="the GPU engine's KV cache: f32 (held to the bar) or f16 (reported)")
    ap.add_argument("--gpu", choices=["auto", "on", "off"], default="auto",
                    help="run -ngl 99 too (auto: when nvidia-smi lists a GPU)")
    ap.add_argument("--threads", type=int, default=4, help="hotmoe and torch threads")
    ap.add_argument("--prompts", default=PROMPTS, help="one prompt a line")
    ap.add_argument("--n-gen", type=int, default=N_GEN)
    ap.add_argument("--fake-noise", type=float, default=0.0,
                    help="--reference hotmoe: add X x std x N(0,1) to the reference rows")
    args = ap.parse_args()
    if args.n_gen < 1 or args.threads < 1:
        ap.error("--n-gen and --threads must be >= 1")
    if args.fake_noise and args.reference != "hotmoe":
        ap.error("--fake-noise goes with --reference hotmoe")
    args.hotmoe = os.path.abspath(args.hotmoe)
    os.makedirs(args.work, exist_ok=True)
    t0 = time.time()
    lines = []

    def say(s):
        log(s)
        lines.append(s)

    def finish(verdict, result):
        say(verdict)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            result["verdict"] = verdict
            with open(os.path.join(args.out, "crosscheck.json"), "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1, ensure_ascii=False)
            with open(os.path.join(args.out, "crosscheck.txt"), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
        return 0 if verdict.startswith("hf_crosscheck: PASS") else 1

    result = {"hf": os.path.abspath(args.hf), "hotmoe": args.hotmoe, "bar": BAR,
              "n_gen": args.n_gen, "reference": args.reference, "prompts": []}
    try:
        with open(args.prompts, encoding="utf-8") as f:
            prompts = [ln.rstrip("\n") for ln in f if ln.strip()]
        gguf = args.gguf or os.path.join(args.work, "model-f32.gguf")
        if not args.gguf:
            hm([args.hotmoe, "convert", args.hf, "-o", gguf, "--type", "f32", "-q"],
               "hotmoe convert --type f32")
        dec = GgufText(gguf)
        result["gguf"] = gguf
        hot = Hotmoe(args.hotmoe, gguf, args.work, args.threads)
        engines = [ENGINES[0]]
        use_gpu = args.gpu == "on" or (args.gpu == "auto" and gpu_present())
        if use_gpu:
            engines.append(ENGINES[1] if args.gpu_kv == "f32" else GPU_F16)
        ref = (HFReference(args.hf, args.threads) if args.reference == "hf"
               else HotmoeReference(hot, args.fake_noise))
    except ImportError as e:
        return finish(f"hf_crosscheck: FAIL (no PyTorch/transformers here: {e}; "
                      "--reference hotmoe runs without them)", result)
    except (OSError, RuntimeError, ValueError, KeyError) as e:
        return finish(f"hf_crosscheck: FAIL ({e})", result)
    result["reference_info"] = ref.info
    say(f"hf_crosscheck: {args.hf} -> {gguf} (f32); {len(prompts)} prompts x {args.n_gen} "
        f"greedy tokens; bar {BAR:g} x std (CPU, f32 KV)")
    say(f"reference: {ref.info}")
    if use_gpu and args.gpu_kv == "f32":
        gpu_line = "GPU -ngl 99 --gpu-strict -ctk f32 -ctv f32 (the same bar)"
    elif use_gpu:
        gpu_line = ("GPU -ngl 99 --gpu-strict (f16 KV, --gpu-kv f16: figure reported, tokens "
                    "must match)")
    else:
        gpu_line = f"GPU not run (--gpu {args.gpu}" + \
            (", no nvidia-smi GPU)" if args.gpu == "auto" else ")")
    say(f"engines: CPU -ctk f32 -ctv f32; {gpu_line}")
    problems = []
    hdr = (f"{'prompt':<30} {'engine':<6} {'KV':<4} {'max rel':>9} {'(steps)':>9} "
           f"{'forced argmax':<14} {'run tokens':<20} verdict")
    table = [hdr, "-" * len(hdr)]
    for pi, prompt in enumerate(prompts):
        p = {"prompt": prompt}
        result["prompts"].append(p)
        try:
            p["ids"] = ref.encode(prompt)
            p["hotmoe_ids"] = hot.tokenize(prompt)
            p["tokenizer_equal"] = p["ids"] == p["hotmoe_ids"]
            if not p["ids"]:
                raise RuntimeError("the prompt has no tokens")
            p["gen"], steps = ref.greedy(p["ids"], args.n_gen)
            full = p["ids"] + p["gen"]
            refrows = ref.rows(full)
            n = len(p["ids"])
            r32 = refrows["float32"]
            # the reference's step rows (growing sequence) against its one pass over all ids
            p["ref_steps_vs_pass_max_rel"] = nan_max(rel_diff(steps, r32[n - 1:]))
            p["ref_self_forced_first_diff"] = forced_first_diff(r32, n, p["gen"])
            p["margins"] = [margin(r32[n - 1 + k]) for k in range(len(p["gen"]))]
            p["gen_until_eog"], p["eog_step"] = dec.until_eog(p["gen"])
            p["ref_text"] = dec.text(p["gen_until_eog"])
            hf_text = ref.decode(p["gen_until_eog"])
            p["decoder_equal"] = None if hf_text is None else hf_text == p["ref_text"]
            if "float64" in refrows:
                p["float32_vs_float64_max_rel"] = nan_max(rel_diff(r32, refrows["float64"]))
            p["engines"] = {}
            for eng in engines:
                e, rows = check_engine(hot, dec, r32, p, eng)
                if "float64" in refrows:
                    e["max_rel_vs_float64"] = nan_max(rel_diff(rows, refrows["float64"]))
                p["engines"][eng[0]] = e
        except (HotmoeError, RuntimeError, OSError, ValueError) as e:
            problems.append(f"prompt {pi + 1}: {e}")
            table.append(f"{prompt[:30]:<30} error: {e}")
            continue
        g = len(p["gen"])
        if not p["tokenizer_equal"]:
            problems.append(f"prompt {pi + 1}: hotmoe tokenizes it as {p['hotmoe_ids']}, "
                            f"the reference as {p['ids']}")
        if p["decoder_equal"] is False:
            say(f"note: prompt {pi + 1}: transformers decodes the continuation differently from "
                "the GGUF's vocabulary")
        for name, e in p["engines"].items():
            fk, rk = e["forced_first_diff"], e["run_first_diff"]
            forced = f"{g}/{g} equal" if fk is None else f"differ at {fk}"
            run = "equal" if rk is None else f"differ at token {rk}"
            if rk is None and p["eog_step"] is not None:
                run += f" (end token at {p['eog_step']})"
            if "ref_margin_at_run_diff" in e:
                run += f" (ref margin {e['ref_margin_at_run_diff']:.2g})"
            verdict = "PASS" if e["pass"] else "FAIL"
            table.append(f"{prompt[:30]:<30} {name:<6} {e['kv']:<4} {e['max_rel']:>9.3g} "
                         f"{e['max_rel_steps']:>9.3g} {forced:<14} {run:<20} {verdict}")
            if not e["pass"]:
                problems.append(f"prompt {pi + 1} {name}: max rel {e['max_rel']:.3g}, forced "
                                f"argmax {forced}, run {run}")
    for t in table:
        say(t)
    for pi, p in enumerate(result["prompts"]):
        if "ref_text" not in p:
            continue
        say(f"--- prompt {pi + 1}: {p['prompt']!r}")
        say(f"reference: {p['ref_text']!r}" + (f" [end token at step {p['eog_step']}]"
                                                 if p["eog_step"] is not None else ""))
        for name, e in p.get("engines", {}).items():
            if not e["tokens_equal"]:
                say(f"hotmoe {name}: {e['run_text']!r}")
        if "ref_steps_vs_pass_max_rel" in p:
            say(f"reference: its {len(p['gen'])} step rows against one pass over all ids: max rel "
                f"{p['ref_steps_vs_pass_max_rel']:.3g}; its own argmax of that pass "
                + ("agrees at every step" if p["ref_self_forced_first_diff"] is None else
                   f"differs at step {p['ref_self_forced_first_diff']}"))
        if "float32_vs_float64_max_rel" in p:
            extra = ", ".join(f"hotmoe {k} {e['max_rel_vs_float64']:.3g}"
                              for k, e in p["engines"].items() if "max_rel_vs_float64" in e)
            say(f"against float64: transformers float32 {p['float32_vs_float64_max_rel']:.3g}"
                f"{', ' + extra if extra else ''} (max rel)")
    say(f"total {time.time() - t0:.1f} s")
    if not prompts:
        problems.append(f"no prompts in {args.prompts}")
    if problems:
        for pr in problems:
            say(f"problem: {pr}")
        return finish(f"hf_crosscheck: FAIL ({len(problems)} problems)", result)
    gpu_note = "CPU and GPU" if use_gpu else "CPU only, GPU not run"
    return finish(f"hf_crosscheck: PASS ({gpu_note}; reference {args.reference})", result)


if __name__ == "__main__":
    sys.exit(main())
