/* bench_layout: the memory a host allocates for a plan, side by side.
 *
 *   build/bench/bench_layout              every bundled graph (below)
 *   build/bench/bench_layout --chain N    an N-op chain end to end (below)
 *   build/bench/bench_layout --write-chain N FILE   write that chain's .rkg
 *
 * Bundled graphs: every graph in tests/graphs, every algorithm (checkmate
 * on graphs of up to 64 ops, with 10 s), at 90 .. 20 % of the baseline
 * peak and at the planner's smallest budget, alignment 256. Per plan: its
 * peak and aligned peak (the lower bound for any layout), the arena of the
 * library's first placer (three greedy orders: what rkm_plan_layout did
 * before the placer in rockmate.c's section 5) and of the placer now (the
 * plan's own layout), the skyline's alone, and the layout's time (median of
 * 3). The summary counts the plans whose arena is the aligned peak, the
 * geometric mean of arena / aligned peak, and the arenas over the budget:
 * the old placer's are what a host with exactly the budget would have run
 * out of.
 *
 * The chain: N ops, each reading the one before (sizes 64..88 KiB, seeded),
 * written to a file, then read, planned at 50 % with the default algorithm
 * and laid out: seconds per stage and the process's peak resident memory. */
#include "../rockmate.c" /* white box: the placer's stages */

#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static const char *const graphs[] = {"gpt2-tiny", "gpt2-124M-b4-t64", "gpt2-xl-b4-t1024", "mlp16", "multi-output",
                                     "peer-gpt", "random30", "resnet18-like-b32", "unet-d2", "unet-d4", "unet-d6",
                                     "dag60", "dag100", "dag4x50"};
static const rkm_algo algos[] = {RKM_ALGO_ROCKMATE, RKM_ALGO_ROTOR, RKM_ALGO_SQRT, RKM_ALGO_DTR, RKM_ALGO_CHECKMATE,
                                 RKM_ALGO_NONE};
static const int pcts[] = {90, 80, 70, 60, 50, 40, 30, 20, 0}; /* 0: the smallest budget */
#define N_PCTS (sizeof pcts / sizeof pcts[0])

typedef struct totals {
    int plans, at_bound_new, at_bound_old, at_bound_sky, over_old;
    double log_new, log_old, log_sky, log_ff, max_ff;
} totals;

/* A re-layout of p's buffers with the given stages: its arena. */
static uint64_t relayout(const rkm_plan *p, unsigned stages, rkm_buffer *buf)
{
    uint64_t arena = 0, peak;
    memcpy(buf, p->buffers, p->n_buffers * sizeof *buf);
    if (rkm__layout(p->ctx, buf, p->n_buffers, p->stats.alignment, stages, NULL, &arena, &peak)) return 0;
    return arena;
}

static void one_plan(const char *name, rkm_algo a, int pct, const rkm_plan *p, totals *t)
{
    rkm_buffer *buf = malloc((p->n_buffers + 1) * sizeof *buf);
    const rkm_plan_stats *st = &p->stats;
    uint64_t old = relayout(p, RKM__LAY_GREEDY, buf), sky = relayout(p, RKM__LAY_SKYLINE, buf);
    double ts[3];
    for (int k = 0; k < 3; k++) {
        double t0 = bench_now();
        relayout(p, RKM__LAY_ALL, buf);
        ts[k] = bench_now() - t0;
    }
    free(buf);
    rkm_arena_capacity_info ff = {0};
    (void)rkm_arena_capacity(p, RKM_ARENA_FIRST_FIT, &ff);
    char b[16];
    if (pct) snprintf(b, sizeof b, "%d%%", pct);
    else snprintf(b, sizeof b, "min");
    double ap = (double)st->aligned_peak;
    double ffp = (double)ff.capacity / (double)st->peak;
    printf("%-18s %-9s %-5s %12llu %12llu %12llu %12llu %12llu %7.4f %7.4f %7.4f %8.4f %s\n", name, rkm_algo_name(a), b,
           (unsigned long long)st->budget, (unsigned long long)st->peak, (unsigned long long)st->aligned_peak,
           (unsigned long long)old, (unsigned long long)st->arena_bytes, (double)old / ap, (double)st->arena_bytes / ap,
           ffp, bench_median3(ts), old > st->budget ? "old over budget" : "");
    t->log_ff += log(ffp);
    if (ffp > t->max_ff) t->max_ff = ffp;
    t->plans++;
    t->at_bound_new += st->arena_bytes == st->aligned_peak;
    t->at_bound_old += old == st->aligned_peak;
    t->at_bound_sky += sky == st->aligned_peak;
    t->over_old += old > st->budget;
    t->log_new += log((double)st->arena_bytes / ap);
    t->log_old += log((double)old / ap);
    t->log_sky += log((double)sky / ap);
}

