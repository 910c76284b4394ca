/* test_lifetime: destroying a graph or a context while objects made from
 * it live (rockmate.h, CONVENTIONS: deferred, as sqlite3_close_v2). The
 * objects left keep working: queries, writing, executing, laying out,
 * planning, arena calls, and failing calls that write the context's
 * message and call its logger; the graph or context goes with the last of
 * them, and not before. Every order of destroying a context, a graph, a
 * plan, a planner, an arena and an arena exec is run; the allocator counts
 * what is outstanding, and the sanitizers catch a use after free. */
#include "test.h"

/* Sizes that are not multiples of the planner's alignment: the planner
 * plans with a copy of its own (rkm_planner_create's aligned graph). */
static const char CHAIN[] = "rockmate-graph 1\ntensor x 1000 input\ntensor a 3000\ntensor b 3000\ntensor c 3000\n"
                            "tensor d 3000\ntensor l 8\n"
                            "op f1 fwd=1 bwd=2 in=x out=a saved=x phantom=500\n"
                            "op f2 fwd=1 bwd=2 in=a out=b saved=a phantom=500\n"
                            "op f3 fwd=1 bwd=2 in=b out=c saved=b phantom=500\n"
                            "op f4 fwd=1 bwd=2 in=c out=d saved=c phantom=500\n"
                            "op f5 fwd=1 bwd=2 in=d out=l saved=d\nloss l\n";

/* The logger: failed calls, and the last message. */
static int n_logged;
static char last_logged[512];

static void logger(void *user, rkm_log_level level, const char *msg)
{
    (void)user;
    if (level != RKM_LOG_ERROR) return;
    n_logged++;
    snprintf(last_logged, sizeof last_logged, "%s", msg);
}

static rkm_context *counted_ctx(void)
{
    rkm_context_desc d;
    memset(&d, 0, sizeof d);
    d.alloc = test_count_alloc;
    d.log = logger;
    d.log_level = RKM_LOG_ERROR;
    rkm_context *ctx = NULL;
    CHECK(rkm_context_create(&d, &ctx) == RKM_OK);
    return ctx;
}

/* A failing call's effects: one more message logged, containing `what`,
 * and (where the context is reachable) the same message in the context. */
static void check_failed(int logged_before, const rkm_context *ctx, const char *what)
{
    CHECK(n_logged == logged_before + 1);
    if (!strstr(last_logged, what)) fprintf(stderr, "logged '%s', expected '%s' in it\n", last_logged, what);
    CHECK(strstr(last_logged, what) != NULL);
    if (ctx) CHECK(strcmp(rkm_context_errmsg(ctx), last_logged) == 0);
}

static int fail_fwd(void *user, const rkm_fwd_call *c)
{
    (void)user;
    (void)c;
    return 7;
}

/* What a fresh set of objects gives, to compare with later. */
typedef struct reference {
    char *plan_text;   /* the baseline plan, written */
    char *solved_text; /* the planner's plan at the budget, written */
    uint64_t budget, min_budget;
} reference;

/* The plan, used as a host would after its graph or context may have been
 * destroyed: reached only through the plan. */
static void use_plan(const rkm_plan *p, const reference *ref)
{
    const rkm_graph *g = rkm_plan_graph(p);
    rkm_context *ctx = rkm_graph_context(g);
    CHECK(rkm_graph_num_ops(g) == 5 && rkm_graph_find_tensor(g, "c") == 3);
    rkm_plan_stats st;
    CHECK(rkm_plan_stats_get(p, &st) == RKM_OK && st.peak > 0);
    sbuf text = {0};
    CHECK(rkm_plan_write(p, sbuf_write, &text) == RKM_OK);
    CHECK(text.data && ref->plan_text && strcmp(text.data, ref->plan_text) == 0);
    free(text.data);
    rkm_callbacks cb = {.forward = noop_fwd, .backward = noop_bwd};
    CHECK(rkm_plan_execute(p, &cb) == RKM_OK);
    rkm_buffer buffers[64];
    uint64_t arena = 0;
    CHECK(rkm_plan_num_buffers(p) <= N_OF(buffers));
    CHECK(rkm_plan_layout(p, 0, buffers, &arena) == RKM_OK && arena >= st.peak);
    rkm_arena_capacity_info need;
    CHECK(rkm_arena_capacity(p, RKM_ARENA_FIRST_FIT, &need) == RKM_OK && need.capacity >= st.peak);
    /* a new exec on the graph the plan reaches, made and run */
    rkm_arena_exec_desc xd = {.graph = g, .plan = p};
    rkm_arena_exec *x = NULL;
    CHECK(rkm_arena_exec_create(&xd, &x) == RKM_OK && rkm_arena_exec_run(x, p) == RKM_OK);
    rkm_arena_exec_destroy(x);
    int before = n_logged;
    cb.forward = fail_fwd;
    CHECK(rkm_plan_execute(p, &cb) == RKM_ERROR_CALLBACK);
    check_failed(before, ctx, "returned 7");
}

