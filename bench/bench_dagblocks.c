/* bench_dagblocks: rockmate on chains of repeated random-DAG blocks against
 * the whole-graph ILP, side by side.
 *
 *   build/bench/bench_dagblocks [--checkmate S] [--tsv]
 *
 * The graphs are bench/reference/dag-blocks/NAME.rkg or, for the two the
 * tests use, tests/graphs/NAME.rkg (each made by tests/graphs/random_dag.py,
 * the commands in bench/reference/dag-blocks/README.md). For each
 * at 90, 80, ..., 30 % of the baseline peak: rockmate's overhead (time /
 * baseline time - 1, in %) with default settings, its planning time per
 * budget (rkm_planner_solve on one planner, median of 3 runs) and the
 * planner's creation (median of 3), beside the whole-graph ILP's overhead
 * (`rockmate plan G --budget P% --algo checkmate --time-limit 120`, from
 * bench/reference/dag-blocks/checkmate-120.tsv; with --checkmate S it runs
 * our checkmate with S seconds now). `ratio` is (1 + ours) / (1 + its): at
 * most 1 is as fast or faster. The last lines count the rows where rockmate
 * is slower and give the geometric mean of the ratios. --tsv prints instead
 * tab-separated lines for bench/vs.sh: per graph and budget (graph, budget,
 * algo, budget in bytes, overhead in %, planning seconds per budget), and
 * per graph one line with budget `create` and the planner's creation in
 * seconds ('-': no plan or no figure). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "../rockmate.h"
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIR "bench/reference/dag-blocks/"

static const char *const graphs[] = {"dag6x30-s17", "dag4x50",     "dag6x30-s3",  "dag6x30-s5", "dag6x30-s8",
                                     "dag5x40-s11", "dag8x20-s4", "dag3x50-s21", "dag7x25-s9"};
#define N_GRAPHS (sizeof graphs / sizeof graphs[0])
static const int pcts[] = {90, 80, 70, 60, 50, 40, 30};
#define N_PCTS (sizeof pcts / sizeof pcts[0])

/* Overhead in % of the plan for budget, or NAN where none. */
static double overhead(const rkm_plan *p, double base_time)
{
    rkm_plan_stats st;
    if (!p || rkm_plan_stats_get(p, &st)) return NAN;
    return 100 * (st.time / base_time - 1);
}

int main(int argc, char **argv)
{
    double checkmate_s = 0;
    int tsv = 0; /* --tsv: machine-readable lines, no table */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--checkmate") && i + 1 < argc) checkmate_s = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tsv")) tsv = 1;
        else {
            fprintf(stderr, "usage: bench_dagblocks [--checkmate SECONDS] [--tsv]\n");
            return 2;
        }
    }
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx)) return 1;
    if (tsv) printf("graph\tbudget\talgo\tbudget_bytes\toverhead\tplan_s\n");
    else {
        printf("overhead in %% of the baseline time; budget in %% of the baseline peak; '-': no plan\n");
        printf("%-12s %6s %9s %9s %7s %8s %8s\n", "graph", "budget", "rockmate", checkmate_s > 0 ? "cm-now" : "cm120",
               "ratio", "plan s", "create s");
    }
    int rows = 0, slower = 0;
    double log_sum = 0;
    for (size_t k = 0; k < N_GRAPHS; k++) {
        char path[256];
        snprintf(path, sizeof path, DIR "%s.rkg", graphs[k]);
        rkm_graph *g = NULL;
        if (rkm_graph_read_file(ctx, path, &g) && !(g = bench_load(ctx, graphs[k]))) return 1;
        rkm_graph_stats gs;
        rkm_graph_stats_get(g, &gs);
        rkm_solve_desc d = {0};
        rkm_planner *pl[3] = {NULL, NULL, NULL};
        double tc[3];
        for (int r = 0; r < 3; r++) {
            double t0 = bench_now();
            if (rkm_planner_create(g, &d, &pl[r])) {
                fprintf(stderr, "%s: %s\n", graphs[k], rkm_context_errmsg(ctx));
                return 1;
            }
            tc[r] = bench_now() - t0;
        }
        double create = bench_median3(tc);
        if (tsv) printf("%s\tcreate\trockmate\t-\t-\t%.4f\n", graphs[k], create);
        for (size_t i = 0; i < N_PCTS; i++) {
            uint64_t budget = gs.baseline_peak / 100 * (uint64_t)pcts[i];
            double ts[3], ours = NAN, its;
            for (int r = 0; r < 3; r++) {
                rkm_plan *p = NULL;
                double t0 = bench_now();
                rkm_result res = rkm_planner_solve(pl[r], budget, &p);
                ts[r] = bench_now() - t0;
                if (!res) ours = overhead(p, gs.baseline_time);
                rkm_plan_destroy(p);
            }
            if (checkmate_s > 0) {
                rkm_solve_desc dc = {0};
                rkm_plan *p = NULL;
                dc.algo = RKM_ALGO_CHECKMATE;
                dc.time_limit = checkmate_s;
                its = rkm_plan_solve(g, &dc, budget, &p) ? NAN : overhead(p, gs.baseline_time);
                rkm_plan_destroy(p);
            } else
                its = bench_tsv(DIR "checkmate-120.tsv", graphs[k], pcts[i]);
            double ratio = isnan(ours) || isnan(its) ? NAN : (1 + ours / 100) / (1 + its / 100);
            if (!isnan(ratio)) {
                rows++;
                slower += ratio > 1 + 1e-9;
                log_sum += log(ratio);
            }
            char a[16] = "-", b[16] = "-", c[16] = "-";
            if (tsv) {
                if (!isnan(ours)) snprintf(a, sizeof a, "%.4f", ours);
                printf("%s\t%d%%\trockmate\t%llu\t%s\t%.4f\n", graphs[k], pcts[i], (unsigned long long)budget, a,
                       bench_median3(ts));
                continue;
            }
            if (!isnan(ours)) snprintf(a, sizeof a, "%.2f", ours);
            if (!isnan(its)) snprintf(b, sizeof b, "%.2f", its);
            if (!isnan(ratio)) snprintf(c, sizeof c, "%.4f", ratio);
            printf("%-12s %5d%% %9s %9s %7s %8.3f %8.3f\n", graphs[k], pcts[i], a, b, c, bench_median3(ts), create);
        }
        for (int r = 0; r < 3; r++) rkm_planner_destroy(pl[r]);
        rkm_graph_destroy(g);
    }
    if (!tsv)
        printf("%d rows with both; rockmate slower than the whole-graph ILP: %d; geometric mean of the ratios %.4f\n",
               rows, slower, rows ? exp(log_sum / rows) : NAN);
    rkm_context_destroy(ctx);
    return 0;
}
