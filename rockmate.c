/* rockmate.c -- the whole library, in sections that follow the pipeline:
 *
 *   1. Base: context, allocator, errors, small containers
 *   2. Graph: builder, validation, gradients and backwards
 *   3. Graph files (.rkg): reader and writer
 *   4. Plans: steps, files (.rkp)
 *   5. Simulator: the one memory and time accounting
 *   6. Baseline plan and bounds
 *   7. Structure: separators, blocks, classes
 *   8. Block options: extremes, replay, dominance
 *   9. Block ILP (lp_solve)
 *  10. Chain DP
 *  11. Planner: algorithms, flattening, budgets
 *  12. Executor and profiler
 *
 * See rockmate.h for the public API and docs/formats.md for the contract. */
#if !defined(_POSIX_C_SOURCE) && !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif
#include "rockmate.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ===========================================================================
 * 1. Base: context, allocator, errors, small containers
 * ========================================================================= */

#define RKM_ERRMSG_SIZE 512
#define RKM_NAME_MAX 255

struct rkm_context {
    rkm_alloc_fn alloc;
    void *alloc_user;
    rkm_log_fn log;
    void *log_user;
    int log_level;
    char errmsg[RKM_ERRMSG_SIZE];
};

static void *rkm__default_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

static void *rkm__alloc(rkm_context *ctx, size_t size)
{
    if (size == 0) size = 1;
    return ctx->alloc(ctx->alloc_user, NULL, 0, size);
}

static void *rkm__calloc(rkm_context *ctx, size_t n, size_t elem)
{
    if (elem && n > SIZE_MAX / elem) return NULL;
    void *p = rkm__alloc(ctx, n * elem);
    if (p) memset(p, 0, n * elem ? n * elem : 1);
    return p;
}

static void *rkm__realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size)
{
    if (new_size == 0) new_size = 1;
    if (!ptr) old_size = 0;
    return ctx->alloc(ctx->alloc_user, ptr, old_size, new_size);
}

static void rkm__free(rkm_context *ctx, void *ptr, size_t size)
{
    if (ptr) ctx->alloc(ctx->alloc_user, ptr, size ? size : 1, 0);
}

/* Grow *p (an array of `elem`-byte items with capacity *cap) to hold `need`. */
static int rkm__reserve(rkm_context *ctx, void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 1;
    size_t ncap = *cap ? *cap : 8;
    while (ncap < need) ncap *= 2;
    if (ncap > SIZE_MAX / elem) return 0;
    void *np = rkm__realloc(ctx, *p, *cap * elem, ncap * elem);
    if (!np) return 0;
    *p = np;
    *cap = ncap;
    return 1;
}

static char *rkm__strdup(rkm_context *ctx, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = rkm__alloc(ctx, n);
    if (d) memcpy(d, s, n);
    return d;
}

static void rkm__strfree(rkm_context *ctx, char *s)
{
    if (s) rkm__free(ctx, s, strlen(s) + 1);
}

static void rkm__logv(rkm_context *ctx, rkm_log_level level, const char *fmt, va_list ap)
{
    if (!ctx->log || (int)level > ctx->log_level) return;
    char buf[RKM_ERRMSG_SIZE];
    vsnprintf(buf, sizeof buf, fmt, ap);
    ctx->log(ctx->log_user, level, buf);
}

static void rkm__log(rkm_context *ctx, rkm_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rkm__logv(ctx, level, fmt, ap);
    va_end(ap);
}

/* Record the message of a failed call and return its code. */
static rkm_result rkm__err(rkm_context *ctx, rkm_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->errmsg, sizeof ctx->errmsg, fmt, ap);
    va_end(ap);
    if (ctx->log && ctx->log_level >= RKM_LOG_ERROR) ctx->log(ctx->log_user, RKM_LOG_ERROR, ctx->errmsg);
    return code;
}

static rkm_result rkm__nomem(rkm_context *ctx, const char *where)
{
    return rkm__err(ctx, RKM_ERROR_NOMEM, "%s: out of memory", where);
}

static double rkm__now(void)
{
    struct timespec ts;
#if defined(CLOCK_MONOTONIC)
    clock_gettime(CLOCK_MONOTONIC, &ts);
#else
    timespec_get(&ts, TIME_UTC);
#endif
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Checked 64-bit add: returns 0 on overflow. */
static int rkm__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a > UINT64_MAX - b) return 0;
    *out = a + b;
    return 1;
}

const char *rkm_version(void) { return RKM_VERSION_STRING; }
int rkm_version_number(void) { return RKM_VERSION_NUMBER; }

const char *rkm_result_string(rkm_result r)
{
    static const char *const names[RKM_RESULT_COUNT] = {
        "ok",
        "out of memory",
        "invalid argument",
        "call not allowed in this state",
        "input/output error",
        "syntax error",
        "graph breaks a rule of the contract",
        "plan breaks a rule of the contract",
        "no plan fits the budget",
        "a host callback failed",
        "the ILP solver failed",
        "planning time ran out",
        "feature compiled out",
    };
    if ((int)r < 0 || r >= RKM_RESULT_COUNT) return "unknown result";
    return names[r];
}

