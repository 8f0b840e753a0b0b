/* grammar.c: the grammar builder, its checks and the flattened form.
 *
 * The checks at finish are what the matcher relies on to terminate: every
 * rule has an alternative, and no rule reaches itself through a chain of
 * leftmost references whose prefixes can all be empty (a "nullable left
 * cycle"). Both are graph walks with explicit stacks, so a deep grammar
 * cannot overflow the C stack.
 */
#include "grammar.h"

#include "error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rule_def {
    char *name;
    struct grammar_seq *alts;
    size_t n_alts, cap_alts;
};

struct grammar_builder {
    struct rule_def *rules;
    int32_t n_rules, cap_rules;
    int32_t *name_slots; /* open addressing over rule names: rule id + 1, 0 empty */
    size_t n_slots;
    struct grammar_class *classes;
    int32_t n_classes, cap_classes;
    int32_t single_byte[256]; /* class index of {b}, -1 until made */
    size_t n_elems_total;
    unsigned fresh_counter;
};

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static int grow(void **p, size_t elem_size, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 8;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem_size);
    if (!q)
        return ERR_NOMEM;
    *p = q;
    *cap = n;
    return 0;
}

int grammar_builder_create(struct grammar_builder **out)
{
    struct grammar_builder *b = calloc(1, sizeof *b);
    if (!b)
        return ERR_NOMEM;
    b->n_slots = 256;
    b->name_slots = calloc(b->n_slots, sizeof *b->name_slots);
    if (!b->name_slots) {
        free(b);
        return ERR_NOMEM;
    }
    for (int i = 0; i < 256; i++)
        b->single_byte[i] = -1;
    *out = b;
    return 0;
}

void grammar_builder_destroy(struct grammar_builder *b)
{
    if (!b)
        return;
    for (int32_t r = 0; r < b->n_rules; r++) {
        free(b->rules[r].name);
        for (size_t a = 0; a < b->rules[r].n_alts; a++)
            grammar_seq_free(&b->rules[r].alts[a]);
        free(b->rules[r].alts);
    }
    free(b->rules);
    free(b->name_slots);
    free(b->classes);
    free(b);
}

