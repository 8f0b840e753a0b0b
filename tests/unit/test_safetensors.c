/* test_safetensors.c: the safetensors reader and writer.
 *
 * Bad files are crafted byte by byte in a fresh temporary directory: each
 * must give an error that names the file (and the tensor, where there is
 * one), never a crash (the ASan build runs these too).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "tmpdir_fixture.h"
#include "safetensors.h"

static int setup(void **state) { return tmpdir_fixture_setup(state, "test_safetensors"); }
static int teardown(void **state) { return tmpdir_fixture_teardown(state); }

static char *path_in(const struct tmpdir_fixture *f, const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", f->dir, name);
    return buf;
}

static void write_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (n > 0)
        assert_int_equal(fwrite(bytes, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long size = ftell(fp);
    assert_true(size >= 0);
    assert_int_equal(fseek(fp, 0, SEEK_SET), 0);
    unsigned char *buf = malloc((size_t)size + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)size, fp), (size_t)size);
    fclose(fp);
    *n = (size_t)size;
    return buf;
}

/* A raw safetensors file: the 8-byte length (header_len_field), the header
 * text, then data_len bytes of 0xAB. */
static void write_raw(const char *path, uint64_t header_len_field, const char *header,
                      size_t data_len)
{
    size_t hl = strlen(header);
    size_t n = 8 + hl + data_len;
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(header_len_field >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, 0xAB, data_len);
    write_bytes(path, buf, n);
    free(buf);
}

/* write_raw with the header padded by spaces to a multiple of 8 bytes (as
 * real writers do, so the data region is 8-byte aligned). */
static void write_hdr(const char *path, const char *header, size_t data_len)
{
    size_t hl = strlen(header);
    size_t padded_len = (hl + 7) / 8 * 8;
    char *padded = malloc(padded_len + 1);
    assert_non_null(padded);
    memcpy(padded, header, hl);
    memset(padded + hl, ' ', padded_len - hl);
    padded[padded_len] = '\0';
    write_raw(path, padded_len, padded, data_len);
    free(padded);
}

/* Opens path expecting failure `code` with a message containing each of the
 * NULL-terminated strings. */
static void expect_open_fails(const char *path, int code, ...)
{
    struct safetensors *st = (struct safetensors *)1;
    char err[ERR_MSG_MAX] = "";
    int rc = safetensors_open(&st, path, err);
    if (rc != code)
        print_error("open %s: rc %d (%s), expected %d\n", path, rc, err, code);
    assert_int_equal(rc, code);
    assert_null(st);
    assert_null(strchr(err, '\n'));
    va_list ap;
    va_start(ap, code);
    const char *needle;
    while ((needle = va_arg(ap, const char *)) != NULL) {
        if (!strstr(err, needle))
            print_error("message \"%s\" lacks \"%s\"\n", err, needle);
        assert_non_null(strstr(err, needle));
    }
    va_end(ap);
}

