/* admission.c: see admission.h. */
#include "admission.h"

/* Blocks a sequence may come to hold in a worker's pool: its prompt and
 * every token it may generate, plus the rows a round adds beyond the
 * accepted ones (k + 1 for the target's verification; the draft's round and
 * its pre-draft, 2k + 2). Reserved at admission, so a worker never runs out
 * in the middle of a request. 0 when the worker reported no pool. */
int admission_kv_blocks(const struct coordinator *c, enum worker_role r, const struct seq *s)
{
    const struct worker *w = &c->worker[r];
    if (w->kv_blocks <= 0 || w->kv_block_size <= 0)
        return 0;
    const long k = c->cfg.coordinator.spec_k_max;
    long positions = (long)s->n_prompt + s->max_tokens + (r == ROLE_DRAFT ? 2 * k + 2 : k + 1);
    if (positions > w->max_seq_len)
        positions = w->max_seq_len;
    return (int)((positions + w->kv_block_size - 1) / w->kv_block_size);
}

/* Whether the pools can hold s now (1), later (0), or never (-1: the
 * target's pool is too small for it). A sequence the draft's pool could
 * never hold runs without speculation rather than failing. */
int admission_kv_fits(const struct coordinator *c, struct seq *s, int *need_out)
{
    const struct worker *t = &c->worker[ROLE_TARGET], *d = &c->worker[ROLE_DRAFT];
    const int need_t = admission_kv_blocks(c, ROLE_TARGET, s);
    *need_out = need_t;
    if (need_t > t->kv_blocks && t->kv_blocks > 0)
        return -1;
    const bool uses_draft = coord_seq_uses_model(s);
    if (uses_draft && d->up && d->kv_blocks > 0 && admission_kv_blocks(c, ROLE_DRAFT, s) > d->kv_blocks)
        s->spec_off = true;
    if (t->kv_blocks > 0 && c->kv_reserved[ROLE_TARGET] + need_t > t->kv_blocks)
        return 0;
    if (uses_draft && d->up && d->kv_blocks > 0 && !s->spec_off &&
        c->kv_reserved[ROLE_DRAFT] + admission_kv_blocks(c, ROLE_DRAFT, s) > d->kv_blocks)
        return 0;
    return 1;
}
