/* test_cuda_xfer.c: the cuda_ipc entry of common/xfer between two real
 * processes on one GPU, with halves of real size (a 1B-shaped draft at
 * K = 8: 9 rows of 128,256 floats, 4.6 MB a half), under stress that makes
 * a missing cross-process wait visible:
 *   - a writer whose kernels are slow (it spins before filling the q rows
 *     of round r with round r's pattern, straight into the slab), and a
 *     reader whose kernels are slow (it spins before counting, in the
 *     mapped slab, the elements that differ from round r's pattern);
 *     neither waits on the host: the reader answers a round as soon as its
 *     reads are queued, and the writer rewrites that half two rounds later.
 *     Every element must match: the reader's count waits for the writer's
 *     ready event, the writer's fill for the reader's consumed event;
 *   - the same with the GPU-side waits left out (kern_cuda_ipc_debug_skip_
 *     waits): the count must see wrong rows, so the test can fail;
 *   - staging (the reader forced to the host face): every round's rows
 *     read back right on the host;
 *   - kill -9 of the writer with a round's ready record pending, and of the
 *     reader with a consumed record pending: the peer's bounded wait ends
 *     within KERN_CUDA_IPC_WAIT_MS plus slack, whatever CUDA does with a dead
 *     process's events (printed: completed or timed out);
 *   - the writer's close while the reader still maps the slab returns
 *     within its bound and leaves the slab to the process: the reader then
 *     still reads the last round right, with no CUDA error.
 * The parent never touches CUDA (a forked child may not use a parent's
 * context): it forks the writer and the reader, relays their messages and
 * kills them. Exit 77 (skipped) where a child finds no CUDA device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "kernels.h"
#include "kernels_cuda.h"
#include "xfer.h"

#define VOCAB 128256
#define K 8
#define ROUNDS 48
#define SPIN_US 3000

/* ---- messages between the processes (fixed size, through pipes) ---- */

enum msg_type { MSG_DESC, MSG_PUBLISHED, MSG_READ, MSG_DONE, MSG_FAIL, MSG_WAITED };

struct msg {
    int32_t type;
    int32_t round;
    int64_t value;      /* MSG_DONE: mismatches; MSG_WAITED: rc */
    double ms;          /* MSG_WAITED: how long the wait took */
    char text[ERR_MSG_MAX + 200]; /* MSG_DESC: the descriptor; MSG_FAIL: the error */
};

static int send_msg(int fd, int type, int round, int64_t value, double ms, const char *text)
{
    struct msg m = {.type = type, .round = round, .value = value, .ms = ms};
    if (text)
        snprintf(m.text, sizeof m.text, "%s", text);
    return write(fd, &m, sizeof m) == (ssize_t)sizeof m ? 0 : -1;
}

