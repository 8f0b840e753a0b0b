/* test_llama_graphs.c: the forward pass's device steps and graphs
 * (common/model/llama_step.c) on a backend that records and replays, in CI.
 *
 * The CUDA backend records graphs; CI has no GPU. What llama_step.c must
 * get right does not need one: that every op of a chunk is handed the
 * step's arrays, that a graph is keyed by everything its recorded launches
 * hold by value, that stale graphs are recorded again, that a failed
 * recording falls back to running the ops. The backend here ("replay", a
 * fake the test controls, not the code under test) wraps the CPU backend
 * and keeps CUDA's semantics of a graph: while recording, ops are stored,
 * not run, with their pointers and sizes as they were handed (a kernel's
 * arguments by value); the step's arrays (ids, positions, the layout's rows
 * and tables) are read at replay from the step current then, as CUDA's
 * kernels read the step's device buffer; the layout's sizes (sequences,
 * table stride) are the recorded ones. A graph replayed for a step whose
 * shape differs from its recording therefore computes garbage, as on a
 * GPU, and the logits show it. Like the CUDA backend it refuses, while
 * recording, host arrays that are not the step's and any copy to or from
 * the host. It offers the fused ops (matmul_multi, add_rmsnorm,
 * matmul_swiglu, rope_kv_store) as their parts, so the forward pass's calls
 * of them are checked here too; their CUDA kernels against their parts:
 * tests/gpu/test_cuda_kernels.c.
 *
 * Checks: logits of a graph context equal a plain CPU context's bit for bit
 * over prefills, decode steps of one and three sequences, verifications of
 * 1..17 rows, truncations, positions across the bounds 256 and 512, and
 * more than 64 shapes (least recently used dropped); graphs really replay,
 * a shape recorded the second time it comes; a recording that fails turns
 * graphs off with the same logits; a moved memory (a launch refused with
 * ERR_NOT_FOUND) is recorded again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "modelgen.h"
#include "ctx_pair.h"

/* ---- the replaying backend ------------------------------------------------ */

enum rop { ROP_EMBED, ROP_RMSNORM, ROP_MATMUL, ROP_ROPE, ROP_KV_STORE, ROP_ATTENTION, ROP_SWIGLU,
           ROP_ADD };

/* One recorded op: what a kernel launch would hold. */
struct rcall {
    enum rop op;
    float *out, *out2;
    const float *in, *in2, *in3;
    const void *w;
    enum kern_dtype dtype;
    int n, a, b, c;
    float f;
    size_t count;
    int kv_block_size, kv_n_blocks, kv_n_seqs, kv_stride; /* the layout's sizes, by value */
};

struct kern_graph {
    struct rcall *calls;
    int n_calls, cap;
    unsigned generation;
};

struct replay {
    struct kern_backend base; /* first */
    struct kern_backend *cpu;
    struct kern_ops ops;
    bool reserved, in_step, capturing;
    struct kern_step_limits lim;
    struct kern_step step;
    struct kern_kv_layout step_kv;
    struct kern_graph *rec;  /* the recording */
    unsigned generation;     /* bumped by the test: the memory "moved" */
    int fail_next_capture;   /* the next graph_capture_end fails */
    int steps, recordings, launches;
};

static struct replay *rp(struct kern_backend *be) { return (struct replay *)be; }

static int refuse(char *err, const char *what)
{
    return error_set(err, ERR_INVALID_ARG, "replay: %s while recording", what);
}

static int rec_push(struct replay *r, struct rcall c)
{
    struct kern_graph *g = r->rec;
    if (g->n_calls == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 256;
        g->calls = realloc(g->calls, (size_t)g->cap * sizeof *g->calls);
        assert_non_null(g->calls);
    }
    g->calls[g->n_calls++] = c;
    return 0;
}

/* The step's layout, as a device kernel would read it: current arrays,
 * sizes as recorded. */
static struct kern_kv_layout step_layout_now(const struct replay *r, const struct rcall *c)
{
    return (struct kern_kv_layout){.block_size = c->kv_block_size, .n_blocks = c->kv_n_blocks,
                                   .n_seqs = c->kv_n_seqs, .table_stride = c->kv_stride,
                                   .tables = r->step_kv.tables, .rows = r->step_kv.rows};
}

static bool is_step_layout(const struct replay *r, const struct kern_kv_layout *kv, int n)
{
    return r->in_step && n == r->step.n && kv->rows == r->step_kv.rows &&
           kv->tables == r->step_kv.tables && kv->n_seqs == r->step_kv.n_seqs &&
           kv->table_stride == r->step_kv.table_stride;
}

