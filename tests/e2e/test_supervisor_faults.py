#!/usr/bin/python3
"""Faults of the coordinator and of the gateway under load, with the real
supervisor (deploy/tandem-supervisor) restarting what dies (issue 15).

1. kill -9 of the coordinator while tools/loadgen runs 16 concurrent clients:
   every request ends within the loadgen's timeout with a correct result or a
   coded error (coordinator_lost: the client saw its connection drop;
   target_unavailable: sent before the workers were back), never a hang. The
   supervisor restarts the coordinator; the workers register with it by
   themselves (same pids: nobody restarted them), as soon as they reconnect:
   the first request is served within SERVED_WITHIN_S of the restart, under
   load and idle, where waiting for worker_timeout_ms would take seconds.
2. A C client (tandem-client, the C library), the Python example client and
   an HTTP client of the gateway, each with a request in flight when the
   coordinator is killed, are told at once (an exit status 3 naming the lost
   connection; a 503 coordinator_unavailable), not after their timeouts.
3. Service resumes: a load run with no fault has no error at all.
4. kill -9 of the gateway while HTTP clients stream: each stream ends with an
   error (reset or cut short) within seconds, never a hang; the coordinator
   stops generating for them; the supervisor restarts the gateway and new HTTP
   requests are served.
5. A clean stop leaves no shared-memory segment and no socket file behind.
"""
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from tandem_e2e import (Fail, Pipeline, binary, check, http, main, no_eos, require_gateway, supervisor_env,
                        time_scale)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(HERE, "..", ".."))
SUPERVISOR = os.path.join(SOURCE, "deploy", "tandem-supervisor")
LOADGEN = os.path.normpath(os.path.join(SOURCE, "tools", "loadgen", "tandem-loadgen.py"))
# How long a client may wait for the word that its request is lost. A killed
# process's sockets are closed by the kernel, so the drop is seen at once; the
# bound leaves room for a loaded 2-core machine.
LOST_WITHIN_S = 2.0 * time_scale()
# From the restarted coordinator's pid file to its first served request. The
# workers see their connection drop, reconnect within 250 ms of its bind
# (their reconnect backoff) and register at once: 0.2-0.4 s measured on 2
# cores. The test's worker_timeout_ms (6 s) is well past the bound, so
# workers that waited for its silence (the old way) fail here.
SERVED_WITHIN_S = 2.0 * time_scale()
WORKER_TIMEOUT_MS = int(6000 * time_scale())
# The coordinator is killed KILL_AFTER_S into a load sized, from the
# throughput this build measured just before (a Release build serves several
# times the requests a sanitizer build does), to last LOAD_S: the kill falls
# with requests in flight on any build, neither after the load is over nor
# so late that the run takes minutes.
KILL_AFTER_S = 0.3
LOAD_S = 3.0
BASELINE_REQUESTS = 64


class Supervised:
    """The supervisor of one Pipeline's config, with its run dir inside the
    test's temporary directory."""

    def __init__(self, p):
        self.p = p
        self.run_dir = os.path.join(p.dir, "run")
        self.env = supervisor_env(TANDEM_RUN_DIR=self.run_dir)
        # The default worker socket: inside the run dir, where the stop check looks.
        p.config["coordinator"].pop("worker_endpoint", None)
        self.config = p.write_config()
        self.started = False
        # Stop the supervised processes before the Pipeline removes the
        # directory they run in (atexit runs last-registered first).
        atexit.register(self.stop_quietly)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signo, frame):
        self.stop_quietly()
        self.p._on_signal(signo, frame)

    def stop_quietly(self):
        try:
            self.stop()
        except (Fail, OSError, subprocess.SubprocessError) as e:
            print("supervisor stop at cleanup: %s" % e)

    def cmd(self, what, timeout=60):
        return subprocess.run([SUPERVISOR, what, "--config", self.config], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=self.env, timeout=timeout)

    def start(self):
        r = self.cmd("start")
        check(r.returncode == 0, "supervisor start: %s%s\n%s" % (r.stdout, r.stderr, self.log("supervisor")))
        self.started = True

    def stop(self):
        if self.started:
            self.started = False
            r = self.cmd("stop")
            check(r.returncode == 0, "supervisor stop: %s%s" % (r.stdout, r.stderr))

    def pid(self, name):
        try:
            with open(os.path.join(self.run_dir, "%s.pid" % name)) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None

    def wait_restarted(self, name, old_pid, timeout_s=20):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            pid = self.pid(name)
            if pid is not None and pid != old_pid:
                return pid
            time.sleep(0.05)
        raise Fail("the supervisor did not restart %s within %d s\n%s" %
                             (name, timeout_s, self.log("supervisor")))

    def log(self, name, n=30):
        try:
            with open(os.path.join(self.run_dir, "%s.log" % name)) as f:
                return "---- %s.log ----\n%s" % (name, "".join(f.readlines()[-n:]))
        except OSError:
            return ""

    def logs(self):
        return "".join(self.log(n) for n in ("supervisor", "coordinator", "draft", "target", "gateway"))


