#!/usr/bin/env bash
# Writes models/trained/expected.json: the trained target's greedy answer to
# the demo's question through tandem-generate (target-only), the text
# tests/e2e/test_trained_pair.py holds every later build and weight file to.
# Run it after training, or after a change that is meant to change the
# answer (and say why in the commit).
#   tools/train/expected.sh [BUILD_DIR]   (default build/)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build="${1:-$root/build}"
gen="$build/tools/generate/tandem-generate"
if [[ ! -x $gen ]]; then
  echo "expected.sh: $gen not built" >&2
  exit 1
fi
dest="$root/models/trained"
prompt="Write a short poem about two bicycles riding in tandem."
max_tokens=64
"$gen" --model "$dest/target" --chat "$prompt" --max-tokens "$max_tokens" --temperature 0 \
  --threads 1 --json > "$dest/.expected.raw"
/usr/bin/python3 - "$dest" "$prompt" "$max_tokens" <<'PY'
import json, sys
dest, prompt, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(f"{dest}/.expected.raw"))
cfg = json.load(open(f"{dest}/target/config.json"))
eos = cfg["eos_token_id"] if isinstance(cfg["eos_token_id"], list) else [cfg["eos_token_id"]]
# tandem-generate stops at an end token and keeps it among the ids
finish = "stop" if r["ids"] and r["ids"][-1] in eos else "length"
out = {"prompt": prompt, "max_tokens": max_tokens, "ids": r["ids"], "text": r["text"],
       "finish_reason": finish}
with open(f"{dest}/expected.json", "w", encoding="utf-8") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(r["text"])
PY
rm -f "$dest/.expected.raw"
