/* graph.c -- the graph builder: tensors, ops, their checks; lifetimes; queries
 *
 * Uses (through internal.h): base.c. */
#include "internal.h"

/* The most a forward of o holds transiently: its workspace, and its scratch
 * on a run that keeps no saved state. Fits in 64 bits (rkm__bytes_fit). */
RKM__PRIVATE uint64_t rkm__fwd_ws_most(const rkm__op *o) { return o->fwd_ws + o->scratch; }

RKM__PRIVATE const char *rkm__tensor_name_of(const void *g, int32_t id) { return ((const rkm_graph *)g)->tensors[id].name; }
static const char *rkm__op_name_of(const void *g, int32_t id) { return ((const rkm_graph *)g)->ops[id].name; }

/* Graph error: prefixes "source:line: " when a reader is active. */
RKM__PRIVATE rkm_result rkm__gerr(const rkm_graph *g, rkm_result code, int32_t line, const char *fmt, ...)
{
    char msg[RKM__ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g->src_name && line > 0) return rkm__err(g->ctx, code, "%s:%d: %s", g->src_name, (int)line, msg);
    return rkm__err(g->ctx, code, "%s", msg);
}

RKM__PRIVATE int rkm__name_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == ':' || c == '/' || c == '[' || c == ']' || c == '-'))
            return 0;
    }
    return n > 0 && n <= RKM__NAME_MAX;
}

rkm_result rkm_graph_create(rkm_context *ctx, rkm_graph **out)
{
    if (!out) return ctx ? rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_graph_create: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!ctx) return RKM_ERROR_ARGUMENT;
    rkm_graph *g = rkm__calloc(ctx, 1, sizeof *g);
    if (!g) return rkm__nomem(ctx, "rkm_graph_create");
    g->ctx = ctx;
    g->loss = -1;
    rkm__ctx_hold(ctx);
    *out = g;
    return RKM_OK;
}

RKM__PRIVATE void rkm__graph_free_blocks(rkm_graph *g)
{
    rkm__free(g->ctx, g->blocks, (size_t)g->n_blocks * sizeof *g->blocks);
    rkm__free(g->ctx, g->block_ops, g->n_ops * sizeof *g->block_ops);
    g->blocks = NULL;
    g->block_ops = NULL;
    g->n_blocks = g->n_classes = 0;
}

static void rkm__graph_free(rkm_graph *g)
{
    rkm_context *ctx = g->ctx;
    for (size_t i = 0; i < g->n_tensors; i++) rkm__strfree(ctx, g->tensors[i].name);
    for (size_t i = 0; i < g->n_ops; i++) {
        rkm__op *o = &g->ops[i];
        rkm__strfree(ctx, o->name);
        rkm__free(ctx, o->in, (size_t)(o->n_in + o->n_out + o->n_saved) * sizeof(int32_t));
    }
    rkm__graph_free_blocks(g);
    rkm__free(ctx, g->tensors, g->cap_tensors * sizeof *g->tensors);
    rkm__free(ctx, g->ops, g->cap_ops * sizeof *g->ops);
    rkm__map_free(ctx, &g->tensor_map);
    rkm__map_free(ctx, &g->op_map);
    rkm__ctx_free_holder(ctx, g, sizeof *g);
}

/* The count is bookkeeping, not content, so it changes through the const
 * pointers that plans and planners keep (one thread at a time: the
 * objects of one context are used so). */
RKM__PRIVATE void rkm__graph_hold(const rkm_graph *g) { ((rkm_graph *)g)->live++; }

RKM__PRIVATE void rkm__graph_release(const rkm_graph *g)
{
    rkm_graph *m = (rkm_graph *)g;
    if (--m->live == 0 && m->destroyed) rkm__graph_free(m);
}

RKM__PRIVATE void rkm__graph_free_holder(rkm_context *ctx, void *holder, size_t size, const rkm_graph *g)
{
    rkm__free(ctx, holder, size);
    rkm__graph_release(g); /* last: it may free g, and ctx with it */
}

RKM__PRIVATE void rkm__graph_rehold(const rkm_graph **slot, const rkm_graph *g)
{
    rkm__graph_hold(g);
    rkm__graph_release(*slot);
    *slot = g;
}

/* Deferred while plans, planners or arena execs made from it live (as
 * sqlite3_close_v2): the last one's destroy frees the graph. */
