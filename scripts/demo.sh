#!/usr/bin/env bash
# The main job: builds Tandem, takes the trained model pair committed in
# models/trained (tools/train: a 4.07M-parameter target and a draft distilled
# from it, with their own byte-level BPE tokenizer), starts the three
# processes under the supervisor, sends one streamed chat request, prints the
# text, then compares the same request through the pipeline (drafted by the
# draft model, and by n-grams of the request alone), in-process speculative
# and target-only (interleaved runs, medians), serves it once more drafted
# from the suffix cache, and stops everything.
# TANDEM_DEMO_PAIR=small runs the random `small` pair instead (generated:
# Llama 3's vocabulary and a draft a third of the target's size, the speed
# figures at a larger size; its text is noise and its agreement is set by
# --noise).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh"

build="$root/build"
# The demo builds the programs it runs (cmake --build build makes the rest),
# and the CUDA backend only where a GPU is listed: nvcc compiling kernels
# that nothing here would run takes minutes of a fresh two-core machine's
# first run (the test command still compiles them: CI must).
cuda=OFF
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  cuda=AUTO
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA="$cuda" >/dev/null
cmake --build "$build" -j"$(nproc)" --target tandem-coordinator tandem-draft-worker \
  tandem-target-worker tandem-client tandem-generate tandem-make-model >/dev/null
bin="$build"
pair="${TANDEM_DEMO_PAIR:-trained}"
case "$pair" in
trained)
  draft="$root/models/trained/draft"
  target="$root/models/trained/target"
  for m in "$draft" "$target"; do
    if [[ ! -f $m/model.safetensors ]]; then
      echo "demo: $m/model.safetensors missing (the trained pair is committed; see tools/train)" >&2
      exit 1
    fi
  done
  ;;
small)
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
  ;;
*)
  echo "demo: TANDEM_DEMO_PAIR: expected trained or small, got '$pair'" >&2
  exit 2
  ;;
esac

instance="demo$$"
port="${TANDEM_DEMO_PORT:-5555}"
endpoint="tcp://127.0.0.1:$port"
run_dir=$(mktemp -d /tmp/tandem-demo-XXXXXX)
# Each worker may use every core (2 threads here): drafting and verification
# mostly alternate, and an idle pool sleeps after a short spin.
cat > "$run_dir/demo-config.json" <<JSON
{
  "instance": "$instance",
  "coordinator": {"client_endpoint": "$endpoint", "max_concurrency": 2, "spec_k_max": 7,
                  "worker_endpoint": "ipc://$run_dir/workers"},
  "draft_worker": {"model": "$draft", "backend": "cpu", "threads": 2, "max_seq_len": 2048},
  "target_worker": {"model": "$target", "backend": "cpu", "threads": 2, "max_seq_len": 2048}
}
JSON
export TANDEM_BIN_DIR="$bin" TANDEM_RUN_DIR="$run_dir/run"
supervisor="$root/deploy/tandem-supervisor"
stop_all() { "$supervisor" stop --config "$run_dir/demo-config.json" >/dev/null 2>&1 || true; rm -rf "$run_dir"; }
trap stop_all EXIT

# --wait: back once both workers have registered, so the first request is served
"$supervisor" start --wait 300 --config "$run_dir/demo-config.json"
client="$bin/client/tandem-client"

question="${TANDEM_DEMO_PROMPT:-Write a short poem about two bicycles riding in tandem.}"
max_tokens="${TANDEM_DEMO_MAX_TOKENS:-96}"
echo
echo "== request to the $pair pair (greedy, streamed through coordinator, draft worker, target worker) =="
echo "user: $question"
echo -n "assistant: "
"$client" --endpoint "$endpoint" --chat "$question" --max-tokens "$max_tokens" --temperature 0 --stream
echo
# The three ways run interleaved, three times each, and the medians are
# compared: run one after the other once, a shift in what else the cores do
# moved the ratios by tens of percent.
rounds="${TANDEM_DEMO_ROUNDS:-3}"
for i in $(seq 1 "$rounds"); do
  "$client" --endpoint "$endpoint" --chat "$question" --max-tokens "$max_tokens" --temperature 0 \
    --draft model --json > "$run_dir/pipeline-$i.json"
  "$client" --endpoint "$endpoint" --chat "$question" --max-tokens "$max_tokens" --temperature 0 \
    --draft ngram --json > "$run_dir/ngram-$i.json"
  "$bin/tools/generate/tandem-generate" --model "$target" --chat "$question" --max-tokens "$max_tokens" \
    --threads 2 --temperature 0 --json > "$run_dir/target-only-$i.json"
  "$bin/tools/generate/tandem-generate" --model "$target" --draft "$draft" --chat "$question" \
    --max-tokens "$max_tokens" --threads 2 --temperature 0 --json > "$run_dir/in-process-$i.json"
