/* qdot_tiles.h: the vector tiles of the int8/int4 product (qdot.h), written
 * once for every ISA. Included only by qdot_<isa>.c, which define first:
 *   QD_FN(name)   the ISA's name for a function of this file
 *   QD_TGT        its target attribute
 *   QD_VB         bytes of a vector (64: one panel line; 32: half a line)
 *   QD_TMAX       most panels a tile takes side by side (one input row)
 *   QD_R          most input rows a tile takes (QD_RMAX at most)
 *   qd_vi, qd_vf  the integer and float vector types, and the operations
 *   QD_LOADI, QD_SET1I, QD_DP (acc + the dot of unsigned by signed bytes,
 *   in 32-bit lanes, exactly), QD_ANDI, QD_SRLI16, QD_CVT, QD_ZEROF, QD_SET1F,
 *   QD_LOADF, QD_MULF, QD_FMA, QD_STOREF.
 *
 * A tile is T panels (T * 64 / QD_VB vectors of output rows) against R input
 * rows: per block, R x vectors int32 sums start at -offset * sum of codes
 * and take one QD_DP per line and row (the row's 4 codes broadcast); then
 * each output's float epilogue of qdot.h, lane by lane, which is the scalar
 * reference's operations: the bits do not depend on T, R, QD_VB or the ISA.
 */

#define QD_V (64 / QD_VB)   /* vectors per panel line */
#define QD_VL (QD_VB / 4)   /* output rows per vector */

QD_TGT static inline __attribute__((always_inline)) qd_vi QD_FN(qd_bcast)(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return QD_SET1I(v);
}

QD_TGT static inline __attribute__((always_inline)) void
QD_FN(qd_tile)(const struct qd_job *job, const int q8, const int T, const int R, int p, int i0)
{
    const struct qd_act *a = job->a;
    const int nb = a->nb;
    const size_t pb = job->panel_bytes;
    const uint8_t *w = job->w + (size_t)p * pb;
    qd_vf acc[QD_TMAX * QD_V][QD_R];
#pragma GCC unroll 8
    for (int v = 0; v < T * QD_V; v++)
#pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            acc[v][r] = QD_ZEROF();
    const int8_t *x = a->q + (size_t)i0 * (size_t)nb * QD_BLOCK;
    const size_t ldx = (size_t)nb * QD_BLOCK;
    for (int b = 0; b < nb; b++) {
        qd_vi is[QD_TMAX * QD_V][QD_R];
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const qd_vi init = QD_SET1I((q8 ? -128 : -8) * a->sum[(size_t)(i0 + r) * (size_t)nb + (size_t)b]);
#pragma GCC unroll 8
            for (int v = 0; v < T * QD_V; v++)
                is[v][r] = init;
        }
        const int8_t *xb = x + (size_t)b * QD_BLOCK;
        if (q8) {
            const uint8_t *wb = w + QD_LINE + (size_t)b * 8 * QD_LINE;
            /* each line's vectors loaded once, each row's codes broadcast once */
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) {
                qd_vi wv[QD_TMAX * QD_V];
#pragma GCC unroll 8
                for (int v = 0; v < T * QD_V; v++)
                    wv[v] = QD_LOADI(wb + (size_t)(v / QD_V) * pb + (size_t)l * QD_LINE +
                                     (size_t)(v % QD_V) * QD_VB);
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    const qd_vi xv = QD_FN(qd_bcast)(xb + (size_t)r * ldx + 4 * l);
#pragma GCC unroll 8
                    for (int v = 0; v < T * QD_V; v++)
                        is[v][r] = QD_DP(is[v][r], wv[v], xv);
                }
            }
        } else {
            const uint8_t *wb = w + (size_t)b * 5 * QD_LINE;
            const qd_vi lo4 = QD_SET1I(0x0f0f0f0f);
#pragma GCC unroll 4
            for (int l = 0; l < 4; l++) {
                qd_vi wlo[QD_TMAX * QD_V], whi[QD_TMAX * QD_V];
#pragma GCC unroll 8
                for (int v = 0; v < T * QD_V; v++) {
                    const qd_vi raw = QD_LOADI(wb + (size_t)(v / QD_V) * pb + (size_t)l * QD_LINE +
                                               (size_t)(v % QD_V) * QD_VB);
                    wlo[v] = QD_ANDI(raw, lo4);
                    whi[v] = QD_ANDI(QD_SRLI16(raw, 4), lo4);
                }
#pragma GCC unroll 6
                for (int r = 0; r < R; r++) {
                    const qd_vi x0 = QD_FN(qd_bcast)(xb + (size_t)r * ldx + 8 * l);
                    const qd_vi x1 = QD_FN(qd_bcast)(xb + (size_t)r * ldx + 8 * l + 4);
#pragma GCC unroll 8
                    for (int v = 0; v < T * QD_V; v++) {
                        is[v][r] = QD_DP(is[v][r], wlo[v], x0);
                        is[v][r] = QD_DP(is[v][r], whi[v], x1);
                    }
                }
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const qd_vf s = QD_SET1F(a->s[(size_t)(i0 + r) * (size_t)nb + (size_t)b]);
#pragma GCC unroll 8
            for (int v = 0; v < T * QD_V; v++) {
                if (q8) {
                    acc[v][r] = QD_FMA(QD_CVT(is[v][r]), s, acc[v][r]);
                } else {
                    const float *ws = (const float *)(const void *)(w + (size_t)(v / QD_V) * pb +
                                                                    (size_t)b * 5 * QD_LINE + 4 * QD_LINE) +
                                      (v % QD_V) * QD_VL;
                    acc[v][r] = QD_FMA(QD_CVT(is[v][r]), QD_MULF(QD_LOADF(ws), s), acc[v][r]);
                }
            }
        }
    }
    /* every index constant (the loops unrolled), or the accumulators would
     * live in memory */
