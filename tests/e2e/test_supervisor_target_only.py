#!/usr/bin/python3
"""A deployment without a draft worker: `tandem-supervisor start` with a
target and no --draft (and no draft_worker section) starts the coordinator
and the target only, status lists no draft, requests are served with the
target's own greedy output, the coordinator drafts n-grams by itself, and
stop ends it cleanly."""
import json
import os
import shutil
import subprocess
import time

import zmq

from tandem_e2e import Pipeline, check, default_run_dir, generate, main, reference, supervisor_env
from test_pipeline_ngram import prompts

SUPERVISOR = os.path.join(os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                          "deploy", "tandem-supervisor")


def supervisor(*args, timeout=60):
    env = supervisor_env()
    env.pop("TANDEM_RUN_DIR", None)
    return subprocess.run([SUPERVISOR] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=timeout)


def test():
    p = Pipeline("targetonly")
    _, target = p.make_pair()
    instance = p.instance
    run_dir = default_run_dir(instance)
    endpoint = p.endpoint
    try:
        r = supervisor("start", "--instance", instance, "--target", target, "--endpoint", endpoint)
        check(r.returncode == 0, "start without a draft failed:\n%s%s" % (r.stdout, r.stderr))
        check("draft" not in r.stdout, "status lists a draft worker:\n%s" % r.stdout)
        with open(os.path.join(run_dir, "config.json")) as f:
            cfg = json.load(f)
        check("draft_worker" not in cfg, "effective config: %s" % cfg)
        s = p.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        deadline = time.time() + 30
        up = False
        while time.time() < deadline and not up:
            s.send_json({"v": 1, "type": "stats"})
            if s.poll(2000):
                up = s.recv_json()["workers"]["target"]["up"]
            if not up:
                time.sleep(0.2)
        check(up, "the target did not register")
        for i, ids in enumerate(prompts(3, 3)):
            done, _ = generate(s, {"id": "t%d" % i, "prompt_ids": ids, "max_tokens": 40, "temperature": 0})
            check(done.get("ids") == reference(target, ids, 40)["ids"], "target-only deployment: %s" % done)
        st = p.stats()  # a socket of its own: no stats reply of the wait above in its way
        check(not st["workers"]["draft"]["up"], "a draft is up: %s" % st["workers"])
        check(st["spec"]["ngram_drafts"] > 0, "no n-gram drafts: %s" % st["spec"])
        print("target-only deployment: %d n-gram rounds, %d of %d drafted tokens accepted" %
              (st["spec"]["ngram_drafts"], st["spec"]["ngram_accepted_tokens"], st["spec"]["ngram_draft_tokens"]))
        s.close()
        r = supervisor("stop", "--instance", instance)
        check(r.returncode == 0, "stop failed: %s%s" % (r.stdout, r.stderr))
    finally:
        supervisor("stop", "--instance", instance)
        shutil.rmtree(run_dir, ignore_errors=True)
        p.close()


if __name__ == "__main__":
    main(test)
