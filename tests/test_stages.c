/* test_stages.c -- pipeline stage graphs (rkm_graph_cut) run for real: the
 * CPU GPT-2 of examples/ cut at block boundaries into P stage graphs, each
 * stage planned on its own (the baseline, and rotor, rockmate, DTR and
 * checkmate below the stage's baseline, so that its plan recomputes), and
 * the stages run one after another through the examples' kernels -- the
 * forward phases (rkm_plan_execute_phase 0) from the first stage on, then
 * the backward phases (phase 1) from the last -- must give the whole
 * graph's loss and parameter gradients bit for bit (the demand;
 * rockmate.h promises it at rkm_graph_cut: "the same ops on the same
 * values"). Along the way: each stage's measured peak is its plan's, and
 * after its backward phase nothing is live but its inputs and the gradient
 * it sends back; the stage graphs' structure (names, ops, flags, times);
 * rkm_graph_cut's refusals and their messages; rkm_plan_execute_phase's
 * refusals; and two micro-batches run interleaved in 1F1B order on a
 * 2-stage cut, each with its own buffers found through the calls' `micro`,
 * which must sum the parameter gradients exactly as two whole-graph steps
 * run one after the other.
 *
 * The host: every stage graph has its own tensor and op ids; the gpt2
 * callbacks index the whole graph's ops and tensors (gpt2_graph.ops, the
 * step's act/grad/phantom arrays), so thin wrappers map a stage's ids to
 * the whole graph's by name (rkm_graph_find_tensor/find_op) and call them,
 * one gpt2_step (buffers, counted allocator) per stage and micro-batch,
 * all sharing one gpt2_model (parameters and their gradients). What
 * crosses a boundary is copied through a "wire": stage s's output after
 * its forward phase, into stage s+1's input buffer (an input is live for
 * the whole plan, so it is made before phase 0); and stage s+1's input
 * gradient, live and complete after its backward phase, which the host
 * then releases there, into grad(output) of stage s, made by stage s's
 * `loss` callback (for the last stage, gpt2_cb_loss seeds it). */
#define _POSIX_C_SOURCE 200809L
#include "test.h"

#include <float.h>
#include <math.h>

#include "../examples/gpt2_model.h"

#define DROP_P 0.1f
#define DROP_SEED 99u
#define STEP_KEY 7u
#define MAX_STAGES 6
#define MAX_MICRO 2
#define MAX_IDS 8 /* the most in/out/saved ids of one gpt2 op (2 + 1 + 2) */
#define BT_MAX 64

/* llm.c's layout at toy size (test_gpt2.c's tiny shape), L layers. */
static gpt2_shape toy_shape(int L, int dropout, int inplace)
{
    gpt2_shape s;
    memset(&s, 0, sizeof s);
    s.L = L, s.C = 32, s.NH = 2, s.V = 64, s.B = 2, s.T = 16, s.dropout = dropout, s.inplace = inplace;
    return s;
}

/* The whole graph, the one model, and two batches of tokens and targets. */
typedef struct world {
    rkm_context *ctx;
    gpt2_graph gg;
    gpt2_model md;
    int32_t tok[MAX_MICRO][BT_MAX], tgt[MAX_MICRO][BT_MAX];
} world;

static void world_free(world *w)
{
    gpt2_model_free(&w->md);
    if (w->gg.g) gpt2_graph_free(&w->gg);
    rkm_context_destroy(w->ctx);
    memset(w, 0, sizeof *w);
}

static int world_init(world *w, gpt2_shape s)
{
    int n = s.B * s.T;
    memset(w, 0, sizeof *w);
    if (n > BT_MAX || rkm_context_create(NULL, &w->ctx) != RKM_OK) return -1;
    if (gpt2_graph_build(w->ctx, &s, &w->gg) != RKM_OK || gpt2_model_init(&w->md, &s, 42)) {
        fprintf(stderr, "world: %s\n", rkm_context_errmsg(w->ctx));
        return -1;
    }
    for (int m = 0; m < MAX_MICRO; m++)
        for (int i = 0; i < n; i++) {
            w->tok[m][i] = (int32_t)(gpt2_mix((uint64_t)(i + 5000 * m)) % (uint64_t)s.V);
            w->tgt[m][i] = (int32_t)(gpt2_mix((uint64_t)(i + 5000 * m) + 1000) % (uint64_t)s.V);
        }
    return 0;
}