static void rdestroy(struct kern_backend *be)
{
    struct replay *r = rp(be);
    kern_backend_destroy(r->cpu);
    free(r);
}
static int ralloc(struct kern_backend *be, size_t size, void **out, char *err)
{
    return rp(be)->capturing ? refuse(err, "alloc") : rp(be)->cpu->ops->alloc(rp(be)->cpu, size, out, err);
}
static void rfree(struct kern_backend *be, void *p) { rp(be)->cpu->ops->free(rp(be)->cpu, p); }
static int rupload(struct kern_backend *be, void *dst, const void *src, size_t size, char *err)
{
    return rp(be)->capturing ? refuse(err, "upload")
                             : rp(be)->cpu->ops->upload(rp(be)->cpu, dst, src, size, err);
}
static int rdownload(struct kern_backend *be, void *dst, const void *src, size_t size, char *err)
{
    return rp(be)->capturing ? refuse(err, "download")
                             : rp(be)->cpu->ops->download(rp(be)->cpu, dst, src, size, err);
}
static int rcopy(struct kern_backend *be, void *dst, const void *src, size_t size, char *err)
{
    return rp(be)->capturing ? refuse(err, "copy")
                             : rp(be)->cpu->ops->copy(rp(be)->cpu, dst, src, size, err);
}
static int rmap(struct kern_backend *be, const void *host, size_t size, const void **out, char *err)
{
    return rp(be)->cpu->ops->map_weights(rp(be)->cpu, host, size, out, err);
}
static void runmap(struct kern_backend *be, const void *p) { rp(be)->cpu->ops->unmap_weights(rp(be)->cpu, p); }
static int rsync(struct kern_backend *be, char *err)
{
    return rp(be)->capturing ? refuse(err, "sync") : rp(be)->cpu->ops->sync(rp(be)->cpu, err);
}
static int rmap_matrix(struct kern_backend *be, const void *host, enum kern_dtype dt, int64_t rows,
                       int64_t cols, const void **out, char *err)
{
    return rp(be)->cpu->ops->map_matrix(rp(be)->cpu, host, dt, rows, cols, out, err);
}

static int rembed(struct kern_backend *be, float *out, const void *table, enum kern_dtype dt,
                  const int32_t *ids, int n, int dim, char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->embed(r->cpu, out, table, dt, ids, n, dim, err);
    if (!r->in_step || ids != r->step.ids || n != r->step.n)
        return refuse(err, "embed of ids that are not the step's");
    return rec_push(r, (struct rcall){.op = ROP_EMBED, .out = out, .w = table, .dtype = dt, .n = n,
                                      .a = dim});
}
static int rrmsnorm(struct kern_backend *be, float *out, const float *in, const void *w,
                    enum kern_dtype dt, int n, int dim, float eps, char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->rmsnorm(r->cpu, out, in, w, dt, n, dim, eps, err);
    return rec_push(r, (struct rcall){.op = ROP_RMSNORM, .out = out, .in = in, .w = w, .dtype = dt,
                                      .n = n, .a = dim, .f = eps});
}
static int rmatmul(struct kern_backend *be, float *out, const float *in, const void *w,
                   enum kern_dtype dt, int n, int d_in, int d_out, char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->matmul(r->cpu, out, in, w, dt, n, d_in, d_out, err);
    return rec_push(r, (struct rcall){.op = ROP_MATMUL, .out = out, .in = in, .w = w, .dtype = dt,
                                      .n = n, .a = d_in, .b = d_out});
}
static int rrope(struct kern_backend *be, float *x, const int32_t *pos, int n, int heads, int hd,
                 const float *freq, char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->rope(r->cpu, x, pos, n, heads, hd, freq, err);
    if (!r->in_step || pos != r->step.positions || freq != r->step.inv_freq || n != r->step.n)
        return refuse(err, "rope of positions that are not the step's");
    return rec_push(r, (struct rcall){.op = ROP_ROPE, .out = x, .n = n, .a = heads, .b = hd});
}
static int rkv_store(struct kern_backend *be, float *kp, float *vp, const float *k, const float *v,
                     int n, const struct kern_kv_layout *kv, int kv_dim, char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->kv_store(r->cpu, kp, vp, k, v, n, kv, kv_dim, err);
    if (!is_step_layout(r, kv, n))
        return refuse(err, "kv_store of a layout that is not the step's");
    return rec_push(r, (struct rcall){.op = ROP_KV_STORE, .out = kp, .out2 = vp, .in = k, .in2 = v,
                                      .n = n, .a = kv_dim, .kv_block_size = kv->block_size,
                                      .kv_n_blocks = kv->n_blocks, .kv_n_seqs = kv->n_seqs,
                                      .kv_stride = kv->table_stride});
}
static int rattention(struct kern_backend *be, float *out, const float *q, const float *kp,
                      const float *vp, int n, const struct kern_kv_layout *kv, int heads,
                      int kv_heads, int hd, float scale, char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->attention(r->cpu, out, q, kp, vp, n, kv, heads, kv_heads, hd, scale, err);
    if (!is_step_layout(r, kv, n))
        return refuse(err, "attention over a layout that is not the step's");
    return rec_push(r, (struct rcall){.op = ROP_ATTENTION, .out = out, .in = q, .in2 = kp,
                                      .in3 = vp, .n = n, .a = heads, .b = kv_heads, .c = hd,
                                      .f = scale, .kv_block_size = kv->block_size,
                                      .kv_n_blocks = kv->n_blocks, .kv_n_seqs = kv->n_seqs,
                                      .kv_stride = kv->table_stride});
}
static int rswiglu(struct kern_backend *be, float *out, const float *g, const float *u, size_t count,
                   char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->swiglu(r->cpu, out, g, u, count, err);
    return rec_push(r, (struct rcall){.op = ROP_SWIGLU, .out = out, .in = g, .in2 = u,
                                      .count = count});
}
static int radd(struct kern_backend *be, float *x, const float *y, size_t count, char *err)
{
    struct replay *r = rp(be);
    if (!r->capturing)
        return r->cpu->ops->add(r->cpu, x, y, count, err);
    return rec_push(r, (struct rcall){.op = ROP_ADD, .out = x, .in = y, .count = count});
}

