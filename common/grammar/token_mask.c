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

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct trie_node {
    uint32_t end;   /* one past the last node of this subtree */
    uint32_t first; /* index into ids of this node's tokens */
    uint16_t n_tok;
    uint16_t depth;
    uint8_t byte;
    uint8_t utf8; /* NODE_* flags: the UTF-8 shape of the path to this node */
};

/* The path from the root to a node, read as UTF-8 from a character boundary:
 * NODE_AT_BOUNDARY: it ends at a character boundary; NODE_SUB_VALID: no path
 * in this node's subtree is ill-formed (a path may end inside a character). */
enum { NODE_AT_BOUNDARY = 1, NODE_SUB_VALID = 2, NODE_PARENT_AT_BOUNDARY = 4 };

struct token_mask_vocab {
    int32_t n_tokens;
    uint32_t *tok_before;   /* by node (and n_nodes): tokens at nodes before it */
    uint64_t (*sub_bytes)[4]; /* by node: the bytes in its subtree, itself included */
    uint16_t *sub_depth;      /* by node: the deepest depth in its subtree */
    uint16_t *sorted_len;     /* by position in ids: that token's length */
    uint16_t *path_chars;     /* by node: complete UTF-8 characters on its path */
    uint16_t *sorted_chars;   /* by position in ids: characters << 1 | ends inside one */
    uint8_t *bytes;   /* all tokens' bytes */
    size_t *offsets;  /* token i: bytes[offsets[i] .. offsets[i + 1]) */
    int32_t *ids;     /* tokens with bytes, sorted by bytes */
    struct trie_node *nodes;
    int32_t n_nodes;
    int32_t tok_count; /* tokens with bytes */
    int depth_max;
};

enum { CHAR_MIXED = -2, CHAR_UNKNOWN = -3 };

/* A state's bytes grouped by the state they lead to: bytes of one group are
 * interchangeable from that state. */
struct partition {
    const int32_t *row;
    int text_loop;  /* every well-formed multi-byte character leads back here:
                       1 yes, 0 no, -1 not known yet */
    int loop_group; /* the group of bytes leading back here, -1 none */
    int32_t char_next; /* where every multi-byte character leads: a state, DEAD,
                          CHAR_MIXED (not all to one), CHAR_UNKNOWN (not yet) */
    uint8_t group[256];
    uint64_t bits[][4];
};

