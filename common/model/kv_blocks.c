/* kv_blocks.c: see kv_blocks.h. */
#include "kv_blocks.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

int kv_blocks_init(struct kv_blocks *kb, int n_blocks, int block_size, bool cache_on, int cap_blocks,
                   char *err)
{
    memset(kb, 0, sizeof *kb);
    kb->n_blocks = n_blocks;
    kb->block_size = block_size;
    kb->cache_on = cache_on;
    kb->cache_cap = cap_blocks > 0 && cap_blocks < n_blocks ? cap_blocks : n_blocks;
    kb->n_buckets = 1;
    while (kb->n_buckets < (uint32_t)n_blocks)
        kb->n_buckets <<= 1;
    const size_t n = (size_t)n_blocks;
    kb->free_stack = malloc(n * sizeof *kb->free_stack);
    kb->refs = calloc(n, sizeof *kb->refs);
    kb->gen = calloc(n, sizeof *kb->gen);
    kb->published = calloc(n, sizeof *kb->published);
    kb->tokens = malloc(n * (size_t)block_size * sizeof *kb->tokens);
    kb->parent = malloc(n * sizeof *kb->parent);
    kb->parent_gen = calloc(n, sizeof *kb->parent_gen);
    kb->bucket = malloc(kb->n_buckets * sizeof *kb->bucket);
    kb->chain = malloc(n * sizeof *kb->chain);
    kb->lru_prev = malloc(n * sizeof *kb->lru_prev);
    kb->lru_next = malloc(n * sizeof *kb->lru_next);
    if (!kb->free_stack || !kb->refs || !kb->gen || !kb->published || !kb->tokens || !kb->parent ||
        !kb->parent_gen || !kb->bucket || !kb->chain || !kb->lru_prev || !kb->lru_next) {
        kv_blocks_free(kb);
        return error_set(err, ERR_NOMEM, "kv cache: out of memory for the block ledger");
    }
    /* Lowest ids on top: a fresh pool hands out blocks in order, and freed
     * blocks (already touched, so committed) are reused first. */
    kb->n_free = n_blocks;
    for (int b = 0; b < n_blocks; b++) {
        kb->free_stack[b] = n_blocks - 1 - b;
        kb->parent[b] = -1;
        kb->chain[b] = kb->lru_prev[b] = kb->lru_next[b] = -1;
    }
    for (uint32_t i = 0; i < kb->n_buckets; i++)
        kb->bucket[i] = -1;
    kb->lru_head = kb->lru_tail = -1;
    return 0;
}

void kv_blocks_free(struct kv_blocks *kb)
{
    void *bufs[] = {kb->free_stack, kb->refs, kb->gen, kb->published, kb->tokens, kb->parent,
                    kb->parent_gen, kb->bucket, kb->chain, kb->lru_prev, kb->lru_next};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    memset(kb, 0, sizeof *kb);
}

int kv_blocks_available(const struct kv_blocks *kb) { return kb->n_free + kb->n_cached; }

static uint32_t name_hash(const struct kv_blocks *kb, int32_t parent, uint32_t parent_gen,
                          const int32_t *tokens)
{
    /* FNV-1a over the name's words: the bucket only; every match is
     * checked word for word */
    uint32_t h = 2166136261u;
    h = (h ^ (uint32_t)parent) * 16777619u;
    h = (h ^ parent_gen) * 16777619u;
    for (int i = 0; i < kb->block_size; i++)
        h = (h ^ (uint32_t)tokens[i]) * 16777619u;
    return h & (kb->n_buckets - 1);
}

static void lru_unlink(struct kv_blocks *kb, int32_t b)
{
    const int32_t p = kb->lru_prev[b], n = kb->lru_next[b];
    if (p >= 0)
        kb->lru_next[p] = n;
    else
        kb->lru_head = n;
    if (n >= 0)
        kb->lru_prev[n] = p;
    else
        kb->lru_tail = p;
    kb->lru_prev[b] = kb->lru_next[b] = -1;
    kb->n_cached--;
}

static void lru_push_newest(struct kv_blocks *kb, int32_t b)
{
    kb->lru_prev[b] = -1;
    kb->lru_next[b] = kb->lru_head;
    if (kb->lru_head >= 0)
        kb->lru_prev[kb->lru_head] = b;
    else
        kb->lru_tail = b;
    kb->lru_head = b;
    kb->n_cached++;
}

static void unname(struct kv_blocks *kb, int32_t b)
{
    const uint32_t h = name_hash(kb, kb->parent[b], kb->parent_gen[b],
                                 kb->tokens + (size_t)b * (size_t)kb->block_size);
    for (int32_t *at = &kb->bucket[h]; *at >= 0; at = &kb->chain[*at]) {
        if (*at == b) {
            *at = kb->chain[b];
            break;
        }
    }
    kb->chain[b] = -1;
    kb->published[b] = false;
    kb->n_published--;
    kb->gen[b]++;
}

