/* mlp.c -- the smallest real rockmate host: a CPU MLP trained under a plan.
 *
 * A multilayer perceptron (matmul+bias, ReLU, ..., matmul+bias, softmax
 * cross-entropy) learns one random batch, written in llm.c's style: plain
 * kernels named x_forward/x_backward, explicit buffers, parameters in one
 * block. The host describes its training step to rockmate with the builder
 * API, then lets a plan drive it. Parameters and their gradients are the
 * host's; every activation, saved state (phantom), activation gradient and
 * workspace lives where --memory says:
 *
 * - arena (the default): one arena per plan, laid out by the library
 *   (rkm_arena_exec_create in layout mode with allocate: one allocation, made before
 *   training; a training step allocates nothing). The callbacks find their
 *   buffers at rkm_arena_ptr(base, offset) and take the workspace with
 *   rkm_arena_exec_scratch. The measured peak is the arena's.
 * - malloc: every buffer is malloc'ed and freed inside the callbacks through
 *   a counting allocator (what a naive host does), whose peak is measured.
 *
 * Either way the measured peak is set against the simulator's, to the byte,
 * and the two give the same losses and gradients, bit for bit: the last
 * line's digest (of every step's loss and gradients) is the same.
 *
 *   build/mlp [--budget B] [--algo A] [--steps N] [--layers L] [--memory M] [--inplace]
 *
 * --copy BW gives the graph a copy link to host memory of BW bytes a second
 * each way (docs/formats.md, "Offloading"): rockmate may then offload
 * activations and saved states to host memory and prefetch them back. The
 * host's copies go to counted host buffers on two copy threads that move
 * BW bytes a second (examples/copier.h) while the kernels go on, and `wait`
 * blocks until its copy is done; the measured host peak is set against
 * the plan's. (The op times here are nominal, so the step's wall time is
 * not held against the simulator's; examples/gpt2.c profiles its ops and
 * does.)
 *
 * --inplace declares ReLU in place both ways (RKM_OP_INPLACE: its output
 * over its input; RKM_OP_GRAD_INPLACE: its input's gradient over its
 * output's), as a host with in-place kernels would: baseline and plans then
 * hold one buffer fewer per layer for a while, and the kernels, unchanged,
 * give the same values (the digest is the same with and without it).
 *
 * Without --budget each step runs the baseline plan. With one ("50%",
 * "64KiB", a byte count, or "min" for the least the algorithm can do) it
 * also plans with rkm_plan_solve (--algo, default: the build's best) and runs both plans
 * every step: the planned step must give the baseline's loss and gradients
 * bit for bit, and its measured peak must equal the simulated one.
 *
 * Exit status: 0 every check held, 1 a check or a library call failed,
 * 2 bad usage, 3 no plan fits the budget. */
#define _POSIX_C_SOURCE 200809L /* copier.h's clocks */
#include "rockmate.h"

#include "args.h"
#include "copier.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BATCH = 16, IN_DIM = 64, HIDDEN = 128, CLASSES = 10, MAX_LAYERS = 64 };
enum { MAX_TENSORS = 2 * MAX_LAYERS + 2, MAX_OPS = 2 * MAX_LAYERS };

/* ---------------------------------------------------------------------------
 * Kernels. A backward writes its input gradient when `acc` is 0 and adds
 * into it when 1 (rockmate says which); parameter gradients always add up.
 * ------------------------------------------------------------------------- */

/* out[b][o] = bias[o] + sum_i inp[b][i] * w[o][i] */
static void matmul_forward(float *out, const float *inp, const float *w, const float *bias, int nb,
                           int c, int oc)
{
    for (int b = 0; b < nb; b++)
        for (int o = 0; o < oc; o++) {
            float sum = bias[o];
            for (int i = 0; i < c; i++) sum += inp[b * c + i] * w[o * c + i];
            out[b * oc + o] = sum;
        }
}

/* dinp may be NULL: the input has no gradient (the batch itself). */
static void matmul_backward(float *dinp, int acc, float *dw, float *dbias, const float *dout,
                            const float *inp, const float *w, int nb, int c, int oc)
{
    for (int b = 0; b < nb; b++) {
        for (int o = 0; o < oc; o++) {
            float d = dout[b * oc + o];
            dbias[o] += d;
            for (int i = 0; i < c; i++) dw[o * c + i] += d * inp[b * c + i];
        }
        if (!dinp) continue;
        for (int i = 0; i < c; i++) {
            float sum = acc ? dinp[b * c + i] : 0.0f;
            for (int o = 0; o < oc; o++) sum += dout[b * oc + o] * w[o * c + i];
            dinp[b * c + i] = sum;
        }
    }
}

