#!/usr/bin/env bash
# serve.sh - `hotmoe serve` on loopback with a forged tiny model, driven by Python's urllib: the
# routes, a completion equal to `hotmoe run`'s bytes (greedy, same prompt), streaming (SSE
# chunks that add up to the same text, usage, [DONE]), stop strings, chat, 8 requests at once,
# errors in OpenAI's shape (400 bad JSON or field, 401 without the key, 404, 405, 413),
# /metrics, a client leaving a stream (cancelled), 1,000 sequential and 64 concurrent requests
# with resident memory flat (< 5 % after a warm-up; not judged under ASan), and SIGTERM: exit 0. Skipped (77) in a build without libmicrohttpd.
#   bash tests/cli/serve.sh HOTMOE_BIN TMPDIR      (run from the repository root)
set -u
bin=$1
tmp=$2/serve_sh
mkdir -p "$tmp"
. "$(dirname "${BASH_SOURCE[0]}")/common.bash"

m=$tmp/q.gguf
"$bin" forge --preset tiny-qwen3moe --type q8_0 --no-hf -q -o "$m" || bad "forge"
serve_start "$bin" "$tmp/err" -m "$m" -t 2 --api-key sekret --queue 128
asan=
ldd "$bin" 2>/dev/null | grep -q libasan && asan=1
expect "serve: listening" test -n "$port"
"$bin" run -m "$m" -t 2 -p "Hello there" -n 12 --temp 0 --no-display-prompt >"$tmp/run.txt" 2>/dev/null
REPO=$PWD SERVE_PID=$pid SERVE_ASAN=$asan python3 - "$port" "$tmp/run.txt" >"$tmp/py.out" 2>&1 <<'PY'
import json, os, sys, threading, urllib.request, urllib.error
port, run_txt = sys.argv[1], open(sys.argv[2], encoding="utf-8", errors="replace").read()
KEY = {"Authorization": "Bearer sekret"}
fails = 0
def check(name, ok):
    global fails
    print(("ok   " if ok else "FAIL ") + name)
    fails += not ok
def req(path, body=None, method=None, headers=KEY, raw=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    r = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                               headers=headers)
    try:
        with urllib.request.urlopen(r, timeout=60) as f:
            return f.status, f.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
def err_shape(body, code):
    try:
        e = json.loads(body)["error"]
        return e["code"] == code and isinstance(e["message"], str) and e["message"]
    except Exception:
        return False

s, b = req("/health", headers={})
check("health: 200 without a key", s == 200 and json.loads(b)["status"] == "ok")
s, b = req("/v1/models")
check("models: the model listed", s == 200 and json.loads(b)["data"][0]["object"] == "model")
s, b = req("/v1/models", headers={})
check("no key: 401 in OpenAI's shape", s == 401 and err_shape(b, 401))
s, b = req("/v1/models", headers={"Authorization": "Bearer wrong"})
check("wrong key: 401", s == 401)

body = {"prompt": "Hello there", "max_tokens": 12, "temperature": 0}
s, b = req("/v1/completions", body)
r = json.loads(b) if s == 200 else {}
text = r.get("choices", [{}])[0].get("text")
check("completion: 200", s == 200)
check("completion: the text `hotmoe run` prints (greedy, same prompt)", text == run_txt.rstrip("\n"))
check("completion: usage", r.get("usage", {}).get("completion_tokens") == 12 and
      r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 12)
check("completion: finish length", r.get("choices", [{}])[0].get("finish_reason") == "length")
s2, b2 = req("/v1/completions", body)
check("completion: the same request, the same bytes", s2 == 200 and json.loads(b2)["choices"] == r["choices"])

s, b = req("/v1/completions", dict(body, stream=True, stream_options={"include_usage": True}))
events = [l[6:] for l in b.split("\n\n") if l.startswith("data: ")]
check("stream: ends with [DONE]", s == 200 and events and events[-1] == "[DONE]")
chunks = [json.loads(e) for e in events[:-1]]
streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
check("stream: the chunks add up to the completion", streamed == text)
check("stream: finish and usage", any(c["choices"] and c["choices"][0]["finish_reason"] == "length" for c in chunks)
      and chunks[-1]["usage"]["completion_tokens"] == 12)
s, b = req("/v1/completions", dict(body, stop=["\u0001\u0002\u0003\u0004"], stream=True))
ev = [json.loads(l[6:]) for l in b.split("\n\n") if l.startswith("data: {")]
per_token = [c for c in ev if c["choices"] and c["choices"][0]["finish_reason"] is None]
check("stream: a chunk for each token, held-back text or not (as llama-server sends), then the "
      "text held back", len(per_token) == 13 and any(c["choices"][0]["text"] == "" for c in per_token) and
      "".join(c["choices"][0]["text"] for c in ev) == text)

