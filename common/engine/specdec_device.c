/* specdec_device.c: the engine's device path on the CUDA backend (contracts
 * in specdec_device.h). Buffers grow and never shrink; each call fills what
 * it reads, so nothing carries over between calls but capacity.
 *
 * Per call the host uploads small things through the backend's staging
 * slots without waiting (parameters, positions, draft ids: k int32) and
 * downloads one block:
 * token ids, counts and status words. Logits, adjusted rows and q rows stay
 * in device memory (a q row crosses only when the draft's caller asked for
 * it in host memory: the three-process pipeline's shared buffer, or a draft
 * and target on different GPUs).
 */
#include "specdec_device.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

#ifdef TANDEM_HAVE_CUDA

#include "kernels_cuda.h"

struct specdec_dev {
    struct kern_backend *be;
    int vocab;
    float *logits;           /* device [logits_rows, vocab] */
    int logits_rows;
    float *probs;            /* device [probs_rows, vocab]: adjusted p or scratch q rows */
    int probs_rows;
    float *q;                /* device [q_rows, vocab]: a verify call's q rows, gathered */
    int q_rows;
    int32_t *ids;            /* device [ids_cap]: a verify call's draft ids */
    int ids_cap;
    void *io;                /* device [io_bytes]: what one call downloads */
    size_t io_bytes;
    void *io_host;           /* host mirror of io */
    size_t io_host_bytes;
    int32_t *ids_host;       /* host [ids_cap] */
    struct kern_cuda_spec_seq *seqs;        /* host [seqs_cap] */
    int seqs_cap;
    struct kern_cuda_sample_params *params; /* host [params_cap] */
    int params_cap;
};

static size_t row_bytes(const struct specdec_dev *dv, int rows)
{
    return (size_t)rows * (size_t)dv->vocab * sizeof(float);
}

/* Makes *buf a backend buffer of at least want bytes (*cap_bytes: its
 * size). Growing drops the old contents: free waits for the stream, so no
 * queued kernel still reads the old buffer. */
static int dev_grow(struct specdec_dev *dv, void **buf, size_t *cap_bytes, size_t want, char *err)
{
    if (want <= *cap_bytes && *buf)
        return 0;
    size_t n = *cap_bytes > 0 ? *cap_bytes : 256;
    while (n < want)
        n *= 2;
    dv->be->ops->free(dv->be, *buf);
    *buf = NULL;
    *cap_bytes = 0;
    int rc = dv->be->ops->alloc(dv->be, n, buf, err);
    if (rc)
        return rc;
    *cap_bytes = n;
    return 0;
}

/* dev_grow for a buffer of vocabulary-wide rows, *cap_rows its capacity. */
static int dev_grow_rows(struct specdec_dev *dv, float **buf, int *cap_rows, int want, char *err)
{
    if (want <= *cap_rows && *buf)
        return 0;
    void *p = *buf;
    size_t bytes = row_bytes(dv, *cap_rows);
    int rc = dev_grow(dv, &p, &bytes, row_bytes(dv, want), err);
    *buf = p;
    *cap_rows = rc ? 0 : (int)(bytes / row_bytes(dv, 1));
    return rc;
}

static int host_grow(void **buf, size_t *cap_bytes, size_t want, char *err)
{
    if (want <= *cap_bytes)
        return 0;
    size_t n = *cap_bytes > 0 ? *cap_bytes : 256;
    while (n < want)
        n *= 2;
    void *p = realloc(*buf, n);
    if (!p)
        return error_set(err, ERR_NOMEM, "device sampling: out of memory");
    *buf = p;
    *cap_bytes = n;
    return 0;
}

/* The io block: `a` bytes of results or tokens, then `b` bytes of statuses
 * (both multiples of 4), on the device and its host mirror. */
