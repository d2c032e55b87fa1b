#!/usr/bin/env bash
# device_tiered.sh - the tiered placements on the GPU machine (H100 or H200, 16 cores): hotmoe's
# `bench` beside a peer llama-bench (ik_llama.cpp, built by the caller beside the project, never
# by this script) on forged qwen3-30b-a3b q4_k_m and gpt-oss-20b mxfp4, the same files for both.
#   bash bench/device_tiered.sh HOTMOE_BIN [PEER_LLAMA_BENCH|-] [PART] [HBM_GBS] [HOST_GBS]
# PART ('+' between items; default all): q3, goss (that model's full, ram and half), budget (both
# models), step (per-layer trace of tiered steps of q3), roofline (forge, inspect, rooflines
# only), all (= q3+goss+budget: longer than one 10-minute device call), or
# MODEL:PLACEMENT[,PLACEMENT...] with MODEL q3|goss and PLACEMENT full|ram|half|budget|step|stephalf,
# e.g. 'q3:full,ram' then 'q3:half+goss:budget'. Each item prints how long it took.
# Placements, hotmoe then the peer's configurations, for each test in turn (all at -t $(nproc)):
#   full    hotmoe -ngl 99 --gpu-strict;    peer -ngl 99 -fa 1 -fmoe 1 (the reference)
#   ram     hotmoe -ngl 99 --cpu-moe;       peer -ngl 99 -ot exps=CPU -fa 1 -fmoe 1, -rtr 0 and 1
#   half    hotmoe -ngl 99 --n-cpu-moe L/2; peer the same with its own --n-cpu-moe L/2 when
#           `llama-bench --help` lists it, else -ot 'blk\.(0|1|..|L/2-1)\.ffn_(up|down|gate)_exps=CPU'
#   budget  hotmoe -ngl 99 --vram-budget 8192 and 16384 (its automatic plan; no peer equivalent)
#   step    hotmoe -ngl 99 --cpu-moe tg32 under bench/hm_trace.c (CUPTI): per host layer, the GPU's
#           kernels and its wait for the CPU's experts (ho_wait_kernel); mean of the 32 timed steps
#   stephalf the same with --n-cpu-moe L/2 (the device layers after the host ones are counted in
#           the last row); into tiered_step_half.txt
# Tests: "-p 512 -n 128" (pp512, tg128) and "-p 2048 -n 0 -ub 2048" (pp2048 in one ubatch), one
# process each, -r $REPS, JSON output, each run under `timeout`. hotmoe's GPU bench adds its
# 1024-token audit generation after tg128 (not part of the figures). A figure is the run's
# avg_ts (mean of the repetitions, both programs); the peer's figure for a workload is its best
# configuration for that placement, named in the summary.
#
# ROOFLINE (decode, per model and placement), from `hotmoe inspect --json` (each tensor's bytes =
# row size x rows, its category; the metadata's expert_count and expert_used_count). With H =
# the layers whose routed experts stay in RAM (the placement's layers; for hotmoe's own runs the
# layers its placement report names):
#   GPU bytes per token = every tensor but token_embd and the routed experts (attention, norms,
#                         routers, shared experts, output norm and matrix) + one token_embd row
#                         (bytes / rows) + for each layer not in H its routed expert tensors'
#                         bytes x expert_used_count / expert_count (the active experts, biases in)
#   RAM bytes per token = for each layer in H: its routed expert tensors' bytes x used / count
#   roofline tok/s      = 1 / (GPU bytes / HBM_GBS + RAM bytes / HOST_GBS), i.e. the sum over the
#                         layers of each part's time: a layer's CPU experts wait for its attention
#                         and router on the GPU, and the GPU's next layer waits for them.
# The KV cache reads are left out (about 0.3% of the bytes over tg128's contexts). The summary
# also gives 1 / max(GPU time, RAM time), the bound were the two parts to overlap perfectly
# (BENCHMARKS.md's form), and the all-in-RAM roofline at bench_matvec's plain read loop.
# HBM_GBS (argument or environment, GB/s): default BENCHMARKS.md's device-to-device copy, 3000 on
# an H100, 4220 on an H200 (3000 if the GPU's name says neither). HOST_GBS: default the host
# read bandwidth that bench_matvec (when it sits beside HOTMOE_BIN) measures at the start of the
# call: the best of its prefetching read loops, the ceiling bench/RESULTS.md's ratios use; else
# 92 (BENCHMARKS.md: 85-99 GB/s on the H100 host; its 84 tok/s experts-in-RAM roofline).
# Environment: REPS (2), TMO (240: seconds per run), DEADLINE (540: no run starts later and none
# outlives it, so that a 10-minute device call still ends with the summary), MODELS (/tmp/models:
# q3.gguf and goss.gguf, forged there if missing), Q3_PRESET / GOSS_PRESET (preset:type, e.g.
# tiny presets for a dry run), WORK (/tmp/hm-tiered), COMMIT (named in the machine line).
# Output in $OUT: tiered_log.txt (everything printed), tiered_summary.md (machine line, bandwidths,
# per model a table: workload, hotmoe t/s, peer best t/s and its configuration, ratio, goal,
# tg / roofline; then the rooflines), tiered_raw.tgz (each run's JSON and stderr with its command
# line, the inspect JSON, results.tsv), tiered_step.txt (the step part).
set -uo pipefail
[ $# -ge 1 ] || { sed -n "2,/^set -uo/p" "$0" | sed "\$d"; exit 2; }
bin=$(readlink -f "$1")
peer=${2:-}
[ "$peer" = - ] && peer=""
parts=${3:-all}
[ -x "$bin" ] || { echo "device_tiered: $1 is not an executable"; exit 2; }
[ -z "$peer" ] || [ -x "$peer" ] || { echo "device_tiered: peer $peer is not an executable"; exit 2; }
[ -n "$peer" ] && peer=$(readlink -f "$peer")
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/hotmoe-out}
W=${WORK:-/tmp/hm-tiered}
M=${MODELS:-/tmp/models}
REPS=${REPS:-2}
TMO=${TMO:-240}
DEADLINE=${DEADLINE:-540}
N=$(nproc)
mkdir -p "$OUT" "$M"
rm -rf "$W"
mkdir -p "$W/raw"
exec > >(tee -a "$OUT/tiered_log.txt") 2>&1 # (no bare `wait` below: it would wait for tee)
T0=$(date +%s)
declare -A PRESET=([q3]=${Q3_PRESET:-qwen3-30b-a3b:q4_k_m} [goss]=${GOSS_PRESET:-gpt-oss-20b:mxfp4})
declare -A NLAYER

