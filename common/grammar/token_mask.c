/* token_mask.c: the preorder token trie and the masked walk over it.
 *
 * The trie is an array of nodes in preorder; node i's subtree is
 * [i, end). Node 0 is the root (no byte). Tokens sharing a node (equal
 * bytes) are consecutive in `ids` (the tokens sorted by bytes). Walking in
 * array order visits parents before children and a skipped subtree is one
 * jump, so a walk reads the array front to back.
 */
#include "token_mask.h"

#include "error.h"

#include <stdlib.h>
#include <string.h>

struct trie_node {
    uint32_t end;   /* one past the last node of this subtree */
    uint32_t first; /* index into ids of this node's tokens */
    uint16_t n_tok;
    uint16_t depth;
    uint8_t byte;
};

struct token_mask_vocab {
    int32_t n_tokens;
    uint32_t *tok_before;   /* by node (and n_nodes): tokens at nodes before it */
    uint64_t (*sub_bytes)[4]; /* by node: the bytes in its subtree, itself included */
    uint8_t *bytes;   /* all tokens' bytes */
    size_t *offsets;  /* token i: bytes[offsets[i] .. offsets[i + 1]) */
    int32_t *ids;     /* tokens with bytes, sorted by bytes */
    struct trie_node *nodes;
    int32_t n_nodes;
    int depth_max;
};

struct token_mask {
    struct grammar_engine *e;
    const struct token_mask_vocab *v;
    size_t words, cache_max, cached_bytes;
    uint64_t (*loops)[4]; /* by state: the bytes that lead back to it */
    uint8_t *loops_known;
    int32_t n_loops;
    uint64_t **cache; /* by state id */
    int32_t n_cache;
    int32_t *walk_state;        /* by depth */
    const int32_t **walk_row;   /* by depth */
};

/* A token while sorting: qsort's comparator has no context argument. */
struct sort_key {
    const uint8_t *p;
    size_t len;
    int32_t id;
};

static int cmp_keys(const void *a, const void *b)
{
    const struct sort_key *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int sort_ids(struct token_mask_vocab *v, int32_t n_with)
{
    struct sort_key *keys = malloc(((size_t)n_with + 1) * sizeof *keys);
    if (!keys)
        return ERR_NOMEM;
    for (int32_t k = 0; k < n_with; k++) {
        int32_t id = v->ids[k];
        keys[k] = (struct sort_key){v->bytes + v->offsets[id], v->offsets[id + 1] - v->offsets[id], id};
    }
    qsort(keys, (size_t)n_with, sizeof *keys, cmp_keys);
    for (int32_t k = 0; k < n_with; k++)
        v->ids[k] = keys[k].id;
    free(keys);
    return 0;
}

/* Copies the tokens' bytes; counts those with bytes. */
static int copy_bytes(struct token_mask_vocab *v, const uint8_t *const *bytes, const size_t *lens,
                      int32_t *n_with, char *err)
{
    size_t total = 0;
    *n_with = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        size_t len = bytes[i] ? lens[i] : 0;
        if (len > TOKEN_MASK_TOKEN_BYTES_MAX)
            return error_set(err, ERR_INVALID_ARG, "token %d: %zu bytes, more than %d", i, len,
                             TOKEN_MASK_TOKEN_BYTES_MAX);
        total += len;
        *n_with += len > 0;
    }
    v->bytes = malloc(total ? total : 1);
    v->offsets = malloc(((size_t)v->n_tokens + 1) * sizeof *v->offsets);
    v->ids = malloc(((size_t)*n_with + 1) * sizeof *v->ids);
    if (!v->bytes || !v->offsets || !v->ids)
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    size_t off = 0;
    int32_t k = 0;
    for (int32_t i = 0; i < v->n_tokens; i++) {
        size_t len = bytes[i] ? lens[i] : 0;
        v->offsets[i] = off;
        if (len)
            memcpy(v->bytes + off, bytes[i], len), v->ids[k++] = i;
        off += len;
    }
    v->offsets[v->n_tokens] = off;
    return 0;
}

/* The per-node summaries the walk's shortcut reads: tokens before each node
 * (a subtree's tokens are ids[tok_before[i] .. tok_before[end])) and the
 * bytes in each subtree. */
static int summarize(struct token_mask_vocab *v, char *err)
{
    uint32_t n = (uint32_t)v->n_nodes;
    v->tok_before = malloc(((size_t)n + 1) * sizeof *v->tok_before);
    v->sub_bytes = calloc(n, sizeof *v->sub_bytes);
    uint32_t *parent = malloc((size_t)n * sizeof *parent);
    uint32_t *open = malloc(((size_t)v->depth_max + 1) * sizeof *open);
    if (!v->tok_before || !v->sub_bytes || !parent || !open) {
        free(parent);
        free(open);
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    }
    uint32_t count = 0;
    open[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        v->tok_before[i] = count;
        count += v->nodes[i].n_tok;
        open[v->nodes[i].depth] = i;
        parent[i] = i ? open[v->nodes[i].depth - 1] : 0;
    }
    v->tok_before[n] = count;
    for (uint32_t i = n - 1; i >= 1; i--) {
        uint8_t b = v->nodes[i].byte;
        v->sub_bytes[i][b >> 6] |= 1ull << (b & 63);
        for (int k = 0; k < 4; k++)
            v->sub_bytes[parent[i]][k] |= v->sub_bytes[i][k];
    }
    free(parent);
    free(open);
    return 0;
}