rkm_result rkm_context_create(const rkm_context_desc *desc, rkm_context **out)
{
    if (!out) return RKM_ERROR_ARGUMENT;
    *out = NULL;
    rkm_context_desc d;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    if (!d.alloc) d.alloc = rkm__default_alloc;
    if (d.log_level == 0) d.log_level = RKM_LOG_WARN;
    rkm_context *ctx = d.alloc(d.alloc_user, NULL, 0, sizeof *ctx);
    if (!ctx) return RKM_ERROR_NOMEM;
    memset(ctx, 0, sizeof *ctx);
    ctx->alloc = d.alloc;
    ctx->alloc_user = d.alloc_user;
    ctx->log = d.log;
    ctx->log_user = d.log_user;
    ctx->log_level = d.log_level;
    *out = ctx;
    return RKM_OK;
}

void rkm_context_destroy(rkm_context *ctx)
{
    if (ctx) ctx->alloc(ctx->alloc_user, ctx, sizeof *ctx, 0);
}

const char *rkm_context_errmsg(const rkm_context *ctx) { return ctx ? ctx->errmsg : ""; }

/* A name -> id map: open addressing over FNV-1a hashes, ids index `names`. */
typedef struct rkm__map {
    int32_t *slots; /* -1 empty, else id */
    size_t cap;     /* power of two */
    size_t count;
} rkm__map;

static uint64_t rkm__hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

typedef const char *(*rkm__name_of)(const void *owner, int32_t id);

static int32_t rkm__map_find(const rkm__map *m, const char *name, rkm__name_of name_of, const void *owner)
{
    if (!m->cap) return -1;
    size_t mask = m->cap - 1;
    for (size_t i = (size_t)rkm__hash(name) & mask;; i = (i + 1) & mask) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        if (strcmp(name_of(owner, id), name) == 0) return id;
    }
}

/* Insert id (whose name is not yet in the map); 0 on allocation failure. */
static int rkm__map_insert(rkm_context *ctx, rkm__map *m, int32_t id, rkm__name_of name_of, const void *owner)
{
    if ((m->count + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        int32_t *ns = rkm__alloc(ctx, ncap * sizeof *ns);
        if (!ns) return 0;
        for (size_t i = 0; i < ncap; i++) ns[i] = -1;
        for (size_t i = 0; i < m->cap; i++) {
            int32_t e = m->slots[i];
            if (e < 0) continue;
            size_t j = (size_t)rkm__hash(name_of(owner, e)) & (ncap - 1);
            while (ns[j] >= 0) j = (j + 1) & (ncap - 1);
            ns[j] = e;
        }
        rkm__free(ctx, m->slots, m->cap * sizeof *m->slots);
        m->slots = ns;
        m->cap = ncap;
    }
    size_t j = (size_t)rkm__hash(name_of(owner, id)) & (m->cap - 1);
    while (m->slots[j] >= 0) j = (j + 1) & (m->cap - 1);
    m->slots[j] = id;
    m->count++;
    return 1;
}

static void rkm__map_free(rkm_context *ctx, rkm__map *m)
{
    rkm__free(ctx, m->slots, m->cap * sizeof *m->slots);
    memset(m, 0, sizeof *m);
}

/* ===========================================================================
 * 2. Graph: builder, validation, gradients and backwards
 * ========================================================================= */

typedef struct rkm__tensor {
    char *name;
    uint64_t bytes;
    unsigned flags;
    int32_t producer;      /* op id, -1 for inputs and not-yet-produced */
    int32_t line;          /* source line, 0 when built through the API */
    int has_grad;
    int32_t n_contrib;     /* backwards reading it (+1 for the loss tensor) */
    int32_t n_readers;     /* ops reading it */
} rkm__tensor;

typedef struct rkm__op {
    char *name;
    double fwd, bwd;
    int32_t *in, *out, *saved; /* one allocation: in, then out, then saved */
    int32_t n_in, n_out, n_saved;
    uint64_t phantom, fwd_ws, bwd_ws;
    int32_t line;
    int has_bwd;
} rkm__op;

typedef struct rkm__block {
    int32_t *ops;      /* op ids in topological order (points into block_ops) */
    int32_t n_ops;
    int32_t in;        /* separator entering, -1 for the first block */
    int32_t out;       /* separator leaving; the loss tensor for the last block */
    int32_t cls;       /* class id */
} rkm__block;

struct rkm_graph {
    rkm_context *ctx;
    rkm__tensor *tensors;
    size_t n_tensors, cap_tensors;
    rkm__op *ops;
    size_t n_ops, cap_ops;
    rkm__map tensor_map, op_map;
    int32_t loss;
    int32_t loss_line;
    int finalized;
    uint64_t input_bytes;
    rkm__block *blocks;
    int32_t n_blocks, n_classes;
    int32_t *block_ops; /* storage for all blocks' op lists (n_ops entries) */
    /* Set by a reader so that builder errors can name file:line. */
    const char *src_name;
    int32_t src_line;
};

static const char *rkm__tensor_name_of(const void *g, int32_t id) { return ((const rkm_graph *)g)->tensors[id].name; }
static const char *rkm__op_name_of(const void *g, int32_t id) { return ((const rkm_graph *)g)->ops[id].name; }

/* Graph error: prefixes "source:line: " when a reader is active. */
static rkm_result rkm__gerr(const rkm_graph *g, rkm_result code, int32_t line, const char *fmt, ...)
{
    char msg[RKM_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g->src_name && line > 0) return rkm__err(g->ctx, code, "%s:%d: %s", g->src_name, (int)line, msg);
    return rkm__err(g->ctx, code, "%s", msg);
}

static int rkm__name_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == ':' || c == '/' || c == '[' || c == ']' || c == '-'))
            return 0;
    }
    return n > 0 && n <= RKM_NAME_MAX;
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
    *out = g;
    return RKM_OK;
}

