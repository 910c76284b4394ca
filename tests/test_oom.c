/* test_oom.c -- allocation failure. A context whose allocator fails at the
 * N-th allocation, for every N up to the number of allocations a clean run
 * makes (of an operation of thousands, its first and last few hundred and
 * a sample between: fails_here): each run either succeeds with the same result as the clean run, or
 * returns RKM_ERROR_NOMEM with its output NULL; nothing leaks, nor holds
 * the context (rockmate.h, CONVENTIONS: lifetimes); and the sizes
 * the library passes back on realloc and free always match what it asked
 * for (the allocator keeps every block's size in a table). */
#include "../src/internal.h"
/* white box: the statics it calls are planner.c's and nest.c's; the rest links
 * from the sources' objects (compiling the whole library into each test
 * took ~25 s of its build). */
#include "../src/planner.c"
#include "../src/nest.c"
#include "test.h"
#include "copy_graph.h"

/* ------------------------------------------------------ tracking allocator */

typedef struct block {
    void *p;
    size_t n;
} block;

static struct {
    block *b;
    size_t n, cap;
    size_t live;     /* bytes held by the library */
    long calls;      /* allocations (and growths) so far */
    long fail_at;    /* the call that fails; 0: none */
    long bad_sizes;  /* old_size that did not match the block */
    long unknown;    /* realloc/free of a pointer never handed out */
} A;

static long find_block(const void *p)
{
    for (size_t i = A.n; i-- > 0;)
        if (A.b[i].p == p) return (long)i;
    return -1;
}

static void *track_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    long i = ptr ? find_block(ptr) : -1;
    if (ptr && i < 0) {
        A.unknown++;
        return NULL;
    }
    if (ptr && A.b[i].n != old_size) {
        fprintf(stderr, "allocator: block of %zu bytes passed back as %zu\n", A.b[i].n, old_size);
        A.bad_sizes++;
    }
    if (!ptr && old_size != 0) A.bad_sizes++;
    if (new_size == 0) {
        if (ptr) {
            A.live -= A.b[i].n;
            A.b[i] = A.b[--A.n];
            free(ptr);
        }
        return NULL;
    }
    if (++A.calls == A.fail_at) return NULL;
    void *q = realloc(ptr, new_size);
    if (!q) return NULL;
    if (ptr) {
        A.live = A.live - A.b[i].n + new_size;
        A.b[i].p = q;
        A.b[i].n = new_size;
    } else {
        if (A.n == A.cap) {
            A.cap = A.cap ? A.cap * 2 : 1024;
            A.b = realloc(A.b, A.cap * sizeof *A.b);
            if (!A.b) exit(2);
        }
        A.b[A.n].p = q;
        A.b[A.n].n = new_size;
        A.n++;
        A.live += new_size;
    }
    return q;
}

static rkm_context *new_ctx(void)
{
    A.fail_at = 0;
    return test_new_ctx_alloc(track_alloc);
}

/* ------------------------------------------------------------ the driver */

/* One operation under test: run() makes its output (or fails), check()
 * compares a successful output with the clean run's, drop() destroys it. */
typedef struct op_under_test {
    const char *name;
    rkm_result (*run)(void *env, void **out);
    int (*check)(void *env, void *out);
    void (*drop)(void *out);
} op_under_test;

/* Whether run n (1..calls) of an operation that makes `calls` allocations
 * fails its n-th: every one of an operation of up to 2 * OOM_EDGE +
 * OOM_MIDDLE; of a longer one, the first and last OOM_EDGE and OOM_MIDDLE
 * evenly spaced between. A solve's thousands of allocations mostly repeat
 * a few sites of the search, candidate after candidate, while its set-up
 * (first) and its plan's birth and layout (last) happen once; each failing
 * run costs up to a whole solve, so failing them all took minutes. */
#define OOM_EDGE 200
#define OOM_MIDDLE 400
static int fails_here(long n, long calls)
{
    long middle = calls - 2 * OOM_EDGE;
    if (n <= OOM_EDGE || n > calls - OOM_EDGE || middle <= OOM_MIDDLE) return 1;
    return (n - OOM_EDGE) % ((middle + OOM_MIDDLE - 1) / OOM_MIDDLE) == 0;
}

/* Run op clean, count its allocations, then fail them in turn (those
 * fails_here picks); ctx is the context whose messages tell what went
 * wrong. */
static void every_failure(const op_under_test *op, void *env, const rkm_context *ctx)
{
    size_t live0 = A.live, held0 = ctx->live; /* held: the context's live graphs and arenas */
    long bad0 = A.bad_sizes;
    A.fail_at = 0;
    long c0 = A.calls;
    void *out = NULL;
    rkm_result r = op->run(env, &out);
    long clean_calls = A.calls - c0;
    if (r != RKM_OK) fprintf(stderr, "%s: the clean run failed: %s\n", op->name, rkm_context_errmsg(ctx));
    CHECK(r == RKM_OK && out != NULL);
    if (out) {
        CHECK(op->check(env, out));
        op->drop(out);
    }
    CHECK_EQ_U64(A.live, live0);
    long fails = 0;
    for (long n = 1; n <= clean_calls; n++) {
        if (!fails_here(n, clean_calls)) continue;
        out = &A; /* a failed run must set it to NULL */
        A.fail_at = A.calls + n;
        r = op->run(env, &out);
        A.fail_at = 0;
        if (r == RKM_OK) {
            /* the failure was absorbed (a shrink, say): the result must be whole */
            CHECK(out != NULL && out != (void *)&A && op->check(env, out));
        } else {
            fails++;
            if (r != RKM_ERROR_NOMEM || out != NULL)
                fprintf(stderr, "%s: failing allocation %ld of %ld: result %d, out %p: %s\n", op->name, n, clean_calls,
                        (int)r, out, rkm_context_errmsg(ctx));
            CHECK(r == RKM_ERROR_NOMEM);
            CHECK(out == NULL);
        }
        if (out && out != (void *)&A) op->drop(out);
        if (A.live != live0)
            fprintf(stderr, "%s: failing allocation %ld: %zu bytes leaked\n", op->name, n, A.live - live0);
        CHECK_EQ_U64(A.live, live0);
        CHECK_EQ_U64(ctx->live, held0);
    }
    CHECK(clean_calls == 0 || fails > 0);
    if (A.bad_sizes != bad0)
        fprintf(stderr, "%s: %ld blocks freed or grown with a wrong old size\n", op->name, A.bad_sizes - bad0);
    CHECK(A.bad_sizes == bad0);
#ifdef OOM_VERBOSE
    fprintf(stderr, "%s: %ld allocations, %ld failing runs\n", op->name, clean_calls, fails);
#endif
}

