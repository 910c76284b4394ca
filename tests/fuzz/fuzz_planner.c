/* fuzz_planner: the planners on fuzzed graphs. Every graph that reads (of
 * at most 40 ops, to keep each run short) is planned by rotor, sqrt and
 * dtr, and one input in eight (by its length) of at most FUZZ_SLOW_OPS ops
 * by rockmate and checkmate (at a fifth of a second of ILP work) too, at
 * four budgets between its lower bound and its baseline peak; an
 * input of odd length is planned with every op that can run in place
 * declared so (test_edit_inplace), so that in-place runs are always
 * covered. Every plan handed out fits its budget (its arena, so its peak
 * too), passes the plan checks and is no faster than rkm_graph_time_bound
 * allows, and a refusal is a budget error naming the smallest budget.
 * Every algorithm meets its own smallest budget (rkm_planner_min_budget),
 * on its planner and on a fresh one (`rockmate info`, then `rockmate plan`
 * at that budget: issue 20); in the corpus's replay on one input in four
 * (FUZZ_FLOORS). One input in four is planned by DTR with a copy link too,
 * and those of them rockmate and checkmate plan by it (plan_offload). */
#include "fuzz.h"

/* rockmate's smallest budget bisects on whole-graph ILPs, checkmate's on
 * its ILP: seconds a graph beyond this, and a fifth of a second on every
 * input would make the corpus's replay (make test) minutes. */
#define FUZZ_SLOW_OPS 12

/* Whether an input of `size` bytes gets the smallest-budget checks. Under
 * libFuzzer every one; in the corpus's replay (make test, FUZZ_REPLAY) one
 * in four, those plan_offload plans (a superset of the slow_too ones):
 * DTR's smallest budget is a search of DTR solves on graphs of up to 40
 * ops, and on every input it was 40 % of the replay's time. A quarter of
 * the corpus (in place or not, with and without a link) still runs every
 * search, and every input meets the plan checks at the four budgets. */
#ifdef FUZZ_REPLAY
#define FUZZ_FLOORS(size) ((size) / 2 % 4 == 0)
#else
#define FUZZ_FLOORS(size) 1
#endif

static void check_plan_at(const rkm_graph *g, const rkm_graph_stats *gs, const rkm_plan *p, uint64_t budget)
{
    rkm_plan_stats st;
    FUZZ_CHECK(rkm_plan_stats_get(p, &st) == RKM_OK && st.peak <= budget);
    FUZZ_CHECK(st.aligned_peak <= st.arena_bytes && st.arena_bytes <= budget);
    fuzz_check_plan(p);
    double extra = -1; /* no plan beats the time bound */
    FUZZ_CHECK(rkm_graph_time_bound(g, budget, &extra) == RKM_OK);
    FUZZ_CHECK(st.time - gs->baseline_time >= extra - 1e-9 * (gs->baseline_time + extra));
}

/* Whether a call of pl ran past its time limit. checkmate's 0.2 s is a
 * work limit and a wall-clock deadline: on a loaded machine the deadline
 * can come first, and then the documented answers (a plan flagged cut, or
 * RKM_ERROR_TIMEOUT) are machine-dependent, so the claims below that need
 * a whole search are not made. */
static int was_cut(const rkm_planner *pl)
{
    rkm_planner_stats st;
    return rkm_planner_stats_get(pl, &st) == RKM_OK && st.cut > 0;
}

/* The planner meets its smallest budget, and so does a fresh one (where no
 * time limit ran out). */
static void check_min_budget(rkm_context *ctx, const rkm_graph *g, const rkm_graph_stats *gs,
                             const rkm_solve_desc *d, rkm_planner *pl)
{
    uint64_t min = 0;
    rkm_result r = rkm_planner_min_budget(pl, &min);
    FUZZ_CHECK(r == RKM_OK || r == RKM_ERROR_NOMEM);
    if (r || was_cut(pl)) return;
    FUZZ_CHECK(min >= gs->lower_bound);
    rkm_plan *p = NULL, *q = NULL;
    r = rkm_planner_solve(pl, min, &p);
    if (r == RKM_ERROR_TIMEOUT && was_cut(pl)) return;
    if (r) fprintf(stderr, "%s: smallest budget %llu refused: %s\n", rkm_algo_name(d->algo), (unsigned long long)min,
                   rkm_context_errmsg(ctx));
    FUZZ_CHECK(r == RKM_OK);
    check_plan_at(g, gs, p, min);
    r = rkm_plan_solve(g, d, min, &q);
    if (r == RKM_ERROR_TIMEOUT) { /* the fresh planner's clock ran out */
        rkm_plan_destroy(p);
        return;
    }
    if (r) fprintf(stderr, "%s: smallest budget %llu refused by a fresh planner: %s\n", rkm_algo_name(d->algo),
                   (unsigned long long)min, rkm_context_errmsg(ctx));
    FUZZ_CHECK(r == RKM_OK);
    check_plan_at(g, gs, q, min);
    rkm_plan_destroy(q);
    rkm_plan_destroy(p);
}