def loadgen(p, sup, target, requests, extra=()):
    pids = ",".join("%s=%d" % (n, sup.pid(n)) for n in ("coordinator", "draft", "target") if sup.pid(n))
    return [sys.executable, LOADGEN, "--endpoint", p.endpoint, "--requests", str(requests), "--concurrency", "16",
            "--max-tokens", "16", "--generate", binary("generate"), "--target", target, "--pids", pids,
            "--timeout-s", "30", "--json"] + list(extra)


def wait_workers(p, sup, timeout_s=30):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            w = p.stats(timeout_s=2)["workers"]
            if w["draft"]["up"] and w["target"]["up"]:
                return w
        except Fail:
            pass  # no stats reply yet: the coordinator is starting
        time.sleep(0.1)
    raise Fail("workers not registered within %d s\n%s" % (timeout_s, sup.logs()))


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def first_served(p, sup, old_pid, t_kill, timeout_s=30):
    """Times a restart: from the kill to the new coordinator's pid file and
    to the first request it serves (a one-token greedy request, sent again
    until it gets done; target_unavailable means the workers are not back).
    Returns (restart_s, served_s), both from the kill."""
    sup.wait_restarted("coordinator", old_pid)
    t_restart = time.time()
    deadline = t_restart + timeout_s
    while time.time() < deadline:
        s = p.client()
        try:
            s.send_json({"v": 1, "type": "generate", "id": "probe", "prompt_ids": [3, 1, 4], "max_tokens": 1,
                         "temperature": 0})
            if s.poll(2000):
                m = s.recv_json()
                if m.get("type") == "done":
                    return t_restart - t_kill, time.time() - t_kill
                check(m.get("code") == "target_unavailable", "probe after the restart: %s" % m)
        finally:
            s.close()
        time.sleep(0.02)
    raise Fail("no request served within %d s of the coordinator's restart\n%s" % (timeout_s, sup.logs()))


def baseline_rate(p, sup, target):
    """Requests a second this build serves under the fault run's load shape."""
    r = subprocess.run(loadgen(p, sup, target, BASELINE_REQUESTS, ("--seed", "2")), capture_output=True, text=True,
                       timeout=600)
    check(r.returncode == 0, "baseline load failed:\n%s" % r.stderr[-3000:])
    out = last_json(r.stdout)
    check(out["unexpected_errors"] == {} and out["hangs"] == 0 and out["requests_per_s"] > 0,
          "baseline load: %s" % out)
    return out["requests_per_s"]


