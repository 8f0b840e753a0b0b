/* specdec_draft.c: the draft half (contracts in specdec.h): draft jobs
 * stepped together, one forward call per step for every job's next entry
 * (a feed chunk, or the next token to draft from), the picks on the host or,
 * with specdec_draft_use_device, on the device.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argmax.h"
#include "error.h"
#include "philox.h"
#include "specdec_internal.h"

int specdec_draft_create(struct specdec_draft **out, struct llama_ctx *ctx, char *err)
{
    *out = NULL;
    struct specdec_draft *d = calloc(1, sizeof *d);
    if (!d)
        return error_set(err, ERR_NOMEM, "draft: out of memory");
    d->ctx = ctx;
    specdec_progress_set(&d->progress, NULL);
    d->vocab = specdec_ctx_vocab(ctx);
    d->probs = malloc((size_t)d->vocab * sizeof(float));
    int rc = !d->probs ? error_set(err, ERR_NOMEM, "draft: out of memory")
                       : sampling_workspace_create(&d->ws, d->vocab, err);
    if (!rc) {
        memset(d->probs, 0, (size_t)d->vocab * sizeof(float)); /* committed now (grow_touched) */
        rc = specdec_grow_touched((void **)&d->logits, &d->logits_cap, 1, (size_t)d->vocab * sizeof(float),
                          err);
    }
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
    specdec_dev_destroy(d->dev);
    free(d->picks);
    free(d->pick_tokens);
    free(d->argmax_picks);
    free(d->allow_rows);
    free(d->logits);
    free(d->probs);
    free(d->entries);
    free(d->in_call);
    free(d->slot_busy);
    free(d);
}

struct llama_ctx *specdec_draft_ctx(struct specdec_draft *d) { return d->ctx; }

int specdec_draft_use_device(struct specdec_draft *d, bool on, char *err)
{
    if (!on) {
        specdec_dev_destroy(d->dev);
        d->dev = NULL;
        return 0;
    }
    return d->dev ? 0 : specdec_dev_create(&d->dev, d->ctx, err);
}

bool specdec_draft_on_device(const struct specdec_draft *d) { return d->dev != NULL; }

bool specdec_draft_prepare_argmax(struct specdec_draft *d)
{
    /* A greedy or point-mass draft reads nothing of its logits but the
     * argmax: the backend may find it from a cheaper copy of the LM head
     * (most of a small draft's bytes). Its argmax is a proposal: the copy
     * may be one whose answer is exact only with overwhelming probability
     * (kernels.h: prepare_argmax with draft), as a wrong proposal costs a
     * rejected token and never one of the target's. */
    d->argmax_ready = d->host_argmax = specdec_prepare_argmax(d->ctx, "draft", true);
    return d->argmax_ready;
}

void specdec_draft_set_argmax(struct specdec_draft *d, bool on)
{
    d->host_argmax = on && d->argmax_ready;
}

void specdec_draft_set_progress(struct specdec_draft *d, const struct specdec_progress *p)
{
    specdec_progress_set(&d->progress, p);
}

void specdec_draft_job_init(struct specdec_draft_job *j)
{
    j->fed = 0;
    j->cached = 0;
    j->drafted = 0;
    j->started = false;
    j->done = false;
    j->rc = 0;
    j->err[0] = '\0';
    j->step_tokens = 0;
    j->in_step = false;
}

/* Whether job j's drafts are its logits' argmax (no q row is read). */
static bool draft_takes_argmax(const struct specdec_draft_job *j)
{
    return sampling_params_is_greedy(&j->sp) || j->mode == SPECULATE_MODE_POINT_MASS;
}

/* Words of one row's allow bitset. */
static size_t draft_allow_words(const struct specdec_draft *d)
{
    return ((size_t)d->vocab + 63) / 64;
}

/* Picks job j's next draft token (j->drafted) from logits, or takes the
 * pick made already: the device's on the device path (dev_pick: token,
 * status), the forward's argmax on the host path (argmax_pick). */
