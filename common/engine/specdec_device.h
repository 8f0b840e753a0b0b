/* specdec_device.h: the device half of the speculation engine (private to
 * common/engine): sampling, drafting picks and accept/reject on the CUDA
 * backend with the kern_cuda_* kernels, so that per token only ids and
 * status words are downloaded. specdec_draft.c and specdec_target.c call
 * it where a draft or target was switched to the device
 * (specdec_*_use_device); the host path never reaches it.
 *
 * Same rules as the host path (sampling.h, speculate.h): the same Philox
 * keys, streams and positions, argmax with the lowest index among ties;
 * the kernels' contract (kernels_cuda.h) says which results are equal to
 * the host's bit for bit (argmax, uniforms, accept tests: every greedy
 * token) and which only up to the rounding of an adjusted row (a sampled
 * token whose draw lies within that rounding of a boundary).
 *
 * Without the CUDA backend in the build, specdec_dev_create returns
 * ERR_UNSUPPORTED and nothing else is reachable.
 *
 * Calls are made by the thread that drives the half; every buffer named
 * *_dev here is memory of the half's backend.
 */
#ifndef TANDEM_SPECDEC_DEVICE_H
#define TANDEM_SPECDEC_DEVICE_H

#include <stdint.h>

#include "llama.h"
#include "sampling.h"
#include "speculate.h"

struct specdec_dev;

/* Device state for one half running on ctx's backend. ERR_UNSUPPORTED
 * (named) when the backend is not CUDA or the build has no CUDA backend. */
int specdec_dev_create(struct specdec_dev **out, struct llama_ctx *ctx, char *err);
void specdec_dev_destroy(struct specdec_dev *dv); /* NULL-safe */

/* A logits buffer of at least rows vocabulary-wide rows in backend memory
 * (*out), for llama_seq_batch.logits_dev. Growing waits for the backend
 * and loses the contents: call it before the forward that fills it. */
int specdec_dev_logits(struct specdec_dev *dv, int rows, float **out, char *err);

/* One drafted token: from row `row` of the logits buffer, either the argmax
 * (greedy, point mass) or a draw from the adjusted row with
 * philox_uniform(sp.seed, PHILOX_STREAM_DRAFT_SAMPLE, position, 0). The
 * adjusted row (the draft's q) goes to q_dev when set (backend memory),
 * else to scratch; q_host (host) receives a copy when set. */
struct specdec_dev_pick {
    int row;
    int argmax;
    struct sampling_params sp;
    uint64_t position;
    float *q_dev;
    float *q_host;
};

/* Runs n picks (one launch each, queued back to back) and downloads their
 * tokens and statuses in one copy. status[i] is 0 or a nonzero code whose
 * text is specdec_dev_status_str (the pick failed: NaN logits, ...). */
int specdec_dev_draft_picks(struct specdec_dev *dv, const struct specdec_dev_pick *picks, int n,
                            int32_t *tokens, int32_t *status, char *err);

/* One sequence's verification: its k + 1 logits rows start at row p_row0
 * of the logits buffer; drafts and q rows as struct speculate_input (q from
 * q_dev, backend memory, when set, else from q_host; read only in sampled
 * mode above temperature 0). */
struct specdec_dev_round {
    int k;
    int p_row0;
    struct sampling_params sp;
    enum speculate_mode mode;
    uint64_t position0;
    const int32_t *draft;  /* host [k] */
    const float *q_dev;    /* [k, vocab] */
    const float *q_host;   /* [k, vocab] */
};

/* The device's outcome of one round: speculate_verify's tokens_out and
 * n_accepted when status is 0; otherwise status names what failed
 * (specdec_dev_status_str) and bad_row the logits row it failed on (-1: the
 * round as a whole). */
struct specdec_dev_outcome {
    int32_t tokens[SPECULATE_K_MAX + 1];
    int n_accepted;
    int32_t status;
    int bad_row;
};

/* Accept/reject for n rounds whose rows fill rows 0 .. n_rows - 1 of the
 * logits buffer: adjusts every row on the device when a round samples (one
 * launch), gathers the drafts and q rows, runs kern_cuda_speculate_verify
 * for all rounds in one launch and downloads the results and the rows'
 * statuses in one copy. */
int specdec_dev_verify(struct specdec_dev *dv, const struct specdec_dev_round *rounds, int n,
                       int n_rows, struct specdec_dev_outcome *out, char *err);

/* Copies n_rows logits rows from row `row` of the logits buffer to host
 * [n_rows, vocab] (the client's logprobs, which the host computes).
 * Waits for the stream. */
int specdec_dev_download_logits(struct specdec_dev *dv, int row, int n_rows, float *host,
                                char *err);

/* The other way: host [n_rows, vocab] into the logits buffer from row
 * `row` (rows the host changed: the sampling controls). */
int specdec_dev_upload_logits(struct specdec_dev *dv, int row, int n_rows, const float *host,
                              char *err);

/* Text of a nonzero status ("a logit is NaN or +inf"); never NULL. */
const char *specdec_dev_status_str(int32_t status);

#endif
