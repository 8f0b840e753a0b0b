/* cpu_pool.c: persistent worker threads for the CPU backend (see cpu_pool.h).
 *
 * Dispatch protocol. One 64-bit word `claim` holds (generation << 32 |
 * remaining). The caller publishes a job (fn, ctx, chunk, n_tasks), zeroes
 * n_done and stores claim = (g + 1, n_tasks). Any thread claims tasks with a
 * compare-and-swap that takes c = min(chunk, remaining) tasks, namely
 * [remaining - c, remaining), from the top, only while the word still carries
 * the generation it read; it runs them and adds c to n_done. The caller claims
 * too, and the job is over when n_done == n_tasks.
 *
 * Why this is safe without locks: job fields are read only after a successful
 * claim, and a job with a claimed-but-unfinished task cannot be over, so the
 * caller cannot have republished the fields. A worker that wakes late finds
 * remaining == 0 (or a newer generation, which it simply serves), so the
 * caller never waits for a worker that did not show up: on a busy machine the
 * caller does the whole job itself instead of waiting for a descheduled
 * thread.
 *
 * Idle threads spin for up to POOL_SPIN_NS (a decode step issues its ops back
 * to back, so the next job nearly always arrives in that window) and then
 * sleep on a condition variable. The mutex is taken only when someone sleeps:
 * a sleeper registers itself (n_sleeping, caller_sleeping) under the mutex and
 * re-checks its condition; the waker changes the condition and then reads the
 * registration, both sequentially consistent, so either the sleeper sees the
 * change or the waker sees the sleeper and broadcasts under the mutex.
 *
 * The mutex/condition-variable calls in the hot path cannot fail on a valid
 * default mutex; a failure there is a broken invariant and aborts.
 */
#include "cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_RELAX() _mm_pause()
#else
#define POOL_RELAX() ((void)0)
#endif

#define POOL_SPIN_NS 100000L

