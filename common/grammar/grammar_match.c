/* grammar_match.c: interned stacks, interned stack sets, lazily built rows.
 *
 * A stack is a chain of nodes (pos, parent): pos indexes the grammar's
 * flattened elements (what comes next), parent is the node to continue with
 * when the alternative at pos ends (-1: the end of the root rule). Node 0 is
 * not a stack but the "accepted" marker a set holds when its input may end.
 * A set (a state) is a sorted array of node ids whose top elements are all
 * byte classes, plus possibly node 0.
 *
 * Expanding a node pushes rule references down to their first byte classes;
 * a reference followed by the end of its alternative reuses the parent
 * instead of pushing a continuation (tail calls), so right recursion such as
 * `items ::= item items | ""` runs in constant stack depth.
 * grammar.c refuses grammars with nullable left cycles, so expansion ends.
 */
#include "grammar_match.h"

#include "error.h"

#include <stdlib.h>
#include <string.h>

struct node {
    int32_t pos, parent;
};

struct grammar_engine {
    struct grammar *g;
    size_t memory_max, memory;
    /* nodes */
    struct node *nodes;
    uint32_t *node_stamp;
    int32_t n_nodes, cap_nodes;
    int32_t *node_slots; /* id + 1, 0 empty */
    size_t n_node_slots;
    /* sets: members in pool[set_off[s] .. set_off[s + 1]) */
    int32_t *pool;
    size_t n_pool, cap_pool;
    uint32_t *set_off;
    int32_t **rows;
    int32_t n_sets, cap_sets;
    int32_t *set_slots;
    size_t n_set_slots;
    /* expansion scratch */
    int32_t *out;
    size_t n_out, cap_out;
    uint32_t stamp;
    int accepted;
    int depth;   /* of expand's recursion */
    int fail_rc; /* why the last expansion failed: ERR_NOMEM or ERR_RANGE */
    int fail_wide; /* the ERR_RANGE was a set past GRAMMAR_SET_STACKS_MAX */
    int32_t start;
    /* byte_groups' scratch: the set's distinct classes, and a stamp per class */
    int32_t *group_classes;
    uint32_t *class_stamp, class_stamp_now;
};

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static int grow(void **p, size_t elem, size_t *cap, size_t need, struct grammar_engine *e)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    if (e && e->memory + (n - *cap) * elem > e->memory_max)
        return ERR_NOMEM;
    void *q = realloc(*p, n * elem);
    if (!q)
        return ERR_NOMEM;
    if (e)
        e->memory += (n - *cap) * elem;
    *p = q;
    *cap = n;
    return 0;
}

static int node_table_grow(struct grammar_engine *e)
{
    size_t n = e->n_node_slots ? e->n_node_slots * 2 : 1024;
    if (e->memory + n * sizeof(int32_t) > e->memory_max)
        return ERR_NOMEM;
    int32_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return ERR_NOMEM;
    e->memory += (n - e->n_node_slots) * sizeof *slots;
    for (int32_t id = 1; id < e->n_nodes; id++) {
        size_t i = mix(((uint64_t)(uint32_t)e->nodes[id].pos << 32) |
                       (uint32_t)e->nodes[id].parent) & (n - 1);
        while (slots[i])
            i = (i + 1) & (n - 1);
        slots[i] = id + 1;
    }
    free(e->node_slots);
    e->node_slots = slots;
    e->n_node_slots = n;
    return 0;
}

