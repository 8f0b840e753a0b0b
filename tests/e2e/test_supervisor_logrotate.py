#!/usr/bin/python3
"""Log rotation without copytruncate (issue 64, item g): an instance
started with `tandem-supervisor start` (with a gateway); every log of its
run dir is moved aside (as logrotate does), then `tandem-supervisor
logrotate` sends SIGHUP: every process and the supervisor keep running and
write their next lines into a new file of the old name, nothing more into
the moved one. A request after the rotation is logged in the new
coordinator.log and gateway.log; stop's lines land in the new
supervisor.log. SIGHUP to a process whose stderr is no file (a pipe) is
ignored, not fatal."""
import os
import signal
import subprocess
import time

from tandem_e2e import Pipeline, binary, check, default_run_dir, free_port, http, main, require_gateway
from test_supervisor_target_only import supervisor


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def test():
    require_gateway()
    p = Pipeline("logrotate")
    draft, target = p.make_pair()
    instance = p.instance
    run_dir = default_run_dir(instance)
    port = free_port()
    try:
        r = supervisor("start", "--wait", "120", "--instance", instance, "--target", target, "--draft", draft,
                       "--endpoint", p.endpoint, "--port", str(port), timeout=180)
        check(r.returncode == 0, "start failed:\n%s%s" % (r.stdout, r.stderr))
        names = ["supervisor", "coordinator", "draft", "target", "gateway"]
        for n in names:
            os.rename(os.path.join(run_dir, n + ".log"), os.path.join(run_dir, n + ".log.1"))
        r = supervisor("logrotate", "--instance", instance)
        check(r.returncode == 0 and "5 process(es)" in r.stdout, "logrotate: %s%s" % (r.stdout, r.stderr))
        time.sleep(0.5)
        st, _, _ = http("POST", "http://127.0.0.1:%d/v1/completions" % port,
                        {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0})
        check(st == 200, "a completion after the rotation: %d" % st)
        time.sleep(0.5)
        r = supervisor("status", "--instance", instance)
        check(r.returncode == 0, "status after the rotation (a process died?):\n%s" % r.stdout)
        new_gw = read(os.path.join(run_dir, "gateway.log"))
        check('"POST /v1/completions" 200' in new_gw, "no access line in the new gateway.log:\n%s" % new_gw[-2000:])
        check('"POST /v1/completions"' not in read(os.path.join(run_dir, "gateway.log.1")),
              "the access line went to the moved gateway.log.1")
        new_co = read(os.path.join(run_dir, "coordinator.log"))
        check("request " in new_co, "no request line in the new coordinator.log:\n%s" % new_co[-2000:])
        r = supervisor("stop", "--instance", instance)
        check(r.returncode == 0, "stop: %s%s" % (r.stdout, r.stderr))
        new_sup = read(os.path.join(run_dir, "supervisor.log")) if os.path.exists(
            os.path.join(run_dir, "supervisor.log")) else ""
        check("stopping" in new_sup, "the supervisor's stop is not in its new log:\n%s" % new_sup[-2000:])
        print("after the rotation: access and request lines in the new gateway.log and coordinator.log, "
              "the supervisor's stop in its new log; 5 processes reopened")

        # a process whose stderr is a pipe: SIGHUP is ignored
        cfg = p.write_config()
        proc = subprocess.Popen([binary("coordinator"), "--config", cfg], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        time.sleep(1.0)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        check(proc.poll() is None, "a coordinator logging to a pipe died of SIGHUP: %s" % proc.poll())
        proc.terminate()
        proc.communicate(timeout=30)
        print("SIGHUP with stderr on a pipe: ignored")
    finally:
        supervisor("stop", "--instance", instance)


if __name__ == "__main__":
    main(test)
