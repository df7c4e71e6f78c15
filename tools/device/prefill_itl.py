#!/usr/bin/env python3
"""prefill_itl.py - issue #34: what a long prompt costs the streams already
decoding on a server, and its own time to first token.

  prefill_itl.py URL [--streams 4] [--long 32768] [--gen 512] [--delay 2]

1. The long prompt alone (random token ids, /v1/completions, max_tokens 1):
   its time to first token, twice.
2. STREAMS greedy streams (64-token prompts, ignore_eos, GEN tokens each);
   after DELAY seconds the long prompt joins. Prints the gaps between the
   streams' events before it, while it prefills (its submission to its
   answer) and after, and its time to first token there.
Standard library only (the GPU image's python). A stream event is one SSE
chunk: a token whose text is held back (an incomplete UTF-8 sequence) joins
the next, so a gap can span two steps; the same for both server settings."""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse


def post(url, body, on_event=None):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    if not body.get("stream"):
        data = r.read()
        c.close()
        return json.loads(data)
    for line in r:
        line = line.strip()
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            on_event(time.monotonic())
    c.close()
    return None


def pct(v, p):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--long", type=int, default=32768)
    ap.add_argument("--gen", type=int, default=512)
    ap.add_argument("--delay", type=float, default=2.0)
    a = ap.parse_args()
    rng = random.Random(1)
    ids = lambda n: [rng.randrange(3, 200) for _ in range(n)]
    long_body = {"prompt": None, "max_tokens": 1, "temperature": 0}

    for i in range(2):
        long_body["prompt"] = ids(a.long)
        t0 = time.monotonic()
        post(a.url, long_body)
        print(f"alone: {a.long} tokens, time to first token {1e3 * (time.monotonic() - t0):.1f} ms", flush=True)

    events = [[] for _ in range(a.streams)]
    threads = []
    for s in range(a.streams):
        body = {"prompt": ids(64), "max_tokens": a.gen, "temperature": 0, "stream": True, "ignore_eos": True}
        t = threading.Thread(target=post, args=(a.url, body, events[s].append))
        t.start()
        threads.append(t)
    time.sleep(a.delay)
    long_body["prompt"] = ids(a.long)
    t_in = time.monotonic()
    post(a.url, long_body)
    t_out = time.monotonic()
    for t in threads:
        t.join()
    gaps = {"before": [], "during": [], "after": []}
    for ev in events:
        for x, y in zip(ev, ev[1:]):
            k = "before" if y <= t_in else "during" if x < t_out else "after"
            gaps[k].append(1e3 * (y - x))
    print(f"beside {a.streams} streams: time to first token {1e3 * (t_out - t_in):.1f} ms; "
          f"streams ended {1e3 * (max(e[-1] for e in events) - t_out):.0f} ms after it", flush=True)
    for k, v in gaps.items():
        print(f"  stream gaps {k:6s}: {len(v):5d}, p50 {pct(v, 50):7.1f} ms, p90 {pct(v, 90):7.1f}, "
              f"p99 {pct(v, 99):7.1f}, max {max(v) if v else float('nan'):7.1f}", flush=True)


if __name__ == "__main__":
    main()
