/* test_cuda_graphs.c: device steps and CUDA graphs (kernels/cuda/step.cu,
 * common/model/llama_step.c) give the bits of the eager run.
 *
 * Two contexts on one model on the GPU, one replaying graphs and one with
 * no_graphs, take the same calls: prefills, decode steps of one and of
 * three sequences, verifications of 2..17 rows, positions across the
 * attention bound's 256 and 512 (new shapes, new recordings), a truncation
 * and a re-feed. After every call the logits of both are compared bit for
 * bit, and the graph context must have replayed graphs (a test that never
 * replays proves nothing). Then: a larger reservation on the same backend
 * moves the step memory, the old graphs are refused and recorded again,
 * still equal; and the backend refuses, while recording, an op handed host
 * arrays that are not the step's (it could not be replayed).
 *
 * Exits 77 ("SKIPPED: no CUDA device") where no device is visible.
 * TANDEM_CUDA_DEVICE selects the device (default "0").
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
#include "kernels_cuda.h"
#include "gpu_skip.h"
#include "llama.h"
#include "modelgen.h"
#include "ctx_pair.h"

#define N_SLOTS 4
#define MAX_SEQ 700

struct graphs_fixture {
    char dir[256];
    struct kern_backend *gpu;
    struct llama_model *model;
    struct llama_ctx *graphs, *eager;
    int vocab;
};

static const char *device(void)
{
    const char *d = getenv("TANDEM_CUDA_DEVICE");
    return d && *d ? d : "0";
}

static int setup(void **state)
{
    char err[ERR_MSG_MAX] = "";
    struct graphs_fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/tandem-test-graphs-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    struct modelgen_params p = {.preset = "tiny", .seed = 3, .force = 1};
    ctx_pair_ok(modelgen_write(f->dir, &p, err), "modelgen_write", err);
    ctx_pair_ok(kern_backend_create(&f->gpu, "cuda", device(), 0, err), "kern_backend_create", err);
    ctx_pair_ok(llama_model_load(&f->model, f->dir, f->gpu, err), "llama_model_load", err);
    struct llama_ctx_params cp = {.n_slots = N_SLOTS, .max_seq_len = MAX_SEQ};
    ctx_pair_ok(llama_ctx_create(&f->graphs, f->model, &cp, err), "llama_ctx_create (graphs)", err);
    cp.no_graphs = true;
    ctx_pair_ok(llama_ctx_create(&f->eager, f->model, &cp, err), "llama_ctx_create (eager)", err);
    f->vocab = llama_model_config(f->model)->vocab_size;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct graphs_fixture *f = *state;
    llama_ctx_destroy(f->graphs);
    llama_ctx_destroy(f->eager);
    llama_model_destroy(f->model);
    kern_backend_destroy(f->gpu);
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

/* The eager context is the reference, the graph context under test. */
static void same_call(struct graphs_fixture *f, const int *slots, int n_seqs, int n_tokens,
                      uint32_t seed)
{
    const struct ctx_pair p = {f->eager, f->graphs, f->vocab};
    ctx_pair_call(&p, slots, n_seqs, n_tokens, seed);
}

static void truncate_both(struct graphs_fixture *f, int slot, int len)
{
    const struct ctx_pair p = {f->eager, f->graphs, f->vocab};
    ctx_pair_truncate(&p, slot, len);
}

