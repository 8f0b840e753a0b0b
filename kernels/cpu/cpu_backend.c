/* cpu_backend.c: the CPU backend's lifetime, memory ops and op table.
 *
 * Memory is plain host memory. alloc() returns 64-byte aligned, zero-filled
 * buffers from calloc (large ones come from fresh anonymous mappings and stay
 * uncommitted until touched); the pointer calloc gave is kept in the 8 bytes
 * just before the aligned block so free() can find it. upload/download/copy
 * are memcpy; sync is a no-op because every op finishes before it returns.
 *
 * map_weights(): a weight tensor of at least CPU_WEIGHT_COPY_MIN bytes is
 * copied into anonymous memory, 2 MiB aligned and advised for transparent
 * huge pages; smaller ones (norms) are used in place. Why: a decode step
 * streams every weight once, and the caller's bytes are usually an mmapped
 * file, i.e. 4 KiB pages. Over a 2.5 GB model that is a TLB miss (and, in a
 * VM, a two-level page walk) every 4 KiB, and the hardware prefetchers stop at
 * every 4 KiB boundary: measured on the 2-core Zen 5 VM, the bf16 matvec read
 * the mmapped 1B model at 18-25 GB/s and the same bytes in huge pages at
 * 30-35 GB/s. The cost is one copy at load (about a second for 2.5 GB) and
 * the copy's memory; the file's page cache is left to the kernel to reclaim.
 * Where the kernel has no transparent huge pages (or they are off) nothing
 * is copied. The copy changes no value, so no result.
 *
 * Not here: the ops themselves (one file each), the thread pool (cpu_pool.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bfdot.h"
#include "cpu_backend.h"
#include "packed.h"
#include "qdot.h"
#include "error.h"

#define CPU_ALIGN 64
#define CPU_HUGE_PAGE ((size_t)2 << 20)
#define CPU_WEIGHT_COPY_MIN CPU_HUGE_PAGE
#define CPU_BF16_DOT_ENV "TANDEM_CPU_BF16_DOT"

/* One weight tensor copied into huge-page memory: the mapping [base, base + len). */
struct cpu_weight_copy {
    void *base;
    size_t len;
    int packed_rows, d_in; /* map_matrix packed it (packed.h): rows in octets; else 0 */
    enum cpu_layout layout; /* which octets (CPU_LAYOUT_ROWS where none) */
    int qrows, qd_in;      /* map_matrix's int8/int4 panels (qdot.h): the matrix's shape */
    enum kern_dtype qdtype;
};

int cpu_backend_check_dtype(enum kern_dtype dtype, const char *what, char *err)
{
    switch (dtype) {
    case KERN_DTYPE_BF16:
    case KERN_DTYPE_F16:
    case KERN_DTYPE_F32: return 0;
    case KERN_DTYPE_Q8:
    case KERN_DTYPE_Q4:
        return error_set(err, ERR_UNSUPPORTED, "cpu %s: %s weights are for matmul only", what,
                         kern_dtype_name(dtype));
    }
    return error_set(err, ERR_UNSUPPORTED, "cpu %s: unsupported weight dtype %d", what, (int)dtype);
}

/* A fresh anonymous mapping of len bytes (a multiple of CPU_HUGE_PAGE) that
 * starts on a huge page, advised to be backed by them: mapped one huge page
 * larger, then trimmed. NULL with errno set on failure, *failed naming the
 * call ("mmap" or "munmap"); nothing is left mapped then. Advice only:
 * without huge pages the memory is merely slower. */
static char *cpu_huge_mapping(size_t len, const char **failed)
{
    char *raw = mmap(NULL, len + CPU_HUGE_PAGE, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) {
        *failed = "mmap";
        return NULL;
    }
    char *base = (char *)(((uintptr_t)raw + CPU_HUGE_PAGE - 1) & ~(uintptr_t)(CPU_HUGE_PAGE - 1));
    const size_t head = (size_t)(base - raw), tail = CPU_HUGE_PAGE - head;
    if ((head && munmap(raw, head) != 0) || (tail && munmap(base + len, tail) != 0)) {
        const int e = errno;
        munmap(raw, len + CPU_HUGE_PAGE); /* whatever is left of it */
        errno = e;
        *failed = "munmap";
        return NULL;
    }
    (void)madvise(base, len, MADV_HUGEPAGE);
    return base;
}

