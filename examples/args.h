/* args.h -- the examples' option values, parsed whole.
 *
 * atoi("10x") is 10 and atof("1GB") is 1: a typo would run another
 * experiment than the one asked for. Each reader here takes the whole text
 * or fails (returns 0), and the caller refuses the option with a message.
 * Numbers only, no units: the budgets go through rkm_parse_budget. */
#ifndef ROCKMATE_EXAMPLES_ARGS_H
#define ROCKMATE_EXAMPLES_ARGS_H

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* A decimal integer in [lo, hi], digits only after an optional '-'. */
static inline int arg_int(const char *v, long lo, long hi, int *out)
{
    const char *d = v && *v == '-' ? v + 1 : v;
    if (!d || !isdigit((unsigned char)*d)) return 0;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < lo || x > hi) return 0;
    *out = (int)x;
    return 1;
}

/* An unsigned decimal integer (a seed). */
static inline int arg_u64(const char *v, uint64_t *out)
{
    if (!v || !isdigit((unsigned char)*v)) return 0;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno) return 0;
    *out = (uint64_t)x;
    return 1;
}

/* A finite decimal number (no hex, inf or nan; strtod takes them). */
static inline int arg_double(const char *v, double *out)
{
    if (!v || !(isdigit((unsigned char)*v) || *v == '.' || *v == '-')) return 0;
    for (const char *p = v; *p; p++)
        if (*p == 'x' || *p == 'X' || *p == 'n' || *p == 'N' || *p == 'i' || *p == 'I') return 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x)) return 0;
    *out = x;
    return 1;
}

#endif
