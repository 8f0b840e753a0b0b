#!/usr/bin/python3
"""tandem-client notices (issue 64): against an endpoint where nothing
listens (a closed TCP port, an ipc path with no socket) it exits 3 within
3 s naming the endpoint, for a request and for --stats, and Ctrl-C there
exits at once; SIGINT during a long request sends a cancel and exits 130
within a second or so, the coordinator's request cancelled. --draft-source
names the request's draft source (--draft, its old spelling, still works)."""
import signal
import subprocess
import time

from tandem_e2e import Fail, Pipeline, binary, check, free_port, main, no_eos, time_scale

EXIT_WITHIN_S = 3.0 * time_scale()


def unreachable(endpoint, extra):
    t0 = time.time()
    try:
        r = subprocess.run([binary("client"), "--endpoint", endpoint] + extra, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=EXIT_WITHIN_S + 5)
    except subprocess.TimeoutExpired:
        raise Fail("tandem-client %s against %s, where nothing listens: still waiting after %.1f s" %
                   (" ".join(extra), endpoint, time.time() - t0))
    took = time.time() - t0
    check(r.returncode == 3, "tandem-client %s against %s: exit %d (not 3): %s" %
          (" ".join(extra), endpoint, r.returncode, r.stderr))
    check("no coordinator at %s" % endpoint in r.stderr, "tandem-client against %s says: %s" % (endpoint, r.stderr))
    check(took < EXIT_WITHIN_S, "tandem-client against %s took %.1f s (bound %.1f s)" % (endpoint, took,
                                                                                        EXIT_WITHIN_S))
    print("%s %s: exit 3 after %.2f s: %s" % (endpoint, " ".join(extra), took, r.stderr.strip()))


def interrupted(cmd, what, bound_s, wait_running=None):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if wait_running:
            wait_running(proc)
        else:
            time.sleep(0.5)
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            raise Fail("%s: tandem-client still running 30 s after SIGINT" % what)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    check(proc.returncode == 130, "%s: exit %d after SIGINT (not 130): %s" % (what, proc.returncode, err))
    check(took < bound_s, "%s: exited %.2f s after SIGINT (bound %.1f s)" % (what, took, bound_s))
    print("%s: exit 130 %.2f s after SIGINT: %s" % (what, took, err.strip()))


def test():
    port = free_port()
    p = Pipeline("unreach")
    unreachable("tcp://127.0.0.1:%d" % port, ["--ids", "1,2,3"])
    unreachable("tcp://127.0.0.1:%d" % port, ["--stats"])
    unreachable("ipc://%s/nobody.sock" % p.dir, ["--prompt", "hello"])
    interrupted([binary("client"), "--endpoint", "tcp://127.0.0.1:%d" % port, "--ids", "1,2,3"],
                "no coordinator", 1.0 * time_scale())

    draft, target = p.make_pair()
    no_eos(draft, target)
    p.start_all()

    def running(proc):
        deadline = time.time() + 30
        while p.stats()["requests"]["active"] < 1:
            check(proc.poll() is None and time.time() < deadline, "the long request never ran")
            time.sleep(0.05)
    interrupted([binary("client"), "--endpoint", p.endpoint, "--ids", "5,6,7", "--max-tokens", "8000",
                 "--temperature", "0"], "during a request", 2.0 * time_scale(), running)
    deadline = time.time() + 10
    while p.stats()["requests"]["active"] > 0:
        check(time.time() < deadline, "the interrupted request still runs 10 s later: %s" % p.stats()["requests"])
        time.sleep(0.05)
    # one vocabulary: --draft-source (a draft source, not a model directory), --draft still accepted
    for flag in ("--draft-source", "--draft"):
        r = subprocess.run([binary("client"), "--endpoint", p.endpoint, "--ids", "5,6,7", "--max-tokens", "4",
                            "--temperature", "0", flag, "ngram"], capture_output=True, text=True, timeout=60)
        check(r.returncode == 0, "tandem-client %s ngram: exit %d: %s" % (flag, r.returncode, r.stderr))
    r = subprocess.run([binary("client"), "--endpoint", p.endpoint, "--ids", "5,6,7", "--draft-source", "bogus"],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "bogus" in r.stderr, "tandem-client --draft-source bogus: %d %s" %
          (r.returncode, r.stderr))
    p.close()


if __name__ == "__main__":
    main(test)
