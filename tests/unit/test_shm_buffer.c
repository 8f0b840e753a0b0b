/* test_shm_buffer.c: the POSIX shared tensor buffer: create, export, import
 * (second mapping and forked child), layout, cleanup, bad descriptors, and
 * the publication protocol of a half (the seqlock of shm_buffer.h): step by
 * step, and with a writer thread rewriting a half while a reader thread
 * reads it through a second, read-only mapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "shm_buffer.h"
#include "shm_half_wire.h"

static char instance[64];

static int dev_shm_exists(const char *posix_name)
{
    char path[256];
    snprintf(path, sizeof path, "/dev/shm%s", posix_name);
    struct stat st;
    return stat(path, &st) == 0;
}

/* Segments in /dev/shm whose name starts with "tandem-<instance>-". */
static int count_instance_segments(void)
{
    char prefix[96];
    snprintf(prefix, sizeof prefix, "tandem-%s-", instance);
    DIR *d = opendir("/dev/shm");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void test_shm_layout_is_aligned_and_sized(void **state)
{
    (void)state;
    struct shm_layout lay;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(shm_layout_init(&lay, 3, 8, 1000, err), 0);
    assert_int_equal(lay.q_offset % 64, 0);
    assert_int_equal(lay.half_bytes % 64, 0);
    assert_true(lay.tokens_offset >= sizeof(struct shm_half_header));
    assert_true(lay.q_offset >= lay.tokens_offset + 9 * sizeof(int32_t));
    assert_true(lay.half_bytes >= lay.q_offset + 9 * 1000 * sizeof(float));
    assert_int_equal(lay.size_bytes, 3 * 2 * lay.half_bytes);
    assert_int_equal(shm_layout_init(&lay, 0, 8, 1000, err), ERR_RANGE);
    assert_non_null(strstr(err, "n_slots"));
    assert_int_equal(shm_layout_init(&lay, 1, 8, 0, err), ERR_RANGE);
    assert_non_null(strstr(err, "vocab"));
}

static void fill_half(struct shm_buffer *b, int slot, int half, uint64_t req)
{
    int32_t *t = shm_buffer_half_tokens(b, slot, half);
    float *q = shm_buffer_half_q(b, slot, half);
    const struct shm_layout *lay = shm_buffer_layout(b);
    shm_buffer_half_begin_write(b, slot, half);
    for (int i = 0; i <= lay->k_max; i++)
        t[i] = (int32_t)(1000 * slot + 100 * half + i);
    for (int r = 0; r <= lay->k_max; r++)
        for (int v = 0; v < lay->vocab; v++)
            q[(size_t)r * lay->vocab + v] = (float)(slot + half * 0.5 + r * 0.01 + v);
    const struct shm_half_info info = {.req = req, .round = (uint32_t)(slot * 10 + half), .k = 3};
    shm_buffer_half_publish(b, slot, half, &info);
}

static int check_half(struct shm_buffer *b, int slot, int half, uint64_t req)
{
    struct shm_half_info h;
    uint64_t seq = 0;
    if (shm_buffer_half_read(b, slot, half, &h, &seq) != 0)
        return 0;
    int32_t *t = shm_buffer_half_tokens(b, slot, half);
    float *q = shm_buffer_half_q(b, slot, half);
    const struct shm_layout *lay = shm_buffer_layout(b);
    if (h.req != req || h.round != (uint32_t)(slot * 10 + half) || h.k != 3)
        return 0;
    for (int i = 0; i <= lay->k_max; i++)
        if (t[i] != (int32_t)(1000 * slot + 100 * half + i))
            return 0;
    for (int r = 0; r <= lay->k_max; r++)
        for (int v = 0; v < lay->vocab; v++)
            if (q[(size_t)r * lay->vocab + v] != (float)(slot + half * 0.5 + r * 0.01 + v))
                return 0;
    return shm_buffer_half_unchanged(b, slot, half, seq);
}

static void test_shm_buffer_second_mapping_sees_writes(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL, *peer = NULL;
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "draft", 2, 4, 50, err), 0);
    assert_true(shm_buffer_is_owner(owner));
    assert_true(dev_shm_exists(shm_buffer_name(owner)));
    cJSON *desc = shm_buffer_export(owner);
    assert_non_null(desc);
    assert_string_equal(cJSON_GetObjectItem(desc, "transport")->valuestring, "posix");
    assert_int_equal(cJSON_GetObjectItem(desc, "n_slots")->valueint, 2);
    assert_int_equal(shm_buffer_import(&peer, desc, err), 0);
    assert_false(shm_buffer_is_owner(peer));

    fill_half(owner, 1, 1, 77);
    fill_half(owner, 0, 0, 5);
    assert_true(check_half(peer, 1, 1, 77));
    assert_true(check_half(peer, 0, 0, 5));
    /* distinct halves do not overlap */
    assert_ptr_not_equal(shm_buffer_half_header(peer, 0, 1), shm_buffer_half_header(peer, 0, 0));
    assert_null(shm_buffer_half_header(peer, 2, 0));
    assert_null(shm_buffer_half_tokens(peer, 0, 2));
    assert_null(shm_buffer_half_q(peer, -1, 0));

    char name[SHM_BUFFER_NAME_MAX];
    snprintf(name, sizeof name, "%s", shm_buffer_name(owner));
    shm_buffer_close(peer);
    assert_true(dev_shm_exists(name)); /* the importer does not unlink */
    shm_buffer_close(owner);
    assert_false(dev_shm_exists(name));
    shm_buffer_close(NULL);
    cJSON_Delete(desc);
}

