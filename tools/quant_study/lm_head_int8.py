#!/usr/bin/env python3
"""Would an int8 LM head keep greedy output? (issue 58, item 5)

For each model: the final hidden states of a text (the trained pair's held-out
text, or random ids for a random-weight preset), then every position's logits
twice: through the bf16 head as Tandem computes them today (f32 activations),
and through the head quantized as the CPU's integer products quantize the
projections (docs/quantization.md: one scale per output row, max|w| / 127; the
activations per row and per block of 32, max|x| / 127; exact integer block
sums, one float epilogue). Prints how often the argmax agrees, the largest
logit error against the row's logit range, and how the disagreements sit
against the reference's top-1 margin.

    /usr/bin/python3 tools/quant_study/lm_head_int8.py DIR [DIR ...] [--tokens N] [--window N]

Needs torch (Debian's python3-torch: /usr/bin/python3 on this machine).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import llama  # noqa: E402  (tools/train/llama.py: the same forward the trainer uses)


def int8_rows(w):
    """One scale a row (max|w| / 127, 1 for a zero row), values rounded to nearest."""
    scale = w.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127)
    return q, scale


def int8_blocks(x, block=32):
    """x [t, d] quantized per row and per block of 32 columns: q, scale [t, d / 32]."""
    t, d = x.shape
    xb = x.reshape(t, d // block, block)
    scale = xb.abs().amax(dim=2) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(xb / scale[:, :, None]), -127, 127)
    return q, scale


def int8_row_blocks(w, block=32):
    """One scale per row and block of 32 (llama.cpp's Q8_0 grain): the values back
    as floats, dequantized."""
    v, d = w.shape
    wb = w.reshape(v, d // block, block)
    scale = wb.abs().amax(dim=2) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.clamp(torch.round(wb / scale[:, :, None]), -127, 127)
    return (q * scale[:, :, None]).reshape(v, d)


def int8_logits(h, wq, ws, block=32):
    """The integer product: per block an exact int sum, times the activations' block
    scale, summed in block order, times the row's scale (float64: the int sums are
    exact there, and the float epilogue's rounding is far below the errors measured)."""
    aq, asc = int8_blocks(h.double(), block)
    t, nb, _ = aq.shape
    wqb = wq.double().reshape(wq.shape[0], nb, block)
    out = torch.zeros(t, wq.shape[0], dtype=torch.float64)
    for b in range(nb):
        out += (aq[:, b, :] @ wqb[:, b, :].t()) * asc[:, b:b + 1]
    return out * ws.double()[None, :]


def hidden_windows(model, ids, window):
    """model.hidden over consecutive windows of `window` positions (the
    trained pair saw 256-token contexts), concatenated."""
    return torch.cat([model.hidden(ids[:, i:i + window])[0] for i in range(0, ids.shape[1], window)])


def ids_of(model_dir, cfg, n):
    """The held-out text's first n ids when the model has one (the trained pair),
    else n random ids (seeded)."""
    text = os.path.join(os.path.dirname(os.path.abspath(model_dir)), "heldout.txt")
    if os.path.exists(text):
        import bpe  # tools/train/bpe.py: the trained pair's tokenizer
        enc = bpe.Encoder(*bpe.load_files(model_dir))
        with open(text, encoding="utf-8") as f:
            body = f.read().replace("<|begin_of_text|>", "").replace("<|end_of_text|>", "\n")
        return torch.tensor([enc.encode(body)[:n]]), "held-out text"
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, cfg["vocab_size"], (1, n), generator=g), "random ids"


def study(model_dir, n_tokens, window):
    model = llama.load(model_dir)
    cfg = model.cfg
    ids, source = ids_of(model_dir, cfg, n_tokens)
    with torch.no_grad():
        h = hidden_windows(model, ids, window)
        w = model.model.embed_tokens.weight  # tied head, bf16 values in f32
        ref = (h @ w.t()).double()
        wq, ws = int8_rows(w)
        q8 = int8_logits(h, wq, ws)
        w_only = (h.double() @ (wq.double() * ws.double()[:, None]).t())  # f32 activations
    top2 = ref.topk(2, dim=1)
    margin = (top2.values[:, 0] - top2.values[:, 1])
    rng = (ref.amax(dim=1) - ref.amin(dim=1))
    agree = (ref.argmax(dim=1) == q8.argmax(dim=1))
    err = (q8 - ref).abs().amax(dim=1)
    rel = (err / rng)
    worst_margin_missed = margin[~agree].max().item() if (~agree).any() else 0.0
    print(f"{os.path.basename(os.path.normpath(model_dir))}: {ids.shape[1]} positions of {source}, "
          f"vocab {cfg['vocab_size']}, hidden {cfg['hidden_size']}")
    print(f"  argmax agrees at {int(agree.sum())} of {agree.numel()} ({100.0 * agree.float().mean():.2f}%)")
    print(f"  largest logit error {err.max().item():.4f} = {100 * rel.max().item():.3f}% of its row's range "
          f"(median {100 * rel.median().item():.3f}%)")
    with torch.no_grad():
        wb = int8_row_blocks(w)
        aq, asc = int8_blocks(h.double())
        h_deq = (aq * asc[:, :, None]).reshape(h.shape)
        q8_0 = h_deq @ wb.double().t()  # Q8_0-grained weights, the same activations
    agree_b = (ref.argmax(dim=1) == q8_0.argmax(dim=1))
    err_b = ((q8_0 - ref).abs().amax(dim=1) / rng)
    print(f"  weights per row and block of 32 (Q8_0's grain), int8 activations: agrees at "
          f"{int(agree_b.sum())}, largest error {100 * err_b.max().item():.3f}% of the range")
    agree_w = (ref.argmax(dim=1) == w_only.argmax(dim=1))
    err_w = ((w_only - ref).abs().amax(dim=1) / rng)
    print(f"  weights alone int8 (activations f32): agrees at {int(agree_w.sum())}, largest error "
          f"{100 * err_w.max().item():.3f}% of the range")
    print(f"  top-1 margin: median {margin.median().item():.4f}; the disagreements' largest margin "
          f"{worst_margin_missed:.4f}; positions with a margin below the largest error: "
          f"{int((margin < err).sum())}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--window", type=int, default=256, help="positions per forward (a context)")
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for d in a.models:
        study(d, a.tokens, a.window)


if __name__ == "__main__":
    main()
