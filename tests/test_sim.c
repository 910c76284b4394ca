/* test_sim.c -- the simulator, the baseline plan and plan files, against
 * small graphs whose every figure is worked out by hand from docs/formats.md.
 *
 * Times are sums of powers of two, exact in doubles (the bundled graph's are
 * added up in step order, as the simulator does).
 * Where the contract fixes which tensors are freed at a point but not in
 * which order (a run of frees), the baseline is compared with each run
 * sorted by id, and mem_after only where a run ends. */
#include "../src/internal.h"
#include "test.h"

#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static rkm_graph *load(rkm_context *ctx, const char *text)
{
    rkm_graph *g = NULL;
    rkm_result r = rkm_graph_read_string(ctx, text, strlen(text), "hand.rkg", &g);
    if (r != RKM_OK) fprintf(stderr, "hand graph rejected: %s\n", rkm_context_errmsg(ctx));
    CHECK(r == RKM_OK);
    return g;
}

static rkm_plan *plan_text_res(const rkm_graph *g, const char *text, rkm_sim_result *res)
{
    rkm_plan *p = NULL;
    rkm_result r = rkm_plan_read_string(g, text, strlen(text), "hand.rkp", res, &p);
    if (r != RKM_OK) fprintf(stderr, "hand plan rejected: %s\n", rkm_context_errmsg(rkm_graph_context(g)));
    CHECK(r == RKM_OK);
    return p;
}

static rkm_plan *plan_text(const rkm_graph *g, const char *text) { return plan_text_res(g, text, NULL); }

/* Gradient and backward facts through the public info structs. */
static int has_grad_id(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(g, t, &ti) == RKM_OK && ti.has_grad;
}

static int has_bwd_id(const rkm_graph *g, int32_t op)
{
    rkm_op_desc d;
    if (rkm_graph_op_info(g, op, &d) != RKM_OK) return 0;
    for (int32_t k = 0; k < d.n_out; k++)
        if (has_grad_id(g, d.out[k])) return 1;
    return 0;
}

static int tensor_has_grad(const rkm_graph *g, const char *name) { return has_grad_id(g, rkm_graph_find_tensor(g, name)); }
static int op_has_bwd(const rkm_graph *g, const char *name) { return has_bwd_id(g, rkm_graph_find_op(g, name)); }

static int is_free_kind(int32_t k)
{
    return k == RKM_STEP_FREE || k == RKM_STEP_FREE_SAVED || k == RKM_STEP_FREE_GRAD;
}

/* Is step i inside a run of same-kind frees (not its last)? */
static int inside_free_run(const rkm_step *s, size_t n, size_t i)
{
    return is_free_kind(s[i].kind) && i + 1 < n && s[i + 1].kind == s[i].kind;
}

/* Sort each run of same-kind frees by index (insertion sort: runs are short). */
static void sort_free_runs(rkm_step *s, size_t n)
{
    for (size_t i = 1; i < n; i++)
        for (size_t j = i;
             j > 0 && is_free_kind(s[j].kind) && s[j - 1].kind == s[j].kind && s[j - 1].index > s[j].index; j--) {
            rkm_step t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
}

static void print_steps(const char *what, const rkm_plan *p)
{
    char buf[300];
    fprintf(stderr, "  %s:\n", what);
    for (size_t i = 0; i < rkm_plan_num_steps(p); i++) {
        rkm_step_text(rkm_plan_graph(p), &rkm_plan_steps(p)[i], buf, sizeof buf);
        fprintf(stderr, "    %zu %s\n", i, buf);
    }
}

/* The graph's stats and its baseline plan equal the hand-worked figures:
 * the expected steps `text` (a run of frees compared as a set), the peak, its
 * first step, the time, and mem_after. */
static void check_baseline(const rkm_graph *g, uint64_t input_bytes, uint64_t peak, int64_t peak_step, double time,
                           const char *text, const uint64_t *mem, size_t n)
{
    rkm_graph_stats st;
    CHECK(rkm_graph_stats_get(g, &st) == RKM_OK);
    CHECK_EQ_U64(st.input_bytes, input_bytes);
    CHECK_EQ_U64(st.baseline_peak, peak);
    CHECK(st.baseline_time == time);
    CHECK(st.lower_bound >= input_bytes && st.lower_bound <= peak);

    rkm_plan *want = plan_text(g, text);
    rkm_plan *p = NULL;
    CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
    if (!p || !want) goto done;
    CHECK_EQ_U64(rkm_plan_num_steps(p), n);
    CHECK_EQ_U64(rkm_plan_num_steps(want), n);
    if (rkm_plan_num_steps(p) != n || rkm_plan_num_steps(want) != n) {
        print_steps("baseline", p);
        goto done;
    }
    rkm_step *got = malloc(n * sizeof *got), *w = malloc(n * sizeof *w);
    memcpy(got, rkm_plan_steps(p), n * sizeof *got);
    memcpy(w, rkm_plan_steps(want), n * sizeof *w);
    sort_free_runs(got, n);
    sort_free_runs(w, n);
    int same = 1;
    for (size_t i = 0; i < n; i++) {
        if (got[i].kind != w[i].kind || got[i].index != w[i].index || got[i].save != w[i].save ||
            got[i].inplace != w[i].inplace)
            same = 0;
    }
    CHECK(same);
    if (!same) print_steps("baseline", p);

    const uint64_t *after = rkm_plan_mem_after(p);
    for (size_t i = 0; i < n; i++)
        if (!inside_free_run(got, n, i)) CHECK_EQ_U64(after[i], mem[i]);
    rkm_plan_stats ps;
    memset(&ps, 0, sizeof ps);
    CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK);
    CHECK_EQ_U64(ps.peak, peak);
    CHECK(ps.peak_step == peak_step);
    CHECK(ps.time == time);
    CHECK(ps.algo == RKM_ALGO_NONE && ps.budget == peak && ps.overhead == 0);
    CHECK_EQ_U64(ps.baseline_peak, peak);
    free(got);
    free(w);
done:
    rkm_plan_destroy(p);
    rkm_plan_destroy(want);
}

/* A hand-written plan is valid with exactly these figures. */
static void check_hand(const rkm_graph *g, const char *text, uint64_t peak, int64_t peak_step, double time,
                       const uint64_t *mem, size_t n)
{
    rkm_sim_result res;
    rkm_plan *p = plan_text_res(g, text, &res);
    if (!p) return;
    CHECK_EQ_U64(rkm_plan_num_steps(p), n);
    CHECK(res.valid == 1);
    CHECK(res.fail_step == -1);
    CHECK_EQ_U64(res.peak, peak);
    CHECK(res.peak_step == peak_step);
    CHECK(res.time == time);
    CHECK_EQ_U64(res.num_steps, n);
    const uint64_t *after = rkm_plan_mem_after(p), *step_peak = rkm_plan_step_peaks(p);
    uint64_t max = 0;
    if (rkm_plan_num_steps(p) == n)
        for (size_t i = 0; i < n; i++) {
            CHECK_EQ_U64(after[i], mem[i]);
            CHECK(step_peak[i] >= after[i]);
            if (step_peak[i] > max) max = step_peak[i];
        }
    CHECK_EQ_U64(max, peak);
    rkm_plan_stats ps;
    memset(&ps, 0, sizeof ps);
    CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK);
    CHECK_EQ_U64(ps.peak, peak);
    CHECK(ps.peak_step == peak_step);
    CHECK(ps.time == time);
    CHECK_EQ_U64(ps.recomputes, res.recomputes);
    /* no valid plan peaks below the graph's lower bound */
    rkm_graph_stats st;
    CHECK(rkm_graph_stats_get(g, &st) == RKM_OK);
    CHECK(st.lower_bound <= peak);
    rkm_plan_destroy(p);
}

/* ------------------------------------------------------- hand-worked graphs */

/* CHAIN2: x(10, input) -f-> a(100) -g-> b(200) = loss. f saves x, g saves a.
 * Baseline, mem after each step (peak of the step in brackets):
 *  0 fwd f          110 [110]   a is read by g: kept
 *  1 fwd g          310 [310]   a saved by g, b the loss: kept
 *  2 loss           510 [510]   grad(b) +200
 *  3 free b         310         no backward saves b
 *  4 bwd g          410 [410]   grad(a) new +100
 *  5 free_grad b    210
 *  6 free a         110         only f's backward remains; it saves x
 *  7 bwd f          110 [110]   x is an input: no gradient
 *  8 free_grad a     10
 * Peak 510 at step 2; time 1+4+2+8 = 15. */
static const char *G_CHAIN2 = "rockmate-graph 1\n"
                              "tensor x 10 input\n"
                              "tensor a 100\n"
                              "tensor b 200\n"
                              "op f fwd=1 bwd=2 in=x out=a saved=x\n"
                              "op g fwd=4 bwd=8 in=a out=b saved=a\n"
                              "loss b\n";

/* CHAIN2 with a copy link (docs/formats.md, "Offloading"). */
static const char *G_CHAIN2_COPY = "rockmate-graph 1\n"
                                   "copy d2h=100 h2d=100\n"
                                   "tensor x 10 input\n"
                                   "tensor a 100\n"
                                   "tensor b 200\n"
                                   "op f fwd=1 bwd=2 in=x out=a saved=x\n"
                                   "op g fwd=4 bwd=8 in=a out=b saved=a\n"
                                   "loss b\n";

