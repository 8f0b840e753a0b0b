/* specdec.c: the draft half, the target half and the in-process
 * speculative generation loop (see specdec.h for the contracts).
 *
 * Invariant kept by specdec_generate: the target's cache holds every accepted
 * token but the last one (the last is fed at the start of the next round);
 * the draft's cache holds draft_valid positions that match the accepted
 * sequence, and whatever it cached beyond that is discarded through keep_len.
 */
#include "specdec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "philox.h"

struct specdec_draft {
    struct llama_ctx *ctx;
    struct specdec_progress progress;
    int vocab;
    float *logits; /* [vocab] */
    float *probs;  /* [vocab] */
    struct sampling_workspace *ws;
};

struct specdec_target {
    struct llama_ctx *ctx;
    struct specdec_progress progress;
    int vocab;
    float *logits;  /* [SPECULATE_K_MAX + 1, vocab]: becomes the p rows in place */
    float *scratch; /* [vocab] */
    int32_t *seq;   /* [max_seq_len]: feed + drafts of one call */
    struct sampling_workspace *ws;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int ctx_vocab(struct llama_ctx *ctx);

static void progress_set(struct specdec_progress *dst, const struct specdec_progress *src)
{
    *dst = src ? *src : (struct specdec_progress){0};
    if (dst->chunk_tokens < 1)
        dst->chunk_tokens = SPECDEC_CHUNK_TOKENS_DEFAULT;
}

/* Feeds the head of a long feed in chunks without logits, leaving at most
 * chunk_tokens tokens for the caller's last call (which carries the logits).
 * Returns how many tokens it fed (0 for a short feed) or a negative code. */
static int feed_head(struct llama_ctx *ctx, const struct specdec_progress *pg, int slot,
                     const int32_t *feed, int n_feed, char *err)
{
    int done = 0;
    while (n_feed - done > pg->chunk_tokens) {
        struct llama_seq_batch b = {.slot = slot, .tokens = feed + done,
                                    .n_tokens = pg->chunk_tokens, .n_logits = 0,
                                    .logits_out = NULL};
        int rc = llama_forward(ctx, &b, 1, err);
        if (rc)
            return rc;
        done += pg->chunk_tokens;
        if (pg->on_chunk)
            pg->on_chunk(pg->user, done, n_feed);
    }
    return done;
}

int specdec_draft_create(struct specdec_draft **out, struct llama_ctx *ctx, char *err)
{
    *out = NULL;
    struct specdec_draft *d = calloc(1, sizeof *d);
    if (!d)
        return error_set(err, ERR_NOMEM, "draft: out of memory");
    d->ctx = ctx;
    progress_set(&d->progress, NULL);
    d->vocab = ctx_vocab(ctx);
    d->logits = malloc((size_t)d->vocab * sizeof(float));
    d->probs = malloc((size_t)d->vocab * sizeof(float));
    int rc = (!d->logits || !d->probs) ? error_set(err, ERR_NOMEM, "draft: out of memory")
                                        : sampling_workspace_create(&d->ws, d->vocab, err);
    if (rc) {
        specdec_draft_destroy(d);
        return rc;
    }
    *out = d;
    return 0;
}

void specdec_draft_destroy(struct specdec_draft *d)
{
    if (!d)
        return;
    sampling_workspace_destroy(d->ws);
    free(d->logits);
    free(d->probs);
    free(d);
}

struct llama_ctx *specdec_draft_ctx(struct specdec_draft *d) { return d->ctx; }

void specdec_draft_set_progress(struct specdec_draft *d, const struct specdec_progress *p)
{
    progress_set(&d->progress, p);
}

/* Picks draft token i from the draft logits in d->logits. */
static int draft_pick(struct specdec_draft *d, const struct sampling_params *sp,
                      enum speculate_mode mode, uint64_t position, float *q_row, int32_t *token,
                      char *err)
{
    int greedy = sampling_params_is_greedy(sp);
    float *row = q_row ? q_row : d->probs;
    if (greedy || mode == SPECULATE_MODE_POINT_MASS) {
        /* The argmax of the adjusted distribution is the argmax of the logits:
         * temperature, top-k, top-p and min-p all keep the most likely token.
         * No q row: the target never reads one in these modes. */
        *token = sampling_argmax(d->logits, d->vocab);
        return 0;
    }
    int rc = sampling_adjust(d->ws, sp, d->logits, d->vocab, row, err);
    if (rc)
        return rc;
    float u = philox_uniform(sp->seed, PHILOX_STREAM_DRAFT_SAMPLE, position, 0);
    *token = sampling_draw(row, d->vocab, u);
    return 0;
}

int specdec_draft_propose(struct specdec_draft *d, int slot, int keep_len, const int32_t *feed,
                          int n_feed, int k, const struct sampling_params *sp,
                          enum speculate_mode mode, int32_t *tokens_out, float *q_rows_out,
                          char *err)
{
    if (k < 0 || k > SPECULATE_K_MAX)
        return error_set(err, ERR_INVALID_ARG, "k: must be in 0..%d, got %d", SPECULATE_K_MAX, k);
    if (n_feed < 1)
        return error_set(err, ERR_INVALID_ARG, "draft: nothing to feed");
    int rc = llama_ctx_truncate(d->ctx, slot, keep_len, err);
    if (rc)
        return rc;
    int head = feed_head(d->ctx, &d->progress, slot, feed, n_feed, err);
    if (head < 0)
        return head;
    feed += head;
    n_feed -= head;
    struct llama_seq_batch b = {.slot = slot, .tokens = feed, .n_tokens = n_feed,
                                .n_logits = k > 0 ? 1 : 0, .logits_out = d->logits};
    if ((rc = llama_forward(d->ctx, &b, 1, err)))
        return rc;
    const uint64_t pos0 = (uint64_t)keep_len + (uint64_t)head + (uint64_t)n_feed;
    for (int i = 0; i < k; i++) {
        float *q_row = q_rows_out ? q_rows_out + (size_t)i * (size_t)d->vocab : NULL;
        if ((rc = draft_pick(d, sp, mode, pos0 + (uint64_t)i, q_row, &tokens_out[i], err)))
            return rc;
        if (i + 1 < k) {
            struct llama_seq_batch next = {.slot = slot, .tokens = &tokens_out[i], .n_tokens = 1,
                                           .n_logits = 1, .logits_out = d->logits};
            if ((rc = llama_forward(d->ctx, &next, 1, err)))
                return rc;
        }
    }
    return 0;
}

int specdec_target_create(struct specdec_target **out, struct llama_ctx *ctx, char *err)
{
    *out = NULL;
    struct specdec_target *t = calloc(1, sizeof *t);
    if (!t)
        return error_set(err, ERR_NOMEM, "target: out of memory");
    t->ctx = ctx;
    progress_set(&t->progress, NULL);
    t->vocab = ctx_vocab(ctx);
    t->logits = malloc((size_t)(SPECULATE_K_MAX + 1) * (size_t)t->vocab * sizeof(float));
    t->scratch = malloc((size_t)t->vocab * sizeof(float));
    t->seq = malloc((size_t)llama_ctx_max_seq_len(ctx) * sizeof(int32_t));
    int rc = (!t->logits || !t->scratch || !t->seq)
                 ? error_set(err, ERR_NOMEM, "target: out of memory")
                 : sampling_workspace_create(&t->ws, t->vocab, err);
    if (rc) {
        specdec_target_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void specdec_target_destroy(struct specdec_target *t)
{
    if (!t)
        return;
    sampling_workspace_destroy(t->ws);
    free(t->logits);
    free(t->scratch);
    free(t->seq);
    free(t);
}

struct llama_ctx *specdec_target_ctx(struct specdec_target *t) { return t->ctx; }

void specdec_target_set_progress(struct specdec_target *t, const struct specdec_progress *p)
{
    progress_set(&t->progress, p);
}

struct target_rows {
    struct specdec_target *t;
    const struct sampling_params *sp;
};

/* Turns logits row i into the p row in place (speculate_input.prepare_p_row). */
static int prepare_p_row(void *user, int i, char *err)
{
    struct target_rows *r = user;
    struct specdec_target *t = r->t;
    float *row = t->logits + (size_t)i * (size_t)t->vocab;
    int rc = sampling_adjust(t->ws, r->sp, row, t->vocab, t->scratch, err);
    if (rc)
        return rc;
    memcpy(row, t->scratch, (size_t)t->vocab * sizeof(float));
    return 0;
}

int specdec_target_verify(struct specdec_target *t, int slot, int keep_len,
                          const int32_t *feed, int n_feed, const int32_t *draft, int k,
                          const float *q_rows, const struct sampling_params *sp,
                          enum speculate_mode mode, int32_t *tokens_out, int *n_accepted_out,
                          char *err)
{
    *n_accepted_out = 0;
    if (k < 0 || k > SPECULATE_K_MAX)
        return error_set(err, ERR_INVALID_ARG, "k: must be in 0..%d, got %d", SPECULATE_K_MAX, k);
    if (n_feed < 1)
        return error_set(err, ERR_INVALID_ARG, "verify: nothing to feed");
    const int max_seq = llama_ctx_max_seq_len(t->ctx);
    if (keep_len < 0 || n_feed + k > max_seq - keep_len)
        return error_set(err, ERR_CONTEXT_FULL,
                         "verify would reach %d positions, the context length is %d",
                         keep_len + n_feed + k, max_seq);
    const int greedy = sampling_params_is_greedy(sp);
    if (k > 0 && !greedy && mode == SPECULATE_MODE_SAMPLED && !q_rows)
        return error_set(err, ERR_INVALID_ARG, "verify: q rows are required to verify sampled drafts");
    int rc = llama_ctx_truncate(t->ctx, slot, keep_len, err);
    if (rc)
        return rc;
    /* The head of a long feed goes in chunks; keep_len and n_feed then
     * describe the last call, whose positions and rows are unchanged. */
    int head = feed_head(t->ctx, &t->progress, slot, feed, n_feed, err);
    if (head < 0)
        return head;
    keep_len += head;
    feed += head;
    n_feed -= head;
    memcpy(t->seq, feed, (size_t)n_feed * sizeof(int32_t));
    if (k > 0)
        memcpy(t->seq + n_feed, draft, (size_t)k * sizeof(int32_t));
    struct llama_seq_batch b = {.slot = slot, .tokens = t->seq, .n_tokens = n_feed + k,
                                .n_logits = k + 1, .logits_out = t->logits};
    if ((rc = llama_forward(t->ctx, &b, 1, err)))
        return rc;
    struct target_rows rows = {.t = t, .sp = sp};
    struct speculate_input in = {
        /* Greedy reads the logits' argmax; otherwise each p row is adjusted
         * only when the accept/reject step reaches it. */
        .prepare_p_row = greedy ? NULL : prepare_p_row,
        .prepare_user = &rows,
        .k = k,
        .vocab = t->vocab,
        .draft_tokens = draft,
        .q_rows = q_rows,
        .p_rows = t->logits,
        .greedy = greedy,
        .mode = mode,
        .seed = sp->seed,
        .position0 = (uint64_t)keep_len + (uint64_t)n_feed,
    };
    int n_accepted = 0;
    if ((rc = speculate_verify(&in, t->scratch, tokens_out, &n_accepted, err)))
        return rc;
    if ((rc = llama_ctx_truncate(t->ctx, slot, keep_len + n_feed + n_accepted, err)))
        return rc;
    *n_accepted_out = n_accepted;
    return 0;
}

/* ---- in-process generation ---- */

static int ctx_vocab(struct llama_ctx *ctx)
{
    return llama_model_config(llama_ctx_model(ctx))->vocab_size;
}

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

int specdec_generate(struct specdec_draft *draft, struct specdec_target *target,
                     const struct specdec_request *req, int32_t *out_tokens, int *n_out,
                     struct specdec_stats *stats, specdec_emit_fn emit, void *user, char *err)
{
    memset(stats, 0, sizeof *stats);
    *n_out = 0;
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
    if ((rc = llama_ctx_truncate(target->ctx, req->slot, 0, err)) ||
        (draft && (rc = llama_ctx_truncate(draft->ctx, req->slot, 0, err))))
        return rc;

    int32_t *seq = malloc((size_t)max_seq * sizeof(int32_t));
    float *q_rows = NULL;
    const int need_q = draft && req->mode == SPECULATE_MODE_SAMPLED &&
                       !sampling_params_is_greedy(&req->sampling);
    if (need_q)
        q_rows = malloc((size_t)SPECULATE_K_MAX * (size_t)target->vocab * sizeof(float));
    if (!seq || (need_q && !q_rows)) {
        free(seq);
        free(q_rows);
        return error_set(err, ERR_NOMEM, "generate: out of memory");
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
    const double t_start = now_ms();

    /* Prefill: the target's call samples the first token; the draft only
     * fills its cache. */
    rc = specdec_target_verify(target, req->slot, 0, req->prompt, req->n_prompt, NULL, 0, NULL,
                               &req->sampling, req->mode, emitted, &n_acc, err);
    if (!rc && draft)
        rc = specdec_draft_propose(draft, req->slot, 0, req->prompt, req->n_prompt, 0,
                                   &req->sampling, req->mode, drafted, NULL, err);
    if (rc)
        goto done;
    stats->prefill_ms = now_ms() - t_start;
    int draft_valid = req->n_prompt;
    int kept = append_tokens(req, emitted, 1, out_tokens, n_out, &stats->finish_reason, &finished);
    seq[req->n_prompt] = emitted[0];
    if (emit && emit(user, emitted, kept)) {
        rc = error_set(err, ERR_CANCELLED, "generation cancelled");
        goto done;
    }
    const double t_decode = now_ms();
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
        double t0 = now_ms();
        if (k > 0 && (rc = specdec_draft_propose(draft, req->slot, draft_valid, seq + draft_valid,
                                                 len - draft_valid, k, &req->sampling, req->mode,
                                                 drafted, q_rows, err)))
            break;
        double t1 = now_ms();
        if ((rc = specdec_target_verify(target, req->slot, len - 1, seq + len - 1, 1, drafted, k,
                                        q_rows, &req->sampling, req->mode, emitted, &n_acc, err)))
            break;
        double t2 = now_ms();
        stats->rounds++;
        stats->draft_ms += t1 - t0;
        stats->verify_ms += t2 - t1;
        if (draft) {
            /* Catching up on tokens skipped at K = 0 is a one-off: the
             * controller wants the cost of drafting itself. */
            int n_feed = len - draft_valid;
            double draft_ms = k > 0 ? (t1 - t0) * k / (double)(k + n_feed - 1) : 0.0;
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
    stats->decode_ms = now_ms() - t_decode;
done:
    stats->generated_tokens = *n_out;
    stats->cost_ratio = adaptive_k_cost_ratio(&kc);
    if (req->k_history && draft)
        *req->k_history = kc;
    free(seq);
    free(q_rows);
    return rc;
}
