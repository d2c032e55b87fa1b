#!/usr/bin/env bash
# serve_slots.sh - `hotmoe serve -np 3` (continuous batching on the CPU engine) on loopback with a
# forged tiny model: a greedy completion gives `hotmoe run`'s bytes; six requests at once (three
# prompts, sampled with a seed, streamed and whole, longer than one batch) give each what the
# same request gives alone; a seventh waits in the queue and is served; a client leaving a
# stream frees its slot (counted cancelled, the next request served); /metrics counts busy
# slots and the batched steps (requests at once take far fewer steps than one by one); a chat
# that goes on finds its start in a slot's cache (counted) and gives `hotmoe run`'s bytes; 1,000
# sequential and 64 concurrent requests through the slots with resident memory flat (< 5 % after
# a warm-up; not judged under ASan); -np 0 and a -c too small to split are refused. Skipped (77) without libmicrohttpd.
#   bash tests/cli/serve_slots.sh HOTMOE_BIN TMPDIR      (run from the repository root)
# SERVE_SLOTS_ARGS (e.g. "-ngl 99", "-ngl 99 --cpu-moe" on a GPU machine) go to serve and run;
# with them, requests at once are not held to their bytes alone (a GPU step of more than 8
# tokens takes the prompt kernels; the same arrivals still give the same outputs), only said.
set -u
bin=$1
tmp=$2/serve_slots_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

m=$tmp/q.gguf
"$bin" forge --preset tiny-qwen3moe --type q8_0 --no-hf -q -o "$m" || bad "forge"
"$bin" serve -m "$m" -np 0 --port 0 >/dev/null 2>"$tmp/np0.err"
expect "-np 0: usage error (2)" test $? -eq 2
"$bin" serve -m "$m" -np 4 -c 40 --port 0 >/dev/null 2>"$tmp/small.err"
rc=$?
grep -q "without libmicrohttpd" "$tmp/small.err" && cli_skip "this hotmoe has no server (libmicrohttpd)"
expect "-c 40 -np 4: refused, 10 positions a slot (2)" test $rc -eq 2
expect "-c 40 -np 4: says why" grep -q "leaves 10 positions each" "$tmp/small.err"

# shellcheck disable=SC2086 # SERVE_SLOTS_ARGS: several flags
serve_start "$bin" "$tmp/err" -m "$m" -t 2 -np 3 -c 3072 -b 16 --queue 128 ${SERVE_SLOTS_ARGS:-}
expect "serve -np 3: listening" test -n "$port"
expect "serve -np 3: 1024 positions per slot, said" grep -q "context 1024 per slot, 3 slots" "$tmp/err"
# shellcheck disable=SC2086
"$bin" run -m "$m" -t 2 -p "Hello there" -n 12 --temp 0 --no-display-prompt ${SERVE_SLOTS_ARGS:-} \
  >"$tmp/run.txt" 2>/dev/null
p2="Hello there$(cat "$tmp/run.txt") and then" # a chat that goes on: the first reply, a new turn
# shellcheck disable=SC2086
"$bin" run -m "$m" -t 2 -p "$p2" -n 12 --temp 0 --no-display-prompt ${SERVE_SLOTS_ARGS:-} \
  >"$tmp/run2.txt" 2>/dev/null
asan=
ldd "$bin" 2>/dev/null | grep -q libasan && asan=1
P2="$p2" SERVE_PID=$pid SERVE_ASAN=$asan python3 - "$port" "$tmp/run.txt" "$tmp/run2.txt" \
  >"$tmp/py.out" 2>&1 <<'PY'
import json, os, sys, threading, time, urllib.request, urllib.error
port = sys.argv[1]
run_txt = open(sys.argv[2], encoding="utf-8", errors="replace").read().rstrip("\n")
fails = 0
def check(name, ok):
    global fails
    print(("ok   " if ok else "FAIL ") + name)
    fails += not ok
def post(body):
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                               data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=120) as f:
        raw = f.read().decode()
    if not body.get("stream"):
        return json.loads(raw)["choices"][0]["text"]
    text = ""
    for line in raw.splitlines():
        if line.startswith("data: {"):
            text += json.loads(line[6:])["choices"][0].get("text", "")
    return text

def metric(name):
    m = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    v = [l.split()[1] for l in m.splitlines() if l.startswith(name + " ")]
    return float(v[0]) if v else -1
greedy = post({"prompt": "Hello there", "max_tokens": 12, "temperature": 0})
check("greedy completion: hotmoe run's bytes", greedy == run_txt)
run2 = open(sys.argv[3], encoding="utf-8", errors="replace").read().rstrip("\n")
c0 = metric("hotmoe_prompt_tokens_cached_total")
again = post({"prompt": os.environ["P2"], "max_tokens": 12, "temperature": 0})
c1 = metric("hotmoe_prompt_tokens_cached_total")
cpu = not os.environ.get("SERVE_SLOTS_ARGS")
check(f"a chat that goes on: hotmoe run's bytes, {c1 - c0:.0f} prompt tokens from the cache",
      again == run2 and ((c1 - c0 > 0) if cpu else True))
nocache = post({"prompt": os.environ["P2"], "max_tokens": 12, "temperature": 0,
                "cache_prompt": False})
