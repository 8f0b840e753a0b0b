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
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "logging.h"
#include "philox.h"
#include "specdec_device.h"

struct specdec_draft {
    struct llama_ctx *ctx;
    struct specdec_progress progress;
    int vocab;
    float *logits;      /* [logits_cap, vocab]: one row per job of a step */
    int logits_cap;
    float *probs;       /* [vocab] */
    struct llama_seq_batch *entries; /* [entries_cap] */
    struct specdec_draft_job **in_call; /* [entries_cap] */
    int entries_cap;
    bool *slot_busy;    /* [n_slots]: slot already in this step */
    struct sampling_workspace *ws;
    /* device sampling (specdec_draft_use_device); NULL: the host path */
    struct specdec_dev *dev;
    struct specdec_dev_pick *picks; /* [entries_cap] */
    int32_t *pick_tokens;           /* [4 * picks_cap]: the picks' tokens, their
                                       statuses, then (token, status) per entry */
    int picks_cap;
    /* The host path's greedy picks: the forward returns only each row's
     * argmax (llama_seq_batch.argmax_out), where the backend offers it. */
    bool host_argmax;
    bool argmax_ready;              /* the backend offers it and the head is prepared */
    int32_t *argmax_picks;          /* [argmax_cap]: one per entry of a step */
    int argmax_cap;
};

