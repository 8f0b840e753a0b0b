/* test_xfer.c: the seam over the draft's halves (common/xfer/xfer.h) with
 * its posix entry, as the workers use it: a writer on the CPU backend
 * creates and exports, a reader imports the descriptor; a round goes
 * begin_write -> tokens and q rows where xfer_q_dest says -> publish, and
 * the reader finds it through the seqlock, takes q rows from the host face,
 * ends its read; a rewrite during a read is seen; the writer's going is
 * seen by the reader; what a CPU writer cannot do (cuda_ipc) is refused by
 * name. The cuda_ipc entry runs in tests/gpu/test_cuda_xfer.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <unistd.h>

#include "error.h"
#include "kernels.h"
#include "xfer.h"

static char instance[64];

struct fixture {
    struct kern_backend *cpu;
};

static struct xfer_params posix_params(void)
{
    return (struct xfer_params){.transport = "posix", .instance = instance, .tag = "xfer",
                                .n_slots = 2, .k_max = 4, .vocab = 50, .reader_backend = "cpu"};
}

static void write_round(struct xfer *w, int slot, int half, uint64_t req, uint32_t round, int k,
                        float base)
{
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(xfer_begin_write(w, slot, half, err), 0);
    int32_t *tokens = (int32_t *)xfer_half_tokens(w, slot, half);
    float *q_host = NULL, *q_dev = NULL;
    xfer_q_dest(w, slot, half, &q_host, &q_dev);
    assert_non_null(q_host); /* posix: q rows live in the host face */
    assert_null(q_dev);
    const int vocab = xfer_layout(w)->vocab;
    for (int i = 0; i < k; i++) {
        tokens[i] = (int32_t)(req * 10 + (uint64_t)i);
        for (int v = 0; v < vocab; v++)
            q_host[(size_t)i * vocab + v] = base + (float)(i * vocab + v);
    }
    const struct shm_half_info info = {.req = req, .round = round, .k = (uint32_t)k};
    assert_int_equal(xfer_publish(w, slot, half, &info, k, true, err), 0);
}

static void test_xfer_posix_round_crosses_the_seam(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    const struct xfer_params p = posix_params();
    struct xfer *w = NULL, *r = NULL;
    assert_int_equal(xfer_create(&w, f->cpu, &p, err), 0);
    assert_string_equal(xfer_transport(w), "posix");
    cJSON *desc = xfer_export(w);
    assert_non_null(desc);
    assert_int_equal(xfer_import(&r, f->cpu, desc, false, err), 0);
    assert_string_equal(xfer_name(r), xfer_name(w));
    assert_int_equal(xfer_layout(r)->vocab, 50);
    assert_string_equal(xfer_q_path(r, false), "from the host face");

    write_round(w, 1, 0, 7, 3, 3, 1000.0f);
    struct shm_half_info info;
    uint64_t seq = 0;
    assert_int_equal(xfer_half_read(r, 1, 0, &info, &seq), 0);
    assert_true(info.req == 7 && info.round == 3 && info.k == 3);
    const int32_t *tokens = xfer_half_tokens(r, 1, 0);
    assert_int_equal(tokens[2], 72);
    /* q rows 1..2 (first 1, k 2): the host face, nothing to stage */
    struct xfer_q q;
    assert_int_equal(xfer_q_rows(r, 1, 0, 1, 2, true, &q, err), 0);
    assert_non_null(q.host);
    assert_null(q.dev);
    assert_false(q.staged);
    assert_true(q.host[0] == 1050.0f && q.host[2 * 50 - 1] == 1000.0f + 3 * 50 - 1);
    assert_int_equal(xfer_wait_staged(r, 1, 0, err), 0);
    assert_int_equal(xfer_end_read(r, 1, 0, err), 0);
    assert_true(xfer_half_unchanged(r, 1, 0, seq));

    /* the writer rewrites the half meanwhile: the reader sees it */
    write_round(w, 1, 0, 8, 4, 2, 0.0f);
    assert_false(xfer_half_unchanged(r, 1, 0, seq));
    assert_int_equal(xfer_half_read(r, 1, 0, &info, &seq), 0);
    assert_true(info.req == 8 && info.round == 4);

    /* the writer goes: the reader sees it and lets go */
    assert_false(xfer_owner_gone(r));
    xfer_close(w, 1000);
    assert_true(xfer_owner_gone(r));
    xfer_close(r, 0);
    cJSON_Delete(desc);
}

