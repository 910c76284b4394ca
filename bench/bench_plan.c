/* bench_plan: planning time and plan quality, side by side, in one run.
 *
 *   build/bench/bench_plan [GRAPH.rkg ...]     (default: every bundled graph)
 *
 * For each graph: the planning time of each algorithm (structure, block
 * options with their ILPs, chain DP: rkm_planner_create, then one solve),
 * then the overhead (time / baseline time - 1) at budgets from 100 % down,
 * per algorithm, with the arena/peak ratio of the memory layout. Checkmate
 * (the whole-graph ILP) runs only on graphs of at most 40 ops, with a 10 s
 * planning limit (5 s per solve). On
 * peer-gpt.rkg it also prints the original Rockmate's published points
 * (replayed under our accounting) beside ours at the same peaks. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "../rockmate.h"
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const default_graphs[] = {
    "tests/graphs/gpt2-tiny.rkg",        "tests/graphs/gpt2-124M-b4-t64.rkg", "tests/graphs/gpt2-xl-b4-t1024.rkg",
    "tests/graphs/mlp16.rkg",            "tests/graphs/multi-output.rkg",     "tests/graphs/peer-gpt.rkg",
    "tests/graphs/random30.rkg",         "tests/graphs/resnet18-like-b32.rkg"};

static const rkm_algo algos[] = {RKM_ALGO_NONE, RKM_ALGO_SQRT, RKM_ALGO_ROTOR, RKM_ALGO_ROCKMATE, RKM_ALGO_CHECKMATE};
#define N_ALGOS 5
static const double pcts[] = {100, 90, 80, 70, 60, 50, 40, 30, 25, 20, 15, 10};
#define N_PCTS (sizeof pcts / sizeof pcts[0])

/* The original Rockmate's plans for peer-gpt.rkg (peak share / overhead). */
static const double peer[][2] = {{82.2, 1.49}, {61.1, 6.31}, {51.1, 9.66}, {41.1, 13.86}, {30.0, 19.89}};

static uint64_t at_pct(uint64_t base, double pct) { return (uint64_t)((double)base * pct / 100.0); }

static void overhead_cell(rkm_planner *pl, uint64_t budget, char *cell, size_t size, double *arena_ratio)
{
    rkm_plan *p;
    rkm_result r = rkm_planner_solve(pl, budget, &p);
    if (r == RKM_ERROR_BUDGET) {
        snprintf(cell, size, "--");
        return;
    }
    if (r) {
        snprintf(cell, size, "err");
        return;
    }
    rkm_plan_stats st;
    rkm_plan_stats_get(p, &st);
    size_t n = rkm_plan_num_buffers(p);
    rkm_buffer *b = malloc((n ? n : 1) * sizeof *b);
    uint64_t arena;
    if (b && rkm_plan_layout(p, 256, b, &arena) == RKM_OK && st.peak && (double)arena / (double)st.peak > *arena_ratio)
        *arena_ratio = (double)arena / (double)st.peak;
    free(b);
    snprintf(cell, size, "%.2f%%", 100.0 * st.overhead);
    rkm_plan_destroy(p);
}

