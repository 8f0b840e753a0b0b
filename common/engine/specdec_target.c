/* specdec_target.c: the target half (contracts in specdec.h):
 * verification jobs stepped together, one forward call per step for every
 * job (a prompt a chunk at a time beside them), accept/reject on the host
 * or, with specdec_target_use_device, on the device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "specdec_internal.h"
#include "specdec_tree.h"

int specdec_target_create(struct specdec_target **out, struct llama_ctx *ctx, char *err)
{
    *out = NULL;
    struct specdec_target *t = calloc(1, sizeof *t);
    if (!t)
        return error_set(err, ERR_NOMEM, "target: out of memory");
    t->ctx = ctx;
    specdec_progress_set(&t->progress, NULL);
    t->vocab = specdec_ctx_vocab(ctx);
    t->scratch = malloc((size_t)t->vocab * sizeof(float));
    int rc = !t->scratch ? error_set(err, ERR_NOMEM, "target: out of memory")
                         : sampling_workspace_create(&t->ws, t->vocab, err);
    /* a whole verification's rows: the largest K's */
    if (!rc) {
        memset(t->scratch, 0, (size_t)t->vocab * sizeof(float));
        rc = specdec_grow_touched((void **)&t->logits, &t->logits_cap, SPECULATE_K_MAX + 1,
                          (size_t)t->vocab * sizeof(float), err);
    }
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
    specdec_dev_destroy(t->dev);
    free(t->rounds);
    free(t->outcomes);
    free(t->argmax_rows);
    free(t->allow_rows);
    free(t->logits);
    free(t->lp_rows);
    free(t->raw_rows);
    specdec_controls_free(t);
    free(t->scratch);
    free(t->tokens);
    free(t->tree_parents);
    free(t->entries);
    free(t->in_call);
    free(t->slot_busy);
    free(t);
}

struct llama_ctx *specdec_target_ctx(struct specdec_target *t) { return t->ctx; }

int specdec_target_use_device(struct specdec_target *t, bool on, char *err)
{
    if (!on) {
        specdec_dev_destroy(t->dev);
        t->dev = NULL;
        return 0;
    }
    if (t->dev)
        return 0;
    int rc = specdec_dev_create(&t->dev, t->ctx, err);
    if (!rc) { /* the rows live on the device now; specdec_grow() finds room again if it is turned off */
        free(t->logits);
        t->logits = NULL;
        t->logits_cap = 0;
    }
    return rc;
}

bool specdec_target_on_device(const struct specdec_target *t) { return t->dev != NULL; }

bool specdec_target_prepare_argmax(struct specdec_target *t)
{
    /* greedy verification and greedy plain decoding read only each row's argmax */
    t->argmax_ready = t->host_argmax = specdec_prepare_argmax(t->ctx, "target", false);
    return t->argmax_ready;
}

void specdec_target_set_argmax(struct specdec_target *t, bool on)
{
    t->host_argmax = on && t->argmax_ready;
}

void specdec_target_set_progress(struct specdec_target *t, const struct specdec_progress *p)
{
    specdec_progress_set(&t->progress, p);
}

void specdec_verify_job_init(struct specdec_verify_job *j)
{
    j->fed = 0;
    j->cached = 0;
    j->n_accepted = 0;
    j->started = false;
    j->done = false;
    j->rc = 0;
    j->err[0] = '\0';
    j->step_tokens = 0;
    j->step_final = false;
    j->in_step = false;
}

struct target_rows {
    struct specdec_target *t;
    const struct sampling_params *sp;
    float *p_rows;
};

/* Turns logits row i into the p row in place (speculate_input.prepare_p_row). */
static int prepare_p_row(void *user, int i, char *err)
{
    struct target_rows *r = user;
    struct specdec_target *t = r->t;
    float *row = r->p_rows + (size_t)i * (size_t)t->vocab;
    int rc = sampling_adjust(t->ws, r->sp, row, t->vocab, t->scratch, err);
    if (rc)
        return rc;
    memcpy(row, t->scratch, (size_t)t->vocab * sizeof(float));
    return 0;
}

