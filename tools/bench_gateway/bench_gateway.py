#!/usr/bin/python3
"""bench_gateway.py: what the HTTP gateway costs: time to first token and
tokens/s of one streamed request through HTTP (tandem-gateway, SSE) against the
same request straight over the ZeroMQ client protocol, in one run.

    bench_gateway.py [--build DIR] [--pair tiny|small] [--max-tokens N] [--repeat N] [--threads N]

Both paths use the same pipeline (coordinator + draft + target), prompt (a chat
message), greedy decoding and a fixed spec_k (so both do the same rounds), and
alternate request by request. Per path it prints the median of:
  - TTFT: request sent to the first token event / SSE chunk with token ids;
  - decode tokens/s: (tokens - 1) / (last token - first token), as tandem-generate;
  - end-to-end tokens/s: tokens / (last token - request sent).
Needs python3-zmq (run with /usr/bin/python3); uses tests/e2e/tandem_e2e.py.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))

CHAT = "Write a short story about a lighthouse keeper."


def run_zmq(e2e, sock, rid, args):
    t0 = time.perf_counter()
    sock.send_json({"v": 1, "type": "generate", "id": rid, "messages": [{"role": "user", "content": CHAT}],
                    "max_tokens": args.max_tokens, "temperature": 0, "spec_k": args.spec_k, "stream": True})
    first = last = None
    n = 0
    while True:
        m = e2e.next_event(sock, rid, 300)
        if m["type"] == "token" and m.get("ids"):
            last = time.perf_counter()
            first = first or last
            n += len(m["ids"])
        if m["type"] in ("done", "error"):
            e2e.check(m["type"] == "done", "zmq: %s" % m)
            return t0, first, last, n


def run_http(base, args):
    host, port = base.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    body = json.dumps({"model": args.model, "messages": [{"role": "user", "content": CHAT}],
                       "max_tokens": args.max_tokens, "temperature": 0, "spec_k": args.spec_k, "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    first = last = None
    n = 0
    buf = b""
    while True:
        line = r.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        ids = json.loads(line[6:]).get("tandem", {}).get("ids", [])
        if ids:
            last = time.perf_counter()
            first = first or last
            n += len(ids)
    conn.close()
    del buf
    return t0, first, last, n


def summary(name, runs):
    ttft = statistics.median([(f - t0) * 1000 for t0, f, _, _ in runs])
    dec = statistics.median([(n - 1) / (l - f) for _, f, l, n in runs if n > 1 and l > f])
    e2e = statistics.median([n / (l - t0) for t0, _, l, n in runs])
    print("%-5s  TTFT %8.2f ms   decode %8.1f tok/s   end-to-end %8.1f tok/s   (%d tokens, median of %d)" %
          (name, ttft, dec, e2e, runs[0][3], len(runs)))
    return ttft, dec, e2e


def main():
    ap = argparse.ArgumentParser(description="Tandem HTTP gateway vs ZeroMQ client benchmark")
    ap.add_argument("--build", default=os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--pair", default="small", choices=["tiny", "small"])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--spec-k", type=int, default=4)
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e as e2e
    e2e.BUILD = os.environ["TANDEM_BUILD_DIR"]
    p = e2e.Pipeline("benchgw", max_concurrency=1, max_queue=1, worker_timeout_ms=3000,
                     extra={"draft_worker": {"threads": args.threads}, "target_worker": {"threads": args.threads}})
    try:
        names = ("tiny-draft", "tiny") if args.pair == "tiny" else ("small-draft", "small")
        p.make_pair(names[0], names[1])
        args.model = names[1]
        base = p.enable_gateway(log_level="warn")
        p.start_all()
        p.start("gateway")
        p.wait_http()
        sock = p.client()
        run_zmq(e2e, sock, "warm", args)
        run_http(base, args)
        zr, hr = [], []
        for i in range(args.repeat):
            zr.append(run_zmq(e2e, sock, "z%d" % i, args))
            hr.append(run_http(base, args))
        print("pair %s, %d max tokens, spec_k %d, %d thread(s) per worker" % (args.pair, args.max_tokens, args.spec_k,
                                                                             args.threads))
        z = summary("zmq", zr)
        h = summary("http", hr)
        print("http - zmq: TTFT %+.2f ms, decode %+.1f%%, end-to-end %+.1f%%" %
              (h[0] - z[0], (h[1] / z[1] - 1) * 100, (h[2] / z[2] - 1) * 100))
    finally:
        p.close()


if __name__ == "__main__":
    main()
