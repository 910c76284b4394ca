/* bench_timeout: how far past rkm_solve_desc.time_limit a planning goes.
 *
 *   build/bench/bench_timeout [T ...]     (default: 0.005 0.05 0.5 seconds)
 *
 * For every bundled graph, time limit T, algorithm (rockmate, dtr, and
 * checkmate on graphs of up to 64 ops) and budget (70 % and 40 % of the
 * baseline peak): the wall time of one plan's planning (rkm_planner_create,
 * then rkm_planner_solve, on a fresh planner: what the limit bounds), the
 * most of 3 runs, and what the call gave: a plan ("ok"), one the limit cut
 * ("cut"), RKM_ERROR_TIMEOUT ("timeout") or RKM_ERROR_BUDGET ("none").
 * Then rkm_planner_min_budget on a fresh planner the same way ("min").
 * "over" is that time minus T: the slack rockmate.h documents is the most
 * of it over every row (the summary line per T). One core; the figures are
 * wall clock, so a loaded machine shows more. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "../rockmate.h"
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const graphs[] = {"multi-output", "gpt2-tiny", "random30", "mlp16", "resnet18-like-b32",
                                     "peer-gpt",     "dag60",     "unet-d2",  "unet-d4", "unet-d6",
                                     "dag100",       "gpt2-124M-b4-t64", "dag4x50", "gpt2-xl-b4-t1024"};
static const double default_limits[] = {0.005, 0.05, 0.5};
static const int pcts[] = {70, 40};
#define RUNS 3
#define WHOLE_GRAPH_OPS 64 /* checkmate beyond: minutes of model build */

/* One planning of `algo` under `limit`: budget 0 is rkm_planner_min_budget,
 * else a solve. Its wall time into *secs; what it gave, as a word. */
static const char *plan_once(const rkm_graph *g, rkm_algo algo, double limit, uint64_t budget, double *secs)
{
    rkm_solve_desc d;
    memset(&d, 0, sizeof d);
    d.algo = algo;
    d.time_limit = limit;
    rkm_planner *pl = NULL;
    rkm_plan *p = NULL;
    uint64_t min = 0;
    double t0 = bench_now();
    rkm_result r = rkm_planner_create(g, &d, &pl);
    if (!r) r = budget ? rkm_planner_solve(pl, budget, &p) : rkm_planner_min_budget(pl, &min);
    *secs = bench_now() - t0;
    rkm_plan_stats ps;
    rkm_planner_stats st;
    int cut = 0;
    if (p && rkm_plan_stats_get(p, &ps) == RKM_OK) cut = ps.cut;
    if (!budget && pl && rkm_planner_stats_get(pl, &st) == RKM_OK) cut = st.cut > 0;
    rkm_plan_destroy(p);
    rkm_planner_destroy(pl);
    if (r == RKM_ERROR_TIMEOUT) return "timeout";
    if (r == RKM_ERROR_BUDGET) return "none";
    if (r) return "error";
    return cut ? "cut" : "ok";
}

/* The worst of RUNS plannings; *word: the first run's outcome, or "mixed". */
static double plan_worst(const rkm_graph *g, rkm_algo algo, double limit, uint64_t budget, const char **word)
{
    double worst = 0;
    for (int k = 0; k < RUNS; k++) {
        double s;
        const char *w = plan_once(g, algo, limit, budget, &s);
        if (k == 0) *word = w;
        else if (strcmp(w, *word) != 0) *word = "mixed";
        if (s > worst) worst = s;
    }
    return worst;
}

int main(int argc, char **argv)
{
    double limits[16];
    int n_limits = 0;
    for (int i = 1; i < argc && n_limits < 16; i++) limits[n_limits++] = atof(argv[i]);
    if (!n_limits)
        for (size_t i = 0; i < sizeof default_limits / sizeof default_limits[0]; i++) limits[n_limits++] = default_limits[i];
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx)) return 1;
    printf("s: create + solve (min: create + min_budget), the most of %d runs; over: s - T, in ms\n", RUNS);
    printf("%-17s %4s %7s %-9s %6s %-8s %8s %8s\n", "graph", "ops", "T", "algo", "budget", "result", "s", "over");
    for (int li = 0; li < n_limits; li++) {
        double T = limits[li], worst = -1e9;
        int rows = 0, cut = 0;
        const char *worst_at = "";
        static char where[96];
        for (size_t k = 0; k < sizeof graphs / sizeof graphs[0]; k++) {
            rkm_graph *g = bench_load(ctx, graphs[k]);
            rkm_graph_stats gs;
            if (!g || rkm_graph_stats_get(g, &gs)) continue;
            int32_t ops = rkm_graph_num_ops(g);
            static const rkm_algo algos[] = {RKM_ALGO_ROCKMATE, RKM_ALGO_DTR, RKM_ALGO_CHECKMATE};
            for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
                if (algos[a] == RKM_ALGO_CHECKMATE && ops > WHOLE_GRAPH_OPS) continue;
                for (size_t i = 0; i <= sizeof pcts / sizeof pcts[0]; i++) {
                    int min = i == sizeof pcts / sizeof pcts[0];
                    uint64_t budget = min ? 0 : gs.baseline_peak / 100 * (uint64_t)pcts[i];
                    const char *word;
                    double s = plan_worst(g, algos[a], T, budget, &word);
                    char b[16];
                    if (min) snprintf(b, sizeof b, "min");
                    else snprintf(b, sizeof b, "%d%%", pcts[i]);
                    printf("%-17s %4d %7.3f %-9s %6s %-8s %8.3f %8.1f\n", graphs[k], (int)ops, T,
                           rkm_algo_name(algos[a]), b, word, s, 1e3 * (s - T));
                    rows++;
                    cut += strcmp(word, "cut") == 0 || strcmp(word, "timeout") == 0;
                    if (s - T > worst) {
                        worst = s - T;
                        snprintf(where, sizeof where, "%s %s %s", graphs[k], rkm_algo_name(algos[a]), b);
                        worst_at = where;
                    }
                }
            }
            rkm_graph_destroy(g);
        }
        printf("T = %g s: %d rows, %d cut or timed out; the most over T: %.1f ms (%s)\n", T, rows, cut, 1e3 * worst,
               worst_at);
        fflush(stdout);
    }
    rkm_context_destroy(ctx);
    return 0;
}