static uint64_t tensor_bytes(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

/* One whole-graph step of `plan` on batch m under dropout key `key`,
 * straight through the gpt2 callbacks (no stage, no wrapper): the
 * reference. zero: the parameter gradients are zeroed first, else the
 * step adds into them. The loss goes to *loss. */
static void whole_step(world *w, const rkm_plan *plan, int m, uint64_t key, int zero, double *loss)
{
    gpt2_step st;
    rkm_callbacks cb;
    CHECK(gpt2_step_init(&st, &w->gg, &w->md, DROP_P, DROP_SEED) == 0);
    if (test_current_failed) return;
    CHECK(gpt2_step_load(&st, w->tok[m], w->tgt[m]) == 0);
    if (zero) gpt2_model_zero_grad(&w->md);
    st.key = key;
    cb = gpt2_callbacks(&st);
    CHECK(rkm_plan_execute(plan, &cb) == RKM_OK);
    if (st.err[0]) fprintf(stderr, "  whole step: %s\n", st.err);
    CHECK(gpt2_step_leaks(&st) == 0);
    *loss = st.loss;
    gpt2_step_release(&st);
    gpt2_step_unload(&st);
    gpt2_step_free(&st);
}

/* ------------------------------------------------------------------------
 * Stages and the host that runs them
 * ---------------------------------------------------------------------- */

typedef struct stage {
    rkm_graph *g;       /* the stage graph (owned here) */
    int32_t nt, no;
    int32_t *t2w, *o2w; /* stage tensor / op id -> the whole graph's */
    int32_t in_w;       /* the whole id of its input (cut s-1); -1 for stage 0 */
    int32_t out_w;      /* the whole id of its output (cut s), or the loss */
    int last;
    int reads_tokens, reads_targets;
} stage;

struct pipeline;
typedef struct stage_host {
    struct pipeline *p;
    int s;
} stage_host;

typedef struct pipeline {
    world *w;
    int P, M;
    stage st[MAX_STAGES];
    const rkm_plan *plan[MAX_STAGES];
    uint64_t plan_peak[MAX_STAGES];
    gpt2_step step[MAX_STAGES][MAX_MICRO];
    stage_host host[MAX_STAGES];
    rkm_callbacks cb[MAX_STAGES];
    uint64_t key[MAX_MICRO];
    /* wire_act[s][m]: stage s's output, sent to s+1; wire_grad[s][m]: its
     * gradient, sent back by s+1 (malloc'd, outside every count) */
    void *wire_act[MAX_STAGES][MAX_MICRO];
    float *wire_grad[MAX_STAGES][MAX_MICRO];
    double loss[MAX_MICRO];
    char err[256];
} pipeline;

static void stage_free(stage *sg)
{
    rkm_graph_destroy(sg->g);
    free(sg->t2w);
    free(sg->o2w);
    memset(sg, 0, sizeof *sg);
}

/* The id maps of stage graph g (stage s of P) onto the whole graph, by
 * name, and the stage's structure checked against the whole graph: its
 * ops are a run of the whole graph's in the same order (starting at
 * *next_op, which moves past them), with the same in/out/saved lists and
 * costs; its tensors keep their sizes and flags but for its input (`input
 * grad`); its output is the cut. */
static int stage_init(stage *sg, rkm_graph *g, const world *w, int s, int P, const int32_t *cuts, int32_t *next_op)
{
    const rkm_graph *wg = w->gg.g;
    rkm_tensor_info ti, wi;
    rkm_op_desc oi, wo;
    memset(sg, 0, sizeof *sg);
    sg->g = g;
    sg->nt = rkm_graph_num_tensors(g);
    sg->no = rkm_graph_num_ops(g);
    sg->last = s == P - 1;
    sg->in_w = s ? cuts[s - 1] : -1;
    sg->out_w = sg->last ? w->gg.loss : cuts[s];
    sg->t2w = (int32_t *)malloc((size_t)sg->nt * sizeof *sg->t2w);
    sg->o2w = (int32_t *)malloc((size_t)sg->no * sizeof *sg->o2w);
    CHECK(sg->t2w && sg->o2w && sg->no > 0);
    if (test_current_failed) return -1;
    for (int32_t t = 0; t < sg->nt; t++) {
        CHECK(rkm_graph_tensor_info(g, t, &ti) == RKM_OK);
        sg->t2w[t] = rkm_graph_find_tensor(wg, ti.name);
        CHECK(sg->t2w[t] >= 0 && rkm_graph_tensor_info(wg, sg->t2w[t], &wi) == RKM_OK);
        if (test_current_failed) return -1;
        CHECK_EQ_U64(ti.bytes, wi.bytes);
        CHECK(ti.flags == (sg->t2w[t] == sg->in_w ? RKM_TENSOR_INPUT | RKM_TENSOR_INPUT_GRAD : wi.flags));
        CHECK(ti.has_grad == (sg->t2w[t] == sg->in_w ? 1 : wi.has_grad));
        sg->reads_tokens |= sg->t2w[t] == w->gg.tokens;
        sg->reads_targets |= sg->t2w[t] == w->gg.targets;
    }
    /* the whole graph's inputs go to the stages that read them */
    CHECK(sg->reads_tokens == (s == 0) && sg->reads_targets == sg->last);
    for (int32_t op = 0; op < sg->no; op++) {
        CHECK(rkm_graph_op_info(g, op, &oi) == RKM_OK);
        sg->o2w[op] = rkm_graph_find_op(wg, oi.name);
        CHECK(sg->o2w[op] == (*next_op)++);
        CHECK(sg->o2w[op] >= 0 && rkm_graph_op_info(wg, sg->o2w[op], &wo) == RKM_OK);
        if (test_current_failed) return -1;
        CHECK(oi.n_in == wo.n_in && oi.n_out == wo.n_out && oi.n_saved == wo.n_saved);
        CHECK(oi.fwd_seconds == wo.fwd_seconds && oi.bwd_seconds == wo.bwd_seconds);
        CHECK(oi.phantom == wo.phantom && oi.fwd_ws == wo.fwd_ws && oi.bwd_ws == wo.bwd_ws);
        CHECK(oi.scratch == wo.scratch && oi.flags == wo.flags);
        if (test_current_failed) return -1;
        for (int i = 0; i < oi.n_in; i++) CHECK(sg->t2w[oi.in[i]] == wo.in[i]);
        for (int i = 0; i < oi.n_out; i++) CHECK(sg->t2w[oi.out[i]] == wo.out[i]);
        for (int i = 0; i < oi.n_saved; i++) CHECK(sg->t2w[oi.saved[i]] == wo.saved[i]);
    }
    CHECK(rkm_graph_loss(g) >= 0 && sg->t2w[rkm_graph_loss(g)] == sg->out_w);
    CHECK(sg->last ? rkm_graph_output(g) == -1 : rkm_graph_output(g) == rkm_graph_loss(g));
    return test_current_failed ? -1 : 0;
}

/* ids[0..n) mapped through map (n_map entries) into out; -1 if one does
 * not fit. */
static int map_ids(const int32_t *map, int32_t n_map, const int32_t *ids, int32_t n, int32_t *out)
{
    if (n < 0 || n > MAX_IDS) return -1;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= n_map) return -1;
        out[i] = map[ids[i]];
    }
    return 0;
}

static int host_fail(stage_host *h, int32_t micro, const char *what)
{
    snprintf(h->p->err, sizeof h->p->err, "stage %d, micro-batch %d: %s", h->s, (int)micro, what);
    return 1;
}

/* The step of the call's micro-batch: each micro-batch has its own
 * buffers, found only through `micro`. */
static gpt2_step *host_step(stage_host *h, int32_t micro)
{
    if (micro < 0 || micro >= h->p->M) {
        host_fail(h, micro, "a call for a micro-batch that does not exist");
        return NULL;
    }
    return &h->p->step[h->s][micro];
}

static int gpt2_failed(stage_host *h, int32_t micro, const gpt2_step *st)
{
    return host_fail(h, micro, st->err[0] ? st->err : "gpt2 callback failed");
}

static int w_forward(void *user, const rkm_fwd_call *c)
{
    stage_host *h = (stage_host *)user;
    const stage *sg = &h->p->st[h->s];
    gpt2_step *st = host_step(h, c->micro);
    int32_t in[MAX_IDS], out[MAX_IDS];
    rkm_fwd_call w = *c;
    if (!st) return 1;
    if (c->op < 0 || c->op >= sg->no || map_ids(sg->t2w, sg->nt, c->in, c->n_in, in) ||
        map_ids(sg->t2w, sg->nt, c->out, c->n_out, out))
        return host_fail(h, c->micro, "forward: ids out of range");
    w.op = sg->o2w[c->op], w.in = in, w.out = out;
    return gpt2_cb_forward(st, &w) ? gpt2_failed(h, c->micro, st) : 0;
}

static int w_backward(void *user, const rkm_bwd_call *c)
{
    stage_host *h = (stage_host *)user;
    const stage *sg = &h->p->st[h->s];
    gpt2_step *st = host_step(h, c->micro);
    int32_t in[MAX_IDS], out[MAX_IDS], saved[MAX_IDS];
    rkm_bwd_call w = *c;
    if (!st) return 1;
    if (c->op < 0 || c->op >= sg->no || map_ids(sg->t2w, sg->nt, c->in, c->n_in, in) ||
        map_ids(sg->t2w, sg->nt, c->out, c->n_out, out) || map_ids(sg->t2w, sg->nt, c->saved, c->n_saved, saved))
        return host_fail(h, c->micro, "backward: ids out of range");
    w.op = sg->o2w[c->op], w.in = in, w.out = out, w.saved = saved;
    return gpt2_cb_backward(st, &w) ? gpt2_failed(h, c->micro, st) : 0;
}