/* A fresh import from the descriptor's text, as the target does (in a
 * forked child: NULL on failure, for its exit status to say). */
static struct shm_buffer *import_text(const char *text)
{
    cJSON *d = cJSON_Parse(text);
    struct shm_buffer *peer = NULL;
    char err[ERR_MSG_MAX];
    if (!d || shm_buffer_import(&peer, d, err) != 0)
        peer = NULL;
    cJSON_Delete(d);
    return peer;
}

static void test_shm_buffer_forked_child_reads_and_cannot_write(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL;
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "draft", 1, 2, 16, err), 0);
    cJSON *desc = shm_buffer_export(owner);
    assert_non_null(desc);
    char *text = cJSON_PrintUnformatted(desc);
    assert_non_null(text);
    fill_half(owner, 0, 1, 123456789012ULL);

    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct shm_buffer *peer = import_text(text);
        if (!peer)
            _exit(2);
        if (!check_half(peer, 0, 1, 123456789012ULL))
            _exit(3);
        /* read-only mapping: this write must fault (CMocka's and ASan's
         * SIGSEGV handlers are dropped so the child dies of the signal) */
        signal(SIGSEGV, SIG_DFL);
        volatile int32_t *t = shm_buffer_half_tokens(peer, 0, 0);
        t[0] = 1;
        _exit(4);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGSEGV);
    cJSON_free(text);
    cJSON_Delete(desc);
    shm_buffer_close(owner);
    assert_int_equal(count_instance_segments(), 0);
}

static void test_shm_buffer_bad_descriptors_are_rejected(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL, *peer = NULL;
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "draft", 2, 4, 50, err), 0);
    cJSON *desc = shm_buffer_export(owner);

    cJSON *d = cJSON_Duplicate(desc, 1);
    cJSON_ReplaceItemInObject(d, "size_bytes", cJSON_CreateNumber(12));
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "shm.size_bytes"));
    assert_null(peer);
    cJSON_Delete(d);

    d = cJSON_Duplicate(desc, 1);
    cJSON_ReplaceItemInObject(d, "transport", cJSON_CreateString("nccl"));
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_UNSUPPORTED);
    cJSON_Delete(d);

    d = cJSON_Duplicate(desc, 1);
    cJSON_ReplaceItemInObject(d, "name", cJSON_CreateString("/etc-passwd"));
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "shm.name"));
    cJSON_Delete(d);

    d = cJSON_Duplicate(desc, 1);
    cJSON_ReplaceItemInObject(d, "name", cJSON_CreateString("/tandem-nonexistent-1-draft"));
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_NOT_FOUND);
    cJSON_Delete(d);

    d = cJSON_Duplicate(desc, 1);
    cJSON_ReplaceItemInObject(d, "vocab", cJSON_CreateString("50"));
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "shm.vocab"));
    cJSON_Delete(d);

    /* Descriptor claims more slots than the segment holds. */
    struct shm_layout big;
    assert_int_equal(shm_layout_init(&big, 4, 4, 50, err), 0);
    d = cJSON_Duplicate(desc, 1);
    cJSON_ReplaceItemInObject(d, "n_slots", cJSON_CreateNumber(4));
    cJSON_ReplaceItemInObject(d, "size_bytes", cJSON_CreateNumber((double)big.size_bytes));
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_FORMAT);
    cJSON_Delete(d);

    assert_int_equal(shm_buffer_import(&peer, NULL, err), ERR_PROTOCOL);
    assert_int_equal(shm_buffer_create(&peer, "cuda-ipc", instance, "draft", 1, 1, 1, err),
                     ERR_UNSUPPORTED);
    /* Same name twice: O_EXCL. */
    assert_int_not_equal(shm_buffer_create(&peer, "posix", instance, "draft", 1, 1, 1, err), 0);
    assert_null(peer);
    cJSON_Delete(desc);
    shm_buffer_close(owner);
    assert_int_equal(count_instance_segments(), 0);
}