/* ---------------------------------------------------------- the operations */

typedef struct graph_env {
    rkm_context *ctx;
    const char *text;
    size_t len;
    const char *path;
    int32_t n_tensors, n_ops;
    uint64_t baseline_peak;
} graph_env;

static int check_graph(void *env, void *out)
{
    graph_env *e = env;
    rkm_graph_stats st;
    return rkm_graph_num_tensors(out) == e->n_tensors && rkm_graph_num_ops(out) == e->n_ops &&
           rkm_graph_stats_get(out, &st) == RKM_OK && st.baseline_peak == e->baseline_peak;
}

static void drop_graph(void *out) { rkm_graph_destroy(out); }

static rkm_result run_read_string(void *env, void **out)
{
    graph_env *e = env;
    return rkm_graph_read_string(e->ctx, e->text, e->len, "oom.rkg", (rkm_graph **)out);
}

static rkm_result run_read_file(void *env, void **out)
{
    graph_env *e = env;
    return rkm_graph_read_file(e->ctx, e->path, (rkm_graph **)out);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (buf) buf[*len] = 0;
    return buf;
}

/* Fill e's expected figures from a clean read. */
static int graph_env_init(graph_env *e, rkm_context *ctx, const char *name, char *path, size_t path_size)
{
    memset(e, 0, sizeof *e);
    e->ctx = ctx;
    test_graph_path(path, path_size, name);
    e->path = path;
    e->text = slurp(path, &e->len);
    CHECK(e->text != NULL);
    rkm_graph *g = NULL;
    if (!e->text || rkm_graph_read_string(ctx, e->text, e->len, "oom.rkg", &g) != RKM_OK) {
        CHECK(0);
        return 0;
    }
    rkm_graph_stats st;
    CHECK(rkm_graph_stats_get(g, &st) == RKM_OK);
    e->n_tensors = rkm_graph_num_tensors(g);
    e->n_ops = rkm_graph_num_ops(g);
    e->baseline_peak = st.baseline_peak;
    rkm_graph_destroy(g);
    return 1;
}

TEST(read_graphs)
{
    static const char *names[] = {"multi-output", "mlp16", "gpt2-tiny"};
    rkm_context *ctx = new_ctx();
    for (size_t k = 0; k < N_OF(names); k++) {
        graph_env e;
        char path[256];
        if (!graph_env_init(&e, ctx, names[k], path, sizeof path)) continue;
        op_under_test op = {names[k], run_read_string, check_graph, drop_graph};
        every_failure(&op, &e, ctx);
        if (k == 0) {
            op_under_test f = {path, run_read_file, check_graph, drop_graph};
            every_failure(&f, &e, ctx);
        }
        free((char *)e.text);
    }
    rkm_context_destroy(ctx);
}

/* A read that breaks a whole-graph rule at its very end (c is never
 * produced) frees all it built; with an allocation failing before that, the
 * answer is NOMEM, not the rule. */
static rkm_result run_read_bad(void *env, void **out)
{
    graph_env *e = env;
    rkm_result r = rkm_graph_read_string(e->ctx, e->text, e->len, "bad.rkg", (rkm_graph **)out);
    /* the clean run's answer is a GRAPH error: report it as the "success" */
    if (r == RKM_ERROR_GRAPH && *out == NULL) {
        *out = e;
        return RKM_OK;
    }
    return r == RKM_OK ? RKM_ERROR_STATE : r;
}

static int check_bad(void *env, void *out) { return out == env; }
static void drop_nothing(void *out) { (void)out; }

TEST(read_bad_graph)
{
    static const char text[] = "rockmate-graph 1\ntensor x 8 input\ntensor a 16\ntensor b 4\ntensor c 4\n"
                               "op f fwd=1 bwd=1 in=x out=a saved=x\nop g fwd=1 bwd=1 in=a out=b saved=a\nloss b\n";
    rkm_context *ctx = new_ctx();
    graph_env e;
    memset(&e, 0, sizeof e);
    e.ctx = ctx;
    e.text = text;
    e.len = strlen(text);
    op_under_test op = {"bad graph", run_read_bad, check_bad, drop_nothing};
    every_failure(&op, &e, ctx);
    rkm_context_destroy(ctx);
}

/* A chain of `layers` (linear, act) pairs with a phantom and a branch that
 * accumulates, built through the API. */