static void rkm__graph_free_blocks(rkm_graph *g)
{
    rkm__free(g->ctx, g->blocks, (size_t)g->n_blocks * sizeof *g->blocks);
    rkm__free(g->ctx, g->block_ops, g->n_ops * sizeof *g->block_ops);
    g->blocks = NULL;
    g->block_ops = NULL;
    g->n_blocks = g->n_classes = 0;
}

void rkm_graph_destroy(rkm_graph *g)
{
    if (!g) return;
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
    rkm__free(ctx, g, sizeof *g);
}

static rkm_result rkm__check_builder(const rkm_graph *g, const char *fn)
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
    if (flags & ~(RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD))
        return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "tensor %s: unknown flags 0x%x", name, flags);
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

static int rkm__list_has(const int32_t *list, int32_t n, int32_t x)
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
    return RKM_OK;
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
    o->out = o->in + d->n_in;
    o->saved = o->out + d->n_out;
    if (d->n_in) memcpy(o->in, d->in, (size_t)d->n_in * sizeof(int32_t));
    memcpy(o->out, d->out, (size_t)d->n_out * sizeof(int32_t));
    if (d->n_saved) memcpy(o->saved, d->saved, (size_t)d->n_saved * sizeof(int32_t));
    o->n_in = d->n_in;
    o->n_out = d->n_out;
    o->n_saved = d->n_saved;
    o->fwd = d->fwd_seconds;
    o->bwd = d->bwd_seconds;
    o->phantom = d->phantom;
    o->fwd_ws = d->fwd_ws;
    o->bwd_ws = d->bwd_ws;
    o->line = line;
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

rkm_result rkm_graph_set_loss(rkm_graph *g, int32_t tensor)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    int32_t line = g->src_line;
    rkm_result r = rkm__check_builder(g, "rkm_graph_set_loss");
    if (r) return r;
    if (g->loss >= 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "loss: given twice (the loss statement appears exactly once)");
    if (tensor < 0 || (size_t)tensor >= g->n_tensors)
        return rkm__gerr(g, RKM_ERROR_ARGUMENT, line, "loss: tensor id %d does not exist", (int)tensor);
    const rkm__tensor *t = &g->tensors[tensor];
    if (t->producer < 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "loss: %s is not produced by an op", t->name);
    if (t->flags & RKM_TENSOR_NOGRAD)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "loss: %s is nograd (the loss must have a gradient)", t->name);
    g->loss = tensor;
    g->loss_line = line;
    return RKM_OK;
}

static void rkm__graph_derive(rkm_graph *g)
{
    for (size_t t = 0; t < g->n_tensors; t++) {
        g->tensors[t].has_grad = 0;
        g->tensors[t].n_contrib = 0;
        g->tensors[t].n_readers = 0;
    }
    for (size_t i = 0; i < g->n_ops; i++)
        for (int32_t k = 0; k < g->ops[i].n_in; k++) g->tensors[g->ops[i].in[k]].n_readers++;
    /* Readers come after producers, so one reverse pass settles both. */
    g->tensors[g->loss].has_grad = 1;
    g->tensors[g->loss].n_contrib = 1;
    for (size_t i = g->n_ops; i-- > 0;) {
        rkm__op *o = &g->ops[i];
        o->has_bwd = 0;
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].has_grad) o->has_bwd = 1;
        if (!o->has_bwd) continue;
        for (int32_t k = 0; k < o->n_in; k++) {
            rkm__tensor *t = &g->tensors[o->in[k]];
            if (t->flags & (RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD)) continue;
            t->has_grad = 1;
            t->n_contrib++;
        }
    }
}

static rkm_result rkm__graph_check_whole(rkm_graph *g)
{
    if (g->loss < 0) return rkm__gerr(g, RKM_ERROR_GRAPH, g->src_line, "no loss statement (exactly one is required)");
    for (size_t t = 0; t < g->n_tensors; t++) {
        const rkm__tensor *x = &g->tensors[t];
        if (!(x->flags & RKM_TENSOR_INPUT) && x->producer < 0)
            return rkm__gerr(g, RKM_ERROR_GRAPH, x->line, "tensor %s: not an input and no op writes it", x->name);
    }
    /* Every op must be an ancestor of the loss: mark backwards from it. */
    uint8_t *anc = rkm__calloc(g->ctx, g->n_ops + 1, 1);
    uint8_t *need = rkm__calloc(g->ctx, g->n_tensors + 1, 1);
    rkm_result r = RKM_OK;
    if (!anc || !need) {
        r = rkm__nomem(g->ctx, "rkm_graph_finalize");
        goto done;
    }
    need[g->loss] = 1;
    for (size_t i = g->n_ops; i-- > 0;) {
        const rkm__op *o = &g->ops[i];
        for (int32_t k = 0; k < o->n_out && !anc[i]; k++) anc[i] = need[o->out[k]];
        if (anc[i])
            for (int32_t k = 0; k < o->n_in; k++) need[o->in[k]] = 1;
    }
    for (size_t i = 0; i < g->n_ops; i++)
        if (!anc[i]) {
            r = rkm__gerr(g, RKM_ERROR_GRAPH, g->ops[i].line, "op %s: not an ancestor of the loss %s", g->ops[i].name,
                          g->tensors[g->loss].name);
            break;
        }
    if (r == RKM_OK) {
        uint64_t total = 0, ws = 0;
        int ok = 1;
        for (size_t t = 0; t < g->n_tensors && ok; t++)
            ok = rkm__add_u64(total, g->tensors[t].bytes, &total) && rkm__add_u64(total, g->tensors[t].bytes, &total);
        for (size_t i = 0; i < g->n_ops && ok; i++) {
            ok = rkm__add_u64(total, g->ops[i].phantom, &total);
            if (g->ops[i].fwd_ws > ws) ws = g->ops[i].fwd_ws;
            if (g->ops[i].bwd_ws > ws) ws = g->ops[i].bwd_ws;
        }
        if (!ok || !rkm__add_u64(total, ws, &total))
            r = rkm__gerr(g, RKM_ERROR_GRAPH, g->src_line, "byte counts too large: their total must fit in 64 bits");
    }
done:
    rkm__free(g->ctx, anc, g->n_ops + 1);
    rkm__free(g->ctx, need, g->n_tensors + 1);
    return r;
}

