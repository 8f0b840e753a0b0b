#!/usr/bin/python3
"""bench_prefix_cache.py: what the workers' prefix cache buys through the
three-process pipeline, in one run.

    bench_prefix_cache.py [--build DIR] [--pair trained|tiny|small] [--threads N] [--prefix N] [--suffix N]
                          [--repeat N] [--clients N] [--system N] [--max-tokens N]

(1) Time to first token of a request whose --prefix tokens (1000) an
    earlier request computed, followed by --suffix (20) tokens of its own,
    against the same kind of request cold (a prefix never seen), both on the
    same pipeline, interleaved; medians of --repeat. Each warm reply is
    checked equal to a cold reply of the same prompt on a pipeline without
    the cache.
(2) --clients (16) concurrent chat-like requests sharing a --system (500)
    token system prompt, each with 20 tokens of its own, --max-tokens (32)
    greedy: aggregate tokens/s (generated over the wall time from the first
    send to the last reply) and the mean time to first token, with the cache
    (the system prompt computed once by an earlier request) and without it.
    The replies of both must be equal.
Models: the trained pair of models/trained (--pair trained, the default; the
prompts are random ids all the same: what is timed is the prefix's compute),
or models/small and models/small-draft (the demo's random pair, --pair small)
when present, else a tiny pair made in a temporary directory.
Needs python3-zmq (run with /usr/bin/python3); uses tests/e2e/tandem_e2e.py.
"""
import argparse
import os
import random
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))


def timed(e2e, sock, req, timeout_s=600):
    """(done, time to first token s, total s) of one streamed request."""
    msg = {"v": 1, "type": "generate", "stream": True}
    msg.update(req)
    t0 = time.time()
    sock.send_json(msg)
    ev = e2e.next_event(sock, req["id"], timeout_s)
    ttft = time.time() - t0
    while ev["type"] == "token":
        ev = e2e.next_event(sock, req["id"], timeout_s)
    e2e.check(ev["type"] == "done", "request %s: %s" % (req["id"], ev))
    return ev, ttft, time.time() - t0


def burst(e2e, p, reqs):
    """Sends reqs from one client each at once; (replies by id, ttfts, wall s)."""
    results, ttfts = {}, []
    gate = threading.Barrier(len(reqs) + 1)

    def one(req):
        c = p.client()
        try:
            gate.wait(60)
            done, ttft, _ = timed(e2e, c, req)
            results[req["id"]] = done
            ttfts.append(ttft)
        except Exception as ex:  # checked by the caller
            results[req["id"]] = {"type": "exception", "message": str(ex)}
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(r,)) for r in reqs]
    for t in threads:
        t.start()
    gate.wait(60)
    t0 = time.time()
    for t in threads:
        t.join(900)
    return results, ttfts, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description="Tandem prefix cache benchmark")
    ap.add_argument("--build", default=os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--pair", default="trained", choices=["trained", "tiny", "small"])
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--prefix", type=int, default=1000)
    ap.add_argument("--suffix", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--system", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e as e2e

    def pipeline(name, cache, concurrency):
        p = e2e.Pipeline(name, max_concurrency=concurrency, max_queue=64,
                         extra={"coordinator": {"request_timeout_ms": 3600000, "suffix_cache_mib": 0}})
        p.use_pair(args.pair)
        for role in ("draft_worker", "target_worker"):
            p.config[role]["threads"] = args.threads
            p.config[role]["prefix_cache"] = 1 if cache else 0
        p.start_all()
        return p

    rng = random.Random(11)
    vocab = 500 if args.pair == "tiny" else 2000  # ids every pair has

    def tokens(n):
        return [rng.randrange(1, vocab) for _ in range(n)]

    # (1) time to first token, cached prefix against cold
    p = pipeline("pcttft", True, 2)
    ref = pipeline("pcref", False, 2)
    s, r = p.client(), ref.client()
    cold_t, warm_t, cached = [], [], []
    for i in range(args.repeat):
        prefix = tokens(args.prefix)
        first = prefix + tokens(args.suffix)
        second = prefix + tokens(args.suffix)
        req = {"max_tokens": 8, "temperature": 0}
        done, t_cold, _ = timed(e2e, s, dict(req, id="cold%d" % i, prompt_ids=first))
        e2e.check(done["usage"]["cached_prompt_tokens"] == 0, "cold request found a cache: %s" % done["usage"])
        done, t_warm, _ = timed(e2e, s, dict(req, id="warm%d" % i, prompt_ids=second))
        want, _, _ = timed(e2e, r, dict(req, id="ref%d" % i, prompt_ids=second))
        e2e.check(done["ids"] == want["ids"], "warm %s != cold %s" % (done["ids"], want["ids"]))
        cold_t.append(t_cold)
        warm_t.append(t_warm)
        cached.append(done["usage"]["cached_prompt_tokens"])
    s.close()
    r.close()
    ref.close()
    p.close()
    c, w = statistics.median(cold_t), statistics.median(warm_t)
    print("== prefix cache, %s pair, %d thread(s) per worker ==" % (args.pair, args.threads))
    print("(1) time to first token, %d-token prefix + %d tokens, medians of %d" %
          (args.prefix, args.suffix, args.repeat))
    print("  cold    %8.1f ms" % (c * 1000))
    print("  cached  %8.1f ms   %.3fx cold   (%d prompt tokens cached)" % (w * 1000, w / c, statistics.median(cached)))

    # (2) concurrent requests sharing a system prompt
    system = tokens(args.system)
    reqs = [{"id": "chat%d" % i, "prompt_ids": system + tokens(20), "max_tokens": args.max_tokens, "temperature": 0}
            for i in range(args.clients)]
    rows = {}
    for cache in (False, True):
        p = pipeline("pcchat%d" % cache, cache, args.clients)
        if cache:
            s = p.client()
            timed(e2e, s, {"id": "seed", "prompt_ids": system + tokens(20), "max_tokens": 1, "temperature": 0})
            s.close()
        results, ttfts, wall = burst(e2e, p, reqs)
        gen = sum(len(d.get("ids", [])) for d in results.values())
        for rq in reqs:
            e2e.check(results[rq["id"]].get("type") == "done", "%s: %s" % (rq["id"], results[rq["id"]]))
        rows[cache] = (gen / wall, statistics.mean(ttfts), wall, results,
                       p.stats()["workers"]["target"]["prefix_cache"])
        p.close()
    for rq in reqs:
        e2e.check(rows[True][3][rq["id"]]["ids"] == rows[False][3][rq["id"]]["ids"],
                  "%s: cached and cold replies differ" % rq["id"])
    print("(2) %d concurrent requests sharing a %d-token system prompt, %d tokens each" %
          (args.clients, args.system, args.max_tokens))
    for cache in (False, True):
        tps, ttft, wall, _, pc = rows[cache]
        print("  %-8s %8.1f tokens/s  %.2fx   mean time to first token %8.1f ms   wall %.2f s   target hits %d/%d" %
              ("cached" if cache else "cold", tps, tps / rows[False][0], ttft * 1000, wall, pc["hits"], pc["queries"]))


if __name__ == "__main__":
    main()