static void bundled(void)
{
    totals t = {0};
    printf("bytes; arena/aligned: arena over the aligned peak; ff/peak: the region a dynamic first fit needs "
           "(rkm_arena_capacity, first fit) over the peak; layout s: the placer on that plan, median of 3\n");
    printf("%-18s %-9s %-5s %12s %12s %12s %12s %12s %7s %7s %7s %8s\n", "graph", "algo", "at", "budget", "peak",
           "aligned peak", "old arena", "arena", "old/al", "new/al", "ff/peak", "layout s");
    for (size_t gi = 0; gi < sizeof graphs / sizeof graphs[0]; gi++) {
        rkm_context *ctx;
        if (rkm_context_create(NULL, &ctx)) return;
        rkm_graph *g = bench_load(ctx, graphs[gi]);
        for (size_t ai = 0; g && ai < sizeof algos / sizeof algos[0]; ai++) {
            if (algos[ai] == RKM_ALGO_CHECKMATE && g->n_ops > 64) continue;
            rkm_solve_desc d = {.algo = algos[ai], .time_limit = algos[ai] == RKM_ALGO_CHECKMATE ? 10 : 0};
            rkm_planner *pl;
            if (rkm_planner_create(g, &d, &pl)) continue;
            for (size_t i = 0; i < N_PCTS; i++) {
                uint64_t budget = g->stats.baseline_peak / 100 * (uint64_t)pcts[i];
                if (!pcts[i] && rkm_planner_min_budget(pl, &budget)) continue;
                rkm_plan *p;
                if (rkm_planner_solve(pl, budget, &p)) continue;
                one_plan(graphs[gi], algos[ai], pcts[i], p, &t);
                rkm_plan_destroy(p);
            }
            rkm_planner_destroy(pl);
        }
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
        fflush(stdout);
    }
    printf("\n%d plans: arena = aligned peak: old %d, skyline alone %d, new %d; geometric mean arena / aligned peak: "
           "old %.4f, skyline alone %.4f, new %.4f; old arena over the budget: %d (new: never, by construction)\n",
           t.plans, t.at_bound_old, t.at_bound_sky, t.at_bound_new, exp(t.log_old / t.plans), exp(t.log_sky / t.plans),
           exp(t.log_new / t.plans), t.over_old);
    printf("a dynamic first fit (an exec in RKM_ARENA_FIRST_FIT mode) needs over the peak: geometric mean "
           "%.4f, at most %.4f\n", exp(t.log_ff / t.plans), t.max_ff);
}

/* The N-op chain: each op reads the one before; sizes 64..88 KiB and times
 * from a fixed xorshift seed. */
static int write_chain(int n, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    uint64_t x = 88172645463325252ull;
#define NEXT() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    fprintf(f, "rockmate-graph 1\ntensor x 65536 input\n");
    for (int i = 0; i < n; i++) fprintf(f, "tensor t%d %llu\n", i, (unsigned long long)(65536 + NEXT() % 24577));
    for (int i = 0; i < n; i++) {
        double fwd = 1e-4 * (1 + (double)(NEXT() % 1000) / 1000), bwd = 2 * fwd;
        char in[32];
        if (i) snprintf(in, sizeof in, "t%d", i - 1);
        else snprintf(in, sizeof in, "x");
        fprintf(f, "op o%d fwd=%.6g bwd=%.6g in=%s out=t%d saved=%s\n", i, fwd, bwd, in, i, in);
    }
    fprintf(f, "loss t%d\n", n - 1);
#undef NEXT
    return fclose(f) == 0;
}

static int chain(int n)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/rkm_chain_%d.rkg", n);
    if (!write_chain(n, path)) return 1;
    rkm_context *ctx;
    rkm_graph *g;
    rkm_planner *pl;
    rkm_plan *p;
    if (rkm_context_create(NULL, &ctx)) return 1;
    double t0 = bench_now();
    if (rkm_graph_read_file(ctx, path, &g)) return fprintf(stderr, "%s\n", rkm_context_errmsg(ctx)), 1;
    double t1 = bench_now();
    rkm_solve_desc d = {0};
    if (rkm_planner_create(g, &d, &pl)) return fprintf(stderr, "%s\n", rkm_context_errmsg(ctx)), 1;
    double t2 = bench_now();
    if (rkm_planner_solve(pl, g->stats.baseline_peak / 2, &p)) return fprintf(stderr, "%s\n", rkm_context_errmsg(ctx)), 1;
    double t3 = bench_now();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const rkm_plan_stats *st = &p->stats;
    printf("chain of %d ops: read and finalize %.3f s, planner %.3f s, solve and layout %.3f s, total %.3f s; "
           "peak resident %.0f MiB\n", n, t1 - t0, t2 - t1, t3 - t2, t3 - t0, (double)ru.ru_maxrss / 1024);
    printf("  %zu steps, %zu buffers, peak %llu, aligned peak %llu, arena %llu (%.4f), budget %llu, overhead %.2f %%\n",
           p->n_steps, p->n_buffers, (unsigned long long)st->peak, (unsigned long long)st->aligned_peak,
           (unsigned long long)st->arena_bytes, (double)st->arena_bytes / (double)st->aligned_peak,
           (unsigned long long)st->budget, 100 * st->overhead);
    rkm_plan_destroy(p);
    rkm_planner_destroy(pl);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    remove(path);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--chain") == 0) return chain(atoi(argv[2]));
    if (argc == 4 && strcmp(argv[1], "--write-chain") == 0) return !write_chain(atoi(argv[2]), argv[3]);
    bundled();
    return 0;
}
