/* test_exec.c -- the executor: callback order and flags on a hand-worked
 * plan, errors from callbacks, the state rule, optional callbacks, and a
 * counting host whose own bookkeeping must match the simulator's to the
 * byte on every bundled graph's baseline. */
#include "../src/internal.h"
#include "test.h"

/* A context whose allocator counts calls, to show that execution never
 * allocates. */
static size_t alloc_calls;

static void *counting_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    (void)old_size;
    alloc_calls++;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

static rkm_context *new_ctx(void) { return test_new_ctx_alloc(counting_alloc); }

/* ------------------------------------------------------------- the trace */

typedef struct event {
    int kind; /* rkm_step_kind */
    int64_t step;
    int32_t index;
    int save, recompute;
    uint8_t flags[8]; /* out_new or in_grad */
    int n_flags;
} event;

typedef struct tracer {
    const rkm_graph *g;
    event ev[64];
    int n;
    int64_t fail_at; /* the call number that returns fail_rc; -1: none */
    int fail_rc;
} tracer;

static int trace_push(tracer *t, event e)
{
    int k = t->n;
    if (t->n < (int)N_OF(t->ev)) t->ev[t->n++] = e;
    return k == t->fail_at ? t->fail_rc : 0;
}

static int tr_forward(void *user, const rkm_fwd_call *c)
{
    tracer *t = user;
    event e = {RKM_STEP_FWD, c->step, c->op, c->save, c->recompute, {0}, c->n_out};
    for (int32_t k = 0; k < c->n_out && k < 8; k++) e.flags[k] = c->out_new[k];
    return trace_push(t, e);
}

static int tr_backward(void *user, const rkm_bwd_call *c)
{
    tracer *t = user;
    event e = {RKM_STEP_BWD, c->step, c->op, 0, 0, {0}, c->n_in};
    for (int32_t k = 0; k < c->n_in && k < 8; k++) e.flags[k] = c->in_grad[k];
    return trace_push(t, e);
}

static int tr_simple(tracer *t, int kind, const rkm_buffer_call *c)
{
    event e = {kind, c->step, c->index, 0, 0, {0}, 0};
    return trace_push(t, e);
}

static int tr_loss(void *user, const rkm_buffer_call *c) { return tr_simple(user, RKM_STEP_LOSS, c); }
static int tr_free(void *user, const rkm_buffer_call *c) { return tr_simple(user, RKM_STEP_FREE, c); }
static int tr_free_saved(void *user, const rkm_buffer_call *c) { return tr_simple(user, RKM_STEP_FREE_SAVED, c); }
static int tr_free_grad(void *user, const rkm_buffer_call *c) { return tr_simple(user, RKM_STEP_FREE_GRAD, c); }

static int same_event(const event *a, const event *b)
{
    return a->kind == b->kind && a->step == b->step && a->index == b->index && a->save == b->save &&
           a->recompute == b->recompute && a->n_flags == b->n_flags && memcmp(a->flags, b->flags, sizeof a->flags) == 0;
}

static rkm_callbacks tracer_callbacks(tracer *t)
{
    rkm_callbacks cb = {.user = t, .forward = tr_forward, .backward = tr_backward, .loss = tr_loss,
                        .free_tensor = tr_free, .free_saved = tr_free_saved, .free_grad = tr_free_grad};
    return cb;
}

/* EXEC: a recompute, an in-place recompute of a multi-output op, and a
 * gradient with two contributors.
 * x(4,in) -p-> a(40), p saves x, phantom 8; a -qr-> b(20), c(30), qr saves a;
 * b,c,a -s-> d(10) = loss, s saves b,c. grad(a) comes from s and qr.
 *  step                mem  flags
 *  0 fwd p save         52  recompute 0, out_new [1]
 *  1 fwd qr            102  recompute 0, out_new [1 1]
 *  2 fwd s             112  recompute 0, out_new [1]
 *  3 free b             92
 *  4 loss              102
 *  5 free d             92
 *  6 fwd qr            112  recompute 1, out_new [1 0]: b is new, c still live
 *  7 bwd s             202  in_grad (b c a) [NEW NEW NEW]; peak 202
 *  8 free_grad d       192
 *  9 bwd qr            192  in_grad (a) [ACCUMULATE]
 * 10 free_grad b       172
 * 11 free_grad c       142
 * 12 free b            122
 * 13 free c             92
 * 14 free a             52
 * 15 bwd p              52  in_grad (x) [NONE]
 * 16 free_saved p       44
 * 17 free_grad a         4
 * Time: fwd 1+2+8+2, bwd 8+2+1 = 24. */
