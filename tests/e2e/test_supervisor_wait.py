#!/usr/bin/python3
"""`tandem-supervisor start --wait`: returns 0 only once the instance serves
(every process running, both workers registered, the gateway's /health
200), so the very next request is answered, with no polling; with a worker
that cannot come up (a draft model directory that is not a model) it exits
1 naming the worker as soon as it gives up (exit 78), not after the given
seconds, whatever the timing. `restart --wait` waits the same way. A draft
that runs but registers late (a stand-in that sleeps before it becomes the
real draft) keeps `--wait` from saying ready until the coordinator holds it
registered. The coordinator's state file is removed when it stops."""
import json
import os
import subprocess
import time

import zmq

from tandem_e2e import (Fail, Pipeline, binary, check, default_run_dir, generate, http, main, reference, supervisor_env,
                        time_scale)
from test_supervisor_target_only import SUPERVISOR, supervisor

def late_draft_bin_dir(p, go):
    """A TANDEM_BIN_DIR whose draft worker waits (up to 60 s) for the file
    go before it execs the real one (same pid: the supervisor sees it
    running all along)."""
    d = os.path.join(p.dir, "bin-late-draft")
    os.mkdir(d)
    for role, name in (("coordinator", "tandem-coordinator"), ("target", "tandem-target-worker"),
                       ("gateway", "tandem-gateway")):
        os.symlink(binary(role), os.path.join(d, name))
    path = os.path.join(d, "tandem-draft-worker")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nfor i in $(seq 600); do [ -e %s ] && break; sleep 0.1; done\nexec %s \"$@\"\n" %
                (go, binary("draft")))
    os.chmod(path, 0o755)
    return d


def read_state(run_dir):
    try:
        with open(os.path.join(run_dir, "coordinator.state")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def late_draft(p, args, run_dir):
    """The target registers, the draft runs but has not: --wait must go on
    waiting; once the draft registers it says ready."""
    go = os.path.join(p.dir, "draft-go")
    env = supervisor_env(TANDEM_BIN_DIR=late_draft_bin_dir(p, go))
    env.pop("TANDEM_RUN_DIR", None)
    t0 = time.time()
    proc = subprocess.Popen([SUPERVISOR, "start", "--wait", "60"] + args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 60
        while not read_state(run_dir).get("target"):
            if proc.poll() is not None:
                raise Fail("start --wait returned before the target registered:\n%s%s" % proc.communicate())
            check(time.time() < deadline, "the target did not register within 60 s")
            time.sleep(0.05)
        time.sleep(1.0)  # ample for a --wait that polls every 0.2 s to answer
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise Fail("start --wait returned (%d) %.2f s after the start, while the coordinator held the target "
                       "registered and not the draft, which runs but waits: coordinator.state %s\n%s%s" %
                       (proc.returncode, time.time() - t0, read_state(run_dir), out, err))
        st = supervisor("status", "--instance", os.path.basename(run_dir)[len("tandem-"):])
        check("state       loading or not ready: draft: not registered" in st.stdout,
              "status while the draft has not registered:\n%s" % st.stdout)
        with open(go, "w"):
            pass
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    state = read_state(run_dir)  # at once: what the coordinator held when --wait said ready
    check(proc.returncode == 0 and "ready" in out, "start --wait with a late draft failed:\n%s%s" % (out, err))
    check(state.get("draft") is True and state.get("target") is True,
          "start --wait said ready before the late draft registered: coordinator.state %s" % state)
    print("start --wait with a late draft: not ready while only the target was registered, ready after %.2f s" %
          (time.time() - t0))


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
        st = supervisor("status", "--instance", instance)
        for want in ("state       ready", "model       %s (target %s, draft %s)" % (os.path.basename(target), target, draft),
                     "endpoints   %s (ZeroMQ), http://%s (OpenAI API)" % (p.endpoint, p.config["gateway"]["listen"])):
            check(want in st.stdout, "status does not say %r:\n%s" % (want, st.stdout))
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

        late_draft(p, args, run_dir)
        r = supervisor("stop", "--instance", instance)
        check(r.returncode == 0, "stop: %s%s" % (r.stdout, r.stderr))

        # A draft that can never come up (it exits 78 at once, before or
        # after start's first look at the pid files): not ready, named, at
        # once, not after --wait's bound. The supervisor's preflight takes a
        # model directory without config.json, so this one has a config.json
        # the draft cannot load.
        bad = os.path.join(p.dir, "not-a-model")
        os.mkdir(bad)
        with open(os.path.join(bad, "config.json"), "w") as f:
            f.write("{}")
        bad_args = ["--instance", instance, "--config", config, "--target", target, "--draft", bad,
                    "--endpoint", p.endpoint]
        for attempt in range(3):
            t0 = time.time()
            r = supervisor("start", "--wait", "300", *bad_args, timeout=120)
            waited = time.time() - t0
            check(r.returncode != 0, "start --wait with a broken draft returned 0:\n%s" % r.stdout)
            check("not ready: draft" in r.stderr, "start --wait did not name the draft:\n%s" % r.stderr)
            check(waited < 5 * time_scale(), "start --wait 300 with a broken draft took %.1f s" % waited)
            supervisor("stop", "--instance", instance)
        print("start --wait with a broken draft, after %.2f s: %s" % (waited, r.stderr.strip().replace("\n", " | ")))
    finally:
        supervisor("stop", "--instance", instance)
        p.close()


if __name__ == "__main__":
    main(test)
