/* cpu_pool.h: the CPU backend's persistent thread pool (private to kernels/cpu).
 *
 * A pool of n_threads threads counting the caller: cpu_pool_run() hands a range
 * of task indices [0, n_tasks) to the n_threads - 1 workers and to the calling
 * thread itself, which claim `chunk` consecutive tasks at a time from a shared
 * counter until none are left, then returns when every task has finished.
 * Workers spin briefly after each job (so the next op of a decode step starts
 * within microseconds) and then sleep on a condition variable.
 *
 * Which thread runs which task is NOT deterministic: a task function must
 * compute its outputs the same way whatever thread runs it (thread_idx is only
 * for choosing per-thread scratch space). That is what keeps the kernels'
 * results independent of the thread count.
 *
 * Not reentrant: one cpu_pool_run at a time per pool (the backend's ops are
 * called from one thread), and a task function must not call cpu_pool_run.
 */
#ifndef TANDEM_KERNELS_CPU_POOL_H
#define TANDEM_KERNELS_CPU_POOL_H

struct cpu_pool;

/* Runs tasks [begin, end) on thread thread_idx (0 = the caller, 1.. = workers). */
typedef void (*cpu_pool_fn)(void *ctx, long begin, long end, int thread_idx);

/* Starts n_threads - 1 worker threads (n_threads >= 1).
 * Returns 0, ERR_INVALID_ARG, ERR_NOMEM or ERR_SYSTEM (reason in err). */
int cpu_pool_create(struct cpu_pool **out, int n_threads, char *err);

/* Stops and joins the workers. NULL-safe. */
void cpu_pool_destroy(struct cpu_pool *pool);

int cpu_pool_threads(const struct cpu_pool *pool);

/* Runs fn over [0, n_tasks) in claims of `chunk` tasks (chunk >= 1) on all
 * threads; returns when all are done. n_tasks <= chunk runs on the caller
 * alone, with no dispatch. */
void cpu_pool_run(struct cpu_pool *pool, long n_tasks, long chunk, cpu_pool_fn fn, void *ctx);

/* cpu_pool_run with claims that shrink as the job goes: each claim takes
 * max(min_chunk, remaining / (2 * n_threads)) tasks, so a job is a few long
 * runs of consecutive tasks per thread and still ends balanced (the last
 * claims are min_chunk). For tasks that stream memory in task order, where
 * each claim's start costs a cold stream. */
void cpu_pool_run_guided(struct cpu_pool *pool, long n_tasks, long min_chunk, cpu_pool_fn fn,
                         void *ctx);

#endif
