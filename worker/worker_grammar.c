/* worker_grammar.c: the slots' grammars and the engine cache (contracts in
 * worker_grammar.h).
 *
 * Invariant: a slot with a grammar holds its engine in the cache (a get
 * not yet put back), so the engine outlives the slot's matcher.
 */
#include "worker_grammar.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "grammar_cache.h"
#include "logging.h"
#include "tokenizer.h"

/* Engines kept for grammars no slot uses any more. */
#define WORKER_GRAMMAR_CACHE 8

struct slot_grammar {
    struct specdec_grammar g;
    struct grammar_engine *engine; /* NULL: none; the cache's, held until the slot's next prompt */
};

struct worker_grammar {
    char *model_dir;
    int32_t eos[MODEL_CONFIG_MAX_EOS];
    int n_eos;
    struct token_mask_vocab *vocab; /* NULL until the first grammar */
    /* Why the vocabulary could not be read (no tokenizer, a broken one):
     * kept, so that later grammars are refused at once instead of parsing
     * the tokenizer again per request; "" while none failed. Out of
     * memory is not kept: it may pass. */
    char vocab_err[ERR_MSG_MAX];
    int vocab_rc;
    struct grammar_cache *cache;    /* over vocab */
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

static void slot_clear(struct worker_grammar *wg, struct slot_grammar *s)
{
    if (!s->engine)
        return;
    grammar_matcher_free(&s->g.matcher);
    free(s->g.bits);
    grammar_cache_put(wg->cache, s->engine);
    s->engine = NULL;
    memset(&s->g, 0, sizeof s->g);
}

void worker_grammar_destroy(struct worker_grammar *wg)
{
    if (!wg)
        return;
    for (int i = 0; wg->slots && i < wg->n_slots; i++)
        slot_clear(wg, &wg->slots[i]);
    grammar_cache_destroy(wg->cache);
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
    if (wg->vocab_rc)
        return error_set(err, wg->vocab_rc, "%s", wg->vocab_err);
    struct tokenizer *tk = NULL;
    char why[ERR_MSG_MAX];
    int rc = tokenizer_load(&tk, wg->model_dir, why);
    if (rc) {
        rc = error_set(err, rc, "grammar: this worker needs its model's tokenizer for "
                       "structured output: %s", why);
        if (rc != ERR_NOMEM) {
            wg->vocab_rc = rc;
            snprintf(wg->vocab_err, sizeof wg->vocab_err, "%s", err);
        }
        return rc;
    }
    const int32_t n = tokenizer_vocab_size(tk);
    const uint8_t **bytes = NULL;
    size_t *lens = NULL;
    rc = tokenizer_text_tokens(tk, &bytes, &lens, err);
    if (!rc)
        rc = token_mask_vocab_create(&wg->vocab, bytes, lens, n, err);
    if (!rc && (rc = grammar_cache_create(&wg->cache, wg->vocab, WORKER_GRAMMAR_CACHE, err))) {
        token_mask_vocab_destroy(wg->vocab);
        wg->vocab = NULL;
    }
    free(bytes);
    free(lens);
    tokenizer_destroy(tk);
    if (!rc)
        LOG_INFO("grammar: vocabulary of %d tokens, trie of %d nodes", n,
                 token_mask_vocab_n_nodes(wg->vocab));
    return rc;
}

int worker_grammar_set(struct worker_grammar *wg, int slot, const cJSON *grammar, int n_prompt,
                       char *err)
{
    if (slot < 0 || slot >= wg->n_slots)
        return error_set(err, ERR_RANGE, "grammar: slot %d out of range", slot);
    struct slot_grammar *s = &wg->slots[slot];
    slot_clear(wg, s);
    if (!grammar)
        return 0;
    struct grammar_spec spec;
    int rc = grammar_spec_from_json(&spec, grammar, "grammar", 1, err);
    if (!rc)
        rc = vocab_ready(wg, err);
    struct grammar_engine *engine = NULL;
    struct token_mask *mask = NULL;
    if (!rc)
        rc = grammar_cache_get(wg->cache, &spec, "grammar", &engine, &mask, err);
    grammar_spec_free(&spec);
    if (rc)
        return rc;
    s->g.bits = malloc(token_mask_words(mask) * sizeof(uint64_t));
    if (!s->g.bits || grammar_matcher_init(&s->g.matcher, engine)) {
        free(s->g.bits);
        s->g.bits = NULL;
        grammar_cache_put(wg->cache, engine);
        return error_set(err, ERR_NOMEM, "grammar: out of memory");
    }
    s->g.mask = mask;
    s->g.vocab = wg->vocab;
    s->g.eos = (struct token_mask_eos){.ids = wg->eos, .n = wg->n_eos};
    s->g.n_prompt = n_prompt;
    s->engine = engine;
    return 0;
}

struct specdec_grammar *worker_grammar_slot(struct worker_grammar *wg, int slot)
{
    if (!wg || slot < 0 || slot >= wg->n_slots || !wg->slots[slot].engine)
        return NULL;
    return &wg->slots[slot].g;
}
