/* llmc_host.h -- the rockmate callbacks that run llm.c's train_gpt2.c
 * kernels one graph op at a time (the graph: llmc_graph.h).
 *
 * Include it after the kernels it calls, by llm.c's names and signatures:
 * encoder_forward, layernorm_forward, matmul_forward, attention_forward,
 * residual_forward, gelu_forward, softmax_forward, crossentropy_forward,
 * their backwards and crossentropy_softmax_backward. examples/llmc.c
 * includes llm.c's own train_gpt2.c before it; tests/test_llmc.c its
 * stand-ins of the same semantics.
 *
 * Instead of llm.c's one activation block (acts and grads_acts), every
 * activation, saved state (layernorm's mean/rstd, attention's att),
 * activation gradient and workspace is a buffer of its own. Two memory
 * modes, chosen when the step is made:
 * - malloc (llmc_step_init, llmc_step_run): the callbacks make and free
 *   each buffer through llmc_mem, which counts bytes as rockmate's
 *   contract does: its peak is the plan's predicted peak, to the byte.
 * - arena (llmc_step_init_arena, llmc_step_open, llmc_step_run_arena): one
 *   rkm_arena_exec per plan, its one region (the plan's arena_bytes)
 *   allocated when it is opened, the inputs filled then; every buffer sits
 *   at its offset in the plan's layout and the callbacks only look it up.
 *   A step allocates and frees nothing; the exec's peak is the plan's.
 * The callbacks are the same for both: a small helper (llmc__new) either
 * counts a malloc or takes the exec's offset.
 * Parameters and their gradients stay the host's (llm.c's
 * ParameterTensors), outside the budget.
 *
 * llm.c's backwards add (+=) into every gradient and gpt2_zero_grad zeroes
 * them all before each step. Here the host zeroes exactly what is new:
 * the gradients a call marks RKM_GRAD_NEW and the backward workspace
 * (attention's dpreatt and datt); the parameter gradients before the step.
 * Every other new buffer comes poisoned (all bits set, a NaN), so a kernel
 * reading a buffer nobody wrote shows in the results. Both modes do the
 * same: in an arena, the bytes an earlier buffer left would otherwise
 * hide such a read. */
#ifndef LLMC_HOST_H
#define LLMC_HOST_H

#include "llmc_graph.h"

/* ---------------------------------------------------------------------------
 * Counting allocator
 * ------------------------------------------------------------------------- */

typedef struct llmc_mem {
    uint64_t cur, peak; /* bytes live now, most bytes live at once */
    int64_t blocks;     /* buffers live now */
} llmc_mem;

static inline void *llmc_mem_alloc(llmc_mem *m, uint64_t bytes, int zero)
{
    void *p = malloc(bytes ? (size_t)bytes : 1);
    if (!p) return NULL;
    memset(p, zero ? 0 : 0xff, (size_t)bytes);
    m->cur += bytes;
    m->blocks++;
    if (m->cur > m->peak) m->peak = m->cur;
    return p;
}

static inline void llmc_mem_free(llmc_mem *m, void *p, uint64_t bytes)
{
    if (!p) return;
    free(p);
    m->cur -= bytes;
    m->blocks--;
}

/* ---------------------------------------------------------------------------
 * One training step's buffers
 * ------------------------------------------------------------------------- */

typedef struct llmc_step {
    const llmc_graph *gg;
    float *params[LLMC_NUM_PARAMS]; /* llm.c's ParameterTensors, in its order */
    float *grads[LLMC_NUM_PARAMS];  /* their gradients */
    int arena;          /* 1: arena mode, 0: malloc mode */
    llmc_mem mem;       /* malloc mode: the counted buffers */
    rkm_arena_exec *ax; /* arena mode: the exec of the step in progress */
    void *base;         /* its region */
    void *batch[2];     /* arena mode: tokens and targets, copied into each exec's inputs */
    void **act;      /* per tensor: its buffer while live */
    float **phantom; /* per op: its saved state while live */
    float **grad;    /* per tensor: its gradient while live */
    float mean_loss; /* as llm.c's model->mean_loss */
    uint64_t peak;   /* the last step's measured activation peak */
    int skip_zeroing; /* tests only: leave new gradients and workspaces unzeroed (wrong) */
    char err[160];   /* why a callback failed */
} llmc_step;

