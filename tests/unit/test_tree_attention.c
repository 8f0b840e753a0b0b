/* test_tree_attention.c: token trees in llama_forward (docs/token-trees.md,
 * steps 1 and 2): every node's logits are bit for bit those of linear
 * decoding of its path, whatever the tree's shape, the context's blocks
 * (prefix-cached or not), the chunking and the sequences beside it; after
 * any run of trees and accepted paths the KV cache is, bit for bit, the one
 * linear decoding of the same output writes, the prefix cache names only
 * accepted tokens; malformed trees are refused and change nothing.
 *
 * Models: the `tiny` and `tiny-draft` presets (head size 16: the kernels'
 * vector paths over V) and one written here with head size 8 (V's scalar
 * column loop). The KV cache is read through llama_private.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "llama_private.h"
#include "modelgen.h"
#include "safetensors.h"

/* ---- fixtures ---- */

struct model_fixture {
    const char *name;
    char dir[256];
    struct kern_backend *be;
    struct llama_model *model;
    int vocab;
};

static void ok(int rc, const char *what, const char *err)
{
    if (rc)
        fail_msg("%s returned %d: %s", what, rc, err);
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rng_int(uint64_t *s, int n) { return (int)(rng_next(s) % (uint64_t)n); }

/* A Llama of head size 8 (6 query heads over 2 kv heads), f32 weights. */
static void write_hd8_model(const char *dir, uint64_t seed)
{
    enum { VOCAB = 97, DIM = 48, LAYERS = 2, HEADS = 6, KV_HEADS = 2, HD = 8, FF = 80 };
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"hidden_act\":"
            "\"silu\",\"vocab_size\":%d,\"hidden_size\":%d,\"intermediate_size\":%d,"
            "\"num_hidden_layers\":%d,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
            "\"head_dim\":%d,\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-5,"
            "\"rope_theta\":10000.0,\"rope_scaling\":null,\"tie_word_embeddings\":true,"
            "\"bos_token_id\":1,\"eos_token_id\":[2]}",
            VOCAB, DIM, FF, LAYERS, HEADS, KV_HEADS, HD);
    fclose(f);
    struct { const char *suffix; int rows, cols; float scale, offset; } kinds[] = {
        {"input_layernorm", DIM, 0, 0.1f, 1.0f},
        {"self_attn.q_proj", HEADS * HD, DIM, 0.3f, 0.0f},
        {"self_attn.k_proj", KV_HEADS * HD, DIM, 0.3f, 0.0f},
        {"self_attn.v_proj", KV_HEADS * HD, DIM, 0.3f, 0.0f},
        {"self_attn.o_proj", DIM, HEADS * HD, 0.2f, 0.0f},
        {"post_attention_layernorm", DIM, 0, 0.1f, 1.0f},
        {"mlp.gate_proj", FF, DIM, 0.15f, 0.0f},
        {"mlp.up_proj", FF, DIM, 0.15f, 0.0f},
        {"mlp.down_proj", DIM, FF, 0.1f, 0.0f},
    };
    enum { N_KINDS = sizeof kinds / sizeof kinds[0], N = 2 + LAYERS * N_KINDS };
    struct safetensors_entry e[N];
    char names[N][96];
    float *data[N];
    uint64_t rng = seed;
    int ne = 0;
    for (int t = -2; t < LAYERS * N_KINDS; t++) {
        int rows, cols;
        float scale, offset;
        if (t == -2) {
            snprintf(names[ne], 96, "model.embed_tokens.weight");
            rows = VOCAB, cols = DIM, scale = 1.0f, offset = 0.0f;
        } else if (t == -1) {
            snprintf(names[ne], 96, "model.norm.weight");
            rows = DIM, cols = 0, scale = 0.1f, offset = 1.0f;
        } else {
            snprintf(names[ne], 96, "model.layers.%d.%s.weight", t / N_KINDS,
                     kinds[t % N_KINDS].suffix);
            rows = kinds[t % N_KINDS].rows, cols = kinds[t % N_KINDS].cols;
            scale = kinds[t % N_KINDS].scale, offset = kinds[t % N_KINDS].offset;
        }
        const size_t count = (size_t)rows * (size_t)(cols ? cols : 1);
        data[ne] = malloc(count * sizeof(float));
        assert_non_null(data[ne]);
        for (size_t i = 0; i < count; i++)
            data[ne][i] = offset + scale * ((float)rng_int(&rng, 2001) / 1000.0f - 1.0f);
        e[ne] = (struct safetensors_entry){.name = names[ne], .dtype = KERN_DTYPE_F32,
                                           .n_dims = cols ? 2 : 1, .shape = {rows, cols},
                                           .data = data[ne]};
        ne++;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char err[ERR_MSG_MAX] = "";
    ok(safetensors_write(path, e, (size_t)ne, err), "safetensors_write", err);
    for (int i = 0; i < ne; i++)
        free(data[i]);
}

static void fixture_open(struct model_fixture *m, const char *preset, uint64_t seed)
{
    char err[ERR_MSG_MAX] = "";
    snprintf(m->dir, sizeof m->dir, "/tmp/tandem-test-tree-XXXXXX");
    assert_non_null(mkdtemp(m->dir));
    m->name = preset ? preset : "hd8";
    if (preset) {
        struct modelgen_params p = {.preset = preset, .seed = seed, .force = 1};
        ok(modelgen_write(m->dir, &p, err), "modelgen_write", err);
    } else {
        write_hd8_model(m->dir, seed);
    }
    ok(kern_cpu_create(&m->be, 2, err), "kern_cpu_create", err);
    ok(llama_model_load(&m->model, m->dir, m->be, err), "llama_model_load", err);
    m->vocab = llama_model_config(m->model)->vocab_size;
}

static void fixture_close(struct model_fixture *m)
{
    llama_model_destroy(m->model);
    m->be->ops->destroy(m->be);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", m->dir);
    assert_int_equal(system(cmd), 0);
}

static struct llama_ctx *ctx_new(struct model_fixture *m, const struct llama_ctx_params *p)
{
    char err[ERR_MSG_MAX] = "";
    struct llama_ctx *ctx = NULL;
    ok(llama_ctx_create(&ctx, m->model, p, err), "llama_ctx_create", err);
    return ctx;
}

static void kv_clean(const struct llama_ctx *ctx, const char *when)
{
    char err[ERR_MSG_MAX] = "";
    if (llama_ctx_kv_check(ctx, err))
        fail_msg("kv cache after %s: %s", when, err);
}

static void random_ids(int32_t *t, int n, int vocab, uint64_t *rng)
{
    for (int i = 0; i < n; i++)
        t[i] = rng_int(rng, vocab);
}

/* Chain forward of n tokens on slot; logits of the last n_logits rows into
 * out (may be NULL with n_logits 0). */
static void feed(struct llama_ctx *ctx, int slot, const int32_t *t, int n, int n_logits, float *out)
{
    if (n == 0)
        return;
    char err[ERR_MSG_MAX] = "";
    struct llama_seq_batch b = {.slot = slot, .tokens = t, .n_tokens = n, .n_logits = n_logits,
                                .logits_out = out};
    ok(llama_forward(ctx, &b, 1, err), "llama_forward (chain)", err);
}

/* A random tree of n nodes: each node's parent is the node before it, a
 * random earlier node, or the root, in proportions that vary by shape so
 * that chains, bushes and stars all come. */
static void random_tree(int32_t *parents, int n, uint64_t *rng)
{
    const int shape = rng_int(rng, 4);
    for (int i = 0; i < n; i++) {
        const int r = rng_int(rng, 100);
        if (shape == 0)
            parents[i] = i - 1; /* a chain */
        else if (shape == 1)
            parents[i] = r < 30 ? -1 : i - 1 - rng_int(rng, i < 3 ? i + 1 : 3);
        else if (shape == 2)
            parents[i] = rng_int(rng, i + 1) - 1;
        else
            parents[i] = r < 60 ? i - 1 : rng_int(rng, i + 1) - 1;
    }
}

/* Node i's path (root child first, i last) into path; returns its depth. */
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

/* The logits linear decoding gives node i: the context, then its path's
 * tokens as a chain, on ref's slot 0 (left holding the context again). */
static void linear_logits(struct llama_ctx *ref, int L, const int32_t *tokens,
                          const int32_t *parents, int i, float *out)
{
    char err[ERR_MSG_MAX] = "";
    int32_t path[LLAMA_TREE_MAX], toks[LLAMA_TREE_MAX];
    const int d = path_of(parents, i, path);
    for (int j = 0; j < d; j++)
        toks[j] = tokens[path[j]];
    feed(ref, 0, toks, d, 1, out);
    ok(llama_ctx_truncate(ref, 0, L, err), "llama_ctx_truncate", err);
}

/* ---- (a) every node's logits are its path's, bit for bit ---- */

struct tree_case {
    int block_size, max_rows;
    int prefix_cache; /* the tree's context mapped from blocks another slot published */
    int n_chains;     /* chain sequences in the same call */
};

/* One model through every tree size 1..32 (two random trees each) on each
 * configuration of the table. */
static void check_nodes_match_paths(const char *preset, uint64_t seed)
{
    static const struct tree_case cases[] = {
        {16, 256, 0, 0}, /* a tree alone, in one chunk */
        {4, 256, 0, 2},  /* small blocks: paths cross them; two chains beside */
        {8, 256, 1, 1},  /* the context from the prefix cache, a chain beside */
        {4, 7, 1, 2},    /* chunks of 7 rows: a tree split across chunks */
    };
    struct model_fixture m;
    fixture_open(&m, preset, seed);
    const int V = m.vocab;
    char err[ERR_MSG_MAX] = "";
    uint64_t rng = seed * 7919;
    struct llama_ctx_params pr = {.n_slots = 1, .max_seq_len = 160, .kv_block_size = 16};
    struct llama_ctx *ref = ctx_new(&m, &pr);
    float *want = malloc((size_t)V * sizeof(float));
    float *got = malloc((size_t)LLAMA_TREE_MAX * V * sizeof(float));
    float *chain_want[2], *chain_got[2];
    for (int c = 0; c < 2; c++) {
        chain_want[c] = malloc((size_t)20 * V * sizeof(float));
        chain_got[c] = malloc((size_t)20 * V * sizeof(float));
    }
    long nodes = 0, off_path = 0;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const struct tree_case *tc = &cases[ci];
        struct llama_ctx_params p = {.n_slots = 4, .max_seq_len = 160,
                                     .kv_block_size = tc->block_size, .max_rows = tc->max_rows,
                                     .prefix_cache = tc->prefix_cache};
        struct llama_ctx *ctx = ctx_new(&m, &p);
        for (int n = 1; n <= LLAMA_TREE_MAX; n++)
            for (int rep = 0; rep < 2; rep++) {
                int32_t ctx_toks[96], tokens[LLAMA_TREE_MAX], parents[LLAMA_TREE_MAX];
                const int L = rng_int(&rng, 50) + (tc->prefix_cache ? 2 * tc->block_size : 0);
                random_ids(ctx_toks, L, V, &rng);
                random_ids(tokens, n, V, &rng);
                random_tree(parents, n, &rng);
                /* the tree's slot 0: its context computed, or (prefix_cache)
                 * its full blocks mapped from slot 3, which computed them */
                for (int s = 0; s < 4; s++)
                    ok(llama_ctx_truncate(ctx, s, 0, err), "llama_ctx_truncate", err);
                int mapped = 0;
                if (tc->prefix_cache) {
                    feed(ctx, 3, ctx_toks, L, 0, NULL);
                    mapped = llama_ctx_prefix_map(ctx, 0, ctx_toks, L, L);
                    assert_true(mapped >= 2 * tc->block_size);
                }
                feed(ctx, 0, ctx_toks + mapped, L - mapped, 0, NULL);
                /* the chains beside it: their own contexts, then 1..20 rows */
                struct llama_seq_batch b[3];
                int nb = 0;
                b[nb++] = (struct llama_seq_batch){.slot = 0, .tokens = tokens, .n_tokens = n,
                                                   .n_logits = n, .logits_out = got,
                                                   .parents = parents};
                int32_t chain_toks[2][40];
                int chain_ctx[2], chain_n[2];
                for (int c = 0; c < tc->n_chains; c++) {
                    chain_ctx[c] = rng_int(&rng, 20);
                    chain_n[c] = 1 + rng_int(&rng, 20);
                    random_ids(chain_toks[c], chain_ctx[c] + chain_n[c], V, &rng);
                    ok(llama_ctx_truncate(ref, 0, 0, err), "llama_ctx_truncate", err);
                    feed(ref, 0, chain_toks[c], chain_ctx[c], 0, NULL);
                    feed(ref, 0, chain_toks[c] + chain_ctx[c], chain_n[c], chain_n[c],
                         chain_want[c]);
                    feed(ctx, 1 + c, chain_toks[c], chain_ctx[c], 0, NULL);
                    b[nb++] = (struct llama_seq_batch){
                        .slot = 1 + c, .tokens = chain_toks[c] + chain_ctx[c],
                        .n_tokens = chain_n[c], .n_logits = chain_n[c],
                        .logits_out = chain_got[c]};
                }
                /* the tree among the chains, not always first */
                if (nb > 1 && rng_int(&rng, 2)) {
                    struct llama_seq_batch t = b[0];
                    b[0] = b[nb - 1];
                    b[nb - 1] = t;
                }
                ok(llama_forward(ctx, b, nb, err), "llama_forward (tree)", err);
                kv_clean(ctx, "a tree forward");
                assert_int_equal(llama_ctx_slot_len(ctx, 0), L + n);
                assert_int_equal(llama_ctx_tree_nodes(ctx, 0), n);
                for (int c = 0; c < tc->n_chains; c++)
                    if (memcmp(chain_got[c], chain_want[c], (size_t)chain_n[c] * V * sizeof(float)))
                        fail_msg("%s, case %zu, tree of %d: the chain of %d rows beside it differs "
                                 "from its call alone", m.name, ci, n, chain_n[c]);
                /* every node against linear decoding of its path */
                ok(llama_ctx_truncate(ref, 0, 0, err), "llama_ctx_truncate", err);
                feed(ref, 0, ctx_toks, L, 0, NULL);
                for (int i = 0; i < n; i++) {
                    int32_t path[LLAMA_TREE_MAX];
                    const int d = path_of(parents, i, path);
                    off_path += d - 1 != i;
                    linear_logits(ref, L, tokens, parents, i, want);
                    if (memcmp(got + (size_t)i * V, want, (size_t)V * sizeof(float)) != 0) {
                        int v = 0;
                        while (got[(size_t)i * V + v] == want[v])
                            v++;
                        fail_msg("%s, case %zu (blocks of %d, chunks of %d, prefix cache %d), "
                                 "tree of %d over %d positions: node %d (depth %d, parent %d) "
                                 "logit %d is %.9g, its path's %.9g", m.name, ci, tc->block_size,
                                 tc->max_rows, tc->prefix_cache, n, L, i, d, parents[i], v,
                                 (double)got[(size_t)i * V + v], (double)want[v]);
                    }
                    nodes++;
                }
                ok(llama_ctx_truncate(ctx, 0, L, err), "llama_ctx_truncate (drop the tree)", err);
                kv_clean(ctx, "dropping a tree");
            }
        llama_ctx_destroy(ctx);
    }
    fprintf(stderr, "  %s: %ld nodes bit for bit their paths' (%ld off the diagonal)\n", m.name,
            nodes, off_path);
    assert_true(off_path > nodes / 2);
    for (int c = 0; c < 2; c++) {
        free(chain_want[c]);
        free(chain_got[c]);
    }
    free(want);
    free(got);
    llama_ctx_destroy(ref);
    fixture_close(&m);
}

