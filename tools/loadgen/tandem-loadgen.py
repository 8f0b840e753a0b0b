#!/usr/bin/python3
"""tandem-loadgen: N requests at concurrency C against a running coordinator.

    tandem-loadgen.py --endpoint E [--requests N] [--concurrency C] [--seed S]
        [--max-tokens N] [--mix greedy=4,sampled=2,stream=3,cancel=1,malformed=1]
        [--generate PATH/tandem-generate --target DIR] [--expect-faults]
        [--pids coordinator=PID,draft=PID,target=PID] [--rss-every N] [--json] [--timeout-s T]

Each of C client sockets (DEALER, one connection each, as separate clients would
be) keeps one request in flight until N have been sent. Requests are drawn from a
seeded mix of prompt lengths (short, medium, long), greedy and sampled, streamed and
not, some cancelled after their first token event, some malformed on purpose.

Checks, not just timings:
  - greedy requests are compared with their expected ids: with --generate and
    --target, tandem-generate computes the target-only ids of each distinct
    greedy request once; a request whose ids differ is a mismatch (something was
    mixed up between requests, or the output depends on the load);
  - every malformed request must get an `invalid_request` error;
  - a cancelled request must end with `done` (finish_reason "cancelled") or an
    error coded `cancelled`, within the timeout;
  - anything else that is not a `done` is an unexpected error, unless
    --expect-faults lets `target_unavailable` through (fault-injection runs);
  - a client whose connection drops while its request runs (the coordinator
    was killed or restarted: its requests are gone with it) ends that request
    at once as `coordinator_lost`, an error of this tool's own, expected only
    with --expect-faults; that client then takes a fresh socket (a request
    it sent as the coordinator died may still be queued in the old one, be
    served by the restarted coordinator and answered after it was counted),
    and its next request waits for the coordinator to be back;
  - a reply naming another request than the one in flight is not taken for
    it (counted as late_replies, shown in the report);
  - a request with no reply within --timeout-s is a hang.
Prints throughput (requests/s, generated tokens/s), time to first token and
per-output-token latency percentiles (p50, p99; measured on streamed requests), errors by code, and the resident
memory (VmRSS) of each process given with --pids at start and end; with
--rss-every N also after every N finished requests, the growth from the first
of those samples to the end, and the growth over the second half of the run
(from the sample at N/2 requests to the end). The second is the leak figure: a
leak grows both halves alike, while the coordinator's warm-up does not repeat:
each client connection's ZeroMQ pipes keep a second 16 KB chunk per direction
once 256 messages went through them (about 33 KB per connection, reached after
some thousands of requests at 16 connections; docs/operations.md).
Exit status 0
when there was no mismatch, no hang, no unexpected error; 1 otherwise.
Needs python3-zmq (Debian).
"""
import argparse
import json
import random
import subprocess
import sys
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

PROMPT_LENGTHS = {"short": (2, 6), "medium": (16, 40), "long": (80, 160)}


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def parse_mix(text):
    mix = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        if name not in ("greedy", "sampled", "stream", "cancel", "malformed"):
            raise SystemExit("--mix: unknown kind %r" % name)
        mix[name] = int(weight)
    return mix


class Plan:
    """The seeded list of requests: the same arguments give the same requests."""

    def __init__(self, args, vocab):
        rng = random.Random(args.seed)
        mix = parse_mix(args.mix)
        kinds = [k for k, w in mix.items() for _ in range(w)]
        # A small pool of prompts, so that expected ids are computed once per prompt.
        self.prompts = []
        for name, (lo, hi) in PROMPT_LENGTHS.items():
            for _ in range(3):
                n = rng.randint(lo, hi)
                self.prompts.append([rng.randrange(1, vocab) for _ in range(n)])
        self.requests = []
        for i in range(args.requests):
            kind = rng.choice(kinds)
            prompt = rng.randrange(len(self.prompts))
            max_tokens = rng.randint(max(1, args.max_tokens // 4), args.max_tokens)
            req = {"v": 1, "type": "generate", "id": "lg-%d" % i, "prompt_ids": self.prompts[prompt],
                   "max_tokens": max_tokens, "temperature": 0}
            if kind == "sampled":
                req.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1 << 40))
            elif kind == "stream":
                req["stream"] = True
            elif kind == "cancel":
                req["stream"] = True
                req["max_tokens"] = args.max_tokens
            self.requests.append((kind, prompt, req))