/* A half the writer is rewriting is refused to the reader (seqlock odd),
 * and a waiting reader is woken by the publish. */
static void test_xfer_reader_waits_for_the_publish(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    const struct xfer_params p = posix_params();
    struct xfer *w = NULL, *r = NULL;
    assert_int_equal(xfer_create(&w, f->cpu, &p, err), 0);
    cJSON *desc = xfer_export(w);
    assert_int_equal(xfer_import(&r, f->cpu, desc, false, err), 0);
    assert_int_equal(xfer_begin_write(w, 0, 1, err), 0);
    struct shm_half_info info;
    uint64_t seq = 0;
    assert_int_equal(xfer_half_read(r, 0, 1, &info, &seq), ERR_UNAVAILABLE);
    const uint64_t seen = xfer_half_seq(r, 0, 1);
    assert_int_equal(xfer_half_wait(r, 0, 1, seen, 20), ERR_TIMEOUT);
    const struct shm_half_info pub = {.req = 1, .round = 1, .k = 0};
    assert_int_equal(xfer_publish(w, 0, 1, &pub, 0, false, err), 0);
    assert_int_equal(xfer_half_wait(r, 0, 1, seen, 1000), 0);
    assert_int_equal(xfer_half_read(r, 0, 1, &info, &seq), 0);
    assert_true(info.req == 1 && info.k == 0);
    xfer_close(r, 0);
    xfer_close(w, 1000);
    cJSON_Delete(desc);
}

/* What the seam refuses, by name. */
static void test_xfer_refuses_cuda_ipc_on_a_cpu_writer(void **state)
{
    struct fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    struct xfer_params p = posix_params();
    struct xfer *w = NULL;
    p.transport = "cuda_ipc";
    assert_int_equal(xfer_create(&w, f->cpu, &p, err), ERR_INVALID_ARG);
    assert_null(w);
    assert_non_null(strstr(err, "\"cuda_ipc\" needs backend \"cuda\""));
    /* auto on the CPU is posix */
    p.transport = "auto";
    assert_int_equal(xfer_create(&w, f->cpu, &p, err), 0);
    assert_string_equal(xfer_transport(w), "posix");
    xfer_close(w, 0);
    p.transport = "carrier-pigeon";
    assert_int_equal(xfer_create(&w, f->cpu, &p, err), ERR_UNSUPPORTED);
    assert_non_null(strstr(err, "carrier-pigeon"));
    /* a descriptor of a segment that is gone */
    p.transport = "posix";
    assert_int_equal(xfer_create(&w, f->cpu, &p, err), 0);
    cJSON *desc = xfer_export(w);
    xfer_close(w, 0);
    struct xfer *r = NULL;
    assert_int_equal(xfer_import(&r, f->cpu, desc, false, err), ERR_NOT_FOUND);
    assert_null(r);
    cJSON_Delete(desc);
}

static int setup(void **state)
{
    snprintf(instance, sizeof instance, "xfertest%ld", (long)getpid());
    struct fixture *f = calloc(1, sizeof *f);
    char err[ERR_MSG_MAX];
    if (!f || kern_cpu_create(&f->cpu, 1, err) != 0) {
        free(f);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    kern_backend_destroy(f->cpu);
    free(f);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xfer_posix_round_crosses_the_seam),
        cmocka_unit_test(test_xfer_reader_waits_for_the_publish),
        cmocka_unit_test(test_xfer_refuses_cuda_ipc_on_a_cpu_writer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