/* Every step of the protocol, in one thread: what a reader is told while a
 * half is being rewritten, after it is published, and after it was
 * rewritten under a reader that had read it. */
static void test_shm_half_protocol_refuses_rewritten_halves(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL, *peer = NULL;
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "steps", 2, 4, 50, err), 0);
    cJSON *desc = shm_buffer_export(owner);
    assert_int_equal(shm_buffer_import(&peer, desc, err), 0);
    struct shm_half_info info;
    uint64_t seq = 0, seq2 = 0;

    /* a zero-filled half reads as published (seq 0) and empty */
    assert_int_equal(shm_buffer_half_read(peer, 1, 0, &info, &seq), 0);
    assert_true(info.req == 0 && info.k == 0);

    shm_buffer_half_begin_write(owner, 1, 0);
    assert_int_equal(shm_buffer_half_read(peer, 1, 0, &info, &seq2), ERR_UNAVAILABLE);
    assert_false(shm_buffer_half_unchanged(peer, 1, 0, seq)); /* a reader of seq 0 is told */
    const struct shm_half_info pub = {.req = 9, .round = 4, .k = 2, .first = 1, .guess = 77};
    shm_buffer_half_publish(owner, 1, 0, &pub);
    assert_int_equal(shm_buffer_half_read(peer, 1, 0, &info, &seq), 0);
    assert_true(info.req == 9 && info.round == 4 && info.k == 2 && info.first == 1 &&
                info.guess == 77);
    assert_true(shm_buffer_half_unchanged(peer, 1, 0, seq));
    /* the other halves did not move */
    assert_int_equal(shm_buffer_half_read(peer, 1, 1, &info, &seq2), 0);
    assert_int_equal(shm_buffer_half_read(peer, 0, 0, &info, &seq2), 0);

    /* a rewrite that fails before publishing, then a second one: the half
     * stays unreadable, and a reader of the last publication is told */
    shm_buffer_half_begin_write(owner, 1, 0);
    shm_buffer_half_begin_write(owner, 1, 0);
    assert_int_equal(shm_buffer_half_read(peer, 1, 0, &info, &seq2), ERR_UNAVAILABLE);
    assert_false(shm_buffer_half_unchanged(peer, 1, 0, seq));
    /* published again with the very same fields: still a different publication */
    shm_buffer_half_publish(owner, 1, 0, &pub);
    assert_false(shm_buffer_half_unchanged(peer, 1, 0, seq));
    assert_int_equal(shm_buffer_half_read(peer, 1, 0, &info, &seq2), 0);
    assert_true(seq2 != seq && seq2 % 2 == 0);

    assert_int_equal(shm_buffer_half_read(peer, 2, 0, &info, &seq2), ERR_RANGE);
    assert_int_equal(shm_buffer_half_read(peer, 0, 2, &info, &seq2), ERR_RANGE);
    assert_false(shm_buffer_half_unchanged(peer, -1, 0, 0));
    cJSON_Delete(desc);
    shm_buffer_close(peer);
    shm_buffer_close(owner);
}

/* The two threads of the stress test: the writer rewrites one half over
 * and over (every token and q value derived from the publication number n,
 * which goes into req); the reader, through its own read-only mapping,
 * copies the half out and accepts the copy only when the protocol says it
 * is one publication. An accepted copy that mixes two publications is a
 * torn read: the protocol failed. */
struct tear_test {
    struct shm_buffer *owner, *peer;
    atomic_bool stop;
    long accepted, refused, torn_accepted, torn_seen;
};

static float tear_value(uint64_t n, size_t i) { return (float)((n * 7919u + i) % 1000003u); }

