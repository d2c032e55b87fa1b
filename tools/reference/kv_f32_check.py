#!/usr/bin/env python3
"""hotmoe's CPU logits with an f32 (and f16, bf16) KV cache against HuggingFace transformers.

The bar: with `--cache-type-k f32 --cache-type-v f32`, an f32 model's logits match HF's within
1e-4 x the standard deviation of HF's logits, at every position of every prompt. The f16 cache
(hotmoe's default) is printed beside it for comparison (its K/V rounding alone moves logits by
a few 1e-4 x std), and bf16 too.

Two halves, kept apart so that the first runs where there is no PyTorch:

  1. hotmoe side (no torch): for every tiny preset, `hotmoe forge --type f32 --seed 42 --hf DIR`
     (the GGUF and its HF twin: the same f32 weights), then `hotmoe logits --ids ... --all` on
     the CPU for each prompt and each cache type (f32, f16, bf16), plus self-checks: the f32
     cache's logits are the same bytes with 1 thread, with all threads and with ubatches of one
     token, and differ from the f16 cache's (the type took effect).
  2. reference side, one of:
       --reference hf      (default; the GPU machine: PyTorch + transformers, no network) loads
                           each HF twin as tools/reference/hf_logits.py does (eager attention,
                           eager experts) and runs the same ids on the CPU in float32 and
                           float64 (float64 where the model's code allows it);
       --reference golden  (anywhere, no torch) the float64 HF logits of the committed goldens
                           (tests/model/golden/<preset>-f32.golden, made by hf_logits.py on the
                           same forged models and the same prompts): for testing this script
                           and the hotmoe half without torch.

Prompts: hf_logits.make_prompts (BOS + 39 ids, 32 ids, BOS + a motif x 4, BOS + 99 ids: the last
runs far past tiny-gpt-oss's 8-token window). Metric per model: max over its prompts of
max|hotmoe - reference| / std(reference logits of that prompt). PASS when the f32 cache's metric
is <= 1e-4 against every reference dtype for every model and the self-checks hold. Prints one
table and a last line `kv_f32_check: PASS` or `kv_f32_check: FAIL (...)`; with --out (or the
environment variable OUT) also writes kv_f32_check.json and kv_f32_check.txt there. Exit status
0 on PASS, 1 otherwise.

    python3 tools/reference/kv_f32_check.py --hotmoe build/release/hotmoe [--reference golden]
    bash tools/reference/kv_f32_check.sh      # builds hotmoe (CPU) first; the device command
"""
import argparse
import array
import json
import math
import os
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_logits  # noqa: E402 - make_prompts, TorchRunner: the goldens' own recipe

PRESETS = ["tiny-qwen3moe", "tiny-mixtral", "tiny-olmoe", "tiny-gpt-oss", "tiny-qwen2moe"]
CACHE_TYPES = ["f32", "f16", "bf16"]
BAR = 1e-4
SEED = hf_logits.SEED


def log(msg):
    print(msg, flush=True)


# ------------------------------------------------------------------ hotmoe side (no torch)

def read_logits(path):
    """A hotmoe logits file (docs/LOGITS.md): (header dict, flat array('f'))."""
    with open(path, "rb") as f:
        b = f.read()
    if b[:8] != b"HMLOGIT1":
        raise RuntimeError(f"{path}: not a hotmoe logits file")
    hl = struct.unpack_from("<I", b, 8)[0]
    h = json.loads(b[12:12 + hl])
    a = array.array("f")
    a.frombytes(b[12 + hl:])
    if sys.byteorder != "little":
        a.byteswap()
    if len(a) != h["n_rows"] * h["n_vocab"]:
        raise RuntimeError(f"{path}: {len(a)} floats, header says {h['n_rows']}x{h['n_vocab']}")
    return h, a


def logits_bytes(path):
    with open(path, "rb") as f:
        b = f.read()
    return b[12 + struct.unpack_from("<I", b, 8)[0]:]