static void bench_graph(rkm_context *ctx, const char *path)
{
    rkm_graph *g;
    if (rkm_graph_read_file(ctx, path, &g) != RKM_OK) {
        fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
        return;
    }
    rkm_graph_stats gs;
    rkm_graph_stats_get(g, &gs);
    printf("\n## %s: %d ops, %d blocks in %d classes, baseline peak %llu bytes, lower bound %.1f%%\n\n", path,
           rkm_graph_num_ops(g), gs.blocks, gs.block_classes, (unsigned long long)gs.baseline_peak,
           100.0 * (double)gs.lower_bound / (double)gs.baseline_peak);
    rkm_planner *pl[N_ALGOS] = {0};
    double worst_arena[N_ALGOS] = {0};
    printf("| algo | plan time (s) | ILP solves (opt/sub/inf/timeout) | min budget |\n|---|---|---|---|\n");
    for (int a = 0; a < N_ALGOS; a++) {
        if (algos[a] == RKM_ALGO_CHECKMATE && rkm_graph_num_ops(g) > 40) continue;
        rkm_solve_desc d = {0};
        d.algo = algos[a];
        if (d.algo == RKM_ALGO_CHECKMATE) d.time_limit = 10; /* 5 s per solve */
        double t0 = bench_now();
        if (rkm_planner_create(g, &d, &pl[a]) != RKM_OK) {
            printf("| %s | %s | | |\n", rkm_algo_name(algos[a]), rkm_context_errmsg(ctx));
            continue;
        }
        rkm_plan *p = NULL;
        rkm_planner_solve(pl[a], at_pct(gs.baseline_peak, 50), &p);
        double t1 = bench_now();
        rkm_plan_destroy(p);
        uint64_t min = 0;
        rkm_planner_min_budget(pl[a], &min);
        rkm_planner_stats st;
        rkm_planner_stats_get(pl[a], &st);
        printf("| %s | %.3f | %d (%d/%d/%d/%d) | %.1f%% |\n", rkm_algo_name(algos[a]), t1 - t0, st.ilp_solves,
               st.ilp_optimal, st.ilp_suboptimal, st.ilp_infeasible, st.ilp_timeout,
               100.0 * (double)min / (double)gs.baseline_peak);
    }
    printf("\n| budget |");
    for (int a = 0; a < N_ALGOS; a++)
        if (pl[a]) printf(" %s |", rkm_algo_name(algos[a]));
    printf("\n|---|");
    for (int a = 0; a < N_ALGOS; a++)
        if (pl[a]) printf("---|");
    printf("\n");
    for (size_t i = 0; i < N_PCTS; i++) {
        printf("| %.0f%% |", pcts[i]);
        for (int a = 0; a < N_ALGOS; a++) {
            if (!pl[a]) continue;
            char cell[32];
            overhead_cell(pl[a], at_pct(gs.baseline_peak, pcts[i]), cell, sizeof cell, &worst_arena[a]);
            printf(" %s |", cell);
        }
        printf("\n");
    }
    printf("\nworst arena/peak of the memory layout:");
    for (int a = 0; a < N_ALGOS; a++)
        if (pl[a]) printf(" %s %.3f", rkm_algo_name(algos[a]), worst_arena[a]);
    printf("\n");
    if (strstr(path, "peer-gpt")) {
        printf("\nagainst the original Rockmate on this graph (its peak share as our budget):\n\n");
        printf("| budget | original Rockmate | rockmate | rotor |\n|---|---|---|---|\n");
        for (size_t i = 0; i < sizeof peer / sizeof peer[0]; i++) {
            char c1[32] = "", c2[32] = "";
            double dummy = 0;
            if (pl[3]) overhead_cell(pl[3], at_pct(gs.baseline_peak, peer[i][0]), c1, sizeof c1, &dummy);
            if (pl[2]) overhead_cell(pl[2], at_pct(gs.baseline_peak, peer[i][0]), c2, sizeof c2, &dummy);
            printf("| %.1f%% | %.2f%% | %s | %s |\n", peer[i][0], peer[i][1], c1, c2);
        }
    }
    for (int a = 0; a < N_ALGOS; a++) rkm_planner_destroy(pl[a]);
    rkm_graph_destroy(g);
}

int main(int argc, char **argv)
{
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx) != RKM_OK) return 1;
    setvbuf(stdout, NULL, _IOLBF, 0); /* rows as they come: checkmate is slow */
    printf("# bench_plan (rockmate %s)\n", rkm_version());
    if (argc > 1)
        for (int i = 1; i < argc; i++) bench_graph(ctx, argv[i]);
    else
        for (size_t i = 0; i < sizeof default_graphs / sizeof default_graphs[0]; i++) bench_graph(ctx, default_graphs[i]);
    rkm_context_destroy(ctx);
    return 0;
}
