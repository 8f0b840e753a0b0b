/* specdec_controls.c: the target half's sampling controls (logit bias and
 * penalties, sampling.h): the tokens each slot holds, kept beside its KV
 * for the sequences that need them, and the controls applied to a
 * verification's rows, row i after the drafts before it, so each row sees
 * what target-only decoding of that position sees.
 *
 * Invariant: a slot's history is known only from a verification with
 * keep_len 0 (a prompt) of a job with controls on; it then mirrors the
 * slot's KV: truncated to keep_len at each start, the feed appended, the
 * accepted drafts kept. A job with controls on a slot whose history is not
 * known fails alone (its sequence did not start with them).
 */
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "specdec_internal.h"

static int hist_reserve(struct specdec_slot_hist *h, int want, char *err)
{
    if (want <= h->cap)
        return 0;
    int cap = h->cap > 0 ? h->cap : 256;
    while (cap < want)
        cap *= 2;
    int32_t *p = realloc(h->tokens, (size_t)cap * sizeof *p);
    if (!p)
        return error_set(err, ERR_NOMEM, "sampling controls: out of memory");
    h->tokens = p;
    h->cap = cap;
    return 0;
}

/* The slots' histories and the counts scratch, made on first use. */
static int controls_ready(struct specdec_target *t, char *err)
{
    if (t->hist)
        return 0;
    const int n_slots = llama_ctx_n_slots(t->ctx);
    t->hist = calloc((size_t)n_slots, sizeof *t->hist);
    t->counts = calloc((size_t)t->vocab, sizeof *t->counts);
    if (!t->hist || !t->counts) {
        free(t->hist);
        free(t->counts);
        t->hist = NULL;
        t->counts = NULL;
        return error_set(err, ERR_NOMEM, "sampling controls: out of memory");
    }
    t->n_hist_slots = n_slots;
    return 0;
}

int specdec_hist_start(struct specdec_target *t, const struct specdec_verify_job *j, char *err)
{
    if (!j->ctl) {
        if (t->hist && j->keep_len == 0)
            t->hist[j->slot].known = false;
        return 0;
    }
    int rc = controls_ready(t, err);
    if (rc)
        return rc;
    struct specdec_slot_hist *h = &t->hist[j->slot];
    if (j->keep_len == 0) {
        h->known = true;
        h->n_prompt = j->n_feed;
        h->len = 0;
    } else if (!h->known || h->len < j->keep_len) {
        return error_set(err, ERR_INVALID_ARG,
                         "sampling controls: slot %d's tokens before position %d are not known (its "
                         "sequence did not start with them)", j->slot, j->keep_len);
    }
    if ((rc = hist_reserve(h, j->keep_len + j->n_feed + j->k, err)))
        return rc;
    memcpy(h->tokens + j->keep_len, j->feed, (size_t)j->n_feed * sizeof(int32_t));
    h->len = j->keep_len + j->n_feed;
    return 0;
}

int specdec_controls_rows(struct specdec_target *t, const struct specdec_verify_job *j, float *rows,
                          char *err)
{
    struct specdec_slot_hist *h = &t->hist[j->slot];
    if (j->k > 0)
        memcpy(h->tokens + h->len, j->draft, (size_t)j->k * sizeof(int32_t));
    for (int i = 0; i <= j->k; i++) {
        const struct sampling_history sh = {.tokens = h->tokens, .n_prompt = h->n_prompt,
                                            .n_tokens = h->len + i};
        int rc = sampling_controls_apply(j->ctl, &sh, t->counts, rows + (size_t)i * (size_t)t->vocab,
                                         t->vocab, err);
        if (rc)
            return rc;
    }
    return 0;
}

void specdec_hist_accept(struct specdec_target *t, const struct specdec_verify_job *j)
{
    if (j->ctl && t->hist)
        t->hist[j->slot].len += j->n_accepted; /* the drafts written by specdec_controls_rows */
}

int specdec_controls_dev(struct specdec_target *t, int n, char *err)
{
    int row = 0;
    for (int i = 0; i < n; i++) {
        const struct specdec_verify_job *j = t->in_call[i];
        if (!j->step_final)
            continue;
        const int row0 = row;
        row += j->k + 1;
        if (!j->ctl && !j->gram)
            continue;
        int rc = specdec_grow((void **)&t->lp_rows, &t->lp_cap, j->k + 1,
                              (size_t)t->vocab * sizeof(float), err);
        if (!rc)
            rc = specdec_dev_download_logits(t->dev, row0, j->k + 1, t->lp_rows, err);
        /* logprobs are the raw rows' (dev_job_logprobs reads them here) */
        if (!rc && j->logprobs)
            rc = specdec_grow((void **)&t->raw_rows, &t->raw_cap, row, (size_t)t->vocab * sizeof(float), err);
        if (!rc && j->logprobs)
            memcpy(t->raw_rows + (size_t)row0 * (size_t)t->vocab, t->lp_rows,
                   (size_t)(j->k + 1) * (size_t)t->vocab * sizeof(float));
        if (!rc && j->ctl)
            rc = specdec_controls_rows(t, j, t->lp_rows, err);
        if (!rc && j->gram)
            rc = specdec_grammar_mask_rows(j->gram, j->draft, j->k, t->lp_rows, t->vocab, err);
        if (!rc)
            rc = specdec_dev_upload_logits(t->dev, row0, j->k + 1, t->lp_rows, err);
        if (rc)
            return rc;
    }
    return 0;
}

void specdec_controls_free(struct specdec_target *t)
{
    for (int s = 0; t->hist && s < t->n_hist_slots; s++)
        free(t->hist[s].tokens);
    free(t->hist);
    free(t->counts);
    t->hist = NULL;
    t->counts = NULL;
}
