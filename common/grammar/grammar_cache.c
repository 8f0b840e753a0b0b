/* grammar_cache.c: engines shared by grammar text (contracts in
 * grammar_cache.h). A few entries: a linear scan is all it needs. */
#include "grammar_cache.h"

#include <stdlib.h>

#include "error.h"

struct cache_entry {
    uint64_t hash;
    struct grammar_spec spec;
    struct grammar_engine *engine;
    struct token_mask *mask;
    int users;
    uint64_t last_used;
};

struct grammar_cache {
    const struct token_mask_vocab *vocab;
    int keep_unused;
    struct cache_entry **entries;
    int n, cap;
    uint64_t clock;
};

int grammar_cache_create(struct grammar_cache **out, const struct token_mask_vocab *vocab,
                         int keep_unused, char *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return error_set(err, ERR_NOMEM, "grammar cache: out of memory");
    (*out)->vocab = vocab;
    (*out)->keep_unused = keep_unused > 0 ? keep_unused : 0;
    return 0;
}

static void entry_free(struct cache_entry *e)
{
    if (!e)
        return;
    token_mask_destroy(e->mask);
    grammar_engine_destroy(e->engine);
    grammar_spec_free(&e->spec);
    free(e);
}

void grammar_cache_destroy(struct grammar_cache *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        entry_free(c->entries[i]);
    free(c->entries);
    free(c);
}

/* Drops the least recently used unused entries past keep_unused. */
static void trim(struct grammar_cache *c)
{
    for (;;) {
        int unused = 0, victim = -1;
        for (int i = 0; i < c->n; i++) {
            if (c->entries[i]->users > 0)
                continue;
            unused++;
            if (victim < 0 || c->entries[i]->last_used < c->entries[victim]->last_used)
                victim = i;
        }
        if (unused <= c->keep_unused)
            return;
        entry_free(c->entries[victim]);
        c->entries[victim] = c->entries[--c->n];
    }
}

int grammar_cache_get(struct grammar_cache *c, const struct grammar_spec *spec, const char *where,
                      struct grammar_engine **engine, struct token_mask **mask, char *err)
{
    const uint64_t h = grammar_spec_hash(spec);
    struct cache_entry *e = NULL;
    for (int i = 0; i < c->n && !e; i++)
        if (c->entries[i]->hash == h && grammar_spec_equal(&c->entries[i]->spec, spec))
            e = c->entries[i];
    if (!e) {
        if (c->n == c->cap) {
            int cap = c->cap ? 2 * c->cap : 8;
            struct cache_entry **p = realloc(c->entries, (size_t)cap * sizeof *p);
            if (!p)
                return error_set(err, ERR_NOMEM, "%s: out of memory", where);
            c->entries = p;
            c->cap = cap;
        }
        struct grammar *g = NULL;
        e = calloc(1, sizeof *e);
        int rc = !e || grammar_spec_copy(&e->spec, spec) ? error_set(err, ERR_NOMEM, "%s: out of memory", where)
                                                         : grammar_spec_compile(spec, where, &g, err);
        if (!rc)
            rc = grammar_engine_create(&e->engine, g, 0, err); /* takes g */
        if (!rc)
            rc = token_mask_create(&e->mask, e->engine, c->vocab, 0, err);
        if (rc) {
            entry_free(e);
            return rc;
        }
        e->hash = h;
        c->entries[c->n++] = e;
    }
    e->users++;
    e->last_used = ++c->clock;
    *engine = e->engine;
    *mask = e->mask;
    trim(c);
    return 0;
}

void grammar_cache_put(struct grammar_cache *c, const struct grammar_engine *engine)
{
    for (int i = 0; i < c->n; i++) {
        if (c->entries[i]->engine == engine && c->entries[i]->users > 0) {
            c->entries[i]->users--;
            trim(c);
            return;
        }
    }
}

int grammar_cache_size(const struct grammar_cache *c) { return c->n; }
