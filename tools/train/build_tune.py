#!/usr/bin/env python3
"""Builds the fine-tuning set of the third pair: chat examples from the training split.

The second pair, asked for a poem, answered with Python: its corpus gave about as many
"Write a ..." instructions answered by code as by verse, and greedy decoding of a model
that small follows the most common continuation. This set shifts the balance towards
what the demo asks for, from the same training documents (never the held-out ones):
  - verse: fortunes shaped like a poem (3 to 14 unindented lines of at most 64
    characters, most of them capitalised, no dialogue or ASCII art), each given as the
    answer to three different poem instructions ("Write a short poem about WORD.",
    "... about WORD and WORD.", ...; the words drawn from the fortune itself);
  - sayings: short prose fortunes as answers to "Say something wise about WORD." and
    the like (a sample);
  - code: Python functions as answers to "Write a Python function named NAME." (a
    smaller sample, so that those prompts keep their answers).
Output: one {"chat": [[role, content], ...], "source": ...} a line. Every choice comes
from random.Random(seed).
"""
import argparse
import json
import random
import re

import build_corpus as bc

VERSE_PROMPTS = [
    "Write a short poem about {w}.",
    "Write a short poem about {w} and {v}.",
    "Write a poem about {w}.",
    "Write a few lines of verse about {w}.",
    "Write a short poem about the {w}.",
    "Write me a poem about {w} and {v}.",
    "Compose a short poem about {w}.",
]
SAYING_PROMPTS = [
    "Say something wise about {w}.",
    "Give me a quote about {w}.",
    "Tell me something about {w}.",
    "What do you think of {w}?",
]


def verse(text):
    lines = [ln for ln in text.split("\n") if ln.strip()]
    body = [ln for ln in lines if not ln.strip().startswith("--")]
    if not 3 <= len(body) <= 14:
        return False
    if any(ln[0].isspace() for ln in body):
        return False
    lens = [len(ln.strip()) for ln in body]
    if max(lens) > 64 or sum(lens) / len(lens) < 18:
        return False
    if any(re.match(r"\s*[A-Z][A-Za-z]*:\s", ln) for ln in body):
        return False
    if any(re.search(r"[|\\_/]{3}|[#*=<>]{3}", ln) for ln in body):
        return False
    return sum(1 for ln in body if ln.strip()[:1].isupper()) >= 0.6 * len(body)


def chat(rng, prompts, text):
    words = [w.lower() for w in bc.WORD_RE.findall(text) if w.lower() not in bc.STOP]
    if not words:
        return None
    q = rng.choice(prompts).format(w=rng.choice(words), v=rng.choice(words))
    return [["user", q], ["assistant", text]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True, help="build_corpus.py output (train.jsonl is read)")
    ap.add_argument("--out", required=True, help="the .jsonl to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--verse-repeats", type=int, default=3)
    ap.add_argument("--sayings", type=int, default=2000)
    ap.add_argument("--code", type=int, default=300)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    docs = [json.loads(line) for line in open(f"{a.corpus}/train.jsonl", encoding="utf-8")]
    fortunes = [d["text"] for d in docs if d.get("source") == "fortunes" and "text" in d]
    code = [d["text"] for d in docs if d.get("source") == "python" and "text" in d]
    verses = [t for t in fortunes if verse(t)]
    sayings = [t for t in fortunes if not verse(t) and len(t) <= 300
               and not any(ln[:1].isspace() for ln in t.split("\n")[:1])]
    rows = []
    for t in verses:
        for _ in range(a.verse_repeats):
            c = chat(rng, VERSE_PROMPTS, t)
            if c:
                rows.append({"chat": c, "source": "verse-chat"})
    for t in rng.sample(sayings, min(a.sayings, len(sayings))):
        c = chat(rng, SAYING_PROMPTS, t)
        if c:
            rows.append({"chat": c, "source": "saying-chat"})
    for t in rng.sample(code, min(a.code, len(code))):
        c = bc.chat_from_code(rng, t)
        if c:
            rows.append({"chat": c, "source": "code-chat"})
    rng.shuffle(rows)
    with open(a.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    n = {}
    for r in rows:
        n[r["source"]] = n.get(r["source"], 0) + 1
    print(json.dumps({"verses": len(verses), "rows": n, "bytes": sum(len(r["chat"][1][1]) for r in rows)}))


if __name__ == "__main__":
    main()
