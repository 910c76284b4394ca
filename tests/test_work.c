/* test_work: each planner call's one work meter (rkm_planner_stats.work,
 * work_limit; src/progress.c). Every call reports work within its limit;
 * a solve at a budget between the graph's lower bound and its smallest
 * budget ends by work, not by the clock, with RKM_ERROR_BUDGET; a meter
 * that runs out stops the search deterministically, without a cut; and
 * the smallest budget is the same whichever call seeks it. */
#include "../src/internal.h"
#include "test.h"

static rkm_planner *make(rkm_graph *g, rkm_algo algo)
{
    rkm_solve_desc d = RKM_ZERO;
    d.algo = algo;
    d.time_limit = 1000; /* only the work may end a call */
    rkm_planner *pl = NULL;
    CHECK(rkm_planner_create(g, &d, &pl) == RKM_OK);
    return pl;
}

static rkm_planner_stats stats(const rkm_planner *pl)
{
    rkm_planner_stats st;
    CHECK(rkm_planner_stats_get(pl, &st) == RKM_OK);
    return st;
}

/* The last call: some work, within a limit, not cut. */
static void check_call(const rkm_planner *pl, const char *graph, const char *call)
{
    rkm_planner_stats st = stats(pl);
    if (!(st.work_limit > 0 && st.work <= st.work_limit && st.cut == 0))
        fprintf(stderr, "%s, %s: work %llu, limit %llu, cut %d\n", graph, call, (unsigned long long)st.work,
                (unsigned long long)st.work_limit, (int)st.cut);
    CHECK(st.work_limit > 0);
    CHECK(st.work <= st.work_limit);
    CHECK(st.cut == 0);
}

/* On graphs whose smallest budget lies above their lower bound,
 * rockmate's solve half way between them returns RKM_ERROR_BUDGET (no
 * plan; the clock never ran out, at 1000 s), within its work limit; so do
 * its creation and its smallest budget. The same planner then reports the
 * smallest budget it named without seeking it again (work 0). Four graphs
 * whose smallest budgets are quick to find (bench/bench_work.sh runs every
 * graph of tests/graphs through the CLI). */