done
# The same request once more with the default draft source ("auto"): it was
# served before, so the suffix cache drafts it from the earlier output.
"$client" --endpoint "$endpoint" --chat "$question" --max-tokens "$max_tokens" --temperature 0 \
  --json > "$run_dir/repeat.json"
"$client" --endpoint "$endpoint" --stats > "$run_dir/stats.json"
python3 - "$run_dir" "$rounds" <<'PY'
import json, statistics, sys
d, n = sys.argv[1], int(sys.argv[2])
load = lambda name: [json.load(open(f"{d}/{name}-{i}.json")) for i in range(1, n + 1)]
ps, ts, ss, ns = load("pipeline"), load("target-only"), load("in-process"), load("ngram")
st = json.load(open(d + "/stats.json"))
med = lambda runs, key: statistics.median(r[key] for r in runs)
rates = lambda runs: " ".join(f"{r['tokens_per_s']:.1f}" for r in runs)
p_tps, t_tps, s_tps = med(ps, "tokens_per_s"), med(ts, "tokens_per_s"), med(ss, "tokens_per_s")
print(f"== figures (same request, greedy, {n} interleaved runs each, medians; "
      "this machine's cores are shared by whatever runs) ==")
print(f"pipeline (3 processes, draft and target 2 threads each, on the same cores):")
print(f"                          {p_tps:8.2f} tokens/s  (runs: {rates(ps)})  acceptance "
      f"{med(ps, 'acceptance_rate'):.3f}  {med(ps, 'mean_accepted_per_round'):.2f} accepted/round")
tm, sp = st["time_ms"], st["spec"]
print(f"                          {sp['num_drafts']} of {sp['rounds']} rounds drafted (all requests); "
      f"the target waited {tm['draft_wait_per_round']:.1f} ms for the draft per round with drafts; "
      f"pre-drafts used {sum(r.get('predraft_used', 0) for r in ps)}/"
      f"{sum(r.get('predraft_offered', 0) for r in ps)}")
wk = st.get("workers", {})
print(f"                          draft and target "
      f"{'share the cores (more threads than cores): no pre-drafts' if wk.get('cores_shared') else 'have cores enough'}; "
      f"{sp.get('plain_run_steps', 0)} plain rounds went to the target in {sp.get('plain_runs', 0)} runs "
      f"(one trip through the coordinator a run); {sp.get('verify_beside_draft', 0)} verifications sent with their drafts")
print(f"pipeline drafted by n-grams of the request alone (draft ngram, no draft model):")
print(f"                          {med(ns, 'tokens_per_s'):8.2f} tokens/s  acceptance "
      f"{med(ns, 'acceptance_rate'):.3f}  {med(ns, 'mean_accepted_per_round'):.2f} accepted/round")
print(f"speculative, in-process (1 process, 2 threads):")
print(f"                          {s_tps:8.2f} tokens/s  (runs: {rates(ss)})  acceptance "
      f"{med(ss, 'acceptance_rate'):.3f}")
print(f"target-only (1 process, 2 threads):")
print(f"                          {t_tps:8.2f} tokens/s  (runs: {rates(ts)})")
same = all(p["ids"] == t["ids"] for p in ps + ns for t in ts)
print(f"pipeline output vs target-only output: {'identical' if same else 'DIFFERENT'} "
      f"({len(ps[0]['ids'])} tokens, every run)")
print(f"speedup vs target-only (medians): pipeline {p_tps / t_tps:.2f}x, in-process {s_tps / t_tps:.2f}x")
rep = json.load(open(d + "/repeat.json"))
print(f"the same request served again (draft auto: the suffix cache), through the pipeline:")
print(f"                          {rep['tokens_per_s']:8.2f} tokens/s  {rep['tokens_per_s'] / t_tps:.2f}x target-only  "
      f"acceptance {rep['acceptance_rate']:.3f}  {rep['mean_accepted_per_round']:.2f} accepted/round  "
      f"(suffix-cache tokens accepted, all requests: {sp.get('suffix_accepted_tokens', 0)})")
same = same and rep["ids"] == ts[0]["ids"]
sys.exit(0 if same else 1)
PY