static void use_planner(rkm_planner *pl, const reference *ref)
{
    rkm_plan *q = NULL, *none = NULL;
    CHECK(rkm_planner_solve(pl, ref->budget, &q) == RKM_OK);
    sbuf text = {0};
    if (q) CHECK(rkm_plan_write(q, sbuf_write, &text) == RKM_OK);
    CHECK(text.data && ref->solved_text && strcmp(text.data, ref->solved_text) == 0);
    free(text.data);
    uint64_t min = 0;
    CHECK(rkm_planner_min_budget(pl, &min) == RKM_OK && min == ref->min_budget);
    int before = n_logged;
    CHECK(rkm_planner_solve(pl, 1, &none) == RKM_ERROR_BUDGET && none == NULL);
    check_failed(before, q ? rkm_graph_context(rkm_plan_graph(q)) : NULL, "budget");
    rkm_plan_destroy(q); /* a plan made after its graph may have been destroyed */
}

static void use_arena(rkm_arena *a)
{
    uint64_t off = RKM_ARENA_NONE;
    CHECK(rkm_arena_alloc(a, 100, &off) == RKM_OK && off == 0);
    CHECK(rkm_arena_free(a, off) == RKM_OK);
    int before = n_logged;
    CHECK(rkm_arena_alloc(a, 0, &off) == RKM_ERROR_ARGUMENT);
    check_failed(before, NULL, "a block of 0 bytes");
}

static void use_exec(rkm_arena_exec *x, const rkm_plan *p)
{
    rkm_arena_stats st;
    CHECK(rkm_arena_exec_stats_get(x, &st) == RKM_OK);
    if (p) CHECK(rkm_arena_exec_run(x, p) == RKM_OK);
    uint64_t off;
    int before = n_logged;
    CHECK(rkm_arena_exec_scratch(x, 16, &off) == RKM_ERROR_STATE);
    check_failed(before, NULL, "outside a forward or backward callback");
}

enum { O_CTX, O_GRAPH, O_PLAN, O_PLANNER, O_ARENA, O_EXEC, N_OBJ };

typedef struct objects {
    rkm_context *ctx;
    rkm_graph *g;
    rkm_plan *p;
    rkm_planner *pl;
    rkm_arena *a;
    rkm_arena_exec *x;
    int alive[N_OBJ];
} objects;

static int make_objects(objects *o)
{
    memset(o, 0, sizeof *o);
    if (!(o->ctx = counted_ctx())) return 0;
    rkm_solve_desc sd = {.algo = RKM_ALGO_ROTOR};
    rkm_arena_exec_desc xd = {0};
    int ok = rkm_graph_read_string(o->ctx, CHAIN, strlen(CHAIN), "chain.rkg", &o->g) == RKM_OK &&
             rkm_plan_baseline(o->g, &o->p) == RKM_OK && rkm_planner_create(o->g, &sd, &o->pl) == RKM_OK &&
             rkm_arena_create(o->ctx, 4096, 8, &o->a) == RKM_OK;
    xd.graph = o->g;
    xd.plan = o->p;
    ok = ok && rkm_arena_exec_create(&xd, &o->x) == RKM_OK;
    CHECK(ok);
    for (int k = 0; k < N_OBJ; k++) o->alive[k] = 1;
    return ok;
}

static void destroy_object(objects *o, int k)
{
    switch (k) {
    case O_CTX: rkm_context_destroy(o->ctx); break;
    case O_GRAPH: rkm_graph_destroy(o->g); break;
    case O_PLAN: rkm_plan_destroy(o->p); break;
    case O_PLANNER: rkm_planner_destroy(o->pl); break;
    case O_ARENA: rkm_arena_destroy(o->a); break;
    default: rkm_arena_exec_destroy(o->x); break;
    }
    o->alive[k] = 0;
}

/* Everything still alive (the context and the graph only through what
 * holds them, once destroyed), used. */
static void use_objects(const objects *o, const reference *ref)
{
    if (o->alive[O_GRAPH]) {
        int before = n_logged;
        rkm_tensor_info ti;
        CHECK(rkm_graph_tensor_info(o->g, 99, &ti) == RKM_ERROR_ARGUMENT);
        check_failed(before, rkm_graph_context(o->g), "99");
    }
    if (o->alive[O_PLAN]) use_plan(o->p, ref);
    if (o->alive[O_PLANNER]) use_planner(o->pl, ref);
    if (o->alive[O_ARENA]) use_arena(o->a);
    if (o->alive[O_EXEC]) use_exec(o->x, o->alive[O_PLAN] ? o->p : NULL);
}

