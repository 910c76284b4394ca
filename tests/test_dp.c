/* test_dp.c -- the chain DP (src/chain.c) against exhaustive search. */
#include "../src/internal.h"
/* white box: the statics it calls are chain.c's; the rest links from the
 * sources' objects (compiling the whole library into each test took ~25 s
 * of its build). */
#include "../src/chain.c"
#include "test.h"
#include "tiny_graph.h"

/* ---- helpers ------------------------------------------------------------ */

/* Random chains checked against exhaustive search (-DDP_SEEDS=5000 for a
 * deeper run). */
#ifndef DP_SEEDS
#define DP_SEEDS 60
#endif
#define MAXB 6
#define MAXK 3
/* A move of the search: no-save run of blocks block..option-1, intermediates freed. */
#define NOSAVE_RUN (RKM__DP_FETCH_IN + 1) /* the copy ops before it need a link: none here */

typedef struct chain {
    int32_t n;
    rkm__dp_block b[MAXB];
    rkm__dp_option o[MAXB][MAXK];
} chain;

/* Random chain; times are multiples of 1/4 (sums are exact), some zero.
 * Peaks are sometimes below their live sets, to exercise the raise. */
static void chain_random(chain *c, int32_t n, int32_t kmax)
{
    /* half the chains have gradients as large as their tensors, as real ones */
    int same_grads = rng_int(0, 1);
    c->n = n;
    for (int32_t i = 0; i < n; i++) {
        rkm__dp_block *b = &c->b[i];
        b->in_sz = i == 0 ? 0 : rng_int(0, 4);
        b->g_out = i == n - 1 ? 0 : rng_int(0, 4);
        b->tfn = rng_int(0, 12) / 4.0;
        b->n_opt = rng_int(1, kmax);
        b->opt = c->o[i];
        b->to_host = b->from_host = 0; /* no copy link: dp_twins sets them */
        for (int32_t k = 0; k < b->n_opt; k++) {
            rkm__dp_option *o = &c->o[i][k];
            o->kept = rng_int(0, 5);
            o->tf = rng_int(0, 12) / 4.0;
            o->tb = rng_int(0, 16) / 4.0;
            o->pf = rng_int(0, 14);
            o->pb = rng_int(0, 18);
        }
    }
    for (int32_t i = 0; i < n; i++) {
        c->b[i].pfn = rng_int(0, 10);
        if (same_grads) c->b[i].g_out = (int32_t)rkm__dp_out(c->b, n, i);
    }
}

/* ---- exhaustive search ---------------------------------------------------
 * Dijkstra over every state of the block-level model (which x_i live, which
 * option's kept state each block holds, how far the backward went), with
 * every op that rkm__dp_apply allows and whose peak fits m. */

typedef struct bf {
    const chain *c;
    int32_t n, kb;          /* kb = 1 + most options of a block */
    size_t pk, nstates;     /* kb^n, all states */
    double *dist;
    uint8_t *done;
    size_t *from;           /* predecessor state, to print a schedule */
    rkm__dp_op *via;        /* and the op from it */
    tiny_heap heap;         /* lazy heap of state keys */
} bf;

static size_t bf_key(const bf *f, const rkm__dp_state *s)
{
    size_t kc = 0, xb = 0;
    for (int32_t i = f->n - 1; i >= 0; i--) {
        kc = kc * (size_t)f->kb + (size_t)s->kept[i];
        xb = xb * 2 + s->x[i];
    }
    return (((size_t)(s->front + 1) * f->pk) + kc) * ((size_t)1 << f->n) + xb;
}

static void bf_decode(const bf *f, size_t key, rkm__dp_state *s)
{
    size_t xb = key % ((size_t)1 << f->n), rest = key >> f->n, kc = rest % f->pk;
    s->front = (int32_t)(rest / f->pk) - 1;
    s->mem = 0;
    for (int32_t i = 0; i < f->n; i++) {
        s->x[i] = (uint8_t)(xb & 1);
        xb >>= 1;
        s->kept[i] = (int32_t)(kc % (size_t)f->kb);
        kc /= (size_t)f->kb;
        if (s->x[i]) s->mem += rkm__dp_out(f->c->b, f->n, i);
        if (s->kept[i]) s->mem += f->c->b[i].opt[s->kept[i] - 1].kept;
    }
    if (s->front >= 0) s->mem += f->c->b[s->front].g_out;
    s->peak = 0;
    s->time = 0;
}

static const char *const op_names[] = {"F", "B", "N", "free", "off", "drop", "fetch", "run"};

static void print_op(const rkm__dp_op *op)
{
    fprintf(stderr, " %s%d", op_names[op->kind], (int)op->block);
    if (op->kind <= RKM__DP_BWD_OPT || op->kind == NOSAVE_RUN) fprintf(stderr, "/%d", (int)op->option);
}

/* Print the ops from start to key (on a mismatch, to see what the DP missed). */
static void bf_print(const bf *f, size_t start, size_t key)
{
    size_t n = 0;
    for (size_t k = key; k != start; k = f->from[k]) n++;
    rkm__dp_op *ops = malloc((n ? n : 1) * sizeof *ops);
    for (size_t k = key, i = n; k != start; k = f->from[k]) ops[--i] = f->via[k];
    fprintf(stderr, "brute:");
    for (size_t i = 0; i < n; i++) print_op(&ops[i]);
    fprintf(stderr, "\n");
    free(ops);
}

