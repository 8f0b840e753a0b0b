#!/usr/bin/env bash
# Trains the model pair committed in models/trained, from nothing, as it was
# trained: corpus, tokenizer, target (beside it the draft's own pretraining),
# the draft's distillation from the target, the held-out slice and the
# PyTorch perplexities the tests hold Tandem to. Then, with Tandem built
# (build/), the committed greedy answer (expected.json).
#   tools/train/run.sh [WORK_DIR]     (default /tmp/tandem-train)
# Needs Debian's python3-torch, python3-numpy, python3-regex, fortunes,
# fortunes-min and libopenblas0-pthread; about 85 minutes on 2 cores shared at a
# load average of 7 to 14 (the committed run: target 61 min, distillation 19).
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
echo "training: $(( $(date +%s) - start )) s"

mkdir -p "$dest/target" "$dest/draft"
for m in target draft; do
  cp "$out/$m/config.json" "$out/$m/model.safetensors" "$out/$m/tokenizer.json" \
     "$out/$m/tokenizer_config.json" "$dest/$m/"
done
cat "$out/train-log-target.jsonl" "$out/train-log-draft-pretrain.jsonl" "$out/train-log-draft.jsonl" \
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