void rkm_graph_destroy(rkm_graph *g)
{
    if (!g) return;
    if (g->live) g->destroyed = 1;
    else rkm__graph_free(g);
}

RKM__PRIVATE rkm_result rkm__check_builder(const rkm_graph *g, const char *fn)
{
    if (g->finalized) return rkm__err(g->ctx, RKM_ERROR_STATE, "%s: the graph is finalized and read-only", fn);
    return RKM_OK;
}

rkm_result rkm_graph_add_tensor(rkm_graph *g, const char *name, uint64_t bytes, unsigned flags, int32_t *id)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    int32_t line = g->src_line;
    rkm_result r = rkm__check_builder(g, "rkm_graph_add_tensor");
    if (r) return r;
    if (!name) return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "tensor: name is NULL");
    if (!rkm__name_ok(name))
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "tensor '%.64s': a name is 1 to 255 characters of [A-Za-z0-9_.:/[]-]", name);
    if (flags & ~(RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD | RKM_TENSOR_INPUT_GRAD))
        return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "tensor %s: unknown flags 0x%x", name, flags);
    if ((flags & RKM_TENSOR_INPUT_GRAD) && (flags & RKM_TENSOR_NOGRAD || !(flags & RKM_TENSOR_INPUT)))
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "tensor %s: grad is for an input that has a gradient (a pipeline "
                         "stage's input: `input grad`), so it %s", name,
                         flags & RKM_TENSOR_NOGRAD ? "cannot be nograd" : "needs input");
    if (g->loss >= 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "tensor %s: nothing may follow the loss statement", name);
    if (rkm__map_find(&g->tensor_map, name, rkm__tensor_name_of, g) >= 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "tensor %s: declared twice (tensor names are unique)", name);
    if (g->n_tensors >= INT32_MAX - 1) return rkm__gerr(g, RKM_ERROR_GRAPH, line, "tensor %s: too many tensors", name);
    if (!rkm__reserve(g->ctx, (void **)&g->tensors, &g->cap_tensors, g->n_tensors + 1, sizeof *g->tensors))
        return rkm__nomem(g->ctx, "rkm_graph_add_tensor");
    rkm__tensor *t = &g->tensors[g->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = rkm__strdup(g->ctx, name);
    if (!t->name) return rkm__nomem(g->ctx, "rkm_graph_add_tensor");
    t->bytes = bytes;
    t->flags = flags;
    t->producer = -1;
    t->line = line;
    if (!rkm__map_insert(g->ctx, &g->tensor_map, (int32_t)g->n_tensors, rkm__tensor_name_of, g)) {
        rkm__strfree(g->ctx, t->name);
        return rkm__nomem(g->ctx, "rkm_graph_add_tensor");
    }
    if (id) *id = (int32_t)g->n_tensors;
    g->n_tensors++;
    return RKM_OK;
}

RKM__PRIVATE int rkm__list_has(const int32_t *list, int32_t n, int32_t x)
{
    for (int32_t i = 0; i < n; i++)
        if (list[i] == x) return 1;
    return 0;
}

/* Checks one of an op's tensor lists: ids in range, no repeats. */
static rkm_result rkm__check_list(const rkm_graph *g, int32_t line, const char *op, const char *what,
                                  const int32_t *list, int32_t n)
{
    if (n < 0 || (n > 0 && !list))
        return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "op %s: %s list is NULL or has a negative length", op, what);
    for (int32_t i = 0; i < n; i++) {
        if (list[i] < 0 || (size_t)list[i] >= g->n_tensors)
            return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "op %s: %s names tensor id %d, which does not exist", op, what,
                             (int)list[i]);
        if (rkm__list_has(list, i, list[i]))
            return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: %s names tensor %s twice", op, what,
                             g->tensors[list[i]].name);
    }
    return RKM_OK;
}

/* The in-place flags: known, on an op whose first input and first output
 * have one size, the forward's not over an input tensor. */
