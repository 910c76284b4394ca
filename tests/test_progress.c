/* test_progress: rkm_solve_desc.progress, through the public API. Reports
 * name a valid stage, their fraction stays in [0, 1] and never goes back
 * within a call; a callback that returns 0 changes no plan (plan files
 * compared byte for byte); one that returns non-zero at its k-th report
 * cancels the call (RKM_ERROR_CANCELLED with a message, no plan, nothing
 * leaked) and the planner then plans as if that call had never been made.
 * No timing is asserted: reports come at most every 0.1 s, so how many a
 * call makes depends on the machine, and the checks say what must hold for
 * any count. */
#include "../rockmate.h"
#include "test.h"

/* What the callback saw in the current call, and when it cancels. */
typedef struct recorder {
    int calls;        /* reports in this call */
    int cancel_at;    /* return non-zero at this report (1-based); 0: never */
    int bad;          /* reports that broke a rule */
    double last;      /* the previous report's fraction, -1 before the first */
    rkm_stage stage;  /* the call's stage (its first report's) */
} recorder;

static void rec_reset(recorder *r, int cancel_at)
{
    r->calls = r->bad = 0;
    r->cancel_at = cancel_at;
    r->last = -1;
    r->stage = (rkm_stage)0;
}

static const char *const stage_names[] = {"", "create", "solve", "min_budget"};

static int record(void *user, const rkm_progress *p)
{
    recorder *r = user;
    int ok = p->stage >= RKM_STAGE_CREATE && p->stage <= RKM_STAGE_MIN_BUDGET && p->stage_name &&
             strcmp(p->stage_name, stage_names[p->stage]) == 0 && p->fraction >= 0 && p->fraction <= 1 &&
             p->fraction >= r->last && p->best_time >= 0 && p->baseline_time > 0 && p->seconds >= 0 &&
             p->algo != RKM_ALGO_DEFAULT && (r->calls == 0 ? p->fraction == 0 : p->stage == r->stage) &&
             (p->stage == RKM_STAGE_SOLVE ? p->budget > 0 : p->budget == 0 && p->best_time == 0);
    if (!ok) {
        fprintf(stderr, "bad report %d: stage %d (%s), fraction %g after %g, best %g, budget %llu\n", r->calls + 1,
                (int)p->stage, p->stage_name ? p->stage_name : "(null)", p->fraction, r->last, p->best_time,
                (unsigned long long)p->budget);
        r->bad++;
    }
    if (r->calls == 0) r->stage = p->stage;
    r->last = p->fraction;
    return ++r->calls == r->cancel_at;
}

/* A plan file in memory, to compare plans byte for byte. */
typedef struct text {
    char buf[1 << 20];
    size_t n;
} text;

static int text_write(void *user, const char *data, size_t len)
{
    text *t = user;
    if (len > sizeof t->buf - t->n) return 1;
    memcpy(t->buf + t->n, data, len);
    t->n += len;
    return 0;
}

static text *plan_text(const rkm_plan *p)
{
    text *t = calloc(1, sizeof *t);
    if (t && rkm_plan_write(p, text_write, t) != RKM_OK) t->n = (size_t)-1;
    return t;
}

static int same_plan(const rkm_plan *a, const rkm_plan *b)
{
    if (!a || !b) return a == b;
    text *x = plan_text(a), *y = plan_text(b);
    int same = x && y && x->n == y->n && x->n != (size_t)-1 && memcmp(x->buf, y->buf, x->n) == 0;
    free(x);
    free(y);
    return same;
}

static uint64_t budget_of(const rkm_graph *g, int pct)
{
    rkm_graph_stats gs;
    memset(&gs, 0, sizeof gs);
    CHECK(rkm_graph_stats_get(g, &gs) == RKM_OK);
    return gs.baseline_peak / 100 * (uint64_t)pct;
}

static rkm_planner *make_planner(const rkm_graph *g, rkm_algo algo, recorder *rec)
{
    rkm_solve_desc d;
    memset(&d, 0, sizeof d);
    d.algo = algo;
    /* never cut: plans are then the same on every run (checkmate spends
     * half its limit as ILP work, which it does not need on these graphs) */
    d.time_limit = algo == RKM_ALGO_CHECKMATE ? 30 : 1e9;
    d.ilp_budget = 0.25; /* fewer block ILP solves: a faster test, plans as deterministic */
    if (rec) {
        d.progress = record;
        d.progress_user = rec;
        rec_reset(rec, 0);
    }
    rkm_planner *pl = NULL;
    CHECK(rkm_planner_create(g, &d, &pl) == RKM_OK);
    if (rec) CHECK(rec->calls >= 1 && rec->stage == RKM_STAGE_CREATE && rec->bad == 0);
    return pl;
}

