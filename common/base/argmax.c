/* argmax.c: see argmax.h. */
#include "argmax.h"

#include <math.h>

int argmax_f32(const float *x, int n)
{
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (isnan(x[i]))
            continue;
        if (best < 0 || x[i] > x[best])
            best = i;
    }
    return best;
}