/* Is some x_j, j >= i, live? */
static int live_from(const rkm__dp_state *s, int32_t n, int32_t i)
{
    for (int32_t j = i; j < n; j++)
        if (s->x[j]) return 1;
    return 0;
}

/* Search modes. ALL: every schedule of the model. PERSISTENT: the class the
 * recurrence covers (Rotor's): (1) forward work starts only right of every
 * live x (from the last checkpoint); (2) a checkpoint x_i stays until its
 * gradient exists (front == i), except the intermediates of a no-save run,
 * each freed right after the next block of the run read it. In ALL mode the
 * search finds cheaper schedules that break (1) or (2) now and then; see
 * dp_persistent_gap. */
enum { ALL, PERSISTENT };

/* Apply one move of the search to s; 0 if allowed. */
static int bf_move(const chain *c, rkm__dp_state *s, const rkm__dp_op *op, int mode)
{
    if (mode == ALL) return op->kind == NOSAVE_RUN || rkm__dp_apply(c->b, c->n, s, op) != NULL;
    /* persistent: single no-save forwards only inside runs */
    if (op->kind == RKM__DP_FWD_NOSAVE || (op->kind == RKM__DP_FREE_OUT && s->front != op->block) ||
        (op->kind != RKM__DP_BWD_OPT && op->kind != RKM__DP_FREE_OUT && live_from(s, c->n, op->block)))
        return 1;
    if (op->kind != NOSAVE_RUN) return rkm__dp_apply(c->b, c->n, s, op) != NULL;
    for (int32_t t = op->block; t < op->option; t++) {
        rkm__dp_op ns = {RKM__DP_FWD_NOSAVE, t, -1}, fr = {RKM__DP_FREE_OUT, t - 1, -1};
        if (rkm__dp_apply(c->b, c->n, s, &ns) || (t > op->block && rkm__dp_apply(c->b, c->n, s, &fr))) return 1;
    }
    return 0;
}

/* Least time of a whole step within m slots; INFINITY if none. */
static double brute(const chain *c, int32_t m, int mode, int print)
{
    bf f = {c, c->n, 1, 1, 0, NULL, NULL, NULL, NULL, {NULL, 0, 0}};
    for (int32_t i = 0; i < c->n; i++) f.kb = c->b[i].n_opt + 1 > f.kb ? c->b[i].n_opt + 1 : f.kb;
    for (int32_t i = 0; i < c->n; i++) f.pk *= (size_t)f.kb;
    f.nstates = (size_t)(c->n + 1) * f.pk << c->n;
    f.dist = malloc(f.nstates * sizeof *f.dist);
    f.done = calloc(f.nstates, 1);
    f.from = malloc(f.nstates * sizeof *f.from);
    f.via = malloc(f.nstates * sizeof *f.via);
    for (size_t i = 0; i < f.nstates; i++) f.dist[i] = INFINITY;
    uint8_t x[MAXB], away[MAXB];
    double sent[MAXB];
    int32_t kept[MAXB];
    rkm__dp_state s = {.x = x, .away = away, .sent = sent, .kept = kept};
    rkm__dp_state_reset(&s, c->n);
    size_t start = bf_key(&f, &s);
    f.dist[start] = 0;
    tiny_heap_push(&f.heap, 0, start);
    double result = INFINITY;
    while (f.heap.n > 0) {
        size_t key = (size_t)tiny_heap_pop(&f.heap).id;
        if (f.done[key]) continue;
        f.done[key] = 1;
        bf_decode(&f, key, &s);
        if (s.front == -1) {
            result = f.dist[key];
            if (print) bf_print(&f, start, key);
            break;
        }
        for (int32_t i = 0; i < c->n; i++) {
            for (int32_t kind = RKM__DP_FWD_OPT; kind <= NOSAVE_RUN; kind++) {
                if (kind > RKM__DP_FREE_OUT && kind < NOSAVE_RUN) continue;
                int32_t nk = kind <= RKM__DP_BWD_OPT ? c->b[i].n_opt : kind == NOSAVE_RUN ? c->n + 1 : 1;
                for (int32_t k = 0; k < nk; k++) {
                    rkm__dp_op op = {kind, i, kind <= RKM__DP_BWD_OPT || kind == NOSAVE_RUN ? k : -1};
                    if (kind == NOSAVE_RUN && k <= i) continue;
                    bf_decode(&f, key, &s);
                    if (bf_move(c, &s, &op, mode) || s.peak > m) continue;
                    size_t nkey = bf_key(&f, &s);
                    double d = f.dist[key] + s.time;
                    if (d < f.dist[nkey]) {
                        f.dist[nkey] = d;
                        f.from[nkey] = key;
                        f.via[nkey] = op;
                        tiny_heap_push(&f.heap, d, nkey);
                    }
                }
            }
        }
    }
    free(f.dist);
    free(f.done);
    free(f.from);
    free(f.via);
    free(f.heap.v);
    return result;
}