def hotmoe_logits(hotmoe, gguf, ids, out, ctype, threads, ub=None):
    cmd = [hotmoe, "logits", "-m", gguf, "--ids", ",".join(map(str, ids)), "--all", "-o", out,
           "-t", str(threads), "-c", str(len(ids)), "--cache-type-k", ctype,
           "--cache-type-v", ctype]
    if ub:
        cmd += ["-ub", str(ub)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return out


def hotmoe_side(args, preset):
    """Forges preset in f32 with its HF twin and runs every prompt with every cache type.
    Returns dict: gguf, hf, bos, prompts [(name, ids)], logits {ctype: [array per prompt]},
    checks [(name, ok, detail)]."""
    d = os.path.join(args.work, preset)
    os.makedirs(d, exist_ok=True)
    gguf, hf = os.path.join(d, f"{preset}-f32.gguf"), os.path.join(d, f"{preset}-f32-hf")
    subprocess.run([args.hotmoe, "forge", "--preset", preset, "--type", "f32", "--seed",
                    str(SEED), "-o", gguf, "--hf", hf, "-q"], check=True)
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    bos = cfg["bos_token_id"]
    prompts = hf_logits.make_prompts(bos)
    res = {"gguf": gguf, "hf": hf, "bos": bos, "prompts": prompts, "n_vocab": cfg["vocab_size"],
           "logits": {t: [] for t in CACHE_TYPES}, "checks": []}
    nthr = os.cpu_count() or 1
    for k, (name, ids) in enumerate(prompts):
        for t in CACHE_TYPES:
            out = hotmoe_logits(args.hotmoe, gguf, ids, os.path.join(d, f"p{k}-{t}.bin"), t,
                                args.threads)
            h, a = read_logits(out)
            if h["ids"] != ids or h["n_vocab"] != res["n_vocab"]:
                raise RuntimeError(f"{out}: ids or vocabulary differ from the request")
            res["logits"][t].append(a)
        # self-checks on the longest prompt: thread count, ubatch, the type taking effect
        if k == len(prompts) - 1:
            base = logits_bytes(os.path.join(d, f"p{k}-f32.bin"))
            for tag, thr, ub in (("1 thread", 1, None), (f"{nthr} threads", nthr, None),
                                 ("ubatch 1", args.threads, 1)):
                o = hotmoe_logits(args.hotmoe, gguf, ids, os.path.join(d, f"p{k}-f32-x.bin"),
                                  "f32", thr, ub)
                same = logits_bytes(o) == base
                res["checks"].append((f"f32 cache, -t {args.threads} == {tag}", same,
                                      "same bytes" if same else "bytes differ"))
            for t in ("f16", "bf16"):
                diff = logits_bytes(os.path.join(d, f"p{k}-{t}.bin")) != base
                res["checks"].append((f"{t} cache's logits differ from f32's", diff,
                                      "differ" if diff else "identical: type not applied?"))
    return res


# ------------------------------------------------------------------ references

def std_of(ref):
    """Population std of a flat sequence of floats, in float64 (as the goldens' logits_std)."""
    n = len(ref)
    m = math.fsum(ref) / n
    return math.sqrt(math.fsum((x - m) * (x - m) for x in ref) / n)


def maxdiff(a, ref):
    """max |a - ref|; NaN if any difference is NaN (Python's max would skip some)."""
    m = 0.0
    for x, y in zip(a, ref):
        d = abs(x - y)
        if d != d:
            return d
        if d > m:
            m = d
    return m


class GoldenReference:
    """The committed goldens' float64 HF logits (no torch)."""

    def __init__(self, repo):
        self.repo = repo

    def open(self, preset, side):
        path = os.path.join(self.repo, "tests", "model", "golden", f"{preset}-f32.golden")
        with open(path, "rb") as f:
            b = f.read()
        end = b.index(b"\nend\n") + 5
        hdr = b[:end].decode().split("\n")
        kv, arrs = {}, {}
        for line in hdr:
            p = line.split(" ")
            if p[0] == "array":
                arrs[p[1]] = (p[2], [int(x) for x in p[3].split("x")], int(p[4]))
            elif len(p) >= 2:
                kv[p[0]] = line[len(p[0]) + 1:]
        data = b[end:]

        def arr(name):
            typ, shape, off = arrs[name]
            n = 1
            for s in shape:
                n *= s
            a = array.array("f" if typ == "f32" else "i")
            a.frombytes(data[off:off + 4 * n])
            return a

        out = {}
        for k, (_, ids) in enumerate(side["prompts"]):
            if list(arr(f"p{k}.ids")) != ids:
                raise RuntimeError(f"{path}: prompt {k} ids differ from make_prompts")
            out[k] = {kv.get("compute_dtype", "float64") + " (golden)": arr(f"p{k}.logits")}
        info = f"golden {os.path.basename(path)}: {kv.get('reference', '?')}, " \
               f"{kv.get('compute_dtype', '?')}, made {kv.get('date', '?')}"
        if kv.get("gguf_size") and int(kv["gguf_size"]) != os.path.getsize(side["gguf"]):
            raise RuntimeError(f"{path}: gguf_size {kv['gguf_size']} != forged "
                               f"{os.path.getsize(side['gguf'])}: goldens stale")
        return out, info


class HFReference:
    """transformers on the HF twin, float32 and float64 (hf_logits.TorchRunner)."""

    def __init__(self, threads):
        import torch  # the only place torch is needed
        if threads:
            torch.set_num_threads(threads)
        self.torch = torch

    def open(self, preset, side):
        r = hf_logits.TorchRunner(side["hf"])
        out = {}
        for k, (_, ids) in enumerate(side["prompts"]):
            out[k] = {}
            for dt, fn in (("float32", r.logits32), ("float64", r.logits64)):
                if dt == "float64" and r.dtype != "float64":
                    continue  # TorchRunner said why (float64 refused): float32 only
                lg = fn(ids).double().contiguous()
                if lg.shape[0] != len(ids) or lg.shape[1] != side["n_vocab"]:
                    raise RuntimeError(f"{preset}: HF logits shape {tuple(lg.shape)}")
                out[k][dt] = array.array("d", lg.reshape(-1).tolist())
        info = f"HF {r.cls}: {r.versions}, experts {r.experts_impl}, float64 " \
               f"{'yes' if r.dtype == 'float64' else 'no (float32 only)'}"
        return out, info


# ------------------------------------------------------------------ main

def compare(side, refs):
    """{ref dtype: {cache type: max over prompts of max|diff| / std}}."""
    table = {}
    for k in range(len(side["prompts"])):
        for dt, ref in refs[k].items():
            sd = std_of(ref)
            for t in CACHE_TYPES:
                v = maxdiff(side["logits"][t][k], ref) / sd
                row = table.setdefault(dt, {})
                prev = row.get(t, 0.0)
                row[t] = v if v != v or prev != prev or v > prev else prev  # NaN sticks
    return table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hotmoe", required=True, help="the hotmoe binary (a CPU build is enough)")
    ap.add_argument("--work", default="/tmp/kv_f32_check")
    ap.add_argument("--out", default=os.environ.get("OUT") or None,
                    help="results folder (default: $OUT if set)")
    ap.add_argument("--reference", choices=["hf", "golden"], default="hf")
    ap.add_argument("--preset", action="append", help="PRESET (repeatable; default: all five)")
    ap.add_argument("--threads", type=int, default=4, help="hotmoe and torch threads")
    args = ap.parse_args()
    args.hotmoe = os.path.abspath(args.hotmoe)
    repo = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    os.makedirs(args.work, exist_ok=True)
    t0 = time.time()
    lines, results, problems = [], [], []

    def say(s):
        log(s)
        lines.append(s)

    try:
        reference = (GoldenReference(repo) if args.reference == "golden"
                     else HFReference(args.threads))
    except ImportError as e:
        say(f"kv_f32_check: FAIL (no PyTorch here: {e}; --reference golden runs without it)")
        return 1
    say(f"kv_f32_check: hotmoe {args.hotmoe}, reference {args.reference}, bar {BAR:g} x std")
    header = f"{'model':<15} {'reference':<18} " + " ".join(f"{t + ' cache':>11}" for t in
                                                            CACHE_TYPES) + "  f32 verdict"
    rows = []
    for preset in args.preset or PRESETS:
        t1 = time.time()
        try:
            side = hotmoe_side(args, preset)
            refs, info = reference.open(preset, side)
        except Exception as e:  # noqa: BLE001 - one line per model, go on with the rest
            problems.append(f"{preset}: {e!r}"[:500])
            say(f"{preset}: ERROR {e!r}"[:2000])
            continue
        say(f"{preset}: {info} ({time.time() - t1:.1f}s)")
        for name, ok, detail in side["checks"]:
            say(f"  check: {name}: {detail}{'' if ok else '  <-- FAIL'}")
            if not ok:
                problems.append(f"{preset}: {name}: {detail}")
        table = compare(side, refs)
        for dt, row in table.items():
            ok = row["f32"] <= BAR
            if not ok:
                problems.append(f"{preset}: f32 cache {row['f32']:.3g} x std from {dt}")
            rows.append(f"{preset:<15} {dt:<18} " + " ".join(f"{row[t]:>11.3e}" for t in
                                                            CACHE_TYPES)
                        + f"  {'PASS' if ok else 'FAIL'}")
            results.append({"preset": preset, "reference": dt, "bar": BAR, "pass": ok,
                            **{f"{t}_cache_maxdiff_over_std": row[t] for t in CACHE_TYPES}})
    say("")
    say("max |hotmoe logits - reference| / std(reference logits), worst prompt of 4:")
    say(header)
    for r in rows:
        say(r)
    if not results:
        problems.append("no model compared")
    verdict = "PASS" if not problems else f"FAIL ({len(problems)}: {'; '.join(problems)})"
    say(f"kv_f32_check: {verdict}  [{time.time() - t0:.1f}s]")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "kv_f32_check.json"), "w") as f:
            json.dump({"reference": args.reference, "bar": BAR, "pass": not problems,
                       "problems": problems, "results": results,
                       "seconds": round(time.time() - t0, 1)}, f, indent=1)
        with open(os.path.join(args.out, "kv_f32_check.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