/* The `loss` step: the last stage seeds grad(loss) (gpt2_cb_loss); any
 * other receives grad(output) from the wire, sent by stage s+1. */
static int w_loss(void *user, const rkm_buffer_call *c)
{
    stage_host *h = (stage_host *)user;
    pipeline *p = h->p;
    const stage *sg = &p->st[h->s];
    gpt2_step *st = host_step(h, c->micro);
    rkm_buffer_call w = *c;
    float **wire;
    if (!st) return 1;
    if (c->index < 0 || c->index >= sg->nt || sg->t2w[c->index] != sg->out_w)
        return host_fail(h, c->micro, "loss: not the stage's output");
    if (c->bytes != tensor_bytes(p->w->gg.g, sg->out_w)) return host_fail(h, c->micro, "loss: wrong size");
    w.index = sg->out_w;
    if (sg->last) return gpt2_cb_loss(st, &w) ? gpt2_failed(h, c->micro, st) : 0;
    wire = &p->wire_grad[h->s][c->micro];
    if (!*wire) return host_fail(h, c->micro, "loss: the output's gradient has not arrived");
    if (!st->act[sg->out_w]) return host_fail(h, c->micro, "loss: the output is not live");
    if (st->grad[sg->out_w]) return host_fail(h, c->micro, "loss: the output's gradient is live already");
    if (!(st->grad[sg->out_w] = (float *)gpt2_mem_alloc(&st->mem, c->bytes, 0)))
        return host_fail(h, c->micro, "loss: out of memory");
    memcpy(st->grad[sg->out_w], *wire, (size_t)c->bytes);
    free(*wire);
    *wire = NULL;
    return 0;
}

/* The free steps: a tensor or gradient (index: tensor), a saved state
 * (index: op). */
static int w_free(stage_host *h, const rkm_buffer_call *c, int op, int (*fn)(void *, const rkm_buffer_call *))
{
    const stage *sg = &h->p->st[h->s];
    gpt2_step *st = host_step(h, c->micro);
    rkm_buffer_call w = *c;
    if (!st) return 1;
    if (c->index < 0 || c->index >= (op ? sg->no : sg->nt)) return host_fail(h, c->micro, "free: id out of range");
    w.index = op ? sg->o2w[c->index] : sg->t2w[c->index];
    return fn(st, &w) ? gpt2_failed(h, c->micro, st) : 0;
}

static int w_free_tensor(void *user, const rkm_buffer_call *c)
{
    return w_free((stage_host *)user, c, 0, gpt2_cb_free_tensor);
}

static int w_free_saved(void *user, const rkm_buffer_call *c)
{
    return w_free((stage_host *)user, c, 1, gpt2_cb_free_saved);
}

static int w_free_grad(void *user, const rkm_buffer_call *c)
{
    return w_free((stage_host *)user, c, 0, gpt2_cb_free_grad);
}

/* A pipeline over the stage graphs stages[0..P) (taken: freed by
 * pipe_free), with M micro-batches under dropout keys key0, key0 + 1...
 * The plans are set by the caller (pipe_set_plans). */
static int pipe_init(pipeline *p, world *w, rkm_graph **stages, int P, int M, const int32_t *cuts)
{
    int32_t next_op = 0;
    int rc = 0;
    memset(p, 0, sizeof *p);
    p->w = w, p->P = P, p->M = M;
    for (int s = 0; s < P; s++) {
        rc |= stage_init(&p->st[s], stages[s], w, s, P, cuts, &next_op);
        stages[s] = NULL;
    }
    CHECK(rc || next_op == rkm_graph_num_ops(w->gg.g)); /* every op in exactly one stage */
    for (int s = 0; s < P && !rc; s++) {
        p->host[s].p = p, p->host[s].s = s;
        memset(&p->cb[s], 0, sizeof p->cb[s]);
        p->cb[s].user = &p->host[s];
        p->cb[s].forward = w_forward;
        p->cb[s].backward = w_backward;
        p->cb[s].loss = w_loss;
        p->cb[s].free_tensor = w_free_tensor;
        p->cb[s].free_saved = w_free_saved;
        p->cb[s].free_grad = w_free_grad;
        for (int m = 0; m < M; m++)
            if (gpt2_step_init(&p->step[s][m], &w->gg, &w->md, DROP_P, DROP_SEED)) rc = -1;
    }
    for (int m = 0; m < M; m++) p->key[m] = STEP_KEY + (uint64_t)m;
    return rc || test_current_failed ? -1 : 0;
}

/* Whatever a failed run left: every buffer of every step, every wire. */
static void pipe_free(pipeline *p)
{
    for (int s = 0; s < p->P; s++) {
        for (int m = 0; m < p->M; m++) {
            gpt2_step *st = &p->step[s][m];
            if (st->act) {
                gpt2_step_release(st);
                gpt2_step_unload(st);
            }
            gpt2_step_free(st);
            free(p->wire_act[s][m]);
            free(p->wire_grad[s][m]);
        }
        stage_free(&p->st[s]);
    }
    memset(p, 0, sizeof *p);
}

static void pipe_set_plans(pipeline *p, rkm_plan *const *plans)
{
    rkm_plan_stats ps;
    for (int s = 0; s < p->P; s++) {
        p->plan[s] = plans[s];
        CHECK(rkm_plan_graph(plans[s]) == p->st[s].g);
        CHECK(rkm_plan_stats_get(plans[s], &ps) == RKM_OK);
        p->plan_peak[s] = ps.peak;
    }
}

/* A new live buffer of stage step st for whole tensor t, counted. */
static void *make_input(gpt2_step *st, int32_t t, const void *src)
{
    uint64_t bytes = tensor_bytes(st->gg->g, t);
    CHECK(!st->act[t]);
    if (st->act[t] || !(st->act[t] = gpt2_mem_alloc(&st->mem, bytes, 0))) return NULL;
    memcpy(st->act[t], src, (size_t)bytes);
    return st->act[t];
}

static void drop_input(gpt2_step *st, int32_t t)
{
    gpt2_mem_free(&st->mem, st->act[t], tensor_bytes(st->gg->g, t));
    st->act[t] = NULL;
}

/* Stage s's forward phase for micro-batch m: its inputs made first (the
 * batch's, and the previous stage's output from the wire), its output sent
 * on the wire after. 0 if it ran. */