/* The word before a buffer cpu_aligned_calloc handed out: the pointer calloc
 * returned, or CPU_MAPPED for a mapping of its own, whose length is in the
 * word before that. */
#define CPU_MAPPED ((uintptr_t)1)

/* Zeroed, CPU_ALIGN-aligned memory. From CPU_HUGE_PAGE up, an anonymous
 * mapping of its own that starts on a huge page and is advised to be backed
 * by them: the KV cache is such a buffer, and attention walks each kv head's
 * slice of it at a stride of a whole cache row (1-2 KiB), a new 4 KiB page
 * every few positions: with small pages, a TLB miss every few positions. */
static void *cpu_aligned_calloc(size_t size_bytes)
{
    if (size_bytes > SIZE_MAX - 2 * CPU_HUGE_PAGE)
        return NULL;
    if (size_bytes >= CPU_HUGE_PAGE) {
        const size_t len =
            (size_bytes + CPU_ALIGN + CPU_HUGE_PAGE - 1) & ~(CPU_HUGE_PAGE - 1);
        const char *failed;
        char *base = cpu_huge_mapping(len, &failed);
        if (!base)
            return NULL;
        const uintptr_t mark = CPU_MAPPED;
        memcpy(base + CPU_ALIGN - sizeof(void *), &mark, sizeof mark);
        memcpy(base + CPU_ALIGN - 2 * sizeof(void *), &len, sizeof len);
        return base + CPU_ALIGN;
    }
    char *raw = calloc(1, size_bytes + CPU_ALIGN + sizeof(void *));
    if (!raw)
        return NULL;
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + CPU_ALIGN - 1) & ~(uintptr_t)(CPU_ALIGN - 1);
    memcpy((char *)p - sizeof(void *), &raw, sizeof(raw));
    return (void *)p;
}

static void cpu_aligned_free(void *ptr)
{
    if (!ptr)
        return;
    char *raw;
    uintptr_t mark;
    memcpy(&mark, (char *)ptr - sizeof(void *), sizeof(mark));
    if (mark == CPU_MAPPED) {
        size_t len;
        memcpy(&len, (char *)ptr - 2 * sizeof(void *), sizeof len);
        /* cannot fail on a mapping this file made; nothing to report to */
        (void)munmap((char *)ptr - CPU_ALIGN, len);
        return;
    }
    memcpy(&raw, (char *)ptr - sizeof(void *), sizeof(raw));
    free(raw);
}

int cpu_backend_scratch_reserve(struct cpu_backend *cb, size_t bytes_per_thread, char *err)
{
    if (bytes_per_thread <= cb->scratch_bytes)
        return 0;
    size_t want = cb->scratch_bytes ? cb->scratch_bytes : 4096;
    while (want < bytes_per_thread)
        want = want > SIZE_MAX / 2 ? bytes_per_thread : want * 2;
    for (int t = 0; t < cb->n_threads; t++) {
        cpu_aligned_free(cb->scratch[t]);
        cb->scratch[t] = NULL;
    }
    cb->scratch_bytes = 0;
    for (int t = 0; t < cb->n_threads; t++) {
        cb->scratch[t] = cpu_aligned_calloc(want);
        if (!cb->scratch[t])
            return error_set(err, ERR_NOMEM, "cpu backend: out of memory for %zu bytes of scratch",
                             want);
    }
    cb->scratch_bytes = want;
    return 0;
}

static void cpu_destroy(struct kern_backend *be)
{
    if (!be)
        return;
    struct cpu_backend *cb = cpu_backend_of(be);
    cpu_pool_destroy(cb->pool);
    cpu_argmax_destroy(cb);
    for (int i = 0; i < cb->n_copies; i++)
        munmap(cb->copies[i].base, cb->copies[i].len);
    free(cb->copies);
    if (cb->scratch) {
        for (int t = 0; t < cb->n_threads; t++)
            cpu_aligned_free(cb->scratch[t]);
        free(cb->scratch);
    }
    free(cb);
}

static int cpu_alloc(struct kern_backend *be, size_t size_bytes, void **out, char *err)
{
    *out = cpu_aligned_calloc(size_bytes);
    if (!*out)
        return error_set(err, ERR_NOMEM, "cpu alloc: out of memory for %zu bytes", size_bytes);
    return 0;
}

static void cpu_free(struct kern_backend *be, void *ptr)
{
    cpu_aligned_free(ptr);
}