struct token_mask {
    struct grammar_engine *e;
    const struct token_mask_vocab *v;
    size_t words, cache_max, cached_bytes;
    struct partition **parts; /* by state, made on first use */
    uint64_t nodes_walked, subtrees_admitted, walks;
    int32_t n_parts;
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

/* One byte of UTF-8 after a path that still needs `need` continuation bytes
 * (-1: already ill-formed); `prev` is the path's last byte, which decides the
 * range of the second byte after E0, ED, F0, F4 (RFC 3629). */
static int8_t utf8_step(int8_t need, uint8_t b, uint8_t prev)
{
    if (need < 0)
        return -1;
    if (need > 0) {
        unsigned lo = 0x80, hi = 0xBF;
        if (prev == 0xE0)
            lo = 0xA0;
        else if (prev == 0xED)
            hi = 0x9F;
        else if (prev == 0xF0)
            lo = 0x90;
        else if (prev == 0xF4)
            hi = 0x8F;
        /* the special ranges apply to the byte right after the lead only */
        int after_lead = (prev >= 0xC2 && prev <= 0xF4);
        if (!after_lead)
            lo = 0x80, hi = 0xBF;
        return b >= lo && b <= hi ? (int8_t)(need - 1) : -1;
    }
    if (b < 0x80)
        return 0;
    if (b >= 0xC2 && b <= 0xDF)
        return 1;
    if (b >= 0xE0 && b <= 0xEF)
        return 2;
    if (b >= 0xF0 && b <= 0xF4)
        return 3;
    return -1;
}

/* The per-node summaries the walk's shortcut reads: tokens before each node
 * (a subtree's tokens are ids[tok_before[i] .. tok_before[end])) and the
 * bytes in each subtree. */
static int summarize(struct token_mask_vocab *v, char *err)
{
    uint32_t n = (uint32_t)v->n_nodes;
    v->tok_before = malloc(((size_t)n + 1) * sizeof *v->tok_before);
    v->sub_bytes = calloc(n, sizeof *v->sub_bytes);
    v->sub_depth = malloc((size_t)n * sizeof *v->sub_depth);
    v->sorted_len = malloc(((size_t)v->tok_count + 1) * sizeof *v->sorted_len);
    v->path_chars = malloc((size_t)n * sizeof *v->path_chars);
    v->sorted_chars = malloc(((size_t)v->tok_count + 1) * sizeof *v->sorted_chars);
    uint32_t *parent = malloc((size_t)n * sizeof *parent);
    uint32_t *open = malloc(((size_t)v->depth_max + 1) * sizeof *open);
    if (!v->tok_before || !v->sub_bytes || !v->sub_depth || !v->sorted_len || !v->path_chars ||
        !v->sorted_chars || !parent || !open) {
        free(parent);
        free(open);
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    }
    uint32_t count = 0;
    open[0] = 0;
    /* need[i]: continuation bytes still expected after node i's path; -1 ill-formed */
    int8_t *need = malloc(n);
    if (!need) {
        free(parent);
        free(open);
        return error_set(err, ERR_NOMEM, "token mask: out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        v->tok_before[i] = count;
        count += v->nodes[i].n_tok;
        open[v->nodes[i].depth] = i;
        v->sub_depth[i] = v->nodes[i].depth;
        parent[i] = i ? open[v->nodes[i].depth - 1] : 0;
        need[i] = i ? utf8_step(need[parent[i]], v->nodes[i].byte, v->nodes[parent[i]].byte) : 0;
        v->path_chars[i] = (uint16_t)(i ? v->path_chars[parent[i]] + (need[i] == 0) : 0);
        for (uint32_t k = v->nodes[i].first; k < v->nodes[i].first + v->nodes[i].n_tok; k++)
            v->sorted_chars[k] = (uint16_t)(v->path_chars[i] << 1 | (need[i] > 0));
        v->nodes[i].utf8 = (uint8_t)((need[i] == 0 ? NODE_AT_BOUNDARY : 0) |
                                     (need[i] >= 0 ? NODE_SUB_VALID : 0) |
                                     (need[parent[i]] == 0 ? NODE_PARENT_AT_BOUNDARY : 0));
    }
    free(need);
    v->tok_before[n] = count;
    for (uint32_t k = 0; k < count; k++)
        v->sorted_len[k] = (uint16_t)(v->offsets[v->ids[k] + 1] - v->offsets[v->ids[k]]);
    for (uint32_t i = n - 1; i >= 1; i--) {
        uint8_t b = v->nodes[i].byte;
        v->sub_bytes[i][b >> 6] |= 1ull << (b & 63);
        for (int k = 0; k < 4; k++)
            v->sub_bytes[parent[i]][k] |= v->sub_bytes[i][k];
        if (v->sub_depth[i] > v->sub_depth[parent[i]])
            v->sub_depth[parent[i]] = v->sub_depth[i];
        if (!(v->nodes[i].utf8 & NODE_SUB_VALID))
            v->nodes[parent[i]].utf8 &= (uint8_t)~NODE_SUB_VALID;
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
    v->nodes[0] = (struct trie_node){0, 0, 0, 0, 0, 0};
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
            v->nodes[n] = (struct trie_node){0, 0, 0, (uint16_t)d, b[d - 1], 0};
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
        v->tok_count = n_with;
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
    free(v->sub_depth);
    free(v->sorted_len);
    free(v->path_chars);
    free(v->sorted_chars);
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
    for (int32_t k = 0; k < m->n_parts; k++)
        free(m->parts[k]);
    free(m->parts);
    free(m->walk_state);
    free(m->walk_row);
    free(m);
}

size_t token_mask_words(const struct token_mask *m)
{
    return m->words;
}

/* The partition of `state` (made on first use); NULL when out of memory or
 * past the engine's cap, which only costs the shortcut (the walk then meets
 * the error itself). */
static const struct partition *partition_of(struct token_mask *m, int32_t state)
{
    if (state < 0) /* CHAR_MIXED and CHAR_UNKNOWN are not states */
        return NULL;
    if (state >= m->n_parts) {
        int32_t n = m->n_parts ? m->n_parts : 256;
        while (n <= state)
            n *= 2;
        struct partition **p = realloc(m->parts, (size_t)n * sizeof *p);
        if (!p)
            return NULL;
        memset(p + m->n_parts, 0, (size_t)(n - m->n_parts) * sizeof *p);
        m->parts = p;
        m->n_parts = n;
    }
    if (m->parts[state])
        return m->parts[state];
    int rc;
    char err[ERR_MSG_MAX];
    const int32_t *row = grammar_engine_row(m->e, state, &rc, err);
    if (!row)
        return NULL;
    int32_t first_of[256]; /* the first byte of each group */
    uint8_t group[256];
    int n_groups = 0;
    for (unsigned b = 0; b < 256; b++) {
        int g = 0;
        while (g < n_groups && row[first_of[g]] != row[b])
            g++;
        if (g == n_groups)
            first_of[n_groups++] = (int32_t)b;
        group[b] = (uint8_t)g;
    }
    struct partition *p = calloc(1, sizeof *p + (size_t)n_groups * sizeof p->bits[0]);
    if (!p)
        return NULL;
    p->row = row;
    p->text_loop = -1;
    p->loop_group = -1;
    p->char_next = CHAR_UNKNOWN;
    for (int g = 0; g < n_groups; g++)
        if (row[first_of[g]] == state)
            p->loop_group = g;
    memcpy(p->group, group, sizeof group);
    for (unsigned b = 0; b < 256; b++)
        p->bits[group[b]][b >> 6] |= 1ull << (b & 63);
    m->parts[state] = p;
    return p;
}

static int subset(const uint64_t *a, const uint64_t *b)
{
    return !(a[0] & ~b[0]) && !(a[1] & ~b[1]) && !(a[2] & ~b[2]) && !(a[3] & ~b[3]);
}

/* Where every well-formed multi-byte UTF-8 character leads `state` (each
 * byte range of each form of RFC 3629 moving as one, no character dying
 * half-way): a state, DEAD (every lead byte refused), or CHAR_MIXED. */
static int32_t char_next(struct token_mask *m, int32_t state, struct partition *p)
{
    static const uint8_t forms[][2][4] = {
        {{0xC2, 0x80}, {0xDF, 0xBF}},             {{0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}},
        {{0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}}, {{0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}},
        {{0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}}, {{0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}},
        {{0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}},
        {{0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}},
    };
    if (p->char_next != CHAR_UNKNOWN)
        return p->char_next;
    int32_t target = CHAR_UNKNOWN;
    for (size_t f = 0; f < sizeof forms / sizeof *forms && target != CHAR_MIXED; f++) {
        int32_t t = state;
        for (int k = 0; k < 4 && forms[f][0][k] && t != GRAMMAR_STATE_DEAD; k++) {
            const struct partition *q = partition_of(m, t);
            uint64_t range[4] = {0};
            for (unsigned b = forms[f][0][k]; b <= forms[f][1][k]; b++)
                range[b >> 6] |= 1ull << (b & 63);
            if (!q || !subset(range, q->bits[q->group[forms[f][0][k]]])) {
                t = CHAR_MIXED;
                break;
            }
            t = q->row[forms[f][0][k]];
            if (t == GRAMMAR_STATE_DEAD && k > 0) {
                t = CHAR_MIXED; /* a character that dies half-way */
                break;
            }
        }
        target = target == CHAR_UNKNOWN || target == t ? t : CHAR_MIXED;
    }
    p->char_next = target;
    return target;
}

static int text_loop(struct token_mask *m, int32_t state, struct partition *p)
{
    return char_next(m, state, p) == state;
}

/* Where every character of node i's subtree leads `t` (its ASCII bytes and,
 * if it has any, every multi-byte character), or CHAR_MIXED. */
static int32_t char_step(struct token_mask *m, int32_t t, uint32_t i)
{
    const uint64_t *sub = m->v->sub_bytes[i];
    struct partition *p = (struct partition *)partition_of(m, t);
    if (!p)
        return CHAR_MIXED;
    int32_t u = CHAR_UNKNOWN;
    if (sub[0] | sub[1]) {
        unsigned b = sub[0] ? (unsigned)__builtin_ctzll(sub[0]) : 64 + (unsigned)__builtin_ctzll(sub[1]);
        const uint64_t *g = p->bits[p->group[b]];
        if ((sub[0] & ~g[0]) || (sub[1] & ~g[1]))
            return CHAR_MIXED;
        u = p->row[b];
    }
    if (sub[2] | sub[3]) {
        int32_t c = char_next(m, t, p);
        u = u == CHAR_UNKNOWN || u == c ? c : CHAR_MIXED;
    }
    return u;
}

/* The bounded-text shortcut: from a character boundary, when every
 * character of the subtree moves alike along the chain from `from` (a
 * string's maxLength counts), a token is admitted by its number of
 * characters alone: c whole characters (plus one begun) need the chain to
 * live c (c + 1) steps. Returns 1 when it applied. */
static int admit_text_chain(struct token_mask *m, int32_t from, uint32_t i, uint64_t *bits)
{
    const struct token_mask_vocab *v = m->v;
    const struct trie_node *node = &v->nodes[i];
    if ((node->utf8 & (NODE_PARENT_AT_BOUNDARY | NODE_SUB_VALID)) !=
        (NODE_PARENT_AT_BOUNDARY | NODE_SUB_VALID))
        return 0;
    int base = v->path_chars[i] - (node->utf8 & NODE_AT_BOUNDARY ? 1 : 0);
    int span = v->sub_depth[i] - node->depth + 1, live = 0;
    int32_t t = from;
    for (int j = 0; j < span; j++) {
        t = char_step(m, t, i);
        if (t == CHAR_MIXED || t == CHAR_UNKNOWN)
            return 0;
        if (t == GRAMMAR_STATE_DEAD)
            break;
        live = j + 1;
    }
    for (uint32_t k = v->tok_before[i]; k < v->tok_before[node->end]; k++) {
        int need = (v->sorted_chars[k] >> 1) - base + (v->sorted_chars[k] & 1);
        if (need <= live)
            bits[v->ids[k] >> 6] |= 1ull << (v->ids[k] & 63);
    }
    return 1;
}

/* The text shortcut: from a state where text loops (every safe ASCII byte and
 * every well-formed character leads back to it), a subtree whose paths are
 * well-formed UTF-8 (possibly ending inside a character) from a character
 * boundary, with only looping ASCII bytes, is admitted whole: inside a JSON
 * string that is most of a multilingual vocabulary. Returns 1 when it
 * applied. */
static int admit_text(struct token_mask *m, int32_t from, uint32_t i, uint64_t *bits)
{
    const struct token_mask_vocab *v = m->v;
    const struct trie_node *node = &v->nodes[i];
    if ((node->utf8 & (NODE_PARENT_AT_BOUNDARY | NODE_SUB_VALID)) !=
        (NODE_PARENT_AT_BOUNDARY | NODE_SUB_VALID))
        return 0;
    struct partition *p = (struct partition *)partition_of(m, from);
    if (!p || p->loop_group < 0)
        return 0;
    const uint64_t *loop = p->bits[p->loop_group], *sub = v->sub_bytes[i];
    if ((sub[0] & ~loop[0]) || (sub[1] & ~loop[1]) || !text_loop(m, from, p))
        return 0;
    for (uint32_t k = v->tok_before[i]; k < v->tok_before[node->end]; k++)
        bits[v->ids[k] >> 6] |= 1ull << (v->ids[k] & 63);
    return 1;
}

/* The shortcut: when every byte in node i's subtree leads, from each state
 * of the chain `from` -> row[byte] -> ..., to one same state, every token
 * below i meets the same states and only its length decides: the tokens no
 * longer than the chain's live part are admitted, without walking. That
 * covers the body of a JSON string (a chain of one state looping to itself)
 * and bounded counts (maxLength, whitespace: a chain of states). Returns 1
 * when it applied. */
static int admit_uniform(struct token_mask *m, int32_t from, uint32_t i, uint64_t *bits)
{
    const struct token_mask_vocab *v = m->v;
    const struct trie_node *node = &v->nodes[i];
    int depth0 = node->depth - 1, live = 0, span = v->sub_depth[i] - depth0;
    int32_t t = from;
    for (int j = 0; j < span; j++) {
        const struct partition *p = partition_of(m, t);
        if (!p || !subset(v->sub_bytes[i], p->bits[p->group[node->byte]]))
            return 0;
        t = p->row[node->byte];
        if (t == GRAMMAR_STATE_DEAD)
            break;
        live = j + 1;
    }
    for (uint32_t k = v->tok_before[i]; k < v->tok_before[node->end]; k++) {
        int32_t id = v->ids[k];
        if (live == span || v->sorted_len[k] - depth0 <= live)
            bits[id >> 6] |= 1ull << (id & 63);
    }
    return 1;
}

/* The trie walk: bits must be zeroed by the caller. */
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
        m->nodes_walked++;
        if (node->end > i + 1 && (admit_text(m, from, i, bits) || admit_uniform(m, from, i, bits) ||
                                  admit_text_chain(m, from, i, bits))) {
            m->subtrees_admitted++;
            i = node->end;
            continue;
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
    m->walks++;
    int rc = walk(m, state, bits, err);
    if (rc)
        return rc;
    cache_store(m, state, bits);
    return 0;
}

void token_mask_counts(const struct token_mask *m, uint64_t *walks, uint64_t *nodes_walked,
                       uint64_t *subtrees_admitted)
{
    *walks = m->walks;
    *nodes_walked = m->nodes_walked;
    *subtrees_admitted = m->subtrees_admitted;
}

static int is_eos(const struct token_mask_eos *eos, int32_t id)
{
    for (int i = 0; eos && i < eos->n; i++)
        if (eos->ids[i] == id)
            return 1;
    return 0;
}

/* Most EOS ids whose logits apply keeps aside (a model lists a few). */
#define APPLY_EOS_MAX 16

int32_t token_mask_apply(const uint64_t *bits, float *logits, int32_t n_vocab,
                         const struct token_mask_eos *eos, int can_end)
{
    /* A word at a time: outside strings almost every word is all refused,
     * inside them all allowed, and a whole row is written per token (per
     * token at 128,256 entries, a bit test each cost 180 us). The EOS ids
     * have no bytes, so no bit: their logits are kept aside and put back
     * where the grammar can end. */
    float kept[APPLY_EOS_MAX];
    int n_eos = 0;
    if (can_end && eos)
        for (int e = 0; e < eos->n && n_eos < APPLY_EOS_MAX; e++, n_eos++)
            kept[n_eos] = eos->ids[e] >= 0 && eos->ids[e] < n_vocab ? logits[eos->ids[e]] : 0.0f;
    int32_t allowed = 0;
    const int32_t n_words = n_vocab / 64;
    for (int32_t w = 0; w < n_words; w++) {
        const uint64_t b = bits[w];
        float *row = logits + (size_t)w * 64;
        if (b == ~0ULL) {
            allowed += 64;
        } else if (b == 0) {
            for (int k = 0; k < 64; k++)
                row[k] = -INFINITY;
        } else {
            allowed += __builtin_popcountll(b);
            for (int k = 0; k < 64; k++)
                row[k] = (b >> k) & 1 ? row[k] : -INFINITY;
        }
    }
    for (int32_t i = n_words * 64; i < n_vocab; i++) {
        if (token_mask_test(bits, i))
            allowed++;
        else
            logits[i] = -INFINITY;
    }
    for (int e = 0; e < n_eos; e++) {
        const int32_t id = eos->ids[e];
        if (id < 0 || id >= n_vocab || token_mask_test(bits, id))
            continue;
        /* an id listed twice is counted once */
        int seen = 0;
        for (int f = 0; f < e; f++)
            seen |= eos->ids[f] == id;
        if (!seen)
            allowed++;
        logits[id] = kept[e];
    }
    return allowed;
}

int token_mask_take(struct grammar_matcher *m, const struct token_mask_vocab *v,
                    const struct token_mask_eos *eos, int32_t id, char *err)
{
    if (id < 0 || id >= v->n_tokens) {
        if (!is_eos(eos, id))
            return error_set(err, ERR_RANGE, "grammar: token %d outside the vocabulary", (int)id);
    }
    const int32_t state = grammar_matcher_state(m);
    if (is_eos(eos, id)) {
        if (!grammar_engine_can_end(m->engine, state))
            return error_set(err, ERR_INVALID_ARG, "grammar: the end of the output at token %d "
                             "comes before the grammar is complete", (int)id);
        return grammar_matcher_accept(m, "", 0, err);
    }
    size_t len;
    const uint8_t *b = token_mask_vocab_bytes(v, id, &len);
    if (!b)
        return error_set(err, ERR_INVALID_ARG, "grammar: token %d has no text the grammar allows",
                         (int)id);
    const int rc = grammar_matcher_accept(m, b, len, err);
    if (rc == ERR_INVALID_ARG)
        error_set(err, rc, "grammar: token %d does not match the grammar", (int)id);
    return rc;
}

int token_mask_accept_tokens(struct grammar_matcher *m, const struct token_mask_vocab *v,
                             const int32_t *tokens, int n, const struct token_mask_eos *eos,
                             char *err)
{
    int n_ok = 0;
    for (int i = 0; i < n; i++) {
        const int rc = token_mask_take(m, v, eos, tokens[i], err);
        if (rc == ERR_INVALID_ARG)
            return n_ok;
        if (rc)
            return rc;
        ++n_ok;
        if (is_eos(eos, tokens[i]))
            return n_ok;
    }
    return n_ok;
}