/* Checks job j once, before its first step; 0 or the error it fails with. */
static int verify_start(struct specdec_target *t, struct specdec_verify_job *j, char *err)
{
    int rc = 0;
    if (j->parents && (rc = specdec_tree_check(t, j, err)))
        return rc;
    if (!j->parents && (j->k < 0 || j->k > SPECULATE_K_MAX))
        return error_set(err, ERR_INVALID_ARG, "k: must be in 0..%d, got %d", SPECULATE_K_MAX,
                         j->k);
    if (j->n_feed < 1 || !j->feed)
        return error_set(err, ERR_INVALID_ARG, "verify: nothing to feed");
    if (j->k > 0 && !j->draft)
        return error_set(err, ERR_INVALID_ARG, "verify: k = %d drafts but none given", j->k);
    const int max_seq = llama_ctx_max_seq_len(t->ctx);
    if (j->keep_len < 0 || j->n_feed + j->k > max_seq - j->keep_len)
        return error_set(err, ERR_CONTEXT_FULL,
                         "verify would reach %d positions, the context length is %d",
                         j->keep_len + j->n_feed + j->k, max_seq);
    if (j->k > 0 && !j->parents && !sampling_params_is_greedy(&j->sp) && j->mode == SPECULATE_MODE_SAMPLED &&
        !j->q_rows && !j->q_rows_dev)
        return error_set(err, ERR_INVALID_ARG,
                         "verify: q rows are required to verify sampled drafts");
    if (j->q_rows_dev && !t->dev)
        return error_set(err, ERR_INVALID_ARG,
                         "verify: q rows in device memory need device sampling");
    rc = specdec_hist_start(t, j, err);
    if (!rc && j->gram)
        rc = specdec_grammar_start(j->gram, j->keep_len, j->feed, j->n_feed, true, err);
    if (!rc)
        rc = llama_ctx_truncate(t->ctx, j->slot, j->keep_len, err);
    /* a prompt: the cached blocks it starts with are mapped, not computed;
     * its last token is, whose logits are wanted */
    if (rc == 0 && j->keep_len == 0)
        j->fed = j->cached = llama_ctx_prefix_map(t->ctx, j->slot, j->feed, j->n_feed, j->n_feed - 1);
    return rc;
}

/* The client's logprobs of j's n_accepted + 1 emitted tokens from rows
 * [n_accepted + 1, vocab] of its logits. */
static int job_logprobs(const struct specdec_target *t, struct specdec_verify_job *j,
                        const float *rows, char *err)
{
    for (int i = 0; i <= j->n_accepted; i++) {
        int rc = sampling_logprobs(rows + (size_t)i * (size_t)t->vocab, t->vocab, j->tokens_out[i],
                                   j->top_logprobs, &j->logprobs_out[i], err);
        if (rc)
            return rc;
    }
    return 0;
}

/* Where j's raw logits survive the accept/reject step: greedy reads them as
 * they are; otherwise rows are adjusted in place, and the controls change
 * them first, so a job with logprobs keeps a copy (k + 1 rows, only then).
 * NULL on error. */
static const float *keep_logits(struct specdec_target *t, const struct specdec_verify_job *j,
                                const float *p_rows, char *err)
{
    if (sampling_params_is_greedy(&j->sp) && !j->ctl && !j->gram)
        return p_rows;
    if (specdec_grow((void **)&t->lp_rows, &t->lp_cap, j->k + 1, (size_t)t->vocab * sizeof(float),
                     err))
        return NULL;
    memcpy(t->lp_rows, p_rows, (size_t)(j->k + 1) * (size_t)t->vocab * sizeof(float));
    return t->lp_rows;
}

/* Words of one row's allow bitset. */
static size_t allow_words(const struct specdec_target *t)
{
    return ((size_t)t->vocab + 63) / 64;
}

/* Accept/reject for a job whose final entry ran: p_rows holds its k + 1
 * logits rows, or (greedy) p_argmax their k + 1 argmaxes. */
