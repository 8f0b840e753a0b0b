#!/usr/bin/python3
"""`tandem-supervisor` with "pairs": one draft and one target a pair, those
of pair 1 named draft1 and target1 (pid files, logs, status); `start --wait`
returns once every pair's workers are registered, names a pair's worker
that cannot come up, and a supervised pair-1 target that dies is restarted
and registers again, while pair 0 serves."""
import json
import os
import signal
import time

import zmq

from tandem_e2e import Pipeline, check, default_run_dir, generate, main, reference
from test_supervisor_target_only import supervisor


def state(run_dir):
    with open(os.path.join(run_dir, "coordinator.state")) as f:
        return json.load(f)


def test():
    p = Pipeline("suppairs")
    draft, target = p.make_pair()
    instance = p.instance
    run_dir = default_run_dir(instance)
    config = os.path.join(p.dir, "sup-config.json")
    workers = {"threads": 1, "heartbeat_ms": 200}
    with open(config, "w") as f:
        json.dump({"coordinator": {"heartbeat_ms": 200, "worker_timeout_ms": 1500},
                   "draft_worker": dict(workers), "target_worker": dict(workers),
                   "pairs": [{}, {"target_worker": {"prefix_cache": 0}}]}, f)
    args = ["--instance", instance, "--config", config, "--target", target, "--draft", draft,
            "--endpoint", p.endpoint]
    try:
        r = supervisor("start", "--wait", "60", *args, timeout=120)
        check(r.returncode == 0 and "ready" in r.stdout, "start --wait failed:\n%s%s" % (r.stdout, r.stderr))
        st = state(run_dir)
        check(st.get("pairs") == [{"draft": True, "target": True}] * 2, "coordinator.state: %s" % st)
        r = supervisor("status", "--instance", instance)
        for name in ("coordinator", "draft", "target", "draft1", "target1"):
            check(any(line.startswith(name + " ") and "running" in line for line in r.stdout.splitlines()),
                  "status has no running %s:\n%s" % (name, r.stdout))
            check(os.path.exists(os.path.join(run_dir, name + ".log")), "no %s.log" % name)

        # pair 1's target dies: the supervisor restarts it, it registers again
        with open(os.path.join(run_dir, "target1.pid")) as f:
            pid = int(f.read())
        os.kill(pid, signal.SIGKILL)
        s = p.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(p.endpoint)
        ids = [5, 6, 7, 8, 9]
        ref = reference(target, ids, 16)["ids"]
        done, _ = generate(s, {"id": "meanwhile", "prompt_ids": ids, "max_tokens": 16, "temperature": 0})
        check(done.get("ids") == ref, "a request while pair 1's target restarts: %s" % done)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                with open(os.path.join(run_dir, "target1.pid")) as f:
                    new_pid = int(f.read())
            except (OSError, ValueError):
                new_pid = pid
            if new_pid != pid and state(run_dir).get("pairs", [{}, {}])[1].get("target"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("pair 1's target was not restarted and registered: %s" % state(run_dir))
        s.close()
        r = supervisor("stop", "--instance", instance)
        check(r.returncode == 0, "stop: %s%s" % (r.stdout, r.stderr))

        # a pair-1 target that cannot come up is named
        broken = os.path.join(p.dir, "broken.json")
        with open(config) as f:
            cfg = json.load(f)
        cfg["pairs"][1]["target_worker"]["model"] = os.path.join(p.dir, "not-a-model")
        os.mkdir(os.path.join(p.dir, "not-a-model"))
        with open(broken, "w") as f:
            json.dump(cfg, f)
        bad_args = ["--instance", instance, "--config", broken, "--target", target, "--draft", draft,
                    "--endpoint", p.endpoint]
        r = supervisor("start", "--wait", "5", *bad_args, timeout=60)
        check(r.returncode != 0, "start --wait with a broken pair-1 target returned 0:\n%s" % r.stdout)
        check("target1" in r.stderr, "start --wait did not name target1:\n%s" % r.stderr)
        print("start --wait with a broken pair-1 target: %s" % r.stderr.strip().replace("\n", " | "))
    finally:
        supervisor("stop", "--instance", instance)
        p.close()


if __name__ == "__main__":
    main(test)