static int io_reserve(struct specdec_dev *dv, size_t bytes, char *err)
{
    int rc = dev_grow(dv, &dv->io, &dv->io_bytes, bytes, err);
    if (!rc)
        rc = host_grow(&dv->io_host, &dv->io_host_bytes, bytes, err);
    return rc;
}

static int ids_reserve(struct specdec_dev *dv, int n, char *err)
{
    if (n <= dv->ids_cap && dv->ids)
        return 0;
    void *p = dv->ids, *h = dv->ids_host;
    size_t bytes = (size_t)dv->ids_cap * sizeof(int32_t), host_bytes = bytes;
    int rc = dev_grow(dv, &p, &bytes, (size_t)n * sizeof(int32_t), err);
    dv->ids = p;
    if (!rc)
        rc = host_grow(&h, &host_bytes, bytes, err);
    dv->ids_host = h;
    dv->ids_cap = rc ? 0 : (int)(bytes / sizeof(int32_t));
    return rc;
}

int specdec_dev_create(struct specdec_dev **out, struct llama_ctx *ctx, char *err)
{
    *out = NULL;
    struct kern_backend *be = llama_ctx_backend(ctx);
    if (strcmp(be->name, "cuda") != 0)
        return error_set(err, ERR_UNSUPPORTED,
                         "device sampling: needs the cuda backend, the model runs on %s",
                         be->name);
    struct specdec_dev *dv = calloc(1, sizeof *dv);
    if (!dv)
        return error_set(err, ERR_NOMEM, "device sampling: out of memory");
    dv->be = be;
    dv->vocab = llama_model_config(llama_ctx_model(ctx))->vocab_size;
    *out = dv;
    return 0;
}

void specdec_dev_destroy(struct specdec_dev *dv)
{
    if (!dv)
        return;
    void *bufs[] = {dv->logits, dv->probs, dv->q, dv->ids, dv->io};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dv->be->ops->free(dv->be, bufs[i]);
    free(dv->io_host);
    free(dv->ids_host);
    free(dv->seqs);
    free(dv->params);
    free(dv);
}

int specdec_dev_logits(struct specdec_dev *dv, int rows, float **out, char *err)
{
    int rc = dev_grow_rows(dv, &dv->logits, &dv->logits_rows, rows < 1 ? 1 : rows, err);
    *out = rc ? NULL : dv->logits;
    return rc;
}

static struct kern_cuda_sample_params kparams(const struct sampling_params *sp)
{
    return (struct kern_cuda_sample_params){.temperature = sp->temperature, .top_k = sp->top_k,
                                            .top_p = sp->top_p, .min_p = sp->min_p,
                                            .seed = sp->seed};
}

int specdec_dev_draft_picks(struct specdec_dev *dv, const struct specdec_dev_pick *picks, int n,
                            int32_t *tokens, int32_t *status, char *err)
{
    if (n <= 0)
        return 0;
    struct kern_backend *be = dv->be;
    const size_t v = (size_t)dv->vocab;
    int n_scratch = 0;
    for (int i = 0; i < n; i++)
        n_scratch += !picks[i].argmax && !picks[i].q_dev;
    int rc = io_reserve(dv, 2 * (size_t)n * sizeof(int32_t), err);
    if (!rc && n_scratch)
        rc = dev_grow_rows(dv, &dv->probs, &dv->probs_rows, n_scratch, err);
    if (rc)
        return rc;
    int32_t *tok_dev = dv->io, *st_dev = tok_dev + n;
    int scratch = 0;
    for (int i = 0; i < n; i++) {
        const struct specdec_dev_pick *p = &picks[i];
        const float *row = dv->logits + (size_t)p->row * v;
        if (p->argmax) {
            rc = kern_cuda_argmax(be, tok_dev + i, row, 1, dv->vocab, err);
        } else {
            float *q = p->q_dev ? p->q_dev : dv->probs + (size_t)scratch++ * v;
            struct kern_cuda_sample_params kp = kparams(&p->sp);
            rc = kern_cuda_sample(be, tok_dev + i, st_dev + i, q, row, 1, dv->vocab, &kp,
                                  &p->position, KERN_CUDA_PHILOX_STREAM_DRAFT_SAMPLE, err);
            /* the pipeline's shared buffer (or another GPU) wants q on the host */
            if (!rc && p->q_host)
                rc = be->ops->download(be, p->q_host, q, v * sizeof(float), err);
        }
        if (rc)
            return rc;
    }
    if ((rc = be->ops->download(be, dv->io_host, dv->io, 2 * (size_t)n * sizeof(int32_t), err)))
        return rc;
    const int32_t *tok_h = dv->io_host, *st_h = tok_h + n;
    for (int i = 0; i < n; i++) {
        tokens[i] = tok_h[i];
        /* argmax writes no status: a row of NaN gives -1 */
        status[i] = picks[i].argmax ? (tok_h[i] < 0 ? KERN_CUDA_SAMPLE_NO_MASS : 0) : st_h[i];
    }
    return 0;
}

