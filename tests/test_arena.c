/* test_arena.c -- the library's arena (rockmate.h, "Arena"): the offset
 * allocator, running plans with buffers carved from it, the exact layout,
 * workspace measurement, the region and its pointers, the statistics.
 * Also what rockmate's CUDA support builds on; no GPU needed. */
#include "rockmate.h"
#include "test.h"

#include <stdint.h>

/* A fixed-seed generator: the random sequences are the same on every run. */
static uint64_t rng_state;
static uint64_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return rng_state >> 33;
}

static uint64_t round256(uint64_t b) { return (b + 255) / 256 * 256; }

/* The op as it was added (names, tensors, costs). */
static rkm_op_desc op_of(const rkm_graph *g, int32_t op)
{
    rkm_op_desc od;
    memset(&od, 0, sizeof od);
    if (rkm_graph_op_info(g, op, &od) != RKM_OK) fprintf(stderr, "op %d: no such op\n", (int)op);
    return od;
}

static int has_grad(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(g, t, &ti) == RKM_OK && ti.has_grad;
}

/* An op has a backward iff one of its outputs has a gradient. */
static int has_backward(const rkm_graph *g, int32_t op)
{
    rkm_op_desc od = op_of(g, op);
    for (int32_t k = 0; k < od.n_out; k++)
        if (has_grad(g, od.out[k])) return 1;
    return 0;
}

static uint64_t plan_peak(const rkm_plan *p)
{
    rkm_plan_stats ps;
    return rkm_plan_stats_get(p, &ps) == RKM_OK ? ps.peak : UINT64_MAX;
}

static const char *msg_of(const rkm_graph *g) { return rkm_context_errmsg(rkm_graph_context(g)); }

/* ---------------------------------------------------------------------------
 * The offset allocator
 * ------------------------------------------------------------------------- */

TEST(arena_first_fit_and_counts)
{
    rkm_context *ctx = test_new_ctx();
    rkm_arena *a;
    uint64_t o1, o2, o3, o4;
    rkm_arena_stats st;
    CHECK(rkm_arena_create(ctx, 4096, 8, &a) == RKM_OK);
    CHECK(rkm_arena_alloc(a, 100, &o1) == RKM_OK && o1 == 0);
    CHECK(rkm_arena_alloc(a, 300, &o2) == RKM_OK && o2 == 256);
    CHECK(rkm_arena_alloc(a, 1, &o3) == RKM_OK && o3 == 768);
    CHECK(rkm_arena_stats_get(a, &st) == RKM_OK);
    CHECK_EQ_U64(st.current, 401); /* requested bytes, not aligned ones */
    CHECK_EQ_U64(st.peak, 401);
    CHECK_EQ_U64(st.high_water, 769);
    CHECK_EQ_U64(st.blocks, 3);
    CHECK(rkm_arena_free(a, o2) == RKM_OK);
    CHECK(rkm_arena_stats_get(a, &st) == RKM_OK);
    CHECK_EQ_U64(st.current, 101);
    CHECK_EQ_U64(st.peak, 401);
    /* The hole at 256 (512 bytes) is the first that fits 200 bytes... */
    CHECK(rkm_arena_alloc(a, 200, &o4) == RKM_OK && o4 == 256);
    /* ...and what is left of it (256 bytes at 512) takes the next 256. */
    CHECK(rkm_arena_alloc(a, 256, &o2) == RKM_OK && o2 == 512);
    /* 257 bytes do not fit anywhere below 768: after the block at 768. */
    CHECK(rkm_arena_alloc(a, 257, &o2) == RKM_OK && o2 == 1024);
    rkm_arena_reset_peak(a);
    CHECK(rkm_arena_stats_get(a, &st) == RKM_OK);
    CHECK_EQ_U64(st.peak, st.current);
    rkm_arena_destroy(a);
    rkm_context_destroy(ctx);
}

/* Every failure leaves its message, naming the offset or the size, in the
 * context the arena was made with. */
TEST(arena_rejects_bad_frees_and_sizes)
{
    rkm_context *ctx = test_new_ctx();
    rkm_arena *a;
    uint64_t o;
    CHECK(rkm_arena_create(ctx, 1024, 4, &a) == RKM_OK);
    CHECK(rkm_arena_alloc(a, 0, &o) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(rkm_context_errmsg(ctx), "0 bytes") != NULL);
    CHECK(rkm_arena_alloc(a, 10, &o) == RKM_OK && o == 0);
    CHECK(rkm_arena_free(a, 5) == RKM_ERROR_ARGUMENT); /* not a block start */
    CHECK(strstr(rkm_context_errmsg(ctx), "offset 5 ") != NULL);
    CHECK(rkm_arena_free(a, 256) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_arena_free(a, 0) == RKM_OK);
    CHECK(rkm_arena_free(a, 0) == RKM_ERROR_ARGUMENT); /* double free */
    CHECK(strstr(rkm_context_errmsg(ctx), "rkm_arena_free: no live block starts at offset 0 ") != NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "double free") != NULL);
    CHECK(rkm_arena_alloc(a, 1025, &o) == RKM_ERROR_NOMEM && o == RKM_ARENA_NONE);
    CHECK(strstr(rkm_context_errmsg(ctx), "1025 bytes") != NULL);
    CHECK(rkm_arena_alloc(a, UINT64_MAX, &o) == RKM_ERROR_NOMEM);
    rkm_arena_destroy(a);
    CHECK(rkm_arena_create(ctx, 1024, 0, &a) == RKM_ERROR_ARGUMENT && a == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "max_blocks 0") != NULL);
    CHECK(rkm_arena_create(NULL, 1024, 4, &a) == RKM_ERROR_ARGUMENT && a == NULL);
    CHECK(rkm_arena_free(NULL, 0) == RKM_ERROR_ARGUMENT);
    rkm_context_destroy(ctx);
}

TEST(arena_coalesces_and_limits_blocks)
{
    rkm_arena *a;
    uint64_t o[4], big;
    rkm_context *ctx = test_new_ctx();
    CHECK(rkm_arena_create(ctx, 4096, 4, &a) == RKM_OK);
    for (int i = 0; i < 4; i++) CHECK(rkm_arena_alloc(a, 1024, &o[i]) == RKM_OK && o[i] == (uint64_t)i * 1024);
    CHECK(rkm_arena_free(a, o[0]) == RKM_OK);
    CHECK(rkm_arena_free(a, o[2]) == RKM_OK);
    CHECK(rkm_arena_alloc(a, 2048, &big) == RKM_ERROR_NOMEM); /* two separate 1 KiB holes */
    CHECK(rkm_arena_free(a, o[1]) == RKM_OK);               /* joins both neighbours */
    CHECK(rkm_arena_alloc(a, 3072, &big) == RKM_OK && big == 0);
    CHECK(rkm_arena_free(a, big) == RKM_OK);
    /* max_blocks: four live blocks, a fifth is refused although bytes remain. */
    CHECK(rkm_arena_free(a, o[3]) == RKM_OK);
    for (int i = 0; i < 4; i++) CHECK(rkm_arena_alloc(a, 1, &o[i]) == RKM_OK);
    CHECK(rkm_arena_alloc(a, 1, &big) == RKM_ERROR_NOMEM);
    rkm_arena_clear(a);
    CHECK(rkm_arena_alloc(a, 4096, &big) == RKM_OK && big == 0);
    rkm_arena_destroy(a);
    rkm_context_destroy(ctx);
}

/* The last block may end short of its aligned size: that is what makes an
 * arena of exactly the high-water mark enough. */
