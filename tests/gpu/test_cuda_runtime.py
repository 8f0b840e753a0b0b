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
  coordinator equal target-only output on cuda, streamed and not; a prompt whose first
  64 tokens an earlier one computed maps them from both workers' prefix caches and
  still equals target-only;
- continuous batching on the GPU: 16 concurrent greedy requests of different prompt
  lengths (one long enough to be prefilled in chunks beside the others) and max_tokens
  each equal their own target-only output run alone on cuda, while the target ran
  several sequences per forward call (the stats' batch figures);
- the supervised pipeline (deploy/tandem-supervisor, backend cuda, both workers on
  GPU 0, both on their lanes to the coordinator (common/wire/lane.h), both sampling on
  the device: sampler "device", the default on cuda), once per
  variant: the draft's buffer over POSIX shared memory (the reference), over cuda_ipc
  (device slab + interprocess events; the draft's sampling kernels write the q rows
  into the slab and the target's accept/reject reads them there after the event wait:
  both logs must say so), over cuda_ipc forced through pinned host staging by the
  draft (shm_staging: no slab) and by the target (its shm_staging: the two-GPU
  fallback path; the draft then writes q into the host face and the target uploads
  it), and over cuda_ipc under an MPS daemon of the instance (supervisor.mps). In
  each: greedy requests, streamed and not, equal target-only; seeded sampled requests
  with fixed K are reproducible and equal, token for token, to the POSIX variant's
  (the same kernels draw and decide on every path, and the q rows crossed intact).
  One more variant runs both workers with sampler "host" over cuda_ipc: greedy equal
  target-only and seeded sampling reproducible, its agreement with the device
  sampler's tokens printed, not gated (the kernels' contract lets a draw that lies
  within rounding of a boundary differ). Each variant prints a "pipeline-row:" line
  that run_gpu_tests.sh turns into a row of its summary;
