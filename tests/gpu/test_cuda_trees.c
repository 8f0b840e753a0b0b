/* test_cuda_trees.c: token trees on the CUDA backend (kernels/cuda/
 * attention.cu's path indirection; docs/token-trees.md), the GPU twin of
 * tests/unit/test_tree_attention.c's first two tests: every node of random
 * trees of 1..32 nodes gets, bit for bit, the logits the GPU gives linear
 * decoding of its path, over contexts that put the paths across attention's
 * 256-position splits, with a chain beside it in the call; and after random
 * trees with random accepted paths, the next step's logits are linear
 * decoding's of the same output.
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
#include <unistd.h>

#include <cmocka.h>

#include "error.h"
#include "gpu_skip.h"
#include "kernels.h"
#include "kernels_cuda.h"
#include "llama.h"
#include "modelgen.h"

#define MAX_SEQ 700

static void ok(int rc, const char *what, const char *err)
{
    if (rc)
        fail_msg("%s returned %d: %s", what, rc, err);
}

static const char *device(void)
{
    const char *d = getenv("TANDEM_CUDA_DEVICE");
    return d && *d ? d : "0";
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rng_int(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

static void feed(struct llama_ctx *ctx, int slot, const int32_t *t, int n, int n_logits, float *out)
{
    if (n == 0)
        return;
    char err[ERR_MSG_MAX] = "";
    struct llama_seq_batch b = {.slot = slot, .tokens = t, .n_tokens = n, .n_logits = n_logits,
                                .logits_out = out};
    ok(llama_forward(ctx, &b, 1, err), "llama_forward (chain)", err);
}

static int path_of(const int32_t *parents, int i, int32_t *path)
{
    int32_t up[LLAMA_TREE_MAX];
    int d = 0;
    for (int32_t v = i; v >= 0; v = parents[v])
        up[d++] = v;
    for (int j = 0; j < d; j++)
        path[j] = up[d - 1 - j];
    return d;
}

static void random_tree(int32_t *parents, int n, uint64_t *rng)
{
    const int chainy = rng_int(rng, 2);
    for (int i = 0; i < n; i++)
        parents[i] = chainy && rng_int(rng, 3) ? i - 1 : rng_int(rng, i + 1) - 1;
}

struct fixture {
    char dir[256];
    struct kern_backend *gpu;
    struct llama_model *model;
    struct llama_ctx *tree, *lin;
    int vocab;
};

static int setup(void **state)
{
    char err[ERR_MSG_MAX] = "";
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    snprintf(f->dir, sizeof f->dir, "/tmp/tandem-test-cuda-trees-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    struct modelgen_params p = {.preset = "tiny", .seed = 3, .force = 1};
    ok(modelgen_write(f->dir, &p, err), "modelgen_write", err);
    ok(kern_backend_create(&f->gpu, "cuda", device(), 0, err), "kern_backend_create", err);
    ok(llama_model_load(&f->model, f->dir, f->gpu, err), "llama_model_load", err);
    struct llama_ctx_params cp = {.n_slots = 2, .max_seq_len = MAX_SEQ, .kv_block_size = 16,
                                  .prefix_cache = true};
    ok(llama_ctx_create(&f->tree, f->model, &cp, err), "llama_ctx_create", err);
    cp.n_slots = 1;
    cp.prefix_cache = false;
    ok(llama_ctx_create(&f->lin, f->model, &cp, err), "llama_ctx_create", err);
    f->vocab = llama_model_config(f->model)->vocab_size;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    llama_ctx_destroy(f->tree);
    llama_ctx_destroy(f->lin);
    llama_model_destroy(f->model);
    kern_backend_destroy(f->gpu);
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(f);
    return 0;
}

/* Trees of 1..32 nodes after contexts of 0..599 positions (many paths
 * across a split at 256 or 512), a chain of 1..16 rows beside each. */