/* The id of node (pos, parent), made on first use; -1 when out of memory. */
static int32_t node_intern(struct grammar_engine *e, int32_t pos, int32_t parent)
{
    if ((size_t)(e->n_nodes + 1) * 2 > e->n_node_slots && node_table_grow(e))
        return -1;
    size_t mask = e->n_node_slots - 1;
    size_t i = mix(((uint64_t)(uint32_t)pos << 32) | (uint32_t)parent) & mask;
    for (; e->node_slots[i]; i = (i + 1) & mask) {
        const struct node *n = &e->nodes[e->node_slots[i] - 1];
        if (n->pos == pos && n->parent == parent)
            return e->node_slots[i] - 1;
    }
    size_t cap = (size_t)e->cap_nodes, cap2 = cap;
    if (grow((void **)&e->nodes, sizeof *e->nodes, &cap, (size_t)e->n_nodes + 1, e) ||
        grow((void **)&e->node_stamp, sizeof *e->node_stamp, &cap2, (size_t)e->n_nodes + 1, e))
        return -1;
    e->cap_nodes = (int32_t)cap;
    e->nodes[e->n_nodes] = (struct node){pos, parent};
    e->node_stamp[e->n_nodes] = 0;
    e->node_slots[i] = e->n_nodes + 1;
    return e->n_nodes++;
}

/* Adds to e->out the class-topped stacks node `id` expands to. */
static int expand_node(struct grammar_engine *e, int32_t id);

/* expand_node, with its recursion bounded: a grammar whose rules nest deeper
 * than GRAMMAR_EXPAND_DEPTH_MAX at one position (a chain of thousands of
 * rules) is refused rather than run off the thread's stack. */
static int expand(struct grammar_engine *e, int32_t id)
{
    if (e->depth >= GRAMMAR_EXPAND_DEPTH_MAX)
        return e->fail_rc = ERR_RANGE;
    e->depth++;
    int rc = expand_node(e, id);
    e->depth--;
    if (rc && !e->fail_rc)
        e->fail_rc = rc;
    return rc;
}