static int draft_pick(struct specdec_draft *d, struct specdec_draft_job *j, const float *logits,
                      const int32_t *dev_pick, const int32_t *argmax_pick, char *err)
{
    const int i = j->drafted;
    if (argmax_pick) {
        if (*argmax_pick < 0 || *argmax_pick >= d->vocab)
            return error_set(err, ERR_INVALID_ARG, "draft token %d: no largest logit (id %d): "
                             "every logit is NaN", i, (int)*argmax_pick);
        j->tokens_out[i] = *argmax_pick;
        return 0;
    }
    if (dev_pick) {
        if (dev_pick[1] != 0)
            return error_set(err, ERR_INVALID_ARG, "draft token %d: %s", i,
                             specdec_dev_status_str(dev_pick[1]));
        if (dev_pick[0] < 0 || dev_pick[0] >= d->vocab)
            return error_set(err, ERR_INVALID_ARG, "draft token %d: the device picked id %d",
                             i, (int)dev_pick[0]);
        j->tokens_out[i] = dev_pick[0];
        return 0;
    }
    const struct sampling_params *sp = &j->sp;
    const uint64_t position = (uint64_t)j->keep_len + (uint64_t)j->n_feed + (uint64_t)i;
    if (j->gram) {
        /* the row is the step's own (d->logits): masked in place */
        int rc = specdec_grammar_mask_row(j->gram, (float *)logits, d->vocab, false, err);
        if (rc)
            return rc;
    }
    if (draft_takes_argmax(j)) {
        /* The argmax of the adjusted distribution is the argmax of the logits:
         * temperature, top-k, top-p and min-p all keep the most likely token.
         * No q row: the target never reads one in these modes. */
        j->tokens_out[i] = argmax_f32(logits, d->vocab);
        return 0;
    }
    float *row = j->q_rows_out ? j->q_rows_out + (size_t)i * (size_t)d->vocab : d->probs;
    int rc = sampling_adjust(d->ws, sp, logits, d->vocab, row, err);
    if (rc)
        return rc;
    float u = philox_uniform(sp->seed, PHILOX_STREAM_DRAFT_SAMPLE, position, 0);
    j->tokens_out[i] = sampling_draw(row, d->vocab, u);
    return 0;
}

/* The forward entry job j needs next, or 0 rows when it has finished (an
 * error is recorded in the job). */
static void draft_next_entry(struct specdec_draft *d, struct specdec_draft_job *j,
                             struct llama_seq_batch *e, float *logits)
{
    char err[ERR_MSG_MAX];
    *e = (struct llama_seq_batch){.slot = j->slot, .logits_out = logits};
    if (!j->started) {
        int rc = 0;
        if (j->k < 0 || j->k > SPECULATE_K_MAX)
            rc = error_set(err, ERR_INVALID_ARG, "k: must be in 0..%d, got %d", SPECULATE_K_MAX,
                           j->k);
        else if (j->n_feed < 1 || !j->feed)
            rc = error_set(err, ERR_INVALID_ARG, "draft: nothing to feed");
        else if (j->k > 0 && !j->tokens_out)
            rc = error_set(err, ERR_INVALID_ARG, "draft: no room for the drafted tokens");
        else if (j->q_rows_dev && !d->dev)
            rc = error_set(err, ERR_INVALID_ARG,
                           "draft: q rows in device memory need device sampling");
        else
            rc = llama_ctx_truncate(d->ctx, j->slot, j->keep_len, err);
        if (rc == 0 && j->gram && !d->dev)
            rc = specdec_grammar_start(j->gram, j->keep_len, j->feed, j->n_feed, false, err);
        /* a prompt: the cached blocks it starts with are mapped, not
         * computed; its last token is, whose logits are wanted */
        if (rc == 0 && j->keep_len == 0)
            j->fed = j->cached = llama_ctx_prefix_map(d->ctx, j->slot, j->feed, j->n_feed, j->n_feed - 1);
        if (rc) {
            specdec_job_fail(&j->rc, j->err, &j->done, rc, err);
            return;
        }
        j->started = true;
    }
    const int rest = j->n_feed - j->fed;
    if (rest > d->progress.chunk_tokens) {
        e->tokens = j->feed + j->fed;
        e->n_tokens = d->progress.chunk_tokens;
    } else if (rest > 0) {
        e->tokens = j->feed + j->fed;
        e->n_tokens = rest;
        e->n_logits = j->k > 0 ? 1 : 0;
    } else {
        /* drafting: feed the token drawn last, read the next distribution */
        e->tokens = j->tokens_out + j->drafted - 1;
        e->n_tokens = 1;
        e->n_logits = 1;
    }
    j->step_tokens = e->n_tokens;
}