/* The least recently used cached block goes to the free stack. */
static void evict_oldest(struct kv_blocks *kb)
{
    const int32_t b = kb->lru_tail;
    lru_unlink(kb, b);
    unname(kb, b);
    kb->free_stack[kb->n_free++] = b;
    kb->evictions++;
}

int32_t kv_blocks_take(struct kv_blocks *kb)
{
    if (kb->n_free == 0)
        evict_oldest(kb);
    const int32_t b = kb->free_stack[--kb->n_free];
    kb->refs[b] = 1;
    /* new content: a name that took this block as its parent while it was
     * private must not lead to it again */
    kb->gen[b]++;
    return b;
}

void kv_blocks_drop(struct kv_blocks *kb, int32_t b)
{
    if (--kb->refs[b] > 0)
        return;
    if (!kb->published[b]) {
        kb->free_stack[kb->n_free++] = b;
        return;
    }
    lru_push_newest(kb, b);
    while (kb->n_cached > kb->cache_cap)
        evict_oldest(kb);
}

void kv_blocks_set_tokens(struct kv_blocks *kb, int32_t b, int off, const int32_t *tokens, int n)
{
    memcpy(kb->tokens + (size_t)b * (size_t)kb->block_size + off, tokens, (size_t)n * sizeof *tokens);
}

static bool name_is(const struct kv_blocks *kb, int32_t b, int32_t parent, uint32_t parent_gen,
                    const int32_t *tokens)
{
    return kb->parent[b] == parent && kb->parent_gen[b] == parent_gen &&
           memcmp(kb->tokens + (size_t)b * (size_t)kb->block_size, tokens,
                  (size_t)kb->block_size * sizeof *tokens) == 0;
}

static int32_t lookup(const struct kv_blocks *kb, int32_t parent, const int32_t *tokens)
{
    const uint32_t pg = parent >= 0 ? kb->gen[parent] : 0;
    for (int32_t b = kb->bucket[name_hash(kb, parent, pg, tokens)]; b >= 0; b = kb->chain[b])
        if (name_is(kb, b, parent, pg, tokens))
            return b;
    return -1;
}

void kv_blocks_publish(struct kv_blocks *kb, int32_t b, int32_t parent)
{
    const int32_t *tokens = kb->tokens + (size_t)b * (size_t)kb->block_size;
    /* a child of a private block could never be reached from the root */
    if (!kb->cache_on || kb->published[b] || (parent >= 0 && !kb->published[parent]) ||
        lookup(kb, parent, tokens) >= 0)
        return;
    kb->parent[b] = parent;
    kb->parent_gen[b] = parent >= 0 ? kb->gen[parent] : 0;
    const uint32_t h = name_hash(kb, parent, kb->parent_gen[b], tokens);
    kb->chain[b] = kb->bucket[h];
    kb->bucket[h] = b;
    kb->published[b] = true;
    kb->n_published++;
}

void kv_blocks_unpublish(struct kv_blocks *kb, int32_t b)
{
    if (kb->published[b])
        unname(kb, b);
}

int32_t kv_blocks_find(struct kv_blocks *kb, int32_t parent, const int32_t *tokens)
{
    if (!kb->cache_on)
        return -1;
    const int32_t b = lookup(kb, parent, tokens);
    if (b < 0)
        return -1;
    if (kb->refs[b]++ == 0)
        lru_unlink(kb, b);
    return b;
}

void kv_blocks_clear_cached(struct kv_blocks *kb)
{
    const int64_t evictions = kb->evictions;
    while (kb->n_cached > 0)
        evict_oldest(kb);
    kb->evictions = evictions; /* a clear is not pressure on the pool */
}

/* Where each block was seen by kv_blocks_check's walks. */
enum { SEEN_FREE = 1, SEEN_LRU = 2, SEEN_CHAIN = 4 };

static int check_free_stack(const struct kv_blocks *kb, uint8_t *seen, char *err)
{
    if (kb->n_free < 0 || kb->n_free > kb->n_blocks)
        return error_set(err, ERR_INTERNAL, "kv blocks: %d free of %d", kb->n_free, kb->n_blocks);
    for (int i = 0; i < kb->n_free; i++) {
        const int32_t b = kb->free_stack[i];
        if (b < 0 || b >= kb->n_blocks)
            return error_set(err, ERR_INTERNAL, "kv blocks: free stack entry %d is block %d", i, (int)b);
        if (seen[b] & SEEN_FREE)
            return error_set(err, ERR_INTERNAL, "kv blocks: block %d is on the free stack twice", (int)b);
        seen[b] |= SEEN_FREE;
    }
    return 0;
}