static int pipe_fwd(pipeline *p, int s, int m)
{
    const stage *sg = &p->st[s];
    gpt2_step *st = &p->step[s][m];
    rkm_result r;
    CHECK(st->mem.blocks == 0 && st->mem.cur == 0); /* a fresh micro-batch */
    st->mem.peak = 0;
    st->key = p->key[m];
    st->loss = NAN;
    st->err[0] = 0;
    p->err[0] = 0;
    if (sg->in_w >= 0) {
        CHECK(p->wire_act[s - 1][m] != NULL);
        if (!p->wire_act[s - 1][m]) return -1;
        CHECK(make_input(st, sg->in_w, p->wire_act[s - 1][m]) != NULL);
        free(p->wire_act[s - 1][m]);
        p->wire_act[s - 1][m] = NULL;
    }
    if (sg->reads_tokens) CHECK(make_input(st, p->w->gg.tokens, p->w->tok[m]) != NULL);
    if (sg->reads_targets) CHECK(make_input(st, p->w->gg.targets, p->w->tgt[m]) != NULL);
    if (test_current_failed) return -1;
    r = rkm_plan_execute_phase(p->plan[s], 0, m, &p->cb[s]);
    CHECK(r == RKM_OK);
    if (r != RKM_OK) {
        fprintf(stderr, "  stage %d forward, micro-batch %d: %s / %s\n", s, m, p->err,
                rkm_context_errmsg(rkm_graph_context(sg->g)));
        return -1;
    }
    /* nothing of the backward before the output's gradient is there */
    for (int32_t t = 0; t < rkm_graph_num_tensors(p->w->gg.g); t++) CHECK(!st->grad[t]);
    if (!sg->last) {
        uint64_t bytes = tensor_bytes(p->w->gg.g, sg->out_w);
        CHECK(st->act[sg->out_w] != NULL); /* live at the end of the forward phase: sent */
        CHECK(p->wire_act[s][m] == NULL);
        if (!st->act[sg->out_w] || p->wire_act[s][m] || !(p->wire_act[s][m] = malloc((size_t)bytes))) return -1;
        memcpy(p->wire_act[s][m], st->act[sg->out_w], (size_t)bytes);
    }
    return 0;
}

/* Stage s's backward phase for micro-batch m (its output's gradient on the
 * wire, unless it is the last): after it, only its inputs and (s > 0) its
 * input's gradient are live; that gradient goes on the wire back and is
 * released here, then the inputs. The measured peak must be the plan's. */
static int pipe_bwd(pipeline *p, int s, int m)
{
    const stage *sg = &p->st[s];
    const rkm_graph *wg = p->w->gg.g;
    gpt2_step *st = &p->step[s][m];
    int64_t expect = (sg->in_w >= 0) + sg->reads_tokens + sg->reads_targets;
    rkm_result r;
    p->err[0] = 0;
    if (!sg->last) CHECK(p->wire_grad[s][m] != NULL);
    r = rkm_plan_execute_phase(p->plan[s], 1, m, &p->cb[s]);
    CHECK(r == RKM_OK);
    if (r != RKM_OK) {
        fprintf(stderr, "  stage %d backward, micro-batch %d: %s / %s\n", s, m, p->err,
                rkm_context_errmsg(rkm_graph_context(sg->g)));
        return -1;
    }
    if (!sg->last) CHECK(p->wire_grad[s][m] == NULL); /* taken by the loss step */
    if (sg->last) p->loss[m] = st->loss;
    /* what the plan leaves: the inputs and the gradient to send back */
    CHECK(st->mem.blocks == expect + (s > 0));
    for (int32_t t = 0; t < rkm_graph_num_tensors(wg); t++) {
        int input = t == sg->in_w || (t == p->w->gg.tokens && sg->reads_tokens) ||
                    (t == p->w->gg.targets && sg->reads_targets);
        CHECK(!st->act[t] == !input);
        CHECK(!st->grad[t] == (t != sg->in_w));
    }
    for (int32_t op = 0; op < rkm_graph_num_ops(wg); op++) CHECK(!st->phantom[op]);
    CHECK_EQ_U64(st->mem.peak, p->plan_peak[s]);
    if (test_current_failed) {
        fprintf(stderr, "  stage %d, micro-batch %d: left %lld buffers\n", s, m, (long long)st->mem.blocks);
        return -1;
    }
    if (s > 0) {
        uint64_t bytes = tensor_bytes(wg, sg->in_w);
        CHECK(p->wire_grad[s - 1][m] == NULL);
        if (p->wire_grad[s - 1][m] || !(p->wire_grad[s - 1][m] = (float *)malloc((size_t)bytes))) return -1;
        memcpy(p->wire_grad[s - 1][m], st->grad[sg->in_w], (size_t)bytes);
        gpt2_mem_free(&st->mem, st->grad[sg->in_w], bytes);
        st->grad[sg->in_w] = NULL;
        drop_input(st, sg->in_w);
    }
    if (sg->reads_tokens) drop_input(st, p->w->gg.tokens);
    if (sg->reads_targets) drop_input(st, p->w->gg.targets);
    CHECK(st->mem.blocks == 0 && st->mem.cur == 0);
    return test_current_failed ? -1 : 0;
}

/* One micro-batch m through every stage in sequence: forward phases from
 * the first stage on, backward phases from the last. */
static int pipe_run_one(pipeline *p, int m)
{
    for (int s = 0; s < p->P; s++)
        if (pipe_fwd(p, s, m)) return -1;
    for (int s = p->P - 1; s >= 0; s--)
        if (pipe_bwd(p, s, m)) return -1;
    return 0;
}

/* ------------------------------------------------------------------------
 * Plans of the stages
 * ---------------------------------------------------------------------- */

/* The cut tensors of P stages spread evenly over the whole graph's blocks:
 * the inputs of blocks round(k * blocks / P), k = 1..P-1. */
static int even_cuts(const rkm_graph *g, int P, int32_t *cuts)
{
    rkm_graph_stats gs;
    rkm_block_info bi;
    int prev = 0;
    if (rkm_graph_stats_get(g, &gs) != RKM_OK || P > gs.blocks) return -1;
    for (int k = 1; k < P; k++) {
        int b = (k * gs.blocks + P / 2) / P;
        if (b <= prev || b >= gs.blocks || rkm_graph_block_info(g, b, &bi) != RKM_OK) return -1;
        cuts[k - 1] = bi.input;
        prev = b;
    }
    return 0;
}

/* Stage graph g's plan: the baseline (RKM_ALGO_NONE), or algo's at pct % of
 * its baseline arena (budgets in the contract's bytes: alignment 4, the
 * floats' own) or, where algo cannot go that low on this stage, at the
 * smallest budget it meets (a stage of a block or two may have nothing to
 * drop: rotor's is its baseline arena then). NULL (a failed check) if
 * none. */
