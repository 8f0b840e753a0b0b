/* specdec_internal.h: what the engine's files share and nothing outside
 * common/engine sees: the two halves' state and the step helpers both
 * halves use.
 *
 *   specdec_draft.c     the draft half: jobs, steps, picks (host or device)
 *   specdec_target.c    the target half: verification jobs, steps, accept/reject
 *   specdec_step.c      the helpers below
 *   specdec_device.c    the halves' device path on the CUDA backend
 */
#ifndef TANDEM_SPECDEC_INTERNAL_H
#define TANDEM_SPECDEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "specdec.h"
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
    uint64_t *allow_rows;           /* [allow_cap][vocab words]: a grammar job's mask */
    int allow_cap;
};

/* A slot's tokens, for the sampling controls (specdec_controls.c). */
struct specdec_slot_hist {
    int32_t *tokens;   /* [cap]: prompt, output, then a verification's drafts */
    int len, cap, n_prompt;
    bool known;        /* len tokens mirror the slot's KV */
};

struct specdec_target {
    struct llama_ctx *ctx;
    struct specdec_progress progress;
    int vocab;
    float *logits;      /* [logits_cap, vocab]: the k + 1 rows of each finishing job */
    int logits_cap;
    float *scratch;     /* [vocab] */
    float *lp_rows;     /* [lp_cap, vocab]: a job's logits kept for its logprobs (the
                           accept/reject step adjusts rows in place; the device
                           path downloads them here) */
    int lp_cap;
    /* Device path: the raw rows (before controls and grammar masks) of the
     * step's jobs that want logprobs and change their rows on the host
     * (specdec_controls_dev), at their device row index: logprobs are the
     * raw ones, as the host path keeps them (keep_logits). [raw_cap, vocab] */
    float *raw_rows;
    int raw_cap;
    int32_t *tokens;    /* [tokens_cap]: feed tail + drafts of each finishing job */
    int tokens_cap;
    int32_t *tree_parents; /* [tree_parents_cap]: a tree job's entry's parents, beside its tokens */
    int tree_parents_cap;
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
    uint64_t *allow_rows;   /* [allow_cap][vocab words]: a grammar job's masks for them */
    int allow_cap;
    /* sampling controls (specdec_controls.c): each slot's tokens, made on
     * first use, and the counts scratch [vocab] */
    struct specdec_slot_hist *hist; /* [n_hist_slots] */
    int n_hist_slots;
    int32_t *counts;
};

/* The sampling controls of the target half (specdec_controls.c): a job's
 * start brings its slot's history up to its feed (every job: a prompt
 * without controls forgets the slot's); rows [k + 1, vocab] of a finishing
 * job get the controls row by row; its accepted drafts stay in the history;
 * the device path does the rows in its logits buffer (downloaded, changed,
 * uploaded back). 0 or an error naming what failed. */
int specdec_hist_start(struct specdec_target *t, const struct specdec_verify_job *j, char *err);
int specdec_controls_rows(struct specdec_target *t, const struct specdec_verify_job *j, float *rows,
                          char *err);
void specdec_hist_accept(struct specdec_target *t, const struct specdec_verify_job *j);
int specdec_controls_dev(struct specdec_target *t, int n, char *err);
void specdec_controls_free(struct specdec_target *t);

/* Structured output in the halves (specdec_grammar.c; struct
 * specdec_grammar in specdec.h). strict (the target): a refused token is an
 * error; otherwise (the draft) it sets g->lost and masks stop until the
 * next start.
 *   start:     the matcher rolled back to keep_len, stepped over the feed
 *   take:      stepped over tokens now in the slot
 *   mask_row:  one row masked with the matcher's state (n == 0 allowed:
 *              strict's error, else lost)
 *   mask_rows: a verification's rows [k + 1, vocab], row i with the state
 *              after drafts 0..i-1, up to the first refused draft's row;
 *              the matcher as it was */
int specdec_grammar_start(struct specdec_grammar *g, int keep_len, const int32_t *feed, int n_feed,
                          bool strict, char *err);
int specdec_grammar_take(struct specdec_grammar *g, const int32_t *tokens, int n, bool strict,
                         char *err);
int specdec_grammar_mask_row(struct specdec_grammar *g, float *row, int vocab, bool strict,
                             char *err);
int specdec_grammar_mask_rows(struct specdec_grammar *g, const int32_t *drafts, int k, float *rows,
                              int vocab, char *err);
/* mask_rows's masks as bitsets for the argmax screen (llama_seq_batch.
 * argmax_allow): allow [k + 1][(vocab + 63) / 64], row i the ids the state
 * after drafts 0..i-1 admits (EOS where it can end), up to the first refused
 * draft's row, later rows empty (greedy acceptance stops before them); a
 * row admitting nothing is mask_row's strict error. The matcher as it was. */
int specdec_grammar_allow_rows(struct specdec_grammar *g, const int32_t *drafts, int k,
                               uint64_t *allow, int vocab, char *err);
/* mask_row's mask as a bitset, [(vocab + 63) / 64]: 0 with allow filled, 1
 * when the row is to be read unmasked (the grammar lost; or nothing allowed
 * and not strict, which loses it, as mask_row), or an error. */
int specdec_grammar_allow_row(struct specdec_grammar *g, uint64_t *allow, int vocab, bool strict,
                              char *err);

/* Monotonic milliseconds. */
double specdec_now_ms(void);

/* The vocabulary of ctx's model. */
int specdec_ctx_vocab(struct llama_ctx *ctx);

/* *dst = *src (src NULL: none), with the default chunk where it has none. */
void specdec_progress_set(struct specdec_progress *dst, const struct specdec_progress *src);

/* Grows *buf (capacity *cap elements of elem bytes) to hold want:
 * 0 or ERR_NOMEM. */
int specdec_grow(void **buf, int *cap, int want, size_t elem, char *err);

/* specdec_grow, then writes the whole buffer once: a buffer of
 * vocabulary-wide rows sized at creation is committed there, not page by
 * page in the first calls that reach its rows (see ctx_touch_logits in
 * llama.c), where the faults were timed as the cost of drafting or of a
 * longer verification. */
int specdec_grow_touched(void **buf, int *cap, int want, size_t elem, char *err);

/* Ends a job with rc and err (its name when err is empty). */
void specdec_job_fail(int *rc_out, char *err_out, bool *done, int rc, const char *err);

/* Blocks the pool can hand out now (free and cached ones). */
int specdec_blocks_available(const struct llama_ctx *ctx);

/* Whether the pool can take entry e now (1), later (0), or never
 * (ERR_OVERLOADED: a call that could not fit even alone in an empty step).
 * *free_left counts down the blocks promised in this step. */
int specdec_entry_fits(struct llama_ctx *ctx, const struct llama_seq_batch *e, int n_taken,
                       int *free_left, char *err);

/* The per-slot flags of a step ([n_slots], made once, all false). */
int specdec_slot_flags(bool **slot_busy, int n_slots, char *err);

/* A step's entry and call arrays (*cap each) grown to want entries. */
int specdec_step_capacity(struct llama_seq_batch **entries, void **in_call, int *cap, int want,
                          char *err);

/* Readies the backend's argmax screen for ctx's LM head, where it offers
 * one (llama_model_prepare_argmax); returns whether it is ready. Never
 * fatal: without it greedy rows read the whole head, which is only slower,
 * so a head the backend will not copy (one holding a NaN) or no memory for
 * the copy is logged and decoding goes on. */
bool specdec_prepare_argmax(struct llama_ctx *ctx, const char *half, bool draft);

#endif