static const char *G_EXEC = "rockmate-graph 1\n"
                            "tensor x 4 input\n"
                            "tensor a 40\n"
                            "tensor b 20\n"
                            "tensor c 30\n"
                            "tensor d 10\n"
                            "op p fwd=1 bwd=1 in=x out=a saved=x phantom=8\n"
                            "op qr fwd=2 bwd=2 in=a out=b,c saved=a\n"
                            "op s fwd=8 bwd=8 in=b,c,a out=d saved=b,c\n"
                            "loss d\n";
static const char *P_EXEC = "rockmate-plan 1\nfwd p save\nfwd qr\nfwd s\nfree b\nloss\nfree d\nfwd qr\nbwd s\n"
                            "free_grad d\nbwd qr\nfree_grad b\nfree_grad c\nfree b\nfree c\nfree a\nbwd p\n"
                            "free_saved p\nfree_grad a\n";

typedef struct fixture {
    rkm_context *ctx;
    rkm_graph *g;
    rkm_plan *p;
} fixture;

static fixture load_exec(int check_figures)
{
    fixture f = {new_ctx(), NULL, NULL};
    CHECK(rkm_graph_read_string(f.ctx, G_EXEC, strlen(G_EXEC), "exec.rkg", &f.g) == RKM_OK);
    rkm_sim_result res;
    if (f.g) CHECK(rkm_plan_read_string(f.g, P_EXEC, strlen(P_EXEC), "exec.rkp", &res, &f.p) == RKM_OK);
    if (f.p && check_figures) {
        static const uint64_t mem[] = {52, 102, 112, 92, 102, 92, 112, 202, 192, 192, 172, 142, 122, 92, 52, 52, 44, 4};
        const uint64_t *after = rkm_plan_mem_after(f.p);
        CHECK(rkm_plan_num_steps(f.p) == N_OF(mem));
        CHECK_EQ_U64(res.peak, 202);
        CHECK(res.peak_step == 7);
        CHECK(res.time == 24.0);
        for (size_t i = 0; i < N_OF(mem); i++) CHECK_EQ_U64(after[i], mem[i]);
    }
    return f;
}

static void unload(fixture *f)
{
    rkm_plan_destroy(f->p);
    rkm_graph_destroy(f->g);
    rkm_context_destroy(f->ctx);
}

/* Each traced call matches the plan's step, in order, with the hand-worked
 * flags. */
static void check_trace(const tracer *t, const rkm_plan *p, size_t upto)
{
    static const struct {
        int recompute;
        uint8_t flags[3];
    } want[] = {
        {0, {1}},                                         /*  0 fwd p save */
        {0, {1, 1}},                                      /*  1 fwd qr */
        {0, {1}},                                         /*  2 fwd s */
        {0, {0}},          {0, {0}},          {0, {0}},   /*  3 free b, 4 loss, 5 free d */
        {1, {1, 0}},                                      /*  6 fwd qr: b new, c in place */
        {0, {RKM_GRAD_NEW, RKM_GRAD_NEW, RKM_GRAD_NEW}},  /*  7 bwd s */
        {0, {0}},                                         /*  8 free_grad d */
        {0, {RKM_GRAD_ACCUMULATE}},                       /*  9 bwd qr */
        {0, {0}}, {0, {0}}, {0, {0}}, {0, {0}}, {0, {0}}, /* 10-14 frees */
        {0, {RKM_GRAD_NONE}},                             /* 15 bwd p */
        {0, {0}}, {0, {0}},                               /* 16-17 frees */
    };
    CHECK(t->n == (int)upto);
    for (size_t i = 0; i < upto && i < (size_t)t->n && i < N_OF(want); i++) {
        const rkm_step *s = &rkm_plan_steps(p)[i];
        const event *e = &t->ev[i];
        CHECK(e->kind == s->kind && e->index == s->index);
        CHECK(e->step == (int64_t)i);
        if (s->kind == RKM_STEP_FWD || s->kind == RKM_STEP_BWD) {
            CHECK(e->recompute == want[i].recompute);
            CHECK(e->save == s->save);
            for (int k = 0; k < e->n_flags; k++) CHECK(e->flags[k] == want[i].flags[k]);
        }
    }
}

