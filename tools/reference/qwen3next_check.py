#!/usr/bin/env python3
"""hotmoe's CPU engine on tiny-qwen3next against HuggingFace transformers' Qwen3NextForCausalLM.

The bar (as for the other architectures' f32 checks, tests/model/golden/README.md): with an f32
model and an f32 KV cache, hotmoe's logits at every position of every prompt are within
1e-4 x the standard deviation of the reference's logits of that prompt, and the greedy 64-token
continuation of every prompt (argmax, lowest id on ties, no EOS stop) is the same token list.

  1. hotmoe side (no torch): `hotmoe forge --preset tiny-qwen3next --type f32 --seed 42 --hf DIR`
     (the GGUF and its HF twin: the same f32 weights; the twin holds the zero-centred norms as
     w - 1, A_log = ln(-ssm_a) and in_proj_qkvz regrouped per key head, as transformers reads
     them), then `hotmoe logits --ids ... --all -ctk f32 -ctv f32` for each prompt of
     hf_logits.make_prompts, and the greedy continuations (`--last`, one token more per call);
     self-check: the prompt's logits are the same bytes with -ub 1 (token by token).
  2. reference side (the GPU machine: PyTorch + transformers, no network): the twin loaded as
     tools/reference/hf_logits.py loads it (eager attention, eager experts), computed on the CPU
     in float64 (float32 where the model's code refuses doubles); the same prompts and greedy
     continuations. Where torch or transformers (with Qwen3NextForCausalLM) is missing, the
     check says SKIPPED and exits 77.

Prints one table and a last line `qwen3next_check: PASS`, `... FAIL (...)` or
`... SKIPPED (...)`; with --out (or OUT) also writes qwen3next_check.json there. Exit status 0 on
PASS, 1 on FAIL, 77 on SKIPPED.

    python3 tools/reference/qwen3next_check.py --hotmoe build/release/hotmoe
    python3 tools/reference/qwen3next_check.py --hotmoe-only ...   # no torch: the hotmoe side
    bash tools/reference/qwen3next_check.sh      # builds hotmoe (CPU) first; the device command
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_logits  # noqa: E402 - make_prompts, TorchRunner, SEED, N_GREEDY
import kv_f32_check  # noqa: E402 - read_logits, logits_bytes, std_of, maxdiff

PRESET = "tiny-qwen3next"
CLASS = "Qwen3NextForCausalLM"
NAME = "qwen3next_check"
BAR = 1e-4
SKIP = 77


def log(msg):
    print(msg, flush=True)


def hotmoe_logits(hotmoe, gguf, ids, out, threads, last=False, ub=None):
    cmd = [hotmoe, "logits", "-m", gguf, "--ids", ",".join(map(str, ids)),
           "--last" if last else "--all", "-o", out, "-t", str(threads), "-c", str(len(ids)),
           "-ctk", "f32", "-ctv", "f32"]
    if ub:
        cmd += ["-ub", str(ub)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr.strip()}")
    return kv_f32_check.read_logits(out)


def argmax(row):
    """lowest id on ties, as torch.argmax"""
    best = 0
    for i, v in enumerate(row):
        if v > row[best]:
            best = i
    return best


def hotmoe_side(args):
    d = os.path.join(args.work, PRESET)
    os.makedirs(d, exist_ok=True)
    gguf, hf = os.path.join(d, f"{PRESET}-f32.gguf"), os.path.join(d, f"{PRESET}-f32-hf")
    subprocess.run([args.hotmoe, "forge", "--preset", PRESET, "--type", "f32", "--seed",
                    str(hf_logits.SEED), "-o", gguf, "--hf", hf, "-q"], check=True)
    with open(os.path.join(hf, "config.json")) as f:
        cfg = json.load(f)
    prompts = hf_logits.make_prompts(cfg["bos_token_id"])
    res = {"gguf": gguf, "hf": hf, "prompts": prompts, "n_vocab": cfg["vocab_size"],
           "logits": [], "greedy": [], "checks": []}
    out = os.path.join(d, "l.bin")
    for k, (name, ids) in enumerate(prompts):
        h, a = hotmoe_logits(args.hotmoe, gguf, ids, out, args.threads)
        if h["ids"] != ids or h["n_vocab"] != res["n_vocab"]:
            raise RuntimeError(f"{out}: ids or vocabulary differ from the request")
        res["logits"].append(a)
        base = kv_f32_check.logits_bytes(out)
        hotmoe_logits(args.hotmoe, gguf, ids, out, args.threads, ub=1)
        same = kv_f32_check.logits_bytes(out) == base
        res["checks"].append((f"p{k} prompt == token by token (-ub 1)", same,
                              "same bytes" if same else "bytes differ"))
        V = res["n_vocab"]
        seq = list(ids)
        nxt = argmax(a[(len(ids) - 1) * V:])
        for _ in range(hf_logits.N_GREEDY):
            seq.append(nxt)
            _, row = hotmoe_logits(args.hotmoe, gguf, seq, out, args.threads, last=True)
            nxt = argmax(row)
        res["greedy"].append(seq[len(ids):])
    return res


def reference_side(res):
    """(logits per prompt as flat lists, greedy lists, info) from transformers"""
    r = hf_logits.TorchRunner(res["hf"])
    if r.cls != CLASS:
        raise RuntimeError(f"{res['hf']}: loaded as {r.cls}")
    logits, greedy = [], []
    for _, ids in res["prompts"]:
        lg = r.logits64(ids)
        logits.append([float(x) for x in lg.reshape(-1).tolist()])
        seq = list(ids)
        for _ in range(hf_logits.N_GREEDY):
            a, _ = hf_logits.top2_tensor(r.logits64(seq)[-1])
            seq.append(int(a))
        greedy.append(seq[len(ids):])
    return logits, greedy, f"{r.versions}, {r.dtype}, {r.experts_impl} experts"


def main(preset=None, cls=None, name=None, doc=None):
    """the check; tools/reference/qwen35moe_check.py runs it for another hybrid preset"""
    global PRESET, CLASS, NAME
    PRESET, CLASS, NAME = preset or PRESET, cls or CLASS, name or NAME
    ap = argparse.ArgumentParser(description=(doc or __doc__).split("\n")[0])
    ap.add_argument("--hotmoe", default="build/release/hotmoe")
    ap.add_argument("--work", default=f"/tmp/{NAME}")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--hotmoe-only", action="store_true",
                    help="no torch: the hotmoe side and its self-checks only (tests the plumbing)")
    args = ap.parse_args()
    t0 = time.time()
    if args.hotmoe_only:
        os.makedirs(args.work, exist_ok=True)
        res = hotmoe_side(args)
        for k, (name, ids) in enumerate(res["prompts"]):
            log(f"p{k} {name}: {len(ids)} ids, greedy {res['greedy'][k][:8]}...")
        bad = [n for n, ok, _ in res["checks"] if not ok]
        for name, ok, detail in res["checks"]:
            log(f"check {name}: {detail}")
        log(f"{NAME} (hotmoe side only): " + ("PASS" if not bad else f"FAIL ({bad})"))
        return 1 if bad else 0
    try:
        import torch  # noqa: F401
        import transformers
        if not hasattr(transformers, CLASS):
            raise ImportError(f"transformers {transformers.__version__} has no {CLASS}")
    except ImportError as e:
        log(f"{NAME}: SKIPPED (needs PyTorch and transformers with {CLASS}: {e})")
        return SKIP
    torch.set_num_threads(args.threads)
    os.makedirs(args.work, exist_ok=True)
    res = hotmoe_side(args)
    ref, ref_greedy, info = reference_side(res)
    log(f"reference: {info}")
    fails, rows = [], []
    for k, (name, ids) in enumerate(res["prompts"]):
        sd = kv_f32_check.std_of(ref[k])
        md = kv_f32_check.maxdiff(res["logits"][k], ref[k])
        ratio = md / sd if sd > 0 else float("inf")
        same = res["greedy"][k] == ref_greedy[k]
        first = next((i for i, (x, y) in enumerate(zip(res["greedy"][k], ref_greedy[k])) if x != y), -1)
        rows.append({"prompt": name, "n": len(ids), "max_abs": md, "std": sd, "ratio": ratio,
                     "greedy_same": same, "greedy_first_diff": first})
        log(f"p{k} {name:10s} n={len(ids):3d} max|diff| {md:.3g} std {sd:.4g} "
            f"ratio {ratio:.3g} greedy {'same' if same else f'differs at {first}'}")
        if not ratio <= BAR:
            fails.append(f"p{k} logits {ratio:.3g} x std > {BAR}")
        if not same:
            fails.append(f"p{k} greedy differs at step {first}")
    for name, ok, detail in res["checks"]:
        log(f"check {name}: {detail}")
        if not ok:
            fails.append(name)
    verdict = "PASS" if not fails else "FAIL (" + "; ".join(fails) + ")"
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{NAME}.json"), "w") as f:
            json.dump({"preset": PRESET, "reference": info, "bar": BAR, "prompts": rows,
                       "checks": res["checks"], "verdict": verdict,
                       "seconds": round(time.time() - t0, 1)}, f, indent=1)
    log(f"{NAME}: {verdict}")
    return 0 if not fails else 1


if __name__ == "__main__":
    sys.exit(main())
