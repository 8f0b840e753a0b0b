/* prof.c: see prof.h. */
#define _GNU_SOURCE
#include "prof.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *const prof_names[PROF_N] = {"embed", "rmsnorm", "matmul", "head argmax", "rope",
                                               "attention", "swiglu", "add", "copy", "other"};

static struct prof_backend *prof_of(struct kern_backend *be)
{
    return (struct prof_backend *)(void *)be;
}

static void prof_add(struct kern_backend *be, enum prof_op op, double t0)
{
    struct prof_backend *p = prof_of(be);
    p->op_s[op] += now_s() - t0;
    p->op_calls[op]++;
}

static void prof_destroy(struct kern_backend *be)
{
    (void)be; /* the inner backend belongs to main */
}
static int prof_alloc(struct kern_backend *be, size_t size_bytes, void **out, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    return in->ops->alloc(in, size_bytes, out, err);
}
static void prof_free(struct kern_backend *be, void *ptr)
{
    struct kern_backend *in = prof_of(be)->inner;
    in->ops->free(in, ptr);
}
static int prof_upload(struct kern_backend *be, void *dst, const void *src, size_t size, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->upload(in, dst, src, size, err);
    prof_add(be, PROF_OTHER, t0);
    return rc;
}
static int prof_download(struct kern_backend *be, void *dst, const void *src, size_t size, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->download(in, dst, src, size, err);
    prof_add(be, PROF_OTHER, t0);
    return rc;
}
static int prof_copy(struct kern_backend *be, void *dst, const void *src, size_t size, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->copy(in, dst, src, size, err);
    prof_add(be, PROF_COPY, t0);
    return rc;
}
static int prof_map_weights(struct kern_backend *be, const void *host, size_t size, const void **out,
                            char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    return in->ops->map_weights(in, host, size, out, err);
}
static int prof_map_matrix(struct kern_backend *be, const void *host, enum kern_dtype dtype,
                           int64_t rows, int64_t cols, const void **out, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    if (in->ops->map_matrix)
        return in->ops->map_matrix(in, host, dtype, rows, cols, out, err);
    return in->ops->map_weights(in, host, (size_t)rows * (size_t)cols * kern_dtype_size(dtype),
                                out, err);
}
static void prof_unmap_weights(struct kern_backend *be, const void *ptr)
{
    struct kern_backend *in = prof_of(be)->inner;
    in->ops->unmap_weights(in, ptr);
}
static int prof_sync(struct kern_backend *be, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    return in->ops->sync(in, err);
}
static int prof_embed(struct kern_backend *be, float *out, const void *table, enum kern_dtype dt,
                      const int32_t *ids, int n, int dim, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->embed(in, out, table, dt, ids, n, dim, err);
    prof_add(be, PROF_EMBED, t0);
    return rc;
}
static int prof_rmsnorm(struct kern_backend *be, float *out, const float *x, const void *w,
                        enum kern_dtype dt, int n, int dim, float eps, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->rmsnorm(in, out, x, w, dt, n, dim, eps, err);
    prof_add(be, PROF_RMSNORM, t0);
    return rc;
}
static int prof_matmul(struct kern_backend *be, float *out, const float *x, const void *w,
                       enum kern_dtype dt, int n, int d_in, int d_out, char *err)
{
    struct prof_backend *p = prof_of(be);
    double t0 = now_s();
    int rc = p->inner->ops->matmul(p->inner, out, x, w, dt, n, d_in, d_out, err);
    double dt_s = now_s() - t0;
    p->op_s[PROF_MATMUL] += dt_s;
    p->op_calls[PROF_MATMUL]++;
    int i = 0;
    while (i < p->n_mm && (p->mm[i].n != n || p->mm[i].d_in != d_in || p->mm[i].d_out != d_out))
        i++;
    if (i == p->n_mm && p->n_mm < PROF_SHAPES) {
        p->mm[i].n = n, p->mm[i].d_in = d_in, p->mm[i].d_out = d_out;
        p->n_mm++;
    }
    if (i < p->n_mm) {
        p->mm[i].calls++;
        p->mm[i].s += dt_s;
    }
    return rc;
}
static int prof_matmul_argmax(struct kern_backend *be, int32_t *idx_out, const float *in,
                              const void *w, enum kern_dtype dtype, int n, int d_in, int d_out,
                              const uint64_t *const *allow, char *err)
{
    struct kern_backend *inner = prof_of(be)->inner;
    double t0 = now_s();
    int rc = inner->ops->matmul_argmax(inner, idx_out, in, w, dtype, n, d_in, d_out, allow, err);
    prof_add(be, PROF_ARGMAX, t0);
    return rc;
}
static int prof_prepare_argmax(struct kern_backend *be, const void *w, enum kern_dtype dtype,
                               int64_t rows, int64_t cols, int draft, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    return in->ops->prepare_argmax(in, w, dtype, rows, cols, draft, err);
}
static int prof_rope(struct kern_backend *be, float *x, const int32_t *pos, int n, int n_heads,
                     int head_dim, const float *inv_freq, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->rope(in, x, pos, n, n_heads, head_dim, inv_freq, err);
    prof_add(be, PROF_ROPE, t0);
    return rc;
}
static int prof_kv_store(struct kern_backend *be, float *kp, float *vp, const float *k,
                         const float *v, int n, const struct kern_kv_layout *kv, int kv_dim,
                         char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->kv_store(in, kp, vp, k, v, n, kv, kv_dim, err);
    prof_add(be, PROF_COPY, t0);
    return rc;
}
static int prof_attention(struct kern_backend *be, float *out, const float *q, const float *kp,
                          const float *vp, int n, const struct kern_kv_layout *kv, int n_heads,
                          int n_kv, int head_dim, float scale, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->attention(in, out, q, kp, vp, n, kv, n_heads, n_kv, head_dim, scale, err);
    prof_add(be, PROF_ATTENTION, t0);
    return rc;
}
static int prof_swiglu(struct kern_backend *be, float *out, const float *g, const float *u,
                       size_t count, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->swiglu(in, out, g, u, count, err);
    prof_add(be, PROF_SWIGLU, t0);
    return rc;
}
static int prof_addop(struct kern_backend *be, float *x, const float *y, size_t count, char *err)
{
    struct kern_backend *in = prof_of(be)->inner;
    double t0 = now_s();
    int rc = in->ops->add(in, x, y, count, err);
    prof_add(be, PROF_ADD, t0);
    return rc;
}