/* ---- tests -------------------------------------------------------------- */

/* Reconstruct at m and replay: the time must be Opt, the peak within m. */
static void check_schedule(rkm_context *ctx, const chain *c, rkm__dp_table *t, int32_t m)
{
    rkm__dp_ops ops = {NULL, 0, 0};
    double time = -1;
    int64_t peak = -1;
    CHECK(rkm__dp_schedule(ctx, t, m, &ops) == RKM_OK);
    CHECK(rkm__dp_eval(ctx, c->b, c->n, &ops, &time, &peak) == RKM_OK);
    CHECK(time == rkm__dp_opt(t, 0, c->n - 1, m));
    CHECK(peak <= m);
    rkm__dp_ops_free(ctx, &ops);
}

static void report_mismatch(rkm_context *ctx, const chain *c, rkm__dp_table *t, int32_t m, double bt)
{
    fprintf(stderr, "n=%d m=%d: brute %g, DP %g\n", (int)c->n, (int)m, bt, rkm__dp_opt(t, 0, c->n - 1, m));
    for (int32_t i = 0; i < c->n; i++) {
        const rkm__dp_block *b = &c->b[i];
        fprintf(stderr, "  block %d: in %d gout %d pfn %d tfn %g |", (int)i, (int)b->in_sz, (int)b->g_out,
                (int)b->pfn, b->tfn);
        for (int32_t k = 0; k < b->n_opt; k++)
            fprintf(stderr, " (tf %g tb %g kept %d pf %d pb %d)", b->opt[k].tf, b->opt[k].tb, (int)b->opt[k].kept,
                    (int)b->opt[k].pf, (int)b->opt[k].pb);
        fprintf(stderr, "\n");
    }
    brute(c, m, PERSISTENT, 1);
    brute(c, m, ALL, 1);
    rkm__dp_ops ops = {NULL, 0, 0};
    if (isfinite(rkm__dp_opt(t, 0, c->n - 1, m)) && rkm__dp_schedule(ctx, t, m, &ops) == RKM_OK) {
        fprintf(stderr, "DP:   ");
        for (size_t i = 0; i < ops.n; i++) print_op(&ops.v[i]);
        fprintf(stderr, "\n");
    }
    rkm__dp_ops_free(ctx, &ops);
}

/* Every m of a random chain: Opt is the exhaustive optimum, non-increasing,
 * infinite exactly below the minimum, and its schedule replays to it. */
static void check_chain(rkm_context *ctx, const chain *c, int32_t mmax, int brute_every)
{
    rkm__dp_table t;
    int64_t lo = -1;
    CHECK(rkm__dp_min_slots(ctx, c->b, c->n, &lo) == RKM_OK);
    CHECK(rkm__dp_solve(ctx, c->b, c->n, mmax, INFINITY, &t, NULL) == RKM_OK);
    if (!t.cost) return;
    for (int32_t m = 0; m <= mmax; m++) {
        double opt = rkm__dp_opt(&t, 0, c->n - 1, m);
        CHECK((m < lo) == !isfinite(opt));
        if (m > 0) CHECK(opt <= rkm__dp_opt(&t, 0, c->n - 1, m - 1));
        if (isfinite(opt)) check_schedule(ctx, c, &t, m);
        if ((m - lo) % brute_every == 0 || m == lo - 1 || m == mmax) {
            double bt = brute(c, m, PERSISTENT, 0);
            if (bt != opt) report_mismatch(ctx, c, &t, m, bt);
            CHECK(bt == opt);
        }
    }
    rkm__dp_table_free(ctx, &t);
}

TEST(dp_matches_brute_force)
{
    rkm_context *ctx = test_new_ctx();
    for (uint64_t seed = 1; seed <= DP_SEEDS; seed++) {
        chain c;
        rng_seed(seed);
        int32_t n = 1 + (int32_t)(seed % 6);
        chain_random(&c, n, n >= 6 ? 2 : MAXK);
        check_chain(ctx, &c, 60, n >= 5 ? 7 : 2);
    }
    rkm_context_destroy(ctx);
}

/* Outside the persistent class the model has cheaper schedules at times
 * (non-nested use of checkpoints; Rotor's DP shares this limit); they never
 * beat the DP the other way round, and the DP's own schedules are in it. */
TEST(dp_persistent_gap)
{
    rkm_context *ctx = test_new_ctx();
    for (uint64_t seed = 500; seed < 530; seed++) {
        chain c;
        rng_seed(seed);
        chain_random(&c, 3 + (int32_t)(seed % 3), MAXK);
        rkm__dp_table t;
        int64_t lo;
        CHECK(rkm__dp_min_slots(ctx, c.b, c.n, &lo) == RKM_OK);
        CHECK(rkm__dp_solve(ctx, c.b, c.n, (int32_t)lo + 12, INFINITY, &t, NULL) == RKM_OK);
        for (int32_t m = (int32_t)lo - 1; m <= lo + 12; m += 3) {
            double all = brute(&c, m, ALL, 0), opt = rkm__dp_opt(&t, 0, c.n - 1, m);
            CHECK(all <= opt);
            CHECK(isfinite(all) == isfinite(opt)); /* the minimum memory is the same */
        }
        rkm__dp_table_free(ctx, &t);
    }
    rkm_context_destroy(ctx);
}