def expected_ids(args, plan):
    """Target-only greedy ids per (prompt, max_tokens), from tandem-generate."""
    need = sorted({(p, r["max_tokens"]) for k, p, r in plan.requests if k in ("greedy", "stream")})
    by_prompt = {}
    for p, n in need:
        by_prompt[p] = max(by_prompt.get(p, 0), n)
    longest = {}
    for p, n in by_prompt.items():
        cmd = [args.generate, "--model", args.target, "--ids", ",".join(map(str, plan.prompts[p])),
               "--max-tokens", str(n), "--temperature", "0", "--json", "--threads", "1"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise SystemExit("tandem-generate failed: %s" % r.stderr[-500:])
        longest[p] = json.loads(r.stdout.strip().splitlines()[-1])["ids"]
    # Greedy output of n tokens is the prefix of a longer run, unless it
    # stopped at EOS first: then the shorter run is that same prefix.
    return {(p, n): longest[p][:n] for p, n in need}


class Client:
    def __init__(self, ctx, endpoint):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # A drop of the connection is the only sign that the coordinator
        # died with our request: its replies will never come.
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sock.connect(endpoint)
        self.busy = None  # (kind, prompt, req, t_sent, t_first, n_events, last_event_t, cancel_sent)

    def dropped(self):
        """True when the monitor reports a dropped connection (reads all its events)."""
        drop = False
        while self.monitor.poll(0):
            drop = drop or recv_monitor_message(self.monitor)["event"] == zmq.EVENT_DISCONNECTED
        return drop

    def close(self):
        self.sock.disable_monitor()
        self.monitor.close()
        self.sock.close()

    def send(self, item):
        kind, prompt, req = item
        if kind == "malformed":
            self.sock.send(b'{"v":1,"type":"generate","id":"%s","prompt_ids":[1,2' % req["id"].encode())
        else:
            self.sock.send(json.dumps(req).encode())
        self.busy = {"kind": kind, "prompt": prompt, "req": req, "t_sent": time.monotonic(), "t_first": None,
                     "token_times": [], "cancel_sent": False}


def renew(c, ctx, endpoint, poller):
    """Replaces c's socket (and its monitor) with a fresh connection."""
    poller.unregister(c.sock)
    poller.unregister(c.monitor)
    c.close()
    c.__init__(ctx, endpoint)
    poller.register(c.sock, zmq.POLLIN)
    poller.register(c.monitor, zmq.POLLIN)


def run(args):
    ctx = zmq.Context.instance()
    probe = ctx.socket(zmq.DEALER)
    probe.setsockopt(zmq.LINGER, 0)
    probe.connect(args.endpoint)
    probe.send(json.dumps({"v": 1, "type": "stats", "id": "lg-stats"}).encode())
    if not probe.poll(30000):
        raise SystemExit("no stats reply from %s" % args.endpoint)
    stats = json.loads(probe.recv())
    vocab = args.vocab
    plan = Plan(args, vocab)
    expected = expected_ids(args, plan) if args.generate and args.target else {}

    pids = {}
    if args.pids:
        for part in args.pids.split(","):
            name, _, pid = part.partition("=")
            pids[name] = int(pid)
    rss_start = {n: rss_kb(p) for n, p in pids.items()}

    clients = [Client(ctx, args.endpoint) for _ in range(args.concurrency)]
    poller = zmq.Poller()
    for c in clients:
        poller.register(c.sock, zmq.POLLIN)
        poller.register(c.monitor, zmq.POLLIN)
    pending = list(plan.requests)
    pending.reverse()
    results = {"done": 0, "mismatch": [], "hang": [], "unexpected": {}, "expected_errors": {}, "codes": {},
               "tokens": 0, "ttft": [], "tpot": [], "cancelled": 0, "late": []}
    # A marker for drivers that inject faults under load (tests/e2e/test_loadgen.py).
    print("tandem-loadgen: load started", file=sys.stderr, flush=True)
    rss_samples = {n: [] for n in pids}
    next_sample = args.rss_every if args.rss_every > 0 else None
    t0 = time.monotonic()
    for c in clients:
        if pending:
            c.send(pending.pop())
    while any(c.busy for c in clients):
        finished = args.requests - len(pending) - sum(1 for c in clients if c.busy)
        if next_sample is not None and finished >= next_sample:
            for n, p in pids.items():
                rss_samples[n].append(rss_kb(p))
            next_sample += args.rss_every
        events = dict(poller.poll(100))
        now = time.monotonic()
        for c in clients:
            b = c.busy
            if b is None:
                continue
            if c.sock in events:
                m = json.loads(c.sock.recv())
                if m.get("id", "") not in (b["req"]["id"], ""):
                    results["late"].append("%s for %s (now %s)" % (m.get("code", m.get("type")), m.get("id"),
                                                                   b["req"]["id"]))
                    continue  # a late reply to an earlier request of this socket (a cancelled one's)
                typ = m.get("type")
                if typ == "token":
                    if b["t_first"] is None:
                        b["t_first"] = now
                    b["token_times"].append((now, len(m.get("ids", []))))
                    if b["kind"] == "cancel" and not b["cancel_sent"]:
                        c.sock.send(json.dumps({"v": 1, "type": "cancel", "id": b["req"]["id"]}).encode())
                        b["cancel_sent"] = True
                    continue
                finish(args, c, b, m, now, expected, results)
                c.busy = None
                if pending:
                    c.send(pending.pop())
            elif c.monitor in events and c.dropped():
                # Replies that came before the drop were read above (the
                # socket goes first); what is still missing will not come
                # from the coordinator that died.
                lost = {"type": "error", "code": "coordinator_lost", "id": b["req"]["id"],
                        "message": "the connection dropped while the request ran"}
                finish(args, c, b, lost, now, expected, results)
                c.busy = None
                # A fresh socket: a request sent in the moment between the
                # death and our reading of the drop sits in this socket's
                # queue, goes to the restarted coordinator when the socket
                # reconnects, and is answered there, after we counted it
                # lost. A malformed one's error has no id to tell it from
                # the next request's.
                renew(c, ctx, args.endpoint, poller)
                if pending:
                    c.send(pending.pop())
            elif now - b["t_sent"] > args.timeout_s:
                results["hang"].append(b["req"]["id"])
                # A fresh socket: a late reply must not be taken for the next request's.
                renew(c, ctx, args.endpoint, poller)
                if pending:
                    c.send(pending.pop())
    wall = time.monotonic() - t0
    rss_end = {n: rss_kb(p) for n, p in pids.items()}
    report(args, results, wall, rss_start, rss_end, stats, rss_samples)
    ok = not results["mismatch"] and not results["hang"] and not results["unexpected"]
    return 0 if ok else 1


def finish(args, c, b, m, now, expected, results):
    kind, req = b["kind"], b["req"]
    typ = m.get("type")
    code = m.get("code", "") if typ == "error" else "done"
    results["codes"][code] = results["codes"].get(code, 0) + 1
    if kind == "malformed":
        if code == "invalid_request" or (args.expect_faults and code == "coordinator_lost"):
            results["expected_errors"][code] = results["expected_errors"].get(code, 0) + 1
        else:
            results["unexpected"].setdefault("malformed got " + code, []).append(req["id"])
        return
    if typ == "error":
        if kind == "cancel" and code == "cancelled":
            results["cancelled"] += 1
            return
        if args.expect_faults and code in ("target_unavailable", "coordinator_lost"):
            results["expected_errors"][code] = results["expected_errors"].get(code, 0) + 1
            return
        results["unexpected"].setdefault(code, []).append("%s: %s" % (req["id"], m.get("message", "")))
        return
    if typ != "done":
        results["unexpected"].setdefault("reply type " + str(typ), []).append(req["id"])
        return
    ids = m.get("ids", [])
    results["done"] += 1
    results["tokens"] += len(ids)
    if kind == "cancel":
        if m.get("finish_reason") == "cancelled":
            results["cancelled"] += 1
        return
    # Latencies are observable only on streamed requests: a non-streamed
    # reply arrives whole.
    if b["t_first"] is not None:
        first = b["t_first"]
        results["ttft"].append((first - b["t_sent"]) * 1000.0)
        if len(ids) > 1:
            results["tpot"].append((now - first) * 1000.0 / (len(ids) - 1))
    key = (b["prompt"], req["max_tokens"])
    if kind in ("greedy", "stream") and key in expected:
        want = expected[key]
        # The target-only run stopped where the reply must: at its EOS or
        # at max_tokens, so the ids are exactly the expected ones; only a
        # stop string may end a reply earlier, on a prefix of them.
        early_ok = m.get("finish_reason") == "stop_string"
        if ids != want if not early_ok else ids != want[:len(ids)]:
            results["mismatch"].append("%s: got %d ids, first difference at %d" % (
                req["id"], len(ids), next((i for i, (a, w) in enumerate(zip(ids, want)) if a != w),
                                          min(len(ids), len(want)))))


def report(args, r, wall, rss_start, rss_end, stats, rss_samples):
    out = {
        "requests": args.requests, "concurrency": args.concurrency, "wall_s": round(wall, 3),
        "requests_per_s": round(args.requests / wall, 2) if wall > 0 else 0,
        "generated_tokens_per_s": round(r["tokens"] / wall, 1) if wall > 0 else 0,
        "done": r["done"], "cancelled": r["cancelled"],
        "ttft_ms": {"p50": round(percentile(r["ttft"], 50), 2), "p99": round(percentile(r["ttft"], 99), 2)},
        "tpot_ms": {"p50": round(percentile(r["tpot"], 50), 2), "p99": round(percentile(r["tpot"], 99), 2)},
        "replies_by_code": r["codes"], "expected_errors": r["expected_errors"],
        "unexpected_errors": {k: len(v) for k, v in r["unexpected"].items()},
        "mismatches": len(r["mismatch"]), "hangs": len(r["hang"]), "late_replies": r["late"][:20],
        "rss_kb": {n: {"start": rss_start.get(n), "end": rss_end.get(n)} for n in rss_start},
    }
    if args.rss_every > 0:
        out["rss_samples_kb"] = rss_samples
        out["rss_growth_pct"] = {}
        out["rss_growth_second_half_pct"] = {}
        for n, v in rss_samples.items():
            if v and v[0] and rss_end.get(n):
                out["rss_growth_pct"][n] = round((rss_end[n] - v[0]) * 100.0 / v[0], 2)
            half = args.requests // 2 // args.rss_every - 1  # the sample taken at N/2
            if 0 <= half < len(v) and v[half] and rss_end.get(n):
                out["rss_growth_second_half_pct"][n] = round((rss_end[n] - v[half]) * 100.0 / v[half], 2)
    if args.json:
        print(json.dumps(out))
    else:
        print("tandem-loadgen: %d requests at concurrency %d in %.1f s: %.1f requests/s, %.1f tokens/s"
              % (args.requests, args.concurrency, wall, out["requests_per_s"], out["generated_tokens_per_s"]))
        print("  time to first token ms: p50 %.1f  p99 %.1f" % (out["ttft_ms"]["p50"], out["ttft_ms"]["p99"]))
        print("  per output token ms:    p50 %.2f  p99 %.2f" % (out["tpot_ms"]["p50"], out["tpot_ms"]["p99"]))
        print("  replies by code: %s" % json.dumps(r["codes"], sort_keys=True))
        print("  cancelled: %d; expected errors: %s" % (r["cancelled"], json.dumps(r["expected_errors"])))
        for n in rss_start:
            print("  RSS %-11s start %s kB, end %s kB" % (n, rss_start[n], rss_end[n]))
        for n, v in out.get("rss_samples_kb", {}).items():
            print("  RSS %-11s every %d requests: %s kB; growth after the first sample: %s%%, "
                  "over the second half: %s%%" % (n, args.rss_every, v, out["rss_growth_pct"].get(n),
                                                  out["rss_growth_second_half_pct"].get(n)))
    for k, v in r["unexpected"].items():
        print("UNEXPECTED %s (%d): %s" % (k, len(v), "; ".join(v[:5])), file=sys.stderr)
    for m in r["mismatch"][:10]:
        print("MISMATCH %s" % m, file=sys.stderr)
    if r["hang"]:
        print("HANG (no reply within %.0f s): %s" % (args.timeout_s, ", ".join(r["hang"][:10])), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description="Tandem load generator")
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--vocab", type=int, default=490, help="prompt ids are drawn from 1..this-1")
    ap.add_argument("--mix", default="greedy=4,sampled=2,stream=3,cancel=1,malformed=1")
    ap.add_argument("--generate", help="tandem-generate, to compute expected greedy ids")
    ap.add_argument("--target", help="the target model directory (for --generate)")
    ap.add_argument("--expect-faults", action="store_true",
                    help="target_unavailable and coordinator_lost are expected outcomes (fault-injection runs)")
    ap.add_argument("--pids", help="name=pid,... processes whose RSS is reported")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="a request with no reply after this is a hang")
    ap.add_argument("--rss-every", type=int, default=0,
                    help="also sample RSS after every N finished requests (soak runs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.requests < 1 or args.concurrency < 1:
        raise SystemExit("--requests and --concurrency must be >= 1")
    sys.exit(run(args))


if __name__ == "__main__":
    main()