def coordinator_under_load(p, sup, target):
    rate = baseline_rate(p, sup, target)
    requests = max(100, int(rate * LOAD_S))
    print("baseline: %.1f requests/s; the fault run sends %d (%.1f s of load), the kill %.1f s in" %
          (rate, requests, LOAD_S, KILL_AFTER_S))
    workers = (sup.pid("draft"), sup.pid("target"))
    old = sup.pid("coordinator")
    lg = subprocess.Popen(loadgen(p, sup, target, requests, ("--expect-faults", "--seed", "3")),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_err = []
    for line in lg.stderr:
        if "load started" in line:
            break
        first_err.append(line)
    check(lg.poll() is None, "the load generator ended before its load: %s" % "".join(first_err))
    time.sleep(KILL_AFTER_S)
    t_kill = time.time()
    os.kill(old, signal.SIGKILL)
    timing = {}

    def probe():
        try:
            timing["t"] = first_served(p, sup, old, t_kill)
        except Fail as e:
            timing["fail"] = str(e)
    th = threading.Thread(target=probe)
    th.start()
    out_s, err_s = lg.communicate(timeout=600)
    th.join(60)
    print(out_s.strip())
    check(lg.returncode == 0, "coordinator fault run failed:\n%s%s" % ("".join(first_err), err_s[-3000:]))
    out = last_json(out_s)
    check(out["hangs"] == 0 and out["mismatches"] == 0 and out["unexpected_errors"] == {},
          "coordinator fault run: %s" % out)
    check(out["expected_errors"].get("coordinator_lost", 0) > 0,
          "no request saw the coordinator go: the kill came too late? (%d requests at a measured %.1f/s) %s" %
          (requests, rate, out))
    new = sup.wait_restarted("coordinator", old)
    w = wait_workers(p, sup)
    check((sup.pid("draft"), sup.pid("target")) == workers,
          "the workers were restarted instead of registering again: %s -> %s" %
          (workers, (sup.pid("draft"), sup.pid("target"))))
    check(w["draft"]["pid"] == workers[0] and w["target"]["pid"] == workers[1],
          "the restarted coordinator (pid %d) knows other workers: %s" % (new, w))
    check("t" in timing, "timing the restart under load: %s" % timing.get("fail", "no result"))
    restart_s, served_s = timing["t"]
    print("under load: coordinator restarted %.2f s after the kill, first request served %.2f s after the kill "
          "(%.2f s after the restart)" % (restart_s, served_s, served_s - restart_s))
    check(served_s - restart_s < SERVED_WITHIN_S, "under load, the first request was served %.2f s after the "
          "coordinator's restart (bound %.1f s)" % (served_s - restart_s, SERVED_WITHIN_S))


def clients_see_loss(p, sup):
    """Three long requests (no EOS: they run until max_tokens, for seconds),
    one from tandem-client (the C library), one from the Python example
    client, one over HTTP through the gateway, are killed with the
    coordinator once it shows them all running."""
    cl = subprocess.Popen([binary("client"), "--endpoint", p.endpoint, "--ids", "5,6,7", "--max-tokens", "8000",
                           "--temperature", "0", "--timeout-ms", "60000"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    py = subprocess.Popen([sys.executable, os.path.join(SOURCE, "client", "examples", "generate.py"), "--endpoint",
                           p.endpoint, "--ids", "5,6,7", "--max-tokens", "8000", "--timeout-ms", "60000"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    got = {}

    def over_http():
        got["reply"] = http("POST", p.base_url + "/v1/completions",
                            {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8000, "temperature": 0}, timeout_s=60)
        got["t"] = time.time()
    th = threading.Thread(target=over_http)
    th.start()
    deadline = time.time() + 10
    while p.stats()["requests"]["active"] < 3:
        check(time.time() < deadline and cl.poll() is None and py.poll() is None and th.is_alive(),
              "the three requests never ran together")
        time.sleep(0.02)
    old = sup.pid("coordinator")
    t0 = time.time()
    os.kill(old, signal.SIGKILL)
    # Each client's end is timed as it happens (the pipes are small: nothing blocks).
    ended = {}
    while len(ended) < 3 and time.time() - t0 < 30:
        for name, proc in (("tandem-client", cl), ("generate.py", py)):
            if name not in ended and proc.poll() is not None:
                ended[name] = time.time() - t0
        if "http" not in ended and not th.is_alive():
            ended["http"] = got["t"] - t0
        time.sleep(0.01)
    for name, proc in (("tandem-client", cl), ("generate.py", py)):
        if name not in ended:
            proc.kill()
    check(len(ended) == 3, "still waiting 30 s after the coordinator was killed: %s" %
          sorted({"tandem-client", "generate.py", "http"} - set(ended)))
    cl_err = cl.communicate()[1].decode(errors="replace")
    py_err = py.communicate()[1]
    st, _, raw = got["reply"]
    print("after the kill: tandem-client %.3f s (%s), generate.py %.3f s (%s), HTTP %.3f s (%d %s)" %
          (ended["tandem-client"], cl_err.strip(), ended["generate.py"], py_err.strip(), ended["http"], st, raw[:120]))
    check(cl.returncode == 3 and "lost the connection to the coordinator" in cl_err,
          "tandem-client after the kill: status %d, %r" % (cl.returncode, cl_err))
    check(py.returncode == 3 and "lost the connection" in py_err,
          "generate.py after the kill: status %d, %r" % (py.returncode, py_err))
    check(st == 503 and b"coordinator_unavailable" in raw,
          "HTTP request when the coordinator was killed: %d %s" % (st, raw[:300]))
    slow = {n: round(t, 2) for n, t in ended.items() if t >= LOST_WITHIN_S}
    check(slow == {}, "clients told of the loss later than %.1f s: %s" % (LOST_WITHIN_S, slow))
    restart_s, served_s = first_served(p, sup, old, t0)
    print("idle: coordinator restarted %.2f s after the kill, first request served %.2f s after the kill "
          "(%.2f s after the restart)" % (restart_s, served_s, served_s - restart_s))
    check(served_s - restart_s < SERVED_WITHIN_S, "idle, the first request was served %.2f s after the "
          "coordinator's restart (bound %.1f s)" % (served_s - restart_s, SERVED_WITHIN_S))
    wait_workers(p, sup)


def service_resumes(p, sup, target):
    r = subprocess.run(loadgen(p, sup, target, 150, ("--seed", "4")), capture_output=True, text=True, timeout=600)
    print(r.stdout.strip())
    check(r.returncode == 0, "load after the restarts failed:\n%s" % r.stderr[-3000:])
    out = last_json(r.stdout)
    check(out["unexpected_errors"] == {} and out["hangs"] == 0 and out["mismatches"] == 0 and out["done"] > 60,
          "load after the restarts: %s" % out)


def gateway_under_load(p, sup):
    port = int(p.base_url.rsplit(":", 1)[1])
    body = json.dumps({"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 4000, "temperature": 0,
                       "stream": True}).encode()
    streams = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            check(chunk, "a stream closed before its first event: %r" % got[:300])
            got += chunk
        check(got.startswith(b"HTTP/1.1 200"), "stream status: %r" % got[:200])
        streams.append(s)
    ended = {}

    def read_to_end(i, s):
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    ended[i] = ("closed", time.time())
                    return
                if b"data: [DONE]" in chunk:
                    ended[i] = ("done", time.time())
                    return
        except ConnectionResetError:
            ended[i] = ("reset", time.time())
        except socket.timeout:
            ended[i] = ("hang", time.time())

    readers = [threading.Thread(target=read_to_end, args=(i, s)) for i, s in enumerate(streams)]
    for t in readers:
        t.start()
    old = sup.pid("gateway")
    t0 = time.time()
    os.kill(old, signal.SIGKILL)
    for t in readers:
        t.join(40)
    for s in streams:
        s.close()
    check(len(ended) == len(streams), "HTTP streams still open after the gateway was killed: %d of %d ended" %
          (len(ended), len(streams)))
    for i, (how, t) in sorted(ended.items()):
        check(how in ("closed", "reset") and t - t0 < LOST_WITHIN_S,
              "stream %d after the gateway was killed: %s after %.2f s" % (i, how, t - t0))
    # The coordinator stops generating for the dead gateway.
    deadline = time.time() + 10
    while True:
        r = p.stats()["requests"]
        if r["active"] == 0 and r["queued"] == 0:
            break
        check(time.time() < deadline, "the dead gateway's requests still run 10 s later: %s" % r)
        time.sleep(0.05)
    sup.wait_restarted("gateway", old)
    deadline = time.time() + 20
    while True:
        try:
            st, _, raw = http("POST", p.base_url + "/v1/completions",
                              {"model": "tiny", "prompt": [3, 1, 4], "max_tokens": 8, "temperature": 0}, timeout_s=60)
            break
        except OSError:
            check(time.time() < deadline, "the restarted gateway does not answer\n%s" % sup.logs())
            time.sleep(0.1)
    check(st == 200 and len(json.loads(raw)["tandem"]["ids"]) == 8,
          "a request to the restarted gateway: %d %s" % (st, raw[:300]))


def test():
    require_gateway()
    p = Pipeline("supfault", max_concurrency=8, max_queue=16, worker_timeout_ms=WORKER_TIMEOUT_MS)
    draft, target = p.make_pair()
    no_eos(draft, target)
    p.enable_gateway()
    sup = Supervised(p)
    try:
        sup.start()
        wait_workers(p, sup)
        coordinator_under_load(p, sup, target)
        clients_see_loss(p, sup)
        service_resumes(p, sup, target)
        gateway_under_load(p, sup)
        sup.stop()
        left = [n for n in os.listdir(sup.run_dir) if n.endswith(".sock")] + \
               [n for n in os.listdir(p.dir) if n.endswith(".sock")]
        check(left == [], "socket files left behind after the stop: %s" % left)
        check(p.shm_segments() == [], "shared-memory segments left behind: %s" % p.shm_segments())
    except Fail as e:
        raise Fail("%s\n%s" % (e, sup.logs()))
    finally:
        sup.stop_quietly()


if __name__ == "__main__":
    main(test)
