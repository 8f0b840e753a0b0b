#!/usr/bin/env python3
"""Byte-level BPE in the shape of the Llama 3 tokenizer: training, encoding, files.

The files mirror Llama 3's tokenizer.json: the same pre-tokenizer (Split on
the Llama 3 regex, then ByteLevel without a prefix space), the ByteLevel
decoder, the post-processor that puts <|begin_of_text|> first, the BPE model
with ignore_merges, and the Llama 3 special tokens as added_tokens (the first
16 of them, placed after the learned vocabulary). Only vocab and merges are new,
so Tandem's tokenizer and HuggingFace `tokenizers` read them as they read
Llama 3's.

Training is the textbook greedy loop with incremental pair counts: unique
pre-tokens are counted once, each merge updates only the words that hold the
merged pair, and a heap with lazy deletion finds the next most frequent pair.
Ties go to the smallest pair (by string), so the merges are deterministic.
"""
import heapq
import json
import os
from collections import Counter, defaultdict

import regex

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
    "<|reserved_special_token_3|>", "<|reserved_special_token_4|>",
    "<|reserved_special_token_5|>", "<|reserved_special_token_6|>",
    "<|reserved_special_token_7|>",
]
CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

_PRE = regex.compile(LLAMA3_PATTERN)
_SPECIAL_SPLIT = regex.compile("(" + "|".join(regex.escape(s) for s in SPECIALS) + ")")


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable code points."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_MAP = bytes_to_unicode()
BYTE_UNMAP = {v: k for k, v in BYTE_MAP.items()}


def pretokens(text):
    """The ByteLevel-mapped pre-tokens of a text with no special tokens in it."""
    return ["".join(BYTE_MAP[b] for b in m.encode("utf-8")) for m in _PRE.findall(text)]


def train(texts, vocab_size):
    """Learns merges until the vocabulary (bytes + merges + specials) has vocab_size entries."""
    n_target = vocab_size - len(SPECIALS)
    counts = Counter()
    for t in texts:
        counts.update(pretokens(t))
    words = [list(w) for w in counts]
    freq = [counts[w] for w in counts]
    # Byte b has id b.
    vocab = {BYTE_MAP[b]: b for b in range(256)}
    pair_count = defaultdict(int)
    where = defaultdict(set)
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += freq[i]
            where[(a, b)].add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(vocab) < n_target and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or negc == 0:
            continue  # stale entry: the count changed since it was pushed
        a, b = pair
        new = a + b
        merges.append(pair)
        if new not in vocab:
            vocab[new] = len(vocab)
        changed = set()
        for i in list(where[pair]):
            w, f = words[i], freq[i]
            for x, y in zip(w, w[1:]):
                pair_count[(x, y)] -= f
                changed.add((x, y))
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for x, y in zip(out, out[1:]):
                pair_count[(x, y)] += f
                where[(x, y)].add(i)
                changed.add((x, y))
        del where[pair]
        pair_count.pop(pair, None)
        for p in changed:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
    return vocab, merges


class Encoder:
    """Encodes text as the files written by write_files do (HF semantics:
    special tokens split first, ignore_merges, lowest-rank merge first)."""

    def __init__(self, vocab, merges):
        self.vocab = vocab
        self.ranks = {p: i for i, p in enumerate(merges)}
        self.special = {s: len(vocab) + k for k, s in enumerate(SPECIALS)}
        self.cache = {}

    def _bpe(self, word):
        if word in self.vocab:
            return [self.vocab[word]]
        syms = list(word)
        while len(syms) > 1:
            best, best_i = None, -1
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, best_i = r, i
            if best is None:
                break
            syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        return [self.vocab[s] for s in syms]

    def encode(self, text):
        """Ids of text; special-token strings in it become their ids. No BOS added."""
        ids = []
        for part in _SPECIAL_SPLIT.split(text):
            if not part:
                continue
            if part in self.special:
                ids.append(self.special[part])
                continue
            for w in pretokens(part):
                t = self.cache.get(w)
                if t is None:
                    t = self._bpe(w)
                    if len(self.cache) < 500000:
                        self.cache[w] = t
                ids.extend(t)
        return ids

    def decode(self, ids):
        inv = {v: k for k, v in self.vocab.items()}
        inv.update({v: k for k, v in self.special.items()})
        s = "".join(inv[i] for i in ids)
        out = bytearray()
        for ch in s:
            out.append(BYTE_UNMAP[ch]) if ch in BYTE_UNMAP else out.extend(ch.encode())
        return out.decode("utf-8", errors="replace")


def render_chat(messages, add_generation_prompt=False):
    """The chat template above, rendered in Python (messages: [[role, content], ...])."""
    out = []
    for k, (role, content) in enumerate(messages):
        c = "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content.strip() + "<|eot_id|>"
        out.append(("<|begin_of_text|>" if k == 0 else "") + c)
    if add_generation_prompt:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def _added(k, base):
    return {"id": base + k, "content": SPECIALS[k], "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": True}


def write_files(out_dir, vocab, merges, max_length):
    """Writes tokenizer.json and tokenizer_config.json into out_dir."""
    base = len(vocab)
    bos = SPECIALS[0]
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added(k, base) for k in range(len(SPECIALS))],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                      {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": bos, "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [base], "tokens": [bos]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": dict(sorted(vocab.items(), key=lambda kv: kv[1])),
                  "merges": [a + " " + b for a, b in merges]},
    }
    cfg = {
        "added_tokens_decoder": {str(base + k): {kk: vv for kk, vv in _added(k, base).items()
                                                 if kk not in ("id",)}
                                 for k in range(len(SPECIALS))},
        "bos_token": bos, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>", "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": max_length, "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")


def load_files(model_dir):
    """Vocab and merges back from a tokenizer.json written by write_files."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    vocab = t["model"]["vocab"]
    merges = [tuple(m.split(" ")) for m in t["model"]["merges"]]
    return vocab, merges