static rkm_result rkm__structure_detect(rkm_graph *g); /* section 7 */

rkm_result rkm_graph_finalize(rkm_graph *g)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_builder(g, "rkm_graph_finalize");
    if (r) return r;
    if ((r = rkm__graph_check_whole(g))) return r;
    rkm__graph_derive(g);
    g->input_bytes = 0;
    for (size_t t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].flags & RKM_TENSOR_INPUT) g->input_bytes += g->tensors[t].bytes;
    if ((r = rkm__structure_detect(g))) return r;
    g->finalized = 1;
    return RKM_OK;
}

rkm_result rkm_graph_set_op_costs(rkm_graph *g, int32_t op, double fwd, double bwd, uint64_t fwd_ws, uint64_t bwd_ws)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    if (op < 0 || (size_t)op >= g->n_ops)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_set_op_costs: op id %d does not exist", (int)op);
    if (!(fwd >= 0) || !(bwd >= 0) || !isfinite(fwd) || !isfinite(bwd))
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_set_op_costs: op %s: times are finite and non-negative",
                        g->ops[op].name);
    g->ops[op].fwd = fwd;
    g->ops[op].bwd = bwd;
    g->ops[op].fwd_ws = fwd_ws;
    g->ops[op].bwd_ws = bwd_ws;
    return RKM_OK;
}

rkm_context *rkm_graph_context(const rkm_graph *g) { return g ? g->ctx : NULL; }
int rkm_graph_is_finalized(const rkm_graph *g) { return g ? g->finalized : 0; }
int32_t rkm_graph_num_tensors(const rkm_graph *g) { return g ? (int32_t)g->n_tensors : 0; }
int32_t rkm_graph_num_ops(const rkm_graph *g) { return g ? (int32_t)g->n_ops : 0; }
int32_t rkm_graph_loss(const rkm_graph *g) { return g ? g->loss : -1; }

int32_t rkm_graph_find_tensor(const rkm_graph *g, const char *name)
{
    return g && name ? rkm__map_find(&g->tensor_map, name, rkm__tensor_name_of, g) : -1;
}

int32_t rkm_graph_find_op(const rkm_graph *g, const char *name)
{
    return g && name ? rkm__map_find(&g->op_map, name, rkm__op_name_of, g) : -1;
}

rkm_result rkm_graph_tensor_info(const rkm_graph *g, int32_t id, rkm_tensor_info *out)
{
    if (!g || !out) return RKM_ERROR_ARGUMENT;
    if (id < 0 || (size_t)id >= g->n_tensors)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_tensor_info: tensor id %d does not exist", (int)id);
    const rkm__tensor *t = &g->tensors[id];
    out->name = t->name;
    out->bytes = t->bytes;
    out->flags = t->flags;
    out->producer = t->producer;
    out->has_grad = t->has_grad;
    out->n_contributors = t->n_contrib;
    return RKM_OK;
}

rkm_result rkm_graph_op_info(const rkm_graph *g, int32_t id, rkm_op_info *out)
{
    if (!g || !out) return RKM_ERROR_ARGUMENT;
    if (id < 0 || (size_t)id >= g->n_ops)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_op_info: op id %d does not exist", (int)id);
    const rkm__op *o = &g->ops[id];
    out->name = o->name;
    out->fwd_seconds = o->fwd;
    out->bwd_seconds = o->bwd;
    out->in = o->in;
    out->n_in = o->n_in;
    out->out = o->out;
    out->n_out = o->n_out;
    out->saved = o->saved;
    out->n_saved = o->n_saved;
    out->phantom = o->phantom;
    out->fwd_ws = o->fwd_ws;
    out->bwd_ws = o->bwd_ws;
    out->has_backward = o->has_bwd;
    return RKM_OK;
}

int rkm_graph_tensor_has_grad(const rkm_graph *g, int32_t t)
{
    return g && t >= 0 && (size_t)t < g->n_tensors ? g->tensors[t].has_grad : 0;
}

int rkm_graph_op_has_backward(const rkm_graph *g, int32_t op)
{
    return g && op >= 0 && (size_t)op < g->n_ops ? g->ops[op].has_bwd : 0;
}

rkm_result rkm_graph_block_info(const rkm_graph *g, int32_t b, rkm_block_info *out)
{
    if (!g || !out) return RKM_ERROR_ARGUMENT;
    if (!g->finalized) return rkm__err(g->ctx, RKM_ERROR_STATE, "rkm_graph_block_info: the graph is not finalized");
    if (b < 0 || b >= g->n_blocks)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_block_info: block %d does not exist", (int)b);
    const rkm__block *k = &g->blocks[b];
    out->ops = k->ops;
    out->n_ops = k->n_ops;
    out->input = k->in;
    out->output = k->out;
    out->class_id = k->cls;
    return RKM_OK;
}

