/* step.cu: device-resident step inputs and CUDA graphs, the step and graph
 * ops of the table (kernels.h: step_reserve .. graph_destroy).
 *
 * A forward step's small host arrays (ids, positions, the frequencies, the
 * KV layout's (sequence, position) pairs and block tables) reach the device
 * in one asynchronous copy from a pinned buffer (two, in turn), into one
 * device buffer.
 * Without a step every op stages its own arrays (cuda_backend_stage2: a
 * copy, an event and a host wait per op, twice per layer for the layout).
 *
 * Why the addresses are fixed: a graph records kernel arguments by value,
 * pointers included. Both buffers are sized once by step_reserve (the
 * largest step of every context on this backend) and move only when a
 * later reservation asks for more, which bumps memory_generation: a graph
 * recorded before is refused at launch (ERR_NOT_FOUND) and recorded again
 * by its owner. Inside the buffer each array's offset depends only on the
 * step's shape (n, sequences, table stride, frequencies), which is part of
 * the key a caller records a graph under (common/model/llama_step.c).
 *
 * The layout is checked once per step (kern_kv_layout_check, and every
 * row's position below the step's max_positions), not once per op.
 *
 * Recording: cudaStreamBeginCapture in thread-local mode on the backend's
 * stream. While recording, nothing may wait, copy from the host or
 * allocate: staging, scratch growth, upload, download, sync and alloc
 * refuse with an error naming the op (cuda_backend.cu), so a recording
 * either holds only the step's kernels or fails.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"

struct kern_graph {
    cudaGraphExec_t exec;
    unsigned long generation; /* the backend's memory_generation when recorded */
};

/* Offsets of the step's arrays in its buffers, from its shape alone. */
struct step_offsets {
    size_t ids, positions, rows, tables, freq, total;
};

static size_t step_align(size_t x) { return (x + 15) & ~(size_t)15; }

static struct step_offsets step_layout(int n, int n_seqs, int table_stride, int n_freq)
{
    struct step_offsets o;
    o.ids = 0;
    o.positions = step_align(o.ids + (size_t)n * sizeof(int32_t));
    o.rows = step_align(o.positions + (size_t)n * sizeof(int32_t));
    o.tables = step_align(o.rows + (size_t)n * 2 * sizeof(int32_t));
    o.freq = step_align(o.tables + (size_t)n_seqs * (size_t)table_stride * sizeof(int32_t));
    o.total = step_align(o.freq + (size_t)n_freq * sizeof(float));
    return o;
}

static int lim_max(int a, int b) { return a > b ? a : b; }