static int expand_node(struct grammar_engine *e, int32_t id)
{
    if (e->node_stamp[id] == e->stamp)
        return 0;
    e->node_stamp[id] = e->stamp;
    const struct grammar *g = e->g;
    struct node n = e->nodes[id];
    int32_t el = g->elems[n.pos];
    switch (GRAMMAR_ELEM_KIND(el)) {
    case GRAMMAR_KIND_CLASS:
        /* An ambiguous grammar (`x* x*`) can double its live parses with
         * every byte; the cap turns that into an error instead of a set of
         * millions of stacks sorted 256 times a state. */
        if (e->n_out >= GRAMMAR_SET_STACKS_MAX) {
            e->fail_wide = 1;
            return e->fail_rc = ERR_RANGE;
        }
        if (grow((void **)&e->out, sizeof *e->out, &e->cap_out, e->n_out + 1, NULL))
            return ERR_NOMEM;
        e->out[e->n_out++] = id;
        return 0;
    case GRAMMAR_KIND_END:
        if (n.parent < 0) {
            e->accepted = 1;
            return 0;
        }
        return expand(e, n.parent);
    default: {
        int32_t r = GRAMMAR_ELEM_INDEX(el), cont = n.parent;
        if (GRAMMAR_ELEM_KIND(g->elems[n.pos + 1]) != GRAMMAR_KIND_END &&
            (cont = node_intern(e, n.pos + 1, n.parent)) < 0)
            return ERR_NOMEM;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            int32_t child = node_intern(e, (int32_t)g->alt_start[a], cont);
            int rc = child < 0 ? ERR_NOMEM : expand(e, child);
            if (rc)
                return rc;
        }
        return 0;
    }
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint64_t set_hash(const int32_t *m, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = mix(h ^ (uint32_t)m[i]) + i;
    return h;
}

static int set_table_grow(struct grammar_engine *e)
{
    size_t n = e->n_set_slots ? e->n_set_slots * 2 : 1024;
    if (e->memory + n * sizeof(int32_t) > e->memory_max)
        return ERR_NOMEM;
    int32_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return ERR_NOMEM;
    e->memory += (n - e->n_set_slots) * sizeof *slots;
    for (int32_t s = 0; s < e->n_sets; s++) {
        size_t i = set_hash(e->pool + e->set_off[s], e->set_off[s + 1] - e->set_off[s]) & (n - 1);
        while (slots[i])
            i = (i + 1) & (n - 1);
        slots[i] = s + 1;
    }
    free(e->set_slots);
    e->set_slots = slots;
    e->n_set_slots = n;
    return 0;
}

/* The state whose members are m[0..n) (sorted); -1 when out of memory. */
static int32_t set_intern(struct grammar_engine *e, const int32_t *m, size_t n)
{
    if ((size_t)(e->n_sets + 1) * 2 > e->n_set_slots && set_table_grow(e))
        return -1;
    size_t mask = e->n_set_slots - 1, i = set_hash(m, n) & mask;
    for (; e->set_slots[i]; i = (i + 1) & mask) {
        int32_t s = e->set_slots[i] - 1;
        size_t len = e->set_off[s + 1] - e->set_off[s];
        if (len == n && (n == 0 || memcmp(e->pool + e->set_off[s], m, n * sizeof *m) == 0))
            return s;
    }
    size_t cap = (size_t)e->cap_sets, cap2 = cap;
    if (grow((void **)&e->pool, sizeof *e->pool, &e->cap_pool, e->n_pool + n, e) ||
        grow((void **)&e->rows, sizeof *e->rows, &cap, (size_t)e->n_sets + 1, e) ||
        grow((void **)&e->set_off, sizeof *e->set_off, &cap2, (size_t)e->n_sets + 2, e))
        return -1;
    e->cap_sets = (int32_t)cap;
    if (e->n_sets == 0)
        e->set_off[0] = 0;
    if (n)
        memcpy(e->pool + e->n_pool, m, n * sizeof *m);
    e->n_pool += n;
    e->rows[e->n_sets] = NULL;
    e->set_off[e->n_sets + 1] = (uint32_t)e->n_pool;
    e->set_slots[i] = e->n_sets + 1;
    return e->n_sets++;
}

/* Closes the expansion scratch into a state. */
static int32_t finish_set(struct grammar_engine *e)
{
    if (e->accepted) {
        if (grow((void **)&e->out, sizeof *e->out, &e->cap_out, e->n_out + 1, NULL))
            return -1;
        e->out[e->n_out++] = 0;
    }
    qsort(e->out, e->n_out, sizeof *e->out, cmp_i32);
    return set_intern(e, e->out, e->n_out);
}

static void begin_set(struct grammar_engine *e)
{
    e->n_out = 0;
    e->accepted = 0;
    e->depth = 0;
    e->fail_rc = 0;
    e->fail_wide = 0;
    if (++e->stamp == 0) { /* wrapped: old stamps could collide */
        memset(e->node_stamp, 0, (size_t)e->n_nodes * sizeof *e->node_stamp);
        e->stamp = 1;
    }
}

static int32_t step(struct grammar_engine *e, int32_t state, unsigned byte)
{
    begin_set(e);
    for (uint32_t k = e->set_off[state]; k < e->set_off[state + 1]; k++) {
        int32_t id = e->pool[k];
        if (id == 0)
            continue;
        struct node n = e->nodes[id];
        int32_t cls = GRAMMAR_ELEM_INDEX(e->g->elems[n.pos]);
        if (!grammar_class_has(&e->g->classes[cls], byte))
            continue;
        int32_t next = node_intern(e, n.pos + 1, n.parent);
        if (next < 0 || expand(e, next))
            return -1;
    }
    return finish_set(e);
}

static int range_error(const struct grammar_engine *e, char *err)
{
    if (e->fail_wide)
        return error_set(err, ERR_RANGE,
                         "grammar: more than %d parses alive at once (an ambiguous grammar, "
                         "such as x* x*)",
                         GRAMMAR_SET_STACKS_MAX);
    return error_set(err, ERR_RANGE, "grammar: rules nest more than %d deep",
                     GRAMMAR_EXPAND_DEPTH_MAX);
}

int grammar_engine_create(struct grammar_engine **out, struct grammar *g, size_t memory_max_bytes,
                          char *err)
{
    struct grammar_engine *e = calloc(1, sizeof *e);
    if (!e) {
        grammar_free(g);
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    }
    e->g = g;
    e->memory_max = memory_max_bytes ? memory_max_bytes : GRAMMAR_ENGINE_MEMORY_DEFAULT;
    e->group_classes = malloc(((size_t)g->n_classes + 1) * sizeof *e->group_classes);
    e->class_stamp = calloc((size_t)g->n_classes + 1, sizeof *e->class_stamp);
    if (!e->group_classes || !e->class_stamp) {
        grammar_engine_destroy(e);
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    }
    /* node 0: the accepted marker; state 0: the empty set (DEAD) */
    int32_t accept = node_intern(e, 0, -2);
    int32_t dead = accept == 0 ? set_intern(e, NULL, 0) : -1;
    int32_t root = dead == 0 ? node_intern(e, 0, -1) : -1;
    /* the root rule entered as if referenced from a one-element alternative */
    if (root >= 0) {
        begin_set(e);
        for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
            int32_t child = node_intern(e, (int32_t)g->alt_start[a], -1);
            if (child < 0 || expand(e, child)) {
                root = -1;
                break;
            }
        }
    }
    if (root < 0 || (e->start = finish_set(e)) < 0) {
        int rc = e->fail_rc == ERR_RANGE ? range_error(e, err)
                                         : error_set(err, ERR_NOMEM, "grammar: out of memory");
        grammar_engine_destroy(e);
        return rc;
    }
    *out = e;
    return 0;
}

