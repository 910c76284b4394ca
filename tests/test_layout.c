/* test_layout: the memory a host allocates. Every plan a planner returns
 * has an arena (its own layout, at the alignment it was planned for) within
 * its budget; the placer's layouts hold (tests/test.h, test_layout_error);
 * hand-made lifetimes reach their bound; and DTR, which plans on a first-fit
 * allocator, gets a layout that is that allocator's. */
#include "../src/internal.h"
/* white box: the placer on hand-made buffers. The statics it calls are
 * layout.c's and drive.c's; the rest links from the sources' objects
 * (compiling the whole library into each test took ~25 s of its build). */
#include "../src/layout.c"
#include "../src/drive.c"
#include "test.h"

static const char *const graphs[] = {TEST_BUNDLED_GRAPHS};
#define N_GRAPHS (sizeof graphs / sizeof graphs[0])
/* 0: the planner's smallest budget; the slow planners (rockmate,
 * checkmate) at two budgets */
static const int pcts[] = {90, 80, 70, 60, 50, 40, 30, 20, 0}, slow_pcts[] = {50, 0};

/* One planner's plans at every budget: each fits (arena, aligned peak and
 * peak within the budget), has the planner's alignment and a layout that
 * holds; budgets it refuses are below its smallest, which it meets. */
static void plans_fit(rkm_graph *g, rkm_algo algo, uint64_t align, const char *name)
{
    clock_t t0 = clock();
    rkm_graph_stats gs;
    CHECK(rkm_graph_stats_get(g, &gs) == RKM_OK);
    rkm_solve_desc d = {0};
    d.algo = algo;
    d.alignment = align;
    d.time_limit = algo == RKM_ALGO_CHECKMATE ? 1 : 0;
    int slow = algo == RKM_ALGO_ROCKMATE || algo == RKM_ALGO_CHECKMATE;
    const int *at = slow ? slow_pcts : pcts;
    size_t n_at = slow ? N_OF(slow_pcts) : N_OF(pcts);
    rkm_planner *pl = NULL;
    rkm_result r = rkm_planner_create(g, &d, &pl);
#ifdef RKM_OMIT_SOLVER
    if (r == RKM_ERROR_UNSUPPORTED && algo == RKM_ALGO_CHECKMATE) return; /* rockmate plans without lp_solve */
#endif
    CHECK(r == RKM_OK);
    uint64_t min = 0;
    CHECK(pl && rkm_planner_min_budget(pl, &min) == RKM_OK);
    for (size_t i = 0; pl && i < n_at; i++) {
        uint64_t budget = at[i] ? gs.baseline_peak / 100 * (uint64_t)at[i] : min;
        rkm_plan *p = NULL;
        r = rkm_planner_solve(pl, budget, &p);
        if (r == RKM_ERROR_BUDGET && budget < min) continue;
        if (r != RKM_OK)
            fprintf(stderr, "%s %s at %d%% (alignment %llu): %s\n", name, rkm_algo_name(algo), at[i],
                    (unsigned long long)align, rkm_context_errmsg(rkm_graph_context(g)));
        CHECK(r == RKM_OK);
        if (!p) continue;
        rkm_plan_stats st;
        uint64_t arena = 0;
        CHECK(rkm_plan_stats_get(p, &st) == RKM_OK);
        const char *why = test_layout_error(p, 0, &arena, NULL);
        if (why) fprintf(stderr, "%s %s at %d%%: %s\n", name, rkm_algo_name(algo), at[i], why);
        CHECK(why == NULL);
        CHECK(st.alignment == (align ? align : RKM_ARENA_ALIGN) && arena == st.arena_bytes);
        if (st.arena_bytes > budget)
            fprintf(stderr, "%s %s at %d%%: arena %llu over the budget %llu\n", name, rkm_algo_name(algo), at[i],
                    (unsigned long long)st.arena_bytes, (unsigned long long)budget);
        CHECK(st.peak <= st.aligned_peak && st.aligned_peak <= st.arena_bytes && st.arena_bytes <= budget);
        rkm_plan_destroy(p);
    }
    rkm_planner_destroy(pl);
    if (getenv("RKM_TEST_TIMES"))
        fprintf(stderr, "    %s %s alignment %llu: %.1f s\n", name, rkm_algo_name(algo), (unsigned long long)align,
                (double)(clock() - t0) / CLOCKS_PER_SEC);
}

/* Every bundled graph, every fast algorithm, at 90..20 % and the smallest
 * budget, at the default alignment (256) and at 1 and 4096 (but on
 * gpt2-xl-b4-t1024, whose tensors are megabytes: there a few KiB of
 * rounding a buffer is the same instance as at 256, and each alignment
 * took 3.6 s of DTR's and rotor's searches). The slow ones
 * at 50 % and the smallest budget on the graphs where they take seconds,
 * not tens (test_plan checks rockmate's arenas at the default alignment on
 * every graph from 30 to 100 %, fuzz_planner on random graphs at 1):
 * rockmate at 1 and 4096, checkmate at the default. */
