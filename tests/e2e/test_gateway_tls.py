#!/usr/bin/python3
"""HTTPS at the gateway (issue 63, item 4), with a self-signed certificate
made here (openssl):
1. curl --cacert gets a chat completion and /v1/models; the official
   `openai` Node client (NODE_EXTRA_CA_CERTS) gets a chat completion and
   the model list.
2. Plain HTTP on the HTTPS port gets no HTTP answer: the connection is
   closed.
3. A missing, unreadable or malformed certificate, a malformed key, a key
   that is not the certificate's, and a key without a certificate stop the
   gateway at start (exit 78) naming the key and the file.
4. With tls_client_ca_file: a client without a certificate gets a 401
   invalid_client_certificate (an OpenAI error object); one with a
   certificate the CA signed is served; one signed by another CA is
   refused (401 or at the handshake).
5. Past max_connections, a TLS connection gets its 503 (Retry-After, an
   OpenAI error object) once its handshake is done."""
import json
import os
import socket
import ssl
import subprocess
import time

from tandem_e2e import Fail, Pipeline, check, main, require_gateway, skip

KEY = "sk-tls-1"
AUTH = ["-H", "Authorization: Bearer " + KEY]

NODE_SCRIPT = r"""
const OpenAI = require(process.env.OPENAI_MODULE);
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: process.env.API_KEY, maxRetries: 0 });
(async () => {
  const out = {};
  out.chat = await client.chat.completions.create({ model: "tiny", temperature: 0, max_tokens: 4,
                                                    messages: [{ role: "user", content: "hi" }] });
  out.models = await client.models.list();
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    check(r.returncode == 0, "openssl %s: %s" % (" ".join(args), r.stdout[-500:]))


def make_certs(d):
    """server.pem/server.key (self-signed, 127.0.0.1), other.key, and a CA
    with a client certificate, plus a client from another CA."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "server.key", "-out", "server.pem", "-days", "2", "-subj",
            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", cwd=d)
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "other.key", cwd=d)
    for ca in ("ca", "otherca"):
        openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "2", "-subj",
                "/CN=tandem test " + ca, cwd=d)
        client = "client" if ca == "ca" else "stranger"
        openssl("req", "-new", *ec, "-keyout", client + ".key", "-out", client + ".csr", "-subj", "/CN=" + client,
                cwd=d)
        openssl("x509", "-req", "-in", client + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                "-CAcreateserial", "-out", client + ".pem", "-days", "2", cwd=d)
    with open(os.path.join(d, "garbage.pem"), "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")


