#!/usr/bin/python3
"""The model runtime and speculative decoding on the CUDA backend, end to end
(label gpu; exit 77 where no GPU can be used, so CI without one reports it skipped).

- greedy ids on cuda equal the CPU backend's over 64 tokens on the tiny and small
  presets (the CPU backend is the reference the CUDA kernels are held to);
- in-process speculative decoding on cuda equals target-only decoding on cuda, token
  for token, for K = 1..8 and adaptive, in both draft modes (verification rows must be
  bit-identical to decode rows on the device);
- --draft-device naming the same GPU by UUID (the two-GPU code path on one device);
- the three-process pipeline with both workers on the GPU: greedy requests through the
  coordinator equal target-only output on cuda, streamed and not;
- continuous batching on the GPU: 16 concurrent greedy requests of different prompt
  lengths (one long enough to be prefilled in chunks beside the others) and max_tokens
  each equal their own target-only output run alone on cuda, while the target ran
  several sequences per forward call (the stats' batch figures).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# No pyzmq here: the GPU image may lack it. Requests go through tandem-client.
BUILD = os.environ.get("TANDEM_BUILD_DIR", "")
DEVICE = os.environ.get("TANDEM_CUDA_DEVICE", "0")
# "cpu" runs the same checks on the CPU backend: a dry run of this script's own
# plumbing on a machine without a GPU, never a substitute for the GPU run.
BACKEND = os.environ.get("TANDEM_GPU_TEST_BACKEND", "cuda")
PROMPTS = [[1, 2, 3], [17, 4, 99, 23, 5], [42] * 9, [7, 300, 11, 64]]
BIN = {
    "coordinator": "coordinator/tandem-coordinator",
    "draft": "draft_worker/tandem-draft-worker",
    "target": "target_worker/tandem-target-worker",
    "client": "client/tandem-client",
    "generate": "tools/generate/tandem-generate",
    "make_model": "tools/make_model/tandem-make-model",
}


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def binary(name):
    return os.path.join(BUILD, BIN[name])


def run(cmd, timeout=600):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise Fail("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr[-2000:]))
    return r.stdout


def make_pair(d, draft_preset, target_preset, seed):
    draft, target = os.path.join(d, draft_preset), os.path.join(d, target_preset)
    run([binary("make_model"), "--preset", draft_preset, "--out", draft, "--seed", seed])
    run([binary("make_model"), "--preset", target_preset, "--out", target, "--derive-from", draft,
         "--noise", "0.02", "--seed", seed])
    return draft, target


def gen(model, ids, n, backend, extra=()):
    out = run([binary("generate"), "--model", model, "--ids", ",".join(map(str, ids)), "--max-tokens",
               str(n), "--temperature", "0", "--backend", backend, "--device", DEVICE, "--json"]
              + list(extra))
    return json.loads(out.strip().splitlines()[-1])


def gpu_usable(model):
    r = subprocess.run([binary("generate"), "--model", model, "--ids", "1", "--max-tokens", "1",
                        "--backend", BACKEND, "--device", DEVICE], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def pipeline_check(d, draft, target, procs):
    endpoint = "ipc://%s/client.sock" % d
    cfg = {
        "instance": "gpu%d" % os.getpid(),
        "coordinator": {"client_endpoint": endpoint, "worker_endpoint": "ipc://%s/workers.sock" % d,
                        "max_concurrency": 16, "max_queue": 16, "heartbeat_ms": 200,
                        "worker_timeout_ms": 5000},
        "draft_worker": {"model": draft, "backend": BACKEND, "device": DEVICE, "max_seq_len": 4096},
        "target_worker": {"model": target, "backend": BACKEND, "device": DEVICE, "max_seq_len": 4096},
    }
    path = os.path.join(d, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    for role in ("coordinator", "target", "draft"):
        log = open(os.path.join(d, role + ".log"), "w")
        procs.append(subprocess.Popen([binary(role), "--config", path], stdout=log, stderr=subprocess.STDOUT))
    client = [binary("client"), "--endpoint", endpoint, "--timeout-ms", "120000"]
    deadline = time.time() + 120
    while True:
        r = subprocess.run(client + ["--stats"], capture_output=True, text=True)
        if r.returncode == 0:
            w = json.loads(r.stdout).get("workers", {})
            if w.get("draft", {}).get("up") and w.get("target", {}).get("up"):
                break
        check(time.time() < deadline, "workers on the GPU did not register: %s" % r.stdout[-500:])
        time.sleep(0.5)
    for ids in PROMPTS:
        ref = gen(target, ids, 40, BACKEND)["ids"]
        for stream in ([], ["--stream"]):
            out = run(client + ["--ids", ",".join(map(str, ids)), "--max-tokens", "40", "--temperature", "0",
                                "--json"] + stream)
            done = json.loads(out.strip().splitlines()[-1])
            check(done.get("ids") == ref, "pipeline on cuda %s %s: first difference at %d"
                  % (stream, ids, first_difference(done.get("ids", []), ref)))
    batching_check(client, target)


def batching_check(client, target):
    """16 requests at once: each equals its target-only run alone; the target batched."""
    reqs = []
    for i in range(16):
        n_prompt = [1, 3, 200, 20, 64, 7, 120, 33][i % 8] + i
        ids = [(i * 131 + j * 17) % 500 + 1 for j in range(n_prompt)]
        reqs.append((ids, 8 + (i * 7) % 41))
    refs = [gen(target, ids, n, BACKEND)["ids"] for ids, n in reqs]
    before = json.loads(run(client + ["--stats"]))["batch"]
    procs = [subprocess.Popen(client + ["--ids", ",".join(map(str, ids)), "--max-tokens", str(n),
                                        "--temperature", "0", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for ids, n in reqs]
    for i, p in enumerate(procs):
        out, errs = p.communicate(timeout=300)
        check(p.returncode == 0, "batched request %d failed: %s" % (i, errs[-500:]))
        got = json.loads(out.strip().splitlines()[-1]).get("ids", [])
        check(got == refs[i], "batched request %d (prompt %d, max_tokens %d) on cuda: first difference "
              "at %d" % (i, len(reqs[i][0]), reqs[i][1], first_difference(got, refs[i])))
    after = json.loads(run(client + ["--stats"]))["batch"]
    calls = after["target_calls"] - before["target_calls"]
    seqs = (after["mean_seqs_per_call"] * after["target_calls"]
            - before["mean_seqs_per_call"] * before["target_calls"])
    check(calls > 0 and seqs / calls > 1.5, "the target did not batch on the GPU: %s" % after)
    print("batching on %s: 16 concurrent requests equal their target-only runs; %.2f sequences per "
          "target call" % (BACKEND, seqs / calls))


def test(d, procs):
    draft, target = make_pair(d, "tiny-draft", "tiny", "1")
    ok, why = gpu_usable(target)
    if not ok:
        print("SKIPPED: no usable GPU: %s" % why)
        sys.exit(77)
    small_d, small_t = make_pair(d, "small-draft", "small", "3")

    # cuda against the CPU reference
    for model in (target, small_t):
        for ids in PROMPTS[:2]:
            cpu = gen(model, ids, 64, "cpu")["ids"]
            gpu = gen(model, ids, 64, BACKEND)["ids"]
            check(cpu == gpu, "%s %s: cuda ids differ from cpu from position %d"
                  % (model, ids, first_difference(cpu, gpu)))

    # speculative == target-only on the device
    for model_d, model_t, ks in ((draft, target, list(range(1, 9)) + [0]), (small_d, small_t, [2, 5, 0])):
        for ids in PROMPTS[:2]:
            ref = gen(model_t, ids, 48, BACKEND)["ids"]
            for mode in ("sampled", "point_mass"):
                for k in ks:
                    got = gen(model_t, ids, 48, BACKEND, ("--draft", model_d, "--spec-k", str(k),
                                                          "--spec-mode", mode))["ids"]
                    check(got == ref, "%s K=%d %s %s: speculative ids differ from target-only at %d"
                          % (model_t, k, mode, ids, first_difference(got, ref)))

    # the draft on "another" device: the same GPU named by UUID
    uuid = ""
    if BACKEND == "cuda" and shutil.which("nvidia-smi"):
        uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", DEVICE],
                              capture_output=True, text=True).stdout.strip()
    if uuid:
        got = gen(target, PROMPTS[0], 48, BACKEND, ("--draft", draft, "--draft-device", uuid))["ids"]
        check(got == gen(target, PROMPTS[0], 48, BACKEND)["ids"], "--draft-device %s changed the ids" % uuid)

    pipeline_check(d, draft, target, procs)
    print("PASS: cuda == cpu on 2 presets; speculative == target-only on cuda (K 1..8, adaptive, both "
          "modes); --draft-device by UUID; pipeline with both workers on the GPU == target-only; "
          "16 concurrent batched requests == their target-only runs")


def main():
    if not BUILD:
        print("TANDEM_BUILD_DIR is not set")
        sys.exit(1)
    d = tempfile.mkdtemp(prefix="tandem-gpu-")
    procs = []
    status = 0
    try:
        test(d, procs)
    except Fail as e:
        print("FAIL: %s" % e)
        for role in ("coordinator", "target", "draft"):
            p = os.path.join(d, role + ".log")
            if os.path.exists(p):
                print("---- %s log ----\n%s" % (role, open(p).read()[-3000:]))
        status = 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(d, ignore_errors=True)
    sys.exit(status)


if __name__ == "__main__":
    main()