/* The fused ops of the table as their parts, through the wrappers above
 * (so recorded as their parts): the forward pass's calls of them are then
 * checked against the plain CPU context like the rest. */
static int rmatmul_multi(struct kern_backend *be, int count, float *const *outs, const float *in,
                         const void *const *ws, enum kern_dtype dt, int n, int d_in,
                         const int *d_outs, char *err)
{
    for (int j = 0; j < count; j++) {
        int rc = rmatmul(be, outs[j], in, ws[j], dt, n, d_in, d_outs[j], err);
        if (rc)
            return rc;
    }
    return 0;
}
static int radd_rmsnorm(struct kern_backend *be, float *out, float *x, const float *y,
                        const void *w, enum kern_dtype dt, int n, int dim, float eps, char *err)
{
    if (out == x)
        return error_set(err, ERR_INVALID_ARG, "replay add_rmsnorm: out aliases x");
    int rc = radd(be, x, y, (size_t)n * (size_t)dim, err);
    return rc ? rc : rrmsnorm(be, out, x, w, dt, n, dim, eps, err);
}
static int rmatmul_swiglu(struct kern_backend *be, float *gate, float *up, const float *in,
                          const void *wg, const void *wu, enum kern_dtype dt, int n, int d_in,
                          int d_out, char *err)
{
    int rc = rmatmul(be, gate, in, wg, dt, n, d_in, d_out, err);
    if (!rc)
        rc = rmatmul(be, up, in, wu, dt, n, d_in, d_out, err);
    return rc ? rc : rswiglu(be, gate, gate, up, (size_t)n * (size_t)d_out, err);
}
static int rrope_kv_store(struct kern_backend *be, float *q, float *k, const float *v,
                          const int32_t *pos, int n, int heads, int kv_heads, int hd,
                          const float *freq, float *kp, float *vp, const struct kern_kv_layout *kv,
                          char *err)
{
    int rc = rrope(be, q, pos, n, heads, hd, freq, err);
    if (!rc)
        rc = rrope(be, k, pos, n, kv_heads, hd, freq, err);
    return rc ? rc : rkv_store(be, kp, vp, k, v, n, kv, kv_heads * hd, err);
}

