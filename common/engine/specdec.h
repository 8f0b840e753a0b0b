/* specdec.h: speculative decoding, built once for every caller.
 *
 * A round is split into its two halves, run by the draft and the target
 * worker roles (in their processes, or in one through coordinator/local.h),
 * whose rounds the coordinator's scheduler decides:
 *   draft half:  a draft job  - roll back, feed tokens, draft k
 *   target half: a verify job - roll back, feed tokens + k drafts in one
 *                forward call, accept/reject, roll back to what was kept
 * Both halves are told explicitly which prefix of their KV cache is still
 * valid (keep_len) and which accepted tokens they have not seen yet (feed),
 * so neither keeps hidden assumptions about the other: the caller (the
 * coordinator) owns the sequence.
 *
 * Randomness is Philox keyed by (request seed, stream, absolute position of
 * the token being produced): the draft samples on PHILOX_STREAM_DRAFT_SAMPLE,
 * the target accepts on PHILOX_STREAM_TARGET_ACCEPT and samples corrections
 * and bonus tokens on PHILOX_STREAM_TARGET_SAMPLE. Target-only decoding of
 * position P draws the same (stream, P) as a speculative correction would.
 */
#ifndef TANDEM_SPECDEC_H
#define TANDEM_SPECDEC_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "llama.h"
#include "sampling.h"
#include "adaptive_k.h"
#include "ngram.h"
#include "speculate.h"
#include "token_mask.h"


struct specdec_draft;
struct specdec_target;

/* ---- structured output: a sequence's grammar as one half sees it ----
 * The owner (a worker, the in-process loop) fills engine-side fields and
 * n_prompt and initializes matcher over the engine (grammar_matcher_init);
 * the half keeps the matcher on what its slot's KV holds: each job's start
 * rolls it back to keep_len and steps it over the feed, the target steps it
 * over the accepted drafts, the draft over the tokens it drafts. Masks
 * (token_mask_apply) go on each row a job reads, so that a refused token
 * never gets probability. Borrowed by a job until it is done; one thread
 * at a time, like the engine. */
struct specdec_grammar {
    struct grammar_matcher matcher;        /* states of the output tokens the slot holds */
    struct token_mask *mask;               /* the engine's mask cache (borrowed) */
    const struct token_mask_vocab *vocab;  /* the tokenizer's bytes (borrowed) */
    struct token_mask_eos eos;             /* allowed where the grammar can end */
    int n_prompt;                          /* positions before the output */
    uint64_t *bits;                        /* [token_mask_words]: scratch, owned by the owner */
    /* Set by a half when a feed token was refused (a draft fed a guess the
     * grammar refuses): masks are off until a start rolls back to a known
     * position. A target fails the job instead. */
    bool lost;
};

/* Long feeds (a prompt) are run in chunks so that a caller can stay alive
 * between them: a worker sends its heartbeat from on_chunk, on its own thread
 * and socket, however long the whole feed takes. Every chunk but the last is
 * a forward call of at most chunk_tokens tokens with no logits; the last one
 * carries the rest of the feed (and the drafts) with the logits. The CPU
 * kernels are batch-invariant (tests/unit/test_llama.c), so chunking never
 * changes a logit or a token. */
#define SPECDEC_CHUNK_TOKENS_DEFAULT 32
struct specdec_progress {
    int chunk_tokens;            /* >= 1; 0 = SPECDEC_CHUNK_TOKENS_DEFAULT */
    /* Optional (NULL): called after each chunk but the last, with the tokens
     * fed so far and the feed's length. Must not touch the model. */
    void (*on_chunk)(void *user, int n_done, int n_total);
    void *user;
};

/* Installs how the feeds of later calls are chunked (copied). The default,
 * before any call, is SPECDEC_CHUNK_TOKENS_DEFAULT with no callback. */
void specdec_draft_set_progress(struct specdec_draft *draft, const struct specdec_progress *p);
void specdec_target_set_progress(struct specdec_target *target, const struct specdec_progress *p);

/* Borrows ctx (and its model); allocates logits and sampling scratch. */
int specdec_draft_create(struct specdec_draft **out, struct llama_ctx *ctx, char *err);
void specdec_draft_destroy(struct specdec_draft *draft);
struct llama_ctx *specdec_draft_ctx(struct specdec_draft *draft);

/* ---- device sampling (the CUDA backend) ----
 * on: the half keeps its logits in device memory (llama_seq_batch.
 * logits_dev) and samples, drafts and accepts/rejects there with the
 * kern_cuda_* kernels (kernels_cuda.h): per token only ids and status words
 * are downloaded. The rules, Philox keys, streams and positions are the host
 * path's; greedy tokens are equal to the host path's bit for bit, sampled
 * ones up to the rounding the kernels' contract states. off (the default):
 * the host path, logits downloaded. ERR_UNSUPPORTED (named) when the
 * context's backend is not cuda or the build lacks it. Call between jobs. */