static void verify_finish(struct specdec_target *t, struct specdec_verify_job *j, float *p_rows,
                          const int32_t *p_argmax)
{
    char err[ERR_MSG_MAX];
    const int greedy = sampling_params_is_greedy(&j->sp);
    struct target_rows rows = {.t = t, .sp = &j->sp, .p_rows = p_rows};
    struct speculate_input in = {
        /* Greedy reads the logits' argmax; otherwise each p row is adjusted
         * only when the accept/reject step reaches it. */
        .prepare_p_row = greedy ? NULL : prepare_p_row,
        .prepare_user = &rows,
        .k = j->k,
        .vocab = t->vocab,
        .draft_tokens = j->draft,
        .q_rows = j->q_rows,
        .p_rows = p_rows,
        .p_argmax = p_argmax,
        .greedy = greedy,
        .mode = j->mode,
        .seed = j->sp.seed,
        .position0 = (uint64_t)j->keep_len + (uint64_t)j->n_feed,
    };
    int n_accepted = 0;
    const float *lp_rows = NULL;
    int rc = 0;
    if (j->logprobs && !(lp_rows = keep_logits(t, j, p_rows, err)))
        rc = ERR_NOMEM;
    if (!rc && j->ctl)
        rc = specdec_controls_rows(t, j, p_rows, err);
    if (!rc && j->gram && p_rows) /* argmax rows were screened under the masks already */
        rc = specdec_grammar_mask_rows(j->gram, j->draft, j->k, p_rows, t->vocab, err);
    if (!rc)
        rc = speculate_verify(&in, t->scratch, j->tokens_out, &n_accepted, err);
    j->n_accepted = n_accepted;
    if (!rc)
        specdec_hist_accept(t, j);
    if (!rc && j->gram)
        rc = specdec_grammar_take(j->gram, j->draft, n_accepted, true, err);
    if (!rc && lp_rows)
        rc = job_logprobs(t, j, lp_rows, err);
    if (!rc)
        rc = llama_ctx_truncate(t->ctx, j->slot, j->keep_len + j->n_feed + n_accepted, err);
    if (rc) {
        specdec_job_fail(&j->rc, j->err, &j->done, rc, err);
        return;
    }
    j->n_accepted = n_accepted;
    j->done = true;
}

/* Device path: the logprobs of a job whose rows start at row0 of the
 * device logits, computed on the host from a copy of the emitted rows. */
static int dev_job_logprobs(struct specdec_target *t, struct specdec_verify_job *j, int row0,
                            char *err)
{
    if (j->ctl || j->gram) /* the device rows were changed: the raw ones were kept */
        return job_logprobs(t, j, t->raw_rows + (size_t)row0 * (size_t)t->vocab, err);
    int rc = specdec_grow((void **)&t->lp_rows, &t->lp_cap, j->n_accepted + 1,
                          (size_t)t->vocab * sizeof(float), err);
    if (!rc)
        rc = specdec_dev_download_logits(t->dev, row0, j->n_accepted + 1, t->lp_rows, err);
    return rc ? rc : job_logprobs(t, j, t->lp_rows, err);
}

/* Device path: accept/reject for every job of the step whose final entry
 * ran (rows 0 .. n_rows - 1 of the device logits), in one batch. */
