/* suffix_cache.c: see suffix_cache.h. Stored requests sit on a list from
 * the most to the least recently used; each position that has a token
 * after its key is one posting in a hash bucket of its key, newest first,
 * doubly linked so that an evicted request takes its postings out in time
 * linear in its length. */
#include "suffix_cache.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Postings looked at per lookup: a key that occurred very often (a loop of
 * one token) costs no more than this. */
#define SUFFIX_CACHE_WALK_MAX 64

struct doc;

struct posting {
    struct posting *prev, *next; /* in its bucket, newest first */
    struct doc *doc;
    int pos;                     /* where its key starts in doc */
    uint32_t bucket;
};

struct doc {
    struct doc *newer, *older;   /* the LRU list */
    int n;
    size_t bytes;                /* what it counts against the budget */
    int32_t *tokens;             /* (n) */
    struct posting *postings;    /* (n - SUFFIX_CACHE_KEY) */
};

struct suffix_cache {
    size_t budget, used;
    size_t fixed;                /* the part of used that is no request's: the bucket table */
    struct posting **buckets;
    uint32_t n_buckets;          /* a power of two */
    struct doc *newest, *oldest;
    int n_docs;
    uint64_t evicted;
};

static uint32_t key_bucket(const struct suffix_cache *sc, const int32_t *key)
{
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < SUFFIX_CACHE_KEY; i++) {
        h ^= (uint32_t)key[i];
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return (uint32_t)h & (sc->n_buckets - 1);
}

int suffix_cache_create(struct suffix_cache **out, size_t budget_bytes, char *err)
{
    *out = NULL;
    /* about one bucket per 256 budgeted bytes (a position costs ~44) */
    uint32_t n_buckets = 1024;
    while (n_buckets < (1u << 22) && (size_t)n_buckets * 2 * 256 <= budget_bytes)
        n_buckets *= 2;
    const size_t table = (size_t)n_buckets * sizeof(struct posting *);
    if (budget_bytes < 2 * table)
        return error_set(err, ERR_INVALID_ARG, "suffix cache budget: at least %zu bytes, got %zu", 2 * table,
                         budget_bytes);
    struct suffix_cache *sc = calloc(1, sizeof *sc);
    if (sc)
        sc->buckets = calloc(n_buckets, sizeof *sc->buckets);
    if (!sc || !sc->buckets) {
        free(sc);
        return error_set(err, ERR_NOMEM, "suffix cache: out of memory");
    }
    sc->budget = budget_bytes;
    sc->n_buckets = n_buckets;
    sc->fixed = sc->used = table + sizeof *sc;
    *out = sc;
    return 0;
}

static void lru_unlink(struct suffix_cache *sc, struct doc *d)
{
    if (d->newer)
        d->newer->older = d->older;
    else
        sc->newest = d->older;
    if (d->older)
        d->older->newer = d->newer;
    else
        sc->oldest = d->newer;
    d->newer = d->older = NULL;
}

static void lru_push_newest(struct suffix_cache *sc, struct doc *d)
{
    d->older = sc->newest;
    d->newer = NULL;
    if (sc->newest)
        sc->newest->newer = d;
    sc->newest = d;
    if (!sc->oldest)
        sc->oldest = d;
}

static void doc_free(struct suffix_cache *sc, struct doc *d)
{
    for (int i = 0; i < d->n - SUFFIX_CACHE_KEY; i++) {
        struct posting *p = &d->postings[i];
        if (p->prev)
            p->prev->next = p->next;
        else
            sc->buckets[p->bucket] = p->next;
        if (p->next)
            p->next->prev = p->prev;
    }
    lru_unlink(sc, d);
    sc->used -= d->bytes;
    sc->n_docs--;
    free(d->postings);
    free(d->tokens);
    free(d);
}

void suffix_cache_destroy(struct suffix_cache *sc)
{
    if (!sc)
        return;
    while (sc->oldest)
        doc_free(sc, sc->oldest);
    free(sc->buckets);
    free(sc);
}

int suffix_cache_add(struct suffix_cache *sc, const int32_t *tokens, int n_tokens)
{
    if (n_tokens <= SUFFIX_CACHE_KEY)
        return 0; /* no key has a token after it */
    const int n_post = n_tokens - SUFFIX_CACHE_KEY;
    const size_t bytes =
        sizeof(struct doc) + (size_t)n_tokens * sizeof(int32_t) + (size_t)n_post * sizeof(struct posting);
    if (sc->fixed + bytes > sc->budget)
        return 0; /* even an empty cache could not hold it */
    struct doc *d = calloc(1, sizeof *d);
    if (d) {
        d->tokens = malloc((size_t)n_tokens * sizeof(int32_t));
        d->postings = calloc((size_t)n_post, sizeof(struct posting));
    }
    if (!d || !d->tokens || !d->postings) {
        if (d) {
            free(d->tokens);
            free(d->postings);
        }
        free(d);
        return ERR_NOMEM;
    }
    while (sc->oldest && sc->used + bytes > sc->budget) {
        doc_free(sc, sc->oldest);
        sc->evicted++;
    }
    memcpy(d->tokens, tokens, (size_t)n_tokens * sizeof(int32_t));
    d->n = n_tokens;
    d->bytes = bytes;
    for (int i = 0; i < n_post; i++) {
        struct posting *p = &d->postings[i];
        p->doc = d;
        p->pos = i;
        p->bucket = key_bucket(sc, &d->tokens[i]);
        p->next = sc->buckets[p->bucket];
        if (p->next)
            p->next->prev = p;
        sc->buckets[p->bucket] = p;
    }
    lru_push_newest(sc, d);
    sc->used += bytes;
    sc->n_docs++;
    return 0;
}