static rkm_plan *stage_plan(const rkm_graph *g, rkm_algo algo, int pct)
{
    rkm_solve_desc sd;
    rkm_planner *pl = NULL;
    rkm_plan *plan = NULL;
    uint64_t arena = 0, budget, least = 0;
    rkm_result r;
    if (algo == RKM_ALGO_NONE) {
        CHECK(rkm_plan_baseline(g, &plan) == RKM_OK);
        return plan;
    }
    memset(&sd, 0, sizeof sd);
    sd.algo = algo;
    sd.alignment = 4;
    sd.ilp_budget = 0.25; /* block ILP work, not seconds: the same plans anywhere, and fast */
    if (algo == RKM_ALGO_CHECKMATE) sd.time_limit = 1; /* its solves' work: half of it each */
    CHECK(rkm_graph_baseline_arena(g, 4, &arena) == RKM_OK);
    CHECK(rkm_planner_create(g, &sd, &pl) == RKM_OK);
    if (test_current_failed) {
        fprintf(stderr, "  %s: %s\n", rkm_algo_name(algo), rkm_context_errmsg(rkm_graph_context(g)));
        rkm_planner_destroy(pl);
        return NULL;
    }
    budget = arena * (uint64_t)pct / 100;
    r = rkm_planner_solve(pl, budget, &plan);
    if (r == RKM_ERROR_BUDGET) {
        CHECK(rkm_planner_min_budget(pl, &least) == RKM_OK);
        CHECK(least > budget && least <= arena);
        r = rkm_planner_solve(pl, least, &plan);
    }
    if (r != RKM_OK)
        fprintf(stderr, "  %s at %d %%: %s\n", rkm_algo_name(algo), pct, rkm_context_errmsg(rkm_graph_context(g)));
    CHECK(r == RKM_OK);
    rkm_planner_destroy(pl);
    return plan;
}

/* The phases of a plan: phase 1 starts at its `loss` step; no backward
 * runs before it. */
static void check_phases(const rkm_plan *plan)
{
    int64_t at = rkm_plan_phase_step(plan);
    const rkm_step *steps = rkm_plan_steps(plan);
    CHECK(at > 0 && (size_t)at < rkm_plan_num_steps(plan));
    if (test_current_failed) return;
    CHECK(steps[at].kind == RKM_STEP_LOSS);
    for (int64_t i = 0; i < at; i++) CHECK(steps[i].kind != RKM_STEP_BWD && steps[i].kind != RKM_STEP_LOSS);
}

typedef struct ref {
    double loss;
    float *grads;
} ref;

/* The whole graph cut at cuts[0..P-1), each stage planned by algo at pct %,
 * one micro-batch (batch 0, micro-batch id `micro`) run through the
 * stages: ref's loss and gradients bit for bit. Adds the stage plans'
 * recomputations to *recomputes. */
static void check_cut(world *w, const int32_t *cuts, int P, rkm_algo algo, int pct, const ref *rf, size_t *recomputes)
{
    rkm_graph *stages[MAX_STAGES];
    rkm_plan *plans[MAX_STAGES] = {NULL};
    rkm_plan_stats ps;
    pipeline p;
    int ok;
    if (rkm_graph_cut(w->gg.g, cuts, P - 1, stages) != RKM_OK) {
        fprintf(stderr, "  cut: %s\n", rkm_context_errmsg(w->ctx));
        CHECK(0);
        return;
    }
    ok = pipe_init(&p, w, stages, P, 1, cuts) == 0;
    for (int s = 0; s < P && ok; s++) {
        ok = (plans[s] = stage_plan(p.st[s].g, algo, pct)) != NULL;
        if (ok) check_phases(plans[s]);
        if (ok && rkm_plan_stats_get(plans[s], &ps) == RKM_OK) {
            if (algo != RKM_ALGO_NONE) CHECK(ps.arena_bytes <= ps.budget);
            *recomputes += ps.recomputes;
        }
    }
    if (ok && !test_current_failed) {
        pipe_set_plans(&p, plans);
        gpt2_model_zero_grad(&w->md);
        if (pipe_run_one(&p, 0) == 0) {
            CHECK(!memcmp(&p.loss[0], &rf->loss, sizeof rf->loss));
            CHECK(!memcmp(w->md.grads, rf->grads, w->md.num_params * sizeof(float)));
        }
    }
    if (test_current_failed) {
        fprintf(stderr, "  failed: P=%d, %s at %d %%, cuts", P, rkm_algo_name(algo), pct);
        for (int k = 0; k < P - 1; k++) {
            rkm_tensor_info ti;
            if (rkm_graph_tensor_info(w->gg.g, cuts[k], &ti) == RKM_OK) fprintf(stderr, " %s", ti.name);
        }
        fprintf(stderr, "\n");
    }
    for (int s = 0; s < P; s++) rkm_plan_destroy(plans[s]);
    pipe_free(&p);
}

/* The whole graph's baseline step on batch 0: the reference. */
static int make_ref(world *w, ref *rf)
{
    rkm_plan *base = NULL;
    rf->grads = (float *)malloc(w->md.num_params * sizeof(float));
    CHECK(rf->grads != NULL);
    CHECK(rkm_plan_baseline(w->gg.g, &base) == RKM_OK);
    if (test_current_failed) {
        rkm_plan_destroy(base);
        return -1;
    }
    whole_step(w, base, 0, STEP_KEY, 1, &rf->loss);
    memcpy(rf->grads, w->md.grads, w->md.num_params * sizeof(float));
    rkm_plan_destroy(base);
    CHECK(isfinite(rf->loss));
    return test_current_failed ? -1 : 0;
}

/* ------------------------------------------------------------------------
 * Tests
 * ---------------------------------------------------------------------- */

/* The stage graphs of every single cut (each block boundary) and of even
 * cuts into 2..4 stages: their ops are the whole graph's, once each, in
 * order; their baseline times add up to the whole graph's (float sums in
 * another order: to 1e-12); a cut tensor is one stage's output and the
 * next's `input grad`. Checked in stage_init. */
TEST(cut_structure)
{
    world w;
    rkm_graph_stats gs, ss;
    if (world_init(&w, toy_shape(2, 1, 1))) {
        CHECK(0);
        world_free(&w);
        return;
    }
    CHECK(rkm_graph_stats_get(w.gg.g, &gs) == RKM_OK);
    CHECK(gs.blocks >= 6);
    for (int P = 1; P <= 4 && !test_current_failed; P++)
        for (int b = 1; b < (P == 2 ? gs.blocks : 2) && !test_current_failed; b++) {
            int32_t cuts[MAX_STAGES];
            rkm_graph *stages[MAX_STAGES];
            rkm_block_info bi;
            double time = 0.0;
            int32_t ops = 0, tensors = 0;
            pipeline p;
            if (P == 2) {
                CHECK(rkm_graph_block_info(w.gg.g, b, &bi) == RKM_OK);
                cuts[0] = bi.input;
            } else {
                CHECK(even_cuts(w.gg.g, P, cuts) == 0);
            }
            if (rkm_graph_cut(w.gg.g, cuts, P - 1, stages) != RKM_OK) {
                CHECK(0);
                break;
            }
            for (int s = 0; s < P; s++) {
                CHECK(rkm_graph_is_finalized(stages[s]));
                CHECK(rkm_graph_stats_get(stages[s], &ss) == RKM_OK);
                time += ss.baseline_time;
                ops += rkm_graph_num_ops(stages[s]);
                tensors += rkm_graph_num_tensors(stages[s]);
            }
            CHECK(ops == rkm_graph_num_ops(w.gg.g));
            /* each cut tensor is in two stages, every other tensor in one */
            CHECK(tensors == rkm_graph_num_tensors(w.gg.g) + P - 1);
            CHECK(fabs(time - gs.baseline_time) <= 1e-12 * gs.baseline_time);
            if (pipe_init(&p, &w, stages, P, 1, cuts) == 0 && P == 1) {
                /* no cut: the whole graph again, with its loss */
                CHECK(rkm_graph_output(p.st[0].g) == -1 && rkm_graph_loss(p.st[0].g) == w.gg.loss);
            }
            pipe_free(&p);
        }
    world_free(&w);
}