#define POOL_CHECK(call)                                                          \
    do {                                                                          \
        int pool_rc_ = (call);                                                    \
        if (pool_rc_ != 0) {                                                      \
            fprintf(stderr, "cpu_pool: %s failed (%d)\n", #call, pool_rc_);      \
            abort();                                                              \
        }                                                                         \
    } while (0)

#define POOL_GEN(word) ((uint32_t)((word) >> 32))
#define POOL_REMAINING(word) ((uint32_t)(word))
#define POOL_WORD(gen, rem) (((uint64_t)(gen) << 32) | (uint64_t)(rem))

struct cpu_pool_worker {
    struct cpu_pool *pool;
    int thread_idx;
    pthread_t thread;
};

struct cpu_pool {
    int n_threads;
    int n_started; /* workers actually started (for unwinding) */
    struct cpu_pool_worker *workers; /* [n_threads - 1] */

    pthread_mutex_t mutex;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;

    _Atomic uint64_t claim;     /* generation << 32 | tasks not yet claimed */
    atomic_long n_done;         /* tasks of the current job finished */
    atomic_int stop;
    atomic_int n_sleeping;      /* workers inside the work_cv wait */
    atomic_int caller_sleeping; /* the caller is inside the done_cv wait */

    /* The current job: written by the caller before it publishes `claim`;
     * read by others only after a successful claim. */
    cpu_pool_fn fn;
    void *ctx;
    long n_tasks;
    _Atomic long chunk; /* read before claiming: atomic, may be stale */
    atomic_int guided;  /* claims of max(chunk, remaining / (2 * n_threads)) */
};

static long pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* Claims and runs tasks of generation `gen` until none remain (or a newer
 * generation appears). */
static void pool_serve(struct cpu_pool *pool, uint32_t gen, int thread_idx)
{
    uint64_t word = atomic_load(&pool->claim);
    for (;;) {
        if (POOL_GEN(word) != gen || POOL_REMAINING(word) == 0)
            return;
        uint32_t rem = POOL_REMAINING(word);
        long chunk = atomic_load_explicit(&pool->chunk, memory_order_relaxed);
        if (atomic_load_explicit(&pool->guided, memory_order_relaxed)) {
            const long share = (long)(rem / (2u * (uint32_t)pool->n_threads));
            chunk = share > chunk ? share : chunk;
        }
        uint32_t c = chunk < 1 ? 1 : (uint64_t)chunk < rem ? (uint32_t)chunk : rem;
        if (!atomic_compare_exchange_weak(&pool->claim, &word, POOL_WORD(gen, rem - c)))
            continue; /* word reloaded */
        /* The job cannot end before our claim is done: its fields are stable. */
        const long n_tasks = pool->n_tasks;
        pool->fn(pool->ctx, (long)(rem - c), (long)rem, thread_idx);
        long done = atomic_fetch_add(&pool->n_done, (long)c) + (long)c;
        if (done == n_tasks && atomic_load(&pool->caller_sleeping)) {
            POOL_CHECK(pthread_mutex_lock(&pool->mutex));
            POOL_CHECK(pthread_cond_broadcast(&pool->done_cv));
            POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
        }
        word = atomic_load(&pool->claim);
    }
}

/* Waits until the claim word's generation differs from `seen`; returns it. */
static uint32_t pool_wait_work(struct cpu_pool *pool, uint32_t seen)
{
    uint32_t gen;
    long start = pool_now_ns();
    for (unsigned spins = 1;; spins++) {
        gen = POOL_GEN(atomic_load_explicit(&pool->claim, memory_order_acquire));
        if (gen != seen)
            return gen;
        POOL_RELAX();
        if ((spins & 63) == 0 && pool_now_ns() - start > POOL_SPIN_NS)
            break;
    }
    POOL_CHECK(pthread_mutex_lock(&pool->mutex));
    atomic_fetch_add(&pool->n_sleeping, 1);
    while ((gen = POOL_GEN(atomic_load(&pool->claim))) == seen)
        POOL_CHECK(pthread_cond_wait(&pool->work_cv, &pool->mutex));
    atomic_fetch_sub(&pool->n_sleeping, 1);
    POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
    return gen;
}

static void *pool_worker_main(void *arg)
{
    struct cpu_pool_worker *wk = arg;
    struct cpu_pool *pool = wk->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = pool_wait_work(pool, seen);
        if (atomic_load(&pool->stop))
            break;
        pool_serve(pool, seen, wk->thread_idx);
    }
    return NULL;
}

int cpu_pool_create(struct cpu_pool **out, int n_threads, char *err)
{
    *out = NULL;
    if (n_threads < 1)
        return error_set(err, ERR_INVALID_ARG, "cpu pool: n_threads must be >= 1, got %d",
                         n_threads);
    struct cpu_pool *pool = calloc(1, sizeof(*pool));
    if (!pool)
        return error_set(err, ERR_NOMEM, "cpu pool: out of memory");
    pool->n_threads = n_threads;
    atomic_init(&pool->claim, 0);
    atomic_init(&pool->n_done, 0);
    atomic_init(&pool->stop, 0);
    atomic_init(&pool->n_sleeping, 0);
    atomic_init(&pool->caller_sleeping, 0);
    atomic_init(&pool->chunk, 1);
    atomic_init(&pool->guided, 0);

    int rc = pthread_mutex_init(&pool->mutex, NULL);
    if (rc != 0) {
        free(pool);
        return error_set_errno(err, ERR_SYSTEM, rc, "cpu pool: pthread_mutex_init");
    }
    rc = pthread_cond_init(&pool->work_cv, NULL);
    if (rc != 0) {
        pthread_mutex_destroy(&pool->mutex);
        free(pool);
        return error_set_errno(err, ERR_SYSTEM, rc, "cpu pool: pthread_cond_init");
    }
    rc = pthread_cond_init(&pool->done_cv, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&pool->work_cv);
        pthread_mutex_destroy(&pool->mutex);
        free(pool);
        return error_set_errno(err, ERR_SYSTEM, rc, "cpu pool: pthread_cond_init");
    }
    if (n_threads > 1) {
        pool->workers = calloc((size_t)(n_threads - 1), sizeof(*pool->workers));
        if (!pool->workers) {
            cpu_pool_destroy(pool);
            return error_set(err, ERR_NOMEM, "cpu pool: out of memory for %d workers",
                             n_threads - 1);
        }
    }
    for (int i = 0; i < n_threads - 1; i++) {
        struct cpu_pool_worker *wk = &pool->workers[i];
        wk->pool = pool;
        wk->thread_idx = i + 1;
        rc = pthread_create(&wk->thread, NULL, pool_worker_main, wk);
        if (rc != 0) {
            cpu_pool_destroy(pool);
            return error_set_errno(err, ERR_SYSTEM, rc, "cpu pool: pthread_create (worker %d)",
                                   i + 1);
        }
        pool->n_started++;
    }
    *out = pool;
    return 0;
}

