/* specdec_generate.c: the in-process speculative generation loop
 * (specdec_generate in specdec.h), on the two halves.
 *
 * Invariant: the target's cache holds every accepted token but the last
 * one (the last is fed at the start of the next round); the draft's cache
 * holds draft_valid positions that match the accepted sequence, and
 * whatever it cached beyond that is discarded through keep_len.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "ngram.h"
#include "specdec_internal.h"

/* Most n-gram drafts a round carries when the request fixes no K. */
#define SPECDEC_NGRAM_K 8

static int is_stop_id(const struct specdec_request *req, int32_t token)
{
    for (int i = 0; i < req->n_stop_ids; i++)
        if (req->stop_ids[i] == token)
            return 1;
    return 0;
}

/* Appends emitted tokens, applying stop ids and max_tokens; returns how many
 * were kept and sets *finished. */
static int append_tokens(const struct specdec_request *req, const int32_t *tokens, int n,
                         int32_t *out, int *n_out, const char **finish_reason, int *finished)
{
    int kept = 0;
    for (int i = 0; i < n && !*finished; i++) {
        out[(*n_out)++] = tokens[i];
        kept++;
        if (is_stop_id(req, tokens[i])) {
            *finish_reason = "stop";
            *finished = 1;
        } else if (*n_out >= req->max_tokens) {
            *finish_reason = "length";
            *finished = 1;
        }
    }
    return kept;
}

/* The request's parameters against the pair's: 0 with the context both
 * halves share in *max_seq, or the error. */
static int check_request(const struct specdec_draft *draft, const struct specdec_target *target,
                         const struct specdec_request *req, int *max_seq_out, char *err)
{
    int rc = sampling_params_validate(&req->sampling, err);
    if (rc)
        return rc;
    if (req->n_prompt < 1 || !req->prompt)
        return error_set(err, ERR_INVALID_ARG, "prompt: must hold at least one token");
    if (req->max_tokens < 1)
        return error_set(err, ERR_INVALID_ARG, "max_tokens: must be >= 1, got %d", req->max_tokens);
    int max_seq = llama_ctx_max_seq_len(target->ctx);
    if (draft) {
        if (draft->vocab != target->vocab)
            return error_set(err, ERR_MISMATCH, "draft vocabulary %d differs from the target's %d",
                             draft->vocab, target->vocab);
        int draft_max = llama_ctx_max_seq_len(draft->ctx);
        max_seq = draft_max < max_seq ? draft_max : max_seq;
    }
    if (req->n_prompt > max_seq - 1)
        return error_set(err, ERR_CONTEXT_FULL,
                         "prompt: %d tokens leave no room to generate in a context of %d",
                         req->n_prompt, max_seq);
    *max_seq_out = max_seq;
    return 0;
}

/* The n-gram drafts of a round (specdec_request.ngram) after seq[0..len),
 * at most K (k_fixed, else SPECDEC_NGRAM_K) and as many as room leaves
 * beside the token after them. */
static int ngram_round(const struct specdec_request *req, const int32_t *seq, int len, int room, int32_t *drafted)
{
    int cap = req->k_fixed > 0 ? req->k_fixed : SPECDEC_NGRAM_K;
    if (cap > room - 1)
        cap = room - 1;
    return cap > 0 ? ngram_draft(req->ngram, seq, len, cap, drafted) : 0;
}

/* How many of drafts[0..k) the grammar takes after `last` (the accepted
 * token the target's slot does not hold yet): n-gram drafts are cut at
 * the first refused one, so the target never verifies what it must refuse.
 * The matcher is left as it was. */
static int grammar_cut(struct specdec_grammar *g, int32_t last, const int32_t *drafts, int k)
{
    int32_t run[SPECULATE_K_MAX + 1];
    char err[ERR_MSG_MAX];
    run[0] = last;
    memcpy(run + 1, drafts, (size_t)k * sizeof *run);
    const size_t base = g->matcher.n_tokens;
    const int rc = specdec_grammar_take(g, run, k + 1, false, err);
    const int taken = (int)(g->matcher.n_tokens - base);
    g->lost = false;
    grammar_matcher_rollback(&g->matcher, (size_t)taken);
    return rc || taken < 1 ? 0 : taken - 1;
}

int specdec_generate(struct specdec_draft *draft, struct specdec_target *target,
                     const struct specdec_request *req, int32_t *out_tokens, int *n_out,
                     struct specdec_stats *stats, specdec_emit_fn emit, void *user, char *err)
{
    memset(stats, 0, sizeof *stats);
    *n_out = 0;
    int max_seq = 0;
    int rc = check_request(draft, target, req, &max_seq, err);
    if (rc)
        return rc;
    if ((rc = llama_ctx_truncate(target->ctx, req->slot, 0, err)) ||
        (draft && (rc = llama_ctx_truncate(draft->ctx, req->slot, 0, err))))
        return rc;

    int32_t *seq = malloc((size_t)max_seq * sizeof(int32_t));
    float *q_rows = NULL, *q_dev = NULL;
    const int need_q = draft && req->mode == SPECULATE_MODE_SAMPLED &&
                       !sampling_params_is_greedy(&req->sampling);
    /* Both halves sampling on one device: the q rows never leave it. On
     * two devices (or the host path) they cross through host memory. */
    struct kern_backend *q_be = llama_ctx_backend(target->ctx);
    const int q_on_device = need_q && draft->dev && target->dev &&
                            llama_ctx_backend(draft->ctx) == q_be;
    const size_t q_bytes = (size_t)SPECULATE_K_MAX * (size_t)target->vocab * sizeof(float);
    if (need_q && !q_on_device)
        q_rows = malloc(q_bytes);
    if (!seq || (need_q && !q_on_device && !q_rows)) {
        free(seq);
        free(q_rows);
        return error_set(err, ERR_NOMEM, "generate: out of memory");
    }
    if (q_on_device && (rc = q_be->ops->alloc(q_be, q_bytes, (void **)&q_dev, err))) {
        free(seq);
        return rc;
    }
    memcpy(seq, req->prompt, (size_t)req->n_prompt * sizeof(int32_t));
    stats->prompt_tokens = req->n_prompt;
    stats->finish_reason = "length";

