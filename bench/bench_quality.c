/* bench_quality: rockmate's plans against the best plans known, side by side.
 *
 *   build/bench/bench_quality [--checkmate S] [--tsv]
 *
 * For every bundled graph at 90, 80, ..., 20 % of the baseline peak and at
 * the budget of every reference plan of that graph (bench/reference/): the
 * overhead (time / baseline time - 1, in %) of rockmate, rotor, sqrt and dtr
 * with default settings, beside the best known: the reference plan replayed
 * by our simulator (an exact MILP's plan, or the original Rockmate's), and
 * `checkmate --time-limit 30` as measured at c03973e
 * (bench/reference/checkmate-vs-rockmate.tsv; the ILP has not changed
 * since). With --checkmate S it also runs our checkmate with S seconds of
 * planning. `bound` is rkm_graph_time_bound's overhead, which no plan at
 * all can beat (where rockmate meets it, its plan is optimal over every
 * plan). Each row ends with rockmate / best (1.00: as good) and
 * rockmate's planning time (create + solve, median of 3 runs). The last
 * lines count the rows where rockmate has no plan although a reference
 * does, and where it is more than 1 % above the best. --tsv prints instead
 * one tab-separated line per row and algorithm (graph, budget label, algo,
 * budget in bytes, overhead in %, planning seconds; '-': none or not
 * measured: only rockmate's planning is timed) for bench/vs.sh. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "../rockmate.h"
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REF "bench/reference/"

static const char *const graphs[] = {"gpt2-tiny", "gpt2-124M-b4-t64", "gpt2-xl-b4-t1024", "mlp16",
                                     "multi-output", "peer-gpt", "random30", "resnet18-like-b32"};
static const int pcts[] = {90, 80, 70, 60, 50, 40, 30, 25, 20};

/* The reference plans of a graph: files named GRAPH__*.rkp, and peer-gpt's. */
static const char *const ref_plans[][2] = {
    {"gpt2-tiny", REF "plans/gpt2-tiny__30pct.rkp"}, {"gpt2-tiny", REF "plans/gpt2-tiny__40pct.rkp"},
    {"gpt2-tiny", REF "plans/gpt2-tiny__60pct.rkp"}, {"gpt2-tiny", REF "plans/gpt2-tiny__80pct.rkp"},
    {"gpt2-tiny", REF "plans/gpt2-tiny__atmin.rkp"}, {"mlp16", REF "plans/mlp16__40pct.rkp"},
    {"mlp16", REF "plans/mlp16__60pct.rkp"},         {"mlp16", REF "plans/mlp16__80pct.rkp"},
    {"mlp16", REF "plans/mlp16__atmin.rkp"},         {"peer-gpt", REF "peer-gpt/peer-0.800.rkp"},
    {"peer-gpt", REF "peer-gpt/peer-0.600.rkp"},     {"peer-gpt", REF "peer-gpt/peer-0.500.rkp"},
    {"peer-gpt", REF "peer-gpt/peer-0.400.rkp"},     {"peer-gpt", REF "peer-gpt/peer-0.300.rkp"}};
#define N_REFS (sizeof ref_plans / sizeof ref_plans[0])

static const rkm_algo algos[] = {RKM_ALGO_ROCKMATE, RKM_ALGO_ROTOR, RKM_ALGO_SQRT, RKM_ALGO_DTR};
#define N_ALGOS 4

/* One row: a budget, and the overheads in % (NAN: no plan). */
typedef struct row {
    uint64_t budget;
    char label[48];
    double algo[N_ALGOS];
    double ref;       /* the reference plan at this budget (NAN: none) */
    double cm30;      /* checkmate --time-limit 30 at c03973e (NAN: none or not measured) */
    double cm_now;    /* our checkmate with --checkmate S (NAN: not run or none) */
    double seconds;   /* rockmate: create + solve, median of 3 */
    double bound;     /* rkm_graph_time_bound: no plan at all beats it (NAN: below the lower bound) */
} row;

/* Overhead in % of the plan of `algo` at `budget`; NAN when there is none.
 * *seconds: create + solve. */
static double plan_overhead(const rkm_graph *g, rkm_algo algo, double limit, uint64_t budget, double *seconds)
{
    rkm_solve_desc d;
    memset(&d, 0, sizeof d);
    d.algo = algo;
    d.time_limit = limit;
    rkm_plan *p = NULL;
    double t0 = bench_now();
    rkm_result r = rkm_plan_solve(g, &d, budget, &p);
    if (seconds) *seconds = bench_now() - t0;
    if (r) return NAN;
    rkm_plan_stats st;
    rkm_plan_stats_get(p, &st);
    rkm_plan_destroy(p);
    return 100 * st.overhead;
}

static void fill_row(const rkm_graph *g, row *w, double cm_limit)
{
    for (int a = 0; a < N_ALGOS; a++) w->algo[a] = plan_overhead(g, algos[a], 0, w->budget, NULL);
    double t[3];
    for (int k = 0; k < 3; k++) plan_overhead(g, RKM_ALGO_ROCKMATE, 0, w->budget, &t[k]);
    w->seconds = bench_median3(t);
    w->cm_now = cm_limit > 0 ? plan_overhead(g, RKM_ALGO_CHECKMATE, cm_limit, w->budget, NULL) : NAN;
    rkm_graph_stats gs;
    double extra;
    w->bound = rkm_graph_stats_get(g, &gs) == RKM_OK && rkm_graph_time_bound(g, w->budget, &extra) == RKM_OK
                   ? 100 * extra / gs.baseline_time
                   : NAN;
}

