#!/usr/bin/env python3
"""pool_trace.py - summary of a pool trace (HOTMOE_POOL_TRACE=FILE, see src/base/threadpool.c).

    python3 bench/pool_trace.py TRACE.csv
    python3 bench/pool_trace.py TRACE.csv --layers PERIOD

The second form folds one-job decode steps (cpu_engine_token.c: PERIOD stages per layer, 4 with
attention inside q/k/v, 6 before; trace them with HOTMOE_POOL_TRACE_SKIP=60
HOTMOE_POOL_TRACE_JOBS=20) by stage position: per position over every layer after the first, the
span from the stage's opening to its last item's end, the share of it the threads spend in items,
how long the last thread ends after the second-to-last (a trailing item), how late a thread
starts its first item and how long it idles after its last, and the median item time by item
index (where big items trail); then per layer the last position's span (the expert FFN: layers
whose expert down matrix is of a slower type stand out).

Per job kind (jobs with the same number of stages), means over the traced jobs, in us from the
job's start: when the job was published; per thread, when it claimed its first item (the wake-up);
per stage: when it opened (the previous stage's close), when its first item started and its last
ended, its close, its `then` step; its items' mean time; the threads' busy share of the stage's
span; the mean wait at the stage's gate of a thread holding an item; the mean gap between a
thread's item and its next claim (claim cost). And the mean time between a job's end and the next
job's start (the caller's own steps).
"""
import collections
import sys