int cuda_step_reserve(struct kern_backend *be, const struct kern_step_limits *lim, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (!lim || lim->max_rows < 1 || lim->max_seqs < 1 || lim->table_stride < 1 ||
        lim->max_positions < 1 || lim->max_freq < 0 || lim->n_heads < 1 || lim->head_dim < 1)
        return error_set(err, ERR_INVALID_ARG, "cuda step_reserve: every limit must be >= 1 "
                         "(max_freq >= 0)");
    if (cb->step.active || cb->capturing)
        return error_set(err, ERR_INVALID_ARG, "cuda step_reserve: called inside a step");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    /* the limits change only once everything they promise is allocated: a
     * failure below leaves the reservation as it was (the step buffers are
     * a few KiB: old and new may coexist) */
    struct kern_step_limits l = cb->step.lim;
    l.max_rows = lim_max(l.max_rows, lim->max_rows);
    l.max_seqs = lim_max(l.max_seqs, lim->max_seqs);
    l.table_stride = lim_max(l.table_stride, lim->table_stride);
    l.max_positions = lim_max(l.max_positions, lim->max_positions);
    l.max_freq = lim_max(l.max_freq, lim->max_freq);
    l.n_heads = lim_max(l.n_heads, lim->n_heads);
    l.head_dim = lim_max(l.head_dim, lim->head_dim);

    const size_t need = step_layout(l.max_rows, l.max_seqs, l.table_stride, l.max_freq).total;
    if (need > cb->step.cap_bytes) {
        void *host[2] = {NULL, NULL}, *dev = NULL;
        cudaError_t e = cudaMallocHost(&host[0], need);
        if (e == cudaSuccess)
            e = cudaMallocHost(&host[1], need);
        if (e == cudaSuccess)
            e = cudaMalloc(&dev, need);
        if (e != cudaSuccess) {
            (void)cudaGetLastError(); /* an allocation failure is not sticky */
            for (int i = 0; i < 2; i++)
                if (host[i])
                    (void)cudaFreeHost(host[i]);
            return cuda_backend_fail(err, e, __func__, "cudaMallocHost/cudaMalloc of the step");
        }
        /* queued kernels and the last copies may still read the old buffers */
        if ((rc = cuda_backend_wait_stream(cb, "cuda step_reserve", err)) < 0) {
            (void)cudaFreeHost(host[0]);
            (void)cudaFreeHost(host[1]);
            (void)cudaFree(dev);
            return rc;
        }
        /* the new buffers in place first, then the old ones freed: a
         * failing free is logged, never leaves the step half swapped */
        void *old_host[2] = {cb->step.host[0], cb->step.host[1]}, *old_dev = cb->step.dev;
        cb->step.host[0] = host[0];
        cb->step.host[1] = host[1];
        cb->step.dev = dev;
        cb->step.cap_bytes = need;
        cb->memory_generation++;
        for (int i = 0; i < 2; i++)
            if (old_host[i] && (e = cudaFreeHost(old_host[i])) != cudaSuccess)
                LOG_ERROR("cuda step_reserve: cudaFreeHost failed: %s", cudaGetErrorString(e));
        if (old_dev && (e = cudaFree(old_dev)) != cudaSuccess)
            LOG_ERROR("cuda step_reserve: cudaFree failed: %s", cudaGetErrorString(e));
    }
    if ((rc = cuda_attention_reserve(cb, l.max_rows, l.n_heads, l.head_dim, l.max_positions,
                                     err)) < 0)
        return rc;
    cb->step.lim = l;
    cb->step.reserved = 1;
    return 0;
}

static int step_check(const struct cuda_backend *cb, const struct kern_step *st, char *err)
{
    const struct kern_step_limits *l = &cb->step.lim;
    if (!cb->step.reserved)
        return error_set(err, ERR_INVALID_ARG, "cuda step_begin: no step_reserve before it");
    if (cb->step.active || cb->capturing)
        return error_set(err, ERR_INVALID_ARG, "cuda step_begin: a step or a recording is open");
    if (!st || !st->ids || !st->positions || !st->kv || (st->n_freq > 0 && !st->inv_freq))
        return error_set(err, ERR_INVALID_ARG, "cuda step_begin: NULL array");
    if (st->n < 1 || st->n > l->max_rows || st->kv->n_seqs > l->max_seqs ||
        st->kv->table_stride > l->table_stride || st->n_freq < 0 || st->n_freq > l->max_freq ||
        st->max_positions < 1 || st->max_positions > l->max_positions)
        return error_set(err, ERR_RANGE,
                         "cuda step_begin: step of %d rows, %d sequences, table stride %d, %d "
                         "frequencies, %d positions exceeds the reservation (%d, %d, %d, %d, %d)",
                         st->n, st->kv->n_seqs, st->kv->table_stride, st->n_freq,
                         st->max_positions, l->max_rows, l->max_seqs, l->table_stride, l->max_freq,
                         l->max_positions);
    int rc = kern_kv_layout_check(st->kv, st->n, "cuda step_begin", err);
    if (rc)
        return rc;
    if (st->kv->path_offset) /* token trees: the cpu backend's alone for now */
        return error_set(err, ERR_UNSUPPORTED,
                         "cuda step_begin: token-tree paths are not supported on cuda");
    for (int i = 0; i < st->n; i++) {
        if (st->ids[i] < 0)
            return error_set(err, ERR_INVALID_ARG, "cuda step_begin: ids[%d] = %d is negative", i,
                             (int)st->ids[i]);
        if (st->kv->rows[2 * i + 1] >= st->max_positions)
            return error_set(err, ERR_RANGE,
                             "cuda step_begin: row %d sits at position %d, past the step's bound "
                             "of %d positions", i, (int)st->kv->rows[2 * i + 1],
                             st->max_positions);
    }
    return 0;
}