/* 1 with *m, 0 at end of file, -1 on timeout or error. */
static int recv_msg(int fd, struct msg *m, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, timeout_ms);
    if (n <= 0)
        return -1;
    size_t got = 0;
    while (got < sizeof *m) {
        ssize_t r = read(fd, (char *)m + got, sizeof *m - got);
        if (r == 0)
            return 0;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 1;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* kern_cuda_debug_value on the host (kernels_cuda.h). */
static float debug_value(uint32_t tag, size_t i)
{
    return (float)((tag * 2654435761u + (uint32_t)i) & 0xffffffu);
}

/* ---- the scenarios ---- */

struct scenario {
    int rounds;
    bool skip_waits;      /* leave out the GPU-side waits (must be caught) */
    bool staging;         /* the reader stages through the host face */
    int kill_writer_at;   /* round after whose publish the writer dies (-1: never) */
    int kill_reader_at;   /* round after whose read the reader dies (-1: never) */
    bool close_early;     /* the writer closes while the reader still maps the slab */
    unsigned writer_spin_us, reader_spin_us;
    unsigned kill_spin_us; /* the slowness of the round a process dies in */
};

struct child_io {
    int in, out; /* from the parent, to the parent */
};

#define CHILD_FAIL(io, ...)                                                       \
    do {                                                                          \
        char m_[ERR_MSG_MAX + 200];                                                           \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                     \
        send_msg((io)->out, MSG_FAIL, -1, 0, 0, m_);                              \
        _exit(1);                                                                 \
    } while (0)

static struct kern_backend *child_backend(const struct child_io *io)
{
    char err[ERR_MSG_MAX];
    const char *dev = getenv("TANDEM_CUDA_DEVICE");
    struct kern_backend *be = NULL;
    if (kern_cuda_create(&be, dev && *dev ? dev : "0", err) != 0)
        CHILD_FAIL(io, "kern_cuda_create: %s", err);
    return be;
}

static void writer_main(const struct scenario *sc, const struct child_io *io)
{
    char err[ERR_MSG_MAX];
    struct kern_backend *be = child_backend(io);
    const char *dev = getenv("TANDEM_CUDA_DEVICE");
    char instance[48];
    snprintf(instance, sizeof instance, "xfergpu%ld", (long)getpid());
    /* q rows into the slab alone unless the reader stages (then they go to
     * the host face, which the writer fills on the host) */
    const struct xfer_params p = {
        .transport = "cuda_ipc", .instance = instance, .tag = "draft", .n_slots = 1,
        .k_max = K, .vocab = VOCAB, .writer_samples_on_device = !sc->staging,
        .writer_device = dev ? dev : "", .reader_backend = "cuda", .reader_device = dev ? dev : "",
        .reader_staging = sc->staging};
    struct xfer *w = NULL;
    if (xfer_create(&w, be, &p, err) != 0)
        CHILD_FAIL(io, "xfer_create: %s", err);
    xfer_debug_skip_waits(w, sc->skip_waits);
    cJSON *desc = xfer_export(w);
    char *text = desc ? cJSON_PrintUnformatted(desc) : NULL;
    if (!text || strlen(text) >= sizeof((struct msg *)0)->text * 16)
        CHILD_FAIL(io, "descriptor: out of memory or too long");
    /* the descriptor in pieces of the message's text */
    const size_t piece = sizeof((struct msg *)0)->text - 1;
    for (size_t off = 0, len = strlen(text); off < len; off += piece) {
        char part[sizeof((struct msg *)0)->text];
        snprintf(part, sizeof part, "%.*s", (int)piece, text + off);
        send_msg(io->out, MSG_DESC, off + piece >= len, 0, 0, part);
    }
    free(text);
    cJSON_Delete(desc);
    const size_t n = (size_t)K * VOCAB;
    float *host_rows = sc->staging ? malloc(n * sizeof(float)) : NULL;
    for (int r = 0; r < sc->rounds; r++) {
        const int half = r % 2;
        /* the coordinator's rule: a half is rewritten only after the reader
         * answered the round it held (its reads queued, not done) */
        if (r >= 2) {
            struct msg m;
            if (recv_msg(io->in, &m, 30000) != 1 || m.type != MSG_READ || m.round != r - 2)
                CHILD_FAIL(io, "writer: no answer for round %d", r - 2);
        }
        const double t0 = now_ms();
        int rc = xfer_begin_write(w, 0, half, err);
        if (sc->kill_reader_at >= 0 && r == sc->kill_reader_at + 2) {
            /* the reader died with its consumed record for this half
             * pending: our stream waits for it on the GPU, so the publish
             * queued behind it, and the next begin_write's host wait on
             * that publish shows how it ended */
            if (rc == 0) {
                const struct shm_half_info info = {.req = 1, .round = (uint32_t)r, .k = K};
                rc = xfer_publish(w, 0, half, &info, K, false, err);
                if (rc == 0)
                    rc = xfer_begin_write(w, 0, half, err); /* waits for that publish */
            }
            send_msg(io->out, MSG_WAITED, r, rc, now_ms() - t0, err);
            _exit(0);
        }
        if (rc != 0)
            CHILD_FAIL(io, "writer round %d: begin_write: %s", r, err);
        float *q_host = NULL, *q_dev = NULL;
        xfer_q_dest(w, 0, half, &q_host, &q_dev);
        int32_t *tokens = (int32_t *)xfer_half_tokens(w, 0, half);
        for (int i = 0; i < K; i++)
            tokens[i] = r * 100 + i;
        /* slow: the fill and the publish's copy and ready record wait behind it */
        if (kern_cuda_debug_spin(be, r == sc->kill_writer_at ? sc->kill_spin_us : sc->writer_spin_us,
                                 err) != 0)
            CHILD_FAIL(io, "writer round %d: %s", r, err);
        if (q_dev) {
            if (kern_cuda_debug_fill(be, q_dev, n, (uint32_t)r + 1, err) != 0)
                CHILD_FAIL(io, "writer round %d: %s", r, err);
        } else {
            for (size_t i = 0; i < n; i++)
                host_rows[i] = debug_value((uint32_t)r + 1, i);
            memcpy(q_host, host_rows, n * sizeof(float));
        }
        const struct shm_half_info info = {.req = 1, .round = (uint32_t)r, .k = K};
        if (xfer_publish(w, 0, half, &info, K, q_dev == NULL, err) != 0)
            CHILD_FAIL(io, "writer round %d: publish: %s", r, err);
        send_msg(io->out, MSG_PUBLISHED, r, 0, 0, NULL);
        if (r == sc->kill_writer_at)
            pause(); /* the parent kills us with this round's records pending */
        if (sc->close_early && r == sc->rounds - 1) {
            struct msg m;
            do {
                if (recv_msg(io->in, &m, 30000) != 1 || m.type != MSG_READ)
                    CHILD_FAIL(io, "writer: no answer for the last round");
            } while (m.round != r);
            const double c0 = now_ms();
            xfer_close(w, 500); /* the reader still maps it */
            send_msg(io->out, MSG_WAITED, r, 0, now_ms() - c0, NULL);
            w = NULL;
            /* stay alive, as a draft would until its exit, while the reader
             * reads the slab once more */
            if (recv_msg(io->in, &m, 30000) != 1)
                CHILD_FAIL(io, "writer: no word after close");
        }
    }
    free(host_rows);
    if (w) {
        if (be->ops->sync(be, err) != 0)
            CHILD_FAIL(io, "writer: sync: %s", err);
        xfer_close(w, 5000);
    }
    kern_backend_destroy(be);
    send_msg(io->out, MSG_DONE, sc->rounds, 0, 0, NULL);
    _exit(0);
}

static void reader_main(const struct scenario *sc, const struct child_io *io)
{
    char err[ERR_MSG_MAX];
    struct kern_backend *be = child_backend(io);
    /* the descriptor, in pieces */
    char *text = calloc(16, sizeof((struct msg *)0)->text);
    struct msg m;
    for (;;) {
        if (!text || recv_msg(io->in, &m, 30000) != 1 || m.type != MSG_DESC)
            CHILD_FAIL(io, "reader: no descriptor");
        strcat(text, m.text);
        if (m.round)
            break;
    }
    cJSON *desc = cJSON_Parse(text);
    free(text);
    struct xfer *r = NULL;
    if (!desc || xfer_import(&r, be, desc, sc->staging, err) != 0)
        CHILD_FAIL(io, "reader: xfer_import: %s", err);
    cJSON_Delete(desc);
    xfer_debug_skip_waits(r, sc->skip_waits);
    unsigned long long *count_dev = NULL, count = 0;
    if (be->ops->alloc(be, sizeof count, (void **)&count_dev, err) != 0)
        CHILD_FAIL(io, "reader: alloc: %s", err);
    const size_t n = (size_t)K * VOCAB;
    long long host_bad = 0;
    for (int round = 0; round < sc->rounds; round++) {
        if (recv_msg(io->in, &m, 30000) != 1 || m.type != MSG_PUBLISHED || m.round != round)
            CHILD_FAIL(io, "reader: no round %d", round);
        const int half = round % 2;
        struct shm_half_info info;
        uint64_t seq;
        if (xfer_half_read(r, 0, half, &info, &seq) != 0 || info.round != (uint32_t)round ||
            info.k != K)
            CHILD_FAIL(io, "reader: half %d does not hold round %d", half, round);
        if (xfer_half_tokens(r, 0, half)[K - 1] != round * 100 + K - 1)
            CHILD_FAIL(io, "reader: round %d: wrong tokens", round);
        struct xfer_q q;
        const double t0 = now_ms();
        if (xfer_q_rows(r, 0, half, 0, K, !sc->staging, &q, err) != 0)
            CHILD_FAIL(io, "reader round %d: q_rows: %s", round, err);
        if (q.dev) {
            if (kern_cuda_debug_spin(be, round == sc->kill_reader_at ? sc->kill_spin_us
                                                                     : sc->reader_spin_us,
                                     err) != 0 ||
                kern_cuda_debug_count_mismatches(be, q.dev, n, (uint32_t)round + 1, count_dev,
                                                 err) != 0)
                CHILD_FAIL(io, "reader round %d: %s", round, err);
        }
        if (xfer_end_read(r, 0, half, err) != 0)
            CHILD_FAIL(io, "reader round %d: end_read: %s", round, err);
        if (round == sc->kill_reader_at) {
            send_msg(io->out, MSG_READ, round, 0, 0, NULL);
            pause(); /* killed with the consumed record pending */
        }
        if (q.staged) {
            int rc = xfer_wait_staged(r, 0, half, err);
            if (round == sc->kill_writer_at) {
                /* the writer died with the ready record pending */
                send_msg(io->out, MSG_WAITED, round, rc, now_ms() - t0, err);
                _exit(0);
            }
            if (rc != 0)
                CHILD_FAIL(io, "reader round %d: staged: %s", round, err);
            for (size_t i = 0; i < n; i++)
                host_bad += q.host[i] != debug_value((uint32_t)round + 1, i);
        }
        if (!xfer_half_unchanged(r, 0, half, seq))
            CHILD_FAIL(io, "reader round %d: the half was rewritten during the read", round);
        send_msg(io->out, MSG_READ, round, 0, 0, NULL);
    }
    if (sc->close_early) {
        /* the writer has closed: its slab must still be there */
        if (recv_msg(io->in, &m, 30000) != 1 || m.type != MSG_WAITED)
            CHILD_FAIL(io, "reader: no word of the writer's close");
        const int last = sc->rounds - 1;
        struct xfer_q q;
        if (xfer_q_rows(r, 0, last % 2, 0, K, true, &q, err) != 0 ||
            kern_cuda_debug_count_mismatches(be, q.dev, n, (uint32_t)last + 1, count_dev, err) != 0)
            CHILD_FAIL(io, "reader after the writer's close: %s", err);
    }
    if (be->ops->download(be, &count, count_dev, sizeof count, err) != 0)
        CHILD_FAIL(io, "reader: download: %s", err);
    be->ops->free(be, count_dev);
    xfer_close(r, 0);
    kern_backend_destroy(be);
    send_msg(io->out, MSG_DONE, sc->rounds, (int64_t)count + host_bad, 0, NULL);
    _exit(0);
}

/* ---- the parent: forks, relays, kills ---- */

struct run_result {
    long long mismatches;  /* the reader's count, -1 when it did not finish */
    int waited_rc;         /* a bounded wait's outcome (kill / close scenarios) */
    double waited_ms;      /* -1 when none was reported */
    char fail[ERR_MSG_MAX + 200]; /* a child's failure, or the parent's */
};

static pid_t fork_child(void (*fn)(const struct scenario *, const struct child_io *),
                        const struct scenario *sc, int *to_child, int *from_child)
{
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        const struct child_io io = {.in = a[0], .out = b[1]};
        fn(sc, &io);
        _exit(1);
    }
    close(a[0]);
    close(b[1]);
    *to_child = a[1];
    *from_child = b[0];
    return pid;
}