static void test_cuda_tree_nodes_are_their_paths_bit_for_bit(void **state)
{
    struct fixture *f = *state;
    const int V = f->vocab;
    char err[ERR_MSG_MAX] = "";
    uint64_t rng = 11;
    int32_t *ctx_toks = malloc(MAX_SEQ * sizeof(int32_t));
    float *got = malloc((size_t)LLAMA_TREE_MAX * V * sizeof(float));
    float *want = malloc((size_t)V * sizeof(float));
    float *chain_got = malloc((size_t)16 * V * sizeof(float));
    float *chain_want = malloc((size_t)16 * V * sizeof(float));
    for (int n = 1; n <= LLAMA_TREE_MAX; n++)
        for (int rep = 0; rep < 3; rep++) {
            int32_t tokens[LLAMA_TREE_MAX], parents[LLAMA_TREE_MAX], chain[16], path[LLAMA_TREE_MAX];
            const int L = rep == 0 ? 256 - 1 - rng_int(&rng, 20) : rng_int(&rng, 600);
            for (int i = 0; i < L; i++)
                ctx_toks[i] = rng_int(&rng, V);
            for (int i = 0; i < n; i++)
                tokens[i] = rng_int(&rng, V);
            random_tree(parents, n, &rng);
            const int cn = 1 + rng_int(&rng, 16);
            for (int i = 0; i < cn; i++)
                chain[i] = rng_int(&rng, V);
            for (int s = 0; s < 2; s++)
                ok(llama_ctx_truncate(f->tree, s, 0, err), "truncate", err);
            feed(f->tree, 0, ctx_toks, L, 0, NULL);
            feed(f->tree, 1, ctx_toks, L / 2, 0, NULL);
            struct llama_seq_batch b[2] = {
                {.slot = 1, .tokens = chain, .n_tokens = cn, .n_logits = cn,
                 .logits_out = chain_got},
                {.slot = 0, .tokens = tokens, .n_tokens = n, .n_logits = n, .logits_out = got,
                 .parents = parents}};
            ok(llama_forward(f->tree, b, 2, err), "llama_forward (tree)", err);
            ok(llama_ctx_kv_check(f->tree, err), "llama_ctx_kv_check", err);
            /* the chain beside it, alone */
            ok(llama_ctx_truncate(f->lin, 0, 0, err), "truncate", err);
            feed(f->lin, 0, ctx_toks, L / 2, 0, NULL);
            feed(f->lin, 0, chain, cn, cn, chain_want);
            if (memcmp(chain_got, chain_want, (size_t)cn * V * sizeof(float)))
                fail_msg("tree of %d: the chain of %d rows beside it differs", n, cn);
            ok(llama_ctx_truncate(f->lin, 0, 0, err), "truncate", err);
            feed(f->lin, 0, ctx_toks, L, 0, NULL);
            for (int i = 0; i < n; i++) {
                int32_t toks[LLAMA_TREE_MAX];
                const int d = path_of(parents, i, path);
                for (int j = 0; j < d; j++)
                    toks[j] = tokens[path[j]];
                feed(f->lin, 0, toks, d, 1, want);
                ok(llama_ctx_truncate(f->lin, 0, L, err), "truncate", err);
                if (memcmp(got + (size_t)i * V, want, (size_t)V * sizeof(float)))
                    fail_msg("tree of %d over %d positions: node %d (depth %d) differs from its "
                             "path's linear decoding", n, L, i, d);
            }
            ok(llama_ctx_truncate(f->tree, 0, L, err), "truncate", err);
        }
    free(ctx_toks);
    free(got);
    free(want);
    free(chain_got);
    free(chain_want);
}

/* 200 rounds of a random tree and a random accepted path (0 .. its depth):
 * every 10 rounds the next step's logits equal linear decoding's of the
 * same output. */
static void test_cuda_tree_rounds_leave_linear_decodings_kv(void **state)
{
    struct fixture *f = *state;
    const int V = f->vocab;
    char err[ERR_MSG_MAX] = "";
    uint64_t rng = 12;
    int32_t *out = malloc(MAX_SEQ * sizeof(int32_t));
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    ok(llama_ctx_truncate(f->tree, 0, 0, err), "truncate", err);
    ok(llama_ctx_truncate(f->lin, 0, 0, err), "truncate", err);
    int len = 0;
    for (int round = 0; round < 200; round++) {
        if (len + LLAMA_TREE_MAX + 2 > MAX_SEQ) {
            ok(llama_ctx_truncate(f->tree, 0, 0, err), "truncate", err);
            ok(llama_ctx_truncate(f->lin, 0, 0, err), "truncate", err);
            len = 0;
        }
        if (len == 0) {
            for (int i = 0; i < 5; i++)
                out[i] = rng_int(&rng, V);
            feed(f->tree, 0, out, 5, 0, NULL);
            feed(f->lin, 0, out, 5, 0, NULL);
            len = 5;
        }
        int32_t tokens[LLAMA_TREE_MAX], parents[LLAMA_TREE_MAX], path[LLAMA_TREE_MAX];
        const int n = 1 + rng_int(&rng, LLAMA_TREE_MAX);
        for (int i = 0; i < n; i++)
            tokens[i] = rng_int(&rng, V);
        random_tree(parents, n, &rng);
        const struct llama_seq_batch tb = {.slot = 0, .tokens = tokens, .n_tokens = n,
                                           .parents = parents};
        ok(llama_forward(f->tree, &tb, 1, err), "llama_forward (tree)", err);
        const int d = path_of(parents, rng_int(&rng, n), path);
        const int keep = rng_int(&rng, d + 1);
        ok(llama_ctx_tree_accept(f->tree, 0, path, keep, err), "llama_ctx_tree_accept", err);
        ok(llama_ctx_kv_check(f->tree, err), "llama_ctx_kv_check", err);
        for (int j = 0; j < keep; j++)
            out[len + j] = tokens[path[j]];
        feed(f->lin, 0, out + len, keep, 0, NULL);
        len += keep;
        if (round % 10 == 9) {
            const int32_t next = rng_int(&rng, V);
            feed(f->tree, 0, &next, 1, 1, a);
            feed(f->lin, 0, &next, 1, 1, b);
            if (memcmp(a, b, (size_t)V * sizeof(float)))
                fail_msg("round %d: the step after differs from linear decoding's", round);
            ok(llama_ctx_truncate(f->tree, 0, len, err), "truncate", err);
            ok(llama_ctx_truncate(f->lin, 0, len, err), "truncate", err);
        }
    }
    free(out);
    free(a);
    free(b);
}

int main(void)
{
    const int skip = gpu_skip_without_device();
    if (skip)
        return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_tree_nodes_are_their_paths_bit_for_bit),
        cmocka_unit_test(test_cuda_tree_rounds_leave_linear_decodings_kv),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
