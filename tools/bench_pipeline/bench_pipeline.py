#!/usr/bin/python3
"""bench_pipeline.py: single-request speed through the three-process pipeline
against in-process speculative decoding and target-only decoding, in one run.

    bench_pipeline.py [--build DIR] [--pair tiny|small] [--target DIR --draft DIR]
                      [--max-tokens N] [--threads N] [--noise S] [--repeat N] [--spec-k K]
                      [--lanes on|off|both]

Prints, for one greedy request (same prompt ids everywhere), every configuration
run once per repeat in turn (medians):
  - tokens/s: pipeline (tandem-coordinator + workers, via the client protocol),
    in-process speculative (tandem-generate --draft), target-only (tandem-generate);
  - the pre-draft hit rate (pre-drafted rounds used / offered);
  - the per-round control-plane overhead: the time the target had no
    verification queued between two rounds (coordinator-measured "target_gap",
    which includes waiting for a draft when no pre-draft could be used), and the
    target's own idle_ms if the target worker reports it.
--lanes both runs two pipelines side by side, worker lanes on and off
(coordinator.worker_lane, docs/protocol-notes.md "Lanes"), their requests
alternating, and prints each one's rows: what the lanes save per round.
Models: --target/--draft directories, or a pair made with tandem-make-model in a
temporary directory (derived target, --noise controls acceptance).
Needs python3-zmq (run with /usr/bin/python3); uses tests/e2e/tandem_e2e.py.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "e2e"))


def main():
    ap = argparse.ArgumentParser(description="Tandem pipeline benchmark")
    ap.add_argument("--build", default=os.environ.get("TANDEM_BUILD_DIR", os.path.join(SRC, "build")))
    ap.add_argument("--pair", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1, help="threads per model (each worker, and tandem-generate)")
    ap.add_argument("--noise", default="0.05")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (the median is printed)")
    ap.add_argument("--spec-k", type=int, default=0, help="fixed K (0 = adaptive) for both speculative runs")
    ap.add_argument("--lanes", default="on", choices=["on", "off", "both"],
                    help="worker lanes of the pipeline; both: one pipeline each way, requests alternating")
    args = ap.parse_args()
    os.environ["TANDEM_BUILD_DIR"] = os.path.abspath(args.build)
    import tandem_e2e as e2e

    lanes = {"on": [1], "off": [0], "both": [1, 0]}[args.lanes]
    pipes = [e2e.Pipeline("bench%d" % lane, max_concurrency=1, max_queue=1, worker_timeout_ms=2000,
                          extra={"coordinator": {"spec_k": args.spec_k, "worker_lane": lane},
                                 "draft_worker": {"threads": args.threads},
                                 "target_worker": {"threads": args.threads}}) for lane in lanes]
    p = pipes[0]
    try:
        if args.target and args.draft:
            p.config["draft_worker"]["model"] = args.draft
            p.config["target_worker"]["model"] = args.target
            target, draft = args.target, args.draft
        else:
            names = ("tiny-draft", "tiny") if args.pair == "tiny" else ("small-draft", "small")
            draft, target = p.make_pair(names[0], names[1], noise=args.noise)
        for q in pipes[1:]:
            q.config["draft_worker"]["model"], q.config["target_worker"]["model"] = draft, target
        ids = [128000, 791, 6864, 315, 9822, 374, 12366, 13, 578] if args.pair == "small" else [1, 5, 9, 77, 300, 12]

        def gen(extra):
            out = e2e.run([e2e.binary("generate"), "--model", target, "--ids", ",".join(map(str, ids)),
                           "--max-tokens", str(args.max_tokens), "--temperature", "0", "--threads",
                           str(args.threads), "--json"] + extra, timeout=3600)
            return json.loads(out)

        spec_extra = ["--draft", draft] + (["--spec-k", str(args.spec_k)] if args.spec_k else [])
        socks = []
        for q in pipes:
            q.start_all()
            socks.append(q.client())
        # Every configuration once per repeat, in turn: this VM's speed moves
        # by tens of percent over a minute, and runs one after the other set
        # different minutes against each other.
        target_only, inproc = [], []
        piped = [[] for _ in pipes]
        for i in range(args.repeat):
            target_only.append(gen([]))
            inproc.append(gen(spec_extra))
            for k, q in enumerate(pipes):
                done, _ = e2e.generate(socks[k], {"id": "b%d" % i, "prompt_ids": ids,
                                                  "max_tokens": args.max_tokens, "temperature": 0}, timeout_s=3600)
                e2e.check(done["type"] == "done", "pipeline: %s" % done)
                e2e.check(done["ids"] == target_only[0]["ids"], "pipeline output differs from target-only")
                piped[k].append(done)
        stats = [q.stats() for q in pipes]
        for k, q in enumerate(pipes):
            want = bool(lanes[k])
            got = (stats[k]["workers"]["draft"]["lane"], stats[k]["workers"]["target"]["lane"])
            e2e.check(got == (want, want), "pipeline with worker_lane %d: lanes %s" % (lanes[k], got))
            socks[k].close()

        med = statistics.median
        tp = med(r["tokens_per_s"] for r in target_only)
        ti = med(r["tokens_per_s"] for r in inproc)
        print("Tandem pipeline benchmark: %s pair, %d prompt tokens, %d generated tokens, greedy, %d thread(s) "
              "per model, K %s, median of %d" % (args.pair if not args.target else "given", len(ids),
                                                 len(target_only[0]["ids"]), args.threads,
                                                 args.spec_k or "adaptive", args.repeat))
        print("  target-only (tandem-generate)            %10.1f tokens/s" % tp)
        print("  in-process speculative (--draft)          %10.1f tokens/s  (%.2fx; acceptance %.3f)" %
              (ti, ti / tp if tp else 0, med(r.get("acceptance_rate", 0) for r in inproc)))
        for k in range(len(pipes)):
            st, runs = stats[k], piped[k]
            tpipe = med(r["timing"]["tokens_per_s"] for r in runs)
            spec = st["spec"]
            tm = st["time_ms"]
            print("  three-process pipeline, lanes %-3s        %10.1f tokens/s  (%.2fx; acceptance %.3f)" %
                  ("on" if lanes[k] else "off", tpipe, tpipe / tp if tp else 0, spec["acceptance_rate"]))
            print("    pre-draft hit rate                      %10.3f  (%d used of %d offered)" %
                  (spec["predraft_hit_rate"], spec["predraft_used"], spec["predraft_offered"]))
            print("    target gap between rounds (coordinator) %10.3f ms/round mean, %.3f ms max, %d rounds" %
                  (tm["target_gap_per_round"], tm["target_gap_max"], tm["target_gap_samples"]))
            print("    draft wait (coordinator)                %10.3f ms/round mean, %d rounds" %
                  (tm["draft_wait_per_round"], tm["draft_wait_rounds"]))
            if tm["target_idle_samples"]:
                print("    target idle between verifications (worker) %7.3f ms/round mean, %.3f ms max" %
                      (tm["target_idle_per_round"], tm["target_idle_max"]))
            print("    per-request: verify %.1f ms, draft %.1f ms, decode %.1f ms (last run)" %
                  (runs[-1]["spec"]["verify_ms"], runs[-1]["spec"]["draft_ms"], runs[-1]["timing"]["decode_ms"]))
    except e2e.Fail as e:
        print("bench_pipeline: %s" % e, file=sys.stderr)
        for q in pipes:
            for role in q.logs:
                print(q.log_tail(role), file=sys.stderr)
        return 1
    finally:
        for q in pipes:
            q.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