/* Builds the preorder trie from the sorted ids. */
static int build_trie(struct token_mask_vocab *v, int32_t n_with, char *err)
{
    size_t total = v->offsets[v->n_tokens];
    v->nodes = malloc((total + 1) * sizeof *v->nodes);
    uint32_t *path = malloc((TOKEN_MASK_TOKEN_BYTES_MAX + 1) * sizeof *path);
    if (!v->nodes || !path) {
        free(path);
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    }
    v->nodes[0] = (struct trie_node){0, 0, 0, 0, 0};
    path[0] = 0;
    uint32_t n = 1;
    size_t depth = 0;
    const uint8_t *prev = NULL;
    size_t prev_len = 0;
    for (int32_t k = 0; k < n_with; k++) {
        int32_t id = v->ids[k];
        const uint8_t *b = v->bytes + v->offsets[id];
        size_t len = v->offsets[id + 1] - v->offsets[id], lcp = 0;
        while (prev && lcp < len && lcp < prev_len && b[lcp] == prev[lcp])
            lcp++;
        for (; depth > lcp; depth--)
            v->nodes[path[depth]].end = n;
        for (size_t d = lcp + 1; d <= len; d++) {
            v->nodes[n] = (struct trie_node){0, 0, 0, (uint16_t)d, b[d - 1]};
            path[d] = n++;
        }
        depth = len;
        struct trie_node *node = &v->nodes[path[len]];
        if (node->n_tok++ == 0)
            node->first = (uint32_t)k;
        if ((int)len > v->depth_max)
            v->depth_max = (int)len;
        prev = b, prev_len = len;
    }
    for (; depth > 0; depth--)
        v->nodes[path[depth]].end = n;
    v->nodes[0].end = n;
    v->n_nodes = (int32_t)n;
    free(path);
    return summarize(v, err);
}

int token_mask_vocab_create(struct token_mask_vocab **out, const uint8_t *const *bytes,
                            const size_t *lens, int32_t n_tokens, char *err)
{
    if (n_tokens <= 0)
        return error_set(err, ERR_INVALID_ARG, "token mask: empty vocabulary");
    struct token_mask_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    v->n_tokens = n_tokens;
    int32_t n_with;
    int rc = copy_bytes(v, bytes, lens, &n_with, err);
    if (rc == 0) {
        rc = sort_ids(v, n_with) ? error_set(err, ERR_NOMEM, "token mask: out of memory")
                                 : build_trie(v, n_with, err);
    }
    if (rc) {
        token_mask_vocab_destroy(v);
        return rc;
    }
    *out = v;
    return 0;
}

void token_mask_vocab_destroy(struct token_mask_vocab *v)
{
    if (!v)
        return;
    free(v->bytes);
    free(v->offsets);
    free(v->ids);
    free(v->nodes);
    free(v->tok_before);
    free(v->sub_bytes);
    free(v);
}

int32_t token_mask_vocab_n_tokens(const struct token_mask_vocab *v)
{
    return v->n_tokens;
}

int32_t token_mask_vocab_n_nodes(const struct token_mask_vocab *v)
{
    return v->n_nodes;
}

const uint8_t *token_mask_vocab_bytes(const struct token_mask_vocab *v, int32_t id, size_t *len)
{
    *len = 0;
    if (id < 0 || id >= v->n_tokens || v->offsets[id + 1] == v->offsets[id])
        return NULL;
    *len = v->offsets[id + 1] - v->offsets[id];
    return v->bytes + v->offsets[id];
}

int token_mask_create(struct token_mask **out, struct grammar_engine *e,
                      const struct token_mask_vocab *v, size_t cache_max_bytes, char *err)
{
    struct token_mask *m = calloc(1, sizeof *m);
    if (!m)
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    m->e = e;
    m->v = v;
    m->words = ((size_t)v->n_tokens + 63) / 64;
    m->cache_max = cache_max_bytes ? cache_max_bytes : (size_t)64 << 20;
    m->walk_state = malloc(((size_t)v->depth_max + 1) * sizeof *m->walk_state);
    m->walk_row = malloc(((size_t)v->depth_max + 1) * sizeof *m->walk_row);
    if (!m->walk_state || !m->walk_row) {
        token_mask_destroy(m);
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    }
    *out = m;
    return 0;
}

static void cache_clear(struct token_mask *m)
{
    for (int32_t s = 0; s < m->n_cache; s++) {
        free(m->cache[s]);
        m->cache[s] = NULL;
    }
    m->cached_bytes = 0;
}

