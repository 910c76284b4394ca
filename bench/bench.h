/* Helpers the benchmarks share: a monotonic clock, the median of 3,
 * loading a bundled graph, and a figure from a reference TSV. */
#ifndef RKM_BENCH_H
#define RKM_BENCH_H

#include "../rockmate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The third column of the TSV at `path` on the row (graph, pct), as a
 * number: NAN where the file, the row or the figure ("-") is missing. The
 * header line does not scan. */
static inline double bench_tsv(const char *path, const char *graph, int pct)
{
    FILE *f = fopen(path, "r");
    char line[256], g[64], v[32];
    int p;
    double out = NAN;
    if (!f) return NAN;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%63s %d %31s", g, &p, v) == 3 && !strcmp(g, graph) && p == pct)
            out = strcmp(v, "-") ? atof(v) : NAN;
    fclose(f);
    return out;
}

#endif
