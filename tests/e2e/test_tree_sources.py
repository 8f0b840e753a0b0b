#!/usr/bin/python3
"""Token trees from the model-free sources, greedy, in process (issue 61):
tandem-bench-tree-sources decodes a 3-turn agent-like conversation on the
trained target with target-only, chains and trees from the suffix cache and
n-grams, and a mixed tree, and exits 1 when any output differs from
target-only's. Here: it exits 0, says so, and the trees were really verified
(the n-gram trees put several rows a round through the target and accept
more than one token a round), so the equality is not that of empty drafts."""
import os
import subprocess
import sys

BUILD = os.environ.get("TANDEM_BUILD_DIR", "")
SRC = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(BUILD, "tools/bench/tandem-bench-tree-sources")


def main():
    if not BUILD or not os.access(TOOL, os.X_OK):
        print("FAIL: %s is not built (set TANDEM_BUILD_DIR)" % TOOL)
        sys.exit(1)
    r = subprocess.run([TOOL, "--model", os.path.join(SRC, "models/trained/target"), "--turns", "3",
                        "--gen", "32", "--reps", "1", "--threads", "1"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 or "every output == target-only" not in r.stdout:
        print("FAIL: exit %d\n%s\n%s" % (r.returncode, r.stdout, r.stderr[-2000:]))
        sys.exit(1)
    rows = {}
    for line in r.stdout.splitlines():
        parts = line.rsplit(None, 5)
        if len(parts) == 6 and not line.startswith(("#", "method")):
            rows[parts[0]] = (float(parts[2]), float(parts[3]))
    for name in ("ngram tree 8", "ngram tree 16", "suffix tree 16", "mixed tree 16", "ngram chain 4"):
        if name not in rows:
            print("FAIL: no line for %s:\n%s" % (name, r.stdout))
            sys.exit(1)
    for name in ("ngram tree 16", "mixed tree 16"):
        tokens, verified = rows[name]
        if not (verified > 2.0 and tokens > 1.1):
            print("FAIL: %s verified %.2f rows and took %.2f tokens a round: the trees were not "
                  "exercised\n%s" % (name, verified, tokens, r.stdout))
            sys.exit(1)
    print(r.stdout)
    print("PASS")


if __name__ == "__main__":
    main()