static rkm_result rkm__check_inplace(const rkm_graph *g, const rkm_op_desc *d, int32_t line)
{
    const char *nm = d->name;
    if (d->flags & ~(RKM_OP_INPLACE | RKM_OP_GRAD_INPLACE))
        return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "op %s: unknown flags 0x%x (RKM_OP_INPLACE, RKM_OP_GRAD_INPLACE)",
                         nm, d->flags & ~(RKM_OP_INPLACE | RKM_OP_GRAD_INPLACE));
    if (!d->flags) return RKM_OK;
    const char *what = d->flags & RKM_OP_INPLACE ? "inplace" : "grad_inplace";
    if (d->n_in == 0) return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: %s needs an input (in[0])", nm, what);
    const rkm__tensor *a = &g->tensors[d->in[0]], *b = &g->tensors[d->out[0]];
    if (a->bytes != b->bytes)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line,
                         "op %s: %s needs the first input and the first output of one size (%s is %llu bytes, %s %llu)",
                         nm, what, a->name, (unsigned long long)a->bytes, b->name, (unsigned long long)b->bytes);
    if ((d->flags & RKM_OP_INPLACE) && (a->flags & RKM_TENSOR_INPUT))
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: inplace over %s, an input (inputs are never overwritten)", nm,
                         a->name);
    return RKM_OK;
}

static rkm_result rkm__check_op_desc(const rkm_graph *g, const rkm_op_desc *d, int32_t line)
{
    const char *nm = d->name;
    if (!rkm__name_ok(nm))
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op '%.64s': a name is 1 to 255 characters of [A-Za-z0-9_.:/[]-]", nm);
    if (g->loss >= 0) return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: ops come before the loss statement", nm);
    if (rkm__map_find(&g->op_map, nm, rkm__op_name_of, g) >= 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: declared twice (op names are unique)", nm);
    if (!(d->fwd_seconds >= 0) || !(d->bwd_seconds >= 0) || !isfinite(d->fwd_seconds) || !isfinite(d->bwd_seconds))
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: fwd and bwd times are finite and non-negative", nm);
    rkm_result r;
    if ((r = rkm__check_list(g, line, nm, "in", d->in, d->n_in))) return r;
    if ((r = rkm__check_list(g, line, nm, "out", d->out, d->n_out))) return r;
    if ((r = rkm__check_list(g, line, nm, "saved", d->saved, d->n_saved))) return r;
    if (d->n_out == 0) return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: an op writes at least one tensor (out=)", nm);
    for (int32_t i = 0; i < d->n_in; i++) {
        const rkm__tensor *t = &g->tensors[d->in[i]];
        if (!(t->flags & RKM_TENSOR_INPUT) && t->producer < 0)
            return rkm__gerr(g, RKM_ERROR_GRAPH, line,
                             "op %s: reads %s, which is neither an input nor an output of an earlier op", nm, t->name);
    }
    for (int32_t i = 0; i < d->n_out; i++) {
        const rkm__tensor *t = &g->tensors[d->out[i]];
        if (t->flags & RKM_TENSOR_INPUT)
            return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: writes %s, which is an input (inputs have no producer)",
                             nm, t->name);
        if (t->producer >= 0)
            return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: writes %s, which op %s already writes (one producer per tensor)",
                             nm, t->name, g->ops[t->producer].name);
        if (rkm__list_has(d->in, d->n_in, d->out[i]))
            return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: %s is both read and written", nm, t->name);
    }
    for (int32_t i = 0; i < d->n_saved; i++)
        if (!rkm__list_has(d->in, d->n_in, d->saved[i]) && !rkm__list_has(d->out, d->n_out, d->saved[i]))
            return rkm__gerr(g, RKM_ERROR_GRAPH, line, "op %s: saved tensor %s is neither in in= nor in out=", nm,
                             g->tensors[d->saved[i]].name);
    if (d->scratch > d->phantom)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line,
                         "op %s: scratch=%llu is more than phantom=%llu (the scratch is the part of the phantom "
                         "written on every run)",
                         nm, (unsigned long long)d->scratch, (unsigned long long)d->phantom);
    return rkm__check_inplace(g, d, line);
}