/* Two small tensors written with the writer: "a" F32 [2,3], "b" BF16 [4]. */
static void write_small(const char *path, float *a, uint16_t *b)
{
    for (int i = 0; i < 6; i++)
        a[i] = (float)i * 0.5f - 1.0f;
    for (int i = 0; i < 4; i++)
        b[i] = (uint16_t)(0x3f80 + i);
    struct safetensors_entry e[2] = {
        {.name = "a", .dtype = KERN_DTYPE_F32, .n_dims = 2, .shape = {2, 3}, .data = a},
        {.name = "b", .dtype = KERN_DTYPE_BF16, .n_dims = 1, .shape = {4}, .data = b},
    };
    char err[ERR_MSG_MAX] = "";
    int rc = safetensors_write(path, e, 2, err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
}

static void test_safetensors_write_then_open_round_trips(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "rt.safetensors", path, sizeof(path));
    float a[6];
    uint16_t b[4];
    uint16_t h[3] = {0x3c00, 0x4000, 0xc000};
    for (int i = 0; i < 6; i++)
        a[i] = (float)i * 0.25f;
    for (int i = 0; i < 4; i++)
        b[i] = (uint16_t)(0x4000 + 3 * i);
    struct safetensors_entry e[3] = {
        {.name = "model.z", .dtype = KERN_DTYPE_F32, .n_dims = 2, .shape = {3, 2}, .data = a},
        {.name = "model.a", .dtype = KERN_DTYPE_BF16, .n_dims = 1, .shape = {4}, .data = b},
        {.name = "scalar\"q", .dtype = KERN_DTYPE_F16, .n_dims = 1, .shape = {3}, .data = h},
    };
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(safetensors_write(path, e, 3, err), 0);

    /* The header length is a multiple of 8 and the metadata is there. */
    size_t n;
    unsigned char *raw = read_bytes(path, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | raw[i];
    assert_int_equal(hl % 8, 0);
    assert_int_equal(n, 8 + hl + sizeof(a) + sizeof(b) + sizeof(h));
    char *header = calloc(1, hl + 1);
    assert_non_null(header);
    memcpy(header, raw + 8, hl);
    assert_non_null(strstr(header, "\"__metadata__\":{\"format\":\"pt\"}"));
    /* Data in the order given. */
    assert_memory_equal(raw + 8 + hl, a, sizeof(a));
    assert_memory_equal(raw + 8 + hl + sizeof(a), b, sizeof(b));
    free(header);
    free(raw);

    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, path, err), 0);
    assert_int_equal(safetensors_count(st), 3);
    const struct safetensors_tensor *t = safetensors_find(st, "model.z");
    assert_non_null(t);
    assert_int_equal(t->dtype, KERN_DTYPE_F32);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->shape[1], 2);
    assert_int_equal(t->size_bytes, sizeof(a));
    assert_memory_equal(t->data, a, sizeof(a));
    assert_string_equal(t->file_path, path);
    assert_int_equal((uintptr_t)t->data % 4, 0);
    t = safetensors_find(st, "model.a");
    assert_non_null(t);
    assert_int_equal(t->dtype, KERN_DTYPE_BF16);
    assert_memory_equal(t->data, b, sizeof(b));
    t = safetensors_find(st, "scalar\"q");
    assert_non_null(t);
    assert_int_equal(t->dtype, KERN_DTYPE_F16);
    assert_memory_equal(t->data, h, sizeof(h));
    /* Index order is name order, and at() covers every tensor once. */
    assert_string_equal(safetensors_at(st, 0)->name, "model.a");
    assert_string_equal(safetensors_at(st, 1)->name, "model.z");
    assert_string_equal(safetensors_at(st, 2)->name, "scalar\"q");
    assert_null(safetensors_at(st, 3));
    assert_null(safetensors_find(st, "model.b"));
    safetensors_close(st);
    safetensors_close(NULL);
}

static void test_safetensors_metadata_and_padding_are_accepted(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "meta.safetensors", path, sizeof(path));
    const char *header = "{\"__metadata__\":{\"format\":\"pt\",\"x\":\"y\"},"
                         "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}   ";
    write_hdr(path, header, 8);
    struct safetensors *st = NULL;
    char err[ERR_MSG_MAX] = "";
    int rc = safetensors_open(&st, path, err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(safetensors_count(st), 1);
    const struct safetensors_tensor *t = safetensors_find(st, "w");
    assert_non_null(t);
    assert_int_equal(((const unsigned char *)t->data)[7], 0xAB);
    safetensors_close(st);
}

