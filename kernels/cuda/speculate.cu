/* speculate.cu: speculative accept/reject on the device, the twin of
 * common/speculation/speculate.c (API and contract in kernels_cuda.h; the rules
 * themselves in speculate.h).
 *
 * What it is: kern_cuda_speculate_verify: the accept tests of a round's
 * drafts against the target's rows and the correction or bonus token
 * (greedy and sampled, residual, bonus, point mass) over rows in device
 * memory, so that only ids, counts and status words go to the host.
 * What it is not: an op of struct kern_ops (the engine calls this entry
 * directly), nor the sampling of plain rows (sampling.cu).
 *
 * One block of SMP_THREADS threads per (sequence, row) of a verification,
 * so no result depends on how many sequences share a launch. The argmax,
 * the Philox uniforms and the draw are sampling_device.cuh's (their orders
 * are stated there), and:
 *
 *   verify     the accept test u * q(t) < p(t) in double (exact: two 24-bit
 *              significands) or u < p(t) in point-mass mode, thread 0 of
 *              each block walking t_1.. in order; the block whose row is the
 *              first rejection (or the bonus row) draws the correction from
 *              max(0, p - q) (float subtraction per entry, computed while
 *              scanning: no scratch row), or from p without t (point mass),
 *              falling back to p when that has no positive entry. Greedy
 *              sequences: one block per row takes the argmax, then a second
 *              kernel walks the rows and compares with the drafts.
 *
 * So every accept/reject decision equals the CPU's, and every draw from
 * identical rows too (sampling.cu states the whole claim). The launch count
 * per call is one, two with greedy sequences.
 */
#include "sampling_device.cuh"

#define SMP_FINISH_THREADS 128 /* greedy finishing kernel: one thread per sequence */

/* Block (s, i): row i of sequence s. Sampled sequences: every block's thread
 * 0 replays the accept tests t_1.. (cheap: one p and one q value each) to
 * find the first rejection n; block n alone draws and writes the result.
 * Greedy sequences: block i writes argmax p_i into tokens[i]; the finishing
 * kernel compares. */
__global__ void __launch_bounds__(SMP_THREADS, 1)
    smp_verify_kernel(struct kern_cuda_spec_result *results, const struct kern_cuda_spec_seq *seqs,
                      const float *p_rows, const float *q_rows, const int32_t *drafts, int vocab)
{
    __shared__ int n_acc_sh, bad_sh;
    const int s = blockIdx.x, i = blockIdx.y, tid = threadIdx.x;
    const struct kern_cuda_spec_seq sq = seqs[s];
    if (i > sq.k)
        return;
    const int32_t *dr = sq.k > 0 ? drafts + sq.draft0 : NULL;
    const float *prow = p_rows + ((size_t)sq.p_row0 + (size_t)i) * (size_t)vocab;
    struct kern_cuda_spec_result *out = &results[s];

    if (sq.greedy) {
        int ignored;
        const int a = smp_block_argmax(prow, vocab, &ignored);
        if (tid == 0)
            out->tokens[i] = a;
        return;
    }
    if (tid == 0) {
        int bad = 0, n = sq.k;
        for (int j = 0; j < sq.k; j++)
            if (dr[j] < 0 || dr[j] >= vocab)
                bad = 1;
        for (int j = 0; !bad && j < sq.k; j++) {
            const int32_t t = dr[j];
            const uint64_t pos = sq.position0 + (uint64_t)j;
            const float pt = p_rows[((size_t)sq.p_row0 + (size_t)j) * (size_t)vocab + (size_t)t];
            const float u =
                smp_philox_uniform(sq.seed, KERN_CUDA_PHILOX_STREAM_TARGET_ACCEPT, pos, 0u);
            bool accept;
            if (!(pt > 0.0f)) {
                accept = false;
            } else if (sq.mode == KERN_CUDA_SPEC_MODE_POINT_MASS) {
                accept = u < pt;
            } else {
                const float qt =
                    q_rows[((size_t)sq.q_row0 + (size_t)j) * (size_t)vocab + (size_t)t];
                /* exact: u and q(t) have 24-bit significands */
                accept = __dmul_rn((double)u, (double)(qt > 0.0f ? qt : 0.0f)) < (double)pt;
            }
            if (!accept) {
                n = j;
                break;
            }
        }
        n_acc_sh = n;
        bad_sh = bad;
    }
    __syncthreads();
    const int n = n_acc_sh;
    if (bad_sh) {
        if (i == 0 && tid == 0) {
            out->n_accepted = 0;
            out->status = KERN_CUDA_SAMPLE_BAD_DRAFT;
            out->tokens[0] = -1;
        }
        return;
    }
    if (i != n)
        return;
    const float u = smp_philox_uniform(sq.seed, KERN_CUDA_PHILOX_STREAM_TARGET_SAMPLE,
                                       sq.position0 + (uint64_t)i, 0u);
    const struct smp_src plain = {prow, NULL, SMP_SRC_PLAIN, 0};
    int tok;
    if (i < sq.k && sq.debug_fault != KERN_CUDA_SPEC_DEBUG_RESIDUAL_FROM_P) {
        struct smp_src corr = {prow, NULL, SMP_SRC_EXCLUDE, dr[i]};
        if (sq.mode != KERN_CUDA_SPEC_MODE_POINT_MASS) {
            corr.q = q_rows + ((size_t)sq.q_row0 + (size_t)i) * (size_t)vocab;
            corr.mode = SMP_SRC_RESIDUAL;
        }
        tok = smp_block_draw(corr, vocab, u);
        if (tok < 0) /* residual empty through rounding: rejection had probability ~0 */
            tok = smp_block_draw(plain, vocab, u);
    } else {
        tok = smp_block_draw(plain, vocab, u); /* bonus, or the broken variant */
    }
    if (tid == 0) {
        for (int j = 0; j < i; j++)
            out->tokens[j] = dr[j];
        out->tokens[i] = tok;
        out->n_accepted = i;
        out->status = tok >= 0 ? KERN_CUDA_SAMPLE_OK : KERN_CUDA_SAMPLE_NO_MASS;
    }
}