void cpu_pool_destroy(struct cpu_pool *pool)
{
    if (!pool)
        return;
    if (pool->n_started > 0) {
        POOL_CHECK(pthread_mutex_lock(&pool->mutex));
        atomic_store(&pool->stop, 1);
        uint32_t gen = POOL_GEN(atomic_load(&pool->claim));
        atomic_store(&pool->claim, POOL_WORD(gen + 1, 0));
        POOL_CHECK(pthread_cond_broadcast(&pool->work_cv));
        POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
        for (int i = 0; i < pool->n_started; i++)
            POOL_CHECK(pthread_join(pool->workers[i].thread, NULL));
    }
    pthread_cond_destroy(&pool->done_cv);
    pthread_cond_destroy(&pool->work_cv);
    pthread_mutex_destroy(&pool->mutex);
    free(pool->workers);
    free(pool);
}

int cpu_pool_threads(const struct cpu_pool *pool)
{
    return pool->n_threads;
}

static void pool_run(struct cpu_pool *pool, long n_tasks, long chunk, int guided, cpu_pool_fn fn,
                     void *ctx)
{
    if (n_tasks <= 0)
        return;
    if (chunk < 1)
        chunk = 1;
    if (pool->n_threads == 1 || n_tasks <= chunk) {
        fn(ctx, 0, n_tasks, 0);
        return;
    }
    if (n_tasks > (long)UINT32_MAX) {
        fprintf(stderr, "cpu_pool: %ld tasks exceed the claim word\n", n_tasks);
        abort();
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&pool->guided, guided, memory_order_relaxed);
    atomic_store(&pool->n_done, 0);
    uint32_t gen = POOL_GEN(atomic_load(&pool->claim)) + 1;
    atomic_store(&pool->claim, POOL_WORD(gen, (uint32_t)n_tasks));
    if (atomic_load(&pool->n_sleeping) > 0) {
        POOL_CHECK(pthread_mutex_lock(&pool->mutex));
        POOL_CHECK(pthread_cond_broadcast(&pool->work_cv));
        POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
    }

    pool_serve(pool, gen, 0);

    long start = pool_now_ns();
    for (unsigned spins = 1;; spins++) {
        if (atomic_load(&pool->n_done) == n_tasks)
            return;
        POOL_RELAX();
        if ((spins & 63) == 0 && pool_now_ns() - start > POOL_SPIN_NS)
            break;
    }
    POOL_CHECK(pthread_mutex_lock(&pool->mutex));
    atomic_store(&pool->caller_sleeping, 1);
    while (atomic_load(&pool->n_done) != n_tasks)
        POOL_CHECK(pthread_cond_wait(&pool->done_cv, &pool->mutex));
    atomic_store(&pool->caller_sleeping, 0);
    POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
}

void cpu_pool_run(struct cpu_pool *pool, long n_tasks, long chunk, cpu_pool_fn fn, void *ctx)
{
    pool_run(pool, n_tasks, chunk, 0, fn, ctx);
}

void cpu_pool_run_guided(struct cpu_pool *pool, long n_tasks, long min_chunk, cpu_pool_fn fn,
                         void *ctx)
{
    pool_run(pool, n_tasks, min_chunk, 1, fn, ctx);
}