    /* The sequence's controller starts from the pair's history when the
     * caller keeps one (costs and acceptance carry over between requests);
     * only the acceptance adapts within the sequence. */
    struct adaptive_k kc;
    if (req->k_history) {
        kc = *req->k_history;
        kc.k_fixed = req->k_fixed;
    } else {
        adaptive_k_init(&kc, req->k_fixed, 8);
    }
    int32_t drafted[SPECULATE_K_MAX];
    int32_t emitted[SPECULATE_K_MAX + 1];
    int n_acc = 0, finished = 0;
    const double t_start = specdec_now_ms();

    /* Prefill: the target's call samples the first token; the draft only
     * fills its cache. */
    struct specdec_grammar *gram_d = draft ? req->gram_draft : NULL;
    if (req->gram_target)
        req->gram_target->n_prompt = req->n_prompt;
    if (gram_d)
        gram_d->n_prompt = req->n_prompt;
    rc = specdec_target_verify_gram(target, req->slot, 0, req->prompt, req->n_prompt, NULL, 0, NULL,
                                    NULL, &req->sampling, req->mode, req->gram_target, emitted,
                                    &n_acc, err);
    if (!rc && draft)
        rc = specdec_draft_propose_gram(draft, req->slot, 0, req->prompt, req->n_prompt, 0,
                                        &req->sampling, req->mode, drafted, NULL, NULL, gram_d, err);
    if (rc)
        goto done;
    stats->prefill_ms = specdec_now_ms() - t_start;
    int draft_valid = req->n_prompt;
    int kept = append_tokens(req, emitted, 1, out_tokens, n_out, &stats->finish_reason, &finished);
    seq[req->n_prompt] = emitted[0];
    if (emit && emit(user, emitted, kept)) {
        rc = error_set(err, ERR_CANCELLED, "generation cancelled");
        goto done;
    }
    const double t_decode = specdec_now_ms();
    while (!finished) {
        const int len = req->n_prompt + *n_out; /* tokens in the sequence */
        int room = req->max_tokens - *n_out;
        if (max_seq - len < room)
            room = max_seq - len;
        if (room <= 0) {
            stats->finish_reason = "length";
            break;
        }
        int k = draft ? adaptive_k_next(&kc, room) : 0;
        enum speculate_mode mode = req->mode;
        if (!draft && req->ngram) {
            k = ngram_round(req, seq, len, room, drafted);
            if (req->gram_target)
                k = grammar_cut(req->gram_target, seq[len - 1], drafted, k);
            mode = SPECULATE_MODE_POINT_MASS; /* no draft distribution exists */
        }
        double t0 = specdec_now_ms();
        if (k > 0 && draft && (rc = specdec_draft_propose_gram(draft, req->slot, draft_valid, seq + draft_valid,
                                         len - draft_valid, k, &req->sampling, req->mode, drafted,
                                         q_rows, q_dev, gram_d, err)))
            break;
        double t1 = specdec_now_ms();
        if ((rc = specdec_target_verify_gram(target, req->slot, len - 1, seq + len - 1, 1, drafted, k, q_rows,
                                q_dev, &req->sampling, mode, req->gram_target, emitted, &n_acc, err)))
            break;
        double t2 = specdec_now_ms();
        stats->rounds++;
        stats->draft_ms += t1 - t0;
        stats->verify_ms += t2 - t1;
        if (draft) {
            /* Up to SPECULATE_ROUND_FEED_MAX fed tokens are what every
             * drafting round brings: they ride in its first call and are
             * part of drafting's cost. A round that also caught up on
             * tokens skipped at K = 0 (a probe) says nothing of that cost:
             * priced as if each caught-up token were a drafted one, a
             * probe after 32 plain rounds set the small pair's draft token
             * at 0.3 ms against 3 measured, and a draft that was never
             * accepted (a = 0.2) was drafted with again. */
            const int n_catch_up = len - draft_valid - SPECULATE_ROUND_FEED_MAX;
            const double draft_ms = k <= 0 ? 0.0 : n_catch_up > 0 ? -1.0 : t1 - t0;
            adaptive_k_update(&kc, k, n_acc, draft_ms, t2 - t1);
        }
        if (k > 0) {
            stats->drafted += k;
            stats->accepted += n_acc;
            for (int i = 0; i < n_acc; i++)
                stats->accepted_at[i]++;
            draft_valid = len + (n_acc < k - 1 ? n_acc : k - 1);
        }
        memcpy(seq + len, emitted, (size_t)(n_acc + 1) * sizeof(int32_t));
        kept = append_tokens(req, emitted, n_acc + 1, out_tokens, n_out, &stats->finish_reason,
                             &finished);
        if (emit && emit(user, emitted, kept)) {
            rc = error_set(err, ERR_CANCELLED, "generation cancelled");
            break;
        }
    }
    stats->decode_ms = specdec_now_ms() - t_decode;
done:
    stats->generated_tokens = *n_out;
    stats->cost_ratio = adaptive_k_cost_ratio(&kc);
    if (req->k_history && draft)
        *req->k_history = kc;
    free(seq);
    free(q_rows);
    if (q_dev)
        q_be->ops->free(q_be, q_dev);
    return rc;
}