/* rkm_graph_cut's refusals: each an RKM_ERROR_* with a message naming
 * what is wrong, and every stages[s] NULL. */
static void check_refusal(world *w, const int32_t *cuts, int32_t n_cuts, rkm_graph **stages, rkm_result want,
                          const char *msg)
{
    rkm_graph *junk = (rkm_graph *)(uintptr_t)0x10; /* never dereferenced: must be overwritten */
    rkm_result r;
    for (int s = 0; stages && s < MAX_STAGES; s++) stages[s] = junk;
    r = rkm_graph_cut(w->gg.g, cuts, n_cuts, stages);
    CHECK(r == want);
    if (!strstr(rkm_context_errmsg(w->ctx), msg)) {
        fprintf(stderr, "  message \"%s\" lacks \"%s\"\n", rkm_context_errmsg(w->ctx), msg);
        CHECK(0);
    }
    for (int s = 0; stages && s <= n_cuts && s < MAX_STAGES; s++) CHECK(stages[s] == NULL);
    if (r == RKM_OK)
        for (int s = 0; stages && s <= n_cuts; s++) rkm_graph_destroy(stages[s]);
}

TEST(cut_refusals)
{
    world w;
    rkm_graph *stages[MAX_STAGES], *builder = NULL;
    rkm_block_info b1, b3;
    int32_t cuts[3];
    if (world_init(&w, toy_shape(2, 0, 0))) {
        CHECK(0);
        world_free(&w);
        return;
    }
    CHECK(rkm_graph_block_info(w.gg.g, 1, &b1) == RKM_OK && rkm_graph_block_info(w.gg.g, 3, &b3) == RKM_OK);
    if (test_current_failed) {
        world_free(&w);
        return;
    }
    /* a tensor inside a block, an input, the loss: no block boundary */
    cuts[0] = rkm_graph_find_tensor(w.gg.g, "h0.qkv");
    check_refusal(&w, cuts, 1, stages, RKM_ERROR_ARGUMENT, "tensor h0.qkv is not a block boundary");
    cuts[0] = w.gg.tokens;
    check_refusal(&w, cuts, 1, stages, RKM_ERROR_ARGUMENT, "tensor tokens is not a block boundary");
    cuts[0] = w.gg.loss;
    check_refusal(&w, cuts, 1, stages, RKM_ERROR_ARGUMENT, "tensor losses is not a block boundary");
    /* a good cut, then a bad one: cut 1 named */
    cuts[0] = b1.input, cuts[1] = rkm_graph_find_tensor(w.gg.g, "h1.fch");
    check_refusal(&w, cuts, 2, stages, RKM_ERROR_ARGUMENT, "cut 1: tensor h1.fch is not a block boundary");
    /* ids that do not exist (the first block has no input: -1) */
    cuts[0] = -1;
    check_refusal(&w, cuts, 1, stages, RKM_ERROR_ARGUMENT, "cut 0: tensor id -1 does not exist");
    cuts[0] = rkm_graph_num_tensors(w.gg.g);
    check_refusal(&w, cuts, 1, stages, RKM_ERROR_ARGUMENT, "does not exist");
    /* out of order, and twice */
    cuts[0] = b3.input, cuts[1] = b1.input;
    check_refusal(&w, cuts, 2, stages, RKM_ERROR_ARGUMENT, "does not come after cut 0");
    cuts[0] = b1.input, cuts[1] = b1.input;
    check_refusal(&w, cuts, 2, stages, RKM_ERROR_ARGUMENT, "does not come after cut 0");
    /* no place for the stages, a negative count, cuts NULL */
    cuts[0] = b1.input;
    check_refusal(&w, cuts, 1, NULL, RKM_ERROR_ARGUMENT, "stages is NULL");
    check_refusal(&w, cuts, -1, stages, RKM_ERROR_ARGUMENT, "-1 cuts");
    check_refusal(&w, NULL, 1, stages, RKM_ERROR_ARGUMENT, "given as NULL");
    /* NULL graph: no message to write, but the argument error */
    CHECK(rkm_graph_cut(NULL, cuts, 1, stages) == RKM_ERROR_ARGUMENT);
    /* a graph not finalized */
    CHECK(rkm_graph_create(w.ctx, &builder) == RKM_OK);
    stages[0] = stages[1] = (rkm_graph *)(uintptr_t)0x10;
    CHECK(rkm_graph_cut(builder, cuts, 1, stages) == RKM_ERROR_STATE);
    CHECK(stages[0] == NULL && stages[1] == NULL);
    CHECK(strstr(rkm_context_errmsg(w.ctx), "not finalized") != NULL);
    rkm_graph_destroy(builder);
    /* no cut at all, cuts NULL: one stage, the whole graph */
    CHECK(rkm_graph_cut(w.gg.g, NULL, 0, stages) == RKM_OK);
    CHECK(stages[0] && rkm_graph_num_ops(stages[0]) == rkm_graph_num_ops(w.gg.g));
    rkm_graph_destroy(stages[0]);
    world_free(&w);
}

/* rkm_plan_execute_phase's refusals, and the whole graph's own plan run in
 * its two phases is rkm_plan_execute. */