/* Advances job j past the entry it just ran (logits: its row, if any;
 * dev_pick: the device's pick for it, on the device path; argmax_pick: the
 * forward's argmax of its row, where it asked for that instead). */
static void draft_after_entry(struct specdec_draft *d, struct specdec_draft_job *j,
                              const float *logits, const int32_t *dev_pick,
                              const int32_t *argmax_pick)
{
    char err[ERR_MSG_MAX];
    if (j->fed < j->n_feed) {
        j->fed += j->step_tokens;
        if (j->fed < j->n_feed)
            return;
        if (j->k == 0) {
            j->done = true;
            return;
        }
    }
    int rc = draft_pick(d, j, logits, dev_pick, argmax_pick, err);
    if (!rc && j->gram && !dev_pick)
        rc = specdec_grammar_take(j->gram, j->tokens_out + j->drafted, 1, false, err);
    if (rc) {
        specdec_job_fail(&j->rc, j->err, &j->done, rc, err);
        return;
    }
    if (++j->drafted == j->k)
        j->done = true;
}

/* Device path: room for n_jobs logits rows (backend memory) and picks. */
static int draft_dev_reserve(struct specdec_draft *d, int n_jobs, float **logits_dev, char *err)
{
    int rc = specdec_dev_logits(d->dev, n_jobs, logits_dev, err);
    if (rc || n_jobs <= d->picks_cap)
        return rc;
    struct specdec_dev_pick *p = realloc(d->picks, (size_t)n_jobs * sizeof *p);
    if (p)
        d->picks = p;
    int32_t *t = p ? realloc(d->pick_tokens, 4 * (size_t)n_jobs * sizeof *t) : NULL;
    if (!t)
        return error_set(err, ERR_NOMEM, "speculation step: out of memory");
    d->pick_tokens = t;
    d->picks_cap = n_jobs;
    return 0;
}

/* Device path, after the forward: the picks of every entry that asked for
 * logits (a job about to draft), made on the device in one batch; entry i's
 * (token, status) lands in draft_dev_pair(d, i). */
static int32_t *draft_dev_pair(struct specdec_draft *d, int i)
{
    return d->pick_tokens + 2 * (size_t)d->picks_cap + 2 * (size_t)i;
}

static int draft_dev_picks(struct specdec_draft *d, int n, char *err)
{
    int n_picks = 0;
    int32_t *tok = d->pick_tokens, *st = d->pick_tokens + d->picks_cap;
    for (int i = 0; i < n; i++) {
        const struct specdec_draft_job *j = d->in_call[i];
        if (d->entries[i].n_logits == 0)
            continue;
        const int at = j->drafted;
        const int argmax = draft_takes_argmax(j);
        const size_t off = (size_t)at * (size_t)d->vocab;
        d->picks[n_picks++] = (struct specdec_dev_pick){
            .row = i, .argmax = argmax, .sp = j->sp,
            .position = (uint64_t)j->keep_len + (uint64_t)j->n_feed + (uint64_t)at,
            .q_dev = !argmax && j->q_rows_dev ? j->q_rows_dev + off : NULL,
            .q_host = !argmax && j->q_rows_out ? j->q_rows_out + off : NULL};
    }
    int rc = specdec_dev_draft_picks(d->dev, d->picks, n_picks, tok, st, err);
    if (rc)
        return rc;
    for (int i = 0, p = 0; i < n; i++) {
        int32_t *pair = draft_dev_pair(d, i);
        const int picked = d->entries[i].n_logits > 0;
        pair[0] = picked ? tok[p] : -1;
        pair[1] = picked ? st[p] : 0;
        p += picked;
    }
    return 0;
}