static int cpu_memcpy_op(const char *what, void *dst, const void *src, size_t size_bytes,
                         char *err)
{
    if (size_bytes == 0)
        return 0;
    if (!dst || !src)
        return error_set(err, ERR_INVALID_ARG, "cpu %s: NULL pointer for %zu bytes", what,
                         size_bytes);
    memcpy(dst, src, size_bytes);
    return 0;
}

static int cpu_upload(struct kern_backend *be, void *dst, const void *src_host, size_t size_bytes,
                      char *err)
{
    return cpu_memcpy_op("upload", dst, src_host, size_bytes, err);
}

static int cpu_download(struct kern_backend *be, void *dst_host, const void *src, size_t size_bytes,
                        char *err)
{
    return cpu_memcpy_op("download", dst_host, src, size_bytes, err);
}

static int cpu_copy(struct kern_backend *be, void *dst, const void *src, size_t size_bytes,
                    char *err)
{
    return cpu_memcpy_op("copy", dst, src, size_bytes, err);
}

/* Whether this kernel gives anonymous memory transparent huge pages when
 * asked (madvise): the setting is "always" or "madvise", not "never". */
static int cpu_thp_available(void)
{
#ifdef MADV_HUGEPAGE
    char line[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return 0;
    const int ok = fgets(line, sizeof line, f) != NULL && strstr(line, "[never]") == NULL;
    fclose(f);
    return ok;
#else
    return 0;
#endif
}

/* Copies size_bytes from host_ptr into a fresh 2 MiB-aligned anonymous
 * mapping advised for huge pages, made read-only after the copy, and records
 * it for unmap_weights. *out = the copy. Returns 0, ERR_NOMEM or ERR_SYSTEM. */
/* Room for one more weight copy's record: 0 or ERR_NOMEM. */
static int cpu_copies_reserve(struct cpu_backend *cb, char *err)
{
    if (cb->n_copies == cb->cap_copies) {
        int cap = cb->cap_copies ? 2 * cb->cap_copies : 64;
        struct cpu_weight_copy *grown = realloc(cb->copies, (size_t)cap * sizeof(*grown));
        if (!grown)
            return error_set(err, ERR_NOMEM, "cpu map_weights: out of memory");
        cb->copies = grown;
        cb->cap_copies = cap;
    }
    return 0;
}

static int cpu_weight_copy_make(struct cpu_backend *cb, const void *host_ptr, size_t size_bytes,
                                int pack_rows, int pack_d_in, enum cpu_layout layout,
                                const void **out, char *err)
{
    int rc = cpu_copies_reserve(cb, err);
    if (rc < 0)
        return rc;
    if (size_bytes > SIZE_MAX - 2 * CPU_HUGE_PAGE)
        return error_set(err, ERR_NOMEM, "cpu map_weights: %zu bytes is too large", size_bytes);
    const size_t len = (size_bytes + CPU_HUGE_PAGE - 1) & ~(CPU_HUGE_PAGE - 1);
    const char *failed;
    char *base = cpu_huge_mapping(len, &failed);
    if (!base)
        return strcmp(failed, "mmap") == 0
                   ? error_set_errno(err, ERR_NOMEM, errno, "cpu map_weights: mmap(%zu bytes)",
                                     len + CPU_HUGE_PAGE)
                   : error_set_errno(err, ERR_SYSTEM, errno, "cpu map_weights: munmap (trimming)");
    memcpy(base, host_ptr, size_bytes);
    int packed_rows = 0;
    if (pack_rows > 0) {
        uint16_t *tmp = malloc((size_t)CPU_PACKED_ROWS * (size_t)pack_d_in * sizeof *tmp);
        if (!tmp) {
            munmap(base, len);
            return error_set(err, ERR_NOMEM, "cpu map_matrix: out of memory");
        }
        if (layout == CPU_LAYOUT_LINES)
            cpu_lines_pack((uint16_t *)(void *)base, pack_rows, pack_d_in, tmp);
        else
            cpu_packed_pack((uint16_t *)(void *)base, pack_rows, pack_d_in, tmp);
        free(tmp);
        packed_rows = pack_rows / CPU_PACKED_ROWS * CPU_PACKED_ROWS;
    }
    if (mprotect(base, len, PROT_READ) != 0) {
        int e = errno;
        munmap(base, len);
        return error_set_errno(err, ERR_SYSTEM, e, "cpu map_weights: mprotect(PROT_READ)");
    }
    cb->copies[cb->n_copies++] = (struct cpu_weight_copy){
        .base = base, .len = len, .packed_rows = packed_rows, .d_in = packed_rows ? pack_d_in : 0,
        .layout = packed_rows ? layout : CPU_LAYOUT_ROWS};
    *out = base;
    return 0;
}

/* map_weights and map_matrix: large tensors are copied (and, with pack_rows
 * > 0, packed in layout), small ones used in place. what: the op, for
 * errors. */
static int cpu_map(struct cpu_backend *cb, const char *what, const void *host_ptr,
                   size_t size_bytes, int pack_rows, int pack_d_in, enum cpu_layout layout,
                   const void **out, char *err)
{
    *out = NULL;
    if (!host_ptr && size_bytes > 0)
        return error_set(err, ERR_INVALID_ARG, "cpu %s: NULL pointer for %zu bytes", what,
                         size_bytes);
    if (cb->weight_copy && size_bytes >= CPU_WEIGHT_COPY_MIN)
        return cpu_weight_copy_make(cb, host_ptr, size_bytes, pack_rows, pack_d_in, layout, out,
                                    err);
    *out = host_ptr;
    return 0;
}

static int cpu_map_weights(struct kern_backend *be, const void *host_ptr, size_t size_bytes,
                           const void **out, char *err)
{
    return cpu_map(cpu_backend_of(be), "map_weights", host_ptr, size_bytes, 0, 0, CPU_LAYOUT_ROWS,
                   out, err);
}

/* int8 and int4 matrices are always copied, into the panels of qdot.h,
 * whatever their size and whether huge pages exist: the product reads that
 * layout (a caller's own bytes are repacked at every call). */
static int cpu_map_quantized(struct cpu_backend *cb, const void *host_ptr, enum kern_dtype dtype,
                             int rows, int cols, const void **out, char *err)
{
    if (rows == 0 || cols == 0) {
        *out = host_ptr;
        return 0;
    }
    if (!host_ptr)
        return error_set(err, ERR_INVALID_ARG, "cpu map_matrix: NULL pointer for a [%d, %d] matrix",
                         rows, cols);
    const size_t bytes = qd_packed_bytes(dtype, rows, cols);
    int rc = cpu_copies_reserve(cb, err);
    if (rc < 0)
        return rc;
    const size_t len = (bytes + CPU_HUGE_PAGE - 1) & ~(CPU_HUGE_PAGE - 1);
    const char *failed;
    char *base = cpu_huge_mapping(len, &failed);
    if (!base)
        return error_set_errno(err, ERR_NOMEM, errno, "cpu map_matrix: %s (%zu bytes)", failed, len);
    qd_pack(dtype, host_ptr, rows, cols, base);
    if (mprotect(base, len, PROT_READ) != 0) {
        int e = errno;
        munmap(base, len);
        return error_set_errno(err, ERR_SYSTEM, e, "cpu map_matrix: mprotect(PROT_READ)");
    }
    cb->copies[cb->n_copies++] = (struct cpu_weight_copy){
        .base = base, .len = len, .qrows = rows, .qd_in = cols, .qdtype = dtype};
    *out = base;
    return 0;
}

/* A matrix is packed when it is copied at all (a tensor used in place is the
 * caller's, read-only, bytes: cpu_map) and its dtype and shape have packed
 * kernels: in line octets where bf16 goes to vdpbf16ps (cpu_lines_supported,
 * bfdot.h), else in row octets (cpu_packed_supported). */
static int cpu_map_matrix(struct kern_backend *be, const void *host_ptr, enum kern_dtype dtype,
                          int64_t rows, int64_t cols, const void **out, char *err)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    *out = NULL;
    if (rows < 0 || cols < 0 || (cols > 0 && rows > INT64_MAX / cols))
        return error_set(err, ERR_INVALID_ARG, "cpu map_matrix: bad shape [%lld, %lld]",
                         (long long)rows, (long long)cols);
    int rc = dtype == KERN_DTYPE_Q8 || dtype == KERN_DTYPE_Q4 ? 0 : cpu_backend_check_dtype(dtype, "map_matrix", err);
    if (rc < 0)
        return rc;
    if (dtype == KERN_DTYPE_Q8 || dtype == KERN_DTYPE_Q4) {
        if (dtype == KERN_DTYPE_Q4 && cols % KERN_Q4_GROUP != 0)
            return error_set(err, ERR_INVALID_ARG, "cpu map_matrix: int4 rows of %lld columns, not a multiple of %d",
                             (long long)cols, KERN_Q4_GROUP);
        if (rows > INT32_MAX - QD_ROWS || cols > INT32_MAX - QD_BLOCK)
            return error_set(err, ERR_INVALID_ARG, "cpu map_matrix: [%lld, %lld] is too large",
                             (long long)rows, (long long)cols);
        return cpu_map_quantized(cb, host_ptr, dtype, (int)rows, (int)cols, out, err);
    }
    const uint64_t bytes = (uint64_t)rows * (uint64_t)cols * kern_dtype_size(dtype);
    if (bytes > SIZE_MAX)
        return error_set(err, ERR_NOMEM, "cpu map_matrix: [%lld, %lld] is too large",
                         (long long)rows, (long long)cols);
    const int bd = dtype == KERN_DTYPE_BF16 && cb->bf16_dot;
    const enum cpu_layout layout = bd ? CPU_LAYOUT_LINES : CPU_LAYOUT_OCTETS;
    const int pack = rows <= INT32_MAX && (bd ? cpu_lines_supported(dtype, (long)rows, (long)cols)
                                              : cpu_packed_supported(dtype, (long)rows, (long)cols));
    return cpu_map(cb, "map_matrix", host_ptr, (size_t)bytes, pack ? (int)rows : 0,
                   pack ? (int)cols : 0, layout, out, err);
}