TEST(trace_and_flags)
{
    fixture f = load_exec(1);
    if (f.p) {
        tracer t;
        memset(&t, 0, sizeof t);
        t.g = f.g;
        t.fail_at = -1;
        rkm_callbacks cb = tracer_callbacks(&t);
        size_t before = alloc_calls;
        CHECK(rkm_plan_execute(f.p, &cb) == RKM_OK);
        CHECK(alloc_calls == before);
        check_trace(&t, f.p, rkm_plan_num_steps(f.p));
        /* A plan runs once per training step: the same calls again. */
        tracer t2;
        memset(&t2, 0, sizeof t2);
        t2.g = f.g;
        t2.fail_at = -1;
        cb.user = &t2;
        CHECK(rkm_plan_execute(f.p, &cb) == RKM_OK);
        CHECK(t2.n == t.n);
        for (int i = 0; i < t.n && i < t2.n; i++) CHECK(same_event(&t.ev[i], &t2.ev[i]));
    }
    unload(&f);
}

/* A callback's error at step k stops the walk there, and the message names
 * the step and the value. */
static void fail_at(int64_t k, int rc)
{
    fixture f = load_exec(1);
    if (f.p) {
        tracer t;
        memset(&t, 0, sizeof t);
        t.g = f.g;
        t.fail_at = k;
        t.fail_rc = rc;
        rkm_callbacks cb = tracer_callbacks(&t);
        CHECK(rkm_plan_execute(f.p, &cb) == RKM_ERROR_CALLBACK);
        check_trace(&t, f.p, (size_t)k + 1);
        const char *msg = rkm_context_errmsg(f.ctx);
        char want[32], val[32];
        snprintf(want, sizeof want, "step %lld", (long long)k);
        snprintf(val, sizeof val, "%d", rc);
        if (!strstr(msg, want) || !strstr(msg, val))
            fprintf(stderr, "callback error at %lld: '%s'\n", (long long)k, msg);
        CHECK(strstr(msg, want) != NULL);
        CHECK(strstr(msg, val) != NULL);
    }
    unload(&f);
}

TEST(callback_errors_stop_the_walk)
{
    fail_at(0, 4242);   /* forward */
    fail_at(6, -77);    /* forward, a recompute */
    fail_at(4, 31337);  /* loss */
    fail_at(9, 555);    /* backward */
    fail_at(12, 9001);  /* free_tensor */
    fail_at(16, 123);   /* free_saved */
    fail_at(17, 8080);  /* free_grad, the last step */
}

/* A plan is valid from birth, so it runs at once; bad arguments are refused. */
TEST(plans_run_from_birth)
{
    fixture f = load_exec(0);
    if (f.p) {
        tracer t;
        memset(&t, 0, sizeof t);
        t.g = f.g;
        t.fail_at = -1;
        rkm_callbacks cb = tracer_callbacks(&t);
        CHECK(rkm_plan_execute(f.p, &cb) == RKM_OK);
        CHECK(t.n == (int)rkm_plan_num_steps(f.p));
        CHECK(rkm_plan_execute(f.p, NULL) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_execute(NULL, &cb) == RKM_ERROR_ARGUMENT);
        rkm_callbacks no_bwd = cb;
        no_bwd.backward = NULL;
        CHECK(rkm_plan_execute(f.p, &no_bwd) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(f.ctx), "backward") != NULL);
    }
    unload(&f);
}