int cuda_step_begin(struct kern_backend *be, const struct kern_step *st, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    int rc = step_check(cb, st, err);
    if (rc)
        return rc;
    if ((rc = cuda_backend_enter(cb, err)) < 0)
        return rc;
    const struct kern_kv_layout *kv = st->kv;
    const struct step_offsets o = step_layout(st->n, kv->n_seqs, kv->table_stride, st->n_freq);
    /* the copy out of this pinned buffer two steps back must be done */
    const int hb = cb->step.next;
    if ((rc = cuda_backend_wait_event(cb->step.copied[hb], CUDA_SYNC_TIMEOUT_MS,
                                      "cuda step_begin", err)) < 0)
        return rc;
    char *h = (char *)cb->step.host[hb];
    memcpy(h + o.ids, st->ids, (size_t)st->n * sizeof(int32_t));
    memcpy(h + o.positions, st->positions, (size_t)st->n * sizeof(int32_t));
    memcpy(h + o.rows, kv->rows, (size_t)st->n * 2 * sizeof(int32_t));
    memcpy(h + o.tables, kv->tables, (size_t)kv->n_seqs * (size_t)kv->table_stride * sizeof(int32_t));
    if (st->n_freq > 0)
        memcpy(h + o.freq, st->inv_freq, (size_t)st->n_freq * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(cb->step.dev, h, o.total, cudaMemcpyHostToDevice, cb->stream));
    CUDA_CHECK(cudaEventRecord(cb->step.copied[hb], cb->stream));
    cb->step.next = 1 - hb;
    const char *d = (const char *)cb->step.dev;
    cb->step.in = *st;
    cb->step.kv = *kv;
    cb->step.in.kv = &cb->step.kv;
    cb->step.ids_dev = (const int32_t *)(const void *)(d + o.ids);
    cb->step.positions_dev = (const int32_t *)(const void *)(d + o.positions);
    cb->step.rows_dev = (const int32_t *)(const void *)(d + o.rows);
    cb->step.tables_dev = (const int32_t *)(const void *)(d + o.tables);
    cb->step.freq_dev = (const float *)(const void *)(d + o.freq);
    cb->step.active = 1;
    return 0;
}

void cuda_step_end(struct kern_backend *be) { cuda_backend_of(be)->step.active = 0; }

void cuda_step_release(struct cuda_backend *cb)
{
    for (int i = 0; i < 2; i++) {
        if (cb->step.host[i]) {
            cudaError_t e = cudaFreeHost(cb->step.host[i]);
            if (e != cudaSuccess)
                LOG_ERROR("cuda_step_release: cudaFreeHost failed: %s", cudaGetErrorString(e));
        }
        if (cb->step.copied[i]) {
            cudaError_t e = cudaEventDestroy(cb->step.copied[i]);
            if (e != cudaSuccess)
                LOG_ERROR("cuda_step_release: cudaEventDestroy failed: %s", cudaGetErrorString(e));
        }
    }
    if (cb->step.dev) {
        cudaError_t e = cudaFree(cb->step.dev);
        if (e != cudaSuccess)
            LOG_ERROR("cuda_step_release: cudaFree failed: %s", cudaGetErrorString(e));
    }
    memset(&cb->step, 0, sizeof cb->step);
}

/* ---- what the ops ask ----------------------------------------------------- */

const int32_t *cuda_step_ids(const struct cuda_backend *cb, const int32_t *ids, int n)
{
    const struct cuda_step *s = &cb->step;
    return s->active && ids == s->in.ids && n == s->in.n ? s->ids_dev : NULL;
}

int cuda_step_rope(const struct cuda_backend *cb, const int32_t *positions, int n,
                   const float *inv_freq, int n_freq, const int32_t **positions_dev,
                   const float **freq_dev)
{
    const struct cuda_step *s = &cb->step;
    if (!s->active || positions != s->in.positions || n != s->in.n ||
        inv_freq != s->in.inv_freq || n_freq > s->in.n_freq)
        return 0;
    *positions_dev = s->positions_dev;
    *freq_dev = s->freq_dev;
    return 1;
}

