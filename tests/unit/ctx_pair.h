/* ctx_pair.h: two llama contexts fed the same calls, their logits compared
 * bit for bit (tests/unit/test_llama_graphs.c: a graph context against a
 * plain CPU one; tests/gpu/test_cuda_graphs.c: graphs against no_graphs on
 * the GPU). Include after cmocka.h. */
#ifndef TANDEM_TESTS_CTX_PAIR_H
#define TANDEM_TESTS_CTX_PAIR_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "llama.h"

#define CTX_PAIR_MAX_SEQS 4

struct ctx_pair {
    struct llama_ctx *a, *b; /* a: the reference */
    int vocab;
};

static inline void ctx_pair_ok(int rc, const char *what, const char *err)
{
    if (rc)
        fail_msg("%s returned %d: %s", what, rc, err);
}

/* The same call on both contexts: n_seqs (<= CTX_PAIR_MAX_SEQS) sequences
 * on slots[], n_tokens pseudo-random ids each (from seed), every row's
 * logits; fails at the first logit whose bits differ. */
static inline void ctx_pair_call(const struct ctx_pair *p, const int *slots, int n_seqs,
                                 int n_tokens, uint32_t seed)
{
    char err[ERR_MSG_MAX] = "";
    assert_true(n_seqs >= 1 && n_seqs <= CTX_PAIR_MAX_SEQS);
    const size_t per = (size_t)n_tokens * (size_t)p->vocab;
    float *la = malloc((size_t)n_seqs * per * sizeof(float));
    float *lb = malloc((size_t)n_seqs * per * sizeof(float));
    int32_t *ids = malloc((size_t)n_seqs * (size_t)n_tokens * sizeof(int32_t));
    assert_true(la && lb && ids);
    uint32_t x = seed * 2654435761u + 7;
    for (int i = 0; i < n_seqs * n_tokens; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)(x % (uint32_t)p->vocab);
    }
    struct llama_seq_batch sa[CTX_PAIR_MAX_SEQS], sb[CTX_PAIR_MAX_SEQS];
    for (int s = 0; s < n_seqs; s++) {
        sa[s] = (struct llama_seq_batch){.slot = slots[s],
                                         .tokens = ids + (size_t)s * (size_t)n_tokens,
                                         .n_tokens = n_tokens, .n_logits = n_tokens,
                                         .logits_out = la + (size_t)s * per};
        sb[s] = sa[s];
        sb[s].logits_out = lb + (size_t)s * per;
    }
    ctx_pair_ok(llama_forward(p->a, sa, n_seqs, err), "llama_forward (reference)", err);
    ctx_pair_ok(llama_forward(p->b, sb, n_seqs, err), "llama_forward (under test)", err);
    for (size_t i = 0; i < (size_t)n_seqs * per; i++)
        if (memcmp(&la[i], &lb[i], sizeof(float)) != 0)
            fail_msg("%d sequences x %d rows (slot %d at length %d): logit %zu differs: "
                     "reference %.9g, under test %.9g", n_seqs, n_tokens, slots[0],
                     llama_ctx_slot_len(p->a, slots[0]), i, (double)la[i], (double)lb[i]);
    free(la);
    free(lb);
    free(ids);
}

static inline void ctx_pair_truncate(const struct ctx_pair *p, int slot, int len)
{
    char err[ERR_MSG_MAX] = "";
    ctx_pair_ok(llama_ctx_truncate(p->a, slot, len, err), "truncate (reference)", err);
    ctx_pair_ok(llama_ctx_truncate(p->b, slot, len, err), "truncate (under test)", err);
}

#endif
