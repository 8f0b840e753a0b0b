#!/usr/bin/python3
"""Token trees from the model-free sources, greedy, through the server's
scheduler in process (issue 61): tandem-bench-tree-sources decodes a 3-turn
agent-like conversation on the trained target with target-only, chains and
trees (spec_tree budgets) from the suffix cache, n-grams and "auto", and
exits 1 when any output differs from target-only's. Here: it exits 0, says
so, and trees were really verified (some of the n-gram and auto rounds went
as trees, and their drafts were accepted: more than one token a round), so
the equality is not that of empty drafts."""
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
        parts = line.rsplit(None, 6)
        if len(parts) == 7 and not line.startswith(("#", "method")):
            rows[parts[0]] = (float(parts[2]), float(parts[3]), float(parts[4]))
    for name in ("ngram tree 8", "ngram tree 16", "suffix tree 16", "auto tree 16", "ngram chain 4"):
        if name not in rows:
            print("FAIL: no line for %s:\n%s" % (name, r.stdout))
            sys.exit(1)
    for name in ("ngram tree 16", "auto tree 16"):
        tokens, verified, tree_share = rows[name]
        if not (tree_share > 0 and verified > tokens and tokens > 1.1):
            print("FAIL: %s: %.2f of its rounds went as trees, %.2f rows verified and %.2f tokens "
                  "taken a round: the trees were not exercised\n%s" % (name, tree_share, verified, tokens,
                                                                         r.stdout))
            sys.exit(1)
    print(r.stdout)
    print("PASS")


if __name__ == "__main__":
    main()
