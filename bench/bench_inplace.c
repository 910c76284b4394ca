/* bench_inplace: what in-place kernels buy, side by side.
 *
 *   build/bench/bench_inplace
 *
 * Each bundled graph as it is, and with every op that can be declared in
 * place declared so (tests/test.h, test_edit_inplace: `inplace` where the
 * first input and output have one size and the input is not an `input`,
 * `grad_inplace` where both also have a gradient; as if every such kernel
 * were elementwise). Per graph: the baseline peak, the lower bound and
 * rockmate's smallest budget, plain and in place; then, at 90 .. 20 % of
 * the plain graph's baseline peak (the same bytes for both), rockmate's
 * overhead plain and in place ('-': no plan). Ratios are in place / plain. */
#define TEST_HELPERS_ONLY
#include "../tests/test.h"

#include <math.h>

static const char *const graphs[] = {"gpt2-tiny", "gpt2-124M-b4-t64", "mlp16", "resnet18-like-b32", "random30"};
static const int pcts[] = {90, 80, 70, 60, 50, 40, 30, 25, 20};
#define N_PCTS (sizeof pcts / sizeof pcts[0])

/* Rockmate's floor and its overheads (%, NAN: no plan) at the budgets. */
static int plan_all(rkm_graph *g, const uint64_t *budgets, uint64_t *floor, double *over)
{
    rkm_solve_desc d = {.algo = RKM_ALGO_DEFAULT};
    rkm_planner *pl = NULL;
    if (rkm_planner_create(g, &d, &pl) != RKM_OK || rkm_planner_min_budget(pl, floor) != RKM_OK) {
        rkm_planner_destroy(pl);
        return 0;
    }
    for (size_t i = 0; i < N_PCTS; i++) {
        rkm_plan *p = NULL;
        rkm_plan_stats st;
        over[i] = NAN;
        if (rkm_planner_solve(pl, budgets[i], &p) == RKM_OK && rkm_plan_stats_get(p, &st) == RKM_OK)
            over[i] = 100.0 * st.overhead;
        rkm_plan_destroy(p);
    }
    rkm_planner_destroy(pl);
    return 1;
}

/* One row: plain, in place and their ratio, '-' where a figure is missing. */
static void row(const char *what, double a, double b, int decimals)
{
    char x[3][32];
    double v[3] = {a, b, a > 0 ? b / a : NAN};
    for (int k = 0; k < 3; k++)
        if (isnan(v[k])) snprintf(x[k], sizeof x[k], "-");
        else snprintf(x[k], sizeof x[k], "%.*f", k == 2 ? 4 : decimals, v[k]);
    printf("  %-26s %14s %14s %10s\n", what, x[0], x[1], x[2]);
}

static int bench_graph(rkm_context *ctx, const char *name)
{
    rkm_graph *g[2] = {test_load_graph(ctx, name), test_load_inplace_graph(ctx, name)};
    rkm_graph_stats st[2];
    uint64_t budgets[N_PCTS], floor[2];
    double over[2][N_PCTS];
    int ok = g[0] && g[1] && rkm_graph_stats_get(g[0], &st[0]) == RKM_OK && rkm_graph_stats_get(g[1], &st[1]) == RKM_OK;
    for (size_t i = 0; ok && i < N_PCTS; i++) budgets[i] = st[0].baseline_peak / 100 * (uint64_t)pcts[i];
    for (int k = 0; ok && k < 2; k++) ok = plan_all(g[k], budgets, &floor[k], over[k]);
    if (ok) {
        printf("\n%-28s %14s %14s %10s\n", name, "plain", "in place", "ratio");
        row("baseline peak (bytes)", (double)st[0].baseline_peak, (double)st[1].baseline_peak, 0);
        row("lower bound (bytes)", (double)st[0].lower_bound, (double)st[1].lower_bound, 0);
        row("rockmate's floor (bytes)", (double)floor[0], (double)floor[1], 0);
        for (size_t i = 0; i < N_PCTS; i++) {
            char what[64];
            snprintf(what, sizeof what, "overhead at %d%% (%%)", pcts[i]);
            row(what, over[0][i], over[1][i], 2);
        }
    } else {
        fprintf(stderr, "bench_inplace: %s: %s\n", name, rkm_context_errmsg(ctx));
    }
    rkm_graph_destroy(g[0]);
    rkm_graph_destroy(g[1]);
    return ok;
}

int main(void)
{
    rkm_context *ctx = test_new_ctx();
    int ok = 1;
    printf("bench_inplace: rockmate (the build's default algorithm) on each graph, plain and with every op\n"
           "that can run in place declared so; budgets in %% of the plain baseline peak\n");
    for (size_t k = 0; k < sizeof graphs / sizeof graphs[0]; k++) ok &= bench_graph(ctx, graphs[k]);
    rkm_context_destroy(ctx);
    return ok ? 0 : 1;
}
