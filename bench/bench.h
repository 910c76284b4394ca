/* Helpers the benchmarks share: a monotonic clock and the median of 3. */
#ifndef RKM_BENCH_H
#define RKM_BENCH_H

#include <time.h>

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The median of t[0..2] (reordered). */
static inline double bench_median3(double t[3])
{
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < 3; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    return t[1];
}

#endif