TEST(arena_tail_needs_only_requested_bytes)
{
    rkm_arena *a;
    uint64_t o;
    rkm_context *ctx = test_new_ctx();
    CHECK(rkm_arena_create(ctx, 1000, 4, &a) == RKM_OK);
    CHECK(rkm_arena_alloc(a, 256, &o) == RKM_OK && o == 0);
    CHECK(rkm_arena_alloc(a, 745, &o) == RKM_ERROR_NOMEM);
    CHECK(rkm_arena_alloc(a, 744, &o) == RKM_OK && o == 256);
    CHECK(rkm_arena_free(a, 256) == RKM_OK);
    CHECK(rkm_arena_alloc(a, 500, &o) == RKM_OK && o == 256);
    CHECK(rkm_arena_alloc(a, 200, &o) == RKM_OK && o == 768); /* 232 bytes left at 768 */
    rkm_arena_destroy(a);
    rkm_context_destroy(ctx);
}

/* Reference model: a map of 256-byte units. First fit over coalesced free
 * ranges is the lowest unit where enough free units follow. */
#define MODEL_UNITS 64
TEST(arena_matches_reference_model)
{
    rkm_arena *a;
    uint8_t unit_used[MODEL_UNITS];
    uint64_t live_off[48], live_bytes[48], cur = 0, peak = 0;
    int n_live = 0;
    memset(unit_used, 0, sizeof unit_used);
    rng_state = 12345;
    rkm_context *ctx = test_new_ctx();
    CHECK(rkm_arena_create(ctx, MODEL_UNITS * 256, 48, &a) == RKM_OK);
    for (int it = 0; it < 4000; it++) {
        if (n_live < 48 && (n_live == 0 || rnd() % 3 != 0)) {
            uint64_t bytes = 1 + rnd() % (6 * 256), need = round256(bytes) / 256, o, want = UINT64_MAX;
            for (uint64_t u = 0; u + need <= MODEL_UNITS && want == UINT64_MAX; u++) {
                uint64_t k = 0;
                while (k < need && !unit_used[u + k]) k++;
                if (k == need) want = u * 256;
            }
            rkm_result r = rkm_arena_alloc(a, bytes, &o);
            if (want == UINT64_MAX) {
                CHECK(r == RKM_ERROR_NOMEM);
                continue;
            }
            CHECK(r == RKM_OK && o == want);
            if (r != RKM_OK || o != want) break;
            for (uint64_t k = 0; k < need; k++) unit_used[o / 256 + k] = 1;
            live_off[n_live] = o;
            live_bytes[n_live++] = bytes;
            cur += bytes;
            if (cur > peak) peak = cur;
        } else {
            int i = (int)(rnd() % (uint64_t)n_live);
            CHECK(rkm_arena_free(a, live_off[i]) == RKM_OK);
            for (uint64_t k = 0; k < round256(live_bytes[i]) / 256; k++) unit_used[live_off[i] / 256 + k] = 0;
            cur -= live_bytes[i];
            live_off[i] = live_off[--n_live];
            live_bytes[i] = live_bytes[n_live];
        }
        rkm_arena_stats st;
        CHECK(rkm_arena_stats_get(a, &st) == RKM_OK);
        CHECK_EQ_U64(st.current, cur);
        CHECK_EQ_U64(st.peak, peak);
        CHECK_EQ_U64(st.blocks, n_live);
    }
    rkm_arena_destroy(a);
    rkm_context_destroy(ctx);
}

/* Replays one random sequence of allocations and frees on an arena of
 * `capacity`. Returns 0 if every allocation held; fills offs and *high. */
#define SEQ_LEN 3000
static int replay_sequence(uint64_t capacity, uint64_t *offs, uint64_t *high)
{
    rkm_arena *a;
    uint64_t live[32];
    int n_live = 0, ok = 1;
    rkm_context *ctx = test_new_ctx();
    if (rkm_arena_create(ctx, capacity, 32, &a) != RKM_OK) {
        rkm_context_destroy(ctx);
        return 0;
    }
    rng_state = 777;
    for (int it = 0; it < SEQ_LEN && ok; it++) {
        offs[it] = RKM_ARENA_NONE;
        if (n_live < 32 && (n_live == 0 || rnd() % 5 < 3)) {
            uint64_t bytes = 1 + rnd() % 5000;
            ok = rkm_arena_alloc(a, bytes, &offs[it]) == RKM_OK;
            if (ok) live[n_live++] = offs[it];
        } else {
            int i = (int)(rnd() % (uint64_t)n_live);
            ok = rkm_arena_free(a, live[i]) == RKM_OK;
            live[i] = live[--n_live];
        }
    }
    rkm_arena_stats st;
    CHECK(rkm_arena_stats_get(a, &st) == RKM_OK);
    *high = st.high_water;
    rkm_arena_destroy(a);
    rkm_context_destroy(ctx);
    return ok;
}

TEST(arena_high_water_is_exact_capacity)
{
    static uint64_t free_offs[SEQ_LEN], exact_offs[SEQ_LEN], short_offs[SEQ_LEN];
    uint64_t high, high2, high3;
    CHECK(replay_sequence(RKM_ARENA_UNBOUNDED, free_offs, &high));
    CHECK(high % 256 != 0); /* the sequence ends its highest block short */
    CHECK(replay_sequence(high, exact_offs, &high2));
    CHECK_EQ_U64(high2, high);
    CHECK(memcmp(free_offs, exact_offs, sizeof free_offs) == 0);
    CHECK(!replay_sequence(high - 1, short_offs, &high3));
}

/* ---------------------------------------------------------------------------
 * Statistics
 * ------------------------------------------------------------------------- */

TEST(trimmed_mean_drops_extremes)
{
    double s1[] = {5, 1, 3, 2, 100};
    CHECK(rkm_trimmed_mean(s1, 5, 0.2) == 10.0 / 3.0); /* drops 1 and 100 */
    CHECK(s1[0] == 1 && s1[4] == 100);                  /* sorted in place */
    double s2[] = {4, 1, 3, 2};
    CHECK(rkm_trimmed_mean(s2, 4, 0.5) == 2.5); /* the two middle ones */
    double s3[] = {7};
    CHECK(rkm_trimmed_mean(s3, 1, 0.4) == 7.0);
    double s4[] = {1, 2, 6};
    CHECK(rkm_trimmed_mean(s4, 3, 0.0) == 3.0);
    CHECK(rkm_trimmed_mean(s4, 3, -1.0) == 3.0);
    CHECK(rkm_trimmed_mean(NULL, 0, 0.2) == 0.0);
    double s5[10] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    CHECK(rkm_trimmed_mean(s5, 10, 0.2) == 4.5); /* 10 * 0.2 drops exactly 2 each end */
    double s6[] = {1, 2, 3, 4, 50, 60};
    CHECK(rkm_trimmed_mean(s6, 6, 0.2) == 14.75); /* floor(1.2) = 1 each end */
}

/* ---------------------------------------------------------------------------
 * Running plans with buffers from an arena
 * ------------------------------------------------------------------------- */

/* A host that checks, in every call, what the arena must guarantee. */
typedef struct checker {
    rkm_arena_exec *x;
    const rkm_graph *g;
    const uint64_t *mem_after; /* the plan's live memory after each step */
    uint64_t capacity;
    int measure;
    int problems;
    int32_t fail_op;           /* forward of this op returns 7; -1: never */
    int32_t host_fail_op;      /* forward of this op fails through rkm_arena_exec_host_fail; -1: never */
    int scratch_mode;          /* 0 none; 1 the declared ws exactly; 2 one byte more; 3 op-dependent */
    uint64_t (*ranges)[2];
    int recompute_in_place;    /* forwards seen with a live output */
    uint64_t trace;            /* hash of every offset seen, for determinism */
} checker;

static int cmp_range(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    return (x[0] > y[0]) - (x[0] < y[0]);
}

static void note(checker *c, uint64_t off) { c->trace = (c->trace ^ off) * 0x100000001b3ull; }

