#!/usr/bin/python3
"""Two replicas behind nginx, one killed mid-run.

Two complete instances (coordinator, draft and target workers, gateway; the
tiny pair) behind an nginx started here with deploy/nginx/tandem.conf: the
file as it is, its upstream servers replaced by the two gateways (their
max_fails/fail_timeout kept) and its listen by a loopback port, inside a
minimal main config with a temporary prefix. Client threads keep greedy
completion requests (streamed and not, several prompts) in flight through
nginx; once replica A has requests in flight, its four processes are killed
with SIGKILL, and the threads go on.

What must hold:
- every request that succeeded (200, a complete body; a stream ending with
  `data: [DONE]`, no error event, a finish_reason) has exactly the output
  the same prompt gets from replica B alone: nothing was cut short or mixed
  up without the client noticing;
- every request that failed (an HTTP error status, an error event in the
  stream, a stream cut without its last chunk or without `data: [DONE]`)
  was in flight on replica A when it was killed; at least one was (else the
  kill proved nothing);
- every request started after the kill succeeds: nginx sends it to B. Once
  A's fail_timeout has passed nginx tries A again; the run goes on until
  that happened, and such a request, refused by A's closed port, must have
  been passed on to B and succeeded, not failed (nothing of it reached A).
The load generator (tools/loadgen) speaks the coordinator's ZeroMQ protocol,
not HTTP, so the load here is direct concurrent HTTP requests.
Skipped (exit 77, one line) where nginx is not installed; scripts/install-deps.sh
installs nginx-light.
"""
import atexit
import http.client as http_client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

from tandem_e2e import (Fail, Pipeline, check, free_port, http, main, require_gateway, skip, sse_events,
                        time_scale)

SOURCE = os.environ.get("TANDEM_SOURCE_DIR") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TEMPLATE = os.path.join(SOURCE, "deploy", "nginx", "tandem.conf")
MODEL = "tiny"
PROMPTS = [[64, 65, 66, 67], [7], [8], [20, 21, 22], [30, 31], [40, 41, 42], [50], [60, 61]]
MAX_TOKENS = 300
CLIENTS = 8
AFTER_KILL_PER_CLIENT = 3


def find_nginx():
    found = shutil.which("nginx")
    if found is None and os.access("/usr/sbin/nginx", os.X_OK):
        found = "/usr/sbin/nginx"   # not on a non-root user's PATH on Debian
    return found


def site_config(template, gateways, port):
    """deploy/nginx/tandem.conf with its upstream servers replaced by
    gateways (host:port list), keeping the first line's parameters, and its
    listen by 127.0.0.1:port; and its fail_timeout in seconds. Fails where
    the file lost what is replaced or what the behaviour checked here rests
    on."""
    block = re.search(r"^upstream\s+tandem_gateways\s*\{\n(.*?)^\}", template, re.S | re.M)
    check(block is not None, "%s: no `upstream tandem_gateways { ... }` block" % TEMPLATE)
    server_line = re.compile(r"^\s*server\s+\S+((?:\s+[a-z_]+=\S+)*)\s*;\s*$")
    lines, params, replaced = [], None, False
    for line in block.group(1).split("\n"):
        m = server_line.match(line)
        if m is None:
            lines.append(line)
            continue
        if params is None:
            params = m.group(1)
        if not replaced:
            lines.extend("    server %s%s;" % (g, params) for g in gateways)
            replaced = True
    fail_timeout = re.search(r"fail_timeout=(\d+)s?\b", params or "")
    check(params is not None and "max_fails=" in params and fail_timeout is not None,
          "%s: the upstream's server lines lost max_fails/fail_timeout (in seconds): %r" % (TEMPLATE, params))
    text = template[:block.start(1)] + "\n".join(lines) + template[block.end(1):]
    text, n = re.subn(r"^(\s*)listen\s+[^;]+;", r"\g<1>listen 127.0.0.1:%d;" % port, text, flags=re.M)
    check(n == 1, "%s: %d listen directives, expected 1" % (TEMPLATE, n))
    directives = re.sub(r"#[^\n]*", "", text)
    for directive in ("proxy_http_version 1.1;", "proxy_buffering off;", "proxy_next_upstream error timeout;"):
        check(directive in directives, "%s: no `%s`" % (TEMPLATE, directive))
    check("non_idempotent" not in directives, "%s: a POST that reached a gateway must not be retried" % TEMPLATE)
    return text, int(fail_timeout.group(1))