/* Room for a step of n_jobs entries: a logits row each (device rows on the
 * device path, *dev_logits, with the picks), and the host path's argmax
 * picks and grammar masks. */
static int draft_step_reserve(struct specdec_draft *d, int n_jobs, float **dev_logits, char *err)
{
    int rc = specdec_slot_flags(&d->slot_busy, llama_ctx_n_slots(d->ctx), err);
    if (!rc)
        rc = specdec_step_capacity(&d->entries, (void **)&d->in_call, &d->entries_cap, n_jobs,
                                   err);
    if (!rc && d->dev)
        rc = draft_dev_reserve(d, n_jobs, dev_logits, err);
    else if (!rc)
        rc = specdec_grow((void **)&d->logits, &d->logits_cap, n_jobs,
                  (size_t)d->vocab * sizeof(float), err);
    if (!rc && !d->dev && d->host_argmax)
        rc = specdec_grow((void **)&d->argmax_picks, &d->argmax_cap, n_jobs, sizeof *d->argmax_picks,
                  err);
    if (!rc && !d->dev && d->host_argmax)
        rc = specdec_grow((void **)&d->allow_rows, &d->allow_cap, n_jobs,
                          draft_allow_words(d) * sizeof(uint64_t), err);
    return rc;
}

/* What one step has taken so far: the entries admitted (d->entries,
 * d->in_call) and the KV blocks they leave free. */
struct draft_plan {
    int n_slots;
    float *dev_logits; /* the step's device rows; NULL on the host path */
    int free_left;
    int n;
};

/* Host path: entry e (job j's, n-th of the step) asks the forward for its
 * row's argmax instead of the row, under a grammar the screen among what its
 * state allows. 0 or the error that fails j. */
static int draft_entry_argmax(struct specdec_draft *d, struct specdec_draft_job *j,
                              struct llama_seq_batch *e, int n, char *err)
{
    uint64_t *allow = d->allow_rows + (size_t)n * draft_allow_words(d);
    const int unmasked = j->gram ? specdec_grammar_allow_row(j->gram, allow, d->vocab, false, err)
                                 : 1;
    if (unmasked < 0)
        return unmasked;
    e->logits_out = NULL;
    e->argmax_out = d->argmax_picks + n;
    e->argmax_allow = unmasked ? NULL : allow;
    return 0;
}

/* Takes job j into the step when its slot is free and its entry fits; a job
 * that can never run fails with its own error and the step goes on. */