static rkm_result build(rkm_context *ctx, int layers, rkm_graph **out)
{
    rkm_graph *g = NULL;
    *out = NULL;
    rkm_result r = rkm_graph_create(ctx, &g);
    if (r) return r;
    int32_t prev, t, skip;
    char name[32];
    if ((r = rkm_graph_add_tensor(g, "x", 64, RKM_TENSOR_INPUT, &prev))) goto fail;
    skip = prev;
    for (int i = 0; i < layers && !r; i++) {
        snprintf(name, sizeof name, "h%d", i);
        if ((r = rkm_graph_add_tensor(g, name, 128 + (uint64_t)i, 0, &t))) break;
        int32_t in[2] = {prev, skip};
        rkm_op_desc d;
        memset(&d, 0, sizeof d);
        snprintf(name, sizeof name, "op%d", i);
        d.name = name;
        d.fwd_seconds = 1e-3 * (i + 1);
        d.bwd_seconds = 2e-3 * (i + 1);
        d.in = in;
        d.n_in = i > 0 && skip != prev ? 2 : 1;
        d.out = &t;
        d.n_out = 1;
        d.saved = in;
        d.n_saved = 1;
        d.phantom = (uint64_t)(i % 3) * 16;
        d.fwd_ws = 32;
        if ((r = rkm_graph_add_op(g, &d, NULL))) break;
        if (i % 4 == 0) skip = t;
        prev = t;
    }
    if (r) goto fail;
    if ((r = rkm_graph_set_loss(g, prev))) goto fail;
    if ((r = rkm_graph_finalize(g))) goto fail;
    *out = g;
    return RKM_OK;
fail:
    rkm_graph_destroy(g);
    return r;
}

static rkm_result run_build(void *env, void **out) { return build(env, 40, (rkm_graph **)out); }

static int check_built(void *env, void *out)
{
    (void)env;
    return rkm_graph_num_ops(out) == 40 && rkm_graph_is_finalized(out);
}

/* New costs and profiling make a new graph: every failure leaves none. */
static rkm_result run_with_costs(void *env, void **out)
{
    const rkm_graph *g = env;
    rkm_op_costs *costs = calloc((size_t)rkm_graph_num_ops(g) + 1, sizeof *costs);
    for (int32_t i = 0; i < rkm_graph_num_ops(g); i++) costs[i] = (rkm_op_costs){1e-3 * i, 2e-3, 16, 0};
    rkm_result r = rkm_graph_with_costs(g, costs, (rkm_graph **)out);
    free(costs);
    return r;
}

static rkm_result run_profile(void *env, void **out)
{
    rkm_callbacks cb = {.forward = noop_fwd, .backward = noop_bwd};
    rkm_profile_desc d = {.runs = 2};
    return rkm_graph_profile(env, &cb, &d, (rkm_graph **)out);
}

static int check_new_graph(void *env, void *out)
{
    return out != env && rkm_graph_num_ops(out) == rkm_graph_num_ops(env) && rkm_graph_is_finalized(out);
}

