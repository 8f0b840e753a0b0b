#!/usr/bin/python3
"""`tandem-supervisor restart` keeps what the instance was started with
(issue 64): started with --target/--draft/--endpoint and a config file,
`restart --config FILE` and a bare `restart` serve again on the same
client endpoint and gateway port. A new configuration is checked before
anything stops (a draft directory that does not exist, a misspelled key:
refused, the instance untouched, same supervisor), and one that passes the
checks but that a process refuses (weights that do not load) is replaced
by the previous one: the instance serves again, the command exits non-zero
saying why."""
import json
import os
import shutil

import zmq

from tandem_e2e import Pipeline, check, default_run_dir, free_port, generate, http, main, require_gateway
from test_supervisor_target_only import supervisor


def serves(p, endpoint, base_url, what):
    s = p.zctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    try:
        done, _ = generate(s, {"id": "r", "prompt_ids": [5, 6, 7], "max_tokens": 4, "temperature": 0}, timeout_s=30)
    finally:
        s.close()
    check(done.get("type") == "done", "%s: no answer on %s: %s" % (what, endpoint, done))
    st, _, body = http("GET", base_url + "/health")
    check(st == 200, "%s: gateway /health at %s: %d %s" % (what, base_url, st, body[:200]))


def sup_pid(run_dir):
    with open(os.path.join(run_dir, "supervisor.pid")) as f:
        return int(f.read())


def test():
    require_gateway()
    p = Pipeline("suprestart")
    draft, target = p.make_pair()
    base_url = p.enable_gateway()
    instance = p.instance
    run_dir = default_run_dir(instance)
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    config = os.path.join(p.dir, "sup-config.json")
    with open(config, "w") as f:
        json.dump({"gateway": p.config["gateway"]}, f)
    try:
        r = supervisor("start", "--wait", "60", "--instance", instance, "--config", config, "--target", target,
                       "--draft", draft, "--endpoint", endpoint, timeout=120)
        check(r.returncode == 0, "start: %s%s" % (r.stdout, r.stderr))
        serves(p, endpoint, base_url, "after start")

        r = supervisor("restart", "--wait", "60", "--instance", instance, "--config", config, timeout=120)
        check(r.returncode == 0, "restart --config: %s%s" % (r.stdout, r.stderr))
        serves(p, endpoint, base_url, "after restart --config (the --target/--draft/--endpoint of start kept)")
        r = supervisor("restart", "--wait", "60", "--instance", instance, timeout=120)
        check(r.returncode == 0, "bare restart: %s%s" % (r.stdout, r.stderr))
        serves(p, endpoint, base_url, "after a bare restart")
        print("restart --config and a bare restart: serving on %s and %s" % (endpoint, base_url))

        # refused before anything stops
        before = sup_pid(run_dir)
        r = supervisor("restart", "--wait", "60", "--instance", instance, "--draft", os.path.join(p.dir, "nope"),
                       timeout=120)
        check(r.returncode != 0 and "draft_worker.model" in r.stderr and "no such directory" in r.stderr,
              "restart with a missing draft: %d %s%s" % (r.returncode, r.stdout, r.stderr))
        check(sup_pid(run_dir) == before, "restart with a missing draft stopped the instance")
        serves(p, endpoint, base_url, "after a refused restart")
        print("restart with a missing draft directory: refused, still serving: %s" % r.stderr.strip())

        # a misspelled key (any section's: the coordinator reads them all)
        # is refused before anything stops, too
        typo = os.path.join(p.dir, "typo.json")
        with open(typo, "w") as f:
            json.dump({"gateway": p.config["gateway"], "target_worker": {"max_seq_lne": 512}}, f)
        r = supervisor("restart", "--wait", "60", "--instance", instance, "--config", typo, timeout=120)
        check(r.returncode != 0, "restart with a misspelled key returned 0: %s%s" % (r.stdout, r.stderr))
        check('did you mean "max_seq_len"' in r.stderr and "keeps running" in r.stderr,
              "restart with a misspelled key says: %s" % r.stderr)
        check(sup_pid(run_dir) == before, "restart with a misspelled key stopped the instance")
        serves(p, endpoint, base_url, "after a restart refused for a misspelled key")
        print("restart with a misspelled key: refused, still serving: %s" % r.stderr.strip()[-160:])

        # refused by a process (weights that do not load pass every check
        # before it): the previous configuration comes back
        broken = os.path.join(p.dir, "broken")
        shutil.copytree(target, broken)
        with open(os.path.join(broken, "model.safetensors"), "r+b") as f:
            f.truncate(100)
        r = supervisor("restart", "--wait", "60", "--instance", instance, "--target", broken, timeout=120)
        check(r.returncode != 0, "restart with weights that do not load returned 0: %s%s" % (r.stdout, r.stderr))
        check("starting the previous one again" in r.stderr,
              "restart with weights that do not load says: %s" % r.stderr)
        serves(p, endpoint, base_url, "after a restart rolled back")
        print("restart with weights that do not load: rolled back, serving again")
        # and the instance's start arguments are still the first ones
        r = supervisor("restart", "--wait", "60", "--instance", instance, timeout=120)
        check(r.returncode == 0, "bare restart after a rollback: %s%s" % (r.stdout, r.stderr))
        serves(p, endpoint, base_url, "after a bare restart after a rollback")
        r = supervisor("stop", "--instance", instance)
        check(r.returncode == 0, "stop: %s%s" % (r.stdout, r.stderr))
    finally:
        supervisor("stop", "--instance", instance)
        shutil.rmtree(run_dir, ignore_errors=True)
        p.close()


if __name__ == "__main__":
    main(test)
