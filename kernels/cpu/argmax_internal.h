/* argmax_internal.h: what the files of matmul_argmax share (private to
 * kernels/cpu/argmax*.c): the shadow of a head (the copy prepare_argmax
 * makes, whose bound and formats argmax.c's header states) and the state
 * the backend keeps for matmul_argmax.
 *
 * argmax.c holds the contract, the screen and cpu_matmul_argmax;
 * argmax_shadow.c makes, finds and releases the shadows.
 */
#ifndef TANDEM_KERNELS_CPU_ARGMAX_INTERNAL_H
#define TANDEM_KERNELS_CPU_ARGMAX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_backend.h"

#define ARGMAX_COLS_ALIGN 64  /* the shadow's row stride, in bytes */
#define ARGMAX_QMAX_W 127
#define ARGMAX_QMAX_W_DRAFT 7   /* the draft copy's codes, stored + 8: 1..15 */
#define ARGMAX_DRAFT_OFFSET 8
#define ARGMAX_DRAFT_COLS 128   /* columns per 64-byte block of the draft copy */
#define ARGMAX_DRAFT_Z 4.0      /* the draft copy's margin, in standard deviations */
/* ARGMAX_GROUP, the input rows one pass over a shadow screens, is argmax.c's. */

struct cpu_argmax_shadow {
    const void *w;
    enum kern_dtype dtype;
    int rows, cols, stride; /* stride: bytes per row of q */
    int cols_pad;           /* columns per quantized input row (hq), a multiple of 64 */
    int draft;              /* the draft copy: 4-bit codes, statistical margin */
    double dq_factor;       /* weight of dq in the margin: 1, or Z / sqrt(d) for a draft */
    int packed;             /* rows of w from the first in the packed layout (packed.h) */
    enum cpu_layout layout; /* which packed layout (packed.h) */
    /* [rows][stride], one mapping of map_len bytes. A draft copy's block b
     * (64 bytes, columns 128b .. 128b + 127): byte j holds column 128b + j in
     * its low four bits and column 128b + 64 + j in its high four. */
    int8_t *q;
    size_t map_len;
    float *scale;           /* s_v */
    float *n1, *n2, *dq;    /* |W_v|_1, |W_v|_2, |W_v - s_v Q_v|_2, rounded up */
    double n1_max, n2_max, dq_max; /* their largest over the rows (screen_job.eps_max) */
};

struct cpu_argmax {
    struct cpu_argmax_shadow *shadows;
    int n_shadows, cap_shadows;
    int16_t *hq;            /* a group's quantized input rows [ARGMAX_GROUP][stride] */
    /* rows that may still hold the largest logit when the screen reached
     * them (A_v + eps_v at least the best lower bound seen so far), with
     * their A_v + eps_v: per thread and input row, [threads][ARGMAX_GROUP]
     * lists of up to rows entries each */
    int32_t *kept;
    double *kept_upper;
    int32_t *candidates;    /* the kept rows that reach the final best lower bound */
    float *logits;          /* a whole row of logits (the paths that need one) */
    /* bf16 heads on vdpbf16ps (bfdot.h): the input rows rounded to bf16,
     * as the product reads them [n][dp], and widened back to f32 [n][cols],
     * which the screen bounds against */
    uint16_t *hb;
    float *hround;
    size_t hq_cap, kept_cap, kept_upper_cap, logits_cap, candidates_cap, hb_cap, hround_cap;
    int last_candidates;    /* rows computed exactly for the last input row; -1: all */
};

/* The backend's matmul_argmax state, made on first use; NULL (and err set)
 * when out of memory. */
struct cpu_argmax *cpu_argmax_state(struct cpu_backend *cb, char *err);
/* The shadow prepared for w, or NULL. */
struct cpu_argmax_shadow *cpu_argmax_shadow_find(const struct cpu_backend *cb, const void *w);

#endif