static void test_safetensors_truncated_file_is_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "short.safetensors", path, sizeof(path));
    /* Shorter than the 8-byte length itself. */
    write_bytes(path, "\x10\x00\x00", 3);
    expect_open_fails(path, ERR_FORMAT, path, "truncated", NULL);
    write_bytes(path, "", 0);
    expect_open_fails(path, ERR_FORMAT, path, "truncated", NULL);

    /* A valid file cut anywhere must be rejected, never read past its end. */
    char full[256];
    path_in(f, "full.safetensors", full, sizeof(full));
    float a[6];
    uint16_t b[4];
    write_small(full, a, b);
    size_t n;
    unsigned char *raw = read_bytes(full, &n);
    for (size_t cut = 0; cut < n; cut++) {
        write_bytes(path, raw, cut);
        struct safetensors *st = NULL;
        char err[ERR_MSG_MAX] = "";
        int rc = safetensors_open(&st, path, err);
        if (rc == 0)
            print_error("cut at %zu of %zu opened\n", cut, n);
        assert_int_equal(rc, ERR_FORMAT);
        assert_non_null(strstr(err, path));
    }
    /* Cut inside the data: the message names the tensor that no longer fits. */
    write_bytes(path, raw, n - 2);
    expect_open_fails(path, ERR_FORMAT, path, "tensor b", "data_offsets", NULL);
    free(raw);
}

static void test_safetensors_oversized_header_length_is_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "big.safetensors", path, sizeof(path));
    const char *header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    /* Longer than the file by one byte. */
    write_raw(path, strlen(header) + 5, header, 4);
    expect_open_fails(path, ERR_FORMAT, path, "header length", NULL);
    /* Absurd lengths, including ones that overflow when 8 is added. */
    write_raw(path, (uint64_t)1 << 40, header, 4);
    expect_open_fails(path, ERR_FORMAT, path, "header length", NULL);
    write_raw(path, UINT64_MAX, header, 4);
    expect_open_fails(path, ERR_FORMAT, path, "header length", NULL);
    write_raw(path, UINT64_MAX - 7, header, 4);
    expect_open_fails(path, ERR_FORMAT, path, "header length", NULL);
    /* Zero length: no JSON object at all. */
    write_raw(path, 0, header, 4);
    expect_open_fails(path, ERR_FORMAT, path, NULL);
}

static void test_safetensors_overlapping_offsets_are_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "overlap.safetensors", path, sizeof(path));
    const char *header = "{\"first\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                         "\"second\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    write_hdr(path, header, 12);
    expect_open_fails(path, ERR_FORMAT, path, "tensor second", "overlap", "first", NULL);

    /* One tensor entirely inside another, listed first. */
    header = "{\"inner\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
             "\"outer\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    write_hdr(path, header, 16);
    expect_open_fails(path, ERR_FORMAT, path, "overlap", "inner", "outer", NULL);

    /* The same range twice, with an empty tensor in between the starts. */
    header = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
    write_hdr(path, header, 8);
    expect_open_fails(path, ERR_FORMAT, path, "overlap", NULL);

    /* Adjacent ranges and an empty tensor on a boundary are fine. */
    header = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
             "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}";
    write_hdr(path, header, 12);
    struct safetensors *st = NULL;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(safetensors_open(&st, path, err), 0);
    assert_int_equal(safetensors_count(st), 3);
    safetensors_close(st);
}

static void test_safetensors_out_of_range_offsets_are_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "range.safetensors", path, sizeof(path));
    /* End past the data region. */
    const char *header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    write_hdr(path, header, 12);
    expect_open_fails(path, ERR_FORMAT, path, "tensor w", "out of range", NULL);
    /* Begin after end. */
    header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}";
    write_hdr(path, header, 12);
    expect_open_fails(path, ERR_FORMAT, path, "tensor w", "out of range", NULL);
    /* Huge offsets that would wrap a pointer. */
    header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[18446744073709551612,18446744073709551616]}}";
    write_hdr(path, header, 12);
    expect_open_fails(path, ERR_FORMAT, path, "tensor w", "data_offsets", NULL);
    /* Negative, fractional, wrong count, wrong type. */
    const char *bad[] = {
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":\"0-4\"}}",
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_hdr(path, bad[i], 12);
        expect_open_fails(path, ERR_FORMAT, path, "tensor w", "data_offsets", NULL);
    }
}