- failures over cuda_ipc: kill -9 of the draft mid-request: the request completes
  with the target-only ids, and once the restarted draft is attached the GPU's used
  memory (nvidia-smi) is back at its level before the kill (the target closed its
  mapping of the dead draft's slab); kill -9 of the target: the request ends with
  target_unavailable within the worker timeout, and after the restart requests equal
  target-only again;
- compute-sanitizer (memcheck) on the draft worker and on the target worker for a
  short cuda_ipc run (device sampling, the default: q rows written into the slab by
  the draft's kernels and copied out of the mapping by the target): no errors
  reported.

TANDEM_GPU_TEST_BACKEND=cpu runs the same on the CPU backend over POSIX shared memory
(no cuda_ipc, MPS, memory or sanitizer checks): a dry run of the script's plumbing.
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


def run(cmd, timeout=600, env=None):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
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
    # the GPU keeps f32 activations: the CPU too, where AVX512_BF16 would
    # round bf16 products' activations (kernels/cpu/bfdot.h)
    env = dict(os.environ, TANDEM_CPU_BF16_DOT="0") if backend == "cpu" else None
    out = run([binary("generate"), "--model", model, "--ids", ",".join(map(str, ids)), "--max-tokens",
               str(n), "--temperature", "0", "--backend", backend, "--device", DEVICE, "--json"]
              + list(extra), env=env)
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
    # prefix caching on the device: the second prompt maps the 64 tokens the
    # first computed, in both workers' pools, and its output is the cold one
    stem = [(i * 37) % 500 + 1 for i in range(64)]
    for j, tail in enumerate(([5, 6, 7], [8, 9, 10, 11])):
        ids = stem + tail
        ref = gen(target, ids, 24, BACKEND)["ids"]
        out = run(client + ["--ids", ",".join(map(str, ids)), "--max-tokens", "24", "--temperature", "0", "--json"])
        done = json.loads(out.strip().splitlines()[-1])
        check(done.get("ids") == ref, "prefix cache on cuda, prompt %d: first difference at %d"
              % (j, first_difference(done.get("ids", []), ref)))
        cached = done.get("usage", {}).get("cached_prompt_tokens")
        check(cached == 64 * j, "prefix cache on cuda, prompt %d: %s tokens cached, want %d" % (j, cached, 64 * j))
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


SUPERVISOR = os.path.join(os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                          "deploy", "tandem-supervisor")
SAMPLED_PROMPTS = PROMPTS[:2]
WORKER_TIMEOUT_MS = 3000


def variants():
    """(name, draft_worker keys, target_worker keys, supervisor keys) to run the pipeline with.

    On cuda every variant but the last samples on the device in both workers (named, not
    left to the default); the last is the host sampler's reference run."""
    if BACKEND != "cuda":
        return [("posix", {"shm_transport": "posix"}, {}, {})]
    dev = {"sampler": "device"}
    return [("posix", dict(dev, shm_transport="posix"), dev, {}),
            ("cuda_ipc", dict(dev, shm_transport="cuda_ipc"), dev, {}),
            ("cuda_ipc+staging", dict(dev, shm_transport="cuda_ipc", shm_staging=1), dev, {}),
            ("cuda_ipc+target-staging", dict(dev, shm_transport="cuda_ipc"), dict(dev, shm_staging=1), {}),
            ("cuda_ipc+mps", dict(dev, shm_transport="cuda_ipc"), dev, {"mps": 1}),
            ("cuda_ipc+host-sampler", {"shm_transport": "cuda_ipc", "sampler": "host"}, {"sampler": "host"}, {})]


def host_sampler(name):
    return name.endswith("host-sampler")


class Supervised:
    """One instance under deploy/tandem-supervisor, its run dir private to the test."""

    def __init__(self, d, name, draft, target, dkeys, tkeys, skeys):
        self.name = name
        self.run_dir = tempfile.mkdtemp(prefix="tandem-gpu-run-")  # mode 0700
        self.instance = "gpu%s%d" % ("".join(c for c in name if c.isalnum()), os.getpid())
        self.endpoint = "ipc://%s/client-%s.sock" % (d, self.instance)
        cfg = {
            "instance": self.instance,
            "coordinator": {"client_endpoint": self.endpoint, "max_concurrency": 4, "max_queue": 8,
                            "heartbeat_ms": 200, "worker_timeout_ms": WORKER_TIMEOUT_MS, "spec_k": 3},
            "draft_worker": dict({"model": draft, "backend": BACKEND, "device": DEVICE, "max_seq_len": 2048},
                                 **dkeys),
            "target_worker": dict({"model": target, "backend": BACKEND, "device": DEVICE, "max_seq_len": 2048},
                                  **tkeys),
        }
        if skeys:
            cfg["supervisor"] = skeys
        self.config = os.path.join(d, "config-%s.json" % self.instance)
        with open(self.config, "w") as f:
            json.dump(cfg, f)
        self.client = [binary("client"), "--endpoint", self.endpoint, "--timeout-ms", "120000"]

    def supervisor(self, *args):
        env = dict(os.environ, TANDEM_BIN_DIR=BUILD, TANDEM_RUN_DIR=self.run_dir)
        return subprocess.run([SUPERVISOR] + list(args) + ["--config", self.config, "--instance", self.instance],
                              capture_output=True, text=True, env=env, timeout=120)

    def start(self):
        r = self.supervisor("start")
        check(r.returncode == 0, "%s: supervisor start failed: %s%s" % (self.name, r.stdout, r.stderr[-2000:]))
        self.wait_up()

    def wait_up(self, timeout_s=120):
        deadline = time.time() + timeout_s
        while True:
            r = subprocess.run(self.client + ["--stats"], capture_output=True, text=True)
            if r.returncode == 0:
                w = json.loads(r.stdout).get("workers", {})
                # up, and on their lanes (common/wire/lane.h: the run dir's
                # ipc:// endpoint, so both must take theirs)
                if all(w.get(role, {}).get("up") and w.get(role, {}).get("lane") for role in ("draft", "target")):
                    return
            check(time.time() < deadline, "%s: workers did not come up on their lanes (%s): %s" %
                  (self.name, {k: v for k, v in w.items() if k in ("draft", "target")} if r.returncode == 0 else r.stderr,
                   self.log_tails()))
            time.sleep(0.5)

    def pid(self, role):
        with open(os.path.join(self.run_dir, role + ".pid")) as f:
            return int(f.read())

    def log(self, role):
        p = os.path.join(self.run_dir, role + ".log")
        return open(p).read() if os.path.exists(p) else ""

    def log_tails(self):
        return "".join("\n---- %s %s.log ----\n%s" % (self.name, r, self.log(r)[-2500:])
                       for r in ("supervisor", "coordinator", "draft", "target"))

    def request(self, ids, n, extra=(), stream=False):
        out = run(self.client + ["--ids", ",".join(map(str, ids)), "--max-tokens", str(n), "--json"]
                  + list(extra) + (["--stream"] if stream else []))
        return json.loads(out.strip().splitlines()[-1]).get("ids", [])

    def stop(self):
        r = self.supervisor("stop")
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return r


def gpu_memory_used_mib():
    if BACKEND != "cuda" or not shutil.which("nvidia-smi"):
        return None
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", DEVICE],
                       capture_output=True, text=True)
    return int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip().isdigit() else None


# What the workers log about the path q rows take (draft_worker.c, target_worker.c).
DRAFT_Q_SLAB = "q rows written by the sampling kernels into the slab (no host copy)"
DRAFT_Q_HOST = "q rows written to the host face"
TARGET_Q = {
    "slab": "q rows in place from the draft's slab on the GPU (device accept/reject, no host copy)",
    "staging": "q rows from the pinned host face, uploaded for the device accept/reject (staging)",
    "host-sampler": "q rows from the draft's slab through pinned host memory (host accept/reject)",
    "posix": "q rows from the host face",
}


def q_path(name):
    """(draft log line, target log line) the variant's q rows must take."""
    if name == "posix":
        return None, TARGET_Q["posix"]
    if host_sampler(name):
        return DRAFT_Q_HOST, TARGET_Q["host-sampler"]
    if "staging" in name:
        return DRAFT_Q_HOST, TARGET_Q["staging"]
    return DRAFT_Q_SLAB, TARGET_Q["slab"]


def check_transport_logs(sv, after_requests=False):
    if BACKEND != "cuda":
        return
    draft_log, target_log = sv.log("draft"), sv.log("target")
    sampler = "host" if host_sampler(sv.name) else "device"
    for role, text in (("draft", draft_log), ("target", target_log)):
        check("%s sampler: %s" % (role, sampler) in text,
              "%s: the %s log does not say it samples on the %s:%s" % (sv.name, role, sampler, sv.log_tails()))
    if after_requests:
        # the target logs its q path when it attaches the draft's buffer
        want_draft, want_target = q_path(sv.name)
        if want_draft:
            check(want_draft in draft_log, "%s: the draft log does not say %r" % (sv.name, want_draft))
        check(want_target in target_log, "%s: the target log does not say %r:%s"
              % (sv.name, want_target, sv.log_tails()))
    if sv.name == "posix":
        check("CUDA IPC" not in draft_log, "posix variant: the draft used CUDA IPC")
        return
    check("draft buffer over CUDA IPC" in draft_log, "%s: the draft did not export over CUDA IPC" % sv.name)
    want = "staging through pinned host memory" if "staging" in sv.name else "mapped and probed"
    check(want in target_log, "%s: the target log does not say %r:%s" % (sv.name, want, sv.log_tails()))
    if "mps" in sv.name:
        check(os.path.exists(os.path.join(sv.run_dir, "mps-pipe", "control")), "mps: no control pipe")


def kill_draft_check(sv, target):
    """kill -9 of the draft mid-request: target-only ids, and the GPU memory comes back."""
    ids = PROMPTS[1]
    ref = gen(target, ids, 200, BACKEND)["ids"]
    sv.request(ids, 8, ["--temperature", "0"])
    before = gpu_memory_used_mib()
    old = sv.pid("draft")
    p = subprocess.Popen(sv.client + ["--ids", ",".join(map(str, ids)), "--max-tokens", "200", "--temperature", "0",
                                      "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    os.kill(old, signal.SIGKILL)
    out, errs = p.communicate(timeout=120)
    check(p.returncode == 0, "request across the draft's kill -9 failed: %s" % errs[-500:])
    got = json.loads(out.strip().splitlines()[-1]).get("ids", [])
    check(got == ref, "request across the draft's kill -9: first difference at %d" % first_difference(got, ref))
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if sv.pid("draft") != old:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    sv.wait_up()
    # a speculative request makes the coordinator name the new buffer to the
    # target, which closes its mapping of the dead draft's slab first
    check(sv.request(ids, 40, ["--temperature", "0"]) == ref[:40], "after the draft's restart: ids differ")
    if before is None:
        return
    after = None
    for _ in range(20):
        after = gpu_memory_used_mib()
        if after is not None and after <= before + 64:
            break
        time.sleep(0.5)
    check(after is not None and after <= before + 64,
          "GPU memory used %s MiB after the draft's kill -9 and restart, %d MiB before: the dead draft's slab "
          "(or context) was not freed" % (after, before))
    print("%s: draft kill -9: request equal to target-only; GPU memory %d MiB before, %d MiB after"
          % (sv.name, before, after))


def kill_target_check(sv, target):
    """kill -9 of the target: target_unavailable within the worker timeout, then recovery."""
    ids = PROMPTS[0]
    old = sv.pid("target")
    p = subprocess.Popen(sv.client + ["--ids", ",".join(map(str, ids)), "--max-tokens", "1000", "--temperature",
                                      "0", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    t0 = time.time()
    os.kill(old, signal.SIGKILL)
    out, errs = p.communicate(timeout=60)
    waited = time.time() - t0
    check(p.returncode != 0 and "target_unavailable" in out + errs,
          "request when the target died: rc %d, %s %s" % (p.returncode, out[-300:], errs[-300:]))
    check(waited < WORKER_TIMEOUT_MS / 1000.0 + 5, "target_unavailable took %.1f s" % waited)
    sv.wait_up()
    ref = gen(target, ids, 40, BACKEND)["ids"]
    check(sv.request(ids, 40, ["--temperature", "0"]) == ref, "after the target's restart: ids differ")
    print("%s: target kill -9: target_unavailable in %.1f s, then recovery" % (sv.name, waited))


def supervised_checks(d, draft, target):
    runs = variants()
    if BACKEND == "cuda" and not shutil.which("nvidia-cuda-mps-control"):
        # the image may lack the daemon: a visible skip, never a failed stage
        print("SKIP mps: nvidia-cuda-mps-control is not installed")
        runs = [v for v in runs if "mps" not in v[0]]
    refs = {tuple(ids): gen(target, ids, 40, BACKEND)["ids"] for ids in PROMPTS}
    sampled_ref = None
    for name, dkeys, tkeys, skeys in runs:
        sv = Supervised(d, name, draft, target, dkeys, tkeys, skeys)
        agreement = ""
        try:
            sv.start()
            check_transport_logs(sv)
            for ids in PROMPTS:
                for stream in (False, True):
                    got = sv.request(ids, 40, ["--temperature", "0"], stream)
                    check(got == refs[tuple(ids)], "%s greedy %s stream=%s: first difference at %d"
                          % (name, ids, stream, first_difference(got, refs[tuple(ids)])))
            sampled = []
            for ids in SAMPLED_PROMPTS:
                args = ["--temperature", "0.9", "--top-p", "0.95", "--seed", "1234", "--spec-k", "3"]
                a, b = sv.request(ids, 48, args), sv.request(ids, 48, args, stream=True)
                check(a == b and len(a) == 48, "%s: seeded sampling not reproducible: %s vs %s" % (name, a, b))
                sampled.append(a)
            if sampled_ref is None:
                sampled_ref = sampled
            if host_sampler(name):
                # not gated: a draw within rounding of a boundary may differ between host and device
                same = sum(x == y for a, b in zip(sampled, sampled_ref) for x, y in zip(a, b))
                total = sum(len(a) for a in sampled_ref)
                agreement = "; host sampler agrees with the device sampler on %d/%d sampled ids" % (same, total)
            else:
                check(sampled == sampled_ref, "%s: seeded sampled output differs from the POSIX variant's (the q "
                      "rows did not cross intact?): %s vs %s" % (name, sampled, sampled_ref))
            if name in ("cuda_ipc", "posix") and (BACKEND != "cuda" or name == "cuda_ipc"):
                kill_draft_check(sv, target)
                kill_target_check(sv, target)
            check_transport_logs(sv, after_requests=True)
            print("supervised %s: greedy == target-only (streamed and not), seeded sampling reproducible%s%s"
                  % (name, "" if host_sampler(name) else " and equal to posix's", agreement))
            print("pipeline-row: %s PASS greedy == target-only; K=3 seeded sampling reproducible%s%s"
                  % (name, "" if host_sampler(name) else ", == posix", agreement))
        except Fail as e:
            print("pipeline-row: %s FAIL %s" % (name, (str(e).splitlines() or [""])[0][:200]))
            raise Fail("%s%s" % (e, sv.log_tails()))
        finally:
            r = sv.stop()
            if r.returncode != 0:
                print("%s: supervisor stop: %s%s" % (name, r.stdout, r.stderr))


def descendants(pid):
    """Every process below pid (from /proc), children before grandchildren."""
    parent = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                with open("/proc/%s/stat" % e) as f:
                    parent[int(e)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def exe_of(pid):
    try:
        return os.path.realpath("/proc/%d/exe" % pid)
    except OSError:
        return ""


def sanitizer_checks(d, draft, target, procs):
    """compute-sanitizer memcheck on each worker in turn, a short cuda_ipc run."""
    if BACKEND != "cuda":
        return
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        raise Fail("compute-sanitizer not found")
    for role in ("draft", "target"):
        sub = tempfile.mkdtemp(prefix="tandem-san-", dir=d)
        endpoint = "ipc://%s/client.sock" % sub
        cfg = {"instance": "san%s%d" % (role, os.getpid()),
               "coordinator": {"client_endpoint": endpoint, "worker_endpoint": "ipc://%s/workers.sock" % sub,
                               "max_concurrency": 2, "heartbeat_ms": 500, "worker_timeout_ms": 60000, "spec_k": 3},
               "draft_worker": {"model": draft, "backend": "cuda", "device": DEVICE, "max_seq_len": 1024,
                                "shm_transport": "cuda_ipc"},
               "target_worker": {"model": target, "backend": "cuda", "device": DEVICE, "max_seq_len": 1024}}
        path = os.path.join(sub, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        mine = []
        san_log = os.path.join(sub, "sanitizer.log")
        for r in ("coordinator", "target", "draft"):
            cmd = [binary(r), "--config", path]
            if r == role:
                cmd = [tool, "--tool", "memcheck", "--error-exitcode", "99", "--log-file", san_log] + cmd
            log = open(os.path.join(sub, r + ".log"), "w")
            mine.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        procs.extend(mine)
        client = [binary("client"), "--endpoint", endpoint, "--timeout-ms", "600000"]
        deadline = time.time() + 600
        while True:
            r = subprocess.run(client + ["--stats"], capture_output=True, text=True)
            if r.returncode == 0:
                w = json.loads(r.stdout).get("workers", {})
                if w.get("draft", {}).get("up") and w.get("target", {}).get("up"):
                    break
            check(time.time() < deadline, "sanitized %s: workers did not register" % role)
            time.sleep(1)
        for args in (["--temperature", "0"], ["--temperature", "0.9", "--seed", "5"]):
            out = run(client + ["--ids", "1,2,3", "--max-tokens", "12", "--json"] + args, timeout=600)
            check(len(json.loads(out.strip().splitlines()[-1]).get("ids", [])) == 12, "sanitized run: short reply")
        # the sanitized worker itself stops on SIGTERM: the process under
        # compute-sanitizer whose executable is the worker's binary (the
        # sanitizer starts it through a launcher whose command line names the
        # binary too; signalled, the launcher dies, the sanitizer loses the
        # exit code and the worker runs on)
        san = mine[["coordinator", "target", "draft"].index(role)]
        kids = [p for p in descendants(san.pid) if exe_of(p) == os.path.realpath(binary(role))]
        check(len(kids) == 1, "sanitized %s: %d processes under compute-sanitizer run %s"
              % (role, len(kids), binary(role)))
        for k in kids:
            os.kill(k, signal.SIGTERM)
        rc = san.wait(timeout=300)
        for p in mine:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
        text = open(san_log).read() if os.path.exists(san_log) else ""
        logs = "".join("\n---- %s.log ----\n%s" % (r, open(os.path.join(sub, r + ".log")).read()[-1500:])
                       for r in ("coordinator", "target", "draft"))
        check(rc == 0 and "ERROR SUMMARY: 0 errors" in text,
              "compute-sanitizer on the %s worker: exit %d\n%s%s" % (role, rc, text[-3000:], logs))
        print("compute-sanitizer memcheck on the %s worker (cuda_ipc): 0 errors" % role)


def cpu_equals_cuda(models, prompts, n):
    for model in models:
        for ids in prompts:
            cpu = gen(model, ids, n, "cpu")["ids"]
            gpu = gen(model, ids, n, BACKEND)["ids"]
            check(cpu == gpu, "%s %s: cuda ids differ from cpu from position %d"
                  % (model, ids, first_difference(cpu, gpu)))


def runtime_checks(d, draft, target):
    small_d, small_t = make_pair(d, "small-draft", "small", "3")
    cpu_equals_cuda((target, small_t), PROMPTS[:2], 64)

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

    # graphs (docs/cuda-graphs.md) change no token: every kernel launched one
    # by one gives the same ids, target-only and speculative
    for model_d, model_t in ((draft, target), (small_d, small_t)):
        for extra in ((), ("--draft", model_d, "--spec-k", "0")):
            a = gen(model_t, PROMPTS[0], 48, BACKEND, extra)["ids"]
            b = gen(model_t, PROMPTS[0], 48, BACKEND, extra + ("--no-graphs",))["ids"]
            check(a == b, "%s %s: ids with graphs differ from --no-graphs at %d"
                  % (model_t, " ".join(extra) or "target-only", first_difference(a, b)))

    # quantized drafts (matmul_quant.cu) never change the output; an int8
    # target's greedy ids on cuda equal its ids on the cpu for the first
    # tokens at least (the orders differ; the argmax rarely does)
    for q in ("int8", "int4"):
        for ids in PROMPTS[:2]:
            ref = gen(small_t, ids, 48, BACKEND)["ids"]
            for k in (3, 0):
                got = gen(small_t, ids, 48, BACKEND, ("--draft", small_d, "--draft-quantize", q, "--spec-k",
                                                       str(k)))["ids"]
                check(got == ref, "%s draft K=%d %s: speculative ids differ from target-only at %d"
                      % (q, k, ids, first_difference(got, ref)))
        cpu = gen(small_t, PROMPTS[0], 16, "cpu", ("--quantize", q))["ids"]
        gpu = gen(small_t, PROMPTS[0], 16, BACKEND, ("--quantize", q))["ids"]
        check(first_difference(cpu, gpu) >= 8, "%s target: cuda and cpu ids part at %d (%s / %s)"
              % (q, first_difference(cpu, gpu), cpu, gpu))

    # the draft on "another" device: the same GPU named by UUID
    uuid = ""
    if BACKEND == "cuda" and shutil.which("nvidia-smi"):
        uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", DEVICE],
                              capture_output=True, text=True).stdout.strip()
    if uuid:
        got = gen(target, PROMPTS[0], 48, BACKEND, ("--draft", draft, "--draft-device", uuid))["ids"]
        check(got == gen(target, PROMPTS[0], 48, BACKEND)["ids"], "--draft-device %s changed the ids" % uuid)
    print("runtime: cuda == cpu on tiny and small; speculative == target-only on cuda (K 1..8, adaptive, "
          "both modes; int8 and int4 drafts); graphs == --no-graphs; int8/int4 targets agree with cpu; "
          "--draft-device by UUID")


# The parts run_gpu_tests.sh runs as steps of its stages; "all" (ctest) runs each.
PARTS = ("smoke", "runtime", "pipeline", "sanitize")


def test(d, procs, part):
    draft, target = make_pair(d, "tiny-draft", "tiny", "1")
    ok, why = gpu_usable(target)
    if not ok:
        print("SKIPPED: no usable GPU: %s" % why)
        sys.exit(77)
    if part in ("smoke", "all"):
        cpu_equals_cuda((target,), PROMPTS[:1], 32)
        print("smoke: tandem-generate --backend %s on tiny == the CPU backend over 32 tokens" % BACKEND)
    if part in ("runtime", "all"):
        runtime_checks(d, draft, target)
    if part in ("pipeline", "all"):
        pipeline_check(d, draft, target, procs)
        supervised_checks(d, draft, target)
        print("pipeline: with both workers on the GPU == target-only; 16 concurrent batched requests == "
              "their target-only runs; supervised over %s; draft and target kill -9 recovery"
              % ", ".join(v[0] for v in variants()))
    if part in ("sanitize", "all"):
        sanitizer_checks(d, draft, target, procs)
    print("PASS (%s)" % part)


def main():
    if not BUILD:
        print("TANDEM_BUILD_DIR is not set")
        sys.exit(1)
    part = "all"
    if len(sys.argv) == 3 and sys.argv[1] == "--part" and sys.argv[2] in PARTS:
        part = sys.argv[2]
    elif len(sys.argv) != 1:
        print("usage: %s [--part %s]" % (sys.argv[0], "|".join(PARTS)))
        sys.exit(2)
    d = tempfile.mkdtemp(prefix="tandem-gpu-")
    procs = []
    status = 0
    try:
        test(d, procs, part)
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