/* What a verification batch needs room for: whether any round samples
 * (then every row is adjusted), its q rows and draft ids, and the bytes
 * coming back (one result per round, then with sampling a status per row). */
struct verify_shape {
    int sampled, n_q, n_ids;
    size_t res_bytes, io_bytes;
};

static struct verify_shape verify_shape(const struct specdec_dev_round *rounds, int n, int n_rows)
{
    struct verify_shape sh = {0};
    for (int i = 0; i < n; i++) {
        const struct specdec_dev_round *r = &rounds[i];
        const int greedy = sampling_params_is_greedy(&r->sp);
        sh.sampled |= !greedy;
        if (!greedy && r->mode == SPECULATE_MODE_SAMPLED)
            sh.n_q += r->k;
        sh.n_ids += r->k;
    }
    sh.res_bytes = (size_t)n * sizeof(struct kern_cuda_spec_result);
    sh.io_bytes = sh.res_bytes + (sh.sampled ? (size_t)n_rows * sizeof(int32_t) : 0);
    return sh;
}

static int verify_reserve(struct specdec_dev *dv, int n, int n_rows, const struct verify_shape *sh,
                          char *err)
{
    size_t seqs_bytes = (size_t)dv->seqs_cap * sizeof *dv->seqs;
    size_t params_bytes = (size_t)dv->params_cap * sizeof *dv->params;
    void *seqs = dv->seqs, *params = dv->params;
    int rc = host_grow(&seqs, &seqs_bytes, (size_t)n * sizeof *dv->seqs, err);
    dv->seqs = seqs;
    dv->seqs_cap = (int)(seqs_bytes / sizeof *dv->seqs);
    if (!rc) {
        rc = host_grow(&params, &params_bytes, (size_t)n_rows * sizeof *dv->params, err);
        dv->params = params;
        dv->params_cap = (int)(params_bytes / sizeof *dv->params);
    }
    if (!rc)
        rc = io_reserve(dv, sh->io_bytes, err);
    if (!rc && sh->sampled)
        rc = dev_grow_rows(dv, &dv->probs, &dv->probs_rows, n_rows, err);
    if (!rc && sh->n_q)
        rc = dev_grow_rows(dv, &dv->q, &dv->q_rows, sh->n_q, err);
    if (!rc && sh->n_ids)
        rc = ids_reserve(dv, sh->n_ids, err);
    return rc;
}

/* Each round's sequence record and row parameters on the host, its drafts
 * gathered into ids_host and its q rows copied to the device. */