/* @@SECTION3@@ */

/* ===========================================================================
 * 4. Plans: steps, files (.rkp)
 * ========================================================================= */

struct rkm_plan {
    const rkm_graph *g;
    rkm_context *ctx;
    rkm_step *steps;
    size_t n_steps, cap_steps;
    /* Executor annotations, valid when `checked`: for step i, flag_off[i]
     * indexes `flags`: fwd -> [recompute, out_new...], bwd -> [in_grad...]. */
    int checked;
    size_t *flag_off;
    uint8_t *flags;
    size_t n_flags;
    rkm_plan_stats stats;
};

static void rkm__plan_drop_check(rkm_plan *p)
{
    rkm__free(p->ctx, p->flag_off, p->n_steps * sizeof *p->flag_off);
    rkm__free(p->ctx, p->flags, p->n_flags);
    p->flag_off = NULL;
    p->flags = NULL;
    p->n_flags = 0;
    p->checked = 0;
}

rkm_result rkm_plan_create(const rkm_graph *g, rkm_plan **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_create: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!g->finalized) return rkm__err(g->ctx, RKM_ERROR_STATE, "rkm_plan_create: the graph is not finalized");
    rkm_plan *p = rkm__calloc(g->ctx, 1, sizeof *p);
    if (!p) return rkm__nomem(g->ctx, "rkm_plan_create");
    p->g = g;
    p->ctx = g->ctx;
    p->stats.algo = RKM_ALGO_NONE;
    *out = p;
    return RKM_OK;
}

void rkm_plan_destroy(rkm_plan *p)
{
    if (!p) return;
    rkm__plan_drop_check(p);
    rkm__free(p->ctx, p->steps, p->cap_steps * sizeof *p->steps);
    rkm__free(p->ctx, p, sizeof *p);
}

static int rkm__step_index_ok(const rkm_graph *g, const rkm_step *s)
{
    switch (s->kind) {
    case RKM_STEP_FWD: return s->index >= 0 && (size_t)s->index < g->n_ops && (s->save == 0 || s->save == 1);
    case RKM_STEP_BWD:
    case RKM_STEP_FREE_SAVED: return s->index >= 0 && (size_t)s->index < g->n_ops;
    case RKM_STEP_LOSS: return s->index == g->loss;
    case RKM_STEP_FREE:
    case RKM_STEP_FREE_GRAD: return s->index >= 0 && (size_t)s->index < g->n_tensors;
    default: return 0;
    }
}

/* Append without checks beyond allocation (internal producers are trusted;
 * the simulator judges every plan anyway). */
static rkm_result rkm__plan_push(rkm_plan *p, int32_t kind, int32_t index, int32_t save)
{
    if (p->checked) rkm__plan_drop_check(p);
    if (!rkm__reserve(p->ctx, (void **)&p->steps, &p->cap_steps, p->n_steps + 1, sizeof *p->steps))
        return rkm__nomem(p->ctx, "plan");
    rkm_step *s = &p->steps[p->n_steps++];
    s->kind = kind;
    s->index = index;
    s->save = save;
    return RKM_OK;
}

rkm_result rkm_plan_append(rkm_plan *p, const rkm_step *s)
{
    if (!p || !s) return p ? rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_append: step is NULL") : RKM_ERROR_ARGUMENT;
    if (!rkm__step_index_ok(p->g, s))
        return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_append: step %zu: kind %d with index %d is out of range",
                        p->n_steps, (int)s->kind, (int)s->index);
    return rkm__plan_push(p, s->kind, s->index, s->kind == RKM_STEP_FWD ? s->save : 0);
}

const rkm_graph *rkm_plan_graph(const rkm_plan *p) { return p ? p->g : NULL; }
size_t rkm_plan_num_steps(const rkm_plan *p) { return p ? p->n_steps : 0; }
const rkm_step *rkm_plan_steps(const rkm_plan *p) { return p ? p->steps : NULL; }

static const char *const rkm__step_words[] = {"fwd", "loss", "bwd", "free", "free_saved", "free_grad"};

/* "fwd h0.attn save", for messages and files. */
static void rkm__step_text(const rkm_graph *g, const rkm_step *s, char *buf, size_t size)
{
    if (!rkm__step_index_ok(g, s)) {
        snprintf(buf, size, "<kind %d index %d>", (int)s->kind, (int)s->index);
        return;
    }
    switch (s->kind) {
    case RKM_STEP_LOSS: snprintf(buf, size, "loss"); break;
    case RKM_STEP_FWD:
        snprintf(buf, size, "fwd %s%s", g->ops[s->index].name, s->save ? " save" : "");
        break;
    case RKM_STEP_BWD:
    case RKM_STEP_FREE_SAVED: snprintf(buf, size, "%s %s", rkm__step_words[s->kind], g->ops[s->index].name); break;
    default: snprintf(buf, size, "%s %s", rkm__step_words[s->kind], g->tensors[s->index].name); break;
    }
}

/* ===========================================================================
 * 5. Simulator: the one memory and time accounting
 * ========================================================================= */

/* Replay state. Everything that measures memory or time (the checker, the
 * baseline, block options, the planner) goes through rkm__sim_step. */