class Nginx:
    """nginx in the foreground under a temporary prefix, stopped at exit."""

    def __init__(self, binary, site):
        self.binary = binary
        self.prefix = tempfile.mkdtemp(prefix="tandem-nginx-")
        os.chmod(self.prefix, 0o755)   # run as root, its workers are nobody
        self.proc = None
        atexit.register(self.close)
        with open(os.path.join(self.prefix, "tandem.conf"), "w") as f:
            f.write(site)
        p = self.prefix
        # The main config around the site file: foreground, files under the
        # prefix, and one header more, naming the gateway(s) each request
        # was sent to (which replica a response came from; no proxy setting).
        main_conf = (
            "daemon off;\nworker_processes 1;\npid %(p)s/nginx.pid;\nerror_log %(p)s/error.log info;\n"
            "events { worker_connections 512; }\n"
            "http {\n    access_log %(p)s/access.log;\n"
            "    client_body_temp_path %(p)s/client_body;\n    proxy_temp_path %(p)s/proxy;\n"
            "    fastcgi_temp_path %(p)s/fastcgi;\n    uwsgi_temp_path %(p)s/uwsgi;\n    scgi_temp_path %(p)s/scgi;\n"
            "    add_header X-Tandem-Upstream $upstream_addr always;\n"
            "    include %(p)s/tandem.conf;\n}\n") % {"p": p}
        self.conf = os.path.join(p, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(main_conf)
        base = [binary, "-p", p + "/", "-c", self.conf, "-e", os.path.join(p, "error.log")]
        t = subprocess.run(base + ["-t"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        check(t.returncode == 0, "nginx -t refuses the config made from %s:\n%s" % (TEMPLATE, t.stdout))
        self.log = open(os.path.join(p, "stdout.log"), "w")
        self.proc = subprocess.Popen(base, stdout=self.log, stderr=subprocess.STDOUT)

    def error_log(self):
        try:
            with open(os.path.join(self.prefix, "error.log")) as f:
                return f.read()
        except OSError:
            return ""

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)   # fast shutdown: master and workers
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.prefix:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = None


def wait_port(port, proc, timeout_s=10):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        check(proc.poll() is None, "nginx exited with %s" % proc.returncode)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise Fail("nginx not listening on %d within %d s" % (port, timeout_s))


def body_of(prompt, stream):
    return {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": stream}


def one_request(port, prompt, stream):
    """One completion through nginx: what the client saw, with its times."""
    rec = {"prompt": tuple(prompt), "stream": stream, "t0": time.time(), "status": None, "upstream": None,
           "body": b"", "exception": None}
    conn = http_client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body_of(prompt, stream)),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        rec["status"], rec["upstream"] = r.status, r.getheader("X-Tandem-Upstream")
        rec["body"] = r.read()   # a chunked body cut short raises IncompleteRead
    except http_client.IncompleteRead as e:
        rec["exception"], rec["body"] = "IncompleteRead (%d bytes)" % len(e.partial), e.partial
    except (OSError, http_client.HTTPException) as e:
        rec["exception"] = "%s: %s" % (type(e).__name__, e)
    finally:
        rec["t1"] = time.time()
        conn.close()
    return rec


def outcome(rec):
    """("ok", text, finish_reason) when the client can take the response as
    a complete answer, else ("error", why)."""
    if rec["exception"] is not None:
        return ("error", "transport: " + rec["exception"])
    if rec["status"] != 200:
        return ("error", "HTTP %s" % rec["status"])
    if not rec["stream"]:
        try:
            choice = json.loads(rec["body"])["choices"][0]
            text, finish = choice["text"], choice["finish_reason"]
        except (ValueError, KeyError, IndexError, TypeError):
            return ("error", "200 with a body that is no completion: %r" % rec["body"][:200])
        return ("ok", text, finish) if finish else ("error", "200 without a finish_reason")
    events = sse_events(rec["body"])
    if not events or events[-1] != "[DONE]":
        return ("error", "stream cut: no data: [DONE] (%d events)" % len(events))
    text, finish = "", None
    for e in events[:-1]:
        try:
            chunk = json.loads(e)
        except ValueError:
            return ("error", "stream event that is not JSON: %r" % e[:200])
        if "error" in chunk:
            return ("error", "error event: %s" % chunk["error"].get("code"))
        for c in chunk.get("choices", []):
            text += c.get("text") or ""
            finish = c.get("finish_reason") or finish
    return ("ok", text, finish) if finish else ("error", "stream without a finish_reason")


def reference_of(base_url, prompt):
    st, _, raw = http("POST", base_url + "/v1/completions", body_of(prompt, False))
    check(st == 200, "%s: %d %s" % (base_url, st, raw[:300]))
    c = json.loads(raw)["choices"][0]
    return c["text"], c["finish_reason"]


def gateway_in_flight(p):
    try:
        st, _, raw = http("GET", p.base_url + "/metrics", None, timeout_s=5)
    except OSError:
        return 0
    m = re.search(rb"^tandem_gateway_requests_in_flight (\S+)$", raw, re.M)
    return float(m.group(1)) if st == 200 and m else 0


def start_replica(name, models=None):
    p = Pipeline(name, max_concurrency=4, max_queue=16, worker_timeout_ms=5000)
    if models is None:
        p.make_pair()
    else:
        p.config["draft_worker"]["model"], p.config["target_worker"]["model"] = models
    p.enable_gateway()
    p.start_all()
    p.start("gateway")
    p.wait_http("/health")
    deadline = time.time() + 20
    while http("GET", p.base_url + "/health", None, timeout_s=5)[0] != 200:
        check(time.time() < deadline, "%s: /health not 200" % name)
        time.sleep(0.05)
    return p


def test():
    require_gateway()
    nginx_bin = find_nginx()
    if nginx_bin is None:
        skip("nginx is not installed (scripts/install-deps.sh installs nginx-light)")
    with open(TEMPLATE) as f:
        template = f.read()

    a = start_replica("nginxA")
    b = start_replica("nginxB", (a.config["draft_worker"]["model"], a.config["target_worker"]["model"]))
    addr = {name: p.base_url[len("http://"):] for name, p in (("A", a), ("B", b))}

    # The expected outputs: each prompt's greedy answer from B, the replica
    # that survives; A, the same models, must agree before it dies.
    ref = {}
    for prompt in PROMPTS:
        ref[tuple(prompt)] = reference_of(b.base_url, prompt)
        check(reference_of(a.base_url, prompt) == ref[tuple(prompt)], "replicas disagree on prompt %s" % prompt)

    port = free_port()
    site, fail_timeout_s = site_config(template, [addr["A"], addr["B"]], port)
    ngx = Nginx(nginx_bin, site)
    wait_port(port, ngx.proc)

    records, lock = [], threading.Lock()
    killed, passed_on = threading.Event(), threading.Event()
    kill_times = {}
    give_up = time.time() + (180 + fail_timeout_s) * time_scale()

    def client(i):
        n, after = 0, 0
        # after the kill: a few requests each, and on until nginx tried A again
        while (after < AFTER_KILL_PER_CLIENT or not passed_on.is_set()) and time.time() < give_up:
            prompt = PROMPTS[(i + n) % len(PROMPTS)]
            rec = one_request(port, prompt, stream=(i + n) % 2 == 0)
            rec["client"] = i
            with lock:
                records.append(rec)
            n += 1
            if killed.is_set() and rec["t0"] > kill_times["end"]:
                after += 1
                if "," in (rec["upstream"] or ""):
                    passed_on.set()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()

    # Kill A once both replicas have served and A has requests in flight.
    deadline = time.time() + 120 * time_scale()
    while True:
        with lock:
            served = {u for u in (r["upstream"] for r in records if r["status"] == 200) if u}
        if len(records) >= CLIENTS and addr["A"] in served and addr["B"] in served and gateway_in_flight(a) >= 2:
            break
        check(time.time() < deadline, "no moment with both replicas serving and A busy (%d requests done, "
              "upstreams %s)" % (len(records), served))
        time.sleep(0.02)
    kill_times["start"] = time.time()
    roles = [r for r in ("gateway", "coordinator", "target", "draft") if r in a.procs]
    for role in roles:
        a.procs[role].send_signal(signal.SIGKILL)   # all at once: the machine is gone
    for role in roles:
        a.kill(role)
    kill_times["end"] = time.time()
    killed.set()

    for t in threads:
        t.join(max(0, give_up - time.time()) + 150)
    check(not any(t.is_alive() for t in threads), "client threads still running")
    check(ngx.proc.poll() is None, "nginx exited with %s" % ngx.proc.returncode)

    # Judge every request.
    t_kill0, t_kill1 = kill_times["start"], kill_times["end"]
    wrong, misplaced, after_failed = [], [], []
    failed_in_flight, failure_kinds = [], {}
    ok_before = ok_in_flight_a = ok_in_flight_b = ok_after = retried_after = 0
    for rec in records:
        o = outcome(rec)
        in_flight = rec["t0"] < t_kill1 and rec["t1"] > t_kill0
        up = rec["upstream"] or ""
        if o[0] == "ok":
            want = ref[rec["prompt"]]
            if (o[1], o[2]) != want:
                wrong.append("prompt %s stream %s via %s: %r (%s) != %r (%s)" %
                             (list(rec["prompt"]), rec["stream"], up, o[1][:80], o[2], want[0][:80], want[1]))
            if rec["t0"] > t_kill1:
                if not up.endswith(addr["B"]):
                    wrong.append("prompt %s after the kill served via %r, not B" % (list(rec["prompt"]), up))
                ok_after += 1
                retried_after += up == "%s, %s" % (addr["A"], addr["B"])
            elif in_flight and up == addr["A"]:
                ok_in_flight_a += 1
            elif in_flight:
                ok_in_flight_b += 1
            else:
                ok_before += 1
            continue
        kind = re.sub(r"\(.*", "", o[1]).strip()
        failure_kinds[kind] = failure_kinds.get(kind, 0) + 1
        what = "prompt %s stream %s via %r, %.2f..%.2f s (the kill at 0..%.2f): %s" % (
            list(rec["prompt"]), rec["stream"], up, rec["t0"] - t_kill0, rec["t1"] - t_kill0, t_kill1 - t_kill0,
            o[1])
        if rec["t0"] > t_kill1:
            after_failed.append(what)
        elif not in_flight or up != addr["A"]:
            misplaced.append(what)
        else:
            failed_in_flight.append(what)
    n_after = sum(1 for r in records if r["t0"] > t_kill1)
    print("%d requests through nginx; replica A killed %.3f s into the run, in %.0f ms" %
          (len(records), t_kill0 - min(r["t0"] for r in records), (t_kill1 - t_kill0) * 1000))
    print("  before the kill: %d succeeded" % ok_before)
    print("  in flight on A at the kill: %d failed (%s), %d completed" %
          (len(failed_in_flight), ", ".join("%s: %d" % kv for kv in sorted(failure_kinds.items())) or "-",
           ok_in_flight_a))
    print("  in flight on B at the kill: %d succeeded" % ok_in_flight_b)
    print("  started after the kill: %d of %d succeeded, all served by B (%d of them tried on A first once its "
          "fail_timeout of %d s had passed, refused and passed on)" %
          (ok_after, n_after, retried_after, fail_timeout_s))
    log = ngx.error_log()
    print("  nginx error log: %d 'prematurely closed', %d 'Connection refused', %d 'no live upstreams'" %
          (log.count("prematurely closed"), log.count("Connection refused"), log.count("no live upstreams")))
    for line in failed_in_flight[:4]:
        print("  e.g. %s" % line)
    check(not wrong, "%d successful responses with the wrong output (a silent truncation?):\n  %s" %
          (len(wrong), "\n  ".join(wrong[:10])))
    check(not misplaced, "%d requests failed that were not in flight on the killed replica:\n  %s" %
          (len(misplaced), "\n  ".join(misplaced[:10])))
    check(not after_failed, "%d of %d requests started after the kill failed:\n  %s" %
          (len(after_failed), n_after, "\n  ".join(after_failed[:10])))
    check(n_after >= CLIENTS * AFTER_KILL_PER_CLIENT, "only %d requests after the kill" % n_after)
    check(retried_after > 0, "no request after the kill was refused by A and passed on to B within %d s "
          "(fail_timeout %d s)" % (give_up - t_kill1, fail_timeout_s))
    check(failed_in_flight, "the kill hit no request in flight on A: nothing was proved")


if __name__ == "__main__":
    main(test)