int specdec_draft_use_device(struct specdec_draft *draft, bool on, char *err);
int specdec_target_use_device(struct specdec_target *target, bool on, char *err);
bool specdec_draft_on_device(const struct specdec_draft *draft);
/* The argmax screen, on the host path: a greedy or point-mass draft, and
 * greedy verification (and greedy decoding without drafts), then ask the
 * forward for only each row's argmax (llama_seq_batch.argmax_out), which the
 * CPU backend finds reading a one-byte copy of the LM head instead of the
 * head (kernels/cpu/argmax.c; the same tokens). prepare makes the copy (263
 * MB at the Llama 3.2 1B shape, 394 MB at 3B; about a second) where the
 * context's backend offers one, and turns the screen on; it returns whether
 * it did. Never fatal: without it (no such backend, a head holding a NaN, no
 * memory for the copy: logged) greedy rows read whole rows of logits, as
 * without the call. set_argmax(false) goes back to whole rows, true to the
 * screen once prepared (tools that compare the two). Call between jobs. */
bool specdec_draft_prepare_argmax(struct specdec_draft *draft);
bool specdec_target_prepare_argmax(struct specdec_target *target);
void specdec_draft_set_argmax(struct specdec_draft *draft, bool on);
void specdec_target_set_argmax(struct specdec_target *target, bool on);
bool specdec_target_on_device(const struct specdec_target *target);

/* ---- batching: several sequences per forward call ----
 *
 * A job is one half-round of one sequence, run as a series of steps. Each step runs one
 * forward call holding the next piece of every job given: a chunk of a long
 * feed (chunk_tokens rows, no logits), the last part of the feed (with the
 * drafts, for the target), or one drafted token (the draft). So the weights
 * are read once per step for all sequences, and a long prompt moves forward
 * a chunk per step beside the others instead of stalling them. Rows are
 * bit-identical to the same job run alone (llama_forward's contract), so
 * batching never changes a token.
 *
 * A step takes at most one job per slot (a slot's later jobs wait), skips a
 * job whose blocks the KV pool cannot give yet, and fails a job alone when
 * its own input is wrong (context full, bad token, a pool too small even
 * for it alone: ERR_OVERLOADED): job->rc and job->err, job->done. It
 * returns nonzero only when it cannot run at all (out of memory); a failed
 * forward call fails every job in it. */
struct specdec_step_info {
    int seqs;   /* jobs in the forward call */
    int rows;   /* rows in the forward call */
    double ms;  /* time of the forward call */
};

/* A draft job truncates slot to keep_len, feeds feed[0..n_feed-1] (n_feed >= 1) at
 * positions keep_len.., then drafts k tokens (0 <= k <= SPECULATE_K_MAX):
 * token i is drawn from q_i, the request's adjusted draft distribution at
 * absolute position keep_len + n_feed + i (argmax in point-mass mode and at
 * temperature 0), and tokens 0..k-2 are fed back; the last drafted token is
 * not fed (the next call's feed carries it). k = 0 only prefills.
 * Afterwards the slot holds keep_len + n_feed + max(k - 1, 0) positions.
 * q_rows_out: [k, vocab] f32, may be NULL; written only in
 * SPECULATE_MODE_SAMPLED at temperature > 0, the one case the target reads
 * q (the rows are left untouched otherwise). */
struct specdec_draft_job {
    /* set by the caller */
    int slot, keep_len;
    const int32_t *feed;
    int n_feed;
    int k;
    struct sampling_params sp;
    enum speculate_mode mode;
    int32_t *tokens_out;  /* [k] */
    /* The sequence's grammar (NULL: none): each drafted token is drawn from
     * the masked row (the q rows are the masked draft's). The host path;
     * the device path drafts unmasked (the target's mask keeps the output
     * exact; only acceptance suffers). */
    struct specdec_grammar *gram;
    float *q_rows_out;    /* [k, vocab] or NULL */
    float *q_rows_dev;    /* [k, vocab] in the draft's backend memory, or NULL:
                             device sampling only; written like q_rows_out */
    /* progress and result (specdec_draft_job_init) */
    int fed, drafted;
    int cached;           /* feed tokens found in the prefix cache (a prompt) */
    bool started, done;
    int rc;               /* 0 or the error the job ended with, err names it */
    char err[ERR_MSG_MAX];
    bool in_step;         /* whether the job was in the last step's forward call */
    int step_tokens;      /* private: rows of the job in the current step */
};

