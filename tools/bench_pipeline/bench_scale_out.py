#!/usr/bin/python3
"""bench_scale_out.py: what a second pair and a draft on another host cost
or buy, through the three-process pipeline, in one run.

    bench_scale_out.py [--build DIR] [--pair tiny|small] [--repeat N] [--clients N] [--max-tokens N]

(1) --clients (8) concurrent greedy requests of --max-tokens (64) on one
    pair (coordinator.max_concurrency = clients) and on two pairs under one
    coordinator (config "pairs", the same per pair), every worker 1 thread:
    aggregate tokens/s (generated tokens over the wall time from the first
    send to the last reply). Runs alternate; medians of --repeat.
(2) One request at a time, K fixed at 3, greedy and seeded sampled: the
    wall time per verified round (request time / the stats' rounds) with
    the draft's halves in shared memory (one host) and as messages over tcp
    (coordinator, draft and target in three network namespaces with a
    /dev/shm each: tests/e2e/test_pipeline_hosts.py); the bytes a half adds
    to draft_ready and to the verify, at this model's vocabulary and at
    Llama 3's. Needs root for (2); skipped with a line otherwise.
Every reply is checked: (1) equal to target-only output, (2) equal between
the two transports. Models: models/small and models/small-draft (the demo's
pair, --pair small) when present, else a tiny pair made in a temporary
directory. Needs python3-zmq (run with /usr/bin/python3).
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))

LLAMA3_VOCAB = 128256
HALF_HEADER_BYTES = 32  # struct shm_half_wire_header


def burst(e2e, p, reqs):
    """All of reqs at once, a client each; (replies in order, wall s)."""
    results = {}
    gate = threading.Barrier(len(reqs) + 1)

    def one(i, req):
        c = p.client()
        try:
            gate.wait(60)
            results[i] = e2e.generate(c, req, 600)[0]
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(reqs)]
    for t in threads:
        t.start()
    gate.wait(60)
    t0 = time.time()
    for t in threads:
        t.join()
    return [results.get(i, {}) for i in range(len(reqs))], time.time() - t0


def pipeline(e2e, name, draft, target, n_pairs, clients):
    p = e2e.Pipeline(name, max_concurrency=clients, max_queue=4 * clients)
    p.config["draft_worker"]["model"], p.config["target_worker"]["model"] = draft, target
    if n_pairs > 1:
        p.config["pairs"] = [{} for _ in range(n_pairs)]
    p.start("coordinator")
    for pair in range(n_pairs):
        p.start("target", pair)
        p.start("draft", pair)
    deadline = time.time() + 60
    while time.time() < deadline:
        pairs = p.stats()["workers"]["pairs"]
        if all(q["draft"]["up"] and q["target"]["up"] for q in pairs):
            return p
        time.sleep(0.1)
    raise e2e.Fail("pairs not up:\n%s" % "".join(p.log_tail(r) for r in p.procs))


def bench_pairs(e2e, args, draft, target):
    prompts = [[11 + i, 22, 33 + 2 * i, 44, 55 - i] for i in range(args.clients)]
    refs = [e2e.reference(target, ids, args.max_tokens)["ids"] for ids in prompts]
    reqs = [{"id": "r%d" % i, "prompt_ids": ids, "max_tokens": args.max_tokens, "temperature": 0}
            for i, ids in enumerate(prompts)]
    rates = {1: [], 2: []}
    pipes = {n: pipeline(e2e, "scale%d" % n, draft, target, n, args.clients) for n in (1, 2)}
    try:
        for _ in range(args.repeat):
            for n in (1, 2):
                replies, wall = burst(e2e, pipes[n], reqs)
                for i, r in enumerate(replies):
                    e2e.check(r.get("ids") == refs[i], "%d pair(s), request %d differs from target-only" % (n, i))
                rates[n].append(sum(len(r["ids"]) for r in replies) / wall)
        calls = [q["target_calls"] for q in pipes[2].stats()["workers"]["pairs"]]
    finally:
        for p in pipes.values():
            p.close()
    m1, m2 = statistics.median(rates[1]), statistics.median(rates[2])
    print("(1) %d concurrent greedy requests of %d tokens, medians of %d:" % (args.clients, args.max_tokens,
                                                                         args.repeat))
    print("    one pair   %7.1f tokens/s   (runs %s)" % (m1, " ".join("%.1f" % r for r in rates[1])))
    print("    two pairs  %7.1f tokens/s   (runs %s)  %.2fx; target calls per pair %s" %
          (m2, " ".join("%.1f" % r for r in rates[2]), m2 / m1, calls))


def one_request(e2e, p, req):
    """(done, ms per verified round)."""
    before = p.stats()["spec"]["rounds"]
    s = p.client()
    t0 = time.time()
    done, _ = e2e.generate(s, req, 600)
    ms = (time.time() - t0) * 1000.0
    s.close()
    rounds = p.stats()["spec"]["rounds"] - before
    e2e.check(done.get("type") == "done" and rounds > 0, "request %s: %s" % (req["id"], done))
    return done, ms / rounds


def bench_hosts(e2e, args, draft, target):
    import test_pipeline_hosts as hosts_test
    why = hosts_test.can_make_hosts()
    if why:
        print("(2) skipped: %s" % why)
        return
    reqs = {
        "greedy": {"prompt_ids": [11, 22, 33, 44, 55], "max_tokens": 128, "temperature": 0, "spec_k": 3},
        "sampled": {"prompt_ids": [3, 14, 15, 92, 65], "max_tokens": 128, "temperature": 0.9, "top_k": 40,
                    "seed": 777, "spec_k": 3},
    }
    per_round = {(w, kind): [] for w in ("shm", "tcp") for kind in reqs}
    ids = {}
    hosts = hosts_test.Hosts()
    pipes = {}
    try:
        shm = e2e.Pipeline("scaleshm")
        tcp = e2e.Pipeline("scaletcp")
        for p in (shm, tcp):
            p.config["draft_worker"]["model"], p.config["target_worker"]["model"] = draft, target
        tcp.config["coordinator"].update({"worker_endpoint": "tcp://*:%d" % hosts_test.PORT, "external_workers": 1})
        for role in ("draft", "target"):
            tcp.config["%s_worker" % role]["coordinator_endpoint"] = "tcp://%s.1:%d" % (hosts_test.NET[role],
                                                                                       hosts_test.PORT)
        for role in ("coordinator", "draft", "target"):
            tcp.wrap[role] = hosts.wrap(role)
        pipes = {"shm": shm, "tcp": tcp}
        for p in pipes.values():
            p.start_all()
        for i in range(args.repeat):
            for where in ("shm", "tcp"):
                for kind, req in reqs.items():
                    done, ms = one_request(e2e, pipes[where], dict(req, id="%s%d" % (kind, i)))
                    per_round[(where, kind)].append(ms)
                    e2e.check(ids.setdefault(kind, done["ids"]) == done["ids"],
                              "%s over %s differs from the other transport" % (kind, where))
        vocab = json.load(open(os.path.join(target, "config.json")))["vocab_size"]
    finally:
        for p in pipes.values():
            p.close()
        hosts.close()
    print("(2) one request, K = 3, 128 tokens, ms per verified round (medians of %d):" % args.repeat)
    for kind in reqs:
        a, b = statistics.median(per_round[("shm", kind)]), statistics.median(per_round[("tcp", kind)])
        print("    %-8s shared memory %6.2f   tcp, halves in messages %6.2f   +%.2f ms a round (%.2fx)" %
              (kind, a, b, b - a, b / a))
    k = 3
    for name, v in (("this model", vocab), ("Llama 3", LLAMA3_VOCAB)):
        greedy = HALF_HEADER_BYTES + 4 * k
        sampled = greedy + k * v * 4
        print("    bytes a half adds to draft_ready and again to the verify at K = 3, %s (vocab %d): greedy %d, "
              "sampled %d (%.2f MB)" % (name, v, greedy, sampled, sampled / 1e6))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--pair", default="small", choices=("tiny", "small"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e as e2e
    base = e2e.Pipeline("scalemodels")
    base.use_pair(args.pair)
    draft, target = base.config["draft_worker"]["model"], base.config["target_worker"]["model"]
    print("models: %s over %s" % (os.path.basename(target), os.path.basename(draft)))
    try:
        bench_pairs(e2e, args, draft, target)
        bench_hosts(e2e, args, draft, target)
    finally:
        base.close()


if __name__ == "__main__":
    main()