TEST(new_costs_new_graph)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = NULL;
    CHECK(build(ctx, 12, &g) == RKM_OK);
    if (g) {
        op_under_test ops[] = {{"with_costs", run_with_costs, check_new_graph, drop_graph},
                               {"profile", run_profile, check_new_graph, drop_graph}};
        for (size_t k = 0; k < N_OF(ops); k++) every_failure(&ops[k], g, ctx);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

TEST(build_through_api)
{
    rkm_context *ctx = new_ctx();
    op_under_test op = {"builder", run_build, check_built, drop_graph};
    every_failure(&op, ctx, ctx);
    rkm_context_destroy(ctx);
}

/* Plans: baseline, simulate, read, write, on a graph loaded beforehand. */
typedef struct plan_env {
    rkm_graph *g;
    rkm_plan *p; /* a baseline, for simulate and write */
    uint64_t peak;
    size_t n_steps;
    char *text;  /* the baseline written as .rkp */
    size_t len;
} plan_env;

static void drop_plan(void *out) { rkm_plan_destroy(out); }

static rkm_result run_baseline(void *env, void **out)
{
    plan_env *e = env;
    return rkm_plan_baseline(e->g, (rkm_plan **)out);
}

/* A whole plan: its steps, its figures, and it runs. */
static int check_plan(void *env, void *out)
{
    plan_env *e = env;
    rkm_plan_stats ps;
    rkm_callbacks cb = {.forward = noop_fwd, .backward = noop_bwd};
    return rkm_plan_num_steps(out) == e->n_steps && rkm_plan_stats_get(out, &ps) == RKM_OK && ps.peak == e->peak &&
           rkm_plan_execute(out, &cb) == RKM_OK;
}

/* A plan's birth allocates its steps, per-step figures, annotations and
 * buffers; every failure leaves nothing behind. */
static rkm_result run_plan_create(void *env, void **out)
{
    plan_env *e = env;
    return rkm_plan_create(e->g, rkm_plan_steps(e->p), rkm_plan_num_steps(e->p), NULL, (rkm_plan **)out);
}

static rkm_result run_plan_read(void *env, void **out)
{
    plan_env *e = env;
    return rkm_plan_read_string(e->g, e->text, e->len, "oom.rkp", NULL, (rkm_plan **)out);
}

/* The layout's scratch: on failure the caller's array is untouched. */
static uint64_t layout_arena;

static rkm_result run_layout(void *env, void **out)
{
    plan_env *e = env;
    rkm_buffer *b = calloc(rkm_plan_num_buffers(e->p) + 1, sizeof *b);
    rkm_result r = rkm_plan_layout(e->p, 0, b, &layout_arena);
    free(b);
    *out = r ? NULL : env;
    return r;
}

static int check_layout(void *env, void *out)
{
    plan_env *e = env;
    return out == env && layout_arena >= e->peak;
}

static int count_write(void *user, const char *data, size_t len)
{
    (void)data;
    *(size_t *)user += len;
    return 0;
}

/* An arena exec (layout mode, its region allocated) and an arena: each
 * holds what it was made from, and a failed one holds nothing. */
static rkm_result run_exec(void *env, void **out)
{
    plan_env *e = env;
    rkm_arena_exec_desc d = {.graph = e->g, .plan = e->p, .allocate = 1};
    return rkm_arena_exec_create(&d, (rkm_arena_exec **)out);
}

static int check_exec(void *env, void *out)
{
    plan_env *e = env;
    rkm_arena_stats st;
    return rkm_arena_exec_run(out, e->p) == RKM_OK && rkm_arena_exec_stats_get(out, &st) == RKM_OK &&
           st.peak == e->peak;
}

static void drop_exec(void *out) { rkm_arena_exec_destroy(out); }

static rkm_result run_arena(void *env, void **out)
{
    plan_env *e = env;
    return rkm_arena_create(rkm_graph_context(e->g), 4096, 16, (rkm_arena **)out);
}

static int check_arena(void *env, void *out)
{
    (void)env;
    uint64_t off;
    return rkm_arena_alloc(out, 100, &off) == RKM_OK && off == 0;
}

static void drop_arena(void *out) { rkm_arena_destroy(out); }

static size_t written;

static rkm_result run_write(void *env, void **out)
{
    plan_env *e = env;
    size_t n = 0;
    rkm_result r = rkm_graph_write(e->g, count_write, &n);
    if (!r) r = rkm_plan_write(e->p, count_write, &n);
    *out = r ? NULL : env;
    written = n;
    return r;
}

static int check_write(void *env, void *out)
{
    (void)env;
    return out == env && written > 0;
}

static int text_sink(void *user, const char *data, size_t len)
{
    plan_env *e = user;
    char *t = realloc(e->text, e->len + len + 1);
    if (!t) return 1;
    memcpy(t + e->len, data, len);
    e->text = t;
    e->len += len;
    t[e->len] = 0;
    return 0;
}

TEST(plans)
{
    rkm_context *ctx = new_ctx();
    plan_env e;
    memset(&e, 0, sizeof e);
    CHECK(build(ctx, 24, &e.g) == RKM_OK);
    if (e.g) CHECK(rkm_plan_baseline(e.g, &e.p) == RKM_OK);
    if (e.p) {
        rkm_plan_stats ps;
        CHECK(rkm_plan_stats_get(e.p, &ps) == RKM_OK);
        e.peak = ps.peak;
        e.n_steps = rkm_plan_num_steps(e.p);
        CHECK(rkm_plan_write(e.p, text_sink, &e) == RKM_OK);
    }
    if (e.p && e.text) {
        op_under_test ops[] = {
            {"baseline", run_baseline, check_plan, drop_plan},
            {"plan create", run_plan_create, check_plan, drop_plan},
            {"plan read", run_plan_read, check_plan, drop_plan},
            {"layout", run_layout, check_layout, drop_nothing},
            {"write", run_write, check_write, drop_nothing},
            {"arena exec", run_exec, check_exec, drop_exec},
            {"arena", run_arena, check_arena, drop_arena},
        };
        for (size_t k = 0; k < N_OF(ops); k++) every_failure(&ops[k], &e, ctx);
    }
    free(e.text);
    rkm_plan_destroy(e.p);
    rkm_graph_destroy(e.g);
    rkm_context_destroy(ctx);
}

/* The planners that need no ILP, on mlp16 under a budget they can meet. */
typedef struct solve_env {
    rkm_graph *g;
    rkm_solve_desc desc;
    uint64_t budget;
    size_t n_steps; /* the clean run's: plans are deterministic */
    uint64_t min;   /* the clean run's smallest budget (run_min_budget) */
} solve_env;

static rkm_result run_solve(void *env, void **out)
{
    solve_env *e = env;
    return rkm_plan_solve(e->g, &e->desc, e->budget, (rkm_plan **)out);
}

static int check_solve(void *env, void *out)
{
    solve_env *e = env;
    rkm_plan_stats ps;
    if (!e->n_steps) e->n_steps = rkm_plan_num_steps(out);
    return rkm_plan_num_steps(out) == e->n_steps && rkm_plan_stats_get(out, &ps) == RKM_OK && ps.peak <= e->budget;
}

TEST(planners)
{
    rkm_context *ctx = new_ctx();
    solve_env e;
    memset(&e, 0, sizeof e);
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/mlp16.rkg", &e.g) == RKM_OK);
    rkm_graph_stats st;
    if (e.g && rkm_graph_stats_get(e.g, &st) == RKM_OK) {
        static const struct {
            rkm_algo algo;
            int percent;
        } runs[] = {{RKM_ALGO_NONE, 100}, {RKM_ALGO_SQRT, 80}, {RKM_ALGO_ROTOR, 70}};
        for (size_t k = 0; k < N_OF(runs); k++) {
            e.desc.algo = runs[k].algo;
            e.budget = st.baseline_peak - st.baseline_peak / 100 * (uint64_t)(100 - runs[k].percent);
            e.n_steps = 0;
            op_under_test op = {rkm_algo_name(runs[k].algo), run_solve, check_solve, drop_plan};
            every_failure(&op, &e, ctx);
        }
    }
    rkm_graph_destroy(e.g);
    rkm_context_destroy(ctx);
}

/* A progress callback that cancels every solve at its first report. */
static int cancel_solves(void *user, const rkm_progress *p)
{
    (void)user;
    return p->stage == RKM_STAGE_SOLVE;
}

/* A cancelled rkm_plan_solve (its creation goes on, its solve is
 * cancelled) with every allocation failing in turn: RKM_ERROR_NOMEM or
 * RKM_ERROR_CANCELLED, never a plan, never a leak. */
TEST(cancelled_solves)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = NULL;
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/mlp16.rkg", &g) == RKM_OK);
    rkm_graph_stats st;
    if (g && rkm_graph_stats_get(g, &st) == RKM_OK) {
        rkm_solve_desc d;
        memset(&d, 0, sizeof d);
        d.algo = RKM_ALGO_ROTOR;
        d.progress = cancel_solves;
        size_t live0 = A.live;
        long c0 = A.calls, clean_calls, fails = 0;
        rkm_plan *p = NULL;
        CHECK(rkm_plan_solve(g, &d, st.baseline_peak / 10 * 7, &p) == RKM_ERROR_CANCELLED && p == NULL);
        clean_calls = A.calls - c0;
        for (long n = 1; n <= clean_calls; n++) {
            if (!fails_here(n, clean_calls)) continue;
            p = (rkm_plan *)&A;
            A.fail_at = A.calls + n;
            rkm_result r = rkm_plan_solve(g, &d, st.baseline_peak / 10 * 7, &p);
            A.fail_at = 0;
            fails += r == RKM_ERROR_NOMEM;
            CHECK((r == RKM_ERROR_NOMEM || r == RKM_ERROR_CANCELLED) && p == NULL);
            CHECK_EQ_U64(A.live, live0);
        }
        CHECK(fails > 0);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* rockmate (the default), checkmate and DTR: with every allocation of a
 * solve failing in turn, the search, the block and whole-graph ILPs, the
 * squeeze and the kicks run past their NOMEM branches, and then those of
 * the smallest budget's search (up, then down) with the plan at it. So the
 * graph is tiny (4 ops, one in place, one with two outputs: a clean
 * rockmate solve makes about 5000 allocations) and the budget a third of
 * the way from its lower bound to its baseline peak, at alignment 1 so that
 * the bytes are the contract's. */
static const char tiny_graph[] = "rockmate-graph 1\ntensor x 64 input\ntensor h 128\ntensor a 128\ntensor b 96\n"
                                 "tensor c 32\ntensor loss 4\nop fc fwd=2e-3 bwd=4e-3 in=x out=h saved=x fwd_ws=16\n"
                                 "op relu fwd=1e-3 bwd=1e-3 in=h out=a saved=h inplace\n"
                                 "op split fwd=1e-3 bwd=1e-3 in=a out=b,c saved=a phantom=32\n"
                                 "op ce fwd=1e-3 bwd=1e-3 in=b,c out=loss saved=b,c\nloss loss\n";

/* A planner's smallest budget (its search up, then down while one byte
 * under still finds a plan), and the plan at it: its arena is that budget. */
static rkm_result run_min_budget(void *env, void **out)
{
    solve_env *e = env;
    rkm_planner *pl = NULL;
    uint64_t min = 0;
    *out = NULL;
    rkm_result r = rkm_planner_create(e->g, &e->desc, &pl);
    if (!r) r = rkm_planner_min_budget(pl, &min);
    if (!r) r = rkm_planner_solve(pl, min, (rkm_plan **)out);
    rkm_planner_destroy(pl);
    return r;
}

static int check_min_budget(void *env, void *out)
{
    solve_env *e = env;
    rkm_plan_stats ps;
    if (rkm_plan_stats_get(out, &ps) != RKM_OK) return 0;
    if (!e->n_steps) e->n_steps = rkm_plan_num_steps(out), e->min = ps.arena_bytes;
    return rkm_plan_num_steps(out) == e->n_steps && ps.arena_bytes == e->min && ps.budget == e->min;
}

TEST(search_planners)
{
    static const rkm_algo algos[] = {RKM_ALGO_ROCKMATE, RKM_ALGO_CHECKMATE, RKM_ALGO_DTR};
    rkm_context *ctx = new_ctx();
    solve_env e;
    memset(&e, 0, sizeof e);
    CHECK(rkm_graph_read_string(ctx, tiny_graph, strlen(tiny_graph), "tiny.rkg", &e.g) == RKM_OK);
    rkm_graph_stats st;
    if (e.g && rkm_graph_stats_get(e.g, &st) == RKM_OK) {
        CHECK(st.lower_bound < st.baseline_peak);
        e.budget = st.lower_bound + (st.baseline_peak - st.lower_bound) / 3;
        e.desc.alignment = 1;
        for (size_t k = 0; k < N_OF(algos); k++) {
            e.desc.algo = algos[k];
            e.n_steps = 0;
            rkm_plan *p = NULL;
            rkm_result r = rkm_plan_solve(e.g, &e.desc, e.budget, &p);
#ifdef RKM_OMIT_SOLVER
            if (algos[k] == RKM_ALGO_CHECKMATE) { /* the one algorithm that needs lp_solve */
                CHECK(r == RKM_ERROR_UNSUPPORTED);
                continue;
            }
#endif
            CHECK(r == RKM_OK);
            rkm_plan_destroy(p);
            op_under_test op = {rkm_algo_name(algos[k]), run_solve, check_solve, drop_plan};
            every_failure(&op, &e, ctx);
            op_under_test min = {"smallest budget", run_min_budget, check_min_budget, drop_plan};
            e.n_steps = 0;
            every_failure(&min, &e, ctx);
        }
    }
    rkm_graph_destroy(e.g);
    rkm_context_destroy(ctx);
}

/* Drop options (nest.c): a rockmate planner's creation on a chain of two
 * 5-op DAG blocks, where each class gets them, with every allocation
 * failing in turn (no block ILP, so that the loop is quick). */
static const char chain_graph[] =
    "rockmate-graph 1\ntensor x 64 input\ntensor p0 96\ntensor q0 80\ntensor r0 128\ntensor s0 96\ntensor y0 64\n"
    "tensor p1 96\ntensor q1 80\ntensor r1 128\ntensor s1 96\ntensor y1 64\ntensor loss 4\n"
    "op a0 fwd=1e-3 bwd=2e-3 in=x out=p0 saved=x\nop b0 fwd=3e-3 bwd=6e-3 in=x out=q0 saved=x phantom=32\n"
    "op c0 fwd=1e-3 bwd=2e-3 in=p0,q0 out=r0 saved=p0,q0\nop d0 fwd=2e-3 bwd=4e-3 in=r0,p0 out=s0 saved=r0\n"
    "op e0 fwd=1e-3 bwd=2e-3 in=s0,q0 out=y0 saved=s0,q0\nop a1 fwd=1e-3 bwd=2e-3 in=y0 out=p1 saved=y0\n"
    "op b1 fwd=3e-3 bwd=6e-3 in=y0 out=q1 saved=y0 phantom=32\nop c1 fwd=1e-3 bwd=2e-3 in=p1,q1 out=r1 saved=p1,q1\n"
    "op d1 fwd=2e-3 bwd=4e-3 in=r1,p1 out=s1 saved=r1\nop e1 fwd=1e-3 bwd=2e-3 in=s1,q1 out=y1 saved=s1,q1\n"
    "op xent fwd=1e-3 bwd=1e-3 in=y1 out=loss saved=y1\nloss loss\n";

static rkm_result run_planner(void *env, void **out)
{
    solve_env *e = env;
    return rkm_planner_create(e->g, &e->desc, (rkm_planner **)out);
}

/* The clean run's options (in n_steps), every time. */
static int check_planner(void *env, void *out)
{
    solve_env *e = env;
    rkm_planner_stats st;
    if (rkm_planner_stats_get(out, &st) != RKM_OK) return 0;
    if (!e->n_steps) e->n_steps = (size_t)st.options;
    return (size_t)st.options == e->n_steps;
}

static void drop_planner(void *out) { rkm_planner_destroy(out); }

TEST(drop_options)
{
    rkm_context *ctx = new_ctx();
    solve_env e;
    memset(&e, 0, sizeof e);
    CHECK(rkm_graph_read_string(ctx, chain_graph, strlen(chain_graph), "chain.rkg", &e.g) == RKM_OK);
    e.desc.alignment = 1;
    e.desc.ilp_budget = 1e-9;
    rkm_planner *pl = NULL;
    if (e.g) CHECK(rkm_planner_create(e.g, &e.desc, &pl) == RKM_OK);
    if (pl) { /* the drop options are there: more than each block's keep-all */
        CHECK(e.g->n_blocks == 3 && rkm__drop_chain(e.g));
        CHECK(pl->bo[0].n_opt > 1 && pl->bo[1].n_opt > 1);
    }
    rkm_planner_destroy(pl);
    op_under_test op = {"drop options", run_planner, check_planner, drop_planner};
    if (e.g) every_failure(&op, &e, ctx);
    rkm_graph_destroy(e.g);
    rkm_context_destroy(ctx);
}

/* DTR with a copy link (test_offload's dtr_offloads_hand_worked): its
 * evictions to host memory, the offloads merged into the plan and the
 * prefetches moved ahead of need, every allocation failing in turn. */
static const char dtr_copy_graph[] =
    "rockmate-graph 1\ncopy d2h=1e9 h2d=1e9 latency=0\ntensor x 64 input\ntensor a 1000\ntensor b 1000\n"
    "tensor c 1000\ntensor d 1000\ntensor loss 4\nop A fwd=10e-3 bwd=10e-3 in=x out=a saved=x\n"
    "op B fwd=1e-3 bwd=1e-3 in=a out=b saved=a\nop C fwd=1e-3 bwd=1e-3 in=b out=c saved=b\n"
    "op D fwd=1e-3 bwd=1e-3 in=c out=d saved=c\nop L fwd=1e-3 bwd=1e-3 in=d out=loss saved=d\nloss loss\n";

/* Planner `algo` on graph `text` at `budget` (alignment 1), checked to
 * offload, then with every allocation failing in turn. */
static void copies_every_failure(const char *text, rkm_algo algo, uint64_t budget, const char *what)
{
    rkm_context *ctx = new_ctx();
    solve_env e;
    memset(&e, 0, sizeof e);
    CHECK(rkm_graph_read_string(ctx, text, strlen(text), "copies.rkg", &e.g) == RKM_OK);
    e.desc.algo = algo;
    e.desc.alignment = 1;
    e.budget = budget;
    rkm_plan *p = NULL;
    rkm_plan_stats ps;
    CHECK(e.g && rkm_plan_solve(e.g, &e.desc, e.budget, &p) == RKM_OK && rkm_plan_stats_get(p, &ps) == RKM_OK);
    CHECK(p && ps.offloads > 0); /* else the loop below covers nothing new */
    rkm_plan_destroy(p);
    op_under_test op = {what, run_solve, check_solve, drop_plan};
    if (e.g) every_failure(&op, &e, ctx);
    rkm_graph_destroy(e.g);
    rkm_context_destroy(ctx);
}

TEST(dtr_copies)
{
    copies_every_failure(dtr_copy_graph, RKM_ALGO_DTR, 4100, "dtr with a copy link");
}

/* Rockmate's smallest budget with a copy link, below its recompute-only
 * floor (240 bytes) at the graph's lower bound (224): the floor's search,
 * the bases it offloads, the bisection and the plan kept for the solve at
 * it, with every allocation failing in turn (fails_here's sample of about
 * 20000: each run is a whole search; every 4th took 6 minutes here, and
 * found a leak that every 31st finds too). A random tiny graph (test_offload's
 * planner_against_brute_force, seed 25). */
static const char tiny_copy_graph[] = G_TINY_COPY;

TEST(offload_min_budget)
{
    rkm_context *ctx = new_ctx();
    solve_env e;
    memset(&e, 0, sizeof e);
    CHECK(rkm_graph_read_string(ctx, tiny_copy_graph, strlen(tiny_copy_graph), "tiny-copy.rkg", &e.g) == RKM_OK);
    rkm_graph *plain = NULL;
    rkm_planner *a = NULL, *b = NULL;
    uint64_t floor = 0, min = 0;
    e.desc.alignment = 1;
    CHECK(e.g && rkm_graph_with_copy(e.g, NULL, &plain) == RKM_OK);
    CHECK(plain && rkm_planner_create(plain, &e.desc, &a) == RKM_OK && rkm_planner_min_budget(a, &floor) == RKM_OK);
    CHECK(rkm_planner_create(e.g, &e.desc, &b) == RKM_OK && rkm_planner_min_budget(b, &min) == RKM_OK);
    CHECK(min < floor); /* else the offloading bisection never runs */
    rkm_planner_destroy(a);
    rkm_planner_destroy(b);
    rkm_graph_destroy(plain);
    op_under_test op = {"smallest budget with a copy link", run_min_budget, check_min_budget, drop_plan};
    if (e.g && min < floor) every_failure(&op, &e, ctx);
    rkm_graph_destroy(e.g);
    rkm_context_destroy(ctx);
}

/* Checkmate with a copy link (the whole-graph ILP with copies, the pass
 * placing its offloads) on the graph above at its lower bound, where no
 * recompute-only plan fits: model, lp_solve's solution read out, the
 * pass and the plan, every allocation failing in turn. */
#ifndef RKM_OMIT_SOLVER
TEST(checkmate_copies)
{
    copies_every_failure(tiny_copy_graph, RKM_ALGO_CHECKMATE, 224, "checkmate with a copy link");
}
#endif

/* The offload stage (src/offload.c) on gpt2-tiny's baseline with a fast
 * copy link at half its peak, and the birth of the plan it makes (copy
 * steps, host copies, prefetched buffers), every allocation failing in
 * turn. (The whole solve around it is rockmate's, covered above; with its
 * thousands of allocations a loop over it would take minutes.) */
typedef struct offload_env {
    rkm_graph *g;
    rkm_plan *base;
    uint64_t budget;
    size_t n_steps; /* the clean run's */
} offload_env;

static rkm_result run_offload(void *env, void **out)
{
    offload_env *e = env;
    rkm__steps d;
    *out = NULL;
    rkm_result r = rkm__offload_plan(e->g, e->base->steps, e->base->n_steps, e->budget, 1, NULL, &d, NULL);
    if (!r && !d.n) return RKM_ERROR_BUDGET; /* a clean run finds copies: check says so */
    return r ? r : rkm__plan_birth(e->g, &d, NULL, (rkm_plan **)out);
}

static int check_offload(void *env, void *out)
{
    offload_env *e = env;
    rkm_plan_stats ps;
    if (!e->n_steps) e->n_steps = rkm_plan_num_steps(out);
    return rkm_plan_stats_get(out, &ps) == RKM_OK && ps.offloads > 0 && ps.peak <= e->budget &&
           rkm_plan_num_steps(out) == e->n_steps;
}

TEST(offload_stage)
{
    rkm_context *ctx = new_ctx();
    offload_env e;
    memset(&e, 0, sizeof e);
    rkm_graph *g = NULL;
    rkm_copy_desc c = {1e12, 1e12, 0};
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/gpt2-tiny.rkg", &g) == RKM_OK);
    if (g) CHECK(rkm_graph_with_copy(g, &c, &e.g) == RKM_OK);
    if (e.g) CHECK(rkm_plan_baseline(e.g, &e.base) == RKM_OK);
    if (e.base) {
        e.budget = e.g->stats.baseline_peak / 2;
        op_under_test op = {"offload stage", run_offload, check_offload, drop_plan};
        every_failure(&op, &e, ctx);
    }
    rkm_plan_destroy(e.base);
    rkm_graph_destroy(e.g);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* The chain DP with block inputs in host memory (rkm__chain_offloads: its
 * chain, its table, the plan, its prefetches moved ahead, the hand-out) on
 * mlp16 with a 450 GB/s link at half its peak, where it offloads, every
 * allocation failing in turn. The planner's table is a cache: each run
 * makes it anew and lets it go, so every run starts from none. */
typedef struct chain_off_env {
    rkm_planner *pl;
    uint64_t budget;
    size_t n_steps; /* the clean run's */
} chain_off_env;

static rkm_result run_chain_off(void *env, void **out)
{
    chain_off_env *e = env;
    rkm_planner *pl = e->pl;
    rkm_result r = rkm__chain_offloads(pl, e->budget, INFINITY, (rkm_plan **)out);
    rkm__free(pl->ctx, pl->off_dpb, (size_t)pl->g->n_blocks * sizeof *pl->off_dpb);
    pl->off_dpb = NULL;
    rkm__dp_table_free(pl->ctx, &pl->off_table);
    return r || *out ? r : RKM_ERROR_BUDGET; /* a clean run finds a plan: check says so */
}

static int check_chain_off(void *env, void *out)
{
    chain_off_env *e = env;
    rkm_plan_stats ps;
    if (!e->n_steps) e->n_steps = rkm_plan_num_steps(out);
    return rkm_plan_stats_get(out, &ps) == RKM_OK && ps.offloads > 0 && ps.arena_bytes <= e->budget &&
           rkm_plan_num_steps(out) == e->n_steps;
}

TEST(chain_offloads)
{
    rkm_context *ctx = new_ctx();
    chain_off_env e;
    memset(&e, 0, sizeof e);
    rkm_graph *g = NULL, *gc = NULL;
    rkm_copy_desc c = {450e9, 450e9, 1e-5};
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/mlp16.rkg", &g) == RKM_OK);
    if (g) CHECK(rkm_graph_with_copy(g, &c, &gc) == RKM_OK);
    if (gc) CHECK(rkm_planner_create(gc, NULL, &e.pl) == RKM_OK);
    if (e.pl) {
        e.budget = gc->stats.baseline_peak / 2;
        op_under_test op = {"chain DP with copies", run_chain_off, check_chain_off, drop_plan};
        every_failure(&op, &e, ctx);
    }
    rkm_planner_destroy(e.pl);
    rkm_graph_destroy(gc);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Offload moves (rkm__offload_moves: polish judged by the offload pass,
 * the winner laid out) from copy_graph.h's plan that rebuilds h, every
 * allocation failing in turn: the plan given stays the caller's, whole,
 * where it fails. */
typedef struct moves_env {
    rkm_planner *pl;
    const rkm_plan *start;
} moves_env;

static rkm_result run_moves(void *env, void **out)
{
    moves_env *e = env;
    rkm_plan *p = NULL;
    rkm_result r = rkm__plan_copy(e->start, &p);
    if (!r) r = rkm__offload_moves(e->pl, 3400, 1000000, &p);
    if (!r && p && p->n_steps == e->start->n_steps && !memcmp(p->steps, e->start->steps, p->n_steps * sizeof *p->steps))
        r = RKM_ERROR_BUDGET; /* the plan given back unchanged where it fails: check says so */
    if (r) {
        rkm_plan_destroy(p);
        p = NULL;
    }
    *out = p;
    return r;
}

static int check_moves(void *env, void *out)
{
    (void)env;
    rkm_plan_stats ps;
    return rkm_plan_stats_get(out, &ps) == RKM_OK && ps.offloads == 1 && ps.time == 12.0 && ps.arena_bytes <= 3400;
}

TEST(offload_moves)
{
    rkm_context *ctx = new_ctx();
    moves_env e = {NULL, NULL};
    rkm_graph *g = NULL;
    rkm_plan *start = NULL;
    rkm_solve_desc d = {.alignment = 1};
    CHECK(rkm_graph_read_string(ctx, G_COPY, strlen(G_COPY), "copy.rkg", &g) == RKM_OK);
    if (g) CHECK(rkm_plan_read_string(g, P_RECOMPUTE, strlen(P_RECOMPUTE), "copy.rkp", NULL, &start) == RKM_OK);
    if (start) CHECK(rkm_planner_create(g, &d, &e.pl) == RKM_OK);
    if (e.pl) {
        e.start = start;
        op_under_test op = {"offload moves", run_moves, check_moves, drop_plan};
        every_failure(&op, &e, ctx);
    }
    rkm_planner_destroy(e.pl);
    rkm_plan_destroy(start);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Nesting writes a block as a graph of its own (rkm__nest_graph): every
 * failing allocation of that build leaves nothing behind. unet-d4's outer
 * block, 37 ops, with the skip tensor as an input and a stand-in loss. */
typedef struct nest_env {
    rkm_graph *g;
    int32_t *map;
} nest_env;

static rkm_result run_nest_graph(void *env, void **out)
{
    nest_env *e = env;
    return rkm__nest_graph(e->g, &e->g->blocks[1], e->map, (rkm_graph **)out);
}

static int check_nest_graph(void *env, void *out)
{
    nest_env *e = env;
    const rkm_graph *h = out;
    return h->n_ops == (size_t)e->g->blocks[1].n_ops + 1 && h->finalized && h->n_blocks > 2;
}

TEST(nest_graph)
{
    rkm_context *ctx = new_ctx();
    nest_env e;
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/unet-d4.rkg", &e.g) == RKM_OK);
    if (e.g) {
        e.map = malloc((e.g->n_tensors + 1) * sizeof *e.map);
        op_under_test op = {"nest graph", run_nest_graph, check_nest_graph, drop_graph};
        if (e.map) every_failure(&op, &e, ctx);
        free(e.map);
    }
    rkm_graph_destroy(e.g);
    rkm_context_destroy(ctx);
}

TEST(context_create)
{
    rkm_context_desc d;
    memset(&d, 0, sizeof d);
    d.alloc = track_alloc;
    rkm_context *ctx = (rkm_context *)&d;
    A.fail_at = A.calls + 1;
    CHECK(rkm_context_create(&d, &ctx) == RKM_ERROR_NOMEM);
    CHECK(ctx == NULL);
    A.fail_at = 0;
}

/* Run last: everything is destroyed, nothing is left, and every size
 * passed back matched. */
TEST(allocator_totals)
{
    CHECK_EQ_U64(A.live, 0);
    CHECK(A.n == 0);
    CHECK(A.bad_sizes == 0);
    CHECK(A.unknown == 0);
}

int main(void)
{
    RUN(context_create);
    RUN(read_graphs);
    RUN(read_bad_graph);
    RUN(build_through_api);
    RUN(new_costs_new_graph);
    RUN(plans);
    RUN(planners);
    RUN(cancelled_solves);
    RUN(search_planners);
    RUN(dtr_copies);
    RUN(offload_min_budget);
    RUN_SOLVER(checkmate_copies);
    RUN(drop_options);
    RUN(offload_stage);
    RUN(chain_offloads);
    RUN(offload_moves);
    RUN(nest_graph);
    RUN(allocator_totals);
    free(A.b);
    TEST_END();
}