static int make_reference(reference *ref)
{
    memset(ref, 0, sizeof *ref);
    objects o;
    if (!make_objects(&o)) return 0;
    sbuf text = {0};
    rkm_plan_stats st;
    rkm_plan *q = NULL;
    CHECK(rkm_plan_write(o.p, sbuf_write, &text) == RKM_OK && rkm_plan_stats_get(o.p, &st) == RKM_OK);
    ref->plan_text = text.data;
    CHECK(rkm_planner_min_budget(o.pl, &ref->min_budget) == RKM_OK && ref->min_budget > 0);
    ref->budget = ref->min_budget;
    if (rkm_planner_solve(o.pl, ref->budget, &q) != RKM_OK) fprintf(stderr, "%s\n", rkm_context_errmsg(o.ctx));
    CHECK(q != NULL);
    text = (sbuf){0};
    if (q) CHECK(rkm_plan_write(q, sbuf_write, &text) == RKM_OK);
    ref->solved_text = text.data;
    rkm_plan_destroy(q);
    for (int k = N_OBJ - 1; k >= 0; k--) destroy_object(&o, k);
    return ref->plan_text && ref->solved_text;
}

/* Destroy in `order`, using what is left after each destroy; nothing is
 * outstanding after the last, something (what is alive) before it. */
static int n_orders;

static void run_order(const int *order, const reference *ref)
{
    n_orders++;
    long long live0 = *test_live_bytes();
    objects o;
    if (!make_objects(&o)) return;
    for (int k = 0; k < N_OBJ; k++) {
        destroy_object(&o, order[k]);
        use_objects(&o, ref);
        if (k + 1 < N_OBJ) CHECK(*test_live_bytes() > live0);
    }
    if (*test_live_bytes() != live0) {
        fprintf(stderr, "order");
        for (int k = 0; k < N_OBJ; k++) fprintf(stderr, " %d", order[k]);
        fprintf(stderr, ": %lld bytes left\n", *test_live_bytes() - live0);
    }
    CHECK_EQ_U64(*test_live_bytes(), live0);
}

/* Every order of destroying the six objects (720). */
TEST(every_destroy_order)
{
    reference ref;
    if (make_reference(&ref)) {
        int order[N_OBJ] = {0, 1, 2, 3, 4, 5}, c[N_OBJ] = {0};
        run_order(order, &ref);
        for (int i = 1; i < N_OBJ && !test_current_failed;) { /* Heap's algorithm */
            if (c[i] < i) {
                int j = i % 2 ? c[i] : 0, t = order[j];
                order[j] = order[i];
                order[i] = t;
                run_order(order, &ref);
                c[i]++;
                i = 1;
            } else {
                c[i++] = 0;
            }
        }
        CHECK(n_orders == 720 || test_current_failed);
    }
    free(ref.plan_text);
    free(ref.solved_text);
}

/* The graph goes first, then the context; the plans, the planner and a
 * graph made from the graph (new costs) keep working; the last of them
 * frees both. */
TEST(graph_then_context_first)
{
    reference ref;
    long long live0 = *test_live_bytes();
    if (make_reference(&ref)) {
        objects o;
        if (make_objects(&o)) {
            rkm_op_costs costs[5];
            for (int i = 0; i < 5; i++) costs[i] = (rkm_op_costs){.fwd_seconds = 2, .bwd_seconds = 3};
            rkm_graph *g2 = NULL;
            CHECK(rkm_graph_with_costs(o.g, costs, &g2) == RKM_OK);
            destroy_object(&o, O_GRAPH);
            destroy_object(&o, O_CTX);
            use_objects(&o, &ref);
            rkm_graph_stats gs;
            CHECK(rkm_graph_stats_get(g2, &gs) == RKM_OK && gs.baseline_time == 25);
            destroy_object(&o, O_PLANNER);
            destroy_object(&o, O_EXEC);
            destroy_object(&o, O_ARENA);
            use_objects(&o, &ref);
            destroy_object(&o, O_PLAN);
            CHECK(*test_live_bytes() > live0); /* g2 holds the context */
            int before = n_logged;
            CHECK(rkm_graph_find_op(g2, "f3") == 2);
            CHECK(rkm_graph_op_info(g2, -1, NULL) == RKM_ERROR_ARGUMENT);
            CHECK(n_logged == before + 1);
            rkm_graph_destroy(g2);
        }
        CHECK_EQ_U64(*test_live_bytes(), live0);
    }
    free(ref.plan_text);
    free(ref.solved_text);
}

int main(void)
{
    RUN(graph_then_context_first);
    RUN(every_destroy_order);
    TEST_END();
}
