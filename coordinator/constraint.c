/* constraint.c: grammar cuts of the drafts made here (contracts in
 * constraint.h).
 *
 * Invariant: a sequence's matcher holds one state per output token of
 * s->hist it has been stepped over (an EOS keeps the state it came in);
 * tokens accepted since its last use are stepped over at the next cut.
 */
#include "constraint.h"

#include <stdlib.h>
#include <string.h>

#include "coord_state.h"
#include "error.h"
#include "grammar_cache.h"
#include "logging.h"
#include "tokenizer.h"

/* Engines kept for schemas no request uses any more. */
#define CONSTRAINT_CACHE 8

struct coord_grammar {
    struct token_mask_vocab *vocab;
    struct grammar_cache *cache;
};

struct seq_grammar {
    struct grammar_cache *cache; /* the engine's, put back at the end */
    struct grammar_engine *engine;
    const struct token_mask_vocab *vocab;
    struct grammar_matcher m;
    bool lost;                   /* a token of hist it refused: cuts nothing from then on */
};

static int vocab_ready(struct coordinator *c, char *err)
{
    if (c->grammar)
        return 0;
    if (!c->tk)
        return error_set(err, ERR_UNAVAILABLE, "no tokenizer");
    struct coord_grammar *g = calloc(1, sizeof *g);
    const int32_t n = tokenizer_vocab_size(c->tk);
    const uint8_t **bytes = NULL;
    size_t *lens = NULL;
    int rc = g ? tokenizer_text_tokens(c->tk, &bytes, &lens, err)
               : error_set(err, ERR_NOMEM, "out of memory");
    if (!rc)
        rc = token_mask_vocab_create(&g->vocab, bytes, lens, n, err);
    if (!rc)
        rc = grammar_cache_create(&g->cache, g->vocab, CONSTRAINT_CACHE, err);
    free(bytes);
    free(lens);
    if (rc) {
        if (g)
            token_mask_vocab_destroy(g->vocab);
        free(g);
        return rc;
    }
    c->grammar = g;
    return 0;
}

static struct seq_grammar *seq_grammar_new(struct coordinator *c, const struct seq *s, char *err)
{
    struct grammar_spec spec;
    int rc = vocab_ready(c, err);
    if (!rc)
        rc = grammar_spec_from_json(&spec, s->grammar, "grammar", 1, err);
    if (rc)
        return NULL;
    struct seq_grammar *g = calloc(1, sizeof *g);
    struct token_mask *mask = NULL;
    rc = !g ? error_set(err, ERR_NOMEM, "out of memory")
            : grammar_cache_get(c->grammar->cache, &spec, "grammar", &g->engine, &mask, err);
    grammar_spec_free(&spec);
    if (!rc && grammar_matcher_init(&g->m, g->engine)) {
        grammar_cache_put(c->grammar->cache, g->engine);
        rc = error_set(err, ERR_NOMEM, "out of memory");
    }
    if (rc) {
        free(g);
        return NULL;
    }
    g->cache = c->grammar->cache;
    g->vocab = c->grammar->vocab;
    return g;
}

/* Steps g over one token, by the rule the workers' halves keep: 0, or
 * nonzero when the grammar refuses it. */
static int take(const struct coordinator *c, const struct seq *s, struct seq_grammar *g, int32_t id)
{
    const struct worker *t = coord_target_of(c, s);
    const struct token_mask_eos eos = {.ids = t->eos_ids, .n = t->n_eos};
    return token_mask_take(&g->m, g->vocab, &eos, id, NULL);
}

int constraint_cut(struct coordinator *c, const struct seq *s, const int32_t *drafts, int k)
{
    if (!s->grammar || k <= 0)
        return k;
    struct seq *w = (struct seq *)s; /* the matcher is the cut's own state, not the round's */
    if (!w->gram) {
        if (w->gram_failed)
            return k;
        char err[ERR_MSG_MAX];
        if (!(w->gram = seq_grammar_new(c, s, err))) {
            w->gram_failed = true;
            LOG_WARN("request \"%s\": its drafts are not cut by the grammar here: %s", s->id, err);
            return k;
        }
    }
    struct seq_grammar *g = w->gram;
    const size_t out_len = (size_t)(s->n_hist - s->n_prompt);
    while (!g->lost && g->m.n_tokens < out_len)
        g->lost = take(c, s, g, s->hist[s->n_prompt + (int)g->m.n_tokens]) != 0;
    if (g->lost)
        return k;
    if (g->m.n_tokens > out_len)
        grammar_matcher_rollback(&g->m, g->m.n_tokens - out_len);
    int n = 0;
    while (n < k && take(c, s, g, drafts[n]) == 0)
        n++;
    grammar_matcher_rollback(&g->m, (size_t)n);
    return n;
}

void constraint_seq_free(struct seq_grammar *g)
{
    if (!g)
        return;
    grammar_matcher_free(&g->m);
    grammar_cache_put(g->cache, g->engine);
    free(g);
}

void constraint_free(struct coordinator *c)
{
    if (!c->grammar)
        return;
    grammar_cache_destroy(c->grammar->cache);
    token_mask_vocab_destroy(c->grammar->vocab);
    free(c->grammar);
    c->grammar = NULL;
}
