#!/usr/bin/env python3
"""serve_load.py - concurrent streams against an OpenAI-compatible server (hotmoe serve, or a
peer's llama-server beside it): aggregate generated tokens per second and time to first token.

    python3 bench/serve_load.py URL [--streams 1,4,16] [--tokens 128] [--rounds 2] [--json OUT]

Each round starts N streams at once (POST URL/v1/completions, stream true, temperature 0,
max_tokens --tokens, ignore_eos where the server takes it, a different prompt per stream, the
usage chunk asked for) and waits for all; a stream's tokens are its usage's completion tokens
(else its content chunks, one token each on both servers), its TTFT the time from its request
to its first chunk with a choice (one per token on both servers, with or without text: a forged
model's tokens often print nothing; nan when none came). A figure is the best round: aggregate tokens
/ wall time from the first request to the last [DONE], and the median TTFT. Prints one line per
N; --json writes them.
"""
import argparse, json, statistics, threading, time, urllib.request

def stream(url, prompt, tokens, out, i):
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    first, n, used = None, 0, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            if (c.get("usage") or {}).get("completion_tokens") is not None:
                used = c["usage"]["completion_tokens"]
            if c.get("choices"):
                if first is None:
                    first = time.time() - t0
                n += 1 if c["choices"][0].get("text") else 0
    out[i] = (used if used is not None else n, first if first is not None else float("nan"),
              time.time())

def one_round(url, n, tokens):
    out = [None] * n
    ts = [threading.Thread(target=stream, args=(url, f"Story number {i}: once upon a time", tokens, out, i))
          for i in range(n)]
    t0 = time.time()
    for t in ts: t.start()
    for t in ts: t.join()
    end = max(o[2] for o in out)
    return sum(o[0] for o in out) / (end - t0), statistics.median(o[1] for o in out)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for n in [int(x) for x in a.streams.split(",")]:
        best = max((one_round(a.url, n, a.tokens) for _ in range(a.rounds)), key=lambda r: r[0])
        rows.append({"streams": n, "tokens_per_stream": a.tokens, "aggregate_tps": best[0],
                     "ttft_median_s": best[1]})
        print("streams %2d: aggregate %8.2f tok/s, TTFT median %.3f s" % (n, best[0], best[1]),
              flush=True)
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)

if __name__ == "__main__":
    main()