static void *tear_writer(void *arg)
{
    struct tear_test *t = arg;
    const struct shm_layout *lay = shm_buffer_layout(t->owner);
    const size_t n_q = (size_t)(lay->k_max + 1) * (size_t)lay->vocab;
    for (uint64_t n = 1; !atomic_load(&t->stop); n++) {
        shm_buffer_half_begin_write(t->owner, 0, 1);
        int32_t *tok = shm_buffer_half_tokens(t->owner, 0, 1);
        float *q = shm_buffer_half_q(t->owner, 0, 1);
        for (int i = 0; i <= lay->k_max; i++)
            tok[i] = (int32_t)(n + (uint64_t)i);
        for (size_t i = 0; i < n_q; i++)
            q[i] = tear_value(n, i);
        const struct shm_half_info info = {.req = n, .round = (uint32_t)n, .k = (uint32_t)lay->k_max};
        shm_buffer_half_publish(t->owner, 0, 1, &info);
        /* a pause as between two rounds, so the reader also gets whole
         * publications (a seqlock starves readers of a writer that never
         * pauses) */
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static void *tear_reader(void *arg)
{
    struct tear_test *t = arg;
    const struct shm_layout *lay = shm_buffer_layout(t->peer);
    const size_t n_q = (size_t)(lay->k_max + 1) * (size_t)lay->vocab;
    float *q_copy = malloc(n_q * sizeof *q_copy);
    int32_t tok_copy[SHM_BUFFER_MAX_K + 1];
    assert_non_null(q_copy);
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        double ms = (double)(now.tv_sec - t0.tv_sec) * 1e3 + (double)(now.tv_nsec - t0.tv_nsec) / 1e6;
        /* enough of both outcomes, or 10 s at most on a loaded machine */
        if ((t->accepted >= 1000 && t->torn_seen >= 20) || ms > 10000)
            break;
        struct shm_half_info info;
        uint64_t seq;
        if (shm_buffer_half_read(t->peer, 0, 1, &info, &seq) != 0) {
            t->refused++;
            continue;
        }
        memcpy(tok_copy, shm_buffer_half_tokens(t->peer, 0, 1),
               (size_t)(lay->k_max + 1) * sizeof(int32_t));
        memcpy(q_copy, shm_buffer_half_q(t->peer, 0, 1), n_q * sizeof *q_copy);
        const bool ok = shm_buffer_half_unchanged(t->peer, 0, 1, seq);
        bool torn = false;
        if (info.req > 0) { /* 0: the zero-filled half before the first publication */
            for (int i = 0; i <= lay->k_max && !torn; i++)
                torn = tok_copy[i] != (int32_t)(info.req + (uint64_t)i);
            for (size_t i = 0; i < n_q && !torn; i++)
                torn = q_copy[i] != tear_value(info.req, i);
        }
        t->torn_seen += torn;
        if (ok) {
            t->accepted++;
            t->torn_accepted += torn;
        } else {
            t->refused++;
        }
    }
    atomic_store(&t->stop, true);
    free(q_copy);
    return NULL;
}

static void test_shm_half_reader_never_accepts_a_torn_half(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct tear_test t = {0};
    atomic_init(&t.stop, false);
    /* 9 rows x 4096 floats: long enough to copy that the writer overtakes
     * the reader often */
    assert_int_equal(shm_buffer_create(&t.owner, "posix", instance, "tear", 1, 8, 4096, err), 0);
    cJSON *desc = shm_buffer_export(t.owner);
    assert_int_equal(shm_buffer_import(&t.peer, desc, err), 0);
    pthread_t wr, rd;
    assert_int_equal(pthread_create(&wr, NULL, tear_writer, &t), 0);
    assert_int_equal(pthread_create(&rd, NULL, tear_reader, &t), 0);
    assert_int_equal(pthread_join(rd, NULL), 0);
    assert_int_equal(pthread_join(wr, NULL), 0);
    print_message("seqlock: %ld copies accepted, %ld refused (%ld of those torn)\n", t.accepted,
                  t.refused, t.torn_seen);
    assert_int_equal(t.torn_accepted, 0);
    assert_true(t.accepted > 0);
    /* the race was met: copies that mixed two publications were made, and
     * the protocol refused every one of them */
    if (t.torn_seen == 0)
        fail_msg("no torn copy in 10 s: the writer never overtook the reader, the test proved nothing");
    cJSON_Delete(desc);
    shm_buffer_close(t.peer);
    shm_buffer_close(t.owner);
}

/* cuda_ipc: the POSIX host face plus the device side in the descriptor,
 * carried and checked without any CUDA (the handles are opaque bytes). */
static void test_shm_buffer_cuda_ipc_descriptor_round_trips(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL, *peer = NULL;
    assert_int_equal(shm_buffer_create(&owner, "cuda_ipc", instance, "cuda", 2, 4, 50, err), 0);
    assert_string_equal(shm_buffer_transport(owner), "cuda_ipc");
    assert_null(shm_buffer_export(owner)); /* no device side yet */
    const struct shm_layout *lay = shm_buffer_layout(owner);
    unsigned char events[4 * SHM_BUFFER_IPC_HANDLE_BYTES], consumed[sizeof events];
    for (size_t i = 0; i < sizeof events; i++) {
        events[i] = (unsigned char)(i * 37 + 5);
        consumed[i] = (unsigned char)(i * 11 + 200);
    }
    struct shm_buffer_cuda_desc cd = {
        .device_uuid = "GPU-0123abcd-4567-89ab-cdef-0123456789AB", .staging = false,
        .slab_bytes = lay->size_bytes + 64, .probe_offset = lay->size_bytes,
        .probe = {1, 2, 3, 4000000000u}, .n_events = 3, .event_handles = events,
        .consumed_handles = consumed};
    for (int i = 0; i < SHM_BUFFER_IPC_HANDLE_BYTES; i++)
        cd.mem_handle[i] = (unsigned char)(255 - i);
    assert_int_equal(shm_buffer_set_cuda(owner, &cd, err), ERR_INVALID_ARG); /* 3 != 4 halves */
    cd.n_events = 4;
    assert_int_equal(shm_buffer_set_cuda(owner, &cd, err), 0);
    cJSON *desc = shm_buffer_export(owner);
    assert_non_null(desc);
    assert_int_equal(shm_buffer_import(&peer, desc, err), 0);
    const struct shm_buffer_cuda_desc *got = shm_buffer_cuda(peer);
    assert_non_null(got);
    assert_string_equal(got->device_uuid, cd.device_uuid);
    assert_false(got->staging);
    assert_memory_equal(got->mem_handle, cd.mem_handle, SHM_BUFFER_IPC_HANDLE_BYTES);
    assert_memory_equal(got->event_handles, events, sizeof events);
    assert_non_null(got->consumed_handles);
    assert_memory_equal(got->consumed_handles, consumed, sizeof consumed);
    assert_int_equal(got->n_events, 4);
    assert_true(got->slab_bytes == cd.slab_bytes && got->probe_offset == cd.probe_offset);
    assert_memory_equal(got->probe, cd.probe, sizeof cd.probe);
    assert_false(got->q_in_slab);
    fill_half(owner, 1, 1, 42); /* the host face is the POSIX segment */
    assert_true(check_half(peer, 1, 1, 42));
    shm_buffer_close(peer);
    peer = NULL;
    assert_non_null(shm_buffer_cuda(owner));

    /* what an importer refuses, naming the field */
    struct { const char *key, *sub; cJSON *value; const char *needle; } bad[] = {
        {"cuda", "events", cJSON_CreateArray(), "shm.cuda.events"},
        {"cuda", "consumed_events", cJSON_CreateArray(), "shm.cuda.consumed_events"},
        {"cuda", "mem_handle", cJSON_CreateString("abc"), "shm.cuda.mem_handle"},
        {"cuda", "device_uuid", cJSON_CreateString("0"), "shm.cuda.device_uuid"},
        {"cuda", "q_offset", cJSON_CreateNumber(8), "offsets"},
        {"cuda", "mode", cJSON_CreateString("peer"), "shm.cuda.mode"},
        {"cuda", "probe_offset", cJSON_CreateNumber(64), "probe"},
        {"cuda", "q_rows", cJSON_CreateString("device"), "shm.cuda.q_rows"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *d = cJSON_Duplicate(desc, 1);
        cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, bad[i].key), bad[i].sub, bad[i].value);
        err[0] = '\0';
        assert_int_equal(shm_buffer_import(&peer, d, err), ERR_PROTOCOL);
        assert_null(peer);
        if (!strstr(err, bad[i].needle))
            fail_msg("%s: error \"%s\" does not name %s", bad[i].sub, err, bad[i].needle);
        cJSON_Delete(d);
    }
    cJSON *d = cJSON_Duplicate(desc, 1);
    cJSON_DeleteItemFromObject(d, "cuda");
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_PROTOCOL);
    cJSON_Delete(d);
    /* an owner that exports no consumed events: the reader learns of it */
    d = cJSON_Duplicate(desc, 1);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(d, "cuda"), "consumed_events");
    assert_int_equal(shm_buffer_import(&peer, d, err), 0);
    assert_null(shm_buffer_cuda(peer)->consumed_handles);
    shm_buffer_close(peer);
    peer = NULL;
    cJSON_Delete(d);
    /* a draft from before q_rows existed wrote q into the host face */
    d = cJSON_Duplicate(desc, 1);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(d, "cuda"), "q_rows");
    assert_int_equal(shm_buffer_import(&peer, d, err), 0);
    assert_false(shm_buffer_cuda(peer)->q_in_slab);
    shm_buffer_close(peer);
    peer = NULL;
    cJSON_Delete(d);

    /* q rows written by the draft's kernels into the slab only */
    cd.q_in_slab = true;
    assert_int_equal(shm_buffer_set_cuda(owner, &cd, err), 0);
    cJSON_Delete(desc);
    desc = shm_buffer_export(owner);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(desc, "cuda"), "q_rows")->valuestring,
                        "slab");
    assert_int_equal(shm_buffer_import(&peer, desc, err), 0);
    assert_true(shm_buffer_cuda(peer)->q_in_slab);
    shm_buffer_close(peer);
    peer = NULL;
    /* a staging buffer has no slab to hold them, on either side */
    d = cJSON_Duplicate(desc, 1);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(d, "cuda"), "mode", cJSON_CreateString("staging"));
    assert_int_equal(shm_buffer_import(&peer, d, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "shm.cuda.q_rows"));
    cJSON_Delete(d);
    cd.staging = true;
    assert_int_equal(shm_buffer_set_cuda(owner, &cd, err), ERR_INVALID_ARG);
    cd.q_in_slab = false;

    /* staging: no slab, no handle needed */
    cd.staging = true;
    cd.slab_bytes = 0;
    assert_int_equal(shm_buffer_set_cuda(owner, &cd, err), 0);
    cJSON_Delete(desc);
    desc = shm_buffer_export(owner);
    assert_null(cJSON_GetObjectItem(cJSON_GetObjectItem(desc, "cuda"), "mem_handle"));
    assert_int_equal(shm_buffer_import(&peer, desc, err), 0);
    assert_true(shm_buffer_cuda(peer)->staging);
    shm_buffer_close(peer);
    /* a posix buffer has no device side */
    struct shm_buffer *plain = NULL;
    assert_int_equal(shm_buffer_create(&plain, "posix", instance, "other", 1, 1, 1, err), 0);
    assert_int_equal(shm_buffer_set_cuda(plain, &cd, err), ERR_INVALID_ARG);
    assert_null(shm_buffer_cuda(plain));
    shm_buffer_close(plain);
    cJSON_Delete(desc);
    shm_buffer_close(owner);
    assert_int_equal(count_instance_segments(), 0);
}