static int verify_finish_dev(struct specdec_target *t, int n, char *err)
{
    int n_rounds = 0;
    if (n > t->rounds_cap) {
        struct specdec_dev_round *r = realloc(t->rounds, (size_t)n * sizeof *r);
        if (r)
            t->rounds = r;
        struct specdec_dev_outcome *o = r ? realloc(t->outcomes, (size_t)n * sizeof *o) : NULL;
        if (!o)
            return error_set(err, ERR_NOMEM, "speculation step: out of memory");
        t->outcomes = o;
        t->rounds_cap = n;
    }
    int row = 0;
    for (int i = 0; i < n; i++) {
        const struct specdec_verify_job *j = t->in_call[i];
        if (!j->step_final)
            continue;
        t->rounds[n_rounds++] = (struct specdec_dev_round){
            .k = j->k, .p_row0 = row, .sp = j->sp, .mode = j->mode,
            .position0 = (uint64_t)j->keep_len + (uint64_t)j->n_feed, .draft = j->draft,
            .q_dev = j->q_rows_dev, .q_host = j->q_rows};
        row += j->k + 1;
    }
    if (n_rounds == 0)
        return 0;
    int rc = specdec_dev_verify(t->dev, t->rounds, n_rounds, row, t->outcomes, err);
    if (rc)
        return rc;
    for (int i = 0, r = 0; i < n; i++) {
        struct specdec_verify_job *j = t->in_call[i];
        if (!j->step_final)
            continue;
        const struct specdec_dev_outcome *o = &t->outcomes[r++];
        char j_err[ERR_MSG_MAX];
        if (o->status == 0 && (o->n_accepted < 0 || o->n_accepted > j->k)) {
            error_set(j_err, ERR_INVALID_ARG, "verify: the device accepted %d of %d drafts",
                      o->n_accepted, j->k);
            specdec_job_fail(&j->rc, j->err, &j->done, ERR_INVALID_ARG, j_err);
            continue;
        }
        if (o->status != 0) {
            if (o->bad_row >= 0)
                error_set(j_err, ERR_INVALID_ARG, "verify: p row %d: %s", o->bad_row,
                          specdec_dev_status_str(o->status));
            else
                error_set(j_err, ERR_INVALID_ARG, "verify: %s", specdec_dev_status_str(o->status));
            specdec_job_fail(&j->rc, j->err, &j->done, ERR_INVALID_ARG, j_err);
            continue;
        }
        if ((rc = llama_ctx_truncate(t->ctx, j->slot, j->keep_len + j->n_feed + o->n_accepted,
                                     j_err))) {
            specdec_job_fail(&j->rc, j->err, &j->done, rc, j_err);
            continue;
        }
        memcpy(j->tokens_out, o->tokens, (size_t)(o->n_accepted + 1) * sizeof(int32_t));
        j->n_accepted = o->n_accepted;
        specdec_hist_accept(t, j);
        if (j->gram && (rc = specdec_grammar_take(j->gram, j->draft, j->n_accepted, true, j_err))) {
            specdec_job_fail(&j->rc, j->err, &j->done, rc, j_err);
            continue;
        }
        if (j->logprobs && (rc = dev_job_logprobs(t, j, t->rounds[r - 1].p_row0, j_err))) {
            specdec_job_fail(&j->rc, j->err, &j->done, rc, j_err);
            continue;
        }
        j->done = true;
    }
    return 0;
}

/* Room for every job's final entry: at most chunk_tokens of feed plus its
 * drafts, and k + 1 logits rows (a k out of range fails the job before it
 * uses any). Sized by each job's own k: 16 jobs at the largest K would
 * otherwise mean 272 vocabulary-wide rows. *dev_logits: the device rows, on
 * the device path. */
static int step_reserve(struct specdec_target *t, struct specdec_verify_job *const *jobs,
                        int n_jobs, float **dev_logits, char *err)
{
    const int n_slots = llama_ctx_n_slots(t->ctx);
    int rc = specdec_slot_flags(&t->slot_busy, n_slots, err);
    if (!rc)
        rc = specdec_step_capacity(&t->entries, (void **)&t->in_call, &t->entries_cap, n_jobs,
                                   err);
    if (rc)
        return rc;
    int want_tokens = 0, want_rows = 0;
    for (int i = 0; i < n_jobs; i++) {
        const int k_max = jobs[i]->parents ? SPECDEC_TREE_NODES_MAX : SPECULATE_K_MAX;
        const int k = jobs[i]->done || jobs[i]->k < 0 || jobs[i]->k > k_max ? 0 : jobs[i]->k;
        want_tokens += t->progress.chunk_tokens + k;
        want_rows += k + 1;
    }
    if ((rc = specdec_grow((void **)&t->tokens, &t->tokens_cap, want_tokens, sizeof(int32_t), err)) ||
        (rc = specdec_grow((void **)&t->tree_parents, &t->tree_parents_cap, want_tokens, sizeof(int32_t),
                           err)) ||
        (t->dev ? (rc = specdec_dev_logits(t->dev, want_rows, dev_logits, err))
                : (rc = specdec_grow((void **)&t->logits, &t->logits_cap, want_rows,
                             (size_t)t->vocab * sizeof(float), err))) ||
        (!t->dev && t->host_argmax &&
         ((rc = specdec_grow((void **)&t->argmax_rows, &t->argmax_cap, want_rows, sizeof(int32_t), err)) ||
          (rc = specdec_grow((void **)&t->allow_rows, &t->allow_cap, want_rows,
                             allow_words(t) * sizeof(uint64_t), err)))))
        return rc;
    return 0;
}