static void test_graph_replay_equals_eager(void **state)
{
    struct graphs_fixture *f = *state;
    const int one[1] = {0}, three[3] = {1, 2, 3};
    same_call(f, one, 1, 40, 1);   /* a 40-row prefill: a graph of its own */
    same_call(f, three, 3, 9, 2);  /* three prompts in one chunk */
    uint32_t seed = 100;
    /* decode and verification, slot 0 up past 256 and 512 positions */
    while (llama_ctx_slot_len(f->graphs, 0) < 540) {
        const int len = llama_ctx_slot_len(f->graphs, 0);
        const int rows = 1 + (int)(seed % 17); /* 1..17 rows */
        same_call(f, one, 1, 1, seed++);
        same_call(f, one, 1, rows, seed++);
        /* a rejected tail rolls back, as speculation does */
        truncate_both(f, 0, len + 1 + (rows > 2 ? rows / 2 : 0));
        same_call(f, three, 3, 1, seed++); /* a batch of three decode rows */
        const int rows3 = 1 + (int)(seed % 5);
        same_call(f, three, 3, rows3, seed++);
        for (int s = 1; s <= 3; s++)
            if (llama_ctx_slot_len(f->graphs, s) > 300)
                truncate_both(f, s, 9);
    }
    struct llama_graph_stats g, e;
    llama_ctx_graph_stats(f->graphs, &g);
    llama_ctx_graph_stats(f->eager, &e);
    print_message("graphs: held %d, recorded %lld, replayed %lld\n", g.held,
                  (long long)g.recorded, (long long)g.replayed);
    assert_true(g.steps && g.graphs);
    assert_true(g.recorded >= 3);            /* bounds 256, 512, 700 and many row counts */
    assert_true(g.replayed >= 2 * g.recorded); /* most calls replay */
    assert_true(e.steps && !e.graphs);
    assert_int_equal(e.recorded, 0);
    assert_int_equal(e.replayed, 0);
}

/* A context with a larger reservation on the same backend moves the step
 * memory: the graph context's graphs are stale, recorded again, and still
 * give the eager bits. */
static void test_graphs_recorded_again_after_the_memory_moved(void **state)
{
    struct graphs_fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    const int one[1] = {0};
    same_call(f, one, 1, 3, 7);
    struct llama_graph_stats before, after;
    llama_ctx_graph_stats(f->graphs, &before);
    struct llama_ctx *big;
    struct llama_ctx_params cp = {.n_slots = 64, .max_seq_len = 2048, .max_rows = 512};
    ctx_pair_ok(llama_ctx_create(&big, f->model, &cp, err), "llama_ctx_create (big)", err);
    same_call(f, one, 1, 3, 8);
    same_call(f, one, 1, 1, 9);
    llama_ctx_graph_stats(f->graphs, &after);
    assert_true(after.recorded > before.recorded);
    assert_true(after.graphs);
    llama_ctx_destroy(big);
}

/* While recording, an op handed host arrays other than the step's is
 * refused (a replay would read stale copies), and the recording ends
 * cleanly. */
static void test_recording_refuses_foreign_host_arrays(void **state)
{
    struct graphs_fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    struct kern_backend *be = f->gpu;
    float *out = NULL;
    ctx_pair_ok(be->ops->alloc(be, 4 * 64 * sizeof(float), (void **)&out, err), "alloc", err);
    const uint16_t table[4 * 64] = {0};
    const void *table_dev = NULL;
    ctx_pair_ok(be->ops->map_weights(be, table, sizeof table, &table_dev, err), "map_weights", err);
    const int32_t ids[2] = {1, 2};
    ctx_pair_ok(be->ops->graph_capture_begin(be, err), "graph_capture_begin", err);
    const int rc = be->ops->embed(be, out, table_dev, KERN_DTYPE_BF16, ids, 2, 64, err);
    assert_int_equal(rc, ERR_INVALID_ARG);
    assert_non_null(strstr(err, "graph"));
    const int rc_sync = be->ops->sync(be, err);
    assert_int_equal(rc_sync, ERR_INVALID_ARG);
    struct kern_graph *g = NULL;
    ctx_pair_ok(be->ops->graph_capture_end(be, &g, err), "graph_capture_end", err);
    be->ops->graph_destroy(be, g);
    /* outside a recording the same call runs */
    ctx_pair_ok(be->ops->embed(be, out, table_dev, KERN_DTYPE_BF16, ids, 2, 64, err), "embed", err);
    ctx_pair_ok(be->ops->sync(be, err), "sync", err);
    be->ops->unmap_weights(be, table_dev);
    be->ops->free(be, out);
}

int main(void)
{
    if (gpu_skip_without_device())
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graph_replay_equals_eager),
        cmocka_unit_test(test_graphs_recorded_again_after_the_memory_moved),
        cmocka_unit_test(test_recording_refuses_foreign_host_arrays),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