/* dp_rotor_hand_worked's chain, x0 and x1 copied to host memory in
 * to_host and back in from_host (0: no link), solved for 0..14 slots into
 * *t; its least feasible m is 9. */
static void rotor_chain(rkm_context *ctx, chain *c, double to_host, double from_host, rkm__dp_table *t)
{
    static const rkm__dp_option o0 = {1, 2, 3, 5, 7}, o1 = {1, 2, 3, 7, 9}, o2 = {1, 2, 3, 5, 5};
    int64_t lo = 0;
    memset(c, 0, sizeof *c);
    c->n = 3;
    c->b[0] = (rkm__dp_block){0, 2, 2, 1, 1, &o0, 0, 0};
    c->b[1] = (rkm__dp_block){2, 2, 4, 1, 1, &o1, to_host, from_host};
    c->b[2] = (rkm__dp_block){2, 0, 2, 1, 1, &o2, to_host, from_host};
    CHECK(rkm__dp_solve(ctx, c->b, 3, 14, INFINITY, t, NULL) == RKM_OK);
    CHECK(rkm__dp_min_slots(ctx, c->b, 3, &lo) == RKM_OK && lo == 9);
}

/* Rotor: one option ("keep everything") per block plus the no-save forward.
 * x0 and x1 have 2 slots, as their gradients; every block keeps 3 slots.
 *   block 0: pf 0+2+3 = 5, pb 0+2+3+2 = 7, pfn 2
 *   block 1: pf 2+2+3 = 7, pb 2+2+3+2 = 9, pfn 4
 *   block 2: pf 2+0+3 = 5, pb 2+0+3+0 = 5, pfn 2      (tfn 1, tf 1, tb 2)
 * Opt(2,2,m) = 3 for m >= 5. Opt(1,1,m) = Opt(0,0,m) = 3 for m >= 9 and 7
 * (their F runs beside a 2-slot gradient). Opt(1,2,m): option, inner
 * Opt(2,2,m-5), pb 9: 6 for m >= 10; checkpoint 2: 1 + Opt(2,2,m-2) +
 * Opt(1,1,m) = 7 for m >= 9. Top, Opt(0,2,m):
 *   m = 13: option, 3 + Opt(1,2,10) = 9 (keep everything)
 *   m = 12: option 3 + Opt(1,2,9) = 10 ties checkpoint 1, 1 + 6 + 3: option
 *   m = 10, 11: option needs Opt(1,2,7..8), infinite; checkpoint 1 gives 10
 *   m = 9: checkpoint 1, 1 + Opt(1,2,9) + 3 = 11 (checkpoint 2 costs 12)
 *   m = 8: B of block 1 alone needs 9: infinite. */
TEST(dp_rotor_hand_worked)
{
    chain c;
    rkm_context *ctx = test_new_ctx();
    rkm__dp_table t;
    rotor_chain(ctx, &c, 0, 0, &t);
    static const double want[] = {INFINITY, 11, 10, 10, 10, 9, 9};
    for (int32_t m = 8; m <= 14; m++) CHECK(rkm__dp_opt(&t, 0, 2, m) == want[m - 8]);
    CHECK(rkm__dp_decision(&t, 0, 2, 12) == 0);
    CHECK(rkm__dp_decision(&t, 0, 2, 10) == RKM__DP_CKPT + 1);
    CHECK(rkm__dp_decision(&t, 0, 2, 8) == RKM__DP_NONE);
    rkm__dp_ops ops = {NULL, 0, 0};
    CHECK(rkm__dp_schedule(ctx, &t, 9, &ops) == RKM_OK);
    static const rkm__dp_op sched[] = {{RKM__DP_FWD_NOSAVE, 0, -1}, {RKM__DP_FWD_NOSAVE, 1, -1},
                                       {RKM__DP_FWD_OPT, 2, 0},     {RKM__DP_BWD_OPT, 2, 0},
                                       {RKM__DP_FREE_OUT, 1, -1},   {RKM__DP_FWD_OPT, 1, 0},
                                       {RKM__DP_BWD_OPT, 1, 0},     {RKM__DP_FREE_OUT, 0, -1},
                                       {RKM__DP_FWD_OPT, 0, 0},     {RKM__DP_BWD_OPT, 0, 0}};
    CHECK(ops.n == sizeof sched / sizeof sched[0]);
    CHECK(ops.n == sizeof sched / sizeof sched[0] && memcmp(ops.v, sched, sizeof sched) == 0);
    rkm__dp_ops_free(ctx, &ops);
    CHECK(rkm__dp_schedule(ctx, &t, 8, &ops) == RKM_ERROR_BUDGET);
    rkm__dp_ops_free(ctx, &ops);
    rkm__dp_table_free(ctx, &t);
    rkm_context_destroy(ctx);
}