typedef struct rkm__sim {
    const rkm_graph *g;
    uint8_t *D;        /* per tensor: live */
    uint8_t *G;        /* per tensor: gradient live */
    int32_t *recv;     /* per tensor: contributions received by grad(T) */
    uint8_t *P;        /* per op: saved state (phantom) live */
    uint8_t *fwd_done; /* per op: forward ran at least once */
    uint8_t *bwd_done; /* per op: backward ran */
    int loss_done;
    uint64_t mem;
} rkm__sim;

static void rkm__sim_free(rkm__sim *s)
{
    if (!s->g) return;
    rkm_context *ctx = s->g->ctx;
    rkm__free(ctx, s->D, s->g->n_tensors * 2 + s->g->n_ops * 3 + 1);
    rkm__free(ctx, s->recv, (s->g->n_tensors + 1) * sizeof *s->recv);
    memset(s, 0, sizeof *s);
}

/* The contract's start state: inputs live, nothing else. */
static void rkm__sim_reset(rkm__sim *s)
{
    const rkm_graph *g = s->g;
    memset(s->D, 0, g->n_tensors * 2 + g->n_ops * 3 + 1);
    memset(s->recv, 0, (g->n_tensors + 1) * sizeof *s->recv);
    s->loss_done = 0;
    s->mem = 0;
    for (size_t t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].flags & RKM_TENSOR_INPUT) {
            s->D[t] = 1;
            s->mem += g->tensors[t].bytes;
        }
}

static rkm_result rkm__sim_init(const rkm_graph *g, rkm__sim *s)
{
    memset(s, 0, sizeof *s);
    size_t nb = g->n_tensors * 2 + g->n_ops * 3 + 1;
    uint8_t *b = rkm__alloc(g->ctx, nb);
    int32_t *recv = rkm__alloc(g->ctx, (g->n_tensors + 1) * sizeof *recv);
    if (!b || !recv) {
        rkm__free(g->ctx, b, nb);
        rkm__free(g->ctx, recv, (g->n_tensors + 1) * sizeof *recv);
        return rkm__nomem(g->ctx, "simulator");
    }
    s->g = g;
    s->D = b;
    s->G = b + g->n_tensors;
    s->P = s->G + g->n_tensors;
    s->fwd_done = s->P + g->n_ops;
    s->bwd_done = s->fwd_done + g->n_ops;
    s->recv = recv;
    rkm__sim_reset(s);
    return RKM_OK;
}

/* Make tensor t live (a block replay's starting checkpoint). */
static void rkm__sim_give_tensor(rkm__sim *s, int32_t t)
{
    if (t < 0 || s->D[t]) return;
    s->D[t] = 1;
    s->mem += s->g->tensors[t].bytes;
}

/* Make grad(t) live and complete (as if every contributor had run). */
static void rkm__sim_give_grad(rkm__sim *s, int32_t t)
{
    if (t < 0 || s->G[t]) return;
    s->G[t] = 1;
    s->recv[t] = s->g->tensors[t].n_contrib;
    s->mem += s->g->tensors[t].bytes;
}

static int rkm__grad_complete(const rkm__sim *s, int32_t t)
{
    return s->G[t] && s->recv[t] == s->g->tensors[t].n_contrib;
}

/* Check one step's requirements; on success apply it, set *peak to the
 * step's peak and return RKM_RULE_NONE. On failure the state is unchanged
 * and *obj names the op or tensor concerned. */
