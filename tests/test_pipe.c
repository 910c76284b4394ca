/* test_pipe: the pipeline replay (rkm_pipeline_simulate) against
 * hand-worked steps, the bubble formula of uniform stages, the schedules'
 * in-flight counts, and its refusals. */
#include "test.h"

#include <limits.h>
#include <math.h>

/* P = 2, M = 3, 1F1B, forward 1 s and backward 2 s on both stages, no
 * transfer time. Stage 0 runs F0 | F1 B0 F2 B1 | B2, stage 1 F0 B0 F1 B1
 * F2 B2. By hand: stage 0 F0 [0,1], F1 [1,2]; stage 1 F0 [1,2], B0 [2,4];
 * stage 0 B0 [4,6]; stage 1 F1 [4,5], B1 [5,7]; stage 0 F2 [6,7], B1
 * [7,9]; stage 1 F2 [7,8], B2 [8,10]; stage 0 B2 [10,12]. 12 s, which is
 * (M + P - 1) x (F + B). */
TEST(one_f_one_b_by_hand)
{
    rkm_context *ctx = test_new_ctx();
    const rkm_pipe_stage st[2] = {{1, 2, 0, 0}, {1, 2, 0, 0}};
    rkm_pipe_phase ph[12];
    int32_t k[2] = {0, 0};
    double t = -1;
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 3, RKM_PIPE_1F1B, ph, k, &t) == RKM_OK);
    CHECK(t == 12);
    CHECK(k[0] == 2 && k[1] == 1);
    /* stage 0's order and times */
    static const int32_t micro0[6] = {0, 1, 0, 2, 1, 2}, bwd0[6] = {0, 0, 1, 0, 1, 1};
    static const double start0[6] = {0, 1, 4, 6, 7, 10}, end0[6] = {1, 2, 6, 7, 9, 12};
    for (int j = 0; j < 6; j++)
        CHECK(ph[j].stage == 0 && ph[j].micro == micro0[j] && ph[j].bwd == bwd0[j] && ph[j].start == start0[j] &&
              ph[j].end == end0[j]);
    static const int32_t micro1[6] = {0, 0, 1, 1, 2, 2}, bwd1[6] = {0, 1, 0, 1, 0, 1};
    static const double start1[6] = {1, 2, 4, 5, 7, 8}, end1[6] = {2, 4, 5, 7, 8, 10};
    for (int j = 0; j < 6; j++)
        CHECK(ph[6 + j].stage == 1 && ph[6 + j].micro == micro1[j] && ph[6 + j].bwd == bwd1[j] &&
              ph[6 + j].start == start1[j] && ph[6 + j].end == end1[j]);
    rkm_context_destroy(ctx);
}

/* P = 2, M = 2, transfers of 0.5 s each way: a phase waits for the
 * transfer, and a link carries one at a time. 1F1B by hand: stage 0 F0
 * [0,1] sends [1,1.5], F1 [1,2] sends [2,2.5]; stage 1 F0 [1.5,2.5], B0
 * [2.5,4.5] sends [4.5,5], F1 [4.5,5.5], B1 [5.5,7.5] sends [7.5,8]; stage
 * 0 B0 [5,7], B1 [8,10]: 10 s. GPipe: stage 1 F0 [1.5,2.5], F1 [2.5,3.5],
 * B0 [3.5,5.5] sends [5.5,6], B1 [5.5,7.5] sends [7.5,8]; stage 0 B0
 * [6,8], B1 [8,10]: 10 s too, with 2 in flight on stage 1. Then a link
 * slower than the stage: 2 s a transfer, so stage 0's second send waits
 * for its first (F0's [1,3], F1's [3,5], not [2,4]). */
