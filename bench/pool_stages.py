#!/usr/bin/env python3
"""pool_stages.py - a one-job decode step's pool profile, per layer position.

    python3 bench/pool_stages.py PROFILE.txt [PERIOD]

Reads the `pool profile` lines of HOTMOE_POOL_PROF=1 runs (hotmoe's stderr) and, for every job
kind with more than 16 stages (cpu_engine_token.c's job: PERIOD stages per layer, default 4: q/k/v
with attention inside, wo, router, expert FFN; 6 for builds before 7c90e2e put attention in the
q/k/v stage, or built with -DMODEL_ATTN_IN_QKV=0 before 35d503d: q/k/v, heads, attention, wo,
router, expert FFN; then the output matrix), prints the mean time of each stage position over
the layers after the first (from the stage closes) and of its `then` step.
"""
import re
import sys

NAMES = {6: ["qkv", "heads", "attn", "wo", "router", "ffn"], 4: ["qkv+attn", "wo", "router", "ffn"]}


def main(path, per):
    for line in open(path):
        m = re.search(r"job kind \d+ \((\d+) stages\): (\d+) calls, ([\d.]+) us each.*"
                      r"closed at \(us\):(.*)", line)
        if not m or int(m.group(1)) <= 16:
            continue
        vals = re.findall(r"([\d.]+) \(then ([\d.]+)\)", m.group(4))
        close = [float(a) for a, _ in vals]
        then = [float(t) for _, t in vals]
        dur = [close[0]] + [close[i] - close[i - 1] for i in range(1, len(close))]
        nl = len(dur) // per
        if nl < 2:
            continue
        cols = []
        for k in range(per):
            d = sum(dur[l * per + k] for l in range(1, nl)) / (nl - 1)
            t = sum(then[l * per + k] for l in range(1, nl)) / (nl - 1)
            name = NAMES[per][k] if per in NAMES else f"s{k}"
            cols.append(f"{name} {d:.1f} (then {t:.1f})")
        layer = sum(sum(dur[l * per:(l + 1) * per]) for l in range(1, nl)) / (nl - 1)
        tail = f", output {dur[-1]:.0f}" if len(dur) % per == 1 else ""
        print(f"{m.group(1)} stages, {m.group(3)} us per step: per layer {layer:.1f} us: "
              + ", ".join(cols) + tail)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 4)