TEST(phase_refusals)
{
    world w;
    rkm_plan *base = NULL;
    rkm_callbacks cb;
    gpt2_step st;
    ref rf = {0, NULL};
    double loss = 0;
    if (world_init(&w, toy_shape(1, 1, 0)) || make_ref(&w, &rf)) {
        CHECK(0);
        free(rf.grads);
        world_free(&w);
        return;
    }
    CHECK(rkm_plan_baseline(w.gg.g, &base) == RKM_OK);
    CHECK(gpt2_step_init(&st, &w.gg, &w.md, DROP_P, DROP_SEED) == 0);
    if (!test_current_failed) {
        cb = gpt2_callbacks(&st);
        CHECK(rkm_plan_phase_step(NULL) == -1);
        CHECK(rkm_plan_execute_phase(NULL, 0, 0, &cb) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_execute_phase(base, 2, 0, &cb) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(w.ctx), "phase 2, micro-batch 0") != NULL);
        CHECK(rkm_plan_execute_phase(base, -1, 0, &cb) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_execute_phase(base, 0, -1, &cb) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(w.ctx), "micro-batch -1") != NULL);
        CHECK(rkm_plan_execute_phase(base, 0, 0, NULL) == RKM_ERROR_ARGUMENT);
        CHECK(st.mem.blocks == 0); /* nothing was called */
        check_phases(base);
        /* the two phases of the whole graph's plan: the reference again */
        CHECK(gpt2_step_load(&st, w.tok[0], w.tgt[0]) == 0);
        gpt2_model_zero_grad(&w.md);
        st.key = STEP_KEY;
        CHECK(rkm_plan_execute_phase(base, 0, 3, &cb) == RKM_OK);
        CHECK(rkm_plan_execute_phase(base, 1, 3, &cb) == RKM_OK);
        loss = st.loss;
        CHECK(!memcmp(&loss, &rf.loss, sizeof loss));
        CHECK(!memcmp(w.md.grads, rf.grads, w.md.num_params * sizeof(float)));
        CHECK(gpt2_step_leaks(&st) == 0);
        gpt2_step_release(&st);
        gpt2_step_unload(&st);
    }
    gpt2_step_free(&st);
    rkm_plan_destroy(base);
    free(rf.grads);
    world_free(&w);
}

/* Every block boundary as a single cut, the stages run on their baseline
 * plans: the whole graph's loss and gradients. */
TEST(every_single_cut_matches_whole)
{
    world w;
    ref rf = {0, NULL};
    rkm_graph_stats gs;
    rkm_block_info bi;
    size_t rec = 0;
    if (world_init(&w, toy_shape(2, 1, 1)) || make_ref(&w, &rf)) {
        CHECK(0);
        free(rf.grads);
        world_free(&w);
        return;
    }
    CHECK(rkm_graph_stats_get(w.gg.g, &gs) == RKM_OK);
    for (int b = 1; b < gs.blocks && !test_current_failed; b++) {
        CHECK(rkm_graph_block_info(w.gg.g, b, &bi) == RKM_OK);
        check_cut(&w, &bi.input, 2, RKM_ALGO_NONE, 100, &rf, &rec);
    }
    CHECK(rec == 0); /* baselines */
    free(rf.grads);
    world_free(&w);
}

/* One algorithm to plan the stages with, on the even cuts into P stages
 * (0: every P tried). */
typedef struct algo_case {
    rkm_algo algo;
    int P;
} algo_case;

/* Even cuts into P = P_min..P_max stages, every stage planned by each
 * case's algorithm below its own baseline (pct % of its arena): the whole
 * graph's baseline loss and gradients bit for bit. */
static void check_even_cuts(gpt2_shape s, const algo_case *cases, int n_cases, int pct, int P_min, int P_max)
{
    world w;
    ref rf = {0, NULL};
    int32_t cuts[MAX_STAGES];
    size_t rec[RKM_ALGO_COUNT] = {0};
    if (world_init(&w, s) || make_ref(&w, &rf)) {
        CHECK(0);
        free(rf.grads);
        world_free(&w);
        return;
    }
    for (int P = P_min; P <= P_max && !test_current_failed; P++) {
        CHECK(even_cuts(w.gg.g, P, cuts) == 0);
        for (int a = 0; a < n_cases && !test_current_failed; a++)
            if (!cases[a].P || cases[a].P == P)
                check_cut(&w, cuts, P, cases[a].algo, cases[a].algo == RKM_ALGO_NONE ? 100 : pct, &rf,
                          &rec[cases[a].algo]);
    }
    /* so that the comparisons meant something: every planner recomputed */
    for (int a = 0; a < n_cases; a++)
        if (cases[a].algo != RKM_ALGO_NONE && !rec[cases[a].algo]) {
            fprintf(stderr, "  %s never recomputed\n", rkm_algo_name(cases[a].algo));
            CHECK(0);
        }
    printf("  L=%d dropout %d inplace %d, P %d..%d at %d %%: recomputes", s.L, s.dropout, s.inplace, P_min, P_max,
           pct);
    for (int a = 0; a < n_cases; a++) printf(" %s %zu", rkm_algo_name(cases[a].algo), rec[cases[a].algo]);
    printf("\n");
    free(rf.grads);
    world_free(&w);
}

/* Rotor and DTR on every cut; rockmate (about a second a cut under the
 * sanitizers) on one P per model. P = 1 (no cut: the whole graph again,
 * through the same host) with the baseline: the planners on the whole
 * graph are test_gpt2's. */
TEST(stages_match_whole)
{
    static const algo_case drop_off[] = {
        {RKM_ALGO_NONE, 0}, {RKM_ALGO_ROTOR, 0}, {RKM_ALGO_DTR, 0}, {RKM_ALGO_ROCKMATE, 3}};
    static const algo_case drop_on[] = {
        {RKM_ALGO_NONE, 0}, {RKM_ALGO_ROTOR, 0}, {RKM_ALGO_DTR, 0}, {RKM_ALGO_ROCKMATE, 2}};
    check_even_cuts(toy_shape(3, 0, 0), drop_off, (int)N_OF(drop_off), 65, 1, 4);
    check_even_cuts(toy_shape(3, 1, 0), drop_on, (int)N_OF(drop_on), 65, 1, 4);
}

/* The same with GELU's and the residual adds' backwards in place
 * (gpt2_shape.inplace, RKM_OP_GRAD_INPLACE): a stage's input is then
 * in[0] of a grad_inplace op (the residual add after it), whose gradient
 * the stage makes in place and sends back. At 05ba526 every planner
 * refuses such a stage graph (RKM_ERROR_ARGUMENT, "at alignment 4 the
 * graph's byte counts no longer fit"): the graph it plans with
 * (rkm__graph_aligned) makes the input plain, which leaves the residual's
 * grad_inplace without the input gradient it needs, and finalize fails.
 * The baselines of such stages run (every_single_cut_matches_whole). */
TEST(stages_grad_inplace_match_whole)
{
    static const algo_case cases[] = {
        {RKM_ALGO_NONE, 0}, {RKM_ALGO_ROTOR, 0}, {RKM_ALGO_DTR, 0}, {RKM_ALGO_ROCKMATE, 4}};
    check_even_cuts(toy_shape(3, 1, 1), cases, (int)N_OF(cases), 65, 1, 4);
}

#ifndef RKM_OMIT_SOLVER
/* Checkmate's whole-graph ILP on each stage of a 1-layer model. */
TEST(checkmate_stages_match_whole)
{
    static const algo_case cases[] = {{RKM_ALGO_CHECKMATE, 0}};
    check_even_cuts(toy_shape(1, 1, 0), cases, 1, 65, 2, 3);
}
#endif