/* What one step has taken so far: the entries admitted (t->entries,
 * t->in_call) and the room they use. */
struct step_plan {
    int n_slots;
    float *dev_logits; /* the step's device rows; NULL on the host path */
    int free_left;     /* KV blocks the admitted entries leave free */
    int n;             /* entries admitted */
    int used_tokens;   /* of t->tokens: final entries' feed tails and drafts */
    int used_rows;     /* logits rows of the final entries */
};

/* Starts job j: a start truncates (blocks come back) and maps cached ones
 * (they leave the pool's reach), so p->free_left follows the pool and what
 * this step promised stays true. */
static int step_start_job(struct specdec_target *t, struct specdec_verify_job *j,
                          struct step_plan *p, char *err)
{
    const int avail = specdec_blocks_available(t->ctx);
    int rc = verify_start(t, j, err);
    p->free_left -= avail - specdec_blocks_available(t->ctx);
    if (!rc)
        j->started = true;
    return rc;
}

/* Where the k + 1 rows of j's final entry e go: device rows, host argmaxes
 * (greedy without logprobs or controls; a grammar's screened under its
 * masks) or host logits. */
static int final_entry_rows(struct specdec_target *t, struct specdec_verify_job *j,
                            struct llama_seq_batch *e, const struct step_plan *p, char *err)
{
    if (p->dev_logits) {
        e->logits_dev = p->dev_logits + (size_t)p->used_rows * (size_t)t->vocab;
    } else if (t->host_argmax && sampling_params_is_greedy(&j->sp) && !j->logprobs && !j->ctl) {
        e->argmax_out = t->argmax_rows + p->used_rows;
        if (j->gram) {
            uint64_t *allow = t->allow_rows + (size_t)p->used_rows * allow_words(t);
            int rc = specdec_grammar_allow_rows(j->gram, j->draft, j->k, allow, t->vocab, err);
            if (rc)
                return rc;
            e->argmax_allow = allow;
        }
    } else {
        e->logits_out = t->logits + (size_t)p->used_rows * (size_t)t->vocab;
    }
    return 0;
}

/* j's entry for this step in e: the head of a long feed, a chunk without
 * logits; or the rest of the feed and the drafts, with k + 1 rows. */
static int step_entry(struct specdec_target *t, struct specdec_verify_job *j,
                      struct llama_seq_batch *e, const struct step_plan *p, char *err)
{
    const int rest = j->n_feed - j->fed;
    /* a tree's forward holds its root, the last feed token, and the
     * drafts: what comes before runs first, as a feed's head */
    const int head_max = j->parents ? rest - 1 : rest;
    if (rest > t->progress.chunk_tokens || (j->parents && rest > 1)) {
        *e = (struct llama_seq_batch){.slot = j->slot, .tokens = j->feed + j->fed,
                                      .n_tokens = head_max < t->progress.chunk_tokens ? head_max
                                                                                      : t->progress.chunk_tokens};
        j->step_final = false;
    } else {
        int32_t *seq = t->tokens + p->used_tokens;
        memcpy(seq, j->feed + j->fed, (size_t)rest * sizeof(int32_t));
        if (j->k > 0)
            memcpy(seq + rest, j->draft, (size_t)j->k * sizeof(int32_t));
        *e = (struct llama_seq_batch){.slot = j->slot, .tokens = seq,
                                      .n_tokens = rest + j->k, .n_logits = j->k + 1};
        if (j->parents) {
            /* rest is 1 here: the root, then the drafts under it */
            int32_t *par = t->tree_parents + p->used_tokens;
            par[0] = -1;
            for (int d = 0; d < j->k; d++)
                par[d + 1] = j->parents[d] + 1;
            e->parents = par;
        }
        int rc = final_entry_rows(t, j, e, p, err);
        if (rc)
            return rc;
        j->step_final = true;
    }
    j->step_tokens = e->n_tokens;
    return 0;
}

/* Takes job j into the step when its slot is free and its entry fits; a job
 * that can never run fails with its own error and the step goes on. */