struct specdec_target {
    struct llama_ctx *ctx;
    struct specdec_progress progress;
    int vocab;
    float *logits;      /* [logits_cap, vocab]: the k + 1 rows of each finishing job */
    int logits_cap;
    float *scratch;     /* [vocab] */
    int32_t *tokens;    /* [tokens_cap]: feed tail + drafts of each finishing job */
    int tokens_cap;
    struct llama_seq_batch *entries;
    struct specdec_verify_job **in_call;
    int entries_cap;
    bool *slot_busy;
    struct sampling_workspace *ws;
    /* device sampling (specdec_target_use_device); NULL: the host path */
    struct specdec_dev *dev;
    struct specdec_dev_round *rounds;     /* [rounds_cap] */
    struct specdec_dev_outcome *outcomes; /* [rounds_cap] */
    int rounds_cap;
    /* The host path's greedy verifications read only each row's argmax
     * (llama_seq_batch.argmax_out), where the backend offers it. */
    bool host_argmax;
    bool argmax_ready;      /* the backend offers it and the head is prepared */
    int32_t *argmax_rows;   /* [argmax_cap]: the k + 1 argmaxes of each finishing job */
    int argmax_cap;
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

/* Grows *buf (capacity *cap elements of elem bytes) to hold want. */
static int grow(void **buf, int *cap, int want, size_t elem, char *err)
{
    if (want <= *cap)
        return 0;
    int n = *cap > 0 ? *cap : 4;
    while (n < want)
        n *= 2;
    void *p = realloc(*buf, (size_t)n * elem);
    if (!p)
        return error_set(err, ERR_NOMEM, "speculation step: out of memory");
    *buf = p;
    *cap = n;
    return 0;
}

/* grow, then writes the whole buffer once: a buffer of vocabulary-wide rows
 * sized at creation is committed there, not page by page in the first
 * calls that reach its rows (see ctx_touch_logits in llama.c), where the
 * faults were timed as the cost of drafting or of a longer verification. */
static int grow_touched(void **buf, int *cap, int want, size_t elem, char *err)
{
    int rc = grow(buf, cap, want, elem, err);
    if (!rc)
        memset(*buf, 0, (size_t)*cap * elem);
    return rc;
}

static void job_fail(int *rc_out, char *err_out, bool *done, int rc, const char *err)
{
    *rc_out = rc;
    snprintf(err_out, ERR_MSG_MAX, "%s", err && err[0] ? err : error_name(rc));
    *done = true;
}

/* Whether the pool can take entry e now. A call that could never fit, even
 * alone in an empty step, fails (ERR_OVERLOADED); otherwise it waits for a
 * later step. *free_left counts down the blocks promised in this step. */
static int entry_fits(struct llama_ctx *ctx, const struct llama_seq_batch *e, int n_taken,
                      int *free_left, char *err)
{
    const int need = llama_ctx_blocks_needed(ctx, e->slot, llama_ctx_slot_len(ctx, e->slot) +
                                                               e->n_tokens);
    if (need <= *free_left) {
        *free_left -= need;
        return 1;
    }
    if (n_taken == 0)
        return error_set(err, ERR_OVERLOADED,
                         "kv cache: slot %d needs %d more blocks, %d are free", e->slot, need,
                         *free_left);
    return 0;
}

static int step_capacity(void **entries, void **in_call, int *cap, bool **slot_busy, int n_slots,
                         int want, size_t entry_size, char *err)
{
    int cap_entries = *cap;
    if (!*slot_busy && !(*slot_busy = calloc((size_t)n_slots, sizeof **slot_busy)))
        return error_set(err, ERR_NOMEM, "speculation step: out of memory");
    int rc = grow(entries, &cap_entries, want, entry_size, err);
    if (rc)
        return rc;
    int cap_calls = *cap;
    rc = grow(in_call, &cap_calls, want, sizeof(void *), err);
    if (rc)
        return rc;
    *cap = cap_entries < cap_calls ? cap_entries : cap_calls;
    return 0;
}

/* Readies the backend's argmax screen for ctx's LM head, where it offers
 * one (llama_model_prepare_argmax); returns whether it is ready. Never
 * fatal: without it greedy rows read the whole head, which is only slower,
 * so a head the backend will not copy (one holding a NaN) or no memory for
 * the copy (a byte a weight, half a byte for a draft's head) is logged and
 * decoding goes on. */
static bool prepare_argmax(struct llama_ctx *ctx, const char *half, bool draft)
{
    if (!llama_ctx_has_argmax(ctx))
        return false;
    char err[ERR_MSG_MAX];
    if (llama_model_prepare_argmax(llama_ctx_model(ctx), draft, err) == 0)
        return true;
    LOG_WARN("%s: greedy rows will read the whole LM head: %s", half, err);
    return false;
}

/* ---- the draft half ---- */

int specdec_draft_create(struct specdec_draft **out, struct llama_ctx *ctx, char *err)
{
    *out = NULL;
    struct specdec_draft *d = calloc(1, sizeof *d);
    if (!d)
        return error_set(err, ERR_NOMEM, "draft: out of memory");
    d->ctx = ctx;
    progress_set(&d->progress, NULL);
    d->vocab = ctx_vocab(ctx);
    d->probs = malloc((size_t)d->vocab * sizeof(float));
    int rc = !d->probs ? error_set(err, ERR_NOMEM, "draft: out of memory")
                       : sampling_workspace_create(&d->ws, d->vocab, err);
    if (!rc) {
        memset(d->probs, 0, (size_t)d->vocab * sizeof(float)); /* committed now (grow_touched) */
        rc = grow_touched((void **)&d->logits, &d->logits_cap, 1, (size_t)d->vocab * sizeof(float),
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
    d->argmax_ready = d->host_argmax = prepare_argmax(d->ctx, "draft", true);
    return d->argmax_ready;
}

void specdec_draft_set_argmax(struct specdec_draft *d, bool on)
{
    d->host_argmax = on && d->argmax_ready;
}

bool specdec_target_prepare_argmax(struct specdec_target *t)
{
    /* greedy verification and greedy plain decoding read only each row's argmax */
    t->argmax_ready = t->host_argmax = prepare_argmax(t->ctx, "target", false);
    return t->argmax_ready;
}

void specdec_target_set_argmax(struct specdec_target *t, bool on)
{
    t->host_argmax = on && t->argmax_ready;
}

void specdec_draft_set_progress(struct specdec_draft *d, const struct specdec_progress *p)
{
    progress_set(&d->progress, p);
}

void specdec_draft_job_init(struct specdec_draft_job *j)
{
    j->fed = 0;
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

/* Picks draft token i of job j from logits, or takes the pick made already:
 * the device's on the device path (dev_pick: token, status), the forward's
 * argmax on the host path (argmax_pick). */
static int draft_pick(struct specdec_draft *d, struct specdec_draft_job *j, const float *logits,
                      int i, const int32_t *dev_pick, const int32_t *argmax_pick, char *err)
{
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
    if (draft_takes_argmax(j)) {
        /* The argmax of the adjusted distribution is the argmax of the logits:
         * temperature, top-k, top-p and min-p all keep the most likely token.
         * No q row: the target never reads one in these modes. */
        j->tokens_out[i] = sampling_argmax(logits, d->vocab);
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
        if (rc) {
            job_fail(&j->rc, j->err, &j->done, rc, err);
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
    int rc = draft_pick(d, j, logits, j->drafted, dev_pick, argmax_pick, err);
    if (rc) {
        job_fail(&j->rc, j->err, &j->done, rc, err);
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

int specdec_draft_step(struct specdec_draft *d, struct specdec_draft_job *const *jobs, int n_jobs,
                       struct specdec_step_info *info, char *err)
{
    struct specdec_step_info local = {0};
    if (!info)
        info = &local;
    *info = (struct specdec_step_info){0};
    const int n_slots = llama_ctx_n_slots(d->ctx);
    int rc = step_capacity((void **)&d->entries, (void **)&d->in_call, &d->entries_cap,
                           &d->slot_busy, n_slots, n_jobs, sizeof *d->entries, err);
    float *dev_logits = NULL;
    if (!rc && d->dev)
        rc = draft_dev_reserve(d, n_jobs, &dev_logits, err);
    else if (!rc)
        rc = grow((void **)&d->logits, &d->logits_cap, n_jobs,
                  (size_t)d->vocab * sizeof(float), err);
    if (!rc && !d->dev && d->host_argmax)
        rc = grow((void **)&d->argmax_picks, &d->argmax_cap, n_jobs, sizeof *d->argmax_picks,
                  err);
    if (rc)
        return rc;
    struct llama_kv_stats kv;
    llama_ctx_kv_stats(d->ctx, &kv);
    int free_left = kv.free_blocks, n = 0;
    for (int i = 0; i < n_jobs; i++)
        jobs[i]->in_step = false;
    for (int i = 0; i < n_jobs; i++) {
        struct specdec_draft_job *j = jobs[i];
        if (j->done || j->slot < 0 || j->slot >= n_slots || d->slot_busy[j->slot]) {
            if (!j->done && (j->slot < 0 || j->slot >= n_slots)) {
                char e[ERR_MSG_MAX];
                error_set(e, ERR_RANGE, "slot: must be in 0..%d, got %d", n_slots - 1, j->slot);
                job_fail(&j->rc, j->err, &j->done, ERR_RANGE, e);
            }
            continue; /* a slot's later job waits for its earlier one */
        }
        struct llama_seq_batch *e = &d->entries[n];
        draft_next_entry(d, j, e, dev_logits ? NULL : d->logits + (size_t)n * (size_t)d->vocab);
        if (j->done)
            continue;
        if (dev_logits)
            e->logits_dev = dev_logits + (size_t)n * (size_t)d->vocab;
        else if (d->host_argmax && e->n_logits > 0 && draft_takes_argmax(j)) {
            e->logits_out = NULL;
            e->argmax_out = d->argmax_picks + n;
        }
        char e_err[ERR_MSG_MAX];
        int fits = 0;
        if ((rc = llama_check_seq(d->ctx, e, e_err)) ||
            (fits = entry_fits(d->ctx, e, n, &free_left, e_err)) < 0) {
            job_fail(&j->rc, j->err, &j->done, rc ? rc : fits, e_err);
            continue;
        }
        if (!fits)
            continue;
        d->slot_busy[j->slot] = true;
        j->in_step = true;
        d->in_call[n++] = j;
        info->rows += e->n_tokens;
    }
    for (int i = 0; i < n; i++)
        d->slot_busy[d->in_call[i]->slot] = false;
    info->seqs = n;
    if (n == 0)
        return 0;
    char f_err[ERR_MSG_MAX];
    const double t0 = now_ms();
    rc = llama_forward(d->ctx, d->entries, n, f_err);
    if (!rc && d->dev)
        rc = draft_dev_picks(d, n, f_err);
    info->ms = now_ms() - t0;
    for (int i = 0; i < n; i++) {
        struct specdec_draft_job *j = d->in_call[i];
        if (rc) {
            job_fail(&j->rc, j->err, &j->done, rc, f_err);
            continue;
        }
        const bool head = j->fed + j->step_tokens < j->n_feed;
        draft_after_entry(d, j, d->dev ? NULL : d->logits + (size_t)i * (size_t)d->vocab,
                          d->dev ? draft_dev_pair(d, i) : NULL, d->entries[i].argmax_out);
        if (head && d->progress.on_chunk)
            d->progress.on_chunk(d->progress.user, j->fed, j->n_feed);
    }
    return 0;
}

/* specdec_draft_propose, q rows to host (q_rows_out) or device (q_rows_dev) memory. */
static int draft_propose(struct specdec_draft *d, int slot, int keep_len, const int32_t *feed,
                         int n_feed, int k, const struct sampling_params *sp,
                         enum speculate_mode mode, int32_t *tokens_out, float *q_rows_out,
                         float *q_rows_dev, char *err)
{
    struct specdec_draft_job j = {.slot = slot, .keep_len = keep_len, .feed = feed,
                                  .n_feed = n_feed, .k = k, .sp = *sp, .mode = mode,
                                  .tokens_out = tokens_out, .q_rows_out = q_rows_out,
                                  .q_rows_dev = q_rows_dev};
    specdec_draft_job_init(&j);
    struct specdec_draft_job *const jobs[1] = {&j};
    while (!j.done) {
        int rc = specdec_draft_step(d, jobs, 1, NULL, err);
        if (rc)
            return rc;
    }
    if (j.rc)
        return error_set(err, j.rc, "%s", j.err);
    return 0;
}

int specdec_draft_propose(struct specdec_draft *d, int slot, int keep_len, const int32_t *feed,
                          int n_feed, int k, const struct sampling_params *sp,
                          enum speculate_mode mode, int32_t *tokens_out, float *q_rows_out,
                          char *err)
{
    return draft_propose(d, slot, keep_len, feed, n_feed, k, sp, mode, tokens_out, q_rows_out,
                         NULL, err);
}

/* ---- the target half ---- */

int specdec_target_create(struct specdec_target **out, struct llama_ctx *ctx, char *err)
{
    *out = NULL;
    struct specdec_target *t = calloc(1, sizeof *t);
    if (!t)
        return error_set(err, ERR_NOMEM, "target: out of memory");
    t->ctx = ctx;
    progress_set(&t->progress, NULL);
    t->vocab = ctx_vocab(ctx);
    t->scratch = malloc((size_t)t->vocab * sizeof(float));
    int rc = !t->scratch ? error_set(err, ERR_NOMEM, "target: out of memory")
                         : sampling_workspace_create(&t->ws, t->vocab, err);
    /* a whole verification's rows: the largest K's */
    if (!rc) {
        memset(t->scratch, 0, (size_t)t->vocab * sizeof(float));
        rc = grow_touched((void **)&t->logits, &t->logits_cap, SPECULATE_K_MAX + 1,
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
    free(t->logits);
    free(t->scratch);
    free(t->tokens);
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
    if (!rc) { /* the rows live on the device now; grow() finds room again if it is turned off */
        free(t->logits);
        t->logits = NULL;
        t->logits_cap = 0;
    }
    return rc;
}

bool specdec_target_on_device(const struct specdec_target *t) { return t->dev != NULL; }

void specdec_target_set_progress(struct specdec_target *t, const struct specdec_progress *p)
{
    progress_set(&t->progress, p);
}

void specdec_verify_job_init(struct specdec_verify_job *j)
{
    j->fed = 0;
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
    if (j->k < 0 || j->k > SPECULATE_K_MAX)
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
    if (j->k > 0 && !sampling_params_is_greedy(&j->sp) && j->mode == SPECULATE_MODE_SAMPLED &&
        !j->q_rows && !j->q_rows_dev)
        return error_set(err, ERR_INVALID_ARG,
                         "verify: q rows are required to verify sampled drafts");
    if (j->q_rows_dev && !t->dev)
        return error_set(err, ERR_INVALID_ARG,
                         "verify: q rows in device memory need device sampling");
    return llama_ctx_truncate(t->ctx, j->slot, j->keep_len, err);
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
    int rc = speculate_verify(&in, t->scratch, j->tokens_out, &n_accepted, err);
    if (!rc)
        rc = llama_ctx_truncate(t->ctx, j->slot, j->keep_len + j->n_feed + n_accepted, err);
    if (rc) {
        job_fail(&j->rc, j->err, &j->done, rc, err);
        return;
    }
    j->n_accepted = n_accepted;
    j->done = true;
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
            job_fail(&j->rc, j->err, &j->done, ERR_INVALID_ARG, j_err);
            continue;
        }
        if (o->status != 0) {
            if (o->bad_row >= 0)
                error_set(j_err, ERR_INVALID_ARG, "verify: p row %d: %s", o->bad_row,
                          specdec_dev_status_str(o->status));
            else
                error_set(j_err, ERR_INVALID_ARG, "verify: %s", specdec_dev_status_str(o->status));
            job_fail(&j->rc, j->err, &j->done, ERR_INVALID_ARG, j_err);
            continue;
        }
        if ((rc = llama_ctx_truncate(t->ctx, j->slot, j->keep_len + j->n_feed + o->n_accepted,
                                     j_err))) {
            job_fail(&j->rc, j->err, &j->done, rc, j_err);
            continue;
        }
        memcpy(j->tokens_out, o->tokens, (size_t)(o->n_accepted + 1) * sizeof(int32_t));
        j->n_accepted = o->n_accepted;
        j->done = true;
    }
    return 0;
}

int specdec_target_step(struct specdec_target *t, struct specdec_verify_job *const *jobs,
                        int n_jobs, struct specdec_step_info *info, char *err)
{
    struct specdec_step_info local = {0};
    if (!info)
        info = &local;
    *info = (struct specdec_step_info){0};
    const int n_slots = llama_ctx_n_slots(t->ctx);
    int rc = step_capacity((void **)&t->entries, (void **)&t->in_call, &t->entries_cap,
                           &t->slot_busy, n_slots, n_jobs, sizeof *t->entries, err);
    if (rc)
        return rc;
    /* Room for every job's final entry: at most chunk_tokens of feed plus
     * its drafts, and k + 1 logits rows (a k out of range fails the job
     * before it uses any). Sized by each job's own k: 16 jobs at the
     * largest K would otherwise mean 272 vocabulary-wide rows. */
    int want_tokens = 0, want_rows = 0;
    for (int i = 0; i < n_jobs; i++) {
        const int k = jobs[i]->done || jobs[i]->k < 0 || jobs[i]->k > SPECULATE_K_MAX ? 0
                                                                                      : jobs[i]->k;
        want_tokens += t->progress.chunk_tokens + k;
        want_rows += k + 1;
    }
    float *dev_logits = NULL;
    if ((rc = grow((void **)&t->tokens, &t->tokens_cap, want_tokens, sizeof(int32_t), err)) ||
        (t->dev ? (rc = specdec_dev_logits(t->dev, want_rows, &dev_logits, err))
                : (rc = grow((void **)&t->logits, &t->logits_cap, want_rows,
                             (size_t)t->vocab * sizeof(float), err))) ||
        (!t->dev && t->host_argmax &&
         (rc = grow((void **)&t->argmax_rows, &t->argmax_cap, want_rows, sizeof(int32_t), err))))
        return rc;
    struct llama_kv_stats kv;
    llama_ctx_kv_stats(t->ctx, &kv);
    int free_left = kv.free_blocks, n = 0, used_tokens = 0, used_rows = 0;
    for (int i = 0; i < n_jobs; i++)
        jobs[i]->in_step = false;
    for (int i = 0; i < n_jobs; i++) {
        struct specdec_verify_job *j = jobs[i];
        char e_err[ERR_MSG_MAX];
        if (j->done)
            continue;
        if (j->slot < 0 || j->slot >= n_slots) {
            error_set(e_err, ERR_RANGE, "slot: must be in 0..%d, got %d", n_slots - 1, j->slot);
            job_fail(&j->rc, j->err, &j->done, ERR_RANGE, e_err);
            continue;
        }
        if (t->slot_busy[j->slot])
            continue; /* a slot's later job waits for its earlier one */
        if (!j->started) {
            if ((rc = verify_start(t, j, e_err))) {
                job_fail(&j->rc, j->err, &j->done, rc, e_err);
                continue;
            }
            j->started = true;
        }
        struct llama_seq_batch *e = &t->entries[n];
        const int rest = j->n_feed - j->fed;
        if (rest > t->progress.chunk_tokens) {
            /* the head of a long feed: a chunk without logits */
            *e = (struct llama_seq_batch){.slot = j->slot, .tokens = j->feed + j->fed,
                                          .n_tokens = t->progress.chunk_tokens};
            j->step_final = false;
        } else {
            int32_t *seq = t->tokens + used_tokens;
            memcpy(seq, j->feed + j->fed, (size_t)rest * sizeof(int32_t));
            if (j->k > 0)
                memcpy(seq + rest, j->draft, (size_t)j->k * sizeof(int32_t));
            *e = (struct llama_seq_batch){.slot = j->slot, .tokens = seq,
                                          .n_tokens = rest + j->k, .n_logits = j->k + 1};
            if (dev_logits)
                e->logits_dev = dev_logits + (size_t)used_rows * (size_t)t->vocab;
            else if (t->host_argmax && sampling_params_is_greedy(&j->sp))
                e->argmax_out = t->argmax_rows + used_rows;
            else
                e->logits_out = t->logits + (size_t)used_rows * (size_t)t->vocab;
            j->step_final = true;
        }
        j->step_tokens = e->n_tokens;
        int fits = 0;
        if ((rc = llama_check_seq(t->ctx, e, e_err)) ||
            (fits = entry_fits(t->ctx, e, n, &free_left, e_err)) < 0) {
            job_fail(&j->rc, j->err, &j->done, rc ? rc : fits, e_err);
            continue;
        }
        if (!fits)
            continue;
        if (j->step_final) {
            used_tokens += e->n_tokens;
            used_rows += e->n_logits;
        }
        t->slot_busy[j->slot] = true;
        j->in_step = true;
        t->in_call[n++] = j;
        info->rows += e->n_tokens;
    }
    for (int i = 0; i < n; i++)
        t->slot_busy[t->in_call[i]->slot] = false;
    info->seqs = n;
    if (n == 0)
        return 0;
    char f_err[ERR_MSG_MAX];
    const double t0 = now_ms();
    rc = llama_forward(t->ctx, t->entries, n, f_err);
    /* the device path accepts/rejects every finishing job at once; the
     * loop below then only advances the others */
    if (!rc && t->dev)
        rc = verify_finish_dev(t, n, f_err);
    info->ms = now_ms() - t0;
    for (int i = 0; i < n; i++) {
        struct specdec_verify_job *j = t->in_call[i];
        if (rc) {
            job_fail(&j->rc, j->err, &j->done, rc, f_err);
        } else if (!j->step_final) {
            j->fed += j->step_tokens;
            if (t->progress.on_chunk)
                t->progress.on_chunk(t->progress.user, j->fed, j->n_feed);
        } else {
            j->fed = j->n_feed;
            if (!t->dev)
                verify_finish(t, j, t->entries[i].logits_out, t->entries[i].argmax_out);
        }
    }
    return 0;
}

/* specdec_target_verify, q rows from host (q_rows) or device (q_rows_dev) memory. */
static int target_verify(struct specdec_target *t, int slot, int keep_len, const int32_t *feed,
                         int n_feed, const int32_t *draft, int k, const float *q_rows,
                         const float *q_rows_dev, const struct sampling_params *sp,
                         enum speculate_mode mode, int32_t *tokens_out, int *n_accepted_out,
                         char *err)
{
    *n_accepted_out = 0;
    struct specdec_verify_job j = {.slot = slot, .keep_len = keep_len, .feed = feed,
                                   .n_feed = n_feed, .draft = draft, .k = k, .q_rows = q_rows,
                                   .q_rows_dev = q_rows_dev, .sp = *sp, .mode = mode};
    specdec_verify_job_init(&j);
    struct specdec_verify_job *const jobs[1] = {&j};
    while (!j.done) {
        int rc = specdec_target_step(t, jobs, 1, NULL, err);
        if (rc)
            return rc;
    }
    if (j.rc)
        return error_set(err, j.rc, "%s", j.err);
    memcpy(tokens_out, j.tokens_out, (size_t)(j.n_accepted + 1) * sizeof(int32_t));
    *n_accepted_out = j.n_accepted;
    return 0;
}

int specdec_target_verify(struct specdec_target *t, int slot, int keep_len,
                          const int32_t *feed, int n_feed, const int32_t *draft, int k,
                          const float *q_rows, const struct sampling_params *sp,
                          enum speculate_mode mode, int32_t *tokens_out, int *n_accepted_out,
                          char *err)
{
    return target_verify(t, slot, keep_len, feed, n_feed, draft, k, q_rows, NULL, sp, mode,
                         tokens_out, n_accepted_out, err);
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
        if (k > 0 && (rc = draft_propose(draft, req->slot, draft_valid, seq + draft_valid,
                                         len - draft_valid, k, &req->sampling, req->mode, drafted,
                                         q_rows, q_dev, err)))
            break;
        double t1 = now_ms();
        if ((rc = target_verify(target, req->slot, len - 1, seq + len - 1, 1, drafted, k, q_rows,
                                q_dev, &req->sampling, req->mode, emitted, &n_acc, err)))
            break;
        double t2 = now_ms();
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
    stats->decode_ms = now_ms() - t_decode;
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
