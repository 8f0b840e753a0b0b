/* cpu_pool.c: persistent worker threads for the CPU backend (see cpu_pool.h).
 *
 * Dispatch protocol. The caller publishes a job (fn, ctx, n_tasks, chunk),
 * resets the claim counter, sets n_busy to the number of workers and bumps
 * `generation` (release, under the mutex so a sleeping worker cannot miss it).
 * A worker waits for generation to move past the last one it served: it spins
 * for up to POOL_SPIN_NS, then sleeps on `work_cv`. Every worker serves every
 * generation exactly once: the caller does not publish the next job before
 * n_busy has dropped to zero, so a worker never skips a job and job fields are
 * never rewritten while a worker may still read them. The worker that drops
 * n_busy to zero signals `done_cv` for a caller that stopped spinning.
 *
 * The mutex/condition-variable calls in the hot path cannot fail on a valid
 * default mutex; a failure there is a broken invariant and aborts.
 */
#include "cpu_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
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

/* How long an idle thread spins before sleeping. A decode step issues its ops
 * back to back, so the next job nearly always arrives within this window. */
#define POOL_SPIN_NS 100000L

#define POOL_CHECK(call)                                                          \
    do {                                                                          \
        int pool_rc_ = (call);                                                    \
        if (pool_rc_ != 0) {                                                      \
            fprintf(stderr, "cpu_pool: %s failed (%d)\n", #call, pool_rc_);      \
            abort();                                                              \
        }                                                                         \
    } while (0)

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

    atomic_ulong generation;
    atomic_int stop;
    atomic_int n_busy;
    atomic_long next_task;

    /* The current job: written by the caller before the generation bump. */
    cpu_pool_fn fn;
    void *ctx;
    long n_tasks;
    long chunk;
};

static long pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void pool_serve(struct cpu_pool *pool, int thread_idx)
{
    const long n = pool->n_tasks, chunk = pool->chunk;
    for (;;) {
        long begin = atomic_fetch_add_explicit(&pool->next_task, chunk, memory_order_relaxed);
        if (begin >= n)
            break;
        long end = begin + chunk < n ? begin + chunk : n;
        pool->fn(pool->ctx, begin, end, thread_idx);
    }
}

/* Waits until generation differs from `seen`; returns the new value. */
static unsigned long pool_wait_work(struct cpu_pool *pool, unsigned long seen)
{
    unsigned long gen;
    long start = pool_now_ns();
    for (unsigned spins = 1;; spins++) {
        gen = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (gen != seen)
            return gen;
        POOL_RELAX();
        if ((spins & 63) == 0 && pool_now_ns() - start > POOL_SPIN_NS)
            break;
    }
    POOL_CHECK(pthread_mutex_lock(&pool->mutex));
    while ((gen = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen)
        POOL_CHECK(pthread_cond_wait(&pool->work_cv, &pool->mutex));
    POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
    return gen;
}

static void *pool_worker_main(void *arg)
{
    struct cpu_pool_worker *wk = arg;
    struct cpu_pool *pool = wk->pool;
    unsigned long seen = 0;
    for (;;) {
        seen = pool_wait_work(pool, seen);
        if (atomic_load_explicit(&pool->stop, memory_order_acquire))
            break;
        pool_serve(pool, wk->thread_idx);
        if (atomic_fetch_sub_explicit(&pool->n_busy, 1, memory_order_acq_rel) == 1) {
            POOL_CHECK(pthread_mutex_lock(&pool->mutex));
            POOL_CHECK(pthread_cond_broadcast(&pool->done_cv));
            POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
        }
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
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->stop, 0);
    atomic_init(&pool->n_busy, 0);
    atomic_init(&pool->next_task, 0);

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
        atomic_store_explicit(&pool->stop, 1, memory_order_release);
        atomic_fetch_add_explicit(&pool->generation, 1, memory_order_acq_rel);
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

void cpu_pool_run(struct cpu_pool *pool, long n_tasks, long chunk, cpu_pool_fn fn, void *ctx)
{
    if (n_tasks <= 0)
        return;
    if (chunk < 1)
        chunk = 1;
    if (pool->n_threads == 1 || n_tasks <= chunk) {
        fn(ctx, 0, n_tasks, 0);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_tasks = n_tasks;
    pool->chunk = chunk;
    atomic_store_explicit(&pool->next_task, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->n_busy, pool->n_threads - 1, memory_order_relaxed);

    POOL_CHECK(pthread_mutex_lock(&pool->mutex));
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_acq_rel);
    POOL_CHECK(pthread_cond_broadcast(&pool->work_cv));
    POOL_CHECK(pthread_mutex_unlock(&pool->mutex));

    pool_serve(pool, 0);

    long start = pool_now_ns();
    for (unsigned spins = 1;; spins++) {
        if (atomic_load_explicit(&pool->n_busy, memory_order_acquire) == 0)
            return;
        POOL_RELAX();
        if ((spins & 63) == 0 && pool_now_ns() - start > POOL_SPIN_NS)
            break;
    }
    POOL_CHECK(pthread_mutex_lock(&pool->mutex));
    while (atomic_load_explicit(&pool->n_busy, memory_order_acquire) != 0)
        POOL_CHECK(pthread_cond_wait(&pool->done_cv, &pool->mutex));
    POOL_CHECK(pthread_mutex_unlock(&pool->mutex));
}
