#!/usr/bin/env python3
"""Trains the Tandem model pair: tokenizer, target, then a draft distilled from it.

Stages (each reads what the one before wrote in --work):
  tokenizer  corpus (build_corpus.py output) -> BPE tokenizer files, token ids
  target     pretrains the target on the token stream (cross-entropy)
  draft      trains the draft on the target's output distribution (forward KL)
  all        the three in turn
Every random choice comes from --seed; with the same corpus, thread count and
PyTorch build the weights are the same bit for bit (CPU kernels are
deterministic at a fixed thread count). The log (one JSON line per
evaluation) goes to <out>/train-log.jsonl.
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

# Other processes share these cores: spinning OpenMP workers then cost more
# than they save (measured 3x slower at 2 threads without this).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import llama  # noqa: E402

# Shapes, chosen by measured throughput on 2 cores shared with four other
# agents (load average 7 to 14, training at nice 19): the target, ~4.07M
# parameters, trained at 6-14 s a step of 2,048 tokens, so an hour bought under
# a million tokens, and larger shapes (5.6M, 7.8M, 11M: 320-520 tokens/s when
# measured) would have seen fewer still; the draft, ~0.92M, is 4.4x smaller and per
# token does about 4.4x fewer multiply-adds than the target (the embedding
# counts: it is also the output head). The first committed pair (target
# hidden 128, 4 layers, 1.31M; draft hidden 64, 2 layers, 0.36M) was too small
# to write readable text, and its draft too cheap to gain from on the CPU.
TARGET = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2}
DRAFT = {"hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2}
CONTEXT = 256
MAX_POSITIONS = 8192
# Llama 3.1's scaling keys; with original_max_position_embeddings at the
# trained context, the low frequencies are stretched as Llama 3.1 stretches
# its own (training and inference both apply it).
ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": CONTEXT}


def log(path, row):
    print(json.dumps(row), flush=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def doc_text(d):
    """A corpus document as the model sees it: BOS, text, end token."""
    if "chat" in d:
        return bpe.render_chat(d["chat"])  # starts with BOS, ends with <|eot_id|>
    return "<|begin_of_text|>" + d["text"] + "<|end_of_text|>"


def stage_tokenizer(a):
    train = read_jsonl(os.path.join(a.corpus, "train.jsonl"))
    valid = read_jsonl(os.path.join(a.corpus, "valid.jsonl"))
    texts = [d["text"] for d in train if "text" in d]
    t0 = time.time()
    vocab, merges = bpe.train(texts, a.vocab_size)
    tok_dir = os.path.join(a.work, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    bpe.write_files(tok_dir, vocab, merges, MAX_POSITIONS)
    enc = bpe.Encoder(vocab, merges)
    for name, docs in (("train", train), ("valid", valid)):
        ids = []
        for d in docs:
            ids.extend(enc.encode(doc_text(d)))
        np.asarray(ids, dtype=np.uint16).tofile(os.path.join(a.work, name + ".bin"))
        print(f"{name}: {len(docs)} documents, {len(ids)} tokens", flush=True)
    print(f"tokenizer: {len(vocab)} + {len(bpe.SPECIALS)} tokens, {len(merges)} merges, "
          f"{time.time() - t0:.0f} s", flush=True)


def load_ids(a, name):
    return torch.from_numpy(np.fromfile(os.path.join(a.work, name + ".bin"), dtype=np.uint16).astype(np.int64))


def batch(ids, gen, n):
    starts = torch.randint(0, len(ids) - CONTEXT - 1, (n,), generator=gen)
    x = torch.stack([ids[s:s + CONTEXT + 1] for s in starts.tolist()])
    return x[:, :-1], x[:, 1:]


def val_windows(ids, n):
    """The first n non-overlapping windows of the validation stream (fixed)."""
    n = min(n, (len(ids) - 1) // CONTEXT)
    x = torch.stack([ids[i * CONTEXT:i * CONTEXT + CONTEXT + 1] for i in range(n)])
    return x[:, :-1], x[:, 1:]


@torch.no_grad()
def evaluate(model, vx, vy, bs=8):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(vx), bs):
        logits = model(vx[i:i + bs])
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), vy[i:i + bs].reshape(-1),
                               reduction="sum").item()
        n += vy[i:i + bs].numel()
    model.train()
    return tot / n


def lr_at(step, steps, peak, warmup, decay_start=None, decay_steps=None):
    """Linear warm-up, then either cosine decay to a tenth over the whole
    schedule, or (decay_steps given) warm-up-stable-decay: the peak held until
    decay_start, then cosine to a tenth over decay_steps."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if decay_steps is not None:
        if decay_start is None or step < decay_start:
            return peak
        p = min(1.0, (step - decay_start) / max(1, decay_steps))
        return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def config_for(shape, a):
    tok = json.load(open(os.path.join(a.work, "tokenizer", "tokenizer.json"), encoding="utf-8"))
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab_size = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    eos = [special["<|end_of_text|>"], special["<|eom_id|>"], special["<|eot_id|>"]]
    cfg = llama.hf_config(shape, vocab_size, special["<|begin_of_text|>"], eos, MAX_POSITIONS, ROPE_SCALING)
    cfg["head_dim"] = shape["hidden_size"] // shape["num_attention_heads"]
    return cfg