static void relu_forward(float *out, const float *inp, int n)
{
    for (int i = 0; i < n; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

/* Reads the output, not the input: that is why relu saves its output. */
static void relu_backward(float *dinp, int acc, const float *dout, const float *out, int n)
{
    for (int i = 0; i < n; i++) {
        float d = out[i] > 0.0f ? dout[i] : 0.0f;
        dinp[i] = acc ? dinp[i] + d : d;
    }
}

/* losses[b] = logsumexp(logits[b]) - logits[b][target]. lse is a workspace
 * of nb floats. probs (the saved state, NULL when not saving) gets softmax. */
static void crossentropy_forward(float *losses, float *probs, float *lse, const float *logits,
                                 const int32_t *targets, int nb, int nc)
{
    for (int b = 0; b < nb; b++) {
        const float *row = logits + b * nc;
        float max = row[0];
        for (int i = 1; i < nc; i++) max = row[i] > max ? row[i] : max;
        float sum = 0.0f;
        for (int i = 0; i < nc; i++) sum += expf(row[i] - max);
        lse[b] = max + logf(sum);
    }
    for (int b = 0; b < nb; b++) {
        losses[b] = lse[b] - logits[b * nc + targets[b]];
        if (!probs) continue;
        for (int i = 0; i < nc; i++) probs[b * nc + i] = expf(logits[b * nc + i] - lse[b]);
    }
}

static void crossentropy_backward(float *dlogits, int acc, const float *dlosses, const float *probs,
                                  const int32_t *targets, int nb, int nc)
{
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < nc; i++) {
            float d = (probs[b * nc + i] - (i == targets[b] ? 1.0f : 0.0f)) * dlosses[b];
            dlogits[b * nc + i] = acc ? dlogits[b * nc + i] + d : d;
        }
}

/* ---------------------------------------------------------------------------
 * Counting allocator: each block remembers its size, so frees are exact.
 * ------------------------------------------------------------------------- */

typedef struct Counter {
    size_t cur, peak;
} Counter;

typedef union Header {
    size_t bytes;
    max_align_t align;
} Header;

static void *counted_alloc(Counter *c, size_t bytes)
{
    Header *h = malloc(sizeof(Header) + bytes);
    if (!h) return NULL;
    h->bytes = bytes;
    c->cur += bytes;
    if (c->cur > c->peak) c->peak = c->cur;
    return h + 1;
}

static void counted_free(Counter *c, void *p)
{
    if (!p) return;
    Header *h = (Header *)p - 1;
    c->cur -= h->bytes;
    free(h);
}

/* ---------------------------------------------------------------------------
 * The model and its graph
 * ------------------------------------------------------------------------- */

typedef enum OpKind { OP_MATMUL, OP_RELU, OP_LOSS } OpKind;

typedef struct Host {
    int layers;
    int inplace;           /* --inplace: ReLU and its backward run in place */
    float *params, *grads; /* host memory: weights then biases of every layer */
    size_t num_params;
    float *w[MAX_LAYERS], *b[MAX_LAYERS], *dw[MAX_LAYERS], *db[MAX_LAYERS];
    rkm_graph *g;
    OpKind kind[MAX_OPS];
    int layer[MAX_OPS];
    size_t bytes[MAX_TENSORS];  /* activation sizes, from the shapes */
    void *act[MAX_TENSORS];     /* live activations (inputs included) */
    void *grad[MAX_TENSORS];    /* live activation gradients */
    void *saved[MAX_OPS];       /* live saved states: the loss keeps its probs */
    double copy_bw;             /* --copy: bytes a second each way; 0: no link */
    void *host_act[MAX_TENSORS];/* host copies (offloading) of activations */
    void *host_saved[MAX_OPS];  /* and of saved states */
    Counter host_mem;           /* their bytes */
    copier cp;                  /* --copy: the copy threads */
    uint64_t copy[MAX_TENSORS + MAX_OPS]; /* per tensor, then op: its copy in flight (copier_start's ticket) */
    int32_t x, targets, losses; /* tensor ids */
    float *batch_x;             /* the batch, host's copy: filled into each run's inputs */
    int32_t *batch_targets;
    Counter mem;                /* --memory malloc */
    rkm_arena_exec *ax;         /* --memory arena: the exec of the step in progress */
    void *base;                 /* its region */
    double loss;
} Host;

static int layer_in(int l) { return l == 0 ? IN_DIM : HIDDEN; }
static int layer_out(const Host *h, int l) { return l == h->layers - 1 ? CLASSES : HIDDEN; }
static size_t floats(size_t n) { return n * sizeof(float); }

/* Rough costs: 10 GFLOP/s for matmuls, 10 GB/s for the rest. A backward
 * matmul does twice the forward's work. */
static double matmul_seconds(int c, int oc) { return 2.0 * BATCH * c * oc / 1e10; }
static double stream_seconds(size_t bytes) { return (double)bytes / 1e10; }

static uint32_t rng_state = 0x2545f491u;
static float rng_uniform(void) /* in [-1, 1), xorshift32 */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

static int init_params(Host *h)
{
    size_t n = 0;
    for (int l = 0; l < h->layers; l++) n += (size_t)layer_out(h, l) * (layer_in(l) + 1);
    h->num_params = n;
    h->params = malloc(floats(n));
    h->grads = malloc(floats(n));
    if (!h->params || !h->grads) return 0;
    float *p = h->params, *d = h->grads;
    for (int l = 0; l < h->layers; l++) {
        int c = layer_in(l), oc = layer_out(h, l);
        h->w[l] = p, h->dw[l] = d, p += c * oc, d += c * oc;
        h->b[l] = p, h->db[l] = d, p += oc, d += oc;
        float scale = sqrtf(6.0f / (float)c); /* He init: keeps ReLU signals alive */
        for (int i = 0; i < c * oc; i++) h->w[l][i] = scale * rng_uniform();
        for (int i = 0; i < oc; i++) h->b[l][i] = 0.0f;
    }
    return 1;
}

static int32_t add_tensor(Host *h, const char *name, size_t bytes, unsigned flags)
{
    int32_t id;
    if (rkm_graph_add_tensor(h->g, name, bytes, flags, &id) != RKM_OK) return -1;
    h->bytes[id] = bytes;
    return id;
}

static int add_op(Host *h, OpKind kind, int layer, const rkm_op_desc *d)
{
    int32_t id;
    if (rkm_graph_add_op(h->g, d, &id) != RKM_OK) return 0;
    h->kind[id] = kind;
    h->layer[id] = layer;
    return 1;
}

/* One matmul layer (and its ReLU unless it is the last); returns the tensor
 * the next layer reads, -1 on error. */
static int32_t build_layer(Host *h, int l, int32_t inp)
{
    char name[32];
    int c = layer_in(l), oc = layer_out(h, l), last = l == h->layers - 1;
    size_t bytes = floats((size_t)BATCH * oc);
    snprintf(name, sizeof name, last ? "logits" : "fc%d", l);
    int32_t out = add_tensor(h, name, bytes, 0);
    if (out < 0) return -1;
    snprintf(name, sizeof name, "fc%d", l);
    /* The backward reads the input (for dW) and the weights (host's). */
    rkm_op_desc fc = {.name = name, .fwd_seconds = matmul_seconds(c, oc),
                      .bwd_seconds = 2 * matmul_seconds(c, oc), .in = &inp, .n_in = 1,
                      .out = &out, .n_out = 1, .saved = &inp, .n_saved = 1};
    if (!add_op(h, OP_MATMUL, l, &fc)) return -1;
    if (last) return out;
    snprintf(name, sizeof name, "relu%d", l);
    int32_t act = add_tensor(h, name, bytes, 0);
    if (act < 0) return -1;
    rkm_op_desc relu = {.name = name, .fwd_seconds = stream_seconds(2 * bytes),
                        .bwd_seconds = stream_seconds(3 * bytes), .in = &out, .n_in = 1,
                        .out = &act, .n_out = 1, .saved = &act, .n_saved = 1,
                        /* elementwise both ways: it can write its output over its input,
                         * and grad(input) over grad(output) */
                        .flags = h->inplace ? RKM_OP_INPLACE | RKM_OP_GRAD_INPLACE : 0};
    return add_op(h, OP_RELU, l, &relu) ? act : -1;
}

static int build_graph(Host *h, rkm_context *ctx)
{
    if (rkm_graph_create(ctx, &h->g) != RKM_OK) return 0;
    h->x = add_tensor(h, "x", floats((size_t)BATCH * IN_DIM), RKM_TENSOR_INPUT);
    h->targets = add_tensor(h, "targets", BATCH * sizeof(int32_t), RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD);
    if (h->x < 0 || h->targets < 0) return 0;
    int32_t t = h->x;
    for (int l = 0; l < h->layers && t >= 0; l++) t = build_layer(h, l, t);
    if (t < 0 || (h->losses = add_tensor(h, "losses", floats(BATCH), 0)) < 0) return 0;
    /* Softmax probabilities are kept for the backward only (a phantom);
     * the forward needs a per-row logsumexp as workspace. */
    int32_t in[2] = {t, h->targets};
    size_t probs = floats((size_t)BATCH * CLASSES);
    rkm_op_desc ce = {.name = "crossentropy", .fwd_seconds = stream_seconds(3 * probs),
                      .bwd_seconds = stream_seconds(3 * probs), .in = in, .n_in = 2,
                      .out = &h->losses, .n_out = 1, .saved = &h->targets, .n_saved = 1,
                      .phantom = probs, .fwd_ws = floats(BATCH)};
    rkm_copy_desc copy = {h->copy_bw, h->copy_bw, 0};
    return add_op(h, OP_LOSS, h->layers, &ce) && rkm_graph_set_loss(h->g, h->losses) == RKM_OK &&
           rkm_graph_set_copy(h->g, &copy) == RKM_OK && rkm_graph_finalize(h->g) == RKM_OK;
}

/* The batch: random inputs and classes, the same every step. */
static int init_batch(Host *h)
{
    float *x = h->batch_x = malloc(h->bytes[h->x]);
    int32_t *targets = h->batch_targets = malloc(h->bytes[h->targets]);
    if (!x || !targets) return 0;
    for (int i = 0; i < BATCH * IN_DIM; i++) x[i] = rng_uniform();
    for (int b = 0; b < BATCH; b++) targets[b] = (int32_t)(rng_state++ % CLASSES);
    return 1;
}

/* The batch into the input buffers at x and targets. */
static void fill_inputs(const Host *h, void *x, void *targets)
{
    memcpy(x, h->batch_x, h->bytes[h->x]);
    memcpy(targets, h->batch_targets, h->bytes[h->targets]);
}

/* --memory malloc: the inputs, counted and live for the whole run. */
static int alloc_inputs(Host *h)
{
    h->act[h->x] = counted_alloc(&h->mem, h->bytes[h->x]);
    h->act[h->targets] = counted_alloc(&h->mem, h->bytes[h->targets]);
    if (!h->act[h->x] || !h->act[h->targets]) return 0;
    fill_inputs(h, h->act[h->x], h->act[h->targets]);
    return 1;
}

/* ---------------------------------------------------------------------------
 * Callbacks. Non-zero returns name what went wrong: 1 out of memory, 2 the
 * executor's flags disagree with the host's buffers (a buffer it should have
 * kept is missing, or one it calls new is live already).
 * ------------------------------------------------------------------------- */

/* A buffer the step creates: where the arena exec has carved it (its
 * offset `off`), or from the counting allocator. */
static int alloc_new(Host *h, void **slot, size_t bytes, uint64_t off)
{
    if (*slot) return 2;
    if (h->ax) return (*slot = rkm_arena_ptr(h->base, off)) ? 0 : 2;
    return (*slot = counted_alloc(&h->mem, bytes)) ? 0 : 1;
}

/* A run in place: *to takes over the live buffer *from, which the kernel
 * reads and overwrites; the caller clears *from after the kernel. The
 * arena exec moves its own offsets the same way. */
static int take_over(void **to, void *const *from)
{
    if (*to || !*from) return 2;
    *to = *from;
    return 0;
}

/* A buffer a free step releases (the arena exec takes it back itself). */
static int release(Host *h, void **slot)
{
    if (!*slot) return 2;
    if (!h->ax) counted_free(&h->mem, *slot);
    *slot = NULL;
    return 0;
}

/* The call's workspace: from the arena (released when the call returns) or
 * counted (the caller frees it with end_scratch). */
static void *scratch(Host *h, uint64_t bytes)
{
    uint64_t off;
    if (!h->ax) return counted_alloc(&h->mem, bytes);
    return rkm_arena_exec_scratch(h->ax, bytes, &off) == RKM_OK ? rkm_arena_ptr(h->base, off) : NULL;
}

static void end_scratch(Host *h, void *p)
{
    if (!h->ax) counted_free(&h->mem, p);
}

static int on_forward(void *user, const rkm_fwd_call *call)
{
    Host *h = user;
    int32_t out = call->out[0];
    int rc = call->out_new[0] == RKM_OUT_NEW ? alloc_new(h, &h->act[out], h->bytes[out], rkm_arena_exec_tensor(h->ax, out))
             : call->out_new[0] == RKM_OUT_INPLACE ? take_over(&h->act[out], &h->act[call->in[0]])
                                                   : 0;
    if (rc) return rc;
    const float *inp = h->act[call->in[0]];
    if (!inp || !h->act[out]) return 2;
    int l = h->layer[call->op];
    switch (h->kind[call->op]) {
    case OP_MATMUL:
        matmul_forward(h->act[out], inp, h->w[l], h->b[l], BATCH, layer_in(l), layer_out(h, l));
        return 0;
    case OP_RELU:
        relu_forward(h->act[out], inp, BATCH * HIDDEN);
        if (call->out_new[0] == RKM_OUT_INPLACE) h->act[call->in[0]] = NULL; /* now out's */
        return 0;
    case OP_LOSS: break;
    }
    if (call->save &&
        (rc = alloc_new(h, &h->saved[call->op], call->phantom, rkm_arena_exec_saved(h->ax, call->op))))
        return rc;
    float *probs = call->save ? h->saved[call->op] : NULL;
    float *lse = scratch(h, call->ws_bytes); /* the declared workspace: B floats */
    if (!lse) return 1;
    crossentropy_forward(h->act[out], probs, lse, inp, h->act[h->targets], BATCH, CLASSES);
    end_scratch(h, lse);
    return 0;
}

static int on_backward(void *user, const rkm_bwd_call *call)
{
    Host *h = user;
    int32_t in = call->in[0], out = call->out[0];
    int inplace = call->in_grad[0] == RKM_GRAD_INPLACE;
    int rc = call->in_grad[0] == RKM_GRAD_NEW ? alloc_new(h, &h->grad[in], h->bytes[in], rkm_arena_exec_grad(h->ax, in))
             : inplace                        ? take_over(&h->grad[in], &h->grad[out])
                                              : 0;
    if (rc) return rc;
    float *dinp = call->in_grad[0] == RKM_GRAD_NONE ? NULL : h->grad[in];
    int acc = call->in_grad[0] == RKM_GRAD_ACCUMULATE;
    const float *dout = h->grad[out];
    if (!dout || (call->in_grad[0] != RKM_GRAD_NONE && !dinp)) return 2;
    int l = h->layer[call->op];
    switch (h->kind[call->op]) {
    case OP_MATMUL:
        if (!h->act[in]) return 2;
        matmul_backward(dinp, acc, h->dw[l], h->db[l], dout, h->act[in], h->w[l], BATCH,
                        layer_in(l), layer_out(h, l));
        return 0;
    case OP_RELU:
        if (!h->act[out] || !dinp) return 2;
        relu_backward(dinp, acc, dout, h->act[out], BATCH * HIDDEN);
        if (inplace) h->grad[out] = NULL; /* now grad(in)'s */
        return 0;
    case OP_LOSS:
        if (!h->saved[call->op] || !dinp) return 2;
        crossentropy_backward(dinp, acc, dout, h->saved[call->op], h->act[h->targets], BATCH, CLASSES);
        return 0;
    }
    return 2;
}

/* grad(loss) = 1/B for each example: the loss is the batch mean. */
static int on_loss(void *user, const rkm_buffer_call *call)
{
    Host *h = user;
    int32_t tensor = call->index;
    const float *losses = h->act[tensor];
    int rc = alloc_new(h, &h->grad[tensor], h->bytes[tensor], rkm_arena_exec_grad(h->ax, tensor));
    if (rc) return rc;
    if (!losses) return 2;
    float *d = h->grad[tensor];
    double sum = 0.0;
    for (int b = 0; b < BATCH; b++) sum += losses[b], d[b] = 1.0f / BATCH;
    h->loss = sum / BATCH;
    return 0;
}

static int on_free_tensor(void *user, const rkm_buffer_call *call)
{
    Host *h = user;
    return release(h, &h->act[call->index]);
}

static int on_free_saved(void *user, const rkm_buffer_call *call)
{
    Host *h = user;
    return release(h, &h->saved[call->index]);
}

static int on_free_grad(void *user, const rkm_buffer_call *call)
{
    Host *h = user;
    return release(h, &h->grad[call->index]);
}

/* Offloading: a host copy per activation or saved state, filled by
 * offload on the device-to-host thread, copied back into the new device
 * buffer by prefetch on the other, released by free_host; wait blocks
 * until the copy is done. */
static void **host_slot(Host *h, const rkm_copy_call *c)
{
    return c->saved ? &h->host_saved[c->index] : &h->host_act[c->index];
}

static uint64_t *copy_slot(Host *h, const rkm_copy_call *c)
{
    return &h->copy[(c->saved ? MAX_TENSORS : 0) + c->index];
}

static int on_offload(void *user, const rkm_copy_call *call)
{
    Host *h = user;
    void **host = host_slot(h, call), *dev = call->saved ? h->saved[call->index] : h->act[call->index];
    if (*host || !dev) return 2;
    if (!(*host = counted_alloc(&h->host_mem, call->bytes))) return 1;
    *copy_slot(h, call) = copier_start(&h->cp, COPIER_D2H, *host, dev, call->bytes);
    return 0;
}

static int on_prefetch(void *user, const rkm_copy_call *call)
{
    Host *h = user;
    int32_t i = call->index;
    void **host = host_slot(h, call), **dev = call->saved ? &h->saved[i] : &h->act[i];
    uint64_t off = call->saved ? rkm_arena_exec_saved(h->ax, i) : rkm_arena_exec_tensor(h->ax, i);
    int rc = *host ? alloc_new(h, dev, call->bytes, off) : 2;
    if (!rc) *copy_slot(h, call) = copier_start(&h->cp, COPIER_H2D, *dev, *host, call->bytes);
    return rc;
}

static int on_wait(void *user, const rkm_copy_call *call)
{
    Host *h = user;
    copier_wait(&h->cp, *copy_slot(h, call));
    return 0;
}

static int on_free_host(void *user, const rkm_copy_call *call)
{
    Host *h = user;
    void **host = host_slot(h, call);
    if (!*host) return 2;
    counted_free(&h->host_mem, *host);
    *host = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------- */

typedef struct Measured {
    double loss;
    size_t peak;
    size_t host_peak; /* host copies (offloading) */
    uint64_t arena; /* --memory arena: the bytes the exec's region holds; 0 with malloc */
} Measured;

/* A plan and, with --memory arena, the exec that runs it in a region of
 * its own (the batch copied into its inputs once). */
typedef struct Run {
    rkm_plan *plan;
    rkm_arena_exec *ax; /* NULL: --memory malloc */
    uint64_t budget;    /* what the plan was made for; 0 for the baseline */
} Run;

static rkm_callbacks host_callbacks(Host *h)
{
    rkm_callbacks cb = {.user = h, .forward = on_forward, .backward = on_backward, .loss = on_loss,
                        .free_tensor = on_free_tensor, .free_saved = on_free_saved, .free_grad = on_free_grad,
                        .offload = on_offload, .prefetch = on_prefetch, .wait = on_wait, .free_host = on_free_host};
    return cb;
}

/* The exec for run->plan (arena: 1): the plan's layout, its one
 * allocation, the batch in its inputs. 0 on failure. */
static int open_run(Host *h, Run *run, int arena)
{
    run->ax = NULL;
    if (!arena) return 1;
    rkm_callbacks cb = host_callbacks(h);
    rkm_arena_exec_desc d = {.graph = h->g, .plan = run->plan, .host = &cb, .allocate = 1};
    if (rkm_arena_exec_create(&d, &run->ax) != RKM_OK) return 0;
    void *base = rkm_arena_exec_base(run->ax);
    fill_inputs(h, rkm_arena_ptr(base, rkm_arena_exec_tensor(run->ax, h->x)),
                rkm_arena_ptr(base, rkm_arena_exec_tensor(run->ax, h->targets)));
    return 1;
}

/* One forward+backward under run->plan. Afterwards only the batch may be
 * live. */
static int run_step(Host *h, const Run *run, Measured *m)
{
    rkm_callbacks cb = host_callbacks(h);
    memset(h->grads, 0, floats(h->num_params));
    h->loss = NAN;
    h->ax = run->ax;
    h->base = rkm_arena_exec_base(run->ax);
    if (h->ax) {
        h->act[h->x] = rkm_arena_ptr(h->base, rkm_arena_exec_tensor(h->ax, h->x));
        h->act[h->targets] = rkm_arena_ptr(h->base, rkm_arena_exec_tensor(h->ax, h->targets));
    }
    h->mem.peak = h->mem.cur;
    h->host_mem.peak = h->host_mem.cur;
    rkm_result r = h->ax ? rkm_arena_exec_run(h->ax, run->plan) : rkm_plan_execute(run->plan, &cb);
    if (h->copy_bw > 0) copier_drain(&h->cp); /* a failed step's copies end before its buffers go */
    size_t cur = h->mem.cur, batch = h->bytes[h->x] + h->bytes[h->targets];
    m->peak = h->mem.peak;
    m->host_peak = h->host_mem.peak;
    m->arena = 0;
    if (h->ax) {
        rkm_arena_stats st;
        rkm_arena_exec_stats_get(h->ax, &st);
        cur = (size_t)st.current;
        m->peak = (size_t)st.peak;
        m->arena = st.capacity;
    }
    int clean = r == RKM_OK && cur == batch && h->host_mem.cur == 0;
    for (int i = 0; i < MAX_TENSORS; i++)
        clean &= (h->act[i] == NULL || i == h->x || i == h->targets) && h->grad[i] == NULL;
    for (int i = 0; i < MAX_OPS; i++) clean &= h->saved[i] == NULL;
    if (h->ax) { /* the arena's pointers: not the host's to free */
        memset(h->act, 0, sizeof h->act);
        memset(h->grad, 0, sizeof h->grad);
        memset(h->saved, 0, sizeof h->saved);
    }
    if (r != RKM_OK) {
        fprintf(stderr, "mlp: %s: %s\n", rkm_result_string(r), rkm_context_errmsg(rkm_graph_context(h->g)));
        return 0;
    }
    if (!clean) fprintf(stderr, "mlp: buffers left live after the step (%zu bytes)\n", cur - batch);
    m->loss = h->loss;
    return clean;
}

/* Whatever is still live: the batch, or what a failed step left. */
static void free_buffers(Host *h)
{
    for (int i = 0; i < MAX_TENSORS; i++) {
        counted_free(&h->mem, h->act[i]);
        counted_free(&h->mem, h->grad[i]);
    }
    for (int i = 0; i < MAX_OPS; i++) counted_free(&h->mem, h->saved[i]);
    for (int i = 0; i < MAX_TENSORS; i++) counted_free(&h->host_mem, h->host_act[i]);
    for (int i = 0; i < MAX_OPS; i++) counted_free(&h->host_mem, h->host_saved[i]);
}

static void sgd_update(Host *h, float lr)
{
    for (size_t i = 0; i < h->num_params; i++) h->params[i] -= lr * h->grads[i];
}

typedef struct Options {
    const char *budget; /* NULL: baseline only */
    rkm_algo algo;
    int steps, layers;
    int arena;          /* --memory arena (1, the default) or malloc (0) */
    int inplace;        /* --inplace */
    double copy_bw;     /* --copy */
} Options;

static int usage(FILE *f, int status)
{
    fprintf(f, "usage: mlp [--budget B] [--algo A] [--steps N] [--layers L] [--memory M] [--inplace] [--copy BW]\n"
                    "  B: bytes, 64KiB, 50%% (of the baseline's arena) or min\n"
                    "  A: default (rockmate), rockmate, rotor, sqrt, dtr, none, checkmate\n"
                    "     (checkmate needs lp_solve; without it rockmate has no ILP options)\n"
                    "  N: training steps (default 5); L: 2..%d layers (default 8)\n"
                    "  M: arena (default: one allocation per plan, the library's layout) or\n"
                    "     malloc (a counted malloc and free per buffer)\n"
                    "  --inplace: ReLU writes its output over its input, and its input's\n"
                    "     gradient over its output's (RKM_OP_INPLACE, RKM_OP_GRAD_INPLACE)\n"
                    "  --copy BW: a copy link to host memory of BW bytes a second each way:\n"
                    "     rockmate may offload there (memcpy, at once)\n",
            MAX_LAYERS);
    return status;
}

/* ctx names the algorithms ("default": the best the build has). */
static int parse_args(rkm_context *ctx, int argc, char **argv, Options *o)
{
    *o = (Options){NULL, RKM_ALGO_DEFAULT, 5, 8, 1, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--inplace")) {
            o->inplace = 1;
            continue;
        }
        if (!v) return 0;
        i++;
        if (!strcmp(a, "--budget")) o->budget = v;
        else if (!strcmp(a, "--algo")) {
            if (rkm_algo_from_name(ctx, v, &o->algo) != RKM_OK) return 0;
        } else if (!strcmp(a, "--steps") || !strcmp(a, "--layers")) {
            if (!arg_int(v, 0, INT_MAX, a[2] == 's' ? &o->steps : &o->layers)) return 0;
        } else if (!strcmp(a, "--copy")) {
            if (!arg_double(v, &o->copy_bw) || !(o->copy_bw > 0)) return 0;
        }
        else if (!strcmp(a, "--memory") && (!strcmp(v, "arena") || !strcmp(v, "malloc")))
            o->arena = !strcmp(v, "arena");
        else return 0;
    }
    return o->steps >= 1 && o->layers >= 2 && o->layers <= MAX_LAYERS;
}

/* A plan for the options (the planner keeps it within the budget), or NULL
 * with *status set. */
static rkm_plan *make_plan(const Host *h, const Options *o, const rkm_graph_stats *st, int *status, uint64_t *budget_out)
{
    rkm_context *ctx = rkm_graph_context(h->g);
    rkm_solve_desc sd = {.algo = o->algo};
    rkm_planner *pl = NULL;
    rkm_plan *plan = NULL;
    rkm_plan_stats ps;
    uint64_t budget;
    rkm_result r = rkm_planner_create(h->g, &sd, &pl);
    if (r == RKM_OK) {
        r = strcmp(o->budget, "min") ? rkm_parse_budget(h->g, o->budget, sd.alignment, &budget)
                                     : rkm_planner_min_budget(pl, &budget);
        if (r == RKM_OK) r = rkm_planner_solve(pl, budget, &plan);
    }
    rkm_planner_destroy(pl);
    if (r == RKM_OK) r = rkm_plan_stats_get(plan, &ps);
    if (r != RKM_OK) {
        fprintf(stderr, "mlp: %s: %s\n", rkm_result_string(r), rkm_context_errmsg(ctx));
        rkm_plan_destroy(plan);
        *status = r == RKM_ERROR_BUDGET ? 3 : r == RKM_ERROR_ARGUMENT ? 2 : 1;
        return NULL;
    }
    printf("%s plan for budget %s (%llu bytes): %zu steps, peak %.1f%% of the baseline's, arena %llu bytes "
           "(%s the budget), time overhead %.1f%%\n",
           rkm_algo_name(o->algo), o->budget, (unsigned long long)budget, rkm_plan_num_steps(plan),
           100.0 * (double)ps.peak / (double)st->baseline_peak, (unsigned long long)ps.arena_bytes,
           ps.arena_bytes <= budget ? "within" : "OVER", 100.0 * (ps.time / st->baseline_time - 1.0));
    *budget_out = budget;
    return plan;
}

/* Runs `plan` once and compares the measured peak with the simulated one
 * (the plan's own figure, fixed when it was made); with --memory arena, the
 * region the step ran in is the plan's arena, within its budget. */
static int checked_step(Host *h, const Run *run, const char *label, Measured *m)
{
    rkm_plan_stats ps;
    if (rkm_plan_stats_get(run->plan, &ps) != RKM_OK || !run_step(h, run, m)) return 0;
    int same = m->peak == ps.peak && m->host_peak == ps.host_peak;
    int fits = !m->arena || (m->arena == ps.arena_bytes && (!run->budget || m->arena <= run->budget));
    printf("  %-9s loss %.6f  activation peak: measured %zu, simulated %llu bytes%s  time %.3g s\n",
           label, m->loss, m->peak, (unsigned long long)ps.peak, same ? "" : "  MISMATCH", ps.time);
    if (ps.offloads)
        printf("  %-9s %zu offloads, host peak: measured %zu, simulated %llu bytes; waits %.3g s\n", "", ps.offloads,
               m->host_peak, (unsigned long long)ps.host_peak, ps.wait_seconds);
    if (m->arena)
        printf("  %-9s arena %llu bytes (the one allocation)%s%s\n", "", (unsigned long long)m->arena,
               run->budget ? (m->arena <= run->budget ? ", within the budget" : ", OVER THE BUDGET") : "",
               fits ? "" : "  MISMATCH");
    return same && fits;
}

/* Warnings (a solver timeout, a fallback). Failed calls are reported by
 * their callers, with what was being done. */
static void warn_logger(void *user, rkm_log_level level, const char *msg)
{
    (void)user;
    if (level != RKM_LOG_ERROR) fprintf(stderr, "rockmate: %s\n", msg);
}

/* FNV-1a over n bytes: the run's digest of losses and gradients. */
static uint64_t digest_add(uint64_t d, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) d = (d ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return d;
}

static int train(Host *h, const Options *o, const Run *baseline, const Run *plan, uint64_t *digest)
{
    float *ref = plan ? malloc(floats(h->num_params)) : NULL;
    int ok = !plan || ref;
    for (int s = 1; s <= o->steps && ok; s++) {
        Measured mb, mp;
        printf("step %d\n", s);
        ok = checked_step(h, baseline, "baseline", &mb);
        *digest = digest_add(digest_add(*digest, &mb.loss, sizeof mb.loss), h->grads, floats(h->num_params));
        if (ok && plan) {
            memcpy(ref, h->grads, floats(h->num_params));
            ok = checked_step(h, plan, rkm_algo_name(o->algo), &mp);
            int same = ok && memcmp(&mp.loss, &mb.loss, sizeof mb.loss) == 0 &&
                       memcmp(ref, h->grads, floats(h->num_params)) == 0;
            printf("  loss and gradients %s the baseline's, bit for bit\n", same ? "equal" : "DIFFER FROM");
            ok = ok && same;
        }
        sgd_update(h, 0.05f);
    }
    free(ref);
    return ok;
}

int main(int argc, char **argv)
{
    Options o;
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) return usage(stdout, 0);
    rkm_context_desc cd = {.log = warn_logger};
    rkm_context *ctx = NULL;
    if (rkm_context_create(&cd, &ctx) != RKM_OK) return 1;
    if (!parse_args(ctx, argc, argv, &o)) {
        rkm_context_destroy(ctx);
        return usage(stderr, 2);
    }
    static Host host;
    Host *h = &host;
    h->layers = o.layers;
    h->inplace = o.inplace;
    if (o.copy_bw > 0 && copier_open(&h->cp, o.copy_bw, 0.0)) {
        fprintf(stderr, "mlp: cannot start the copy threads\n");
        rkm_context_destroy(ctx);
        return 1;
    }
    h->copy_bw = o.copy_bw;
    int status = 1;
    Run baseline = {NULL, NULL, 0}, plan = {NULL, NULL, 0};
    rkm_graph_stats st;
    uint64_t digest = 0xcbf29ce484222325ull;
    if (!init_params(h) || !build_graph(h, ctx) || !init_batch(h) || (!o.arena && !alloc_inputs(h)) ||
        rkm_graph_stats_get(h->g, &st) != RKM_OK || rkm_plan_baseline(h->g, &baseline.plan) != RKM_OK ||
        !open_run(h, &baseline, o.arena)) {
        fprintf(stderr, "mlp: setup failed: %s\n", rkm_context_errmsg(ctx));
        goto done;
    }
    printf("mlp: %d layers, batch %d, %d ops, %d tensors, %d blocks; baseline peak %llu bytes (batch %llu); "
           "memory: %s\n",
           h->layers, BATCH, rkm_graph_num_ops(h->g), rkm_graph_num_tensors(h->g), st.blocks,
           (unsigned long long)st.baseline_peak, (unsigned long long)st.input_bytes,
           o.arena ? "one arena per plan" : "malloc per buffer");
    if (o.budget && !(plan.plan = make_plan(h, &o, &st, &status, &plan.budget))) goto done;
    if (plan.plan && !open_run(h, &plan, o.arena)) {
        fprintf(stderr, "mlp: arena: %s\n", rkm_context_errmsg(ctx));
        goto done;
    }
    status = train(h, &o, &baseline, plan.plan ? &plan : NULL, &digest) ? 0 : 1;
    printf("mlp: %s, digest %016llx\n", status ? "FAILED" : "all checks passed", (unsigned long long)digest);
done:
    rkm_arena_exec_destroy(plan.ax);
    rkm_arena_exec_destroy(baseline.ax);
    rkm_plan_destroy(plan.plan);
    rkm_plan_destroy(baseline.plan);
    if (h->copy_bw > 0) copier_close(&h->cp);
    free_buffers(h);
    rkm_graph_destroy(h->g);
    rkm_context_destroy(ctx);
    free(h->params);
    free(h->grads);
    free(h->batch_x);
    free(h->batch_targets);
    return status;
}