int cpu_backend_qpanels(const struct cpu_backend *cb, const void *w, enum kern_dtype dtype, int rows,
                        int d_in)
{
    for (int i = 0; i < cb->n_copies; i++)
        if (cb->copies[i].base == w)
            return cb->copies[i].qrows == rows && cb->copies[i].qd_in == d_in &&
                   cb->copies[i].qdtype == dtype && rows > 0;
    return 0;
}

int cpu_backend_packed(const struct cpu_backend *cb, const void *w, int *packed_rows, int *d_in)
{
    for (int i = 0; i < cb->n_copies; i++)
        if (cb->copies[i].base == w) {
            if (cb->copies[i].packed_rows == 0)
                return CPU_LAYOUT_ROWS;
            *packed_rows = cb->copies[i].packed_rows;
            *d_in = cb->copies[i].d_in;
            return (int)cb->copies[i].layout;
        }
    return CPU_LAYOUT_ROWS;
}

/* Releases a copy made by map_weights; a pointer used in place is not ours. */
static void cpu_unmap_weights(struct kern_backend *be, const void *ptr)
{
    struct cpu_backend *cb = cpu_backend_of(be);
    cpu_argmax_release(cb, ptr);
    for (int i = 0; i < cb->n_copies; i++)
        if (cb->copies[i].base == ptr) {
            munmap(cb->copies[i].base, cb->copies[i].len);
            cb->copies[i] = cb->copies[--cb->n_copies];
            return;
        }
}

