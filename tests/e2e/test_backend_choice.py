#!/usr/bin/python3
"""Choosing a backend: every program that loads a model takes `--backend cpu|cuda`
(`backend`/`device` in a worker's config section). Where no GPU can be used, asking
for cuda gives one clear line and a clean exit, never a crash: tandem-generate exits 1,
a worker exits 78 (a config error: the supervisor does not restart it). An unknown
backend is named in the refusal. On a machine with a usable GPU the cuda runs are left
to tests/gpu (this test checks the refusal only where there is something to refuse)."""
import os
import subprocess

from tandem_e2e import Pipeline, binary, check, main, reference


def cuda_usable(model):
    r = subprocess.run([binary("generate"), "--model", model, "--ids", "1,2", "--max-tokens", "1",
                        "--backend", "cuda"], capture_output=True, text=True, timeout=120)
    return r.returncode == 0


def one_line_refusal(r, needle, what):
    check(r.returncode == 1, "%s: exit %d, expected 1 (stderr %r)" % (what, r.returncode, r.stderr))
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    check(len(lines) == 1, "%s: expected one line on stderr, got %r" % (what, r.stderr))
    check(needle in lines[0], "%s: %r lacks %r" % (what, lines[0], needle))
    check(r.stdout == "", "%s: printed %r" % (what, r.stdout))


def test():
    p = Pipeline("backend")
    draft, target = p.make_pair()

    # The cpu backend by name is the default's output, token for token.
    ref = reference(target, [5, 6, 7], 8)["ids"]
    named = reference(target, [5, 6, 7], 8, extra=("--backend", "cpu"))["ids"]
    check(named == ref, "--backend cpu gave %s, the default %s" % (named, ref))

    r = subprocess.run([binary("generate"), "--model", target, "--ids", "1,2", "--backend", "tpu"],
                       capture_output=True, text=True, timeout=120)
    one_line_refusal(r, 'backend "tpu": must be "cpu" or "cuda"', "unknown backend")

    if cuda_usable(target):
        print("a usable GPU is visible: the refusal cases are skipped (tests/gpu covers cuda)")
        return
    for extra in ((), ("--draft", draft), ("--device", "GPU-00000000-0000-0000-0000-000000000000")):
        r = subprocess.run([binary("generate"), "--model", target, "--ids", "1,2", "--backend", "cuda"]
                           + list(extra), capture_output=True, text=True, timeout=120)
        one_line_refusal(r, "backend cuda", "generate --backend cuda %s" % " ".join(extra))

    # A worker asked for cuda without a GPU: exit 78 with the reason in its log.
    p.config["target_worker"]["backend"] = "cuda"
    p.start("coordinator")
    t = p.start("target")
    try:
        rc = t.wait(timeout=60)
    except subprocess.TimeoutExpired:
        rc = None
    log = open(p.logs["target"]).read()
    check(rc == 78, "target worker with backend cuda and no GPU: exit %s, expected 78; log:\n%s" % (rc, log))
    check("backend cuda" in log, "the target's log does not say why: %s" % log)
    check("Sanitizer" not in log and "core dumped" not in log, "the target crashed: %s" % log)


if __name__ == "__main__":
    main(test)