static void test_shm_buffer_cleanup_removes_only_dead_owners(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    char dead[128], live[128], other[128];
    /* pid 999999999 is above any pid_max, so it never runs. */
    snprintf(dead, sizeof dead, "/tandem-%s-999999999-draft", instance);
    snprintf(live, sizeof live, "/tandem-%s-%ld-x", instance, (long)getpid());
    snprintf(other, sizeof other, "/tandem-%s-x-999999999-draft", instance);
    const char *names[] = {dead, live, other};
    for (int i = 0; i < 3; i++) {
        int fd = shm_open(names[i], O_RDWR | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        close(fd);
    }
    int n = -1;
    assert_int_equal(shm_buffer_cleanup_stale(instance, false, &n, err), 0);
    assert_int_equal(n, 1);
    assert_false(dev_shm_exists(dead));
    assert_true(dev_shm_exists(live));
    assert_true(dev_shm_exists(other)); /* instance "<instance>-x" is someone else */
    assert_int_equal(shm_buffer_cleanup_stale(instance, true, &n, err), 0);
    assert_int_equal(n, 1);
    assert_false(dev_shm_exists(live));
    assert_true(dev_shm_exists(other));
    assert_int_equal(shm_unlink(other), 0);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A reader in another process, on its read-only mapping, sleeps in
 * shm_buffer_half_wait until the owner publishes, and is woken by it (well
 * before its timeout); with nothing published it returns ERR_TIMEOUT after
 * the time asked. */
static void test_shm_buffer_half_wait_wakes_a_reader_in_another_process(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL;
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "wait", 1, 2, 16, err), 0);
    cJSON *desc = shm_buffer_export(owner);
    char *text = cJSON_PrintUnformatted(desc);
    assert_non_null(text);
    const uint64_t seen = shm_buffer_half_seq(owner, 0, 0);
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        struct shm_buffer *peer = import_text(text);
        if (!peer)
            _exit(2);
        if (write(go[1], "w", 1) != 1) /* about to wait */
            _exit(3);
        const double t0 = now_ms();
        struct shm_half_info hi = {0};
        uint64_t at = seen;
        for (;;) { /* woken early or for a begin_write: read again */
            if (shm_buffer_half_wait(peer, 0, 0, at, 10000.0 - (now_ms() - t0)) != 0)
                _exit(4);
            at = shm_buffer_half_seq(peer, 0, 0);
            if (shm_buffer_half_read(peer, 0, 0, &hi, &at) == 0 && hi.round == 7)
                break;
        }
        if (hi.req != 99 || now_ms() - t0 > 5000.0)
            _exit(5);
        const double t1 = now_ms();
        if (shm_buffer_half_wait(peer, 0, 0, at, 40.0) != ERR_TIMEOUT || now_ms() - t1 < 35.0)
            _exit(6);
        _exit(0);
    }
    char c;
    assert_int_equal(read(go[0], &c, 1), 1);
    struct timespec pause = {.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    shm_buffer_half_begin_write(owner, 0, 0);
    shm_buffer_half_publish(owner, 0, 0, &(struct shm_half_info){.req = 99, .round = 7, .k = 1});
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    close(go[0]);
    close(go[1]);
    cJSON_free(text);
    cJSON_Delete(desc);
    shm_buffer_close(owner);
}