static int rstep_reserve(struct kern_backend *be, const struct kern_step_limits *lim, char *err)
{
    struct replay *r = rp(be);
    (void)err;
    r->lim = *lim;
    r->reserved = true;
    return 0;
}
static int rstep_begin(struct kern_backend *be, const struct kern_step *st, char *err)
{
    struct replay *r = rp(be);
    if (!r->reserved || r->in_step || r->capturing)
        return error_set(err, ERR_INVALID_ARG, "replay: step_begin out of order");
    if (st->n > r->lim.max_rows || st->kv->n_seqs > r->lim.max_seqs ||
        st->kv->table_stride > r->lim.table_stride || st->max_positions > r->lim.max_positions)
        return error_set(err, ERR_RANGE, "replay: step beyond the reservation");
    int rc = kern_kv_layout_check(st->kv, st->n, "replay step_begin", err);
    if (rc)
        return rc;
    for (int i = 0; i < st->n; i++)
        if (st->kv->rows[2 * i + 1] >= st->max_positions)
            return error_set(err, ERR_RANGE, "replay: row %d past the step's bound", i);
    r->step = *st;
    r->step_kv = *st->kv;
    r->in_step = true;
    r->steps++;
    return 0;
}
static void rstep_end(struct kern_backend *be) { rp(be)->in_step = false; }

static int rcapture_begin(struct kern_backend *be, char *err)
{
    struct replay *r = rp(be);
    if (r->capturing)
        return error_set(err, ERR_INVALID_ARG, "replay: already recording");
    r->rec = calloc(1, sizeof *r->rec);
    assert_non_null(r->rec);
    r->capturing = true;
    return 0;
}
static int rcapture_end(struct kern_backend *be, struct kern_graph **out, char *err)
{
    struct replay *r = rp(be);
    r->capturing = false;
    *out = NULL;
    if (r->fail_next_capture) {
        r->fail_next_capture = 0;
        free(r->rec->calls);
        free(r->rec);
        return error_set(err, ERR_INTERNAL, "replay: the recording was broken (injected)");
    }
    r->rec->generation = r->generation;
    *out = r->rec;
    r->rec = NULL;
    r->recordings++;
    return 0;
}
static int rlaunch(struct kern_backend *be, struct kern_graph *g, char *err)
{
    struct replay *r = rp(be);
    if (g->generation != r->generation)
        return error_set(err, ERR_NOT_FOUND, "replay: the memory moved since the recording");
    if (!r->in_step)
        return error_set(err, ERR_INVALID_ARG, "replay: launch outside a step");
    struct kern_backend *c = r->cpu;
    const struct kern_ops *o = c->ops;
    r->launches++;
    for (int i = 0; i < g->n_calls; i++) {
        const struct rcall *k = &g->calls[i];
        struct kern_kv_layout kv = step_layout_now(r, k);
        int rc = 0;
        switch (k->op) {
        case ROP_EMBED: rc = o->embed(c, k->out, k->w, k->dtype, r->step.ids, k->n, k->a, err); break;
        case ROP_RMSNORM: rc = o->rmsnorm(c, k->out, k->in, k->w, k->dtype, k->n, k->a, k->f, err); break;
        case ROP_MATMUL: rc = o->matmul(c, k->out, k->in, k->w, k->dtype, k->n, k->a, k->b, err); break;
        case ROP_ROPE:
            rc = o->rope(c, k->out, r->step.positions, k->n, k->a, k->b, r->step.inv_freq, err);
            break;
        case ROP_KV_STORE:
            rc = o->kv_store(c, k->out, k->out2, k->in, k->in2, k->n, &kv, k->a, err);
            break;
        case ROP_ATTENTION:
            rc = o->attention(c, k->out, k->in, k->in2, k->in3, k->n, &kv, k->a, k->b, k->c, k->f,
                              err);
            break;
        case ROP_SWIGLU: rc = o->swiglu(c, k->out, k->in, k->in2, k->count, err); break;
        case ROP_ADD: rc = o->add(c, k->out, k->in, k->count, err); break;
        }
        if (rc)
            return rc;
    }
    return 0;
}
static void rgraph_destroy(struct kern_backend *be, struct kern_graph *g)
{
    (void)be;
    if (g) {
        free(g->calls);
        free(g);
    }
}

