#!/usr/bin/env bash
# The main job: builds Tandem, generates the `small` model pair (a derived
# draft a third of the target's size, real Llama 3 tokenizer), starts the
# three processes under the supervisor, sends one streamed chat request,
# prints the text, the acceptance rate and tokens/s next to a target-only
# run of the same request, and stops everything.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"

build="$root/build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=AUTO >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
bin="$build"
models="${TANDEM_DEMO_MODELS:-$root/models}"
draft="$models/small-draft"
target="$models/small"
# The noise that separates target from draft sets the acceptance rate; 0.01
# gives an agreement in the range of a real 1B/3B pair.
noise="${TANDEM_DEMO_NOISE:-0.01}"
if [[ ! -f $draft/model.safetensors ]]; then
  "$bin/tools/make_model/tandem-make-model" --preset small-draft --seed 1 --out "$draft" --force
fi
if [[ ! -f $target/model.safetensors ]]; then
  "$bin/tools/make_model/tandem-make-model" --preset small --derive-from "$draft" --noise "$noise" \
    --seed 2 --out "$target" --force
fi

instance="demo$$"
port="${TANDEM_DEMO_PORT:-5555}"
endpoint="tcp://127.0.0.1:$port"
run_dir=$(mktemp -d /tmp/tandem-demo-XXXXXX)
# Each worker may use every core (2 threads here): drafting and verification
# mostly alternate, and an idle pool sleeps after a short spin.
cat > "$run_dir/demo-config.json" <<JSON
{
  "instance": "$instance",
  "coordinator": {"client_endpoint": "$endpoint", "max_concurrency": 2,
                  "worker_endpoint": "ipc://$run_dir/workers"},
  "draft_worker": {"model": "$draft", "backend": "cpu", "threads": 2, "max_seq_len": 2048},
  "target_worker": {"model": "$target", "backend": "cpu", "threads": 2, "max_seq_len": 2048}
}
JSON
export TANDEM_BIN_DIR="$bin" TANDEM_RUN_DIR="$run_dir/run"
supervisor="$root/deploy/tandem-supervisor"
stop_all() { "$supervisor" stop --config "$run_dir/demo-config.json" >/dev/null 2>&1 || true; rm -rf "$run_dir"; }
trap stop_all EXIT

"$supervisor" start --config "$run_dir/demo-config.json"
client="$bin/client/tandem-client"
# Wait until both workers have registered.
for _ in $(seq 1 120); do
  if "$client" --endpoint "$endpoint" --stats --timeout-ms 1000 2>/dev/null |
       python3 -c 'import json,sys; s=json.load(sys.stdin); w=s.get("workers",{}); sys.exit(0 if w.get("target",{}).get("up") and w.get("draft",{}).get("up") else 1)' 2>/dev/null; then
    break
  fi
  sleep 0.5
done

question="${TANDEM_DEMO_PROMPT:-Write a short poem about two bicycles riding in tandem.}"
max_tokens="${TANDEM_DEMO_MAX_TOKENS:-96}"
echo
echo "== request (greedy, streamed through coordinator, draft worker, target worker) =="
echo "user: $question"
echo -n "assistant: "
"$client" --endpoint "$endpoint" --chat "$question" --max-tokens "$max_tokens" --temperature 0 --stream
echo
"$client" --endpoint "$endpoint" --chat "$question" --max-tokens "$max_tokens" --temperature 0 --json > "$run_dir/pipeline.json"
"$client" --endpoint "$endpoint" --stats > "$run_dir/stats.json"
"$bin/tools/generate/tandem-generate" --model "$target" --chat "$question" --max-tokens "$max_tokens" \
  --threads 2 --temperature 0 --json > "$run_dir/target-only.json"
"$bin/tools/generate/tandem-generate" --model "$target" --draft "$draft" --chat "$question" \
  --max-tokens "$max_tokens" --threads 2 --temperature 0 --json > "$run_dir/in-process.json"
python3 - "$run_dir" <<'PY'
import json, sys
d = sys.argv[1]
p = json.load(open(d + "/pipeline.json"))
t = json.load(open(d + "/target-only.json"))
s = json.load(open(d + "/in-process.json"))
st = json.load(open(d + "/stats.json"))
print("== figures (same request, greedy; this machine's cores are shared by whatever runs) ==")
print(f"pipeline (3 processes, draft and target 2 threads each, on the same cores):")
print(f"                          {p['tokens_per_s']:8.2f} tokens/s  acceptance {p['acceptance_rate']:.3f}  "
      f"{p['mean_accepted_per_round']:.2f} accepted/round  pre-drafts used {p.get('predraft_used', 0)}/{p.get('predraft_offered', 0)}")
tm, sp = st["time_ms"], st["spec"]
print(f"                          {sp['num_drafts']} of {sp['rounds']} rounds drafted (both requests); "
      f"the target waited {tm['draft_wait_per_round']:.1f} ms for the draft per round with drafts")
print(f"speculative, in-process (1 process, 2 threads):")
print(f"                          {s['tokens_per_s']:8.2f} tokens/s  acceptance {s['acceptance_rate']:.3f}")
print(f"target-only (1 process, 2 threads):")
print(f"                          {t['tokens_per_s']:8.2f} tokens/s")
same = "identical" if p["ids"] == t["ids"] else "DIFFERENT"
print(f"pipeline output vs target-only output: {same} ({len(p['ids'])} tokens)")
print(f"speedup vs target-only: pipeline {p['tokens_per_s'] / t['tokens_per_s']:.2f}x, "
      f"in-process {s['tokens_per_s'] / t['tokens_per_s']:.2f}x")
sys.exit(0 if p["ids"] == t["ids"] else 1)
PY
