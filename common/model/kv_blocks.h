/* kv_blocks.h: the KV pool's block ledger: which blocks are free, which
 * slots hold which, and which full blocks are kept as a prefix cache.
 *
 * Only ids and counts live here (host memory); the keys and values are in
 * llama.c's pool, at the same block ids. A block is in exactly one of three
 * states:
 *   free      on the free stack, content garbage;
 *   held      in refs > 0 slots' tables;
 *   cached    held by no slot, but published: kept in a least-recently-used
 *             list and found by its name until a take needs it (evicted).
 * A held block may be published too (then other slots may map it).
 *
 * A published block's name is (its parent's id and generation, its
 * block_size token ids): the parent is the block before it in the table
 * that filled it (-1 for a sequence's first block). The generation of a
 * block changes whenever its content may change (evicted, or unpublished
 * to be written again), so a name can only ever find the content it was
 * published with, and a chain of names stands for exactly its token
 * prefix: no hash is trusted, every token id is compared.
 *
 * Invariants: a published block is full and its content never changes
 * while it is published; a slot never writes into a published block
 * (llama.c unpublishes it, or copies it when another slot holds it too).
 */
#ifndef TANDEM_KV_BLOCKS_H
#define TANDEM_KV_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

struct kv_blocks {
    int n_blocks, block_size;
    bool cache_on;      /* publish full blocks; false: a plain allocator */
    int cache_cap;      /* most cached (unheld) blocks kept; 0: the pool */
    int32_t *free_stack; /* [n_blocks] */
    int n_free;
    int *refs;           /* [n_blocks] slots holding the block */
    uint32_t *gen;       /* [n_blocks] */
    bool *published;     /* [n_blocks] */
    int32_t *tokens;     /* [n_blocks][block_size] the ids the block holds */
    int32_t *parent;     /* [n_blocks] the name's parent id, -1 for none */
    uint32_t *parent_gen; /* [n_blocks] */
    int32_t *bucket;     /* [n_buckets] first published block, -1 */
    int32_t *chain;      /* [n_blocks] next published block in the bucket */
    uint32_t n_buckets;  /* a power of two */
    int32_t *lru_prev, *lru_next; /* [n_blocks] cached blocks, newest at lru_head */
    int32_t lru_head, lru_tail;
    int n_cached;        /* blocks in the LRU list */
    int n_published;
    int64_t evictions;
};

/* cap_blocks: most cached blocks kept (0: as many as the pool has). 0 or
 * ERR_NOMEM. */
int kv_blocks_init(struct kv_blocks *kb, int n_blocks, int block_size, bool cache_on, int cap_blocks,
                   char *err);
void kv_blocks_free(struct kv_blocks *kb);

/* Blocks a take can hand out: free ones and cached ones (evicted). */
int kv_blocks_available(const struct kv_blocks *kb);
/* A block for one slot (refs 1, unpublished): a free one, else the least
 * recently used cached one, evicted. The caller checked availability. */
int32_t kv_blocks_take(struct kv_blocks *kb);
/* One slot lets go of b: with no holder left, a published block becomes
 * cached (newest), an unpublished one free. */
void kv_blocks_drop(struct kv_blocks *kb, int32_t b);

/* Records the token ids of positions off .. off + n - 1 of block b. */
void kv_blocks_set_tokens(struct kv_blocks *kb, int32_t b, int off, const int32_t *tokens, int n);
/* Publishes full block b (its tokens set) under parent (-1: a sequence's
 * first block). A block whose name is already published stays private: the
 * same content computed twice at once. */
void kv_blocks_publish(struct kv_blocks *kb, int32_t b, int32_t parent);
/* Withdraws b's name so its holder may write it again; its children's
 * names no longer lead anywhere. b must have one holder. */
void kv_blocks_unpublish(struct kv_blocks *kb, int32_t b);
/* The published block named (parent, tokens[0 .. block_size - 1]), taken
 * by one more slot (out of the LRU list if it was cached), or -1. */
int32_t kv_blocks_find(struct kv_blocks *kb, int32_t parent, const int32_t *tokens);
/* Frees every cached block (held ones stay). */
void kv_blocks_clear_cached(struct kv_blocks *kb);

/* Walks the whole ledger and checks the invariants above, those a bug
 * would break silently (a stale name maps KV another slot overwrites):
 * every block in exactly one state (free: on the free stack once, no
 * holder, no name, not in the LRU list; cached: no holder, named, in the
 * LRU list; held: refs > 0, off both); the LRU list linked both ways with
 * n_cached entries and at most cache_cap; every bucket's chain free of
 * cycles, holding only published blocks whose names hash to that bucket,
 * no name twice, n_published of them in all. 0, or ERR_INTERNAL with the
 * first broken invariant named in err. O(n_blocks * block_size): for
 * tests, and after every operation in the sanitizer build (llama.c). */
int kv_blocks_check(const struct kv_blocks *kb, char *err);

#endif
