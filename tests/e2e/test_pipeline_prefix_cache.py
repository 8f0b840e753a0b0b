#!/usr/bin/python3
"""Prefix caching through the three processes: a prompt whose start an
earlier request computed maps those KV blocks in both workers instead of
computing them, and its output is the cold output token for token (greedy,
and a seeded sampled request); requests sharing a prefix at once, a prompt
entirely cached, prompts ending mid-block; a KV pool so small that cached
blocks are evicted all the time (every output still right, every block back
once idle); a multi-turn chat through the gateway, against the same turns
with the cache off; the stats and the Prometheus text count the lookups,
hits, cached blocks and evictions per worker."""
import json
import os
import random

from tandem_e2e import Pipeline, binary, check, generate, generate_concurrently, http, main, reference, require_binaries

BLOCK = 16  # the workers' KV block size (LLAMA_DEFAULT_KV_BLOCK_SIZE)


def cached_of(done):
    return done.get("usage", {}).get("cached_prompt_tokens", -1)


def prefix_stats(p):
    w = p.stats()["workers"]
    return w["draft"]["prefix_cache"], w["target"]["prefix_cache"]


def check_shared_prefixes(p, target):
    rng = random.Random(5)
    system = [rng.randrange(1, 512) for _ in range(70)]
    tails = [[rng.randrange(1, 512) for _ in range(n)] for n in (5, 11, 1, 23)]
    prompts = [system + t for t in tails]
    n = 24
    refs = [reference(target, ids, n)["ids"] for ids in prompts]
    s = p.client()
    done, _ = generate(s, {"id": "cold", "prompt_ids": prompts[0], "max_tokens": n, "temperature": 0})
    check(done.get("ids") == refs[0], "cold: %s != %s" % (done, refs[0]))
    check(cached_of(done) == 0, "the first prompt found something cached: %s" % done.get("usage"))
    # a second prompt with the same 70-token start: 64 of them mapped
    done, _ = generate(s, {"id": "warm", "prompt_ids": prompts[1], "max_tokens": n, "temperature": 0})
    check(done.get("ids") == refs[1], "warm: ids %s != cold %s" % (done.get("ids"), refs[1]))
    check(cached_of(done) == 64, "warm: %s cached, want 64" % done.get("usage"))
    # the first prompt again: entirely cached but its last token (and its
    # output's blocks are cached too)
    done, _ = generate(s, {"id": "again", "prompt_ids": prompts[0], "max_tokens": n, "temperature": 0})
    check(done.get("ids") == refs[0], "again: %s" % done)
    want = (len(prompts[0]) - 1) // BLOCK * BLOCK
    check(cached_of(done) == want, "again: %s cached, want %d" % (done.get("usage"), want))
    # whole output of an earlier request as the next prompt (a chat's next
    # turn): prompt + output's blocks are found
    turn = prompts[0] + refs[0] + tails[2]
    ref_turn = reference(target, turn, n)["ids"]
    done, _ = generate(s, {"id": "turn", "prompt_ids": turn, "max_tokens": n, "temperature": 0})
    check(done.get("ids") == ref_turn, "next turn: %s != %s" % (done.get("ids"), ref_turn))
    check(cached_of(done) >= 80, "next turn: only %s cached" % done.get("usage"))
    # a seeded sampled request: the same tokens cold and warm (with the
    # model's drafts, K fixed: docs/protocol.md)
    for how in ({"draft": "none"}, {"draft": "model", "spec_k": 3}):
        fresh = [rng.randrange(1, 512) for _ in range(40)]
        sampled = dict(how, prompt_ids=fresh, max_tokens=n, temperature=0.9, seed=1234)
        cold, _ = generate(s, dict(sampled, id="sampled-cold"))
        warm, _ = generate(s, dict(sampled, id="sampled-warm"))
        check(cold.get("type") == "done" and cached_of(cold) == 0, "sampled cold %s: %s" % (how, cold))
        check(cached_of(warm) == 32, "sampled warm %s: %s cached, want 32" % (how, warm.get("usage")))
        check(warm.get("ids") == cold.get("ids"),
              "seeded sampled %s: warm %s != cold %s" % (how, warm.get("ids"), cold.get("ids")))
    # four at once sharing a prefix none has computed yet, ending mid-block
    shared = [rng.randrange(1, 512) for _ in range(50)]
    batch = [shared + t for t in tails]
    refs_b = [reference(target, ids, n)["ids"] for ids in batch]
    for source in ("model", "auto"):
        out = generate_concurrently(p, [{"id": "b%s%d" % (source, i), "prompt_ids": ids, "max_tokens": n, "temperature": 0,
                             "draft": source} for i, ids in enumerate(batch)])
        for i, done in enumerate(out):
            check(done.get("ids") == refs_b[i], "batch %s %d: %s != %s" % (source, i, done, refs_b[i]))
    d, t = prefix_stats(p)
    check(t["hits"] > 0 and t["queries"] >= t["hits"], "target prefix cache figures: %s" % t)
    check(d["hits"] > 0 and d["queries"] >= d["hits"], "draft prefix cache figures: %s" % d)
    check(t["cached_blocks"] > 0, "target keeps no cached blocks: %s" % t)
    s.close()
    print("shared prefixes: target %d of %d prompt tokens cached, draft %d of %d" %
          (t["hits"], t["queries"], d["hits"], d["queries"]))


