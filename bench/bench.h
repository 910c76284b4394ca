/* Helpers the benchmarks share: a monotonic clock, the median of 3, and
 * loading a bundled graph. */
#ifndef RKM_BENCH_H
#define RKM_BENCH_H

#include "../rockmate.h"

#include <stdio.h>
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

/* tests/graphs/NAME.rkg, or NULL with the error on stderr. */
static inline rkm_graph *bench_load(rkm_context *ctx, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "tests/graphs/%s.rkg", name);
    rkm_graph *g = NULL;
    if (rkm_graph_read_file(ctx, path, &g)) fprintf(stderr, "%s: %s\n", path, rkm_context_errmsg(ctx));
    return g;
}

#endif