/* Twins (a copy link: x_{a-1} in host memory around the segment after the
 * forward), on dp_rotor_hand_worked's chain with x0 and x1 copied out in
 * 0.5 and back in 0.25 (the offload hides behind a forward of 1, the
 * prefetch does not). Opt(1,2,m): option 0's twin, 3 + 0.25 +
 * Opt(2,2,m-3), kept only beside the inner segment, 6.25 for m >= 9 (pb
 * 9), where the plain option needs m >= 10 (6); checkpoint 2's twin costs
 * 7.25. Top, Opt(0,2,m) (block 0 has no input: no twin):
 *   m = 9: checkpoint 1, 1 + 6.25 + 3 = 10.25 (plain: 11)
 *   m = 10, 11: checkpoint 1, 10 (as plain: the inner plain option is 6)
 *   m = 12: option, 3 + Opt(1,2,9) = 9.25 (plain: 10)
 *   m = 13: option, 9; m = 8: B of block 1 alone needs 9: infinite.
 * At m = 12 the schedule offloads x0 before F of block 1, drops it after,
 * fetches it before B of block 1; it replays to 9.25, within 12 slots. */
TEST(dp_twins_hand_worked)
{
    chain c;
    rkm_context *ctx = test_new_ctx();
    rkm__dp_table t;
    rotor_chain(ctx, &c, 0.5, 0.25, &t);
    static const double want[] = {INFINITY, 10.25, 10, 10, 9.25, 9, 9};
    for (int32_t m = 8; m <= 14; m++) CHECK(rkm__dp_opt(&t, 0, 2, m) == want[m - 8]);
    CHECK(rkm__dp_opt(&t, 1, 2, 9) == 6.25 && rkm__dp_decision(&t, 1, 2, 9) == (0 | RKM__DP_OFF));
    CHECK(rkm__dp_decision(&t, 1, 2, 10) == 0 && rkm__dp_decision(&t, 0, 2, 12) == 0);
    rkm__dp_ops ops = {NULL, 0, 0};
    CHECK(rkm__dp_schedule(ctx, &t, 12, &ops) == RKM_OK);
    static const rkm__dp_op sched[] = {{RKM__DP_FWD_OPT, 0, 0},   {RKM__DP_OFFLOAD_IN, 1, -1}, {RKM__DP_FWD_OPT, 1, 0},
                                       {RKM__DP_DROP_IN, 1, -1},  {RKM__DP_FWD_OPT, 2, 0},     {RKM__DP_BWD_OPT, 2, 0},
                                       {RKM__DP_FETCH_IN, 1, -1}, {RKM__DP_BWD_OPT, 1, 0},     {RKM__DP_BWD_OPT, 0, 0}};
    CHECK(ops.n == sizeof sched / sizeof sched[0] && memcmp(ops.v, sched, sizeof sched) == 0);
    double time = -1;
    int64_t peak = -1;
    CHECK(rkm__dp_eval(ctx, c.b, 3, &ops, &time, &peak) == RKM_OK && time == 9.25 && peak == 12);
    rkm__dp_ops_free(ctx, &ops);
    /* a copy op out of place is refused: a fetch of what is on the device */
    static const rkm__dp_op bad[] = {{RKM__DP_FWD_OPT, 0, 0}, {RKM__DP_FETCH_IN, 1, -1}};
    rkm__dp_ops b = {(rkm__dp_op *)bad, 2, 2};
    CHECK(rkm__dp_eval(ctx, c.b, 3, &b, &time, &peak) == RKM_ERROR_PLAN && strstr(rkm_context_errmsg(ctx), "fetch"));
    rkm__dp_table_free(ctx, &t);
    rkm_context_destroy(ctx);
}

/* Random chains with copy times (quarters, so every sum is exact): the
 * twins never cost time or memory (Opt and the least feasible m at most
 * the plain chain's), they win somewhere, and every schedule replays to Opt
 * within m. */
TEST(dp_twins)
{
    rkm_context *ctx = test_new_ctx();
    int wins = 0;
    for (uint64_t seed = 200; seed < 240; seed++) {
        chain c, d;
        rng_seed(seed);
        chain_random(&c, 2 + (int32_t)(seed % 5), MAXK);
        d = c;
        for (int32_t i = 0; i < d.n; i++) {
            d.b[i].opt = d.o[i];
            d.b[i].to_host = rng_int(0, 8) / 4.0;
            d.b[i].from_host = rng_int(0, 4) / 4.0;
        }
        for (int32_t i = 0; i < c.n; i++) c.b[i].opt = c.o[i];
        rkm__dp_table tc, td;
        int64_t lc = -1, ld = -1;
        CHECK(rkm__dp_min_slots(ctx, c.b, c.n, &lc) == RKM_OK && rkm__dp_min_slots(ctx, d.b, d.n, &ld) == RKM_OK);
        CHECK(ld <= lc);
        CHECK(rkm__dp_solve(ctx, c.b, c.n, 60, INFINITY, &tc, NULL) == RKM_OK);
        CHECK(rkm__dp_solve(ctx, d.b, d.n, 60, INFINITY, &td, NULL) == RKM_OK);
        for (int32_t m = 0; m <= 60 && tc.cost && td.cost; m++) {
            double a = rkm__dp_opt(&tc, 0, c.n - 1, m), b = rkm__dp_opt(&td, 0, d.n - 1, m);
            CHECK(b <= a && (m < ld) == !isfinite(b));
            wins += b < a;
            if (isfinite(b)) check_schedule(ctx, &d, &td, m);
        }
        rkm__dp_table_free(ctx, &tc);
        rkm__dp_table_free(ctx, &td);
    }
    CHECK(wins > 0);
    fprintf(stderr, "  dp_twins: twins faster at %d budgets\n", wins);
    rkm_context_destroy(ctx);
}