static int verify_stage(struct specdec_dev *dv, const struct specdec_dev_round *rounds, int n,
                        char *err)
{
    struct kern_backend *be = dv->be;
    const size_t v = (size_t)dv->vocab;
    int q_at = 0, id_at = 0;
    for (int i = 0; i < n; i++) {
        const struct specdec_dev_round *r = &rounds[i];
        const int greedy = sampling_params_is_greedy(&r->sp);
        for (int row = 0; row <= r->k; row++)
            dv->params[r->p_row0 + row] = kparams(&r->sp);
        dv->seqs[i] = (struct kern_cuda_spec_seq){
            .k = r->k, .greedy = greedy, .mode = (int32_t)r->mode, .seed = r->sp.seed,
            .position0 = r->position0, .p_row0 = r->p_row0, .q_row0 = q_at, .draft0 = id_at};
        if (r->k > 0)
            memcpy(dv->ids_host + id_at, r->draft, (size_t)r->k * sizeof(int32_t));
        id_at += r->k;
        if (!greedy && r->mode == SPECULATE_MODE_SAMPLED && r->k > 0) {
            const size_t bytes = (size_t)r->k * v * sizeof(float);
            float *dst = dv->q + (size_t)q_at * v;
            int rc = r->q_dev ? be->ops->copy(be, dst, r->q_dev, bytes, err)
                              : be->ops->upload(be, dst, r->q_host, bytes, err);
            if (rc)
                return rc;
            q_at += r->k;
        }
    }
    return 0;
}

/* The rounds' outcomes from the results downloaded to io_host. */
static void verify_outcomes(const struct specdec_dev *dv, const struct specdec_dev_round *rounds,
                            int n, const struct verify_shape *sh, struct specdec_dev_outcome *out)
{
    const struct kern_cuda_spec_result *res = dv->io_host;
    const int32_t *st = (const int32_t *)((const char *)dv->io_host + sh->res_bytes);
    for (int i = 0; i < n; i++) {
        const struct specdec_dev_round *r = &rounds[i];
        struct specdec_dev_outcome *o = &out[i];
        o->status = res[i].status;
        o->bad_row = -1;
        o->n_accepted = res[i].n_accepted;
        memcpy(o->tokens, res[i].tokens, sizeof o->tokens);
        /* a row that could not be adjusted explains a failed round; rows
         * past the first rejection were adjusted but never read, so only a
         * failed round reports them */
        if (sh->sampled && o->status != 0)
            for (int row = 0; row <= r->k; row++)
                if (st[r->p_row0 + row] != 0) {
                    o->status = st[r->p_row0 + row];
                    o->bad_row = row;
                    break;
                }
    }
}

int specdec_dev_verify(struct specdec_dev *dv, const struct specdec_dev_round *rounds, int n,
                       int n_rows, struct specdec_dev_outcome *out, char *err)
{
    if (n <= 0)
        return 0;
    struct kern_backend *be = dv->be;
    const struct verify_shape sh = verify_shape(rounds, n, n_rows);
    int rc = verify_reserve(dv, n, n_rows, &sh, err);
    if (!rc)
        rc = verify_stage(dv, rounds, n, err);
    if (rc)
        return rc;
    /* staged, not waited for: the host queues the adjust and verify
     * kernels while the GPU still runs the forward pass before them (the
     * ids are copied out of ids_host before this returns; on the stream
     * they land ahead of the verify kernel that reads them) */
    if (sh.n_ids && (rc = kern_cuda_upload_staged(be, dv->ids, dv->ids_host,
                                                  (size_t)sh.n_ids * sizeof(int32_t), err)))
        return rc;
    /* Every row of a sampling call is adjusted (greedy rows become one-hot
     * at their argmax, which is all the greedy rule reads); the host path
     * adjusts lazily, but a row's adjusted values do not depend on whether
     * it was needed. */
    const float *p = dv->logits;
    if (sh.sampled) {
        int32_t *st_dev = (int32_t *)((char *)dv->io + sh.res_bytes);
        if ((rc = kern_cuda_sampling_adjust(be, dv->probs, st_dev, dv->logits, n_rows, dv->vocab,
                                            dv->params, err)))
            return rc;
        p = dv->probs;
    }
    struct kern_cuda_spec_result *res_dev = dv->io;
    if ((rc = kern_cuda_speculate_verify(be, res_dev, dv->seqs, n, p, sh.n_q ? dv->q : NULL,
                                         sh.n_ids ? dv->ids : NULL, dv->vocab, err)) ||
        (rc = be->ops->download(be, dv->io_host, dv->io, sh.io_bytes, err)))
        return rc;
    verify_outcomes(dv, rounds, n, &sh, out);
    return 0;
}

