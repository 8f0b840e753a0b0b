/* specdec_fixtures.h: shared helpers for the speculative-decoding tests:
 * model pairs written by the model generator into temporary directories,
 * loaded on the CPU backend, and generation with or without a draft. */
#ifndef TANDEM_TESTS_SPECDEC_FIXTURES_H
#define TANDEM_TESTS_SPECDEC_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kernels.h"
#include "llama.h"
#include "modelgen.h"
#include "specdec.h"

struct loaded_model {
    struct llama_model *model;
    struct llama_ctx *ctx;
};

static inline void fixture_check(int rc, const char *what, const char *err)
{
    if (rc)
        fprintf(stderr, "%s failed (%d): %s\n", what, rc, err);
    assert_int_equal(rc, 0);
}

static inline void fixture_tmpdir(char *dir, size_t size)
{
    snprintf(dir, size, "/tmp/tandem-test-specdec-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static inline void fixture_rmdir(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* Writes a model of `preset` (or, with from_dir, derives one from it). */
static inline void fixture_make(const char *out_dir, const char *preset, uint64_t seed, int vocab,
                                const char *from_dir, double noise)
{
    char err[ERR_MSG_MAX] = "";
    struct modelgen_params p = {.preset = preset, .seed = seed, .vocab_size_override = vocab,
                                .force = 1};
    int rc = from_dir ? modelgen_derive(out_dir, from_dir, &p, noise, err)
                      : modelgen_write(out_dir, &p, err);
    fixture_check(rc, from_dir ? "modelgen_derive" : "modelgen_write", err);
}

static inline void fixture_load(struct loaded_model *m, const char *dir, struct kern_backend *be,
                                int max_seq_len)
{
    char err[ERR_MSG_MAX] = "";
    fixture_check(llama_model_load(&m->model, dir, be, err), "llama_model_load", err);
    struct llama_ctx_params p = {.n_slots = 1, .max_seq_len = max_seq_len};
    fixture_check(llama_ctx_create(&m->ctx, m->model, &p, err), "llama_ctx_create", err);
}

static inline void fixture_unload(struct loaded_model *m)
{
    llama_ctx_destroy(m->ctx);
    llama_model_destroy(m->model);
}

static inline void fixture_random_ids(int32_t *ids, int n, int vocab_lo, int vocab_hi,
                                      uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = vocab_lo + (int32_t)((x >> 33) % (uint64_t)(vocab_hi - vocab_lo));
    }
}

#endif