static void test_tree_nodes_are_their_paths_bit_for_bit_tiny(void **state)
{
    (void)state;
    check_nodes_match_paths("tiny", 3);
}

static void test_tree_nodes_are_their_paths_bit_for_bit_tiny_draft(void **state)
{
    (void)state;
    check_nodes_match_paths("tiny-draft", 4);
}

static void test_tree_nodes_are_their_paths_bit_for_bit_head_size_8(void **state)
{
    (void)state;
    check_nodes_match_paths(NULL, 5);
}

/* ---- (b) KV after acceptance ---- */

/* Every layer's keys and values of slot's positions 0..len-1, bit for bit
 * between the two contexts (same model, any block layout). */
static void kv_equal(const struct llama_ctx *a, int slot_a, const struct llama_ctx *b, int slot_b,
                     int len, int round)
{
    const struct model_config *c = llama_model_config(a->model);
    const size_t kv_dim = (size_t)c->num_key_value_heads * (size_t)c->head_dim;
    for (int t = 0; t < len; t++) {
        const int32_t ba = a->tables[(size_t)slot_a * a->table_stride + t / a->block_size];
        const int32_t bb = b->tables[(size_t)slot_b * b->table_stride + t / b->block_size];
        const size_t ra = ((size_t)ba * a->block_size + t % a->block_size) * kv_dim;
        const size_t rb = ((size_t)bb * b->block_size + t % b->block_size) * kv_dim;
        for (int plane = 0; plane < 2 * c->num_hidden_layers; plane++)
            if (memcmp(a->kv_pool + plane * a->kv_plane + ra, b->kv_pool + plane * b->kv_plane + rb,
                       kv_dim * sizeof(float)))
                fail_msg("round %d: layer %d's %s at position %d differ from linear decoding's",
                         round, plane / 2, plane % 2 ? "values" : "keys", t);
    }
}