static void run_scenario(const struct scenario *sc, struct run_result *res)
{
    *res = (struct run_result){.mismatches = -1, .waited_ms = -1};
    int to_w, from_w, to_r, from_r;
    pid_t w = fork_child(writer_main, sc, &to_w, &from_w);
    pid_t r = fork_child(reader_main, sc, &to_r, &from_r);
    assert_true(w > 0 && r > 0);
    bool w_done = false, r_done = false;
    const double deadline = now_ms() + 60000;
    while (!(w_done && r_done) && now_ms() < deadline && !res->fail[0]) {
        struct pollfd p[2] = {{.fd = w_done ? -1 : from_w, .events = POLLIN},
                              {.fd = r_done ? -1 : from_r, .events = POLLIN}};
        if (poll(p, 2, 1000) <= 0)
            continue;
        struct msg m;
        if (p[0].revents) {
            int got = recv_msg(from_w, &m, 0);
            if (got != 1) {
                w_done = true; /* exited (or killed) */
            } else if (m.type == MSG_DESC || m.type == MSG_PUBLISHED) {
                if (!r_done && write(to_r, &m, sizeof m) != (ssize_t)sizeof m)
                    snprintf(res->fail, sizeof res->fail, "parent: the reader is gone");
                if (m.type == MSG_PUBLISHED && m.round == sc->kill_writer_at) {
                    kill(w, SIGKILL);
                    w_done = true;
                }
            } else if (m.type == MSG_WAITED) {
                res->waited_rc = (int)m.value;
                res->waited_ms = m.ms;
                if (sc->close_early && !r_done && write(to_r, &m, sizeof m) != (ssize_t)sizeof m)
                    snprintf(res->fail, sizeof res->fail, "parent: the reader is gone");
                if (sc->kill_reader_at >= 0)
                    w_done = true;
            } else if (m.type == MSG_FAIL) {
                snprintf(res->fail, sizeof res->fail, "%s", m.text);
            } else if (m.type == MSG_DONE) {
                w_done = true;
            }
        }
        if (p[1].revents) {
            int got = recv_msg(from_r, &m, 0);
            if (got != 1) {
                r_done = true;
            } else if (m.type == MSG_READ) {
                if (m.round == sc->kill_reader_at) {
                    kill(r, SIGKILL);
                    r_done = true;
                }
                if (!w_done && write(to_w, &m, sizeof m) != (ssize_t)sizeof m)
                    snprintf(res->fail, sizeof res->fail, "parent: the writer is gone");
            } else if (m.type == MSG_WAITED) {
                res->waited_rc = (int)m.value;
                res->waited_ms = m.ms;
                r_done = true;
            } else if (m.type == MSG_FAIL) {
                snprintf(res->fail, sizeof res->fail, "%s", m.text);
            } else if (m.type == MSG_DONE) {
                res->mismatches = m.value;
                r_done = true;
                if (sc->close_early) {
                    struct msg bye = {.type = MSG_DONE};
                    if (write(to_w, &bye, sizeof bye) != (ssize_t)sizeof bye)
                        snprintf(res->fail, sizeof res->fail, "parent: the writer is gone");
                }
            }
        }
    }
    if (!(w_done && r_done) && !res->fail[0])
        snprintf(res->fail, sizeof res->fail, "the processes did not finish within 60 s");
    kill(w, SIGKILL);
    kill(r, SIGKILL);
    waitpid(w, NULL, 0);
    waitpid(r, NULL, 0);
    close(to_w), close(from_w), close(to_r), close(from_r);
}