int specdec_dev_download_logits(struct specdec_dev *dv, int row, int n_rows, float *host,
                                char *err)
{
    if (row < 0 || n_rows < 0 || row + n_rows > dv->logits_rows)
        return error_set(err, ERR_INVALID_ARG, "logits rows %d..%d outside the buffer's %d", row,
                         row + n_rows - 1, dv->logits_rows);
    return dv->be->ops->download(dv->be, host, dv->logits + (size_t)row * (size_t)dv->vocab,
                                 row_bytes(dv, n_rows), err);
}

int specdec_dev_upload_logits(struct specdec_dev *dv, int row, int n_rows, const float *host,
                              char *err)
{
    if (row < 0 || n_rows < 0 || row + n_rows > dv->logits_rows)
        return error_set(err, ERR_INVALID_ARG, "logits rows %d..%d outside the buffer's %d", row,
                         row + n_rows - 1, dv->logits_rows);
    return dv->be->ops->upload(dv->be, dv->logits + (size_t)row * (size_t)dv->vocab, host,
                               row_bytes(dv, n_rows), err);
}

const char *specdec_dev_status_str(int32_t status)
{
    return kern_cuda_sample_status_str(status);
}

#else /* no CUDA backend in this build */

struct specdec_dev {
    int unused;
};

int specdec_dev_create(struct specdec_dev **out, struct llama_ctx *ctx, char *err)
{
    (void)ctx;
    *out = NULL;
    return error_set(err, ERR_UNSUPPORTED,
                     "device sampling: needs the cuda backend, and this build has none (built "
                     "without the CUDA toolkit)");
}

void specdec_dev_destroy(struct specdec_dev *dv)
{
    free(dv);
}

/* Unreachable without a device state (create refuses); they say so rather
 * than pretend. */
int specdec_dev_logits(struct specdec_dev *dv, int rows, float **out, char *err)
{
    (void)dv;
    (void)rows;
    *out = NULL;
    return error_set(err, ERR_UNSUPPORTED, "device sampling: no CUDA backend in this build");
}

int specdec_dev_draft_picks(struct specdec_dev *dv, const struct specdec_dev_pick *picks, int n,
                            int32_t *tokens, int32_t *status, char *err)
{
    (void)dv, (void)picks, (void)n, (void)tokens, (void)status;
    return error_set(err, ERR_UNSUPPORTED, "device sampling: no CUDA backend in this build");
}

int specdec_dev_verify(struct specdec_dev *dv, const struct specdec_dev_round *rounds, int n,
                       int n_rows, struct specdec_dev_outcome *out, char *err)
{
    (void)dv, (void)rounds, (void)n, (void)n_rows, (void)out;
    return error_set(err, ERR_UNSUPPORTED, "device sampling: no CUDA backend in this build");
}

int specdec_dev_download_logits(struct specdec_dev *dv, int row, int n_rows, float *host,
                                char *err)
{
    (void)dv, (void)row, (void)n_rows, (void)host;
    return error_set(err, ERR_UNSUPPORTED, "device sampling: no CUDA backend in this build");
}

int specdec_dev_upload_logits(struct specdec_dev *dv, int row, int n_rows, const float *host,
                              char *err)
{
    (void)dv, (void)row, (void)n_rows, (void)host;
    return error_set(err, ERR_UNSUPPORTED, "device sampling: no CUDA backend in this build");
}

const char *specdec_dev_status_str(int32_t status)
{
    (void)status;
    return "no CUDA backend in this build";
}

#endif
