#!/usr/bin/python3
"""Load and faults, through tools/loadgen/tandem-loadgen.py against real processes.

1. 500 requests at 16 concurrent clients (a mix of prompt lengths, greedy and sampled,
   streamed and not, some cancelled after their first token, some malformed): zero
   unexpected errors, no hang, and every greedy output equal to its own target-only
   output run alone (nothing mixed up between requests, nothing depending on the load).
2. Faults under load: the draft is killed (kill -9) and restarted, then the target, while
   300 requests run at 16 concurrent. Every request ends within the loadgen's timeout
   with a correct result or a coded error (target_unavailable), never a hang, and no
   shared-memory segment is left behind.
"""
import json
import os
import subprocess
import sys
import time

from tandem_e2e import Pipeline, binary, check, main

HERE = os.path.dirname(os.path.abspath(__file__))
LOADGEN = os.path.normpath(os.path.join(HERE, "..", "..", "tools", "loadgen", "tandem-loadgen.py"))


def loadgen(p, target, requests, extra=()):
    pids = ",".join("%s=%d" % (r, pr.pid) for r, pr in p.procs.items())
    return [sys.executable, LOADGEN, "--endpoint", p.endpoint, "--requests", str(requests),
            "--concurrency", "16", "--max-tokens", "16", "--generate", binary("generate"),
            "--target", target, "--pids", pids, "--timeout-s", "60", "--json"] + list(extra)


def test():
    p = Pipeline("load", max_concurrency=8, max_queue=16, worker_timeout_ms=3000)
    draft, target = p.make_pair()
    p.start_all()

    r = subprocess.run(loadgen(p, target, 500), capture_output=True, text=True, timeout=900)
    print(r.stdout.strip())
    check(r.returncode == 0, "load run failed:\n%s" % r.stderr[-3000:])
    out = json.loads(r.stdout.strip().splitlines()[-1])
    check(out["unexpected_errors"] == {} and out["hangs"] == 0 and out["mismatches"] == 0,
          "load run: %s" % out)
    check(out["done"] > 300, "load run: only %d requests done" % out["done"])
    stats = p.stats()
    check(stats["requests"]["active"] == 0, "requests still active after the load: %s" % stats["requests"])

    # Faults under load.
    # The faults come early (the load may take under a second in a fast
    # build): the draft at once, the target a moment later, each restarted
    # at once, while most of the 1000 requests are still to come.
    lg = subprocess.Popen(loadgen(p, target, 1000, ("--expect-faults", "--seed", "2")),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_err = []
    for line in lg.stderr:
        if "load started" in line:
            break
        first_err.append(line)
    check(lg.poll() is None, "the load generator ended before its load: %s" % "".join(first_err))
    time.sleep(0.1)
    p.kill("draft")
    p.start("draft")
    time.sleep(0.3)
    p.kill("target")
    p.start("target")
    out_s, err_s = lg.communicate(timeout=900)
    err_s = "".join(first_err) + err_s
    print(out_s.strip())
    check(lg.returncode == 0, "fault run failed:\n%s" % err_s[-3000:])
    out = json.loads(out_s.strip().splitlines()[-1])
    check(out["hangs"] == 0 and out["mismatches"] == 0 and out["unexpected_errors"] == {},
          "fault run: %s" % out)
    p.wait_workers(draft=True, target=True)
    stats = p.stats()
    check(stats["workers"]["draft"]["losses"] >= 1 and stats["workers"]["target"]["losses"] >= 1,
          "the faults were not noticed: %s" % stats["workers"])
    live = {os.path.basename(s) for s in p.shm_segments()}
    owners = {str(pr.pid) for pr in p.procs.values()}
    stale = [s for s in live if not any("-%s-" % o in s for o in owners)]
    check(stale == [], "shared-memory segments of dead workers left behind: %s" % stale)


if __name__ == "__main__":
    main(test)
