/* fuzz_planner: the planners on fuzzed graphs. Every graph that reads (of
 * at most 40 ops, to keep each run short) is planned by rotor, sqrt and dtr
 * at four budgets between its lower bound and its baseline peak; every plan
 * handed out fits its budget (its arena, so its peak too), passes the plan checks and is no faster
 * than rkm_graph_time_bound allows, and a refusal is a budget error naming
 * the smallest budget. */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const rkm_algo algos[] = {RKM_ALGO_ROTOR, RKM_ALGO_SQRT, RKM_ALGO_DTR};
    rkm_context *ctx = fuzz_ctx();
    rkm_graph *g = NULL;
    rkm_graph_stats gs;
    if (rkm_graph_read_string(ctx, (const char *)data, size, "fuzz.rkg", &g) == RKM_OK && rkm_graph_num_ops(g) <= 40 &&
        rkm_graph_stats_get(g, &gs) == RKM_OK) {
        for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
            rkm_solve_desc d = {0};
            d.algo = algos[a];
            d.slots = 100;
            rkm_planner *pl = NULL;
            rkm_result r = rkm_planner_create(g, &d, &pl);
            FUZZ_CHECK(r == RKM_OK || r == RKM_ERROR_NOMEM);
            for (int k = 0; pl && k <= 3; k++) {
                uint64_t span = gs.baseline_peak - gs.lower_bound;
                uint64_t budget = gs.lower_bound + span / 3 * (uint64_t)k;
                rkm_plan *p = NULL;
                r = rkm_planner_solve(pl, budget, &p);
                FUZZ_CHECK(r == RKM_OK || r == RKM_ERROR_BUDGET);
                if (r == RKM_ERROR_BUDGET) FUZZ_CHECK(strstr(rkm_context_errmsg(ctx), "smallest") != NULL);
                if (p) {
                    rkm_plan_stats st;
                    FUZZ_CHECK(rkm_plan_stats_get(p, &st) == RKM_OK && st.peak <= budget);
                    FUZZ_CHECK(st.aligned_peak <= st.arena_bytes && st.arena_bytes <= budget);
                    fuzz_check_plan(p);
                    double extra = -1; /* no plan beats the time bound */
                    FUZZ_CHECK(rkm_graph_time_bound(g, budget, &extra) == RKM_OK);
                    FUZZ_CHECK(st.time - gs.baseline_time >= extra - 1e-9 * (gs.baseline_time + extra));
                }
                rkm_plan_destroy(p);
            }
            rkm_planner_destroy(pl);
        }
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    return 0;
}