def curl(p, path, *extra, body=None):
    args = ["curl", "-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code}"] + list(extra)
    if body is not None:
        args += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(body)]
    r = subprocess.run(args + [p.base_url + path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    out, _, code = r.stdout.rpartition("\n")
    return r.returncode, int(code or 0), out, r.stderr


def wait_https(p, cafile, timeout_s=20):
    ctx = ssl.create_default_context(cafile=cafile)
    port = int(p.base_url.rsplit(":", 1)[1])
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        check(p.procs["gateway"].poll() is None, "gateway exited:\n%s" % p.log_tail("gateway"))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                with ctx.wrap_socket(s, server_hostname="127.0.0.1"):
                    return
        except OSError:
            time.sleep(0.05)
    raise Fail("the gateway does not serve HTTPS within %d s\n%s" % (timeout_s, p.log_tail("gateway")))


def served(p, d):
    ca = ["--cacert", os.path.join(d, "server.pem")]
    rc, st, out, err = curl(p, "/v1/chat/completions", *(ca + AUTH),
                            body={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                  "temperature": 0})
    check(rc == 0 and st == 200, "curl --cacert, chat completion: rc %d status %d %s %s" % (rc, st, out[:300], err))
    check(json.loads(out)["object"] == "chat.completion", "chat completion over HTTPS: %s" % out[:300])
    rc, st, out, err = curl(p, "/v1/models", *(ca + AUTH))
    check(rc == 0 and st == 200 and json.loads(out)["data"][0]["id"] == "tiny", "curl /v1/models: %s" % out[:300])
    # Without the CA, curl must refuse the certificate: it is the server's own, not a public one.
    rc, st, out, err = curl(p, "/v1/models", *AUTH)
    check(rc != 0, "curl without --cacert accepted a self-signed certificate")
    print("curl --cacert: chat completion and /v1/models served over HTTPS")

    deps = os.environ.get("TANDEM_DEPS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", ".deps"))
    module = os.path.join(deps, "npm", "node_modules", "openai")
    if not os.path.isdir(module):
        skip("npm package openai is not installed in %s (scripts/install-deps.sh)" % module)
    env = dict(os.environ, OPENAI_MODULE=module, BASE_URL=p.base_url, API_KEY=KEY,
               NODE_EXTRA_CA_CERTS=os.path.join(d, "server.pem"))
    r = subprocess.run(["node", "-e", NODE_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env, timeout=120)
    check(r.returncode == 0, "node openai client over HTTPS failed: %s" % r.stderr[-2000:])
    out = json.loads(r.stdout)
    check(out["chat"]["object"] == "chat.completion" and out["models"]["data"][0]["id"] == "tiny",
          "openai client over HTTPS: %s" % r.stdout[:300])
    print("openai (Node): chat completion and model list over HTTPS")


def chunked_over_limit(p, d):
    """Over HTTPS no answer can be written beside the TLS session: a chunked
    body over the limit is read to its end, then answered 413."""
    ctx = ssl.create_default_context(cafile=os.path.join(d, "server.pem"))
    port = int(p.base_url.rsplit(":", 1)[1])
    limit = p.config["gateway"]["max_body_bytes"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                      b"\r\nTransfer-Encoding: chunked\r\n\r\n")
            piece = b"a" * 1024
            for _ in range(2 * limit // 1024):
                s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            s.sendall(b"0\r\n\r\n")
            got = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
    check(got.startswith(b"HTTP/1.1 413"), "HTTPS, chunked body over the limit: %r" % got[:300])
    err = json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]
    check(err["code"] == "request_too_large", "HTTPS 413: %s" % err)
    print("HTTPS, chunked body of %d bytes over a limit of %d: 413 at its end" % (2 * limit, limit))


def plain_refused(p):
    port = int(p.base_url.rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got, closed = b"", False
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                closed = True
                break
            got += chunk
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        pass
    s.close()
    check(b"HTTP/1." not in got, "plain HTTP on the HTTPS port was answered: %r" % got[:200])
    check(closed, "plain HTTP on the HTTPS port: the connection stayed open")
    plain = subprocess.run(["curl", "-sS", "--max-time", "10", "http://" + p.base_url.split("://", 1)[1] + "/health"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
    check(plain.returncode != 0 and "HTTP/" not in plain.stdout,
          "curl http:// on the HTTPS port: rc %d %r" % (plain.returncode, plain.stdout[:200]))
    print("plain HTTP on the HTTPS port: closed without an answer (%d bytes, curl: %s)" %
          (len(got), plain.stderr.strip()[:80]))


def refused_at_start(p, d):
    unreadable = os.path.join(d, "unreadable.pem")
    with open(unreadable, "w") as f:
        f.write(open(os.path.join(d, "server.pem")).read())
    os.chmod(unreadable, 0)
    cases = [
        ("a missing certificate", {"tls_cert_file": os.path.join(d, "nope.pem")},
         ["gateway.tls_cert_file", "nope.pem", "No such file"]),
        ("a malformed certificate", {"tls_cert_file": os.path.join(d, "garbage.pem")},
         ["gateway.tls_cert_file", "garbage.pem", "not a PEM certificate"]),
        ("a key for a certificate", {"tls_key_file": os.path.join(d, "server.pem")},
         ["gateway.tls_key_file", "server.pem", "private key"]),
        ("another key", {"tls_key_file": os.path.join(d, "other.key")},
         ["gateway.tls_key_file", "other.key", "not the key of gateway.tls_cert_file"]),
        ("a key without a certificate", {"tls_cert_file": ""}, ["gateway.tls_key_file", "gateway.tls_cert_file"]),
        ("a malformed client CA", {"tls_client_ca_file": os.path.join(d, "garbage.pem")},
         ["gateway.tls_client_ca_file", "garbage.pem"]),
    ]
    if os.geteuid() != 0:  # root reads a file of mode 000
        cases.append(("an unreadable certificate", {"tls_cert_file": unreadable},
                      ["gateway.tls_cert_file", "unreadable.pem", "Permission denied"]))
    p.kill("gateway", sig=15)
    for what, change, needles in cases:
        saved = dict(p.config["gateway"])
        p.config["gateway"].update(change)
        open(p.logs["gateway"], "w").close()
        proc = p.start("gateway")
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            raise Fail("%s: the gateway started" % what)
        finally:
            p.config["gateway"] = saved
            p.procs.pop("gateway", None)
        log = open(p.logs["gateway"]).read()
        check(rc == 78, "%s: exit %s, expected 78\n%s" % (what, rc, log[-800:]))
        for n in needles:
            check(n in log, "%s: the error does not name %r:\n%s" % (what, n, log[-800:]))
        print("%-28s exit 78: %s" % (what, log.strip().splitlines()[-1][:160]))


def client_certificates(p, d):
    p.config["gateway"]["tls_client_ca_file"] = os.path.join(d, "ca.pem")
    p.start("gateway")
    wait_https(p, os.path.join(d, "server.pem"))
    ca = ["--cacert", os.path.join(d, "server.pem")]
    rc, st, out, err = curl(p, "/v1/models", *(ca + AUTH))
    check(rc == 0 and st == 401, "no client certificate: rc %d status %d %s %s" % (rc, st, out[:300], err))
    check(json.loads(out)["error"]["code"] == "invalid_client_certificate", "no client certificate: %s" % out)
    mine = ["--cert", os.path.join(d, "client.pem"), "--key", os.path.join(d, "client.key")]
    rc, st, out, err = curl(p, "/v1/models", *(ca + AUTH + mine))
    check(rc == 0 and st == 200, "a client certificate the CA signed: rc %d status %d %s %s" % (rc, st, out[:300], err))
    theirs = ["--cert", os.path.join(d, "stranger.pem"), "--key", os.path.join(d, "stranger.key")]
    rc, st, out, err = curl(p, "/v1/models", *(ca + AUTH + theirs))
    check(rc != 0 or st == 401, "a client certificate of another CA: rc %d status %d %s" % (rc, st, out[:300]))
    print("client certificates: none 401, the CA's served, another CA's refused (rc %d, status %d)" % (rc, st))


def overload(p, d):
    """Past max_connections a TLS connection is answered 503 once its
    handshake is done (nothing can be written before it)."""
    p.kill("gateway", sig=15)
    p.config["gateway"].update(max_connections=2, tls_client_ca_file="")
    p.start("gateway")
    wait_https(p, os.path.join(d, "server.pem"))
    time.sleep(0.3)  # the probe's connection is gone
    ctx = ssl.create_default_context(cafile=os.path.join(d, "server.pem"))
    port = int(p.base_url.rsplit(":", 1)[1])
    held = []
    for _ in range(2):
        held.append(ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10),
                                    server_hostname="127.0.0.1"))
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")
    s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n")
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except (ssl.SSLError, OSError):
        pass
    for c in held + [s]:
        c.close()
    check(got.startswith(b"HTTP/1.1 503"), "HTTPS past max_connections: %r" % got[:300])
    head, _, body = got.partition(b"\r\n\r\n")
    check(b"Retry-After: 1" in head and json.loads(body)["error"]["code"] == "too_many_connections",
          "HTTPS 503: %r" % got[:400])
    print("HTTPS past max_connections 2: 503 too_many_connections after the handshake")


def test():
    require_gateway()
    import shutil
    if shutil.which("openssl") is None:
        skip("openssl is not installed (scripts/install-deps.sh)")
    p = Pipeline("gwtls", worker_timeout_ms=5000)
    p.make_pair()
    d = os.path.join(p.dir, "tls")
    os.mkdir(d)
    make_certs(d)
    p.enable_gateway(api_key=KEY, max_body_bytes=4096, tls_cert_file=os.path.join(d, "server.pem"),
                     tls_key_file=os.path.join(d, "server.key"))
    p.base_url = p.base_url.replace("http://", "https://")
    p.start_all()
    p.start("gateway")
    wait_https(p, os.path.join(d, "server.pem"))
    served(p, d)
    chunked_over_limit(p, d)
    plain_refused(p)
    refused_at_start(p, d)
    client_certificates(p, d)
    overload(p, d)


if __name__ == "__main__":
    main(test)