TEST(budget_between_bound_and_min)
{
    static const char *const names[] = {"gpt2-tiny", "multi-output", "resnet18-like-b32", "gpt2-124M-b4-t64"};
    int between = 0;
    for (size_t i = 0; i < N_OF(names); i++) {
        rkm_context *ctx = NULL;
        CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
        rkm_graph *g = test_load_graph(ctx, names[i]);
        rkm_planner *pl = g ? make(g, RKM_ALGO_ROCKMATE) : NULL;
        if (pl) {
            check_call(pl, names[i], "create");
            uint64_t min = 0, again = 0, lb = g->stats.lower_bound;
            rkm_planner *first = make(g, RKM_ALGO_ROCKMATE);
            CHECK(first && rkm_planner_min_budget(first, &min) == RKM_OK);
            if (first) check_call(first, names[i], "min_budget");
            rkm_planner_destroy(first);
            if (min > lb + 1) {
                between++;
                rkm_plan *p = NULL;
                rkm_result r = rkm_planner_solve(pl, lb + (min - lb) / 2, &p);
                if (r != RKM_ERROR_BUDGET) fprintf(stderr, "%s: %s: %s\n", names[i], rkm_result_string(r), rkm_context_errmsg(ctx));
                CHECK(r == RKM_ERROR_BUDGET && p == NULL);
                check_call(pl, names[i], "solve");
                /* the smallest budget the solve sought is the one a fresh planner found */
                CHECK(rkm_planner_min_budget(pl, &again) == RKM_OK);
                CHECK_EQ_U64(again, min);
                CHECK_EQ_U64(stats(pl).work, 0);
            }
        }
        rkm_planner_destroy(pl);
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
    CHECK(between == (int)N_OF(names)); /* the check ran on each */
}

/* A plan does not depend on what the planner did before: a solve after a
 * failing one and after the smallest budget's search gives the same plan
 * as on a fresh planner, with the same work. */
TEST(plans_independent_of_call_order)
{
    rkm_context *ctx = NULL;
    CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
    rkm_graph *g = test_load_graph(ctx, "random30");
    rkm_planner *a = g ? make(g, RKM_ALGO_ROCKMATE) : NULL, *b = g ? make(g, RKM_ALGO_ROCKMATE) : NULL;
    if (a && b) {
        uint64_t budget = g->stats.baseline_peak / 2, min = 0;
        rkm_plan *p = NULL, *q = NULL, *none = NULL;
        CHECK(rkm_planner_solve(a, budget, &p) == RKM_OK);
        uint64_t wa = stats(a).work;
        CHECK(rkm_planner_min_budget(b, &min) == RKM_OK);
        CHECK(rkm_planner_solve(b, g->stats.lower_bound, &none) == RKM_ERROR_BUDGET);
        CHECK(rkm_planner_solve(b, budget, &q) == RKM_OK);
        CHECK(p && q && p->n_steps == q->n_steps && !memcmp(p->steps, q->steps, p->n_steps * sizeof *p->steps));
        CHECK_EQ_U64(stats(b).work, wa);
        rkm_plan_destroy(p);
        rkm_plan_destroy(q);
    }
    rkm_planner_destroy(a);
    rkm_planner_destroy(b);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* The meter that runs out: the search stops where its work ends, with
 * the best plan found by then or none, never more than the limit, not
 * cut (only the clock cuts), and the same result on a second run. Driven
 * below the API: a solve's limit is set by the rule, so the test sets a
 * small one on the search itself. */
TEST(spent_meter_stops_deterministically)
{
    rkm_context *ctx = NULL;
    CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
    rkm_graph *g = test_load_graph(ctx, "mlp16");
    static const uint64_t limits[] = {0, 20000, 400000, 4000000};
    for (size_t k = 0; g && k < N_OF(limits); k++) {
        rkm_plan *p[2] = {NULL, NULL};
        for (int run = 0; run < 2; run++) {
            rkm_planner *pl = make(g, RKM_ALGO_ROCKMATE);
            if (!pl) break;
            rkm__work_start(pl, limits[k]);
            rkm__search_begin(pl, RKM__ASK_SOLVE);
            CHECK(rkm__solve_rockmate(pl, g->stats.baseline_peak * 2 / 5, RKM__ASK_SOLVE, &p[run]) == RKM_OK);
            CHECK(pl->work_spent <= limits[k]);
            CHECK(pl->cut == 0);
            rkm_planner_destroy(pl);
        }
        CHECK((p[0] == NULL) == (p[1] == NULL));
        if (p[0] && p[1]) {
            CHECK(p[0]->n_steps == p[1]->n_steps && !memcmp(p[0]->steps, p[1]->steps, p[0]->n_steps * sizeof *p[0]->steps));
            CHECK(p[0]->stats.peak <= g->stats.baseline_peak * 2 / 5);
        }
        rkm_plan_destroy(p[0]);
        rkm_plan_destroy(p[1]);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* The effort rule (rkm__affords): at W's floor (graphs of up to 488 ops
 * and tensors) each part's level falls at the op count internal.h states,
 * a part is afforded on fewer ops whenever on more, and a larger graph,
 * whose W is larger, affords a part on more ops. Only the graph's size is
 * read, so a sized stand-in serves. */
static rkm_graph sized(size_t ops, size_t tensors)
{
    rkm_graph g;
    memset(&g, 0, sizeof g);
    g.n_ops = ops, g.n_tensors = tensors;
    return g;
}

TEST(effort_rule_scales)
{
    static const struct {
        double need;
        int64_t last; /* the most ops afforded at W's floor */
    } levels[] = {{RKM__NEED_GRAPH_ILP, 64}, {RKM__NEED_KICKS, 256}, {RKM__NEED_BLOCK_ILP, 48},
                  {RKM__NEED_NESTED_ILP, 24}, {RKM__NEED_DTR, 1264}};
    rkm_graph small = sized(60, 62), large = sized(4000, 4100);
    CHECK(rkm__work_solve(&small) == RKM__WORK_MIN);
    CHECK(rkm__work_solve(&large) == (uint64_t)RKM__WORK_PER_OBJECT * 8100);
    for (size_t k = 0; k < N_OF(levels); k++) {
        double need = levels[k].need;
        int64_t last = levels[k].last;
        CHECK(rkm__affords(&small, last, need) && !rkm__affords(&small, last + 1, need));
        for (int64_t n = 1; n <= 2 * last; n++) /* monotone in the ops */
            CHECK(rkm__affords(&small, n, need) == (n <= last));
        int64_t up = 1;
        while (rkm__affords(&large, up + 1, need)) up++;
        CHECK(up > last); /* a larger graph affords more */
        CHECK((double)up * (double)up * need <= (double)rkm__work_solve(&large));
    }
}

int main(void)
{
    RUN(effort_rule_scales);
    RUN(budget_between_bound_and_min);
    RUN(plans_independent_of_call_order);
    RUN(spent_meter_stops_deterministically);
    TEST_END();
}