static int cpu_sync(struct kern_backend *be, char *err)
{
    return 0;
}

static const struct kern_ops cpu_ops = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .map_weights = cpu_map_weights,
    .unmap_weights = cpu_unmap_weights,
    .sync = cpu_sync,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope = cpu_rope,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .map_matrix = cpu_map_matrix,
    .matmul_argmax = cpu_matmul_argmax,
    .prepare_argmax = cpu_prepare_argmax,
};

int kern_cpu_create(struct kern_backend **out, int n_threads, char *err)
{
    *out = NULL;
    if (n_threads < 0 || n_threads > 1024)
        return error_set(err, ERR_INVALID_ARG, "cpu backend: n_threads must be in 0..1024, got %d",
                         n_threads);
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online < 1 ? 1 : online > 1024 ? 1024 : (int)online;
    }
    struct cpu_backend *cb = calloc(1, sizeof(*cb));
    if (!cb)
        return error_set(err, ERR_NOMEM, "cpu backend: out of memory");
    cb->base.ops = &cpu_ops;
    cb->base.name = "cpu";
    cb->n_threads = n_threads;
    cb->weight_copy = cpu_thp_available();
    cb->qdot_isa = qd_isa_best();
    /* bf16 on vdpbf16ps wherever the CPU has it, so that a bf16 product's
     * bits depend on the CPU's ISA only (kernels.h). TANDEM_CPU_BF16_DOT=0
     * keeps bf16 on the f32 paths (for comparison), =1 insists on it
     * (refused where the CPU lacks it); read once, at creation, so every
     * product of a backend takes the same path. */
    cb->bf16_dot = bd_supported();
    const char *bf16_env = getenv(CPU_BF16_DOT_ENV);
    if (bf16_env && *bf16_env) {
        if (strcmp(bf16_env, "0") != 0 && strcmp(bf16_env, "1") != 0) {
            free(cb);
            return error_set(err, ERR_INVALID_ARG, "%s: must be 0 or 1, got \"%s\"", CPU_BF16_DOT_ENV,
                             bf16_env);
        }
        if (bf16_env[0] == '1' && !cb->bf16_dot) {
            free(cb);
            return error_set(err, ERR_UNSUPPORTED, "%s=1: this CPU (or build) has no AVX512_BF16",
                             CPU_BF16_DOT_ENV);
        }
        cb->bf16_dot = bf16_env[0] == '1';
    }
    cb->scratch = calloc((size_t)n_threads, sizeof(*cb->scratch));
    if (!cb->scratch) {
        free(cb);
        return error_set(err, ERR_NOMEM, "cpu backend: out of memory");
    }
    int rc = cpu_pool_create(&cb->pool, n_threads, err);
    if (rc < 0) {
        cpu_destroy(&cb->base);
        return rc;
    }
    *out = &cb->base;
    return 0;
}