static void test_safetensors_unsupported_dtype_is_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "i8.safetensors", path, sizeof(path));
    const char *header = "{\"q\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
    write_hdr(path, header, 4);
    expect_open_fails(path, ERR_UNSUPPORTED, path, "tensor q", "I8", NULL);
    header = "{\"q\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,4]}}";
    write_hdr(path, header, 4);
    expect_open_fails(path, ERR_FORMAT, path, "tensor q", "dtype", NULL);
    /* More dims than supported. */
    header = "{\"q\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}";
    write_hdr(path, header, 4);
    expect_open_fails(path, ERR_UNSUPPORTED, path, "tensor q", "dims", NULL);
}

static void test_safetensors_byte_length_mismatch_is_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "len.safetensors", path, sizeof(path));
    /* F32 [2,3] needs 24 bytes, the offsets give 20. */
    const char *header = "{\"m\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}";
    write_hdr(path, header, 24);
    expect_open_fails(path, ERR_FORMAT, path, "tensor m", "[2, 3]", NULL);
    /* BF16 [2,3] needs 12, not 24. */
    header = "{\"m\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    write_hdr(path, header, 24);
    expect_open_fails(path, ERR_FORMAT, path, "tensor m", "BF16", NULL);
    /* A shape whose product overflows 64 bits. */
    header = "{\"m\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
             "\"data_offsets\":[0,0]}}";
    write_hdr(path, header, 24);
    expect_open_fails(path, ERR_FORMAT, path, "tensor m", NULL);
    /* Bad extents. */
    header = "{\"m\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}";
    write_hdr(path, header, 24);
    expect_open_fails(path, ERR_FORMAT, path, "tensor m", "shape", NULL);
    header = "{\"m\":{\"dtype\":\"F32\",\"shape\":3,\"data_offsets\":[0,12]}}";
    write_hdr(path, header, 24);
    expect_open_fails(path, ERR_FORMAT, path, "tensor m", "shape", NULL);
}

static void test_safetensors_malformed_json_header_is_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "json.safetensors", path, sizeof(path));
    const char *bad[] = {
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}",  /* unclosed */
        "{\"w\":{\"dtype\":\"F32\",,\"shape\":[1],\"data_offsets\":[0,4]}}", /* ,, */
        "[1,2,3]",                                                          /* not object */
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}xx", /* trailing */
        "{\"w\":[1,2]}",                                                     /* entry type */
        "{\"__metadata__\":\"pt\"}",                                         /* metadata type */
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", /* duplicate key */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        write_hdr(path, bad[i], 8);
        expect_open_fails(path, ERR_FORMAT, path, NULL);
    }
    /* The header length cuts the JSON short. */
    const char *good = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    write_raw(path, strlen(good) - 3, good, 8);
    expect_open_fails(path, ERR_FORMAT, path, "JSON", NULL);
}

static void test_safetensors_misaligned_data_is_rejected(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "align.safetensors", path, sizeof(path));
    /* F32 starting 2 bytes into an 8-aligned data region. */
    const char *header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[2,6]}}";
    char padded[128];
    snprintf(padded, sizeof(padded), "%s", header);
    while ((8 + strlen(padded)) % 8 != 0)
        strcat(padded, " ");
    write_hdr(path, padded, 8);
    expect_open_fails(path, ERR_UNSUPPORTED, path, "tensor w", "aligned", NULL);
}

static void test_safetensors_missing_tensor_is_reported(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "m.safetensors", path, sizeof(path));
    float a[6];
    uint16_t b[4];
    write_small(path, a, b);
    struct safetensors *st = NULL;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(safetensors_open(&st, path, err), 0);
    assert_null(safetensors_find(st, "model.norm.weight"));
    const int64_t shape[1] = {4};
    const struct safetensors_tensor *t = (const void *)1;
    assert_int_equal(safetensors_expect(st, "model.norm.weight", 1, shape, &t, err),
                     ERR_NOT_FOUND);
    assert_null(t);
    assert_non_null(strstr(err, "model.norm.weight"));
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "missing"));
    safetensors_close(st);
}