int cuda_step_layout(const struct cuda_backend *cb, const struct kern_kv_layout *kv, int n,
                     const int32_t **rows_dev, const int32_t **tables_dev, int *max_positions)
{
    const struct cuda_step *s = &cb->step;
    if (!s->active || !kv || n != s->in.n || kv->rows != s->kv.rows ||
        kv->tables != s->kv.tables || kv->n_seqs != s->kv.n_seqs ||
        kv->table_stride != s->kv.table_stride || kv->block_size != s->kv.block_size ||
        kv->n_blocks != s->kv.n_blocks)
        return 0;
    *rows_dev = s->rows_dev;
    *tables_dev = s->tables_dev;
    *max_positions = s->in.max_positions;
    return 1;
}

/* ---- graphs ---------------------------------------------------------------- */

int cuda_graph_capture_begin(struct kern_backend *be, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (cb->capturing)
        return error_set(err, ERR_INVALID_ARG, "cuda graph_capture_begin: already recording");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    CUDA_CHECK(cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal));
    cb->capturing = 1;
    return 0;
}

int cuda_graph_capture_end(struct kern_backend *be, struct kern_graph **out, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    *out = NULL;
    if (!cb->capturing)
        return error_set(err, ERR_INVALID_ARG, "cuda graph_capture_end: not recording");
    cb->capturing = 0;
    /* the device is current: graph_capture_begin made it so on this thread,
     * and the capture must end here whatever else fails */
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &graph);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* a broken recording is not a sticky error */
        if (graph)
            (void)cudaGraphDestroy(graph);
        return cuda_backend_fail(err, e, __func__, "cudaStreamEndCapture");
    }
    struct kern_graph *g = (struct kern_graph *)calloc(1, sizeof *g);
    if (!g) {
        (void)cudaGraphDestroy(graph);
        return error_set(err, ERR_NOMEM, "cuda graph_capture_end: out of memory");
    }
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    cudaError_t e2 = cudaGraphDestroy(graph);
    if (e != cudaSuccess || e2 != cudaSuccess) {
        if (e == cudaSuccess)
            (void)cudaGraphExecDestroy(g->exec);
        free(g);
        return cuda_backend_fail(err, e != cudaSuccess ? e : e2, __func__,
                                 "cudaGraphInstantiate/cudaGraphDestroy");
    }
    g->generation = cb->memory_generation;
    *out = g;
    return 0;
}

int cuda_graph_launch(struct kern_backend *be, struct kern_graph *g, char *err)
{
    struct cuda_backend *cb = cuda_backend_of(be);
    if (!g)
        return error_set(err, ERR_INVALID_ARG, "cuda graph_launch: NULL graph");
    if (cb->capturing)
        return error_set(err, ERR_INVALID_ARG, "cuda graph_launch: called while recording");
    if (g->generation != cb->memory_generation)
        return error_set(err, ERR_NOT_FOUND, "cuda graph_launch: the memory the graph reads "
                         "moved after it was recorded (a larger reservation): record it again");
    int rc = cuda_backend_enter(cb, err);
    if (rc < 0)
        return rc;
    CUDA_CHECK(cudaGraphLaunch(g->exec, cb->stream));
    return 0;
}

void cuda_graph_destroy(struct kern_backend *be, struct kern_graph *g)
{
    if (!g)
        return;
    struct cuda_backend *cb = cuda_backend_of(be);
    char err[ERR_MSG_MAX] = "";
    /* a launch may still run it: wait, bounded like every wait here */
    int rc = cuda_backend_enter(cb, err);
    if (rc == 0 && !cb->capturing)
        rc = cuda_backend_wait_stream(cb, "cuda graph_destroy", err);
    if (rc != 0) {
        LOG_ERROR("cuda_graph_destroy: %s (the graph is left allocated)", err);
        free(g);
        return;
    }
    cudaError_t e = cudaGraphExecDestroy(g->exec);
    if (e != cudaSuccess)
        LOG_ERROR("cuda_graph_destroy: cudaGraphExecDestroy failed: %s", cudaGetErrorString(e));
    free(g);
}