TEST(transfers_by_hand)
{
    rkm_context *ctx = test_new_ctx();
    rkm_pipe_stage st[2] = {{1, 2, 0.5, 0.5}, {1, 2, 0.5, 0.5}};
    rkm_pipe_phase ph[8];
    int32_t k[2];
    double t = -1;
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 2, RKM_PIPE_1F1B, ph, k, &t) == RKM_OK);
    CHECK(t == 10 && k[0] == 2 && k[1] == 1);
    CHECK(ph[0].arrive == 1.5 && ph[1].arrive == 2.5);                          /* stage 0: F0, F1 */
    CHECK(ph[4].start == 1.5 && ph[5].end == 4.5 && ph[5].arrive == 5);         /* stage 1: F0, B0 */
    CHECK(ph[6].start == 4.5 && ph[7].end == 7.5 && ph[7].arrive == 8);         /* stage 1: F1, B1 */
    CHECK(ph[2].start == 5 && ph[2].end == 7 && ph[3].start == 8 && ph[3].end == 10); /* stage 0: B0, B1 */
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 2, RKM_PIPE_GPIPE, ph, k, &t) == RKM_OK);
    CHECK(t == 10 && k[0] == 2 && k[1] == 2);
    CHECK(ph[5].start == 2.5 && ph[6].start == 3.5 && ph[6].arrive == 6 && ph[2].start == 6);
    st[0].send_fwd = 2;
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 2, RKM_PIPE_1F1B, ph, k, &t) == RKM_OK);
    CHECK(ph[0].arrive == 3 && ph[1].arrive == 5);
    CHECK(ph[4].start == 3); /* stage 1's F0 waits for its input */
    rkm_context_destroy(ctx);
}

/* Uniform stages with free links: 1F1B's step is (M + P - 1) x (F + B)
 * (the bubble of P - 1 stages), and so is GPipe's; stage s holds
 * min(P - s, M) micro-batches in 1F1B, M in GPipe. Times in powers of two,
 * so the sums are exact. */
TEST(uniform_stages_match_the_bubble_formula)
{
    rkm_context *ctx = test_new_ctx();
    rkm_pipe_stage st[8];
    int32_t k[8];
    for (int32_t p = 1; p <= 8; p++)
        for (int32_t m = 1; m <= 16; m++)
            for (int kind = 0; kind < 2; kind++) {
                for (int32_t s = 0; s < p; s++) st[s] = (rkm_pipe_stage){0.5, 1, 0, 0};
                double t = -1;
                CHECK(rkm_pipeline_simulate(ctx, st, p, m, (rkm_pipe_schedule)kind, NULL, k, &t) == RKM_OK);
                CHECK(t == (double)(m + p - 1) * 1.5);
                for (int32_t s = 0; s < p; s++) CHECK(k[s] == (kind == RKM_PIPE_GPIPE ? m : (p - s < m ? p - s : m)));
            }
    rkm_context_destroy(ctx);
}

/* Every phase once, each stage's phases back to back at most, every
 * forward after its input arrived and every backward after its gradient
 * arrived, on uneven stages and links. */
TEST(replays_respect_every_dependency)
{
    rkm_context *ctx = test_new_ctx();
    rng_seed(7);
    rkm_pipe_stage st[6];
    static rkm_pipe_phase ph[2 * 6 * 9];
    for (int trial = 0; trial < 50; trial++) {
        int32_t p = rng_int(1, 6), m = rng_int(1, 9), n = 2 * m;
        for (int32_t s = 0; s < p; s++)
            st[s] = (rkm_pipe_stage){rng_int(1, 9) / 8.0, rng_int(1, 9) / 8.0, rng_int(0, 9) / 8.0, rng_int(0, 9) / 8.0};
        double t = -1;
        CHECK(rkm_pipeline_simulate(ctx, st, p, m, (rkm_pipe_schedule)(trial % 2), ph, NULL, &t) == RKM_OK);
        for (int32_t s = 0; s < p; s++) {
            int seen[2][9] = {{0}};
            for (int32_t j = 0; j < n; j++) {
                const rkm_pipe_phase *e = &ph[s * n + j];
                CHECK(e->stage == s && e->micro >= 0 && e->micro < m);
                seen[e->bwd][e->micro]++;
                CHECK(e->end == e->start + (e->bwd ? st[s].bwd : st[s].fwd) && e->end <= t);
                if (j) CHECK(e->start >= ph[s * n + j - 1].end);
                int32_t from = e->bwd ? s + 1 : s - 1;
                for (int32_t i = 0; from >= 0 && from < p && i < n; i++) {
                    const rkm_pipe_phase *c = &ph[from * n + i];
                    if (c->micro == e->micro && c->bwd == e->bwd) CHECK(e->start >= c->arrive && c->arrive >= c->end);
                }
                if (e->bwd) CHECK(seen[0][e->micro] == 1); /* after its own forward */
            }
            for (int32_t i = 0; i < m; i++) CHECK(seen[0][i] == 1 && seen[1][i] == 1);
        }
    }
    rkm_context_destroy(ctx);
}