/* loss and the free callbacks may be NULL; forward and backward may not. */
TEST(optional_callbacks)
{
    fixture f = load_exec(1);
    if (f.p) {
        tracer t;
        memset(&t, 0, sizeof t);
        t.g = f.g;
        t.fail_at = -1;
        rkm_callbacks cb = {.user = &t, .forward = tr_forward, .backward = tr_backward};
        CHECK(rkm_plan_execute(f.p, &cb) == RKM_OK);
        int k = 0;
        const rkm_step *s = rkm_plan_steps(f.p);
        for (size_t i = 0; i < rkm_plan_num_steps(f.p); i++) {
            if (s[i].kind != RKM_STEP_FWD && s[i].kind != RKM_STEP_BWD) continue;
            CHECK(k < t.n && t.ev[k].step == (int64_t)i && t.ev[k].kind == s[i].kind && t.ev[k].index == s[i].index);
            k++;
        }
        CHECK(k == t.n && k == 7); /* 4 forwards, 3 backwards */
        rkm_callbacks none = {.user = &t, .backward = tr_backward};
        CHECK(rkm_plan_execute(f.p, &none) == RKM_ERROR_ARGUMENT);
        none.forward = tr_forward;
        none.backward = NULL;
        CHECK(rkm_plan_execute(f.p, &none) == RKM_ERROR_ARGUMENT);
    }
    unload(&f);
}

/* ---------------------------------------------------------- counting host */

/* A host that allocates and frees bytes as the calls tell it, checks that
 * every flag agrees with what it holds, and measures its own peak. */
typedef struct host {
    const rkm_graph *g;
    uint8_t *live, *grad, *saved, *ran;
    uint64_t cur, peak;
    int64_t step; /* the step the next call must carry */
    int errors;
} host;

static uint64_t tbytes(const host *h, int32_t t)
{
    rkm_tensor_info ti;
    rkm_graph_tensor_info(h->g, t, &ti);
    return ti.bytes;
}

static void host_peak(host *h, uint64_t extra)
{
    if (h->cur + extra > h->peak) h->peak = h->cur + extra;
}

static int host_error(host *h, const char *what, int64_t step)
{
    fprintf(stderr, "counting host: %s at step %lld\n", what, (long long)step);
    h->errors++;
    return 1;
}

/* The call's own view of the op must be the graph's. */
static int same_op(const rkm_op_desc *oi, const int32_t *in, int32_t n_in, const int32_t *out, int32_t n_out)
{
    return n_in == oi->n_in && n_out == oi->n_out && (!n_in || !memcmp(in, oi->in, (size_t)n_in * sizeof *in)) &&
           !memcmp(out, oi->out, (size_t)n_out * sizeof *out);
}

static int h_forward(void *user, const rkm_fwd_call *c)
{
    host *h = user;
    rkm_op_desc oi;
    rkm_graph_op_info(h->g, c->op, &oi);
    if (!same_op(&oi, c->in, c->n_in, c->out, c->n_out) || c->ws_bytes != oi.fwd_ws)
        return host_error(h, "forward call disagrees with the op", c->step);
    if (c->step != h->step) return host_error(h, "forward step index", c->step);
    h->step++;
    for (int32_t k = 0; k < oi.n_in; k++)
        if (!h->live[oi.in[k]]) return host_error(h, "forward input not live", c->step);
    if (c->recompute != h->ran[c->op]) return host_error(h, "recompute flag", c->step);
    for (int32_t k = 0; k < oi.n_out; k++) {
        if (c->out_new[k] != !h->live[oi.out[k]]) return host_error(h, "out_new flag", c->step);
        if (c->out_new[k]) {
            h->live[oi.out[k]] = 1;
            h->cur += tbytes(h, oi.out[k]);
        }
    }
    if (c->save) {
        if (h->saved[c->op]) return host_error(h, "save while saved", c->step);
        h->saved[c->op] = 1;
        h->cur += oi.phantom;
    }
    h->ran[c->op] = 1;
    host_peak(h, oi.fwd_ws);
    return 0;
}

