/* The planner's time limit (rkm_solve_desc.time_limit), through the public
 * API: a limit that runs out gives a plan flagged cut or RKM_ERROR_TIMEOUT
 * with a message, and leaks nothing; a plan it does not cut is the plan of
 * an unlimited planner. No timing is measured or asserted: a limit of
 * 1e-9 s has passed before the planner's first check, and one of 1e9 s
 * never does. */
#include "../src/internal.h"
#include "test.h"

static rkm_context *new_ctx(void)
{
    *test_live_bytes() = 0;
    return test_new_ctx_alloc(test_count_alloc);
}

#define TINY 1e-9
#define HUGE_LIMIT 1e9

/* pct % of g's baseline peak, as plan_under plans for it. */
static uint64_t budget_of(const rkm_graph *g, int pct)
{
    rkm_graph_stats gs;
    memset(&gs, 0, sizeof gs);
    CHECK(rkm_graph_stats_get(g, &gs) == RKM_OK);
    return gs.baseline_peak / 100 * (uint64_t)pct;
}

/* The plan of `algo` for pct % of g's baseline peak under time_limit `limit`
 * (*out NULL on an error, its code in *r); *pst the planner's stats after. */
static void plan_under(const rkm_graph *g, rkm_algo algo, double limit, int pct, rkm_result *r, rkm_plan **out,
                       rkm_planner_stats *pst)
{
    rkm_solve_desc d;
    rkm_planner *pl = NULL;
    memset(&d, 0, sizeof d);
    memset(pst, 0, sizeof *pst);
    d.algo = algo;
    d.time_limit = limit;
    *out = NULL;
    *r = rkm_planner_create(g, &d, &pl);
    if (*r == RKM_OK) *r = rkm_planner_solve(pl, budget_of(g, pct), out);
    if (pl) CHECK(rkm_planner_stats_get(pl, pst) == RKM_OK);
    rkm_planner_destroy(pl);
}

/* Do two plans have the same steps? */
static int same_steps(const rkm_plan *a, const rkm_plan *b)
{
    size_t n = rkm_plan_num_steps(a);
    const rkm_step *x = rkm_plan_steps(a), *y = rkm_plan_steps(b);
    if (n != rkm_plan_num_steps(b)) return 0;
    for (size_t i = 0; i < n; i++)
        if (x[i].kind != y[i].kind || x[i].index != y[i].index || x[i].save != y[i].save) return 0;
    return 1;
}

static const rkm_algo algos[] = {RKM_ALGO_ROCKMATE, RKM_ALGO_DTR, RKM_ALGO_ROTOR};

/* A limit that has run out before the first check: every call returns, with
 * a plan flagged cut, or one not flagged that is the unlimited planner's
 * (nothing in that solve looked at the clock: rotor's), or
 * RKM_ERROR_TIMEOUT naming the limit; a rockmate planner's creation is cut
 * (its block ILP left out) and says so. */
