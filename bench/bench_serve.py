#!/usr/bin/env python3
# bench_serve.py — what `sparsetrace serve` adds over the engine on the same prompt: per request,
# the client's wall time minus the engine's own time for it (serve's log line "ID: P prompt + G
# generated tokens in S s": the prefill and decode loop `run` performs), i.e. HTTP, JSON parse,
# render, tokenise, reply and the store's row. With C concurrent clients the wait in the queue is
# also reported (latency - engine - overhead is the wait). Nothing lost: every request sent is
# answered 200 and is a complete served row of the store.
#
#   bench_serve.py SPARSETRACE MODEL_DIR [--requests N] [--clients 1,16] [--max-tokens G]
import argparse, json, os, re, sqlite3, statistics, subprocess, sys, tempfile, threading, time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("bin"); ap.add_argument("model")
ap.add_argument("--requests", type=int, default=64)
ap.add_argument("--clients", default="1,16")
ap.add_argument("--max-tokens", type=int, default=4)
args = ap.parse_args()

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]

tools = "\n".join(f"- tool_{i}: reads the file given by its path and reports what changed." for i in range(20))
body = json.dumps({"model": "needle-v4", "temperature": 0, "max_tokens": args.max_tokens,
                   "messages": [{"role": "system", "content": "You are a coding agent.\n" + tools},
                                {"role": "user", "content": "Which tools do you have?"}]}).encode()
tmp = tempfile.mkdtemp(prefix="st_bench_serve.")
log = open(f"{tmp}/serve.log", "w")
srv = subprocess.Popen([args.bin, "serve", "--model", args.model, "--store", f"{tmp}/store", "--port", "0",
                        "--queue", "64", "--ready-file", f"{tmp}/ready"], stderr=log)
try:
    for _ in range(600):
        if os.path.exists(f"{tmp}/ready"): break
        time.sleep(0.1)
    url = open(f"{tmp}/ready").read().strip() + "/v1/chat/completions"

    def one(out):
        t0 = time.perf_counter()
        req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            json.load(r)
            out.append((r.status, r.headers["x-sparsetrace-request-id"], time.perf_counter() - t0))

    one([])  # warm
    print(f"prompt: {len(body)} bytes of JSON, max_tokens {args.max_tokens}; {args.requests} requests per row")
    print("| clients | answered | latency p50 / p99 (ms) | engine p50 (ms) | serve adds p50 / p99 (ms) | rows complete |")
    print("|---|---|---|---|---|---|")
    for c in [int(x) for x in args.clients.split(",")]:
        results, threads = [], []
        per = args.requests // c
        def client():
            for _ in range(per): one(results)
        w0 = time.perf_counter()
        for _ in range(c):
            threads.append(threading.Thread(target=client)); threads[-1].start()
        for t in threads: t.join()
        wall = time.perf_counter() - w0
        time.sleep(0.5)
        log.flush()
        engine = {}
        for line in open(f"{tmp}/serve.log"):
            m = re.match(r"sparsetrace serve: ([0-9a-f-]{36}): (\d+) prompt \+ (\d+) generated tokens in ([0-9.]+) s", line)
            if m: engine[m.group(1)] = float(m.group(4))
        lat = [r[2] for r in results]
        eng = [engine[r[1]] for r in results]
        # one client: latency - engine is serve's own time. Several: latency includes the wait for
        # the engine, so the figure is the engine's busy share of the wall time (the rest is what
        # serve did that no engine work overlapped), as (wall - sum engine) / requests.
        adds = [l - e for l, e in zip(lat, eng)] if c == 1 else None
        db = sqlite3.connect(f"{tmp}/store/index.sqlite")
        ids = [r[1] for r in results]
        done = sum(db.execute("SELECT count(*) FROM requests WHERE id = ? AND state = 'complete' AND origin = 'served'", (i,)).fetchone()[0] for i in ids)
        ok = sum(1 for r in results if r[0] == 200)
        adds_text = (f"{1000 * pct(adds, 50):.1f} / {1000 * pct(adds, 99):.1f}" if adds else
                     f"{1000 * (wall - sum(eng)) / len(eng):.1f} per request not overlapped (engine busy {100 * sum(eng) / wall:.0f}%)")
        print(f"| {c} | {ok}/{per * c} | {1000 * pct(lat, 50):.0f} / {1000 * pct(lat, 99):.0f} | "
              f"{1000 * statistics.median(eng):.0f} | {adds_text} | {done}/{per * c} |")
finally:
    srv.terminate(); srv.wait()
