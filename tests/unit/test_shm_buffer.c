/* test_shm_buffer.c: the POSIX shared tensor buffer: create, export, import
 * (second mapping and forked child), layout, cleanup, bad descriptors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "error.h"
#include "shm_buffer.h"

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
    struct shm_half_header *h = shm_buffer_half_header(b, slot, half);
    int32_t *t = shm_buffer_half_tokens(b, slot, half);
    float *q = shm_buffer_half_q(b, slot, half);
    const struct shm_layout *lay = shm_buffer_layout(b);
    h->req = req;
    h->round = (uint32_t)(slot * 10 + half);
    h->k = 3;
    h->first = 0;
    for (int i = 0; i <= lay->k_max; i++)
        t[i] = (int32_t)(1000 * slot + 100 * half + i);
    for (int r = 0; r <= lay->k_max; r++)
        for (int v = 0; v < lay->vocab; v++)
            q[(size_t)r * lay->vocab + v] = (float)(slot + half * 0.5 + r * 0.01 + v);
    shm_buffer_publish(b);
}

static int check_half(struct shm_buffer *b, int slot, int half, uint64_t req)
{
    shm_buffer_acquire(b);
    struct shm_half_header *h = shm_buffer_half_header(b, slot, half);
    int32_t *t = shm_buffer_half_tokens(b, slot, half);
    float *q = shm_buffer_half_q(b, slot, half);
    const struct shm_layout *lay = shm_buffer_layout(b);
    if (h->req != req || h->round != (uint32_t)(slot * 10 + half) || h->k != 3)
        return 0;
    for (int i = 0; i <= lay->k_max; i++)
        if (t[i] != (int32_t)(1000 * slot + 100 * half + i))
            return 0;
    for (int r = 0; r <= lay->k_max; r++)
        for (int v = 0; v < lay->vocab; v++)
            if (q[(size_t)r * lay->vocab + v] != (float)(slot + half * 0.5 + r * 0.01 + v))
                return 0;
    return 1;
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
        /* A fresh import from the descriptor's text, as the target does. */
        cJSON *d = cJSON_Parse(text);
        struct shm_buffer *peer = NULL;
        char cerr[ERR_MSG_MAX];
        if (!d || shm_buffer_import(&peer, d, cerr) != 0)
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

int main(void)
{
    snprintf(instance, sizeof instance, "ut%ld", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shm_layout_is_aligned_and_sized),
        cmocka_unit_test(test_shm_buffer_second_mapping_sees_writes),
        cmocka_unit_test(test_shm_buffer_forked_child_reads_and_cannot_write),
        cmocka_unit_test(test_shm_buffer_bad_descriptors_are_rejected),
        cmocka_unit_test(test_shm_buffer_cleanup_removes_only_dead_owners),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
