/* bench_kick: what the kicks buy on graphs too large for the whole-graph ILP, side by side.
 *
 *   build/bench/bench_kick
 *
 * The kicks (search.c: drop one recomputation of the best plan, squeeze it
 * back within the budget, polish) ran only on graphs small enough for the
 * whole-graph ILP (64 ops); they now run on every graph that affords them
 * (rkm__affords, RKM__NEED_KICKS: 256 ops at W's floor), with half the
 * squeeze's work where the graph does not afford the whole-graph ILP. For
 * every bundled graph of 65 to 256 ops,
 * at 90..25 % of the baseline peak: rockmate's overhead in % with the kicks
 * and without (the planner's kick work set to 0), their ratio
 * (1 + kicked) / (1 + unkicked), and the planning time of each (create +
 * solve, median of 3 runs, one core). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "../rockmate.c"
#include "bench.h"

#include <stdio.h>

static const char *const graphs[] = {"unet-d6", "dag100", "gpt2-124M-b4-t64", "dag4x50"};
static const int pcts[] = {90, 80, 70, 60, 50, 40, 30, 25};

/* Rockmate's overhead in % at `budget` (NAN: no plan), kicks on or off, and
 * the median planning time of 3 fresh planners. */
static double run(const rkm_graph *g, int kicks, uint64_t budget, double *secs)
{
    double t[3], ours = NAN;
    for (int k = 0; k < 3; k++) {
        rkm_solve_desc d = {0};
        d.algo = RKM_ALGO_ROCKMATE;
        double t0 = bench_now();
        rkm_planner *pl = NULL;
        rkm_plan *p = NULL;
        if (rkm_planner_create(g, &d, &pl) == RKM_OK) {
            if (!kicks) pl->kick_work = 0;
            (void)rkm_planner_solve(pl, budget, &p);
        }
        t[k] = bench_now() - t0;
        ours = p ? 100 * p->stats.overhead : NAN;
        rkm_plan_destroy(p);
        rkm_planner_destroy(pl);
    }
    *secs = bench_median3(t);
    return ours;
}

int main(void)
{
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx)) return 1;
    printf("overhead in %% of the baseline time; '-': no plan; s: create + solve, median of 3\n");
    printf("%-17s %4s %6s %8s %8s %7s %7s %7s\n", "graph", "ops", "budget", "kicked", "unkicked", "ratio", "s-kick",
           "s-none");
    int rows = 0, better = 0;
    double worst = 0, sum = 0;
    for (size_t k = 0; k < sizeof graphs / sizeof graphs[0]; k++) {
        rkm_graph *g = bench_load(ctx, graphs[k]);
        if (!g) continue;
        for (size_t i = 0; i < sizeof pcts / sizeof pcts[0]; i++) {
            uint64_t budget = (uint64_t)((double)g->stats.baseline_peak * pcts[i] / 100.0);
            double sk, sn, on = run(g, 1, budget, &sk), off = run(g, 0, budget, &sn);
            double ratio = (1 + on / 100) / (1 + off / 100);
            printf("%-17s %4d %5d%%", graphs[k], (int)g->n_ops, pcts[i]);
            if (isnan(on)) printf(" %8s %8s %7s", "-", "-", "-");
            else printf(" %8.2f %8.2f %7.4f", on, off, ratio);
            printf(" %7.3f %7.3f\n", sk, sn);
            if (isnan(on)) continue;
            rows++, better += ratio < 1, sum += sk - sn;
            if (sk - sn > worst) worst = sk - sn;
        }
        rkm_graph_destroy(g);
    }
    printf("%d rows with a plan; faster with the kicks: %d; planning time added: %.3f s on average, %.3f s at most\n",
           rows, better, rows ? sum / rows : 0, worst);
    rkm_context_destroy(ctx);
    return 0;
}