/* How far backwards from its key posting p matches hist: SUFFIX_CACHE_KEY
 * .. SUFFIX_CACHE_MATCH_MAX, or 0 when the key itself differs (a bucket
 * holds other keys too). */
static int match_length(const struct posting *p, const int32_t *hist, int n_hist)
{
    const int32_t *t = p->doc->tokens;
    if (memcmp(&t[p->pos], &hist[n_hist - SUFFIX_CACHE_KEY], SUFFIX_CACHE_KEY * sizeof(int32_t)) != 0)
        return 0;
    int len = SUFFIX_CACHE_KEY;
    while (len < SUFFIX_CACHE_MATCH_MAX && p->pos + SUFFIX_CACHE_KEY - len - 1 >= 0 && n_hist - len - 1 >= 0 &&
           t[p->pos + SUFFIX_CACHE_KEY - len - 1] == hist[n_hist - len - 1])
        len++;
    return len;
}

/* Up to max matching postings, the longest matches first and, among equal
 * lengths, the newest first (the bucket's order); returns how many. */
static int find_matches(const struct suffix_cache *sc, const int32_t *hist, int n_hist,
                        const struct posting **found, int *lens, int max)
{
    int n = 0, walked = 0;
    for (const struct posting *p = sc->buckets[key_bucket(sc, &hist[n_hist - SUFFIX_CACHE_KEY])];
         p && walked < SUFFIX_CACHE_WALK_MAX; p = p->next, walked++) {
        const int len = match_length(p, hist, n_hist);
        if (len == 0)
            continue;
        int at = n; /* after every longer or equal one: a stable insertion */
        while (at > 0 && lens[at - 1] < len)
            at--;
        if (at >= max)
            continue;
        for (int j = (n < max ? n : max - 1); j > at; j--)
            found[j] = found[j - 1], lens[j] = lens[j - 1];
        found[at] = p;
        lens[at] = len;
        if (n < max)
            n++;
    }
    return n;
}

/* The tokens that follow posting p's key, at most k_max; returns how many. */
static int continuation(const struct posting *p, int k_max, const int32_t **out)
{
    const int from = p->pos + SUFFIX_CACHE_KEY;
    *out = &p->doc->tokens[from];
    return p->doc->n - from < k_max ? p->doc->n - from : k_max;
}

static void touch(struct suffix_cache *sc, const struct posting *p)
{
    lru_unlink(sc, p->doc);
    lru_push_newest(sc, p->doc);
}

int suffix_cache_draft(struct suffix_cache *sc, const int32_t *hist, int n_hist, int k_max, int32_t *out,
                       int *match_len)
{
    if (match_len)
        *match_len = 0;
    if (n_hist < SUFFIX_CACHE_KEY || k_max < 1)
        return 0;
    const struct posting *best;
    int best_len;
    if (find_matches(sc, hist, n_hist, &best, &best_len, 1) == 0)
        return 0;
    const int32_t *from;
    const int k = continuation(best, k_max, &from);
    memcpy(out, from, (size_t)k * sizeof(int32_t));
    touch(sc, best);
    if (match_len)
        *match_len = best_len;
    return k;
}

int suffix_cache_draft_tree(struct suffix_cache *sc, const int32_t *hist, int n_hist, int depth_max,
                            int nodes_max, struct draft_tree *out, int *match_len)
{
    draft_tree_clear(out);
    if (match_len)
        *match_len = 0;
    if (n_hist < SUFFIX_CACHE_KEY || depth_max < 1 || nodes_max < 1)
        return 0;
    const struct posting *found[SUFFIX_CACHE_TREE_CANDIDATES];
    int lens[SUFFIX_CACHE_TREE_CANDIDATES];
    const int n = find_matches(sc, hist, n_hist, found, lens, SUFFIX_CACHE_TREE_CANDIDATES);
    for (int i = 0; i < n && out->n < nodes_max; i++) {
        const int32_t *from;
        const int k = continuation(found[i], depth_max, &from);
        draft_tree_add_chain(out, from, k, 1, nodes_max);
    }
    if (n > 0) {
        touch(sc, found[0]);
        if (match_len)
            *match_len = lens[0];
    }
    return out->n;
}

size_t suffix_cache_bytes(const struct suffix_cache *sc)
{
    return sc->used;
}

size_t suffix_cache_budget(const struct suffix_cache *sc)
{
    return sc->budget;
}

int suffix_cache_requests(const struct suffix_cache *sc)
{
    return sc->n_docs;
}

uint64_t suffix_cache_evicted(const struct suffix_cache *sc)
{
    return sc->evicted;
}