TEST(bad_inputs_are_refused)
{
    rkm_context *ctx = test_new_ctx();
    rkm_pipe_stage st[2] = {{1, 2, 0, 0}, {1, 2, 0, 0}};
    double t = 5;
    CHECK(rkm_pipeline_simulate(NULL, st, 2, 2, RKM_PIPE_1F1B, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_pipeline_simulate(ctx, NULL, 2, 2, RKM_PIPE_1F1B, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_pipeline_simulate(ctx, st, 0, 2, RKM_PIPE_1F1B, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(rkm_context_errmsg(ctx), "0 stages") != NULL);
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 0, RKM_PIPE_1F1B, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 2, (rkm_pipe_schedule)7, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    st[1].send_bwd = -1;
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 2, RKM_PIPE_1F1B, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(rkm_context_errmsg(ctx), "stage 1: send_bwd") != NULL);
    st[1].send_bwd = NAN;
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 2, RKM_PIPE_1F1B, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    st[1].send_bwd = 0, st[0].fwd = INFINITY;
    CHECK(rkm_pipeline_simulate(ctx, st, 2, 2, RKM_PIPE_1F1B, NULL, NULL, &t) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(rkm_context_errmsg(ctx), "stage 0: fwd") != NULL);
    CHECK(t == 5); /* untouched by a refused call */
    rkm_context_destroy(ctx);
}

/* An allocator that refuses every request after the first *budget
 * (counted in *test_alloc_calls()), so each of the replay's allocations
 * fails in turn: RKM_ERROR_NOMEM, nothing left allocated, *step_time
 * untouched; with enough, the same step as without the allocator. */
static long long oom_budget;
static void *oom_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    if (new_size > 0 && (!ptr || new_size > old_size) && *test_alloc_calls() >= oom_budget) return NULL;
    return test_count_alloc(user, ptr, old_size, new_size);
}

TEST(out_of_memory_leaves_nothing)
{
    const rkm_pipe_stage st[3] = {{1, 2, 0.25, 0.25}, {1, 2, 0.25, 0.25}, {1, 2, 0.25, 0.25}};
    int32_t k[3];
    double want = -1;
    rkm_context *plain = test_new_ctx();
    CHECK(rkm_pipeline_simulate(plain, st, 3, 4, RKM_PIPE_1F1B, NULL, k, &want) == RKM_OK);
    rkm_context_destroy(plain);
    int ok = 0;
    long long k_calls = 0;
    for (; k_calls < 16 && !ok; k_calls++) {
        oom_budget = LLONG_MAX; /* the context's own allocations */
        rkm_context *ctx = test_new_ctx_alloc(oom_alloc);
        long long live = *test_live_bytes();
        *test_alloc_calls() = 0;
        oom_budget = k_calls;
        double t = -1;
        rkm_result r = rkm_pipeline_simulate(ctx, st, 3, 4, RKM_PIPE_1F1B, NULL, k, &t);
        CHECK(r == RKM_OK || r == RKM_ERROR_NOMEM);
        CHECK(*test_live_bytes() == live);
        if (r == RKM_OK) {
            CHECK(t == want);
            ok = 1;
        } else
            CHECK(t == -1);
        rkm_context_destroy(ctx);
    }
    CHECK(ok && k_calls > 1); /* it allocates, and succeeds once it may */
}

/* ---- a stage's memory with micro-batches in flight ---- */

/* CHAIN2 as a stage (tests/test_sim.c's G_STAGE): x(10, input grad) -f->
 * a(100) -g-> b(200) = output. Its baseline: fwd f, fwd g | loss, free b,
 * bwd g, free_grad b, free a, bwd f, free_grad a; the loss step is 2. */
static const char *G_STAGE = "rockmate-graph 1\n"
                             "tensor x 10 input grad\n"
                             "tensor a 100\n"
                             "tensor b 200\n"
                             "op f fwd=1 bwd=2 in=x out=a saved=x\n"
                             "op g fwd=4 bwd=8 in=a out=b saved=a\n"
                             "output b\n";

static rkm_graph *read_graph(rkm_context *ctx, const char *text)
{
    rkm_graph *g = NULL;
    CHECK(rkm_graph_read_string(ctx, text, strlen(text), "stage.rkg", &g) == RKM_OK);
    return g;
}

/* Every buffer live at once in the stage's order, each micro-batch's kept
 * buffers in its slot, lies inside the arena and apart from the others:
 * the layout is one a device can allocate. Returns the most bytes live. */
static uint64_t check_stage_layout(const rkm_plan *p, rkm_pipe_schedule kind, int32_t stage, int32_t n_stages,
                                   int32_t m, uint64_t align)
{
    size_t nb = rkm_plan_num_buffers(p), ns = rkm_plan_num_steps(p);
    int64_t L = rkm_plan_phase_step(p);
    rkm_buffer *b = calloc(nb + 1, sizeof *b);
    rkm_stage_memory sm;
    CHECK(b && rkm_plan_stage_layout(p, kind, stage, n_stages, m, align, b, &sm) == RKM_OK);
    if (!b) return 0;
    CHECK(sm.alignment == align && sm.arena_bytes == (uint64_t)sm.in_flight * sm.slot_bytes + sm.transient_bytes);
    /* the order: the same as rkm_pipeline_simulate's */
    rkm_context *ctx = test_new_ctx();
    rkm_pipe_stage *st = calloc((size_t)n_stages, sizeof *st);
    rkm_pipe_phase *ph = calloc(2 * (size_t)n_stages * (size_t)m, sizeof *ph);
    double t;
    CHECK(st && ph && rkm_pipeline_simulate(ctx, st, n_stages, m, kind, ph, NULL, &t) == RKM_OK);
    uint64_t *lo = calloc(nb * (size_t)m + 1, sizeof *lo), *hi = calloc(nb * (size_t)m + 1, sizeof *hi), most = 0;
    int *in = calloc((size_t)m + 1, sizeof *in);
    for (int32_t j = 0; ph && lo && hi && in && j < 2 * m; j++) {
        const rkm_pipe_phase *e = &ph[(size_t)stage * 2 * m + j];
        int64_t a = e->bwd ? L : 0, z = e->bwd ? (int64_t)ns : L;
        for (int64_t i = a; i < z; i++) {
            size_t n = 0;
            uint64_t live = 0;
            for (int32_t u = 0; u < m; u++) {
                if (u != e->micro && !in[u]) continue;
                for (size_t k = 0; k < nb; k++) {
                    const rkm_buffer *x = &b[k];
                    int here = u == e->micro ? x->first_step <= i && i <= x->last_step
                                             : x->first_step < L && x->last_step >= L; /* held between its phases */
                    if (!here || !x->bytes) continue;
                    int slot = x->offset < sm.slot_bytes; /* with one in flight, every base is 0 */
                    uint64_t base = slot ? (uint64_t)(u % sm.in_flight) * sm.slot_bytes : 0;
                    if (sm.in_flight > 1) CHECK(slot || x->offset >= (uint64_t)sm.in_flight * sm.slot_bytes);
                    lo[n] = base + x->offset, hi[n] = lo[n] + x->bytes;
                    live += x->bytes;
                    CHECK(hi[n] <= sm.arena_bytes);
                    n++;
                }
            }
            for (size_t u = 0; u < n; u++)
                for (size_t v = u + 1; v < n; v++)
                    if (!(hi[u] <= lo[v] || hi[v] <= lo[u])) {
                        fprintf(stderr, "stage %d: step %lld of micro %d: [%llu,%llu) meets [%llu,%llu)\n", (int)stage,
                                (long long)i, (int)e->micro, (unsigned long long)lo[u], (unsigned long long)hi[u],
                                (unsigned long long)lo[v], (unsigned long long)hi[v]);
                        CHECK(0);
                        u = v = n;
                    }
            if (live > most) most = live;
        }
        in[e->micro] = !e->bwd;
    }
    free(in);
    free(lo);
    free(hi);
    free(st);
    free(ph);
    free(b);
    rkm_context_destroy(ctx);
    return most;
}

/* G_STAGE's baseline by hand: kept 310 (x, a, b before the loss step);
 * the forward phase peaks at 310, the backward at 510 (the loss step:
 * grad(b) arrives). At alignment 1 the slot is x + a + b = 310 (all live
 * at steps 1-2), the transient region grad(b) 200 [2,5] with grad(a) 100
 * [4,8] and grad(x) 10 [7,9] over grad(b)'s bytes after step 5: 300.
 * P = 2, M = 4, 1F1B: stage 0 holds 2 (F0 F1 B0 F2 B1 F3 B2 B3): B0 runs
 * beside F1's 310, so 820; its arena 2 x 310 + 300 = 920. Stage 1 holds
 * one at a time: 510, and its arena is the plan's own, 510 (the split one
 * would be 610). GPipe, M = 4: 3 x 310 + 510 = 1440 in 4 x 310 + 300. */
TEST(stage_memory_by_hand)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = read_graph(ctx, G_STAGE);
    rkm_plan *p = NULL;
    CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
    rkm_stage_memory sm;
    if (p) {
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 0, 2, 4, 1, &sm) == RKM_OK);
        CHECK(sm.in_flight == 2 && sm.kept_bytes == 310 && sm.fwd_peak == 310 && sm.bwd_peak == 510);
        CHECK(sm.peak == 820 && sm.slot_bytes == 310 && sm.transient_bytes == 300 && sm.arena_bytes == 920);
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 1, 2, 4, 0, &sm) == RKM_OK); /* the plan's own: 256 */
        CHECK(sm.in_flight == 1 && sm.peak == 510 && sm.alignment == 256);
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 1, 2, 4, 1, &sm) == RKM_OK);
        CHECK(sm.in_flight == 1 && sm.peak == 510 && sm.arena_bytes == 610); /* laid out anew at 1: split */
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_GPIPE, 0, 2, 4, 1, &sm) == RKM_OK);
        CHECK(sm.in_flight == 4 && sm.peak == 1440 && sm.arena_bytes == 4 * 310 + 300);
        /* one micro-batch: the plan alone */
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 0, 2, 1, 1, &sm) == RKM_OK);
        CHECK(sm.in_flight == 1 && sm.peak == 510);
        for (uint64_t align = 1; align <= 4096; align *= 16) {
            CHECK(check_stage_layout(p, RKM_PIPE_1F1B, 0, 2, 4, align) == 820);
            CHECK(check_stage_layout(p, RKM_PIPE_GPIPE, 0, 2, 4, align) == 1440);
            check_stage_layout(p, RKM_PIPE_1F1B, 1, 2, 4, align);
        }
        /* refusals */
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 2, 2, 4, 1, &sm) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(ctx), "stage 2 of 2") != NULL && sm.peak == 0);
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 0, 2, 0, 1, &sm) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_stage_memory(p, (rkm_pipe_schedule)7, 0, 2, 4, 1, &sm) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(ctx), "unknown schedule 7") != NULL);
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 0, 2, 4, 3, &sm) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(ctx), "alignment 3") != NULL);
        CHECK(rkm_plan_stage_memory(p, RKM_PIPE_1F1B, 0, 2, 4, 1, NULL) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_stage_layout(p, RKM_PIPE_1F1B, 0, 2, 4, 1, NULL, &sm) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_stage_memory(NULL, RKM_PIPE_1F1B, 0, 2, 4, 1, &sm) == RKM_ERROR_ARGUMENT);
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(out_of_memory_leaves_nothing);
    RUN(one_f_one_b_by_hand);
    RUN(transfers_by_hand);
    RUN(uniform_stages_match_the_bubble_formula);
    RUN(replays_respect_every_dependency);
    RUN(bad_inputs_are_refused);
    RUN(stage_memory_by_hand);
    TEST_END();
}