def main(path):
    items = collections.defaultdict(list)   # job -> [(ith, stage, item, claim, open, end)]
    stages = collections.defaultdict(dict)  # job -> stage -> (then start, then end)
    jobs = {}                               # job -> (n_stages, start, publish, end)
    with open(path) as f:
        next(f)
        for line in f:
            job, ns, ith, st, it, c, o, e = line.strip().split(",")[:8]
            job, ns, ith, st, it = int(job), int(ns), int(ith), int(st), int(it)
            c, o, e = float(c), float(o), float(e)
            if ith >= 0:
                items[job].append((ith, st, it, c, o, e))
            elif st >= 0:
                stages[job][st] = (c, e)
            else:
                jobs[job] = (ns, c, o, e)
    kinds = collections.defaultdict(list)
    for j, (ns, _, _, _) in jobs.items():
        kinds[ns].append(j)
    order = sorted(jobs)
    gaps = [jobs[b][1] - (jobs[a][1] + jobs[a][3]) for a, b in zip(order, order[1:]) if b == a + 1]
    if gaps:
        print(f"between jobs: {sum(gaps) / len(gaps):.1f} us mean over {len(gaps)} gaps")
    for ns in sorted(kinds):
        js = kinds[ns]
        n = len(js)
        pub = sum(jobs[j][2] for j in js) / n
        dur = sum(jobs[j][3] for j in js) / n
        firsts = []
        for j in js:
            first = {}
            for ith, st, it, c, o, e in items[j]:
                first[ith] = min(first.get(ith, 1e18), c)
            firsts.extend(v - jobs[j][2] for v in first.values())
        wake = sum(firsts) / len(firsts) if firsts else 0.0
        print(f"\njob kind: {ns} stages, {n} jobs, {dur:.1f} us each; published at {pub:.1f} us; "
              f"a thread's first claim {wake:.1f} us after (mean), "
              f"{max(firsts) if firsts else 0:.1f} us (max)")
        print("| stage | opened | first start | last end | closed | then | items | item us | "
              "busy share | gate wait | claim gap |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for s in range(ns):
            acc = collections.defaultdict(float)
            cnt = 0
            for j in js:
                its = [r for r in items[j] if r[1] == s]
                if not its:
                    continue
                cnt += 1
                prev_close = stages[j][s - 1][1] if s > 0 and s - 1 in stages[j] else 0.0
                close = stages[j][s][1] if s in stages[j] else max(r[5] for r in its)
                then = stages[j][s][1] - stages[j][s][0] if s in stages[j] else 0.0
                acc["open"] += prev_close
                acc["first"] += min(r[4] for r in its)
                acc["last"] += max(r[5] for r in its)
                acc["close"] += close
                acc["then"] += then
                acc["items"] += len(its)
                busy = sum(r[5] - r[4] for r in its)
                acc["item_us"] += busy / len(its)
                span = close - then - prev_close
                nth = len({r[0] for r in items[j]})
                acc["busy"] += busy / (span * nth) if span > 0 else 0.0
                waits = [r[4] - r[3] for r in its if r[3] < prev_close]
                acc["wait"] += sum(waits) / len(waits) if waits else 0.0
                by_t = collections.defaultdict(list)
                for r in items[j]:
                    by_t[r[0]].append(r)
                g = []
                for rs in by_t.values():
                    rs.sort(key=lambda r: r[3])
                    g.extend(b[3] - a[5] for a, b in zip(rs, rs[1:]) if b[1] == s and a[1] == s)
                acc["gap"] += sum(g) / len(g) if g else 0.0
            if cnt == 0:
                continue
            m = {k: v / cnt for k, v in acc.items()}
            print(f"| {s} | {m['open']:.1f} | {m['first']:.1f} | {m['last']:.1f} | {m['close']:.1f} "
                  f"| {m['then']:.1f} | {m['items']:.0f} | {m['item_us']:.2f} | {m['busy']:.2f} | "
                  f"{m['wait']:.1f} | {m['gap']:.2f} |")


def per_layer(path, per):
    items = collections.defaultdict(lambda: collections.defaultdict(list))  # (job, stage) -> ith
    stages = {}                                                              # (job, stage) -> then
    n_stages = {}
    cpus = []  # (stage, item, vCPU, thread, us)
    with open(path) as f:
        next(f)
        for line in f:
            f9 = line.strip().split(",")
            job, ns, ith, st, it, c, o, e = f9[:8]
            cpu = int(f9[8]) if len(f9) > 8 else -1  # traces before the cpu column: -1
            job, ns, ith, st, it = int(job), int(ns), int(ith), int(st), int(it)
            if ns <= 16:
                continue
            n_stages[job] = ns
            if ith >= 0:
                items[(job, st)][ith].append((it, float(o), float(e)))
                cpus.append((st, it, cpu, ith, float(e) - float(o)))
            elif st >= 0:
                stages[(job, st)] = (float(c), float(e))
    med = lambda v: sorted(v)[len(v) // 2] if v else 0.0
    threads = collections.defaultdict(set)
    for (job, st), per_t in items.items():
        threads[job].update(per_t)
    acc = collections.defaultdict(lambda: collections.defaultdict(list))
    by_item = collections.defaultdict(lambda: collections.defaultdict(list))
    layer_span = collections.defaultdict(list)
    for (job, st), per_t in items.items():
        if st < per or st >= n_stages[job] - 1:
            continue  # layer 0 (cold) and the output matrix
        prev = max((s for s in range(st) if (job, s) in stages), default=None)
        if prev is None:
            continue
        opened = stages[(job, prev)][1]
        ends = sorted(max(e for _, _, e in v) for v in per_t.values())
        span = ends[-1] - opened
        busy = sum(e - o for v in per_t.values() for _, o, e in v)
        k = st % per
        a = acc[k]
        a["span"].append(span)
        a["busy"].append(busy / (len(threads[job]) * span) if span > 0 else 0.0)
        a["lag"].append(ends[-1] - ends[-2] if len(ends) > 1 else 0.0)
        a["first"].extend(min(o for _, o, _ in v) - opened for v in per_t.values())
        a["tail"].extend(ends[-1] - max(e for _, _, e in v) for v in per_t.values())
        for v in per_t.values():
            for it, o, e in v:
                by_item[k][it].append(e - o)
        if k == per - 1:
            layer_span[st // per].append(span)
    mean = lambda v: sum(v) / len(v) if v else 0.0
    print("| position | span us | busy share | last-thread lag us | first item at us | idle after "
          "last us |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k in sorted(acc):
        a = acc[k]
        print(f"| {k} | {mean(a['span']):.1f} | {mean(a['busy']):.2f} | {mean(a['lag']):.1f} | "
              f"{mean(a['first']):.1f} | {mean(a['tail']):.1f} |")
    for k in sorted(by_item):
        print(f"position {k}, median item us by index: " +
              " ".join(f"{it}:{med(v):.1f}" for it, v in sorted(by_item[k].items())))
    print("per layer, median span of position {}: ".format(per - 1) +
          " ".join(f"{l}:{med(v):.0f}" for l, v in sorted(layer_span.items())))
    # per vCPU: each item's time over the median time of its (position, index), so that big and
    # small items weigh alike; a vCPU that streams slower stands above 1
    ref = {(k, it): med(v) for k in by_item for it, v in by_item[k].items()}
    slow = collections.defaultdict(list)
    owners = collections.defaultdict(set)
    for st, it, cpu, ith, us in cpus:
        k = st % per
        if st < per or (k, it) not in ref or ref[(k, it)] <= 0:
            continue
        slow[(cpu, k)].append(us / ref[(k, it)])
        owners[cpu].add(ith)
    if slow:
        print("per vCPU, median item time over the item's median (position: items, ratio); threads "
              "seen on it")
        for cpu in sorted({c for c, _ in slow}):
            print(f"vCPU {cpu}: " + " ".join(
                f"{k}: {len(slow[(cpu, k)])}, {med(slow[(cpu, k)]):.2f}" for k in range(per)
                if (cpu, k) in slow) + f"; threads {sorted(owners[cpu])}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--layers":
        per_layer(sys.argv[1], int(sys.argv[3]))
    elif len(sys.argv) == 2:
        main(sys.argv[1])
    else:
        sys.exit("usage: pool_trace.py TRACE.csv [--layers PERIOD]")