static void test_safetensors_shape_mismatch_names_file_and_tensor(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256];
    path_in(f, "s.safetensors", path, sizeof(path));
    float a[6];
    uint16_t b[4];
    write_small(path, a, b);
    struct safetensors *st = NULL;
    char err[ERR_MSG_MAX] = "";
    assert_int_equal(safetensors_open(&st, path, err), 0);

    const int64_t wrong[2] = {3, 2};
    assert_int_equal(safetensors_expect(st, "a", 2, wrong, NULL, err), ERR_MISMATCH);
    char want[ERR_MSG_MAX];
    snprintf(want, sizeof(want), "%s: tensor a: shape [2, 3] expected [3, 2]", path);
    assert_string_equal(err, want);

    const int64_t flat[1] = {6};
    assert_int_equal(safetensors_expect(st, "a", 1, flat, NULL, err), ERR_MISMATCH);
    snprintf(want, sizeof(want), "%s: tensor a: shape [2, 3] expected [6]", path);
    assert_string_equal(err, want);

    const int64_t right[2] = {2, 3};
    const struct safetensors_tensor *t = NULL;
    assert_int_equal(safetensors_expect(st, "a", 2, right, &t, err), 0);
    assert_non_null(t);
    assert_memory_equal(t->data, a, sizeof(a));
    safetensors_close(st);
}

static void write_index(const char *path, const char *json)
{
    write_bytes(path, json, strlen(json));
}

