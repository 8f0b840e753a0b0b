#!/usr/bin/python3
"""`tandem-supervisor serve MODEL_DIR [--draft DIR] [--port N] ...` (issue
64): one command, in the foreground, the gateway on. Its stdout carries
every process's lines tagged with the process and a "ready: listening on
http://HOST:PORT ..., serving NAME" line once the instance answers; the
official OpenAI client (npm `openai`) gets the target-only greedy
completion from it under the --served-model-name; SIGINT stops it all. A
port that is taken ends it at once, naming the port."""
import json
import os
import signal
import socket
import subprocess
import time

from tandem_e2e import (Fail, Pipeline, check, default_run_dir, free_port, main, require_gateway, skip,
                        supervisor_env, time_scale)
from test_gateway_openai import generate_ref
from test_supervisor_target_only import SUPERVISOR

PROMPT = "Once upon a time"
N = 16
NODE_SCRIPT = r"""
const OpenAI = require(process.env.OPENAI_MODULE);
const client = new OpenAI({ baseURL: process.env.BASE_URL + "/v1", apiKey: "unused", maxRetries: 0 });
(async () => {
  const comp = await client.completions.create({ model: process.env.MODEL, prompt: process.env.PROMPT,
                                                 temperature: 0, max_tokens: Number(process.env.N) });
  const chat = await client.chat.completions.create({ model: process.env.MODEL, temperature: 0, max_tokens: 4,
                                                      messages: [{ role: "user", content: "Hello" }] });
  const models = await client.models.list();
  console.log(JSON.stringify({ comp, chat, models: models.data.map((m) => m.id) }));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def openai_module():
    deps = os.environ.get("TANDEM_DEPS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", ".deps"))
    module = os.path.join(deps, "npm", "node_modules", "openai")
    if not os.path.isdir(module):
        skip("npm package openai is not installed in %s (scripts/install-deps.sh)" % module)
    return module


def wait_line(path, proc, needle, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with open(path) as f:
            text = f.read()
        if needle in text:
            return text
        if proc.poll() is not None:
            raise Fail("serve exited (%d) before %r:\n%s" % (proc.returncode, needle, text[-3000:]))
        time.sleep(0.1)
    raise Fail("serve did not print %r within %d s:\n%s" % (needle, timeout_s, text[-3000:]))


def test():
    require_gateway()
    module = openai_module()
    p = Pipeline("serve")
    draft, target = p.make_pair()
    port = free_port()
    out_path = os.path.join(p.dir, "serve.out")
    args = [SUPERVISOR, "serve", target, "--draft", draft, "--port", str(port), "--served-model-name", "tiny-served",
            "--max-seq-len", "4096", "--threads", "1", "--instance", p.instance, "--endpoint", p.endpoint]
    env = supervisor_env()
    env.pop("TANDEM_RUN_DIR", None)
    with open(out_path, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        t0 = time.time()
        text = wait_line(out_path, proc, "ready: listening on http://127.0.0.1:%d" % port, 60 * time_scale())
        ready_line = [l for l in text.splitlines() if "ready: listening on" in l][0]
        print("serve: %.2f s to %s" % (time.time() - t0, ready_line))
        check("serving tiny-served" in ready_line, "the ready line does not name the model: %s" % ready_line)
        for name in ("coordinator", "draft", "target", "gateway"):
            check(any(l.startswith(name) and " | " in l for l in text.splitlines()),
                  "no line tagged %s on serve's stdout:\n%s" % (name, text[-3000:]))
        with open(os.path.join(default_run_dir(p.instance), "config.json")) as f:
            cfg = json.load(f)
        check(cfg["target_worker"]["max_seq_len"] == 4096 and cfg["draft_worker"]["threads"] == 1 and
              cfg["gateway"]["listen"] == "127.0.0.1:%d" % port, "effective config: %s" % cfg)

        ref = generate_ref(target, "--prompt", PROMPT)
        env_node = dict(os.environ, OPENAI_MODULE=module, BASE_URL="http://127.0.0.1:%d" % port, MODEL="tiny-served",
                        PROMPT=PROMPT, N=str(N))
        r = subprocess.run(["node", "-e", NODE_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env_node, timeout=120)
        check(r.returncode == 0, "the openai client against serve failed: %s" % r.stderr[-3000:])
        got = json.loads(r.stdout)
        check(got["comp"]["choices"][0]["text"] == ref["text"][:len(got["comp"]["choices"][0]["text"])] and
              got["comp"]["usage"]["completion_tokens"] >= 1,
              "completion %r, target-only %r" % (got["comp"]["choices"][0]["text"], ref["text"]))
        check(got["chat"]["choices"][0]["message"]["role"] == "assistant", "chat: %s" % got["chat"])
        check(got["models"] == ["tiny-served"], "models: %s" % got["models"])
        print("openai client: completion %r, models %s" % (got["comp"]["choices"][0]["text"], got["models"]))

        # one access line per request, at INFO on serve's stdout
        with open(out_path) as f:
            text = f.read()
        for what in ('"POST /v1/completions" 200', '"POST /v1/chat/completions" 200', '"GET /v1/models" 200'):
            check(any(("access: 127.0.0.1 " + what) in l and l.startswith("gateway") for l in text.splitlines()),
                  "no access line %s on serve's stdout:\n%s" % (what, text[-3000:]))
        # the completion's line carries its usage
        u = got["comp"]["usage"]
        tokens = "prompt_tokens=%d completion_tokens=%d" % (u["prompt_tokens"], u["completion_tokens"])
        check(any('"POST /v1/completions" 200' in l and tokens in l for l in text.splitlines()),
              "no access line with %s:\n%s" % (tokens, text[-3000:]))
        print("access line: ... %s" % tokens)

        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
        with open(out_path) as f:
            text = f.read()
        check(rc == 0 and "supervisor: stopped" in text, "serve after SIGINT: exit %d\n%s" % (rc, text[-2000:]))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        subprocess.run([SUPERVISOR, "stop", "--instance", p.instance], env=env, capture_output=True, timeout=60)

    # a taken port: at once, named
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        taken = held.getsockname()[1]
        t0 = time.time()
        r = subprocess.run([SUPERVISOR, "serve", target, "--port", str(taken), "--instance", p.instance,
                            "--endpoint", p.endpoint], env=env, capture_output=True, text=True, timeout=60)
    took = time.time() - t0
    check(r.returncode != 0 and "gateway.listen: 127.0.0.1:%d is in use" % taken in r.stderr,
          "serve on a taken port: exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
    check(took < 5 * time_scale(), "serve on a taken port took %.1f s" % took)
    print("serve on a taken port: exit %d after %.2f s: %s" % (r.returncode, took, r.stderr.strip().splitlines()[-1]))
    p.close()


if __name__ == "__main__":
    main(test)
