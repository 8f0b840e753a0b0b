/* argmax.h: the argmax rule every part of Tandem takes a token by: the
 * lowest index of the largest value, NaN values skipped. One definition,
 * in base, so the kernels (below common/speculation) and the sampling code
 * (above them) cannot drift apart: a greedy token must be the same whoever
 * picks it, and the kernels' faster argmaxes (the screened LM head) are
 * checked against this one. */
#ifndef TANDEM_ARGMAX_H
#define TANDEM_ARGMAX_H

/* The index of the largest of x[0..n), the lowest on ties; -1 when n < 1 or
 * every value is NaN. */
int argmax_f32(const float *x, int n);

#endif
