/* worker_grammar.c: the slots' grammars and the engine cache (contracts in
 * worker_grammar.h).
 *
 * Invariant: an engine in the cache outlives every slot whose matcher
 * points at it (users counts them); only unused entries are evicted.
 */
#include "worker_grammar.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "grammar_spec.h"
#include "logging.h"
#include "tokenizer.h"

/* Engines kept for grammars no slot uses any more. */
#define WORKER_GRAMMAR_CACHE 8

struct cached_engine {
    uint64_t hash;
    struct grammar_spec spec;
    struct grammar_engine *engine;
    struct token_mask *mask;
    int users;
    uint64_t last_used;
};

struct slot_grammar {
    struct specdec_grammar g;
    struct cached_engine *entry; /* NULL: none */
};

struct worker_grammar {
    char *model_dir;
    int32_t eos[MODEL_CONFIG_MAX_EOS];
    int n_eos;
    struct token_mask_vocab *vocab; /* NULL until the first grammar */
    struct cached_engine **cache;
    int n_cache, cache_cap;
    uint64_t clock;
    struct slot_grammar *slots;
    int n_slots;
};

int worker_grammar_create(struct worker_grammar **out, const char *model_dir,
                          const struct model_config *mc, int n_slots, char *err)
{
    *out = NULL;
    struct worker_grammar *wg = calloc(1, sizeof *wg);
    if (!wg || !(wg->model_dir = strdup(model_dir)) ||
        !(wg->slots = calloc((size_t)n_slots, sizeof *wg->slots))) {
        worker_grammar_destroy(wg);
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    }
    wg->n_slots = n_slots;
    for (int i = 0; i < mc->n_eos_token_ids && i < MODEL_CONFIG_MAX_EOS; i++)
        wg->eos[wg->n_eos++] = mc->eos_token_ids[i];
    *out = wg;
    return 0;
}

static void entry_free(struct cached_engine *e)
{
    if (!e)
        return;
    token_mask_destroy(e->mask);
    grammar_engine_destroy(e->engine);
    grammar_spec_free(&e->spec);
    free(e);
}

static void slot_clear(struct slot_grammar *s)
{
    if (!s->entry)
        return;
    grammar_matcher_free(&s->g.matcher);
    free(s->g.bits);
    s->entry->users--;
    s->entry = NULL;
    memset(&s->g, 0, sizeof s->g);
}

void worker_grammar_destroy(struct worker_grammar *wg)
{
    if (!wg)
        return;
    for (int i = 0; wg->slots && i < wg->n_slots; i++)
        slot_clear(&wg->slots[i]);
    for (int i = 0; i < wg->n_cache; i++)
        entry_free(wg->cache[i]);
    free(wg->cache);
    free(wg->slots);
    token_mask_vocab_destroy(wg->vocab);
    free(wg->model_dir);
    free(wg);
}

/* The vocabulary's bytes from the model directory's tokenizer (special
 * tokens have none: the mask never allows them). */
static int vocab_ready(struct worker_grammar *wg, char *err)
{
    if (wg->vocab)
        return 0;
    struct tokenizer *tk = NULL;
    char why[ERR_MSG_MAX];
    int rc = tokenizer_load(&tk, wg->model_dir, why);
    if (rc)
        return error_set(err, rc, "grammar: this worker needs its model's tokenizer for "
                         "structured output: %s", why);
    const int32_t n = tokenizer_vocab_size(tk);
    const uint8_t **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    if (!bytes || !lens)
        rc = error_set(err, ERR_NOMEM, "grammar: out of memory");
    for (int32_t i = 0; !rc && i < n; i++)
        if (!tokenizer_is_special(tk, i))
            bytes[i] = tokenizer_token_bytes(tk, i, &lens[i]);
    if (!rc)
        rc = token_mask_vocab_create(&wg->vocab, bytes, lens, n, err);
    free(bytes);
    free(lens);
    tokenizer_destroy(tk);
    if (!rc)
        LOG_INFO("grammar: vocabulary of %d tokens, trie of %d nodes", n,
                 token_mask_vocab_n_nodes(wg->vocab));
    return rc;
}

