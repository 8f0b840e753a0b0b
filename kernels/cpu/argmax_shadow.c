/* argmax_shadow.c: the shadows of cpu_prepare_argmax: the copy of a head
 * that matmul_argmax screens with (one byte a weight, or half a byte for a
 * draft's head) and each row's scale and norms; making, finding and
 * releasing them, and freeing the backend's matmul_argmax state
 * (cpu_argmax_destroy). The bound they serve and the copies' formats are
 * stated in argmax.c's header.
 *
 * Invariants: a row's norms are summed in double and stored rounded up, so
 * a margin computed from them is never smaller than the true one; a shadow
 * is read-only (its mapping PROT_READ) once made, and the newest
 * prepare_argmax of a matrix replaces the one before.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "argmax_internal.h"
#include "error.h"
#include "packed.h"

#define ARGMAX_HUGE_PAGE ((size_t)2 << 20)

/* ---- memory ---- */

struct cpu_argmax *cpu_argmax_state(struct cpu_backend *cb, char *err)
{
    if (!cb->argmax && !(cb->argmax = calloc(1, sizeof *cb->argmax)))
        error_set(err, ERR_NOMEM, "cpu matmul_argmax: out of memory");
    return cb->argmax;
}

static void shadow_free(struct cpu_argmax_shadow *s)
{
    if (s->q)
        munmap(s->q, s->map_len);
    free(s->scale);
    free(s->n1);
    free(s->n2);
    free(s->dq);
    memset(s, 0, sizeof *s);
}

struct cpu_argmax_shadow *cpu_argmax_shadow_find(const struct cpu_backend *cb, const void *w)
{
    struct cpu_argmax *a = cb->argmax;
    for (int i = 0; a && i < a->n_shadows; i++)
        if (a->shadows[i].w == w)
            return &a->shadows[i];
    return NULL;
}

void cpu_argmax_release(struct cpu_backend *cb, const void *w)
{
    struct cpu_argmax *a = cb->argmax;
    struct cpu_argmax_shadow *s = cpu_argmax_shadow_find(cb, w);
    if (!s)
        return;
    shadow_free(s);
    *s = a->shadows[--a->n_shadows];
}

void cpu_argmax_destroy(struct cpu_backend *cb)
{
    struct cpu_argmax *a = cb->argmax;
    if (!a)
        return;
    for (int i = 0; i < a->n_shadows; i++)
        shadow_free(&a->shadows[i]);
    free(a->shadows);
    free(a->hq);
    free(a->kept);
    free(a->kept_upper);
    free(a->logits);
    free(a->candidates);
    free(a->hb);
    free(a->hround);
    free(a);
    cb->argmax = NULL;
}

/* ---- the shadow ---- */

static float round_up_f32(double x)
{
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INFINITY) : f;
}

struct prepare_job {
    struct cpu_argmax_shadow *s;
    float **rows;           /* per-thread [cols] */
    int *bad;               /* per-thread: a row held a NaN or an infinity */
};

static void prepare_task(void *ctx, long begin, long end, int thread_idx)
{
    const struct prepare_job *job = ctx;
    struct cpu_argmax_shadow *s = job->s;
    float *y = job->rows[thread_idx];
    for (long v = begin; v < end; v++) {
        cpu_matrix_row_f32(s->w, s->dtype, s->cols, s->packed, s->layout, v, y);
        double maxabs = 0;
        for (int k = 0; k < s->cols; k++) {
            if (!isfinite(y[k])) {
                job->bad[thread_idx] = 1;
                return;
            }
            maxabs = fmax(maxabs, fabs((double)y[k]));
        }
        const long qmax = s->draft ? ARGMAX_QMAX_W_DRAFT : ARGMAX_QMAX_W;
        const float scale = (float)(maxabs / (double)qmax);
        int8_t *q = s->q + (size_t)v * (size_t)s->stride;
        double n1 = 0, n2 = 0, dq = 0;
        for (int k = 0; k < s->cols; k++) {
            const double x = y[k];
            long r = scale > 0 ? lrint(x / scale) : 0;
            r = r > qmax ? qmax : r < -qmax ? -qmax : r;
            if (s->draft) {
                const int j = k % ARGMAX_DRAFT_COLS;
                uint8_t *byte = (uint8_t *)q + (size_t)(k / ARGMAX_DRAFT_COLS) * 64 + (size_t)(j % 64);
                const unsigned code = (unsigned)(r + ARGMAX_DRAFT_OFFSET);
                *byte = (uint8_t)(j < 64 ? (*byte & 0xF0u) | code : (*byte & 0x0Fu) | (code << 4));
            } else {
                q[k] = (int8_t)r;
            }
            const double e = x - (double)scale * (double)r; /* the product is exact */
            n1 += fabs(x);
            n2 += x * x;
            dq += e * e;
        }
        /* sums of d terms in double: relative error far below 1e-9 */
        s->scale[v] = scale;
        s->n1[v] = round_up_f32(n1 * (1 + 1e-9));
        s->n2[v] = round_up_f32(sqrt(n2) * (1 + 1e-9));
        s->dq[v] = round_up_f32(sqrt(dq) * (1 + 1e-9));
    }
}