static struct kern_backend *replay_create(void)
{
    char err[ERR_MSG_MAX] = "";
    struct replay *r = calloc(1, sizeof *r);
    assert_non_null(r);
    assert_int_equal(kern_cpu_create(&r->cpu, 1, err), 0);
    r->ops = *r->cpu->ops;
    r->ops.destroy = rdestroy;
    r->ops.alloc = ralloc;
    r->ops.free = rfree;
    r->ops.upload = rupload;
    r->ops.download = rdownload;
    r->ops.copy = rcopy;
    r->ops.map_weights = rmap;
    r->ops.unmap_weights = runmap;
    r->ops.sync = rsync;
    r->ops.map_matrix = r->cpu->ops->map_matrix ? rmap_matrix : NULL;
    r->ops.matmul_argmax = NULL; /* its backend pointer would be ours, not the cpu's */
    r->ops.prepare_argmax = NULL;
    r->ops.embed = rembed;
    r->ops.rmsnorm = rrmsnorm;
    r->ops.matmul = rmatmul;
    r->ops.rope = rrope;
    r->ops.kv_store = rkv_store;
    r->ops.attention = rattention;
    r->ops.swiglu = rswiglu;
    r->ops.add = radd;
    r->ops.matmul_multi = rmatmul_multi;
    r->ops.add_rmsnorm = radd_rmsnorm;
    r->ops.matmul_swiglu = rmatmul_swiglu;
    r->ops.rope_kv_store = rrope_kv_store;
    r->ops.step_reserve = rstep_reserve;
    r->ops.step_begin = rstep_begin;
    r->ops.step_end = rstep_end;
    r->ops.graph_capture_begin = rcapture_begin;
    r->ops.graph_capture_end = rcapture_end;
    r->ops.graph_launch = rlaunch;
    r->ops.graph_destroy = rgraph_destroy;
    r->base.ops = &r->ops;
    r->base.name = "cpu-replay";
    return &r->base;
}

/* ---- the tests ------------------------------------------------------------ */

#define N_SLOTS 4
#define MAX_SEQ 700

struct fx {
    char dir[128];
    struct kern_backend *cpu, *rep;
    struct llama_model *m_cpu, *m_rep;
    struct llama_ctx *plain, *graphs;
    int vocab;
};