/* 1,000 rounds: a random tree of 1..32 nodes verified on slot 0, a random
 * root path accepted at a random depth (0 included); linear decoding feeds
 * the accepted tokens as a chain on its own context. After each round the
 * two caches hold the same bits, every invariant of the ledger holds (no
 * published block holds a rejected node), and every 25 rounds the next
 * step's logits agree and another slot that maps the accepted output from
 * the prefix cache computes the same logits too. */
static void test_tree_rounds_leave_the_kv_of_linear_decoding(void **state)
{
    (void)state;
    enum { ROUNDS = 1000, MAX_SEQ = 512 };
    struct model_fixture m;
    fixture_open(&m, "tiny", 7);
    const int V = m.vocab;
    char err[ERR_MSG_MAX] = "";
    uint64_t rng = 77;
    struct llama_ctx_params pt = {.n_slots = 2, .max_seq_len = MAX_SEQ, .kv_block_size = 8,
                                  .prefix_cache = true};
    struct llama_ctx_params pl = {.n_slots = 1, .max_seq_len = MAX_SEQ, .kv_block_size = 16};
    struct llama_ctx *tree = ctx_new(&m, &pt), *lin = ctx_new(&m, &pl);
    int32_t *out = malloc(MAX_SEQ * sizeof(int32_t));
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    float *logits = malloc((size_t)LLAMA_TREE_MAX * V * sizeof(float));
    int len = 0, accepted_total = 0, zero_rounds = 0, full_rounds = 0;
    for (int round = 0; round < ROUNDS; round++) {
        if (len + LLAMA_TREE_MAX + 1 > MAX_SEQ || round % 200 == 0) {
            /* a new sequence: the start of the old one, fed as a chain */
            const int keep = len ? rng_int(&rng, len / 2 + 1) : 0;
            ok(llama_ctx_truncate(tree, 0, keep, err), "truncate", err);
            ok(llama_ctx_truncate(lin, 0, keep, err), "truncate", err);
            len = keep;
            const int fresh = 1 + rng_int(&rng, 20);
            random_ids(out + len, fresh, V, &rng);
            feed(tree, 0, out + len, fresh, 0, NULL);
            feed(lin, 0, out + len, fresh, 0, NULL);
            len += fresh;
        }
        int32_t tokens[LLAMA_TREE_MAX], parents[LLAMA_TREE_MAX], path[LLAMA_TREE_MAX];
        const int n = 1 + rng_int(&rng, LLAMA_TREE_MAX);
        random_ids(tokens, n, V, &rng);
        random_tree(parents, n, &rng);
        /* the last token's logits too, as a verification asks */
        const struct llama_seq_batch tb = {.slot = 0, .tokens = tokens, .n_tokens = n,
                                           .n_logits = n, .logits_out = logits,
                                           .parents = parents};
        ok(llama_forward(tree, &tb, 1, err), "llama_forward (tree)", err);
        kv_clean(tree, "a tree forward");
        const int d = path_of(parents, rng_int(&rng, n), path);
        const int keep = rng_int(&rng, d + 1);
        zero_rounds += keep == 0;
        full_rounds += keep == d;
        ok(llama_ctx_tree_accept(tree, 0, path, keep, err), "llama_ctx_tree_accept", err);
        kv_clean(tree, "a tree accept");
        assert_int_equal(llama_ctx_tree_nodes(tree, 0), 0);
        for (int j = 0; j < keep; j++)
            out[len + j] = tokens[path[j]];
        feed(lin, 0, out + len, keep, 0, NULL);
        len += keep;
        accepted_total += keep;
        assert_int_equal(llama_ctx_slot_len(tree, 0), len);
        assert_int_equal(llama_ctx_slot_len(lin, 0), len);
        kv_equal(tree, 0, lin, 0, len, round);
        if (round % 25 == 24) {
            /* the next step's logits, then undone */
            int32_t next = rng_int(&rng, V);
            feed(tree, 0, &next, 1, 1, a);
            feed(lin, 0, &next, 1, 1, b);
            if (memcmp(a, b, (size_t)V * sizeof(float)))
                fail_msg("round %d: the step after differs from linear decoding's", round);
            ok(llama_ctx_truncate(tree, 0, len, err), "truncate", err);
            ok(llama_ctx_truncate(lin, 0, len, err), "truncate", err);
            /* slot 1 maps what the prefix cache holds of the output: only
             * accepted tokens' blocks can be found, with their bits */
            ok(llama_ctx_truncate(tree, 1, 0, err), "truncate", err);
            const int mapped = llama_ctx_prefix_map(tree, 1, out, len, len - 1);
            kv_clean(tree, "a prefix map");
            kv_equal(tree, 1, lin, 0, mapped, round);
            feed(tree, 1, out + mapped, len - mapped, 1, a);
            ok(llama_ctx_truncate(lin, 0, len - 1, err), "truncate", err);
            feed(lin, 0, out + len - 1, 1, 1, b);
            if (memcmp(a, b, (size_t)V * sizeof(float)))
                fail_msg("round %d: a slot mapping the output (%d of %d positions) differs",
                         round, mapped, len);
            ok(llama_ctx_truncate(tree, 1, 0, err), "truncate", err);
        }
    }
    fprintf(stderr, "  %d rounds: %d tokens accepted, %d rounds with none, %d whole paths\n",
            ROUNDS, accepted_total, zero_rounds, full_rounds);
    assert_true(zero_rounds > 0 && full_rounds > 0);
    struct llama_kv_stats st;
    llama_ctx_kv_stats(tree, &st);
    assert_true(st.prefix_hits > 0);
    free(out);
    free(a);
    free(b);
    free(logits);
    llama_ctx_destroy(tree);
    llama_ctx_destroy(lin);
    fixture_close(&m);
}

