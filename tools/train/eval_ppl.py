#!/usr/bin/env python3
"""Perplexity of a trained model on a text, in PyTorch: the reference value
that `tandem-bench ppl` must match (tests/e2e/test_trained_pair.py).

The text is encoded as Tandem's tokenizer encodes it (special-token text
parsed, no BOS added; bpe.Encoder is byte-exact with HuggingFace tokenizers),
cut into consecutive windows of --context tokens, each scored from an empty
sequence: every token after a window's first, from the ones before it.

  eval_ppl.py --write-heldout FILE --corpus DIR [--bytes N]
      writes the held-out slice: the first validation documents (never
      trained on), rendered as the model saw them, up to N bytes
  eval_ppl.py --model DIR --text FILE [--context 256]
      prints {"tokens", "scored", "nll", "ppl"} as JSON
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import llama  # noqa: E402
import train  # noqa: E402


@torch.no_grad()
def perplexity(model_dir, text, context):
    vocab, merges = bpe.load_files(model_dir)
    ids = bpe.Encoder(vocab, merges).encode(text)
    model = llama.load(model_dir)
    nll, scored = 0.0, 0
    for at in range(0, len(ids) - 1, context):
        w = torch.tensor(ids[at:at + context])[None]
        if w.shape[1] < 2:
            break
        logits = model(w)[0].double()
        nll += F.cross_entropy(logits[:-1], w[0, 1:], reduction="sum").item()
        scored += w.shape[1] - 1
    return {"tokens": len(ids), "scored": scored, "context": context,
            "nll": nll / scored, "ppl": math.exp(nll / scored)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model")
    ap.add_argument("--text")
    ap.add_argument("--context", type=int, default=train.CONTEXT)
    ap.add_argument("--write-heldout")
    ap.add_argument("--corpus")
    ap.add_argument("--bytes", type=int, default=12000)
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.write_heldout:
        docs = train.read_jsonl(os.path.join(a.corpus, "valid.jsonl"))
        out = ""
        for d in docs:
            t = train.doc_text(d)
            if len(out.encode()) + len(t.encode()) > a.bytes:
                break
            out += t
        with open(a.write_heldout, "w", encoding="utf-8") as f:
            f.write(out)
        print(f"{a.write_heldout}: {len(out.encode())} bytes")
        return
    if not a.model or not a.text:
        sys.exit("eval_ppl.py: --model and --text are required (or --write-heldout)")
    with open(a.text, encoding="utf-8") as f:
        text = f.read()
    print(json.dumps(perplexity(a.model, text, a.context)))


if __name__ == "__main__":
    main()