static void draft_admit(struct specdec_draft *d, struct specdec_draft_job *j, struct draft_plan *p,
                        struct specdec_step_info *info)
{
    if (j->done || j->slot < 0 || j->slot >= p->n_slots || d->slot_busy[j->slot]) {
        if (!j->done && (j->slot < 0 || j->slot >= p->n_slots)) {
            char e[ERR_MSG_MAX];
            error_set(e, ERR_RANGE, "slot: must be in 0..%d, got %d", p->n_slots - 1, j->slot);
            specdec_job_fail(&j->rc, j->err, &j->done, ERR_RANGE, e);
        }
        return; /* a slot's later job waits for its earlier one */
    }
    const int n = p->n;
    struct llama_seq_batch *e = &d->entries[n];
    /* a start truncates and maps cached blocks (specdec_target_step) */
    const int avail = specdec_blocks_available(d->ctx);
    draft_next_entry(d, j, e, p->dev_logits ? NULL : d->logits + (size_t)n * (size_t)d->vocab);
    p->free_left -= avail - specdec_blocks_available(d->ctx);
    if (j->done)
        return;
    if (p->dev_logits)
        e->logits_dev = p->dev_logits + (size_t)n * (size_t)d->vocab;
    char e_err[ERR_MSG_MAX];
    int rc = 0, fits = 0;
    if ((!p->dev_logits && d->host_argmax && e->n_logits > 0 && draft_takes_argmax(j) &&
         (rc = draft_entry_argmax(d, j, e, n, e_err))) ||
        (rc = llama_check_seq(d->ctx, e, e_err)) ||
        (fits = specdec_entry_fits(d->ctx, e, n, &p->free_left, e_err)) < 0) {
        specdec_job_fail(&j->rc, j->err, &j->done, rc ? rc : fits, e_err);
        return;
    }
    if (!fits)
        return;
    d->slot_busy[j->slot] = true;
    j->in_step = true;
    d->in_call[p->n++] = j;
    info->rows += e->n_tokens;
}

/* One forward call for the step's n entries (the device's picks after it),
 * then each job advanced past its entry. A failed call fails every job in
 * it. */
static void draft_forward(struct specdec_draft *d, int n, struct specdec_step_info *info)
{
    char f_err[ERR_MSG_MAX];
    const double t0 = specdec_now_ms();
    int rc = llama_forward(d->ctx, d->entries, n, f_err);
    if (!rc && d->dev)
        rc = draft_dev_picks(d, n, f_err);
    info->ms = specdec_now_ms() - t0;
    for (int i = 0; i < n; i++) {
        struct specdec_draft_job *j = d->in_call[i];
        if (rc) {
            specdec_job_fail(&j->rc, j->err, &j->done, rc, f_err);
            continue;
        }
        const bool head = j->fed + j->step_tokens < j->n_feed;
        draft_after_entry(d, j, d->dev ? NULL : d->logits + (size_t)i * (size_t)d->vocab,
                          d->dev ? draft_dev_pair(d, i) : NULL, d->entries[i].argmax_out);
        if (head && d->progress.on_chunk)
            d->progress.on_chunk(d->progress.user, j->fed, j->n_feed);
    }
}

int specdec_draft_step(struct specdec_draft *d, struct specdec_draft_job *const *jobs, int n_jobs,
                       struct specdec_step_info *info, char *err)
{
    struct specdec_step_info local = {0};
    if (!info)
        info = &local;
    *info = (struct specdec_step_info){0};
    struct draft_plan p = {.n_slots = llama_ctx_n_slots(d->ctx)};
    int rc = draft_step_reserve(d, n_jobs, &p.dev_logits, err);
    if (rc)
        return rc;
    struct llama_kv_stats kv;
    llama_ctx_kv_stats(d->ctx, &kv);
    p.free_left = kv.free_blocks;
    for (int i = 0; i < n_jobs; i++)
        jobs[i]->in_step = false;
    for (int i = 0; i < n_jobs; i++)
        draft_admit(d, jobs[i], &p, info);
    for (int i = 0; i < p.n; i++)
        d->slot_busy[d->in_call[i]->slot] = false;
    info->seqs = p.n;
    if (p.n > 0)
        draft_forward(d, p.n, info);
    return 0;
}

int specdec_draft_run(struct specdec_draft *d, struct specdec_draft_job *job, char *err)
{
    specdec_draft_job_init(job);
    struct specdec_draft_job *const jobs[1] = {job};
    while (!job->done) {
        int rc = specdec_draft_step(d, jobs, 1, NULL, err);
        if (rc)
            return rc;
    }
    return job->rc ? error_set(err, job->rc, "%s", job->err) : 0;
}