static const struct kern_ops prof_ops = {
    .destroy = prof_destroy, .alloc = prof_alloc, .free = prof_free, .upload = prof_upload,
    .download = prof_download, .copy = prof_copy, .map_weights = prof_map_weights,
    .unmap_weights = prof_unmap_weights, .sync = prof_sync, .embed = prof_embed,
    .rmsnorm = prof_rmsnorm, .matmul = prof_matmul, .rope = prof_rope,
    .kv_store = prof_kv_store, .attention = prof_attention, .swiglu = prof_swiglu, .add = prof_addop,
    .map_matrix = prof_map_matrix, .matmul_argmax = prof_matmul_argmax,
    .prepare_argmax = prof_prepare_argmax,
};

void prof_init(struct prof_backend *p, struct kern_backend *inner)
{
    memset(p, 0, sizeof *p);
    p->ops = prof_ops;
    if (!inner->ops->matmul_argmax)
        p->ops.matmul_argmax = NULL;
    if (!inner->ops->prepare_argmax)
        p->ops.prepare_argmax = NULL;
    p->base.ops = &p->ops;
    p->base.name = inner->name;
    p->inner = inner;
}

/* Prints the time per op kind and per matmul shape, per unit (a decoded
 * token, or a forward call: `unit` names it, `over` says what was run). */
void prof_report(const struct prof_backend *p, double wall_s, long units, const char *unit,
                 const char *over)
{
    double total = 0;
    for (int i = 0; i < PROF_N; i++)
        total += p->op_s[i];
    printf("  profile over %ld %s (%.1f ms/%s wall, %.1f ms/%s in ops):\n", units, over,
           1e3 * wall_s / (double)units, unit, 1e3 * total / (double)units, unit);
    for (int i = 0; i < PROF_N; i++)
        if (p->op_calls[i])
            printf("    %-10s %8ld calls %9.3f ms/%-5s %6.1f%%  %8.2f us/call\n", prof_names[i],
                   p->op_calls[i], 1e3 * p->op_s[i] / (double)units, unit,
                   100.0 * p->op_s[i] / wall_s, 1e6 * p->op_s[i] / (double)p->op_calls[i]);
    for (int i = 0; i < p->n_mm; i++)
        printf("    matmul n=%-3d %6d -> %-7d %8ld calls %9.3f ms/%-5s %8.2f us/call\n",
               p->mm[i].n, p->mm[i].d_in, p->mm[i].d_out, p->mm[i].calls,
               1e3 * p->mm[i].s / (double)units, unit, 1e6 * p->mm[i].s / (double)p->mm[i].calls);
}