void token_mask_destroy(struct token_mask *m)
{
    if (!m)
        return;
    cache_clear(m);
    free(m->cache);
    free(m->loops);
    free(m->loops_known);
    free(m->walk_state);
    free(m->walk_row);
    free(m);
}

size_t token_mask_words(const struct token_mask *m)
{
    return m->words;
}

/* The bytes that lead from `state` back to itself (computed once per state);
 * NULL when out of memory, which only costs the shortcut. */
static const uint64_t *loop_bytes(struct token_mask *m, int32_t state, const int32_t *row)
{
    if (state >= m->n_loops) {
        int32_t n = m->n_loops ? m->n_loops : 256;
        while (n <= state)
            n *= 2;
        uint64_t(*l)[4] = realloc(m->loops, (size_t)n * sizeof *l);
        if (!l)
            return NULL;
        m->loops = l;
        uint8_t *k = realloc(m->loops_known, (size_t)n);
        if (!k)
            return NULL;
        memset(k + m->n_loops, 0, (size_t)(n - m->n_loops));
        m->loops_known = k;
        m->n_loops = n;
    }
    if (!m->loops_known[state]) {
        memset(m->loops[state], 0, sizeof m->loops[state]);
        for (unsigned b = 0; b < 256; b++)
            if (row[b] == state)
                m->loops[state][b >> 6] |= 1ull << (b & 63);
        m->loops_known[state] = 1;
    }
    return m->loops[state];
}

static int subset(const uint64_t *a, const uint64_t *b)
{
    return !(a[0] & ~b[0]) && !(a[1] & ~b[1]) && !(a[2] & ~b[2]) && !(a[3] & ~b[3]);
}

/* The trie walk: bits must be zeroed by the caller. A node whose byte leads
 * from state s back to s, and whose subtree holds only such bytes, admits
 * every token below it without a step: inside a JSON string that skips most
 * of the vocabulary. */
static int walk(struct token_mask *m, int32_t state, uint64_t *bits, char *err)
{
    const struct token_mask_vocab *v = m->v;
    const struct trie_node *nodes = v->nodes;
    int rc;
    m->walk_state[0] = state;
    if (!(m->walk_row[0] = grammar_engine_row(m->e, state, &rc, err)))
        return rc;
    uint32_t i = 1, n = (uint32_t)v->n_nodes;
    while (i < n) {
        const struct trie_node *node = &nodes[i];
        int32_t from = m->walk_state[node->depth - 1];
        int32_t next = m->walk_row[node->depth - 1][node->byte];
        if (next == GRAMMAR_STATE_DEAD) {
            i = node->end;
            continue;
        }
        if (next == from && node->end > i + 1) {
            const uint64_t *loops = loop_bytes(m, from, m->walk_row[node->depth - 1]);
            if (loops && subset(v->sub_bytes[i], loops)) {
                for (uint32_t k = v->tok_before[i]; k < v->tok_before[node->end]; k++)
                    bits[v->ids[k] >> 6] |= 1ull << (v->ids[k] & 63);
                i = node->end;
                continue;
            }
        }
        for (uint32_t k = node->first; k < node->first + node->n_tok; k++) {
            int32_t id = v->ids[k];
            bits[id >> 6] |= 1ull << (id & 63);
        }
        if (node->end > i + 1) { /* children follow: they need this state's row */
            m->walk_state[node->depth] = next;
            if (!(m->walk_row[node->depth] = grammar_engine_row(m->e, next, &rc, err)))
                return rc;
        }
        i++;
    }
    return 0;
}

/* Keeps a copy of the mask of `state`; a full cache is emptied first. */
static void cache_store(struct token_mask *m, int32_t state, const uint64_t *bits)
{
    size_t bytes = m->words * sizeof *bits;
    if (state >= m->n_cache) {
        int32_t n = m->n_cache ? m->n_cache : 256;
        while (n <= state)
            n *= 2;
        uint64_t **c = realloc(m->cache, (size_t)n * sizeof *c);
        if (!c)
            return; /* a cache miss later, not an error */
        memset(c + m->n_cache, 0, (size_t)(n - m->n_cache) * sizeof *c);
        m->cache = c;
        m->n_cache = n;
    }
    if (bytes > m->cache_max)
        return;
    if (m->cached_bytes + bytes > m->cache_max)
        cache_clear(m);
    uint64_t *copy = malloc(bytes);
    if (!copy)
        return;
    memcpy(copy, bits, bytes);
    m->cache[state] = copy;
    m->cached_bytes += bytes;
}

int token_mask_compute(struct token_mask *m, int32_t state, uint64_t *bits, char *err)
{
    size_t bytes = m->words * sizeof *bits;
    if (state < m->n_cache && m->cache[state]) {
        memcpy(bits, m->cache[state], bytes);
        return 0;
    }
    memset(bits, 0, bytes);
    if (state == GRAMMAR_STATE_DEAD)
        return 0;
    int rc = walk(m, state, bits, err);
    if (rc)
        return rc;
    cache_store(m, state, bits);
    return 0;
}