#pragma GCC unroll 8
    for (int v = 0; v < T * QD_V; v++) {
        const int o0 = (p + v / QD_V) * QD_ROWS + (v % QD_V) * QD_VL;
        const int left = job->d_out - o0;
        const int live = left < 0 ? 0 : left < QD_VL ? left : QD_VL;
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            qd_vf y = acc[v][r];
            if (q8)
                y = QD_MULF(y, QD_LOADF((const float *)(const void *)(w + (size_t)(v / QD_V) * pb) +
                                        (v % QD_V) * QD_VL));
            float tmp[QD_VL];
            QD_STOREF(tmp, y);
            memcpy(job->out + (size_t)(i0 + r) * (size_t)job->d_out + (size_t)o0, tmp,
                   (size_t)live * sizeof(float));
        }
    }
}

/* The tile of T panels against R rows with both constant (the switch gives
 * the compiler one copy per shape, its accumulators in registers). */
QD_TGT static void QD_FN(qd_tile_any)(const struct qd_job *job, int T, int R, int p, int i0)
{
#define QD_CASE(t, r)                                                                              \
    case (t) * 8 + (r):                                                                            \
        if (job->dtype == KERN_DTYPE_Q8)                                                           \
            QD_FN(qd_tile)(job, 1, t, r, p, i0);                                                   \
        else                                                                                       \
            QD_FN(qd_tile)(job, 0, t, r, p, i0);                                                   \
        return;
    switch (T * 8 + R) {
        QD_CASE(1, 1)
        QD_CASE(QD_TMAX, 1)
        QD_CASE(1, 2)
        QD_CASE(1, 3)
#if QD_R > 3
        QD_CASE(QD_TMAX, 2)
        QD_CASE(QD_TMAX, 3)
        QD_CASE(1, 4)
        QD_CASE(1, 5)
        QD_CASE(1, 6)
        QD_CASE(2, 2)
        QD_CASE(2, 3)
        QD_CASE(2, 4)
        QD_CASE(2, 5)
        QD_CASE(2, 6)
#endif
    default: break;
    }
#undef QD_CASE
}

/* Panels [p0, p0 + np) against all the job's rows: one row QD_TMAX panels
 * at a time (that many weight streams side by side), more rows in groups of
 * at most QD_R as even as can be, over QD_PAIR panels at a time. */
QD_TGT void QD_FN(qd_panels)(const struct qd_job *job, int p0, int np)
{
    const int n = job->n;
    if (n == 1) {
        int p = p0;
        for (; p + QD_TMAX <= p0 + np; p += QD_TMAX)
            QD_FN(qd_tile_any)(job, QD_TMAX, 1, p, 0);
        for (; p < p0 + np; p++)
            QD_FN(qd_tile_any)(job, 1, 1, p, 0);
        return;
    }
    /* up to QD_WIDE_MAX rows: QD_TMAX panels (streams) in groups of 3 */
    const int wide = QD_R > 3 && n <= QD_WIDE_MAX;
    const int rmax = wide ? 3 : QD_R, tmax = wide ? QD_TMAX : QD_PAIR;
    const int groups = (n + rmax - 1) / rmax;
    for (int p = p0, t; p < p0 + np; p += t) {
        t = p0 + np - p < tmax ? 1 : tmax;
        for (int g = 0, i = 0; g < groups; g++) {
            const int ri = n / groups + (g < n % groups ? 1 : 0);
            QD_FN(qd_tile_any)(job, t, ri, p, i);
            i += ri;
        }
    }
}