/* Solve at budget with and without a 0-returning callback: the same plan
 * file, valid reports, at least the first. */
static void compare_at(rkm_planner *plain, rkm_planner *watched, recorder *rec, uint64_t budget)
{
    rkm_plan *a = NULL, *b = NULL;
    rkm_result ra = rkm_planner_solve(plain, budget, &a);
    rec_reset(rec, 0);
    rkm_result rb = rkm_planner_solve(watched, budget, &b);
    CHECK(ra == rb);
    CHECK(rec->calls >= 1 && rec->stage == RKM_STAGE_SOLVE && rec->bad == 0);
    CHECK(same_plan(a, b));
    rkm_plan_destroy(a);
    rkm_plan_destroy(b);
}

/* ...at 70 % and, `full`, 40 % and the smallest budget (min_budget too). */
static void plans_unchanged_on(const char *name, rkm_algo algo, int full)
{
    static const int pcts[] = {70, 40};
    rkm_context *ctx = test_new_ctx_alloc(test_count_alloc);
    rkm_graph *g = test_load_graph(ctx, name);
    if (!g) {
        rkm_context_destroy(ctx);
        return;
    }
    recorder rec;
    rkm_planner *plain = make_planner(g, algo, NULL), *watched = make_planner(g, algo, &rec);
    for (size_t k = 0; plain && watched && k < (full ? N_OF(pcts) : 1); k++)
        compare_at(plain, watched, &rec, budget_of(g, pcts[k]));
    uint64_t m1 = 0, m2 = 0;
    if (plain && watched && full) {
        rkm_result r1 = rkm_planner_min_budget(plain, &m1);
        rec_reset(&rec, 0);
        rkm_result r2 = rkm_planner_min_budget(watched, &m2);
        CHECK(r1 == r2 && m1 == m2);
        CHECK(rec.calls >= 1 && rec.stage == RKM_STAGE_MIN_BUDGET && rec.bad == 0);
        compare_at(plain, watched, &rec, m1); /* the smallest budget's plan, from min_plan */
    }
    rkm_planner_destroy(plain);
    rkm_planner_destroy(watched);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* unet-d4 nests (its nested planners check through their parent). */
TEST(plans_unchanged)
{
    plans_unchanged_on("mlp16", RKM_ALGO_ROCKMATE, 1);
    plans_unchanged_on("unet-d4", RKM_ALGO_ROCKMATE, 0);
    plans_unchanged_on("gpt2-tiny", RKM_ALGO_ROTOR, 1);
    plans_unchanged_on("gpt2-tiny", RKM_ALGO_DTR, 1);
    plans_unchanged_on("mlp16", RKM_ALGO_SQRT, 1);
}

#ifndef RKM_OMIT_SOLVER
TEST(plans_unchanged_checkmate) { plans_unchanged_on("multi-output", RKM_ALGO_CHECKMATE, 1); }
#endif

/* Cancel the solve at budget at its k-th report: CANCELLED with a message
 * and no plan where the callback got that far, else the plan as usual; and
 * then the planner's plan is ref's. */
static void cancel_solve_at(rkm_context *ctx, rkm_planner *pl, recorder *rec, int k, uint64_t budget,
                            const rkm_plan *ref)
{
    rkm_plan *p = (rkm_plan *)&p; /* not NULL: the call must set it */
    rec_reset(rec, k);
    rkm_result r = rkm_planner_solve(pl, budget, &p);
    if (rec->calls >= k) {
        CHECK(r == RKM_ERROR_CANCELLED && p == NULL);
        CHECK(strstr(rkm_context_errmsg(ctx), "cancelled by the progress callback") != NULL);
        CHECK(strstr(rkm_context_errmsg(ctx), "solve") != NULL);
    } else {
        CHECK(r == RKM_OK && same_plan(p, ref));
    }
    CHECK(rec->bad == 0);
    rkm_plan_destroy(p == (rkm_plan *)&p ? NULL : p);
    rec_reset(rec, 0);
    CHECK(rkm_planner_solve(pl, budget, &p) == RKM_OK);
    CHECK(same_plan(p, ref));
    rkm_plan_destroy(p);
    rkm_planner_stats st;
    CHECK(rkm_planner_stats_get(pl, &st) == RKM_OK && st.cut == 0); /* a cancel is no cut */
}

static void cancel_on(const char *name, rkm_algo algo, int pct)
{
    rkm_context *ctx = test_new_ctx_alloc(test_count_alloc);
    rkm_graph *g = test_load_graph(ctx, name);
    if (!g) {
        rkm_context_destroy(ctx);
        return;
    }
    recorder rec;
    uint64_t budget = budget_of(g, pct), min_ref = 0, min = 1;
    rkm_planner *ref_pl = make_planner(g, algo, NULL), *pl = make_planner(g, algo, &rec);
    rkm_plan *ref = NULL;
    if (ref_pl) CHECK(rkm_planner_solve(ref_pl, budget, &ref) == RKM_OK);
    /* how many reports an uncancelled solve makes here */
    rec_reset(&rec, 0);
    rkm_plan *p = NULL;
    if (pl) CHECK(rkm_planner_solve(pl, budget, &p) == RKM_OK && same_plan(p, ref));
    rkm_plan_destroy(p);
    int n = rec.calls;
    /* the first report, the second, the last (n + 1: never reached) */
    for (int k = 1; pl && ref && k <= n + 1; k = k < 2 ? k + 1 : k < n ? n : n + 2) cancel_solve_at(ctx, pl, &rec, k, budget, ref);
    /* min_budget: cancelled at its first report, then as the reference's */
    if (pl && ref_pl) {
        rec_reset(&rec, 1);
        CHECK(rkm_planner_min_budget(pl, &min) == RKM_ERROR_CANCELLED && min == 0);
        CHECK(strstr(rkm_context_errmsg(ctx), "min_budget") != NULL);
        rec_reset(&rec, 0);
        CHECK(rkm_planner_min_budget(pl, &min) == RKM_OK);
        CHECK(rkm_planner_min_budget(ref_pl, &min_ref) == RKM_OK && min == min_ref);
    }
    rkm_plan_destroy(ref);
    rkm_planner_destroy(ref_pl);
    rkm_planner_destroy(pl);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

TEST(cancel_solve)
{
    cancel_on("mlp16", RKM_ALGO_ROCKMATE, 40);
    cancel_on("gpt2-tiny", RKM_ALGO_ROTOR, 50);
    cancel_on("gpt2-tiny", RKM_ALGO_DTR, 50);
}

#ifndef RKM_OMIT_SOLVER
TEST(cancel_solve_checkmate) { cancel_on("multi-output", RKM_ALGO_CHECKMATE, 95); }
#endif

/* Cancelled at its k-th report, rkm_planner_create makes no planner and
 * leaks nothing; rkm_plan_solve likewise hands out no plan. */
static void cancel_create_on(const char *name, rkm_algo algo)
{
    rkm_context *ctx = test_new_ctx_alloc(test_count_alloc);
    rkm_graph *g = test_load_graph(ctx, name);
    if (!g) {
        rkm_context_destroy(ctx);
        return;
    }
    recorder rec;
    rkm_solve_desc d;
    memset(&d, 0, sizeof d);
    d.algo = algo;
    d.time_limit = 1e9;
    d.ilp_budget = 0.25;
    d.progress = record;
    d.progress_user = &rec;
    rkm_planner *pl = NULL;
    rec_reset(&rec, 0);
    CHECK(rkm_planner_create(g, &d, &pl) == RKM_OK && pl);
    rkm_planner_destroy(pl);
    int n = rec.calls;
    for (int k = 1; k <= n; k = k < 2 ? k + 1 : k + n / 2 + 1) {
        rec_reset(&rec, k);
        pl = (rkm_planner *)&pl;
        rkm_result r = rkm_planner_create(g, &d, &pl);
        if (rec.calls >= k) { /* else this run made fewer reports */
            CHECK(r == RKM_ERROR_CANCELLED && pl == NULL && rec.calls == k);
            CHECK(strstr(rkm_context_errmsg(ctx), "rkm_planner_create: cancelled") != NULL);
        } else {
            CHECK(r == RKM_OK && pl != NULL);
            rkm_planner_destroy(pl == (rkm_planner *)&pl ? NULL : pl);
        }
        CHECK(rec.bad == 0);
    }
    rkm_plan *p = (rkm_plan *)&p;
    rec_reset(&rec, 1);
    CHECK(rkm_plan_solve(g, &d, budget_of(g, 50), &p) == RKM_ERROR_CANCELLED && p == NULL);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

TEST(cancel_create)
{
    cancel_create_on("unet-d4", RKM_ALGO_ROCKMATE);
    cancel_create_on("gpt2-tiny", RKM_ALGO_ROTOR);
    cancel_create_on("mlp16", RKM_ALGO_DTR);
}

TEST(result_string)
{
    CHECK(strcmp(rkm_result_string(RKM_ERROR_CANCELLED), "cancelled by the progress callback") == 0);
    CHECK(RKM_ERROR_CANCELLED == RKM_RESULT_COUNT - 1);
}

int main(void)
{
    RUN(plans_unchanged);
    RUN_SOLVER(plans_unchanged_checkmate);
    RUN(cancel_solve);
    RUN_SOLVER(cancel_solve_checkmate);
    RUN(cancel_create);
    RUN(result_string);
    TEST_END();
}