static void test_safetensors_sharded_directory_round_trips(void **state)
{
    struct tmpdir_fixture *f = *state;
    char p1[256], p2[256], pi[256], err[ERR_MSG_MAX] = "";
    path_in(f, "model-00001-of-00002.safetensors", p1, sizeof(p1));
    path_in(f, "model-00002-of-00002.safetensors", p2, sizeof(p2));
    path_in(f, "model.safetensors.index.json", pi, sizeof(pi));
    uint16_t emb[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint16_t norm[2] = {0x3f80, 0x3f80};
    float up[3 * 2] = {1, 2, 3, 4, 5, 6};
    struct safetensors_entry s1[2] = {
        {.name = "model.embed_tokens.weight", .dtype = KERN_DTYPE_BF16, .n_dims = 2,
         .shape = {4, 2}, .data = emb},
        {.name = "model.norm.weight", .dtype = KERN_DTYPE_BF16, .n_dims = 1, .shape = {2},
         .data = norm},
    };
    struct safetensors_entry s2[1] = {
        {.name = "model.layers.0.mlp.up_proj.weight", .dtype = KERN_DTYPE_F32, .n_dims = 2,
         .shape = {3, 2}, .data = up},
    };
    assert_int_equal(safetensors_write(p1, s1, 2, err), 0);
    assert_int_equal(safetensors_write(p2, s2, 1, err), 0);
    write_index(pi, "{\"metadata\":{\"total_size\":44},\"weight_map\":{"
                    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                    "\"model.layers.0.mlp.up_proj.weight\":\"model-00002-of-00002.safetensors\","
                    "\"model.norm.weight\":\"model-00001-of-00002.safetensors\"}}");

    struct safetensors *st = NULL;
    int rc = safetensors_open(&st, f->dir, err);
    if (rc != 0)
        print_error("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(safetensors_count(st), 3);
    const struct safetensors_tensor *t = safetensors_find(st, "model.layers.0.mlp.up_proj.weight");
    assert_non_null(t);
    assert_string_equal(t->file_path, p2);
    assert_memory_equal(t->data, up, sizeof(up));
    t = safetensors_find(st, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_string_equal(t->file_path, p1);
    assert_memory_equal(t->data, emb, sizeof(emb));
    /* A shape mismatch in the second shard names that shard. */
    const int64_t wrong[2] = {2, 3};
    assert_int_equal(safetensors_expect(st, "model.layers.0.mlp.up_proj.weight", 2, wrong, NULL,
                                        err),
                     ERR_MISMATCH);
    assert_non_null(strstr(err, p2));
    safetensors_close(st);

    /* The index promises a tensor its shard does not hold. */
    write_index(pi, "{\"weight_map\":{"
                    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                    "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(f->dir, ERR_FORMAT, pi, "lm_head.weight", NULL);
    /* The index names a tensor that lives in the other shard. */
    write_index(pi, "{\"weight_map\":{"
                    "\"model.norm.weight\":\"model-00002-of-00002.safetensors\","
                    "\"model.layers.0.mlp.up_proj.weight\":\"model-00001-of-00002.safetensors\"}}");
    expect_open_fails(f->dir, ERR_FORMAT, "model.", NULL);
    /* The index names a shard that does not exist. */
    write_index(pi, "{\"weight_map\":{\"model.norm.weight\":\"model-00009-of-00009.safetensors\"}}");
    expect_open_fails(f->dir, ERR_NOT_FOUND, "model-00009-of-00009.safetensors", NULL);
    /* A shard name escaping the directory, bad JSON, no weight_map. */
    write_index(pi, "{\"weight_map\":{\"model.norm.weight\":\"../x.safetensors\"}}");
    expect_open_fails(f->dir, ERR_FORMAT, pi, "weight_map", NULL);
    write_index(pi, "{\"weight_map\":");
    expect_open_fails(f->dir, ERR_FORMAT, pi, NULL);
    write_index(pi, "{\"metadata\":{}}");
    expect_open_fails(f->dir, ERR_FORMAT, pi, "weight_map", NULL);
    /* The same tensor in two shards. */
    struct safetensors_entry dup[1] = {s1[1]};
    assert_int_equal(safetensors_write(p2, dup, 1, err), 0);
    write_index(pi, "{\"weight_map\":{"
                    "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                    "\"model.norm.weight\":\"model-00002-of-00002.safetensors\"}}");
    expect_open_fails(f->dir, ERR_FORMAT, "model.norm.weight", "duplicate", NULL);
}

static void test_safetensors_directory_with_single_file_opens(void **state)
{
    struct tmpdir_fixture *f = *state;
    char err[ERR_MSG_MAX] = "";
    expect_open_fails(f->dir, ERR_NOT_FOUND, f->dir, "model.safetensors", NULL);
    char path[256];
    path_in(f, "model.safetensors", path, sizeof(path));
    float a[6];
    uint16_t b[4];
    write_small(path, a, b);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, f->dir, err), 0);
    assert_int_equal(safetensors_count(st), 2);
    assert_string_equal(safetensors_find(st, "b")->file_path, path);
    safetensors_close(st);
    char missing[256];
    path_in(f, "nope.safetensors", missing, sizeof(missing));
    expect_open_fails(missing, ERR_NOT_FOUND, missing, NULL);
}

static void test_safetensors_write_rejects_bad_entries(void **state)
{
    struct tmpdir_fixture *f = *state;
    char path[256], err[ERR_MSG_MAX] = "";
    path_in(f, "w.safetensors", path, sizeof(path));
    float x[4] = {0};
    struct safetensors_entry e[2] = {
        {.name = "t", .dtype = KERN_DTYPE_F32, .n_dims = 1, .shape = {4}, .data = x},
        {.name = "t", .dtype = KERN_DTYPE_F32, .n_dims = 1, .shape = {4}, .data = x},
    };
    assert_int_equal(safetensors_write(path, e, 2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "duplicate"));
    e[1].name = "u";
    e[1].n_dims = 5;
    assert_int_equal(safetensors_write(path, e, 2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "tensor u"));
    e[1].n_dims = 1;
    e[1].data = NULL;
    assert_int_equal(safetensors_write(path, e, 2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "tensor u"));
    e[1].data = x;
    e[1].shape[0] = -3;
    assert_int_equal(safetensors_write(path, e, 2, err), ERR_INVALID_ARG);
    /* BF16 of odd length followed by F32 would misalign the F32. */
    e[0].dtype = KERN_DTYPE_BF16;
    e[0].shape[0] = 3;
    e[1].shape[0] = 1;
    assert_int_equal(safetensors_write(path, e, 2, err), ERR_INVALID_ARG);
    assert_non_null(strstr(err, "aligned"));
    assert_int_equal(access(path, F_OK), -1);
    /* Unwritable location. */
    e[0].dtype = KERN_DTYPE_F32;
    e[0].shape[0] = 4;
    assert_int_equal(safetensors_write("/nonexistent-dir/x.safetensors", e, 2, err), ERR_IO);
    assert_non_null(strstr(err, "/nonexistent-dir/x.safetensors"));
    /* Zero tensors is a valid (empty) file. */
    assert_int_equal(safetensors_write(path, NULL, 0, err), 0);
    struct safetensors *st = NULL;
    assert_int_equal(safetensors_open(&st, path, err), 0);
    assert_int_equal(safetensors_count(st), 0);
    safetensors_close(st);
}

/* Every single-byte corruption of a valid file's header either still opens
 * (with every tensor inside the file) or fails with a message naming the
 * file: never a crash or an out-of-bounds read (checked under ASan). */
static void test_safetensors_corrupted_bytes_never_crash(void **state)
{
    struct tmpdir_fixture *f = *state;
    char full[256], path[256];
    path_in(f, "good.safetensors", full, sizeof(full));
    path_in(f, "bad.safetensors", path, sizeof(path));
    float a[6];
    uint16_t b[4];
    write_small(full, a, b);
    size_t n;
    unsigned char *raw = read_bytes(full, &n);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | raw[i];
    const unsigned char values[] = {0x00, 0x01, '"', '9', '[', ']', '{', '}', ',', '-', 0xff};
    size_t n_ok = 0, n_fail = 0;
    for (size_t pos = 0; pos < 8 + hl; pos++) {
        for (size_t v = 0; v < sizeof(values); v++) {
            unsigned char saved = raw[pos];
            if (saved == values[v])
                continue;
            raw[pos] = values[v];
            write_bytes(path, raw, n);
            raw[pos] = saved;
            struct safetensors *st = NULL;
            char err[ERR_MSG_MAX] = "";
            int rc = safetensors_open(&st, path, err);
            if (rc == 0) {
                n_ok++;
                for (size_t i = 0; i < safetensors_count(st); i++) {
                    const struct safetensors_tensor *t = safetensors_at(st, i);
                    volatile unsigned char sink = 0;
                    for (size_t k = 0; k < t->size_bytes; k++)
                        sink ^= ((const unsigned char *)t->data)[k];
                    (void)sink;
                }
                safetensors_close(st);
            } else {
                n_fail++;
                assert_true(rc < 0);
                assert_non_null(strstr(err, path));
            }
        }
    }
    assert_true(n_fail > 0);
    free(raw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_safetensors_write_then_open_round_trips, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_metadata_and_padding_are_accepted, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_truncated_file_is_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_oversized_header_length_is_rejected,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_overlapping_offsets_are_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_out_of_range_offsets_are_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_unsupported_dtype_is_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_byte_length_mismatch_is_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_malformed_json_header_is_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_misaligned_data_is_rejected, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_missing_tensor_is_reported, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_shape_mismatch_names_file_and_tensor,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_sharded_directory_round_trips, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_directory_with_single_file_opens, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_write_rejects_bad_entries, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_safetensors_corrupted_bytes_never_crash, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