check("cache_prompt false: read whole, the same bytes",
      nocache == run2 and metric("hotmoe_prompt_tokens_cached_total") == c1)
try:
    post({"prompt": "x", "cache_prompt": "yes"})
    bad_type = None
except urllib.error.HTTPError as e:
    bad_type = e.code
check("cache_prompt of the wrong type: 400", bad_type == 400)
def usage(body):
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                               data=json.dumps(body).encode())
    with urllib.request.urlopen(r, timeout=120) as f:
        return json.loads(f.read())["usage"]["completion_tokens"]
check("ignore_eos: max_tokens tokens exactly",
      usage({"prompt": "Once", "max_tokens": 300, "ignore_eos": True, "seed": 5}) == 300)
try:
    post({"prompt": "x", "ignore_eos": 1})
    bad_type = None
except urllib.error.HTTPError as e:
    bad_type = e.code
check("ignore_eos of the wrong type: 400", bad_type == 400)
long_prompt = " ".join(["the engine reads the experts"] * 6)  # over one batch (-b 16)
bodies = []
for i, p in enumerate(["Once upon a time", "The function returns", long_prompt]):
    for stream in (False, True):
        bodies.append({"prompt": p, "max_tokens": 64, "temperature": 0.8, "seed": 11 + i,
                       "stream": stream})
s0 = metric("hotmoe_batch_steps_total")
alone = [post(b) for b in bodies]
s1 = metric("hotmoe_batch_steps_total")
check("alone: sampled texts not empty", all(alone))
res = [None] * (len(bodies) + 1)
start = threading.Barrier(len(bodies) + 1)  # the seven sent together
def go(k, b):
    start.wait()
    try:
        res[k] = post(b)
    except Exception as e:
        res[k] = e
ts = [threading.Thread(target=go, args=(k, b)) for k, b in enumerate(bodies)]
ts.append(threading.Thread(target=go, args=(len(bodies), bodies[0])))
for t in ts:
    t.start()
for t in ts:
    t.join()
check("7 at once: every request answered", all(isinstance(r, str) for r in res))
same = all(res[k] == alone[k] for k in range(len(bodies))) and res[-1] == alone[0]
if os.environ.get("SERVE_SLOTS_ARGS"):  # GPU: steps over 8 tokens take other kernels
    print(f"info 7 at once: each the bytes it gives alone: {same}")
else:
    check("7 at once: each the bytes it gives alone", same)
s2 = metric("hotmoe_batch_steps_total")
# alone the six took s1 - s0 steps; at once (with a seventh) three slots share each step
check(f"batched: the six alone took {s1 - s0:.0f} steps, seven at once {s2 - s1:.0f}",
      s1 - s0 > 0 and s2 - s1 < 0.7 * (s1 - s0) * 7 / 6 and metric("hotmoe_slots") == 3)

# a client leaving a stream: its slot is freed, the next request served
r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                           data=json.dumps({"prompt": "Once", "max_tokens": 1000,
                                            "ignore_eos": True, "stream": True}).encode())
f = urllib.request.urlopen(r, timeout=60)
f.readline()
f.close()
time.sleep(0.5)
after = post({"prompt": "Hello there", "max_tokens": 12, "temperature": 0})
check("after a client left: served", after == run_txt)
for _ in range(200):  # the left stream's slot ends once the server sees the disconnect
    if metric("hotmoe_slots_busy") == 0:
        break
    time.sleep(0.1)
check("metrics: slots_busy 0 when idle", metric("hotmoe_slots_busy") == 0)
check("metrics: the left stream counted cancelled", metric("hotmoe_requests_cancelled_total") >= 1)
# load through the slots: 1,000 sequential and 64 concurrent requests, resident memory after a
# warm-up (the slots' caches, prompts and runs are reused, nothing grows per request)
def rss():
    for l in open(f"/proc/{os.environ['SERVE_PID']}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
res64 = [None] * 64
def burst():
    def one(i):
        try:
            res64[i] = post({"prompt": f"c {i}", "max_tokens": 2, "stream": i % 2 == 0})
        except Exception as e:
            res64[i] = e
    ts = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return all(isinstance(r, str) for r in res64)
for i in range(30):  # warm-up: connection threads and allocator arenas at their peak
    post({"prompt": f"warm {i}", "max_tokens": 2})
burst()
burst()
r0 = rss()
ok = all(isinstance(post({"prompt": f"seq {i}", "max_tokens": 2}), str) for i in range(1000))
ok = burst() and ok
r1 = rss()
check("load: 1,064 requests through the slots, none failed", ok)
if os.environ.get("SERVE_ASAN"):
    print(f"rss {r0} -> {r1} kB (not judged under ASan: its quarantine holds freed memory)")
else:
    check(f"load: resident memory {r0} -> {r1} kB, growth < 5 %", r1 < r0 * 1.05)
print(f"{fails} failed")
sys.exit(1 if fails else 0)
PY
rc=$?
cat "$tmp/py.out"
expect "python checks" test $rc -eq 0
kill -TERM "$pid"
wait "$pid"
expect "SIGTERM: exit 0" test $? -eq 0
cli_summary serve_slots