void grammar_engine_destroy(struct grammar_engine *e)
{
    if (!e)
        return;
    for (int32_t s = 0; s < e->n_sets; s++)
        free(e->rows[s]);
    free(e->rows);
    free(e->nodes);
    free(e->node_stamp);
    free(e->node_slots);
    free(e->pool);
    free(e->set_off);
    free(e->set_slots);
    free(e->out);
    free(e->group_classes);
    free(e->class_stamp);
    grammar_free(e->g);
    free(e);
}

int32_t grammar_engine_start(const struct grammar_engine *e)
{
    return e->start;
}

int grammar_engine_can_end(const struct grammar_engine *e, int32_t state)
{
    /* node 0 sorts first */
    return state > 0 && state < e->n_sets && e->set_off[state] < e->set_off[state + 1] &&
           e->pool[e->set_off[state]] == 0;
}

/* The bytes grouped by which of state's stacks accept them: group[b], and
 * each group's first byte in rep; returns the groups. Bytes accepted by the
 * same stacks lead to the same state (a step pushes what follows each
 * accepting stack's class, whatever the byte), so a row steps once per
 * group: a class of 200 bytes (a JSON string's body, `.`) is expanded once,
 * not 200 times. Stacks with the same class accept the same bytes, so the
 * grouping reads each distinct class of the set once. */
static int byte_groups(struct grammar_engine *e, int32_t state, uint8_t *group, int *rep)
{
    const struct grammar *g = e->g;
    int32_t *cls = e->group_classes;
    int n_cls = 0;
    if (++e->class_stamp_now == 0) { /* wrapped: old stamps could collide */
        memset(e->class_stamp, 0, (size_t)g->n_classes * sizeof *e->class_stamp);
        e->class_stamp_now = 1;
    }
    for (uint32_t k = e->set_off[state]; k < e->set_off[state + 1]; k++) {
        const int32_t id = e->pool[k];
        if (id == 0)
            continue;
        const int32_t c = GRAMMAR_ELEM_INDEX(g->elems[e->nodes[id].pos]);
        if (e->class_stamp[c] != e->class_stamp_now) {
            e->class_stamp[c] = e->class_stamp_now;
            cls[n_cls++] = c;
        }
    }
    uint64_t sig[256];
    for (unsigned b = 0; b < 256; b++)
        sig[b] = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_cls; i++)
        for (unsigned b = 0; b < 256; b++)
            if (grammar_class_has(&g->classes[cls[i]], b))
                sig[b] = mix(sig[b] ^ (uint64_t)(i + 1));
    int n = 0;
    for (unsigned b = 0; b < 256; b++) {
        int j = 0;
        for (; j < n; j++) {
            if (sig[rep[j]] != sig[b])
                continue;
            int i = 0; /* equal signatures: the same classes, checked */
            while (i < n_cls && grammar_class_has(&g->classes[cls[i]], b) ==
                                    grammar_class_has(&g->classes[cls[i]], (unsigned)rep[j]))
                i++;
            if (i == n_cls)
                break;
        }
        if (j == n)
            rep[n++] = (int)b;
        group[b] = (uint8_t)j;
    }
    return n;
}

