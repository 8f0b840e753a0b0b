#!/usr/bin/python3
"""`tandem-supervisor start --wait`: returns 0 only once the instance serves
(every process running, both workers registered, the gateway's /health
200), so the very next request is answered, with no polling; with a worker
that cannot come up (a draft model directory that is not a model) it exits
1 after the given seconds, naming the worker. `restart --wait` waits the
same way. The coordinator's state file is removed when it stops."""
import json
import os
import time

import zmq

from tandem_e2e import Pipeline, check, default_run_dir, generate, http, main, reference
from test_supervisor_target_only import supervisor


def test():
    p = Pipeline("supwait")
    draft, target = p.make_pair()
    base_url = p.enable_gateway()
    instance = p.instance
    run_dir = default_run_dir(instance)
    config = os.path.join(p.dir, "sup-config.json")
    with open(config, "w") as f:
        json.dump({"gateway": p.config["gateway"]}, f)
    args = ["--instance", instance, "--config", config, "--target", target, "--draft", draft,
            "--endpoint", p.endpoint]
    try:
        t0 = time.time()
        r = supervisor("start", "--wait", "60", *args, timeout=120)
        waited = time.time() - t0
        check(r.returncode == 0 and "ready" in r.stdout, "start --wait failed:\n%s%s" % (r.stdout, r.stderr))
        # no polling: the first request is served
        s = p.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(p.endpoint)
        ids = [5, 6, 7, 8, 9]
        done, _ = generate(s, {"id": "first", "prompt_ids": ids, "max_tokens": 16, "temperature": 0})
        check(done.get("ids") == reference(target, ids, 16)["ids"], "first request after start --wait: %s" % done)
        s.close()
        st, _, body = http("GET", base_url + "/health")
        check(st == 200, "/health after start --wait: %d %s" % (st, body[:200]))
        with open(os.path.join(run_dir, "coordinator.state")) as f:
            state = json.load(f)
        check(state.get("draft") is True and state.get("target") is True, "coordinator.state: %s" % state)
        check(os.stat(os.path.join(run_dir, "coordinator.state")).st_mode & 0o077 == 0,
              "coordinator.state is readable by others")
        for name in ("coordinator.log", "target.log", "draft.log", "gateway.log", "coordinator.pid", "config.json"):
            mode = os.stat(os.path.join(run_dir, name)).st_mode & 0o777
            check(mode == 0o600, "%s has mode %o, not 600 (logs can hold prompts)" % (name, mode))
        print("start --wait returned ready after %.2f s" % waited)
        r = supervisor("restart", "--wait", "60", *args, timeout=120)
        check(r.returncode == 0 and "ready" in r.stdout, "restart --wait failed:\n%s%s" % (r.stdout, r.stderr))
        s = p.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(p.endpoint)
        done, _ = generate(s, {"id": "again", "prompt_ids": ids, "max_tokens": 16, "temperature": 0})
        check(done.get("type") == "done", "first request after restart --wait: %s" % done)
        s.close()
        r = supervisor("stop", "--instance", instance)
        check(r.returncode == 0, "stop: %s%s" % (r.stdout, r.stderr))
        check(not os.path.exists(os.path.join(run_dir, "coordinator.state")),
              "coordinator.state left behind after stop")

        # a draft that can never come up: not ready, named, within the bound
        bad = os.path.join(p.dir, "not-a-model")
        os.mkdir(bad)
        bad_args = ["--instance", instance, "--config", config, "--target", target, "--draft", bad,
                    "--endpoint", p.endpoint]
        t0 = time.time()
        r = supervisor("start", "--wait", "3", *bad_args, timeout=60)
        waited = time.time() - t0
        check(r.returncode != 0, "start --wait with a broken draft returned 0:\n%s" % r.stdout)
        check("not ready" in r.stderr and "draft" in r.stderr, "start --wait did not name the draft:\n%s" % r.stderr)
        check(waited < 20, "start --wait 3 took %.1f s" % waited)
        print("start --wait with a broken draft: %s" % r.stderr.strip().replace("\n", " | "))
    finally:
        supervisor("stop", "--instance", instance)
        p.close()


if __name__ == "__main__":
    main(test)
