#!/usr/bin/python3
"""Secure exposure of the client endpoint.

- A client endpoint other machines can reach is refused at start (exit 78, the key named)
  unless CURVE is configured or `insecure: 1` is set; `insecure` is warned about in the log.
- A worker endpoint other machines can reach is refused unless `external_workers: 1`.
- With CURVE and a list of admitted client keys: an admitted client is served (greedy ids
  equal target-only output); a client with another key and a client without CURVE get
  nothing (the handshake is refused, the coordinator logs it), and service goes on.
- max_requests_per_client: one client cannot take every slot: its request past the limit
  gets `overloaded` naming the key, while another client is still served.
- Refusals of one key are logged with the key, one line per 10 s.
- The gateway in front of it: refused at start without the coordinator's public key; with a
  key the coordinator does not admit, 503 naming the refusal (and one log line); once the
  key is admitted (the coordinator restarted), the same gateway is served (greedy ids equal
  target-only output): it connected again by itself.
"""
import json
import os
import subprocess
import time

import zmq

from tandem_e2e import Pipeline, binary, check, collect, free_port, http, main, reference, run


def keygen(d, name):
    prefix = os.path.join(d, name)
    run([binary("keygen"), prefix])
    return prefix + ".key", prefix + ".pub"


def read_key(path):
    return open(path).read().strip().encode()


def start_refused(p, what, needle, role="coordinator"):
    c = p.start(role)
    try:
        rc = c.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    log = open(p.logs[role]).read()
    check(rc == 78, "%s: %s exit %s, expected 78; log: %s" % (what, role, rc, log[-1000:]))
    check(needle in log, "%s: the log does not name %r: %s" % (what, needle, log[-1000:]))
    p.procs.pop(role, None)


def test():
    p = Pipeline("expose", max_concurrency=4, max_queue=8)
    draft, target = p.make_pair()
    srv_key, srv_pub = keygen(p.dir, "server")
    cli_key, cli_pub = keygen(p.dir, "client")
    other_key, other_pub = keygen(p.dir, "stranger")
    check(oct(os.stat(srv_key).st_mode & 0o777) == "0o600", "tandem-keygen: the secret key is not 0600")
    admitted = os.path.join(p.dir, "clients")
    gw_key, gw_pub = keygen(p.dir, "gateway")
    with open(admitted, "w") as f:
        f.write("# admitted clients\n%s\n" % open(cli_pub).read().strip())

    co = p.config["coordinator"]
    co["client_endpoint"] = "tcp://0.0.0.0:%d" % free_port()
    start_refused(p, "reachable client endpoint without CURVE", "coordinator.client_endpoint")
    co["client_endpoint"] = "tcp://127.0.0.1:%d" % free_port()
    co["worker_endpoint"] = "tcp://*:%d" % free_port()
    start_refused(p, "reachable worker endpoint", "external_workers")
    del co["worker_endpoint"]

    co["client_endpoint"] = "tcp://0.0.0.0:%d" % free_port()
    co["insecure"] = 1
    c = p.start("coordinator")
    time.sleep(1.0)
    check(c.poll() is None, "coordinator with insecure: 1 did not start: %s" % open(p.logs["coordinator"]).read())
    check("WITHOUT encryption" in open(p.logs["coordinator"]).read(), "insecure exposure is not warned about")
    p.kill("coordinator")
    del co["insecure"]

    # CURVE with admitted keys.
    port = free_port()
    co.update(client_endpoint="tcp://0.0.0.0:%d" % port, curve_secret_key_file=srv_key,
              curve_client_keys_file=admitted, max_requests_per_client=2)
    p.endpoint = "tcp://127.0.0.1:%d" % port
    server_pub = read_key(srv_pub)

    def curve_client(secret_path=cli_key):
        s = p.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        secret = read_key(secret_path)
        s.curve_secretkey = secret
        s.curve_publickey = zmq.curve_public(secret)
        s.curve_serverkey = server_pub
        s.connect(p.endpoint)
        return s

    p.client = curve_client
    p.start_all()

    cli = [binary("client"), "--endpoint", p.endpoint, "--ids", "5,6,7", "--max-tokens", "8",
           "--temperature", "0", "--json", "--timeout-ms", "3000"]
    ref = reference(target, [5, 6, 7], 8)["ids"]
    out = run(cli + ["--curve-server-key", srv_pub, "--curve-key", cli_key])
    check(json.loads(out.strip().splitlines()[-1])["ids"] == ref, "admitted CURVE client: %s" % out)
    r = subprocess.run(cli + ["--curve-server-key", srv_pub, "--curve-key", other_key],
                       capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and '"ids"' not in r.stdout, "a client with a stranger's key was served: %s" % r.stdout)
    check("does not admit this side's CURVE key" in r.stderr, "a refused key is not named: %s" % r.stderr)
    # Refusals of one key come as fast as clients retry: the log names the key, a line per 10 s.
    for _ in range(2):
        subprocess.run(cli + ["--curve-server-key", srv_pub, "--curve-key", other_key], capture_output=True,
                       timeout=60)
    lines = [l for l in open(p.logs["coordinator"]) if "refused a client connection" in l]
    check(len(lines) == 1 and read_key(other_pub).decode() in lines[0],
          "3 refusals of one key: %d log lines: %s" % (len(lines), lines[-3:]))
    r = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    check(r.returncode != 0 and '"ids"' not in r.stdout, "a client without CURVE was served: %s" % r.stdout)
    check("refused the connection" in r.stderr and "CURVE" in r.stderr,
          "a client without CURVE is not told why: %s" % r.stderr)
    check("refused a client connection" in open(p.logs["coordinator"]).read(), "refusals are not logged")

    # Per-client limit: the third request in flight is refused, another client is served.
    s = curve_client()
    for i in range(3):
        s.send_json({"v": 1, "type": "generate", "id": "pc%d" % i, "prompt_ids": [1, 2, 3],
                     "max_tokens": 200, "temperature": 0, "stream": True})
    refused = None
    deadline = time.time() + 60
    while refused is None and time.time() < deadline:
        if s.poll(1000):
            m = s.recv_json()
            if m.get("type") == "error":
                refused = m
    check(refused is not None and refused.get("id") == "pc2" and refused.get("code") == "overloaded"
          and "max_requests_per_client" in refused.get("message", ""),
          "the third request of one client: %s" % refused)
    other = curve_client()
    other.send_json({"v": 1, "type": "generate", "id": "o", "prompt_ids": [5, 6, 7], "max_tokens": 8,
                     "temperature": 0})
    done, _ = collect(other, "o", 60)
    check(done.get("ids") == ref, "another client while the first is at its limit: %s" % done)
    for sock in (s, other):
        sock.close()
    gateway_to_curve(p, srv_pub, gw_key, gw_pub, admitted, ref)


