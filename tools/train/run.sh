#!/usr/bin/env bash
# Trains the model pair committed in models/trained, from nothing, as it was
# trained: corpus, tokenizer, target (beside it the draft's own pretraining),
# the draft's distillation from the target (the second pair, commit 8feaf56),
# then the third round: both models continued from there on a mix of the
# corpus and a chat set shaped for the demo's kind of question (build_tune.py).
# Then the held-out slice and the PyTorch perplexities the tests hold Tandem to,
# and, with Tandem built (build/), the committed greedy answer (expected.json).
#   tools/train/run.sh [WORK_DIR]     (default /tmp/tandem-train)
#   SECOND_PAIR=DIR tools/train/run.sh [WORK_DIR]
#       the third round alone, from the second pair's target/ and draft/ in DIR
#       (git show 8feaf56:models/trained/...; the corpus and tokenizer are rebuilt:
#       about 2 minutes)
# Needs Debian's python3-torch, python3-numpy, python3-regex, fortunes,
# fortunes-min and libopenblas0-pthread; about 160 minutes on 2 cores shared at a
# load average of 7 to 14 (the committed runs: second pair 80 min, target 61 and
# distillation 19; third round 74 min, target 57 and distillation 16.5).
# The learning rates hold their peak, then decay (warm-up-stable-decay); the
# committed run chose each decay's start while it ran (train.py: <out>/NAME.decay),
# the steps below repeat it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work="${1:-/tmp/tandem-train}"
py=/usr/bin/python3 # Debian's Python: the one python3-torch is built for
out="$work/out"
dest="$root/models/trained"
t="$root/tools/train"
mkdir -p "$work"
start=$(date +%s)
"$py" "$t/build_corpus.py" --out "$work/corpus"
args=(--corpus "$work/corpus" --work "$work" --out "$out")
"$py" "$t/train.py" tokenizer "${args[@]}"
if [[ -z ${SECOND_PAIR:-} ]]; then
# The draft's pretraining needs nothing from the target: it runs beside it.
"$py" "$t/train.py" draft-pretrain --threads 1 --draft-pretrain-steps 5000 --draft-pretrain-lr 3e-3 \
  --draft-pretrain-decay-steps 100 --draft-pretrain-decay-start 148 --eval-every 50 \
  "${args[@]}" > "$work/draft-pretrain.out" 2>&1 &
pre=$!
"$py" "$t/train.py" target --target-steps 3000 --target-lr 1.5e-3 --target-decay-steps 120 \
  --target-decay-start 318 --eval-every 50 "${args[@]}"
if ! wait "$pre"; then
  echo "run.sh: draft pretraining failed; see $work/draft-pretrain.out" >&2
  exit 1
fi
"$py" "$t/train.py" draft --draft-steps 2000 --draft-lr 1e-3 --warmup 10 --draft-decay-steps 40 \
  --draft-decay-start 166 --eval-every 40 "${args[@]}"
echo "second pair: $(( $(date +%s) - start )) s"
cat "$out/train-log-target.jsonl" "$out/train-log-draft-pretrain.jsonl" "$out/train-log-draft.jsonl" \
  > "$work/train-log-second.jsonl"
SECOND_PAIR="$out"
else
  cp "$SECOND_PAIR/train-log.jsonl" "$work/train-log-second.jsonl" 2>/dev/null || : > "$work/train-log-second.jsonl"
fi

# Third round (the committed pair): the target warm-started from the second
# pair's, half of each batch from the tune set; then the draft distilled again
# from the new target, warm-started from the second pair's draft, on the same mix.
out3="$work/out3"
"$py" "$t/build_tune.py" --corpus "$work/corpus" --out "$work/tune.jsonl" --verse-repeats 4 \
  --sayings 1200 --code 120
args3=(--corpus "$work/corpus" --work "$work" --out "$out3" --tune "$work/tune.jsonl" --tune-fraction 0.5)
"$py" "$t/train.py" target --target-init "$SECOND_PAIR/target" --target-steps 3000 --target-lr 1e-3 \
  --warmup 20 --target-decay-steps 80 --target-decay-start 620 --eval-every 50 "${args3[@]}"
"$py" "$t/train.py" draft --draft-init "$SECOND_PAIR/draft" --draft-steps 2000 --draft-lr 1e-3 --warmup 10 \
  --draft-decay-steps 60 --draft-decay-start 160 --eval-every 40 "${args3[@]}"
echo "training: $(( $(date +%s) - start )) s"
out="$out3"

mkdir -p "$dest/target" "$dest/draft"
for m in target draft; do
  cp "$out/$m/config.json" "$out/$m/model.safetensors" "$out/$m/tokenizer.json" \
     "$out/$m/tokenizer_config.json" "$dest/$m/"
done
# The second pair's log, then the third round's (target, draft)
cat "$work/train-log-second.jsonl" "$out/train-log-target.jsonl" "$out/train-log-draft.jsonl" \
  > "$dest/train-log.jsonl"
"$py" "$t/eval_ppl.py" --write-heldout "$dest/heldout.txt" --corpus "$work/corpus"
# The reference perplexities (PyTorch, weights as stored: bf16)
{
  printf '{"text": "heldout.txt", "context": 256'
  for m in target draft; do
    printf ', "%s": %s' "$m" "$("$py" "$t/eval_ppl.py" --model "$dest/$m" --text "$dest/heldout.txt")"
  done
  printf '}\n'
} > "$dest/eval.json"
cat "$dest/eval.json"
"$t/expected.sh"