# ---- the helper: parsing, rooflines, summary (python3, no packages) ----
cat >"$W/tiered.py" <<'PY'
import json, re, sys

def rows(path):
    """(test, avg_ts, stddev_ts) of a llama-bench-style JSON array; a cut-off file still gives
    its complete objects (none holds a nested object)."""
    text = open(path, errors="replace").read()
    try:
        objs = json.loads(text)
    except ValueError:
        objs = []
        for m in re.finditer(r"\{[^{}]*\}", text):
            try:
                objs.append(json.loads(m.group(0)))
            except ValueError:
                pass
    out = []
    for o in objs:
        if not isinstance(o, dict) or "avg_ts" not in o:
            continue
        npp, ntg = int(o.get("n_prompt", 0)), int(o.get("n_gen", 0))
        test = "tg%d" % ntg if ntg > 0 else "pp%d" % npp
        out.append((test, float(o["avg_ts"]), float(o.get("stddev_ts", 0))))
    return out

def ranges(text):
    """'0-2, 5' -> {0, 1, 2, 5}; 'none' -> set()"""
    s = set()
    for part in text.split(","):
        part = part.strip()
        if not part or part == "none":
            continue
        a, _, b = part.partition("-")
        s.update(range(int(a), int(b or a) + 1))
    return s