/* Greedy sequences after smp_verify_kernel: accept while argmax p_i == t_i. */
__global__ void __launch_bounds__(SMP_FINISH_THREADS)
    smp_verify_greedy_kernel(struct kern_cuda_spec_result *results,
                             const struct kern_cuda_spec_seq *seqs, const int32_t *drafts,
                             int n_seqs, int vocab)
{
    const int s = blockIdx.x * SMP_FINISH_THREADS + threadIdx.x;
    if (s >= n_seqs)
        return;
    const struct kern_cuda_spec_seq sq = seqs[s];
    if (!sq.greedy)
        return;
    const int32_t *dr = sq.k > 0 ? drafts + sq.draft0 : NULL;
    struct kern_cuda_spec_result *out = &results[s];
    for (int j = 0; j < sq.k; j++)
        if (dr[j] < 0 || dr[j] >= vocab) {
            out->n_accepted = 0;
            out->status = KERN_CUDA_SAMPLE_BAD_DRAFT;
            out->tokens[0] = -1;
            return;
        }
    for (int i = 0; i <= sq.k; i++) {
        const int32_t tok = out->tokens[i];
        if (tok < 0) {
            out->n_accepted = i;
            out->status = KERN_CUDA_SAMPLE_NO_MASS;
            return;
        }
        if (i == sq.k || tok != dr[i]) {
            out->n_accepted = i;
            out->status = KERN_CUDA_SAMPLE_OK;
            return;
        }
    }
}

/* ---- the public entry ----------------------------------------------------- */

extern "C" int kern_cuda_speculate_verify(struct kern_backend *be,
                                          struct kern_cuda_spec_result *results_dev,
                                          const struct kern_cuda_spec_seq *seqs, int n_seqs,
                                          const float *p_rows_dev, const float *q_rows_dev,
                                          const int32_t *draft_tokens_dev, int vocab, char *err)
{
    if (n_seqs < 0 || vocab < 1)
        return error_set(err, ERR_INVALID_ARG, "cuda speculate_verify: bad shape n_seqs=%d "
                         "vocab=%d", n_seqs, vocab);
    if (n_seqs == 0)
        return 0;
    if (!results_dev || !seqs || !p_rows_dev)
        return error_set(err, ERR_INVALID_ARG,
                         "cuda speculate_verify: results, seqs and p_rows are required");
    int k_max = 0;
    for (int s = 0; s < n_seqs; s++) {
        const struct kern_cuda_spec_seq *q = &seqs[s];
        if (q->k < 0 || q->k > KERN_CUDA_SPEC_K_MAX)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].k: must be in 0..%d, got %d", s,
                             KERN_CUDA_SPEC_K_MAX, (int)q->k);
        if (q->mode != KERN_CUDA_SPEC_MODE_SAMPLED && q->mode != KERN_CUDA_SPEC_MODE_POINT_MASS)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].mode: unknown mode %d", s,
                             (int)q->mode);
        if (q->debug_fault != KERN_CUDA_SPEC_DEBUG_NONE &&
            q->debug_fault != KERN_CUDA_SPEC_DEBUG_RESIDUAL_FROM_P)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].debug_fault: unknown fault %d", s,
                             (int)q->debug_fault);
        if (q->p_row0 < 0)
            return error_set(err, ERR_INVALID_ARG, "seqs[%d].p_row0: negative (%d)", s,
                             (int)q->p_row0);
        if (q->k > 0 && (q->draft0 < 0 || !draft_tokens_dev))
            return error_set(err, ERR_INVALID_ARG,
                             "seqs[%d].draft0: draft_tokens required at a nonnegative offset "
                             "for k = %d", s, (int)q->k);
        if (!q->greedy && q->mode == KERN_CUDA_SPEC_MODE_SAMPLED && q->k > 0 &&
            (q->q_row0 < 0 || !q_rows_dev))
            return error_set(err, ERR_INVALID_ARG,
                             "seqs[%d].q_row0: q_rows required at a nonnegative offset in "
                             "sampled mode", s);
        if (q->k > k_max)
            k_max = q->k;
    }
    struct cuda_backend *cb = NULL;
    int rc = smp_enter(be, "kern_cuda_speculate_verify", &cb, err);
    if (rc < 0)
        return rc;
    const void *dev = NULL;
    if ((rc = cuda_backend_stage(cb, seqs, (size_t)n_seqs * sizeof(*seqs), &dev, err)) < 0)
        return rc;
    const struct kern_cuda_spec_seq *d_seqs = (const struct kern_cuda_spec_seq *)dev;
    const dim3 grid((unsigned int)n_seqs, (unsigned int)(k_max + 1));
    smp_verify_kernel<<<grid, SMP_THREADS, 0, cb->stream>>>(results_dev, d_seqs, p_rows_dev,
                                                            q_rows_dev, draft_tokens_dev, vocab);
    CUDA_CHECK_LAUNCH("smp_verify_kernel");
    const unsigned int blocks =
        (unsigned int)((n_seqs + SMP_FINISH_THREADS - 1) / SMP_FINISH_THREADS);
    smp_verify_greedy_kernel<<<blocks, SMP_FINISH_THREADS, 0, cb->stream>>>(
        results_dev, d_seqs, draft_tokens_dev, n_seqs, vocab);
    CUDA_CHECK_LAUNCH("smp_verify_greedy_kernel");
    return 0;
}
