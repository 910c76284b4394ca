/* test_portfolio: rockmate against rotor, sqrt and DTR on every bundled
 * graph. Apart from test_search, whose other tests take as long, so that
 * each program runs well within the runner's limit under the sanitizers. */
#include "../src/internal.h"
#include "test.h"

static const char *const graphs[] = {TEST_BUNDLED_GRAPHS};
#define N_GRAPHS (sizeof graphs / sizeof graphs[0])

/* rockmate is never worse than rotor, sqrt or dtr at the same budget (20,
 * 60 and 100 %, and rotor's and DTR's smallest), in either build (without
 * lp_solve, with no ILP options): its candidates include their plans
 * (rotor's options are among its own), and it plans wherever they do. The
 * smallest budgets are where a missing candidate shows (the others plan,
 * rockmate must too); 20, 60 and 100 % span the rest (40 and 80 % were
 * solves between them, of the same candidates: 13 % of the run). */
TEST(rockmate_never_worse_than_the_others)
{
    static const rkm_algo others[] = {RKM_ALGO_ROTOR, RKM_ALGO_SQRT, RKM_ALGO_DTR};
    rkm_context *ctx;
    CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
    for (size_t k = 0; k < N_GRAPHS; k++) {
        rkm_graph *g = test_load_graph(ctx, graphs[k]);
        CHECK(g != NULL);
        if (!g) continue;
        rkm_graph_stats gs;
        CHECK(rkm_graph_stats_get(g, &gs) == RKM_OK);
        rkm_solve_desc dm = {0};
        dm.algo = RKM_ALGO_ROCKMATE;
        dm.time_limit = 1000; /* the work meters end every call: no cut on a slow or busy machine */
        rkm_planner *pm, *po[3];
        CHECK(rkm_planner_create(g, &dm, &pm) == RKM_OK);
        for (int a = 0; a < 3; a++) {
            rkm_solve_desc d = {0};
            d.algo = others[a];
            d.time_limit = 1000;
            CHECK(rkm_planner_create(g, &d, &po[a]) == RKM_OK);
        }
        /* 20, 60 and 100 %, then rotor's and DTR's smallest budgets */
        uint64_t minm = 0, at[5];
        CHECK(rkm_planner_min_budget(pm, &minm) == RKM_OK);
        for (int i = 0; i < 3; i++) at[i] = gs.baseline_peak / 100 * (uint64_t)(20 + 40 * i);
        for (int a = 0; a < 3; a++) {
            uint64_t mino = 0;
            CHECK(rkm_planner_min_budget(po[a], &mino) == RKM_OK);
            if (others[a] != RKM_ALGO_SQRT) CHECK(minm <= mino); /* sqrt's may exceed the baseline peak */
            if (others[a] != RKM_ALGO_SQRT) at[a ? 4 : 3] = mino;
        }
        for (int i = 0; i < 5; i++) {
            uint64_t budget = at[i];
            rkm_plan *b = NULL;
            rkm_result rb = rkm_planner_solve(pm, budget, &b);
            for (int a = 0; a < 3; a++) {
                rkm_plan *o = NULL;
                if (rkm_planner_solve(po[a], budget, &o) == RKM_OK) {
                    CHECK(rb == RKM_OK);
                    if (rb == RKM_OK && b->stats.time > o->stats.time)
                        fprintf(stderr, "%s at %llu bytes: rockmate %g s, %s %g s\n", graphs[k],
                                (unsigned long long)budget, b->stats.time, rkm_algo_name(others[a]), o->stats.time);
                    if (rb == RKM_OK) CHECK(b->stats.time <= o->stats.time);
                }
                rkm_plan_destroy(o);
            }
            rkm_plan_destroy(b);
        }
        for (int a = 0; a < 3; a++) rkm_planner_destroy(po[a]);
        rkm_planner_destroy(pm);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(rockmate_never_worse_than_the_others);
    TEST_END();
}
