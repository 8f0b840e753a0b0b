#!/usr/bin/python3
"""The documented clients work against a running pipeline: the Python
example (client/examples/generate.py) and the tandem-client CLI (--json with
the fields of tandem-generate --json, --stream, --stats, --prometheus) give the
target-only greedy ids."""
import json
import os
import re
import subprocess
import sys

from tandem_e2e import Pipeline, binary, check, main, reference


def test():
    src = os.environ.get("TANDEM_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    p = Pipeline("examples")
    draft, target = p.make_pair()
    p.start_all()
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    ref = reference(target, ids, 20)

    r = subprocess.run([sys.executable, os.path.join(src, "client/examples/generate.py"), "--endpoint", p.endpoint,
                        "--ids", ",".join(map(str, ids)), "--max-tokens", "20"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(r.returncode == 0, "generate.py: %d %s" % (r.returncode, r.stderr))
    m = re.search(r"ids (\[[0-9, ]*\])\]", r.stdout)
    check(m is not None and json.loads(m.group(1)) == ref["ids"], "generate.py output: %s" % r.stdout)

    cli = [binary("client"), "--endpoint", p.endpoint, "--timeout-ms", "60000"]
    r = subprocess.run(cli + ["--ids", ",".join(map(str, ids)), "--max-tokens", "20", "--temperature", "0", "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(r.returncode == 0, "tandem-client --json: %d %s" % (r.returncode, r.stderr))
    out = json.loads(r.stdout)
    check(out["ids"] == ref["ids"], "tandem-client ids %s != %s" % (out["ids"], ref["ids"]))
    check(out["text"] == ref["text"], "tandem-client text %r != %r" % (out["text"], ref["text"]))
    for key in ("ids", "text", "prompt_tokens", "generated_tokens", "prefill_ms", "decode_ms", "tokens_per_s",
                "acceptance_rate", "rounds", "mean_accepted_per_round", "draft_ms", "verify_ms", "queue_ms",
                "total_ms"):
        check(key in out, "tandem-client --json lacks %s" % key)

    r = subprocess.run(cli + ["--ids", ",".join(map(str, ids)), "--max-tokens", "20", "--temperature", "0",
                              "--stream"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    check(r.returncode == 0 and r.stdout == ref["text"] + "\n", "streamed text %r != %r" % (r.stdout, ref["text"]))

    r = subprocess.run(cli + ["--stats"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    check(r.returncode == 0 and json.loads(r.stdout)["requests"]["finished"] == 3, "--stats: %s" % r.stdout)
    r = subprocess.run(cli + ["--stats", "--prometheus"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    check(r.returncode == 0 and "tandem_spec_decode_num_draft_tokens_total" in r.stdout, "--prometheus: %s" % r.stdout)
    p.close()


if __name__ == "__main__":
    main(test)