/* Every live buffer lies in the arena and no two overlap. */
static void check_disjoint(checker *c)
{
    int n = 0;
    for (int32_t t = 0; t < rkm_graph_num_tensors(c->g); t++) {
        rkm_tensor_info ti;
        rkm_graph_tensor_info(c->g, t, &ti);
        uint64_t offs[2] = {rkm_arena_exec_tensor(c->x, t), rkm_arena_exec_grad(c->x, t)};
        for (int k = 0; k < 2; k++)
            if (offs[k] != RKM_ARENA_NONE && ti.bytes) {
                c->ranges[n][0] = offs[k];
                c->ranges[n++][1] = offs[k] + ti.bytes;
            }
    }
    for (int32_t o = 0; o < rkm_graph_num_ops(c->g); o++) {
        rkm_op_desc oi = op_of(c->g, o);
        uint64_t off = rkm_arena_exec_saved(c->x, o);
        if (off != RKM_ARENA_NONE && oi.phantom) {
            c->ranges[n][0] = off;
            c->ranges[n++][1] = off + oi.phantom;
        }
    }
    qsort(c->ranges, (size_t)n, sizeof c->ranges[0], cmp_range);
    for (int i = 0; i < n; i++) {
        if (c->ranges[i][0] % 256 != 0 || c->ranges[i][1] > c->capacity) c->problems++;
        if (i > 0 && c->ranges[i - 1][1] > c->ranges[i][0]) c->problems++;
        note(c, c->ranges[i][0]);
    }
}

/* The scratch the checker takes in a call with declared workspace ws. */
static int take_scratch(checker *c, int32_t op, uint64_t ws, int bwd)
{
    uint64_t off;
    if (c->scratch_mode == 1 && ws > 0) {
        /* two pieces: an aligned first one, the rest exactly */
        uint64_t first = ws > 256 ? (ws / 2) / 256 * 256 : 0;
        if (first && rkm_arena_exec_scratch(c->x, first, &off) != RKM_OK) c->problems++;
        if (rkm_arena_exec_scratch(c->x, ws - first, &off) != RKM_OK) c->problems++;
    } else if (c->scratch_mode == 2) {
        if (rkm_arena_exec_scratch(c->x, ws + 1, &off) != RKM_ERROR_NOMEM) c->problems++;
        return 9;
    } else if (c->scratch_mode == 3) {
        uint64_t a = 100u * (uint64_t)op + 1, b = bwd ? 300 : 0;
        if (rkm_arena_exec_scratch(c->x, a, &off) != RKM_OK) c->problems++;
        if (b && rkm_arena_exec_scratch(c->x, b, &off) != RKM_OK) c->problems++;
    }
    return 0;
}

/* In plan mode the arena holds exactly what the contract counts for the
 * step: live memory after it plus its workspace. */
static void check_current(checker *c, int64_t step, uint64_t ws)
{
    rkm_arena_stats st;
    CHECK(rkm_arena_exec_stats_get(c->x, &st) == RKM_OK);
    if (!c->measure && st.current != c->mem_after[step] + ws) c->problems++;
}

static int chk_forward(void *user, const rkm_fwd_call *call)
{
    checker *c = user;
    rkm_op_desc oi = op_of(c->g, call->op);
    for (int32_t k = 0; k < oi.n_in; k++)
        if (rkm_arena_exec_tensor(c->x, oi.in[k]) == RKM_ARENA_NONE) c->problems++;
    for (int32_t k = 0; k < oi.n_out; k++) {
        if (rkm_arena_exec_tensor(c->x, oi.out[k]) == RKM_ARENA_NONE) c->problems++;
        if (!call->out_new[k]) c->recompute_in_place++;
    }
    if (call->save && rkm_arena_exec_saved(c->x, call->op) == RKM_ARENA_NONE) c->problems++;
    check_current(c, call->step, call->ws_bytes);
    check_disjoint(c);
    if (call->op == c->fail_op) return 7;
    if (call->op == c->host_fail_op) return rkm_arena_exec_host_fail(c->x, RKM_ERROR_IO, "device %d lost", 42);
    return take_scratch(c, call->op, call->ws_bytes, 0);
}

static int chk_backward(void *user, const rkm_bwd_call *call)
{
    checker *c = user;
    rkm_op_desc oi = op_of(c->g, call->op);
    for (int32_t k = 0; k < oi.n_saved; k++)
        if (rkm_arena_exec_tensor(c->x, oi.saved[k]) == RKM_ARENA_NONE) c->problems++;
    if (oi.phantom && rkm_arena_exec_saved(c->x, call->op) == RKM_ARENA_NONE) c->problems++;
    for (int32_t k = 0; k < oi.n_out; k++)
        if (has_grad(c->g, oi.out[k]) && rkm_arena_exec_grad(c->x, oi.out[k]) == RKM_ARENA_NONE)
            c->problems++;
    for (int32_t k = 0; k < oi.n_in; k++)
        if ((call->in_grad[k] != RKM_GRAD_NONE) != (rkm_arena_exec_grad(c->x, oi.in[k]) != RKM_ARENA_NONE))
            c->problems++;
    check_current(c, call->step, call->ws_bytes);
    check_disjoint(c);
    return take_scratch(c, call->op, call->ws_bytes, 1);
}

static int chk_loss(void *user, const rkm_buffer_call *call)
{
    checker *c = user;
    int32_t t = call->index;
    if (rkm_arena_exec_grad(c->x, t) == RKM_ARENA_NONE) c->problems++;
    check_disjoint(c);
    return 0;
}

/* A checker for plan p, and its exec over `capacity` (0: the plan's exact
 * first-fit arena). */
typedef struct harness {
    checker c;
    rkm_plan *p;
    uint64_t peak; /* the plan's */
    rkm_arena_capacity_info lay; /* first fit's */
    rkm_callbacks cb;
} harness;

static int harness_init(harness *h, rkm_plan *p, uint64_t capacity, int measure)
{
    const rkm_graph *g = rkm_plan_graph(p);
    size_t nb = (size_t)rkm_graph_num_tensors(g) * 2 + (size_t)rkm_graph_num_ops(g);
    memset(h, 0, sizeof *h);
    h->p = p;
    h->peak = plan_peak(p);
    h->c.ranges = calloc(nb + 1, sizeof h->c.ranges[0]);
    if (!h->c.ranges) return 0;
    if (rkm_arena_capacity(p, RKM_ARENA_FIRST_FIT, &h->lay) != RKM_OK) {
        fprintf(stderr, "layout: %s\n", msg_of(g));
        return 0;
    }
    h->c.g = g;
    h->c.mem_after = rkm_plan_mem_after(p);
    h->c.capacity = capacity ? capacity : h->lay.capacity;
    h->c.measure = measure;
    h->c.fail_op = -1;
    h->c.host_fail_op = -1;
    rkm_callbacks cb = {.user = &h->c, .forward = chk_forward, .backward = chk_backward, .loss = chk_loss};
    h->cb = cb;
    rkm_arena_exec_desc d = {.graph = g, .mode = measure ? RKM_ARENA_MEASURE : RKM_ARENA_FIRST_FIT,
                             .capacity = h->c.capacity, .host = &h->cb};
    return rkm_arena_exec_create(&d, &h->c.x) == RKM_OK;
}

static void harness_free(harness *h)
{
    rkm_arena_exec_destroy(h->c.x);
    free(h->c.ranges);
}

static uint64_t input_bytes(const rkm_graph *g)
{
    rkm_graph_stats gs;
    return rkm_graph_stats_get(g, &gs) == RKM_OK ? gs.input_bytes : UINT64_MAX;
}

static const char *const graph_files[] = {TEST_BUNDLED_GRAPHS};