/* Drops the least recently used unused engine past the cache's size. */
static void cache_trim(struct worker_grammar *wg)
{
    while (wg->n_cache > WORKER_GRAMMAR_CACHE) {
        int victim = -1;
        for (int i = 0; i < wg->n_cache; i++)
            if (wg->cache[i]->users == 0 &&
                (victim < 0 || wg->cache[i]->last_used < wg->cache[victim]->last_used))
                victim = i;
        if (victim < 0)
            return;
        entry_free(wg->cache[victim]);
        wg->cache[victim] = wg->cache[--wg->n_cache];
    }
}

static int engine_for(struct worker_grammar *wg, const struct grammar_spec *spec,
                      struct cached_engine **out, char *err)
{
    const uint64_t h = grammar_spec_hash(spec);
    for (int i = 0; i < wg->n_cache; i++) {
        struct cached_engine *e = wg->cache[i];
        if (e->hash == h && grammar_spec_equal(&e->spec, spec)) {
            e->last_used = ++wg->clock;
            *out = e;
            return 0;
        }
    }
    if (wg->n_cache == wg->cache_cap) {
        int cap = wg->cache_cap ? 2 * wg->cache_cap : 2 * WORKER_GRAMMAR_CACHE;
        struct cached_engine **c = realloc(wg->cache, (size_t)cap * sizeof *c);
        if (!c)
            return error_set(err, ERR_NOMEM, "grammar: out of memory");
        wg->cache = c;
        wg->cache_cap = cap;
    }
    struct cached_engine *e = calloc(1, sizeof *e);
    struct grammar *g = NULL;
    int rc = !e ? error_set(err, ERR_NOMEM, "grammar: out of memory")
                : grammar_spec_copy(&e->spec, spec) ? error_set(err, ERR_NOMEM, "grammar: out of memory") : 0;
    if (!rc)
        rc = grammar_spec_compile(spec, "grammar", &g, err);
    if (!rc)
        rc = grammar_engine_create(&e->engine, g, 0, err);
    if (!rc)
        rc = token_mask_create(&e->mask, e->engine, wg->vocab, 0, err);
    if (rc) {
        entry_free(e);
        return rc;
    }
    e->hash = h;
    e->last_used = ++wg->clock;
    wg->cache[wg->n_cache++] = e;
    *out = e;
    return 0;
}

int worker_grammar_set(struct worker_grammar *wg, int slot, const cJSON *grammar, int n_prompt,
                       char *err)
{
    if (slot < 0 || slot >= wg->n_slots)
        return error_set(err, ERR_RANGE, "grammar: slot %d out of range", slot);
    struct slot_grammar *s = &wg->slots[slot];
    slot_clear(s);
    if (!grammar)
        return 0;
    struct grammar_spec spec;
    int rc = grammar_spec_from_json(&spec, grammar, "grammar", 1, err);
    if (!rc)
        rc = vocab_ready(wg, err);
    struct cached_engine *e = NULL;
    if (!rc)
        rc = engine_for(wg, &spec, &e, err);
    grammar_spec_free(&spec);
    if (rc)
        return rc;
    s->g.bits = malloc(token_mask_words(e->mask) * sizeof(uint64_t));
    if (!s->g.bits || grammar_matcher_init(&s->g.matcher, e->engine)) {
        free(s->g.bits);
        s->g.bits = NULL;
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    }
    s->g.mask = e->mask;
    s->g.vocab = wg->vocab;
    s->g.eos = (struct token_mask_eos){.ids = wg->eos, .n = wg->n_eos};
    s->g.n_prompt = n_prompt;
    s->entry = e;
    e->users++;
    cache_trim(wg);
    return 0;
}

struct specdec_grammar *worker_grammar_slot(struct worker_grammar *wg, int slot)
{
    if (!wg || slot < 0 || slot >= wg->n_slots || !wg->slots[slot].entry)
        return NULL;
    return &wg->slots[slot].g;
}