/* The sqrt schedule is valid, and the DP does at least as well at its peak. */
TEST(dp_sqrt_schedule)
{
    rkm_context *ctx = test_new_ctx();
    for (uint64_t seed = 100; seed < 140; seed++) {
        chain c;
        rng_seed(seed);
        chain_random(&c, 1 + (int32_t)(seed % 6), MAXK);
        rkm__dp_ops ops = {NULL, 0, 0};
        double time = -1;
        int64_t peak = -1;
        CHECK(rkm__dp_sqrt(ctx, c.b, c.n, 0, &ops) == RKM_OK);
        CHECK(rkm__dp_eval(ctx, c.b, c.n, &ops, &time, &peak) == RKM_OK);
        rkm__dp_table t;
        CHECK(peak >= 0 && rkm__dp_solve(ctx, c.b, c.n, (int32_t)peak, INFINITY, &t, NULL) == RKM_OK);
        CHECK(rkm__dp_opt(&t, 0, c.n - 1, (int32_t)peak) <= time);
        rkm__dp_table_free(ctx, &t);
        rkm__dp_ops_free(ctx, &ops);
    }
    rkm_context_destroy(ctx);
}

/* 9 blocks: segments of 3; forward keeps x2 and x5. */
TEST(dp_sqrt_shape)
{
    static const rkm__dp_option o[2] = {{1, 1, 0, 0, 0}, {0.5, 1, 5, 0, 0}};
    rkm__dp_block b[9];
    for (int i = 0; i < 9; i++) b[i] = (rkm__dp_block){i ? 1 : 0, i < 8 ? 1 : 0, 0, 1, 2, o, 0, 0};
    rkm_context *ctx = test_new_ctx();
    rkm__dp_ops ops = {NULL, 0, 0};
    CHECK(rkm__dp_sqrt(ctx, b, 9, 0, &ops) == RKM_OK);
    /* 6 no-save forwards, 4 frees inside segments, 2 boundary frees, 9 F, 9 B */
    CHECK(ops.n == 6 + 4 + 2 + 9 + 9);
    int nosave = 0, fastest = 1;
    for (size_t i = 0; i < ops.n; i++) {
        nosave += ops.v[i].kind == RKM__DP_FWD_NOSAVE;
        if (ops.v[i].kind == RKM__DP_FWD_OPT) fastest &= ops.v[i].option == 1; /* 1.5 < 2 */
    }
    CHECK(nosave == 6 && fastest);
    CHECK(ops.n > 11 && ops.v[10].kind == RKM__DP_FWD_OPT && ops.v[10].block == 6);
    double time;
    int64_t peak;
    CHECK(rkm__dp_eval(ctx, b, 9, &ops, &time, &peak) == RKM_OK);
    CHECK(time == 6 * 1 + 9 * 1.5);
    rkm__dp_ops_free(ctx, &ops);
    rkm_context_destroy(ctx);
}

/* The same 9 blocks, full recomputation (segments of 1): the forward keeps
 * every block's input (8 no-save forwards, no frees), then each block from
 * the last is run again with its fastest option and its backward, its
 * output freed first (but the last's: the loss). */
TEST(dp_full_shape)
{
    static const rkm__dp_option o[2] = {{1, 1, 0, 0, 0}, {0.5, 1, 5, 0, 0}};
    rkm__dp_block b[9];
    for (int i = 0; i < 9; i++) b[i] = (rkm__dp_block){i ? 1 : 0, i < 8 ? 1 : 0, 0, 1, 2, o, 0, 0};
    rkm_context *ctx = test_new_ctx();
    rkm__dp_ops ops = {NULL, 0, 0};
    CHECK(rkm__dp_sqrt(ctx, b, 9, 1, &ops) == RKM_OK);
    CHECK(ops.n == 8 + 8 + 9 + 9);
    for (size_t i = 0; i < 8 && i < ops.n; i++) CHECK(ops.v[i].kind == RKM__DP_FWD_NOSAVE && ops.v[i].block == (int32_t)i);
    CHECK(ops.n > 10 && ops.v[8].kind == RKM__DP_FWD_OPT && ops.v[8].block == 8 && ops.v[9].kind == RKM__DP_BWD_OPT);
    CHECK(ops.n > 12 && ops.v[10].kind == RKM__DP_FREE_OUT && ops.v[10].block == 7 && ops.v[11].kind == RKM__DP_FWD_OPT &&
          ops.v[11].block == 7);
    double time;
    int64_t peak;
    CHECK(rkm__dp_eval(ctx, b, 9, &ops, &time, &peak) == RKM_OK);
    CHECK(time == 8 * 1 + 9 * 1.5);
    rkm__dp_ops_free(ctx, &ops);
    rkm_context_destroy(ctx);
}