rkm_result rkm_graph_add_op(rkm_graph *g, const rkm_op_desc *d, int32_t *id)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    int32_t line = g->src_line;
    rkm_result r = rkm__check_builder(g, "rkm_graph_add_op");
    if (r) return r;
    if (!d || !d->name) return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "rkm_graph_add_op: desc or its name is NULL");
    if ((r = rkm__check_op_desc(g, d, line))) return r;
    if (!rkm__reserve(g->ctx, (void **)&g->ops, &g->cap_ops, g->n_ops + 1, sizeof *g->ops))
        return rkm__nomem(g->ctx, "rkm_graph_add_op");
    rkm__op *o = &g->ops[g->n_ops];
    memset(o, 0, sizeof *o);
    size_t nl = (size_t)(d->n_in + d->n_out + d->n_saved);
    o->name = rkm__strdup(g->ctx, d->name);
    o->in = rkm__alloc(g->ctx, nl * sizeof(int32_t));
    if (!o->name || !o->in) {
        rkm__strfree(g->ctx, o->name);
        rkm__free(g->ctx, o->in, nl * sizeof(int32_t));
        return rkm__nomem(g->ctx, "rkm_graph_add_op");
    }
    int32_t *in = o->in;
    *o = (rkm__op){o->name, d->fwd_seconds, d->bwd_seconds, in, in + d->n_in, in + d->n_in + d->n_out, d->n_in,
                   d->n_out, d->n_saved, d->phantom, d->fwd_ws, d->bwd_ws, d->scratch, d->flags, line, 0};
    if (d->n_in) memcpy(o->in, d->in, (size_t)d->n_in * sizeof(int32_t));
    memcpy(o->out, d->out, (size_t)d->n_out * sizeof(int32_t));
    if (d->n_saved) memcpy(o->saved, d->saved, (size_t)d->n_saved * sizeof(int32_t));
    if (!rkm__map_insert(g->ctx, &g->op_map, (int32_t)g->n_ops, rkm__op_name_of, g)) {
        rkm__strfree(g->ctx, o->name);
        rkm__free(g->ctx, o->in, nl * sizeof(int32_t));
        return rkm__nomem(g->ctx, "rkm_graph_add_op");
    }
    for (int32_t i = 0; i < o->n_out; i++) g->tensors[o->out[i]].producer = (int32_t)g->n_ops;
    if (id) *id = (int32_t)g->n_ops;
    g->n_ops++;
    return RKM_OK;
}

rkm_result rkm_graph_set_copy(rkm_graph *g, const rkm_copy_desc *copy)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_builder(g, "rkm_graph_set_copy");
    if (r) return r;
    rkm_copy_desc c = {0, 0, 0};
    if (copy) c = *copy;
    int none = c.d2h_bytes_per_second == 0 && c.h2d_bytes_per_second == 0;
    int ok = none || (isfinite(c.d2h_bytes_per_second) && c.d2h_bytes_per_second > 0 &&
                      isfinite(c.h2d_bytes_per_second) && c.h2d_bytes_per_second > 0);
    if (!ok || !(isfinite(c.latency_seconds) && c.latency_seconds >= 0))
        return rkm__gerr(g, RKM_ERROR_ARGUMENT, g->src_line, "copy: d2h %g and h2d %g bytes/s, latency %g s (both "
                         "bandwidths positive and finite, or both 0; latency finite, >= 0)", c.d2h_bytes_per_second,
                         c.h2d_bytes_per_second, c.latency_seconds);
    g->copy = none ? (rkm_copy_desc){0, 0, 0} : c;
    return RKM_OK;
}

rkm_result rkm_graph_copy_get(const rkm_graph *g, rkm_copy_desc *out)
{
    if (out) memset(out, 0, sizeof *out); /* zeroed on every error (rockmate.h) */
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!out) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_copy_get: out is NULL");
    *out = g->copy;
    return RKM_OK;
}

/* The loss statement and the output statement: one tensor, set once, with
 * the same rules; `what` names the statement in messages. */
static rkm_result rkm__set_loss(rkm_graph *g, int32_t tensor, int output)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    const char *what = output ? "output" : "loss";
    int32_t line = g->src_line;
    rkm_result r = rkm__check_builder(g, output ? "rkm_graph_set_output" : "rkm_graph_set_loss");
    if (r) return r;
    if (g->loss >= 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "%s: %s (a graph has exactly one loss or output statement)", what,
                         g->output == output ? "given twice" : g->output ? "the graph has an output already"
                                                                          : "the graph has a loss already");
    if (tensor < 0 || (size_t)tensor >= g->n_tensors)
        return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "%s: tensor id %d does not exist", what, (int)tensor);
    const rkm__tensor *t = &g->tensors[tensor];
    if (t->flags & RKM_TENSOR_INPUT)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "%s: %s is an input tensor (the %s must be written by an op)", what,
                         t->name, what);
    if (t->producer < 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line,
                         "%s: %s is not produced by an op declared before it (the %s statement comes after the op "
                         "that writes the %s tensor, at the end)",
                         what, t->name, what, what);
    if (t->flags & RKM_TENSOR_NOGRAD)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "%s: %s is nograd (the %s must have a gradient)", what, t->name, what);
    g->loss = tensor;
    g->loss_line = line;
    g->output = output;
    return RKM_OK;
}