static inline int llmc__fail(llmc_step *st, const char *what, int32_t id)
{
    snprintf(st->err, sizeof st->err, "%s (id %d)", what, (int)id);
    return 1;
}

static inline uint64_t llmc__tbytes(const llmc_step *st, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(st->gg->g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

/* A buffer the step creates: where the exec carved it (offset `off`), or
 * counted. Poisoned, or zeroed (`zero`) for the kernels that add into it.
 * NULL when out of memory. */
static inline void *llmc__new(llmc_step *st, uint64_t off, uint64_t bytes, int zero)
{
    void *p;
    if (!st->ax) return llmc_mem_alloc(&st->mem, bytes, zero);
    if ((p = rkm_arena_ptr(st->base, off))) memset(p, zero ? 0 : 0xff, (size_t)bytes);
    return p;
}

/* A buffer a free step releases (the exec takes its own back by itself). */
static inline void llmc__release(llmc_step *st, void *p, uint64_t bytes)
{
    if (!st->ax) llmc_mem_free(&st->mem, p, bytes);
}

/* The call's workspace of `bytes` (its ws_bytes): cut from the exec's
 * reservation for the call, or counted. NULL for 0 bytes or out of memory;
 * release it with llmc__release. */
static inline float *llmc__ws(llmc_step *st, uint64_t bytes, int zero)
{
    uint64_t off = 0;
    if (!bytes || (st->ax && rkm_arena_exec_scratch(st->ax, bytes, &off) != RKM_OK)) return NULL;
    return (float *)llmc__new(st, off, bytes, zero);
}

/* A parameter as llm.c's gpt2_forward points at it: l_qkvw = params.qkvw
 * + l * 3*C * C, and so on; whole outside the layers. */
static inline float *llmc__param(float *const *base, const llmc_shape *s, int param, int layer)
{
    if (param < 0) return NULL;
    return base[param] + (layer < 0 ? 0 : (size_t)layer * llmc_param_stride(s, param));
}

/* gpt2_forward's kernel call for one op. scratch: where the kernel writes
 * what it always writes (mean/rstd, att): the saved state when live, else
 * the workspace after fwd_ws; ws: the workspace (attention's preatt). */
static inline void llmc__forward_kernel(llmc_step *st, const llmc_opdef *d, float *scratch, float *ws)
{
    const llmc_shape *s = &st->gg->shape;
    int B = s->B, T = s->T, C = s->C, NH = s->NH;
    float *out = (float *)st->act[d->out[0]], *inp = (float *)st->act[d->in[0]];
    float *w = llmc__param(st->params, s, d->weight, d->layer), *b = llmc__param(st->params, s, d->bias, d->layer);
    switch (d->kind) {
    case LLMC_ENCODER: encoder_forward(out, (int *)st->act[d->in[0]], w, b, B, T, C); break;
    case LLMC_LAYERNORM: layernorm_forward(out, scratch, scratch + B * T, inp, w, b, B, T, C); break;
    case LLMC_MATMUL: matmul_forward(out, inp, w, b, B, T, d->C, d->OC); break;
    case LLMC_ATTENTION: attention_forward(out, ws, scratch, inp, B, T, C, NH); break;
    case LLMC_RESIDUAL: residual_forward(out, inp, (float *)st->act[d->in[1]], B * T * C); break;
    case LLMC_GELU: gelu_forward(out, inp, B * T * 4 * C); break;
    case LLMC_SOFTMAX_XENT:
        softmax_forward(out, inp, B, T, s->V, s->Vp);
        crossentropy_forward((float *)st->act[d->out[1]], out, (int *)st->act[d->in[1]], B, T, s->Vp);
        break;
    }
}

static inline int llmc_cb_forward(void *user, const rkm_fwd_call *c)
{
    llmc_step *st = (llmc_step *)user;
    const llmc_opdef *d = &st->gg->ops[c->op];
    float *ws = NULL, *scratch;
    for (int i = 0; i < d->n_in; i++)
        if (!st->act[d->in[i]]) return llmc__fail(st, "forward: input not live", d->in[i]);
    for (int k = 0; k < d->n_out; k++) {
        int32_t t = d->out[k];
        if (c->out_new[k]) {
            if (st->act[t]) return llmc__fail(st, "forward: new output already live", t);
            if (!(st->act[t] = llmc__new(st, rkm_arena_exec_tensor(st->ax, t), llmc__tbytes(st, t), 0)))
                return llmc__fail(st, "forward: out of memory", t);
        } else if (!st->act[t]) {
            return llmc__fail(st, "forward: output to recompute in place is not live", t);
        }
    }
    if (c->save) {
        if (st->phantom[c->op]) return llmc__fail(st, "forward: saved state already live", c->op);
        if (!(st->phantom[c->op] = (float *)llmc__new(st, rkm_arena_exec_saved(st->ax, c->op), c->phantom, 0)))
            return llmc__fail(st, "forward: out of memory", c->op);
    }
    /* the contract's workspace: fwd_ws, plus the scratch when no saved state is live */
    if (c->ws_bytes != d->fwd_ws + (st->phantom[c->op] ? 0 : d->scratch))
        return llmc__fail(st, "forward: workspace differs from the graph's fwd_ws and scratch", c->op);
    if (c->ws_bytes && !(ws = llmc__ws(st, c->ws_bytes, 0))) return llmc__fail(st, "forward: out of memory", c->op);
    scratch = st->phantom[c->op] ? st->phantom[c->op] : ws ? (float *)((char *)ws + d->fwd_ws) : NULL;
    llmc__forward_kernel(st, d, scratch, ws);
    llmc__release(st, ws, c->ws_bytes);
    return 0;
}

/* The buffer of tensor t if the op's backward declares it saved, else NULL:
 * a backward sees only what its `saved` list promises. */
static inline void *llmc__saved(const llmc_step *st, const rkm_bwd_call *c, int32_t t)
{
    for (int i = 0; i < c->n_saved; i++)
        if (c->saved[i] == t) return st->act[t];
    return NULL;
}

/* gpt2_backward's kernel call for one op; din[i]: grad(in[i]) or NULL. */
static inline void llmc__backward_kernel(llmc_step *st, const llmc_opdef *d, const rkm_bwd_call *c, float *const din[2],
                                         float *ws)
{
    const llmc_shape *s = &st->gg->shape;
    int B = s->B, T = s->T, C = s->C, NH = s->NH;
    size_t scores = (size_t)B * NH * T * T;
    float *inp = (float *)llmc__saved(st, c, d->in[0]), *ph = st->phantom[c->op];
    float *w = llmc__param(st->params, s, d->weight, d->layer);
    float *dw = llmc__param(st->grads, s, d->weight, d->layer), *db = llmc__param(st->grads, s, d->bias, d->layer);
    float *dout = st->grad[d->out[d->kind == LLMC_SOFTMAX_XENT ? 1 : 0]];
    switch (d->kind) {
    case LLMC_ENCODER: encoder_backward(dw, db, dout, (int *)inp, B, T, C); break;
    case LLMC_LAYERNORM: layernorm_backward(din[0], dw, db, dout, inp, w, ph, ph + B * T, B, T, C); break;
    case LLMC_MATMUL: matmul_backward(din[0], dw, db, dout, inp, w, B, T, d->C, d->OC); break;
    case LLMC_ATTENTION: attention_backward(din[0], ws, ws + scores, dout, inp, ph, B, T, C, NH); break;
    case LLMC_RESIDUAL: residual_backward(din[0], din[1], dout, B * T * C); break;
    case LLMC_GELU: gelu_backward(din[0], inp, dout, B * T * 4 * C); break;
    case LLMC_SOFTMAX_XENT:
        crossentropy_softmax_backward(din[0], dout, (float *)llmc__saved(st, c, d->out[0]),
                                      (int *)llmc__saved(st, c, d->in[1]), B, T, s->V, s->Vp);
        break;
    }
}

/* Makes din[i] point at grad(in[i]) as the executor asks; a new one is
 * zeroed, since llm.c's backwards add into it. */
static inline int llmc__input_grads(llmc_step *st, const llmc_opdef *d, const rkm_bwd_call *c, float *din[2])
{
    din[0] = din[1] = NULL;
    for (int i = 0; i < d->n_in; i++) {
        int32_t t = d->in[i];
        if (c->in_grad[i] == RKM_GRAD_NEW) {
            uint64_t off = rkm_arena_exec_grad(st->ax, t); /* arena mode: where the exec carved it */
            if (st->grad[t]) return llmc__fail(st, "backward: new gradient already live", t);
            if (!(st->grad[t] = (float *)llmc__new(st, off, llmc__tbytes(st, t), !st->skip_zeroing)))
                return llmc__fail(st, "backward: out of memory", t);
        } else if (c->in_grad[i] == RKM_GRAD_ACCUMULATE && !st->grad[t]) {
            return llmc__fail(st, "backward: gradient to accumulate into is not live", t);
        }
        if (c->in_grad[i] != RKM_GRAD_NONE) din[i] = st->grad[t];
    }
    /* llm.c's kernels write every input gradient but the encoder's and
     * the targets' (neither has one) */
    if (d->kind != LLMC_ENCODER && !din[0]) return llmc__fail(st, "backward: input without gradient", d->in[0]);
    if (d->kind == LLMC_RESIDUAL && !din[1]) return llmc__fail(st, "backward: input without gradient", d->in[1]);
    return 0;
}

static inline int llmc_cb_backward(void *user, const rkm_bwd_call *c)
{
    llmc_step *st = (llmc_step *)user;
    const llmc_opdef *d = &st->gg->ops[c->op];
    int32_t out = d->out[d->kind == LLMC_SOFTMAX_XENT ? 1 : 0]; /* the output with a gradient */
    float *din[2], *ws = NULL;
    if (!st->grad[out]) return llmc__fail(st, "backward: output gradient not live", out);
    for (int i = 0; i < c->n_saved; i++)
        if (!st->act[c->saved[i]]) return llmc__fail(st, "backward: saved tensor not live", c->saved[i]);
    if (c->phantom && !st->phantom[c->op]) return llmc__fail(st, "backward: saved state not live", c->op);
    if (llmc__input_grads(st, d, c, din)) return 1;
    if (c->ws_bytes && !(ws = llmc__ws(st, c->ws_bytes, !st->skip_zeroing)))
        return llmc__fail(st, "backward: out of memory", c->op);
    llmc__backward_kernel(st, d, c, din, ws);
    llmc__release(st, ws, c->ws_bytes);
    return 0;
}

/* As gpt2_forward's mean loss and gpt2_backward's seed: dlosses = 1/(B*T). */
static inline int llmc_cb_loss(void *user, const rkm_buffer_call *c)
{
    llmc_step *st = (llmc_step *)user;
    const llmc_shape *s = &st->gg->shape;
    size_t BT = (size_t)s->B * (size_t)s->T;
    const float *losses = (const float *)st->act[c->index];
    float mean_loss = 0.0f, dloss_mean = 1.0f / (float)BT;
    if (!losses) return llmc__fail(st, "loss: tensor not live", c->index);
    if (st->grad[c->index]) return llmc__fail(st, "loss: gradient already live", c->index);
    if (!(st->grad[c->index] = (float *)llmc__new(st, rkm_arena_exec_grad(st->ax, c->index), c->bytes, 0)))
        return llmc__fail(st, "loss: out of memory", c->index);
    for (size_t i = 0; i < BT; i++) mean_loss += losses[i];
    st->mean_loss = mean_loss / (float)BT;
    for (size_t i = 0; i < BT; i++) st->grad[c->index][i] = dloss_mean;
    return 0;
}

static inline int llmc_cb_free_tensor(void *user, const rkm_buffer_call *c)
{
    llmc_step *st = (llmc_step *)user;
    if (!st->act[c->index]) return llmc__fail(st, "free: tensor not live", c->index);
    llmc__release(st, st->act[c->index], c->bytes);
    st->act[c->index] = NULL;
    return 0;
}

static inline int llmc_cb_free_saved(void *user, const rkm_buffer_call *c)
{
    llmc_step *st = (llmc_step *)user;
    if (!st->phantom[c->index]) return llmc__fail(st, "free_saved: saved state not live", c->index);
    llmc__release(st, st->phantom[c->index], c->bytes);
    st->phantom[c->index] = NULL;
    return 0;
}

static inline int llmc_cb_free_grad(void *user, const rkm_buffer_call *c)
{
    llmc_step *st = (llmc_step *)user;
    if (!st->grad[c->index]) return llmc__fail(st, "free_grad: gradient not live", c->index);
    llmc__release(st, st->grad[c->index], c->bytes);
    st->grad[c->index] = NULL;
    return 0;
}

static inline rkm_callbacks llmc_callbacks(llmc_step *st)
{
    rkm_callbacks cb;
    cb.user = st;
    cb.forward = llmc_cb_forward;
    cb.backward = llmc_cb_backward;
    cb.loss = llmc_cb_loss;
    cb.free_tensor = llmc_cb_free_tensor;
    cb.free_saved = llmc_cb_free_saved;
    cb.free_grad = llmc_cb_free_grad;
    return cb;
}

/* ---------------------------------------------------------------------------
 * Set-up and one step
 * ------------------------------------------------------------------------- */

static inline void llmc_step_free(llmc_step *st)
{
    const llmc_graph *gg = st->gg;
    if (st->act && gg) {
        int32_t ids[2] = {gg->tokens, gg->targets};
        for (int i = 0; i < 2; i++) llmc_mem_free(&st->mem, st->act[ids[i]], llmc__tbytes(st, ids[i]));
    }
    free(st->act);
    free(st->phantom);
    free(st->grad);
    free(st->batch[0]);
    free(st->batch[1]);
    memset(st, 0, sizeof *st);
}

/* Both modes' set-up; the inputs go into counted buffers made live now
 * (malloc mode) or into the step's copy, for each exec (arena mode). */
static inline int llmc__step_init(llmc_step *st, const llmc_graph *gg, float *const params[LLMC_NUM_PARAMS],
                                  float *const grads[LLMC_NUM_PARAMS], const int *tokens, const int *targets,
                                  int arena)
{
    size_t nt = (size_t)rkm_graph_num_tensors(gg->g), no = (size_t)rkm_graph_num_ops(gg->g);
    int32_t ids[2] = {gg->tokens, gg->targets};
    const int *src[2] = {tokens, targets};
    memset(st, 0, sizeof *st);
    st->gg = gg;
    st->arena = arena;
    for (int k = 0; k < LLMC_NUM_PARAMS; k++) st->params[k] = params[k], st->grads[k] = grads[k];
    st->act = (void **)calloc(nt, sizeof *st->act);
    st->phantom = (float **)calloc(no, sizeof *st->phantom);
    st->grad = (float **)calloc(nt, sizeof *st->grad);
    if (!st->act || !st->phantom || !st->grad) {
        llmc_step_free(st);
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        uint64_t bytes = llmc__tbytes(st, ids[i]);
        void *p = arena ? (st->batch[i] = malloc((size_t)bytes))
                        : (st->act[ids[i]] = llmc_mem_alloc(&st->mem, bytes, 0));
        if (!p) {
            llmc_step_free(st);
            return -1;
        }
        memcpy(p, src[i], (size_t)bytes);
    }
    return 0;
}

/* Malloc mode. params and grads: the 16 parameter tensors and their
 * gradients, in llm.c's order. Makes the inputs live (counted) holding
 * tokens and targets (B*T each). 0 on success, -1 when out of memory. */
static inline int llmc_step_init(llmc_step *st, const llmc_graph *gg, float *const params[LLMC_NUM_PARAMS],
                                 float *const grads[LLMC_NUM_PARAMS], const int *tokens, const int *targets)
{
    return llmc__step_init(st, gg, params, grads, tokens, targets, 0);
}

/* Arena mode (see the top), the same arguments; tokens and targets are
 * copied, for llmc_step_open to put into each exec's inputs. */
static inline int llmc_step_init_arena(llmc_step *st, const llmc_graph *gg, float *const params[LLMC_NUM_PARAMS],
                                       float *const grads[LLMC_NUM_PARAMS], const int *tokens, const int *targets)
{
    return llmc__step_init(st, gg, params, grads, tokens, targets, 1);
}

/* Arena mode: the exec that runs `plan` (of the step's graph, which must
 * outlive it), its region allocated here, once, from the plan's layout,
 * and its inputs filled. The caller destroys it (rkm_arena_exec_destroy). */
static inline rkm_result llmc_step_open(llmc_step *st, const rkm_plan *plan, rkm_arena_exec **out)
{
    rkm_callbacks cb = llmc_callbacks(st);
    rkm_arena_exec_desc d;
    int32_t ids[2] = {st->gg->tokens, st->gg->targets};
    rkm_result r;
    st->err[0] = 0; /* a failed create says why in the context */
    if (!st->arena) {
        snprintf(st->err, sizeof st->err, "llmc_step_open: a malloc step runs with llmc_step_run");
        return RKM_ERROR_STATE;
    }
    memset(&d, 0, sizeof d);
    d.graph = st->gg->g;
    d.host = &cb; /* copied by the exec */
    d.plan = plan; /* layout mode (0): every buffer at its offset in the plan's layout */
    d.allocate = 1;
    if ((r = rkm_arena_exec_create(&d, out)) != RKM_OK) return r;
    for (int i = 0; i < 2; i++)
        memcpy(rkm_arena_ptr(rkm_arena_exec_base(*out), rkm_arena_exec_tensor(*out, ids[i])), st->batch[i],
               (size_t)llmc__tbytes(st, ids[i]));
    return RKM_OK;
}

/* Malloc mode: frees whatever a failed step left live, inputs excepted. */
static inline void llmc_step_release(llmc_step *st)
{
    int32_t nt = rkm_graph_num_tensors(st->gg->g), no = rkm_graph_num_ops(st->gg->g);
    for (int32_t t = 0; t < nt; t++) {
        if (st->act[t] && t != st->gg->tokens && t != st->gg->targets) {
            llmc_mem_free(&st->mem, st->act[t], llmc__tbytes(st, t));
            st->act[t] = NULL;
        }
        llmc_mem_free(&st->mem, st->grad[t], llmc__tbytes(st, t));
        st->grad[t] = NULL;
    }
    for (int32_t op = 0; op < no; op++) {
        rkm_op_desc oi;
        if (st->phantom[op] && rkm_graph_op_info(st->gg->g, op, &oi) == RKM_OK)
            llmc_mem_free(&st->mem, st->phantom[op], oi.phantom);
        st->phantom[op] = NULL;
    }
}

/* Buffers other than the inputs the host still holds: 0 after a step. */
static inline int64_t llmc_step_leaks(const llmc_step *st)
{
    int32_t nt = rkm_graph_num_tensors(st->gg->g), no = rkm_graph_num_ops(st->gg->g);
    int64_t n = 0;
    for (int32_t t = 0; t < nt; t++)
        n += (st->act[t] && t != st->gg->tokens && t != st->gg->targets) + (st->grad[t] != NULL);
    for (int32_t op = 0; op < no; op++) n += st->phantom[op] != NULL;
    return n;
}

/* What both modes do before a step, as llm.c's gpt2_zero_grad: the
 * parameter gradients zeroed (the backwards add into them). */
static inline void llmc__step_begin(llmc_step *st, size_t num_params)
{
    memset(st->grads[0], 0, num_params * sizeof(float)); /* one block, as llm.c's grads_memory */
    st->err[0] = 0;
    st->mean_loss = -1.0f;
}

/* Malloc mode: one training step under `plan`, as llm.c's gpt2_forward,
 * gpt2_zero_grad, gpt2_backward: the parameter gradients are zeroed, then
 * accumulated. The measured activation peak (llmc_mem's) is left in
 * st->peak. */
static inline rkm_result llmc_step_run(llmc_step *st, const rkm_plan *plan, size_t num_params)
{
    rkm_callbacks cb = llmc_callbacks(st);
    rkm_result r;
    if (st->arena) {
        snprintf(st->err, sizeof st->err, "llmc_step_run: an arena step runs with llmc_step_run_arena");
        return RKM_ERROR_STATE;
    }
    llmc__step_begin(st, num_params);
    st->mem.peak = st->mem.cur;
    r = rkm_plan_execute(plan, &cb);
    st->peak = st->mem.peak;
    if (r == RKM_OK && st->mem.blocks != 2) {
        snprintf(st->err, sizeof st->err, "%lld buffers besides the inputs live after the step",
                 (long long)st->mem.blocks - 2);
        r = RKM_ERROR_STATE;
    }
    if (r != RKM_OK) llmc_step_release(st);
    return r;
}

/* Arena mode, after a step: its pointers are into the exec's region, which
 * the exec manages; nothing to free, only to forget (the next run carves
 * anew, and a failed one left them dangling). */
static inline void llmc__forget(llmc_step *st)
{
    memset(st->act, 0, (size_t)rkm_graph_num_tensors(st->gg->g) * sizeof *st->act);
    memset(st->grad, 0, (size_t)rkm_graph_num_tensors(st->gg->g) * sizeof *st->grad);
    memset(st->phantom, 0, (size_t)rkm_graph_num_ops(st->gg->g) * sizeof *st->phantom);
    st->ax = NULL;
    st->base = NULL;
}

/* Arena mode: the same step through x (llmc_step_open of this step and
 * `plan`); allocates nothing. The measured activation peak (the arena's)
 * is left in st->peak. On failure the exec has released every buffer but
 * the inputs, and x can run again. */
static inline rkm_result llmc_step_run_arena(llmc_step *st, rkm_arena_exec *x, const rkm_plan *plan,
                                             size_t num_params)
{
    int32_t ids[2] = {st->gg->tokens, st->gg->targets};
    uint64_t inputs = 0;
    rkm_arena_stats as;
    rkm_result r;
    if (!st->arena || !x) {
        snprintf(st->err, sizeof st->err, "llmc_step_run_arena: %s",
                 !st->arena ? "a malloc step runs with llmc_step_run" : "no exec");
        return RKM_ERROR_STATE;
    }
    llmc__step_begin(st, num_params);
    st->ax = x;
    st->base = rkm_arena_exec_base(x);
    for (int i = 0; i < 2; i++) {
        st->act[ids[i]] = rkm_arena_ptr(st->base, rkm_arena_exec_tensor(x, ids[i]));
        inputs += llmc__tbytes(st, ids[i]);
    }
    r = rkm_arena_exec_run(x, plan);
    rkm_arena_exec_stats_get(x, &as);
    st->peak = as.peak;
    if (r == RKM_OK && (llmc_step_leaks(st) != 0 || as.current != inputs)) {
        snprintf(st->err, sizeof st->err, "%lld buffers (%llu bytes) besides the inputs live after the step",
                 (long long)llmc_step_leaks(st), (unsigned long long)(as.current - inputs));
        r = RKM_ERROR_STATE;
    }
    llmc__forget(st);
    return r;
}

#endif /* LLMC_HOST_H */
