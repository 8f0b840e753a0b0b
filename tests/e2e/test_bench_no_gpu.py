#!/usr/bin/python3
"""tandem-bench --backend cuda where no GPU can be used: one line on stderr starting
"no GPU: " (the reason after it), nothing on stdout, exit 77, and nothing left behind
(no models directory made, no model generated): never a crash, never a half-printed
table. Checked for runtime, spec and batch, and for a device named by UUID. On a
machine with a GPU (nvidia-smi lists one) this test skips: tests/gpu/run_gpu_tests.sh
runs the benchmark itself there."""
import os
import shutil
import subprocess
import sys
import tempfile

BUILD = os.environ.get("TANDEM_BUILD_DIR", "")
BENCH = os.path.join(BUILD, "tools/bench/tandem-bench")


def gpu_listed():
    if not shutil.which("nvidia-smi"):
        return False
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0 and any(l.startswith("GPU") for l in r.stdout.splitlines())


def main():
    if not BUILD or not os.access(BENCH, os.X_OK):
        print("FAIL: %s is not built (set TANDEM_BUILD_DIR)" % BENCH)
        sys.exit(1)
    if gpu_listed():
        print("a GPU is listed: skipped (tests/gpu/run_gpu_tests.sh runs the cuda benchmark)")
        sys.exit(77)
    failures = []
    d = tempfile.mkdtemp(prefix="tandem-bench-nogpu-")
    try:
        models = os.path.join(d, "models")
        cases = (["runtime", "--presets", "small"], ["spec"], ["batch"],
                 ["runtime", "--device", "GPU-00000000-0000-0000-0000-000000000000"])
        for args in cases:
            cmd = [BENCH] + args + ["--backend", "cuda", "--models", models, "--tokens", "4"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=d)
            what = " ".join(args)
            lines = [l for l in r.stderr.splitlines() if l.strip()]
            if r.returncode != 77:
                failures.append("%s: exit %d, expected 77 (stderr %r)" % (what, r.returncode, r.stderr[-1000:]))
            elif len(lines) != 1 or not lines[0].startswith("no GPU: ") or len(lines[0]) <= len("no GPU: "):
                failures.append("%s: expected one line \"no GPU: <reason>\" on stderr, got %r" % (what, r.stderr))
            elif r.stdout:
                failures.append("%s: printed %r on stdout" % (what, r.stdout))
            elif os.path.exists(models):
                failures.append("%s: made %s without a GPU" % (what, models))
            else:
                print("ok: %s -> exit 77, %s" % (what, lines[0]))
        # the refusal is cuda's alone: an unknown backend is a usage error
        r = subprocess.run([BENCH, "runtime", "--backend", "tpu"], capture_output=True, text=True,
                           timeout=60, cwd=d)
        if r.returncode != 2 or "--backend" not in r.stderr:
            failures.append("--backend tpu: exit %d, stderr %r (expected 2 naming --backend)"
                            % (r.returncode, r.stderr))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("PASS")


if __name__ == "__main__":
    main()
