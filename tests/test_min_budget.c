/* test_min_budget: every algorithm plans at its own smallest budget.
 *
 * rockmate.h promises that rkm_planner_solve meets the budget
 * rkm_planner_min_budget reports, and not one byte under it (the descent
 * stops there, or after 16 plans, which these small graphs do not reach);
 * and `rockmate info` then `rockmate plan --budget <that>B`, two processes,
 * are a fresh planner at that budget: it must meet it too. Issue 20's
 * graph (tests/graphs/inplace-split.rkg: an in-place split whose input is
 * read again later) had checkmate report a smallest budget its own solve
 * refused. */
#include "test.h"

static const rkm_algo algos[] = {RKM_ALGO_ROCKMATE, RKM_ALGO_ROTOR, RKM_ALGO_SQRT,
                                 RKM_ALGO_CHECKMATE, RKM_ALGO_DTR,  RKM_ALGO_NONE};

/* The budget a BUDGET error's message names as the smallest; 0 if none. */
static uint64_t named_smallest(const rkm_context *ctx)
{
    const char *s = strstr(rkm_context_errmsg(ctx), "smallest it can meet is ");
    return s ? strtoull(s + strlen("smallest it can meet is "), NULL, 10) : 0;
}

/* Algorithm `algo` on g: its smallest budget is met by the same planner
 * and by a fresh one, and the budget one byte under it is refused with a
 * message naming it. */
static void plans_at_its_min(rkm_context *ctx, const rkm_graph *g, const char *name, rkm_algo algo)
{
    rkm_solve_desc d = {0};
    d.algo = algo;
    rkm_planner *pl = NULL;
    rkm_result r = rkm_planner_create(g, &d, &pl);
    if (r == RKM_ERROR_UNSUPPORTED) return; /* not in this build (RKM_OMIT_SOLVER) */
    CHECK(r == RKM_OK);
    uint64_t min = 0;
    CHECK(pl && rkm_planner_min_budget(pl, &min) == RKM_OK && min > 0);
    rkm_plan *p = NULL, *fresh = NULL, *under = NULL;
    rkm_plan_stats st;
    r = pl ? rkm_planner_solve(pl, min, &p) : RKM_ERROR_STATE;
    if (r != RKM_OK)
        fprintf(stderr, "%s: %s reports a smallest budget of %llu bytes, its planner refuses it: %s\n", name,
                rkm_algo_name(algo), (unsigned long long)min, rkm_context_errmsg(ctx));
    CHECK(r == RKM_OK && p);
    if (p) CHECK(rkm_plan_stats_get(p, &st) == RKM_OK && st.arena_bytes <= min && st.peak <= min);
    r = rkm_plan_solve(g, &d, min, &fresh); /* `info`, then `plan --budget <min>B` */
    if (r != RKM_OK)
        fprintf(stderr, "%s: %s reports a smallest budget of %llu bytes, a fresh planner refuses it: %s\n", name,
                rkm_algo_name(algo), (unsigned long long)min, rkm_context_errmsg(ctx));
    CHECK(r == RKM_OK && fresh);
    if (fresh) CHECK(rkm_plan_stats_get(fresh, &st) == RKM_OK && st.arena_bytes <= min);
    r = pl ? rkm_planner_solve(pl, min - 1, &under) : RKM_ERROR_STATE;
    if (r != RKM_ERROR_BUDGET)
        fprintf(stderr, "%s: %s plans one byte under its smallest budget %llu: result %d\n", name,
                rkm_algo_name(algo), (unsigned long long)min, (int)r);
    CHECK(r == RKM_ERROR_BUDGET && under == NULL);
    if (r == RKM_ERROR_BUDGET) CHECK_EQ_U64(named_smallest(ctx), min);
    rkm_plan_destroy(under);
    rkm_plan_destroy(fresh);
    rkm_plan_destroy(p);
    rkm_planner_destroy(pl);
}

static void every_algo_at_its_min(const char *graph)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, graph);
    for (size_t a = 0; g && a < N_OF(algos); a++) plans_at_its_min(ctx, g, graph, algos[a]);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Issue 20's graph. */
TEST(inplace_split_plans_at_each_min) { every_algo_at_its_min("inplace-split"); }

TEST(multi_output_plans_at_each_min) { every_algo_at_its_min("multi-output"); }

/* gpt2-tiny with every op that can run in place declared so. */
TEST(inplace_gpt2_tiny_plans_at_each_min)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_inplace_graph(ctx, "gpt2-tiny");
    for (size_t a = 0; g && a < N_OF(algos); a++)
        if (algos[a] != RKM_ALGO_CHECKMATE) plans_at_its_min(ctx, g, "gpt2-tiny in place", algos[a]);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Under the graph's lower bound (one step's own need) no plan of any
 * algorithm exists: the solve refuses at once, with no search (not one
 * allocation) and no search for the smallest budget, naming the bound and
 * its step; once rkm_planner_min_budget has run, it names that budget too
 * (and still says BUDGET, never TIMEOUT). */
TEST(under_the_lower_bound_refused_at_once)
{
    rkm_context *ctx = test_new_ctx_alloc(test_count_alloc);
    rkm_graph *g = test_load_graph(ctx, "multi-output"); /* small: checkmate's smallest budget is never cut */
    rkm_graph_stats gs;
    CHECK(g && rkm_graph_stats_get(g, &gs) == RKM_OK);
    char want[96];
    snprintf(want, sizeof want, "no plan of any algorithm peaks under %llu bytes", (unsigned long long)gs.lower_bound);
    for (size_t a = 0; g && a < N_OF(algos); a++) {
        rkm_solve_desc d = {0};
        d.algo = algos[a];
        rkm_planner *pl = NULL;
        rkm_result r = rkm_planner_create(g, &d, &pl);
        if (r == RKM_ERROR_UNSUPPORTED) continue;
        CHECK(r == RKM_OK);
        rkm_plan *p = NULL;
        uint64_t min = 0;
        long long before = *test_alloc_calls();
        CHECK(pl && rkm_planner_solve(pl, gs.lower_bound - 1, &p) == RKM_ERROR_BUDGET && !p);
        CHECK(*test_alloc_calls() == before);
        const char *msg = rkm_context_errmsg(ctx);
        if (!strstr(msg, want) || !strstr(msg, "of op '")) fprintf(stderr, "%s: %s\n", rkm_algo_name(algos[a]), msg);
        CHECK(strstr(msg, want) && strstr(msg, "of op '"));
        CHECK(pl && rkm_planner_min_budget(pl, &min) == RKM_OK && min >= gs.lower_bound);
        CHECK(pl && rkm_planner_solve(pl, gs.lower_bound - 1, &p) == RKM_ERROR_BUDGET && !p);
        CHECK_EQ_U64(named_smallest(ctx), min);
        rkm_planner_destroy(pl);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(inplace_split_plans_at_each_min);
    RUN(multi_output_plans_at_each_min);
    RUN(inplace_gpt2_tiny_plans_at_each_min);
    RUN(under_the_lower_bound_refused_at_once);
    TEST_END();
}