if text and len(text) > 4:
    stop = text[3:6]
    s, b = req("/v1/completions", dict(body, stop=[stop]))
    r2 = json.loads(b)["choices"][0]
    check("stop string: the text ends before it", s == 200 and r2["text"] == text[:text.find(stop)]
          and r2["finish_reason"] == "stop")
    s, b = req("/v1/completions", dict(body, stop=stop, stream=True))
    ev = [json.loads(l[6:]) for l in b.split("\n\n") if l.startswith("data: {")]
    check("stop string, streamed: the same text", "".join(c["choices"][0]["text"] for c in ev) == text[:text.find(stop)])

s, b = req("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi"}],
                                    "max_tokens": 6, "temperature": 0.7, "seed": 3})
c = json.loads(b) if s == 200 else {}
check("chat: an assistant message", s == 200 and c["choices"][0]["message"]["role"] == "assistant"
      and c["object"] == "chat.completion")
s, b2 = req("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi"}],
                                     "max_tokens": 6, "temperature": 0.7, "seed": 3})
check("chat: the same seed, the same reply", s == 200 and json.loads(b2)["choices"] == c["choices"])
s, b = req("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi"}],
                                    "max_tokens": 6, "temperature": 0.7, "seed": 3, "stream": True})
ev = [json.loads(l[6:]) for l in b.split("\n\n") if l.startswith("data: {")]
deltas = [e["choices"][0]["delta"] for e in ev if e.get("choices")]
check("chat stream: the first delta names the role, no later one, the text the reply's",
      s == 200 and deltas and deltas[0].get("role") == "assistant" and
      all("role" not in d for d in deltas[1:]) and
      "".join(d.get("content") or "" for d in deltas) == c["choices"][0]["message"]["content"])

a1 = req("/v1/completions", {"prompt": "Hello there", "max_tokens": 12, "temperature": 1.0})
a2 = req("/v1/completions", {"prompt": "Hello there", "max_tokens": 12, "temperature": 1.0})
check("no seed, temperature 1: a fresh seed per request (two replies differ)",
      a1[0] == a2[0] == 200 and json.loads(a1[1])["choices"] != json.loads(a2[1])["choices"])
res = [None] * 8
def one(i):
    res[i] = req("/v1/completions", {"prompt": f"Number {i}", "max_tokens": 4})
ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
check("8 requests at once: all answered", all(r and r[0] == 200 for r in res))

s, b = req("/metrics", headers={})
lines = dict(l.split(" ", 1) for l in b.splitlines() if l and not l.startswith("#"))
check("metrics: Prometheus text with the counts", s == 200 and int(lines["hotmoe_requests_total"]) >= 15
      and int(lines["hotmoe_completion_tokens_total"]) >= 24 and lines["hotmoe_queue_depth"] == "0"
      and float(lines["hotmoe_decode_tokens_per_second"]) > 0 and lines["hotmoe_vram_bytes"] == "0")
s, b = req("/moe-layer-perf")
p = json.loads(b) if s == 200 else {}
check("GET /moe-layer-perf on the CPU: mode off, no counters, said why", s == 200 and p.get("mode") == "off"
      and p.get("perf") is None and "tiered" in p.get("note", ""))
s, b = req("/moe-layer-perf", {"mode": "full"})
check("POST /moe-layer-perf full without a tiered placement: 409", s == 409 and err_shape(b, 409))
s, b = req("/moe-layer-perf", {"mode": "off"})
check("POST /moe-layer-perf off: 200", s == 200 and json.loads(b)["mode"] == "off")
s, b = req("/moe-layer-perf", {"mode": "loud"})
check("POST /moe-layer-perf bad mode: 400", s == 400)
s, b = req("/moe-layer-perf", headers={})
check("/moe-layer-perf needs the key: 401", s == 401)
s, b = req("/moe-hot-cache")
h = json.loads(b) if s == 200 else {}
check("GET /moe-hot-cache without a cache: no layers", s == 200 and h.get("layers") == [] and h.get("hot_experts_total") == 0)
learn = {"format": "hotmoe-expert-usage", "version": 1, "n_layer": 4, "n_expert": 16,
         "n_expert_used": 4, "prompts": 1, "total_tokens": 40, "rejected": 0,
         "experts": [4 * (16 - e) for e in range(16)],
         "layers": [{"layer": il, "calls": 1, "tokens": 40, "expert_hits_total": 136,
                     "experts": [16 - e for e in range(16)]} for il in range(4)]}