static void cell(double v)
{
    if (isnan(v)) printf(" %9s", "-");
    else printf(" %9.2f", v);
}

/* The best of the references (lower is better); NAN when none has a plan. */
static double best_known(const row *w)
{
    double b = NAN;
    const double v[3] = {w->ref, w->cm30, w->cm_now};
    for (int k = 0; k < 3; k++)
        if (!isnan(v[k]) && (isnan(b) || v[k] < b)) b = v[k];
    return b;
}

static int missing, worse, rows, at_bound;
static int tsv; /* --tsv: machine-readable lines, no table */
static const char *const algo_names[N_ALGOS] = {"rockmate", "rotor", "sqrt", "dtr"};

static void print_tsv(const char *graph, const row *w)
{
    for (int a = 0; a < N_ALGOS; a++) {
        printf("%s\t%s\t%s\t%llu\t", graph, w->label, algo_names[a], (unsigned long long)w->budget);
        if (isnan(w->algo[a])) printf("-");
        else printf("%.4f", w->algo[a]);
        if (a == 0) printf("\t%.4f\n", w->seconds);
        else printf("\t-\n");
    }
}

static void print_row(const char *graph, const row *w)
{
    if (tsv) {
        print_tsv(graph, w);
        return;
    }
    printf("%-18s %-14s", graph, w->label);
    for (int a = 0; a < N_ALGOS; a++) cell(w->algo[a]);
    cell(w->ref);
    cell(w->cm30);
    cell(w->cm_now);
    cell(w->bound);
    double best = best_known(w), ours = w->algo[0];
    /* overheads compare as times: (1 + ours) / (1 + best) */
    if (isnan(best) || isnan(ours)) printf(" %7s", "-");
    else printf(" %7.4f", (100 + ours) / (100 + best));
    printf(" %8.3f\n", w->seconds);
    rows++;
    if (!isnan(best) && isnan(ours)) missing++;
    if (!isnan(best) && !isnan(ours) && (100 + ours) > 1.01 * (100 + best)) worse++;
    if (!isnan(ours) && !isnan(w->bound) && ours <= w->bound + 1e-9) at_bound++;
}

static void bench_graph(rkm_context *ctx, const char *name, double cm_limit)
{
    rkm_graph *g = bench_load(ctx, name);
    rkm_graph_stats gs;
    if (!g || rkm_graph_stats_get(g, &gs)) {
        rkm_graph_destroy(g);
        return;
    }
    for (size_t i = 0; i < sizeof pcts / sizeof pcts[0]; i++) {
        row w;
        memset(&w, 0, sizeof w);
        w.budget = (uint64_t)((double)gs.baseline_peak * pcts[i] / 100.0);
        snprintf(w.label, sizeof w.label, "%d%%", pcts[i]);
        w.ref = NAN;
        w.cm30 = bench_tsv(REF "checkmate-vs-rockmate.tsv", name, pcts[i]);
        fill_row(g, &w, cm_limit);
        print_row(name, &w);
    }
    for (size_t k = 0; k < N_REFS; k++) {
        if (strcmp(ref_plans[k][0], name) != 0) continue;
        rkm_plan *p = NULL;
        rkm_plan_stats st;
        if (rkm_plan_read_file(g, ref_plans[k][1], NULL, &p) || rkm_plan_stats_get(p, &st)) {
            fprintf(stderr, "%s: %s\n", ref_plans[k][1], rkm_context_errmsg(ctx));
            continue;
        }
        row w;
        memset(&w, 0, sizeof w);
        w.budget = st.peak;
        snprintf(w.label, sizeof w.label, "%.2f%% ref", 100.0 * (double)st.peak / (double)gs.baseline_peak);
        w.ref = 100 * st.overhead;
        w.cm30 = NAN;
        rkm_plan_destroy(p);
        fill_row(g, &w, cm_limit);
        print_row(name, &w);
    }
    rkm_graph_destroy(g);
}

int main(int argc, char **argv)
{
    double cm_limit = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--checkmate") == 0 && i + 1 < argc) cm_limit = atof(argv[++i]);
        else if (strcmp(argv[i], "--tsv") == 0) tsv = 1;
        else {
            fprintf(stderr, "usage: bench_quality [--checkmate SECONDS] [--tsv]\n");
            return 2;
        }
    }
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx)) return 1;
    if (tsv) {
        printf("graph\tbudget\talgo\tbudget_bytes\toverhead\tplan_s\n");
        for (size_t k = 0; k < sizeof graphs / sizeof graphs[0]; k++) bench_graph(ctx, graphs[k], cm_limit);
        rkm_context_destroy(ctx);
        return 0;
    }
    printf("overhead in %% of the baseline time; budget in %% of the baseline peak; '-': no plan\n");
    printf("%-18s %-14s %9s %9s %9s %9s %9s %9s %9s %9s %7s %8s\n", "graph", "budget", "rockmate", "rotor", "sqrt",
           "dtr", "reference", "cm30", "cm-now", "bound", "ours/best", "plan s");
    for (size_t k = 0; k < sizeof graphs / sizeof graphs[0]; k++) bench_graph(ctx, graphs[k], cm_limit);
    printf("%d rows; rockmate has no plan where a reference does: %d; more than 1 %% slower than the best: %d\n", rows,
           missing, worse);
    printf("rows where rockmate meets the bound (optimal over every plan): %d\n", at_bound);
    rkm_context_destroy(ctx);
    return 0;
}