/* ---- (c) refusals ---- */

/* Malformed trees are refused with the reason and change nothing; a slot
 * holding an unaccepted tree takes no other forward, no cut inside the
 * tree, and no accept of a path that is not one of its root paths. */
static void test_tree_malformed_is_refused(void **state)
{
    (void)state;
    struct model_fixture m;
    fixture_open(&m, "tiny", 9);
    char err[ERR_MSG_MAX] = "";
    struct llama_ctx_params p = {.n_slots = 2, .max_seq_len = 128, .kv_block_size = 8,
                                 .prefix_cache = true};
    struct llama_ctx *ctx = ctx_new(&m, &p);
    int32_t ctx_toks[10], tokens[LLAMA_TREE_MAX + 1] = {0};
    uint64_t rng = 1;
    random_ids(ctx_toks, 10, m.vocab, &rng);
    feed(ctx, 0, ctx_toks, 10, 0, NULL);
    struct llama_kv_stats before, after;
    llama_ctx_kv_stats(ctx, &before);
    static const struct {
        int n;
        int32_t parents[4];
        const char *says;
    } bad[] = {
        {3, {-1, 0, 2}, "tree node 2 has parent 2"},  /* its own parent */
        {3, {-1, 2, 0}, "tree node 1 has parent 2"},  /* a parent after its child */
        {2, {-2, 0}, "tree node 0 has parent -2"},    /* below the root */
        {4, {-1, 0, 1, 7}, "tree node 3 has parent 7"}, /* outside the tree */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct llama_seq_batch b = {.slot = 0, .tokens = tokens, .n_tokens = bad[i].n,
                                    .parents = bad[i].parents};
        assert_int_equal(llama_forward(ctx, &b, 1, err), ERR_INVALID_ARG);
        if (!strstr(err, bad[i].says))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].says);
    }
    int32_t parents[LLAMA_TREE_MAX + 1];
    for (int i = 0; i <= LLAMA_TREE_MAX; i++)
        parents[i] = i - 1;
    struct llama_seq_batch big = {.slot = 0, .tokens = tokens, .n_tokens = LLAMA_TREE_MAX + 1,
                                  .parents = parents};
    assert_int_equal(llama_forward(ctx, &big, 1, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "a tree of 33 nodes, at most 32"));
    /* a bad tree beside a good chain: the whole call refused */
    struct llama_seq_batch pair[2] = {
        {.slot = 1, .tokens = tokens, .n_tokens = 2},
        {.slot = 0, .tokens = tokens, .n_tokens = 3, .parents = bad[0].parents}};
    assert_int_equal(llama_forward(ctx, pair, 2, err), ERR_INVALID_ARG);
    assert_int_equal(llama_ctx_slot_len(ctx, 0), 10);
    assert_int_equal(llama_ctx_slot_len(ctx, 1), 0);
    llama_ctx_kv_stats(ctx, &after);
    assert_int_equal(after.free_blocks, before.free_blocks);
    assert_int_equal(llama_ctx_tree_nodes(ctx, 0), 0);
    kv_clean(ctx, "refused trees");

    /* nothing to accept yet */
    int32_t path[2] = {0, 1};
    assert_int_equal(llama_ctx_tree_accept(ctx, 0, path, 1, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "holds no unaccepted tree"));
    /* a tree of 4: 0 <- 1, 0 <- 2 <- 3 */
    const int32_t good[4] = {-1, 0, 0, 2};
    struct llama_seq_batch t = {.slot = 0, .tokens = tokens, .n_tokens = 4, .parents = good};
    ok(llama_forward(ctx, &t, 1, err), "llama_forward (tree)", err);
    assert_int_equal(llama_ctx_slot_len(ctx, 0), 14);
    struct llama_seq_batch next = {.slot = 0, .tokens = tokens, .n_tokens = 1};
    assert_int_equal(llama_forward(ctx, &next, 1, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "unaccepted tree of 4 nodes"));
    assert_int_equal(llama_ctx_truncate(ctx, 0, 11, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "inside its unaccepted tree"));
    int32_t not_a_path[2] = {0, 3}; /* 3's parent is 2 */
    assert_int_equal(llama_ctx_tree_accept(ctx, 0, not_a_path, 2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "path[1] = 3 is not a child of 0"));
    int32_t not_a_root[1] = {2};
    assert_int_equal(llama_ctx_tree_accept(ctx, 0, not_a_root, 1, err), ERR_INVALID_ARG);
    assert_int_equal(llama_ctx_tree_accept(ctx, 0, path, 5, err), ERR_INVALID_ARG);
    assert_int_equal(llama_ctx_slot_len(ctx, 0), 14);
    assert_int_equal(llama_ctx_tree_nodes(ctx, 0), 4);
    kv_clean(ctx, "refused accepts");
    /* 0 -> 2 -> 3 accepted */
    int32_t deep[3] = {0, 2, 3};
    ok(llama_ctx_tree_accept(ctx, 0, deep, 3, err), "llama_ctx_tree_accept", err);
    assert_int_equal(llama_ctx_slot_len(ctx, 0), 13);
    ok(llama_forward(ctx, &next, 1, err), "llama_forward after the accept", err);
    kv_clean(ctx, "an accept");
    /* a tree dropped by a cut to its base */
    ok(llama_forward(ctx, &t, 1, err), "llama_forward (tree)", err);
    ok(llama_ctx_truncate(ctx, 0, 14, err), "truncate to the base", err);
    assert_int_equal(llama_ctx_tree_nodes(ctx, 0), 0);
    ok(llama_forward(ctx, &next, 1, err), "llama_forward after the cut", err);
    kv_clean(ctx, "a cut");
    llama_ctx_destroy(ctx);
    fixture_close(&m);
}

