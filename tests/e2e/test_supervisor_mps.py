#!/usr/bin/python3
"""MPS in the supervisor (config key supervisor.mps), checked without a GPU:

- where nvidia-cuda-mps-control is absent, `start` with supervisor.mps = 1 is
  refused with a message naming the key and the program, and nothing runs;
- with a stand-in nvidia-cuda-mps-control first on PATH (it records what it is
  asked and keeps a process alive as the daemon would): the daemon is started
  before the workers with private pipe and log directories inside the run dir,
  both workers run with CUDA_MPS_PIPE_DIRECTORY pointing there, `status` shows
  it, and `stop` quits it after the workers are gone (its process ends, its
  pipe directory goes).
The real daemon with real GPU clients is run by tests/gpu/test_cuda_runtime.py.
"""
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time

from tandem_e2e import BUILD, Pipeline, check, main

SUPERVISOR = os.path.join(os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                          "deploy", "tandem-supervisor")

FAKE_MPS = r"""#!/bin/bash
# stand-in for nvidia-cuda-mps-control (test_supervisor_mps.py)
log="$CUDA_MPS_LOG_DIRECTORY/control.log"
if [ "${1:-}" = -d ]; then
    [ -d "$CUDA_MPS_PIPE_DIRECTORY" ] && [ -d "$CUDA_MPS_LOG_DIRECTORY" ] || exit 3
    sleep 600 </dev/null >/dev/null 2>&1 &
    echo $! >"$CUDA_MPS_PIPE_DIRECTORY/daemon.pid"
    : >"$CUDA_MPS_PIPE_DIRECTORY/control"
    echo "start $CUDA_MPS_PIPE_DIRECTORY" >>"$log"
    exit 0
fi
read -r cmd
echo "cmd $cmd" >>"$log"
if [ "$cmd" = quit ]; then
    kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/daemon.pid")"
    rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
fi
"""


def supervisor(args, path, timeout=60):
    env = dict(os.environ, TANDEM_BIN_DIR=BUILD, PATH=path)
    env.pop("TANDEM_RUN_DIR", None)
    env.pop("CUDA_MPS_PIPE_DIRECTORY", None)
    return subprocess.run([SUPERVISOR] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, timeout=timeout)


def environ_of(pid):
    with open("/proc/%d/environ" % pid, "rb") as f:
        return dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)


def test():
    p = Pipeline("mps")
    draft, target = p.make_pair()
    instance = p.instance
    run_dir = "/tmp/tandem-%s" % instance
    cfg = os.path.join(p.dir, "mps.json")
    with open(cfg, "w") as f:
        json.dump({"supervisor": {"mps": 1}, "coordinator": {"client_endpoint": "ipc://%s/client.sock" % p.dir}}, f)
    common = ["--config", cfg, "--instance", instance, "--target", target, "--draft", draft]
    fake_dir = tempfile.mkdtemp(prefix="tandem-fake-mps-")
    # PATH without any nvidia-cuda-mps-control: the directories of the tools the script needs
    bare = ":".join(d for d in ("/usr/local/bin", "/usr/bin", "/bin")
                    if not os.path.exists(os.path.join(d, "nvidia-cuda-mps-control")))
    try:
        # 1. absent: refused, clearly, before anything starts
        r = supervisor(["start"] + common, bare)
        check(r.returncode != 0, "start with mps and no nvidia-cuda-mps-control succeeded: %s" % r.stdout)
        check("supervisor.mps" in r.stderr and "nvidia-cuda-mps-control" in r.stderr,
              "unclear refusal: %r" % r.stderr)
        check(not os.path.exists(os.path.join(run_dir, "supervisor.pid")), "a supervisor was left running")

        # 2. a stand-in daemon: started before the workers, stopped after them
        fake = os.path.join(fake_dir, "nvidia-cuda-mps-control")
        with open(fake, "w") as f:
            f.write(FAKE_MPS)
        os.chmod(fake, stat.S_IRWXU)
        path = fake_dir + ":" + bare
        # --wait: the workers registered, so each pid is the binary, not the
        # shell forked to run it (whose environment is read before its exec)
        r = supervisor(["start", "--wait", "60"] + common, path, timeout=120)
        check(r.returncode == 0, "start with the stand-in failed:\n%s%s" % (r.stdout, r.stderr))
        pipe = os.path.join(run_dir, "mps-pipe")
        check(os.path.exists(os.path.join(pipe, "control")), "no MPS control pipe in %s" % run_dir)
        check(os.stat(pipe).st_mode & 0o777 == 0o700, "the MPS pipe directory is not private")
        with open(os.path.join(pipe, "daemon.pid")) as f:
            daemon = int(f.read())
        for role in ("draft", "target"):
            with open(os.path.join(run_dir, role + ".pid")) as f:
                pid = int(f.read())
            env = environ_of(pid)
            check(env.get(b"CUDA_MPS_PIPE_DIRECTORY") == pipe.encode(),
                  "%s runs without the instance's MPS pipe: %r" % (role, env.get(b"CUDA_MPS_PIPE_DIRECTORY")))
            check(env.get(b"CUDA_MPS_LOG_DIRECTORY") == os.path.join(run_dir, "mps-log").encode(),
                  "%s: CUDA_MPS_LOG_DIRECTORY not the instance's" % role)
        r = supervisor(["status", "--instance", instance], path)
        check("mps" in r.stdout, "status does not show the MPS daemon: %s" % r.stdout)
        r = supervisor(["stop", "--instance", instance], path)
        check(r.returncode == 0, "stop failed: %s%s" % (r.stdout, r.stderr))
        deadline = time.time() + 10
        while time.time() < deadline and os.path.exists("/proc/%d" % daemon):
            time.sleep(0.1)
        check(not os.path.exists("/proc/%d" % daemon), "the MPS daemon outlived the stop")
        check(not os.path.exists(pipe), "the MPS pipe directory was left")
        with open(os.path.join(run_dir, "supervisor.log")) as f:
            log = f.read()
        order = [log.find(s) for s in ("mps: control daemon running", "draft: started", "target: started",
                                         "stopping", "mps: control daemon stopped")]
        check(-1 not in order and order == sorted(order),
              "supervisor.log does not show daemon start < workers < stop < daemon stop:\n%s" % log[-2000:])
        with open(os.path.join(run_dir, "mps-log", "control.log")) as f:
            check(f.read().split("\n")[:2] == ["start " + pipe, "cmd quit"], "the daemon was not asked to quit once")
    finally:
        supervisor(["stop", "--instance", instance], fake_dir + ":" + bare)
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(fake_dir, ignore_errors=True)
        p.close()


if __name__ == "__main__":
    main(test)