TEST(every_plan_fits_its_budget)
{
    static const rkm_algo fast[] = {RKM_ALGO_ROTOR, RKM_ALGO_SQRT, RKM_ALGO_DTR, RKM_ALGO_NONE};
    static const uint64_t aligns[] = {0, 1, 4096};
    static const char *const slow_graphs[] = {"gpt2-tiny", "mlp16", "multi-output"};
    for (size_t k = 0; k < N_GRAPHS; k++) {
        rkm_context *ctx = test_new_ctx();
        rkm_graph *g = test_load_graph(ctx, graphs[k]);
        CHECK(g != NULL);
        size_t n_aligns = strcmp(graphs[k], "gpt2-xl-b4-t1024") ? N_OF(aligns) : 1;
        for (size_t a = 0; g && a < N_OF(fast); a++)
            for (size_t l = 0; l < n_aligns; l++) plans_fit(g, fast[a], aligns[l], graphs[k]);
        for (size_t s = 0; g && s < N_OF(slow_graphs); s++) {
            if (strcmp(graphs[k], slow_graphs[s]) != 0) continue;
            plans_fit(g, RKM_ALGO_CHECKMATE, 0, graphs[k]);
            plans_fit(g, RKM_ALGO_ROCKMATE, 1, graphs[k]);
            plans_fit(g, RKM_ALGO_ROCKMATE, 4096, graphs[k]);
        }
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
}

/* Buffers with the given lifetimes and sizes (takes_over -1). */
static void buffers(rkm_buffer *b, size_t n, const int64_t (*life)[3])
{
    for (size_t i = 0; i < n; i++)
        b[i] = (rkm_buffer){RKM_BUFFER_TENSOR, (int32_t)i, life[i][0], life[i][1], (uint64_t)life[i][2], 0, -1};
}

/* Offsets aligned, no two live buffers share a byte, and the arena is the
 * highest end. */
static int holds(const rkm_buffer *b, size_t n, uint64_t align, uint64_t arena)
{
    uint64_t top = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t si = rkm__round_up(b[i].bytes, align);
        if (b[i].offset % align) return 0;
        if (b[i].bytes && b[i].offset + si > top) top = b[i].offset + si;
        for (size_t j = i + 1; j < n; j++) {
            uint64_t sj = rkm__round_up(b[j].bytes, align);
            if (b[i].first_step <= b[j].last_step && b[j].first_step <= b[i].last_step && b[i].bytes && b[j].bytes &&
                b[i].offset < b[j].offset + sj && b[j].offset < b[i].offset + si)
                return 0;
        }
    }
    return top == arena;
}

/* Hand-made lifetimes whose bound (the most live in a step) a layout can
 * reach, worked by hand. */
TEST(placer_reaches_the_bound_on_hand_made_lifetimes)
{
    /* steps 0..9: checkpoints c0 [0,9] 4 and c1 [1,8] 4 (nested); a
     * forward's transients [2,3] 2, [3,4] 3, [4,5] 2; a backward's
     * gradients [6,7] 3, [7,8] 3. The most live: 4 + 4 + 3 + 3 = 14 at step
     * 7; reached with c0 at 0, c1 at 4, [2,3] and [4,5] at 8, [3,4] at 10,
     * [6,7] at 8 and [7,8] at 11. */
    static const int64_t chain[][3] = {{0, 9, 4}, {1, 8, 4}, {2, 3, 2}, {3, 4, 3}, {4, 5, 2}, {6, 7, 3}, {7, 8, 3}};
    /* a [0,1] 2, b [1,2] 2, c [0,0] 1, d [2,2] 1: 3, 4 and 3 live at steps
     * 0, 1 and 2; reached with a at 0, b at 2, c at 2, d at 0 */
    static const int64_t crossed[][3] = {{0, 1, 2}, {1, 2, 2}, {0, 0, 1}, {2, 2, 1}};
    struct {
        const int64_t (*life)[3];
        size_t n;
        uint64_t bound;
    } cases[] = {{chain, N_OF(chain), 14}, {crossed, N_OF(crossed), 4}};
    rkm_context *ctx = test_new_ctx();
    for (size_t c = 0; c < N_OF(cases); c++)
        for (uint64_t align = 1; align <= 256; align *= 256) {
            rkm_buffer b[16];
            uint64_t arena = 0, peak = 0;
            buffers(b, cases[c].n, cases[c].life);
            for (size_t i = 0; i < cases[c].n; i++) b[i].bytes *= align; /* the same, in units of the alignment */
            CHECK(rkm__layout(ctx, b, cases[c].n, align, RKM__LAY_ALL, NULL, &arena, &peak) == RKM_OK);
            CHECK_EQ_U64(peak, cases[c].bound * align);
            CHECK_EQ_U64(arena, peak);
            CHECK(holds(b, cases[c].n, align, arena));
        }
    rkm_context_destroy(ctx);
}

