/* specdec_step.c: the helpers both halves' steps use (contracts in
 * specdec_internal.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "logging.h"
#include "specdec_internal.h"

double specdec_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

void specdec_progress_set(struct specdec_progress *dst, const struct specdec_progress *src)
{
    *dst = src ? *src : (struct specdec_progress){0};
    if (dst->chunk_tokens < 1)
        dst->chunk_tokens = SPECDEC_CHUNK_TOKENS_DEFAULT;
}

/* Grows *buf (capacity *cap elements of elem bytes) to hold want. */
int specdec_grow(void **buf, int *cap, int want, size_t elem, char *err)
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
int specdec_grow_touched(void **buf, int *cap, int want, size_t elem, char *err)
{
    int rc = specdec_grow(buf, cap, want, elem, err);
    if (!rc)
        memset(*buf, 0, (size_t)*cap * elem);
    return rc;
}

void specdec_job_fail(int *rc_out, char *err_out, bool *done, int rc, const char *err)
{
    *rc_out = rc;
    snprintf(err_out, ERR_MSG_MAX, "%s", err && err[0] ? err : error_name(rc));
    *done = true;
}

int specdec_blocks_available(const struct llama_ctx *ctx)
{
    struct llama_kv_stats kv;
    llama_ctx_kv_stats(ctx, &kv);
    return kv.free_blocks;
}

/* Whether the pool can take entry e now. A call that could never fit, even
 * alone in an empty step, fails (ERR_OVERLOADED); otherwise it waits for a
 * later step. *free_left counts down the blocks promised in this step. */
int specdec_entry_fits(struct llama_ctx *ctx, const struct llama_seq_batch *e, int n_taken,
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

int specdec_slot_flags(bool **slot_busy, int n_slots, char *err)
{
    if (!*slot_busy && !(*slot_busy = calloc((size_t)n_slots, sizeof **slot_busy)))
        return error_set(err, ERR_NOMEM, "speculation step: out of memory");
    return 0;
}

int specdec_step_capacity(struct llama_seq_batch **entries, void **in_call, int *cap, int want,
                          char *err)
{
    int cap_entries = *cap;
    int rc = specdec_grow((void **)entries, &cap_entries, want, sizeof **entries, err);
    if (rc)
        return rc;
    int cap_calls = *cap;
    rc = specdec_grow(in_call, &cap_calls, want, sizeof(void *), err);
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
bool specdec_prepare_argmax(struct llama_ctx *ctx, const char *half, bool draft)
{
    if (!llama_ctx_has_argmax(ctx))
        return false;
    char err[ERR_MSG_MAX];
    if (llama_model_prepare_argmax(llama_ctx_model(ctx), draft, err) == 0)
        return true;
    LOG_WARN("%s: greedy rows will read the whole LM head: %s", half, err);
    return false;
}

int specdec_ctx_vocab(struct llama_ctx *ctx)
{
    return llama_model_config(llama_ctx_model(ctx))->vocab_size;
}