static int setup(void **state)
{
    char err[ERR_MSG_MAX] = "";
    struct fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/tandem-test-llama-graphs-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    struct modelgen_params p = {.preset = "tiny", .seed = 5, .force = 1};
    ctx_pair_ok(modelgen_write(f->dir, &p, err), "modelgen_write", err);
    ctx_pair_ok(kern_cpu_create(&f->cpu, 1, err), "kern_cpu_create", err);
    f->rep = replay_create();
    ctx_pair_ok(llama_model_load(&f->m_cpu, f->dir, f->cpu, err), "load (cpu)", err);
    ctx_pair_ok(llama_model_load(&f->m_rep, f->dir, f->rep, err), "load (replay)", err);
    struct llama_ctx_params cp = {.n_slots = N_SLOTS, .max_seq_len = MAX_SEQ};
    ctx_pair_ok(llama_ctx_create(&f->plain, f->m_cpu, &cp, err), "ctx (cpu)", err);
    ctx_pair_ok(llama_ctx_create(&f->graphs, f->m_rep, &cp, err), "ctx (replay)", err);
    f->vocab = llama_model_config(f->m_cpu)->vocab_size;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    llama_ctx_destroy(f->plain);
    llama_ctx_destroy(f->graphs);
    llama_model_destroy(f->m_cpu);
    llama_model_destroy(f->m_rep);
    kern_backend_destroy(f->cpu);
    kern_backend_destroy(f->rep);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

static void same_call(struct fx *f, const int *slots, int n_seqs, int n_tokens, uint32_t seed)
{
    const struct ctx_pair p = {f->plain, f->graphs, f->vocab};
    ctx_pair_call(&p, slots, n_seqs, n_tokens, seed);
}

static void truncate_both(struct fx *f, int slot, int len)
{
    const struct ctx_pair p = {f->plain, f->graphs, f->vocab};
    ctx_pair_truncate(&p, slot, len);
}

static void reset_all(struct fx *f)
{
    for (int s = 0; s < N_SLOTS; s++)
        truncate_both(f, s, 0);
}

/* Prefills, decode and verification rows, one and three sequences, up past
 * 512 positions; more than 64 shapes: the oldest graphs are dropped. */
static void test_replayed_graphs_give_the_plain_logits(void **state)
{
    struct fx *f = *state;
    struct replay *r = rp(f->rep);
    reset_all(f);
    const int one[1] = {0}, three[3] = {1, 2, 3};
    same_call(f, one, 1, 40, 1);
    assert_int_equal(r->recordings, 0); /* a shape seen once runs op by op */
    truncate_both(f, 0, 0);
    same_call(f, one, 1, 40, 1);
    assert_int_equal(r->recordings, 1); /* the second time: recorded and launched */
    assert_int_equal(r->launches, 1);
    same_call(f, three, 3, 9, 2);
    uint32_t seed = 100;
    bool swept_512 = false;
    /* 1..32 rows under the bound 256, each twice (a shape is recorded the
     * second time it comes): 32 shapes */
    for (int rows = 1; rows <= 32; rows++)
        for (int twice = 0; twice < 2; twice++) {
            same_call(f, one, 1, rows, seed++);
            truncate_both(f, 0, 40);
        }
    while (llama_ctx_slot_len(f->plain, 0) < 560) {
        const int len = llama_ctx_slot_len(f->plain, 0);
        if (len > 300 && !swept_512) { /* and 32 more under the bound 512 */
            for (int rows = 1; rows <= 32; rows++)
                for (int twice = 0; twice < 2; twice++) {
                    same_call(f, one, 1, rows, seed++);
                    truncate_both(f, 0, len);
                }
            swept_512 = true;
        }
        const int rows = 1 + (int)(seed % 17);
        same_call(f, one, 1, 1, seed++);
        same_call(f, one, 1, rows, seed++);
        truncate_both(f, 0, len + 1 + rows / 2);
        same_call(f, three, 3, 1, seed++);
        const int rows3 = 1 + (int)(seed % 5);
        same_call(f, three, 3, rows3, seed++);
        for (int s = 1; s <= 3; s++)
            if (llama_ctx_slot_len(f->plain, s) > 300)
                truncate_both(f, s, 9);
    }
    struct llama_graph_stats g;
    llama_ctx_graph_stats(f->graphs, &g);
    print_message("graphs: held %d, recorded %lld, replayed %lld\n", g.held, (long long)g.recorded,
                  (long long)g.replayed);
    assert_true(g.steps && g.graphs);
    assert_true(g.recorded > 64); /* more shapes than a context keeps */
    assert_true(g.held > 32 && g.held <= 64);
    assert_true(g.replayed >= 2 * g.recorded); /* most calls replayed */
    assert_int_equal(r->launches, g.replayed);
    assert_int_equal(r->recordings, g.recorded);
}

/* A launch refused because the memory moved: recorded again, same logits. */
static void test_stale_graphs_are_recorded_again(void **state)
{
    struct fx *f = *state;
    struct replay *r = rp(f->rep);
    reset_all(f);
    const int one[1] = {0};
    same_call(f, one, 1, 12, 3);
    same_call(f, one, 1, 1, 4);
    struct llama_graph_stats before, after;
    llama_ctx_graph_stats(f->graphs, &before);
    r->generation++;
    same_call(f, one, 1, 1, 5);
    same_call(f, one, 1, 1, 6);
    llama_ctx_graph_stats(f->graphs, &after);
    assert_int_equal(after.recorded, before.recorded + 1); /* the 1-row shape, once */
    assert_true(after.graphs);
    assert_int_equal(after.held, 1); /* every stale graph dropped */
}

/* A recording that fails turns graphs off: the chunk runs op by op, the
 * logits unchanged, and no later call records. Last: it leaves graphs off. */
static void test_a_failed_recording_turns_graphs_off(void **state)
{
    struct fx *f = *state;
    struct replay *r = rp(f->rep);
    reset_all(f);
    const int one[1] = {0};
    r->fail_next_capture = 1;
    same_call(f, one, 1, 23, 8); /* a shape never seen: run op by op, noted */
    assert_int_equal(r->fail_next_capture, 1);
    truncate_both(f, 0, 0);
    same_call(f, one, 1, 23, 8); /* seen before: recorded, and that fails */
    assert_int_equal(r->fail_next_capture, 0);
    struct llama_graph_stats g;
    llama_ctx_graph_stats(f->graphs, &g);
    assert_false(g.graphs);
    assert_int_equal(g.held, 0);
    const int recordings = r->recordings, launches = r->launches, steps = r->steps;
    same_call(f, one, 1, 1, 9);
    same_call(f, one, 1, 5, 10);
    assert_int_equal(r->recordings, recordings);
    assert_int_equal(r->launches, launches);
    assert_int_equal(r->steps, steps + 2); /* still device steps */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replayed_graphs_give_the_plain_logits),
        cmocka_unit_test(test_stale_graphs_are_recorded_again),
        cmocka_unit_test(test_a_failed_recording_turns_graphs_off),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