/* A solve whose deadline has passed stops after its first tile of columns:
 * the table holds those (M is the last), each the full table's, with its
 * schedules; where it was not cut, the deadline changed nothing. */
TEST(dp_deadline_keeps_the_columns_done)
{
    rkm_context *ctx = test_new_ctx();
    chain c;
    rng_seed(7);
    chain_random(&c, 6, MAXK);
    int32_t M = 3 * 256 + 10;
    rkm__dp_table full, part, ample;
    int cut = -1, cut2 = -1;
    CHECK(rkm__dp_solve(ctx, c.b, c.n, M, INFINITY, &full, NULL) == RKM_OK);
    CHECK(rkm__dp_solve(ctx, c.b, c.n, M, -1.0, &part, &cut) == RKM_OK); /* passed at once */
    CHECK(rkm__dp_solve(ctx, c.b, c.n, M, 1e300, &ample, &cut2) == RKM_OK);
    CHECK(cut == 1 && part.M == 255 && cut2 == 0 && ample.M == M);
    for (int32_t m = 0; m <= M && full.cost && part.cost && ample.cost; m++) {
        double f = rkm__dp_opt(&full, 0, c.n - 1, m);
        CHECK(rkm__dp_opt(&ample, 0, c.n - 1, m) == f);
        if (m > part.M) continue;
        CHECK(rkm__dp_opt(&part, 0, c.n - 1, m) == f);
        if (isfinite(f)) check_schedule(ctx, &c, &part, m);
    }
    rkm__dp_ops ops = {NULL, 0, 0};
    CHECK(rkm__dp_schedule(ctx, &part, part.M + 1, &ops) == RKM_ERROR_ARGUMENT); /* past the columns done */
    rkm__dp_ops_free(ctx, &ops);
    rkm__dp_table_free(ctx, &full);
    rkm__dp_table_free(ctx, &part);
    rkm__dp_table_free(ctx, &ample);
    rkm_context_destroy(ctx);
}

/* Equal candidates: the first option wins; options before checkpoints. */
TEST(dp_ties)
{
    static const rkm__dp_option o[3] = {{1, 1, 2, 0, 0}, {1, 1, 1, 0, 0}, {2, 0, 0, 0, 0}};
    rkm__dp_block b[2] = {{0, 1, 0, 0, 3, o, 0, 0}, {1, 0, 0, 0, 3, o, 0, 0}};
    rkm_context *ctx = test_new_ctx();
    rkm__dp_table t;
    CHECK(rkm__dp_solve(ctx, b, 2, 20, INFINITY, &t, NULL) == RKM_OK);
    /* Every choice costs 4 at m = 20 (no-save forwards are free). */
    CHECK(rkm__dp_opt(&t, 0, 1, 20) == 4);
    CHECK(rkm__dp_decision(&t, 0, 1, 20) == 0);
    rkm__dp_table_free(ctx, &t);
    rkm_context_destroy(ctx);
}

/* An allocator that fails from the k-th call and checks every free's size. */
typedef struct fail_alloc {
    int calls, fail_at;
    long long live;
} fail_alloc;

static void *fail_fn(void *user, void *ptr, size_t old_size, size_t new_size)
{
    fail_alloc *f = user;
    if (new_size == 0) {
        f->live -= (long long)old_size;
        free(ptr);
        return NULL;
    }
    if (++f->calls == f->fail_at) return NULL;
    void *p = realloc(ptr, new_size);
    if (p) f->live += (long long)new_size - (long long)(ptr ? old_size : 0);
    return p;
}

TEST(dp_nomem_and_arguments)
{
    chain c;
    rng_seed(7);
    chain_random(&c, 5, MAXK);
    for (int fail_at = 2; fail_at < 40; fail_at++) {
        fail_alloc f = {0, fail_at, 0};
        rkm_context_desc d = {fail_fn, &f, NULL, NULL, 0};
        rkm_context *ctx = NULL;
        CHECK(rkm_context_create(&d, &ctx) == RKM_OK);
        if (!ctx) continue;
        long long base = f.live;
        rkm__dp_table t;
        rkm_result r = rkm__dp_solve(ctx, c.b, c.n, 40, INFINITY, &t, NULL);
        rkm__dp_ops ops = {NULL, 0, 0};
        if (r == RKM_OK) {
            rkm_result r2 = rkm__dp_schedule(ctx, &t, 40, &ops);
            CHECK(r2 == RKM_OK || r2 == RKM_ERROR_NOMEM);
            rkm__dp_ops_free(ctx, &ops);
            rkm__dp_table_free(ctx, &t);
        } else {
            CHECK(r == RKM_ERROR_NOMEM);
            CHECK(strstr(rkm_context_errmsg(ctx), "out of memory") != NULL);
        }
        CHECK(f.live == base);
        rkm_context_destroy(ctx);
    }
    rkm_context *ctx = test_new_ctx();
    rkm__dp_table t;
    c.b[0].in_sz = 1;
    CHECK(rkm__dp_solve(ctx, c.b, c.n, 10, INFINITY, &t, NULL) == RKM_ERROR_ARGUMENT);
    c.b[0].in_sz = 0;
    c.b[2].tfn = NAN;
    CHECK(rkm__dp_solve(ctx, c.b, c.n, 10, INFINITY, &t, NULL) == RKM_ERROR_ARGUMENT);
    c.b[2].tfn = 1;
    CHECK(rkm__dp_solve(ctx, c.b, c.n, -1, INFINITY, &t, NULL) == RKM_ERROR_ARGUMENT);
    c.b[3].n_opt = 0; /* a block without options: never feasible */
    int64_t lo;
    CHECK(rkm__dp_min_slots(ctx, c.b, c.n, &lo) == RKM_ERROR_BUDGET);
    CHECK(rkm__dp_solve(ctx, c.b, c.n, 50, INFINITY, &t, NULL) == RKM_OK);
    CHECK(!isfinite(rkm__dp_opt(&t, 0, c.n - 1, 50)));
    rkm__dp_table_free(ctx, &t);
    rkm_context_destroy(ctx);
}