int cpu_prepare_argmax(struct kern_backend *be, const void *w, enum kern_dtype dtype, int64_t rows,
                       int64_t cols, int draft, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    int rc = cpu_backend_check_dtype(dtype, "prepare_argmax", err);
    if (rc < 0)
        return rc;
    if (!w || rows < 1 || cols < 1 || rows > INT32_MAX || cols > (1 << 24))
        return error_set(err, ERR_INVALID_ARG,
                         "cpu prepare_argmax: need a matrix of 1..2^31-1 rows of 1..2^24 columns, "
                         "got %p [%lld, %lld]",
                         w, (long long)rows, (long long)cols);
    int packed_rows = 0, packed_d_in = 0;
    const int layout = cpu_backend_packed(cb, w, &packed_rows, &packed_d_in);
    if (layout != CPU_LAYOUT_ROWS &&
        (packed_d_in != cols || dtype != KERN_DTYPE_BF16 || rows < packed_rows))
        return error_set(err, ERR_INVALID_ARG,
                         "cpu prepare_argmax: w was mapped as a bf16 matrix of at least %d rows of "
                         "%d, named as %s [%lld, %lld]",
                         packed_rows, packed_d_in, kern_dtype_name(dtype), (long long)rows,
                         (long long)cols);
    struct cpu_argmax *a = cpu_argmax_state(cb, err);
    if (!a)
        return ERR_NOMEM;
    cpu_argmax_release(cb, w); /* prepared again: the newest shape counts */
    if (a->n_shadows == a->cap_shadows) {
        const int cap = a->cap_shadows ? 2 * a->cap_shadows : 4;
        struct cpu_argmax_shadow *grown = realloc(a->shadows, (size_t)cap * sizeof *grown);
        if (!grown)
            return error_set(err, ERR_NOMEM, "cpu prepare_argmax: out of memory");
        a->shadows = grown;
        a->cap_shadows = cap;
    }
    struct cpu_argmax_shadow s = {.w = w, .dtype = dtype, .rows = (int)rows, .cols = (int)cols,
                                  .packed = packed_rows,
                                  .layout = (enum cpu_layout)layout, .dq_factor = 1.0};
#if defined(__AVX512F__) && defined(__AVX512BW__)
    /* the draft copy is read by the AVX-512 screen only (scores_rows_draft):
     * elsewhere a draft gets the one-byte copy, exact and no slower */
    s.draft = draft != 0;
#else
    (void)draft;
#endif
    if (s.draft) {
        s.cols_pad = (int)((cols + ARGMAX_DRAFT_COLS - 1) / ARGMAX_DRAFT_COLS * ARGMAX_DRAFT_COLS);
        s.stride = s.cols_pad / 2;
        s.dq_factor = ARGMAX_DRAFT_Z / sqrt((double)cols);
    } else {
        s.stride = (int)((cols + ARGMAX_COLS_ALIGN - 1) / ARGMAX_COLS_ALIGN * ARGMAX_COLS_ALIGN);
        s.cols_pad = s.stride;
    }
    const size_t q_bytes = (size_t)rows * (size_t)s.stride;
    s.map_len = (q_bytes + ARGMAX_HUGE_PAGE - 1) & ~(ARGMAX_HUGE_PAGE - 1);
    /* a read-mostly stream like the weights: huge pages where there are any */
    void *q = mmap(NULL, s.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED)
        return error_set_errno(err, ERR_NOMEM, errno, "cpu prepare_argmax: mmap(%zu bytes)",
                               s.map_len);
    (void)madvise(q, s.map_len, MADV_HUGEPAGE); /* advice: without it merely slower */
    s.q = q;
    s.scale = malloc((size_t)rows * sizeof *s.scale);
    s.n1 = malloc((size_t)rows * sizeof *s.n1);
    s.n2 = malloc((size_t)rows * sizeof *s.n2);
    s.dq = malloc((size_t)rows * sizeof *s.dq);
    float **row_bufs = calloc((size_t)cb->n_threads, sizeof *row_bufs);
    int *bad = calloc((size_t)cb->n_threads, sizeof *bad);
    rc = !s.scale || !s.n1 || !s.n2 || !s.dq || !row_bufs || !bad
             ? error_set(err, ERR_NOMEM, "cpu prepare_argmax: out of memory")
             : 0;
    for (int t = 0; !rc && t < cb->n_threads; t++)
        if (!(row_bufs[t] = malloc((size_t)cols * sizeof(float))))
            rc = error_set(err, ERR_NOMEM, "cpu prepare_argmax: out of memory");
    if (!rc) {
        struct prepare_job job = {.s = &s, .rows = row_bufs, .bad = bad};
        cpu_pool_run_guided(cb->pool, (long)rows, 64, prepare_task, &job);
        for (int t = 0; t < cb->n_threads; t++)
            if (bad[t])
                rc = error_set(err, ERR_INVALID_ARG,
                               "cpu prepare_argmax: the matrix holds a NaN or an infinity");
    }
    for (int t = 0; row_bufs && t < cb->n_threads; t++)
        free(row_bufs[t]);
    free(row_bufs);
    free(bad);
    if (rc) {
        shadow_free(&s);
        return rc;
    }
    for (int64_t v = 0; v < rows; v++) {
        s.n1_max = fmax(s.n1_max, s.n1[v]);
        s.n2_max = fmax(s.n2_max, s.n2[v]);
        s.dq_max = fmax(s.dq_max, s.dq[v]);
    }
    if (mprotect(s.q, s.map_len, PROT_READ) != 0) {
        const int e = errno;
        shadow_free(&s);
        return error_set_errno(err, ERR_SYSTEM, e, "cpu prepare_argmax: mprotect(PROT_READ)");
    }
    a->shadows[a->n_shadows++] = s;
    return 0;
}

int cpu_argmax_copy_bits(const struct cpu_backend *cb, const void *w)
{
    const struct cpu_argmax_shadow *s = cpu_argmax_shadow_find(cb, w);
    return !s ? 0 : s->draft ? 4 : 8;
}