const int32_t *grammar_engine_row(struct grammar_engine *e, int32_t state, int *rc, char *err)
{
    *rc = 0;
    if (e->rows[state])
        return e->rows[state];
    if (e->memory + 256 * sizeof(int32_t) > e->memory_max)
        goto full;
    int32_t *row = malloc(256 * sizeof *row);
    if (!row)
        goto full;
    uint8_t group[256];
    int rep[256];
    const int n_groups = byte_groups(e, state, group, rep);
    int32_t next[256];
    for (int g = 0; g < n_groups; g++) {
        next[g] = state == GRAMMAR_STATE_DEAD ? GRAMMAR_STATE_DEAD : step(e, state, (unsigned)rep[g]);
        if (next[g] < 0) {
            free(row);
            goto full;
        }
    }
    for (unsigned b = 0; b < 256; b++)
        row[b] = next[group[b]];
    e->memory += 256 * sizeof *row;
    e->rows[state] = row;
    return row;
full:
    if (e->fail_rc == ERR_RANGE)
        *rc = range_error(e, err);
    else
        *rc = error_set(err, ERR_NOMEM,
                        "grammar: the matcher's state cache is over its cap of %zu MiB",
                        e->memory_max >> 20);
    return NULL;
}

int grammar_engine_feed(struct grammar_engine *e, int32_t state, const void *bytes, size_t len,
                        int32_t *next, char *err)
{
    const uint8_t *p = bytes;
    for (size_t i = 0; i < len && state != GRAMMAR_STATE_DEAD; i++) {
        int rc;
        const int32_t *row = grammar_engine_row(e, state, &rc, err);
        if (!row)
            return rc;
        state = row[p[i]];
    }
    *next = state;
    return 0;
}

int32_t grammar_engine_n_states(const struct grammar_engine *e)
{
    return e->n_sets;
}

size_t grammar_engine_memory(const struct grammar_engine *e)
{
    return e->memory;
}

int grammar_matcher_init(struct grammar_matcher *m, struct grammar_engine *e)
{
    memset(m, 0, sizeof *m);
    m->engine = e;
    m->cap = 64;
    m->states = malloc(m->cap * sizeof *m->states);
    if (!m->states)
        return ERR_NOMEM;
    m->states[0] = grammar_engine_start(e);
    return 0;
}

void grammar_matcher_free(struct grammar_matcher *m)
{
    free(m->states);
    memset(m, 0, sizeof *m);
}

int grammar_matcher_accept(struct grammar_matcher *m, const void *bytes, size_t len, char *err)
{
    int32_t next = GRAMMAR_STATE_DEAD;
    int rc = grammar_engine_feed(m->engine, grammar_matcher_state(m), bytes, len, &next, err);
    if (rc)
        return rc;
    if (next == GRAMMAR_STATE_DEAD)
        return error_set(err, ERR_INVALID_ARG, "grammar: the output does not match the grammar");
    if (grow((void **)&m->states, sizeof *m->states, &m->cap, m->n_tokens + 2, NULL))
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    m->states[++m->n_tokens] = next;
    return 0;
}

int grammar_matcher_rollback(struct grammar_matcher *m, size_t n)
{
    if (n > m->n_tokens)
        return ERR_RANGE;
    m->n_tokens -= n;
    return 0;
}