static void plan_algos(rkm_context *ctx, const rkm_graph *g, const rkm_algo *algos, size_t n_algos, int slow_too,
                       int floors)
{
    rkm_graph_stats gs;
    if (rkm_graph_stats_get(g, &gs) != RKM_OK) return;
    for (size_t a = 0; a < n_algos; a++) {
        int slow = algos[a] == RKM_ALGO_ROCKMATE || algos[a] == RKM_ALGO_CHECKMATE;
        if (slow && (!slow_too || rkm_graph_num_ops(g) > FUZZ_SLOW_OPS)) continue;
        rkm_solve_desc d = {0};
        d.algo = algos[a];
        d.slots = 100;
        d.time_limit = algos[a] == RKM_ALGO_CHECKMATE ? 0.2 : 0; /* ILP work, and a deadline (was_cut) */
        rkm_planner *pl = NULL;
        rkm_result r = rkm_planner_create(g, &d, &pl);
        FUZZ_CHECK(r == RKM_OK || r == RKM_ERROR_NOMEM || (slow && r == RKM_ERROR_UNSUPPORTED));
        for (int k = 0; pl && k <= 3; k++) {
            uint64_t span = gs.baseline_peak - gs.lower_bound;
            uint64_t budget = gs.lower_bound + span / 3 * (uint64_t)k;
            rkm_plan *p = NULL;
            r = rkm_planner_solve(pl, budget, &p);
            FUZZ_CHECK(r == RKM_OK || r == RKM_ERROR_BUDGET || (r == RKM_ERROR_TIMEOUT && was_cut(pl)));
            if (r == RKM_ERROR_BUDGET) FUZZ_CHECK(strstr(rkm_context_errmsg(ctx), "smallest") != NULL);
            if (p) check_plan_at(g, &gs, p, budget);
            rkm_plan_destroy(p);
        }
        if (pl && floors) check_min_budget(ctx, g, &gs, &d, pl);
        rkm_planner_destroy(pl);
    }
}

static void plan_all(rkm_context *ctx, const rkm_graph *g, int slow_too, int floors)
{
    static const rkm_algo algos[] = {RKM_ALGO_ROTOR, RKM_ALGO_SQRT, RKM_ALGO_DTR, RKM_ALGO_ROCKMATE,
                                     RKM_ALGO_CHECKMATE};
    plan_algos(ctx, g, algos, sizeof algos / sizeof algos[0], slow_too, floors);
}

/* DTR, and where slow_too rockmate and checkmate (plan_algos: up to
 * FUZZ_SLOW_OPS ops), with a copy link (the input's length picks its figures, from one that
 * hides every copy to one that hides none), so that their offloading plans
 * (copies, waits, a tensor prefetched more than once, DTR's evictions to
 * host memory and prefetches moved ahead of need) meet the same checks, at
 * the smallest budget too. */
static void plan_offload(rkm_context *ctx, const rkm_graph *g, size_t size, int slow_too, int floors)
{
    static const rkm_algo algos[] = {RKM_ALGO_DTR, RKM_ALGO_ROCKMATE, RKM_ALGO_CHECKMATE};
    static const double bandwidth[] = {1e12, 1e9, 1e7, 1e5};
    rkm_copy_desc link = {bandwidth[size / 16 % 4], bandwidth[size / 64 % 4], 1e-7 * (double)(size / 256 % 3)};
    rkm_graph *gc = NULL;
    if (rkm_graph_with_copy(g, &link, &gc) == RKM_OK)
        plan_algos(ctx, gc, algos, sizeof algos / sizeof *algos, slow_too, floors);
    rkm_graph_destroy(gc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rkm_context *ctx = fuzz_ctx();
    rkm_graph *g = NULL, *ip = NULL;
    if (rkm_graph_read_string(ctx, (const char *)data, size, "fuzz.rkg", &g) == RKM_OK && rkm_graph_num_ops(g) <= 40) {
        int slow_too = size / 2 % 8 == 0, floors = FUZZ_FLOORS(size); /* in place or not */
        if (size % 2 && test_edited_copy(g, test_edit_inplace, &ip) == RKM_OK) plan_all(ctx, ip, slow_too, floors);
        else plan_all(ctx, g, slow_too, floors);
        if (size / 2 % 4 == 0) plan_offload(ctx, ip ? ip : g, size, slow_too, floors);
    }
    rkm_graph_destroy(ip);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    return 0;
}