static int check_lru(const struct kv_blocks *kb, uint8_t *seen, char *err)
{
    int n = 0;
    int32_t prev = -1;
    for (int32_t b = kb->lru_head; b >= 0; prev = b, b = kb->lru_next[b]) {
        if (b >= kb->n_blocks || n >= kb->n_blocks || (seen[b] & SEEN_LRU))
            return error_set(err, ERR_INTERNAL, "kv blocks: the LRU list loops or leaves the pool at "
                             "block %d", (int)b);
        if (kb->lru_prev[b] != prev)
            return error_set(err, ERR_INTERNAL, "kv blocks: LRU block %d points back to %d, not %d",
                             (int)b, (int)kb->lru_prev[b], (int)prev);
        seen[b] |= SEEN_LRU;
        n++;
    }
    if (kb->lru_tail != prev)
        return error_set(err, ERR_INTERNAL, "kv blocks: LRU tail is %d, the list ends at %d",
                         (int)kb->lru_tail, (int)prev);
    if (n != kb->n_cached || n > kb->cache_cap)
        return error_set(err, ERR_INTERNAL, "kv blocks: %d blocks in the LRU list, n_cached %d, cap %d",
                         n, kb->n_cached, kb->cache_cap);
    return 0;
}

static int check_chains(const struct kv_blocks *kb, uint8_t *seen, char *err)
{
    int chained = 0;
    for (uint32_t h = 0; h < kb->n_buckets; h++) {
        for (int32_t b = kb->bucket[h]; b >= 0; b = kb->chain[b]) {
            if (b >= kb->n_blocks || (seen[b] & SEEN_CHAIN))
                return error_set(err, ERR_INTERNAL, "kv blocks: bucket %u's chain loops or meets "
                                 "block %d a second time", h, (int)b);
            seen[b] |= SEEN_CHAIN;
            chained++;
            if (!kb->published[b])
                return error_set(err, ERR_INTERNAL, "kv blocks: block %d is chained in bucket %u "
                                 "but not published (a stale name)", (int)b, h);
            const int32_t *tokens = kb->tokens + (size_t)b * (size_t)kb->block_size;
            const uint32_t want = name_hash(kb, kb->parent[b], kb->parent_gen[b], tokens);
            if (want != h)
                return error_set(err, ERR_INTERNAL, "kv blocks: block %d is chained in bucket %u "
                                 "but its name hashes to %u (its tokens changed while published)",
                                 (int)b, h, want);
            /* bounded: a loop further on is reported when the walk gets there */
            int steps = 0;
            for (int32_t o = kb->chain[b]; o >= 0 && o < kb->n_blocks && o != b && steps < kb->n_blocks;
                 o = kb->chain[o], steps++)
                if (name_is(kb, o, kb->parent[b], kb->parent_gen[b], tokens))
                    return error_set(err, ERR_INTERNAL, "kv blocks: blocks %d and %d are published "
                                     "under one name", (int)b, (int)o);
        }
    }
    if (chained != kb->n_published)
        return error_set(err, ERR_INTERNAL, "kv blocks: %d blocks chained, n_published %d", chained,
                         kb->n_published);
    if (!kb->cache_on && chained > 0)
        return error_set(err, ERR_INTERNAL, "kv blocks: %d blocks published with the cache off",
                         chained);
    return 0;
}

/* Each block in exactly one state, its flags agreeing with the walks. */
static int check_states(const struct kv_blocks *kb, const uint8_t *seen, char *err)
{
    for (int32_t b = 0; b < kb->n_blocks; b++) {
        const bool free_ = seen[b] & SEEN_FREE, lru = seen[b] & SEEN_LRU,
                   chained = seen[b] & SEEN_CHAIN;
        if (kb->published[b] != chained)
            return error_set(err, ERR_INTERNAL, "kv blocks: block %d is %spublished but %schained",
                             (int)b, kb->published[b] ? "" : "not ", chained ? "" : "not ");
        if (kb->refs[b] < 0)
            return error_set(err, ERR_INTERNAL, "kv blocks: block %d has %d holders", (int)b,
                             kb->refs[b]);
        const bool is_free = free_ && kb->refs[b] == 0 && !kb->published[b] && !lru;
        const bool is_cached = !free_ && kb->refs[b] == 0 && kb->published[b] && lru;
        const bool is_held = !free_ && kb->refs[b] > 0 && !lru;
        if (!is_free && !is_cached && !is_held)
            return error_set(err, ERR_INTERNAL, "kv blocks: block %d is in no single state (free "
                             "stack %d, holders %d, published %d, LRU %d)", (int)b, free_,
                             kb->refs[b], kb->published[b], lru);
    }
    return 0;
}

int kv_blocks_check(const struct kv_blocks *kb, char *err)
{
    if (kb->n_blocks <= 0)
        return 0;
    uint8_t *seen = calloc((size_t)kb->n_blocks, 1);
    if (!seen)
        return error_set(err, ERR_NOMEM, "kv blocks: out of memory for the check");
    int rc = check_free_stack(kb, seen, err);
    if (!rc)
        rc = check_lru(kb, seen, err);
    if (!rc)
        rc = check_chains(kb, seen, err);
    if (!rc)
        rc = check_states(kb, seen, err);
    free(seen);
    return rc;
}