def write_model(model, cfg, out_dir, a):
    llama.export(model, out_dir, cfg)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(a.work, "tokenizer", f), os.path.join(out_dir, f))


def tune_ids(a):
    """The --tune set (build_tune.py) as one token stream, with the tokenizer in --work."""
    enc = bpe.Encoder(*bpe.load_files(os.path.join(a.work, "tokenizer")))
    ids = []
    for d in read_jsonl(a.tune):
        ids.extend(enc.encode(doc_text(d)))
    return torch.tensor(ids, dtype=torch.int64)


def run_training(a, name, shape, steps, peak_lr, teacher=None, init_from=None, seed_offset=0,
                 stop_after=None, decay_start=None, decay_steps=None):
    """Trains a model of shape for `steps` steps of the learning-rate schedule;
    with stop_after (a multiple of --eval-every), it stops after that step's
    update: the checkpoint written there, the schedule's rest never run.

    With decay_steps (warm-up-stable-decay) the learning rate stays at its
    peak until decay_start, then decays over decay_steps, and training ends
    there: `steps` is only an upper bound. decay_start may be left open and
    chosen while it runs, by writing a step number (or nothing: the next
    step) into <out>/<name>.decay; the log records the step it began, which
    passed as decay_start on a later run repeats the same schedule."""
    torch.manual_seed(a.seed + seed_offset)
    gen = torch.Generator().manual_seed(a.seed + 10 + seed_offset)
    cfg = config_for(shape, a)
    model = llama.Llama(cfg)
    if init_from:
        model.load_state_dict(llama.load(init_from).state_dict())
    train_ids, valid_ids = load_ids(a, "train"), load_ids(a, "valid")
    # With --tune, that many rows of each batch come from the tune set's stream,
    # the rest from the corpus'.
    tune = tune_ids(a) if a.tune else None
    n_tune = int(round(a.batch * a.tune_fraction)) if tune is not None else 0
    vx, vy = val_windows(valid_ids, a.val_windows)
    out_dir = os.path.join(a.out, name)
    logf = os.path.join(a.out, f"train-log-{name}.jsonl")
    os.makedirs(a.out, exist_ok=True)
    if os.path.exists(logf):
        os.remove(logf)
    log(logf, {"model": name, "params": llama.n_params(model), "shape": shape, "steps": steps,
               "batch": a.batch, "context": CONTEXT, "peak_lr": peak_lr,
               "train_tokens": len(train_ids), "valid_tokens_evaluated": vy.numel(),
               "distilled_from": "target" if teacher is not None else None, "init_from": init_from,
               "stop_after": stop_after, "decay_start": decay_start, "decay_steps": decay_steps,
               "warmup": a.warmup, "tune": os.path.basename(a.tune) if a.tune else None,
               "tune_tokens": len(tune) if tune is not None else 0, "tune_rows_per_batch": n_tune,
               "threads": torch.get_num_threads(), "seed": a.seed})
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95), eps=1e-8)
    t0 = time.time()
    decay_file = os.path.join(a.out, f"{name}.decay")
    if os.path.exists(decay_file):
        os.remove(decay_file)
    for step in range(steps):
        if decay_steps is not None and decay_start is None and os.path.exists(decay_file):
            txt = open(decay_file).read().strip()
            decay_start = max(step, int(txt)) if txt else step
            log(logf, {"decay_start": decay_start, "decay_steps": decay_steps, "at_step": step})
        if decay_steps is not None and decay_start is not None and step >= decay_start + decay_steps:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, peak_lr, a.warmup, decay_start, decay_steps)
        x, y = batch(train_ids, gen, a.batch - n_tune)
        if n_tune:
            tx, ty = batch(tune, gen, n_tune)
            x, y = torch.cat([x, tx]), torch.cat([y, ty])
        logits = model(x)
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        else:
            with torch.no_grad():
                t_logp = F.log_softmax(teacher(x), dim=-1)
            logp = F.log_softmax(logits, dim=-1)
            # forward KL(target || draft), per token
            loss = (t_logp.exp() * (t_logp - logp)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step % a.log_every == 0 or step == steps - 1
                or (decay_steps is not None and decay_start is not None and step == decay_start + decay_steps - 1)):
            row = {"step": step, "train_loss": round(loss.item(), 4),
                   "lr": round(opt.param_groups[0]["lr"], 6),
                   "tokens": (step + 1) * a.batch * CONTEXT, "elapsed_s": round(time.time() - t0, 1)}
            last = step == steps - 1 or (decay_steps is not None and decay_start is not None
                                         and step == decay_start + decay_steps - 1)
            if step % a.eval_every == 0 or last:
                row["valid_loss"] = round(evaluate(model, vx, vy), 4)
                write_model(model, cfg, out_dir, a)  # a checkpoint one can load meanwhile
            log(logf, row)
        if stop_after is not None and step == stop_after:
            break
    model.eval()
    write_model(model, cfg, out_dir, a)
    final = llama.load(out_dir)  # as stored: bf16
    vl = evaluate(final, vx, vy)
    log(logf, {"final": True, "valid_loss_bf16": round(vl, 4), "valid_ppl_bf16": round(math.exp(vl), 3),
               "wall_s": round(time.time() - t0, 1)})
    return final


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=["tokenizer", "target", "draft-pretrain", "draft", "all"])
    ap.add_argument("--corpus", required=True, help="build_corpus.py output directory")
    ap.add_argument("--work", required=True, help="tokenizer and token ids")
    ap.add_argument("--out", required=True, help="model directories and logs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--target-steps", type=int, default=320)
    ap.add_argument("--target-stop-after", type=int, default=None,
                    help="stop the target after this step (a multiple of --eval-every), mid-schedule")
    ap.add_argument("--target-decay-steps", type=int, default=None,
                    help="warm-up-stable-decay: decay over this many steps (else cosine over --target-steps)")
    ap.add_argument("--target-decay-start", type=int, default=None,
                    help="the step the decay begins (else chosen while it runs: <out>/target.decay)")
    ap.add_argument("--draft-pretrain-steps", type=int, default=320)
    ap.add_argument("--draft-pretrain-decay-steps", type=int, default=None)
    ap.add_argument("--draft-pretrain-decay-start", type=int, default=None)
    ap.add_argument("--draft-steps", type=int, default=150)
    ap.add_argument("--draft-decay-steps", type=int, default=None)
    ap.add_argument("--draft-decay-start", type=int, default=None)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-pretrain-lr", type=float, default=3e-3)
    ap.add_argument("--draft-lr", type=float, default=1e-3)
    ap.add_argument("--target-init", default=None,
                    help="start the target from this model directory (a warm start) instead of at random")
    ap.add_argument("--draft-init", default=None,
                    help="start the distilled draft from this model directory (default <out>/draft-pretrain)")
    ap.add_argument("--tune", default=None, help="a build_tune.py .jsonl mixed into every batch")
    ap.add_argument("--tune-fraction", type=float, default=0.5, help="share of each batch drawn from --tune")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--val-windows", type=int, default=48)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    if a.stage in ("tokenizer", "all"):
        stage_tokenizer(a)
    # The draft first learns the corpus on its own (cross-entropy; run beside
    # the target's training, it needs nothing from it), then, once the target
    # is trained, learns the target's output distribution (forward KL): what
    # it is scored on is agreeing with the target, not with the corpus.
    if a.stage in ("target", "all"):
        run_training(a, "target", TARGET, a.target_steps, a.target_lr, init_from=a.target_init,
                     stop_after=a.target_stop_after,
                     decay_start=a.target_decay_start, decay_steps=a.target_decay_steps)
    if a.stage in ("draft-pretrain", "all"):
        run_training(a, "draft-pretrain", DRAFT, a.draft_pretrain_steps, a.draft_pretrain_lr,
                     seed_offset=2, decay_start=a.draft_pretrain_decay_start,
                     decay_steps=a.draft_pretrain_decay_steps)
    if a.stage in ("draft", "all"):
        teacher = llama.load(os.path.join(a.out, "target"))
        for p in teacher.parameters():
            p.requires_grad_(False)
        run_training(a, "draft", DRAFT, a.draft_steps, a.draft_lr, teacher,
                     init_from=a.draft_init or os.path.join(a.out, "draft-pretrain"), seed_offset=1,
                     decay_start=a.draft_decay_start, decay_steps=a.draft_decay_steps)


if __name__ == "__main__":
    main()
