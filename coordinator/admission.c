/* admission.c: see admission.h. */
#include "admission.h"

#include "drafters.h"

/* Blocks a sequence may come to hold in a worker's pool: its prompt and
 * every token it may generate, plus the rows a round adds beyond the
 * accepted ones (k + 1 for the target's verification, or a token tree's
 * budget when larger; the draft's round and its pre-draft, 2k + 2). Reserved at admission, so a worker never runs out
 * in the middle of a request. 0 when the worker reported no pool. */
int admission_kv_blocks(const struct coordinator *c, const struct pair *p, enum worker_role r,
                        const struct seq *s)
{
    const struct worker *w = &p->worker[r];
    if (w->kv_blocks <= 0 || w->kv_block_size <= 0)
        return 0;
    const long k = c->cfg.coordinator.spec_k_max;
    long verify_rows = k + 1;
    if (s->spec_tree >= REQUEST_SPEC_TREE_MIN && s->spec_tree > verify_rows)
        verify_rows = s->spec_tree;
    if (s->spec_tree == REQUEST_SPEC_TREE_AUTO && DRAFTERS_AUTO_TREE_NODES > verify_rows)
        verify_rows = DRAFTERS_AUTO_TREE_NODES;
    long positions = (long)s->n_prompt + s->max_tokens + (r == ROLE_DRAFT ? 2 * k + 2 : verify_rows);
    if (positions > w->max_seq_len)
        positions = w->max_seq_len;
    return (int)((positions + w->kv_block_size - 1) / w->kv_block_size);
}

/* Whether pair p's pools can hold s now (1), later (0), or never (-1:
 * the target's pool is too small for it). *draft_never: the draft's pool
 * could never hold it (it then runs there without speculation rather
 * than failing). */
static int kv_fits(const struct coordinator *c, const struct pair *p, const struct seq *s, int *need_out,
                   bool *draft_never)
{
    const struct worker *t = &p->worker[ROLE_TARGET], *d = &p->worker[ROLE_DRAFT];
    const int need_t = admission_kv_blocks(c, p, ROLE_TARGET, s);
    *need_out = need_t;
    *draft_never = false;
    if (need_t > t->kv_blocks && t->kv_blocks > 0)
        return -1;
    const bool uses_draft = coord_seq_uses_model(s) && !s->spec_off && d->up && d->kv_blocks > 0;
    const int need_d = uses_draft ? admission_kv_blocks(c, p, ROLE_DRAFT, s) : 0;
    *draft_never = uses_draft && need_d > d->kv_blocks;
    if (t->kv_blocks > 0 && p->kv_reserved[ROLE_TARGET] + need_t > t->kv_blocks)
        return 0;
    if (uses_draft && !*draft_never && p->kv_reserved[ROLE_DRAFT] + need_d > d->kv_blocks)
        return 0;
    return 1;
}

/* Free blocks in the target's pool, for the choice between pairs (a pool
 * not reported counts as unbounded). */
static long target_kv_free(const struct pair *p)
{
    const struct worker *t = &p->worker[ROLE_TARGET];
    return t->kv_blocks > 0 ? (long)t->kv_blocks - p->kv_reserved[ROLE_TARGET] : (long)1 << 40;
}

int admission_choose_pair(const struct coordinator *c, struct seq *s, int *need_out)
{
    int best = -1;
    bool any_could = false;
    bool best_draft_never = false;
    *need_out = 0;
    for (int i = 0; i < c->n_pairs; i++) {
        const struct pair *p = &c->pair[i];
        if (!p->worker[ROLE_TARGET].up)
            continue;
        int need = 0;
        bool draft_never = false;
        const int fit = kv_fits(c, p, s, &need, &draft_never);
        if (fit < 0) {
            if (!any_could && need > *need_out)
                *need_out = need;
            continue;
        }
        if (!any_could)
            *need_out = need;
        any_could = true;
        if (fit == 0 || p->n_active >= admission_pair_slots(c, p))
            continue;
        /* the most free KV, then the fewest sequences, then the lowest index */
        const struct pair *b = best >= 0 ? &c->pair[best] : NULL;
        if (b == NULL || target_kv_free(p) > target_kv_free(b) ||
            (target_kv_free(p) == target_kv_free(b) && p->n_active < b->n_active)) {
            best = i;
            best_draft_never = draft_never;
        }
    }
    if (best >= 0) {
        if (best_draft_never)
            s->spec_off = true;
        return best;
    }
    return any_could ? ADMISSION_LATER : ADMISSION_NEVER;
}

int admission_pair_slots(const struct coordinator *c, const struct pair *p)
{
    int n = c->cfg.coordinator.max_concurrency;
    if (p->worker[ROLE_TARGET].n_slots < n)
        n = p->worker[ROLE_TARGET].n_slots;
    return n;
}