def report(err_path):
    """The host-only expert layers and the plan from hotmoe's placement report (stderr):
    (host layer set or None, attention-on-host flag, plan text)."""
    host, attn_host, plan = None, False, ""
    for line in open(err_path, errors="replace"):
        m = re.search(r"routed experts: device slots in layers .*?; host only in layers (.*?) \(", line)
        if m:
            host = ranges(m.group(1))
        m = re.search(r"attention \+ KV cache: device in layers .*?; host in layers (.*?) \(", line)
        if m and ranges(m.group(1)):
            attn_host = True
        m = re.search(r"placement: (as asked \(.*\)|tiered, chosen automatically)", line)
        if m:
            plan = m.group(1)
        m = re.search(r"  plan: (.*)", line)
        if m:
            plan = m.group(1)
        if "is ignored; running on the CPU only" in line:
            plan = "CPU only (no GPU)"
    return host, attn_host, plan

def model_info(inspect_path):
    d = json.load(open(inspect_path))
    meta = {m["key"]: m["value"] for m in d["metadata"]}
    arch = meta["general.architecture"]
    n_layer = int(meta["%s.block_count" % arch])
    n_exp = int(meta.get("%s.expert_count" % arch, 0) or 0)
    n_used = int(meta.get("%s.expert_used_count" % arch, 0) or 0)
    return d, n_layer, n_exp, n_used

def token_bytes(inspect_path, host):
    """GPU and RAM bytes read per decoded token with the routed experts of layers `host` in RAM"""
    d, n_layer, n_exp, n_used = model_info(inspect_path)
    gpu = ram = 0.0
    for t in d["tensors"]:
        name, b = t["name"], float(t["bytes"])
        if name == "token_embd.weight":
            gpu += b / t["shape"][-1]
            continue
        if t["category"] == "experts" and n_exp > 0:
            layer = int(re.match(r"blk\.(\d+)\.", name).group(1))
            act = b * n_used / n_exp
            if layer in host:
                ram += act
            else:
                gpu += act
        else:
            gpu += b
    return gpu, ram

def roof(inspect_path, host, hbm, hst):
    gpu, ram = token_bytes(inspect_path, host)
    tg, tr = gpu / (hbm * 1e9), ram / (hst * 1e9)
    return gpu, ram, 1.0 / (tg + tr), 1.0 / max(tg, tr)

def cmd_parse(path):
    for test, avg, sd in rows(path):
        print("%s\t%.3f\t%.3f" % (test, avg, sd))

def cmd_nlayer(inspect_path):
    print(model_info(inspect_path)[1])