static rkm_rule rkm__sim_step(rkm__sim *s, const rkm_step *st, uint64_t *peak, int32_t *obj)
{
    const rkm_graph *g = s->g;
    *obj = -1;
    if (!rkm__step_index_ok(g, st)) return RKM_RULE_BAD_STEP;
    int32_t x = st->index;
    *obj = x;
    *peak = s->mem;
    switch (st->kind) {
    case RKM_STEP_FWD: {
        const rkm__op *o = &g->ops[x];
        for (int32_t k = 0; k < o->n_in; k++)
            if (!s->D[o->in[k]]) {
                *obj = o->in[k];
                return RKM_RULE_FWD_INPUT_MISSING;
            }
        if (st->save && (o->phantom == 0 || !o->has_bwd)) return RKM_RULE_SAVE_NOT_ALLOWED;
        if (st->save && s->P[x]) return RKM_RULE_SAVE_ALREADY_LIVE;
        uint64_t add = 0;
        for (int32_t k = 0; k < o->n_out; k++)
            if (!s->D[o->out[k]]) add += g->tensors[o->out[k]].bytes;
        if (st->save) add += o->phantom;
        *peak = s->mem + add + o->fwd_ws;
        for (int32_t k = 0; k < o->n_out; k++) s->D[o->out[k]] = 1;
        if (st->save) s->P[x] = 1;
        s->fwd_done[x] = 1;
        s->mem += add;
        return RKM_RULE_NONE;
    }
    case RKM_STEP_LOSS:
        if (s->loss_done) return RKM_RULE_LOSS_TWICE;
        if (!s->D[x]) return RKM_RULE_LOSS_TENSOR_MISSING;
        *peak = s->mem + g->tensors[x].bytes;
        s->loss_done = 1;
        s->G[x] = 1;
        s->recv[x] = 1;
        s->mem += g->tensors[x].bytes;
        return RKM_RULE_NONE;
    case RKM_STEP_BWD: {
        const rkm__op *o = &g->ops[x];
        if (!o->has_bwd) return RKM_RULE_BWD_NO_BACKWARD;
        if (s->bwd_done[x]) return RKM_RULE_BWD_TWICE;
        for (int32_t k = 0; k < o->n_saved; k++)
            if (!s->D[o->saved[k]]) {
                *obj = o->saved[k];
                return RKM_RULE_BWD_SAVED_MISSING;
            }
        if (o->phantom > 0 && !s->P[x]) return RKM_RULE_BWD_PHANTOM_MISSING;
        for (int32_t k = 0; k < o->n_out; k++) {
            int32_t t = o->out[k];
            if (!g->tensors[t].has_grad) continue;
            *obj = t;
            if (!s->G[t]) return RKM_RULE_BWD_GRAD_MISSING;
            if (!rkm__grad_complete(s, t)) return RKM_RULE_BWD_GRAD_INCOMPLETE;
        }
        *obj = x;
        uint64_t add = 0;
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            if (g->tensors[t].has_grad && !s->G[t]) add += g->tensors[t].bytes;
        }
        *peak = s->mem + add + o->bwd_ws;
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            if (!g->tensors[t].has_grad) continue;
            s->G[t] = 1;
            s->recv[t]++;
        }
        s->bwd_done[x] = 1;
        s->mem += add;
        return RKM_RULE_NONE;
    }
    case RKM_STEP_FREE:
        if (g->tensors[x].flags & RKM_TENSOR_INPUT) return RKM_RULE_FREE_INPUT;
        if (!s->D[x]) return RKM_RULE_FREE_NOT_LIVE;
        s->D[x] = 0;
        s->mem -= g->tensors[x].bytes;
        return RKM_RULE_NONE;
    case RKM_STEP_FREE_SAVED:
        if (!s->P[x]) return RKM_RULE_FREE_SAVED_NOT_LIVE;
        s->P[x] = 0;
        s->mem -= g->ops[x].phantom;
        return RKM_RULE_NONE;
    case RKM_STEP_FREE_GRAD:
        if (!s->G[x]) return RKM_RULE_FREE_GRAD_NOT_LIVE;
        if (!rkm__grad_complete(s, x)) return RKM_RULE_FREE_GRAD_INCOMPLETE;
        s->G[x] = 0;
        s->mem -= g->tensors[x].bytes;
        return RKM_RULE_NONE;
    }
    return RKM_RULE_BAD_STEP;
}

/* The contract's end-of-plan rules. */
static rkm_rule rkm__sim_end(const rkm__sim *s, int32_t *obj)
{
    const rkm_graph *g = s->g;
    *obj = -1;
    if (!s->loss_done) return RKM_RULE_END_LOSS_MISSING;
    for (size_t i = 0; i < g->n_ops; i++) {
        *obj = (int32_t)i;
        if (g->ops[i].has_bwd && !s->bwd_done[i]) return RKM_RULE_END_BWD_MISSING;
        if (s->P[i]) return RKM_RULE_END_SAVED_LIVE;
    }
    for (size_t t = 0; t < g->n_tensors; t++) {
        *obj = (int32_t)t;
        if (s->D[t] && !(g->tensors[t].flags & RKM_TENSOR_INPUT)) return RKM_RULE_END_TENSOR_LIVE;
        if (s->G[t]) return RKM_RULE_END_GRAD_LIVE;
    }
    *obj = -1;
    return RKM_RULE_NONE;
}

/* Replay steps[0..n) from the current state. Fills res (peak, time, and on
 * failure rule/fail_step/fail_object) and mem_after if given. Returns 1 if
 * every step held. */
static int rkm__sim_run(rkm__sim *s, const rkm_step *steps, size_t n, rkm_sim_result *res, uint64_t *mem_after)
{
    memset(res, 0, sizeof *res);
    res->fail_step = -1;
    res->fail_object = -1;
    res->peak = s->mem;
    res->peak_step = -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t pk;
        int32_t obj;
        rkm_rule rule = rkm__sim_step(s, &steps[i], &pk, &obj);
        if (rule != RKM_RULE_NONE) {
            res->rule = rule;
            res->fail_step = (int64_t)i;
            res->fail_object = obj;
            return 0;
        }
        if (res->peak_step < 0 || pk > res->peak) {
            res->peak = pk;
            res->peak_step = (int64_t)i;
        }
        if (steps[i].kind == RKM_STEP_FWD) res->time += s->g->ops[steps[i].index].fwd;
        else if (steps[i].kind == RKM_STEP_BWD) res->time += s->g->ops[steps[i].index].bwd;
        if (mem_after) mem_after[i] = s->mem;
    }
    return 1;
}

const char *rkm_rule_string(rkm_rule rule)
{
    static const char *const text[RKM_RULE_COUNT] = {
        "no rule broken",
        "fwd: every in tensor must be live",
        "fwd save: the op must have phantom > 0 and a backward",
        "fwd save: the op's saved state must not be live already",
        "loss: the loss tensor must be live",
        "loss: runs exactly once",
        "bwd: the op must have a backward",
        "bwd: each backward runs exactly once",
        "bwd: every saved tensor must be live",
        "bwd: the op's saved state (phantom) must be live",
        "bwd: the gradient of every output with a gradient must be live",
        "bwd: the gradient of every output must be complete (all contributors ran)",
        "free: the tensor must be live",
        "free: an input tensor is never freed",
        "free_saved: the op's saved state must be live",
        "free_grad: the gradient must be live",
        "free_grad: the gradient must be complete (all contributors ran)",
        "end: the loss step must have run",
        "end: every op with a backward must run it",
        "end: only input tensors may be live",
        "end: no saved state may be live",
        "end: no gradient may be live",
        "step kind or index out of range",
    };
    if ((int)rule < 0 || rule >= RKM_RULE_COUNT) return "unknown rule";
    return text[rule];
}