int kern_cpu_threads(const struct kern_backend *be)
{
    if (!be || be->ops != &cpu_ops)
        return 0;
    return ((const struct cpu_backend *)be)->n_threads;
}

int kern_cpu_argmax_candidates(const struct kern_backend *be)
{
    if (!be || be->ops != &cpu_ops)
        return -1;
    return cpu_argmax_last_candidates((const struct cpu_backend *)be);
}

int kern_cpu_argmax_copy_bits(const struct kern_backend *be, const void *w)
{
    if (!be || be->ops != &cpu_ops)
        return 0;
    return cpu_argmax_copy_bits((const struct cpu_backend *)be, w);
}

int kern_cpu_weight_copies(const struct kern_backend *be, const void **ptrs, size_t *bytes, int max)
{
    if (!be || be->ops != &cpu_ops)
        return 0;
    const struct cpu_backend *cb = (const struct cpu_backend *)be;
    for (int i = 0; i < cb->n_copies && i < max; i++) {
        ptrs[i] = cb->copies[i].base;
        bytes[i] = cb->copies[i].len;
    }
    return cb->n_copies;
}

int kern_cpu_int_dot(const struct kern_backend *be)
{
    if (!be || be->ops != &cpu_ops)
        return -1;
    return ((const struct cpu_backend *)be)->qdot_isa;
}

int kern_cpu_set_int_dot(struct kern_backend *be, int isa, char *err)
{
    if (!be || be->ops != &cpu_ops)
        return error_set(err, ERR_INVALID_ARG, "kern_cpu_set_int_dot: not a CPU backend");
    if (isa < 0 || isa >= QD_ISA_COUNT || !qd_isa_supported(isa))
        return error_set(err, ERR_UNSUPPORTED, "kern_cpu_set_int_dot: %s (%d) is not available on this CPU",
                         qd_isa_name(isa), isa);
    cpu_backend_of(be)->qdot_isa = isa;
    return 0;
}

const char *kern_cpu_int_dot_name(int isa)
{
    return qd_isa_name(isa);
}

int kern_cpu_bf16_dot(const struct kern_backend *be)
{
    if (!be || be->ops != &cpu_ops)
        return -1;
    return ((const struct cpu_backend *)be)->bf16_dot;
}

int kern_cpu_set_bf16_dot(struct kern_backend *be, int on, char *err)
{
    if (!be || be->ops != &cpu_ops)
        return error_set(err, ERR_INVALID_ARG, "kern_cpu_set_bf16_dot: not a CPU backend");
    if (on && !bd_supported())
        return error_set(err, ERR_UNSUPPORTED, "kern_cpu_set_bf16_dot: this CPU (or build) has no AVX512_BF16");
    cpu_backend_of(be)->bf16_dot = on != 0;
    return 0;
}
