/* prof.h: tandem-bench's op profile: a kern_backend that forwards every op
 * to the real one and adds up the time each op kind takes (matmul by
 * shape). The CPU backend finishes every op before it returns, so wall
 * time per call is the op's cost, dispatch included. Used by `runtime
 * --profile 1` to show where a decode step goes.
 */
#ifndef TANDEM_BENCH_PROF_H
#define TANDEM_BENCH_PROF_H

#include "llama.h"

#define PROF_SHAPES 16
enum prof_op { PROF_EMBED, PROF_RMSNORM, PROF_MATMUL, PROF_ARGMAX, PROF_ROPE, PROF_ATTENTION,
               PROF_SWIGLU, PROF_ADD, PROF_COPY, PROF_OTHER, PROF_N };
struct prof_backend {
    struct kern_backend base; /* first: the ops receive &base */
    struct kern_backend *inner;
    struct kern_ops ops;      /* prof_ops less the optional ops inner lacks */
    double op_s[PROF_N];
    long op_calls[PROF_N];
    struct { int n, d_in, d_out; long calls; double s; } mm[PROF_SHAPES];
    int n_mm;
};

/* Wraps inner (which must outlive p): p->base is the backend to run on. */
void prof_init(struct prof_backend *p, struct kern_backend *inner);

/* Prints the time per op kind and per matmul shape, per unit (a decoded
 * token, or a forward call: `unit` names it, `over` says what was run). */
void prof_report(const struct prof_backend *p, double wall_s, long units, const char *unit, const char *over);

#endif