static size_t slot_of(const struct grammar_builder *b, const char *name)
{
    size_t mask = b->n_slots - 1, i = (size_t)name_hash(name) & mask;
    while (b->name_slots[i] && strcmp(b->rules[b->name_slots[i] - 1].name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

static int rehash(struct grammar_builder *b)
{
    size_t n = b->n_slots * 2;
    int32_t *slots = calloc(n, sizeof *slots);
    if (!slots)
        return ERR_NOMEM;
    free(b->name_slots);
    b->name_slots = slots;
    b->n_slots = n;
    for (int32_t r = 0; r < b->n_rules; r++)
        b->name_slots[slot_of(b, b->rules[r].name)] = r + 1;
    return 0;
}

static int rule_new(struct grammar_builder *b, const char *name, int32_t *id_out)
{
    if (b->n_rules >= GRAMMAR_RULES_MAX)
        return ERR_RANGE;
    size_t cap = (size_t)b->cap_rules;
    if (grow((void **)&b->rules, sizeof *b->rules, &cap, (size_t)b->n_rules + 1))
        return ERR_NOMEM;
    b->cap_rules = (int32_t)cap;
    if ((size_t)(b->n_rules + 1) * 2 > b->n_slots && rehash(b))
        return ERR_NOMEM;
    char *copy = strdup(name);
    if (!copy)
        return ERR_NOMEM;
    struct rule_def *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name = copy;
    b->name_slots[slot_of(b, name)] = b->n_rules + 1;
    *id_out = b->n_rules++;
    return 0;
}

int grammar_builder_rule(struct grammar_builder *b, const char *name, int32_t *id_out)
{
    size_t i = slot_of(b, name);
    if (b->name_slots[i]) {
        *id_out = b->name_slots[i] - 1;
        return 0;
    }
    return rule_new(b, name, id_out);
}

int grammar_builder_rule_fresh(struct grammar_builder *b, const char *base, int32_t *id_out)
{
    char name[96];
    for (;;) {
        snprintf(name, sizeof name, "%.64s_%u", base, b->fresh_counter++);
        if (!b->name_slots[slot_of(b, name)])
            return rule_new(b, name, id_out);
    }
}

const char *grammar_builder_rule_name(const struct grammar_builder *b, int32_t id)
{
    return id >= 0 && id < b->n_rules ? b->rules[id].name : "?";
}

size_t grammar_builder_alt_count(const struct grammar_builder *b, int32_t id)
{
    return id >= 0 && id < b->n_rules ? b->rules[id].n_alts : 0;
}

int grammar_builder_rule_defined(const struct grammar_builder *b, int32_t id)
{
    return id >= 0 && id < b->n_rules && b->rules[id].n_alts > 0;
}

static int single_byte_of(const struct grammar_class *cls)
{
    int found = -1;
    for (int i = 0; i < 32; i++) {
        if (!cls->bits[i])
            continue;
        if (found >= 0 || (cls->bits[i] & (cls->bits[i] - 1)))
            return -1;
        found = i * 8 + __builtin_ctz(cls->bits[i]);
    }
    return found;
}

int grammar_builder_class(struct grammar_builder *b, const struct grammar_class *cls,
                          int32_t *elem_out)
{
    int single = single_byte_of(cls);
    if (single >= 0 && b->single_byte[single] >= 0) {
        *elem_out = GRAMMAR_ELEM(GRAMMAR_KIND_CLASS, b->single_byte[single]);
        return 0;
    }
    if (single < 0) {
        for (int32_t i = 0; i < b->n_classes; i++)
            if (memcmp(b->classes[i].bits, cls->bits, sizeof cls->bits) == 0) {
                *elem_out = GRAMMAR_ELEM(GRAMMAR_KIND_CLASS, i);
                return 0;
            }
    }
    if (b->n_classes >= GRAMMAR_RULES_MAX)
        return ERR_RANGE;
    size_t cap = (size_t)b->cap_classes;
    if (grow((void **)&b->classes, sizeof *b->classes, &cap, (size_t)b->n_classes + 1))
        return ERR_NOMEM;
    b->cap_classes = (int32_t)cap;
    b->classes[b->n_classes] = *cls;
    if (single >= 0)
        b->single_byte[single] = b->n_classes;
    *elem_out = GRAMMAR_ELEM(GRAMMAR_KIND_CLASS, b->n_classes);
    b->n_classes++;
    return 0;
}

int grammar_seq_push(struct grammar_seq *s, int32_t elem)
{
    if (s->n >= GRAMMAR_ELEMS_MAX)
        return ERR_RANGE;
    if (grow((void **)&s->elems, sizeof *s->elems, &s->cap, s->n + 1))
        return ERR_NOMEM;
    s->elems[s->n++] = elem;
    return 0;
}

int grammar_seq_literal(struct grammar_builder *b, struct grammar_seq *s, const void *bytes,
                        size_t len)
{
    const uint8_t *p = bytes;
    for (size_t i = 0; i < len; i++) {
        struct grammar_class c = {{0}};
        grammar_class_add(&c, p[i], p[i]);
        int32_t e;
        int rc = grammar_builder_class(b, &c, &e);
        if (rc == 0)
            rc = grammar_seq_push(s, e);
        if (rc)
            return rc;
    }
    return 0;
}

void grammar_seq_free(struct grammar_seq *s)
{
    free(s->elems);
    s->elems = NULL;
    s->n = s->cap = 0;
}

int grammar_builder_alt(struct grammar_builder *b, int32_t id, const struct grammar_seq *s)
{
    if (id < 0 || id >= b->n_rules)
        return ERR_INVALID_ARG;
    if (b->n_elems_total + s->n + 1 > GRAMMAR_ELEMS_MAX)
        return ERR_RANGE;
    struct rule_def *r = &b->rules[id];
    if (grow((void **)&r->alts, sizeof *r->alts, &r->cap_alts, r->n_alts + 1))
        return ERR_NOMEM;
    struct grammar_seq copy = {0};
    if (s->n) {
        copy.elems = malloc(s->n * sizeof *copy.elems);
        if (!copy.elems)
            return ERR_NOMEM;
        memcpy(copy.elems, s->elems, s->n * sizeof *copy.elems);
        copy.n = copy.cap = s->n;
    }
    r->alts[r->n_alts++] = copy;
    b->n_elems_total += s->n + 1;
    return 0;
}

/* nullable[r]: rule r can match the empty string (a fixpoint). */
static void compute_nullable(const struct grammar_builder *b, uint8_t *nullable)
{
    int changed = 1;
    while (changed) {
        changed = 0;
        for (int32_t r = 0; r < b->n_rules; r++) {
            if (nullable[r])
                continue;
            for (size_t a = 0; a < b->rules[r].n_alts && !nullable[r]; a++) {
                const struct grammar_seq *s = &b->rules[r].alts[a];
                size_t i = 0;
                while (i < s->n && GRAMMAR_ELEM_KIND(s->elems[i]) == GRAMMAR_KIND_RULE &&
                       nullable[GRAMMAR_ELEM_INDEX(s->elems[i])])
                    i++;
                if (i == s->n)
                    nullable[r] = 1, changed = 1;
            }
        }
    }
}

/* The leftmost references of rule r (those reachable without consuming a
 * byte), appended to *edges. */
static int left_edges(const struct grammar_builder *b, const uint8_t *nullable, int32_t r,
                      struct grammar_seq *edges)
{
    for (size_t a = 0; a < b->rules[r].n_alts; a++) {
        const struct grammar_seq *s = &b->rules[r].alts[a];
        for (size_t i = 0; i < s->n && GRAMMAR_ELEM_KIND(s->elems[i]) == GRAMMAR_KIND_RULE; i++) {
            int32_t t = GRAMMAR_ELEM_INDEX(s->elems[i]);
            if (grammar_seq_push(edges, t))
                return ERR_NOMEM;
            if (!nullable[t])
                break;
        }
    }
    return 0;
}

/* Depth-first search for a cycle of leftmost references; colour 1 = on the
 * path, 2 = done. Returns the rule on a cycle, -1 for none, -2 out of memory. */
static int32_t find_left_cycle(const struct grammar_builder *b, const uint8_t *nullable,
                               uint8_t *colour)
{
    struct grammar_seq path = {0}, pos = {0};
    struct grammar_seq *adj = calloc((size_t)b->n_rules, sizeof *adj);
    int32_t found = adj ? -1 : -2;
    for (int32_t r = 0; r < b->n_rules && found == -1; r++)
        if (left_edges(b, nullable, r, &adj[r]))
            found = -2;
    for (int32_t start = 0; start < b->n_rules && found == -1; start++) {
        if (colour[start])
            continue;
        if (grammar_seq_push(&path, start) || grammar_seq_push(&pos, 0)) {
            found = -2;
            break;
        }
        colour[start] = 1;
        while (path.n && found == -1) {
            int32_t r = path.elems[path.n - 1];
            int32_t k = pos.elems[pos.n - 1];
            if ((size_t)k >= adj[r].n) {
                colour[r] = 2;
                path.n--, pos.n--;
                continue;
            }
            pos.elems[pos.n - 1]++;
            int32_t t = adj[r].elems[k];
            if (colour[t] == 1)
                found = t;
            else if (colour[t] == 0) {
                colour[t] = 1;
                if (grammar_seq_push(&path, t) || grammar_seq_push(&pos, 0))
                    found = -2;
            }
        }
    }
    for (int32_t r = 0; adj && r < b->n_rules; r++)
        grammar_seq_free(&adj[r]);
    free(adj);
    grammar_seq_free(&path);
    grammar_seq_free(&pos);
    return found;
}

static int check(const struct grammar_builder *b, int32_t root, char *err)
{
    if (root < 0 || root >= b->n_rules)
        return error_set(err, ERR_INVALID_ARG, "grammar: no root rule");
    for (int32_t r = 0; r < b->n_rules; r++)
        if (b->rules[r].n_alts == 0)
            return error_set(err, ERR_FORMAT, "grammar: rule '%.100s' is used but never defined",
                             b->rules[r].name);
    uint8_t *nullable = calloc((size_t)b->n_rules, 2);
    if (!nullable)
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    compute_nullable(b, nullable);
    int32_t cyc = find_left_cycle(b, nullable, nullable + b->n_rules);
    free(nullable);
    if (cyc == -2)
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    if (cyc >= 0)
        return error_set(err, ERR_FORMAT,
                         "grammar: rule '%.100s' can reach itself without consuming input "
                         "(left recursion, or a repetition of something that can be empty)",
                         b->rules[cyc].name);
    return 0;
}

int grammar_builder_finish(struct grammar_builder *b, int32_t root, struct grammar **out,
                           char *err)
{
    int rc = check(b, root, err);
    if (rc)
        return rc;
    size_t n_alts = 0;
    for (int32_t r = 0; r < b->n_rules; r++)
        n_alts += b->rules[r].n_alts;
    struct grammar *g = calloc(1, sizeof *g);
    if (!g)
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    g->elems = malloc((b->n_elems_total + 1) * sizeof *g->elems);
    g->alt_start = malloc((n_alts + 1) * sizeof *g->alt_start);
    g->rule_alt = malloc(((size_t)b->n_rules + 1) * sizeof *g->rule_alt);
    g->classes = malloc(((size_t)b->n_classes + 1) * sizeof *g->classes);
    if (!g->elems || !g->alt_start || !g->rule_alt || !g->classes) {
        grammar_free(g);
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    }
    size_t e = 0, a = 0;
    for (int32_t r = 0; r < b->n_rules; r++) {
        g->rule_alt[r] = (uint32_t)a;
        for (size_t k = 0; k < b->rules[r].n_alts; k++) {
            const struct grammar_seq *s = &b->rules[r].alts[k];
            g->alt_start[a++] = (uint32_t)e;
            if (s->n)
                memcpy(g->elems + e, s->elems, s->n * sizeof *s->elems);
            e += s->n;
            g->elems[e++] = GRAMMAR_ELEM(GRAMMAR_KIND_END, 0);
        }
    }
    g->rule_alt[b->n_rules] = (uint32_t)a;
    g->alt_start[a] = (uint32_t)e;
    g->n_elems = e;
    g->n_rules = b->n_rules;
    if (b->n_classes)
        memcpy(g->classes, b->classes, (size_t)b->n_classes * sizeof *g->classes);
    g->n_classes = b->n_classes;
    g->root = root;
    *out = g;
    return 0;
}

void grammar_free(struct grammar *g)
{
    if (!g)
        return;
    free(g->elems);
    free(g->alt_start);
    free(g->rule_alt);
    free(g->classes);
    free(g);
}

/* One UTF-8 form: a lead byte range then up to three continuation ranges. */
struct utf8_form {
    uint8_t lo[4], hi[4];
    int n;
};

int grammar_builder_alt1(struct grammar_builder *b, int32_t id, int32_t elem)
{
    struct grammar_seq s = {0};
    int rc = grammar_seq_push(&s, elem);
    if (rc == 0)
        rc = grammar_builder_alt(b, id, &s);
    grammar_seq_free(&s);
    return rc;
}

int grammar_builder_utf8_multi(struct grammar_builder *b, int32_t *id_out)
{
    /* RFC 3629's table of well-formed byte sequences */
    static const struct utf8_form forms[] = {
        {{0xC2, 0x80}, {0xDF, 0xBF}, 2},
        {{0xE0, 0xA0, 0x80}, {0xE0, 0xBF, 0xBF}, 3},
        {{0xE1, 0x80, 0x80}, {0xEC, 0xBF, 0xBF}, 3},
        {{0xED, 0x80, 0x80}, {0xED, 0x9F, 0xBF}, 3},
        {{0xEE, 0x80, 0x80}, {0xEF, 0xBF, 0xBF}, 3},
        {{0xF0, 0x90, 0x80, 0x80}, {0xF0, 0xBF, 0xBF, 0xBF}, 4},
        {{0xF1, 0x80, 0x80, 0x80}, {0xF3, 0xBF, 0xBF, 0xBF}, 4},
        {{0xF4, 0x80, 0x80, 0x80}, {0xF4, 0x8F, 0xBF, 0xBF}, 4},
    };
    int rc = grammar_builder_rule(b, "<utf8>", id_out);
    if (rc || grammar_builder_rule_defined(b, *id_out))
        return rc;
    for (size_t f = 0; f < sizeof forms / sizeof *forms && rc == 0; f++) {
        struct grammar_seq s = {0};
        for (int k = 0; k < forms[f].n && rc == 0; k++) {
            struct grammar_class c = {{0}};
            int32_t e;
            grammar_class_add(&c, forms[f].lo[k], forms[f].hi[k]);
            rc = grammar_builder_class(b, &c, &e);
            if (rc == 0)
                rc = grammar_seq_push(&s, e);
        }
        if (rc == 0)
            rc = grammar_builder_alt(b, *id_out, &s);
        grammar_seq_free(&s);
    }
    return rc;
}

/* out += sub repeated min..max times (max -1: unbounded). */
int grammar_builder_repeat(struct grammar_builder *b, const char *base,
                           const struct grammar_seq *sub, long min, long max, struct grammar_seq *out)
{
    int rc = 0;
    for (long i = 0; i < min && rc == 0; i++)
        for (size_t k = 0; k < sub->n && rc == 0; k++)
            rc = grammar_seq_push(out, sub->elems[k]);
    int32_t prev = -1;
    long n_opt = max < 0 ? 1 : max - min;
    for (long i = 0; i < n_opt && rc == 0; i++) {
        int32_t rule;
        struct grammar_seq body = {0}, empty = {0};
        if ((rc = grammar_builder_rule_fresh(b, base, &rule)))
            break;
        for (size_t k = 0; k < sub->n && rc == 0; k++)
            rc = grammar_seq_push(&body, sub->elems[k]);
        /* star: rule ::= sub rule | ""; bounded: rule_i ::= sub rule_{i-1} | "" */
        int32_t tail = max < 0 ? rule : prev;
        if (rc == 0 && tail >= 0)
            rc = grammar_seq_push(&body, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, tail));
        if (rc == 0 && (rc = grammar_builder_alt(b, rule, &body)) == 0)
            rc = grammar_builder_alt(b, rule, &empty);
        grammar_seq_free(&body);
        prev = rule;
    }
    if (rc == 0 && prev >= 0)
        rc = grammar_seq_push(out, GRAMMAR_ELEM(GRAMMAR_KIND_RULE, prev));
    return rc;
}