/* The same buffers give the same offsets, whatever the stages before: the
 * layout is a function of the plan. And every stage alone gives a layout
 * that holds, never below the bound. */
TEST(placer_stages_hold_and_are_deterministic)
{
    rkm_context *ctx = test_new_ctx();
    static const char *const names[] = {"random30", "dag60", "unet-d4"};
    for (size_t k = 0; k < N_OF(names); k++) {
        rkm_graph *g = test_load_graph(ctx, names[k]);
        rkm_plan *p = NULL;
        rkm_solve_desc d = {0};
        d.algo = RKM_ALGO_DTR;
        rkm_graph_stats gs;
        rkm_planner *pl = NULL;
        uint64_t min = 0;
        CHECK(g && rkm_graph_stats_get(g, &gs) == RKM_OK);
        CHECK(g && rkm_planner_create(g, &d, &pl) == RKM_OK && rkm_planner_min_budget(pl, &min) == RKM_OK);
        /* half the baseline, or DTR's least if it cannot go that low */
        CHECK(pl && rkm_planner_solve(pl, min > gs.baseline_peak / 2 ? min : gs.baseline_peak / 2, &p) == RKM_OK);
        rkm_planner_destroy(pl);
        size_t n = p ? p->n_buffers : 0;
        rkm_buffer *b = calloc(n + 1, sizeof *b), *c = calloc(n + 1, sizeof *c);
        static const unsigned stages[] = {RKM__LAY_SKYLINE, RKM__LAY_GREEDY, RKM__LAY_SKYLINE | RKM__LAY_SEARCH,
                                          RKM__LAY_ALL};
        for (size_t s = 0; p && s < N_OF(stages); s++) {
            uint64_t arena = 0, peak = 0, again = 0;
            memcpy(b, p->buffers, n * sizeof *b);
            memcpy(c, p->buffers, n * sizeof *c);
            CHECK(rkm__layout(ctx, b, n, 256, stages[s], NULL, &arena, &peak) == RKM_OK);
            CHECK(rkm__layout(ctx, c, n, 256, stages[s], NULL, &again, &peak) == RKM_OK);
            CHECK(arena == again && memcmp(b, c, n * sizeof *b) == 0);
            CHECK(arena >= peak && peak == p->stats.aligned_peak);
            CHECK(holds(b, n, 256, arena));
            if (stages[s] == RKM__LAY_ALL) CHECK_EQ_U64(arena, p->stats.arena_bytes);
        }
        free(b);
        free(c);
        rkm_plan_destroy(p);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

/* DTR plans on a first-fit allocator of the budget's bytes: the plan's
 * first fit in creation order is that allocator, so it fits the budget,
 * at every budget DTR meets, before the other stages are tried. */
TEST(dtr_plans_fit_by_first_fit)
{
    rkm_context *ctx = test_new_ctx();
    static const char *const names[] = {"peer-gpt", "random30", "dag60", "resnet18-like-b32"};
    for (size_t k = 0; k < N_OF(names); k++) {
        rkm_graph *g = test_load_graph(ctx, names[k]);
        rkm_graph_stats gs;
        CHECK(g && rkm_graph_stats_get(g, &gs) == RKM_OK);
        rkm_solve_desc d = {0};
        d.algo = RKM_ALGO_DTR;
        rkm_planner *pl = NULL;
        CHECK(g && rkm_planner_create(g, &d, &pl) == RKM_OK);
        for (int pct = 90; pl && pct >= 30; pct -= 10) {
            uint64_t budget = gs.baseline_peak / 100 * (uint64_t)pct;
            rkm_plan *p = NULL;
            if (rkm__planner_try(pl, budget, RKM__ASK_SOLVE, &p) != RKM_OK || !p) continue; /* the plan before any layout */
            rkm_buffer *b = calloc(p->n_buffers + 1, sizeof *b);
            uint64_t arena = 0, peak = 0;
            memcpy(b, p->buffers, p->n_buffers * sizeof *b);
            /* first fit alone: the greedy's third order is creation order */
            CHECK(rkm__layout(ctx, b, p->n_buffers, 256, RKM__LAY_GREEDY, NULL, &arena, &peak) == RKM_OK);
            if (arena > budget)
                fprintf(stderr, "%s dtr at %d%%: first fit %llu over %llu\n", names[k], pct, (unsigned long long)arena,
                        (unsigned long long)budget);
            CHECK(arena <= budget);
            free(b);
            rkm_plan_destroy(p);
        }
        rkm_planner_destroy(pl);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(placer_reaches_the_bound_on_hand_made_lifetimes);
    RUN(placer_stages_hold_and_are_deterministic);
    RUN(dtr_plans_fit_by_first_fit);
    RUN(every_plan_fits_its_budget);
    TEST_END();
}
