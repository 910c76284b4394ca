/* bench_nest: what nesting buys on graphs whose big blocks nest, side by side.
 *
 *   build/bench/bench_nest
 *
 * For the U-Nets (tests/graphs/unet-d2, -d4, -d6: their outer block holds the
 * skip tensor across the inner network) and random DAGs without nesting
 * (dag60, dag100: their big block has no separators even with its input
 * held, and from 49 ops gets no block ILP either), at
 * 90, 80, 70, 60 and 50 % of the baseline peak: rockmate's overhead in % with
 * default settings (nesting on) and with nest_ops = -1 (flat: the block ILP
 * on every block), DTR's, the time bound's (no plan can beat it; '-' below
 * the lower bound, where no plan fits), and the
 * chain DP's own plan for each (the plan the block options feed, before
 * polish, squeeze and the other candidates). Planning time is create +
 * solve, median of 3 runs, one core. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "../rockmate.c"
#include "bench.h"

#include <stdio.h>

static const char *const graphs[] = {"unet-d2", "unet-d4", "unet-d6", "dag60", "dag100"};
static const int pcts[] = {90, 80, 70, 60, 50};

static double pct_of(const rkm_plan *p) { return p ? 100 * p->stats.overhead : NAN; }

static void cell(double v)
{
    if (isnan(v)) printf(" %8s", "-");
    else printf(" %8.2f", v);
}

/* Rockmate's overhead at `budget` (nest_ops as given), its chain DP plan's,
 * and the median planning time of 3 fresh planners. */
static void run(const rkm_graph *g, int32_t nest_ops, uint64_t budget, double *ours, double *dp, double *secs)
{
    double t[3];
    *ours = *dp = NAN;
    for (int k = 0; k < 3; k++) {
        rkm_solve_desc d = {0};
        d.algo = RKM_ALGO_ROCKMATE;
        d.nest_ops = nest_ops;
        double t0 = bench_now();
        rkm_planner *pl = NULL;
        rkm_plan *p = NULL, *q = NULL;
        if (rkm_planner_create(g, &d, &pl) == RKM_OK) (void)rkm_planner_solve(pl, budget, &p);
        t[k] = bench_now() - t0;
        if (pl && rkm__solve_dp(pl, budget, &q) == RKM_OK) *dp = pct_of(q);
        *ours = pct_of(p);
        rkm_plan_destroy(p);
        rkm_plan_destroy(q);
        rkm_planner_destroy(pl);
    }
    *secs = bench_median3(t);
}

int main(void)
{
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx)) return 1;
    printf("overhead in %% of the baseline time; '-': no plan; plan s: create + solve, median of 3\n");
    printf("%-8s %6s %8s %8s %8s %8s %8s %8s %8s %8s\n", "graph", "budget", "nested", "flat", "dp-nest", "dp-flat",
           "dtr", "bound", "s-nest", "s-flat");
    for (size_t k = 0; k < sizeof graphs / sizeof graphs[0]; k++) {
        rkm_graph *g = bench_load(ctx, graphs[k]);
        if (!g) continue;
        for (size_t i = 0; i < sizeof pcts / sizeof pcts[0]; i++) {
            uint64_t budget = (uint64_t)((double)g->stats.baseline_peak * pcts[i] / 100.0);
            double on, off, dpon, dpoff, son, soff, extra = NAN;
            run(g, 0, budget, &on, &dpon, &son);
            run(g, -1, budget, &off, &dpoff, &soff);
            rkm_solve_desc d = {0};
            d.algo = RKM_ALGO_DTR;
            rkm_plan *p = NULL;
            (void)rkm_plan_solve(g, &d, budget, &p);
            extra = rkm_graph_time_bound(g, budget, &extra) == RKM_OK ? 100 * extra / g->stats.baseline_time : NAN;
            printf("%-8s %5d%%", graphs[k], pcts[i]);
            cell(on), cell(off), cell(dpon), cell(dpoff), cell(pct_of(p)), cell(extra);
            printf(" %8.3f %8.3f\n", son, soff);
            rkm_plan_destroy(p);
        }
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
    return 0;
}