/* Two micro-batches (two batches, dropout keys STEP_KEY and STEP_KEY + 1)
 * on a 2-stage cut, each stage planned to recompute, run interleaved: the
 * buffers of each micro-batch are found only through the calls' `micro`.
 *
 * Exactness: the backwards add into the one set of parameter gradients
 * (llm.c's `+=`), so an element's value is its contributions summed in the
 * order the kernels ran; float addition does not reassociate, so the
 * pipeline equals two whole-graph steps run one after the other (micro-batch
 * 0's backward, then 1's, accumulating) exactly when every element gets its
 * contributions in that order. Every parameter but wte is used by one op,
 * hence one stage, and each stage runs its backwards in micro-batch order
 * (in 1F1B and GPipe alike): fine. wte is tied: lm_head (last stage) and
 * the encoder (stage 0) both add into it, and two whole-graph steps add
 * lm_head(0), encoder(0), lm_head(1), encoder(1). 1F1B order
 *   S0 F0, S0 F1, S1 F0, S1 B0, S0 B0, S1 F1, S1 B1, S0 B1
 * (stage 0: F0 F1 B0 B1, one warm-up forward; stage 1: F0 B0 F1 B1) runs
 * S0 B0 before S1 B1, so it adds in that same order: bit for bit. GPipe
 * order (all forwards, then S1 B0, S1 B1, S0 B0, S0 B1) adds lm_head(1)
 * before encoder(0): every other parameter is still exact, and wte is the
 * same sum in another order: equal within float rounding only (a real
 * pipeline keeps wte's two gradients on two devices and sums them
 * afterwards, which is yet another order). */
typedef struct phase_ref {
    int s, m, bwd;
} phase_ref;

static void run_order(world *w, const int32_t *cut, rkm_algo algo, const phase_ref *order, int n,
                      const double *ref_loss, const float *ref_grads, int exact_wte)
{
    rkm_graph *stages[2];
    pipeline p;
    size_t wte_off = (size_t)(w->md.g[GPT2_WTE] - w->md.grads), wte_n = w->md.sizes[GPT2_WTE], differ = 0;
    float scale = 0.0f, worst = 0.0f;
    if (rkm_graph_cut(w->gg.g, cut, 1, stages) != RKM_OK) {
        CHECK(0);
        return;
    }
    if (pipe_init(&p, w, stages, 2, 2, cut) == 0) {
        int ok = 1;
        rkm_plan *mine[2] = {NULL, NULL};
        for (int s = 0; s < 2 && !test_current_failed; s++) {
            rkm_plan_stats ps;
            mine[s] = stage_plan(p.st[s].g, algo, 65);
            CHECK(mine[s] && rkm_plan_stats_get(mine[s], &ps) == RKM_OK && ps.recomputes > 0);
        }
        if (!test_current_failed) {
            pipe_set_plans(&p, mine);
            gpt2_model_zero_grad(&w->md);
            for (int i = 0; i < n && ok; i++)
                ok = (order[i].bwd ? pipe_bwd(&p, order[i].s, order[i].m) : pipe_fwd(&p, order[i].s, order[i].m)) == 0;
            CHECK(ok);
        }
        if (ok && !test_current_failed) {
            for (int m = 0; m < 2; m++) CHECK(!memcmp(&p.loss[m], &ref_loss[m], sizeof(double)));
            CHECK(!memcmp(w->md.grads, ref_grads, wte_off * sizeof(float)));
            CHECK(!memcmp(w->md.grads + wte_off + wte_n, ref_grads + wte_off + wte_n,
                          (w->md.num_params - wte_off - wte_n) * sizeof(float)));
            for (size_t i = wte_off; i < wte_off + wte_n; i++) scale = fmaxf(scale, fabsf(ref_grads[i]));
            for (size_t i = wte_off; i < wte_off + wte_n; i++) {
                float a = w->md.grads[i], b = ref_grads[i];
                differ += memcmp(&a, &b, sizeof a) != 0;
                worst = fmaxf(worst, fabsf(a - b));
            }
            /* a sum reordered moves by a few ulps of its largest terms; a
             * contribution lost or doubled would move it by ~1/(B*T) */
            CHECK(worst <= 64.0f * FLT_EPSILON * scale);
            if (exact_wte) CHECK(differ == 0);
            printf("  %s, %s: wte elements off by rounding: %zu of %zu\n", exact_wte ? "1F1B" : "GPipe",
                   rkm_algo_name(algo), differ, wte_n);
        }
        for (int s = 0; s < 2; s++) rkm_plan_destroy(mine[s]);
    }
    pipe_free(&p);
}

TEST(micro_batches_interleaved)
{
    static const phase_ref one_f_one_b[] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 0, 1},
                                            {0, 0, 1}, {1, 1, 0}, {1, 1, 1}, {0, 1, 1}};
    static const phase_ref gpipe[] = {{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0},
                                      {1, 0, 1}, {1, 1, 1}, {0, 0, 1}, {0, 1, 1}};
    world w;
    int32_t cut[1];
    rkm_plan *base = NULL;
    double ref_loss[2] = {0, 0};
    float *ref_grads = NULL;
    if (world_init(&w, toy_shape(2, 1, 0))) {
        CHECK(0);
        world_free(&w);
        return;
    }
    /* the reference: two whole-graph steps, the second adding into the
     * first's gradients */
    CHECK(rkm_plan_baseline(w.gg.g, &base) == RKM_OK);
    CHECK((ref_grads = (float *)malloc(w.md.num_params * sizeof(float))) != NULL);
    CHECK(even_cuts(w.gg.g, 2, cut) == 0);
    if (!test_current_failed) {
        whole_step(&w, base, 0, STEP_KEY, 1, &ref_loss[0]);
        whole_step(&w, base, 1, STEP_KEY + 1, 0, &ref_loss[1]);
        memcpy(ref_grads, w.md.grads, w.md.num_params * sizeof(float));
        CHECK(memcmp(&ref_loss[0], &ref_loss[1], sizeof(double)) != 0); /* two different batches */
    }
    if (!test_current_failed) {
        run_order(&w, cut, RKM_ALGO_ROTOR, one_f_one_b, (int)N_OF(one_f_one_b), ref_loss, ref_grads, 1);
        if (!test_current_failed)
            run_order(&w, cut, RKM_ALGO_DTR, one_f_one_b, (int)N_OF(one_f_one_b), ref_loss, ref_grads, 1);
        if (!test_current_failed) run_order(&w, cut, RKM_ALGO_ROTOR, gpipe, (int)N_OF(gpipe), ref_loss, ref_grads, 0);
    }
    rkm_plan_destroy(base);
    free(ref_grads);
    world_free(&w);
}

int main(void)
{
    RUN(cut_structure);
    RUN(cut_refusals);
    RUN(phase_refusals);
    RUN(every_single_cut_matches_whole);
    RUN(stages_match_whole);
    RUN(stages_grad_inplace_match_whole);
#ifndef RKM_OMIT_SOLVER
    RUN(checkmate_stages_match_whole);
#else
    RUN_SKIPPED(checkmate_stages_match_whole, "needs lp_solve (built with RKM_OMIT_SOLVER)");
#endif
    RUN(micro_batches_interleaved);
    TEST_END();
}