static const struct scenario base = {.rounds = ROUNDS, .kill_writer_at = -1, .kill_reader_at = -1,
                                     .writer_spin_us = SPIN_US, .reader_spin_us = SPIN_US};

/* One side slow, the other not, so that each wait has a window to close:
 * a slow writer (the reader's count would run before the fill without the
 * ready wait) and a slow reader (the writer's next fill of the half would
 * run before the count without the consumed wait). */
static void slab_run(const char *what, unsigned writer_us, unsigned reader_us, bool skip_waits)
{
    struct scenario sc = base;
    sc.writer_spin_us = writer_us;
    sc.reader_spin_us = reader_us;
    sc.skip_waits = skip_waits;
    struct run_result res;
    run_scenario(&sc, &res);
    if (res.fail[0])
        fail_msg("%s: %s", what, res.fail);
    print_message("%s%s: %d rounds of %d x %d floats, writer %u us, reader %u us slow: %lld "
                  "mismatched elements of %lld\n", what, skip_waits ? " (expected wrong)" : "",
                  sc.rounds, K, VOCAB, writer_us, reader_us, res.mismatches,
                  (long long)sc.rounds * K * VOCAB);
    if (skip_waits)
        assert_true(res.mismatches > 0);
    else
        assert_int_equal(res.mismatches, 0);
}

