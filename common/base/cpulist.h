/* cpulist.h: sets of CPU numbers, in the kernel's list notation ("0-3,8").
 *
 * Workers describe the cores they compute on in that notation (Linux's
 * cpuset and sysfs files use it, and an operator reads it at a glance); the
 * coordinator reads two such descriptions to tell whether the draft and the
 * target compete for the same cores.
 */
#ifndef TANDEM_CPULIST_H
#define TANDEM_CPULIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CPUs 0..CPULIST_MAX-1, as many as glibc's cpu_set_t holds. */
#define CPULIST_MAX 1024

struct cpulist {
    uint64_t bits[CPULIST_MAX / 64];
};

void cpulist_clear(struct cpulist *l);
/* Adds cpu; ERR_RANGE outside 0..CPULIST_MAX-1. */
int cpulist_add(struct cpulist *l, int cpu);
bool cpulist_has(const struct cpulist *l, int cpu);
int cpulist_count(const struct cpulist *l);

/* Parses "N", "N-M" items joined by commas, ascending and disjoint, each
 * CPU below CPULIST_MAX. ERR_FORMAT naming the offending item for anything
 * else, the empty string included (no CPU is not a place to compute). */
int cpulist_parse(const char *text, struct cpulist *out, char *err);

/* Writes the shortest list notation of l; ERR_RANGE when it does not fit in
 * size bytes (nul included), ERR_INVALID_ARG for an empty set. */
int cpulist_format(const struct cpulist *l, char *buf, size_t size, char *err);

/* Whether two thread pools placed on these sets contend for cores: the sets
 * overlap and together the threads outnumber the CPUs of both. The kernel
 * spreads fewer threads over the CPUs without sharing one. */
bool cpulist_oversubscribed(const struct cpulist *a, int threads_a, const struct cpulist *b,
                            int threads_b);

#endif