def gateway_to_curve(p, srv_pub, gw_key, gw_pub, admitted, ref):
    """The gateway in front of the CURVE coordinator: refused at start without
    the coordinator's public key; while the coordinator does not admit its
    key, its requests fail with 503 naming the refusal (logged once); once
    the coordinator admits it (restarted with the key listed), the same
    gateway process is served: it connects again by itself."""
    if not os.access(binary("gateway"), os.X_OK):
        print("gateway part skipped: %s is not built" % binary("gateway"))
        return
    url = p.enable_gateway()
    start_refused(p, "gateway without the coordinator's key", "gateway.coordinator_curve_public_key_file",
                  role="gateway")

    body = {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}
    p.config["gateway"].update(coordinator_curve_public_key_file=srv_pub, curve_secret_key_file=gw_key)
    p.start("gateway")
    p.wait_http()
    for _ in range(3):
        status, _, out = http("POST", url + "/v1/completions", body)
        check(status == 503 and b"does not admit this side's CURVE key" in out,
              "gateway with a key not admitted: %s %s" % (status, out[:500]))
    check(open(p.logs["gateway"]).read().count("ERROR: the coordinator refused the connection") == 1,
          "the gateway does not log the refusal once: %s" % p.log_tail("gateway"))

    with open(admitted, "a") as f:
        f.write("%s\n" % open(gw_pub).read().strip())
    p.kill("coordinator")
    p.start("coordinator")
    p.wait_workers(draft=True, target=True)
    deadline = time.time() + 30
    while True:
        status, _, out = http("POST", url + "/v1/completions", body)
        if status == 200 or time.time() > deadline:
            break
        time.sleep(0.5)
    check(status == 200 and json.loads(out)["tandem"]["ids"] == ref,
          "gateway once its key is admitted: %s %s" % (status, out[:500]))

if __name__ == "__main__":
    main(test)