static int h_backward(void *user, const rkm_bwd_call *c)
{
    host *h = user;
    rkm_op_desc oi;
    rkm_graph_op_info(h->g, c->op, &oi);
    if (!same_op(&oi, c->in, c->n_in, c->out, c->n_out) || c->ws_bytes != oi.bwd_ws)
        return host_error(h, "backward call disagrees with the op", c->step);
    if (c->step != h->step) return host_error(h, "backward step index", c->step);
    h->step++;
    for (int32_t k = 0; k < oi.n_out; k++) {
        rkm_tensor_info ti;
        rkm_graph_tensor_info(h->g, oi.out[k], &ti);
        if (c->out_grad[k] != ti.has_grad || (ti.has_grad && !h->grad[oi.out[k]]))
            return host_error(h, "out_grad flag", c->step);
    }
    for (int32_t k = 0; k < oi.n_saved; k++)
        if (!h->live[oi.saved[k]]) return host_error(h, "saved tensor not live", c->step);
    if (oi.phantom && !h->saved[c->op]) return host_error(h, "phantom not live", c->step);
    for (int32_t k = 0; k < oi.n_in; k++) {
        int32_t t = oi.in[k];
        rkm_tensor_info ti;
        int has = rkm_graph_tensor_info(h->g, t, &ti) == RKM_OK && ti.has_grad;
        if (c->in_grad[k] == RKM_GRAD_NONE && has)
            return host_error(h, "GRAD_NONE on a tensor with a gradient", c->step);
        if (c->in_grad[k] == RKM_GRAD_NEW && (!has || h->grad[t])) return host_error(h, "GRAD_NEW flag", c->step);
        if (c->in_grad[k] == RKM_GRAD_ACCUMULATE && !h->grad[t]) return host_error(h, "GRAD_ACCUMULATE flag", c->step);
        if (c->in_grad[k] > RKM_GRAD_ACCUMULATE) return host_error(h, "in_grad value", c->step);
        if (c->in_grad[k] == RKM_GRAD_NEW) {
            h->grad[t] = 1;
            h->cur += tbytes(h, t);
        }
    }
    host_peak(h, oi.bwd_ws);
    return 0;
}

/* A buffer call: its step comes next, and its bytes are the host's own. */
static int h_buffer_call(host *h, const rkm_buffer_call *c, uint64_t bytes)
{
    if (c->step != h->step || c->bytes != bytes) return host_error(h, "buffer call step or bytes", c->step);
    h->step++;
    return 0;
}

static int h_loss(void *user, const rkm_buffer_call *c)
{
    host *h = user;
    int32_t t = c->index;
    if (h_buffer_call(h, c, tbytes(h, t))) return 1;
    if (!h->live[t] || h->grad[t]) return host_error(h, "loss", -1);
    h->grad[t] = 1;
    h->cur += tbytes(h, t);
    host_peak(h, 0);
    return 0;
}

static int h_free(void *user, const rkm_buffer_call *c)
{
    host *h = user;
    int32_t t = c->index;
    if (h_buffer_call(h, c, tbytes(h, t))) return 1;
    if (!h->live[t]) return host_error(h, "free of a dead tensor", -1);
    h->live[t] = 0;
    h->cur -= tbytes(h, t);
    return 0;
}

static int h_free_saved(void *user, const rkm_buffer_call *c)
{
    host *h = user;
    int32_t op = c->index;
    rkm_op_desc oi;
    rkm_graph_op_info(h->g, op, &oi);
    if (h_buffer_call(h, c, oi.phantom)) return 1;
    if (!h->saved[op]) return host_error(h, "free_saved of a dead state", -1);
    h->saved[op] = 0;
    h->cur -= oi.phantom;
    return 0;
}

static int h_free_grad(void *user, const rkm_buffer_call *c)
{
    host *h = user;
    int32_t t = c->index;
    if (h_buffer_call(h, c, tbytes(h, t))) return 1;
    if (!h->grad[t]) return host_error(h, "free_grad of a dead gradient", -1);
    h->grad[t] = 0;
    h->cur -= tbytes(h, t);
    return 0;
}

