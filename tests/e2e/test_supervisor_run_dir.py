#!/usr/bin/python3
"""Local exposure (issue 15, defect 5): the run dir /tmp/tandem-<instance> has
a predictable name, so it is used only when it is ours.

- a symlink planted at the run dir's name: `tandem-supervisor start` refuses
  with a clear message and writes nothing through it; the coordinator run by
  hand (default worker endpoint) refuses too, with exit status 78;
- a planted directory of the wrong mode (or owner, when run as root) holding a
  supervisor.pid: `stop` refuses and signals nobody;
- a clean start creates the run dir with mode 0700 and the worker socket in it
  (no /tmp/tandem-<instance>-workers), and a clean stop removes the socket.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import zmq

from tandem_e2e import BUILD, Pipeline, binary, check, default_run_dir, main

SUPERVISOR = os.path.join(os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                          "deploy", "tandem-supervisor")


def supervisor(*args, timeout=60):
    env = dict(os.environ, TANDEM_BIN_DIR=BUILD)
    env.pop("TANDEM_RUN_DIR", None)
    return subprocess.run([SUPERVISOR] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=timeout)


def remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def test():
    p = Pipeline("rundir")
    draft, target = p.make_pair()
    instance = p.instance
    run_dir = default_run_dir(instance)
    endpoint = "ipc://%s/client.sock" % p.dir
    common = ["--instance", instance, "--target", target, "--draft", draft, "--endpoint", endpoint]
    decoy = tempfile.mkdtemp(prefix="tandem-decoy-")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        # 1. A planted symlink: refused, nothing written through it.
        os.symlink(decoy, run_dir)
        r = supervisor("start", *common)
        check(r.returncode != 0, "start through a planted symlink succeeded:\n%s%s" % (r.stdout, r.stderr))
        check("symbolic link" in r.stderr and run_dir in r.stderr, "unclear refusal: %r" % r.stderr)
        check(os.listdir(decoy) == [], "files written through the symlink: %s" % os.listdir(decoy))
        cfg = os.path.join(p.dir, "coord.json")
        with open(cfg, "w") as f:
            json.dump({"instance": instance, "coordinator": {"client_endpoint": endpoint},
                       "target_worker": {"model": target}, "draft_worker": {"model": draft}}, f)
        r = subprocess.run([binary("coordinator"), "--config", cfg], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=30)
        check(r.returncode == 78 and "symbolic link" in r.stdout,
              "coordinator with a planted run dir: status %d, %r" % (r.returncode, r.stdout[-500:]))
        check(os.listdir(decoy) == [], "the coordinator bound its socket through the symlink")
        os.unlink(run_dir)

        # 2. A planted directory that is not ours (mode, or owner as root), with a pid file.
        os.mkdir(run_dir, 0o755)
        os.chmod(run_dir, 0o755)
        with open(os.path.join(run_dir, "supervisor.pid"), "w") as f:
            f.write("%d\n" % sleeper.pid)
        for what in ("stop", "start"):
            r = supervisor(what, *common)
            check(r.returncode != 0 and "mode 755" in r.stderr, "%s in a 0755 run dir: %r" % (what, r.stderr))
        check(sleeper.poll() is None, "stop signalled the pid planted in a foreign run dir")
        if os.geteuid() == 0:
            os.chmod(run_dir, 0o700)
            os.chown(run_dir, 65534, 65534)
            r = supervisor("stop", *common)
            check(r.returncode != 0 and "owned by uid 65534" in r.stderr, "foreign owner: %r" % r.stderr)
            check(sleeper.poll() is None, "stop signalled the pid planted in a foreign run dir")
        remove(run_dir)

        # 3. Clean start: private run dir, socket inside; clean stop: socket gone.
        r = supervisor("start", *common)
        check(r.returncode == 0, "start failed:\n%s%s" % (r.stdout, r.stderr))
        st = os.lstat(run_dir)
        check(st.st_mode & 0o7777 == 0o700, "run dir mode %o" % (st.st_mode & 0o7777))
        sock = os.path.join(run_dir, "workers.sock")
        check(os.path.exists(sock), "no worker socket in the run dir: %s" % os.listdir(run_dir))
        check(not os.path.exists("/tmp/tandem-%s-workers" % instance), "the old socket path is still used")
        with open(os.path.join(run_dir, "config.json")) as f:
            check(json.load(f).get("run_dir") == run_dir, "run_dir not in the effective config")
        s = p.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        deadline = time.time() + 30
        up = False
        while time.time() < deadline and not up:
            s.send_json({"v": 1, "type": "stats"})
            if s.poll(2000):
                w = s.recv_json()["workers"]
                up = w["draft"]["up"] and w["target"]["up"]
            if not up:
                time.sleep(0.2)
        s.close()
        check(up, "workers did not register through the socket in the run dir")
        r = supervisor("stop", "--instance", instance)
        check(r.returncode == 0, "stop failed: %s%s" % (r.stdout, r.stderr))
        check(not os.path.exists(sock), "worker socket left after a clean stop")
        check(not os.path.exists(os.path.join(run_dir, "supervisor.pid")), "pid file left after stop")
    finally:
        supervisor("stop", "--instance", instance)
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
        remove(run_dir)
        shutil.rmtree(decoy, ignore_errors=True)
        p.close()


if __name__ == "__main__":
    main(test)