/* Calls fn on the baseline plan of every bundled graph. */
static void for_baseline_plans(void (*fn)(rkm_plan *p, const char *label))
{
    rkm_context *ctx = test_new_ctx();
    for (size_t i = 0; i < sizeof graph_files / sizeof graph_files[0]; i++) {
        rkm_graph *g = test_load_graph(ctx, graph_files[i]);
        rkm_plan *p = NULL;
        CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
        if (p) fn(p, graph_files[i]);
        rkm_plan_destroy(p);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

/* Runs p once through a first-fit exec over its exact arena: the arena's
 * peak is the plan's, to the byte, and every call sees exactly the
 * contract's memory and disjoint buffers. 0 if the harness could not be
 * made; otherwise the caller frees it. */
static int run_exact(harness *h, rkm_plan *p, const char *label)
{
    if (!harness_init(h, p, 0, 0)) {
        fprintf(stderr, "%s: harness\n", label);
        CHECK(0);
        return 0;
    }
    h->c.scratch_mode = 1;
    CHECK(rkm_arena_exec_run(h->c.x, p) == RKM_OK);
    rkm_arena_stats st;
    CHECK(rkm_arena_exec_stats_get(h->c.x, &st) == RKM_OK);
    CHECK_EQ_U64(st.peak, h->peak);
    CHECK_EQ_U64(st.current, input_bytes(rkm_plan_graph(p)));
    CHECK(h->c.problems == 0);
    if (h->c.problems) fprintf(stderr, "%s: %d problems\n", label, h->c.problems);
    return 1;
}

/* The exact arena is the first-fit high water, and a second step repeats
 * the first offset for offset. */
static void exec_baseline_plan(rkm_plan *p, const char *label)
{
    harness h;
    if (!run_exact(&h, p, label)) return;
    rkm_arena_stats st;
    CHECK(rkm_arena_exec_stats_get(h.c.x, &st) == RKM_OK);
    CHECK_EQ_U64(h.lay.peak, h.peak);
    CHECK(h.lay.capacity >= h.lay.peak);
    CHECK_EQ_U64(st.high_water, h.lay.capacity);
    uint64_t trace = h.c.trace;
    h.c.trace = 0;
    CHECK(rkm_arena_exec_run(h.c.x, p) == RKM_OK);
    CHECK(h.c.trace == trace);
    CHECK(h.c.problems == 0);
    harness_free(&h);
}

TEST(exec_baseline_matches_simulator_on_all_graphs) { for_baseline_plans(exec_baseline_plan); }

/* A hand-written plan with recomputation: scores runs first without save,
 * then again with save before the backward; causal recomputes in place. */
static const char recompute_plan[] =
    "rockmate-plan 1\n"
    "fwd embed\nfwd split\nfwd causal\nfwd scores\nfwd attend\nfree s\nfwd dropout save\nfree a\n"
    "fwd residual\nfree drop\nfwd norm save\nfwd head\nfwd xent\n"
    "loss\nbwd xent\nfree_grad loss\nfree loss\nfree out\nbwd head\nfree_grad out\nfree n\n"
    "bwd norm\nfree_saved norm\nfree_grad n\nfree r\nbwd residual\nfree_grad r\n"
    "bwd dropout\nfree_saved dropout\nfree_grad drop\n"
    "fwd scores save\nbwd attend\nfree_grad a\nfree s\nfree v\nfwd causal\n"
    "bwd scores\nfree_saved scores\nfree_grad s\nfree q\nfree k\nfree mask\n"
    "bwd split\nfree_grad q\nfree_grad k\nfree_grad v\nbwd embed\nfree_grad h\nfree h\n";

static rkm_plan *load_recompute_plan(rkm_graph *g)
{
    rkm_plan *p = NULL;
    if (rkm_plan_read_string(g, recompute_plan, sizeof recompute_plan - 1, "recompute", NULL, &p) != RKM_OK)
        fprintf(stderr, "%s\n", rkm_context_errmsg(rkm_graph_context(g)));
    return p;
}

TEST(exec_recompute_plan)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    rkm_plan *p = g ? load_recompute_plan(g) : NULL;
    harness h;
    CHECK(p != NULL);
    if (p && run_exact(&h, p, "recompute")) {
        CHECK(h.c.recompute_in_place == 1);
        harness_free(&h);
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Calls fn on the plan that rotor and rockmate make at their smallest
 * budget (the most recomputation) on small bundled graphs; on random30
 * rotor's and DTR's: rockmate's smallest budget there is a search of
 * whole-graph ILPs (9 of this test's 15 s, the runs themselves 0.01 s),
 * and DTR's plans recompute anywhere in the DAG too. */
static void for_min_budget_plans(void (*fn)(rkm_plan *p, uint64_t budget, const char *label))
{
    rkm_context *ctx;
    CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
    /* the last two again with scratch (half of every phantom written on every run) */
    const char *files[] = {"gpt2-tiny", "multi-output", "mlp16", "random30", "gpt2-tiny", "mlp16"};
    const rkm_algo algos[] = {RKM_ALGO_ROTOR, RKM_ALGO_ROCKMATE}, random30_algos[] = {RKM_ALGO_ROTOR, RKM_ALGO_DTR};
    for (int i = 0; i < 6; i++) {
        rkm_graph *g = i < 4 ? test_load_graph(ctx, files[i]) : test_load_scratch_graph(ctx, files[i]);
        CHECK(g != NULL);
        for (int a = 0; g && a < 2; a++) {
            rkm_solve_desc sd;
            rkm_planner *pl = NULL;
            rkm_plan *p = NULL;
            uint64_t minb = 0;
            char label[64];
            memset(&sd, 0, sizeof sd);
            sd.algo = i == 3 ? random30_algos[a] : algos[a];
            rkm_result r = rkm_planner_create(g, &sd, &pl);
            CHECK(r == RKM_OK);
            CHECK(pl && rkm_planner_min_budget(pl, &minb) == RKM_OK);
            CHECK(pl && rkm_planner_solve(pl, minb, &p) == RKM_OK);
            snprintf(label, sizeof label, "%s%s/%s", files[i], i < 4 ? "" : "+scratch", rkm_algo_name(sd.algo));
            if (p) fn(p, minb, label);
            else fprintf(stderr, "%s: %s\n", label, rkm_context_errmsg(ctx));
            rkm_plan_destroy(p);
            rkm_planner_destroy(pl);
        }
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

static void check_layout_run(rkm_plan *p, const char *label);

/* A planner's plan at its smallest budget (the tightest it makes), in
 * both modes: through the first-fit arena its peak is the plan's, within
 * the budget; in layout mode (check_layout_run) every buffer sits at its
 * offset in a region of the plan's arena. One pass, since finding the
 * smallest budgets is the costly part. */
static void min_budget_plan(rkm_plan *p, uint64_t budget, const char *label)
{
    harness h;
    if (run_exact(&h, p, label)) {
        CHECK(h.peak <= budget);
        harness_free(&h);
    }
    rkm_plan_stats ps;
    CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK && ps.arena_bytes <= budget);
    check_layout_run(p, label);
}

TEST(planner_plans_at_min_budget_run_in_both_modes) { for_min_budget_plans(min_budget_plan); }

/* One byte short of the layout: the run fails as out of memory, names the
 * step and the buffer, and leaves only the inputs behind; the exec stays
 * usable. */
TEST(exec_arena_one_byte_short)
{
    rkm_context *ctx = test_new_ctx();
    const char *files[] = {"multi-output", "gpt2-tiny", "random30"};
    for (int i = 0; i < 3; i++) {
        rkm_graph *g = test_load_graph(ctx, files[i]);
        rkm_plan *p = NULL;
        harness h, probe;
        CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
        if (!p) continue;
        if (!harness_init(&probe, p, 0, 0) || !harness_init(&h, p, probe.lay.capacity - 1, 0)) {
            CHECK(0);
            break;
        }
        CHECK(rkm_arena_exec_run(h.c.x, p) == RKM_ERROR_NOMEM);
        CHECK(strstr(msg_of(g), "arena full") != NULL);
        CHECK(strncmp(msg_of(g), "step ", 5) == 0); /* the run names the step */
        rkm_arena_stats st;
        CHECK(rkm_arena_exec_stats_get(h.c.x, &st) == RKM_OK);
        CHECK_EQ_U64(st.current, input_bytes(g));
        CHECK(rkm_arena_exec_run(h.c.x, p) == RKM_ERROR_NOMEM);
        CHECK(rkm_arena_exec_run(probe.c.x, p) == RKM_OK);
        harness_free(&h);
        harness_free(&probe);
        rkm_plan_destroy(p);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

/* Runs body on a harness over the baseline plan of bundled graph `file`
 * (capacity and measure as for harness_init). */
static void with_baseline(const char *file, uint64_t capacity, int measure,
                          void (*body)(harness *h, const rkm_graph *g))
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, file);
    rkm_plan *p = NULL;
    harness h;
    CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
    if (p && harness_init(&h, p, capacity, measure)) {
        body(&h, g);
        harness_free(&h);
    } else {
        CHECK(0);
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

static void host_failure_and_overrun(harness *h, const rkm_graph *g)
{
    rkm_arena_stats st;
    h->c.fail_op = rkm_graph_find_op(g, "attend");
    CHECK(rkm_arena_exec_run(h->c.x, h->p) == RKM_ERROR_CALLBACK);
    CHECK(strstr(msg_of(g), "returned 7") != NULL);
    CHECK(rkm_arena_exec_stats_get(h->c.x, &st) == RKM_OK);
    CHECK_EQ_U64(st.current, input_bytes(g));
    /* Plan mode: one byte beyond the declared workspace is refused. */
    h->c.fail_op = -1;
    h->c.scratch_mode = 2;
    CHECK(rkm_arena_exec_run(h->c.x, h->p) == RKM_ERROR_CALLBACK);
    /* The executor names the callback, the exec the refused request. */
    CHECK(strstr(msg_of(g), "returned 9, after rkm_arena_exec_scratch: forward of ") != NULL);
    CHECK(strstr(msg_of(g), "declared workspace") != NULL);
    CHECK(rkm_arena_exec_stats_get(h->c.x, &st) == RKM_OK);
    CHECK_EQ_U64(st.current, input_bytes(g));
    CHECK(h->c.problems == 0);
    /* Outside a call there is no scratch. */
    uint64_t off;
    CHECK(rkm_arena_exec_scratch(h->c.x, 16, &off) == RKM_ERROR_STATE);
    CHECK(strstr(msg_of(g), "outside a forward or backward") != NULL);
    /* A host's own failure: its code, and its message after the step. */
    h->c.scratch_mode = 1;
    h->c.host_fail_op = rkm_graph_find_op(g, "attend");
    CHECK(rkm_arena_exec_run(h->c.x, h->p) == RKM_ERROR_IO);
    CHECK(strncmp(msg_of(g), "step ", 5) == 0 && strstr(msg_of(g), ": device 42 lost") != NULL);
    CHECK(rkm_arena_exec_stats_get(h->c.x, &st) == RKM_OK);
    CHECK_EQ_U64(st.current, input_bytes(g));
    h->c.host_fail_op = -1;
    CHECK(rkm_arena_exec_run(h->c.x, NULL) == RKM_ERROR_ARGUMENT);
    CHECK(strstr(msg_of(g), "plan is NULL") != NULL);
    CHECK(rkm_arena_exec_run(h->c.x, h->p) == RKM_OK);
}

TEST(exec_host_failure_and_workspace_overrun) { with_baseline("multi-output", 0, 0, host_failure_and_overrun); }

/* Measure mode: each op's workspace is what its calls took from the arena
 * (scratch counts in 256-byte units), whatever the graph declares. */
static void measures_workspace(harness *h, const rkm_graph *g)
{
    h->c.scratch_mode = 3;
    CHECK(rkm_arena_exec_run(h->c.x, h->p) == RKM_OK);
    for (int32_t o = 0; o < rkm_graph_num_ops(g); o++) {
        uint64_t f, b;
        rkm_arena_exec_measured_ws(h->c.x, o, &f, &b);
        CHECK_EQ_U64(f, round256(100u * (uint64_t)o + 1));
        CHECK_EQ_U64(b, has_backward(g, o) ? round256(100u * (uint64_t)o + 1) + 256 + 256 : 0);
    }
    rkm_arena_stats st;
    CHECK(rkm_arena_exec_stats_get(h->c.x, &st) == RKM_OK);
    CHECK_EQ_U64(st.current, input_bytes(g));
    CHECK(h->c.problems == 0);
}

TEST(exec_measures_workspace) { with_baseline("multi-output", 1u << 20, 1, measures_workspace); }

/* Measure mode with a host that takes exactly the declared workspaces (all
 * multiples of 256 here): the measured workspaces are the declared ones and
 * the step's peak is the plan's peak, so profiling such a host leaves
 * the graph's memory figures as they are. */
static void measure_agrees(harness *h, const rkm_graph *g)
{
    h->c.scratch_mode = 1;
    CHECK(rkm_arena_exec_run(h->c.x, h->p) == RKM_OK);
    for (int32_t o = 0; o < rkm_graph_num_ops(g); o++) {
        rkm_op_desc oi = op_of(g, o);
        uint64_t f, b;
        rkm_arena_exec_measured_ws(h->c.x, o, &f, &b);
        CHECK_EQ_U64(f, oi.fwd_ws);
        CHECK_EQ_U64(b, has_backward(g, o) ? oi.bwd_ws : 0);
    }
    rkm_arena_stats st;
    CHECK(rkm_arena_exec_stats_get(h->c.x, &st) == RKM_OK);
    CHECK_EQ_U64(st.peak, h->peak);
    CHECK(h->c.problems == 0);
}

TEST(exec_measure_mode_agrees_with_declared_workspaces)
{
    with_baseline("multi-output", 1u << 24, 1, measure_agrees);
    with_baseline("gpt2-tiny", 1u << 24, 1, measure_agrees);
}

/* All bookkeeping memory comes from the context's allocator, and all of it
 * goes back: the counting allocator sees every byte returned. */
static long long counted_bytes, counted_calls;
static void *counting_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    counted_calls++;
    counted_bytes += (long long)new_size - (long long)(ptr ? old_size : 0);
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

TEST(allocation_goes_through_the_context)
{
    rkm_context *ctx = test_new_ctx_alloc(counting_alloc);
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    rkm_plan *p = NULL;
    CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
    long long bytes = counted_bytes, calls = counted_calls;
    rkm_arena *a = NULL;
    CHECK(rkm_arena_create(ctx, 4096, 8, &a) == RKM_OK);
    CHECK(counted_calls > calls && counted_bytes > bytes);
    rkm_arena_destroy(a);
    CHECK(counted_bytes == bytes);
    rkm_arena_exec *x = NULL, *xl = NULL;
    rkm_arena_exec_desc d = {.graph = g, .mode = RKM_ARENA_FIRST_FIT, .capacity = 1u << 20};
    CHECK(p && rkm_arena_exec_create(&d, &x) == RKM_OK);
    d.mode = RKM_ARENA_LAYOUT;
    d.plan = p;
    CHECK(rkm_arena_exec_create(&d, &xl) == RKM_OK);
    CHECK(x && xl && rkm_arena_exec_run(x, p) == RKM_OK && rkm_arena_exec_run(xl, p) == RKM_OK);
    rkm_arena_exec_destroy(x);
    rkm_arena_exec_destroy(xl);
    CHECK(counted_bytes == bytes);
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(counted_bytes == 0);
}

/* ---------------------------------------------------------------------------
 * The region: desc.allocate, rkm_arena_exec_base, rkm_arena_ptr
 * ------------------------------------------------------------------------- */

/* A CPU host on the exec's own region: it writes every byte of every
 * buffer a call creates and of its workspace, through rkm_arena_ptr, so
 * that the sanitizer sees any buffer that leaves the region. */
typedef struct writer {
    rkm_arena_exec *x;
    const rkm_graph *g;
    int problems;
    long long calls_before; /* counted_calls when the run started */
} writer;

static uint64_t tensor_bytes(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

/* Write `bytes` at offset off of the region; the pointer must be base + off. */
static void fill(writer *w, uint64_t off, uint64_t bytes)
{
    char *base = rkm_arena_exec_base(w->x), *p = rkm_arena_ptr(base, off);
    if (!p || p != base + off) {
        w->problems++;
        return;
    }
    memset(p, 0x5a, bytes);
}

static int wr_scratch(writer *w, uint64_t ws)
{
    uint64_t off;
    if (rkm_arena_exec_scratch(w->x, ws, &off) != RKM_OK) return 1;
    fill(w, off, ws);
    return 0;
}

static int wr_forward(void *user, const rkm_fwd_call *call)
{
    writer *w = user;
    for (int32_t k = 0; k < call->n_out; k++)
        if (call->out_new[k]) fill(w, rkm_arena_exec_tensor(w->x, call->out[k]), tensor_bytes(w->g, call->out[k]));
    if (call->save) fill(w, rkm_arena_exec_saved(w->x, call->op), call->phantom);
    return wr_scratch(w, call->ws_bytes);
}

static int wr_backward(void *user, const rkm_bwd_call *call)
{
    writer *w = user;
    for (int32_t k = 0; k < call->n_in; k++)
        if (call->in_grad[k] == RKM_GRAD_NEW)
            fill(w, rkm_arena_exec_grad(w->x, call->in[k]), tensor_bytes(w->g, call->in[k]));
    return wr_scratch(w, call->ws_bytes);
}

static int wr_loss(void *user, const rkm_buffer_call *call)
{
    writer *w = user;
    fill(w, rkm_arena_exec_grad(w->x, call->index), call->bytes);
    return 0;
}

/* The exec allocates its region once, at creation, through the context
 * (for the bundled graphs whose baseline peak is at most 64 MiB);
 * a step allocates nothing; buffers are base + offset and stay inside. */
static void region_run(rkm_plan *p, const char *label)
{
    const rkm_graph *g = rkm_plan_graph(p);
    rkm_context *ctx = rkm_graph_context(g);
    writer w = {NULL, g, 0, 0};
    rkm_callbacks cb = {.user = &w, .forward = wr_forward, .backward = wr_backward, .loss = wr_loss};
    rkm_arena_exec_desc d = {.graph = g, .plan = p, .host = &cb, .allocate = 1};
    rkm_arena_stats st;
    long long bytes = counted_bytes;
    CHECK(rkm_arena_exec_create(&d, &w.x) == RKM_OK && w.x);
    if (!w.x) return;
    CHECK(rkm_arena_exec_stats_get(w.x, &st) == RKM_OK);
    CHECK(rkm_arena_exec_base(w.x) != NULL);
    CHECK(counted_bytes - bytes >= (long long)st.capacity);
    for (int32_t t = 0; t < rkm_graph_num_tensors(g); t++) /* the inputs, as a host fills them */
        if (rkm_arena_exec_tensor(w.x, t) != RKM_ARENA_NONE) fill(&w, rkm_arena_exec_tensor(w.x, t), tensor_bytes(g, t));
    for (int step = 0; step < 2; step++) {
        long long calls = counted_calls;
        CHECK(rkm_arena_exec_run(w.x, p) == RKM_OK);
        CHECK(counted_calls == calls); /* a training step allocates nothing */
    }
    CHECK(w.problems == 0);
    if (w.problems) fprintf(stderr, "%s: %d problems\n", label, w.problems);
    rkm_arena_exec_destroy(w.x);
    CHECK(counted_bytes == bytes);
    (void)ctx;
}

TEST(exec_allocates_its_region)
{
    rkm_context *ctx = test_new_ctx_alloc(counting_alloc);
    int ran = 0;
    for (size_t i = 0; i < sizeof graph_files / sizeof graph_files[0]; i++) {
        rkm_graph *g = test_load_graph(ctx, graph_files[i]);
        rkm_plan *p = NULL;
        CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
        if (p && plan_peak(p) <= (64u << 20)) { /* real bytes: small graphs */
            region_run(p, graph_files[i]);
            ran++;
        }
        rkm_plan_destroy(p);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
    CHECK(counted_bytes == 0);
    CHECK(ran >= 3);
}

/* The pointer helper's edges, and the rules of allocate. */
TEST(region_pointers_and_rules)
{
    int anchor[4];
    CHECK(rkm_arena_ptr(NULL, 0) == NULL);
    CHECK(rkm_arena_ptr(anchor, RKM_ARENA_NONE) == NULL);
    CHECK(rkm_arena_ptr(anchor, 0) == (void *)anchor);
    CHECK(rkm_arena_ptr(anchor, 8) == (void *)((char *)anchor + 8));
    CHECK(rkm_arena_exec_base(NULL) == NULL);
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    rkm_plan *p = NULL;
    CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
    rkm_arena_capacity_info lay;
    CHECK(p && rkm_arena_capacity(p, RKM_ARENA_FIRST_FIT, &lay) == RKM_OK);
    rkm_arena_exec *x = NULL;
    /* Without allocate the host has the region: no base. */
    rkm_arena_exec_desc d = {.graph = g, .mode = RKM_ARENA_FIRST_FIT, .capacity = lay.capacity};
    CHECK(rkm_arena_exec_create(&d, &x) == RKM_OK && rkm_arena_exec_base(x) == NULL);
    rkm_arena_exec_destroy(x);
    /* First fit with allocate: a region of the capacity. */
    d.allocate = 1;
    CHECK(rkm_arena_exec_create(&d, &x) == RKM_OK && rkm_arena_exec_base(x) != NULL);
    CHECK(x && rkm_arena_exec_run(x, p) == RKM_OK);
    rkm_arena_exec_destroy(x);
    d.capacity = RKM_ARENA_UNBOUNDED;
    CHECK(rkm_arena_exec_create(&d, &x) == RKM_ERROR_ARGUMENT && x == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "rkm_arena_exec_create: allocate needs a bounded capacity") != NULL);
    /* Capacity 0 is what the plan needs in the mode: first fit's, or the
     * layout's arena; a layout region may be larger, never smaller. */
    rkm_arena_capacity_info need;
    rkm_arena_stats st;
    d.capacity = 0;
    d.plan = p;
    CHECK(rkm_arena_exec_create(&d, &x) == RKM_OK && rkm_arena_exec_base(x) != NULL);
    CHECK(rkm_arena_exec_stats_get(x, &st) == RKM_OK && st.capacity == lay.capacity);
    CHECK(x && rkm_arena_exec_run(x, p) == RKM_OK);
    rkm_arena_exec_destroy(x);
    d.mode = RKM_ARENA_LAYOUT;
    CHECK(rkm_arena_capacity(p, RKM_ARENA_LAYOUT, &need) == RKM_OK && need.peak == lay.peak);
    CHECK(rkm_arena_exec_create(&d, &x) == RKM_OK && rkm_arena_exec_base(x) != NULL);
    CHECK(rkm_arena_exec_stats_get(x, &st) == RKM_OK && st.capacity == need.capacity);
    CHECK(rkm_arena_exec_mode(x) == RKM_ARENA_LAYOUT);
    rkm_arena_exec_destroy(x);
    d.capacity = need.capacity + 4096;
    CHECK(rkm_arena_exec_create(&d, &x) == RKM_OK && rkm_arena_exec_stats_get(x, &st) == RKM_OK);
    CHECK(st.capacity == need.capacity + 4096 && x && rkm_arena_exec_run(x, p) == RKM_OK);
    rkm_arena_exec_destroy(x);
    d.capacity = need.capacity - 1;
    CHECK(rkm_arena_exec_create(&d, &x) == RKM_ERROR_ARGUMENT && x == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "is below the plan's arena") != NULL);
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* An allocator that refuses anything of a MiB or more. */
static void *small_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return new_size >= (1u << 20) ? NULL : realloc(ptr, new_size);
}

TEST(region_that_cannot_be_allocated)
{
    rkm_context *ctx = test_new_ctx_alloc(small_alloc);
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    rkm_arena_exec *x = NULL;
    rkm_arena_exec_desc d = {.graph = g, .mode = RKM_ARENA_FIRST_FIT, .capacity = 1u << 24, .allocate = 1};
    CHECK(g && rkm_arena_exec_create(&d, &x) == RKM_ERROR_NOMEM && x == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "no memory for the arena's region of 16777216 bytes") != NULL);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* ---------------------------------------------------------------------------
 * Layout mode: the library's layout (rkm_plan_layout), offset for offset
 * ------------------------------------------------------------------------- */

/* A host that follows rkm_plan_layout's buffers on its own: as each call
 * creates buffers it finds them in the layout (kind, index, creation step),
 * checks the exec put them at the layout's offset, and checks that no two
 * buffers it holds live (workspaces included) share a byte. */
typedef struct lchecker {
    checker c;                 /* the contract checks of the first-fit tests */
    rkm_buffer *b;             /* the layout (rkm_plan_layout's, computed again here) */
    size_t n;
    uint64_t arena;            /* its arena_bytes */
    uint8_t *live, *seen;      /* per layout buffer */
    int64_t step;              /* of the last call */
    size_t matched;
    int problems;
} lchecker;

/* The layout's buffer of (kind, index) created at `step` (step < -1: the
 * first not yet seen after the last call's step, for the loss). */
static size_t lchk_find(lchecker *l, int32_t kind, int32_t index, int64_t step)
{
    for (size_t i = 0; i < l->n; i++) {
        const rkm_buffer *b = &l->b[i];
        if (b->kind != kind || b->index != index || l->seen[i]) continue;
        if (step >= -1 ? b->first_step == step : b->first_step > l->step) return i;
    }
    return SIZE_MAX;
}

/* Buffer (kind, index, step) was just created at offset off: it is the
 * layout's, at the layout's offset, inside the arena, and overlaps no live
 * buffer. */
static void lchk_created(lchecker *l, int32_t kind, int32_t index, int64_t step, uint64_t off)
{
    size_t i = lchk_find(l, kind, index, step);
    if (i == SIZE_MAX) {
        fprintf(stderr, "layout: no buffer kind %d index %d step %lld\n", (int)kind, (int)index, (long long)step);
        l->problems++;
        return;
    }
    const rkm_buffer *b = &l->b[i];
    if (off != b->offset) {
        fprintf(stderr, "layout: buffer %zu at %llu, layout says %llu\n", i, (unsigned long long)off,
                (unsigned long long)b->offset);
        l->problems++;
    }
    if (b->offset % 256 || b->offset + b->bytes > l->arena) l->problems++;
    for (size_t k = 0; k < l->n && b->bytes; k++) {
        const rkm_buffer *o = &l->b[k];
        if (!l->live[k] || !o->bytes) continue;
        if (o->offset < b->offset + b->bytes && b->offset < o->offset + o->bytes) {
            fprintf(stderr, "layout: buffers %zu and %zu overlap while live\n", k, i);
            l->problems++;
        }
    }
    l->seen[i] = l->live[i] = 1;
    l->matched++;
}

/* The live buffer of (kind, index) is released. */
static void lchk_released(lchecker *l, int32_t kind, int32_t index)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->live[i] && l->b[i].kind == kind && l->b[i].index == index) {
            l->live[i] = 0;
            return;
        }
    l->problems++;
}

/* The call's workspace: a scratch buffer of the declared size sits at the
 * layout's workspace offset and lives during the call. */
static void lchk_workspace(lchecker *l, int32_t op, int64_t step, uint64_t ws)
{
    if (!ws) return;
    uint64_t off;
    if (rkm_arena_exec_scratch(l->c.x, ws, &off) != RKM_OK) {
        l->problems++;
        return;
    }
    lchk_created(l, RKM_BUFFER_WORKSPACE, op, step, off);
    lchk_released(l, RKM_BUFFER_WORKSPACE, op);
}

static int lchk_forward(void *user, const rkm_fwd_call *call)
{
    lchecker *l = user;
    rkm_op_desc oi = op_of(l->c.g, call->op);
    for (int32_t k = 0; k < oi.n_out; k++)
        if (call->out_new[k])
            lchk_created(l, RKM_BUFFER_TENSOR, oi.out[k], call->step, rkm_arena_exec_tensor(l->c.x, oi.out[k]));
    if (call->save) lchk_created(l, RKM_BUFFER_PHANTOM, call->op, call->step, rkm_arena_exec_saved(l->c.x, call->op));
    l->step = call->step;
    int rc = chk_forward(&l->c, call);
    lchk_workspace(l, call->op, call->step, call->ws_bytes);
    return rc;
}

static int lchk_backward(void *user, const rkm_bwd_call *call)
{
    lchecker *l = user;
    rkm_op_desc oi = op_of(l->c.g, call->op);
    for (int32_t k = 0; k < oi.n_in; k++)
        if (call->in_grad[k] == RKM_GRAD_NEW)
            lchk_created(l, RKM_BUFFER_GRAD, oi.in[k], call->step, rkm_arena_exec_grad(l->c.x, oi.in[k]));
    l->step = call->step;
    int rc = chk_backward(&l->c, call);
    lchk_workspace(l, call->op, call->step, call->ws_bytes);
    return rc;
}

static int lchk_loss(void *user, const rkm_buffer_call *call)
{
    lchecker *l = user;
    lchk_created(l, RKM_BUFFER_GRAD, call->index, -2, rkm_arena_exec_grad(l->c.x, call->index));
    return chk_loss(&l->c, call);
}

static int lchk_free_tensor(void *user, const rkm_buffer_call *call)
{
    lchk_released(user, RKM_BUFFER_TENSOR, call->index);
    return 0;
}

static int lchk_free_saved(void *user, const rkm_buffer_call *call)
{
    lchk_released(user, RKM_BUFFER_PHANTOM, call->index);
    return 0;
}

static int lchk_free_grad(void *user, const rkm_buffer_call *call)
{
    lchk_released(user, RKM_BUFFER_GRAD, call->index);
    return 0;
}

/* Run plan p twice in layout mode with the checks above; the arena's
 * capacity is the layout's arena size and its peak the plan's. */
static void check_layout_run(rkm_plan *p, const char *label)
{
    const rkm_graph *g = rkm_plan_graph(p);
    size_t nb = (size_t)rkm_graph_num_tensors(g) * 2 + (size_t)rkm_graph_num_ops(g);
    uint64_t peak = plan_peak(p);
    lchecker l;
    memset(&l, 0, sizeof l);
    l.c.ranges = calloc(nb + 1, sizeof l.c.ranges[0]);
    l.n = rkm_plan_num_buffers(p);
    l.b = calloc(l.n + 1, sizeof *l.b);
    CHECK(l.b && rkm_plan_layout(p, RKM_ARENA_ALIGN, l.b, &l.arena) == RKM_OK);
    rkm_callbacks cb = {.user = &l, .forward = lchk_forward, .backward = lchk_backward, .loss = lchk_loss,
                        .free_tensor = lchk_free_tensor, .free_saved = lchk_free_saved, .free_grad = lchk_free_grad};
    rkm_arena_exec_desc d = {.graph = g, .plan = p, .host = &cb};
    CHECK(rkm_arena_exec_create(&d, &l.c.x) == RKM_OK);
    l.live = calloc(l.n + 1, 1);
    l.seen = calloc(l.n + 1, 1);
    if (!l.c.x || !l.b || !l.live || !l.seen || !l.c.ranges) {
        CHECK(0);
        goto done;
    }
    CHECK(rkm_arena_exec_mode(l.c.x) == RKM_ARENA_LAYOUT);
    l.c.g = g;
    l.c.mem_after = rkm_plan_mem_after(p);
    l.c.capacity = l.arena;
    l.c.fail_op = -1;
    l.c.host_fail_op = -1;
    rkm_arena_stats st;
    CHECK(rkm_arena_exec_stats_get(l.c.x, &st) == RKM_OK);
    CHECK_EQ_U64(st.capacity, l.arena);
    for (int run = 0; run < 2; run++) {
        /* The inputs, carved at creation, are the layout's first buffers. */
        memset(l.seen, 0, l.n);
        memset(l.live, 0, l.n);
        l.matched = 0;
        l.step = -1;
        for (int32_t t = 0; t < rkm_graph_num_tensors(g); t++) {
            rkm_tensor_info ti;
            rkm_graph_tensor_info(g, t, &ti);
            if (ti.flags & RKM_TENSOR_INPUT)
                lchk_created(&l, RKM_BUFFER_TENSOR, t, -1, rkm_arena_exec_tensor(l.c.x, t));
        }
        rkm_result r = rkm_arena_exec_run(l.c.x, p);
        if (r != RKM_OK) fprintf(stderr, "%s: %s\n", label, msg_of(g));
        CHECK(r == RKM_OK);
        CHECK(rkm_arena_exec_stats_get(l.c.x, &st) == RKM_OK);
        CHECK_EQ_U64(st.peak, peak);
        CHECK_EQ_U64(st.capacity, l.arena);
        CHECK(st.high_water <= l.arena);
        CHECK(l.arena >= peak);
        CHECK_EQ_U64(st.current, input_bytes(g));
        CHECK_EQ_U64(l.matched, l.n);
        CHECK(l.problems == 0);
        CHECK(l.c.problems == 0);
    }
    rkm_arena_capacity_info ff;
    CHECK(rkm_arena_capacity(p, RKM_ARENA_FIRST_FIT, &ff) == RKM_OK);
    if (getenv("TEST_VERBOSE"))
        fprintf(stderr, "  %-28s peak %10llu  layout arena %10llu  (+%.2f%%)  first-fit %10llu\n", label,
                (unsigned long long)peak, (unsigned long long)l.arena,
                peak ? 100.0 * (double)(l.arena - peak) / (double)peak : 0.0,
                (unsigned long long)ff.capacity);
done:
    rkm_arena_exec_destroy(l.c.x);
    free(l.live);
    free(l.seen);
    free(l.b);
    free(l.c.ranges);
}

TEST(layout_mode_baselines_on_all_graphs) { for_baseline_plans(check_layout_run); }


/* The desc's rules (each field means one thing in every mode): layout
 * mode needs a plan, of the desc's graph; an unknown mode and capacity 0
 * without a plan are refused; a layout exec refuses a run of a plan whose
 * buffers are not the layout's. */
TEST(layout_mode_rejects_other_plans)
{
    rkm_context *ctx;
    CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
    rkm_graph *g = test_load_graph(ctx, "gpt2-tiny");
    rkm_graph *g2 = test_load_graph(ctx, "mlp16");
    rkm_plan *base = NULL, *rec = NULL, *other = NULL;
    rkm_arena_exec *x = NULL;
    CHECK(g && g2 && rkm_plan_baseline(g, &base) == RKM_OK && rkm_plan_baseline(g2, &other) == RKM_OK);
    if (base && other) {
        rkm_arena_exec_desc d = {.graph = g};
        CHECK(rkm_arena_exec_create(&d, &x) == RKM_ERROR_ARGUMENT && !x);
        CHECK(strstr(msg_of(g), "layout mode (mode 0) needs desc.plan") != NULL);
        d.mode = RKM_ARENA_MEASURE;
        CHECK(rkm_arena_exec_create(&d, &x) == RKM_ERROR_ARGUMENT && !x);
        CHECK(strstr(msg_of(g), "capacity 0 sizes the region for desc.plan, which is NULL") != NULL);
        d.mode = (rkm_arena_mode)3;
        d.plan = base;
        CHECK(rkm_arena_exec_create(&d, &x) == RKM_ERROR_ARGUMENT && !x);
        CHECK(strstr(msg_of(g), "mode 3 is not") != NULL);
        d.mode = RKM_ARENA_LAYOUT;
        d.plan = other;
        CHECK(rkm_arena_exec_create(&d, &x) == RKM_ERROR_ARGUMENT && !x);
        CHECK(strstr(msg_of(g), "desc.plan is not of desc.graph") != NULL);
        d.plan = base;
        CHECK(rkm_arena_exec_create(&d, &x) == RKM_OK);
        CHECK(rkm_arena_exec_mode(NULL) == RKM_ARENA_LAYOUT);
        rkm_solve_desc sd;
        rkm_planner *pl = NULL;
        uint64_t minb = 0;
        memset(&sd, 0, sizeof sd);
        sd.algo = RKM_ALGO_ROTOR;
        if (rkm_planner_create(g, &sd, &pl) == RKM_OK && rkm_planner_min_budget(pl, &minb) == RKM_OK)
            CHECK(rkm_planner_solve(pl, minb, &rec) == RKM_OK);
        rkm_planner_destroy(pl);
        if (x && rec) {
            rkm_arena_stats st;
            CHECK(rkm_arena_exec_run(x, rec) == RKM_ERROR_STATE);
            CHECK(strstr(msg_of(g), "layout") != NULL);
            CHECK(rkm_arena_exec_stats_get(x, &st) == RKM_OK);
            CHECK_EQ_U64(st.current, input_bytes(g));
            /* The failure left the exec usable for its own plan. */
            CHECK(rkm_arena_exec_run(x, base) == RKM_OK);
        }
    }
    rkm_arena_exec_destroy(x);
    rkm_plan_destroy(rec);
    rkm_plan_destroy(base);
    rkm_plan_destroy(other);
    rkm_graph_destroy(g);
    rkm_graph_destroy(g2);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(arena_first_fit_and_counts);
    RUN(arena_rejects_bad_frees_and_sizes);
    RUN(arena_coalesces_and_limits_blocks);
    RUN(arena_tail_needs_only_requested_bytes);
    RUN(arena_matches_reference_model);
    RUN(arena_high_water_is_exact_capacity);
    RUN(trimmed_mean_drops_extremes);
    RUN(exec_baseline_matches_simulator_on_all_graphs);
    RUN(exec_recompute_plan);
    RUN(planner_plans_at_min_budget_run_in_both_modes);
    RUN(exec_arena_one_byte_short);
    RUN(exec_host_failure_and_workspace_overrun);
    RUN(exec_measures_workspace);
    RUN(exec_measure_mode_agrees_with_declared_workspaces);
    RUN(allocation_goes_through_the_context);
    RUN(exec_allocates_its_region);
    RUN(region_pointers_and_rules);
    RUN(region_that_cannot_be_allocated);
    RUN(layout_mode_baselines_on_all_graphs);
    RUN(layout_mode_rejects_other_plans);
    TEST_END();
}