/* Runs p through the counting host; its peak must be the simulator's. */
static void run_counting_host(const rkm_graph *g, const rkm_plan *p, const char *what)
{
    rkm_plan_stats res;
    CHECK(rkm_plan_stats_get(p, &res) == RKM_OK);
    size_t nt = (size_t)rkm_graph_num_tensors(g), no = (size_t)rkm_graph_num_ops(g);
    host h;
    memset(&h, 0, sizeof h);
    h.g = g;
    h.live = calloc(nt, 1);
    h.grad = calloc(nt, 1);
    h.saved = calloc(no, 1);
    h.ran = calloc(no, 1);
    for (size_t t = 0; t < nt; t++) {
        rkm_tensor_info ti;
        rkm_graph_tensor_info(g, (int32_t)t, &ti);
        if (ti.flags & RKM_TENSOR_INPUT) {
            h.live[t] = 1;
            h.cur += ti.bytes;
        }
    }
    uint64_t inputs = h.cur;
    h.peak = h.cur;
    rkm_callbacks cb = {.user = &h, .forward = h_forward, .backward = h_backward, .loss = h_loss,
                        .free_tensor = h_free, .free_saved = h_free_saved, .free_grad = h_free_grad};
    size_t before = alloc_calls;
    CHECK(rkm_plan_execute(p, &cb) == RKM_OK);
    CHECK(alloc_calls == before);
    CHECK(h.errors == 0);
    if (h.peak != res.peak) fprintf(stderr, "%s: host peak %llu, simulator %llu\n", what, (unsigned long long)h.peak,
                                    (unsigned long long)res.peak);
    CHECK_EQ_U64(h.peak, res.peak);
    CHECK_EQ_U64(h.cur, inputs);
    free(h.live);
    free(h.grad);
    free(h.saved);
    free(h.ran);
}

TEST(counting_host_bundled_baselines)
{
    static const char *names[] = {TEST_BUNDLED_GRAPHS};
    for (size_t k = 0; k < N_OF(names); k++) {
        char path[256];
        test_graph_path(path, sizeof path, names[k]);
        rkm_context *ctx = new_ctx();
        rkm_graph *g = NULL;
        rkm_plan *p = NULL;
        CHECK(rkm_graph_read_file(ctx, path, &g) == RKM_OK);
        if (g) CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
        if (p) run_counting_host(g, p, path);
        rkm_plan_destroy(p);
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
}

TEST(counting_host_hand_plan)
{
    fixture f = load_exec(1);
    if (f.p) run_counting_host(f.g, f.p, "exec.rkp");
    unload(&f);
}

/* Workspaces count in the host's peak as in the simulator's: the MULTI plan
 * of test_sim.c (split with fwd_ws 100 recomputed in place, join with
 * bwd_ws 50), whose peak 266 is join's backward: 120 + 96 + 50. */
TEST(counting_host_workspaces)
{
    static const char *graph = "rockmate-graph 1\ntensor x 16 input\ntensor u 32\ntensor v 64\ntensor w 8\n"
                               "op split fwd=1 bwd=2 in=x out=u,v saved=x fwd_ws=100\n"
                               "op join fwd=4 bwd=8 in=u,v out=w saved=u bwd_ws=50\nloss w\n";
    static const char *plan = "rockmate-plan 1\nfwd split\nfwd join\nfree v\nloss\nfree w\nfwd split\nbwd join\n"
                              "free_grad w\nfree u\nfree v\nbwd split\nfree_grad u\nfree_grad v\n";
    rkm_context *ctx = new_ctx();
    rkm_graph *g = NULL;
    rkm_plan *p = NULL;
    CHECK(rkm_graph_read_string(ctx, graph, strlen(graph), "multi.rkg", &g) == RKM_OK);
    rkm_sim_result res;
    if (g) CHECK(rkm_plan_read_string(g, plan, strlen(plan), "multi.rkp", &res, &p) == RKM_OK);
    if (p) {
        CHECK_EQ_U64(res.peak, 266);
        run_counting_host(g, p, "multi.rkp");
    }
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(trace_and_flags);
    RUN(callback_errors_stop_the_walk);
    RUN(plans_run_from_birth);
    RUN(optional_callbacks);
    RUN(counting_host_bundled_baselines);
    RUN(counting_host_hand_plan);
    RUN(counting_host_workspaces);
    TEST_END();
}