def cmd_roofline(w, model, hbm, hst):
    p = "%s/raw/%s.inspect.json" % (w, model)
    _, n_layer, n_exp, n_used = model_info(p)
    print("roofline %s (%d layers, %d of %d experts per token; HBM %.0f GB/s, host %.1f GB/s):"
          % (model, n_layer, n_used, n_exp, hbm, hst))
    for pl, host in (("full", set()), ("half", set(range(n_layer // 2))), ("ram", set(range(n_layer)))):
        gpu, ram, r_sum, r_max = roof(p, host, hbm, hst)
        print("  %-4s GPU %7.1f MB + RAM %7.1f MB per token: roofline %7.1f tok/s (overlapped bound %7.1f)"
              % (pl, gpu / 1e6, ram / 1e6, r_sum, r_max))

GOALS = {("ram", "tg128"): 1.30, ("half", "tg128"): 1.30, ("ram", "pp512"): 1.15, ("ram", "pp2048"): 1.15}
ORDER = {"full": 0, "ram": 1, "half": 2, "budget8192": 3, "budget16384": 4}
PLNAME = {"full": "full GPU", "ram": "all experts in RAM", "half": "half the layers' experts in RAM"}

def cmd_summary(w, hbm, hst, hbm_src, hst_src, machine, plain):
    res = []
    for line in open("%s/results.tsv" % w):
        f = line.rstrip("\n").split("\t")
        if len(f) == 8:
            res.append(f)
    out = ["# Tiered placements: hotmoe and the peer", "", machine, "",
           "HBM %.0f GB/s (%s), host read %.1f GB/s (%s)." % (hbm, hbm_src, hst, hst_src), ""]
    import glob, os
    models = sorted({os.path.basename(x).split(".")[0] for x in glob.glob("%s/raw/*.inspect.json" % w)},
                    key=lambda m: (m != "q3", m))
    for model in models:
        p = "%s/raw/%s.inspect.json" % (w, model)
        out.append("## %s" % model)
        out.append("")
        if any(r[0] == model for r in res):
            out.append("| workload | hotmoe t/s | peer best t/s | peer config | hotmoe / peer | goal | tg / roofline |")
            out.append("| --- | ---: | ---: | --- | ---: | --- | ---: |")
        keys = sorted({(r[1], r[4]) for r in res if r[0] == model},
                      key=lambda k: (ORDER.get(k[0], 9), k[1][:2] != "tg", int(k[1][2:])))
        for pl, test in keys:
            hm = [r for r in res if r[0] == model and r[1] == pl and r[4] == test and r[2] == "hotmoe"]
            pe = [r for r in res if r[0] == model and r[1] == pl and r[4] == test and r[2] == "peer"]
            num = lambda r: float(r[5]) if r[5] != "fail" else 0.0
            h = num(hm[0]) or None if hm else None
            best = max(pe, key=num) if pe else None
            b = num(best) or None if best else None
            ratio = "%.2f" % (h / b) if h and b else "-"
            goal = GOALS.get((pl, test))
            gtext = "-"
            if goal and h and b:
                gtext = ">= %.2f: %s" % (goal, "ok" if h / b >= goal else "LOW")
            elif goal:
                gtext = ">= %.2f" % goal
            rtext = "-"
            plan = ""
            if hm:
                host, attn_host, plan = report("%s/raw/%s.err" % (w, hm[0][7]))
                if host is None:  # no report: the placement's own set
                    _, n_layer, _, _ = model_info(p)
                    host = {"full": set(), "ram": set(range(n_layer)),
                            "half": set(range(n_layer // 2))}.get(pl)
                if test.startswith("tg") and host is not None and not attn_host and h \
                        and plan != "CPU only (no GPU)":
                    _, _, r_sum, _ = roof(p, host, hbm, hst)
                    rtext = "%.2f of %.1f" % (h / r_sum, r_sum)
                    if pl == "ram":
                        rtext += (" (goal 0.80: %s)" % ("ok" if h / r_sum >= 0.80 else "LOW"))
            name = PLNAME.get(pl, pl.replace("budget", "--vram-budget ") + (" (plan: %s)" % plan if plan else ""))
            out.append("| %s, %s | %s | %s | %s | %s | %s | %s |" % (
                name, test, "%.2f" % h if h else ("failed" if hm else "-"),
                "%.2f" % b if b else ("failed" if pe else "-"),
                best[3] if best and b else "-", ratio, gtext, rtext))
        out.append("")
        _, n_layer, n_exp, n_used = model_info(p)
        out.append("Roofline (tg; `bench/device_tiered.sh`'s header says how it is computed):")
        out.append("")
        for pl, host in (("full GPU", set()), ("half the layers' experts in RAM", set(range(n_layer // 2))),
                         ("all experts in RAM", set(range(n_layer)))):
            gpu, ram, r_sum, r_max = roof(p, host, hbm, hst)
            alt = ""
            if plain > 0 and ram > 0:
                alt = "; with the plain read loop's %.1f GB/s: %.1f" % (plain, roof(p, host, hbm, plain)[2])
            out.append("- %s: GPU %.1f MB + RAM %.1f MB per token: **%.1f tok/s** (overlapped bound %.1f%s)"
                       % (pl, gpu / 1e6, ram / 1e6, r_sum, r_max, alt))
        out.append("")
    print("\n".join(out))

def cmd_step(csv_path, first, n):
    """Per-layer split of tiered decode steps traced by hm_trace.c: steps start at the graph's
    first kernel; in a step, layer k's part runs from the end of the previous wait for the CPU
    (ho_wait_kernel) to the end of its own wait: 'gpu' = the kernels before the wait (the last
    layer's take and merge, this layer's attention, router and post), 'wait' = the wait kernel
    (the CPU's experts plus the hand-off), each kernel counted from the previous kernel's end."""
    import csv, collections
    rows_ = [r for r in csv.DictReader(open(csv_path)) if r["graph_id"] != "0"]
    rows_.sort(key=lambda r: int(r["end_ns"]))
    if not rows_:
        print("step: no graph kernels traced")
        return
    first_name = rows_[0]["name"]
    starts = [i for i, r in enumerate(rows_) if r["name"] == first_name]
    if first + n >= len(starts):
        first = max(0, len(starts) - n - 1)
    sel_steps = [(starts[i], starts[i + 1]) for i in range(first, min(first + n, len(starts) - 1))]
    gpu = collections.defaultdict(float); wait = collections.defaultdict(float)
    kcount = collections.defaultdict(int); names = collections.defaultdict(float)
    tail = 0.0; total = 0.0
    for lo, hi in sel_steps:
        prev = int(rows_[lo - 1]["end_ns"]) if lo > 0 else int(rows_[lo]["start_ns"])
        layer = 0
        for r in rows_[lo:hi]:
            e = int(r["end_ns"]); c = e - prev; prev = e; total += c
            nm = r["name"].split("(")[0].split("<")[0][:48]
            if nm.startswith("ho_wait_kernel") or "ho_wait_kernel" in r["name"]:
                wait[layer] += c
                layer += 1
            else:
                gpu[layer] += c; kcount[layer] += 1; names[nm] += c
        # the part after the last wait (the output layer, the sampler) sits in gpu[layer]
    ns = len(sel_steps)
    nl = max(list(wait.keys()) + [-1]) + 1
    print("%d steps (from step %d), %.1f us per step; %d host layers per step" % (ns, first, total / ns / 1e3, nl))
    print("| host layer | gpu us | wait for the CPU us | kernels |")
    print("| ---: | ---: | ---: | ---: |")
    for k in range(nl):
        print("| %d | %.1f | %.1f | %.1f |" % (k, gpu[k] / ns / 1e3, wait[k] / ns / 1e3, kcount[k] / ns))
    print("| after the last | %.1f | - | %.1f |" % (gpu[nl] / ns / 1e3, kcount[nl] / ns))
    tg = sum(gpu.values()); tw = sum(wait.values())
    print("GPU kernels %.1f us (%.0f%%), waits for the CPU %.1f us (%.0f%%) per step"
          % (tg / ns / 1e3, 100 * tg / total, tw / ns / 1e3, 100 * tw / total))
    print("GPU time per step by kernel name:")
    for nm, c in sorted(names.items(), key=lambda x: -x[1])[:15]:
        print("  %7.1f us %5.1f%%  %s" % (c / ns / 1e3, 100 * c / total, nm))

if __name__ == "__main__":
    c, a = sys.argv[1], sys.argv[2:]
    if c == "parse": cmd_parse(a[0])
    elif c == "nlayer": cmd_nlayer(a[0])
    elif c == "roofline": cmd_roofline(a[0], a[1], float(a[2]), float(a[3]))
    elif c == "summary": cmd_summary(a[0], float(a[1]), float(a[2]), a[3], a[4], a[5], float(a[6] or 0))
    elif c == "step": cmd_step(a[0], int(a[1]), int(a[2]))
    elif c == "report":
        h, ah, plan = report(a[0])
        print("plan: %s; host expert layers: %s%s" % (plan or "-", "none" if not h else
              ("%d-%d" % (min(h), max(h)) if len(h) == max(h) - min(h) + 1 else sorted(h)),
              "; some attention on the host" if ah else ""))
PY
py() { python3 "$W/tiered.py" "$@"; }
: >"$W/results.tsv"
pack() { # the raw logs back in one file (the device returns at most 8 files)
  tar czf "$OUT/tiered_raw.tgz" -C "$W" raw results.tsv 2>/dev/null
}

# ---- the machine ----
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
machine="machine: GPU ${gpu:-none}; CPU $cpu; $N cores; $(awk '/MemTotal/ {printf "%.0f GiB RAM", $2 / 1048576}' /proc/meminfo); $(date -u +%FT%TZ); hotmoe $bin${COMMIT:+ at $COMMIT}"
echo "$machine"
[ -n "$peer" ] && echo "peer: $peer"
HBM_GBS=${4:-${HBM_GBS:-}} HOST_GBS=${5:-${HOST_GBS:-}} plain=""
if [ -n "$HBM_GBS" ]; then hbm=$HBM_GBS hbm_src="given"
elif [[ "$gpu" == *H200* ]]; then hbm=4220 hbm_src="BENCHMARKS.md, H200 device copy"
else hbm=3000 hbm_src="BENCHMARKS.md, H100 device copy"; fi
if [ -n "$HOST_GBS" ]; then host=$HOST_GBS host_src="given"
elif [ -x "$(dirname "$bin")/bench_matvec" ]; then
  timeout 120 "$(dirname "$bin")/bench_matvec" -t "$N" --reps 2 --types q8_0 >"$W/raw/read.txt" 2>&1
  host=$(grep -oE 'bandwidth at the start: [0-9.]+' "$W/raw/read.txt" | grep -oE '[0-9.]+$')
  plain=$(grep -oE 'plain AVX2 read loop.*: [0-9.]+' "$W/raw/read.txt" | grep -oE '[0-9.]+$')
  host_src="bench_matvec -t $N at the start of this call; its plain AVX2 loop ${plain:-?} GB/s"
  [ -n "$host" ] || { host=92 host_src="BENCHMARKS.md (bench_matvec failed)"; }
else host=92 host_src="BENCHMARKS.md, 85-99 GB/s on the H100 host"; fi
echo "bandwidths: HBM $hbm GB/s ($hbm_src); host read $host GB/s ($host_src)"

# ---- models ----
model_ready() { # MODEL: forged if missing, inspected, NLAYER set
  local mod=$1 f=$M/$1.gguf spec=${PRESET[$1]} t
  [ -n "${NLAYER[$mod]:-}" ] && return 0
  if [ ! -s "$f" ]; then
    t=$(date +%s)
    timeout 900 "$bin" forge --preset "${spec%%:*}" --type "${spec##*:}" --no-hf -q -o "$f" ||
      { echo "forge $spec failed"; rm -f "$f"; return 1; }
    echo "forged $f ($spec, $(du -h "$f" | cut -f1)) in $(($(date +%s) - t)) s"
  fi
  "$bin" inspect "$f" --json >"$W/raw/$mod.inspect.json" || { echo "inspect $f failed"; return 1; }
  NLAYER[$mod]=$(py nlayer "$W/raw/$mod.inspect.json")
  py roofline "$W" "$mod" "$hbm" "$host"
}

# ---- the peer's half placement: its own --n-cpu-moe, or the same layers by -ot ----
peer_half=""
if [ -n "$peer" ]; then
  if "$peer" --help 2>&1 | grep -q -- '--n-cpu-moe'; then peer_half=ncmoe; else peer_half=ot; fi
  echo "peer half placement by: $([ $peer_half = ncmoe ] && echo "its --n-cpu-moe" || echo "-ot on blk.0..L/2-1 experts")"
fi
half_ot() { # L/2 -> -ot value for layers 0 .. L/2-1
  local s="" i
  for ((i = 0; i < $1; i++)); do s+="${s:+|}$i"; done
  echo "blk\\.($s)\\.ffn_(up|down|gate)_exps=CPU"
}

# one bench process: ENGINE MODEL PLACEMENT CONFIG TESTSET COMMAND... (TESTSET a: pp512 + tg128,
# b: pp2048 -ub 2048); rows go to results.tsv: model placement engine config test avg sd tag
one() {
  local eng=$1 mod=$2 pl=$3 cfg=$4 set=$5 t rc tag line=""
  shift 5
  local targs=(-p 512 -n 128)
  [ "$set" = b ] && targs=(-p 2048 -n 0 -ub 2048)
  tag=$(echo "${mod}_${pl}_${eng}_${cfg}_$set" | tr -c 'A-Za-z0-9_.\n-' '_')
  t=$(date +%s)
  local left=$((DEADLINE - (t - T0))) tmo=$TMO
  if [ $left -lt 20 ]; then
    printf '  %-6s %-4s %-10s %-26s skipped: DEADLINE (%d s) reached\n' "$eng" "$mod" "$pl" "$cfg" "$DEADLINE"
    return 0
  fi
  [ $left -lt $tmo ] && tmo=$left
  timeout -k 10 "$tmo" "$@" -t "$N" -r "$REPS" -o json "${targs[@]}" >"$W/raw/$tag.json" 2>"$W/raw/$tag.err"
  rc=$?
  echo "$* -t $N -r $REPS -o json ${targs[*]}" >>"$W/raw/$tag.err"
  while IFS=$'\t' read -r test avg sd; do
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mod" "$pl" "$eng" "$cfg" "$test" "$avg" "$sd" "$tag" >>"$W/results.tsv"
    line+=" $test $avg ± $sd"
  done < <(py parse "$W/raw/$tag.json")
  if [ -z "$line" ]; then # no figures: the tests are recorded as failed
    for test in $([ "$set" = a ] && echo pp512 tg128 || echo pp2048); do
      printf '%s\t%s\t%s\t%s\t%s\tfail\t-\t%s\n' "$mod" "$pl" "$eng" "$cfg" "$test" "$tag" >>"$W/results.tsv"
    done
  fi
  printf '  %-6s %-4s %-10s %-26s rc %3d %4d s:%s\n' "$eng" "$mod" "$pl" "$cfg" "$rc" "$(($(date +%s) - t))" "${line:- (no figures)}"
  [ "$eng" = hotmoe ] && echo "         $(py report "$W/raw/$tag.err")"
  [ $rc -eq 0 ] || tail -3 "$W/raw/$tag.err" | grep -v -- ' -o json ' | sed 's/^/         /'
  return 0
}

placement() { # MODEL PLACEMENT
  local mod=$1 pl=$2 f=$M/$1.gguf L h s
  L=${NLAYER[$mod]}
  h=$((L / 2))
  for s in a b; do
    case $pl in
    full)
      one hotmoe "$mod" full "-ngl99 --gpu-strict" $s "$bin" bench -m "$f" -ngl 99 --gpu-strict
      [ -n "$peer" ] && one peer "$mod" full "-ngl99 -fa1 -fmoe1" $s "$peer" -m "$f" -ngl 99 -fa 1 -fmoe 1
      ;;
    ram)
      one hotmoe "$mod" ram "-ngl99 --cpu-moe" $s "$bin" bench -m "$f" -ngl 99 --cpu-moe
      if [ -n "$peer" ]; then
        one peer "$mod" ram "-ot exps=CPU -rtr0" $s "$peer" -m "$f" -ngl 99 -ot exps=CPU -fa 1 -fmoe 1 -rtr 0
        one peer "$mod" ram "-ot exps=CPU -rtr1" $s "$peer" -m "$f" -ngl 99 -ot exps=CPU -fa 1 -fmoe 1 -rtr 1
      fi
      ;;
    half)
      one hotmoe "$mod" half "-ngl99 --n-cpu-moe$h" $s "$bin" bench -m "$f" -ngl 99 --n-cpu-moe $h
      if [ "$peer_half" = ncmoe ]; then
        one peer "$mod" half "--n-cpu-moe$h -rtr0" $s "$peer" -m "$f" -ngl 99 --n-cpu-moe $h -fa 1 -fmoe 1 -rtr 0
        one peer "$mod" half "--n-cpu-moe$h -rtr1" $s "$peer" -m "$f" -ngl 99 --n-cpu-moe $h -fa 1 -fmoe 1 -rtr 1
      elif [ "$peer_half" = ot ]; then
        one peer "$mod" half "-ot blk0-$((h - 1))exps -rtr0" $s "$peer" -m "$f" -ngl 99 -ot "$(half_ot $h)" -fa 1 -fmoe 1 -rtr 0
        one peer "$mod" half "-ot blk0-$((h - 1))exps -rtr1" $s "$peer" -m "$f" -ngl 99 -ot "$(half_ot $h)" -fa 1 -fmoe 1 -rtr 1
      fi
      ;;
    budget)
      one hotmoe "$mod" budget8192 "-ngl99 --vram-budget8192" $s "$bin" bench -m "$f" -ngl 99 --vram-budget 8192
      one hotmoe "$mod" budget16384 "-ngl99 --vram-budget16384" $s "$bin" bench -m "$f" -ngl 99 --vram-budget 16384
      ;;
    esac
  done
}

step() { # MODEL [FLAGS]: per-layer trace of the tiered steps of tg32 (default --cpu-moe)
  local mod=$1 f=$M/$1.gguf cu lib flags=${2:---cpu-moe} out=$OUT/tiered_step${3:-}.txt
  export PATH=$PATH:/usr/local/cuda/bin
  command -v nvcc >/dev/null || { echo "step: no nvcc (CUPTI headers) here: skipped"; return 0; }
  cu=$(dirname "$(dirname "$(command -v nvcc)")")
  lib=$(ls -d "$cu/lib64" "$cu/lib" "$cu/extras/CUPTI/lib64" 2>/dev/null | head -1)
  gcc -O2 -shared -fPIC -I"$cu/include" -I"$cu/extras/CUPTI/include" "$repo/bench/hm_trace.c" \
    -L"$lib" -L"$cu/extras/CUPTI/lib64" -lcupti -Wl,-rpath,"$lib:$cu/extras/CUPTI/lib64" \
    -o "$W/libhm_trace.so" || { echo "step: the CUPTI tracer does not build: skipped"; return 0; }
  local tmo=$((DEADLINE - ($(date +%s) - T0)))
  [ $tmo -ge 30 ] || { echo "step: DEADLINE ($DEADLINE s) reached: skipped"; return 0; }
  [ $tmo -gt "$TMO" ] && tmo=$TMO
  CUDA_INJECTION64_PATH=$W/libhm_trace.so HM_TRACE_OUT=$W/step.csv timeout -k 10 "$tmo" \
    "$bin" bench -m "$f" -ngl 99 $flags -t "$N" -r 1 -p 0 -n 32 >"$W/raw/step_bench.txt" 2>&1
  local rc=$?
  echo "  traced tg32: rc $rc ($(grep -E 'tg32' "$W/raw/step_bench.txt" | tr -s ' ' | cut -c1-120))"
  # the warm-up decodes 16 tokens, then the 32 timed ones (one CUDA graph replay per token)
  { echo "## One tiered decode step of $mod (-ngl 99 $flags), per layer"; echo
    [ -s "$W/step.csv" ] && py step "$W/step.csv" 16 32 || echo "no trace written"; } >"$out"
  rm -f "$W/step.csv"
  cat "$out"
}

# ---- the parts ----
items=()
for p in ${parts//+/ }; do
  case $p in
  all) items+=(q3:full,ram,half goss:full,ram,half q3:budget goss:budget) ;;
  q3 | goss) items+=("$p:full,ram,half") ;;
  budget) items+=(q3:budget goss:budget) ;;
  step) items+=(q3:step) ;;
  roofline) items+=(q3: goss:) ;;
  q3:* | goss:*) items+=("$p") ;;
  *) echo "device_tiered: unknown part '$p' (q3, goss, budget, step, roofline, all, MODEL:PLACEMENTS)"; exit 2 ;;
  esac
done
[ "$parts" = all ] && echo "note: 'all' takes longer than one 10-minute device call; give one part per call"
for it in "${items[@]}"; do
  mod=${it%%:*} pls=${it#*:}
  t=$(date +%s)
  echo "== $mod: ${pls:-roofline only} =="
  model_ready "$mod" || continue
  for pl in ${pls//,/ }; do
    case $pl in
    full | ram | half | budget) placement "$mod" "$pl" ;;
    step) step "$mod" ;;
    stephalf) step "$mod" "--n-cpu-moe $((NLAYER[$mod] / 2))" _half ;;
    *) echo "unknown placement '$pl' (full, ram, half, budget, step, stephalf)" ;;
    esac
    pack
  done
  echo "== $mod: ${pls:-roofline only}: $(($(date +%s) - t)) s (total $(($(date +%s) - T0)) s) =="
done

py summary "$W" "$hbm" "$host" "$hbm_src" "$host_src" "$machine" "${plain:-}" >"$OUT/tiered_summary.md"
cp "$OUT/tiered_summary.md" "$W/raw/" 2>/dev/null
pack
cat "$OUT/tiered_summary.md"
echo "device_tiered: $(($(date +%s) - T0)) s"