TEST(chain2_baseline)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_CHAIN2);
    if (g) {
        static const uint64_t mem[] = {110, 310, 510, 310, 410, 210, 110, 110, 10};
        check_baseline(g, 10, 510, 2, 15.0,
                       "rockmate-plan 1\nfwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nfree a\nbwd f\n"
                       "free_grad a\n",
                       mem, N_OF(mem));
        rkm_tensor_info ti;
        CHECK(rkm_graph_tensor_info(g, rkm_graph_find_tensor(g, "x"), &ti) == RKM_OK);
        CHECK(ti.has_grad == 0 && ti.producer == -1 && ti.flags == RKM_TENSOR_INPUT);
        CHECK(rkm_graph_tensor_info(g, rkm_graph_find_tensor(g, "b"), &ti) == RKM_OK);
        CHECK(ti.has_grad == 1 && ti.n_contributors == 1 && ti.producer == rkm_graph_find_op(g, "g"));
        CHECK(rkm_graph_loss(g) == rkm_graph_find_tensor(g, "b"));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* STAGE: CHAIN2 as a pipeline stage: x is the stage's input (input grad),
 * b its output. The same baseline steps; bwd f now makes grad(x) (+10),
 * which is live at the end (sent back), so the plan ends at 20, not 10:
 *  0 fwd f 110   1 fwd g 310   2 loss 510 [510] (grad(b) arrives)
 *  3 free b 310  4 bwd g 410   5 free_grad b 210   6 free a 110
 *  7 bwd f 120 [120] (grad(x) new)   8 free_grad a 20
 * The forward phase is steps 0-1; the backward phase starts at the loss
 * step, 2. */
static const char *G_STAGE = "rockmate-graph 1\n"
                             "tensor x 10 input grad\n"
                             "tensor a 100\n"
                             "tensor b 200\n"
                             "op f fwd=1 bwd=2 in=x out=a saved=x\n"
                             "op g fwd=4 bwd=8 in=a out=b saved=a\n"
                             "output b\n";

TEST(stage_graph_hand_worked)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_STAGE);
    if (g) {
        static const uint64_t mem[] = {110, 310, 510, 310, 410, 210, 110, 120, 20};
        check_baseline(g, 10, 510, 2, 15.0,
                       "rockmate-plan 1\nfwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nfree a\nbwd f\n"
                       "free_grad a\n",
                       mem, N_OF(mem));
        int32_t x = rkm_graph_find_tensor(g, "x"), b = rkm_graph_find_tensor(g, "b");
        rkm_tensor_info ti;
        CHECK(rkm_graph_tensor_info(g, x, &ti) == RKM_OK);
        CHECK(ti.has_grad == 1 && ti.n_contributors == 1 && ti.flags == (RKM_TENSOR_INPUT | RKM_TENSOR_INPUT_GRAD));
        CHECK(rkm_graph_loss(g) == b && rkm_graph_output(g) == b);
        rkm_plan *p = NULL;
        CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
        CHECK(rkm_plan_phase_step(p) == 2);
        /* grad(x) lives from bwd f (step 7) to after the last step, as the inputs do */
        size_t n = rkm_plan_num_buffers(p);
        rkm_buffer *bufs = calloc(n ? n : 1, sizeof *bufs);
        uint64_t arena = 0;
        int found = 0;
        CHECK(bufs && rkm_plan_layout(p, 1, bufs, &arena) == RKM_OK);
        for (size_t i = 0; bufs && i < n; i++)
            if (bufs[i].kind == RKM_BUFFER_GRAD && bufs[i].index == x)
                found += bufs[i].first_step == 7 && bufs[i].last_step == 9;
        CHECK(found == 1 && arena >= 510);
        free(bufs);
        rkm_plan_destroy(p);
        /* written and read back: the same graph */
        sbuf text = {NULL, 0, 0};
        CHECK(rkm_graph_write(g, sbuf_write, &text) == RKM_OK && text.data);
        CHECK(text.data && strstr(text.data, "tensor x 10 input grad\n") && strstr(text.data, "\noutput b\n") &&
              !strstr(text.data, "loss"));
        free(text.data);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* CHAIN3: x(10,in) -f1-> a(100) -f2-> b(100) -f3-> c(50) = loss; each op saves
 * its input. Times f1 1/2, f2 4/8, f3 16/32.
 * Baseline:
 *  0 fwd f1 110 [110]   1 fwd f2 210 [210]   2 fwd f3 260 [260]
 *  3 loss 310 [310]     4 free c 260
 *  5 bwd f3 360 [360] (grad b new)          6 free_grad c 310   7 free b 210
 *  8 bwd f2 310 [310] (grad a new)          9 free_grad b 210  10 free a 110
 * 11 bwd f1 110        12 free_grad a 10
 * Peak 360 at step 5, time 63.
 * Hand plan with a recompute: free a after f2 and run f1 again before f2's
 * backward:
 *  0 fwd f1 110   1 fwd f2 210   2 free a 110   3 fwd f3 160   4 loss 210 [210]
 *  5 free c 160   6 bwd f3 260 [260]   7 free_grad c 210   8 free b 110
 *  9 fwd f1 210 [210] (a new again)   10 bwd f2 310 [310]   11 free_grad b 210
 * 12 free a 110  13 bwd f1 110  14 free_grad a 10
 * Peak 310 at step 10, time 63 + 1 = 64. */
static const char *G_CHAIN3 = "rockmate-graph 1\n"
                              "tensor x 10 input\n"
                              "tensor a 100\n"
                              "tensor b 100\n"
                              "tensor c 50\n"
                              "op f1 fwd=1 bwd=2 in=x out=a saved=x\n"
                              "op f2 fwd=4 bwd=8 in=a out=b saved=a\n"
                              "op f3 fwd=16 bwd=32 in=b out=c saved=b\n"
                              "loss c\n";

TEST(chain3_recompute)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_CHAIN3);
    if (g) {
        static const uint64_t base[] = {110, 210, 260, 310, 260, 360, 310, 210, 310, 210, 110, 110, 10};
        check_baseline(g, 10, 360, 5, 63.0,
                       "rockmate-plan 1\nfwd f1\nfwd f2\nfwd f3\nloss\nfree c\nbwd f3\nfree_grad c\nfree b\n"
                       "bwd f2\nfree_grad b\nfree a\nbwd f1\nfree_grad a\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {110, 210, 110, 160, 210, 160, 260, 210, 110, 210, 310, 210, 110, 110, 10};
        check_hand(g,
                   "rockmate-plan 1\nfwd f1\nfwd f2\nfree a\nfwd f3\nloss\nfree c\nbwd f3\nfree_grad c\nfree b\n"
                   "fwd f1\nbwd f2\nfree_grad b\nfree a\nbwd f1\nfree_grad a\n",
                   310, 10, 64.0, hand, N_OF(hand));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* PHANTOM: x(8,in) -a-> h(64) -b-> y(32) = loss. a saves x and has phantom 16,
 * b saves nothing but has phantom 128 (a dropout mask). Times a .5/1,
 * b .25/.5.
 * Baseline:
 *  0 fwd a save  88 [88]  (+64 +16)
 *  1 fwd b save 248 [248] (+32 +128)
 *  2 free h     184       no backward saves h
 *  3 loss       216 [216]  4 free y 184
 *  5 bwd b      248 [248] (grad h new)   6 free_saved b 120   7 free_grad y 88
 *  8 bwd a       88        9 free_saved a 72   10 free_grad h 8
 * Peak 248 first at step 1, time 2.25.
 * Hand plan: b runs without save first, and with save (a recompute) only
 * once the loss is done:
 *  0 fwd a save 88   1 fwd b 120 [120]   2 loss 152 [152]   3 free y 120
 *  4 fwd b save 280 [280] (y new +32, phantom +128)   5 free y 248
 *  6 free h 184   7 bwd b 248 [248]   8 free_saved b 120   9 free_grad y 88
 * 10 bwd a 88   11 free_saved a 72   12 free_grad h 8
 * Peak 280 at step 4, time .5+.25+.25+.5+1 = 2.5.
 * Hand plan 2: `fwd b save` while y is still live recomputes y in place and
 * only adds the phantom:
 *  0 fwd a save 88  1 fwd b 120  2 loss 152  3 fwd b save 280 [280]
 *  4 free y 248  5 free h 184  6 bwd b 248  7 free_saved b 120
 *  8 free_grad y 88  9 bwd a 88  10 free_saved a 72  11 free_grad h 8
 * Peak 280 at step 3, time 2.5.
 * Hand plan 3: `fwd a` without save while a's saved state is live is a
 * recompute that leaves the saved state alone (h is live: nothing new):
 *  0 fwd a save 88  1 fwd a 88 [88]  2 fwd b save 248 [248]  then as the
 *  baseline from its step 2: 184 216 184 248 120 88 88 72 8
 * Peak 248 at step 2, time 2.25 + .5 = 2.75. */
static const char *G_PHANTOM = "rockmate-graph 1\n"
                               "tensor x 8 input\n"
                               "tensor h 64\n"
                               "tensor y 32\n"
                               "op a fwd=0.5 bwd=1 in=x out=h saved=x phantom=16\n"
                               "op b fwd=0.25 bwd=0.5 in=h out=y phantom=128\n"
                               "loss y\n";

TEST(phantom_save_free_saved)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_PHANTOM);
    if (g) {
        static const uint64_t base[] = {88, 248, 184, 216, 184, 248, 120, 88, 88, 72, 8};
        check_baseline(g, 8, 248, 1, 2.25,
                       "rockmate-plan 1\nfwd a save\nfwd b save\nfree h\nloss\nfree y\nbwd b\nfree_saved b\n"
                       "free_grad y\nbwd a\nfree_saved a\nfree_grad h\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {88, 120, 152, 120, 280, 248, 184, 248, 120, 88, 88, 72, 8};
        check_hand(g,
                   "rockmate-plan 1\nfwd a save\nfwd b\nloss\nfree y\nfwd b save\nfree y\nfree h\nbwd b\n"
                   "free_saved b\nfree_grad y\nbwd a\nfree_saved a\nfree_grad h\n",
                   280, 4, 2.5, hand, N_OF(hand));
        static const uint64_t hand2[] = {88, 120, 152, 280, 248, 184, 248, 120, 88, 88, 72, 8};
        check_hand(g,
                   "rockmate-plan 1\nfwd a save\nfwd b\nloss\nfwd b save\nfree y\nfree h\nbwd b\n"
                   "free_saved b\nfree_grad y\nbwd a\nfree_saved a\nfree_grad h\n",
                   280, 3, 2.5, hand2, N_OF(hand2));
        static const uint64_t hand3[] = {88, 88, 248, 184, 216, 184, 248, 120, 88, 88, 72, 8};
        check_hand(g,
                   "rockmate-plan 1\nfwd a save\nfwd a\nfwd b save\nfree h\nloss\nfree y\nbwd b\nfree_saved b\n"
                   "free_grad y\nbwd a\nfree_saved a\nfree_grad h\n",
                   248, 2, 2.75, hand3, N_OF(hand3));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* ACCUM: a(40) is read by q and r, so grad(a) has two contributors.
 * x(4,in) -p-> a; a -q-> b(20); a -r-> c(30); b,c -s-> d(10) = loss.
 * p saves x, q and r save a, s saves b,c. Times p 1/1, q 2/2, r 4/4, s 8/8.
 * Baseline:
 *  0 fwd p 44   1 fwd q 64   2 fwd r 94   3 fwd s 104   4 loss 114 [114]
 *  5 free d 104   6 bwd s 154 [154] (grads b, c new)   7 free_grad d 144
 *  8 free b 124   9 free c 94 (only r, q, p remain; they save a and x)
 * 10 bwd r 134 [134] (grad a new)   11 free_grad c 104
 * 12 bwd q 104 (grad a accumulated: nothing new)   13 free_grad b 84
 * 14 free a 44   15 bwd p 44   16 free_grad a 4
 * Peak 154 at step 6, time 30.
 * Hand plan, backwards in the other order and frees kept late: q's backward
 * makes grad(a), r's accumulates into it.
 *  0..5 as above (44 64 94 104 114 104)   6 bwd s 154 [154]   7 free_grad d 144
 *  8 bwd q 184 [184] (grad a new)   9 free_grad b 164   10 free b 144
 * 11 bwd r 144   12 free_grad c 114   13 free c 84   14 free a 44
 * 15 bwd p 44   16 free_grad a 4
 * Peak 184 at step 8, time 30. */
static const char *G_ACCUM = "rockmate-graph 1\n"
                             "tensor x 4 input\n"
                             "tensor a 40\n"
                             "tensor b 20\n"
                             "tensor c 30\n"
                             "tensor d 10\n"
                             "op p fwd=1 bwd=1 in=x out=a saved=x\n"
                             "op q fwd=2 bwd=2 in=a out=b saved=a\n"
                             "op r fwd=4 bwd=4 in=a out=c saved=a\n"
                             "op s fwd=8 bwd=8 in=b,c out=d saved=b,c\n"
                             "loss d\n";

TEST(accumulation_two_readers)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_ACCUM);
    if (g) {
        static const uint64_t base[] = {44, 64, 94, 104, 114, 104, 154, 144, 124, 94, 134, 104, 104, 84, 44, 44, 4};
        check_baseline(g, 4, 154, 6, 30.0,
                       "rockmate-plan 1\nfwd p\nfwd q\nfwd r\nfwd s\nloss\nfree d\nbwd s\nfree_grad d\nfree b\nfree c\n"
                       "bwd r\nfree_grad c\nbwd q\nfree_grad b\nfree a\nbwd p\nfree_grad a\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {44, 64, 94, 104, 114, 104, 154, 144, 184, 164, 144, 144, 114, 84, 44, 44, 4};
        check_hand(g,
                   "rockmate-plan 1\nfwd p\nfwd q\nfwd r\nfwd s\nloss\nfree d\nbwd s\nfree_grad d\nbwd q\n"
                   "free_grad b\nfree b\nbwd r\nfree_grad c\nfree c\nfree a\nbwd p\nfree_grad a\n",
                   184, 8, 30.0, hand, N_OF(hand));
        rkm_tensor_info ti;
        CHECK(rkm_graph_tensor_info(g, rkm_graph_find_tensor(g, "a"), &ti) == RKM_OK);
        CHECK(ti.has_grad == 1 && ti.n_contributors == 2);
        CHECK(rkm_graph_tensor_info(g, rkm_graph_find_tensor(g, "d"), &ti) == RKM_OK);
        CHECK(ti.has_grad == 1 && ti.n_contributors == 1);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* MULTI: a multi-output op with a forward workspace, a reader with a backward
 * workspace. x(16,in) -split-> u(32), v(64); u,v -join-> w(8) = loss.
 * split saves x, fwd_ws 100; join saves u only, bwd_ws 50. Times 1/2, 4/8.
 * Baseline:
 *  0 fwd split 112 [16+96+100 = 212]   1 fwd join 120 [120]
 *  2 free v 56 (join saves u only)     3 loss 64 [64]   4 free w 56
 *  5 bwd join 152 [56+96+50 = 202] (grads u, v new)   6 free_grad w 144
 *  7 free u 112   8 bwd split 112   9 free_grad u 80   10 free_grad v 16
 * Peak 212 at step 0, time 15.
 * Hand plan: before join's backward, split runs again while u is still live:
 * u is recomputed in place (no new memory), only v is new.
 *  0..4 as above (112 120 56 64 56)
 *  5 fwd split 120 [56+64+100 = 220]   6 bwd join 216 [120+96+50 = 266]
 *  7 free_grad w 208   8 free u 176   9 free v 112   10 bwd split 112
 * 11 free_grad u 80   12 free_grad v 16
 * Peak 266 at step 6, time 1+4+1+8+2 = 16. */
static const char *G_MULTI = "rockmate-graph 1\n"
                             "tensor x 16 input\n"
                             "tensor u 32\n"
                             "tensor v 64\n"
                             "tensor w 8\n"
                             "op split fwd=1 bwd=2 in=x out=u,v saved=x fwd_ws=100\n"
                             "op join fwd=4 bwd=8 in=u,v out=w saved=u bwd_ws=50\n"
                             "loss w\n";

TEST(multi_output_workspaces_inplace)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_MULTI);
    if (g) {
        static const uint64_t base[] = {112, 120, 56, 64, 56, 152, 144, 112, 112, 80, 16};
        check_baseline(g, 16, 212, 0, 15.0,
                       "rockmate-plan 1\nfwd split\nfwd join\nfree v\nloss\nfree w\nbwd join\nfree_grad w\nfree u\n"
                       "bwd split\nfree_grad u\nfree_grad v\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {112, 120, 56, 64, 56, 120, 216, 208, 176, 112, 112, 80, 16};
        check_hand(g,
                   "rockmate-plan 1\nfwd split\nfwd join\nfree v\nloss\nfree w\nfwd split\nbwd join\nfree_grad w\n"
                   "free u\nfree v\nbwd split\nfree_grad u\nfree_grad v\n",
                   266, 6, 16.0, hand, N_OF(hand));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* NOGRAD: idx(5) is an input marked nograd too; mask makes m(20, nograd) from
 * it, so mask has no backward (its phantom 4 is never saved); lin makes h(40)
 * from x(10,in); apply reads h and m, saves only m, makes y(8) = loss.
 * Times mask 1/1, lin 2/4, apply 8/16. Inputs: 15 bytes.
 * Baseline:
 *  0 fwd mask 35   1 fwd lin 75   2 fwd apply 83 [83]   3 free h 43
 *  4 loss 51 [51]   5 free y 43   6 bwd apply 83 [83] (grad h new, m has none)
 *  7 free_grad y 75   8 free m 55   9 bwd lin 55   10 free_grad h 15
 * Peak 83 first at step 2, time 1+2+8+16+4 = 31.
 * Hand plan: free m and h before the loss, recompute the mask (an op with no
 * backward) for apply's backward:
 *  0 fwd mask 35  1 fwd lin 75  2 fwd apply 83 [83]  3 free m 63  4 free h 23
 *  5 loss 31  6 free y 23  7 fwd mask 43  8 bwd apply 83 [83]
 *  9 free_grad y 75  10 free m 55  11 bwd lin 55  12 free_grad h 15
 * Peak 83 first at step 2, time 31 + 1 = 32. */
static const char *G_NOGRAD = "rockmate-graph 1\n"
                              "tensor x 10 input\n"
                              "tensor idx 5 input nograd\n"
                              "tensor m 20 nograd\n"
                              "tensor h 40\n"
                              "tensor y 8\n"
                              "op mask fwd=1 bwd=1 in=idx out=m phantom=4\n"
                              "op lin fwd=2 bwd=4 in=x out=h saved=x\n"
                              "op apply fwd=8 bwd=16 in=h,m out=y saved=m\n"
                              "loss y\n";

TEST(nograd)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_NOGRAD);
    if (g) {
        static const uint64_t base[] = {35, 75, 83, 43, 51, 43, 83, 75, 55, 55, 15};
        check_baseline(g, 15, 83, 2, 31.0,
                       "rockmate-plan 1\nfwd mask\nfwd lin\nfwd apply\nfree h\nloss\nfree y\nbwd apply\nfree_grad y\n"
                       "free m\nbwd lin\nfree_grad h\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {35, 75, 83, 63, 23, 31, 23, 43, 83, 75, 55, 55, 15};
        check_hand(g,
                   "rockmate-plan 1\nfwd mask\nfwd lin\nfwd apply\nfree m\nfree h\nloss\nfree y\nfwd mask\n"
                   "bwd apply\nfree_grad y\nfree m\nbwd lin\nfree_grad h\n",
                   83, 2, 32.0, hand, N_OF(hand));
        CHECK(op_has_bwd(g, "mask") == 0);
        CHECK(op_has_bwd(g, "lin") == 1);
        CHECK(tensor_has_grad(g, "m") == 0);
        CHECK(tensor_has_grad(g, "idx") == 0);
        CHECK(tensor_has_grad(g, "h") == 1);
        rkm_tensor_info ti;
        CHECK(rkm_graph_tensor_info(g, rkm_graph_find_tensor(g, "idx"), &ti) == RKM_OK);
        CHECK(ti.flags == (RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* INPUTS: a big input (1000) read late still counts from the first step; gen
 * has no `in` at all. gen -> z(10); z,big -f-> a(20), f saves big;
 * a -g-> b(4) = loss, g saves a. Times gen 1/2, f 4/8, g 16/32.
 * Baseline:
 *  0 fwd gen 1010   1 fwd f 1030   2 free z 1020   3 fwd g 1024
 *  4 loss 1028   5 free b 1024   6 bwd g 1044 [1044] (grad a new)
 *  7 free_grad b 1040   8 free a 1020   9 bwd f 1030 [1030] (grad z new)
 * 10 free_grad a 1010  11 bwd gen 1010  12 free_grad z 1000
 * Peak 1044 at step 6, time 63.
 * Hand plan, everything freed as early as possible and recomputed:
 *  0 fwd gen 1010  1 fwd f 1030  2 free z 1020  3 fwd g 1024  4 free a 1004
 *  5 loss 1008  6 free b 1004  7 fwd gen 1014  8 fwd f 1034  9 free z 1024
 * 10 bwd g 1044 [1044]  11 free_grad b 1040  12 free a 1020
 * 13 bwd f 1030 [1030]  14 free_grad a 1010  15 bwd gen 1010  16 free_grad z 1000
 * Peak 1044 at step 10: the input is never freed. Time 63 + 1 + 4 = 68. */
static const char *G_INPUTS = "rockmate-graph 1\n"
                              "tensor big 1000 input\n"
                              "tensor z 10\n"
                              "tensor a 20\n"
                              "tensor b 4\n"
                              "op gen fwd=1 bwd=2 out=z\n"
                              "op f fwd=4 bwd=8 in=z,big out=a saved=big\n"
                              "op g fwd=16 bwd=32 in=a out=b saved=a\n"
                              "loss b\n";

TEST(inputs_counted_all_the_time)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_INPUTS);
    if (g) {
        static const uint64_t base[] = {1010, 1030, 1020, 1024, 1028, 1024, 1044,
                                        1040, 1020, 1030, 1010, 1010, 1000};
        check_baseline(g, 1000, 1044, 6, 63.0,
                       "rockmate-plan 1\nfwd gen\nfwd f\nfree z\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nfree a\n"
                       "bwd f\nfree_grad a\nbwd gen\nfree_grad z\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {1010, 1030, 1020, 1024, 1004, 1008, 1004, 1014, 1034,
                                        1024, 1044, 1040, 1020, 1030, 1010, 1010, 1000};
        check_hand(g,
                   "rockmate-plan 1\nfwd gen\nfwd f\nfree z\nfwd g\nfree a\nloss\nfree b\nfwd gen\nfwd f\nfree z\n"
                   "bwd g\nfree_grad b\nfree a\nbwd f\nfree_grad a\nbwd gen\nfree_grad z\n",
                   1044, 10, 68.0, hand, N_OF(hand));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* SAVED_BOTH: a(50) is saved by its producer f and by its reader g.
 * x(2,in) -f-> a -g-> b(30) = loss. Times f 1/2, g 4/8.
 * Baseline:
 *  0 fwd f 52   1 fwd g 82   2 loss 112 [112]   3 free b 82
 *  4 bwd g 132 [132] (grad a new)   5 free_grad b 102 (f still needs a)
 *  6 bwd f 102   7 free_grad a 52   8 free a 2
 * Peak 132 at step 4, time 15.
 * Hand plan: a freed before the loss, recomputed for g's backward and kept for
 * f's:
 *  0 fwd f 52  1 fwd g 82  2 free a 32  3 loss 62  4 free b 32
 *  5 fwd f 82 [82]  6 bwd g 132 [132]  7 free_grad b 102  8 bwd f 102
 *  9 free_grad a 52  10 free a 2
 * Peak 132 at step 6, time 16. */
static const char *G_SAVED_BOTH = "rockmate-graph 1\n"
                                  "tensor x 2 input\n"
                                  "tensor a 50\n"
                                  "tensor b 30\n"
                                  "op f fwd=1 bwd=2 in=x out=a saved=a\n"
                                  "op g fwd=4 bwd=8 in=a out=b saved=a\n"
                                  "loss b\n";

TEST(saved_by_producer_and_reader)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_SAVED_BOTH);
    if (g) {
        static const uint64_t base[] = {52, 82, 112, 82, 132, 102, 102, 52, 2};
        check_baseline(g, 2, 132, 4, 15.0,
                       "rockmate-plan 1\nfwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nbwd f\nfree_grad a\nfree a\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {52, 82, 32, 62, 32, 82, 132, 102, 102, 52, 2};
        check_hand(g,
                   "rockmate-plan 1\nfwd f\nfwd g\nfree a\nloss\nfree b\nfwd f\nbwd g\nfree_grad b\nbwd f\n"
                   "free_grad a\nfree a\n",
                   132, 6, 16.0, hand, N_OF(hand));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* LOSS_SAVED: the loss L(3) is saved by its own producer's backward.
 * x(6,in) -f-> h(12) -xent-> L; xent saves h and L. Times 1/1, 2/2.
 * Baseline:
 *  0 fwd f 18   1 fwd xent 21   2 loss 24 [24] (L kept: xent's backward needs it)
 *  3 bwd xent 36 [36] (grad h new)   4 free_grad L 33   5 free h 21   6 free L 18
 *  7 bwd f 18   8 free_grad h 6
 * Peak 36 at step 3, time 6.
 * Hand plan: L freed right after the loss step and recomputed:
 *  0 fwd f 18  1 fwd xent 21  2 loss 24  3 free L 21  4 fwd xent 24 [24]
 *  5 bwd xent 36 [36]  6 free_grad L 33  7 free L 30  8 free h 18
 *  9 bwd f 18  10 free_grad h 6
 * Peak 36 at step 5, time 8. */
static const char *G_LOSS_SAVED = "rockmate-graph 1\n"
                                  "tensor x 6 input\n"
                                  "tensor h 12\n"
                                  "tensor L 3\n"
                                  "op f fwd=1 bwd=1 in=x out=h saved=x\n"
                                  "op xent fwd=2 bwd=2 in=h out=L saved=h,L\n"
                                  "loss L\n";

TEST(loss_read_by_backward)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_LOSS_SAVED);
    if (g) {
        static const uint64_t base[] = {18, 21, 24, 36, 33, 21, 18, 18, 6};
        check_baseline(g, 6, 36, 3, 6.0,
                       "rockmate-plan 1\nfwd f\nfwd xent\nloss\nbwd xent\nfree_grad L\nfree h\nfree L\nbwd f\n"
                       "free_grad h\n",
                       base, N_OF(base));
        static const uint64_t hand[] = {18, 21, 24, 21, 24, 36, 33, 30, 18, 18, 6};
        check_hand(g,
                   "rockmate-plan 1\nfwd f\nfwd xent\nloss\nfree L\nfwd xent\nbwd xent\nfree_grad L\nfree L\n"
                   "free h\nbwd f\nfree_grad h\n",
                   36, 5, 8.0, hand, N_OF(hand));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* POOL: a three-output op: y(40) has a gradient, ix(10) is nograd, spare(7)
 * is read by nobody (no gradient, freed at once). x(100,in) -pool-> y,ix,spare
 * (saves ix); y,ix -head-> z(5) = loss (saves y, ix). Times 1/2, 4/8.
 * Baseline:
 *  0 fwd pool 157 [157]   1 free spare 150   2 fwd head 155   3 loss 160
 *  4 free z 155   5 bwd head 195 [195] (grad y new; ix has none)
 *  6 free_grad z 190   7 free y 150 (pool saves ix only)   8 bwd pool 150
 *  9 free_grad y 110   10 free ix 100
 * Peak 195 at step 5, time 15. */
static const char *G_POOL = "rockmate-graph 1\n"
                            "tensor x 100 input\n"
                            "tensor y 40\n"
                            "tensor ix 10 nograd\n"
                            "tensor spare 7\n"
                            "tensor z 5\n"
                            "op pool fwd=1 bwd=2 in=x out=y,ix,spare saved=ix\n"
                            "op head fwd=4 bwd=8 in=y,ix out=z saved=y,ix\n"
                            "loss z\n";

TEST(unread_and_nograd_outputs)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_POOL);
    if (g) {
        static const uint64_t base[] = {157, 150, 155, 160, 155, 195, 190, 150, 150, 110, 100};
        check_baseline(g, 100, 195, 5, 15.0,
                       "rockmate-plan 1\nfwd pool\nfree spare\nfwd head\nloss\nfree z\nbwd head\nfree_grad z\nfree y\n"
                       "bwd pool\nfree_grad y\nfree ix\n",
                       base, N_OF(base));
        CHECK(tensor_has_grad(g, "spare") == 0);
        CHECK(tensor_has_grad(g, "ix") == 0);
        CHECK(tensor_has_grad(g, "y") == 1);
        CHECK(op_has_bwd(g, "pool") == 1);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* NOBWD_SAVED: cmp has a saved= list but no backward (its only output is
 * nograd), so what it saves keeps nothing alive.
 * x(10,in) -f-> a(20), f saves x; a -cmp-> m(5, nograd), cmp saves a;
 * a,m -use-> y(8) = loss, use saves m. Times f 1/2, cmp 4/8, use 16/32.
 * Baseline:
 *  0 fwd f 30   1 fwd cmp 35   2 fwd use 43 [43]   3 free a 23 (only cmp,
 *  which has no backward, saves it)   4 loss 31   5 free y 23
 *  6 bwd use 43 [43] (grad a new; m has none)   7 free_grad y 35
 *  8 free m 30   9 bwd f 30   10 free_grad a 10
 * Peak 43 first at step 2, time 1+4+16+32+2 = 55. */
static const char *G_NOBWD_SAVED = "rockmate-graph 1\n"
                                   "tensor x 10 input\n"
                                   "tensor a 20\n"
                                   "tensor m 5 nograd\n"
                                   "tensor y 8\n"
                                   "op f fwd=1 bwd=2 in=x out=a saved=x\n"
                                   "op cmp fwd=4 bwd=8 in=a out=m saved=a\n"
                                   "op use fwd=16 bwd=32 in=a,m out=y saved=m\n"
                                   "loss y\n";

TEST(saved_by_op_without_backward)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_NOBWD_SAVED);
    if (g) {
        static const uint64_t base[] = {30, 35, 43, 23, 31, 23, 43, 35, 30, 30, 10};
        check_baseline(g, 10, 43, 2, 55.0,
                       "rockmate-plan 1\nfwd f\nfwd cmp\nfwd use\nfree a\nloss\nfree y\nbwd use\nfree_grad y\n"
                       "free m\nbwd f\nfree_grad a\n",
                       base, N_OF(base));
        CHECK(op_has_bwd(g, "cmp") == 0);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* The bundled multi-output.rkg, worked by hand from its text. Inputs x and
 * pos: 4608 bytes. causal makes the nograd mask: no backward. scores,
 * dropout and norm keep phantoms (2048, 1024, 256). h is read by split and
 * residual, r by norm and head: two contributors each.
 *  0 fwd embed        8704          23 free r           37376
 *  1 fwd split       20992 [23040]  24 bwd residual     45568 (grads h, drop new)
 *  2 fwd causal      22016          25 free_grad r      41472
 *  3 fwd scores save 32256          26 bwd dropout      45568 (grad a new)
 *  4 fwd attend      36352          27 free_saved dropout 44544
 *  5 fwd dropout save 41472         28 free_grad drop   40448
 *  6 free a          37376          29 bwd attend       52736 (grads s, v new)
 *  7 fwd residual    41472          30 free_grad a      48640
 *  8 free drop       37376          31 free s           40448
 *  9 fwd norm save   41728          32 free v           36352
 * 10 fwd head        43776          33 bwd scores       44544 [+8192 ws = 52736]
 * 11 fwd xent        43780          34 free_saved scores 42496
 * 12 loss            43784          35 free_grad s      34304
 * 13 free loss       43780          36 free q           30208
 * 14 bwd xent        45828          37 free k           26112
 * 15 free_grad loss  45824          38 free mask        25088
 * 16 free out        43776          39 bwd split        25088 (grad h accumulated)
 * 17 bwd head        51968 (grads n, r new)   40..42 free_grad q k v 20992 16896 12800
 * 18 free_grad out   49920          43 free h            8704
 * 19 free n          45824          44 bwd embed         8704
 * 20 bwd norm        45824 (grad r accumulated)   45 free_grad h 4608
 * 21 free_saved norm 45568
 * 22 free_grad n     41472
 * Peak 52736 first at step 29. Time: the fwd and bwd seconds in step order. */
TEST(bundled_multi_output_by_hand)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL;
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/multi-output.rkg", &g) == RKM_OK);
    if (g) {
        static const uint64_t base[] = {8704,  20992, 22016, 32256, 36352, 41472, 37376, 41472, 37376, 41728,
                                        43776, 43780, 43784, 43780, 45828, 45824, 43776, 51968, 49920, 45824,
                                        45824, 45568, 41472, 37376, 45568, 41472, 45568, 44544, 40448, 52736,
                                        48640, 40448, 36352, 44544, 42496, 34304, 30208, 26112, 25088, 25088,
                                        20992, 16896, 12800, 8704,  8704,  4608};
        const double time = 1e-5 + 3e-5 + 1e-6 + 2e-5 + 2e-5 + 5e-6 + 2e-6 + 8e-6 + 1e-5 + 3e-6 + /* forwards */
                            3e-6 + 2e-5 + 1.6e-5 + 2e-6 + 5e-6 + 4e-5 + 4e-5 + 6e-5 + 2e-5;   /* backwards */
        check_baseline(g, 4608, 52736, 29, time,
                       "rockmate-plan 1\nfwd embed\nfwd split\nfwd causal\nfwd scores save\nfwd attend\n"
                       "fwd dropout save\nfree a\nfwd residual\nfree drop\nfwd norm save\nfwd head\nfwd xent\n"
                       "loss\nfree loss\nbwd xent\nfree_grad loss\nfree out\nbwd head\nfree_grad out\nfree n\n"
                       "bwd norm\nfree_saved norm\nfree_grad n\nfree r\nbwd residual\nfree_grad r\nbwd dropout\n"
                       "free_saved dropout\nfree_grad drop\nbwd attend\nfree_grad a\nfree s\nfree v\nbwd scores\n"
                       "free_saved scores\nfree_grad s\nfree q\nfree k\nfree mask\nbwd split\nfree_grad q\n"
                       "free_grad k\nfree_grad v\nfree h\nbwd embed\nfree_grad h\n",
                       base, N_OF(base));
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* New costs make a new graph whose figures follow them (MULTI with split's
 * fwd_ws 100 -> 300 peaks at step 0 with 16 + 96 + 300 = 412; join's fwd
 * 4 -> 0.5 makes the time 11.5); the old graph and its plans keep theirs. */
TEST(costs_make_a_new_graph)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_MULTI), *g2 = NULL;
    rkm_plan *p = NULL;
    if (g && rkm_plan_baseline(g, &p) == RKM_OK) {
        int32_t n = rkm_graph_num_ops(g);
        rkm_op_costs *costs = calloc((size_t)n, sizeof *costs);
        for (int32_t i = 0; i < n; i++) {
            rkm_op_desc d;
            CHECK(rkm_graph_op_info(g, i, &d) == RKM_OK);
            costs[i] = (rkm_op_costs){d.fwd_seconds, d.bwd_seconds, d.fwd_ws, d.bwd_ws};
        }
        costs[rkm_graph_find_op(g, "split")] = (rkm_op_costs){1, 2, 300, 0};
        costs[rkm_graph_find_op(g, "join")] = (rkm_op_costs){0.5, 8, 0, 50};
        CHECK(rkm_graph_with_costs(g, costs, &g2) == RKM_OK);
        static const uint64_t base[] = {112, 120, 56, 64, 56, 152, 144, 112, 112, 80, 16};
        if (g2)
            check_baseline(g2, 16, 412, 0, 11.5,
                           "rockmate-plan 1\nfwd split\nfwd join\nfree v\nloss\nfree w\nbwd join\nfree_grad w\nfree u\n"
                           "bwd split\nfree_grad u\nfree_grad v\n",
                           base, N_OF(base));
        rkm_plan_stats ps;
        memset(&ps, 0, sizeof ps);
        CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK);
        CHECK_EQ_U64(ps.peak, 212);
        CHECK(ps.time == 15.0);
        rkm_graph_stats st;
        CHECK(rkm_graph_stats_get(g, &st) == RKM_OK);
        CHECK_EQ_U64(st.baseline_peak, 212);
        CHECK(st.baseline_time == 15.0);
        /* the 64-bit rule holds for new costs too, and NULL costs are refused */
        rkm_graph *g3 = NULL;
        costs[0].fwd_ws = UINT64_MAX;
        CHECK(rkm_graph_with_costs(g, costs, &g3) == RKM_ERROR_GRAPH && g3 == NULL);
        CHECK(strstr(rkm_context_errmsg(ctx), "64 bits") != NULL);
        costs[0].fwd_ws = 0;
        costs[0].fwd_seconds = NAN;
        CHECK(rkm_graph_with_costs(g, costs, &g3) == RKM_ERROR_GRAPH && g3 == NULL);
        CHECK(rkm_graph_with_costs(g, NULL, &g3) == RKM_ERROR_ARGUMENT && g3 == NULL);
        free(costs);
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g2);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Plans made from a step array give the same figures as the same plan read
 * from text (CHAIN2's baseline, by ids); out-of-range steps are refused. */
TEST(plan_create_matches_text)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_CHAIN2);
    rkm_plan *p = NULL;
    if (g) {
        int32_t f = rkm_graph_find_op(g, "f"), gg = rkm_graph_find_op(g, "g");
        int32_t a = rkm_graph_find_tensor(g, "a"), b = rkm_graph_find_tensor(g, "b");
        const rkm_step steps[] = {{RKM_STEP_FWD, f, 0, 0},       {RKM_STEP_FWD, gg, 0, 0},       {RKM_STEP_LOSS, b, 0, 0},
                                  {RKM_STEP_FREE, b, 0, 0},      {RKM_STEP_BWD, gg, 0, 0},       {RKM_STEP_FREE_GRAD, b, 0, 0},
                                  {RKM_STEP_FREE, a, 0, 0},      {RKM_STEP_BWD, f, 0, 0},        {RKM_STEP_FREE_GRAD, a, 0, 0}};
        rkm_sim_result res;
        CHECK(rkm_plan_create(g, steps, N_OF(steps), &res, &p) == RKM_OK);
        CHECK(res.valid && res.peak == 510 && res.time == 15.0);
        CHECK(rkm_plan_num_steps(p) == N_OF(steps));
        CHECK(rkm_plan_graph(p) == g);
        rkm_plan_stats ps;
        memset(&ps, 0xff, sizeof ps);
        CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK);
        CHECK(ps.peak == 510 && ps.time == 15.0 && ps.budget == 0 && ps.algo == RKM_ALGO_NONE);
        /* Out-of-range steps are refused with the rule, and no plan is made. */
        const rkm_step bad[] = {{RKM_STEP_FWD, 2, 0, 0}, {RKM_STEP_FWD, -1, 0, 0}, {RKM_STEP_FREE, 3, 0, 0},
                                {RKM_STEP_LOSS, a, 0, 0}, {10, 0, 0, 0},         {RKM_STEP_FWD, f, 2, 0}};
        for (size_t i = 0; i < N_OF(bad); i++) {
            rkm_plan *q = (rkm_plan *)1;
            CHECK(rkm_plan_create(g, &bad[i], 1, &res, &q) == RKM_ERROR_PLAN && q == NULL);
            CHECK(res.rule == RKM_RULE_BAD_STEP && res.fail_step == 0 && !res.valid);
        }
        rkm_plan *q = (rkm_plan *)1;
        CHECK(rkm_plan_create(g, NULL, 1, &res, &q) == RKM_ERROR_ARGUMENT && q == NULL);
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* INPLACE: x(100, input) -fc-> h(1000) -relu-> a(1000) -fc2-> b(1000);
 * add(b, a) -> s(1000) -ce-> loss(4) = loss. relu runs in place (a over h)
 * and its backward too (grad(h) over grad(a)); add writes s over b and
 * grad(b) over grad(s) (a residual add: the gradient passes through).
 * fc saves x, relu a, fc2 a, ce s and keeps a phantom of 200 with fwd_ws 100.
 * Baseline (the plain plan, run in place where it then frees the input),
 * mem after each step [peak during it]:
 *  0 fwd fc               1100 [1100]
 *  1 fwd relu inplace     1100 [1100]  a takes h's bytes; no `free h`
 *  2 fwd fc2              2100 [2100]
 *  3 fwd add inplace      2100 [2100]  s takes b's bytes; no `free b`
 *  4 fwd ce save          2304 [2404]  loss 4, phantom 200, ws 100
 *  5 loss                 2308 [2308]
 *  6 free loss            2304
 *  7 bwd ce               3304 [3304]  grad(s) new
 *  8 free_saved ce        3104
 *  9 free_grad loss       3100
 * 10 free s               2100
 * 11 bwd add inplace      3100 [3100]  grad(b) takes grad(s)'s bytes, grad(a) new
 * 12 bwd fc2              3100 [3100]  adds into grad(a)
 * 13 free_grad b          2100
 * 14 bwd relu inplace     2100 [2100]  grad(h) takes grad(a)'s bytes
 * 15 free a               1100
 * 16 bwd fc               1100 [1100]
 * 17 free_grad h           100
 * Peak 3304 at step 7 (without the flags: 4100, at `bwd add`, which makes
 * grad(b) and grad(a) on top of grad(s)). Time 6.5 + 10.5 = 17. Lower bound
 * 3100: fc2's backward holds x, a, grad(b) and grad(a). */
static const char *G_INPLACE = "rockmate-graph 1\n"
                               "tensor x 100 input\ntensor h 1000\ntensor a 1000\ntensor b 1000\ntensor s 1000\n"
                               "tensor loss 4\n"
                               "op fc fwd=2 bwd=4 in=x out=h saved=x\n"
                               "op relu fwd=1 bwd=1 in=h out=a saved=a inplace grad_inplace\n"
                               "op fc2 fwd=2 bwd=4 in=a out=b saved=a\n"
                               "op add fwd=0.5 bwd=0.5 in=b,a out=s inplace grad_inplace\n"
                               "op ce fwd=1 bwd=1 in=s out=loss saved=s phantom=200 fwd_ws=100\n"
                               "loss loss\n";
static const char *P_INPLACE_BASE = "rockmate-plan 1\n"
                                    "fwd fc\nfwd relu inplace\nfwd fc2\nfwd add inplace\nfwd ce save\nloss\nfree loss\n"
                                    "bwd ce\nfree_saved ce\nfree_grad loss\nfree s\nbwd add inplace\nbwd fc2\n"
                                    "free_grad b\nbwd relu inplace\nfree a\nbwd fc\nfree_grad h\n";
/* At the lower bound: a is freed before ce and rebuilt, in place again,
 * from x before the backward of add (mem after [peak]):
 *  0 fwd fc 1100 [1100]  1 fwd relu inplace 1100  2 fwd fc2 2100  3 fwd add
 *  inplace 2100  4 free a 1100  5 fwd ce save 1304 [1404]  6 loss 1308
 *  7 free loss 1304  8 bwd ce 2304  9 free_saved ce 2104  10 free_grad loss
 *  2100  11 free s 1100  12 fwd fc 2100  13 fwd relu inplace 2100  14 bwd add
 *  inplace 3100  15 bwd fc2 3100  16 free_grad b 2100  17 bwd relu inplace
 *  2100  18 free a 1100  19 bwd fc 1100  20 free_grad h 100.
 * Peak 3100 at step 14; time 17 + 2 + 1 = 20. */
static const char *P_INPLACE_LOW = "rockmate-plan 1\n"
                                   "fwd fc\nfwd relu inplace\nfwd fc2\nfwd add inplace\nfree a\nfwd ce save\nloss\n"
                                   "free loss\nbwd ce\nfree_saved ce\nfree_grad loss\nfree s\nfwd fc\nfwd relu inplace\n"
                                   "bwd add inplace\nbwd fc2\nfree_grad b\nbwd relu inplace\nfree a\nbwd fc\n"
                                   "free_grad h\n";
/* INPLACE2: h read by id1 and id2, both passing their gradient through in
 * place; the second of their backwards finds grad(h) live. */
static const char *G_INPLACE2 = "rockmate-graph 1\n"
                                "tensor x 10 input\ntensor h 100\ntensor y1 100\ntensor y2 100\ntensor s 100\n"
                                "op fc fwd=1 bwd=1 in=x out=h saved=x\n"
                                "op id1 fwd=1 bwd=1 in=h out=y1 grad_inplace\n"
                                "op id2 fwd=1 bwd=1 in=h out=y2 grad_inplace\n"
                                "op add fwd=1 bwd=1 in=y1,y2 out=s grad_inplace\n"
                                "loss s\n";

/* What the executor hands the host, per forward and backward call: the
 * first output's RKM_OUT_* or the input gradients' RKM_GRAD_*. */
static char inplace_seen[64];
static size_t inplace_n;
static int inplace_fwd(void *user, const rkm_fwd_call *c)
{
    (void)user;
    if (inplace_n < sizeof inplace_seen - 1) inplace_seen[inplace_n++] = (char)('0' + c->out_new[0]);
    return 0;
}
static int inplace_bwd(void *user, const rkm_bwd_call *c)
{
    (void)user;
    for (int32_t k = 0; k < c->n_in && inplace_n < sizeof inplace_seen - 2; k++)
        inplace_seen[inplace_n++] = (char)('0' + c->in_grad[k]);
    if (inplace_n < sizeof inplace_seen - 1) inplace_seen[inplace_n++] = '.';
    return 0;
}

/* Buffers that take another's bytes share its offset; the arena exec runs
 * the plan both ways at its peak. */
static void check_inplace_layout(const rkm_graph *g, const rkm_plan *p, size_t want_chained)
{
    size_t nb = rkm_plan_num_buffers(p), chained = 0;
    rkm_buffer *buf = calloc(nb + 1, sizeof *buf);
    uint64_t arena = 0;
    rkm_plan_stats ps;
    CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK);
    CHECK(buf && rkm_plan_layout(p, 0, buf, &arena) == RKM_OK && arena >= ps.peak);
    for (size_t i = 0; buf && i < nb; i++) {
        if (buf[i].takes_over < 0) continue;
        const rkm_buffer *o = &buf[buf[i].takes_over];
        chained++;
        CHECK(buf[i].takes_over < (int64_t)i && o->last_step == buf[i].first_step && o->bytes == buf[i].bytes &&
              o->offset == buf[i].offset && o->kind == buf[i].kind);
    }
    CHECK_EQ_U64(chained, want_chained);
    free(buf);
    test_check_layouts(p);
    test_check_arena_runs(g, p, ps.peak);
}

TEST(inplace_hand_worked)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_INPLACE);
    if (g) {
        static const uint64_t base_mem[] = {1100, 1100, 2100, 2100, 2304, 2308, 2304, 3304, 3104,
                                            3100, 2100, 3100, 3100, 2100, 2100, 1100, 1100, 100};
        check_baseline(g, 100, 3304, 7, 17.0, P_INPLACE_BASE, base_mem, N_OF(base_mem));
        rkm_graph_stats st;
        CHECK(rkm_graph_stats_get(g, &st) == RKM_OK && st.lower_bound == 3100);
        static const uint64_t low_mem[] = {1100, 1100, 2100, 2100, 1100, 1304, 1308, 1304, 2304, 2104, 2100,
                                           1100, 2100, 2100, 3100, 3100, 2100, 2100, 1100, 1100, 100};
        check_hand(g, P_INPLACE_LOW, 3100, 14, 20.0, low_mem, N_OF(low_mem));
        rkm_plan *p = plan_text(g, P_INPLACE_BASE);
        if (p) {
            rkm_callbacks cb = {.forward = inplace_fwd, .backward = inplace_bwd};
            inplace_n = 0;
            CHECK(rkm_plan_execute(p, &cb) == RKM_OK);
            inplace_seen[inplace_n] = '\0';
            /* fwd fc relu fc2 add ce; bwd ce, add (b, a), fc2, relu, fc */
            CHECK(strcmp(inplace_seen, "12121" "1." "31." "2." "3." "0.") == 0);
            check_inplace_layout(g, p, 4); /* a, s; grad(b), grad(h) */
            sbuf text = {0};
            CHECK(rkm_plan_write(p, sbuf_write, &text) == RKM_OK && text.data &&
                  strcmp(test_plan_steps(text.data), test_plan_steps(P_INPLACE_BASE)) == 0);
            free(text.data);
        }
        rkm_plan_destroy(p);
        p = plan_text(g, P_INPLACE_LOW);
        if (p) check_inplace_layout(g, p, 5); /* a twice, s; grad(b), grad(h) */
        rkm_plan_destroy(p);
        /* the graph file keeps the flags */
        sbuf text = {0};
        rkm_graph *back = NULL;
        rkm_op_desc od;
        CHECK(rkm_graph_write(g, sbuf_write, &text) == RKM_OK && text.data &&
              strstr(text.data, "saved=a inplace grad_inplace\n"));
        if (text.data) CHECK(rkm_graph_read_string(ctx, text.data, text.len, "back.rkg", &back) == RKM_OK);
        CHECK(back && rkm_graph_op_info(back, 3, &od) == RKM_OK && od.flags == (RKM_OP_INPLACE | RKM_OP_GRAD_INPLACE));
        CHECK(back && rkm_graph_op_info(back, 2, &od) == RKM_OK && od.flags == 0);
        rkm_graph_destroy(back);
        free(text.data);
    }
    rkm_graph_destroy(g);
    /* without the flags the plain plan holds grad(s), grad(b), grad(a) at once */
    char plain[1024];
    snprintf(plain, sizeof plain, "%s", G_INPLACE);
    for (char *w; (w = strstr(plain, " grad_inplace")) || (w = strstr(plain, " inplace"));)
        memmove(w, strchr(w + 1, '\n'), strlen(strchr(w + 1, '\n')) + 1);
    g = load(ctx, plain);
    rkm_graph_stats st;
    CHECK(g && rkm_graph_stats_get(g, &st) == RKM_OK && st.baseline_peak == 4100 && st.lower_bound == 3100);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* RESIDUAL CHAIN: x(10, input) -enc-> e(100); f1 = m1(e); r1 = add1(e, f1);
 * f2 = m2(r1); r2 = add2(r1, f2); l(4) = head(r2) = loss. The adds pass the
 * residual stream's gradient through in place (grad_inplace, first input
 * the stream): grad(r2), grad(r1), grad(e) are one buffer, llm.c's
 * dresidual. m1 saves e, m2 r1, head r2, enc x. Baseline, mem after:
 *  0 fwd enc 110  1 fwd m1 210  2 fwd add1 310  3 free f1 210  4 fwd m2 310
 *  5 fwd add2 410  6 free f2 310  7 fwd head 314  8 loss 318  9 free l 314
 * 10 bwd head 414 [414]  11 free_grad l, 12 free r2: 310
 * 13 bwd add2 inplace 410 [410]: grad(r1) takes grad(r2)'s bytes, grad(f2) new
 * 14 bwd m2 410 (adds into grad(r1))  15 free_grad f2, 16 free r1: 210
 * 17 bwd add1 inplace 310 [310]: grad(e) takes grad(r1)'s bytes, grad(f1) new
 * 18 bwd m1 310  19 free_grad f1, 20 free e: 110  21 bwd enc 110
 * 22 free_grad e 10.
 * Peak 414 at step 10 (without grad_inplace: 510, at bwd add2); time 12. */
static const char *G_RESCHAIN = "rockmate-graph 1\n"
                                "tensor x 10 input\ntensor e 100\ntensor f1 100\ntensor r1 100\ntensor f2 100\n"
                                "tensor r2 100\ntensor l 4\n"
                                "op enc fwd=1 bwd=1 in=x out=e saved=x\n"
                                "op m1 fwd=1 bwd=1 in=e out=f1 saved=e\n"
                                "op add1 fwd=1 bwd=1 in=e,f1 out=r1 grad_inplace\n"
                                "op m2 fwd=1 bwd=1 in=r1 out=f2 saved=r1\n"
                                "op add2 fwd=1 bwd=1 in=r1,f2 out=r2 grad_inplace\n"
                                "op head fwd=1 bwd=1 in=r2 out=l saved=r2\n"
                                "loss l\n";
static const char *P_RESCHAIN = "rockmate-plan 1\n"
                                "fwd enc\nfwd m1\nfwd add1\nfree f1\nfwd m2\nfwd add2\nfree f2\nfwd head\nloss\nfree l\n"
                                "bwd head\nfree_grad l\nfree r2\nbwd add2 inplace\nbwd m2\nfree_grad f2\nfree r1\n"
                                "bwd add1 inplace\nbwd m1\nfree_grad f1\nfree e\nbwd enc\nfree_grad e\n";

TEST(inplace_gradient_chain)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_RESCHAIN);
    if (g) {
        static const uint64_t mem[] = {110, 210, 310, 210, 310, 410, 310, 314, 318, 314, 414, 410,
                                       310, 410, 410, 310, 210, 310, 310, 210, 110, 110, 10};
        check_baseline(g, 10, 414, 10, 12.0, P_RESCHAIN, mem, N_OF(mem));
        rkm_graph_stats st;
        CHECK(rkm_graph_stats_get(g, &st) == RKM_OK && st.lower_bound == 310);
        rkm_plan *p = NULL;
        CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
        size_t nb = p ? rkm_plan_num_buffers(p) : 0;
        rkm_buffer *b = calloc(nb + 1, sizeof *b);
        uint64_t arena = 0;
        CHECK(p && b && rkm_plan_layout(p, 0, b, &arena) == RKM_OK && arena >= 414);
        /* grad(r2), grad(r1), grad(e): one chain, one offset, from step 10 to 22 */
        int32_t chain[3] = {rkm_graph_find_tensor(g, "r2"), rkm_graph_find_tensor(g, "r1"), rkm_graph_find_tensor(g, "e")};
        int64_t at[3] = {-1, -1, -1};
        for (size_t i = 0; i < nb; i++)
            for (int k = 0; k < 3; k++)
                if (b[i].kind == RKM_BUFFER_GRAD && b[i].index == chain[k]) at[k] = (int64_t)i;
        CHECK(at[0] >= 0 && at[1] >= 0 && at[2] >= 0);
        if (at[0] >= 0 && at[1] >= 0 && at[2] >= 0) {
            CHECK(b[at[0]].takes_over < 0 && b[at[1]].takes_over == at[0] && b[at[2]].takes_over == at[1]);
            CHECK(b[at[0]].offset == b[at[1]].offset && b[at[1]].offset == b[at[2]].offset);
            CHECK(b[at[0]].first_step == 10 && b[at[1]].first_step == 13 && b[at[2]].first_step == 17 &&
                  b[at[2]].last_step == 22);
        }
        free(b);
        if (p) check_inplace_layout(g, p, 2);
        rkm_plan_destroy(p);
    }
    rkm_graph_destroy(g);
    char plain[1024];
    snprintf(plain, sizeof plain, "%s", G_RESCHAIN);
    for (char *w; (w = strstr(plain, " grad_inplace"));) memmove(w, w + 13, strlen(w + 13) + 1);
    g = load(ctx, plain);
    rkm_graph_stats st;
    CHECK(g && rkm_graph_stats_get(g, &st) == RKM_OK && st.baseline_peak == 510);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* The graph rules of the flags, each with its message. */
TEST(inplace_graph_rules)
{
    static const struct {
        const char *ops, *msg;
    } bad[] = {
        {"op f fwd=1 bwd=1 in=x out=a saved=x inplace\nop g fwd=1 bwd=1 in=a out=l\n", "inplace over x, an input"},
        {"op f fwd=1 bwd=1 in=x out=a saved=x\nop g fwd=1 bwd=1 in=a out=l inplace\n",
         "first input and the first output of one size (a is 40 bytes, l 4)"},
        {"op f fwd=1 bwd=1 in=x out=a saved=x\nop g fwd=1 bwd=1 in=a out=l grad_inplace\n",
         "first input and the first output of one size"},
        {"op f fwd=1 bwd=1 out=a inplace\nop g fwd=1 bwd=1 in=a out=l\n", "inplace needs an input"},
        {"op f fwd=1 bwd=1 in=x out=a saved=x inplace inplace\nop g fwd=1 bwd=1 in=a out=l\n", "flag inplace given twice"},
        {"tensor b 40 nograd\nop f fwd=1 bwd=1 in=x out=a saved=x\nop g fwd=1 bwd=1 in=a out=b grad_inplace\n"
         "op h fwd=1 bwd=1 in=a,b out=l\n", "grad_inplace needs gradients of a and b; b has none"},
    };
    for (size_t k = 0; k < N_OF(bad); k++) {
        rkm_context *ctx = test_new_ctx();
        char text[512];
        snprintf(text, sizeof text, "rockmate-graph 1\ntensor x 40 input\ntensor a 40\ntensor l 4\n%sloss l\n",
                 bad[k].ops);
        rkm_graph *g = NULL;
        rkm_result r = rkm_graph_read_string(ctx, text, strlen(text), "bad.rkg", &g);
        CHECK((r == RKM_ERROR_GRAPH || r == RKM_ERROR_PARSE) && !g);
        if (!strstr(rkm_context_errmsg(ctx), bad[k].msg)) fprintf(stderr, "case %zu: %s\n", k, rkm_context_errmsg(ctx));
        CHECK(strstr(rkm_context_errmsg(ctx), bad[k].msg) != NULL);
        rkm_context_destroy(ctx);
    }
    /* through the API: unknown flag bits */
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL;
    int32_t x, a;
    CHECK(rkm_graph_create(ctx, &g) == RKM_OK && rkm_graph_add_tensor(g, "x", 4, RKM_TENSOR_INPUT, &x) == RKM_OK &&
          rkm_graph_add_tensor(g, "a", 4, 0, &a) == RKM_OK);
    rkm_op_desc d = {.name = "f", .in = &x, .n_in = 1, .out = &a, .n_out = 1, .flags = 4};
    CHECK(rkm_graph_add_op(g, &d, NULL) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(rkm_context_errmsg(ctx), "op f: unknown flags 0x4") != NULL);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* -------------------------------------------- every plan rule broken once */

typedef struct bad_plan {
    const char **graph;
    const char *plan;     /* steps after the header */
    rkm_rule rule;
    int64_t step;         /* fail_step */
    const char *text;     /* the failing step's text; NULL for end-of-plan rules */
    const char *object;   /* the op or tensor concerned; NULL for none */
    int object_is_op;
} bad_plan;

static const bad_plan bad_plans[] = {
    {&G_CHAIN2, "fwd g\n", RKM_RULE_FWD_INPUT_MISSING, 0, "fwd g", "a", 0},
    {&G_CHAIN2, "fwd f save\n", RKM_RULE_SAVE_NOT_ALLOWED, 0, "fwd f save", "f", 1},
    /* mask has a phantom but no backward */
    {&G_NOGRAD, "fwd mask save\n", RKM_RULE_SAVE_NOT_ALLOWED, 0, "fwd mask save", "mask", 1},
    {&G_PHANTOM, "fwd a save\nfwd a save\n", RKM_RULE_SAVE_ALREADY_LIVE, 1, "fwd a save", "a", 1},
    {&G_CHAIN2, "fwd f\nloss\n", RKM_RULE_LOSS_TENSOR_MISSING, 1, "loss", "b", 0},
    {&G_CHAIN2, "fwd f\nfwd g\nloss\nloss\n", RKM_RULE_LOSS_TWICE, 3, "loss", NULL, 0},
    {&G_NOGRAD, "fwd mask\nbwd mask\n", RKM_RULE_BWD_NO_BACKWARD, 1, "bwd mask", "mask", 1},
    {&G_CHAIN2, "fwd f\nfwd g\nloss\nbwd g\nbwd g\n", RKM_RULE_BWD_TWICE, 4, "bwd g", "g", 1},
    {&G_CHAIN2, "fwd f\nfwd g\nloss\nfree a\nbwd g\n", RKM_RULE_BWD_SAVED_MISSING, 4, "bwd g", "a", 0},
    {&G_LOSS_SAVED, "fwd f\nfwd xent\nloss\nfree L\nbwd xent\n", RKM_RULE_BWD_SAVED_MISSING, 4, "bwd xent", "L", 0},
    {&G_PHANTOM, "fwd a save\nfwd b\nloss\nbwd b\n", RKM_RULE_BWD_PHANTOM_MISSING, 3, "bwd b", "b", 1},
    {&G_CHAIN2, "fwd f\nfwd g\nbwd g\n", RKM_RULE_BWD_GRAD_MISSING, 2, "bwd g", "b", 0},
    {&G_ACCUM, "fwd p\nfwd q\nfwd r\nfwd s\nloss\nbwd s\nbwd r\nbwd p\n", RKM_RULE_BWD_GRAD_INCOMPLETE, 7, "bwd p",
     "a", 0},
    {&G_CHAIN2, "free a\n", RKM_RULE_FREE_NOT_LIVE, 0, "free a", "a", 0},
    {&G_CHAIN2, "fwd f\nfree a\nfree a\n", RKM_RULE_FREE_NOT_LIVE, 2, "free a", "a", 0},
    {&G_CHAIN2, "free x\n", RKM_RULE_FREE_INPUT, 0, "free x", "x", 0},
    {&G_INPUTS, "fwd gen\nfwd f\nfree big\n", RKM_RULE_FREE_INPUT, 2, "free big", "big", 0},
    {&G_PHANTOM, "free_saved a\n", RKM_RULE_FREE_SAVED_NOT_LIVE, 0, "free_saved a", "a", 1},
    {&G_PHANTOM, "fwd a save\nfree_saved a\nfree_saved a\n", RKM_RULE_FREE_SAVED_NOT_LIVE, 2, "free_saved a", "a", 1},
    {&G_CHAIN2, "free_grad b\n", RKM_RULE_FREE_GRAD_NOT_LIVE, 0, "free_grad b", "b", 0},
    {&G_ACCUM, "fwd p\nfwd q\nfwd r\nfwd s\nloss\nbwd s\nbwd r\nfree_grad a\n", RKM_RULE_FREE_GRAD_INCOMPLETE, 7,
     "free_grad a", "a", 0},
    {&G_CHAIN2, "", RKM_RULE_END_LOSS_MISSING, 0, NULL, NULL, 0},
    {&G_CHAIN2, "fwd f\nfwd g\nfree a\nfree b\n", RKM_RULE_END_LOSS_MISSING, 4, NULL, NULL, 0},
    {&G_INPLACE, "fwd fc inplace\n", RKM_RULE_INPLACE_NOT_DECLARED, 0, "fwd fc inplace", "fc", 1},
    {&G_INPLACE, "fwd fc\nfwd relu\nfwd relu inplace\n", RKM_RULE_INPLACE_OUT_LIVE, 2, "fwd relu inplace", "a", 0},
    {&G_INPLACE2, "fwd fc\nfwd id1\nfwd id2\nfwd add\nloss\nbwd add inplace\nbwd id2 inplace\nbwd id1 inplace\n",
     RKM_RULE_INPLACE_GRAD_LIVE, 7, "bwd id1 inplace", "h", 0},
    /* copies: a plan that offloads a, frees it, and prefetches it for g's
     * backward is valid (fwd f, offload a, fwd g, wait a, free a, loss,
     * prefetch a, wait a, bwd g, ...); each case breaks one rule */
    {&G_CHAIN2, "fwd f\noffload a\n", RKM_RULE_COPY_NO_BANDWIDTH, 1, "offload a", "a", 0},
    {&G_CHAIN2_COPY, "offload a\n", RKM_RULE_OFFLOAD_NOT_LIVE, 0, "offload a", "a", 0},
    {&G_CHAIN2_COPY, "offload x\n", RKM_RULE_OFFLOAD_NOT_LIVE, 0, "offload x", "x", 0},
    {&G_CHAIN2_COPY, "fwd f\noffload a\nwait a\noffload a\n", RKM_RULE_OFFLOAD_ON_HOST, 3, "offload a", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\nprefetch a\n", RKM_RULE_PREFETCH_NOT_ON_HOST, 1, "prefetch a", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\noffload a\nwait a\nprefetch a\n", RKM_RULE_PREFETCH_LIVE, 3, "prefetch a", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\nwait a\n", RKM_RULE_WAIT_NO_COPY, 1, "wait a", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\noffload a\nfree a\n", RKM_RULE_COPY_IN_FLIGHT, 2, "free a", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\noffload a\nfwd f\n", RKM_RULE_COPY_IN_FLIGHT, 2, "fwd f", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\noffload a\nwait a\nfree a\nprefetch a\nfwd g\n", RKM_RULE_COPY_IN_FLIGHT, 5, "fwd g",
     "a", 0},
    {&G_CHAIN2_COPY, "fwd f\noffload a\nfree_host a\n", RKM_RULE_COPY_IN_FLIGHT, 2, "free_host a", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\nfree_host a\n", RKM_RULE_FREE_HOST_NOT_ON_HOST, 1, "free_host a", "a", 0},
    {&G_CHAIN2_COPY, "fwd f\nfwd g\nloss\nbwd g\nfree b\nfree_grad b\nbwd f\nfree_grad a\noffload a\n",
     RKM_RULE_END_COPY_IN_FLIGHT, 9, NULL, "a", 0},
    {&G_CHAIN2_COPY, "fwd f\noffload a\nfwd g\nwait a\nloss\nbwd g\nfree b\nfree_grad b\nbwd f\nfree_grad a\nfree a\n",
     RKM_RULE_END_HOST_LIVE, 11, NULL, "a", 0},
    /* a run in place leaves its input and its output's gradient gone */
    {&G_INPLACE, "fwd fc\nfwd relu inplace\nfwd relu\n", RKM_RULE_FWD_INPUT_MISSING, 2, "fwd relu", "h", 0},
    {&G_INPLACE, "fwd fc\nfwd relu inplace\nfree h\n", RKM_RULE_FREE_NOT_LIVE, 2, "free h", "h", 0},
    {&G_INPLACE2, "fwd fc\nfwd id1\nfwd id2\nfwd add\nloss\nbwd add inplace\nfree_grad s\n",
     RKM_RULE_FREE_GRAD_NOT_LIVE, 6, "free_grad s", "s", 0},
    /* everything else is clean: only f's backward is missing */
    {&G_CHAIN2, "fwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nfree_grad a\nfree a\n", RKM_RULE_END_BWD_MISSING, 8,
     NULL, "f", 1},
    /* CHAIN2's baseline without its `free a` */
    {&G_CHAIN2, "fwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nbwd f\nfree_grad a\n", RKM_RULE_END_TENSOR_LIVE, 8,
     NULL, "a", 0},
    /* PHANTOM's baseline without `free_saved a` */
    {&G_PHANTOM, "fwd a save\nfwd b save\nfree h\nloss\nfree y\nbwd b\nfree_saved b\nfree_grad y\nbwd a\nfree_grad h\n",
     RKM_RULE_END_SAVED_LIVE, 10, NULL, "a", 1},
    /* a stage's plan that releases its input's gradient instead of sending it */
    {&G_STAGE, "fwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nfree a\nbwd f\nfree_grad a\nfree_grad x\n",
     RKM_RULE_END_INPUT_GRAD_MISSING, 10, NULL, "x", 0},
    /* ... or never makes it: the baseline without bwd f is refused before */
    {&G_STAGE, "fwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nfree a\nfree_grad a\n", RKM_RULE_END_BWD_MISSING, 8,
     NULL, "f", 1},
    /* CHAIN2's baseline without the last `free_grad a` */
    {&G_CHAIN2, "fwd f\nfwd g\nloss\nfree b\nbwd g\nfree_grad b\nfree a\nbwd f\n", RKM_RULE_END_GRAD_LIVE, 8, NULL,
     "a", 0},
};

/* The failure is reported with the rule, the step, the object, and a
 * message naming "step N", the step's text and the rule. */
static void check_bad_plan(const bad_plan *b, size_t k)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, *b->graph);
    char text[1024];
    snprintf(text, sizeof text, "rockmate-plan 1\n%s", b->plan);
    rkm_plan *p = (rkm_plan *)1;
    if (g) {
        rkm_sim_result res;
        rkm_result r = rkm_plan_read_string(g, text, strlen(text), "bad.rkp", &res, &p);
        const char *msg = rkm_context_errmsg(ctx);
        char want[64];
        snprintf(want, sizeof want, "step %lld", (long long)b->step);
        int ok = r == RKM_ERROR_PLAN && res.valid == 0 && res.rule == b->rule && res.fail_step == b->step &&
                 strstr(msg, want) && strstr(msg, rkm_rule_string(b->rule)) && (!b->text || strstr(msg, b->text));
        if (b->object) {
            int32_t id = b->object_is_op ? rkm_graph_find_op(g, b->object) : rkm_graph_find_tensor(g, b->object);
            ok = ok && res.fail_object == id;
        }
        char failed[300];
        rkm_step_text(g, &res.failed, failed, sizeof failed);
        if (b->text) ok = ok && strcmp(failed, b->text) == 0;
        if (!ok)
            fprintf(stderr, "bad plan %zu (rule %d, step %lld): got result %d rule %d step %lld object %d msg '%s'\n",
                    k, (int)b->rule, (long long)b->step, (int)r, (int)res.rule, (long long)res.fail_step,
                    (int)res.fail_object, msg);
        CHECK(ok);
        /* An invalid plan is never handed out. */
        CHECK(p == NULL);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

TEST(every_plan_rule)
{
    int seen[RKM_RULE_COUNT] = {0};
    for (size_t k = 0; k < N_OF(bad_plans); k++) {
        check_bad_plan(&bad_plans[k], k);
        seen[bad_plans[k].rule] = 1;
    }
    /* RKM_RULE_BAD_STEP cannot come from text (names are checked):
     * bad_step_rule below reaches it through rkm_plan_create. */
    for (int r = 1; r < RKM_RULE_COUNT; r++)
        if (r != RKM_RULE_BAD_STEP && !seen[r]) {
            fprintf(stderr, "rule %d (%s) not covered\n", r, rkm_rule_string((rkm_rule)r));
            CHECK(0);
        }
    for (int r = 0; r < RKM_RULE_COUNT; r++) CHECK(rkm_rule_string((rkm_rule)r)[0] != '\0');
}

/* A step out of range after a good one is caught where it stands. */
TEST(bad_step_rule)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_CHAIN2);
    rkm_plan *p = NULL;
    if (g) {
        const rkm_step steps[] = {{RKM_STEP_FWD, 0, 0, 0}, {RKM_STEP_BWD, 9, 0, 0}};
        rkm_sim_result res;
        CHECK(rkm_plan_create(g, steps, 2, &res, &p) == RKM_ERROR_PLAN && p == NULL);
        CHECK(res.rule == RKM_RULE_BAD_STEP);
        CHECK(res.fail_step == 1);
        CHECK(strstr(rkm_context_errmsg(ctx), "step 1") != NULL);
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Results of a refused plan cover the steps before the failure. */
TEST(partial_figures_on_failure)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_CHAIN2);
    const char *text = "rockmate-plan 1\nfwd f\nfwd g\nloss\nfree a\nbwd g\nfwd f\n";
    rkm_plan *p = NULL;
    if (g) {
        rkm_sim_result res;
        CHECK(rkm_plan_read_string(g, text, strlen(text), "part.rkp", &res, &p) == RKM_ERROR_PLAN && !p);
        CHECK_EQ_U64(res.peak, 510);
        CHECK(res.peak_step == 2);
        CHECK(res.time == 5.0);
        CHECK(res.fail_step == 4);
        CHECK_EQ_U64(res.num_steps, 6);
        CHECK_EQ_U64(res.recomputes, 1); /* counted over the whole list */
        /* res may be NULL */
        CHECK(rkm_plan_read_string(g, text, strlen(text), "part.rkp", NULL, &p) == RKM_ERROR_PLAN && !p);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* ---------------------------------------- random walks against an oracle */

/* The contract's replay written again, plainly, from docs/formats.md, with
 * only the public API: random plans replayed by it and by rkm_plan_simulate
 * must agree on every step's memory, the peak, the time and where a plan
 * first breaks a rule. */
typedef struct oracle {
    const rkm_graph *g;
    int32_t nt, no;
    uint8_t *D, *G, *P, *bwd_done;
    int32_t *recv;
    int loss_done;
    uint64_t mem;
} oracle;

static rkm_tensor_info tinfo(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    rkm_graph_tensor_info(g, t, &ti);
    return ti;
}

static void oracle_init(oracle *o, const rkm_graph *g)
{
    memset(o, 0, sizeof *o);
    o->g = g;
    o->nt = rkm_graph_num_tensors(g);
    o->no = rkm_graph_num_ops(g);
    o->D = calloc((size_t)o->nt, 1);
    o->G = calloc((size_t)o->nt, 1);
    o->recv = calloc((size_t)o->nt, sizeof *o->recv);
    o->P = calloc((size_t)o->no, 1);
    o->bwd_done = calloc((size_t)o->no, 1);
    for (int32_t t = 0; t < o->nt; t++) {
        rkm_tensor_info ti = tinfo(g, t);
        if (ti.flags & RKM_TENSOR_INPUT) {
            o->D[t] = 1;
            o->mem += ti.bytes;
        }
    }
}

static void oracle_free(oracle *o)
{
    free(o->D);
    free(o->G);
    free(o->recv);
    free(o->P);
    free(o->bwd_done);
}


static int grad_complete(const oracle *o, int32_t t)
{
    return o->G[t] && o->recv[t] == tinfo(o->g, t).n_contributors;
}

/* 1 and the step's peak if the step is allowed (and then applied when
 * `apply`), 0 if it breaks a rule. */
static int oracle_step(oracle *o, const rkm_step *s, int apply, uint64_t *peak)
{
    const rkm_graph *g = o->g;
    rkm_op_desc oi;
    uint64_t add = 0;
    if (s->kind == RKM_STEP_FWD) {
        rkm_graph_op_info(g, s->index, &oi);
        for (int32_t k = 0; k < oi.n_in; k++)
            if (!o->D[oi.in[k]]) return 0;
        if (s->save && (oi.phantom == 0 || !has_bwd_id(g, s->index) || o->P[s->index])) return 0;
        /* in place: declared, out[0] not live; it takes in[0]'s bytes */
        if (s->inplace && (!(oi.flags & RKM_OP_INPLACE) || o->D[oi.out[0]])) return 0;
        for (int32_t k = s->inplace ? 1 : 0; k < oi.n_out; k++)
            if (!o->D[oi.out[k]]) add += tinfo(g, oi.out[k]).bytes;
        if (s->save) add += oi.phantom;
        *peak = o->mem + add + oi.fwd_ws;
        if (!apply) return 1;
        if (s->inplace) o->D[oi.in[0]] = 0;
        for (int32_t k = 0; k < oi.n_out; k++) o->D[oi.out[k]] = 1;
        if (s->save) o->P[s->index] = 1;
    } else if (s->kind == RKM_STEP_LOSS) {
        int32_t t = rkm_graph_loss(g);
        if (o->loss_done || !o->D[t]) return 0;
        add = tinfo(g, t).bytes;
        *peak = o->mem + add;
        if (!apply) return 1;
        o->loss_done = 1;
        o->G[t] = 1;
        o->recv[t] = 1;
    } else if (s->kind == RKM_STEP_BWD) {
        rkm_graph_op_info(g, s->index, &oi);
        if (!has_bwd_id(g, s->index) || o->bwd_done[s->index]) return 0;
        for (int32_t k = 0; k < oi.n_saved; k++)
            if (!o->D[oi.saved[k]]) return 0;
        if (oi.phantom > 0 && !o->P[s->index]) return 0;
        for (int32_t k = 0; k < oi.n_out; k++)
            if (tinfo(g, oi.out[k]).has_grad && !grad_complete(o, oi.out[k])) return 0;
        /* in place: declared, grad(in[0]) not live; it takes grad(out[0])'s bytes */
        if (s->inplace && (!(oi.flags & RKM_OP_GRAD_INPLACE) || o->G[oi.in[0]])) return 0;
        for (int32_t k = s->inplace ? 1 : 0; k < oi.n_in; k++)
            if (tinfo(g, oi.in[k]).has_grad && !o->G[oi.in[k]]) add += tinfo(g, oi.in[k]).bytes;
        *peak = o->mem + add + oi.bwd_ws;
        if (!apply) return 1;
        if (s->inplace) o->G[oi.out[0]] = 0;
        for (int32_t k = 0; k < oi.n_in; k++)
            if (tinfo(g, oi.in[k]).has_grad) {
                o->G[oi.in[k]] = 1;
                o->recv[oi.in[k]]++;
            }
        o->bwd_done[s->index] = 1;
    } else {
        int ok = s->kind == RKM_STEP_FREE         ? o->D[s->index] && !(tinfo(g, s->index).flags & RKM_TENSOR_INPUT)
                 : s->kind == RKM_STEP_FREE_SAVED ? o->P[s->index]
                                                  : grad_complete(o, s->index);
        if (!ok) return 0;
        *peak = o->mem;
        if (!apply) return 1;
        if (s->kind == RKM_STEP_FREE_SAVED) {
            rkm_graph_op_info(g, s->index, &oi);
            o->P[s->index] = 0;
            o->mem -= oi.phantom;
        } else {
            uint8_t *set = s->kind == RKM_STEP_FREE ? o->D : o->G;
            set[s->index] = 0;
            o->mem -= tinfo(g, s->index).bytes;
        }
        return 1;
    }
    o->mem += add;
    return 1;
}

/* The end-of-plan rules. */
static int oracle_end_ok(const oracle *o)
{
    if (!o->loss_done) return 0;
    for (int32_t i = 0; i < o->no; i++)
        if (o->P[i] || (has_bwd_id(o->g, i) && !o->bwd_done[i])) return 0;
    for (int32_t t = 0; t < o->nt; t++)
        if (o->G[t] || (o->D[t] && !(tinfo(o->g, t).flags & RKM_TENSOR_INPUT))) return 0;
    return 1;
}

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* Every step of the graph: fwd (with and without save), bwd and free_saved
 * per op, free and free_grad per tensor, loss. */
static size_t all_steps(const rkm_graph *g, rkm_step *out)
{
    size_t n = 0;
    for (int32_t i = 0; i < rkm_graph_num_ops(g); i++) {
        out[n++] = (rkm_step){RKM_STEP_FWD, i, 0, 0};
        out[n++] = (rkm_step){RKM_STEP_FWD, i, 1, 0};
        out[n++] = (rkm_step){RKM_STEP_BWD, i, 0, 0};
        out[n++] = (rkm_step){RKM_STEP_FREE_SAVED, i, 0, 0};
        out[n++] = (rkm_step){RKM_STEP_FWD, i, 0, 1};
        out[n++] = (rkm_step){RKM_STEP_FWD, i, 1, 1};
        out[n++] = (rkm_step){RKM_STEP_BWD, i, 0, 1};
    }
    for (int32_t t = 0; t < rkm_graph_num_tensors(g); t++) {
        out[n++] = (rkm_step){RKM_STEP_FREE, t, 0, 0};
        out[n++] = (rkm_step){RKM_STEP_FREE_GRAD, t, 0, 0};
    }
    out[n++] = (rkm_step){RKM_STEP_LOSS, rkm_graph_loss(g), 0, 0};
    return n;
}

static double step_time(const rkm_graph *g, const rkm_step *s)
{
    rkm_op_desc oi;
    if (s->kind != RKM_STEP_FWD && s->kind != RKM_STEP_BWD) return 0;
    rkm_graph_op_info(g, s->index, &oi);
    return s->kind == RKM_STEP_FWD ? oi.fwd_seconds : oi.bwd_seconds;
}

/* One random walk of up to `len` allowed steps; then the same plan with a
 * step that breaks a rule put in at a random place. */
static void random_walk(const rkm_graph *g, uint64_t seed, size_t len)
{
    size_t ncand = (size_t)rkm_graph_num_ops(g) * 7 + (size_t)rkm_graph_num_tensors(g) * 2 + 1;
    rkm_step *cand = malloc(ncand * sizeof *cand), *ok = malloc(ncand * sizeof *ok);
    rkm_step *walk = malloc((len + 1) * sizeof *walk);
    uint64_t *mem = malloc((len + 1) * sizeof *mem), *after = malloc((len + 1) * sizeof *after);
    all_steps(g, cand);
    oracle o;
    oracle_init(&o, g);
    uint64_t peak = 0, pk;
    int64_t peak_step = -1;
    double time = 0;
    size_t n = 0;
    /* Weights that make walks reach the backward pass: first forwards, loss
     * and backwards are likely, frees and recomputes less. A walk stops where
     * the plan could end valid. */
    uint8_t *ran = calloc((size_t)rkm_graph_num_ops(g), 1);
    unsigned *wt = malloc(ncand * sizeof *wt);
    while (n < len && !(n > 0 && oracle_end_ok(&o))) {
        size_t nok = 0;
        unsigned total = 0;
        for (size_t i = 0; i < ncand; i++) {
            const rkm_step *c = &cand[i];
            if (!oracle_step(&o, c, 0, &pk)) continue;
            wt[nok] = c->kind == RKM_STEP_FWD         ? (ran[c->index] ? 3 : 20)
                      : c->kind == RKM_STEP_LOSS      ? 50
                      : c->kind == RKM_STEP_BWD       ? 50
                      : c->kind == RKM_STEP_FREE_GRAD ? 10
                                                      : 2;
            total += wt[nok];
            ok[nok++] = *c;
        }
        if (!nok) break;
        unsigned pick = (unsigned)(lcg(&seed) % total);
        size_t c = 0;
        while (pick >= wt[c]) pick -= wt[c++];
        walk[n] = ok[c];
        if (walk[n].kind == RKM_STEP_FWD) ran[walk[n].index] = 1;
        oracle_step(&o, &walk[n], 1, &pk);
        if (peak_step < 0 || pk > peak) peak = pk, peak_step = (int64_t)n;
        time += step_time(g, &walk[n]);
        mem[n++] = o.mem;
    }
    rkm_plan *p = NULL;
    rkm_sim_result res;
    rkm_result r = rkm_plan_create(g, walk, n, &res, &p);
    /* valid exactly when the oracle says so; otherwise only an end rule is broken */
    CHECK(oracle_end_ok(&o) ? r == RKM_OK : r == RKM_ERROR_PLAN && res.fail_step == (int64_t)n && !p);
    if (p) memcpy(after, rkm_plan_mem_after(p), n * sizeof *after);
    else { /* a refused plan has no per-step figures: the library's own replay has them */
        rkm__sim s;
        rkm_sim_result tmp;
        CHECK(rkm__sim_init(g, &s) == RKM_OK);
        CHECK(rkm__sim_run(&s, walk, n, &tmp, after) == 1);
        rkm__sim_free(&s);
    }
    int same = res.peak == peak && res.peak_step == peak_step && res.time == time;
    for (size_t i = 0; i < n; i++) same = same && after[i] == mem[i];
    if (!same) fprintf(stderr, "random walk %llu: figures differ from the oracle\n", (unsigned long long)seed);
    CHECK(same);
    if (p) test_check_layouts(p); /* a random plan's lifetimes: the placer's layouts hold */
    rkm_plan_destroy(p);
    /* A step that breaks a rule, put in at step k, is reported at k. */
    size_t k = n ? lcg(&seed) % n : 0;
    oracle_free(&o);
    oracle_init(&o, g);
    for (size_t i = 0; i < k; i++) oracle_step(&o, &walk[i], 1, &pk);
    rkm_step bad = cand[0];
    for (int tries = 0; tries < 1000; tries++) {
        bad = cand[lcg(&seed) % ncand];
        if (!oracle_step(&o, &bad, 0, &pk)) break;
    }
    if (!oracle_step(&o, &bad, 0, &pk)) {
        p = NULL;
        for (size_t i = n + 1; i-- > k + 1;) walk[i] = walk[i - 1];
        walk[k] = bad;
        CHECK(rkm_plan_create(g, walk, n + 1, &res, &p) == RKM_ERROR_PLAN && !p);
        if (res.fail_step != (int64_t)k)
            fprintf(stderr, "random walk %llu: bad step at %zu reported at %lld\n", (unsigned long long)seed, k,
                    (long long)res.fail_step);
        CHECK(res.fail_step == (int64_t)k);
    }
    oracle_free(&o);
    free(ran);
    free(wt);
    free(cand);
    free(ok);
    free(walk);
    free(mem);
    free(after);
}

TEST(random_walks)
{
    const char *hand[] = {G_CHAIN3, G_PHANTOM, G_ACCUM, G_MULTI, G_NOGRAD, G_INPUTS, G_LOSS_SAVED, G_POOL, G_NOBWD_SAVED,
                          G_INPLACE, G_INPLACE2, G_RESCHAIN};
    uint64_t seed = 1;
    for (size_t k = 0; k < N_OF(hand); k++) {
        rkm_context *ctx = test_new_ctx();
        rkm_graph *g = load(ctx, hand[k]);
        for (int w = 0; g && w < 40; w++) random_walk(g, seed++, 60);
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
    static const char *files[] = {"multi-output", "random30", "gpt2-tiny"};
    for (size_t k = 0; k < N_OF(files); k++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s.rkg", TEST_GRAPHS_DIR, files[k]);
        rkm_context *ctx = test_new_ctx();
        rkm_graph *g = NULL;
        CHECK(rkm_graph_read_file(ctx, path, &g) == RKM_OK);
        for (int w = 0; g && w < 20; w++) random_walk(g, seed++, 800);
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
}

/* ------------------------------------------------------------- plan files */

typedef struct bad_rkp {
    const char *text;
    int line;
    const char *word; /* a word of the rule the message must hold after source:line; NULL: none */
} bad_rkp;

static const bad_rkp bad_rkps[] = {
    {"fwd f\n", 1, "rockmate-plan"},
    {"rockmate-plan 3\nfwd f\n", 1, "rockmate-plan"},
    {"rockmate-plan\nfwd f\n", 1, "rockmate-plan"},
    {"rockmate-plan 1\n# comment\n\nfwdd f\n", 4, "fwdd"},
    {"rockmate-plan 1\nfwd f\nfwd zz\n", 3, "zz"},
    {"rockmate-plan 1\nfree zz\n", 2, "zz"},
    {"rockmate-plan 1\nfree_grad f\n", 2, NULL}, /* f is an op, not a tensor */
    {"rockmate-plan 1\nbwd a\n", 2, NULL},       /* a is a tensor, not an op */
    {"rockmate-plan 1\nfree_saved zz\n", 2, "zz"},
    {"rockmate-plan 1\nfwd f save now\n", 2, "fwd"},
    {"rockmate-plan 1\nfwd f keep\n", 2, "keep"},
    {"rockmate-plan 1\nloss b\n", 2, "loss"},
    {"rockmate-plan 1\nfree a b\n", 2, "free"},
    {"rockmate-plan 1\nbwd g g\n", 2, "bwd"},
    {"rockmate-plan 1\nfwd\n", 2, "fwd"},
    {"rockmate-plan 1\nfree\n", 2, "free"},
    {"rockmate-plan 1\nfwd f\nrockmate-plan 1\n", 3, "rockmate-plan"},
};

TEST(plan_file_syntax_errors)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_CHAIN2);
    for (size_t k = 0; g && k < N_OF(bad_rkps); k++) {
        rkm_plan dummy, *p = &dummy;
        const char *t = bad_rkps[k].text;
        rkm_result r = rkm_plan_read_string(g, t, strlen(t), "bad.rkp", NULL, &p);
        const char *msg = rkm_context_errmsg(ctx);
        char where[64];
        snprintf(where, sizeof where, "bad.rkp:%d:", bad_rkps[k].line);
        const char *at = strstr(msg, where);
        int ok = r == RKM_ERROR_PARSE && p == NULL && at &&
                 (!bad_rkps[k].word || strstr(at + strlen(where), bad_rkps[k].word));
        if (!ok) fprintf(stderr, "bad rkp %zu: result %d msg '%s' (want %s ... %s)\n", k, (int)r, msg, where,
                         bad_rkps[k].word);
        CHECK(ok);
        if (p != &dummy) rkm_plan_destroy(p);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Comments, blank lines and tabs are accepted; steps come out as written
 * (PHANTOM's baseline with b's save dropped). */
TEST(plan_file_reads)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_PHANTOM);
    static const char text[] = "# a plan\n\nrockmate-plan 1 # header\n  fwd\ta   save\n"
                               "fwd b save # comment\n\tloss\nfree y\nbwd b\nfree_saved b\nfree_grad y\n"
                               "free h\nbwd a\t\nfree_saved a\n\nfree_grad h\n";
    rkm_plan *p = g ? plan_text(g, text) : NULL;
    if (p) {
        CHECK(rkm_plan_num_steps(p) == 11);
        const rkm_step *s = rkm_plan_steps(p);
        CHECK(s[0].kind == RKM_STEP_FWD && s[0].index == rkm_graph_find_op(g, "a") && s[0].save == 1);
        CHECK(s[1].kind == RKM_STEP_FWD && s[1].index == rkm_graph_find_op(g, "b") && s[1].save == 1);
        CHECK(s[2].kind == RKM_STEP_LOSS && s[2].index == rkm_graph_find_tensor(g, "y"));
        CHECK(s[3].kind == RKM_STEP_FREE && s[3].index == rkm_graph_find_tensor(g, "y"));
        CHECK(s[4].kind == RKM_STEP_BWD && s[4].index == rkm_graph_find_op(g, "b"));
        CHECK(s[5].kind == RKM_STEP_FREE_SAVED && s[5].index == rkm_graph_find_op(g, "b"));
        CHECK(s[6].kind == RKM_STEP_FREE_GRAD && s[6].index == rkm_graph_find_tensor(g, "y"));
        CHECK(s[7].kind == RKM_STEP_FREE && s[7].index == rkm_graph_find_tensor(g, "h"));
        CHECK(s[8].kind == RKM_STEP_BWD && s[8].index == rkm_graph_find_op(g, "a"));
        CHECK(s[9].kind == RKM_STEP_FREE_SAVED && s[9].index == rkm_graph_find_op(g, "a"));
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Writing a plan and reading it back gives the same steps; the text is
 * the same when written again. */
static void plan_round_trip(const char *graph_text)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, graph_text);
    rkm_plan *p = NULL, *q = NULL;
    sbuf a = {0}, b = {0};
    if (g && rkm_plan_baseline(g, &p) == RKM_OK) {
        CHECK(rkm_plan_write(p, sbuf_write, &a) == RKM_OK);
        CHECK(a.data && strncmp(a.data, "rockmate-plan 2", 15) == 0);
        CHECK(a.data && rkm_plan_read_string(g, a.data, a.len, "rt.rkp", NULL, &q) == RKM_OK);
        if (q) {
            CHECK(rkm_plan_num_steps(q) == rkm_plan_num_steps(p));
            CHECK(rkm_plan_num_steps(q) == rkm_plan_num_steps(p) &&
                  memcmp(rkm_plan_steps(p), rkm_plan_steps(q), rkm_plan_num_steps(p) * sizeof(rkm_step)) == 0);
            CHECK(rkm_plan_write(q, sbuf_write, &b) == RKM_OK);
            CHECK(a.len == b.len && b.data && strcmp(a.data, b.data) == 0);
        }
        CHECK(rkm_plan_write(p, fail_write, NULL) == RKM_ERROR_IO);
    }
    free(a.data);
    free(b.data);
    rkm_plan_destroy(p);
    rkm_plan_destroy(q);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

TEST(plan_file_round_trip)
{
    plan_round_trip(G_PHANTOM);
    plan_round_trip(G_ACCUM);
    plan_round_trip(G_POOL);
}

/* Plan files on disk: written, read back step for step; a missing file or
 * folder is an I/O error naming the path. */
TEST(plan_files_on_disk)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_MULTI);
    rkm_plan *p = NULL, *q = (rkm_plan *)&ctx;
    char path[64];
    snprintf(path, sizeof path, "/tmp/rkm_test_plan_%ld.rkp", (long)getpid());
    if (g && rkm_plan_baseline(g, &p) == RKM_OK) {
        CHECK(rkm_plan_write_file(p, path) == RKM_OK);
        CHECK(rkm_plan_read_file(g, path, NULL, &q) == RKM_OK);
        CHECK(q && rkm_plan_num_steps(q) == rkm_plan_num_steps(p) &&
              memcmp(rkm_plan_steps(q), rkm_plan_steps(p), rkm_plan_num_steps(p) * sizeof(rkm_step)) == 0);
        rkm_plan_destroy(q);
        remove(path);
        q = (rkm_plan *)&ctx;
        CHECK(rkm_plan_read_file(g, path, NULL, &q) == RKM_ERROR_IO && q == NULL);
        CHECK(strstr(rkm_context_errmsg(ctx), path) != NULL);
        CHECK(rkm_plan_write_file(p, "/nonexistent-dir/p.rkp") == RKM_ERROR_IO);
        CHECK(strstr(rkm_context_errmsg(ctx), "/nonexistent-dir/p.rkp") != NULL);
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Every bundled graph's baseline is valid under the simulator, and its
 * figures agree with the graph's stats. */
TEST(bundled_baselines)
{
    static const char *names[] = {TEST_BUNDLED_GRAPHS};
    for (size_t k = 0; k < N_OF(names); k++) {
        char path[256];
        test_graph_path(path, sizeof path, names[k]);
        rkm_context *ctx = test_new_ctx();
        rkm_graph *g = NULL;
        rkm_plan *p = NULL;
        rkm_result r = rkm_graph_read_file(ctx, path, &g);
        if (r != RKM_OK) fprintf(stderr, "%s: %s\n", path, rkm_context_errmsg(ctx));
        CHECK(r == RKM_OK);
        if (g && rkm_plan_baseline(g, &p) == RKM_OK) {
            rkm_plan_stats res;
            rkm_graph_stats st;
            CHECK(rkm_plan_stats_get(p, &res) == RKM_OK);
            CHECK(rkm_graph_stats_get(g, &st) == RKM_OK);
            CHECK_EQ_U64(res.peak, st.baseline_peak);
            CHECK(res.time == st.baseline_time);
            CHECK(st.lower_bound <= st.baseline_peak && st.lower_bound >= st.input_bytes);
        }
        rkm_plan_destroy(p);
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
}

/* SCRATCH: x(4,in) -f-> a(40) -g-> b(20) = loss. f saves x, phantom 8 of
 * which scratch 6 is written on every run (mean/rstd-like), fwd_ws 3.
 *  step              mem  peak  (f's call workspace; a free step's peak is mem before it)
 *  0 fwd f            44    53  4 + 40 + 3 + scratch 6: no save, P empty (ws 9)
 *  1 fwd g            64    64
 *  2 free a           24
 *  3 loss             44    44
 *  4 fwd f save       92    95  44 + 40 + phantom 8 + 3: the scratch is in the phantom (ws 3)
 *  5 bwd g           132   132  grad(a) new
 *  6 free_grad b     112
 *  7 free b           92
 *  8 fwd f            92    95  a live, P live: recomputed in place, scratch into the saved state (ws 3)
 *  9 free a           52
 * 10 bwd f            52    52  x is an input: no gradient
 * 11 free_saved f     44
 * 12 free_grad a       4
 * Peak 132 at step 5; time 3 + 1 + 1 + 1 = 6. Lower bound: f's lightest run is
 * 4 + 40 + 3 + 8 = 55 (it must save once), loss 4 + 2 x 20 = 44; g's backward
 * 4 + a 40 + grad(b) 20 + grad(a) 40 = 104. */
static const char *G_SCRATCH = "rockmate-graph 1\n"
                               "tensor x 4 input\n"
                               "tensor a 40\n"
                               "tensor b 20\n"
                               "op f fwd=1 bwd=1 in=x out=a saved=x phantom=8 fwd_ws=3 scratch=6\n"
                               "op g fwd=1 bwd=1 in=a out=b saved=a\n"
                               "loss b\n";
static const char *P_SCRATCH = "rockmate-plan 1\nfwd f\nfwd g\nfree a\nloss\nfwd f save\nbwd g\nfree_grad b\nfree b\n"
                               "fwd f\nfree a\nbwd f\nfree_saved f\nfree_grad a\n";

static int scratch_ws_seen[3], scratch_n;
static int scratch_fwd(void *user, const rkm_fwd_call *c)
{
    (void)user;
    if (scratch_n < 3) scratch_ws_seen[scratch_n] = (int)c->ws_bytes;
    scratch_n += c->op == 0;
    return 0;
}
static int scratch_bwd(void *user, const rkm_bwd_call *c)
{
    (void)user, (void)c;
    return 0;
}

TEST(scratch_written_every_run)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_SCRATCH);
    if (g) {
        static const uint64_t mem[] = {44, 64, 24, 44, 92, 132, 112, 92, 92, 52, 52, 44, 4};
        static const uint64_t peaks[] = {53, 64, 64, 44, 95, 132, 132, 112, 95, 92, 52, 52, 44}; /* a free: mem before */
        check_hand(g, P_SCRATCH, 132, 5, 6.0, mem, N_OF(mem));
        rkm_graph_stats st;
        CHECK(rkm_graph_stats_get(g, &st) == RKM_OK && st.lower_bound == 104);
        rkm_plan *p = plan_text(g, P_SCRATCH);
        if (p) {
            const uint64_t *sp = rkm_plan_step_peaks(p);
            for (size_t i = 0; i < N_OF(peaks); i++) CHECK_EQ_U64(sp[i], peaks[i]);
            /* the executor hands f the workspace the simulator counted */
            rkm_callbacks cb = {.forward = scratch_fwd, .backward = scratch_bwd};
            scratch_n = 0;
            CHECK(rkm_plan_execute(p, &cb) == RKM_OK && scratch_n == 3);
            CHECK(scratch_ws_seen[0] == 9 && scratch_ws_seen[1] == 3 && scratch_ws_seen[2] == 3);
            /* and the layout's workspace buffers have those sizes */
            size_t nb = rkm_plan_num_buffers(p), k = 0;
            rkm_buffer *buf = calloc(nb, sizeof *buf);
            uint64_t arena = 0, want[] = {9, 3, 3};
            CHECK(buf && rkm_plan_layout(p, 0, buf, &arena) == RKM_OK && arena >= 132);
            for (size_t i = 0; buf && i < nb; i++)
                if (buf[i].kind == RKM_BUFFER_WORKSPACE) CHECK(k < 3 && buf[i].bytes == want[k++]);
            CHECK(k == 3);
            free(buf);
        }
        rkm_plan_destroy(p);
        /* the baseline saves f: no transient scratch; its peak is g's backward
         * after free b: x 4, a 40, phantom 8, grad(b) 20, grad(a) 40 */
        rkm_plan *base = NULL;
        rkm_plan_stats bs;
        CHECK(rkm_plan_baseline(g, &base) == RKM_OK && rkm_plan_stats_get(base, &bs) == RKM_OK);
        CHECK_EQ_U64(bs.peak, 112);
        rkm_plan_destroy(base);
        /* the file keeps it: written, read back, the same op */
        sbuf text = {0};
        rkm_graph *back = NULL;
        rkm_op_desc od;
        CHECK(rkm_graph_write(g, sbuf_write, &text) == RKM_OK && text.data && strstr(text.data, " scratch=6"));
        if (text.data) CHECK(rkm_graph_read_string(ctx, text.data, text.len, "back.rkg", &back) == RKM_OK);
        CHECK(back && rkm_graph_op_info(back, 0, &od) == RKM_OK && od.scratch == 6 && od.phantom == 8);
        rkm_graph_destroy(back);
        free(text.data);
        /* scratch is part of the phantom */
        static const char *bad = "rockmate-graph 1\ntensor x 4 input\ntensor a 40\n"
                                 "op f fwd=1 bwd=1 in=x out=a saved=x phantom=8 scratch=9\nloss a\n";
        rkm_graph *b = NULL;
        CHECK(rkm_graph_read_string(ctx, bad, strlen(bad), "bad.rkg", &b) == RKM_ERROR_GRAPH && !b);
        CHECK(strstr(rkm_context_errmsg(ctx), "bad.rkg:4: op f: scratch=9 is more than phantom=8") != NULL);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* TIME BOUND: x(4,in) -f1-> a1(100) -f2-> a2(100) -f3-> a3(100) -f4-> l(4) =
 * loss; each op saves its input; fwd times 1, 2, 4, 8. Lower bound 304 (the
 * backward of f2 or f3: 4 + saved 100 + gradient out 100 + gradient in 100).
 * At the loss step the inputs, l and grad(l) take 12 bytes; what the
 * backwards read from the forwards is a1 (f1's), a2 (f2's), a3 (f3's), 100
 * each. Budget 304..311 leaves 292..299: two of them fit, so the cheapest op
 * to run twice is f1, 1 s; from 312 all three fit: 0. */
static const char *G_BOUND = "rockmate-graph 1\n"
                             "tensor x 4 input\ntensor a1 100\ntensor a2 100\ntensor a3 100\ntensor l 4\n"
                             "op f1 fwd=1 bwd=1 in=x out=a1 saved=x\n"
                             "op f2 fwd=2 bwd=1 in=a1 out=a2 saved=a1\n"
                             "op f3 fwd=4 bwd=1 in=a2 out=a3 saved=a2\n"
                             "op f4 fwd=8 bwd=1 in=a3 out=l saved=a3\n"
                             "loss l\n";

TEST(time_bound_hand_worked)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load(ctx, G_BOUND);
    if (g) {
        rkm_graph_stats st;
        double t = -1;
        CHECK(rkm_graph_stats_get(g, &st) == RKM_OK && st.lower_bound == 304);
        CHECK(rkm_graph_time_bound(g, 303, &t) == RKM_ERROR_BUDGET && t == 0);
        CHECK(strstr(rkm_context_errmsg(ctx), "lower bound is 304") != NULL);
        CHECK(rkm_graph_time_bound(g, 304, &t) == RKM_OK && t == 1.0);
        CHECK(rkm_graph_time_bound(g, 311, &t) == RKM_OK && t == 1.0);
        CHECK(rkm_graph_time_bound(g, 312, &t) == RKM_OK && t == 0.0);
        CHECK(rkm_graph_time_bound(g, st.baseline_peak, &t) == RKM_OK && t == 0.0);
        CHECK(rkm_graph_time_bound(g, 304, NULL) == RKM_ERROR_ARGUMENT);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(time_bound_hand_worked);
    RUN(stage_graph_hand_worked);
    RUN(scratch_written_every_run);
    RUN(inplace_hand_worked);
    RUN(inplace_graph_rules);
    RUN(inplace_gradient_chain);
    RUN(chain2_baseline);
    RUN(chain3_recompute);
    RUN(phantom_save_free_saved);
    RUN(accumulation_two_readers);
    RUN(multi_output_workspaces_inplace);
    RUN(nograd);
    RUN(inputs_counted_all_the_time);
    RUN(saved_by_producer_and_reader);
    RUN(loss_read_by_backward);
    RUN(unread_and_nograd_outputs);
    RUN(saved_by_op_without_backward);
    RUN(bundled_multi_output_by_hand);
    RUN(costs_make_a_new_graph);
    RUN(plan_create_matches_text);
    RUN(every_plan_rule);
    RUN(bad_step_rule);
    RUN(partial_figures_on_failure);
    RUN(random_walks);
    RUN(plan_file_syntax_errors);
    RUN(plan_file_reads);
    RUN(plan_file_round_trip);
    RUN(plan_files_on_disk);
    RUN(bundled_baselines);
    TEST_END();
}