static void test_cuda_xfer_slab_rounds_are_ordered(void **state)
{
    (void)state;
    slab_run("slab, slow writer (ready wait)", SPIN_US, 0, false);
    slab_run("slab, slow reader (consumed wait)", 0, SPIN_US, false);
}

static void test_cuda_xfer_missing_waits_are_caught(void **state)
{
    (void)state;
    slab_run("slab, slow writer, no GPU-side waits", SPIN_US, 0, true);
    slab_run("slab, slow reader, no GPU-side waits", 0, SPIN_US, true);
}

static void test_cuda_xfer_staging_rounds_read_right(void **state)
{
    (void)state;
    struct scenario sc = base;
    sc.staging = true;
    sc.rounds = 12;
    struct run_result res;
    run_scenario(&sc, &res);
    if (res.fail[0])
        fail_msg("%s", res.fail);
    print_message("staging, %d rounds: %lld mismatched elements\n", sc.rounds, res.mismatches);
    assert_int_equal(res.mismatches, 0);
}

/* Bounded: KERN_CUDA_IPC_WAIT_MS, and a few seconds for the process's
 * death to be noticed around it. */
#define KILL_BOUND_MS (KERN_CUDA_IPC_WAIT_MS + 3000.0)

static void test_cuda_xfer_writer_killed_mid_round_is_bounded(void **state)
{
    (void)state;
    struct scenario sc = base;
    sc.staging = true;   /* the reader's host wait is on the staging copy behind ready */
    sc.rounds = 6;
    sc.kill_writer_at = 3;
    sc.kill_spin_us = 2000000; /* the round's ready record is 2 s away when it dies */
    struct run_result res;
    run_scenario(&sc, &res);
    if (res.fail[0])
        fail_msg("%s", res.fail);
    print_message("writer killed with a ready record pending: the reader's wait ended after "
                  "%.0f ms (%s)\n", res.waited_ms, res.waited_rc == 0 ? "completed" : error_name(res.waited_rc));
    assert_true(res.waited_ms >= 0 && res.waited_ms < KILL_BOUND_MS);
    assert_true(res.waited_rc == 0 || res.waited_rc == ERR_TIMEOUT || res.waited_rc == ERR_CUDA);
}