/* Readers are seen: an importer holds the segment (a shared lock) until it
 * closes or dies; the owner's await_readers removes the name, which the
 * importer sees, and waits, bounded, until no importer holds it. */
static void test_shm_buffer_owner_awaits_its_readers(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL, *peer = NULL;
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "await", 1, 2, 16, err), 0);
    cJSON *desc = shm_buffer_export(owner);
    assert_non_null(desc);
    /* no reader: at once */
    assert_int_equal(shm_buffer_await_readers(owner, 0, err), 0);
    shm_buffer_close(owner);
    cJSON_Delete(desc);

    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "await", 1, 2, 16, err), 0);
    desc = shm_buffer_export(owner);
    assert_int_equal(shm_buffer_import(&peer, desc, err), 0);
    assert_false(shm_buffer_owner_gone(peer));
    assert_false(shm_buffer_owner_gone(owner));
    assert_int_equal(shm_buffer_await_readers(peer, 0, err), ERR_INVALID_ARG);
    /* a reader that holds on: the bound ends the wait */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(shm_buffer_await_readers(owner, 60, err), ERR_TIMEOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double waited_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    assert_true(waited_ms >= 60 && waited_ms < 2000);
    assert_non_null(strstr(err, "a reader still maps it"));
    /* the name is gone: the reader learns the owner is going, no one new
     * can import */
    assert_true(shm_buffer_owner_gone(peer));
    assert_false(dev_shm_exists(shm_buffer_name(owner)));
    struct shm_buffer *late = NULL;
    assert_int_equal(shm_buffer_import(&late, desc, err), ERR_NOT_FOUND);
    /* the reader lets go: the owner's wait ends */
    shm_buffer_close(peer);
    assert_int_equal(shm_buffer_await_readers(owner, 1000, err), 0);
    shm_buffer_close(owner);
    cJSON_Delete(desc);

    /* a reader killed with -9 lets go too (the kernel drops its lock) */
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "await", 1, 2, 16, err), 0);
    desc = shm_buffer_export(owner);
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct shm_buffer *child = NULL;
        char cerr[ERR_MSG_MAX];
        char ok = shm_buffer_import(&child, desc, cerr) == 0 ? 'y' : 'n';
        if (write(ready[1], &ok, 1) != 1)
            _exit(2);
        pause();
        _exit(0);
    }
    char ok = 0;
    assert_int_equal(read(ready[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
    assert_int_equal(shm_buffer_await_readers(owner, 30, err), ERR_TIMEOUT);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    assert_int_equal(shm_buffer_await_readers(owner, 1000, err), 0);
    close(ready[0]);
    close(ready[1]);
    shm_buffer_close(owner);
    cJSON_Delete(desc);
}

/* A half as bytes (shm_half_wire.h): packed from the owner's published
 * half, stored into a "frames" buffer (private memory, no segment) made
 * from a "frames" descriptor, it reads there as it reads in place: header,
 * tokens and q rows bit for bit, with or without the q rows; bytes that do
 * not fit the layout are refused naming why, and only a "frames" buffer
 * takes them. */
static void test_shm_half_bytes_round_trip_into_a_frames_buffer(void **state)
{
    (void)state;
    char err[ERR_MSG_MAX] = "";
    struct shm_buffer *owner = NULL, *mirror = NULL;
    const int vocab = 50, k_max = 4;
    assert_int_equal(shm_buffer_create(&owner, "posix", instance, "wire", 2, k_max, vocab, err), 0);
    cJSON *desc = shm_buffer_export(owner);
    assert_non_null(desc);
    cJSON_ReplaceItemInObjectCaseSensitive(desc, "transport", cJSON_CreateString("frames"));
    const int before = count_instance_segments();
    assert_int_equal(shm_buffer_import(&mirror, desc, err), 0);
    assert_int_equal(count_instance_segments(), before); /* nothing mapped from /dev/shm */
    assert_string_equal(shm_buffer_transport(mirror), "frames");

    /* a pre-draft: the guess and 3 drafts, q rows for all four */
    shm_buffer_half_begin_write(owner, 1, 1);
    int32_t *tok = shm_buffer_half_tokens(owner, 1, 1);
    float *q = shm_buffer_half_q(owner, 1, 1);
    for (int i = 0; i < 4; i++) {
        tok[i] = 10 + i;
        for (int v = 0; v < vocab; v++)
            q[(size_t)i * vocab + v] = (float)(i * 1000 + v) / 7.0f;
    }
    const struct shm_half_info info = {.req = 12345678901ull, .round = 9, .k = 3, .first = 1, .guess = 10};
    shm_buffer_half_publish(owner, 1, 1, &info);
    void *bytes = NULL;
    size_t len = 0;
    assert_int_equal(shm_half_pack(owner, 1, 1, 4, &bytes, &len, err), 0);
    assert_int_equal(len, sizeof(struct shm_half_wire_header) + 4 * 4 + 4 * (size_t)vocab * 4);
    assert_int_equal(shm_half_store(mirror, 1, 1, bytes, len, err), 0);
    struct shm_half_info got;
    uint64_t seq = 0;
    assert_int_equal(shm_buffer_half_read(mirror, 1, 1, &got, &seq), 0);
    assert_true(got.req == info.req && got.round == 9 && got.k == 3 && got.first == 1 && got.guess == 10);
    assert_memory_equal(shm_buffer_half_tokens(mirror, 1, 1), tok, 4 * sizeof(int32_t));
    assert_memory_equal(shm_buffer_half_q(mirror, 1, 1), q, 4 * (size_t)vocab * sizeof(float));
    /* a store moves the seqlock on: a reader of the old one sees a change */
    assert_int_equal(shm_half_store(mirror, 1, 1, bytes, len, err), 0);
    assert_false(shm_buffer_half_unchanged(mirror, 1, 1, seq));

    /* tokens alone (greedy) */
    void *small = NULL;
    size_t small_len = 0;
    assert_int_equal(shm_half_pack(owner, 1, 1, 0, &small, &small_len, err), 0);
    assert_int_equal(small_len, sizeof(struct shm_half_wire_header) + 4 * 4);
    assert_int_equal(shm_half_store(mirror, 0, 0, small, small_len, err), 0);
    assert_memory_equal(shm_buffer_half_tokens(mirror, 0, 0), tok, 4 * sizeof(int32_t));

    /* what does not fit is refused, naming why */
    assert_int_equal(shm_half_store(mirror, 1, 1, bytes, len - 4, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "the header says"));
    assert_int_equal(shm_half_store(mirror, 1, 1, bytes, 8, err), ERR_PROTOCOL);
    assert_int_equal(shm_half_store(mirror, 2, 0, bytes, len, err), ERR_PROTOCOL);
    struct shm_half_wire_header h;
    memcpy(&h, bytes, sizeof h);
    h.k = (uint32_t)k_max + 1; /* first 1 + k past k_max + 1 */
    memcpy(bytes, &h, sizeof h);
    assert_int_equal(shm_half_store(mirror, 1, 1, bytes, len, err), ERR_PROTOCOL);
    h.k = 3;
    h.vocab = (uint32_t)vocab + 1;
    memcpy(bytes, &h, sizeof h);
    assert_int_equal(shm_half_store(mirror, 1, 1, bytes, len, err), ERR_PROTOCOL);
    assert_non_null(strstr(err, "q rows"));
    /* a mapped buffer is the draft's: never written from bytes */
    assert_int_equal(shm_half_store(owner, 0, 0, small, small_len, err), ERR_INVALID_ARG);
    /* a half being rewritten is not packed */
    shm_buffer_half_begin_write(owner, 0, 1);
    void *none = NULL;
    size_t none_len = 0;
    assert_int_equal(shm_half_pack(owner, 0, 1, 0, &none, &none_len, err), ERR_UNAVAILABLE);
    assert_null(none);
    free(bytes);
    free(small);
    shm_buffer_close(mirror);
    shm_buffer_close(owner);
    cJSON_Delete(desc);
}

int main(void)
{
    snprintf(instance, sizeof instance, "ut%ld", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_layout_is_aligned_and_sized),
        cmocka_unit_test(test_shm_buffer_second_mapping_sees_writes),
        cmocka_unit_test(test_shm_buffer_forked_child_reads_and_cannot_write),
        cmocka_unit_test(test_shm_buffer_half_wait_wakes_a_reader_in_another_process),
        cmocka_unit_test(test_shm_buffer_bad_descriptors_are_rejected),
        cmocka_unit_test(test_shm_half_protocol_refuses_rewritten_halves),
        cmocka_unit_test(test_shm_half_reader_never_accepts_a_torn_half),
        cmocka_unit_test(test_shm_buffer_cuda_ipc_descriptor_round_trips),
        cmocka_unit_test(test_shm_buffer_cleanup_removes_only_dead_owners),
        cmocka_unit_test(test_shm_buffer_owner_awaits_its_readers),
        cmocka_unit_test(test_shm_half_bytes_round_trip_into_a_frames_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
