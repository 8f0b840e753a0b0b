#!/usr/bin/env python3
"""Builds the training corpus of the trained model pair from Debian-packaged text.

What goes in, and why:
  - fortunes, fortunes-min (/usr/share/games/fortunes): short English prose,
    quotations, jokes and verse: the "hard" passages a draft mostly misses.
  - the Python standard library's own sources (/usr/lib/python3.X/*.py, package
    libpython3.X-stdlib, on every Debian machine): code, full of repeated
    identifiers and idioms, the n-gram-friendly passages a draft mostly hits.
  - /usr/share/common-licenses (base-files): long formal English prose.
Chat examples pair an instruction with an answer drawn from the same sources
(a fortune for "Write a short poem about <word>.", a function for "Write a
Python function named <name>."), rendered with the Llama 3 chat format, so the
model learns the shape of an answer and to end it with <|eot_id|>.

Output (in --out): train.jsonl and valid.jsonl, one document a line:
{"text": ...} for plain text, {"chat": [[role, content], ...]} for a
conversation. Every choice is drawn from random.Random(seed): the same files
give the same corpus. The validation split is every 50th document of each
source (by a seeded shuffle), so it is text the model never trained on.
"""
import argparse
import glob
import json
import os
import random
import re
import sys


def read_fortunes(root):
    docs = []
    files = sorted(f for f in glob.glob(os.path.join(root, "*"))
                   if os.path.isfile(f) and not f.endswith(".dat") and not os.path.islink(f))
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            for item in f.read().split("\n%\n"):
                item = item.strip("\n")
                # The offensive collection lives in off/ (not read); rot13 files
                # would only be noise.
                if 20 <= len(item) <= 1200:
                    docs.append(item)
    return docs


def read_python(root, max_bytes):
    """Top-level functions and classes of the stdlib's modules, each a document."""
    docs = []
    for path in sorted(glob.glob(os.path.join(root, "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            src = f.read()
        # Split at top-level definitions: each chunk starts with def/class/@.
        parts = re.split(r"\n(?=(?:def |class |@))", src)
        for p in parts:
            p = p.strip("\n")
            if 40 <= len(p) <= 4000:
                docs.append(p)
    return docs


def read_licenses(root):
    docs = []
    for path in sorted(glob.glob(os.path.join(root, "*"))):
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for para in re.split(r"\n\s*\n", f.read()):
                para = para.strip()
                if len(para) >= 80:
                    docs.append(para)
    return docs


WORD_RE = re.compile(r"[A-Za-z]{4,}")
STOP = set("""that this with have from they will what when your there their would about
which were been more some than them then into only other could these also like just
over such very must even most make made much many where those here each well does""".split())

POEM_PROMPTS = [
    "Write a short poem about {w}.",
    "Write a short poem about {w} and {v}.",
    "Tell me something about {w}.",
    "Say something wise about {w}.",
    "Give me a quote about {w}.",
    "What do you think of {w}?",
]
CODE_PROMPTS = [
    "Write a Python function named {n}.",
    "Show me the Python code of {n}.",
    "How would you write {n} in Python?",
]


def chat_from_fortune(rng, text):
    words = [w.lower() for w in WORD_RE.findall(text) if w.lower() not in STOP]
    if not words:
        return None
    w, v = rng.choice(words), rng.choice(words)
    q = rng.choice(POEM_PROMPTS).format(w=w, v=v)
    return [["user", q], ["assistant", text]]


def chat_from_code(rng, text):
    m = re.match(r"(?:@.*\n)*(def|class) (\w+)", text)
    if not m:
        return None
    q = rng.choice(CODE_PROMPTS).format(n=m.group(2))
    return [["user", q], ["assistant", text]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--python-dir", default="/usr/lib/python3.%d" % sys.version_info[1])
    ap.add_argument("--fortunes-dir", default="/usr/share/games/fortunes")
    ap.add_argument("--licenses-dir", default="/usr/share/common-licenses")
    ap.add_argument("--code-bytes", type=int, default=3_000_000,
                    help="keep about this many bytes of Python (the stdlib is larger than the prose)")
    ap.add_argument("--chat-fraction", type=float, default=0.35,
                    help="share of fortunes and code documents also given as a chat example")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    fortunes = read_fortunes(args.fortunes_dir)
    if len(fortunes) < 1000:
        sys.exit(f"{args.fortunes_dir}: only {len(fortunes)} fortunes (apt-get install fortunes fortunes-min)")
    code = read_python(args.python_dir, args.code_bytes)
    if not code:
        sys.exit(f"{args.python_dir}: no Python sources found")
    licenses = read_licenses(args.licenses_dir)
    rng.shuffle(code)
    kept, total = [], 0
    for c in code:
        if total >= args.code_bytes:
            break
        kept.append(c)
        total += len(c)
    code = kept

    train, valid = [], []
    stats = {}
    for name, docs, to_chat in (("fortunes", fortunes, chat_from_fortune),
                                ("python", code, chat_from_code),
                                ("licenses", licenses, None)):
        docs = list(docs)
        rng.shuffle(docs)
        n_valid = max(1, len(docs) // 50)
        for i, d in enumerate(docs):
            dest = valid if i < n_valid else train
            dest.append({"text": d, "source": name})
            if to_chat and rng.random() < args.chat_fraction:
                chat = to_chat(rng, d)
                if chat:
                    dest.append({"chat": chat, "source": name + "-chat"})
        stats[name] = {"docs": len(docs), "bytes": sum(len(d) for d in docs)}
    rng.shuffle(train)
    rng.shuffle(valid)
    os.makedirs(args.out, exist_ok=True)
    for fname, rows in (("train.jsonl", train), ("valid.jsonl", valid)):
        with open(os.path.join(args.out, fname), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(json.dumps({"sources": stats, "train_docs": len(train), "valid_docs": len(valid)}))


if __name__ == "__main__":
    main()