s, b = req("/moe-hot-cache", learn)
check("POST /moe-hot-cache without a tiered placement: 409 saying so", s == 409 and err_shape(b, 409))
s, b = req("/moe-hot-cache", raw=b'{"format": "hotmoe-expert-usage"')
check("POST /moe-hot-cache, not JSON: 400", s == 400 and err_shape(b, 400))
s, b = req("/moe-hot-cache", dict(learn, n_layer=5))
check("POST /moe-hot-cache, a file that does not parse as the schema: 400", s == 400)
s, b = req("/")
page = open(os.path.join(os.environ["REPO"], "src/server/dashboard.html"), encoding="utf-8").read()
check("GET /: the dashboard, src/server/dashboard.html's bytes", s == 200 and b == page and "<canvas" in b)
s, b = req("/moe-routing")
rt = json.loads(b) if s == 200 else {}
routed = sum(sum(l["experts"]) for l in rt.get("layers", []))
toks = sum(l["tokens"] for l in rt.get("layers", []))
check("GET /moe-routing: every layer's routing counted (n_used per token)", s == 200 and rt["n_expert"] == 16
      and len(rt["layers"]) == 4 and toks > 0 and routed == toks * 4)
s, b = req("/v1/completions", raw=b"{not json")
check("bad JSON: 400 in OpenAI's shape", s == 400 and err_shape(b, 400))
s, b = req("/v1/completions", {"prompt": "x", "temperature": "hot"})
check("bad field: 400 naming it", s == 400 and "temperature" in json.loads(b)["error"]["message"])
s, b = req("/v1/completions", {"prompt": "x", "n": 2})
check("n = 2: 400", s == 400)
s, b = req("/v1/chat/completions", {"messages": []})
check("no messages: 400", s == 400)
s, b = req("/v1/nothing")
check("unknown route: 404", s == 404 and err_shape(b, 404))
s, b = req("/v1/completions", method="GET")
check("wrong method: 405", s == 405 and err_shape(b, 405))
s, b = req("/v1/completions", raw=b'{"prompt": "' + b"a" * (2 << 20) + b'"}')
check("oversize body: 413", s == 413 and err_shape(b, 413))
# a client that leaves a stream: its request is cancelled, the next one is served at once
import http.client, re, time
h = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
h.request("POST", "/v1/completions", json.dumps({"prompt": "Go on", "max_tokens": 3000,
                                                 "ignore_eos": True, "stream": True}), KEY)
resp = h.getresponse()
first = resp.read(6)
h.sock.close()
h.close()
t0 = time.time()
s, b = req("/v1/completions", {"prompt": "After", "max_tokens": 2})
took = time.time() - t0
deadline = time.time() + 10
cancelled = 0
while time.time() < deadline:
    m = re.search(r"^hotmoe_requests_cancelled_total (\d+)$", req("/metrics", headers={})[1], re.M)
    cancelled = int(m.group(1)) if m else 0
    if cancelled >= 1:
        break
    time.sleep(0.1)
check("a client that leaves a stream: its request cancelled", first.startswith(b"data: ") and cancelled >= 1)
check("... and the next request answered", s == 200)

# load: 1,000 sequential and 64 concurrent requests; resident memory after a warm-up of 50 and
# two bursts of 64
def rss():
    for l in open(f"/proc/{os.environ['SERVE_PID']}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
import os
res = [None] * 64
def one2(i):
    res[i] = req("/v1/chat/completions", {"messages": [{"role": "user", "content": f"c {i}"}],
                                          "max_tokens": 2, "stream": i % 2 == 0})
def burst():
    ts = [threading.Thread(target=one2, args=(i,)) for i in range(64)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return all(r and r[0] == 200 for r in res)
for i in range(50):  # warm-up: the same mix (connection threads, their stacks, allocator arenas)
    req("/v1/completions", {"prompt": f"warm {i}", "max_tokens": 2})
burst()
burst()
r0 = rss()
ok, lat = True, []
for i in range(1000):
    t0 = time.time()
    ok = req("/v1/completions", {"prompt": f"seq {i}", "max_tokens": 2})[0] == 200 and ok
    lat.append(time.time() - t0)
lat.sort()
print("load: latency p50 %.2f ms, p90 %.2f ms, p99 %.2f ms (1,000 sequential, 2 tokens each)"
      % (1e3 * lat[500], 1e3 * lat[900], 1e3 * lat[990]))
ok = burst() and ok
r1 = rss()
check("load: 1,064 requests, none failed", ok)
if os.environ.get("SERVE_ASAN"):
    print(f"rss {r0} -> {r1} kB (not judged under ASan: its quarantine holds freed memory)")
else:
    check(f"load: resident memory {r0} -> {r1} kB, growth < 5 %", r1 < r0 * 1.05)
sys.exit(1 if fails else 0)
PY
expect "the HTTP checks (see py.out)" test $? -eq 0
grep '^FAIL' "$tmp/py.out" >&2
kill -TERM $pid 2>/dev/null
for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
wait $pid
expect "SIGTERM: exit 0" test $? -eq 0
expect "SIGTERM: the counts" grep -q "requests, .* completed" "$tmp/err"

cli_summary serve.sh