static void step_admit(struct specdec_target *t, struct specdec_verify_job *j, struct step_plan *p,
                       struct specdec_step_info *info)
{
    char e_err[ERR_MSG_MAX];
    int rc = 0;
    if (j->done)
        return;
    if (j->slot < 0 || j->slot >= p->n_slots) {
        error_set(e_err, ERR_RANGE, "slot: must be in 0..%d, got %d", p->n_slots - 1, j->slot);
        specdec_job_fail(&j->rc, j->err, &j->done, ERR_RANGE, e_err);
        return;
    }
    if (t->slot_busy[j->slot])
        return; /* a slot's later job waits for its earlier one */
    struct llama_seq_batch *e = &t->entries[p->n];
    int fits = 0;
    if ((!j->started && (rc = step_start_job(t, j, p, e_err))) ||
        (rc = step_entry(t, j, e, p, e_err)) || (rc = llama_check_seq(t->ctx, e, e_err)) ||
        (fits = specdec_entry_fits(t->ctx, e, p->n, &p->free_left, e_err)) < 0) {
        specdec_job_fail(&j->rc, j->err, &j->done, rc ? rc : fits, e_err);
        return;
    }
    if (!fits)
        return;
    if (j->step_final) {
        p->used_tokens += e->n_tokens;
        p->used_rows += e->n_logits;
    }
    t->slot_busy[j->slot] = true;
    j->in_step = true;
    t->in_call[p->n++] = j;
    info->rows += e->n_tokens;
}

/* One forward call for the step's n entries, then each job advanced: a
 * chunk's feed counted, a final entry accepted/rejected. A failed call
 * fails every job in it. */
static void step_forward(struct specdec_target *t, int n, struct specdec_step_info *info)
{
    char f_err[ERR_MSG_MAX];
    const double t0 = specdec_now_ms();
    int rc = llama_forward(t->ctx, t->entries, n, f_err);
    /* the device path accepts/rejects every finishing job at once; the
     * loop below then only advances the others */
    if (!rc && t->dev)
        rc = specdec_controls_dev(t, n, f_err);
    if (!rc && t->dev)
        rc = verify_finish_dev(t, n, f_err);
    info->ms = specdec_now_ms() - t0;
    for (int i = 0; i < n; i++) {
        struct specdec_verify_job *j = t->in_call[i];
        if (rc) {
            specdec_job_fail(&j->rc, j->err, &j->done, rc, f_err);
        } else if (!j->step_final) {
            j->fed += j->step_tokens;
            if (t->progress.on_chunk)
                t->progress.on_chunk(t->progress.user, j->fed, j->n_feed);
        } else {
            j->fed = j->n_feed;
            if (!t->dev && j->parents)
                specdec_tree_finish(t, j, t->entries[i].logits_out, t->entries[i].argmax_out);
            else if (!t->dev)
                verify_finish(t, j, t->entries[i].logits_out, t->entries[i].argmax_out);
        }
    }
}

int specdec_target_step(struct specdec_target *t, struct specdec_verify_job *const *jobs,
                        int n_jobs, struct specdec_step_info *info, char *err)
{
    struct specdec_step_info local = {0};
    if (!info)
        info = &local;
    *info = (struct specdec_step_info){0};
    struct step_plan p = {.n_slots = llama_ctx_n_slots(t->ctx)};
    int rc = step_reserve(t, jobs, n_jobs, &p.dev_logits, err);
    if (rc)
        return rc;
    struct llama_kv_stats kv;
    llama_ctx_kv_stats(t->ctx, &kv);
    p.free_left = kv.free_blocks;
    for (int i = 0; i < n_jobs; i++)
        jobs[i]->in_step = false;
    for (int i = 0; i < n_jobs; i++)
        step_admit(t, jobs[i], &p, info);
    for (int i = 0; i < p.n; i++)
        t->slot_busy[t->in_call[i]->slot] = false;
    info->seqs = p.n;
    if (p.n > 0)
        step_forward(t, p.n, info);
    return 0;
}

int specdec_target_run(struct specdec_target *t, struct specdec_verify_job *job, char *err)
{
    specdec_verify_job_init(job);
    struct specdec_verify_job *const jobs[1] = {job};
    while (!job->done) {
        int rc = specdec_target_step(t, jobs, 1, NULL, err);
        if (rc)
            return rc;
    }
    return job->rc ? error_set(err, job->rc, "%s", job->err) : 0;
}