/* A bad schedule is refused with the op that breaks the model. */
TEST(dp_eval_rejects)
{
    static const rkm__dp_option o = {1, 1, 1, 0, 0};
    rkm__dp_block b[2] = {{0, 1, 0, 1, 1, &o, 0, 0}, {1, 0, 0, 1, 1, &o, 0, 0}};
    rkm_context *ctx = test_new_ctx();
    double time;
    int64_t peak;
    /* backward of block 0 before block 1's */
    rkm__dp_op bad1[] = {{RKM__DP_FWD_OPT, 0, 0}, {RKM__DP_FWD_OPT, 1, 0}, {RKM__DP_BWD_OPT, 0, 0}};
    rkm__dp_ops ops = {bad1, 3, 3};
    CHECK(rkm__dp_eval(ctx, b, 2, &ops, &time, &peak) == RKM_ERROR_PLAN);
    CHECK(strstr(rkm_context_errmsg(ctx), "op 2") != NULL);
    /* freeing x0 while block 1 holds kept state */
    rkm__dp_op bad2[] = {{RKM__DP_FWD_NOSAVE, 0, -1}, {RKM__DP_FWD_OPT, 1, 0}, {RKM__DP_FREE_OUT, 0, -1}};
    ops.v = bad2;
    CHECK(rkm__dp_eval(ctx, b, 2, &ops, &time, &peak) == RKM_ERROR_PLAN);
    /* unfinished */
    ops.n = 2;
    CHECK(rkm__dp_eval(ctx, b, 2, &ops, &time, &peak) == RKM_ERROR_PLAN);
    /* good: 1 slot x0 + 1 kept, then block 1's kept on top */
    rkm__dp_op good[] = {{RKM__DP_FWD_OPT, 0, 0}, {RKM__DP_FWD_OPT, 1, 0}, {RKM__DP_BWD_OPT, 1, 0},
                         {RKM__DP_BWD_OPT, 0, 0}};
    ops = (rkm__dp_ops){good, 4, 4};
    CHECK(rkm__dp_eval(ctx, b, 2, &ops, &time, &peak) == RKM_OK);
    CHECK(time == 4 && peak == 3);
    rkm_context_destroy(ctx);
}

/* Tiny slot counts: a table row can have no candidate terms at all (clang's
 * UBSan once caught arithmetic on their NULL array there). Every budget
 * then either plans within it or names its floor. */
TEST(dp_few_slots)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, "gpt2-tiny");
    for (int32_t slots = 1; g && slots <= 3; slots++) {
        rkm_solve_desc d = {0};
        d.algo = RKM_ALGO_ROTOR;
        d.slots = slots;
        rkm_planner *pl = NULL;
        CHECK(rkm_planner_create(g, &d, &pl) == RKM_OK);
        rkm_graph_stats gs;
        CHECK(rkm_graph_stats_get(g, &gs) == RKM_OK);
        for (int pct = 40; pl && pct <= 100; pct += 20) {
            rkm_plan *p = NULL;
            uint64_t budget = gs.baseline_peak / 100 * (uint64_t)pct;
            rkm_result r = rkm_planner_solve(pl, budget, &p);
            CHECK(r == RKM_OK || r == RKM_ERROR_BUDGET);
            if (p) CHECK(p->stats.peak <= budget);
            rkm_plan_destroy(p);
        }
        rkm_planner_destroy(pl);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(dp_few_slots);
    RUN(dp_matches_brute_force);
    RUN(dp_persistent_gap);
    RUN(dp_rotor_hand_worked);
    RUN(dp_twins_hand_worked);
    RUN(dp_twins);
    RUN(dp_sqrt_schedule);
    RUN(dp_sqrt_shape);
    RUN(dp_full_shape);
    RUN(dp_ties);
    RUN(dp_deadline_keeps_the_columns_done);
    RUN(dp_nomem_and_arguments);
    RUN(dp_eval_rejects);
    TEST_END();
}