static void test_cuda_xfer_reader_killed_mid_round_is_bounded(void **state)
{
    (void)state;
    struct scenario sc = base;
    sc.rounds = 8;
    sc.kill_reader_at = 3;
    sc.kill_spin_us = 2000000; /* the round's consumed record is 2 s away when it dies */
    struct run_result res;
    run_scenario(&sc, &res);
    if (res.fail[0])
        fail_msg("%s", res.fail);
    print_message("reader killed with a consumed record pending: the writer's next rewrite of "
                  "the half ended after %.0f ms (%s)\n", res.waited_ms,
                  res.waited_rc == 0 ? "completed" : error_name(res.waited_rc));
    assert_true(res.waited_ms >= 0 && res.waited_ms < KILL_BOUND_MS);
    assert_true(res.waited_rc == 0 || res.waited_rc == ERR_TIMEOUT || res.waited_rc == ERR_CUDA);
}

static void test_cuda_xfer_close_keeps_a_mapped_slab(void **state)
{
    (void)state;
    struct scenario sc = base;
    sc.rounds = 6;
    sc.close_early = true;
    struct run_result res;
    run_scenario(&sc, &res);
    if (res.fail[0])
        fail_msg("%s", res.fail);
    print_message("writer closed while the reader maps the slab: close returned after %.0f ms; "
                  "the reader then read the last round with %lld mismatched elements\n",
                  res.waited_ms, res.mismatches);
    assert_true(res.waited_ms >= 400 && res.waited_ms < 3000); /* its 500 ms bound */
    assert_int_equal(res.mismatches, 0);
}

/* A forked child looks for a device: the parent itself never initialises
 * CUDA. 0 when there is one, 77 when not. */
static int device_present(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        char err[ERR_MSG_MAX] = "";
        int count = 0;
        if (kern_cuda_device_count(&count, err) != 0 || count == 0) {
            printf("SKIPPED: no CUDA device%s%s\n", err[0] ? ": " : "", err);
            _exit(77);
        }
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return 1;
    return WEXITSTATUS(st);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    int dev = device_present();
    if (dev != 0)
        return dev;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_xfer_slab_rounds_are_ordered),
        cmocka_unit_test(test_cuda_xfer_missing_waits_are_caught),
        cmocka_unit_test(test_cuda_xfer_staging_rounds_read_right),
        cmocka_unit_test(test_cuda_xfer_writer_killed_mid_round_is_bounded),
        cmocka_unit_test(test_cuda_xfer_reader_killed_mid_round_is_bounded),
        cmocka_unit_test(test_cuda_xfer_close_keeps_a_mapped_slab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