/* The layout check every backend runs refuses paths that do not fit, with
 * positions anywhere in int32 (a message's values), never overflowing. */
static void test_tree_layout_check_refuses_bad_paths(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    int32_t tables[4] = {0, 1, 2, 3}, off[2] = {0, 2};
    int32_t rows[2] = {0, 9}, phys[2] = {8, 9};
    struct kern_kv_layout kv = {.block_size = 4, .n_blocks = 4, .n_seqs = 1, .table_stride = 4,
                                .tables = tables, .rows = rows, .path_offset = off,
                                .path_phys = phys};
    assert_int_equal(kern_kv_layout_check(&kv, 1, "t", err), 0); /* depth 2 at 9: slots 8, 9 */
    static const struct {
        int32_t pos, phys0, phys1;
        const char *says;
    } bad[] = {
        {INT32_MAX, 8, 9, "at slot 8"},          /* L far above every slot */
        {INT32_MIN, 8, 9, "tree node of depth 2"}, /* a depth past the position */
        {0, 8, 9, "tree node of depth 2"},
        {9, 9, 9, "at slot 9 (after 9"},         /* not strictly increasing */
        {9, 7, 9, "at slot 7 (after 7"},         /* below L = 8 */
        {9, 8, 16, "inside 16 positions"},       /* past the table */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rows[1] = bad[i].pos, phys[0] = bad[i].phys0, phys[1] = bad[i].phys1;
        assert_int_equal(kern_kv_layout_check(&kv, 1, "t", err), ERR_RANGE);
        if (!strstr(err, bad[i].says))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].says);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_nodes_are_their_paths_bit_for_bit_tiny),
        cmocka_unit_test(test_tree_nodes_are_their_paths_bit_for_bit_tiny_draft),
        cmocka_unit_test(test_tree_nodes_are_their_paths_bit_for_bit_head_size_8),
        cmocka_unit_test(test_tree_rounds_leave_the_kv_of_linear_decoding),
        cmocka_unit_test(test_tree_malformed_is_refused),
        cmocka_unit_test(test_tree_layout_check_refuses_bad_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