static const char *rkm__obj_name(const rkm_graph *g, rkm_rule rule, int32_t obj)
{
    if (obj < 0) return "";
    int is_op = rule == RKM_RULE_SAVE_NOT_ALLOWED || rule == RKM_RULE_SAVE_ALREADY_LIVE ||
                rule == RKM_RULE_BWD_NO_BACKWARD || rule == RKM_RULE_BWD_TWICE || rule == RKM_RULE_BWD_PHANTOM_MISSING ||
                rule == RKM_RULE_FREE_SAVED_NOT_LIVE || rule == RKM_RULE_END_BWD_MISSING ||
                rule == RKM_RULE_END_SAVED_LIVE;
    if (is_op) return (size_t)obj < g->n_ops ? g->ops[obj].name : "";
    return (size_t)obj < g->n_tensors ? g->tensors[obj].name : "";
}

/* Record what the executor needs, from a replay of the whole (valid) plan. */
static rkm_result rkm__plan_annotate(rkm_plan *p)
{
    const rkm_graph *g = p->g;
    size_t nf = 0;
    for (size_t i = 0; i < p->n_steps; i++) {
        const rkm_step *st = &p->steps[i];
        if (st->kind == RKM_STEP_FWD) nf += 1 + (size_t)g->ops[st->index].n_out;
        if (st->kind == RKM_STEP_BWD) nf += (size_t)g->ops[st->index].n_in;
    }
    p->flag_off = rkm__alloc(p->ctx, (p->n_steps + 1) * sizeof *p->flag_off);
    p->flags = rkm__alloc(p->ctx, nf + 1);
    if (!p->flag_off || !p->flags) {
        rkm__free(p->ctx, p->flag_off, (p->n_steps + 1) * sizeof *p->flag_off);
        rkm__free(p->ctx, p->flags, nf + 1);
        p->flag_off = NULL;
        p->flags = NULL;
        return rkm__nomem(p->ctx, "plan annotations");
    }
    p->n_flags = nf + 1;
    rkm__sim s;
    rkm_result r = rkm__sim_init(g, &s);
    if (r) {
        rkm__plan_drop_check(p);
        return r;
    }
    size_t at = 0;
    for (size_t i = 0; i < p->n_steps; i++) {
        const rkm_step *st = &p->steps[i];
        p->flag_off[i] = at;
        if (st->kind == RKM_STEP_FWD) {
            const rkm__op *o = &g->ops[st->index];
            p->flags[at++] = s.fwd_done[st->index];
            for (int32_t k = 0; k < o->n_out; k++) p->flags[at++] = !s.D[o->out[k]];
        } else if (st->kind == RKM_STEP_BWD) {
            const rkm__op *o = &g->ops[st->index];
            for (int32_t k = 0; k < o->n_in; k++) {
                int32_t t = o->in[k];
                p->flags[at++] = !g->tensors[t].has_grad ? RKM_GRAD_NONE : s.G[t] ? RKM_GRAD_ACCUMULATE : RKM_GRAD_NEW;
            }
        }
        uint64_t pk;
        int32_t obj;
        (void)rkm__sim_step(&s, st, &pk, &obj); /* valid: checked by the caller */
    }
    rkm__sim_free(&s);
    return RKM_OK;
}

/* Simulate a whole plan, fill res, and on failure set the context message. */
static rkm_result rkm__plan_check(rkm_plan *p, rkm_sim_result *res, uint64_t *mem_after)
{
    rkm__sim s;
    rkm_result r = rkm__sim_init(p->g, &s);
    if (r) return r;
    int ok = rkm__sim_run(&s, p->steps, p->n_steps, res, mem_after);
    int32_t obj = -1;
    if (ok) {
        rkm_rule rule = rkm__sim_end(&s, &obj);
        if (rule != RKM_RULE_NONE) {
            ok = 0;
            res->rule = rule;
            res->fail_step = (int64_t)p->n_steps;
            res->fail_object = obj;
        }
    }
    rkm__sim_free(&s);
    res->valid = ok;
    if (!ok) {
        char text[300] = "end of plan";
        if (res->fail_step < (int64_t)p->n_steps) rkm__step_text(p->g, &p->steps[res->fail_step], text, sizeof text);
        const char *on = rkm__obj_name(p->g, res->rule, res->fail_object);
        if (p->checked) rkm__plan_drop_check(p);
        return rkm__err(p->ctx, RKM_ERROR_PLAN, "step %lld (%s): %s%s%s", (long long)res->fail_step, text,
                        rkm_rule_string(res->rule), *on ? ": " : "", on);
    }
    res->fail_step = -1;
    p->stats.peak = res->peak;
    p->stats.time = res->time;
    if (!p->checked) {
        if ((r = rkm__plan_annotate(p))) return r;
        p->checked = 1;
    }
    return RKM_OK;
}

rkm_result rkm_plan_simulate(rkm_plan *p, rkm_sim_result *res, uint64_t *mem_after)
{
    if (!p) return RKM_ERROR_ARGUMENT;
    rkm_sim_result tmp;
    return rkm__plan_check(p, res ? res : &tmp, mem_after);
}

/* @@SECTION6@@ */
