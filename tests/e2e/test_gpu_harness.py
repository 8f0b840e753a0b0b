#!/usr/bin/python3
"""tests/gpu/run_gpu_tests.sh's stage logic, on a machine without a GPU, against
stand-in nvidia-smi programs (the GPU run itself needs a lent GPU machine):

- --plan prints one "STAGE <name> <budget_s>" line per stage, in the order smoke,
  correctness, pipeline, sanitize, bench, every budget at most 420 s, and exits 0;
- no nvidia-smi at all, and one that lists no GPU: --stage smoke prints exactly one
  line on stdout, starting "no GPU: ", and exits 77;
- a stand-in that lists a GPU where none works: the smoke stage runs, the GPU tests'
  exit 77 ("no usable GPU") is recorded as FAIL (never a skip where nvidia-smi lists
  a GPU), --out receives smoke.json (stage, status FAIL, budget_s, elapsed_s, one
  entry per step) and summary.txt, and the exit status is 1;
- a stage whose budget is spent marks the steps it could not start as FAIL ("not
  run"), never leaves them out;
- an unknown stage and a missing --stage are usage errors (exit 2).
"""
import json
import os
import subprocess
import sys
import tempfile

SRC = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("TANDEM_BUILD_DIR", "")
HARNESS = os.path.join(SRC, "tests", "gpu", "run_gpu_tests.sh")
STAGES = ["smoke", "correctness", "pipeline", "sanitize", "bench"]


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def stand_in(d, name, lists_gpu):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
        if lists_gpu:
            f.write('case "$1" in -L) echo "GPU 0: Stand-in GPU (UUID: GPU-00000000-0000-0000-0000-'
                    '000000000000)";; *) echo "name, uuid"; echo "Stand-in GPU, GPU-0";; esac\n')
        else:
            f.write('echo "No devices were found"; exit 6\n')
    os.chmod(path, 0o755)
    return path


def harness(args, env_extra, timeout=300):
    env = dict(os.environ)
    # no real nvidia-smi on PATH for these runs
    env["PATH"] = "/usr/bin:/bin"
    env.update(env_extra)
    return subprocess.run([HARNESS] + args, capture_output=True, text=True, env=env, timeout=timeout)


def test(d):
    r = harness(["--plan"], {})
    check(r.returncode == 0, "--plan exited %d: %s" % (r.returncode, r.stderr))
    lines = r.stdout.strip().splitlines()
    check([l.split()[1] for l in lines] == STAGES, "--plan stages: %s" % lines)
    for l in lines:
        parts = l.split()
        check(len(parts) == 3 and parts[0] == "STAGE" and parts[2].isdigit() and 0 < int(parts[2]) <= 420,
              "--plan line %r" % l)

    r = harness(["--stage", "smoke"], {"NVIDIA_SMI": os.path.join(d, "absent")})
    check(r.returncode == 77, "no nvidia-smi: exit %d" % r.returncode)
    check(len(r.stdout.splitlines()) == 1 and r.stdout.startswith("no GPU: "),
          "no nvidia-smi: stdout %r" % r.stdout)
    r = harness(["--stage", "smoke"], {"NVIDIA_SMI": stand_in(d, "smi-none", False)})
    check(r.returncode == 77 and r.stdout == "no GPU: nvidia-smi lists no GPU\n",
          "nvidia-smi listing no GPU: exit %d, stdout %r" % (r.returncode, r.stdout))

    r = harness(["--stage", "nosuch"], {})
    check(r.returncode == 2 and "no stage 'nosuch'" in r.stderr, "unknown stage: exit %d %s"
          % (r.returncode, r.stderr))
    r = harness([], {})
    check(r.returncode == 2, "no --stage: exit %d" % r.returncode)

    listed = stand_in(d, "smi-listed", True)
    out = os.path.join(d, "out")
    r = harness(["--stage", "smoke", "--build", BUILD, "--out", out, "--logs", os.path.join(d, "logs")],
                {"NVIDIA_SMI": listed})
    check(r.returncode == 1, "a listed GPU that does not work: exit %d\n%s%s" % (r.returncode, r.stdout, r.stderr))
    with open(os.path.join(out, "smoke.json")) as f:
        res = json.load(f)
    check(res["stage"] == "smoke" and res["status"] == "FAIL" and res["budget_s"] == 120,
          "smoke.json: %s" % res)
    steps = {s["name"]: s for s in res["steps"]}
    check("ops vs cpu, small shapes" in steps and steps["ops vs cpu, small shapes"]["status"] == "FAIL",
          "smoke.json steps: %s" % res["steps"])
    check(all(s["status"] != "SKIP" for s in res["steps"]), "a step skipped where a GPU is listed: %s"
          % res["steps"])
    gen = steps.get("generate tiny: cuda == cpu", {})
    check(gen.get("status") == "FAIL" and "exit 77" in gen.get("detail", ""),
          "the one-token cuda run's exit 77 is not a FAIL naming it: %s" % gen)
    check(os.path.exists(os.path.join(out, "summary.txt")), "no summary.txt")

    # a stage whose budget is spent: the steps it cannot start are FAIL rows
    out2 = os.path.join(d, "out2")
    r = harness(["--stage", "smoke", "--max-stage-s", "1", "--build", BUILD, "--out", out2],
                {"NVIDIA_SMI": listed})
    with open(os.path.join(out2, "smoke.json")) as f:
        res = json.load(f)
    check(r.returncode == 1 and res["budget_s"] == 1 and len(res["steps"]) == 4 and
          all(s["status"] == "FAIL" and s["detail"].startswith("not run") for s in res["steps"]),
          "a spent budget: %s" % res)
    print("PASS: --plan; no GPU -> one line, exit 77; a listed GPU that fails -> FAIL rows, smoke.json, "
          "exit 1; a spent budget -> 'not run' FAIL rows; usage errors exit 2")


def main():
    if not BUILD:
        print("FAIL: TANDEM_BUILD_DIR is not set")
        sys.exit(1)
    with tempfile.TemporaryDirectory(prefix="tandem-harness-") as d:
        try:
            test(d)
        except Fail as e:
            print("FAIL: %s" % e)
            sys.exit(1)


if __name__ == "__main__":
    main()