def check_tiny_pool():
    """A pool of two sequences' worth: cached blocks are evicted for every
    new prompt, and outputs stay right."""
    kv = {"kv_tokens": 256, "max_seq_len": 128}
    p = Pipeline("prefixpool", max_concurrency=2, extra={"draft_worker": kv, "target_worker": kv})
    _, target_dir = p.make_pair()
    p.start_all()
    rng = random.Random(9)
    stems = [[rng.randrange(1, 512) for _ in range(40)] for _ in range(3)]
    reqs, refs = [], []
    for i in range(10):
        ids = stems[i % 3] + [rng.randrange(1, 512) for _ in range(rng.randrange(1, 30))]
        reqs.append({"id": "pool%d" % i, "prompt_ids": ids, "max_tokens": 16, "temperature": 0})
        refs.append(reference(target_dir, ids, 16)["ids"])
    for lo in range(0, 10, 2):
        out = generate_concurrently(p, reqs[lo:lo + 2])
        for i, done in enumerate(out):
            check(done.get("ids") == refs[lo + i], "tiny pool, request %d: %s != %s" % (lo + i, done, refs[lo + i]))
    d, t = prefix_stats(p)
    check(t["evictions"] > 0 and d["evictions"] > 0, "no eviction under a tiny pool: draft %s target %s" % (d, t))
    check(t["hits"] > 0, "no hit under a tiny pool: %s" % t)
    kvb = p.stats()["kv_blocks"]
    check(kvb["target_reserved"] == 0 and kvb["draft_reserved"] == 0, "blocks still reserved when idle: %s" % kvb)
    print("tiny pool: target %d evictions, %d of %d prompt tokens cached" % (t["evictions"], t["hits"], t["queries"]))
    p.close()


def chat_turns(p, url):
    """Three turns of one conversation through the gateway; returns the
    replies and the usage of each."""
    messages = [{"role": "system", "content": "You are a terse assistant. " * 12}]
    out = []
    for q in ("Name a colour.", "And another one?", "Which of them is darker?"):
        messages.append({"role": "user", "content": q})
        st, _, body = http("POST", url + "/v1/chat/completions",
                           {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0})
        check(st == 200, "chat turn: %d %s" % (st, body[:300]))
        r = json.loads(body)
        text = r["choices"][0]["message"]["content"]
        out.append((text, r["usage"]))
        messages.append({"role": "assistant", "content": text})
    return out


def check_chat():
    if not os.access(binary("gateway"), os.X_OK):
        print("no gateway built: the chat through the gateway is not checked")
        return
    got = {}
    for on in (0, 1):
        extra = {"draft_worker": {"prefix_cache": on}, "target_worker": {"prefix_cache": on}}
        p = Pipeline("prefixchat%d" % on, extra=extra)
        p.make_pair()
        url = p.enable_gateway()
        p.start_all()
        p.start("gateway")
        p.wait_http()
        got[on] = chat_turns(p, url)
        p.close()
    for i, ((text_off, u_off), (text_on, u_on)) in enumerate(zip(got[0], got[1])):
        check(text_on == text_off, "turn %d: %r with the cache, %r without" % (i, text_on, text_off))
        check(u_off.get("prompt_tokens_details", {}).get("cached_tokens") == 0,
              "turn %d without a cache: %s" % (i, u_off))
        cached = u_on.get("prompt_tokens_details", {}).get("cached_tokens")
        check(cached is not None and (i == 0 or cached >= BLOCK), "turn %d with the cache: %s" % (i, u_on))
    print("chat: cached tokens per turn %s of %s" %
          ([u["prompt_tokens_details"]["cached_tokens"] for _, u in got[1]], [u["prompt_tokens"] for _, u in got[1]]))


def test():
    require_binaries()
    p = Pipeline("prefix", max_concurrency=4)
    draft, target = p.make_pair()
    p.start_all()
    check_shared_prefixes(p, target)
    # the Prometheus text names both workers
    text = p.stats().get("prometheus", "")
    for name in ("tandem_prefix_cache_queries_total", "tandem_prefix_cache_hits_total",
                 "tandem_prefix_cache_blocks", "tandem_prefix_cache_evictions_total"):
        for worker in ("draft", "target"):
            check('%s{worker="%s",pair="0"}' % (name, worker) in text,
                  "%s{worker=%s,pair=0} missing from:\n%s" % (name, worker, text[-3000:]))
    p.close()
    check_tiny_pool()
    check_chat()


if __name__ == "__main__":
    main(test)