TEST(tiny_limit_cuts_or_times_out)
{
    static const char *const names[] = {"gpt2-tiny", "mlp16", "random30", "peer-gpt", "unet-d2"};
    static const int pcts[] = {70, 40};
    rkm_context *ctx = new_ctx();
    int cut = 0, timeouts = 0;
    for (size_t k = 0; k < N_OF(names); k++) {
        rkm_graph *g = test_load_graph(ctx, names[k]);
        for (size_t a = 0; a < N_OF(algos) && g; a++)
            for (size_t i = 0; i < N_OF(pcts); i++) {
                rkm_result r, r_ref;
                rkm_plan *p, *ref;
                rkm_planner_stats st, st_ref;
                plan_under(g, algos[a], TINY, pcts[i], &r, &p, &st);
                rkm_graph_stats gs;
                CHECK(rkm_graph_stats_get(g, &gs) == RKM_OK);
                /* under the lower bound no plan exists, whatever the time: refused at once */
                if (budget_of(g, pcts[i]) < gs.lower_bound) {
                    CHECK(r == RKM_ERROR_BUDGET && p == NULL);
                    continue;
                }
                CHECK(r == RKM_OK || r == RKM_ERROR_TIMEOUT);
                if (algos[a] == RKM_ALGO_ROCKMATE) CHECK(st.cut >= 1); /* its creation was cut */
#ifndef RKM_OMIT_SOLVER
                if (algos[a] == RKM_ALGO_ROCKMATE) CHECK(st.ilp_skipped > 0); /* and so its block ILP solves */
#endif
                if (r == RKM_ERROR_TIMEOUT) {
                    timeouts++;
                    CHECK(p == NULL && strstr(rkm_context_errmsg(ctx), "time limit") != NULL);
                    CHECK(st.cut >= 1);
                    continue;
                }
                rkm_plan_stats ps;
                CHECK(p && rkm_plan_stats_get(p, &ps) == RKM_OK);
                if (!p) continue;
                CHECK(ps.peak <= budget_of(g, pcts[i]) && ps.arena_bytes <= budget_of(g, pcts[i]));
                cut += ps.cut;
                if (!ps.cut) { /* then the limit changed nothing */
                    plan_under(g, algos[a], HUGE_LIMIT, pcts[i], &r_ref, &ref, &st_ref);
                    CHECK(r_ref == RKM_OK && ref && same_steps(p, ref));
                    rkm_plan_destroy(ref);
                } else
                    CHECK(st.cut >= 1);
                rkm_plan_destroy(p);
            }
        rkm_graph_destroy(g);
    }
    CHECK(cut > 0); /* the cut plans are there */
    if (getenv("RKM_TEST_TIMES")) fprintf(stderr, "  %d cut plans, %d timeouts\n", cut, timeouts);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* A limit that never runs out cuts nothing, and gives the plans of the
 * default limit (60 s) wherever that did not cut them either. */
TEST(ample_limit_changes_nothing)
{
    static const char *const names[] = {"gpt2-tiny", "mlp16"};
    static const int pcts[] = {70, 40};
    rkm_context *ctx = new_ctx();
    for (size_t k = 0; k < N_OF(names); k++) {
        rkm_graph *g = test_load_graph(ctx, names[k]);
        for (size_t a = 0; a < N_OF(algos) && g; a++)
            for (size_t i = 0; i < N_OF(pcts); i++) {
                rkm_result r, r_def;
                rkm_plan *p, *q;
                rkm_planner_stats st, st_def;
                plan_under(g, algos[a], HUGE_LIMIT, pcts[i], &r, &p, &st);
                CHECK(r == RKM_OK && p && st.cut == 0);
                plan_under(g, algos[a], 0, pcts[i], &r_def, &q, &st_def);
                CHECK(r_def == RKM_OK && q);
                rkm_plan_stats ps, qs;
                if (p && q && rkm_plan_stats_get(p, &ps) == RKM_OK && rkm_plan_stats_get(q, &qs) == RKM_OK) {
                    CHECK(ps.cut == 0);
                    if (!qs.cut) CHECK(same_steps(p, q) && ps.time == qs.time);
                }
                rkm_plan_destroy(p);
                rkm_plan_destroy(q);
            }
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* The smallest budget under a limit that ran out: a budget the planner
 * meets (a solve there gives a plan, flagged cut unless it is the
 * baseline, or times out), counted among the cut calls; checkmate's
 * whole-graph ILP stops at the limit too. */
TEST(tiny_limit_min_budget_and_checkmate)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = test_load_graph(ctx, "gpt2-tiny");
    static const rkm_algo some[] = {RKM_ALGO_ROCKMATE, RKM_ALGO_DTR, RKM_ALGO_CHECKMATE};
    for (size_t a = 0; a < N_OF(some) && g; a++) {
        rkm_solve_desc d;
        rkm_planner *pl = NULL;
        memset(&d, 0, sizeof d);
        d.algo = some[a];
        d.time_limit = TINY;
        rkm_result r = rkm_planner_create(g, &d, &pl);
#ifdef RKM_OMIT_SOLVER
        if (some[a] == RKM_ALGO_CHECKMATE) { /* the one algorithm that needs lp_solve */
            CHECK(r == RKM_ERROR_UNSUPPORTED && !pl);
            continue;
        }
#endif
        CHECK(r == RKM_OK && pl);
        if (!pl) continue;
        rkm_planner_stats before, after;
        uint64_t min = 0;
        CHECK(rkm_planner_stats_get(pl, &before) == RKM_OK);
        CHECK(rkm_planner_min_budget(pl, &min) == RKM_OK && min > 0);
        CHECK(rkm_planner_stats_get(pl, &after) == RKM_OK && after.cut == before.cut + 1);
        rkm_plan *p = NULL;
        r = rkm_planner_solve(pl, min, &p);
        CHECK(r == RKM_OK || r == RKM_ERROR_TIMEOUT);
        rkm_plan_stats ps;
        /* not cut: the baseline, which nothing beats (min is its arena when
         * the search for it stopped at once) */
        if (r == RKM_OK)
            CHECK(p && rkm_plan_stats_get(p, &ps) == RKM_OK && ps.arena_bytes <= min &&
                  (ps.cut || (ps.recomputes == 0 && ps.time == ps.baseline_time)));
        else CHECK(p == NULL && strstr(rkm_context_errmsg(ctx), "time limit") != NULL);
        rkm_plan_destroy(p);
        p = NULL;
        r = rkm_planner_solve(pl, budget_of(g, 70), &p); /* below the baseline: a search, cut */
        CHECK(r == RKM_OK || r == RKM_ERROR_TIMEOUT);
        if (r == RKM_OK) CHECK(p && rkm_plan_stats_get(p, &ps) == RKM_OK && ps.cut == 1);
        else CHECK(p == NULL && strstr(rkm_context_errmsg(ctx), "time limit") != NULL);
        rkm_plan_destroy(p);
        rkm_planner_destroy(pl);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

int main(void)
{
    RUN(tiny_limit_cuts_or_times_out);
    RUN(ample_limit_changes_nothing);
    RUN(tiny_limit_min_budget_and_checkmate);
    TEST_END();
}