/* Resets the progress and result fields of a job whose inputs are set. */
void specdec_draft_job_init(struct specdec_draft_job *job);
/* One step of jobs[0..n_jobs-1] (done jobs are skipped). info may be NULL. */
int specdec_draft_step(struct specdec_draft *draft, struct specdec_draft_job *const *jobs,
                       int n_jobs, struct specdec_step_info *info, char *err);
/* One job alone, stepped to its end (job_init included): 0 or the job's
 * error. For tests and tools; the workers step many jobs at once. */
int specdec_draft_run(struct specdec_draft *draft, struct specdec_draft_job *job, char *err);

/* A verify job truncates slot to keep_len, runs feed[0..n_feed-1] followed by
 * draft[0..k-1] in one forward call, takes the k + 1 target distributions p
 * (after the last feed token and after each draft token), accepts or rejects
 * the drafts (speculate_verify), and truncates the slot to
 * keep_len + n_feed + n_accepted. Leaves n_accepted + 1 tokens in tokens_out
 * (the accepted drafts, then the correction or bonus token). k = 0 is plain
 * decoding (and, with the prompt as feed, prefill): one token out.
 * q_rows: [k, vocab] f32, read only in SPECULATE_MODE_SAMPLED at temperature > 0. */
struct specdec_verify_job {
    /* set by the caller */
    int slot, keep_len;
    const int32_t *feed;
    int n_feed;
    const int32_t *draft; /* [k] */
    int k;
    /* NULL: the drafts are a chain. Else they are a token tree (issue 61,
     * docs/token-trees.md): draft[i] under parents[i] (-1: a child of the
     * last feed token, else an earlier draft), k <= SPECDEC_TREE_NODES_MAX,
     * no root path deeper than SPECULATE_K_MAX, every draft a point mass;
     * verified in one forward (specdec_tree_finish), the accepted path's KV
     * kept (llama_ctx_tree_accept), tokens_out the path then the target's
     * next, as a chain's. The host path without logprobs, controls or a
     * grammar (ERR_UNSUPPORTED otherwise). */
    const int32_t *parents;
    const float *q_rows;  /* [k, vocab]; sampled mode at temperature > 0 only */
    const float *q_rows_dev; /* the same rows in memory the target's backend
                                reads on its stream: its own, or the draft's
                                slab mapped over CUDA IPC once the stream waits
                                for the half's event (device sampling only);
                                used instead of q_rows */
    struct sampling_params sp;
    enum speculate_mode mode;
    /* The client's logprobs (false: none, and the job costs nothing more):
     * each emitted token's raw log-softmax and the top_logprobs
     * (0..SAMPLING_TOP_LOGPROBS_MAX) most likely tokens of its row,
     * sampling.h's sampling_logprobs, from this verification's logits: a
     * token accepted from a draft reports what target-only decoding of it
     * reports. Greedy jobs then read whole logits rows (no argmax screen). */
    bool logprobs;
    int top_logprobs;
    /* Logit bias and penalties (sampling.h; NULL: none; borrowed until the
     * job is done). Applied to every row after the drafts before it, so the
     * output is target-only decoding's with the same controls; the slot's
     * sequence must have started (keep_len 0) with them. Greedy jobs then
     * read whole rows. A draft makes its proposals without them: the caller
     * verifies them as point masses (speculate.h) when sampling. */
    const struct sampling_controls *ctl;
    /* The sequence's grammar (NULL: none): row i is masked with the state
     * after the first i drafts, so a draft the grammar refuses is rejected
     * at its row; after the controls, before the accept/reject. Greedy jobs
     * then read whole rows. */
    struct specdec_grammar *gram;
    /* result: the accepted drafts, then the correction or bonus token */
    int32_t tokens_out[SPECULATE_K_MAX + 1];
    int n_accepted;
    struct sampling_logprobs logprobs_out[SPECULATE_K_MAX + 1]; /* with logprobs */
    /* progress (specdec_verify_job_init) */
    int fed;
    int cached;           /* feed tokens found in the prefix cache (a prompt) */
    bool started, done;
    int rc;
    char err[ERR_MSG_MAX];
    bool in_step;         /* whether the job was in the last step's forward call */
    int step_tokens;      /* private */
    bool step_final;      /* private */
};

void specdec_verify_job_init(struct specdec_verify_job *job);
int specdec_target_step(struct specdec_target *target, struct specdec_verify_job *const *jobs,
                        int n_jobs, struct specdec_step_info *info, char *err);
/* One job alone, stepped to its end (job_init included): 0 or the job's
 * error. */
int specdec_target_run(struct specdec_target *target, struct specdec_verify_job *job, char *err);

int specdec_target_create(struct specdec_target **out, struct llama_ctx *ctx, char *err);
void specdec_target_destroy(struct specdec_target *target);
struct llama_ctx *specdec_target_ctx(struct specdec_target *target);

#endif
