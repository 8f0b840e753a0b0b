/* cpulist.c: CPU sets in list notation (see cpulist.h). */
#include "cpulist.h"

#include <stdio.h>
#include <string.h>

#include "error.h"

void cpulist_clear(struct cpulist *l)
{
    memset(l, 0, sizeof *l);
}

int cpulist_add(struct cpulist *l, int cpu)
{
    if (cpu < 0 || cpu >= CPULIST_MAX)
        return ERR_RANGE;
    l->bits[cpu / 64] |= UINT64_C(1) << (cpu % 64);
    return 0;
}

bool cpulist_has(const struct cpulist *l, int cpu)
{
    return cpu >= 0 && cpu < CPULIST_MAX && (l->bits[cpu / 64] >> (cpu % 64)) & 1;
}

int cpulist_count(const struct cpulist *l)
{
    int n = 0;
    for (size_t i = 0; i < sizeof l->bits / sizeof l->bits[0]; i++)
        n += __builtin_popcountll(l->bits[i]);
    return n;
}

/* Reads a decimal CPU number at *p (no sign, no leading "+"); -1 when there
 * is none or it is CPULIST_MAX or more. */
static int read_cpu(const char **p)
{
    const char *s = *p;
    if (*s < '0' || *s > '9')
        return -1;
    long v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v >= CPULIST_MAX)
            return -1;
        s++;
    }
    *p = s;
    return (int)v;
}

int cpulist_parse(const char *text, struct cpulist *out, char *err)
{
    cpulist_clear(out);
    const char *p = text;
    int last = -1;
    for (int item = 1;; item++) {
        const char *start = p;
        int lo = read_cpu(&p), hi = lo;
        if (lo >= 0 && *p == '-') {
            p++;
            hi = read_cpu(&p);
        }
        if (lo < 0 || hi < lo || lo <= last || (*p != ',' && *p != '\0'))
            return error_set(err, ERR_FORMAT,
                             "cpu list \"%.64s\": item %d (\"%.16s\") is not an ascending CPU number "
                             "or range below %d",
                             text, item, start, CPULIST_MAX);
        for (int c = lo; c <= hi; c++)
            cpulist_add(out, c);
        last = hi;
        if (*p == '\0')
            return 0;
        p++;
    }
}

int cpulist_format(const struct cpulist *l, char *buf, size_t size, char *err)
{
    size_t used = 0;
    if (size > 0)
        buf[0] = '\0';
    bool any = false;
    for (int c = 0; c < CPULIST_MAX; c++) {
        if (!cpulist_has(l, c))
            continue;
        int end = c;
        while (end + 1 < CPULIST_MAX && cpulist_has(l, end + 1))
            end++;
        int n = end > c ? snprintf(buf + used, size - used, "%s%d-%d", any ? "," : "", c, end)
                        : snprintf(buf + used, size - used, "%s%d", any ? "," : "", c);
        if (n < 0 || (size_t)n >= size - used)
            return error_set(err, ERR_RANGE, "cpu list: does not fit in %zu bytes", size);
        used += (size_t)n;
        any = true;
        c = end;
    }
    if (!any)
        return error_set(err, ERR_INVALID_ARG, "cpu list: the set is empty");
    return 0;
}

bool cpulist_oversubscribed(const struct cpulist *a, int threads_a, const struct cpulist *b,
                            int threads_b)
{
    struct cpulist both;
    bool overlap = false;
    for (size_t i = 0; i < sizeof a->bits / sizeof a->bits[0]; i++) {
        both.bits[i] = a->bits[i] | b->bits[i];
        overlap = overlap || (a->bits[i] & b->bits[i]) != 0;
    }
    return overlap && threads_a + threads_b > cpulist_count(&both);
}