rkm_result rkm_graph_set_loss(rkm_graph *g, int32_t tensor) { return rkm__set_loss(g, tensor, 0); }
rkm_result rkm_graph_set_output(rkm_graph *g, int32_t tensor) { return rkm__set_loss(g, tensor, 1); }

RKM__PRIVATE rkm_result rkm__check_finalized(const rkm_graph *g, const char *fn)
{
    if (!g->finalized) return rkm__err(g->ctx, RKM_ERROR_STATE, "%s: the graph is not finalized", fn);
    return RKM_OK;
}

rkm_context *rkm_graph_context(const rkm_graph *g) { return g ? g->ctx : NULL; }
int rkm_graph_is_finalized(const rkm_graph *g) { return g ? g->finalized : 0; }
int32_t rkm_graph_num_tensors(const rkm_graph *g) { return g ? (int32_t)g->n_tensors : 0; }
int32_t rkm_graph_num_ops(const rkm_graph *g) { return g ? (int32_t)g->n_ops : 0; }
int32_t rkm_graph_loss(const rkm_graph *g) { return g ? g->loss : -1; }
int32_t rkm_graph_output(const rkm_graph *g) { return g && g->output ? g->loss : -1; }

int32_t rkm_graph_find_tensor(const rkm_graph *g, const char *name)
{
    return g && name ? rkm__map_find(&g->tensor_map, name, rkm__tensor_name_of, g) : -1;
}

int32_t rkm_graph_find_op(const rkm_graph *g, const char *name)
{
    return g && name ? rkm__map_find(&g->op_map, name, rkm__op_name_of, g) : -1;
}

/* What every info query checks: a graph, an output, an id in [0, n). The
 * output (size bytes) is zeroed first, so that every error leaves it so. */
static rkm_result rkm__info_args(const rkm_graph *g, void *out, size_t size, int32_t id, size_t n, const char *fn,
                                 const char *what)
{
    if (out) memset(out, 0, size);
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!out) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "%s: out is NULL", fn);
    if (id < 0 || (size_t)id >= n) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "%s: %s %d does not exist", fn, what, (int)id);
    return RKM_OK;
}

rkm_result rkm_graph_tensor_info(const rkm_graph *g, int32_t id, rkm_tensor_info *out)
{
    rkm_result r = rkm__info_args(g, out, sizeof *out, id, g ? g->n_tensors : 0, "rkm_graph_tensor_info", "tensor id");
    if (r) return r;
    const rkm__tensor *t = &g->tensors[id];
    *out = (rkm_tensor_info){t->name, t->bytes, t->flags, t->producer, t->has_grad, t->n_contrib};
    return RKM_OK;
}

rkm_result rkm_graph_op_info(const rkm_graph *g, int32_t id, rkm_op_desc *out)
{
    rkm_result r = rkm__info_args(g, out, sizeof *out, id, g ? g->n_ops : 0, "rkm_graph_op_info", "op id");
    if (r) return r;
    const rkm__op *o = &g->ops[id];
    *out = (rkm_op_desc){o->name, o->fwd, o->bwd, o->in, o->n_in, o->out, o->n_out, o->saved, o->n_saved,
                         o->phantom, o->fwd_ws, o->bwd_ws, o->scratch, o->flags};
    return RKM_OK;
}

rkm_result rkm_graph_block_info(const rkm_graph *g, int32_t b, rkm_block_info *out)
{
    if (out) memset(out, 0, sizeof *out); /* zeroed on every error (rockmate.h) */
    rkm_result r = g ? rkm__check_finalized(g, "rkm_graph_block_info") : RKM_ERROR_ARGUMENT;
    if (!r) r = rkm__info_args(g, out, sizeof *out, b, (size_t)g->n_blocks, "rkm_graph_block_info", "block");
    if (r) return r;
    const rkm__block *k = &g->blocks[b];
    *out = (rkm_block_info){k->ops, k->n_ops, k->in, k->out, k->cls};
    return RKM_OK;
}

