/* rockmate.c -- the whole library, in sections that follow the pipeline:
 *
 *   1. Base: context, allocator, errors, small containers
 *   2. Graph: builder, validation, gradients and backwards
 *   3. Graph files (.rkg): reader and writer
 *   4. Plans: steps, files (.rkp)
 *   5. Simulator: the one memory and time accounting; memory layout
 *   6. Baseline plan and bounds
 *   7. Structure: separators, blocks, classes
 *   8. Block options: extremes, replay, dominance
 *   9. Block ILP (lp_solve)
 *  10. Chain DP
 *  11. DTR: dynamic tensor rematerialization, simulated offline
 *  12. Planner: algorithms, flattening, budgets
 *  13. Executor and profiler
 *  14. Arena: one allocation, an offset per buffer
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
#if defined(__SSE2__)
#include <emmintrin.h> /* the chain DP's min loops */
#endif

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
    if (p) memset(p, 0, n * elem > 0 ? n * elem : 1);
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

/* v rounded up to a multiple of a power of two a (v + a - 1 must fit). */
static uint64_t rkm__round_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

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
        "internal error (a bug in rockmate)",
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
    if (d.log_level < 0 || d.log_level > RKM_LOG_DEBUG) return RKM_ERROR_ARGUMENT;
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

void *rkm_context_realloc(rkm_context *ctx, void *ptr, size_t old_size, size_t new_size)
{
    if (!ctx) return NULL;
    if (new_size == 0) {
        rkm__free(ctx, ptr, old_size);
        return NULL;
    }
    return rkm__realloc(ctx, ptr, old_size, new_size);
}

rkm_result rkm_context_fail(rkm_context *ctx, rkm_result code, const char *fmt, ...)
{
    if (!ctx || !fmt) return code;
    char msg[RKM_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rkm__err(ctx, code, "%s", msg);
}

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
    uint64_t scratch; /* of the phantom, written by every forward (transient without save) */
    unsigned flags;   /* RKM_OP_INPLACE, RKM_OP_GRAD_INPLACE */
    int32_t line;
    int has_bwd;
} rkm__op;

/* The most a forward of o holds transiently: its workspace, and its scratch
 * on a run that keeps no saved state. Fits in 64 bits (rkm__bytes_fit). */
static uint64_t rkm__fwd_ws_most(const rkm__op *o) { return o->fwd_ws + o->scratch; }

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
    int has_inplace; /* some op declares RKM_OP_INPLACE or RKM_OP_GRAD_INPLACE (at finalize) */
    uint64_t input_bytes;
    rkm__block *blocks;
    int32_t n_blocks, n_classes;
    int32_t *block_ops; /* storage for all blocks' op lists (n_ops entries) */
    rkm_graph_stats stats; /* computed once by finalize */
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
    if (t->flags & RKM_TENSOR_INPUT)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line, "loss: %s is an input tensor (the loss must be written by an op)",
                         t->name);
    if (t->producer < 0)
        return rkm__gerr(g, RKM_ERROR_GRAPH, line,
                         "loss: %s is not produced by an op declared before it (the loss statement comes after the op "
                         "that writes the loss tensor, at the end)",
                         t->name);
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
    g->has_inplace = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        for (int32_t k = 0; k < g->ops[i].n_in; k++) g->tensors[g->ops[i].in[k]].n_readers++;
        g->has_inplace |= g->ops[i].flags != 0;
    }
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

/* 2 x all tensors + all phantoms + the largest workspace fits in 64 bits,
 * so that no memory sum anywhere can overflow. */
static int rkm__bytes_fit(const rkm_graph *g)
{
    uint64_t total = 0, ws = 0;
    int ok = 1;
    for (size_t t = 0; t < g->n_tensors && ok; t++)
        ok = rkm__add_u64(total, g->tensors[t].bytes, &total) && rkm__add_u64(total, g->tensors[t].bytes, &total);
    for (size_t i = 0; i < g->n_ops && ok; i++) {
        uint64_t f = 0; /* rkm__fwd_ws_most, checked here */
        ok = rkm__add_u64(total, g->ops[i].phantom, &total) && rkm__add_u64(g->ops[i].fwd_ws, g->ops[i].scratch, &f);
        if (f > ws) ws = f;
        if (g->ops[i].bwd_ws > ws) ws = g->ops[i].bwd_ws;
    }
    return ok && rkm__add_u64(total, ws, &total);
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
    if (r == RKM_OK && !rkm__bytes_fit(g))
        r = rkm__gerr(g, RKM_ERROR_GRAPH, g->src_line, "byte counts too large: their total must fit in 64 bits");
done:
    rkm__free(g->ctx, anc, g->n_ops + 1);
    rkm__free(g->ctx, need, g->n_tensors + 1);
    return r;
}

/* grad_inplace, once gradients are known: both tensors have one. */
static rkm_result rkm__check_grad_inplace(const rkm_graph *g)
{
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *o = &g->ops[i];
        if (!(o->flags & RKM_OP_GRAD_INPLACE)) continue;
        const rkm__tensor *a = &g->tensors[o->in[0]], *b = &g->tensors[o->out[0]];
        if (!a->has_grad || !b->has_grad)
            return rkm__gerr(g, RKM_ERROR_GRAPH, o->line, "op %s: grad_inplace needs gradients of %s and %s; %s has none",
                             o->name, a->name, b->name, a->has_grad ? b->name : a->name);
    }
    return RKM_OK;
}

static rkm_result rkm__structure_detect(rkm_graph *g); /* section 7 */
static rkm_result rkm__graph_figures(rkm_graph *g);    /* section 6 */

rkm_result rkm_graph_finalize(rkm_graph *g)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_builder(g, "rkm_graph_finalize");
    if (r) return r;
    if ((r = rkm__graph_check_whole(g))) return r;
    rkm__graph_derive(g);
    if ((r = rkm__check_grad_inplace(g))) return r;
    g->input_bytes = 0;
    for (size_t t = 0; t < g->n_tensors; t++)
        if (g->tensors[t].flags & RKM_TENSOR_INPUT) g->input_bytes += g->tensors[t].bytes;
    if ((r = rkm__structure_detect(g))) return r;
    if ((r = rkm__graph_figures(g))) {
        rkm__graph_free_blocks(g);
        return r;
    }
    g->finalized = 1;
    return RKM_OK;
}

static rkm_result rkm__check_finalized(const rkm_graph *g, const char *fn)
{
    if (!g->finalized) return rkm__err(g->ctx, RKM_ERROR_STATE, "%s: the graph is not finalized", fn);
    return RKM_OK;
}

/* Rebuild g's tensors, ops (with their costs from `costs`, or g's when
 * NULL) and loss into the empty graph n, every byte count rounded up to
 * `align` (1: as they are), then finalize it: everything derived comes
 * from the new figures, as when the graph's file is read. */
static rkm_result rkm__graph_rebuild(const rkm_graph *g, const rkm_op_costs *costs, uint64_t align, rkm_graph *n)
{
    rkm_result r = RKM_OK;
    for (size_t t = 0; t < g->n_tensors && !r; t++)
        r = rkm_graph_add_tensor(n, g->tensors[t].name, rkm__round_up(g->tensors[t].bytes, align), g->tensors[t].flags,
                                 NULL);
    for (size_t i = 0; i < g->n_ops && !r; i++) {
        const rkm__op *o = &g->ops[i];
        rkm_op_costs c = costs ? costs[i] : (rkm_op_costs){o->fwd, o->bwd, o->fwd_ws, o->bwd_ws};
        rkm_op_desc d = {o->name, c.fwd_seconds, c.bwd_seconds, o->in, o->n_in, o->out, o->n_out, o->saved, o->n_saved,
                         rkm__round_up(o->phantom, align), rkm__round_up(c.fwd_ws, align), rkm__round_up(c.bwd_ws, align),
                         rkm__round_up(o->scratch, align), o->flags};
        r = rkm_graph_add_op(n, &d, NULL);
    }
    if (!r) r = rkm_graph_set_loss(n, g->loss);
    if (!r) r = rkm_graph_finalize(n);
    return r;
}

/* The graph a planner plans with at alignment `align`: g with every byte
 * count rounded up to it, so that the planners' own accounting (the
 * simulator's peak of that graph) bounds the plan's aligned peak. *out
 * NULL when g's counts are multiples of align already (g itself serves). */
static rkm_result rkm__graph_aligned(const rkm_graph *g, uint64_t align, rkm_graph **out)
{
    *out = NULL;
    int aligned = 1;
    for (size_t t = 0; t < g->n_tensors && aligned; t++) aligned = g->tensors[t].bytes % align == 0;
    for (size_t i = 0; i < g->n_ops && aligned; i++) {
        const rkm__op *o = &g->ops[i];
        aligned = (o->phantom | o->fwd_ws | o->bwd_ws | o->scratch) % align == 0;
    }
    if (aligned) return RKM_OK;
    rkm_graph *n;
    rkm_result r = rkm_graph_create(g->ctx, &n);
    if (!r && (r = rkm__graph_rebuild(g, NULL, align, n))) rkm_graph_destroy(n);
    if (r == RKM_ERROR_GRAPH) /* the rounded sums no longer fit 64 bits */
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "solve desc: at alignment %llu the graph's byte counts no longer "
                        "fit: %s", (unsigned long long)align, rkm_context_errmsg(g->ctx));
    if (!r) *out = n;
    return r;
}

rkm_result rkm_graph_with_costs(const rkm_graph *g, const rkm_op_costs *costs, rkm_graph **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_with_costs: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!costs) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_with_costs: costs is NULL");
    rkm_result r = rkm__check_finalized(g, "rkm_graph_with_costs");
    if (r) return r;
    rkm_graph *n;
    if ((r = rkm_graph_create(g->ctx, &n))) return r;
    if ((r = rkm__graph_rebuild(g, costs, 1, n))) {
        rkm_graph_destroy(n);
        return r;
    }
    *out = n;
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

/* What every info query checks: a graph, an output, an id in [0, n). */
static rkm_result rkm__info_args(const rkm_graph *g, const void *out, int32_t id, size_t n, const char *fn,
                                 const char *what)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!out) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "%s: out is NULL", fn);
    if (id < 0 || (size_t)id >= n) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "%s: %s %d does not exist", fn, what, (int)id);
    return RKM_OK;
}

rkm_result rkm_graph_tensor_info(const rkm_graph *g, int32_t id, rkm_tensor_info *out)
{
    rkm_result r = rkm__info_args(g, out, id, g ? g->n_tensors : 0, "rkm_graph_tensor_info", "tensor id");
    if (r) return r;
    const rkm__tensor *t = &g->tensors[id];
    *out = (rkm_tensor_info){t->name, t->bytes, t->flags, t->producer, t->has_grad, t->n_contrib};
    return RKM_OK;
}

rkm_result rkm_graph_op_info(const rkm_graph *g, int32_t id, rkm_op_desc *out)
{
    rkm_result r = rkm__info_args(g, out, id, g ? g->n_ops : 0, "rkm_graph_op_info", "op id");
    if (r) return r;
    const rkm__op *o = &g->ops[id];
    *out = (rkm_op_desc){o->name, o->fwd, o->bwd, o->in, o->n_in, o->out, o->n_out, o->saved, o->n_saved,
                         o->phantom, o->fwd_ws, o->bwd_ws, o->scratch, o->flags};
    return RKM_OK;
}

rkm_result rkm_graph_block_info(const rkm_graph *g, int32_t b, rkm_block_info *out)
{
    rkm_result r = g ? rkm__check_finalized(g, "rkm_graph_block_info") : RKM_ERROR_ARGUMENT;
    if (!r) r = rkm__info_args(g, out, b, (size_t)g->n_blocks, "rkm_graph_block_info", "block");
    if (r) return r;
    const rkm__block *k = &g->blocks[b];
    *out = (rkm_block_info){k->ops, k->n_ops, k->in, k->out, k->cls};
    return RKM_OK;
}

/* ===========================================================================
 * 3. Graph files (.rkg): reader and writer
 * ========================================================================= */

#define RKM_MAX_TOKENS 16

/* A statement reader shared by the .rkg and .rkp parsers: one statement a
 * line, tokens split by spaces or tabs, '#' to the end of the line ignored. */
typedef struct rkm__reader {
    rkm_context *ctx;
    const char *src;
    const char *p, *end;
    int32_t line;
    char *buf;
    size_t cap;
    char *tok[RKM_MAX_TOKENS];
    int ntok;
} rkm__reader;

static rkm_result rkm__rerr(rkm__reader *r, rkm_result code, const char *fmt, ...)
{
    char msg[RKM_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rkm__err(r->ctx, code, "%s:%d: %s", r->src, (int)r->line, msg);
}

/* Next non-empty statement into r->tok. RKM_OK with ntok > 0, or ntok == 0
 * at the end of the text. */
static rkm_result rkm__next_stmt(rkm__reader *r)
{
    r->ntok = 0;
    while (r->p < r->end) {
        const char *nl = memchr(r->p, '\n', (size_t)(r->end - r->p));
        const char *le = nl ? nl : r->end;
        size_t n = (size_t)(le - r->p);
        r->line++;
        if (!rkm__reserve(r->ctx, (void **)&r->buf, &r->cap, n + 1, 1)) return rkm__nomem(r->ctx, r->src);
        if (memchr(r->p, 0, n)) return rkm__rerr(r, RKM_ERROR_PARSE, "a NUL byte is not allowed in the text");
        memcpy(r->buf, r->p, n);
        r->buf[n] = 0;
        r->p = nl ? nl + 1 : r->end;
        char *hash = strchr(r->buf, '#');
        if (hash) *hash = 0;
        for (char *s = r->buf;;) {
            while (*s == ' ' || *s == '\t' || *s == '\r') s++;
            if (!*s) break;
            if (r->ntok == RKM_MAX_TOKENS) return rkm__rerr(r, RKM_ERROR_PARSE, "too many fields on one line");
            r->tok[r->ntok++] = s;
            while (*s && *s != ' ' && *s != '\t' && *s != '\r') s++;
            if (*s) *s++ = 0;
        }
        if (r->ntok) return RKM_OK;
    }
    return RKM_OK;
}

static void rkm__reader_free(rkm__reader *r) { rkm__free(r->ctx, r->buf, r->cap); }

/* Unsigned 64-bit decimal: digits only, no overflow. */
static int rkm__parse_u64(const char *s, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return 0;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
    }
    *out = v;
    return 1;
}

/* The length of the decimal number s starts with,
 * [0-9]*[.[0-9]*][(e|E)[+-][0-9]+] with a digit somewhere; 0 if none. No
 * hex, no inf or nan: what strtod also takes is not the documented syntax. */
static size_t rkm__decimal_len(const char *s)
{
    const char *p = s;
    int digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (*p == '.') {
        p++;
        while (*p >= '0' && *p <= '9') p++, digits++;
    }
    if (!digits) return 0;
    if (*p == 'e' || *p == 'E') {
        const char *e = p + 1;
        if (*e == '+' || *e == '-') e++;
        if (*e >= '0' && *e <= '9') {
            while (*e >= '0' && *e <= '9') e++;
            p = e;
        }
    }
    return (size_t)(p - s);
}

/* The value of the decimal number s[0..n), finite and non-negative; 0 if not. */
static int rkm__decimal_value(const char *s, size_t n, double *out)
{
    char buf[64];
    if (!n || n >= sizeof buf) return 0;
    memcpy(buf, s, n);
    buf[n] = 0;
    double v = strtod(buf, NULL);
    if (!isfinite(v) || v < 0) return 0;
    *out = v;
    return 1;
}

/* Non-negative decimal float, the whole of s. */
static int rkm__parse_time(const char *s, double *out)
{
    size_t n = rkm__decimal_len(s);
    return n && !s[n] && rkm__decimal_value(s, n, out);
}

/* Split "a,b,c" into tensor ids appended to *ids. */
static rkm_result rkm__parse_names(rkm__reader *r, const rkm_graph *g, const char *key, char *list, int32_t **ids,
                                   size_t *n, size_t *cap)
{
    for (char *s = list;;) {
        char *comma = strchr(s, ',');
        if (comma) *comma = 0;
        if (!rkm__name_ok(s)) return rkm__rerr(r, RKM_ERROR_PARSE, "%s=: '%.64s' is not a valid tensor name", key, s);
        int32_t id = rkm_graph_find_tensor(g, s);
        if (id < 0) return rkm__rerr(r, RKM_ERROR_GRAPH, "%s=: tensor %s is not declared (declare tensors before use)", key, s);
        if (!rkm__reserve(r->ctx, (void **)ids, cap, *n + 1, sizeof **ids)) return rkm__nomem(r->ctx, r->src);
        (*ids)[(*n)++] = id;
        if (!comma) return RKM_OK;
        s = comma + 1;
    }
}

static rkm_result rkm__read_tensor(rkm__reader *r, rkm_graph *g)
{
    if (r->ntok < 3 || r->ntok > 5)
        return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'tensor NAME BYTES [input] [nograd]'");
    if (!rkm__name_ok(r->tok[1]))
        return rkm__rerr(r, RKM_ERROR_PARSE, "tensor '%.64s': a name is 1 to 255 characters of [A-Za-z0-9_.:/[]-]", r->tok[1]);
    uint64_t bytes;
    if (!rkm__parse_u64(r->tok[2], &bytes))
        return rkm__rerr(r, RKM_ERROR_PARSE, "tensor %.64s: '%.64s' is not a byte count (unsigned 64-bit decimal)",
                         r->tok[1], r->tok[2]);
    unsigned flags = 0;
    for (int i = 3; i < r->ntok; i++) {
        unsigned f = strcmp(r->tok[i], "input") == 0 ? RKM_TENSOR_INPUT : strcmp(r->tok[i], "nograd") == 0 ? RKM_TENSOR_NOGRAD : 0;
        if (!f) return rkm__rerr(r, RKM_ERROR_PARSE, "tensor %.64s: unknown flag '%.64s' (input or nograd)", r->tok[1], r->tok[i]);
        if (flags & f) return rkm__rerr(r, RKM_ERROR_PARSE, "tensor %.64s: flag %s given twice", r->tok[1], r->tok[i]);
        flags |= f;
    }
    return rkm_graph_add_tensor(g, r->tok[1], bytes, flags, NULL);
}

static const char *const rkm__op_keys[] = {"fwd", "bwd", "in", "out", "saved", "phantom", "fwd_ws", "bwd_ws", "scratch"};
enum { RKM__K_FWD, RKM__K_BWD, RKM__K_IN, RKM__K_OUT, RKM__K_SAVED, RKM__K_PHANTOM, RKM__K_FWS, RKM__K_BWS, RKM__K_SCRATCH,
       RKM__K_N };

typedef struct rkm__idlist {
    int32_t *ids;
    size_t n, cap;
} rkm__idlist;

static rkm_result rkm__read_op(rkm__reader *r, rkm_graph *g)
{
    if (r->ntok < 2) return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'op NAME fwd=S bwd=S ...'");
    const char *name = r->tok[1];
    if (!rkm__name_ok(name))
        return rkm__rerr(r, RKM_ERROR_PARSE, "op '%.64s': a name is 1 to 255 characters of [A-Za-z0-9_.:/[]-]", name);
    int seen[RKM__K_N] = {0};
    rkm__idlist lists[3] = {{0}};
    uint64_t num[4] = {0, 0, 0, 0};
    rkm_op_desc d;
    memset(&d, 0, sizeof d);
    d.name = name;
    rkm_result res = RKM_OK;
    for (int i = 2; i < r->ntok && res == RKM_OK; i++) {
        char *eq = strchr(r->tok[i], '=');
        unsigned flag = strcmp(r->tok[i], "inplace") == 0 ? RKM_OP_INPLACE
                        : strcmp(r->tok[i], "grad_inplace") == 0 ? RKM_OP_GRAD_INPLACE : 0;
        if (flag) {
            if (d.flags & flag) res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: flag %s given twice", name, r->tok[i]);
            d.flags |= flag;
            continue;
        }
        if (!eq) {
            res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: '%.64s' is not KEY=VALUE, inplace or grad_inplace", name,
                            r->tok[i]);
            break;
        }
        *eq = 0;
        int k = 0;
        while (k < RKM__K_N && strcmp(r->tok[i], rkm__op_keys[k]) != 0) k++;
        if (k == RKM__K_N) {
            res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: unknown key '%.64s'", name, r->tok[i]);
        } else if (seen[k]++) {
            res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: key %s given twice", name, rkm__op_keys[k]);
        } else if (k == RKM__K_FWD || k == RKM__K_BWD) {
            double *t = k == RKM__K_FWD ? &d.fwd_seconds : &d.bwd_seconds;
            if (!rkm__parse_time(eq + 1, t))
                res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: %s='%.64s' is not a non-negative decimal time in seconds",
                                name, rkm__op_keys[k], eq + 1);
        } else if (k >= RKM__K_PHANTOM) {
            if (!rkm__parse_u64(eq + 1, &num[k - RKM__K_PHANTOM]))
                res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: %s='%.64s' is not a byte count", name, rkm__op_keys[k], eq + 1);
        } else {
            rkm__idlist *l = &lists[k - RKM__K_IN];
            res = rkm__parse_names(r, g, rkm__op_keys[k], eq + 1, &l->ids, &l->n, &l->cap);
        }
    }
    if (res == RKM_OK && (!seen[RKM__K_FWD] || !seen[RKM__K_BWD]))
        res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: fwd= and bwd= are required", name);
    if (res == RKM_OK && !seen[RKM__K_OUT]) res = rkm__rerr(r, RKM_ERROR_PARSE, "op %.64s: out= is required", name);
    if (res == RKM_OK) {
        d.in = lists[0].ids;
        d.n_in = (int32_t)lists[0].n;
        d.out = lists[1].ids;
        d.n_out = (int32_t)lists[1].n;
        d.saved = lists[2].ids;
        d.n_saved = (int32_t)lists[2].n;
        d.phantom = num[0];
        d.fwd_ws = num[1];
        d.bwd_ws = num[2];
        d.scratch = num[3];
        res = rkm_graph_add_op(g, &d, NULL);
    }
    for (int i = 0; i < 3; i++) rkm__free(r->ctx, lists[i].ids, lists[i].cap * sizeof(int32_t));
    return res;
}

static rkm_result rkm__read_graph_stmts(rkm__reader *r, rkm_graph *g)
{
    rkm_result res = rkm__next_stmt(r);
    if (res) return res;
    if (r->ntok != 2 || strcmp(r->tok[0], "rockmate-graph") != 0 || strcmp(r->tok[1], "1") != 0) {
        if (!r->ntok) r->line = r->line ? r->line : 1;
        return rkm__rerr(r, RKM_ERROR_PARSE, "the first statement must be the header 'rockmate-graph 1'");
    }
    for (;;) {
        if ((res = rkm__next_stmt(r))) return res;
        if (!r->ntok) break;
        g->src_line = r->line;
        const char *w = r->tok[0];
        if (strcmp(w, "tensor") == 0) res = rkm__read_tensor(r, g);
        else if (strcmp(w, "op") == 0) res = rkm__read_op(r, g);
        else if (strcmp(w, "loss") == 0) {
            if (r->ntok != 2) return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'loss TENSOR'");
            int32_t t = rkm_graph_find_tensor(g, r->tok[1]);
            if (t < 0) return rkm__rerr(r, RKM_ERROR_GRAPH, "loss: tensor %.64s is not declared", r->tok[1]);
            res = rkm_graph_set_loss(g, t);
        } else
            return rkm__rerr(r, RKM_ERROR_PARSE, "unknown statement '%.64s' (tensor, op or loss)", w);
        if (res) return res;
    }
    g->src_line = r->line;
    return rkm_graph_finalize(g);
}

rkm_result rkm_graph_read_string(rkm_context *ctx, const char *text, size_t len, const char *source_name, rkm_graph **out)
{
    if (!out) return ctx ? rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_graph_read_string: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!ctx) return RKM_ERROR_ARGUMENT;
    if (!text && len) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_graph_read_string: text is NULL");
    rkm_graph *g;
    rkm_result res = rkm_graph_create(ctx, &g);
    if (res) return res;
    rkm__reader r;
    memset(&r, 0, sizeof r);
    r.ctx = ctx;
    r.src = source_name ? source_name : "<string>";
    r.p = text ? text : "";
    r.end = r.p + len;
    g->src_name = r.src;
    res = rkm__read_graph_stmts(&r, g);
    rkm__reader_free(&r);
    g->src_name = NULL;
    g->src_line = 0;
    if (res) {
        rkm_graph_destroy(g);
        return res;
    }
    *out = g;
    return RKM_OK;
}

/* Read a whole file through the context allocator. */
static rkm_result rkm__slurp(rkm_context *ctx, const char *path, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return rkm__err(ctx, RKM_ERROR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 0, n = 0;
    char *buf = NULL;
    rkm_result res = RKM_OK;
    for (;;) {
        if (!rkm__reserve(ctx, (void **)&buf, &cap, n + 65536, 1)) {
            res = rkm__nomem(ctx, path);
            break;
        }
        errno = 0;
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            /* errno names the cause (EISDIR: a folder given as a file) */
            if (ferror(f))
                res = rkm__err(ctx, RKM_ERROR_IO, "%s: cannot read: %s", path, errno ? strerror(errno) : "read error");
            break;
        }
    }
    fclose(f);
    if (res) {
        rkm__free(ctx, buf, cap);
        return res;
    }
    /* Shrink to n + 1 bytes: callers free with *len + 1. */
    char *fit = rkm__realloc(ctx, buf, cap, n + 1);
    if (!fit) {
        rkm__free(ctx, buf, cap);
        return rkm__nomem(ctx, path);
    }
    *data = fit;
    *len = n;
    return RKM_OK;
}

rkm_result rkm_graph_read_file(rkm_context *ctx, const char *path, rkm_graph **out)
{
    if (!out) return ctx ? rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_graph_read_file: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!ctx || !path) return ctx ? rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_graph_read_file: path is NULL") : RKM_ERROR_ARGUMENT;
    char *data;
    size_t len;
    rkm_result res = rkm__slurp(ctx, path, &data, &len);
    if (res) return res;
    res = rkm_graph_read_string(ctx, data, len, path, out);
    rkm__free(ctx, data, len + 1);
    return res;
}

/* Buffered output through a rkm_write_fn. */
typedef struct rkm__out {
    rkm_write_fn fn;
    void *user;
    char buf[4096];
    size_t n;
    int failed;
} rkm__out;

static void rkm__out_flush(rkm__out *o)
{
    if (o->n && !o->failed && o->fn(o->user, o->buf, o->n) != 0) o->failed = 1;
    o->n = 0;
}

static void rkm__outf(rkm__out *o, const char *fmt, ...)
{
    char tmp[RKM_NAME_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof tmp) n = (int)sizeof tmp - 1;
    if (o->n + (size_t)n > sizeof o->buf) rkm__out_flush(o);
    memcpy(o->buf + o->n, tmp, (size_t)n);
    o->n += (size_t)n;
}

/* The shortest %g form of x that reads back as exactly x. */
static void rkm__fmt_time(double x, char *buf, size_t size)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) return;
    }
}

static void rkm__out_list(rkm__out *o, const rkm_graph *g, const char *key, const int32_t *ids, int32_t n)
{
    if (!n) return;
    rkm__outf(o, " %s=", key);
    for (int32_t i = 0; i < n; i++) rkm__outf(o, "%s%s", i ? "," : "", g->tensors[ids[i]].name);
}

static void rkm__write_graph_to(const rkm_graph *g, rkm__out *o)
{
    rkm__outf(o, "rockmate-graph 1\n");
    for (size_t t = 0; t < g->n_tensors; t++) {
        const rkm__tensor *x = &g->tensors[t];
        rkm__outf(o, "tensor %s %llu%s%s\n", x->name, (unsigned long long)x->bytes,
                  x->flags & RKM_TENSOR_INPUT ? " input" : "", x->flags & RKM_TENSOR_NOGRAD ? " nograd" : "");
    }
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *op = &g->ops[i];
        char f[40], b[40];
        rkm__fmt_time(op->fwd, f, sizeof f);
        rkm__fmt_time(op->bwd, b, sizeof b);
        rkm__outf(o, "op %s fwd=%s bwd=%s", op->name, f, b);
        rkm__out_list(o, g, "in", op->in, op->n_in);
        rkm__out_list(o, g, "out", op->out, op->n_out);
        rkm__out_list(o, g, "saved", op->saved, op->n_saved);
        if (op->phantom) rkm__outf(o, " phantom=%llu", (unsigned long long)op->phantom);
        if (op->fwd_ws) rkm__outf(o, " fwd_ws=%llu", (unsigned long long)op->fwd_ws);
        if (op->scratch) rkm__outf(o, " scratch=%llu", (unsigned long long)op->scratch);
        if (op->bwd_ws) rkm__outf(o, " bwd_ws=%llu", (unsigned long long)op->bwd_ws);
        rkm__outf(o, "%s%s\n", op->flags & RKM_OP_INPLACE ? " inplace" : "", op->flags & RKM_OP_GRAD_INPLACE ? " grad_inplace" : "");
    }
    rkm__outf(o, "loss %s\n", g->tensors[g->loss].name);
}

rkm_result rkm_graph_write(const rkm_graph *g, rkm_write_fn fn, void *user)
{
    if (!g || !fn) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_write: write function is NULL") : RKM_ERROR_ARGUMENT;
    if (!g->finalized) return rkm__err(g->ctx, RKM_ERROR_STATE, "rkm_graph_write: the graph is not finalized");
    rkm__out o = {fn, user, {0}, 0, 0};
    rkm__write_graph_to(g, &o);
    rkm__out_flush(&o);
    return o.failed ? rkm__err(g->ctx, RKM_ERROR_IO, "rkm_graph_write: the write function failed") : RKM_OK;
}

static int rkm__file_write(void *user, const char *data, size_t len)
{
    return fwrite(data, 1, len, (FILE *)user) == len ? 0 : 1;
}

/* Open path, run writer(obj) into it, close; errors name the path. */
static rkm_result rkm__write_file(rkm_context *ctx, const char *path, rkm_result (*writer)(const void *, rkm_write_fn, void *),
                                  const void *obj)
{
    if (!path) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "write: path is NULL");
    FILE *f = fopen(path, "wb");
    if (!f) return rkm__err(ctx, RKM_ERROR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    rkm_result res = writer(obj, rkm__file_write, f);
    if (fclose(f) != 0 && res == RKM_OK) res = rkm__err(ctx, RKM_ERROR_IO, "%s: write error", path);
    if (res == RKM_ERROR_IO) rkm__err(ctx, RKM_ERROR_IO, "%s: write error", path);
    return res;
}

static rkm_result rkm__graph_writer(const void *g, rkm_write_fn fn, void *user) { return rkm_graph_write(g, fn, user); }

rkm_result rkm_graph_write_file(const rkm_graph *g, const char *path)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    return rkm__write_file(g->ctx, path, rkm__graph_writer, g);
}


/* ===========================================================================
 * 4. Plans: steps, files (.rkp)
 * ========================================================================= */

/* A plan is born checked (rkm__plan_birth, section 5) and never changes. */
struct rkm_plan {
    const rkm_graph *g;
    rkm_context *ctx;
    rkm_step *steps;
    size_t n_steps;
    uint64_t *mem_after, *step_peak; /* [n_steps] */
    /* Executor annotations: for step i, flag_off[i] indexes `flags`:
     * fwd -> [recompute, out_new...], bwd -> [in_grad...]. */
    size_t *flag_off;
    uint8_t *flags;
    size_t n_flags;
    rkm_buffer *buffers; /* lifetimes from the replay; offsets 0 (rkm_plan_layout places them) */
    size_t n_buffers, cap_buffers;
    rkm_plan_stats stats;
};

void rkm_plan_destroy(rkm_plan *p)
{
    if (!p) return;
    rkm_context *ctx = p->ctx;
    rkm__free(ctx, p->steps, p->n_steps * sizeof *p->steps);
    rkm__free(ctx, p->mem_after, (p->n_steps + 1) * sizeof *p->mem_after);
    rkm__free(ctx, p->step_peak, (p->n_steps + 1) * sizeof *p->step_peak);
    rkm__free(ctx, p->flag_off, (p->n_steps + 1) * sizeof *p->flag_off);
    rkm__free(ctx, p->flags, p->n_flags);
    rkm__free(ctx, p->buffers, p->cap_buffers * sizeof *p->buffers);
    rkm__free(ctx, p, sizeof *p);
}

/* A growable step list: what producers of plans build, before birth. */
typedef struct rkm__steps {
    rkm_context *ctx;
    rkm_step *s;
    size_t n, cap;
} rkm__steps;

static int rkm__steps_push(rkm__steps *l, int32_t kind, int32_t index, int32_t save)
{
    if (!rkm__reserve(l->ctx, (void **)&l->s, &l->cap, l->n + 1, sizeof *l->s)) return 0;
    l->s[l->n].kind = kind;
    l->s[l->n].index = index;
    l->s[l->n].save = save;
    l->s[l->n].inplace = 0;
    l->n++;
    return 1;
}

/* Append a copy of *st (a step as given: the birth checks it). */
static int rkm__steps_push_step(rkm__steps *l, const rkm_step *st)
{
    if (!rkm__steps_push(l, st->kind, st->index, st->kind == RKM_STEP_FWD ? st->save : 0)) return 0;
    l->s[l->n - 1].inplace = st->inplace;
    return 1;
}

/* Shrink to exactly n steps so that the owner frees with n * size. */
static rkm_step *rkm__steps_take(rkm__steps *l)
{
    rkm_step *s = rkm__realloc(l->ctx, l->s, l->cap * sizeof *l->s, (l->n ? l->n : 1) * sizeof *l->s);
    if (!s) return NULL;
    if (!l->n) {
        rkm__free(l->ctx, s, sizeof *s);
        s = NULL;
    }
    l->s = NULL;
    l->n = l->cap = 0;
    return s;
}

static void rkm__steps_free(rkm__steps *l)
{
    rkm__free(l->ctx, l->s, l->cap * sizeof *l->s);
    l->s = NULL;
    l->n = l->cap = 0;
}

/* A draft of the n given steps (each as rkm__steps_push_step copies it),
 * for a birth; out of memory names `what` and leaves nothing. */
static rkm_result rkm__steps_copy(rkm_context *ctx, const rkm_step *steps, size_t n, rkm__steps *d, const char *what)
{
    *d = (rkm__steps){ctx, NULL, 0, 0};
    for (size_t i = 0; i < n; i++)
        if (!rkm__steps_push_step(d, &steps[i])) {
            rkm__steps_free(d);
            return rkm__nomem(ctx, what);
        }
    return RKM_OK;
}

/* Does a step of this kind name an op (fwd, bwd, free_saved), not a tensor? */
static int rkm__step_on_op(int32_t kind)
{
    return kind == RKM_STEP_FWD || kind == RKM_STEP_BWD || kind == RKM_STEP_FREE_SAVED;
}

static int rkm__step_index_ok(const rkm_graph *g, const rkm_step *s)
{
    int compute = s->kind == RKM_STEP_FWD || s->kind == RKM_STEP_BWD;
    if (s->inplace != 0 && !(compute && s->inplace == 1)) return 0;
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

const rkm_graph *rkm_plan_graph(const rkm_plan *p) { return p ? p->g : NULL; }
size_t rkm_plan_num_steps(const rkm_plan *p) { return p ? p->n_steps : 0; }
const rkm_step *rkm_plan_steps(const rkm_plan *p) { return p ? p->steps : NULL; }
const uint64_t *rkm_plan_mem_after(const rkm_plan *p) { return p ? p->mem_after : NULL; }
const uint64_t *rkm_plan_step_peaks(const rkm_plan *p) { return p ? p->step_peak : NULL; }
size_t rkm_plan_num_buffers(const rkm_plan *p) { return p ? p->n_buffers : 0; }

static const char *const rkm__step_words[] = {"fwd", "loss", "bwd", "free", "free_saved", "free_grad"};

void rkm_step_text(const rkm_graph *g, const rkm_step *s, char *buf, size_t size)
{
    if (!buf || !size) return;
    if (!g || !s) {
        buf[0] = '\0';
        return;
    }
    if (!rkm__step_index_ok(g, s)) {
        snprintf(buf, size, "<kind %d index %d>", (int)s->kind, (int)s->index);
        return;
    }
    switch (s->kind) {
    case RKM_STEP_LOSS: snprintf(buf, size, "loss"); break;
    case RKM_STEP_FWD:
        snprintf(buf, size, "fwd %s%s%s", g->ops[s->index].name, s->save ? " save" : "", s->inplace ? " inplace" : "");
        break;
    case RKM_STEP_BWD:
        snprintf(buf, size, "bwd %s%s", g->ops[s->index].name, s->inplace ? " inplace" : "");
        break;
    case RKM_STEP_FREE_SAVED: snprintf(buf, size, "%s %s", rkm__step_words[s->kind], g->ops[s->index].name); break;
    default: snprintf(buf, size, "%s %s", rkm__step_words[s->kind], g->tensors[s->index].name); break;
    }
}

static rkm_result rkm__plan_birth(const rkm_graph *g, rkm__steps *draft, rkm_sim_result *res, rkm_plan **out);
static rkm_result rkm__plan_seal(rkm_plan *p, uint64_t alignment);
static int rkm__layout_fits(const rkm_plan *p, uint64_t align);

/* A plan handed out by the API: born (r is the birth's result), then laid
 * out at `alignment`; on failure nothing is left. A read, built or baseline
 * plan whose buffers rounded up add up past 64 bits is handed out without a
 * layout (its alignment 0; rkm_plan_layout says why). */
static rkm_result rkm__plan_handout(rkm_result r, uint64_t alignment, rkm_plan **out)
{
    if (r == RKM_OK && !rkm__layout_fits(*out, alignment)) return RKM_OK;
    if (r == RKM_OK && (r = rkm__plan_seal(*out, alignment))) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* What every function that makes a plan of g checks first: *out cleared,
 * g given and finalized, its input (`what`) given when input_ok is 0. */
static rkm_result rkm__plan_args(const rkm_graph *g, rkm_plan **out, int input_ok, const char *fn, const char *what)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "%s: out is NULL", fn) : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!input_ok) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "%s: %s is NULL", fn, what);
    return rkm__check_finalized(g, fn);
}

rkm_result rkm_plan_create(const rkm_graph *g, const rkm_step *steps, size_t n, rkm_sim_result *res, rkm_plan **out)
{
    rkm_result r = rkm__plan_args(g, out, steps || !n, "rkm_plan_create", "steps");
    if (r) return r;
    rkm__steps d;
    if ((r = rkm__steps_copy(g->ctx, steps, n, &d, "rkm_plan_create"))) return r;
    return rkm__plan_handout(rkm__plan_birth(g, &d, res, out), RKM_ARENA_ALIGN, out);
}

/* Plan files (.rkp) */

static rkm_result rkm__read_step(rkm__reader *r, const rkm_graph *g, rkm__steps *d)
{
    const char *w = r->tok[0];
    int kind = -1;
    for (int k = 0; k < 6; k++)
        if (strcmp(w, rkm__step_words[k]) == 0) kind = k;
    if (kind < 0)
        return rkm__rerr(r, RKM_ERROR_PARSE, "unknown step '%.64s' (fwd, loss, bwd, free, free_saved, free_grad)", w);
    rkm_step st = {kind, 0, 0, 0};
    if (kind == RKM_STEP_LOSS) {
        if (r->ntok != 1) return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'loss' alone");
        st.index = g->loss;
    } else {
        int want_max = kind == RKM_STEP_FWD ? 4 : kind == RKM_STEP_BWD ? 3 : 2;
        const char *form = kind == RKM_STEP_FWD ? "fwd OP [save] [inplace]" : kind == RKM_STEP_BWD ? "bwd OP [inplace]" : NULL;
        if (r->ntok < 2 || r->ntok > want_max)
            return form ? rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s'", form) : rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s NAME'", w);
        for (int i = 2; i < r->ntok; i++) {
            int is_save = kind == RKM_STEP_FWD && strcmp(r->tok[i], "save") == 0 && i == 2;
            int is_inplace = strcmp(r->tok[i], "inplace") == 0 && !st.inplace;
            if (!is_save && !is_inplace)
                return rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s', not '%.64s' as word %d", form, r->tok[i], i + 1);
            st.save |= is_save;
            st.inplace |= is_inplace;
        }
        int on_op = rkm__step_on_op(kind);
        st.index = on_op ? rkm_graph_find_op(g, r->tok[1]) : rkm_graph_find_tensor(g, r->tok[1]);
        if (st.index < 0)
            return rkm__rerr(r, RKM_ERROR_PARSE, "%s: no %s named '%.64s' in the graph", w, on_op ? "op" : "tensor", r->tok[1]);
    }
    return rkm__steps_push_step(d, &st) ? RKM_OK : rkm__nomem(r->ctx, r->src);
}

/* Parse .rkp text into d: syntax and names only. *lines (capacity *cap)
 * receives each step's line, for the messages of the rules. */
static rkm_result rkm__read_steps(const rkm_graph *g, const char *text, size_t len, const char *source_name, rkm__steps *d,
                                  int32_t **lines, size_t *cap)
{
    rkm__reader r;
    memset(&r, 0, sizeof r);
    r.ctx = g->ctx;
    r.src = source_name ? source_name : "<string>";
    r.p = text ? text : "";
    r.end = r.p + len;
    rkm_result res = rkm__next_stmt(&r);
    if (!res && (r.ntok != 2 || strcmp(r.tok[0], "rockmate-plan") != 0 || strcmp(r.tok[1], "1") != 0)) {
        if (!r.line) r.line = 1;
        res = rkm__rerr(&r, RKM_ERROR_PARSE, "the first statement must be the header 'rockmate-plan 1'");
    }
    while (!res) {
        if ((res = rkm__next_stmt(&r)) || !r.ntok) break;
        res = rkm__read_step(&r, g, d);
        if (!res && !rkm__reserve(g->ctx, (void **)lines, cap, d->n, sizeof **lines)) res = rkm__nomem(g->ctx, r.src);
        if (!res) (*lines)[d->n - 1] = (int32_t)r.line;
    }
    rkm__reader_free(&r);
    return res;
}

rkm_result rkm_plan_read_string(const rkm_graph *g, const char *text, size_t len, const char *source_name,
                                rkm_sim_result *sim, rkm_plan **out)
{
    rkm_result res = rkm__plan_args(g, out, text || !len, "rkm_plan_read_string", "text");
    if (res) return res;
    rkm__steps d = {g->ctx, NULL, 0, 0};
    int32_t *lines = NULL;
    size_t cap = 0;
    rkm_sim_result tmp;
    if (!sim) sim = &tmp;
    if ((res = rkm__read_steps(g, text, len, source_name, &d, &lines, &cap))) {
        rkm__steps_free(&d);
    } else if ((res = rkm__plan_birth(g, &d, sim, out)) == RKM_ERROR_PLAN) {
        /* The rule's message, led by the file and the step's line. */
        char msg[RKM_ERRMSG_SIZE];
        snprintf(msg, sizeof msg, "%s", g->ctx->errmsg);
        const char *src = source_name ? source_name : "<string>";
        if (sim->fail_step >= 0 && (size_t)sim->fail_step < sim->num_steps)
            rkm__err(g->ctx, res, "%s:%d: %s", src, (int)lines[sim->fail_step], msg);
        else
            rkm__err(g->ctx, res, "%s: %s", src, msg);
    }
    rkm__free(g->ctx, lines, cap * sizeof *lines);
    return rkm__plan_handout(res, RKM_ARENA_ALIGN, out);
}

rkm_result rkm_plan_read_file(const rkm_graph *g, const char *path, rkm_sim_result *sim, rkm_plan **out)
{
    rkm_result res = rkm__plan_args(g, out, path != NULL, "rkm_plan_read_file", "path");
    if (res) return res;
    char *data;
    size_t len;
    res = rkm__slurp(g->ctx, path, &data, &len);
    if (res) return res;
    res = rkm_plan_read_string(g, data, len, path, sim, out);
    rkm__free(g->ctx, data, len + 1);
    return res;
}

rkm_result rkm_plan_write(const rkm_plan *p, rkm_write_fn fn, void *user)
{
    if (!p || !fn) return p ? rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_write: write function is NULL") : RKM_ERROR_ARGUMENT;
    rkm__out o = {fn, user, {0}, 0, 0};
    rkm__outf(&o, "rockmate-plan 1\n");
    for (size_t i = 0; i < p->n_steps; i++) {
        char text[RKM_NAME_MAX + 32];
        rkm_step_text(p->g, &p->steps[i], text, sizeof text);
        rkm__outf(&o, "%s\n", text);
    }
    rkm__out_flush(&o);
    return o.failed ? rkm__err(p->ctx, RKM_ERROR_IO, "rkm_plan_write: the write function failed") : RKM_OK;
}

static rkm_result rkm__plan_writer(const void *p, rkm_write_fn fn, void *user) { return rkm_plan_write(p, fn, user); }

rkm_result rkm_plan_write_file(const rkm_plan *p, const char *path)
{
    if (!p) return RKM_ERROR_ARGUMENT;
    return rkm__write_file(p->ctx, path, rkm__plan_writer, p);
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

/* What a forward of o adds to the live memory: its outputs not live yet,
 * its saved state when run with save. */
/* The transient bytes of a forward of op x: its workspace, and its scratch
 * when the run keeps no saved state (with save, or with the saved state
 * live already, the scratch is written into the saved state). */
static uint64_t rkm__sim_fwd_ws(const rkm__sim *s, const rkm__op *o, int32_t x, int save)
{
    return o->fwd_ws + (!save && !s->P[x] ? o->scratch : 0);
}

/* What a forward of o adds to the live memory: its outputs not live yet
 * (but out[0] of a run in place, which takes in[0]'s bytes), its saved
 * state when run with save. */
static uint64_t rkm__sim_fwd_adds(const rkm__sim *s, const rkm__op *o, int save, int inplace)
{
    uint64_t add = save ? o->phantom : 0;
    for (int32_t k = inplace ? 1 : 0; k < o->n_out; k++)
        if (!s->D[o->out[k]]) add += s->g->tensors[o->out[k]].bytes;
    return add;
}

/* What a backward of o adds: the gradients of its inputs not live yet (but
 * grad(in[0]) of a run in place, which takes grad(out[0])'s bytes). */
static uint64_t rkm__sim_bwd_adds(const rkm__sim *s, const rkm__op *o, int inplace)
{
    uint64_t add = 0;
    for (int32_t k = inplace ? 1 : 0; k < o->n_in; k++) {
        const rkm__tensor *t = &s->g->tensors[o->in[k]];
        if (t->has_grad && !s->G[o->in[k]]) add += t->bytes;
    }
    return add;
}

/* The in-place rules of a fwd or bwd step of o (RKM_RULE_NONE without
 * inplace): declared, and the buffer it makes not live yet. */
static rkm_rule rkm__sim_inplace_rule(const rkm__sim *s, const rkm_step *st, const rkm__op *o, int32_t *obj)
{
    if (!st->inplace) return RKM_RULE_NONE;
    int fwd = st->kind == RKM_STEP_FWD;
    if (!(o->flags & (fwd ? RKM_OP_INPLACE : RKM_OP_GRAD_INPLACE))) return RKM_RULE_INPLACE_NOT_DECLARED;
    *obj = fwd ? o->out[0] : o->in[0];
    if (fwd && s->D[o->out[0]]) return RKM_RULE_INPLACE_OUT_LIVE;
    if (!fwd && s->G[o->in[0]]) return RKM_RULE_INPLACE_GRAD_LIVE;
    *obj = st->index;
    return RKM_RULE_NONE;
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
        rkm_rule rule = rkm__sim_inplace_rule(s, st, o, obj);
        if (rule != RKM_RULE_NONE) return rule;
        uint64_t add = rkm__sim_fwd_adds(s, o, st->save, st->inplace);
        *peak = s->mem + add + rkm__sim_fwd_ws(s, o, x, st->save);
        if (st->inplace) s->D[o->in[0]] = 0; /* out[0] has its bytes */
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
        rkm_rule rule = rkm__sim_inplace_rule(s, st, o, obj);
        if (rule != RKM_RULE_NONE) return rule;
        uint64_t add = rkm__sim_bwd_adds(s, o, st->inplace);
        *peak = s->mem + add + o->bwd_ws;
        if (st->inplace) s->G[o->out[0]] = 0; /* grad(in[0]) has its bytes */
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

/* What a plan's birth records besides its figures: the executor's flags
 * and every buffer's lifetime. open_*: per tensor / tensor / op, its open
 * buffer (-1 if none). */
typedef struct rkm__recorder {
    rkm_plan *p;
    int64_t *open_t, *open_g, *open_p;
    size_t n_open;
    size_t at; /* next free entry of p->flags */
} rkm__recorder;

static int rkm__buf_open(rkm__recorder *rc, int32_t kind, int32_t index, int64_t step, uint64_t bytes)
{
    rkm_plan *p = rc->p;
    if (!rkm__reserve(p->ctx, (void **)&p->buffers, &p->cap_buffers, p->n_buffers + 1, sizeof *p->buffers)) return 0;
    rkm_buffer *x = &p->buffers[p->n_buffers];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->index = index;
    x->first_step = x->last_step = step;
    x->bytes = bytes;
    x->takes_over = -1;
    if (kind == RKM_BUFFER_TENSOR) rc->open_t[index] = (int64_t)p->n_buffers;
    if (kind == RKM_BUFFER_GRAD) rc->open_g[index] = (int64_t)p->n_buffers;
    if (kind == RKM_BUFFER_PHANTOM) rc->open_p[index] = (int64_t)p->n_buffers;
    p->n_buffers++;
    return 1;
}

static void rkm__buf_close(rkm__recorder *rc, int64_t *open, int32_t index, int64_t step)
{
    rc->p->buffers[open[index]].last_step = step;
    open[index] = -1;
}

/* An in-place step i: the buffer open in from[from_index] passes its bytes
 * to a new buffer (kind, index) that takes it over. */
static int rkm__buf_take_over(rkm__recorder *rc, int64_t *from, int32_t from_index, int32_t kind, int32_t index,
                              int64_t i)
{
    int64_t old = from[from_index];
    if (old < 0) return 1; /* not live: the step breaks a rule */
    rkm__buf_close(rc, from, from_index, i);
    if (!rkm__buf_open(rc, kind, index, i, rc->p->buffers[old].bytes)) return 0;
    rc->p->buffers[rc->p->n_buffers - 1].takes_over = old;
    return 1;
}

static void rkm__recorder_free(rkm__recorder *rc)
{
    rkm__free(rc->p->ctx, rc->open_t, rc->n_open * sizeof *rc->open_t);
    rc->open_t = NULL;
}

/* Open arrays, and the input tensors' buffers: live from before the first
 * step to after the last. */
static rkm_result rkm__recorder_init(rkm__recorder *rc, rkm_plan *p)
{
    const rkm_graph *g = p->g;
    memset(rc, 0, sizeof *rc);
    rc->p = p;
    size_t nt = g->n_tensors + 1, no = g->n_ops + 1;
    rc->n_open = 2 * nt + no;
    rc->open_t = rkm__alloc(p->ctx, rc->n_open * sizeof *rc->open_t);
    if (!rc->open_t) return rkm__nomem(p->ctx, "plan");
    rc->open_g = rc->open_t + nt;
    rc->open_p = rc->open_g + nt;
    for (size_t i = 0; i < rc->n_open; i++) rc->open_t[i] = -1;
    for (size_t t = 0; t < g->n_tensors; t++) {
        if (!(g->tensors[t].flags & RKM_TENSOR_INPUT)) continue;
        if (!rkm__buf_open(rc, RKM_BUFFER_TENSOR, (int32_t)t, -1, g->tensors[t].bytes)) {
            rkm__recorder_free(rc);
            return rkm__nomem(p->ctx, "plan");
        }
        p->buffers[p->n_buffers - 1].last_step = (int64_t)p->n_steps;
    }
    return RKM_OK;
}

/* Before step i (s: the state before it, st's index in range): the flags
 * the executor passes and the buffers the step creates. */
static int rkm__record_before(rkm__recorder *rc, const rkm__sim *s, const rkm_step *st, int64_t i)
{
    const rkm_graph *g = s->g;
    uint8_t *fl = rc->p->flags;
    int32_t x = st->index;
    rc->p->flag_off[i] = rc->at;
    switch (st->kind) {
    case RKM_STEP_FWD: {
        const rkm__op *o = &g->ops[x];
        uint64_t ws = rkm__sim_fwd_ws(s, o, x, st->save);
        fl[rc->at++] = s->fwd_done[x];
        fl[rc->at++] = ws != o->fwd_ws; /* the call's workspace holds the scratch */
        for (int32_t k = 0; k < o->n_out; k++)
            fl[rc->at++] = k == 0 && st->inplace ? RKM_OUT_INPLACE : s->D[o->out[k]] ? RKM_OUT_LIVE : RKM_OUT_NEW;
        if (st->inplace && !rkm__buf_take_over(rc, rc->open_t, o->in[0], RKM_BUFFER_TENSOR, o->out[0], i)) return 0;
        for (int32_t k = st->inplace ? 1 : 0; k < o->n_out; k++)
            if (!s->D[o->out[k]] && !rkm__buf_open(rc, RKM_BUFFER_TENSOR, o->out[k], i, g->tensors[o->out[k]].bytes))
                return 0;
        if (st->save && !rkm__buf_open(rc, RKM_BUFFER_PHANTOM, x, i, o->phantom)) return 0;
        return !ws || rkm__buf_open(rc, RKM_BUFFER_WORKSPACE, x, i, ws);
    }
    case RKM_STEP_BWD: {
        const rkm__op *o = &g->ops[x];
        if (st->inplace && !rkm__buf_take_over(rc, rc->open_g, o->out[0], RKM_BUFFER_GRAD, o->in[0], i)) return 0;
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            int new_grad = g->tensors[t].has_grad && !s->G[t];
            fl[rc->at++] = k == 0 && st->inplace ? RKM_GRAD_INPLACE : !g->tensors[t].has_grad ? RKM_GRAD_NONE
                           : new_grad ? RKM_GRAD_NEW : RKM_GRAD_ACCUMULATE;
            if (new_grad && rc->open_g[t] < 0 && !rkm__buf_open(rc, RKM_BUFFER_GRAD, t, i, g->tensors[t].bytes)) return 0;
        }
        for (int32_t k = 0; k < o->n_out; k++) fl[rc->at++] = (uint8_t)g->tensors[o->out[k]].has_grad;
        return !o->bwd_ws || rkm__buf_open(rc, RKM_BUFFER_WORKSPACE, x, i, o->bwd_ws);
    }
    case RKM_STEP_LOSS: return s->loss_done || rkm__buf_open(rc, RKM_BUFFER_GRAD, x, i, g->tensors[x].bytes);
    }
    return 1;
}

/* After step i held: the buffers it releases. */
static void rkm__record_after(rkm__recorder *rc, const rkm_step *st, int64_t i)
{
    switch (st->kind) {
    case RKM_STEP_FREE: rkm__buf_close(rc, rc->open_t, st->index, i); break;
    case RKM_STEP_FREE_SAVED: rkm__buf_close(rc, rc->open_p, st->index, i); break;
    case RKM_STEP_FREE_GRAD: rkm__buf_close(rc, rc->open_g, st->index, i); break;
    }
}

/* Replay steps[0..n) from the current state. Fills res (peak, time, and on
 * failure rule/fail_step/fail_object), and when given: mem_after and
 * step_peak per step, and what a plan's birth records (rc). Returns 1 if
 * every step held, -1 if recording ran out of memory, 0 otherwise. */
static int rkm__sim_run_peaks(rkm__sim *s, const rkm_step *steps, size_t n, rkm_sim_result *res, uint64_t *mem_after,
                              uint64_t *step_peak, rkm__recorder *rc)
{
    memset(res, 0, sizeof *res);
    res->fail_step = -1;
    res->fail_object = -1;
    res->peak = s->mem;
    res->peak_step = -1;
    res->num_steps = n;
    for (size_t i = 0; i < n; i++) {
        uint64_t pk;
        int32_t obj;
        if (rc && rkm__step_index_ok(s->g, &steps[i]) && !rkm__record_before(rc, s, &steps[i], (int64_t)i)) return -1;
        rkm_rule rule = rkm__sim_step(s, &steps[i], &pk, &obj);
        if (rule != RKM_RULE_NONE) {
            res->rule = rule;
            res->fail_step = (int64_t)i;
            res->fail_object = obj;
            res->failed = steps[i];
            return 0;
        }
        if (rc) rkm__record_after(rc, &steps[i], (int64_t)i);
        if (res->peak_step < 0 || pk > res->peak) {
            res->peak = pk;
            res->peak_step = (int64_t)i;
        }
        if (steps[i].kind == RKM_STEP_FWD) res->time += s->g->ops[steps[i].index].fwd;
        else if (steps[i].kind == RKM_STEP_BWD) res->time += s->g->ops[steps[i].index].bwd;
        if (mem_after) mem_after[i] = s->mem;
        if (step_peak) step_peak[i] = pk;
    }
    return 1;
}

static int rkm__sim_run(rkm__sim *s, const rkm_step *steps, size_t n, rkm_sim_result *res, uint64_t *mem_after)
{
    return rkm__sim_run_peaks(s, steps, n, res, mem_after, NULL, NULL) == 1;
}

/* Each rule: its text, and whether the object it names is an op (else a
 * tensor). */
static const struct rkm__rule_info {
    const char *text;
    int on_op;
} rkm__rules[RKM_RULE_COUNT] = {
    [RKM_RULE_NONE] = {"no rule broken", 0},
    [RKM_RULE_FWD_INPUT_MISSING] = {"fwd: every in tensor must be live", 0},
    [RKM_RULE_SAVE_NOT_ALLOWED] = {"fwd save: the op must have phantom > 0 and a backward", 1},
    [RKM_RULE_SAVE_ALREADY_LIVE] = {"fwd save: the op's saved state must not be live already", 1},
    [RKM_RULE_LOSS_TENSOR_MISSING] = {"loss: the loss tensor must be live", 0},
    [RKM_RULE_LOSS_TWICE] = {"loss: runs exactly once", 0},
    [RKM_RULE_BWD_NO_BACKWARD] = {"bwd: the op must have a backward", 1},
    [RKM_RULE_BWD_TWICE] = {"bwd: each backward runs exactly once", 1},
    [RKM_RULE_BWD_SAVED_MISSING] = {"bwd: every saved tensor must be live", 0},
    [RKM_RULE_BWD_PHANTOM_MISSING] = {"bwd: the op's saved state (phantom) must be live", 1},
    [RKM_RULE_BWD_GRAD_MISSING] = {"bwd: the gradient of every output with a gradient must be live", 0},
    [RKM_RULE_BWD_GRAD_INCOMPLETE] = {"bwd: the gradient of every output must be complete (all contributors ran)", 0},
    [RKM_RULE_FREE_NOT_LIVE] = {"free: the tensor must be live", 0},
    [RKM_RULE_FREE_INPUT] = {"free: an input tensor is never freed", 0},
    [RKM_RULE_FREE_SAVED_NOT_LIVE] = {"free_saved: the op's saved state must be live", 1},
    [RKM_RULE_FREE_GRAD_NOT_LIVE] = {"free_grad: the gradient must be live", 0},
    [RKM_RULE_FREE_GRAD_INCOMPLETE] = {"free_grad: the gradient must be complete (all contributors ran)", 0},
    [RKM_RULE_END_LOSS_MISSING] = {"end: the loss step must have run", 0},
    [RKM_RULE_END_BWD_MISSING] = {"end: every op with a backward must run it", 1},
    [RKM_RULE_END_TENSOR_LIVE] = {"end: only input tensors may be live", 0},
    [RKM_RULE_END_SAVED_LIVE] = {"end: no saved state may be live", 1},
    [RKM_RULE_END_GRAD_LIVE] = {"end: no gradient may be live", 0},
    [RKM_RULE_BAD_STEP] = {"step kind or index out of range", 0},
    [RKM_RULE_INPLACE_NOT_DECLARED] = {"inplace: the op must declare it (inplace for fwd, grad_inplace for bwd)", 1},
    [RKM_RULE_INPLACE_OUT_LIVE] = {"fwd inplace: out[0] must not be live (it takes in[0]'s buffer)", 0},
    [RKM_RULE_INPLACE_GRAD_LIVE] = {"bwd inplace: grad(in[0]) must not be live (it takes grad(out[0])'s buffer)", 0},
};

const char *rkm_rule_string(rkm_rule rule)
{
    if ((int)rule < 0 || rule >= RKM_RULE_COUNT) return "unknown rule";
    return rkm__rules[rule].text;
}

static const char *rkm__obj_name(const rkm_graph *g, rkm_rule rule, int32_t obj)
{
    if (obj < 0) return "";
    if (rkm__rules[rule].on_op) return (size_t)obj < g->n_ops ? g->ops[obj].name : "";
    return (size_t)obj < g->n_tensors ? g->tensors[obj].name : "";
}

/* Forward steps of ops whose forward came earlier in the list. */
static rkm_result rkm__count_recomputes(const rkm_graph *g, const rkm_step *steps, size_t n, size_t *out)
{
    uint8_t *ran = rkm__calloc(g->ctx, g->n_ops + 1, 1);
    if (!ran) return rkm__nomem(g->ctx, "plan");
    *out = 0;
    for (size_t i = 0; i < n; i++) {
        if (steps[i].kind != RKM_STEP_FWD || steps[i].index < 0 || (size_t)steps[i].index >= g->n_ops) continue;
        *out += ran[steps[i].index];
        ran[steps[i].index] = 1;
    }
    rkm__free(g->ctx, ran, g->n_ops + 1);
    return RKM_OK;
}

/* An empty plan that takes the draft's steps and has room for every
 * per-step record. The draft is emptied whatever happens. */
static rkm_result rkm__plan_alloc(const rkm_graph *g, rkm__steps *draft, rkm_plan **out)
{
    *out = NULL;
    size_t n = draft->n, nf = 0;
    for (size_t i = 0; i < n; i++) {
        const rkm_step *st = &draft->s[i];
        if (!rkm__step_index_ok(g, st)) continue;
        if (st->kind == RKM_STEP_FWD) nf += 2 + (size_t)g->ops[st->index].n_out;
        if (st->kind == RKM_STEP_BWD) nf += (size_t)g->ops[st->index].n_in + (size_t)g->ops[st->index].n_out;
    }
    rkm_plan *p = rkm__calloc(g->ctx, 1, sizeof *p);
    rkm_step *steps = rkm__steps_take(draft);
    if (!p || (n && !steps)) {
        rkm__steps_free(draft);
        rkm__free(g->ctx, steps, n * sizeof *steps);
        rkm__free(g->ctx, p, sizeof *p);
        return rkm__nomem(g->ctx, "plan");
    }
    p->g = g;
    p->ctx = g->ctx;
    p->steps = steps;
    p->n_steps = n;
    p->n_flags = nf + 1;
    p->mem_after = rkm__calloc(g->ctx, n + 1, sizeof *p->mem_after);
    p->step_peak = rkm__calloc(g->ctx, n + 1, sizeof *p->step_peak);
    p->flag_off = rkm__calloc(g->ctx, n + 1, sizeof *p->flag_off);
    p->flags = rkm__calloc(g->ctx, p->n_flags, 1);
    if (!p->mem_after || !p->step_peak || !p->flag_off || !p->flags) {
        rkm_plan_destroy(p);
        return rkm__nomem(g->ctx, "plan");
    }
    *out = p;
    return RKM_OK;
}

/* Replay the plan once, recording everything a query may later ask. 1:
 * valid, 0: a rule broke (res says which), -1: out of memory. */
static int rkm__plan_replay(rkm_plan *p, rkm_sim_result *res)
{
    rkm__sim s;
    rkm__recorder rc;
    if (rkm__recorder_init(&rc, p)) return -1;
    if (rkm__sim_init(p->g, &s)) {
        rkm__recorder_free(&rc);
        return -1;
    }
    int ok = rkm__sim_run_peaks(&s, p->steps, p->n_steps, res, p->mem_after, p->step_peak, &rc);
    int32_t obj = -1;
    rkm_rule rule = ok == 1 ? rkm__sim_end(&s, &obj) : RKM_RULE_NONE;
    if (rule != RKM_RULE_NONE) {
        ok = 0;
        res->rule = rule;
        res->fail_step = (int64_t)p->n_steps;
        res->fail_object = obj;
    }
    rkm__sim_free(&s);
    rkm__recorder_free(&rc);
    res->valid = ok == 1;
    return ok;
}

/* The message of an invalid plan: the step and the rule. */
static rkm_result rkm__plan_refuse(const rkm_plan *p, const rkm_sim_result *res)
{
    char text[300] = "end of plan";
    if (res->fail_step < (int64_t)p->n_steps) rkm_step_text(p->g, &p->steps[res->fail_step], text, sizeof text);
    const char *on = rkm__obj_name(p->g, res->rule, res->fail_object);
    return rkm__err(p->ctx, RKM_ERROR_PLAN, "step %lld (%s): %s%s%s", (long long)res->fail_step, text,
                    rkm_rule_string(res->rule), *on ? ": " : "", on);
}

/* The one way a plan comes to be: the draft's steps (taken) replayed once;
 * *out only if every rule holds, else RKM_ERROR_PLAN naming the rule. */
static rkm_result rkm__plan_birth(const rkm_graph *g, rkm__steps *draft, rkm_sim_result *res, rkm_plan **out)
{
    rkm_sim_result tmp;
    if (!res) res = &tmp;
    memset(res, 0, sizeof *res);
    res->fail_step = res->peak_step = -1;
    res->fail_object = -1;
    *out = NULL;
    rkm_plan *p;
    size_t recomputes = 0;
    rkm_result r = rkm__count_recomputes(g, draft->s, draft->n, &recomputes);
    if (r) {
        rkm__steps_free(draft);
        return r;
    }
    if ((r = rkm__plan_alloc(g, draft, &p))) return r;
    int ok = rkm__plan_replay(p, res);
    res->recomputes = recomputes;
    if (ok != 1) {
        r = ok < 0 ? rkm__nomem(g->ctx, "plan") : rkm__plan_refuse(p, res);
        rkm_plan_destroy(p);
        return r;
    }
    rkm_plan_stats *st = &p->stats;
    st->algo = RKM_ALGO_NONE;
    st->peak = res->peak;
    st->peak_step = res->peak_step;
    st->time = res->time;
    st->recomputes = recomputes;
    st->baseline_peak = g->stats.baseline_peak;
    st->baseline_time = g->stats.baseline_time;
    st->overhead = st->baseline_time > 0 ? st->time / st->baseline_time - 1 : 0;
    *out = p;
    return RKM_OK;
}

/* ---------------------------------------------------------------------------
 * Memory layout: one arena, an offset for every buffer
 *
 * Buffers are recorded at a plan's birth with exact lifetimes (inclusive
 * step ranges: a buffer counts in the step that frees it, as in the
 * contract), so placing them is an offline problem (dynamic storage
 * allocation): give each an aligned offset so that buffers alive in the
 * same step never share a byte, in the least arena. The plan's aligned
 * peak, the most aligned bytes alive in one step, is a lower bound on any
 * layout, and the placer works towards it:
 * 1. an in-place chain (takes_over) is one block, its first buffer over the
 *    chain's lifetime; sizes round up to the alignment and count in units
 *    of it; zero-byte buffers sit at offset 0;
 * 2. the skyline (below): O(n log^2 n), at the bound on 63 % of the bundled
 *    graphs' plans (every algorithm, 90..20 % and the smallest budgets);
 * 3. where it misses: first fit in creation order (a dynamic allocator's
 *    layout: DTR plans on it, so for DTR plans it fits the budget), the
 *    library's first greedy in three orders (up to RKM_LAYOUT_GREEDY_ITEMS
 *    buffers), then a search over canonical placements (MiniMalloc:
 *    Moffitt, ASPLOS 2024) for a layout at the bound, then bisection
 *    between the bound and the best found. First fit has
 *    RKM_LAYOUT_FIRSTFIT_WORK units of work, the last two share
 *    RKM_LAYOUT_WORK (a unit: one buffer or section visited), so the
 *    layout is the same on every machine. All together, on 349 plans:
 *    88.5 % at the bound, the geometric mean of arena / bound 1.0021
 *    (bench_layout; 10x the work moves a few plans, at 10x the time).
 * ------------------------------------------------------------------------- */

/* Work of the stages after the skyline, per layout: 10 M units is at most
 * ~50 ms on this project's 2-core machine. On 93 plans of an earlier
 * rockmate (every bundled graph at 90..30 % and its smallest budget; the
 * skyline alone: 48 at the bound), 2 M units brought 67 to the bound, 10 M
 * 78, 20 M 79. */
#define RKM_LAYOUT_WORK 10000000u
#define RKM_LAYOUT_GREEDY_ITEMS 2048 /* the greedy is O(n^2): 4 M units a pass there */
/* First fit's own work: it is what makes a DTR plan fit (DTR spent as much
 * placing its buffers), so it runs apart from the stages' shared work; 200
 * M units is about a second (a DTR plan of a 4000-op chain takes 20 M). */
#define RKM_LAYOUT_FIRSTFIT_WORK 200000000u

/* A placement problem, in units of the alignment. Items are the buffers to
 * place; their lifetimes are section ranges [s0, s1) of a time axis
 * compressed to where lifetimes start and end. */
typedef struct rkm__lay {
    rkm_context *ctx;
    int32_t n, nsec;
    int32_t *s0, *s1;   /* [n] */
    int64_t *life;      /* [n] steps alive: the skyline's first tie-break */
    uint64_t *w;        /* [n] size in units */
    int32_t *rank[3];   /* [n] ranks in three preorders (MiniMalloc's: by lifetime, area
                           and section load in turn; see rkm__lay_ranks) */
    uint64_t *off;      /* [n] offsets being built (units) */
    uint64_t *best;     /* [n] the best layout found */
    uint64_t height;    /* its height (units); UINT64_MAX before the first */
    uint64_t bound;     /* the most units alive in one section: no layout is lower */
    uint64_t work;      /* units of work left to the search */
} rkm__lay;

/* ---- Skyline: the lowest stretch first, O(n log^2 n) ----
 * The skyline is the top of the placed items over the sections, kept as
 * maximal runs of one height ("segments"). Take the lowest segment (the
 * leftmost of equals); of the unplaced items whose sections lie inside it,
 * put the first in the preorder (rank[0]) on it; if none lies inside, the
 * segment can hold nothing more: raise it to its lower neighbour (the space
 * under it is lost) and merge. This is the bottom-left rule of strip
 * packing, and it places like the canonical order of the search below; on
 * the bundled graphs' plans it is as good as placing the item that can sit
 * lowest of all, which costs O(n^2) on long plans. The query "first rank
 * inside [a, b)" is a merge-sort tree over the items' first sections: per
 * level, each node's items sorted by their end, with a min-tree of ranks
 * over every level's array. */

/* A heap entry: a key (an offset, a height), then a rank, then an item. */
typedef struct rkm__hent {
    uint64_t key;
    int32_t pre, item;
} rkm__hent;

static int rkm__hent_less(const rkm__hent *a, const rkm__hent *b)
{
    if (a->key != b->key) return a->key < b->key;
    return a->pre != b->pre ? a->pre < b->pre : a->item < b->item;
}

static int rkm__hent_cmp(const void *x, const void *y)
{
    const rkm__hent *a = x, *b = y;
    return rkm__hent_less(a, b) ? -1 : rkm__hent_less(b, a);
}

static void rkm__heap_push(rkm__hent *h, int32_t *n, rkm__hent e)
{
    int32_t i = (*n)++;
    while (i > 0 && rkm__hent_less(&e, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static rkm__hent rkm__heap_pop(rkm__hent *h, int32_t *n)
{
    rkm__hent top = h[0], e = h[--*n];
    int32_t i = 0;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && rkm__hent_less(&h[c + 1], &h[c])) c++;
        if (!rkm__hent_less(&h[c], &e)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = e;
    return top;
}

/* The unplaced items, by first section: level l's array holds every item,
 * grouped by node (first section >> l), each group sorted by end. */
typedef struct rkm__cands {
    int32_t n, levels, leaves, n2; /* leaves >= nsec, n2 >= n: powers of two */
    int32_t *end, *at, *pos;       /* [levels * n]: end and item per position, position per item */
    int32_t *first;                /* [levels * (leaves + 1)]: each node's first position */
    int32_t *mint;                 /* [levels * 2 * n2]: min-tree of ranks; INT32_MAX: placed */
    int32_t *by_rank;              /* [n] the item of each rank */
} rkm__cands;

static void rkm__cands_free(rkm_context *ctx, rkm__cands *c)
{
    size_t lv = (size_t)c->levels, n = (size_t)c->n + 1;
    rkm__free(ctx, c->end, lv * n * sizeof *c->end);
    rkm__free(ctx, c->at, lv * n * sizeof *c->at);
    rkm__free(ctx, c->pos, lv * n * sizeof *c->pos);
    rkm__free(ctx, c->first, lv * ((size_t)c->leaves + 1) * sizeof *c->first);
    rkm__free(ctx, c->mint, lv * 2 * (size_t)c->n2 * sizeof *c->mint);
    rkm__free(ctx, c->by_rank, n * sizeof *c->by_rank);
}

/* order: the items sorted by end (then rank). 0 on NOMEM. */
static int rkm__cands_init(const rkm__lay *L, rkm__cands *c, const int32_t *order)
{
    memset(c, 0, sizeof *c);
    c->n = L->n;
    c->leaves = c->n2 = 1;
    while (c->leaves < L->nsec) c->leaves *= 2;
    while (c->n2 < L->n) c->n2 *= 2;
    for (int32_t x = c->leaves; x; x >>= 1) c->levels++;
    size_t lv = (size_t)c->levels, n = (size_t)L->n + 1;
    c->end = rkm__alloc(L->ctx, lv * n * sizeof *c->end);
    c->at = rkm__alloc(L->ctx, lv * n * sizeof *c->at);
    c->pos = rkm__alloc(L->ctx, lv * n * sizeof *c->pos);
    c->first = rkm__alloc(L->ctx, lv * ((size_t)c->leaves + 1) * sizeof *c->first);
    c->mint = rkm__alloc(L->ctx, lv * 2 * (size_t)c->n2 * sizeof *c->mint);
    c->by_rank = rkm__alloc(L->ctx, n * sizeof *c->by_rank);
    if (!c->end || !c->at || !c->pos || !c->first || !c->mint || !c->by_rank) return 0;
    for (int32_t i = 0; i < L->n; i++) c->by_rank[L->rank[0][i]] = i;
    for (int32_t l = 0; l < c->levels; l++) { /* counting sort by node; the order by end stays */
        int32_t *first = c->first + (size_t)l * ((size_t)c->leaves + 1), *mint = c->mint + (size_t)l * 2 * (size_t)c->n2;
        int32_t nodes = c->leaves >> l;
        memset(first, 0, ((size_t)nodes + 1) * sizeof *first);
        for (int32_t i = 0; i < L->n; i++) first[(L->s0[i] >> l) + 1]++;
        for (int32_t j = 0; j < nodes; j++) first[j + 1] += first[j];
        int32_t *fill = c->pos + (size_t)l * n; /* the next free position per node, borrowed */
        for (int32_t j = 0; j < nodes; j++) fill[j] = first[j];
        for (int32_t k = 0; k < L->n; k++) c->at[(size_t)l * n + (size_t)fill[L->s0[order[k]] >> l]++] = order[k];
        for (int32_t k = 0; k < L->n; k++) {
            int32_t i = c->at[(size_t)l * n + (size_t)k];
            c->pos[(size_t)l * n + (size_t)i] = k;
            c->end[(size_t)l * n + (size_t)k] = L->s1[i];
            mint[c->n2 + k] = L->rank[0][i];
        }
        for (int32_t k = L->n; k < c->n2; k++) mint[c->n2 + k] = INT32_MAX;
        for (int32_t k = c->n2 - 1; k > 0; k--) mint[k] = mint[2 * k] < mint[2 * k + 1] ? mint[2 * k] : mint[2 * k + 1];
    }
    return 1;
}

static void rkm__cands_remove(rkm__cands *c, int32_t item)
{
    for (int32_t l = 0; l < c->levels; l++) {
        int32_t *mint = c->mint + (size_t)l * 2 * (size_t)c->n2;
        int32_t k = c->n2 + c->pos[(size_t)l * ((size_t)c->n + 1) + (size_t)item];
        for (mint[k] = INT32_MAX; k > 1; k /= 2) mint[k / 2] = mint[k] < mint[k ^ 1] ? mint[k] : mint[k ^ 1];
    }
}

/* The first rank among level l's positions [x, y). */
static int32_t rkm__cands_min(const rkm__cands *c, int32_t l, int32_t x, int32_t y)
{
    const int32_t *mint = c->mint + (size_t)l * 2 * (size_t)c->n2;
    int32_t m = INT32_MAX;
    for (x += c->n2, y += c->n2; x < y; x /= 2, y /= 2) {
        if (x & 1) m = mint[x] < m ? mint[x] : m, x++;
        if (y & 1) y--, m = mint[y] < m ? mint[y] : m;
    }
    return m;
}

/* The unplaced item of first rank inside sections [a, b), or -1. */
static int32_t rkm__cands_inside(const rkm__cands *c, int32_t a, int32_t b)
{
    int32_t best = INT32_MAX;
    size_t n = (size_t)c->n + 1;
    for (int32_t l = 0, x = a, y = b; x < y; l++, x /= 2, y /= 2) {
        int32_t node[2] = {-1, -1};
        if (x & 1) node[0] = x++;
        if (y & 1) node[1] = --y;
        for (int q = 0; q < 2; q++) {
            if (node[q] < 0) continue;
            const int32_t *first = c->first + (size_t)l * ((size_t)c->leaves + 1), *end = c->end + (size_t)l * n;
            int32_t lo = first[node[q]], hi = first[node[q] + 1];
            while (lo < hi) { /* the first position whose item ends after b */
                int32_t m = lo + (hi - lo) / 2;
                if (end[m] <= b) lo = m + 1;
                else hi = m;
            }
            int32_t r = rkm__cands_min(c, l, first[node[q]], lo);
            if (r < best) best = r;
        }
    }
    return best == INT32_MAX ? -1 : c->by_rank[best];
}

/* The skyline's segments, by first section: end, height, previous. */
typedef struct rkm__skyline {
    int32_t *end, *prev;
    uint64_t *h;
    uint8_t *alive;
    rkm__hent *heap; /* (height, start): the lowest first, lazily */
    int32_t nh;
} rkm__skyline;

static void rkm__sky_push(rkm__skyline *k, int32_t s) { rkm__heap_push(k->heap, &k->nh, (rkm__hent){k->h[s], s, k->end[s]}); }

/* Merge segment s with the next one (same height). */
static void rkm__sky_merge(rkm__skyline *k, int32_t s, int32_t nsec)
{
    int32_t t = k->end[s];
    k->end[s] = k->end[t];
    k->alive[t] = 0;
    if (k->end[s] < nsec) k->prev[k->end[s]] = s;
}

/* A new segment [a, b) at height h, merged with equal neighbours; pushed. */
static void rkm__sky_set(rkm__skyline *k, int32_t a, int32_t b, uint64_t h, int32_t before, int32_t nsec)
{
    k->end[a] = b, k->h[a] = h, k->alive[a] = 1, k->prev[a] = before;
    if (b < nsec) k->prev[b] = a;
    if (b < nsec && k->h[b] == h) rkm__sky_merge(k, a, nsec);
    if (before >= 0 && k->h[before] == h) {
        rkm__sky_merge(k, before, nsec);
        a = before;
    }
    rkm__sky_push(k, a);
}

/* The skyline layout into L->off; its height, or UINT64_MAX when memory ran out. */
static uint64_t rkm__lay_skyline(rkm__lay *L)
{
    rkm_context *ctx = L->ctx;
    size_t n = (size_t)L->n + 1, ns = (size_t)L->nsec + 1, nh = 5 * n + 8; /* pushes: 3 a placement, 1 a raise */
    rkm__cands c = {0, 0, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
    rkm__skyline k = {NULL, NULL, NULL, NULL, NULL, 0};
    rkm__hent *ord = rkm__alloc(ctx, n * sizeof *ord);
    int32_t *order = rkm__alloc(ctx, n * sizeof *order);
    k.end = rkm__alloc(ctx, ns * sizeof *k.end), k.prev = rkm__alloc(ctx, ns * sizeof *k.prev);
    k.h = rkm__alloc(ctx, ns * sizeof *k.h), k.alive = rkm__alloc(ctx, ns), k.heap = rkm__alloc(ctx, nh * sizeof *k.heap);
    int ok = ord && order && k.end && k.prev && k.h && k.alive && k.heap;
    if (ok) { /* the items by end, then rank */
        for (int32_t i = 0; i < L->n; i++) ord[i] = (rkm__hent){(uint64_t)L->s1[i], L->rank[0][i], i};
        qsort(ord, (size_t)L->n, sizeof *ord, rkm__hent_cmp);
        for (int32_t i = 0; i < L->n; i++) order[i] = ord[i].item;
    }
    ok = ok && rkm__cands_init(L, &c, order);
    uint64_t height = UINT64_MAX;
    if (ok) {
        height = 0;
        memset(k.alive, 0, ns);
        k.h[L->nsec] = UINT64_MAX; /* a sentinel: never merged into */
        rkm__sky_set(&k, 0, L->nsec, 0, -1, L->nsec);
        for (int32_t left = L->n; left > 0;) {
            rkm__hent e = rkm__heap_pop(k.heap, &k.nh);
            int32_t a = e.pre, b = e.item;
            if (!k.alive[a] || k.end[a] != b || k.h[a] != e.key) continue; /* stale */
            int32_t i = rkm__cands_inside(&c, a, b), before = k.prev[a];
            if (i < 0) { /* nothing fits: up to the lower neighbour */
                uint64_t hl = before >= 0 ? k.h[before] : UINT64_MAX, hr = b < L->nsec ? k.h[b] : UINT64_MAX;
                k.alive[a] = 0;
                rkm__sky_set(&k, a, b, hl < hr ? hl : hr, before, L->nsec);
                continue;
            }
            uint64_t top = e.key + L->w[i];
            L->off[i] = e.key;
            if (top > height) height = top;
            rkm__cands_remove(&c, i);
            left--;
            k.alive[a] = 0;
            if (L->s0[i] > a) { /* what is left of the segment, on either side */
                k.end[a] = L->s0[i], k.alive[a] = 1;
                rkm__sky_push(&k, a);
                before = a;
            }
            if (L->s1[i] < b) {
                k.end[L->s1[i]] = b, k.h[L->s1[i]] = e.key, k.alive[L->s1[i]] = 1, k.prev[L->s1[i]] = L->s0[i];
                if (b < L->nsec) k.prev[b] = L->s1[i];
                rkm__sky_push(&k, L->s1[i]);
            }
            rkm__sky_set(&k, L->s0[i], L->s1[i], top, before, L->nsec);
        }
    }
    rkm__cands_free(ctx, &c);
    rkm__free(ctx, ord, n * sizeof *ord);
    rkm__free(ctx, order, n * sizeof *order);
    rkm__free(ctx, k.end, ns * sizeof *k.end);
    rkm__free(ctx, k.prev, ns * sizeof *k.prev);
    rkm__free(ctx, k.h, ns * sizeof *k.h);
    rkm__free(ctx, k.alive, ns);
    rkm__free(ctx, k.heap, nh * sizeof *k.heap);
    return height;
}

/* Keep L->off as the best layout if it is lower than the best so far. */
static void rkm__lay_keep(rkm__lay *L, uint64_t height)
{
    if (height >= L->height) return;
    L->height = height;
    memcpy(L->best, L->off, (size_t)L->n * sizeof *L->best);
}

/* ---- First fit in creation order: what a dynamic allocator does ----
 * Each item, in the order the plan creates them, at the lowest offset free
 * of the items still alive when it is made. DTR plans on exactly this
 * allocator (section 11), so for them this layout fits the budget; on
 * others it is one more candidate. O(n x live), while work lasts. */
static uint64_t rkm__lay_firstfit(rkm__lay *L, int32_t *live)
{
    uint64_t height = 0;
    int32_t n_live = 0;
    for (int32_t i = 0; i < L->n; i++) {
        if (L->work < (uint64_t)n_live + 1) return UINT64_MAX;
        L->work -= (uint64_t)n_live + 1;
        int32_t m = 0, at = -1;
        uint64_t lo = 0;
        for (int32_t k = 0; k < n_live; k++) { /* drop the dead; find the first gap that holds i */
            int32_t j = live[k];
            if (L->s1[j] <= L->s0[i]) continue;
            if (at < 0 && L->off[j] - lo >= L->w[i]) at = m;
            if (at < 0) lo = L->off[j] + L->w[j];
            live[m++] = j;
        }
        n_live = m;
        if (at < 0) at = n_live;
        memmove(live + at + 1, live + at, (size_t)(n_live - at) * sizeof *live);
        live[at] = i;
        n_live++;
        L->off[i] = lo;
        if (lo + L->w[i] > height) height = lo + L->w[i];
    }
    return height;
}

/* ---- Greedy: one order, each item at the lowest offset free of the placed
 * items alive with it (the library's first placer, kept as a candidate:
 * on some plans it is the best of all). The placed items are kept sorted
 * by offset, so each placement is one scan: O(n^2), while work lasts. ---- */

/* The greedy layout in order ord (n items) into L->off; its height, or
 * UINT64_MAX when work ran out. placed: scratch for n items. */
static uint64_t rkm__lay_greedy(rkm__lay *L, const int32_t *ord, int32_t *placed)
{
    uint64_t height = 0;
    for (int32_t k = 0; k < L->n; k++) {
        int32_t i = ord[k], at = k;
        if (L->work < (uint64_t)k + 1) return UINT64_MAX;
        L->work -= (uint64_t)k + 1;
        uint64_t lo = 0;
        for (int32_t q = 0; q < k; q++) { /* offset order: the first gap that holds i */
            int32_t j = placed[q];
            if (!(L->s0[i] < L->s1[j] && L->s0[j] < L->s1[i])) continue;
            if (L->off[j] >= lo + L->w[i]) {
                at = q;
                break;
            }
            if (L->off[j] + L->w[j] > lo) lo = L->off[j] + L->w[j];
        }
        L->off[i] = lo;
        while (at > 0 && L->off[placed[at - 1]] > lo) at--; /* keep the list sorted by offset */
        while (at < k && L->off[placed[at]] <= lo) at++;
        memmove(placed + at + 1, placed + at, (size_t)(k - at) * sizeof *placed);
        placed[at] = i;
        if (lo + L->w[i] > height) height = lo + L->w[i];
    }
    return height;
}

/* ---- Search: canonical placements (MiniMalloc), depth first ----
 * Some layout of height C, if one exists, places its items one by one so
 * that each sits at the lowest offset the items before it leave free (its
 * "lowest offset": the highest top of an earlier item alive with it), in an
 * order where offsets never fall and items at the same offset come in rank
 * order. The search tries those orders, pruned by:
 * - dominance: an item placed at or above where another could sit whole
 *   leaves a gap that a canonical order never does;
 * - the sections: a section's unplaced units, stacked from the lowest
 *   offset any of them can have, must fit under C;
 * - decomposition: once no unplaced item spans a section boundary, the two
 *   sides are independent problems, each solved once;
 * - an item that touches no unplaced item: if the rest fails with it there,
 *   it fails with any other first.
 * Iterative (an explicit stack of frames), so that no C stack grows with
 * the problem; every change is logged and undone on backtracking. */

enum { RKM__UNDO_MO, RKM__UNDO_FLOOR, RKM__UNDO_TOTAL, RKM__UNDO_CUTS, RKM__UNDO_PLACED };

typedef struct rkm__lay_frame {
    int32_t *part;       /* the partition's items (placed ones included), a range of d->all */
    int32_t np, lo, hi;  /* their count, the sections [lo, hi) */
    uint64_t lastoff;    /* canonical order: nothing lower than this, */
    int32_t lastpre;     /* nor at it with a rank before this */
    uint64_t minh;       /* the lowest top any unplaced item can have (dominance) */
    uint64_t ckey;       /* the last candidate tried: the next is the first */
    int32_t cpre;        /* after it in (offset, rank) order */
    int32_t cur, hat;    /* the candidate placed now (-1: none); it touched no unplaced item */
    size_t undo;         /* undo log length before cur */
    size_t mark;         /* scratch length on entry */
    int32_t subs, nsub, sub; /* decomposition: nsub parts at scratch offset subs (lo, hi, first, count), the one running */
    size_t subs_end;     /* scratch length after the parts' lists */
} rkm__lay_frame;

typedef struct rkm__dfs {
    rkm__lay *L;
    const int32_t *pre;  /* [n] the preorder's ranks */
    uint64_t cap;        /* the height sought */
    uint64_t *mo;        /* [n] lowest offset of each unplaced item */
    uint8_t *placed;     /* [n] */
    uint64_t *floor, *total; /* [nsec] top of the placed items; units unplaced */
    int32_t *cuts;       /* [nsec] unplaced items spanning sections s and s + 1 */
    uint64_t *minmo;     /* [nsec] lowest offset of the unplaced items in it (per node) */
    int32_t *next;       /* [nsec + 1] union-find "next unpainted section" */
    rkm__hent *order;    /* [n] a node's unplaced items, sorted */
    int32_t *all;        /* [n] every item, reordered by the splits */
    int32_t *tmp, *tmpkey; /* [n] the splits' counting sort */
    int32_t *scratch;    /* candidate and part lists, a stack */
    size_t ns, scap;
    int32_t *uidx;       /* the undo log: kind << 29 | index, and the old value */
    uint64_t *uold;
    size_t nu, ucap;
    uint64_t nodes;      /* frames entered that the round robin still allows */
    rkm__lay_frame *fr;  /* frames */
    int32_t nf, fcap;
} rkm__dfs;

#define RKM__DFS_FAIL 0
#define RKM__DFS_FOUND 1
#define RKM__DFS_ABORT 2  /* out of work */
#define RKM__DFS_NOMEM 3

static int rkm__dfs_spend(rkm__dfs *d, uint64_t units)
{
    if (d->L->work < units) {
        d->L->work = 0;
        return 0;
    }
    d->L->work -= units;
    return 1;
}

static int rkm__dfs_log(rkm__dfs *d, int kind, int32_t index, uint64_t old)
{
    if (d->nu == d->ucap) {
        size_t c1 = d->ucap, c2 = d->ucap;
        if (!rkm__reserve(d->L->ctx, (void **)&d->uidx, &c1, d->nu + 1, sizeof *d->uidx) ||
            !rkm__reserve(d->L->ctx, (void **)&d->uold, &c2, d->nu + 1, sizeof *d->uold))
            return 0;
        d->ucap = c1 < c2 ? c1 : c2;
    }
    d->uidx[d->nu] = (int32_t)((uint32_t)kind << 29 | (uint32_t)index);
    d->uold[d->nu++] = old;
    return 1;
}

static void rkm__dfs_undo(rkm__dfs *d, size_t mark)
{
    while (d->nu > mark) {
        d->nu--;
        uint32_t x = (uint32_t)d->uidx[d->nu];
        int32_t i = (int32_t)(x & 0x1fffffffu);
        uint64_t v = d->uold[d->nu];
        switch (x >> 29) {
        case RKM__UNDO_MO: d->mo[i] = v; break;
        case RKM__UNDO_FLOOR: d->floor[i] = v; break;
        case RKM__UNDO_TOTAL: d->total[i] = v; break;
        case RKM__UNDO_CUTS: d->cuts[i] = (int32_t)v; break;
        default: d->placed[i] = 0; break;
        }
    }
}

/* n int32s on the scratch stack; -1 when it is full (the search gives up). */
static int32_t rkm__dfs_take(rkm__dfs *d, size_t n)
{
    if (d->scap - d->ns < n) return -1;
    size_t at = d->ns;
    d->ns += n;
    return (int32_t)at;
}

static int rkm__sec_overlap(const rkm__lay *L, int32_t a, int32_t b)
{
    return L->s0[a] < L->s1[b] && L->s0[b] < L->s1[a];
}

/* Union-find over sections: the first unpainted one from s. */
static int32_t rkm__dfs_find(int32_t *next, int32_t s)
{
    int32_t r = s;
    while (next[r] != r) r = next[r];
    while (next[s] != r) {
        int32_t t = next[s];
        next[s] = r;
        s = t;
    }
    return r;
}

/* A frame's entry: its unplaced items, the sections' check. Returns FOUND
 * when nothing is left to place, FAIL when the sections cannot fit under
 * cap, ABORT; else -1, the frame ready for its first candidate. */
static int rkm__dfs_enter(rkm__dfs *d, rkm__lay_frame *f)
{
    const rkm__lay *L = d->L;
    int32_t m = 0;
    uint64_t minh = UINT64_MAX;
    for (int32_t k = 0; k < f->np; k++) {
        int32_t i = f->part[k];
        if (d->placed[i]) continue;
        d->order[m++] = (rkm__hent){d->mo[i], d->pre[i], i};
        if (d->mo[i] + L->w[i] < minh) minh = d->mo[i] + L->w[i];
    }
    if (!m) return RKM__DFS_FOUND;
    uint64_t lg = 1;
    while ((1u << lg) < (uint32_t)m && lg < 31) lg++;
    if (!rkm__dfs_spend(d, (uint64_t)f->np + (uint64_t)m * lg + 2 * (uint64_t)(f->hi - f->lo))) return RKM__DFS_ABORT;
    qsort(d->order, (size_t)m, sizeof *d->order, rkm__hent_cmp);
    /* Each section's floor: no unplaced item in it sits below the lowest
     * offset among them (painted lowest first), nor below lastoff. */
    for (int32_t s = f->lo; s <= f->hi; s++) d->next[s] = s;
    for (int32_t k = 0; k < m; k++) {
        int32_t i = d->order[k].item, end = L->s1[i] < f->hi ? L->s1[i] : f->hi;
        for (int32_t s = rkm__dfs_find(d->next, L->s0[i] > f->lo ? L->s0[i] : f->lo); s < end; s = rkm__dfs_find(d->next, s)) {
            d->minmo[s] = d->order[k].key;
            d->next[s] = s + 1;
        }
    }
    for (int32_t s = f->lo; s < f->hi; s++) {
        if (!d->total[s]) continue;
        uint64_t fl = d->floor[s] > f->lastoff ? d->floor[s] : f->lastoff;
        if (d->minmo[s] > fl) fl = d->minmo[s];
        if (fl + d->total[s] > d->cap) return RKM__DFS_FAIL;
    }
    f->minh = minh;
    f->ckey = f->lastoff;
    f->cpre = f->lastpre;
    return -1;
}

/* Place candidate i of frame f at its lowest offset, logging every change.
 * Returns 0, or NOMEM / ABORT. Sets f->hat and counts new zero cuts into
 * *zeros (their boundaries s, meaning between s and s + 1, at scratch *zat). */
static int rkm__dfs_place(rkm__dfs *d, rkm__lay_frame *f, int32_t i, int32_t *zat, int32_t *zeros)
{
    rkm__lay *L = d->L;
    uint64_t top = d->mo[i] + L->w[i];
    int32_t span = L->s1[i] - L->s0[i];
    if (!rkm__dfs_spend(d, (uint64_t)f->np + 3 * (uint64_t)span)) return RKM__DFS_ABORT;
    f->undo = d->nu;
    if (!rkm__dfs_log(d, RKM__UNDO_PLACED, i, 0)) return RKM__DFS_NOMEM;
    d->placed[i] = 1;
    L->off[i] = d->mo[i];
    f->hat = 1;
    for (int32_t k = 0; k < f->np; k++) {
        int32_t j = f->part[k];
        if (d->placed[j] || !rkm__sec_overlap(L, i, j)) continue;
        f->hat = 0;
        if (d->mo[j] >= top) continue;
        if (!rkm__dfs_log(d, RKM__UNDO_MO, j, d->mo[j])) return RKM__DFS_NOMEM;
        d->mo[j] = top;
    }
    for (int32_t s = L->s0[i]; s < L->s1[i]; s++) {
        if (!rkm__dfs_log(d, RKM__UNDO_FLOOR, s, d->floor[s]) || !rkm__dfs_log(d, RKM__UNDO_TOTAL, s, d->total[s]))
            return RKM__DFS_NOMEM;
        d->floor[s] = top;
        d->total[s] -= L->w[i];
    }
    *zat = (int32_t)d->ns;
    *zeros = 0;
    for (int32_t s = L->s0[i]; s + 1 < L->s1[i]; s++) {
        if (!rkm__dfs_log(d, RKM__UNDO_CUTS, s, (uint64_t)d->cuts[s])) return RKM__DFS_NOMEM;
        if (--d->cuts[s] == 0 && s >= f->lo && s + 1 < f->hi) {
            if (rkm__dfs_take(d, 1) < 0) return RKM__DFS_ABORT;
            d->scratch[*zat + (*zeros)++] = s;
        }
    }
    return 0;
}

/* Split f's unplaced items at the zero cuts at scratch zat (ascending
 * boundaries: a cut at s lies between sections s and s + 1): f's list is
 * reordered in place (a stable counting sort: placed items first, then
 * each part's), and each part with items is recorded on the scratch as
 * (lo, hi, first, count), first indexing d->all. */
static int rkm__dfs_split(rkm__dfs *d, rkm__lay_frame *f, int32_t zat, int32_t zeros)
{
    const rkm__lay *L = d->L;
    int32_t subs = rkm__dfs_take(d, 4 * ((size_t)zeros + 1));
    if (subs < 0) return RKM__DFS_ABORT;
    if (!rkm__dfs_spend(d, 3 * (uint64_t)f->np + (uint64_t)zeros)) return RKM__DFS_ABORT;
    int32_t *count = d->next; /* free outside a frame's entry; zeros + 2 <= nsec + 1 */
    memset(count, 0, ((size_t)zeros + 2) * sizeof *count);
    for (int32_t k = 0; k < f->np; k++) {
        int32_t j = f->part[k], key = 0;
        if (!d->placed[j]) { /* 1 + the cuts at or before its first section */
            int32_t a = 0, b = zeros;
            while (a < b) {
                int32_t m = a + (b - a) / 2;
                if (d->scratch[zat + m] < L->s0[j]) a = m + 1;
                else b = m;
            }
            key = 1 + a;
        }
        d->tmpkey[k] = key;
        count[key]++;
    }
    for (int32_t z = 0, at = 0; z <= zeros + 1; z++) {
        int32_t c = count[z];
        count[z] = at;
        at += c;
    }
    for (int32_t k = 0; k < f->np; k++) d->tmp[count[d->tmpkey[k]]++] = f->part[k];
    memcpy(f->part, d->tmp, (size_t)f->np * sizeof *f->part);
    /* count[0] now ends the placed items, count[z + 1] part z */
    int32_t nsub = 0, lo = f->lo, first = count[0];
    for (int32_t z = 0; z <= zeros; z++) {
        int32_t hi = z < zeros ? d->scratch[zat + z] + 1 : f->hi, end = count[z + 1];
        if (end > first) {
            int32_t *p = &d->scratch[subs + 4 * nsub++];
            p[0] = lo, p[1] = hi, p[2] = (int32_t)(f->part - d->all) + first, p[3] = end - first;
        }
        first = end;
        lo = hi;
    }
    f->subs = subs;
    f->nsub = nsub;
    f->sub = 0;
    f->subs_end = d->ns;
    return 0;
}

static void rkm__dfs_push(rkm__dfs *d, int32_t *part, int32_t np, int32_t lo, int32_t hi, uint64_t lastoff,
                          int32_t lastpre)
{
    rkm__lay_frame *f = &d->fr[d->nf++];
    *f = (rkm__lay_frame){.part = part, .np = np, .lo = lo, .hi = hi, .lastoff = lastoff, .lastpre = lastpre, .cur = -1,
                          .mark = d->ns};
}

/* Push the frame of f's next part; 0 when none is left. */
static int rkm__dfs_next_part(rkm__dfs *d, rkm__lay_frame *f)
{
    if (f->sub >= f->nsub) return 0;
    const int32_t *p = &d->scratch[f->subs + 4 * f->sub++];
    rkm__dfs_push(d, &d->all[p[2]], p[3], p[0], p[1], 0, -1);
    return 1;
}

/* f's next candidate: the unplaced item first in (lowest offset, rank)
 * order after the last one tried (or, first, after the item placed before
 * f: the canonical order), below every unplaced item's top (dominance) and
 * fitting under cap; -1 when none is left. Scanned, not kept, so that a
 * frame holds no list. */
static int32_t rkm__dfs_next_cand(rkm__dfs *d, rkm__lay_frame *f)
{
    const rkm__lay *L = d->L;
    int32_t best = -1;
    uint64_t bk = 0;
    for (int32_t k = 0; k < f->np; k++) {
        int32_t i = f->part[k];
        uint64_t mo = d->mo[i];
        if (d->placed[i] || mo >= f->minh || mo + L->w[i] > d->cap) continue;
        if (mo < f->ckey || (mo == f->ckey && d->pre[i] <= f->cpre)) continue;
        if (best < 0 || mo < bk || (mo == bk && d->pre[i] < d->pre[best])) best = i, bk = mo;
    }
    return best;
}

/* Try f's next candidate: place it and push what follows it. Returns -1
 * when a frame was pushed, else FAIL (none left), ABORT or NOMEM. */
static int rkm__dfs_try(rkm__dfs *d, rkm__lay_frame *f)
{
    if (!rkm__dfs_spend(d, (uint64_t)f->np)) return RKM__DFS_ABORT;
    int32_t i = rkm__dfs_next_cand(d, f), zat, zeros;
    f->cur = i;
    if (i < 0) return RKM__DFS_FAIL;
    uint64_t at = d->mo[i];
    f->ckey = at;
    f->cpre = d->pre[i];
    size_t ns = d->ns;
    int r = rkm__dfs_place(d, f, i, &zat, &zeros);
    if (r) return r;
    if (zeros && (r = rkm__dfs_split(d, f, zat, zeros))) return r;
    if (zeros && rkm__dfs_next_part(d, f)) return -1;
    /* no cut, or no item left: go on in the same partition */
    d->ns = ns;
    f->nsub = 0;
    rkm__dfs_push(d, f->part, f->np, f->lo, f->hi, at, d->pre[i]);
    return -1;
}

/* Depth-first search for a layout of height cap over all items; the
 * partitions at the start are those between sections no item spans. */
static int rkm__dfs_run(rkm__dfs *d)
{
    const rkm__lay *L = d->L;
    rkm__dfs_push(d, d->all, L->n, 0, L->nsec, 0, -1);
    rkm__lay_frame *root = &d->fr[0];
    int32_t zat = (int32_t)d->ns, zeros = 0, r;
    for (int32_t s = 0; s + 1 < L->nsec; s++)
        if (!d->cuts[s]) {
            if (rkm__dfs_take(d, 1) < 0) return RKM__DFS_ABORT;
            d->scratch[zat + zeros++] = s;
        }
    if ((r = rkm__dfs_split(d, root, zat, zeros))) return r;
    root->cur = -2; /* the root only runs its parts */
    if (!rkm__dfs_next_part(d, root)) return RKM__DFS_FOUND;
    int res = -1;
    while (d->nf > 0) {
        rkm__lay_frame *f = &d->fr[d->nf - 1];
        if (res == RKM__DFS_FOUND) { /* a child solved its part */
            if (f->nsub) d->ns = f->subs_end;
            if (f->nsub && rkm__dfs_next_part(d, f)) {
                res = -1;
                continue;
            }
            d->nf--; /* f solved: its placements stay */
            continue;
        }
        if (res == RKM__DFS_FAIL) {
            if (f->cur == -2) break;
            rkm__dfs_undo(d, f->undo);
            d->ns = f->mark;
            f->nsub = 0;
            if (f->hat) { /* nothing else can do better */
                d->ns = f->mark;
                d->nf--;
                continue;
            }
        } else if (res < 0) { /* a new frame */
            if (!d->nodes--) return RKM__DFS_ABORT;
            int e = rkm__dfs_enter(d, f);
            if (e >= 0) {
                if (e == RKM__DFS_ABORT || e == RKM__DFS_NOMEM) return e;
                res = e;
                d->ns = f->mark;
                d->nf--;
                continue;
            }
        }
        res = rkm__dfs_try(d, f);
        if (res == RKM__DFS_ABORT || res == RKM__DFS_NOMEM) return res;
        if (res == RKM__DFS_FAIL) {
            d->ns = f->mark;
            d->nf--;
        }
    }
    return res == RKM__DFS_FAIL ? RKM__DFS_FAIL : RKM__DFS_FOUND;
}

/* The search's arrays, for L; 0 or NOMEM. */
static int rkm__dfs_init(rkm__dfs *d, rkm__lay *L)
{
    size_t n = (size_t)L->n + 1, ns = (size_t)L->nsec + 1;
    memset(d, 0, sizeof *d);
    d->L = L;
    d->scap = 16 * n + 4096;
    d->fcap = 2 * L->n + 4;
    d->mo = rkm__alloc(L->ctx, n * sizeof *d->mo);
    d->placed = rkm__alloc(L->ctx, n);
    d->order = rkm__alloc(L->ctx, n * sizeof *d->order);
    d->floor = rkm__alloc(L->ctx, ns * sizeof *d->floor);
    d->total = rkm__alloc(L->ctx, ns * sizeof *d->total);
    d->minmo = rkm__alloc(L->ctx, ns * sizeof *d->minmo);
    d->cuts = rkm__alloc(L->ctx, ns * sizeof *d->cuts);
    d->next = rkm__alloc(L->ctx, (ns + 1) * sizeof *d->next);
    d->scratch = rkm__alloc(L->ctx, d->scap * sizeof *d->scratch);
    d->fr = rkm__alloc(L->ctx, (size_t)d->fcap * sizeof *d->fr);
    d->all = rkm__alloc(L->ctx, n * sizeof *d->all);
    d->tmp = rkm__alloc(L->ctx, n * sizeof *d->tmp);
    d->tmpkey = rkm__alloc(L->ctx, n * sizeof *d->tmpkey);
    return d->mo && d->placed && d->order && d->floor && d->total && d->minmo && d->cuts && d->next && d->scratch &&
           d->fr && d->all && d->tmp && d->tmpkey;
}

static void rkm__dfs_free(rkm__dfs *d)
{
    if (!d->L) return;
    rkm_context *ctx = d->L->ctx;
    size_t n = (size_t)d->L->n + 1, ns = (size_t)d->L->nsec + 1;
    rkm__free(ctx, d->mo, n * sizeof *d->mo);
    rkm__free(ctx, d->placed, n);
    rkm__free(ctx, d->order, n * sizeof *d->order);
    rkm__free(ctx, d->floor, ns * sizeof *d->floor);
    rkm__free(ctx, d->total, ns * sizeof *d->total);
    rkm__free(ctx, d->minmo, ns * sizeof *d->minmo);
    rkm__free(ctx, d->cuts, ns * sizeof *d->cuts);
    rkm__free(ctx, d->next, (ns + 1) * sizeof *d->next);
    rkm__free(ctx, d->scratch, d->scap * sizeof *d->scratch);
    rkm__free(ctx, d->fr, (size_t)d->fcap * sizeof *d->fr);
    rkm__free(ctx, d->all, n * sizeof *d->all);
    rkm__free(ctx, d->tmp, n * sizeof *d->tmp);
    rkm__free(ctx, d->tmpkey, n * sizeof *d->tmpkey);
    rkm__free(ctx, d->uidx, d->ucap * sizeof *d->uidx);
    rkm__free(ctx, d->uold, d->ucap * sizeof *d->uold);
}

/* One probe: a layout of height cap or less? */
static int rkm__dfs_probe(rkm__dfs *d, uint64_t cap)
{
    const rkm__lay *L = d->L;
    for (int32_t i = 0; i < L->n; i++) d->all[i] = i;
    memset(d->mo, 0, (size_t)L->n * sizeof *d->mo);
    memset(d->placed, 0, (size_t)L->n);
    memset(d->floor, 0, (size_t)L->nsec * sizeof *d->floor);
    memset(d->total, 0, (size_t)L->nsec * sizeof *d->total);
    memset(d->cuts, 0, (size_t)L->nsec * sizeof *d->cuts);
    for (int32_t i = 0; i < L->n; i++) { /* difference arrays */
        d->total[L->s0[i]] += L->w[i];
        if (L->s1[i] < L->nsec) d->total[L->s1[i]] -= L->w[i];
        d->cuts[L->s0[i]]++;
        if (L->s1[i] - 1 < L->nsec) d->cuts[L->s1[i] - 1]--;
    }
    for (int32_t s = 1; s < L->nsec; s++) {
        d->total[s] += d->total[s - 1];
        d->cuts[s] += d->cuts[s - 1];
    }
    d->cap = cap;
    d->nu = d->ns = 0;
    d->nf = 0;
    if (!rkm__dfs_spend(d, (uint64_t)L->n + (uint64_t)L->nsec)) return RKM__DFS_ABORT;
    return rkm__dfs_run(d);
}

static uint64_t rkm__lay_top(const rkm__lay *L)
{
    uint64_t h = 0;
    for (int32_t i = 0; i < L->n; i++)
        if (L->off[i] + L->w[i] > h) h = L->off[i] + L->w[i];
    return h;
}

/* One capacity: the three preorders in turn, each with a work limit that
 * doubles every round (MiniMalloc's round robin: one order often finds at
 * once what another misses after long), until one finds a layout, one
 * proves there is none (a search that ends without running out), or the
 * work is spent. */
static int rkm__lay_probe(rkm__lay *L, rkm__dfs *d, uint64_t cap)
{
    for (uint64_t limit = 2 * (uint64_t)L->n;; limit *= 2)
        for (int h = 0; h < 3; h++) {
            d->pre = L->rank[h];
            d->nodes = limit;
            int r = rkm__dfs_probe(d, cap);
            if (r != RKM__DFS_ABORT || !L->work) return r;
        }
}

/* The search: a layout at the bound (with half the work), else bisection
 * between the bound and the best so far (a probe that runs out of its
 * share counts as failed). 0 or NOMEM. */
static int rkm__lay_search(rkm__lay *L)
{
    rkm__dfs d;
    if (!rkm__dfs_init(&d, L)) {
        rkm__dfs_free(&d);
        return 0;
    }
    uint64_t lo = L->bound, hi = L->height - 1;
    int r = RKM__DFS_FAIL;
    for (int first = 1; lo <= hi && L->work; first = 0) {
        uint64_t cap = first ? lo : lo + (hi - lo) / 2, share = first ? L->work / 2 : L->work / 3 + 1;
        uint64_t keep = L->work - share;
        L->work = share;
        r = rkm__lay_probe(L, &d, cap);
        L->work += keep;
        if (r == RKM__DFS_NOMEM) break;
        if (r == RKM__DFS_FOUND) {
            uint64_t h = rkm__lay_top(L);
            rkm__lay_keep(L, h);
            hi = h - 1;
        } else
            lo = cap + 1;
    }
    rkm__dfs_free(&d);
    return r != RKM__DFS_NOMEM;
}

/* ---- The problem from a plan's buffers ---- */

static int rkm__i64_cmp(const void *x, const void *y)
{
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The section of time t: the index of t among the sorted times. */
static int32_t rkm__lay_section(const int64_t *t, int32_t n, int64_t v)
{
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t m = lo + (hi - lo) / 2;
        if (t[m] < v) lo = m + 1;
        else hi = m;
    }
    return lo;
}

/* A preorder's keys: three of lifetime (W), area (A) and the most units
 * alive in the item's sections (T), in the order of the preorder's name. */
typedef struct rkm__pkey {
    uint64_t k[3];
    int32_t item;
} rkm__pkey;

static int rkm__pkey_cmp(const void *x, const void *y)
{
    const rkm__pkey *a = x, *b = y;
    for (int q = 0; q < 3; q++)
        if (a->k[q] != b->k[q]) return a->k[q] > b->k[q] ? -1 : 1;
    return (a->item > b->item) - (a->item < b->item);
}

/* The three preorders' ranks and the bound. load: scratch, nsec + 1. */
static int rkm__lay_ranks(rkm__lay *L, uint64_t *load)
{
    static const char order[3][4] = {"WAT", "TAW", "TWA"};
    int32_t size = 1;
    while (size < L->nsec) size *= 2;
    size_t tb = 2 * (size_t)size * sizeof(uint64_t);
    rkm__pkey *pk = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *pk);
    uint64_t *mx = rkm__calloc(L->ctx, 2 * (size_t)size, sizeof *mx); /* a max-tree of the loads */
    int ok = pk && mx;
    if (ok) {
        memset(load, 0, ((size_t)L->nsec + 1) * sizeof *load);
        for (int32_t i = 0; i < L->n; i++) load[L->s0[i]] += L->w[i], load[L->s1[i]] -= L->w[i];
        L->bound = 0;
        for (int32_t s = 0; s < L->nsec; s++) {
            if (s) load[s] += load[s - 1];
            if (load[s] > L->bound) L->bound = load[s];
            mx[size + s] = load[s];
        }
        for (int32_t k = size - 1; k > 0; k--) mx[k] = mx[2 * k] > mx[2 * k + 1] ? mx[2 * k] : mx[2 * k + 1];
        for (int h = 0; h < 3; h++) {
            for (int32_t i = 0; i < L->n; i++) {
                uint64_t W = (uint64_t)L->life[i], A = L->w[i] > UINT64_MAX / W ? UINT64_MAX : L->w[i] * W, T = 0;
                for (int32_t x = L->s0[i] + size, y = L->s1[i] + size; x < y; x /= 2, y /= 2) {
                    if (x & 1) T = mx[x] > T ? mx[x] : T, x++;
                    if (y & 1) y--, T = mx[y] > T ? mx[y] : T;
                }
                for (int q = 0; q < 3; q++) pk[i].k[q] = order[h][q] == 'W' ? W : order[h][q] == 'A' ? A : T;
                pk[i].item = i;
            }
            qsort(pk, (size_t)L->n, sizeof *pk, rkm__pkey_cmp);
            for (int32_t i = 0; i < L->n; i++) L->rank[h][pk[i].item] = i;
        }
    }
    rkm__free(L->ctx, pk, ((size_t)L->n + 1) * sizeof *pk);
    rkm__free(L->ctx, mx, tb);
    return ok;
}

/* The greedy in its three orders (largest first, largest size x lifetime
 * first, created first), each kept if lower. 0 on NOMEM. */
static int rkm__lay_greedies(rkm__lay *L)
{
    int32_t *placed = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *placed);
    int32_t *ord = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *ord);
    rkm__pkey *pk = rkm__alloc(L->ctx, ((size_t)L->n + 1) * sizeof *pk);
    int ok = placed && ord && pk;
    for (int pass = 0; ok && pass < 3 && L->height > L->bound; pass++) {
        for (int32_t i = 0; i < L->n; i++) {
            uint64_t late = UINT64_MAX - (uint64_t)L->s0[i], W = (uint64_t)L->life[i];
            uint64_t A = L->w[i] > UINT64_MAX / W ? UINT64_MAX : L->w[i] * W;
            pk[i] = (rkm__pkey){{pass == 0 ? L->w[i] : pass == 1 ? A : late, late, 0}, i};
        }
        qsort(pk, (size_t)L->n, sizeof *pk, rkm__pkey_cmp);
        for (int32_t i = 0; i < L->n; i++) ord[i] = pk[i].item;
        uint64_t h = rkm__lay_greedy(L, ord, placed);
        if (h != UINT64_MAX) rkm__lay_keep(L, h);
    }
    rkm__free(L->ctx, placed, ((size_t)L->n + 1) * sizeof *placed);
    rkm__free(L->ctx, ord, ((size_t)L->n + 1) * sizeof *ord);
    rkm__free(L->ctx, pk, ((size_t)L->n + 1) * sizeof *pk);
    return ok;
}

/* The items of buffers b[0..n): in-place chains merged into their first
 * buffer (head[i]: the chain's first), zero-byte buffers left out; their
 * sections, units and preorders. item[k]: the buffer of item k. 0 on NOMEM. */
static int rkm__lay_build(rkm__lay *L, const rkm_buffer *b, size_t n, uint64_t align, const int64_t *head,
                          const int64_t *last, int32_t *item)
{
    size_t ni = (size_t)L->n + 1, nt = 2 * ni;
    int64_t *t = rkm__alloc(L->ctx, nt * sizeof *t);
    uint64_t *load = NULL;
    int ok = t != NULL;
    int32_t u = 0;
    if (ok) {
        for (size_t i = 0, k = 0; i < n; i++)
            if (head[i] == (int64_t)i && b[i].bytes) {
                item[k] = (int32_t)i;
                t[2 * k] = b[i].first_step, t[2 * k + 1] = last[i] + 1;
                L->w[k] = rkm__round_up(b[i].bytes, align) / align;
                L->life[k] = last[i] - b[i].first_step + 1;
                k++;
            }
        qsort(t, 2 * (size_t)L->n, sizeof *t, rkm__i64_cmp);
        for (int32_t i = 0; i < 2 * L->n; i++)
            if (!u || t[i] != t[u - 1]) t[u++] = t[i];
        L->nsec = u ? u - 1 : 0;
        for (int32_t k = 0; k < L->n; k++) {
            L->s0[k] = rkm__lay_section(t, u, b[item[k]].first_step);
            L->s1[k] = rkm__lay_section(t, u, last[item[k]] + 1);
        }
        load = rkm__alloc(L->ctx, ((size_t)L->nsec + 1) * sizeof *load);
        ok = load && rkm__lay_ranks(L, load);
    }
    rkm__free(L->ctx, t, nt * sizeof *t);
    rkm__free(L->ctx, load, ((size_t)L->nsec + 1) * sizeof *load);
    return ok;
}

/* The placer's stages (rkm__layout's `stages`; bench_layout compares them). */
#define RKM__LAY_SKYLINE 1u
#define RKM__LAY_GREEDY 2u
#define RKM__LAY_SEARCH 4u
#define RKM__LAY_ALL 7u

/* Lay out b[0..n) (lifetimes and takes_over as recorded) at alignment
 * `align` with the given stages: offsets into b, the arena and the aligned
 * peak. RKM_OK or RKM_ERROR_NOMEM (message left to the caller). */
static rkm_result rkm__layout(rkm_context *ctx, rkm_buffer *b, size_t n, uint64_t align, unsigned stages,
                              uint64_t *arena, uint64_t *peak)
{
    rkm__lay L;
    memset(&L, 0, sizeof L);
    L.ctx = ctx;
    size_t nb = n + 1;
    int64_t *head = rkm__alloc(ctx, nb * sizeof *head), *last = rkm__alloc(ctx, nb * sizeof *last);
    int32_t *item = rkm__alloc(ctx, nb * sizeof *item);
    int ok = head && last && item;
    for (size_t i = 0; ok && i < n; i++) {
        head[i] = b[i].takes_over >= 0 ? head[b[i].takes_over] : (int64_t)i;
        last[i] = b[i].last_step;
        if (last[i] > last[head[i]]) last[head[i]] = last[i];
        if (head[i] == (int64_t)i && b[i].bytes) L.n++;
    }
    size_t ni = (size_t)L.n + 1;
    if (ok) {
        L.s0 = rkm__alloc(ctx, ni * sizeof *L.s0), L.s1 = rkm__alloc(ctx, ni * sizeof *L.s1);
        L.life = rkm__alloc(ctx, ni * sizeof *L.life), L.w = rkm__alloc(ctx, ni * sizeof *L.w);
        L.off = rkm__alloc(ctx, ni * sizeof *L.off), L.best = rkm__alloc(ctx, ni * sizeof *L.best);
        for (int h = 0; h < 3; h++) L.rank[h] = rkm__alloc(ctx, ni * sizeof *L.rank[h]);
        ok = L.s0 && L.s1 && L.life && L.w && L.off && L.best && L.rank[0] && L.rank[1] && L.rank[2] &&
             rkm__lay_build(&L, b, n, align, head, last, item);
    }
    L.height = L.n ? UINT64_MAX : 0;
    if (ok && L.n && (stages & RKM__LAY_SKYLINE)) {
        uint64_t h = rkm__lay_skyline(&L);
        ok = h != UINT64_MAX;
        if (ok) rkm__lay_keep(&L, h);
    }
    if (ok && L.height > L.bound && (stages & RKM__LAY_SKYLINE)) {
        int32_t *live = rkm__alloc(ctx, ni * sizeof *live);
        L.work = RKM_LAYOUT_FIRSTFIT_WORK;
        uint64_t h = live ? rkm__lay_firstfit(&L, live) : UINT64_MAX;
        ok = live != NULL;
        if (h != UINT64_MAX) rkm__lay_keep(&L, h);
        rkm__free(ctx, live, ni * sizeof *live);
    }
    L.work = stages & RKM__LAY_SKYLINE ? RKM_LAYOUT_WORK : UINT64_MAX; /* the greedy alone: all it takes */
    if (ok && L.height > L.bound && (stages & RKM__LAY_GREEDY) && (L.n <= RKM_LAYOUT_GREEDY_ITEMS || stages == RKM__LAY_GREEDY))
        ok = rkm__lay_greedies(&L);
    /* the search improves on a layout; its undo log packs an index in 29 bits */
    if (ok && L.height > L.bound && L.height != UINT64_MAX && (stages & RKM__LAY_SEARCH) && L.n < (1 << 28) &&
        L.nsec < (1 << 28))
        ok = rkm__lay_search(&L);
    if (ok) {
        for (size_t i = 0; i < n; i++) b[i].offset = 0;
        for (int32_t k = 0; k < L.n; k++) b[item[k]].offset = L.best[k] * align;
        for (size_t i = 0; i < n; i++) b[i].offset = b[head[i]].offset;
        *arena = L.height * align;
        *peak = L.bound * align;
    }
    rkm__free(ctx, head, nb * sizeof *head);
    rkm__free(ctx, last, nb * sizeof *last);
    rkm__free(ctx, item, nb * sizeof *item);
    rkm__free(ctx, L.s0, ni * sizeof *L.s0);
    rkm__free(ctx, L.s1, ni * sizeof *L.s1);
    rkm__free(ctx, L.life, ni * sizeof *L.life);
    rkm__free(ctx, L.w, ni * sizeof *L.w);
    rkm__free(ctx, L.off, ni * sizeof *L.off);
    rkm__free(ctx, L.best, ni * sizeof *L.best);
    for (int h = 0; h < 3; h++) rkm__free(ctx, L.rank[h], ni * sizeof *L.rank[h]);
    return ok ? RKM_OK : RKM_ERROR_NOMEM;
}

/* Whether the plan's buffers, rounded up to align, add up within 64 bits
 * (then every offset + size does too). */
static int rkm__layout_fits(const rkm_plan *p, uint64_t align)
{
    uint64_t total = 0;
    for (size_t i = 0; i < p->n_buffers; i++)
        if (p->buffers[i].bytes > UINT64_MAX - (align - 1) ||
            !rkm__add_u64(total, rkm__round_up(p->buffers[i].bytes, align), &total))
            return 0;
    return 1;
}

static rkm_result rkm__layout_too_big(const rkm_plan *p, uint64_t align, const char *fn)
{
    return rkm__err(p->ctx, RKM_ERROR_ARGUMENT,
                    "%s: the buffers rounded up to %llu bytes add up to more than 64 bits: no arena offsets can hold "
                    "them", fn, (unsigned long long)align);
}

/* The plan's own layout, at `alignment`, kept with it: offsets in
 * p->buffers, the figures in p->stats. Done once, before a plan is handed
 * out (the planner's candidates are never laid out). */
static rkm_result rkm__plan_seal(rkm_plan *p, uint64_t alignment)
{
    if (!rkm__layout_fits(p, alignment)) return rkm__layout_too_big(p, alignment, "plan layout");
    rkm_result r;
    uint64_t arena, peak;
    if ((r = rkm__layout(p->ctx, p->buffers, p->n_buffers, alignment, RKM__LAY_ALL, &arena, &peak)))
        return rkm__nomem(p->ctx, "the plan's memory layout");
    p->stats.alignment = alignment;
    p->stats.aligned_peak = peak;
    p->stats.arena_bytes = arena;
    return RKM_OK;
}

/* A plan of the same steps, laid out as p is (birth and layout are
 * functions of the steps). */
static rkm_result rkm__plan_copy(const rkm_plan *p, rkm_plan **out)
{
    rkm__steps d;
    rkm_result r = rkm__steps_copy(p->ctx, p->steps, p->n_steps, &d, "plan copy");
    if (r) return r;
    r = rkm__plan_birth(p->g, &d, NULL, out);
    if (!r && p->stats.alignment && (r = rkm__plan_seal(*out, p->stats.alignment))) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    if (!r) (*out)->stats.gap = p->stats.gap;
    return r;
}

rkm_result rkm_plan_layout(const rkm_plan *p, uint64_t alignment, rkm_buffer *buffers, uint64_t *arena_bytes)
{
    if (!p || !buffers || !arena_bytes)
        return p ? rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_layout: an output pointer is NULL") : RKM_ERROR_ARGUMENT;
    if (alignment & (alignment - 1))
        return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_layout: alignment %llu is not a power of two",
                        (unsigned long long)alignment);
    size_t n = p->n_buffers;
    if (n) memcpy(buffers, p->buffers, n * sizeof *buffers);
    if (p->stats.alignment && (!alignment || alignment == p->stats.alignment)) { /* the plan's own */
        *arena_bytes = p->stats.arena_bytes;
        return RKM_OK;
    }
    if (!alignment) alignment = RKM_ARENA_ALIGN; /* a plan born without a layout */
    if (!rkm__layout_fits(p, alignment)) return rkm__layout_too_big(p, alignment, "rkm_plan_layout");
    uint64_t peak;
    if (rkm__layout(p->ctx, buffers, n, alignment, RKM__LAY_ALL, arena_bytes, &peak))
        return rkm__nomem(p->ctx, "rkm_plan_layout");
    return RKM_OK;
}

/* ===========================================================================
 * 6. Baseline plan and bounds
 * ========================================================================= */

/* Per tensor: the last op (file order) whose forward reads it, and the first
 * op (file order) with a backward that saves it: after that op's backward no
 * backward needs it. -1 when none. */
static rkm_result rkm__uses(const rkm_graph *g, int32_t **last_fwd, int32_t **first_bwd)
{
    size_t n = g->n_tensors + 1;
    *last_fwd = rkm__alloc(g->ctx, n * sizeof(int32_t));
    *first_bwd = rkm__alloc(g->ctx, n * sizeof(int32_t));
    if (!*last_fwd || !*first_bwd) {
        rkm__free(g->ctx, *last_fwd, n * sizeof(int32_t));
        rkm__free(g->ctx, *first_bwd, n * sizeof(int32_t));
        return rkm__nomem(g->ctx, "baseline");
    }
    for (size_t t = 0; t < n; t++) (*last_fwd)[t] = (*first_bwd)[t] = -1;
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *o = &g->ops[i];
        for (int32_t k = 0; k < o->n_in; k++) (*last_fwd)[o->in[k]] = (int32_t)i;
    }
    for (size_t i = g->n_ops; i-- > 0;) {
        const rkm__op *o = &g->ops[i];
        if (!o->has_bwd) continue;
        for (int32_t k = 0; k < o->n_saved; k++) (*first_bwd)[o->saved[k]] = (int32_t)i;
    }
    return RKM_OK;
}

static int rkm__saves_phantom(const rkm__op *o) { return o->phantom > 0 && o->has_bwd; }

/* In-place runs, made from a valid plan: a `fwd OP` of an op that declares
 * RKM_OP_INPLACE, whose in[0] is live and out[0] is not, and after which
 * the next step that touches in[0] is `free in[0]`, becomes `fwd OP
 * inplace` and that free goes; a `bwd OP` of an op that declares
 * RKM_OP_GRAD_INPLACE whose grad(in[0]) is not live yet becomes `bwd OP
 * inplace` and the `free_grad out[0]` after it goes. Between the two steps
 * the plan holds one buffer fewer, and no step's peak grows: the plan stays
 * valid and never peaks higher. One decision cannot undo another's
 * conditions: a tensor freed early is touched by nothing in between. */

/* The tensors that step st reads, makes or frees (grads 0), or whose
 * gradients it does (grads 1): *n ids, in the graph or the step. */
static const int32_t *rkm__step_objects(const rkm_graph *g, const rkm_step *st, int grads, int32_t *n)
{
    const rkm__op *o = st->kind == RKM_STEP_FWD || st->kind == RKM_STEP_BWD ? &g->ops[st->index] : NULL;
    switch (st->kind) {
    case RKM_STEP_FWD: *n = grads ? 0 : o->n_in + o->n_out; return o->in; /* in, out contiguous */
    case RKM_STEP_BWD: *n = grads ? o->n_in + o->n_out : o->n_saved; return grads ? o->in : o->saved;
    case RKM_STEP_LOSS: *n = 1; return &st->index;
    case RKM_STEP_FREE: *n = !grads; return &st->index;
    case RKM_STEP_FREE_GRAD: *n = grads != 0; return &st->index;
    default: *n = 0; return NULL; /* free_saved: a saved state, no tensor */
    }
}

/* Step i is the next touch (next[t] = i) of each tensor (grads 0) or
 * gradient (grads 1) that st reads, makes or frees. */
static void rkm__note_touches(const rkm_graph *g, const rkm_step *st, int grads, int64_t *next, int64_t i)
{
    int32_t n;
    const int32_t *v = rkm__step_objects(g, st, grads, &n);
    for (int32_t k = 0; k < n; k++) next[v[k]] = i;
}

/* Which steps of d can run in place (ok[i] = 1), from a replay. */
static void rkm__inplace_candidates(rkm__sim *s, const rkm__steps *d, uint8_t *ok)
{
    const rkm_graph *g = s->g;
    for (size_t i = 0; i < d->n; i++) {
        const rkm_step *st = &d->s[i];
        const rkm__op *o = st->kind == RKM_STEP_FWD || st->kind == RKM_STEP_BWD ? &g->ops[st->index] : NULL;
        ok[i] = o && !st->inplace &&
                (st->kind == RKM_STEP_FWD ? (o->flags & RKM_OP_INPLACE) && s->D[o->in[0]] && !s->D[o->out[0]]
                                          : (o->flags & RKM_OP_GRAD_INPLACE) && !s->G[o->in[0]]);
        uint64_t pk;
        int32_t obj;
        if (rkm__sim_step(s, st, &pk, &obj) != RKM_RULE_NONE) {
            memset(ok + i, 0, d->n - i); /* not valid from here: leave the rest as it is */
            return;
        }
    }
}

/* Mark the in-place runs (ok[i] 1 -> the step's inplace) and the frees
 * they make unneeded (ok[j] = 2), scanning backwards for each tensor's and
 * gradient's next touch. */
static void rkm__inplace_mark(const rkm_graph *g, rkm__steps *d, uint8_t *ok, int64_t *nt, int64_t *ng)
{
    for (size_t t = 0; t < g->n_tensors; t++) nt[t] = ng[t] = -1;
    for (size_t i = d->n; i-- > 0;) {
        rkm_step *st = &d->s[i];
        if (ok[i]) {
            const rkm__op *o = &g->ops[st->index];
            int fwd = st->kind == RKM_STEP_FWD;
            int32_t t = fwd ? o->in[0] : o->out[0];
            int64_t j = fwd ? nt[t] : ng[t];
            ok[i] = 0;
            if (j >= 0 && d->s[j].kind == (fwd ? RKM_STEP_FREE : RKM_STEP_FREE_GRAD)) {
                st->inplace = 1;
                ok[j] = 2; /* gone */
            }
        }
        rkm__note_touches(g, st, 0, nt, (int64_t)i);
        rkm__note_touches(g, st, 1, ng, (int64_t)i);
    }
}

/* Lower d (a valid plan, or one valid up to some step) to in-place runs. */
static rkm_result rkm__lower_inplace(const rkm_graph *g, rkm__steps *d)
{
    size_t n = d->n;
    if (!n || !g->has_inplace) return RKM_OK;
    rkm__sim s;
    uint8_t *ok = rkm__alloc(g->ctx, n);
    int64_t *next = rkm__alloc(g->ctx, 2 * (g->n_tensors + 1) * sizeof *next);
    rkm_result r = ok && next ? rkm__sim_init(g, &s) : rkm__nomem(g->ctx, "in-place runs");
    if (!r) {
        rkm__inplace_candidates(&s, d, ok);
        rkm__sim_free(&s);
        rkm__inplace_mark(g, d, ok, next, next + g->n_tensors + 1);
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (ok[i] != 2) d->s[m++] = d->s[i];
        d->n = m;
    }
    rkm__free(g->ctx, ok, n);
    rkm__free(g->ctx, next, 2 * (g->n_tensors + 1) * sizeof *next);
    return r;
}

/* Append a step and apply it to the tracking state. */
static rkm_result rkm__push_tracked(rkm__steps *p, rkm__sim *s, int32_t kind, int32_t index, int32_t save)
{
    rkm_step st = {kind, index, save, 0};
    uint64_t pk;
    int32_t obj;
    (void)rkm__sim_step(s, &st, &pk, &obj);
    return rkm__steps_push(p, kind, index, save) ? RKM_OK : rkm__nomem(p->ctx, "baseline");
}

/* Append `free t` when t is live in the replay state and is not an input. */
static rkm_result rkm__push_free_live(rkm__steps *p, rkm__sim *s, int32_t t)
{
    if (!s->D[t] || (s->g->tensors[t].flags & RKM_TENSOR_INPUT)) return RKM_OK;
    return rkm__push_tracked(p, s, RKM_STEP_FREE, t, 0);
}

static rkm_result rkm__baseline_fill(const rkm_graph *g, rkm__steps *p, rkm__sim *s, const int32_t *last_fwd,
                                     const int32_t *first_bwd)
{
    rkm_result r = RKM_OK;
    for (size_t i = 0; i < g->n_ops && !r; i++) {
        const rkm__op *o = &g->ops[i];
        r = rkm__push_tracked(p, s, RKM_STEP_FWD, (int32_t)i, rkm__saves_phantom(o));
        for (int32_t k = 0; k < o->n_in + o->n_out && !r; k++) {
            int32_t t = o->in[k]; /* in and out are contiguous */
            if (last_fwd[t] <= (int32_t)i && first_bwd[t] < 0 && t != g->loss) r = rkm__push_free_live(p, s, t);
        }
    }
    if (!r) r = rkm__push_tracked(p, s, RKM_STEP_LOSS, g->loss, 0);
    if (!r && first_bwd[g->loss] < 0) r = rkm__push_free_live(p, s, g->loss);
    for (size_t i = g->n_ops; i-- > 0 && !r;) {
        const rkm__op *o = &g->ops[i];
        if (!o->has_bwd) continue;
        r = rkm__push_tracked(p, s, RKM_STEP_BWD, (int32_t)i, 0);
        if (!r && s->P[i]) r = rkm__push_tracked(p, s, RKM_STEP_FREE_SAVED, (int32_t)i, 0);
        for (int32_t k = 0; k < o->n_out && !r; k++)
            if (g->tensors[o->out[k]].has_grad) r = rkm__push_tracked(p, s, RKM_STEP_FREE_GRAD, o->out[k], 0);
        for (int32_t k = 0; k < o->n_saved && !r; k++)
            if (first_bwd[o->saved[k]] == (int32_t)i) r = rkm__push_free_live(p, s, o->saved[k]);
    }
    return r;
}

/* The baseline's steps, appended to d. */
static rkm_result rkm__baseline_steps(const rkm_graph *g, rkm__steps *d)
{
    int32_t *last_fwd, *first_bwd;
    rkm__sim s;
    rkm_result r = rkm__uses(g, &last_fwd, &first_bwd);
    if (r) return r;
    if (!(r = rkm__sim_init(g, &s))) {
        r = rkm__baseline_fill(g, d, &s, last_fwd, first_bwd);
        rkm__sim_free(&s);
    }
    if (!r) r = rkm__lower_inplace(g, d);
    rkm__free(g->ctx, last_fwd, (g->n_tensors + 1) * sizeof(int32_t));
    rkm__free(g->ctx, first_bwd, (g->n_tensors + 1) * sizeof(int32_t));
    return r;
}

/* The baseline plan, not laid out (the planner's candidate). */
static rkm_result rkm__plan_baseline(const rkm_graph *g, rkm_plan **out)
{
    rkm__steps d = {g->ctx, NULL, 0, 0};
    rkm_result r = rkm__baseline_steps(g, &d);
    if (r) {
        rkm__steps_free(&d);
        return r;
    }
    if ((r = rkm__plan_birth(g, &d, NULL, out)) == RKM_ERROR_PLAN)
        return rkm__err(g->ctx, RKM_ERROR_INTERNAL, "internal error: the baseline plan does not replay");
    if (!r) (*out)->stats.budget = (*out)->stats.peak;
    return r;
}

rkm_result rkm_plan_baseline(const rkm_graph *g, rkm_plan **out)
{
    rkm_result r = rkm__plan_args(g, out, 1, "rkm_plan_baseline", "");
    if (r) return r;
    return rkm__plan_handout(rkm__plan_baseline(g, out), RKM_ARENA_ALIGN, out);
}

/* Sum of bytes of the distinct tensors among two id lists (a, then b). */
static uint64_t rkm__bytes_union(const rkm_graph *g, const int32_t *a, int32_t na, const int32_t *b, int32_t nb,
                                 int grads_only)
{
    uint64_t sum = 0;
    for (int32_t i = 0; i < na + nb; i++) {
        int32_t t = i < na ? a[i] : b[i - na];
        const rkm__tensor *x = &g->tensors[t];
        if ((x->flags & RKM_TENSOR_INPUT) && !grads_only) continue; /* counted in input_bytes */
        if (grads_only && !x->has_grad) continue;
        int dup = i < na ? rkm__list_has(a, i, t) : rkm__list_has(a, na, t) || rkm__list_has(b, i - na, t);
        if (!dup) sum += x->bytes;
    }
    return sum;
}

/* The largest single step's need: no plan can peak below it. */
static uint64_t rkm__lower_bound(const rkm_graph *g)
{
    uint64_t lb = g->input_bytes + 2 * g->tensors[g->loss].bytes;
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *o = &g->ops[i];
        /* a run in place has out[0] in in[0]'s bytes, and grad(in[0]) in grad(out[0])'s */
        uint64_t f = g->input_bytes + rkm__bytes_union(g, o->in, o->n_in, o->out, o->n_out, 0) + o->fwd_ws +
                     (rkm__saves_phantom(o) ? o->phantom : o->scratch) - /* each run holds at least the scratch */
                     (o->flags & RKM_OP_INPLACE ? g->tensors[o->out[0]].bytes : 0);
        if (f > lb) lb = f;
        if (!o->has_bwd) continue;
        uint64_t b = g->input_bytes + rkm__bytes_union(g, o->saved, o->n_saved, NULL, 0, 0) + o->phantom + o->bwd_ws +
                     rkm__bytes_union(g, o->out, o->n_out, o->in, o->n_in, 1) -
                     (o->flags & RKM_OP_GRAD_INPLACE ? g->tensors[o->in[0]].bytes : 0);
        if (b > lb) lb = b;
    }
    return lb;
}

/* Per op, the state its backward needs from its forward, in bytes: its
 * outputs that some backward reads (but the loss tensor, live at the loss
 * step in any case) and its phantom. read_by_bwd: per tensor, scratch. */
static void rkm__kept_states(const rkm_graph *g, uint8_t *read_by_bwd, uint64_t *state)
{
    for (size_t i = 0; i < g->n_ops; i++)
        for (int32_t k = 0; g->ops[i].has_bwd && k < g->ops[i].n_saved; k++) read_by_bwd[g->ops[i].saved[k]] = 1;
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *o = &g->ops[i];
        state[i] = o->has_bwd ? o->phantom : 0;
        for (int32_t k = 0; k < o->n_out; k++)
            if (read_by_bwd[o->out[k]] && o->out[k] != g->loss) state[i] += g->tensors[o->out[k]].bytes;
    }
}

/* Knapsack over the ops: the most forward time whose kept state fits in
 * cap bytes. Bytes are counted in units of cap / RKM__BOUND_UNITS, each
 * item rounded down, so any set that truly fits fits here: the maximum
 * found is at least the true one. best has RKM__BOUND_UNITS + 1 entries. */
#define RKM__BOUND_UNITS 4096
static double rkm__kept_time(const rkm_graph *g, const uint64_t *state, uint64_t cap, double *best)
{
    uint64_t unit = cap / RKM__BOUND_UNITS + 1;
    size_t w_cap = (size_t)(cap / unit);
    for (size_t w = 0; w <= w_cap; w++) best[w] = 0;
    double free_time = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        size_t w = (size_t)(state[i] / unit);
        if (state[i] == 0 || state[i] > cap) continue; /* nothing to keep, or it cannot be kept */
        if (w == 0) {
            free_time += g->ops[i].fwd;
            continue;
        }
        for (size_t c = w_cap; c >= w; c--)
            if (best[c - w] + g->ops[i].fwd > best[c]) best[c] = best[c - w] + g->ops[i].fwd;
    }
    return free_time + best[w_cap];
}

rkm_result rkm_graph_time_bound(const rkm_graph *g, uint64_t budget, double *extra_seconds)
{
    if (!g || !extra_seconds)
        return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_time_bound: extra_seconds is NULL") : RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_graph_time_bound");
    if (r) return r;
    *extra_seconds = 0;
    if (budget < g->stats.lower_bound)
        return rkm__err(g->ctx, RKM_ERROR_BUDGET, "rkm_graph_time_bound: no plan fits %llu bytes (the lower bound is %llu)",
                        (unsigned long long)budget, (unsigned long long)g->stats.lower_bound);
    if (budget >= g->stats.baseline_peak) return RKM_OK;
    uint8_t *read_by_bwd = rkm__calloc(g->ctx, g->n_tensors + 1, 1);
    uint64_t *state = rkm__calloc(g->ctx, g->n_ops + 1, sizeof *state);
    double *best = rkm__calloc(g->ctx, RKM__BOUND_UNITS + 1, sizeof *best);
    if (!read_by_bwd || !state || !best) r = rkm__nomem(g->ctx, "rkm_graph_time_bound");
    if (!r) {
        rkm__kept_states(g, read_by_bwd, state);
        /* the loss step holds the inputs, the loss and its gradient (lower_bound covers them) */
        uint64_t cap = budget - g->input_bytes - 2 * g->tensors[g->loss].bytes, all = 0;
        double total = 0;
        for (size_t i = 0; i < g->n_ops; i++) {
            total += state[i] ? g->ops[i].fwd : 0;
            all += state[i];
        }
        double kept = all <= cap ? total : rkm__kept_time(g, state, cap, best);
        *extra_seconds = total > kept ? total - kept : 0;
    }
    rkm__free(g->ctx, read_by_bwd, g->n_tensors + 1);
    rkm__free(g->ctx, state, (g->n_ops + 1) * sizeof *state);
    rkm__free(g->ctx, best, (RKM__BOUND_UNITS + 1) * sizeof *best);
    return r;
}

/* The graph's figures, once, at finalize: the baseline's peak and time come
 * from replaying its steps (the graph is not finalized yet: no plan). */
static rkm_result rkm__graph_figures(rkm_graph *g)
{
    rkm__steps d = {g->ctx, NULL, 0, 0};
    rkm__sim s;
    rkm_result r = rkm__baseline_steps(g, &d);
    if (!r && !(r = rkm__sim_init(g, &s))) {
        rkm_sim_result res;
        int32_t obj;
        if (!rkm__sim_run(&s, d.s, d.n, &res, NULL) || rkm__sim_end(&s, &obj) != RKM_RULE_NONE)
            r = rkm__err(g->ctx, RKM_ERROR_INTERNAL, "internal error: the baseline plan does not replay");
        rkm__sim_free(&s);
        rkm_graph_stats *st = &g->stats;
        st->input_bytes = g->input_bytes;
        st->baseline_peak = res.peak;
        st->baseline_time = res.time;
        st->lower_bound = rkm__lower_bound(g);
        st->blocks = g->n_blocks;
        st->block_classes = g->n_classes;
    }
    rkm__steps_free(&d);
    return r;
}

rkm_result rkm_graph_stats_get(const rkm_graph *g, rkm_graph_stats *out)
{
    if (!g || !out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_stats_get: out is NULL") : RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_graph_stats_get");
    if (!r) *out = g->stats;
    return r;
}

/* ===========================================================================
 * 7. Structure: separators, blocks, classes
 * ========================================================================= */

/* Relative tolerance for op times within a class of identical blocks. A
 * class shares its ILP schedules only: every block's option figures come
 * from replaying the schedule on that block, so the tolerance trades option
 * quality for fewer solves, never correctness. */
#define RKM_CLASS_TIME_TOLERANCE 0.20

/* Separators are the tensors that dominate the loss in the graph that
 * runs from a virtual source to the first ops (those that read only input
 * tensors, which are live all the time), from each op to its outputs and
 * from each non-input tensor to the ops that read it: every path from the
 * source to the loss passes through them. Ops are in topological order, so
 * one pass gives every node's immediate dominator: a tensor's is its
 * producer, an op's the nearest common dominator of the tensors it reads
 * (the source for a first op), found by binary lifting in O(log n). The
 * loss's dominators are then the chain of immediate dominators above it.
 * Nodes: 0 the source, 1 + i op i, 1 + n_ops + t tensor t. */
static int32_t rkm__dom_lca(int32_t *const *up, const int32_t *depth, int levels, int32_t a, int32_t b)
{
    if (depth[a] < depth[b]) {
        int32_t t = a;
        a = b;
        b = t;
    }
    for (int k = levels - 1; k >= 0; k--)
        if (depth[a] - (1 << k) >= depth[b]) a = up[k][a];
    if (a == b) return a;
    for (int k = levels - 1; k >= 0; k--)
        if (up[k][a] != up[k][b]) a = up[k][a], b = up[k][b];
    return up[0][a];
}

/* Separators in op order: tensors with a gradient, other than the loss,
 * through which every path from the first ops to the loss passes. */
static rkm_result rkm__separators(const rkm_graph *g, int32_t *seps, int32_t *n_seps)
{
    size_t nodes = 1 + g->n_ops + g->n_tensors;
    int levels = 1;
    while (levels < 31 && ((size_t)1 << levels) < nodes) levels++;
    int32_t *depth = rkm__alloc(g->ctx, nodes * sizeof *depth);
    int32_t *up[31] = {NULL};
    int ok = depth != NULL;
    for (int k = 0; k < levels && ok; k++) ok = (up[k] = rkm__alloc(g->ctx, nodes * sizeof *up[k])) != NULL;
    *n_seps = 0;
    if (ok) {
        int32_t tensor0 = 1 + (int32_t)g->n_ops;
        depth[0] = 0;
        for (int k = 0; k < levels; k++) up[k][0] = 0;
        for (size_t i = 0; i < g->n_ops; i++) {
            const rkm__op *o = &g->ops[i];
            int32_t v = 1 + (int32_t)i, dom = -1;
            for (int32_t k = 0; k < o->n_in; k++) {
                int32_t t = o->in[k];
                if (g->tensors[t].flags & RKM_TENSOR_INPUT) continue;
                dom = dom < 0 ? tensor0 + t : rkm__dom_lca(up, depth, levels, dom, tensor0 + t);
            }
            if (dom < 0) dom = 0; /* a first op */
            for (int32_t k = 0; k <= o->n_out; k++) { /* the op, then its outputs */
                int32_t x = k ? tensor0 + o->out[k - 1] : v, d = k ? v : dom;
                depth[x] = depth[d] + 1;
                up[0][x] = d;
                for (int l = 1; l < levels; l++) up[l][x] = up[l - 1][up[l - 1][x]];
            }
        }
        /* the loss's dominators, from the loss up: reversed into op order */
        for (int32_t x = up[0][tensor0 + g->loss]; x > 0; x = up[0][x]) {
            int32_t t = x - tensor0;
            if (t >= 0 && g->tensors[t].has_grad) seps[(*n_seps)++] = t;
        }
        for (int32_t i = 0, j = *n_seps - 1; i < j; i++, j--) {
            int32_t t = seps[i];
            seps[i] = seps[j];
            seps[j] = t;
        }
    }
    rkm__free(g->ctx, depth, nodes * sizeof *depth);
    for (int k = 0; k < levels; k++) rkm__free(g->ctx, up[k], nodes * sizeof *up[k]);
    return ok ? RKM_OK : rkm__nomem(g->ctx, "structure");
}

/* Two blocks are identical when their ops match one to one with the same
 * lists (tensors named relative to the block), sizes and flags, and times
 * within the tolerance. */
static int rkm__close(double a, double b)
{
    double m = a > b ? a : b;
    return fabs(a - b) <= RKM_CLASS_TIME_TOLERANCE * m;
}

/* A tensor seen from a block: an input tensor (its id), the block input
 * (-1), or output k of the block's j-th op (-(2 + j * 65536 + k)). */
static int64_t rkm__local_ref(const rkm_graph *g, const rkm__block *b, int32_t t)
{
    if (g->tensors[t].flags & RKM_TENSOR_INPUT) return t;
    if (t == b->in) return -1;
    int32_t p = g->tensors[t].producer;
    int32_t j = p - b->ops[0];
    if (j < 0 || j >= b->n_ops) return INT64_MIN; /* not local: never equal */
    const rkm__op *o = &g->ops[p];
    int32_t k = 0;
    while (o->out[k] != t) k++;
    return -(2 + (int64_t)j * 65536 + k);
}

static int rkm__same_list(const rkm_graph *g, const rkm__block *a, const rkm__block *b, const int32_t *la,
                          const int32_t *lb, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        const rkm__tensor *x = &g->tensors[la[i]], *y = &g->tensors[lb[i]];
        int64_t ra = rkm__local_ref(g, a, la[i]), rb = rkm__local_ref(g, b, lb[i]);
        /* The block output's other contributors are outside the block. */
        int inner = la[i] != a->out;
        if (ra == INT64_MIN || ra != rb || x->bytes != y->bytes || x->flags != y->flags || x->has_grad != y->has_grad ||
            (inner && x->n_contrib != y->n_contrib))
            return 0;
    }
    return 1;
}

static int rkm__same_block(const rkm_graph *g, const rkm__block *a, const rkm__block *b)
{
    if (a->n_ops != b->n_ops || (a->in < 0) != (b->in < 0) || (a->out == g->loss) != (b->out == g->loss)) return 0;
    if (rkm__local_ref(g, a, a->out) != rkm__local_ref(g, b, b->out)) return 0;
    if (a->in >= 0 && g->tensors[a->in].bytes != g->tensors[b->in].bytes) return 0;
    for (int32_t j = 0; j < a->n_ops; j++) {
        const rkm__op *x = &g->ops[a->ops[j]], *y = &g->ops[b->ops[j]];
        if (x->n_in != y->n_in || x->n_out != y->n_out || x->n_saved != y->n_saved || x->phantom != y->phantom ||
            x->fwd_ws != y->fwd_ws || x->scratch != y->scratch || x->bwd_ws != y->bwd_ws || x->has_bwd != y->has_bwd ||
            x->flags != y->flags ||
            !rkm__close(x->fwd, y->fwd) || !rkm__close(x->bwd, y->bwd))
            return 0;
        if (!rkm__same_list(g, a, b, x->in, y->in, x->n_in) || !rkm__same_list(g, a, b, x->out, y->out, x->n_out) ||
            !rkm__same_list(g, a, b, x->saved, y->saved, x->n_saved))
            return 0;
    }
    return 1;
}

/* A block's signature: a hash of what rkm__same_block compares exactly
 * (everything but the times), so that only blocks of equal signature are
 * compared. */
static uint64_t rkm__block_sig(const rkm_graph *g, const rkm__block *b)
{
    uint64_t h = 14695981039346656037ull;
#define RKM__MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    RKM__MIX(b->n_ops);
    RKM__MIX(b->in < 0 ? 0 : g->tensors[b->in].bytes + 1);
    RKM__MIX(b->out == g->loss);
    for (int32_t j = 0; j < b->n_ops; j++) {
        const rkm__op *o = &g->ops[b->ops[j]];
        RKM__MIX(o->n_in), RKM__MIX(o->n_out), RKM__MIX(o->n_saved), RKM__MIX(o->phantom), RKM__MIX(o->fwd_ws);
        RKM__MIX(o->scratch), RKM__MIX(o->bwd_ws), RKM__MIX(o->has_bwd), RKM__MIX(o->flags);
        for (int32_t k = 0; k < o->n_in + o->n_out; k++) {
            const rkm__tensor *t = &g->tensors[k < o->n_in ? o->in[k] : o->out[k - o->n_in]];
            RKM__MIX(t->bytes), RKM__MIX(t->flags), RKM__MIX(t->has_grad);
        }
    }
#undef RKM__MIX
    return h;
}

typedef struct rkm__sigidx {
    uint64_t sig;
    int32_t block;
} rkm__sigidx;

static int rkm__sigidx_cmp(const void *x, const void *y)
{
    const rkm__sigidx *a = x, *b = y;
    if (a->sig != b->sig) return a->sig < b->sig ? -1 : 1;
    return (a->block > b->block) - (a->block < b->block);
}

/* Classes: a block takes the class of the first earlier block it is the
 * same as (rkm__same_block), else a new one. Only blocks of one signature
 * can be the same, so each is compared with the earlier ones of its
 * signature: O(n log n) on a chain of distinct blocks, not O(n^2). */
static rkm_result rkm__classes(rkm_graph *g)
{
    int32_t n = g->n_blocks;
    rkm__sigidx *v = rkm__alloc(g->ctx, ((size_t)n + 1) * sizeof *v);
    int32_t *rep = rkm__alloc(g->ctx, ((size_t)n + 1) * sizeof *rep); /* the first block of b's class */
    if (!v || !rep) {
        rkm__free(g->ctx, v, ((size_t)n + 1) * sizeof *v);
        rkm__free(g->ctx, rep, ((size_t)n + 1) * sizeof *rep);
        return rkm__nomem(g->ctx, "structure");
    }
    for (int32_t b = 0; b < n; b++) v[b] = (rkm__sigidx){rkm__block_sig(g, &g->blocks[b]), b};
    qsort(v, (size_t)n, sizeof *v, rkm__sigidx_cmp);
    for (int32_t i = 0, start = 0; i < n; i++) { /* the earlier blocks of its signature, in block order */
        if (i && v[i].sig != v[i - 1].sig) start = i;
        int32_t b = v[i].block;
        rep[b] = b;
        for (int32_t k = start; k < i && rep[b] == b; k++)
            if (rkm__same_block(g, &g->blocks[v[k].block], &g->blocks[b])) rep[b] = rep[v[k].block];
    }
    g->n_classes = 0; /* numbered in block order */
    for (int32_t b = 0; b < n; b++) g->blocks[b].cls = rep[b] == b ? g->n_classes++ : g->blocks[rep[b]].cls;
    rkm__free(g->ctx, v, ((size_t)n + 1) * sizeof *v);
    rkm__free(g->ctx, rep, ((size_t)n + 1) * sizeof *rep);
    return RKM_OK;
}

/* Cut at the separators. Blocks are runs of consecutive ops: an op that is
 * not an ancestor of a separator is a descendant of it. Runs of one-op
 * blocks are merged, RKM_MERGE_RUN ops at most, so that chains of tiny ops
 * (an MLP, a GPT's head) do not become a block each: every block boundary is
 * held from its forward to its block's backward, so boundaries cost memory,
 * while the block ILP handles what lies inside a block. Measured against
 * pairs: runs of 4 take rockmate's smallest budget on gpt2-124M from 65 % to
 * 49 % and its overhead on gpt2-tiny at 41 % from 31 % to 20 %; longer runs
 * gain little more for rockmate and cost rotor (two options a block) more
 * of its range (an 8-layer MLP: 47 % at pairs, 58 % at 4, 68 % at 6). */
#define RKM_MERGE_RUN 4
static rkm_result rkm__structure_detect(rkm_graph *g)
{
    rkm__graph_free_blocks(g);
    int32_t *seps = rkm__alloc(g->ctx, (g->n_tensors + 1) * sizeof *seps);
    int32_t *ends = rkm__alloc(g->ctx, (g->n_ops + 1) * sizeof *ends); /* last op of each block */
    rkm_result r = seps && ends ? RKM_OK : rkm__nomem(g->ctx, "structure");
    int32_t n_seps = 0, n = 0;
    if (!r) r = rkm__separators(g, seps, &n_seps);
    if (!r) {
        for (int32_t i = 0; i < n_seps; i++) ends[n++] = g->tensors[seps[i]].producer;
        ends[n++] = (int32_t)g->n_ops - 1;
        int32_t m = 0, prev = -1; /* merge runs of one-op blocks */
        for (int32_t i = 0; i < n; i++) {
            int single = ends[i] - prev == 1;
            for (int run = 1; single && run < RKM_MERGE_RUN && i + 1 < n && ends[i + 1] - ends[i] == 1; run++) i++;
            prev = ends[i];
            ends[m] = ends[i];
            seps[m] = i < n_seps ? seps[i] : g->loss;
            m++;
        }
        n = m;
        g->blocks = rkm__calloc(g->ctx, (size_t)n, sizeof *g->blocks);
        g->block_ops = rkm__alloc(g->ctx, g->n_ops * sizeof *g->block_ops);
        if (!g->blocks || !g->block_ops) {
            rkm__free(g->ctx, g->blocks, (size_t)n * sizeof *g->blocks);
            rkm__free(g->ctx, g->block_ops, g->n_ops * sizeof *g->block_ops);
            g->blocks = NULL;
            g->block_ops = NULL;
            r = rkm__nomem(g->ctx, "structure");
        }
    }
    if (!r) {
        g->n_blocks = n;
        for (size_t i = 0; i < g->n_ops; i++) g->block_ops[i] = (int32_t)i;
        for (int32_t b = 0; b < n; b++) {
            rkm__block *k = &g->blocks[b];
            int32_t first = b ? ends[b - 1] + 1 : 0;
            k->ops = g->block_ops + first;
            k->n_ops = ends[b] - first + 1;
            k->in = b ? g->blocks[b - 1].out : -1;
            k->out = b == n - 1 ? g->loss : seps[b];
            k->cls = -1;
        }
        r = rkm__classes(g);
    }
    rkm__free(g->ctx, seps, (g->n_tensors + 1) * sizeof *seps);
    rkm__free(g->ctx, ends, (g->n_ops + 1) * sizeof *ends);
    return r;
}

/* ===========================================================================
 * 8. Block options: extremes, replay, dominance
 * ===========================================================================
 *
 * Bytes: every memory figure of a block and every budget, from the planner
 * (section 11) through the block options here to the block ILP (section 9),
 * is absolute bytes, the graph's input tensors included: what the simulator
 * measures. "peak" is the most live at any point; "kept" is everything live
 * at the end of a block's forward part (inputs, x_in, x_out and what the
 * backward keeps); a budget of either is peak_budget / kept_budget. The chain
 * DP (section 10) alone counts otherwise, in slots above the inputs (its kept
 * besides x_{i-1} and x_i); rkm__planner_chain is the one conversion. */

/* An option of a block: a schedule of the block's own steps (forward part
 * then backward part, global ids) and its five figures, all measured by
 * replaying the schedule in the simulator from the block's start state:
 *   pf   peak of the forward part
 *   kept memory live after the forward part
 *   pb   peak of the backward part (starts from kept plus grad(x_out)) */
typedef struct rkm__option {
    rkm_step *steps;
    size_t n_fwd, n_bwd;
    double tf, tb;
    uint64_t kept, pf, pb;
    size_t seq; /* order of arrival: the last tie-break, so sorting is total */
} rkm__option;

/* Per block: the no-save forward (run to reach a checkpoint) and options. */
typedef struct rkm__bopts {
    rkm_step *nosave;
    size_t n_nosave;
    double tfn;
    uint64_t pfn;
    rkm__option *opt;
    size_t n_opt, cap_opt;
    size_t arrived; /* options offered so far */
} rkm__bopts;

static void rkm__option_free(rkm_context *ctx, rkm__option *o)
{
    rkm__free(ctx, o->steps, (o->n_fwd + o->n_bwd) * sizeof *o->steps);
    o->steps = NULL;
}

static void rkm__bopts_free(rkm_context *ctx, rkm__bopts *b)
{
    rkm__free(ctx, b->nosave, b->n_nosave * sizeof *b->nosave);
    for (size_t i = 0; i < b->n_opt; i++) rkm__option_free(ctx, &b->opt[i]);
    rkm__free(ctx, b->opt, b->cap_opt * sizeof *b->opt);
    memset(b, 0, sizeof *b);
}

/* Is t a tensor of the block (made by one of its ops)? */
static int rkm__in_block(const rkm_graph *g, const rkm__block *b, int32_t t)
{
    int32_t p = g->tensors[t].producer;
    return p >= b->ops[0] && p <= b->ops[b->n_ops - 1];
}

/* Does a block op with a backward, from op index `from` down to the block's
 * first op, save t? (from = last op: any backward of the block.) */
static int rkm__bwd_needs(const rkm_graph *g, const rkm__block *b, int32_t t, int32_t from)
{
    for (int32_t i = from; i >= b->ops[0]; i--) {
        const rkm__op *o = &g->ops[i];
        if (o->has_bwd && rkm__list_has(o->saved, o->n_saved, t)) return 1;
    }
    return 0;
}

/* Is t read by a forward of the block after op i? */
static int rkm__fwd_reads_after(const rkm_graph *g, const rkm__block *b, int32_t t, int32_t i)
{
    for (int32_t j = i + 1; j <= b->ops[b->n_ops - 1]; j++)
        if (rkm__list_has(g->ops[j].in, g->ops[j].n_in, t)) return 1;
    return 0;
}

/* The block's forward, every tensor freed after its last use; with `keep`
 * it saves phantoms and keeps what the backward reads (the block's baseline
 * forward), without it keeps only x_in and x_out (the no-save forward). */
static int rkm__gen_forward(const rkm_graph *g, const rkm__block *b, int keep, rkm__steps *l)
{
    int32_t last = b->ops[b->n_ops - 1];
    for (int32_t i = b->ops[0]; i <= last; i++) {
        const rkm__op *o = &g->ops[i];
        if (!rkm__steps_push(l, RKM_STEP_FWD, i, keep && rkm__saves_phantom(o))) return 0;
        for (int32_t k = 0; k < o->n_in + o->n_out; k++) {
            int32_t t = o->in[k];
            if (t == b->out || !rkm__in_block(g, b, t) || rkm__fwd_reads_after(g, b, t, i)) continue;
            if (keep && rkm__bwd_needs(g, b, t, last)) continue;
            if (!rkm__steps_push(l, RKM_STEP_FREE, t, 0)) return 0;
        }
    }
    return 1;
}

/* The block's baseline backward, from the state its baseline forward left. */
static int rkm__gen_backward(const rkm_graph *g, const rkm__block *b, rkm__steps *l)
{
    int32_t last = b->ops[b->n_ops - 1];
    if (b->out == g->loss && !rkm__steps_push(l, RKM_STEP_LOSS, g->loss, 0)) return 0;
    if (!rkm__bwd_needs(g, b, b->out, last) && !rkm__steps_push(l, RKM_STEP_FREE, b->out, 0)) return 0;
    for (int32_t i = last; i >= b->ops[0]; i--) {
        const rkm__op *o = &g->ops[i];
        if (!o->has_bwd) continue;
        if (!rkm__steps_push(l, RKM_STEP_BWD, i, 0)) return 0;
        if (rkm__saves_phantom(o) && !rkm__steps_push(l, RKM_STEP_FREE_SAVED, i, 0)) return 0;
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].has_grad && !rkm__steps_push(l, RKM_STEP_FREE_GRAD, o->out[k], 0)) return 0;
        for (int32_t k = 0; k < o->n_saved; k++) {
            int32_t t = o->saved[k];
            if (!rkm__in_block(g, b, t) || rkm__bwd_needs(g, b, t, i - 1)) continue;
            if (!rkm__steps_push(l, RKM_STEP_FREE, t, 0)) return 0;
        }
    }
    return 1;
}

/* Replay an option from the block's start state; fill its figures. Returns
 * 1 when both parts are valid and the backward ends in the block's end
 * state: x_in live, grad(x_in) live and complete, nothing else of the block. */
static int rkm__option_measure(rkm__sim *s, const rkm__block *b, rkm__option *o)
{
    const rkm_graph *g = s->g;
    rkm_sim_result r;
    rkm__sim_reset(s);
    rkm__sim_give_tensor(s, b->in);
    uint64_t base = g->input_bytes + (b->in >= 0 ? g->tensors[b->in].bytes : 0);
    if (!rkm__sim_run(s, o->steps, o->n_fwd, &r, NULL) || !s->D[b->out]) return 0;
    o->tf = r.time;
    o->pf = r.peak;
    o->kept = s->mem;
    if (b->out != g->loss) rkm__sim_give_grad(s, b->out);
    if (!rkm__sim_run(s, o->steps + o->n_fwd, o->n_bwd, &r, NULL)) return 0;
    o->tb = r.time;
    o->pb = r.peak;
    for (int32_t i = b->ops[0]; i <= b->ops[b->n_ops - 1]; i++)
        if (s->P[i] || (g->ops[i].has_bwd && !s->bwd_done[i])) return 0;
    uint64_t end = base + (b->in >= 0 && g->tensors[b->in].has_grad ? g->tensors[b->in].bytes : 0);
    if (b->in >= 0 && g->tensors[b->in].has_grad && !rkm__grad_complete(s, b->in)) return 0;
    return s->mem == end && (b->in < 0 || s->D[b->in]);
}

/* Replay the no-save forward: it must leave exactly x_in and x_out. */
static int rkm__nosave_measure(rkm__sim *s, const rkm__block *b, rkm__bopts *bo)
{
    const rkm_graph *g = s->g;
    rkm_sim_result r;
    rkm__sim_reset(s);
    rkm__sim_give_tensor(s, b->in);
    if (!rkm__sim_run(s, bo->nosave, bo->n_nosave, &r, NULL) || !s->D[b->out]) return 0;
    bo->tfn = r.time;
    bo->pfn = r.peak;
    uint64_t end = g->input_bytes + g->tensors[b->out].bytes + (b->in >= 0 ? g->tensors[b->in].bytes : 0);
    return s->mem == end;
}

/* Does a dominate b (no worse in every figure)? */
static int rkm__dominates(const rkm__option *a, const rkm__option *b)
{
    return a->tf + a->tb <= b->tf + b->tb && a->kept <= b->kept && a->pf <= b->pf && a->pb <= b->pb;
}

/* Measure an option and add it unless an option already there dominates
 * it; drop those it dominates. Takes ownership of o->steps either way.
 * Returns 0 on allocation failure, else 1; *valid says whether it replayed. */
static int rkm__bopts_add(rkm_context *ctx, rkm__sim *s, const rkm__block *b, rkm__bopts *bo, rkm__option *o, int *valid)
{
    *valid = rkm__option_measure(s, b, o);
    if (!*valid) {
        rkm__option_free(ctx, o);
        return 1;
    }
    for (size_t i = 0; i < bo->n_opt; i++)
        if (rkm__dominates(&bo->opt[i], o)) {
            rkm__option_free(ctx, o);
            return 1;
        }
    size_t m = 0;
    for (size_t i = 0; i < bo->n_opt; i++) {
        if (rkm__dominates(o, &bo->opt[i])) rkm__option_free(ctx, &bo->opt[i]);
        else bo->opt[m++] = bo->opt[i];
    }
    bo->n_opt = m;
    if (!rkm__reserve(ctx, (void **)&bo->opt, &bo->cap_opt, bo->n_opt + 1, sizeof *bo->opt)) {
        rkm__option_free(ctx, o);
        return 0;
    }
    o->seq = bo->arrived++;
    bo->opt[bo->n_opt++] = *o;
    return 1;
}

/* Less memory first, then less time, then fewer steps, then arrival: a
 * total order, so qsort gives the same result on every C library, and the
 * DP prefers earlier options on ties. */
static int rkm__option_cmp(const void *x, const void *y)
{
    const rkm__option *a = x, *b = y;
    if (a->kept != b->kept) return a->kept < b->kept ? -1 : 1;
    if (a->pf != b->pf) return a->pf < b->pf ? -1 : 1;
    if (a->pb != b->pb) return a->pb < b->pb ? -1 : 1;
    double ta = a->tf + a->tb, tb = b->tf + b->tb;
    if (ta != tb) return ta < tb ? -1 : 1;
    if (a->n_fwd + a->n_bwd != b->n_fwd + b->n_bwd) return a->n_fwd + a->n_bwd < b->n_fwd + b->n_bwd ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

/* The two extremes of a block: its own baseline, and the no-save forward. */
static rkm_result rkm__bopts_extremes(rkm__sim *s, const rkm__block *b, rkm__bopts *bo)
{
    const rkm_graph *g = s->g;
    rkm__steps l = {g->ctx, NULL, 0, 0};
    rkm__option o;
    memset(&o, 0, sizeof o);
    int ok = rkm__gen_forward(g, b, 0, &l);
    bo->n_nosave = l.n;
    if (ok) bo->nosave = rkm__steps_take(&l);
    if (!ok || !bo->nosave) {
        rkm__free(g->ctx, l.s, l.cap * sizeof *l.s);
        bo->n_nosave = 0;
        return rkm__nomem(g->ctx, "block options");
    }
    ok = rkm__gen_forward(g, b, 1, &l);
    o.n_fwd = l.n;
    ok = ok && rkm__gen_backward(g, b, &l);
    o.n_bwd = l.n - o.n_fwd;
    if (ok) o.steps = rkm__steps_take(&l);
    if (!ok || !o.steps) {
        rkm__free(g->ctx, l.s, l.cap * sizeof *l.s);
        return rkm__nomem(g->ctx, "block options");
    }
    int valid;
    if (!rkm__bopts_add(g->ctx, s, b, bo, &o, &valid)) return rkm__nomem(g->ctx, "block options");
    if (!valid || !rkm__nosave_measure(s, b, bo))
        return rkm__err(g->ctx, RKM_ERROR_INTERNAL, "internal error: block %s..%s: its baseline schedule does not replay",
                        g->ops[b->ops[0]].name, g->ops[b->ops[b->n_ops - 1]].name);
    return RKM_OK;
}

/* Map a step of block `from` onto the identical block `to`. */
static rkm_step rkm__map_step(const rkm_graph *g, const rkm__block *from, const rkm__block *to, rkm_step st)
{
    if (st.kind == RKM_STEP_LOSS) return st;
    if (rkm__step_on_op(st.kind)) {
        st.index = to->ops[st.index - from->ops[0]];
        return st;
    }
    int64_t ref = rkm__local_ref(g, from, st.index);
    if (ref >= 0) return st;
    if (ref == -1) {
        st.index = to->in;
        return st;
    }
    int64_t code = -ref - 2;
    st.index = g->ops[to->ops[code / 65536]].out[code % 65536];
    return st;
}

/* ===========================================================================
 * 9. Block ILP (lp_solve)
 * ===========================================================================
 *
 * A block: forward ops (global ids, topological order) of a finalized graph,
 * the separator x_in entering it (-1: none) and x_out leaving it (the loss
 * tensor for the last block). Its schedule is two runs of graph-level steps:
 *   F  from inputs + x_in: every block op's forward once, in order, with
 *      `save` where the phantom is kept; frees. Ends with x_in, x_out and
 *      whatever B needs live ("kept").
 *   B  from F's end state plus grad(x_out) live and complete (the caller sets
 *      it with rkm__sim_give_grad; the last block starts B with `loss`):
 *      recomputations, every block backward once, frees. Ends with inputs +
 *      x_in live, grad(x_in) live (if it has one), nothing else.
 *
 *   rkm__ilp_block_create(g, ops, n_ops, x_in, x_out, is_last, &b)
 *      builds the budget-independent model (the whole graph: x_in = -1,
 *      x_out = loss, is_last = 1: that is Checkmate's whole-graph form).
 *   rkm__ilp_block_solve(b, peak_budget, kept_budget, time_limit_s, &steps,
 *                        &n_fwd, &n_bwd, &stats, &found)
 *      least-time schedule whose replayed peak is <= peak_budget and whose
 *      memory at the end of F ("kept", x_in and x_out included) is <=
 *      kept_budget (UINT64_MAX: no limit); absolute bytes, inputs included,
 *      like every memory figure of a block (see section 8).
 *      steps[0..n_fwd) is F, then n_bwd steps of B; the caller frees them
 *      with rkm__free(ctx, steps, (n_fwd + n_bwd) * sizeof *steps).
 *      found = 0 (steps NULL) when no schedule fits; that is RKM_OK too.
 *      time_limit_s (<= 0: 1 s) is turned into work budgets (lp_solve
 *      callbacks, steps replayed by the greedy) worth about that much time,
 *      so that the result is the same on every machine; a wall clock at
 *      RKM__ILP_WALL_SAFETY times the limit stops a pathological solve
 *      (results may then differ).
 *      Stats counters accumulate (zero them first); proven/bound/time
 *      describe this call.
 *   rkm__ilp_block_destroy(b)
 *
 * A block is four parts, each with one owner and its own init and free:
 * rkm__ilp_shape (numbering and structure, fixed at create), rkm__ilp_model
 * (the lprec and its column maps), rkm__ilp_memo (what solves learn: found
 * schedules, budget pairs proven empty, the floors) and rkm__ilp_scratch
 * (one solve's working memory, handed explicitly to the functions using it).
 *
 * Shape of the model (docs: lpsolve.md, formulation `fb`): stage 0 runs the
 * forward ops in order, then stage t = 1..nb runs the recomputations it
 * chooses (topological order) and the t-th backward (reverse order). Stage 1
 * opens with the "loss node": grad(x_out) appears. Values are data tensors
 * made by block ops (S: live at a stage start), phantoms (RP: the one stage
 * whose run of the op saves it; it then lives until the op's backward) and
 * gradients (fixed by the backward order: constants). Memory is the chain of
 * Q columns (a node's peak, bounded by the peak budget); the kept budget
 * plus grad(x_out) is the bound of the loss node's Q. Frees are continuous F columns (disaggregated).
 * A solution is read out as "who runs where" only; the steps free every
 * tensor right after its last use, which never needs more memory than the
 * model counted. Every schedule is replayed by the simulator before use.
 * Stages never reorder backwards and the forward pass never recomputes: the
 * optimum is over that family of schedules (tests/test_ilp.c checks it
 * against an exhaustive search of that family, and of all plans).
 *
 * Around the ILP, per solve: budgets below a floor (what some step always
 * needs) or under a pair already proven empty answer at once; a schedule
 * proven optimal for larger budgets that fits is optimal here too; else the
 * fastest fitting schedule among those found by earlier solves of the block
 * and a greedy (local search over per-op modes: keep, recompute in every
 * stage that reads it, recompute once and keep) is the incumbent, and
 * lp_solve runs with its objective as a cutoff (status INFEASIBLE or 25
 * then proves it optimal). The stage-window LNS of lpsolve.md was tried on
 * the whole-graph form of gpt2-tiny, peer-gpt and mlp16 and never improved
 * the incumbent, so it is not here. */

typedef struct rkm__ilp_stats {
    int32_t solves, optimal, suboptimal, infeasible, timeout, failed; /* lp_solve outcomes (accumulated) */
    double seconds;  /* wall time in rkm__ilp_block_solve (accumulated) */
    double work;     /* solver work spent, in seconds of its calibration (accumulated; deterministic) */
    int proven;      /* this call: the schedule (or "none fits") is optimal for the model */
    double time;     /* this call: the returned schedule's time (0 if none) */
    double bound;    /* this call: a lower bound on the model's optimal time */
} rkm__ilp_stats;

typedef struct rkm__ilp_block rkm__ilp_block;

#ifdef RKM_OMIT_SOLVER

struct rkm__ilp_block {
    int unused;
};

static rkm_result rkm__ilp_block_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                        int32_t x_out, int is_last, rkm__ilp_block **out)
{
    (void)ops, (void)n_ops, (void)x_in, (void)x_out, (void)is_last;
    *out = NULL;
    return rkm__err(g->ctx, RKM_ERROR_UNSUPPORTED, "block ILP: built without lp_solve (RKM_OMIT_SOLVER)");
}

static rkm_result rkm__ilp_block_solve(rkm__ilp_block *b, uint64_t peak_budget, uint64_t kept_budget,
                                       double time_limit_s, rkm_step **steps, size_t *n_fwd, size_t *n_bwd,
                                       rkm__ilp_stats *st, int *found)
{
    (void)b, (void)peak_budget, (void)kept_budget, (void)time_limit_s, (void)st;
    *steps = NULL;
    *n_fwd = *n_bwd = 0;
    *found = 0;
    /* No block, so no context for a message: rkm__ilp_block_create refused. */
    return RKM_ERROR_INTERNAL;
}

static void rkm__ilp_block_destroy(rkm__ilp_block *b) { (void)b; }

#else /* !RKM_OMIT_SOLVER */

#include <lpsolve/lp_lib.h>

/* ---- the one lock around lp_solve ---------------------------------------- */

#if !defined(__STDC_NO_THREADS__)
#include <threads.h>
static mtx_t rkm__ilp_mtx;
static once_flag rkm__ilp_once = ONCE_FLAG_INIT;
static void rkm__ilp_mtx_init(void) { (void)mtx_init(&rkm__ilp_mtx, mtx_plain); }
static void rkm__ilp_lock(void)
{
    call_once(&rkm__ilp_once, rkm__ilp_mtx_init);
    (void)mtx_lock(&rkm__ilp_mtx);
}
static void rkm__ilp_unlock(void) { (void)mtx_unlock(&rkm__ilp_mtx); }
#else
#include <pthread.h>
static pthread_mutex_t rkm__ilp_mtx = PTHREAD_MUTEX_INITIALIZER;
static void rkm__ilp_lock(void) { (void)pthread_mutex_lock(&rkm__ilp_mtx); }
static void rkm__ilp_unlock(void) { (void)pthread_mutex_unlock(&rkm__ilp_mtx); }
#endif

/* ---- the block ----------------------------------------------------------- */

#define RKM__ILP_ONE (-1) /* a variable reference that is the constant 1 */
#define RKM__ILP_CACHE 64 /* schedules remembered per block */
/* Work budgets, so that results do not depend on the machine's speed: a
 * time limit of 1 s allows lp_solve this many abort-callback calls times
 * model size (columns + rows), and the greedy half this many replayed steps
 * (each about 1 s on a 2020s core); the wall clock at RKM__ILP_WALL_SAFETY
 * times the limit stops a slow machine anyway. */
#define RKM__ILP_CALLS_PER_S 2.0e7
#define RKM__ILP_STEPS_PER_S 1.5e7 /* greedy: steps of the schedules it replays */
/* 20: only a pathological solve meets the wall clock, so that a slow,
 * loaded or sanitized build plans the same as any other. */
#define RKM__ILP_WALL_SAFETY 20.0
#define RKM__ILP_MAX_COLS 200000 /* beyond, building the model alone takes too long */

enum { RKM__ILP_NODE_FWD, RKM__ILP_NODE_BWD, RKM__ILP_NODE_LOSS };

typedef struct rkm__ilp_node {
    int32_t kind; /* RKM__ILP_NODE_* */
    int32_t v;    /* local op (fwd: the op run; bwd: the op whose backward runs) */
    int32_t q;    /* its Q column */
    int32_t f0;   /* its free candidates: fcand[f0 .. next node's f0) */
} rkm__ilp_node;

typedef struct rkm__ilp_free {
    int32_t i;   /* local tensor */
    int32_t col; /* its F column */
} rkm__ilp_free;

/* A schedule as the model sees it: who runs in which stage, where each
 * phantom is saved; and its replayed figures (absolute bytes, like every
 * memory figure and budget of the block ILP). */
typedef struct rkm__ilp_sched {
    uint8_t *r;    /* [(nb+1)*n]: r[t*n+v], op v runs in stage t (row 0 all 1) */
    int32_t *save; /* [n]: stage of v's save run, -1 if none */
    size_t r_bytes, n_save; /* allocated */
    uint64_t peak, kept;
    double time;
    /* in the cache: proven optimal for every budget pair up to these */
    int proven;
    uint64_t peak_budget, kept_budget;
} rkm__ilp_sched;

/* A budget pair proven to admit no schedule (nor does any smaller pair). */
typedef struct rkm__ilp_none {
    uint64_t peak_budget, kept_budget;
} rkm__ilp_none;

/* What a solve may spend: work units (deterministic) and a wall clock. */
typedef struct rkm__ilp_work {
    double calls, max_calls; /* lp_solve abort-callback calls */
    double evals, max_evals; /* steps of the schedules the greedy replayed */
    double deadline;         /* rkm__now() past which everything stops */
} rkm__ilp_work;

static int rkm__ilp_spent(const rkm__ilp_work *u, int greedy)
{
    if (greedy ? u->evals >= u->max_evals : u->calls >= u->max_calls) return 1;
    return rkm__now() > u->deadline;
}

/* The arrays of one part of a block, each recorded with its size when it
 * is allocated, so that the part frees exactly what it took. */
#define RKM__ILP_MAX_ARRAYS 16
typedef struct rkm__ilp_arrays {
    void **at[RKM__ILP_MAX_ARRAYS];
    size_t bytes[RKM__ILP_MAX_ARRAYS];
    int n;
} rkm__ilp_arrays;

/* *where = count zeroed items of elem bytes, recorded in a. 0: no memory. */
static int rkm__ilp_take(rkm_context *ctx, rkm__ilp_arrays *a, void *where, size_t count, size_t elem)
{
    void **p = where;
    if (a->n == RKM__ILP_MAX_ARRAYS) return 0; /* internal: raise RKM__ILP_MAX_ARRAYS */
    *p = rkm__calloc(ctx, count, elem);
    if (!*p) return 0;
    a->at[a->n] = p;
    a->bytes[a->n++] = count * elem;
    return 1;
}

static void rkm__ilp_drop(rkm_context *ctx, rkm__ilp_arrays *a)
{
    for (int k = 0; k < a->n; k++) {
        rkm__free(ctx, *a->at[k], a->bytes[k]);
        *a->at[k] = NULL;
    }
    a->n = 0;
}

/* Scratch in the ILP: a forward's transient bytes count as
 * rkm__fwd_ws_most on every run. The simulator counts the scratch only on
 * runs that keep no saved state, so the ILP over-counts a `save` run by at
 * most the scratch (<= phantom): its schedules stay within their budgets. */

/* (a) The block: its numbering and structure, fixed once created. */
typedef struct rkm__ilp_shape {
    const rkm_graph *g;
    rkm_context *ctx;
    int32_t n, nt, nb;        /* forward ops, block tensors, backward stages */
    int32_t x_in, x_out, is_last;
    int32_t *op;              /* [n] global id of local op v */
    int32_t *lt;              /* [g->n_tensors] local index of a block tensor, else -1 */
    int32_t *tg;              /* [nt] global id of local tensor i */
    int32_t *tprod;           /* [nt] local producer of i */
    int32_t *rd_off, *rd;     /* readers of i among the block ops: rd[rd_off[i] .. rd_off[i+1]) */
    int32_t *st;              /* [n] stage of v's backward, 0 if it has none */
    int32_t *bop;             /* [nb+1] local op whose backward is stage t */
    int32_t *need_o, *need_t; /* last stage where an op's run / a tensor can be useful */
    int32_t *last0;           /* [nt] last stage-0 node that touches i */
    int32_t max_list;         /* longest in or saved list of an op, plus one */
    uint64_t static_bytes;    /* inputs + x_in: live all along */
    uint64_t *gstart;         /* [nb+2] gradient bytes live at the start of stage t */
    uint64_t *gnew, *gfree;   /* [nb+1] gradient bytes made / freed by stage t's backward */
    double base_time;         /* every forward once and every backward */
    double tscale, mscale;    /* objective and byte divisors */
    rkm__ilp_arrays arrays;
} rkm__ilp_shape;

/* (b) The LP model of the block, budget-independent: budgets are bounds
 * that each solve sets. */
typedef struct rkm__ilp_model {
    lprec *lp;
    int32_t ncols, nrows;
    int32_t *colR, *colRP;    /* [(nb+1)*n], 0: no column */
    int32_t *colS;            /* [(nb+2)*nt] */
    rkm__ilp_node *node;      /* stage t's nodes: node[node_off[t] .. node_off[t+1]) */
    int32_t *node_off;        /* [nb+2] */
    int32_t n_nodes;
    rkm__ilp_free *fcand;
    int32_t n_fcand;
    int bad;                  /* a row that never holds: no schedule at any budget */
    double *x;                /* [ncols] solution */
    rkm__ilp_arrays arrays;
} rkm__ilp_model;

/* (c) What solves of the block learn and later solves use. */
typedef struct rkm__ilp_memo {
    rkm__ilp_sched cache[RKM__ILP_CACHE]; /* schedules found so far (ring) */
    int32_t n_cache, cache_next;
    rkm__ilp_none none[RKM__ILP_CACHE];   /* budget pairs proven empty (ring) */
    int32_t n_none, none_next;
    uint64_t min_peak, min_kept;          /* no schedule has a lower peak / kept memory */
} rkm__ilp_memo;

/* (d) Scratch of one solve, in three parts with one user each. Emitting and
 * replaying a schedule (rkm__ilp_measure): */
typedef struct rkm__ilp_replayer {
    int32_t *live;     /* [nt] last event that touched a tensor */
    int32_t *rbuf;     /* [max_list] one op's in or saved list */
    size_t last_steps; /* steps of the last schedule measured (work count) */
    rkm__sim sim;
} rkm__ilp_replayer;

/* The greedy (rkm__ilp_greedy) and its two trial schedules: */
typedef struct rkm__ilp_greedy_ws {
    uint8_t *x;     /* [n] the recompute set: 0 keep, 1 always, 2 once */
    uint8_t *seen2; /* [n] ops with x = 2 that have run again */
    rkm__ilp_sched trial, alt;
} rkm__ilp_greedy_ws;

/* And rkm__ilp_block_solve's own two schedules. */
typedef struct rkm__ilp_scratch {
    rkm__ilp_replayer rp;
    rkm__ilp_greedy_ws gr;
    rkm__ilp_sched best;  /* the incumbent */
    rkm__ilp_sched found; /* the greedy's result, then lp_solve's solution */
    rkm__ilp_arrays arrays;
} rkm__ilp_scratch;

struct rkm__ilp_block {
    rkm__ilp_shape shape;
    rkm__ilp_model model;
    rkm__ilp_memo memo;
    rkm__ilp_scratch scratch;
};

static size_t rkm__ilp_rsize(const rkm__ilp_shape *b) { return (size_t)(b->nb + 1) * (size_t)b->n; }

static rkm__ilp_free *rkm__ilp_fend(const rkm__ilp_model *md, int32_t k)
{
    return md->fcand + (k + 1 < md->n_nodes ? md->node[k + 1].f0 : md->n_fcand);
}

static int rkm__ilp_sched_alloc(const rkm__ilp_shape *b, rkm__ilp_sched *s)
{
    s->r_bytes = rkm__ilp_rsize(b) + 1;
    s->n_save = (size_t)b->n + 1;
    s->r = rkm__calloc(b->ctx, s->r_bytes, 1);
    s->save = rkm__calloc(b->ctx, s->n_save, sizeof *s->save);
    return s->r && s->save;
}

static void rkm__ilp_sched_free(rkm_context *ctx, rkm__ilp_sched *s)
{
    rkm__free(ctx, s->r, s->r_bytes);
    rkm__free(ctx, s->save, s->n_save * sizeof *s->save);
    s->r = NULL;
    s->save = NULL;
}

/* Copy src's contents and figures into dst, which keeps its own arrays. */
static void rkm__ilp_sched_copy(const rkm__ilp_shape *b, rkm__ilp_sched *dst, const rkm__ilp_sched *src)
{
    rkm__ilp_sched own = *dst;
    memcpy(own.r, src->r, rkm__ilp_rsize(b));
    memcpy(own.save, src->save, (size_t)b->n * sizeof *own.save);
    *dst = *src;
    dst->r = own.r;
    dst->save = own.save;
    dst->r_bytes = own.r_bytes;
    dst->n_save = own.n_save;
}

/* Report an error of block b: "block ILP: first..last: why". */
static rkm_result rkm__ilp_err(const rkm__ilp_shape *b, rkm_result code, const char *fmt, ...)
{
    char why[RKM_ERRMSG_SIZE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return rkm__err(b->ctx, code, "block ILP: %s..%s: %s", b->g->ops[b->op[0]].name, b->g->ops[b->op[b->n - 1]].name,
                    why);
}

static int rkm__ilp_phantom(const rkm__ilp_shape *b, int32_t v)
{
    const rkm__op *o = &b->g->ops[b->op[v]];
    return o->phantom > 0 && o->has_bwd;
}

/* Local tensor of global t if it is a block tensor, else -1. */
static int32_t rkm__ilp_loc(const rkm__ilp_shape *b, int32_t t) { return b->lt[t]; }

/* Does stage t's backward read block tensor i (saved)? */
static int rkm__ilp_bwd_reads(const rkm__ilp_shape *b, int32_t t, int32_t i)
{
    if (t < 1 || t > b->nb) return 0;
    const rkm__op *o = &b->g->ops[b->op[b->bop[t]]];
    return rkm__list_has(o->saved, o->n_saved, b->tg[i]);
}

/* ---- schedules: steps, replay ------------------------------------------- */

/* A schedule's steps, and where its forward part ends. */
typedef struct rkm__ilp_out {
    rkm__steps l;
    size_t n_fwd;
} rkm__ilp_out;

static int rkm__ilp_push(rkm__ilp_out *o, int32_t kind, int32_t index, int32_t save)
{
    return rkm__steps_push(&o->l, kind, index, save);
}

/* One compute event of a schedule. */
typedef struct rkm__ilp_event {
    int32_t kind, v, t;
} rkm__ilp_event;

/* Events of a schedule in order: stage 0's forwards, the loss node, then per
 * stage its recomputations and its backward. Returns the count. */
static size_t rkm__ilp_events(const rkm__ilp_shape *b, const rkm__ilp_sched *s, rkm__ilp_event *ev)
{
    size_t m = 0;
    for (int32_t v = 0; v < b->n; v++) ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_FWD, v, 0};
    ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_LOSS, -1, 1};
    for (int32_t t = 1; t <= b->nb; t++) {
        for (int32_t v = 0; v < b->n; v++)
            if (s->r[(size_t)t * (size_t)b->n + (size_t)v]) ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_FWD, v, t};
        ev[m++] = (rkm__ilp_event){RKM__ILP_NODE_BWD, b->bop[t], t};
    }
    return m;
}

/* Block tensors an event reads, through a callback-free list: fills buf
 * (capacity enough for any op's in/saved list) and returns the count. */
static int32_t rkm__ilp_reads(const rkm__ilp_shape *b, const rkm__ilp_event *e, int32_t *buf)
{
    int32_t k = 0;
    if (e->kind == RKM__ILP_NODE_LOSS) {
        buf[k++] = rkm__ilp_loc(b, b->x_out);
        return k;
    }
    const rkm__op *o = &b->g->ops[b->op[e->v]];
    const int32_t *list = e->kind == RKM__ILP_NODE_FWD ? o->in : o->saved;
    int32_t nl = e->kind == RKM__ILP_NODE_FWD ? o->n_in : o->n_saved;
    for (int32_t j = 0; j < nl; j++)
        if (rkm__ilp_loc(b, list[j]) >= 0) buf[k++] = rkm__ilp_loc(b, list[j]);
    return k;
}

typedef struct rkm__ilp_freeat {
    size_t e;
    int32_t i;
} rkm__ilp_freeat;

static int rkm__ilp_freeat_cmp(const void *a, const void *c)
{
    const rkm__ilp_freeat *x = a, *y = c;
    if (x->e != y->e) return x->e < y->e ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* Emit the main step of event e. */
static int rkm__ilp_emit_event(const rkm__ilp_shape *b, const rkm__ilp_sched *s, const rkm__ilp_event *e,
                               rkm__ilp_out *o)
{
    const rkm_graph *g = b->g;
    if (e->kind == RKM__ILP_NODE_LOSS) return b->is_last ? rkm__ilp_push(o, RKM_STEP_LOSS, g->loss, 0) : 1;
    int32_t gop = b->op[e->v];
    if (e->kind == RKM__ILP_NODE_FWD)
        return rkm__ilp_push(o, RKM_STEP_FWD, gop, rkm__ilp_phantom(b, e->v) && s->save[e->v] == e->t);
    return rkm__ilp_push(o, RKM_STEP_BWD, gop, 0);
}

/* After a backward: its saved state and its outputs' gradients are dead. */
static int rkm__ilp_emit_bwd_frees(const rkm__ilp_shape *b, int32_t v, rkm__ilp_out *o)
{
    const rkm__op *op = &b->g->ops[b->op[v]];
    if (op->phantom > 0 && !rkm__ilp_push(o, RKM_STEP_FREE_SAVED, b->op[v], 0)) return 0;
    for (int32_t k = 0; k < op->n_out; k++)
        if (b->g->tensors[op->out[k]].has_grad && !rkm__ilp_push(o, RKM_STEP_FREE_GRAD, op->out[k], 0)) return 0;
    return 1;
}

/* Free points of schedule s's block tensors, sorted: each right after its
 * last use before it is made again, or right after it is made if nothing
 * reads it. *fr is allocated through the context (*cap items). 0: no memory. */
static int rkm__ilp_free_points(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, const rkm__ilp_event *ev, size_t m,
                                rkm__ilp_freeat **fr, size_t *n_fr, size_t *cap)
{
    int32_t *live = rp->live;
    int ok = 1;
    for (int32_t i = 0; i < b->nt; i++) live[i] = -1;
    /* Lifetimes: live[i] is the last event that touched i since it was made. */
    for (size_t e = 0; e < m && ok; e++) {
        int32_t nr = rkm__ilp_reads(b, &ev[e], rp->rbuf);
        for (int32_t j = 0; j < nr; j++) live[rp->rbuf[j]] = (int32_t)e;
        if (ev[e].kind != RKM__ILP_NODE_FWD) continue;
        const rkm__op *op = &b->g->ops[b->op[ev[e].v]];
        for (int32_t k = 0; k < op->n_out && ok; k++) {
            int32_t i = rkm__ilp_loc(b, op->out[k]);
            if (live[i] >= 0) {
                ok = rkm__reserve(b->ctx, (void **)fr, cap, *n_fr + 1, sizeof **fr);
                if (ok) (*fr)[(*n_fr)++] = (rkm__ilp_freeat){(size_t)live[i], i};
            }
            live[i] = (int32_t)e;
        }
    }
    for (int32_t i = 0; i < b->nt && ok; i++)
        if (live[i] >= 0) {
            ok = rkm__reserve(b->ctx, (void **)fr, cap, *n_fr + 1, sizeof **fr);
            if (ok) (*fr)[(*n_fr)++] = (rkm__ilp_freeat){(size_t)live[i], i};
        }
    if (ok && *n_fr) qsort(*fr, *n_fr, sizeof **fr, rkm__ilp_freeat_cmp);
    return ok;
}

/* The steps of schedule s: events in order, each followed by the frees
 * rkm__ilp_free_points puts there, in o->l (the context's allocation). */
static rkm_result rkm__ilp_emit(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, const rkm__ilp_sched *s,
                                rkm__ilp_out *o)
{
    rkm_context *ctx = b->ctx;
    size_t cap_ev = (size_t)b->n * (size_t)(b->nb + 1) + (size_t)b->nb + 2;
    rkm__ilp_event *ev = rkm__alloc(ctx, cap_ev * sizeof *ev);
    rkm__ilp_freeat *fr = NULL;
    size_t n_fr = 0, cap_fr = 0;
    int ok = ev != NULL;
    memset(o, 0, sizeof *o);
    o->l.ctx = ctx;
    size_t m = ok ? rkm__ilp_events(b, s, ev) : 0;
    ok = ok && rkm__ilp_free_points(b, rp, ev, m, &fr, &n_fr, &cap_fr);
    size_t f = 0;
    for (size_t e = 0; e < m && ok; e++) {
        ok = rkm__ilp_emit_event(b, s, &ev[e], o);
        if (ok && ev[e].kind == RKM__ILP_NODE_BWD) ok = rkm__ilp_emit_bwd_frees(b, ev[e].v, o);
        for (; ok && f < n_fr && fr[f].e == e; f++) ok = rkm__ilp_push(o, RKM_STEP_FREE, b->tg[fr[f].i], 0);
        if (ok && e + 1 < m && ev[e + 1].kind == RKM__ILP_NODE_LOSS) o->n_fwd = o->l.n;
    }
    rkm__free(ctx, ev, cap_ev * sizeof *ev);
    rkm__free(ctx, fr, cap_fr * sizeof *fr);
    if (!ok) {
        rkm__steps_free(&o->l);
        o->n_fwd = 0;
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a schedule's steps");
    }
    return RKM_OK;
}

/* Does the simulator's state hold exactly the block's end state? */
static int rkm__ilp_end_ok(const rkm__ilp_shape *b, const rkm__sim *s)
{
    const rkm_graph *g = b->g;
    for (int32_t v = 0; v < b->n; v++) {
        int32_t x = b->op[v];
        if ((g->ops[x].has_bwd && !s->bwd_done[x]) || s->P[x]) return 0;
    }
    if (b->is_last && !s->loss_done) return 0;
    for (size_t t = 0; t < g->n_tensors; t++) {
        int is_in = (g->tensors[t].flags & RKM_TENSOR_INPUT) || (int32_t)t == b->x_in;
        if (s->D[t] != is_in) return 0;
        int want_g = (int32_t)t == b->x_in && g->tensors[t].has_grad;
        if (s->G[t] != want_g) return 0;
        if (want_g && !rkm__grad_complete(s, (int32_t)t)) return 0;
    }
    return 1;
}

/* Replay a block schedule from the block's start state; fills the figures
 * of s (absolute bytes; kept: all that is live at the end of F). Returns 1
 * if it is valid and ends in the block's end state. */
static int rkm__ilp_replay(const rkm__ilp_shape *b, rkm__sim *sim, const rkm__ilp_out *o, rkm__ilp_sched *s)
{
    rkm_sim_result r1, r2;
    rkm__sim_reset(sim);
    rkm__sim_give_tensor(sim, b->x_in);
    if (!rkm__sim_run(sim, o->l.s, o->n_fwd, &r1, NULL)) return 0;
    s->kept = sim->mem;
    if (!b->is_last) rkm__sim_give_grad(sim, b->x_out);
    if (!rkm__sim_run(sim, o->l.s + o->n_fwd, o->l.n - o->n_fwd, &r2, NULL)) return 0;
    s->peak = r1.peak > r2.peak ? r1.peak : r2.peak;
    s->time = r1.time + r2.time;
    return rkm__ilp_end_ok(b, sim);
}

/* Emit and replay schedule s, setting its figures. Returns 1 if valid;
 * RKM_ERROR_NOMEM is reported through *res. */
static int rkm__ilp_measure(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, rkm__ilp_sched *s, rkm_result *res)
{
    rkm__ilp_out o;
    *res = rkm__ilp_emit(b, rp, s, &o);
    if (*res) return 0;
    int ok = rkm__ilp_replay(b, &rp->sim, &o, s);
    rp->last_steps = o.l.n;
    rkm__steps_free(&o.l);
    return ok;
}

static int rkm__ilp_fits(const rkm__ilp_sched *s, uint64_t peak_budget, uint64_t kept_budget)
{
    return s->peak <= peak_budget && s->kept <= kept_budget;
}

/* ---- greedy: a recompute set -------------------------------------------- */

/* Mark op v to run in stage row r when the recompute set says it does not
 * keep its outputs from earlier: 1, recompute in every stage that reads
 * them; 2, recompute in the first such stage and keep them (and the
 * phantom) from there. */
static void rkm__ilp_greedy_need(const rkm__ilp_greedy_ws *gw, uint8_t *r, int32_t v)
{
    if (gw->x[v] == 1 || (gw->x[v] == 2 && !gw->seen2[v])) r[v] = 1;
}

/* The schedule that the recompute set gw->x describes: each stage
 * recomputes, from what is live, what its backward reads (the phantom of an
 * op with x != 0 included). */
static void rkm__ilp_greedy_sched(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_sched *s)
{
    const rkm_graph *g = b->g;
    const uint8_t *x = gw->x;
    size_t n = (size_t)b->n;
    memset(s->r, 0, rkm__ilp_rsize(b));
    memset(s->r, 1, n);
    memset(gw->seen2, 0, n);
    for (int32_t v = 0; v < b->n; v++) s->save[v] = !rkm__ilp_phantom(b, v) ? -1 : x[v] ? b->st[v] : 0;
    for (int32_t t = 1; t <= b->nb; t++) {
        uint8_t *r = s->r + (size_t)t * n;
        int32_t o = b->bop[t];
        const rkm__op *bo = &g->ops[b->op[o]];
        if (rkm__ilp_phantom(b, o)) rkm__ilp_greedy_need(gw, r, o);
        for (int32_t k = 0; k < bo->n_saved; k++) {
            int32_t i = rkm__ilp_loc(b, bo->saved[k]);
            if (i >= 0) rkm__ilp_greedy_need(gw, r, b->tprod[i]);
        }
        for (int32_t v = b->n; v-- > 0;) {
            if (!r[v]) continue;
            const rkm__op *op = &g->ops[b->op[v]];
            for (int32_t k = 0; k < op->n_in; k++) {
                int32_t i = rkm__ilp_loc(b, op->in[k]);
                if (i >= 0) rkm__ilp_greedy_need(gw, r, b->tprod[i]);
            }
        }
        for (int32_t v = 0; v < b->n; v++)
            if (r[v] && x[v] == 2) {
                gw->seen2[v] = 1;
                if (rkm__ilp_phantom(b, v)) s->save[v] = t;
            }
    }
}

/* How far s is over the budgets (0: fits). */
static uint64_t rkm__ilp_excess(const rkm__ilp_sched *s, uint64_t peak_budget, uint64_t kept_budget)
{
    uint64_t e = s->peak > peak_budget ? s->peak - peak_budget : 0;
    uint64_t f = s->kept > kept_budget ? s->kept - kept_budget : 0;
    return e > UINT64_MAX - f ? UINT64_MAX : e + f;
}

/* Is a better than c: fitting first, then less excess, then less time? */
static int rkm__ilp_better(const rkm__ilp_sched *a, const rkm__ilp_sched *c, uint64_t peak_budget,
                           uint64_t kept_budget)
{
    uint64_t ea = rkm__ilp_excess(a, peak_budget, kept_budget), ec = rkm__ilp_excess(c, peak_budget, kept_budget);
    if (ea != ec) return ea < ec;
    return a->time < c->time;
}

/* Evaluate the recompute set with op v set to `val` into gw->trial.
 * Returns 1 if valid. */
static int rkm__ilp_greedy_try(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp, int32_t v,
                               uint8_t val, rkm_result *res)
{
    uint8_t keep = gw->x[v];
    gw->x[v] = val;
    rkm__ilp_greedy_sched(b, gw, &gw->trial);
    int ok = rkm__ilp_measure(b, rp, &gw->trial, res);
    gw->x[v] = keep;
    return ok;
}

/* One round of the local search: every change of one op's mode, the best
 * (excess, time) below *out's into *out. *pick: the op changed (-1: none),
 * *to its new mode. */
static rkm_result rkm__ilp_greedy_round(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp,
                                        uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work,
                                        rkm__ilp_sched *out, int32_t *pick, uint8_t *to)
{
    rkm_result res = RKM_OK;
    int32_t xo = b->tprod[rkm__ilp_loc(b, b->x_out)];
    *pick = -1;
    for (int32_t v = 0; v < b->n; v++)
        for (uint8_t val = 0; val < 3 && b->need_o[v] >= 1 && v != xo; val++) {
            if (val == gw->x[v]) continue;
            int ok = rkm__ilp_greedy_try(b, gw, rp, v, val, &res);
            work->evals += (double)rp->last_steps;
            if (!ok) {
                if (res) return res;
                continue;
            }
            if (rkm__ilp_better(&gw->trial, out, peak_budget, kept_budget)) {
                *pick = v;
                *to = val;
                rkm__ilp_sched_copy(b, out, &gw->trial);
            }
        }
    return RKM_OK;
}

/* Local search over recompute sets from gw->x: take the change of one op's
 * mode that gives the best (excess, time) while it improves. Leaves the
 * best schedule in *out (not gw->trial or gw->alt). */
static rkm_result rkm__ilp_descend(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp,
                                   uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work,
                                   rkm__ilp_sched *out)
{
    rkm_result res = RKM_OK;
    rkm__ilp_greedy_sched(b, gw, out);
    if (!rkm__ilp_measure(b, rp, out, &res)) {
        if (res) return res;
        return rkm__ilp_err(b, RKM_ERROR_INTERNAL, "internal error: the greedy's first schedule does not replay");
    }
    for (int32_t round = 0; round < 4 * b->n && !rkm__ilp_spent(work, 1); round++) {
        int32_t pick;
        uint8_t to = 0;
        if ((res = rkm__ilp_greedy_round(b, gw, rp, peak_budget, kept_budget, work, out, &pick, &to))) return res;
        if (pick < 0) break;
        gw->x[pick] = to;
    }
    return RKM_OK;
}

/* Greedy: the local search from "recompute nothing" and from "recompute
 * everything", the better of the two in *out (valid, maybe not fitting). */
static rkm_result rkm__ilp_greedy(const rkm__ilp_shape *b, rkm__ilp_greedy_ws *gw, rkm__ilp_replayer *rp,
                                  uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work, rkm__ilp_sched *out)
{
    memset(gw->x, 1, (size_t)b->n);
    rkm_result r = rkm__ilp_descend(b, gw, rp, peak_budget, kept_budget, work, &gw->alt);
    if (r) return r;
    memset(gw->x, 0, (size_t)b->n);
    if ((r = rkm__ilp_descend(b, gw, rp, peak_budget, kept_budget, work, out))) return r;
    if (rkm__ilp_better(&gw->alt, out, peak_budget, kept_budget)) rkm__ilp_sched_copy(b, out, &gw->alt);
    return RKM_OK;
}

/* ---- structure of a block ------------------------------------------------ */

/* Check the block against the graph: ops in topological order, reads only
 * inputs, x_in and block tensors, block tensors read outside only if x_out. */
static rkm_result rkm__ilp_check(const rkm__ilp_shape *b, const int32_t *opl)
{
    const rkm_graph *g = b->g;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t t = o->in[k];
            if (b->lt[t] >= 0 || t == b->x_in || (g->tensors[t].flags & RKM_TENSOR_INPUT)) {
                if (t != b->x_out || b->is_last) continue;
                return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "op %s reads the block's output %s", o->name,
                                    g->tensors[t].name);
            }
            return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "op %s reads %s, made outside the block", o->name,
                                g->tensors[t].name);
        }
    }
    for (size_t x = 0; x < g->n_ops; x++) {
        if (opl[x] >= 0) continue;
        const rkm__op *o = &g->ops[x];
        for (int32_t k = 0; k < o->n_in; k++)
            if (b->lt[o->in[k]] >= 0 && o->in[k] != b->x_out)
                return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "%s is read by op %s outside the block",
                                    g->tensors[o->in[k]].name, o->name);
    }
    if (b->x_in >= 0 && b->lt[b->x_in] >= 0)
        return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "x_in %s is made inside the block", g->tensors[b->x_in].name);
    if (b->lt[b->x_out] < 0) return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "no block op makes x_out");
    if (!g->tensors[b->x_out].has_grad)
        return rkm__ilp_err(b, RKM_ERROR_ARGUMENT, "x_out %s has no gradient", g->tensors[b->x_out].name);
    return RKM_OK;
}

/* Stages (backwards in reverse order), readers, and how late each op and
 * tensor can be useful (need). fill: [nt] zeroed counters. */
static void rkm__ilp_derive(rkm__ilp_shape *b, int32_t *fill)
{
    const rkm_graph *g = b->g;
    int32_t t = 0;
    for (int32_t v = b->n; v-- > 0;) {
        b->st[v] = g->ops[b->op[v]].has_bwd ? ++t : 0;
        if (b->st[v]) b->bop[b->st[v]] = v;
    }
    for (int32_t i = 0; i <= b->nt; i++) b->rd_off[i] = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++)
            if (b->lt[o->in[k]] >= 0) b->rd_off[b->lt[o->in[k]] + 1]++;
    }
    for (int32_t i = 0; i < b->nt; i++) b->rd_off[i + 1] += b->rd_off[i];
    for (int32_t i = 0; i < b->nt; i++) b->last0[i] = b->tprod[i];
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++) {
            int32_t i = b->lt[o->in[k]];
            if (i < 0) continue;
            b->rd[b->rd_off[i] + fill[i]++] = v;
            b->last0[i] = v;
        }
    }
    for (int32_t v = b->n; v-- > 0;) {
        const rkm__op *o = &g->ops[b->op[v]];
        int32_t nv = rkm__ilp_phantom(b, v) ? b->st[v] : 0;
        for (int32_t k = 0; k < o->n_out; k++) {
            int32_t i = b->lt[o->out[k]], nd = o->out[k] == b->x_out ? 1 : 0;
            for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++)
                if (b->need_o[b->rd[j]] > nd) nd = b->need_o[b->rd[j]];
            for (int32_t s = 1; s <= b->nb; s++)
                if (s > nd && rkm__ilp_bwd_reads(b, s, i)) nd = s;
            b->need_t[i] = nd;
            if (nd > nv) nv = nd;
        }
        b->need_o[v] = nv;
    }
}

/* Sum of bytes of the block tensors in a list. */
static uint64_t rkm__ilp_list_bytes(const rkm__ilp_shape *b, const int32_t *list, int32_t n)
{
    uint64_t m = 0;
    for (int32_t k = 0; k < n; k++)
        if (b->lt[list[k]] >= 0) m += b->g->tensors[list[k]].bytes;
    return m;
}

/* What must be live at some node of every schedule: x_out (and its
 * gradient) at the boundary, an op's inputs and outputs in the forward pass,
 * a backward's saved tensors, phantom and gradients. */
static void rkm__ilp_floors(const rkm__ilp_shape *b, rkm__ilp_memo *memo)
{
    const rkm_graph *g = b->g;
    uint64_t xo = g->tensors[b->x_out].bytes;
    memo->min_kept = b->static_bytes + xo;
    memo->min_peak = memo->min_kept + xo;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        uint64_t m = b->static_bytes + rkm__ilp_list_bytes(b, o->in, o->n_in) + rkm__ilp_list_bytes(b, o->out, o->n_out);
        if (m + rkm__fwd_ws_most(o) > memo->min_peak) memo->min_peak = m + rkm__fwd_ws_most(o);
        int32_t t = b->st[v];
        if (!t) continue;
        m = b->static_bytes + (t == 1 ? xo : b->gstart[t]) + b->gnew[t] + o->bwd_ws + o->phantom +
            rkm__ilp_list_bytes(b, o->saved, o->n_saved);
        if (m > memo->min_peak) memo->min_peak = m;
    }
}

/* Gradient bytes along the backward order (fixed, so constants). */
static rkm_result rkm__ilp_grad_bytes(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    uint8_t *gl = rkm__calloc(b->ctx, g->n_tensors + 1, 1);
    if (!gl) return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the gradient bytes");
    uint64_t live = g->tensors[b->x_out].bytes;
    gl[b->x_out] = 1;
    b->gstart[1] = 0;
    for (int32_t t = 1; t <= b->nb; t++) {
        if (t > 1) b->gstart[t] = live;
        const rkm__op *o = &g->ops[b->op[b->bop[t]]];
        b->gnew[t] = b->gfree[t] = 0;
        for (int32_t k = 0; k < o->n_in; k++)
            if (g->tensors[o->in[k]].has_grad && !gl[o->in[k]]) {
                gl[o->in[k]] = 1;
                b->gnew[t] += g->tensors[o->in[k]].bytes;
            }
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].has_grad && gl[o->out[k]]) {
                gl[o->out[k]] = 0;
                b->gfree[t] += g->tensors[o->out[k]].bytes;
            }
        live = live + b->gnew[t] - b->gfree[t];
    }
    b->gstart[b->nb + 1] = live;
    rkm__free(b->ctx, gl, g->n_tensors + 1);
    return RKM_OK;
}

/* Gradient bytes, static bytes, base time and the two scales. */
static rkm_result rkm__ilp_constants(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    uint64_t mx = 1;
    rkm_result r = rkm__ilp_grad_bytes(b);
    if (r) return r;
    b->static_bytes = g->input_bytes;
    if (b->x_in >= 0 && !(g->tensors[b->x_in].flags & RKM_TENSOR_INPUT)) b->static_bytes += g->tensors[b->x_in].bytes;
    b->base_time = 0;
    b->tscale = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        b->base_time += o->fwd + (o->has_bwd ? o->bwd : 0);
        if (o->fwd > b->tscale) b->tscale = o->fwd;
        uint64_t m = o->phantom > rkm__fwd_ws_most(o) ? o->phantom : rkm__fwd_ws_most(o);
        if (o->bwd_ws > m) m = o->bwd_ws;
        for (int32_t k = 0; k < o->n_out; k++)
            if (g->tensors[o->out[k]].bytes > m) m = g->tensors[o->out[k]].bytes;
        if (m > mx) mx = m;
    }
    if (!(b->tscale > 0)) b->tscale = 1;
    /* A power of two: bytes / mscale is exact in a double. */
    b->mscale = 1;
    while (b->mscale * 2 <= (double)mx) b->mscale *= 2;
    return RKM_OK;
}

/* ---- the model ----------------------------------------------------------- */

static int32_t rkm__ilp_R(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t t, int32_t v)
{
    return t == 0 ? RKM__ILP_ONE : md->colR[(size_t)t * (size_t)b->n + (size_t)v];
}

static int32_t rkm__ilp_RP(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t t, int32_t v)
{
    return md->colRP[(size_t)t * (size_t)b->n + (size_t)v];
}

static int32_t rkm__ilp_S(const rkm__ilp_shape *b, const rkm__ilp_model *md, int32_t t, int32_t i)
{
    return t >= 1 && t <= b->nb + 1 ? md->colS[(size_t)t * (size_t)b->nt + (size_t)i] : 0;
}

/* Append a node (and its free candidates: block tensors it reads or makes,
 * unless the stage's backward is sure to read them later). */
static void rkm__ilp_add_node(const rkm__ilp_shape *b, rkm__ilp_model *md, int32_t t, int kind, int32_t v, int32_t *c,
                              int32_t *nn, int32_t *nf)
{
    const rkm_graph *g = b->g;
    int32_t q = ++*c;
    if (md->node) md->node[*nn] = (rkm__ilp_node){kind, v, q, *nf};
    ++*nn;
    if (t == 0) return; /* stage 0 frees are fixed by S[1] */
    const rkm__op *o = v >= 0 ? &g->ops[b->op[v]] : NULL;
    for (int32_t l = 0; l < (kind == RKM__ILP_NODE_FWD ? 2 : 1); l++) {
        const int32_t *list = kind == RKM__ILP_NODE_LOSS ? &b->x_out
                              : kind == RKM__ILP_NODE_BWD ? o->saved
                              : l == 0                    ? o->in
                                                          : o->out;
        int32_t len = kind == RKM__ILP_NODE_LOSS ? 1
                      : kind == RKM__ILP_NODE_BWD ? o->n_saved
                      : l == 0                    ? o->n_in
                                                  : o->n_out;
        for (int32_t k = 0; k < len; k++) {
            int32_t i = b->lt[list[k]];
            if (i < 0 || (kind == RKM__ILP_NODE_FWD && rkm__ilp_bwd_reads(b, t, i))) continue;
            int32_t f = ++*c;
            if (md->node) md->fcand[*nf] = (rkm__ilp_free){i, f};
            ++*nf;
        }
    }
}

/* Give every variable its column; list each stage's nodes. Counting pass
 * when md->node is NULL (column numbers are the same in both passes). */
static void rkm__ilp_columns(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    int32_t c = 0, nn = 0, nf = 0, xo = b->lt[b->x_out];
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (b->need_o[v] >= t) md->colR[(size_t)t * (size_t)b->n + (size_t)v] = ++c;
    for (int32_t t = 0; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (rkm__ilp_phantom(b, v) && t <= b->st[v]) md->colRP[(size_t)t * (size_t)b->n + (size_t)v] = ++c;
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t i = 0; i < b->nt; i++)
            if (t <= b->need_t[i])
                md->colS[(size_t)t * (size_t)b->nt + (size_t)i] = t == 1 && i == xo ? RKM__ILP_ONE : ++c;
    for (int32_t t = 0; t <= b->nb; t++) {
        if (md->node) md->node_off[t] = nn;
        if (t == 1) rkm__ilp_add_node(b, md, t, RKM__ILP_NODE_LOSS, -1, &c, &nn, &nf);
        for (int32_t v = 0; v < b->n; v++)
            if (rkm__ilp_R(b, md, t, v)) rkm__ilp_add_node(b, md, t, RKM__ILP_NODE_FWD, v, &c, &nn, &nf);
        if (t >= 1) rkm__ilp_add_node(b, md, t, RKM__ILP_NODE_BWD, b->bop[t], &c, &nn, &nf);
    }
    if (md->node) md->node_off[b->nb + 1] = nn;
    md->ncols = c;
    md->n_nodes = nn;
    md->n_fcand = nf;
}

/* The gathered model: an entry (a row's column and coefficient), and a row
 * (its first entry, type LE, GE or EQ, and right-hand side). */
typedef struct rkm__ilp_entry {
    int col;
    REAL val;
} rkm__ilp_entry;
typedef struct rkm__ilp_rowhead {
    size_t start;
    int type;
    REAL rhs;
} rkm__ilp_rowhead;

/* A row being built: coefficients merged per column, constants apart. */
typedef struct rkm__ilp_row {
    rkm_context *ctx;
    int *col;
    REAL *val;
    double *dense;  /* [ncols+1] */
    uint8_t *seen;  /* [ncols+1] */
    int n;
    double k;       /* constant part of the left-hand side */
    int bad;        /* a row without columns that cannot hold */
    int nomem;      /* the gathered rows could not grow */
    /* The rows, gathered whole before lp_solve sees any (rkm__ilp_load):
     * lp_solve keeps the column bounds after the rows in one array, so a
     * row added to a model that has its columns moves them all, and that
     * was half of rockmate's planning time on a 60-op block. */
    rkm__ilp_entry *ent; /* row after row */
    size_t n_ent, cap_ent;
    rkm__ilp_rowhead *rows;
    size_t n_rows, cap_rows;
    REAL *obj;      /* [ncols+1] objective coefficients */
} rkm__ilp_row;

/* Add coef * ref (a column, RKM__ILP_ONE, or 0: nothing). */
static void rkm__ilp_term(rkm__ilp_row *w, int32_t ref, double coef)
{
    if (ref == RKM__ILP_ONE) w->k += coef;
    if (ref <= 0) return;
    if (!w->seen[ref]) {
        w->seen[ref] = 1;
        w->col[w->n++] = ref;
    }
    w->dense[ref] += coef;
}

/* Gather the row `lhs type rhs` and reset the builder. */
static void rkm__ilp_emit_row(rkm__ilp_row *w, int type, double rhs)
{
    int m = 0;
    for (int j = 0; j < w->n; j++) {
        int c = w->col[j];
        if (w->dense[c] != 0) {
            w->col[m] = c;
            w->val[m++] = w->dense[c];
        }
        w->dense[c] = 0;
        w->seen[c] = 0;
    }
    rhs -= w->k;
    if (m == 0) {
        if ((type == LE && rhs < -1e-9) || (type == GE && rhs > 1e-9) || (type == EQ && fabs(rhs) > 1e-9)) w->bad = 1;
    } else if (!rkm__reserve(w->ctx, (void **)&w->ent, &w->cap_ent, w->n_ent + (size_t)m, sizeof *w->ent) ||
               !rkm__reserve(w->ctx, (void **)&w->rows, &w->cap_rows, w->n_rows + 1, sizeof *w->rows)) {
        w->nomem = 1;
    } else {
        w->rows[w->n_rows++] = (rkm__ilp_rowhead){w->n_ent, type, rhs};
        for (int j = 0; j < m; j++) w->ent[w->n_ent++] = (rkm__ilp_entry){w->col[j], w->val[j]};
    }
    w->n = 0;
    w->k = 0;
}

/* Stage of node k. */
static int32_t rkm__ilp_stage_of(const rkm__ilp_model *md, int32_t k)
{
    int32_t t = 0;
    while (k >= md->node_off[t + 1]) t++;
    return t;
}

/* Row sets of the model (see the comment at the top of the section).
 * Dependencies, and recompute only what is not live. */
static void rkm__ilp_rows_deps(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    for (int32_t k = md->node_off[1]; k < md->n_nodes; k++) {
        const rkm__ilp_node *nd = &md->node[k];
        if (nd->kind == RKM__ILP_NODE_LOSS) continue;
        int32_t t = rkm__ilp_stage_of(md, k);
        const rkm__op *o = &g->ops[b->op[nd->v]];
        int fwd = nd->kind == RKM__ILP_NODE_FWD;
        const int32_t *list = fwd ? o->in : o->saved;
        for (int32_t j = 0; j < (fwd ? o->n_in : o->n_saved); j++) {
            int32_t i = b->lt[list[j]];
            if (i < 0) continue;
            /* fwd: R[t,v] <= R[t,p] + S[t,i];  bwd: R[t,p] + S[t,i] >= 1 */
            if (fwd) rkm__ilp_term(w, rkm__ilp_R(b, md, t, nd->v), 1);
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->tprod[i]), fwd ? -1 : 1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), fwd ? -1 : 1);
            rkm__ilp_emit_row(w, fwd ? LE : GE, fwd ? 0 : 1);
        }
        if (!fwd) continue;
        for (int32_t j = 0; j < o->n_out; j++) {
            /* recompute only what is not live: R[t,v] + S[t,T] <= 1; but the
             * loss node may free x_out before stage 1 recomputes it (counted
             * as new memory: exact or more) */
            if (t == 1 && o->out[j] == b->x_out) continue;
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, nd->v), 1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, b->lt[o->out[j]]), 1);
            rkm__ilp_emit_row(w, LE, 1);
        }
    }
}

/* Checkpoint continuity and the phantoms' save runs. */
static void rkm__ilp_rows_carry(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    for (int32_t i = 0; i < b->nt; i++) /* S[t+1,i] <= S[t,i] + R[t,p] */
        for (int32_t t = 1; t < b->need_t[i]; t++) {
            rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, i), 1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), -1);
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->tprod[i]), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
    for (int32_t v = 0; v < b->n; v++) { /* one save run, on a run: sum_t RP[t,v] = 1, RP <= R */
        if (!rkm__ilp_phantom(b, v)) continue;
        for (int32_t t = 0; t <= b->st[v]; t++) rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), 1);
        rkm__ilp_emit_row(w, EQ, 1);
        for (int32_t t = 1; t <= b->st[v]; t++) {
            rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), 1);
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, v), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
        /* dominance: an op recomputed in its own backward's stage saves there */
        for (int32_t t = 0; t < b->st[v]; t++) rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), 1);
        rkm__ilp_term(w, rkm__ilp_R(b, md, b->st[v], v), 1);
        rkm__ilp_emit_row(w, LE, 1);
    }
}

/* Is later node j (same stage) a recomputation reading block tensor i? */
static int rkm__ilp_node_reads(const rkm__ilp_shape *b, const rkm__ilp_node *nd, int32_t i)
{
    if (nd->kind != RKM__ILP_NODE_FWD) return 0;
    const rkm__op *o = &b->g->ops[b->op[nd->v]];
    return rkm__list_has(o->in, o->n_in, b->tg[i]);
}

/* F[t,i,k] <= R[t,k];  F + S[t+1,i] <= 1;  F + R[t,j] <= 1 for later readers j.
 * The loss node may free x_out only if stage 1 makes it again before the
 * backward reads it or stage 2 keeps it: there the hazards allow R[1,p]. */
static void rkm__ilp_rows_frees(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    for (int32_t k = md->node_off[1]; k < md->n_nodes; k++) {
        const rkm__ilp_node *nd = &md->node[k];
        int32_t t = rkm__ilp_stage_of(md, k), end = md->node_off[t + 1];
        int loss = nd->kind == RKM__ILP_NODE_LOSS;
        int32_t remake = loss ? rkm__ilp_R(b, md, 1, b->tprod[b->lt[b->x_out]]) : 0;
        for (const rkm__ilp_free *f = md->fcand + nd->f0; f < rkm__ilp_fend(md, k); f++) {
            if (nd->kind == RKM__ILP_NODE_FWD || (loss && rkm__ilp_bwd_reads(b, 1, f->i))) {
                rkm__ilp_term(w, f->col, 1);
                rkm__ilp_term(w, loss ? remake : rkm__ilp_R(b, md, t, nd->v), -1);
                rkm__ilp_emit_row(w, LE, 0);
            }
            if (rkm__ilp_S(b, md, t + 1, f->i)) {
                rkm__ilp_term(w, f->col, 1);
                rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, f->i), 1);
                rkm__ilp_term(w, remake, -1);
                rkm__ilp_emit_row(w, LE, 1);
            }
            for (int32_t j = k + 1; j < end; j++)
                if (rkm__ilp_node_reads(b, &md->node[j], f->i)) {
                    rkm__ilp_term(w, f->col, 1);
                    rkm__ilp_term(w, rkm__ilp_R(b, md, t, md->node[j].v), 1);
                    rkm__ilp_emit_row(w, LE, 1);
                }
        }
    }
}

/* Memory: Q[k] = what the previous node left + what node k makes + its
 * workspace. Stage 0 frees each tensor after its last stage-0 use unless
 * kept (S[1]); later stages start from what is kept. In mscale units. */
static void rkm__ilp_rows_memory(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    double ms = b->mscale;
    for (int32_t k = 0; k < md->n_nodes; k++) {
        const rkm__ilp_node *nd = &md->node[k];
        int32_t t = rkm__ilp_stage_of(md, k), v = nd->v;
        const rkm__op *o = v >= 0 ? &g->ops[b->op[v]] : NULL;
        rkm__ilp_term(w, nd->q, 1);
        if (k > md->node_off[t]) { /* what node k-1 left */
            const rkm__ilp_node *pv = &md->node[k - 1];
            const rkm__op *po = pv->v >= 0 ? &g->ops[b->op[pv->v]] : NULL;
            rkm__ilp_term(w, pv->q, -1);
            if (pv->kind == RKM__ILP_NODE_FWD)
                rkm__ilp_term(w, rkm__ilp_R(b, md, t, pv->v), (double)rkm__fwd_ws_most(po) / ms);
            if (pv->kind == RKM__ILP_NODE_BWD)
                rkm__ilp_term(w, RKM__ILP_ONE, ((double)po->bwd_ws + (double)b->gfree[t] + (double)po->phantom) / ms);
            for (const rkm__ilp_free *f = md->fcand + pv->f0; t > 0 && f < rkm__ilp_fend(md, k - 1); f++)
                rkm__ilp_term(w, f->col, (double)g->tensors[b->tg[f->i]].bytes / ms);
            for (int32_t i = 0; t == 0 && i < b->nt; i++)
                if (b->last0[i] == pv->v) {
                    rkm__ilp_term(w, RKM__ILP_ONE, (double)g->tensors[b->tg[i]].bytes / ms);
                    rkm__ilp_term(w, rkm__ilp_S(b, md, 1, i), -(double)g->tensors[b->tg[i]].bytes / ms);
                }
        } else { /* the stage start */
            rkm__ilp_term(w, RKM__ILP_ONE, -(double)(b->static_bytes + b->gstart[t]) / ms);
            for (int32_t i = 0; i < b->nt; i++)
                rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), -(double)g->tensors[b->tg[i]].bytes / ms);
            for (int32_t u = 0; u < b->n; u++)
                for (int32_t t0 = 0; t0 < t && rkm__ilp_phantom(b, u) && t <= b->st[u]; t0++)
                    rkm__ilp_term(w, rkm__ilp_RP(b, md, t0, u), -(double)g->ops[b->op[u]].phantom / ms);
        }
        if (nd->kind == RKM__ILP_NODE_LOSS) rkm__ilp_term(w, RKM__ILP_ONE, -(double)g->tensors[b->x_out].bytes / ms);
        if (nd->kind == RKM__ILP_NODE_BWD) rkm__ilp_term(w, RKM__ILP_ONE, -((double)b->gnew[t] + (double)o->bwd_ws) / ms);
        if (nd->kind == RKM__ILP_NODE_FWD) {
            double made = (double)rkm__fwd_ws_most(o);
            for (int32_t j = 0; j < o->n_out; j++) made += (double)g->tensors[o->out[j]].bytes;
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, v), -made / ms);
            if (rkm__ilp_phantom(b, v) && t <= b->st[v])
                rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), -(double)o->phantom / ms);
        }
        rkm__ilp_emit_row(w, EQ, 0);
    }
}

/* Dominance: keep a tensor only if a stage reads or carries it; recompute an
 * op only if something later in the stage reads it, carries it or its
 * phantom is saved. They cut equivalent schedules, not the optimum. */
static void rkm__ilp_rows_dominance(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    const rkm_graph *g = b->g;
    int32_t xo = b->lt[b->x_out];
    for (int32_t t = 1; t <= b->nb; t++) {
        for (int32_t i = 0; i < b->nt; i++) {
            if (rkm__ilp_S(b, md, t, i) <= 0 || rkm__ilp_bwd_reads(b, t, i) || (t == 1 && i == xo)) continue;
            rkm__ilp_term(w, rkm__ilp_S(b, md, t, i), 1);
            for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++)
                rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->rd[j]), -1);
            rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, i), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
        for (int32_t v = 0; v < b->n; v++) {
            if (!rkm__ilp_R(b, md, t, v)) continue;
            const rkm__op *o = &g->ops[b->op[v]];
            int sure = 0;
            for (int32_t k = 0; k < o->n_out; k++) sure |= rkm__ilp_bwd_reads(b, t, b->lt[o->out[k]]);
            if (sure) continue;
            rkm__ilp_term(w, rkm__ilp_R(b, md, t, v), 1);
            for (int32_t k = 0; k < o->n_out; k++) {
                int32_t i = b->lt[o->out[k]];
                for (int32_t j = b->rd_off[i]; j < b->rd_off[i + 1]; j++)
                    rkm__ilp_term(w, rkm__ilp_R(b, md, t, b->rd[j]), -1);
                rkm__ilp_term(w, rkm__ilp_S(b, md, t + 1, i), -1);
            }
            rkm__ilp_term(w, rkm__ilp_RP(b, md, t, v), -1);
            rkm__ilp_emit_row(w, LE, 0);
        }
    }
}

/* ---- lp_solve ------------------------------------------------------------ */

static int __WINAPI rkm__ilp_abortfn(lprec *lp, void *work)
{
    rkm__ilp_work *u = work;
    (void)lp;
    u->calls++;
    return rkm__ilp_spent(u, 0) ? TRUE : FALSE;
}

static void __WINAPI rkm__ilp_logfn(lprec *lp, void *ctx, char *buf)
{
    (void)lp;
    rkm__log((rkm_context *)ctx, RKM_LOG_DEBUG, "lp_solve: %s", buf);
}

/* The objective of a schedule: recomputation time in tscale units. */
static double rkm__ilp_obj(const rkm__ilp_shape *b, const rkm__ilp_sched *s)
{
    double z = 0;
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++)
            if (s->r[(size_t)t * (size_t)b->n + (size_t)v]) z += b->g->ops[b->op[v]].fwd / b->tscale;
    return z;
}

/* The row builder's arrays, for nc - 1 columns. 0: no memory. */
static int rkm__ilp_row_init(rkm_context *ctx, rkm__ilp_row *w, size_t nc)
{
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->col = rkm__alloc(ctx, nc * sizeof *w->col);
    w->val = rkm__alloc(ctx, nc * sizeof *w->val);
    w->dense = rkm__calloc(ctx, nc, sizeof *w->dense);
    w->seen = rkm__calloc(ctx, nc, 1);
    w->obj = rkm__calloc(ctx, nc, sizeof *w->obj);
    return w->col && w->val && w->dense && w->seen && w->obj;
}

static void rkm__ilp_row_free(rkm_context *ctx, rkm__ilp_row *w, size_t nc)
{
    rkm__free(ctx, w->col, nc * sizeof *w->col);
    rkm__free(ctx, w->val, nc * sizeof *w->val);
    rkm__free(ctx, w->dense, nc * sizeof *w->dense);
    rkm__free(ctx, w->seen, nc);
    rkm__free(ctx, w->obj, nc * sizeof *w->obj);
    rkm__free(ctx, w->ent, w->cap_ent * sizeof *w->ent);
    rkm__free(ctx, w->rows, w->cap_rows * sizeof *w->rows);
}

/* The objective: the time of the forwards run in stages 1.., in w->obj. */
static void rkm__ilp_objective(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_row *w)
{
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++) {
            int32_t c = rkm__ilp_R(b, md, t, v);
            if (c > 0) w->obj[c] += b->g->ops[b->op[v]].fwd / b->tscale;
        }
}

/* Binary columns and the bounds of the F columns. */
static void rkm__ilp_set_columns(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    lprec *lp = md->lp;
    for (size_t j = 0; j < (size_t)(b->nb + 1) * (size_t)b->n; j++) {
        if (md->colR[j] > 0) set_binary(lp, md->colR[j], TRUE);
        if (md->colRP[j] > 0) set_binary(lp, md->colRP[j], TRUE);
    }
    for (size_t j = 0; j < (size_t)(b->nb + 2) * (size_t)b->nt; j++)
        if (md->colS[j] > 0) set_binary(lp, md->colS[j], TRUE);
    for (int32_t f = 0; f < md->n_fcand; f++) set_upbo(lp, md->fcand[f].col, 1);
}

/* The gathered rows and objective as columns (row 0 the objective), each
 * in row order: ent[at[c] .. at[c + 1]). 0: no memory. */
static int rkm__ilp_by_column(const rkm__ilp_row *w, size_t nc, size_t *at, int *row, REAL *val)
{
    size_t *fill = rkm__calloc(w->ctx, nc, sizeof *fill);
    if (!fill) return 0;
    memset(at, 0, (nc + 1) * sizeof *at);
    for (size_t c = 1; c < nc; c++) at[c + 1] = w->obj[c] != 0;
    for (size_t e = 0; e < w->n_ent; e++) at[w->ent[e].col + 1]++;
    for (size_t c = 1; c < nc; c++) at[c + 1] += at[c];
    for (size_t c = 1; c < nc; c++) {
        fill[c] = at[c];
        if (w->obj[c] != 0) row[fill[c]] = 0, val[fill[c]++] = w->obj[c];
    }
    for (size_t i = 0; i < w->n_rows; i++)
        for (size_t e = w->rows[i].start; e < (i + 1 < w->n_rows ? w->rows[i + 1].start : w->n_ent); e++) {
            size_t c = (size_t)w->ent[e].col;
            row[fill[c]] = (int)i + 1;
            val[fill[c]++] = w->ent[e].val;
        }
    rkm__free(w->ctx, fill, nc * sizeof *fill);
    return 1;
}

/* A new lprec from the gathered model (under the lock): the rows first,
 * then each column appended at the end, which moves nothing. */
static rkm_result rkm__ilp_load(const rkm__ilp_shape *b, rkm__ilp_model *md, const rkm__ilp_row *w)
{
    size_t nc = (size_t)md->ncols + 1, ne = w->n_ent + nc;
    size_t *at = rkm__alloc(b->ctx, (nc + 1) * sizeof *at);
    int *row = rkm__alloc(b->ctx, ne * sizeof *row);
    REAL *val = rkm__alloc(b->ctx, ne * sizeof *val);
    rkm_result r = RKM_OK;
    if (!at || !row || !val || !rkm__ilp_by_column(w, nc, at, row, val))
        r = rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model");
    rkm__ilp_lock();
    if (!r && !(md->lp = make_lp((int)w->n_rows, 0))) r = rkm__ilp_err(b, RKM_ERROR_NOMEM, "lp_solve: out of memory");
    if (!r) {
        int ok = 1;
        set_outputfile(md->lp, "");
        set_verbose(md->lp, NEUTRAL);
        put_logfunc(md->lp, rkm__ilp_logfn, b->ctx);
        for (size_t i = 0; i < w->n_rows && ok; i++)
            ok = set_constr_type(md->lp, (int)i + 1, w->rows[i].type) && set_rh(md->lp, (int)i + 1, w->rows[i].rhs);
        for (size_t c = 1; c < nc && ok; c++) ok = add_columnex(md->lp, (int)(at[c + 1] - at[c]), val + at[c], row + at[c]);
        if (ok) rkm__ilp_set_columns(b, md);
        set_minim(md->lp);
        set_bb_floorfirst(md->lp, BRANCH_FLOOR);
        md->nrows = get_Nrows(md->lp);
        if (!ok) r = rkm__ilp_err(b, RKM_ERROR_SOLVER, "lp_solve refused the model");
    }
    rkm__ilp_unlock();
    rkm__free(b->ctx, at, (nc + 1) * sizeof *at);
    rkm__free(b->ctx, row, ne * sizeof *row);
    rkm__free(b->ctx, val, ne * sizeof *val);
    return r;
}

/* Build the lprec: objective and rows gathered, then loaded. */
static rkm_result rkm__ilp_build(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    size_t nc = (size_t)md->ncols + 1;
    rkm__ilp_row w;
    rkm_result r = RKM_OK;
    if (!rkm__ilp_row_init(b->ctx, &w, nc)) r = rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a row");
    if (!r) {
        rkm__ilp_objective(b, md, &w);
        rkm__ilp_rows_deps(b, md, &w);
        rkm__ilp_rows_carry(b, md, &w);
        rkm__ilp_rows_frees(b, md, &w);
        rkm__ilp_rows_memory(b, md, &w);
        rkm__ilp_rows_dominance(b, md, &w);
        md->bad = w.bad;
        r = w.nomem ? rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model's rows") : rkm__ilp_load(b, md, &w);
    }
    rkm__ilp_row_free(b->ctx, &w, nc);
    return r;
}

/* lp_solve's solution as a schedule: r and save of *s. */
static void rkm__ilp_read_solution(const rkm__ilp_shape *b, rkm__ilp_model *md, rkm__ilp_sched *s)
{
    get_variables(md->lp, md->x);
    for (int32_t t = 1; t <= b->nb; t++)
        for (int32_t v = 0; v < b->n; v++) {
            int32_t c = rkm__ilp_R(b, md, t, v);
            s->r[(size_t)t * (size_t)b->n + (size_t)v] = c > 0 && md->x[c - 1] > 0.5;
        }
    for (int32_t v = 0; v < b->n; v++) {
        s->save[v] = -1;
        for (int32_t t = 0; t <= b->nb && rkm__ilp_phantom(b, v); t++) {
            int32_t c = rkm__ilp_RP(b, md, t, v);
            if (c > 0 && md->x[c - 1] > 0.5) s->save[v] = t;
        }
    }
    memset(s->r, 1, (size_t)b->n);
}

/* Solve under the budgets (under the lock): the peak budget bounds every
 * node's Q, the kept budget (memory at the end of F) plus grad(x_out) the
 * loss node's. cutoff < 0: none. Reads a solution into *out (r, save) when
 * lp_solve has one. *root: the LP bound lp_solve found at the root
 * (objective units), or -1. */
static int rkm__ilp_run(const rkm__ilp_shape *b, rkm__ilp_model *md, uint64_t peak_budget, uint64_t kept_budget,
                        double cutoff, rkm__ilp_work *work, rkm__ilp_sched *out, double *root)
{
    const double lim = 9007199254740992.0; /* 2^53: exact as a double */
    double xb = (double)b->g->tensors[b->x_out].bytes;
    rkm__ilp_lock();
    lprec *lp = md->lp;
    double inf = get_infinite(lp);
    double q_peak = (double)peak_budget >= lim ? inf : (double)peak_budget / b->mscale;
    double q_loss = (double)kept_budget >= lim - xb ? inf : ((double)kept_budget + xb) / b->mscale;
    for (int32_t k = 0; k < md->n_nodes; k++) set_upbo(lp, md->node[k].q, q_peak);
    set_upbo(lp, md->node[md->node_off[1]].q, q_loss < q_peak ? q_loss : q_peak);
    set_obj_bound(lp, cutoff >= 0 ? cutoff : inf);
    put_abortfunc(lp, rkm__ilp_abortfn, work);
    int status = solve(lp);
    *root = lp->real_solution < inf && lp->real_solution > -inf ? lp->real_solution : -1;
    if (status == OPTIMAL || status == SUBOPTIMAL) rkm__ilp_read_solution(b, md, out);
    put_abortfunc(lp, NULL, NULL);
    rkm__ilp_unlock();
    return status;
}

/* ---- entry points -------------------------------------------------------- */

/* Remember a found schedule (ring of RKM__ILP_CACHE, no duplicates), with
 * the budgets it is proven optimal for, if it is. */
static void rkm__ilp_remember(const rkm__ilp_shape *b, rkm__ilp_memo *memo, rkm__ilp_sched *s, uint64_t peak_budget,
                              uint64_t kept_budget, int proven)
{
    s->proven = proven;
    s->peak_budget = peak_budget;
    s->kept_budget = kept_budget;
    for (int32_t c = 0; c < memo->n_cache; c++) {
        rkm__ilp_sched *e = &memo->cache[c];
        if (memcmp(e->r, s->r, rkm__ilp_rsize(b)) || memcmp(e->save, s->save, (size_t)b->n * sizeof *s->save)) continue;
        if (proven && (!e->proven || (peak_budget >= e->peak_budget && kept_budget >= e->kept_budget))) {
            e->proven = 1;
            e->peak_budget = peak_budget;
            e->kept_budget = kept_budget;
        }
        return;
    }
    rkm__ilp_sched_copy(b, &memo->cache[memo->cache_next], s);
    memo->cache_next = (memo->cache_next + 1) % RKM__ILP_CACHE;
    if (memo->n_cache < RKM__ILP_CACHE) memo->n_cache++;
}

/* Remember budgets that admit nothing. */
static void rkm__ilp_remember_none(rkm__ilp_memo *memo, uint64_t peak_budget, uint64_t kept_budget)
{
    memo->none[memo->none_next] = (rkm__ilp_none){peak_budget, kept_budget};
    memo->none_next = (memo->none_next + 1) % RKM__ILP_CACHE;
    if (memo->n_none < RKM__ILP_CACHE) memo->n_none++;
}

/* Take schedule s as the incumbent *best if it fits and is faster (or there
 * is none yet: *have = 0). */
static void rkm__ilp_consider(const rkm__ilp_shape *b, const rkm__ilp_sched *s, rkm__ilp_sched *best,
                              uint64_t peak_budget, uint64_t kept_budget, int *have)
{
    if (!rkm__ilp_fits(s, peak_budget, kept_budget) || (*have && !(s->time < best->time))) return;
    rkm__ilp_sched_copy(b, best, s);
    *have = 1;
}

/* What earlier solves settle: 1 if nothing fits (proven), 2 if *best is
 * proven optimal; else 0, with *best the fastest fitting schedule seen
 * (*have). */
static int rkm__ilp_recall(const rkm__ilp_shape *b, const rkm__ilp_memo *memo, uint64_t peak_budget,
                           uint64_t kept_budget, rkm__ilp_sched *best, int *have)
{
    *have = 0;
    if (peak_budget < memo->min_peak || kept_budget < memo->min_kept) return 1;
    for (int32_t c = 0; c < memo->n_none; c++)
        if (peak_budget <= memo->none[c].peak_budget && kept_budget <= memo->none[c].kept_budget) return 1;
    for (int32_t c = 0; c < memo->n_cache; c++) {
        const rkm__ilp_sched *s = &memo->cache[c];
        if (!rkm__ilp_fits(s, peak_budget, kept_budget)) continue;
        if (s->proven && peak_budget <= s->peak_budget && kept_budget <= s->kept_budget) {
            rkm__ilp_sched_copy(b, best, s);
            *have = 1;
            return 2;
        }
        rkm__ilp_consider(b, s, best, peak_budget, kept_budget, have);
    }
    return 0;
}

/* The steps of schedule s, in an allocation of exactly their size. */
static rkm_result rkm__ilp_output(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, const rkm__ilp_sched *s,
                                  rkm_step **steps, size_t *n_fwd, size_t *n_bwd)
{
    rkm__ilp_out o;
    rkm_result r = rkm__ilp_emit(b, rp, s, &o);
    if (r) return r;
    size_t n = o.l.n;
    rkm_step *out = rkm__steps_take(&o.l);
    if (!out && n) {
        rkm__steps_free(&o.l);
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a schedule's steps");
    }
    *steps = out;
    *n_fwd = o.n_fwd;
    *n_bwd = n - o.n_fwd;
    return RKM_OK;
}

/* Measure lp_solve's solution s (*valid: it replays) and consider it. */
static rkm_result rkm__ilp_offer(const rkm__ilp_shape *b, rkm__ilp_replayer *rp, rkm__ilp_sched *s,
                                 rkm__ilp_sched *best, uint64_t peak_budget, uint64_t kept_budget, int *have,
                                 int *valid)
{
    rkm_result r = RKM_OK;
    *valid = rkm__ilp_measure(b, rp, s, &r);
    if (*valid) rkm__ilp_consider(b, s, best, peak_budget, kept_budget, have);
    return r;
}

/* lp_solve's verdict into the stats; returns whether the best (or "none")
 * is proven optimal. */
static int rkm__ilp_verdict(const rkm__ilp_shape *b, int status, int cutoff, int have, int valid, rkm__ilp_stats *st)
{
    st->solves++;
    switch (status) {
    case OPTIMAL:
        st->optimal++;
        return valid;
    case SUBOPTIMAL: st->suboptimal++; return 0;
    case INFEASIBLE:
    case ACCURACYERROR:
        /* under a cutoff both mean "nothing better than the incumbent" */
        if (cutoff) {
            st->optimal++;
            return 1;
        }
        if (status == INFEASIBLE) {
            st->infeasible++;
            return !have;
        }
        break;
    case USERABORT:
    case TIMEOUT: st->timeout++; return 0;
    default: break;
    }
    st->failed++;
    rkm__log(b->ctx, RKM_LOG_WARN, "block ILP: lp_solve returned status %d", status);
    return 0;
}

/* Hand the incumbent out: its steps, time and bound. */
static rkm_result rkm__ilp_finish(const rkm__ilp_shape *b, rkm__ilp_scratch *sc, double t0, rkm_step **steps,
                                  size_t *n_fwd, size_t *n_bwd, rkm__ilp_stats *st, int *found)
{
    st->time = sc->best.time;
    if (st->proven || st->bound > st->time) st->bound = st->time;
    rkm_result r = rkm__ilp_output(b, &sc->rp, &sc->best, steps, n_fwd, n_bwd);
    *found = r == RKM_OK;
    st->seconds += rkm__now() - t0;
    return r;
}

/* A fresh lprec for the block (the old one is deleted). */
static rkm_result rkm__ilp_rebuild(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    rkm__ilp_lock();
    delete_lp(md->lp);
    md->lp = NULL;
    rkm__ilp_unlock();
    return rkm__ilp_build(b, md);
}

/* lp_solve on the model, with the incumbent's objective (if *have) as a
 * cutoff; its solution, if valid and better, becomes the incumbent. Sets
 * *proven and *root (see rkm__ilp_run). */
static rkm_result rkm__ilp_exact(rkm__ilp_block *bk, uint64_t peak_budget, uint64_t kept_budget, rkm__ilp_work *work,
                                 int *have, int *proven, double *root, rkm__ilp_stats *st)
{
    const rkm__ilp_shape *b = &bk->shape;
    rkm__ilp_scratch *sc = &bk->scratch;
    rkm_result r;
    int valid = 0;
    double obj = *have ? rkm__ilp_obj(b, &sc->best) : -1;
    double cutoff = *have ? obj - 1e-9 * (1 + obj) : -1;
    int status = rkm__ilp_run(b, &bk->model, peak_budget, kept_budget, cutoff, work, &sc->found, root);
    /* lp_solve 5.5.2.5 can crash (coldual) re-solving an lprec whose
     * last solve was aborted: such a model is rebuilt before reuse. */
    if (status != OPTIMAL && status != INFEASIBLE && (r = rkm__ilp_rebuild(b, &bk->model))) return r;
    if (status == OPTIMAL || status == SUBOPTIMAL) {
        if ((r = rkm__ilp_offer(b, &sc->rp, &sc->found, &sc->best, peak_budget, kept_budget, have, &valid))) return r;
        if (!valid) rkm__log(b->ctx, RKM_LOG_WARN, "block ILP: a solution failed its replay; kept the fallback");
    }
    *proven = rkm__ilp_verdict(b, status, cutoff >= 0, *have, valid, st);
    return RKM_OK;
}

static rkm_result rkm__ilp_block_solve(rkm__ilp_block *bk, uint64_t peak_budget, uint64_t kept_budget,
                                       double time_limit_s, rkm_step **steps, size_t *n_fwd, size_t *n_bwd,
                                       rkm__ilp_stats *st, int *found)
{
    const rkm__ilp_shape *b = &bk->shape;
    rkm__ilp_scratch *sc = &bk->scratch;
    double t0 = rkm__now(), lim = time_limit_s > 0 ? time_limit_s : 1.0;
    rkm__ilp_work work = {0, lim * RKM__ILP_CALLS_PER_S / (bk->model.ncols + bk->model.nrows), 0,
                          lim * RKM__ILP_STEPS_PER_S / 2, t0 + lim * RKM__ILP_WALL_SAFETY};
    *steps = NULL;
    *n_fwd = *n_bwd = 0;
    *found = 0;
    st->proven = 0;
    st->time = st->bound = 0;
    int have = 0, known = rkm__ilp_recall(b, &bk->memo, peak_budget, kept_budget, &sc->best, &have);
    if (known) {
        st->proven = 1;
        if (known == 1) {
            st->seconds += rkm__now() - t0;
            return RKM_OK;
        }
        return rkm__ilp_finish(b, sc, t0, steps, n_fwd, n_bwd, st, found);
    }
    rkm_result r = rkm__ilp_greedy(b, &sc->gr, &sc->rp, peak_budget, kept_budget, &work, &sc->found);
    if (r) return r;
    rkm__ilp_consider(b, &sc->found, &sc->best, peak_budget, kept_budget, &have);
    /* Nothing recomputed: no schedule is faster. */
    int proven = have && rkm__ilp_obj(b, &sc->best) == 0;
    double root = -1;
    if (!proven && !bk->model.bad &&
        (r = rkm__ilp_exact(bk, peak_budget, kept_budget, &work, &have, &proven, &root, st)))
        return r;
    if (!have && proven) rkm__ilp_remember_none(&bk->memo, peak_budget, kept_budget);
    st->work += lim * fmax(work.calls / work.max_calls, work.evals / work.max_evals);
    st->proven = proven;
    if (!have) {
        st->seconds += rkm__now() - t0;
        return RKM_OK;
    }
    st->bound = proven ? sc->best.time : b->base_time + (root > 0 ? root * b->tscale : 0);
    rkm__ilp_remember(b, &bk->memo, &sc->best, peak_budget, kept_budget, proven);
    return rkm__ilp_finish(b, sc, t0, steps, n_fwd, n_bwd, st, found);
}

/* ---- the parts: init and free -------------------------------------------- */

/* Local ids: ops (checked topological), block tensors and their producers. */
static rkm_result rkm__ilp_locals(rkm__ilp_shape *b, const int32_t *ops, int32_t *opl)
{
    const rkm_graph *g = b->g;
    b->nt = 0;
    b->max_list = 1;
    for (int32_t v = 0; v < b->n; v++) {
        int32_t x = ops[v];
        if (x < 0 || (size_t)x >= g->n_ops || (v > 0 && x <= ops[v - 1]))
            return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "block ILP: op %d of the block has id %d: ids must be valid "
                                                        "and increasing", (int)v, (int)x);
        b->op[v] = x;
        opl[x] = v;
        const rkm__op *o = &g->ops[x];
        b->nt += o->n_out;
        if (o->n_in >= b->max_list) b->max_list = o->n_in + 1;
        if (o->n_saved >= b->max_list) b->max_list = o->n_saved + 1;
    }
    return RKM_OK;
}

/* The shape's arrays whose size is known once n, nt, nb are. 0: no memory. */
static int rkm__ilp_shape_arrays(rkm__ilp_shape *b)
{
    rkm_context *ctx = b->ctx;
    rkm__ilp_arrays *a = &b->arrays;
    size_t n = (size_t)b->n, nt = (size_t)b->nt, nb = (size_t)b->nb;
    return rkm__ilp_take(ctx, a, &b->tg, nt, sizeof *b->tg) && rkm__ilp_take(ctx, a, &b->tprod, nt, sizeof *b->tprod) &&
           rkm__ilp_take(ctx, a, &b->rd_off, nt + 1, sizeof *b->rd_off) &&
           rkm__ilp_take(ctx, a, &b->st, n, sizeof *b->st) && rkm__ilp_take(ctx, a, &b->bop, nb + 1, sizeof *b->bop) &&
           rkm__ilp_take(ctx, a, &b->need_o, n, sizeof *b->need_o) &&
           rkm__ilp_take(ctx, a, &b->need_t, nt, sizeof *b->need_t) &&
           rkm__ilp_take(ctx, a, &b->last0, nt, sizeof *b->last0) &&
           rkm__ilp_take(ctx, a, &b->gstart, nb + 2, sizeof *b->gstart) &&
           rkm__ilp_take(ctx, a, &b->gnew, nb + 1, sizeof *b->gnew) &&
           rkm__ilp_take(ctx, a, &b->gfree, nb + 1, sizeof *b->gfree);
}

/* Number block tensors and stages; allocate the shape's arrays. */
static rkm_result rkm__ilp_number(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    int32_t i = 0;
    b->nb = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        b->nb += o->has_bwd ? 1 : 0;
        for (int32_t k = 0; k < o->n_out; k++) b->lt[o->out[k]] = i++;
    }
    if ((double)(b->nb + 1) * b->n > 20.0 * RKM__ILP_MAX_COLS)
        return rkm__ilp_err(b, RKM_ERROR_SOLVER, "%d ops are too many for one model", (int)b->n);
    if (!rkm__ilp_shape_arrays(b)) return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the block's structure");
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_out; k++) {
            b->tg[b->lt[o->out[k]]] = o->out[k];
            b->tprod[b->lt[o->out[k]]] = v;
        }
    }
    return RKM_OK;
}

/* Readers, stages, needs (see rkm__ilp_derive) and constants. */
static rkm_result rkm__ilp_structure(rkm__ilp_shape *b)
{
    const rkm_graph *g = b->g;
    size_t n_rd = 0;
    for (int32_t v = 0; v < b->n; v++) {
        const rkm__op *o = &g->ops[b->op[v]];
        for (int32_t k = 0; k < o->n_in; k++) n_rd += b->lt[o->in[k]] >= 0;
    }
    int32_t *fill = rkm__calloc(b->ctx, (size_t)b->nt + 1, sizeof *fill);
    if (!fill || !rkm__ilp_take(b->ctx, &b->arrays, &b->rd, n_rd + 1, sizeof *b->rd)) {
        rkm__free(b->ctx, fill, ((size_t)b->nt + 1) * sizeof *fill);
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the readers");
    }
    rkm__ilp_derive(b, fill);
    rkm__free(b->ctx, fill, ((size_t)b->nt + 1) * sizeof *fill);
    return rkm__ilp_constants(b);
}

/* (a) The block's shape: checked against the graph, numbered, derived. */
static rkm_result rkm__ilp_shape_init(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                      int32_t x_out, int is_last, rkm__ilp_shape *b)
{
    rkm_context *ctx = g->ctx;
    b->g = g;
    b->ctx = ctx;
    b->n = n_ops;
    b->x_in = x_in;
    b->x_out = x_out;
    b->is_last = is_last ? 1 : 0;
    int32_t *opl = rkm__alloc(ctx, (g->n_ops + 1) * sizeof *opl);
    rkm_result r = RKM_OK;
    if (!opl || !rkm__ilp_take(ctx, &b->arrays, &b->lt, g->n_tensors + 1, sizeof *b->lt) ||
        !rkm__ilp_take(ctx, &b->arrays, &b->op, (size_t)n_ops, sizeof *b->op))
        r = rkm__err(ctx, RKM_ERROR_NOMEM, "block ILP: out of memory for a block of %d ops", (int)n_ops);
    if (!r) {
        for (size_t x = 0; x < g->n_ops; x++) opl[x] = -1;
        for (size_t t = 0; t < g->n_tensors; t++) b->lt[t] = -1;
        r = rkm__ilp_locals(b, ops, opl);
    }
    if (!r) r = rkm__ilp_number(b);
    if (!r) r = rkm__ilp_check(b, opl);
    if (!r) r = rkm__ilp_structure(b);
    rkm__free(ctx, opl, (g->n_ops + 1) * sizeof *opl);
    return r;
}

/* (b) The model: columns, nodes, free candidates, and the lprec. */
static rkm_result rkm__ilp_model_init(const rkm__ilp_shape *b, rkm__ilp_model *md)
{
    rkm_context *ctx = b->ctx;
    rkm__ilp_arrays *a = &md->arrays;
    size_t n = (size_t)b->n, nt = (size_t)b->nt, nb = (size_t)b->nb;
    if (!rkm__ilp_take(ctx, a, &md->colR, (nb + 1) * n, sizeof *md->colR) ||
        !rkm__ilp_take(ctx, a, &md->colRP, (nb + 1) * n, sizeof *md->colRP) ||
        !rkm__ilp_take(ctx, a, &md->colS, (nb + 2) * nt, sizeof *md->colS) ||
        !rkm__ilp_take(ctx, a, &md->node_off, nb + 2, sizeof *md->node_off))
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model's columns");
    rkm__ilp_columns(b, md); /* count */
    if (md->ncols > RKM__ILP_MAX_COLS)
        return rkm__ilp_err(b, RKM_ERROR_SOLVER, "%d ops make %d columns, more than lp_solve can take (%d)", (int)b->n,
                            (int)md->ncols, RKM__ILP_MAX_COLS);
    if (!rkm__ilp_take(ctx, a, &md->node, (size_t)md->n_nodes, sizeof *md->node) ||
        !rkm__ilp_take(ctx, a, &md->fcand, (size_t)md->n_fcand, sizeof *md->fcand) ||
        !rkm__ilp_take(ctx, a, &md->x, (size_t)md->ncols + 1, sizeof *md->x))
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the model's nodes");
    rkm__ilp_columns(b, md);
    return rkm__ilp_build(b, md);
}

static void rkm__ilp_model_free(rkm_context *ctx, rkm__ilp_model *md)
{
    if (md->lp) {
        rkm__ilp_lock();
        delete_lp(md->lp);
        rkm__ilp_unlock();
        md->lp = NULL;
    }
    rkm__ilp_drop(ctx, &md->arrays);
}

/* (c) The memo: the floors, and room for the cache's schedules. */
static rkm_result rkm__ilp_memo_init(const rkm__ilp_shape *b, rkm__ilp_memo *memo)
{
    rkm__ilp_floors(b, memo);
    for (int c = 0; c < RKM__ILP_CACHE; c++)
        if (!rkm__ilp_sched_alloc(b, &memo->cache[c]))
            return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for the schedule cache");
    return RKM_OK;
}

static void rkm__ilp_memo_free(rkm_context *ctx, rkm__ilp_memo *memo)
{
    for (int c = 0; c < RKM__ILP_CACHE; c++) rkm__ilp_sched_free(ctx, &memo->cache[c]);
}

/* (d) The scratch of a solve. */
static rkm_result rkm__ilp_scratch_init(const rkm__ilp_shape *b, rkm__ilp_scratch *sc)
{
    rkm_context *ctx = b->ctx;
    rkm__ilp_arrays *a = &sc->arrays;
    size_t n = (size_t)b->n, nt = (size_t)b->nt;
    if (!rkm__ilp_take(ctx, a, &sc->gr.x, n, 1) || !rkm__ilp_take(ctx, a, &sc->gr.seen2, n, 1) ||
        !rkm__ilp_take(ctx, a, &sc->rp.live, nt, sizeof *sc->rp.live) ||
        !rkm__ilp_take(ctx, a, &sc->rp.rbuf, (size_t)b->max_list, sizeof *sc->rp.rbuf) ||
        !rkm__ilp_sched_alloc(b, &sc->gr.trial) || !rkm__ilp_sched_alloc(b, &sc->gr.alt) ||
        !rkm__ilp_sched_alloc(b, &sc->best) || !rkm__ilp_sched_alloc(b, &sc->found))
        return rkm__ilp_err(b, RKM_ERROR_NOMEM, "out of memory for a solve's scratch");
    rkm_result r = rkm__sim_init(b->g, &sc->rp.sim);
    return r ? rkm__ilp_err(b, r, "out of memory for the simulator") : RKM_OK;
}

static void rkm__ilp_scratch_free(rkm_context *ctx, rkm__ilp_scratch *sc)
{
    rkm__sim_free(&sc->rp.sim);
    rkm__ilp_sched_free(ctx, &sc->gr.trial);
    rkm__ilp_sched_free(ctx, &sc->gr.alt);
    rkm__ilp_sched_free(ctx, &sc->best);
    rkm__ilp_sched_free(ctx, &sc->found);
    rkm__ilp_drop(ctx, &sc->arrays);
}

static void rkm__ilp_block_destroy(rkm__ilp_block *bk)
{
    if (!bk) return;
    rkm_context *ctx = bk->shape.ctx;
    rkm__ilp_model_free(ctx, &bk->model);
    rkm__ilp_memo_free(ctx, &bk->memo);
    rkm__ilp_scratch_free(ctx, &bk->scratch);
    rkm__ilp_drop(ctx, &bk->shape.arrays);
    rkm__free(ctx, bk, sizeof *bk);
}

static rkm_result rkm__ilp_block_create(const rkm_graph *g, const int32_t *ops, int32_t n_ops, int32_t x_in,
                                        int32_t x_out, int is_last, rkm__ilp_block **out)
{
    *out = NULL;
    rkm_context *ctx = g->ctx;
    if (!g->finalized) return rkm__err(ctx, RKM_ERROR_STATE, "block ILP: the graph is not finalized");
    if (!ops || n_ops < 1 || (size_t)n_ops > g->n_ops || x_out < 0 || (size_t)x_out >= g->n_tensors ||
        x_in < -1 || (x_in >= 0 && (size_t)x_in >= g->n_tensors) || (is_last && x_out != g->loss))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "block ILP: bad block (ops, x_in, x_out or is_last)");
    rkm__ilp_block *bk = rkm__calloc(ctx, 1, sizeof *bk);
    if (!bk) return rkm__err(ctx, RKM_ERROR_NOMEM, "block ILP: out of memory for a block of %d ops", (int)n_ops);
    rkm_result r = rkm__ilp_shape_init(g, ops, n_ops, x_in, x_out, is_last, &bk->shape);
    if (!r) r = rkm__ilp_model_init(&bk->shape, &bk->model);
    if (!r) r = rkm__ilp_memo_init(&bk->shape, &bk->memo);
    if (!r) r = rkm__ilp_scratch_init(&bk->shape, &bk->scratch);
    if (r) {
        rkm__ilp_block_destroy(bk);
        return r;
    }
    *out = bk;
    return RKM_OK;
}

#endif /* RKM_OMIT_SOLVER */

/* ===========================================================================
 * 10. Chain DP
 * ===========================================================================
 *
 * An abstract chain of blocks 0..n-1. Block i reads x_{i-1} (nothing for
 * block 0) and writes x_i (the loss for the last block, counted inside that
 * block's own numbers: its output has 0 slots). Memory is in integer slots
 * above the graph's inputs (rkm__planner_chain converts the blocks' bytes,
 * section 8, to them).
 * Per block: in_sz (slots of x_{i-1}), g_out (slots of grad(x_i)), a no-save
 * forward (time tfn, peak pfn counting x_{i-1} and x_i) and options k, each
 * (tf, tb, kept, pf, pb): F_k leaves x_{i-1}, x_i and `kept` slots live and
 * peaks at pf (counting them); B_k starts from x_{i-1}, x_i, kept, grad(x_i),
 * peaks at pb (counting them), and leaves x_{i-1} and grad(x_{i-1}).
 *
 * Peaks are raised to the live sets they count (rkm__dp_pf and friends): a
 * caller rounds each size and peak up to slots on its own, so a rounded peak
 * can fall below the sum of its rounded parts; the raise keeps the DP from
 * promising memory that is not there.
 *
 * Opt(a, b, m): least time for blocks a..b when x_{a-1} is live (held by the
 * caller), grad(x_b) is live, and m slots hold everything of the segment,
 * x_{a-1} and grad(x_b) included. It ends with x_{a-1} and grad(x_{a-1}).
 *   option k:      F_k(a), Opt(a+1, b, m - in_a - kept_k), B_k(a)
 *   checkpoint j:  no-save forward a..j-1 (x_{t-1} freed after block t > a),
 *                  Opt(j, b, m - in_a), free x_{j-1}, Opt(a, j-1, m)
 * Ties (exactly equal times) go to the first candidate in this order:
 * options in their given order, then checkpoints by increasing j.
 * Infeasible cells have cost INFINITY and decision RKM__DP_NONE; a cost of 0
 * is an ordinary cost.
 *
 * Block-level schedules (rkm__dp_ops) are what the planner flattens; the DP's
 * reconstruction and the sqrt schedule produce them, rkm__dp_eval measures
 * them with the rules of rkm__dp_apply. */
typedef struct rkm__dp_option {
    double tf, tb;   /* forward and backward time */
    int32_t kept;    /* slots kept from F_k to B_k, besides x_{i-1} and x_i */
    int32_t pf, pb;  /* peak slots of F_k and B_k (see above) */
} rkm__dp_option;

typedef struct rkm__dp_block {
    int32_t in_sz;   /* slots of x_{i-1}; must be 0 for the first block */
    int32_t g_out;   /* slots of grad(x_i); must be 0 for the last block */
    int32_t pfn;     /* peak of the no-save forward, counting x_{i-1} and x_i */
    double tfn;      /* time of the no-save forward */
    int32_t n_opt;
    const rkm__dp_option *opt;
} rkm__dp_block;

enum {
    RKM__DP_FWD_OPT,    /* F_k of `block`, k = `option` */
    RKM__DP_BWD_OPT,    /* B_k of `block` (the last block's includes the loss step) */
    RKM__DP_FWD_NOSAVE, /* no-save forward of `block`: only x_block is left */
    RKM__DP_FREE_OUT    /* free x_block, the output of `block` */
};

typedef struct rkm__dp_op {
    int32_t kind, block, option; /* option: -1 unless FWD_OPT or BWD_OPT */
} rkm__dp_op;

typedef struct rkm__dp_ops {
    rkm__dp_op *v;
    size_t n, cap;
} rkm__dp_ops;

/* Decisions: an option index, RKM__DP_CKPT + j, or RKM__DP_NONE. */
#define RKM__DP_CKPT 0x8000u
#define RKM__DP_NONE 0xFFFFu
#define RKM__DP_MAX_OPT 0x7FFF
#define RKM__DP_MAX_BLOCKS 0x7FFE
/* Columns solved together (see rkm__dp_solve). */
#define RKM__DP_TILE 256
/* "No m is enough"; far from overflow when a few slot counts are added. */
#define RKM__DP_INF_SLOTS (INT64_MAX / 4)

/* A candidate of a cell (a, b, m), m >= start: its cost is base, plus
 * Opt of pair p1 at m - sh, plus Opt of pair p2 at m (RKM__DP_NOROW: none). */
typedef struct rkm__dp_term {
    double base;
    int32_t start, sh;
    uint32_t p1, p2;
} rkm__dp_term;

#define RKM__DP_NOROW UINT32_MAX

/* The same, while enumerating: constant for m >= cf, decision dec. */
typedef struct rkm__dp_cand {
    rkm__dp_term x;
    int64_t cf;
    uint16_t dec;
} rkm__dp_cand;

typedef struct rkm__dp_table {
    const rkm__dp_block *bl; /* the chain (the caller keeps it alive) */
    int32_t n, M;
    size_t row;      /* M + 1 cells per pair (a, b) */
    double *cost;    /* Opt(a, b, m) at [rkm__dp_pair(n, a, b) * row + m] */
    int64_t *lo;     /* per pair: least feasible m (may exceed M) */
    int32_t *hi;     /* per pair: the cost is constant for m >= hi */
    rkm__dp_cand *cands; /* scratch: the candidates of one pair */
    double *bound;       /* scratch: a bound per candidate of one pair */
    size_t n_cands;      /* capacity of both: most options of a block + n */
    rkm__dp_term *terms; /* while solving: every pair's feasible candidates */
    size_t n_terms, cap_terms;
    size_t *term_at;     /* per pair: its first term; its last is term_at[p] + term_n[p] */
    uint32_t *term_n;
} rkm__dp_table;

/* ---- the model ---------------------------------------------------------- */

static int64_t rkm__dp_max(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t rkm__dp_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* Slots of x_i (0 for the last block's output, the loss). */
static int64_t rkm__dp_out(const rkm__dp_block *bl, int32_t n, int32_t i)
{
    return i + 1 < n ? bl[i + 1].in_sz : 0;
}

/* Slots of grad(x_{i-1}), which B of block i leaves. */
static int64_t rkm__dp_gin(const rkm__dp_block *bl, int32_t i) { return i > 0 ? bl[i - 1].g_out : 0; }

static int64_t rkm__dp_pfn(const rkm__dp_block *bl, int32_t n, int32_t i)
{
    return rkm__dp_max(bl[i].pfn, bl[i].in_sz + rkm__dp_out(bl, n, i));
}

static int64_t rkm__dp_pf(const rkm__dp_block *bl, int32_t n, int32_t i, int32_t k)
{
    const rkm__dp_option *o = &bl[i].opt[k];
    return rkm__dp_max(o->pf, bl[i].in_sz + rkm__dp_out(bl, n, i) + o->kept);
}

static int64_t rkm__dp_pb(const rkm__dp_block *bl, int32_t n, int32_t i, int32_t k)
{
    const rkm__dp_option *o = &bl[i].opt[k];
    int64_t start = bl[i].in_sz + rkm__dp_out(bl, n, i) + o->kept + bl[i].g_out;
    return rkm__dp_max(o->pb, rkm__dp_max(start, bl[i].in_sz + rkm__dp_gin(bl, i)));
}

static int rkm__dp_time_ok(double t) { return isfinite(t) && t >= 0; }

static rkm_result rkm__dp_check(rkm_context *ctx, const rkm__dp_block *bl, int32_t n)
{
    if (!bl || n < 1 || n > RKM__DP_MAX_BLOCKS)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "chain DP: %d blocks (1 to %d)", (int)n, RKM__DP_MAX_BLOCKS);
    if (bl[0].in_sz != 0 || bl[n - 1].g_out != 0)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "chain DP: the first block's input and the last block's "
                                                 "output gradient must have 0 slots");
    for (int32_t i = 0; i < n; i++) {
        const rkm__dp_block *b = &bl[i];
        int bad = b->in_sz < 0 || b->g_out < 0 || b->pfn < 0 || !rkm__dp_time_ok(b->tfn) || b->n_opt < 0 ||
                  b->n_opt > RKM__DP_MAX_OPT || (b->n_opt > 0 && !b->opt);
        for (int32_t k = 0; !bad && k < b->n_opt; k++) {
            const rkm__dp_option *o = &b->opt[k];
            bad = o->kept < 0 || o->pf < 0 || o->pb < 0 || !rkm__dp_time_ok(o->tf) || !rkm__dp_time_ok(o->tb);
        }
        if (bad) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "chain DP: block %d: negative, NaN or infinite value, "
                                                          "or bad option list", (int)i);
    }
    return RKM_OK;
}

/* The state of a block-level schedule being replayed. */
typedef struct rkm__dp_state {
    uint8_t *x;      /* x[i]: x_i live */
    int32_t *kept;   /* kept[i]: 1 + the option whose kept state of block i is live, or 0 */
    int32_t front;   /* blocks > front have run their backward; grad(x_front) is live */
    int64_t mem, peak;
    double time;
} rkm__dp_state;

/* The start of a step: nothing live (x_{-1} is empty), no backward done. */
static void rkm__dp_state_reset(rkm__dp_state *s, int32_t n)
{
    memset(s->x, 0, (size_t)n);
    memset(s->kept, 0, (size_t)n * sizeof *s->kept);
    s->front = n - 1;
    s->mem = s->peak = 0;
    s->time = 0;
}

static int rkm__dp_fwd_ok(const rkm__dp_state *s, int32_t i)
{
    /* x_i must not exist twice, and a block with live kept state cannot run
     * forward again (its kept tensors would be made a second time). Forward
     * work on a block whose backward is done is useless; refusing it keeps
     * exhaustive searches small. */
    return (i == 0 || s->x[i - 1]) && !s->x[i] && !s->kept[i] && s->front >= i;
}

/* Apply one op to s. Returns NULL and updates s (time, memory, peak), or says
 * which precondition fails and leaves s unchanged. */
static const char *rkm__dp_apply(const rkm__dp_block *bl, int32_t n, rkm__dp_state *s, const rkm__dp_op *op)
{
    int32_t i = op->block, k = op->option;
    if (i < 0 || i >= n) return "block out of range";
    int64_t in = bl[i].in_sz, out = rkm__dp_out(bl, n, i), peak, mem;
    double t;
    switch (op->kind) {
    case RKM__DP_FWD_OPT:
        if (k < 0 || k >= bl[i].n_opt) return "option out of range";
        /* fall through */
    case RKM__DP_FWD_NOSAVE: {
        int save = op->kind == RKM__DP_FWD_OPT;
        if (!rkm__dp_fwd_ok(s, i)) return "forward needs x_{i-1}, no x_i, no kept state, backward not done";
        peak = s->mem - in + (save ? rkm__dp_pf(bl, n, i, k) : rkm__dp_pfn(bl, n, i));
        mem = s->mem + out + (save ? bl[i].opt[k].kept : 0);
        t = save ? bl[i].opt[k].tf : bl[i].tfn;
        s->x[i] = 1;
        s->kept[i] = save ? k + 1 : 0;
        break;
    }
    case RKM__DP_BWD_OPT:
        if (s->front != i || s->kept[i] != k + 1 || k < 0 || (i > 0 && !s->x[i - 1]) || !s->x[i])
            return "backward needs grad(x_i), x_{i-1}, x_i and the option's kept state";
        peak = s->mem - (in + out + bl[i].opt[k].kept + bl[i].g_out) + rkm__dp_pb(bl, n, i, k);
        mem = s->mem - out - bl[i].opt[k].kept - bl[i].g_out + rkm__dp_gin(bl, i);
        t = bl[i].opt[k].tb;
        s->x[i] = 0;
        s->kept[i] = 0;
        s->front = i - 1;
        break;
    case RKM__DP_FREE_OUT:
        /* x_i is pinned while block i or block i+1 holds kept state: their
         * backward reads it and no forward may remake it meanwhile. */
        if (!s->x[i] || s->kept[i] || (i + 1 < n && s->kept[i + 1])) return "free needs x_i live and not pinned";
        peak = s->mem;
        mem = s->mem - out;
        t = 0;
        s->x[i] = 0;
        break;
    default:
        return "unknown op kind";
    }
    s->mem = mem;
    s->peak = rkm__dp_max(s->peak, peak);
    s->time += t;
    return NULL;
}

static void rkm__dp_ops_free(rkm_context *ctx, rkm__dp_ops *o)
{
    rkm__free(ctx, o->v, o->cap * sizeof *o->v);
    o->v = NULL;
    o->n = o->cap = 0;
}

static int rkm__dp_ops_push(rkm_context *ctx, rkm__dp_ops *o, int32_t kind, int32_t block, int32_t option)
{
    if (!rkm__reserve(ctx, (void **)&o->v, &o->cap, o->n + 1, sizeof *o->v)) return 0;
    o->v[o->n++] = (rkm__dp_op){kind, block, option};
    return 1;
}

/* Replay a whole schedule from the start of a step: *time and *peak (slots).
 * RKM_ERROR_PLAN names the first op whose preconditions fail, or a schedule
 * that does not end with every backward done and nothing live. */
static rkm_result rkm__dp_eval(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, const rkm__dp_ops *ops,
                               double *time, int64_t *peak)
{
    rkm_result r = rkm__dp_check(ctx, bl, n);
    if (r != RKM_OK) return r;
    rkm__dp_state s;
    s.x = rkm__alloc(ctx, (size_t)n);
    s.kept = rkm__calloc(ctx, (size_t)n, sizeof *s.kept);
    if (!s.x || !s.kept) {
        r = rkm__nomem(ctx, "chain DP evaluation");
        goto done;
    }
    rkm__dp_state_reset(&s, n);
    for (size_t i = 0; i < ops->n; i++) {
        const char *why = rkm__dp_apply(bl, n, &s, &ops->v[i]);
        if (why) {
            r = rkm__err(ctx, RKM_ERROR_PLAN, "block schedule op %zu (kind %d, block %d): %s", i,
                         (int)ops->v[i].kind, (int)ops->v[i].block, why);
            goto done;
        }
    }
    if (s.front != -1 || s.mem != 0) {
        r = rkm__err(ctx, RKM_ERROR_PLAN, "block schedule ends with backward not done or memory live");
        goto done;
    }
    *time = s.time;
    *peak = s.peak;
done:
    rkm__free(ctx, s.x, (size_t)n);
    rkm__free(ctx, s.kept, (size_t)n * sizeof *s.kept);
    return r;
}

/* ---- the table ---------------------------------------------------------- */

static size_t rkm__dp_pair(int32_t n, int32_t a, int32_t b)
{
    return (size_t)a * (size_t)n - (size_t)a * (size_t)(a - 1) / 2 + (size_t)(b - a);
}

static size_t rkm__dp_pairs(int32_t n) { return (size_t)n * (size_t)(n + 1) / 2; }

static int64_t rkm__dp_add(int64_t a, int64_t b) { return rkm__dp_min(a + b, RKM__DP_INF_SLOTS); }

/* Peak requirement of the no-save run a..j-1 of a checkpoint j, given the
 * requirement `need` up to j-1 (pass 0 for j = a+1). */
static int64_t rkm__dp_need(const rkm__dp_block *bl, int32_t n, int32_t a, int32_t b, int32_t j, int64_t need)
{
    int64_t gb = bl[b].g_out;
    if (j == a + 1) return rkm__dp_pfn(bl, n, a) + gb;
    return rkm__dp_max(need, bl[a].in_sz + rkm__dp_pfn(bl, n, j - 1) + gb);
}

/* Least feasible m of every pair (the same recurrence on feasibility only). */
static void rkm__dp_fill_lo(const rkm__dp_block *bl, int32_t n, int64_t *lo)
{
    for (int32_t a = n - 1; a >= 0; a--) {
        for (int32_t b = a; b < n; b++) {
            int64_t gb = bl[b].g_out, ina = bl[a].in_sz, best = RKM__DP_INF_SLOTS, need = 0;
            for (int32_t k = 0; k < bl[a].n_opt; k++) {
                int64_t st = rkm__dp_max(rkm__dp_pf(bl, n, a, k) + gb, rkm__dp_pb(bl, n, a, k));
                if (a < b) st = rkm__dp_max(st, rkm__dp_add(lo[rkm__dp_pair(n, a + 1, b)], ina + bl[a].opt[k].kept));
                best = rkm__dp_min(best, st);
            }
            for (int32_t j = a + 1; j <= b; j++) {
                need = rkm__dp_need(bl, n, a, b, j, need);
                int64_t st = rkm__dp_max(need, rkm__dp_add(lo[rkm__dp_pair(n, j, b)], ina));
                best = rkm__dp_min(best, rkm__dp_max(st, lo[rkm__dp_pair(n, a, j - 1)]));
            }
            lo[rkm__dp_pair(n, a, b)] = best;
        }
    }
}

/* The least M with Opt(1, n, M) finite; RKM_ERROR_BUDGET when there is none
 * (a block without options). */
static rkm_result rkm__dp_min_slots(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int64_t *min)
{
    rkm_result r = rkm__dp_check(ctx, bl, n);
    if (r != RKM_OK) return r;
    int64_t *lo = rkm__calloc(ctx, rkm__dp_pairs(n), sizeof *lo);
    if (!lo) return rkm__nomem(ctx, "chain DP");
    rkm__dp_fill_lo(bl, n, lo);
    *min = lo[rkm__dp_pair(n, 0, n - 1)];
    rkm__free(ctx, lo, rkm__dp_pairs(n) * sizeof *lo);
    if (*min >= RKM__DP_INF_SLOTS) return rkm__err(ctx, RKM_ERROR_BUDGET, "chain DP: a block has no option");
    return RKM_OK;
}

/* The feasible candidates of pair (a, b) into t->cands, in tie-breaking
 * order (they read lo and hi of shorter pairs only). */
static size_t rkm__dp_cands(rkm__dp_table *t, int32_t a, int32_t b)
{
    const rkm__dp_block *bl = t->bl;
    int32_t n = t->n;
    int64_t gb = bl[b].g_out, ina = bl[a].in_sz, need = 0;
    size_t nc = 0;
    for (int32_t k = 0; k < bl[a].n_opt; k++) {
        int64_t start = rkm__dp_max(rkm__dp_pf(bl, n, a, k) + gb, rkm__dp_pb(bl, n, a, k)), cf = 0;
        int64_t sh = ina + bl[a].opt[k].kept;
        uint32_t p1 = RKM__DP_NOROW;
        if (a < b) {
            p1 = (uint32_t)rkm__dp_pair(n, a + 1, b);
            start = rkm__dp_max(start, rkm__dp_add(t->lo[p1], sh));
            cf = rkm__dp_add(t->hi[p1], sh);
        }
        if (start > t->M) continue;
        /* start <= M bounds sh when p1 is used */
        rkm__dp_term x = {bl[a].opt[k].tf + bl[a].opt[k].tb, (int32_t)start, p1 == RKM__DP_NOROW ? 0 : (int32_t)sh,
                          p1, RKM__DP_NOROW};
        t->cands[nc++] = (rkm__dp_cand){x, rkm__dp_max(cf, start), (uint16_t)k};
    }
    double tsum = 0;
    for (int32_t j = a + 1; j <= b; j++) {
        need = rkm__dp_need(bl, n, a, b, j, need);
        tsum += bl[j - 1].tfn;
        uint32_t p1 = (uint32_t)rkm__dp_pair(n, j, b), p2 = (uint32_t)rkm__dp_pair(n, a, j - 1);
        int64_t start = rkm__dp_max(need, rkm__dp_max(rkm__dp_add(t->lo[p1], ina), t->lo[p2]));
        if (start > t->M) continue;
        rkm__dp_term x = {tsum, (int32_t)start, (int32_t)ina, p1, p2};
        int64_t cf = rkm__dp_max(start, rkm__dp_max(rkm__dp_add(t->hi[p1], ina), t->hi[p2]));
        t->cands[nc++] = (rkm__dp_cand){x, cf, (uint16_t)(RKM__DP_CKPT + (unsigned)j)};
    }
    return nc;
}

/* The cost of candidate x at m >= x->start. The kernels below compute the
 * same sums in the same order, so decisions can be found again by equality. */
static double rkm__dp_term_at(const rkm__dp_table *t, const rkm__dp_term *x, int32_t m)
{
    double v = x->base;
    if (x->p1 != RKM__DP_NOROW) v = v + t->cost[x->p1 * t->row + (size_t)(m - x->sh)];
    if (x->p2 != RKM__DP_NOROW) v = v + t->cost[x->p2 * t->row + (size_t)m];
    return v;
}

/* best[i] = min(best[i], base (+ r1[i] (+ r2[i]))) over distinct rows: the
 * DP's hot loops. With SSE2 (every x86-64), two cells at a time: minpd picks
 * exactly what the scalar `v < b ? v : b` picks (costs are never NaN). */
static void rkm__dp_min0(double *restrict best, double base, int32_t len)
{
    for (int32_t i = 0; i < len; i++) best[i] = base < best[i] ? base : best[i];
}

static void rkm__dp_min1(double *restrict best, const double *restrict r1, double base, int32_t len)
{
    int32_t i = 0;
#if defined(__SSE2__)
    __m128d vb = _mm_set1_pd(base);
    for (; i + 2 <= len; i += 2)
        _mm_storeu_pd(best + i, _mm_min_pd(_mm_add_pd(vb, _mm_loadu_pd(r1 + i)), _mm_loadu_pd(best + i)));
#endif
    for (; i < len; i++) {
        double v = base + r1[i];
        best[i] = v < best[i] ? v : best[i];
    }
}

static void rkm__dp_min2(double *restrict best, const double *restrict r1, const double *restrict r2, double base,
                         int32_t len)
{
    int32_t i = 0;
#if defined(__SSE2__)
    __m128d vb = _mm_set1_pd(base);
    for (; i + 2 <= len; i += 2) {
        __m128d v = _mm_add_pd(_mm_add_pd(vb, _mm_loadu_pd(r1 + i)), _mm_loadu_pd(r2 + i));
        _mm_storeu_pd(best + i, _mm_min_pd(v, _mm_loadu_pd(best + i)));
    }
#endif
    for (; i < len; i++) {
        double v = base + r1[i] + r2[i];
        best[i] = v < best[i] ? v : best[i];
    }
}

/* First m in [lo, hi] with best[m] <= v, or hi + 1 (best is non-increasing). */
static int32_t rkm__dp_first_le(const double *best, int32_t lo, int32_t hi, double v)
{
    if (best[lo] <= v) return lo; /* the common cases first */
    if (best[hi] > v) return hi + 1;
    int32_t end = hi;
    while (lo < end) {
        int32_t mid = lo + (end - lo) / 2;
        if (best[mid] <= v) end = mid;
        else lo = mid + 1;
    }
    return end;
}

/* best = min(best, x) over [m0, e), given x's cost at e-1 (`floor`). Every
 * candidate is non-increasing in m, so best is too, and where best is
 * already <= the floor, x cannot win: the loop stops there. */
static void rkm__dp_relax(const rkm__dp_table *t, const rkm__dp_term *x, int32_t m0, int32_t e, double floor,
                          double *best)
{
    m0 = x->start > m0 ? x->start : m0;
    int32_t end = m0 < e ? rkm__dp_first_le(best, m0, e - 1, floor) : m0;
    if (end <= m0) return;
    if (x->p1 == RKM__DP_NOROW) {
        rkm__dp_min0(best + m0, x->base, end - m0);
    } else if (x->p2 == RKM__DP_NOROW) {
        rkm__dp_min1(best + m0, t->cost + x->p1 * t->row + (m0 - x->sh), x->base, end - m0);
    } else {
        rkm__dp_min2(best + m0, t->cost + x->p1 * t->row + (m0 - x->sh), t->cost + x->p2 * t->row + m0, x->base,
                     end - m0);
    }
}

/* Columns [m0, m1) of pair p's row. All shorter pairs have theirs. */
static void rkm__dp_solve_tile(rkm__dp_table *t, size_t p, int32_t m0, int32_t m1)
{
    double *best = t->cost + p * t->row;
    int32_t hi = t->hi[p], e = m1 < hi + 1 ? m1 : hi + 1;
    uint32_t nc = t->term_n[p];
    const rkm__dp_term *x = nc ? t->terms + t->term_at[p] : NULL; /* no terms: t->terms may be NULL */
    if (m0 < e) {
        for (int32_t m = m0; m < e; m++) best[m] = INFINITY;
        /* Values do not depend on the order (decisions are found again in
         * the tie-breaking order): the least floor goes first, so that the
         * others stop early. */
        uint32_t first = 0;
        for (uint32_t i = 0; i < nc; i++) {
            t->bound[i] = x[i].start < e ? rkm__dp_term_at(t, &x[i], e - 1) : INFINITY;
            if (t->bound[i] < t->bound[first]) first = i;
        }
        for (uint32_t i = 0; i < nc; i++) {
            uint32_t k = i == 0 ? first : i == first ? 0 : i;
            rkm__dp_relax(t, &x[k], m0, e, t->bound[k], best);
        }
    }
    for (int32_t m = e > m0 ? e : m0; m < m1; m++) best[m] = best[hi]; /* constant past hi */
}

static void rkm__dp_table_free(rkm_context *ctx, rkm__dp_table *t)
{
    size_t pairs = t->n > 0 ? rkm__dp_pairs(t->n) : 0;
    rkm__free(ctx, t->cost, pairs * t->row * sizeof *t->cost);
    rkm__free(ctx, t->lo, pairs * sizeof *t->lo);
    rkm__free(ctx, t->hi, pairs * sizeof *t->hi);
    rkm__free(ctx, t->cands, t->n_cands * sizeof *t->cands);
    rkm__free(ctx, t->bound, t->n_cands * sizeof *t->bound);
    rkm__free(ctx, t->terms, t->cap_terms * sizeof *t->terms);
    rkm__free(ctx, t->term_at, pairs * sizeof *t->term_at);
    rkm__free(ctx, t->term_n, pairs * sizeof *t->term_n);
    memset(t, 0, sizeof *t);
}

/* Every pair's candidates and hi (shorter pairs first). 0 on NOMEM. */
static int rkm__dp_prepare(rkm_context *ctx, rkm__dp_table *t)
{
    for (int32_t a = t->n - 1; a >= 0; a--) {
        for (int32_t b = a; b < t->n; b++) {
            size_t p = rkm__dp_pair(t->n, a, b), nc = rkm__dp_cands(t, a, b);
            if (!rkm__reserve(ctx, (void **)&t->terms, &t->cap_terms, t->n_terms + nc, sizeof *t->terms)) return 0;
            int64_t h = 0;
            for (size_t i = 0; i < nc; i++) {
                t->terms[t->n_terms + i] = t->cands[i].x;
                h = rkm__dp_max(h, t->cands[i].cf);
            }
            /* past the largest cf every candidate is constant, so the row is */
            t->hi[p] = (int32_t)rkm__dp_min(h, t->M);
            t->term_at[p] = t->n_terms;
            t->term_n[p] = (uint32_t)nc;
            t->n_terms += nc;
        }
    }
    return 1;
}

/* About the most memory the DP's table for n blocks and M slots takes: its
 * rows (n^2/2 x M), and its candidate terms (every option and every
 * checkpoint position of every pair: n^3/6, twice over for the growth of
 * their array). The planner checks it against RKM_DP_MAX_BYTES before
 * anything is allocated, so that a long chain is refused at once, with the
 * figure, instead of taking the process down. */
#define RKM_DP_MAX_BYTES (1024.0 * 1024 * 1024)
static double rkm__dp_bytes(const rkm__dp_block *bl, int32_t n, int32_t M)
{
    int32_t max_opt = 0;
    for (int32_t i = 0; i < n; i++) max_opt = bl[i].n_opt > max_opt ? bl[i].n_opt : max_opt;
    double dn = (double)n, pairs = dn * (dn + 1) / 2;
    double terms = pairs * max_opt + dn * (dn * dn - 1) / 6;
    return pairs * ((double)(M + 1) * sizeof(double) + 24) + 2 * terms * sizeof(rkm__dp_term);
}

/* Opt(a, b, m) for every pair and every m in 0..M (0-based blocks). The
 * table keeps a pointer to bl, which must outlive it. Columns go in tiles of
 * RKM__DP_TILE, all pairs per tile (a cell needs only cells of shorter pairs
 * at the same or fewer slots): a candidate's cost at the end of the tile then
 * bounds it over the tile, which prunes far more than its cost at M, and a
 * tile reads less memory than whole rows. */
static rkm_result rkm__dp_solve(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int32_t M, rkm__dp_table *t)
{
    memset(t, 0, sizeof *t);
    rkm_result r = rkm__dp_check(ctx, bl, n);
    if (r != RKM_OK) return r;
    if (M < 0 || M == INT32_MAX) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "chain DP: %d slots", (int)M);
    size_t pairs = rkm__dp_pairs(n), row = (size_t)M + 1, max_opt = 0;
    if (pairs > SIZE_MAX / row / sizeof(double)) return rkm__nomem(ctx, "chain DP table");
    for (int32_t i = 0; i < n; i++) max_opt = bl[i].n_opt > (int32_t)max_opt ? (size_t)bl[i].n_opt : max_opt;
    t->bl = bl;
    t->n = n;
    t->M = M;
    t->row = row;
    t->n_cands = max_opt + (size_t)n;
    t->cost = rkm__alloc(ctx, pairs * row * sizeof *t->cost);
    t->lo = rkm__alloc(ctx, pairs * sizeof *t->lo);
    t->hi = rkm__alloc(ctx, pairs * sizeof *t->hi);
    t->cands = rkm__alloc(ctx, t->n_cands * sizeof *t->cands);
    t->bound = rkm__alloc(ctx, t->n_cands * sizeof *t->bound);
    t->term_at = rkm__alloc(ctx, pairs * sizeof *t->term_at);
    t->term_n = rkm__alloc(ctx, pairs * sizeof *t->term_n);
    if (!t->cost || !t->lo || !t->hi || !t->cands || !t->bound || !t->term_at || !t->term_n) goto nomem;
    rkm__dp_fill_lo(bl, n, t->lo);
    if (!rkm__dp_prepare(ctx, t)) goto nomem;
    for (int32_t m0 = 0; m0 <= M; m0 += RKM__DP_TILE) {
        int32_t m1 = M + 1 - m0 > RKM__DP_TILE ? m0 + RKM__DP_TILE : M + 1;
        for (int32_t a = n - 1; a >= 0; a--)
            for (int32_t b = a; b < n; b++) rkm__dp_solve_tile(t, rkm__dp_pair(n, a, b), m0, m1);
    }
    /* the terms are only needed while solving */
    rkm__free(ctx, t->terms, t->cap_terms * sizeof *t->terms);
    t->terms = NULL;
    t->n_terms = t->cap_terms = 0;
    return RKM_OK;
nomem:
    rkm__dp_table_free(ctx, t);
    return rkm__nomem(ctx, "chain DP table");
}

/* Opt(a, b, m); INFINITY when infeasible. */
static double rkm__dp_opt(const rkm__dp_table *t, int32_t a, int32_t b, int32_t m)
{
    return t->cost[rkm__dp_pair(t->n, a, b) * t->row + (size_t)m];
}

/* The decision of cell (a, b, m): the first candidate, in tie-breaking order,
 * whose cost is the cell's (an option k, RKM__DP_CKPT + j), or RKM__DP_NONE
 * when infeasible. Found again rather than stored: the solve's loops then
 * only take minima, and a table takes 8 bytes a cell. */
static unsigned rkm__dp_decision(rkm__dp_table *t, int32_t a, int32_t b, int32_t m)
{
    double v = rkm__dp_opt(t, a, b, m);
    size_t nc = isfinite(v) ? rkm__dp_cands(t, a, b) : 0;
    for (size_t i = 0; i < nc; i++)
        if (t->cands[i].x.start <= m && rkm__dp_term_at(t, &t->cands[i].x, m) == v) return t->cands[i].dec;
    return RKM__DP_NONE;
}

/* ---- schedules ---------------------------------------------------------- */

/* Reconstruction work item: an op to emit (kind >= 0; a = block, b = option)
 * or a segment (kind -1; Opt(a, b, m)). */
typedef struct rkm__dp_task {
    int32_t kind, a, b, m;
} rkm__dp_task;

typedef struct rkm__dp_stack {
    rkm__dp_task *v;
    size_t n, cap;
} rkm__dp_stack;

static int rkm__dp_push(rkm_context *ctx, rkm__dp_stack *s, int32_t kind, int32_t a, int32_t b, int32_t m)
{
    if (!rkm__reserve(ctx, (void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return 0;
    s->v[s->n++] = (rkm__dp_task){kind, a, b, m};
    return 1;
}

/* Push the work of cell (a, b, m) in reverse order of execution. */
static int rkm__dp_expand(rkm_context *ctx, rkm__dp_table *t, rkm__dp_stack *s, rkm__dp_task seg)
{
    const rkm__dp_block *bl = t->bl;
    int32_t a = seg.a, b = seg.b, m = seg.m;
    unsigned d = rkm__dp_decision(t, a, b, m);
    if (d < RKM__DP_CKPT) {
        int32_t k = (int32_t)d;
        return rkm__dp_push(ctx, s, RKM__DP_BWD_OPT, a, k, 0) &&
               (a == b || rkm__dp_push(ctx, s, -1, a + 1, b, m - bl[a].in_sz - bl[a].opt[k].kept)) &&
               rkm__dp_push(ctx, s, RKM__DP_FWD_OPT, a, k, 0);
    }
    int32_t j = (int32_t)(d - RKM__DP_CKPT);
    if (!rkm__dp_push(ctx, s, -1, a, j - 1, m) || !rkm__dp_push(ctx, s, RKM__DP_FREE_OUT, j - 1, -1, 0) ||
        !rkm__dp_push(ctx, s, -1, j, b, m - bl[a].in_sz))
        return 0;
    for (int32_t i = j - 1; i >= a; i--)
        if ((i > a && !rkm__dp_push(ctx, s, RKM__DP_FREE_OUT, i - 1, -1, 0)) ||
            !rkm__dp_push(ctx, s, RKM__DP_FWD_NOSAVE, i, -1, 0))
            return 0;
    return 1;
}

/* The schedule of Opt(1, n, m) from a table solved with M >= m, appended to
 * *ops (which the caller frees). RKM_ERROR_BUDGET if infeasible at m. */
static rkm_result rkm__dp_schedule(rkm_context *ctx, rkm__dp_table *t, int32_t m, rkm__dp_ops *ops)
{
    if (m < 0 || m > t->M) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "chain DP: %d slots outside the table", (int)m);
    if (!isfinite(rkm__dp_opt(t, 0, t->n - 1, m)))
        return rkm__err(ctx, RKM_ERROR_BUDGET, "chain DP: no schedule fits %d slots", (int)m);
    rkm__dp_stack s = {NULL, 0, 0};
    rkm_result r = RKM_OK;
    if (!rkm__dp_push(ctx, &s, -1, 0, t->n - 1, m)) r = rkm__nomem(ctx, "chain DP schedule");
    while (r == RKM_OK && s.n > 0) {
        rkm__dp_task x = s.v[--s.n];
        int ok = x.kind < 0 ? rkm__dp_expand(ctx, t, &s, x) : rkm__dp_ops_push(ctx, ops, x.kind, x.a, x.b);
        if (!ok) r = rkm__nomem(ctx, "chain DP schedule");
    }
    rkm__free(ctx, s.v, s.cap * sizeof *s.v);
    return r;
}

/* The option the sqrt schedule uses: least tf + tb, then least kept, then
 * first (for the planner's option sets, "keep everything"). -1 if none. */
static int32_t rkm__dp_fastest(const rkm__dp_block *b)
{
    int32_t best = -1;
    for (int32_t k = 0; k < b->n_opt; k++) {
        const rkm__dp_option *o = &b->opt[k], *p = best >= 0 ? &b->opt[best] : NULL;
        double t = o->tf + o->tb, tp = p ? p->tf + p->tb : 0;
        if (!p || t < tp || (t == tp && o->kept < p->kept)) best = k;
    }
    return best;
}

/* Chen et al.'s schedule: segments of ceil(sqrt(n)) blocks; a no-save forward
 * keeps only segment inputs; then, from the last segment back, forward with
 * the fastest option through the segment and backward through it. */
static rkm_result rkm__dp_sqrt(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, rkm__dp_ops *ops)
{
    rkm_result r = rkm__dp_check(ctx, bl, n);
    if (r != RKM_OK) return r;
    for (int32_t i = 0; i < n; i++)
        if (bl[i].n_opt == 0) return rkm__err(ctx, RKM_ERROR_BUDGET, "chain DP: block %d has no option", (int)i);
    int32_t seg = 1;
    while ((int64_t)seg * seg < n) seg++;
    int32_t last = (n - 1) / seg * seg; /* first block of the last segment */
    int ok = 1;
    for (int32_t i = 0; ok && i < last; i++) {
        ok = rkm__dp_ops_push(ctx, ops, RKM__DP_FWD_NOSAVE, i, -1);
        if (ok && i % seg != 0) ok = rkm__dp_ops_push(ctx, ops, RKM__DP_FREE_OUT, i - 1, -1);
    }
    for (int32_t s0 = last; ok && s0 >= 0; s0 -= seg) {
        int32_t s1 = s0 + seg < n ? s0 + seg : n;
        if (s0 < last) ok = rkm__dp_ops_push(ctx, ops, RKM__DP_FREE_OUT, s1 - 1, -1);
        for (int32_t i = s0; ok && i < s1; i++)
            ok = rkm__dp_ops_push(ctx, ops, RKM__DP_FWD_OPT, i, rkm__dp_fastest(&bl[i]));
        for (int32_t i = s1 - 1; ok && i >= s0; i--)
            ok = rkm__dp_ops_push(ctx, ops, RKM__DP_BWD_OPT, i, rkm__dp_fastest(&bl[i]));
    }
    return ok ? RKM_OK : rkm__nomem(ctx, "sqrt schedule");
}

/* ===========================================================================
 * 11. DTR: dynamic tensor rematerialization, simulated offline
 * ========================================================================= */

/* Kirisame et al. (ICLR 2021), run ahead of time on the contract instead of
 * at run time: the baseline's program (every forward in file order, the
 * loss, every backward in reverse) is replayed under the budget; before a
 * step that would not fit, the live activation or saved state with the
 * least cost / (bytes x staleness) is evicted, and whatever a step needs
 * that is not live is recomputed on demand (recursively). Gradients are
 * never evicted. A tensor is freed as soon as nothing in the program reads
 * it any more. Works on any DAG, at any budget it can meet; it is the
 * fallback and a competitor of the chain DP, and `--algo dtr` on its own.
 *
 * As DTR does at run time, it runs on an allocator, not on a byte count:
 * an arena of the budget's bytes where every new buffer of a step goes to
 * the lowest offset free (first fit, in the order the plan's layout
 * records them), and a step that finds no room for one evicts until it
 * does. Counting bytes alone lets the freed space scatter: on the bundled
 * graphs a third of such plans needed an arena 4 % over their peak. The
 * plan's layout replays this allocator (rkm__lay_firstfit), so a DTR
 * plan's arena fits its budget. The planner's graph counts sizes rounded
 * up to the alignment, so the offsets are aligned. */

typedef struct rkm__dtr {
    const rkm_graph *g;
    rkm__sim s;
    rkm__steps out;
    uint64_t budget;
    uint64_t cap;          /* the allocator's bytes: the budget, or unbounded in bytes mode */
    uint64_t step_need;    /* the bytes the step being placed creates */
    int bytes_mode;        /* evict by bytes live, as counted (the placer lays the plan out after) */
    size_t max_steps;      /* a plan longer than this is thrashing: give up */
    double time, max_time; /* compute so far; over max_time (a plan already found) it cannot win: give up */
    int32_t *lock_t;       /* per tensor: pinned by steps in progress */
    int32_t *lock_p;       /* per op: its saved state pinned */
    int64_t *last_t;       /* per tensor: the step that last touched it */
    int64_t *last_p;       /* per op: the same for its saved state */
    int32_t *uses;         /* per tensor: program steps still to read it */
    int32_t depth;         /* of rkm__dtr_ensure's recursion */
    int failed;            /* 1: the budget cannot be met; -1: out of memory */
    int score;             /* RKM__DTR_* */
    /* The arena: live blocks [at, end) sorted by offset; per tensor, its
     * data's and its gradient's offset, per op its saved state's
     * (UINT64_MAX: none); the blocks of the step being placed. */
    uint64_t *at, *end;
    int64_t *own;          /* per block: tensor t, n_tensors + op for a saved state, -1 pinned */
    size_t n_blk, cap_blk;
    double *cost;          /* per block, rkm__dtr_window's scratch */
    size_t cap_cost;
    uint64_t *off_t, *off_g, *off_p;
} rkm__dtr;

/* Eviction scores, least evicted first. DTR's own is cost / (bytes x
 * staleness); the planner tries them all and keeps the fastest plan, since
 * which one wins depends on the graph. */
enum {
    RKM__DTR_H,        /* cost / (bytes x staleness) */
    RKM__DTR_H_EQ,     /* the same, cost counting evicted inputs to recompute too */
    RKM__DTR_COST,     /* cost / bytes: cheapest per byte */
    RKM__DTR_LRU,      /* 1 / staleness */
    RKM__DTR_SCORES
};

/* The score of evicting something that costs `cost` to recompute, holds
 * `bytes`, and was last touched `age` steps ago (>= 1). */
static double rkm__dtr_h(int score, double cost, uint64_t bytes, int64_t age)
{
    switch (score) {
    case RKM__DTR_COST: return cost / (double)bytes;
    case RKM__DTR_LRU: return 1.0 / (double)age;
    default: return cost / ((double)bytes * (double)age);
    }
}

/* The time to recompute tensor t: its producer, and for RKM__DTR_H_EQ the
 * producers of that op's inputs that are not live either. */
static double rkm__dtr_cost(const rkm__dtr *d, int32_t t)
{
    const rkm__op *o = &d->g->ops[d->g->tensors[t].producer];
    double c = o->fwd;
    if (d->score != RKM__DTR_H_EQ) return c;
    for (int32_t k = 0; k < o->n_in; k++) {
        const rkm__tensor *u = &d->g->tensors[o->in[k]];
        if (!d->s.D[o->in[k]] && u->producer >= 0) c += d->g->ops[u->producer].fwd;
    }
    return c;
}

/* The least of the (live, unpinned, non-empty) activations and saved
 * states to evict: cost / (bytes x staleness), ties to the lower id, a
 * tensor before a saved state. Returns 0 if there is none. */
static int rkm__dtr_victim(const rkm__dtr *d, int *is_op, int32_t *id)
{
    const rkm_graph *g = d->g;
    double best = 0;
    int found = 0;
    int64_t now = (int64_t)d->out.n;
    for (size_t t = 0; t < g->n_tensors; t++) {
        const rkm__tensor *x = &g->tensors[t];
        if (!d->s.D[t] || (x->flags & RKM_TENSOR_INPUT) || d->lock_t[t] || !x->bytes) continue;
        double h = rkm__dtr_h(d->score, rkm__dtr_cost(d, (int32_t)t), x->bytes, now - d->last_t[t] + 1);
        if (!found || h < best) best = h, found = 1, *is_op = 0, *id = (int32_t)t;
    }
    for (size_t i = 0; i < g->n_ops; i++) {
        if (!d->s.P[i] || d->lock_p[i]) continue;
        double h = rkm__dtr_h(d->score, g->ops[i].fwd, g->ops[i].phantom, now - d->last_p[i] + 1);
        if (!found || h < best) best = h, found = 1, *is_op = 1, *id = (int32_t)i;
    }
    return found;
}

/* A block of `bytes` for `owner` (see rkm__dtr.own) at the lowest offset
 * free in [0, budget) into *off; 0 when none is free (or out of memory:
 * d->failed). */
static int rkm__dtr_alloc(rkm__dtr *d, uint64_t bytes, int64_t owner, uint64_t *off)
{
    uint64_t lo = 0;
    size_t k = 0;
    for (; k < d->n_blk && d->at[k] - lo < bytes; k++) lo = d->end[k];
    if (k == d->n_blk && (lo > d->cap || d->cap - lo < bytes)) return 0;
    size_t c1 = d->cap_blk, c2 = d->cap_blk, c3 = d->cap_blk;
    if (!rkm__reserve(d->g->ctx, (void **)&d->at, &c1, d->n_blk + 1, sizeof *d->at) ||
        !rkm__reserve(d->g->ctx, (void **)&d->end, &c2, d->n_blk + 1, sizeof *d->end) ||
        !rkm__reserve(d->g->ctx, (void **)&d->own, &c3, d->n_blk + 1, sizeof *d->own)) {
        d->failed = -1;
        return 0;
    }
    d->cap_blk = c1 < c2 ? c1 : c2;
    d->cap_blk = d->cap_blk < c3 ? d->cap_blk : c3;
    memmove(d->at + k + 1, d->at + k, (d->n_blk - k) * sizeof *d->at);
    memmove(d->end + k + 1, d->end + k, (d->n_blk - k) * sizeof *d->end);
    memmove(d->own + k + 1, d->own + k, (d->n_blk - k) * sizeof *d->own);
    d->at[k] = lo, d->end[k] = lo + bytes, d->own[k] = owner;
    d->n_blk++;
    *off = lo;
    return 1;
}

/* Release the block at *off (none: UINT64_MAX). */
static void rkm__dtr_unalloc(rkm__dtr *d, uint64_t *off)
{
    if (*off == UINT64_MAX) return;
    size_t lo = 0, hi = d->n_blk;
    while (lo < hi) {
        size_t m = lo + (hi - lo) / 2;
        if (d->at[m] < *off) lo = m + 1;
        else hi = m;
    }
    memmove(d->at + lo, d->at + lo + 1, (d->n_blk - lo - 1) * sizeof *d->at);
    memmove(d->end + lo, d->end + lo + 1, (d->n_blk - lo - 1) * sizeof *d->end);
    memmove(d->own + lo, d->own + lo + 1, (d->n_blk - lo - 1) * sizeof *d->own);
    d->n_blk--;
    *off = UINT64_MAX;
}

/* One new buffer of the step being placed at *off (zero bytes: no block). */
static int rkm__dtr_take(rkm__dtr *d, uint64_t bytes, int64_t owner, uint64_t *off)
{
    return !bytes || rkm__dtr_alloc(d, bytes, owner, off);
}

/* The new buffers of compute step st, in the order a plan's layout records
 * them: placed (give 0), or given back after a failed placement (give 1:
 * a buffer of the step that is not live has a block only if this
 * placement made it). ws: the step's workspace (released after it).
 * Returns 0 when placed, else the bytes the step needs (at least 1). */
static uint64_t rkm__dtr_place(rkm__dtr *d, const rkm_step *st, uint64_t *ws, int give)
{
    const rkm_graph *g = d->g;
    int ok = 1;
    int64_t nt = (int64_t)g->n_tensors;
    uint64_t need = 0;
#define RKM__DTR_TAKE(bytes, owner, off) \
    (need += (bytes), give ? (rkm__dtr_unalloc(d, (off)), 1) : (ok = rkm__dtr_take(d, (bytes), (owner), (off))))
    if (!give) *ws = UINT64_MAX;
    if (st->kind == RKM_STEP_LOSS) {
        if (!d->s.loss_done) RKM__DTR_TAKE(g->tensors[st->index].bytes, -1, &d->off_g[st->index]);
    } else if (st->kind == RKM_STEP_FWD) {
        const rkm__op *o = &g->ops[st->index];
        for (int32_t k = 0; k < o->n_out && ok; k++)
            if (!d->s.D[o->out[k]]) RKM__DTR_TAKE(g->tensors[o->out[k]].bytes, o->out[k], &d->off_t[o->out[k]]);
        if (ok && st->save) RKM__DTR_TAKE(o->phantom, nt + st->index, &d->off_p[st->index]);
        if (ok) RKM__DTR_TAKE(rkm__sim_fwd_ws(&d->s, o, st->index, st->save), -1, ws);
    } else {
        const rkm__op *o = &g->ops[st->index];
        for (int32_t k = 0; k < o->n_in && ok; k++)
            if (g->tensors[o->in[k]].has_grad && !d->s.G[o->in[k]])
                RKM__DTR_TAKE(g->tensors[o->in[k]].bytes, -1, &d->off_g[o->in[k]]);
        if (ok) RKM__DTR_TAKE(o->bwd_ws, -1, ws);
    }
#undef RKM__DTR_TAKE
    if (!ok) rkm__dtr_place(d, st, ws, 1); /* its need: all of the step's new bytes */
    d->step_need = need;
    return ok ? 0 : need ? need : 1;
}

static void rkm__dtr_apply(rkm__dtr *d, int32_t kind, int32_t index, int32_t save);

/* Evict the cheapest run of arena blocks whose space, with the free gaps
 * around them, holds `need` contiguous bytes: the blocks must be live,
 * unpinned activations or saved states, and a run costs the sum of their
 * scores times their bytes (for DTR's own score, cost / staleness). What
 * one eviction at a time would free can be scattered; this frees a hole.
 * Returns 0 when no run holds `need`. */
static int rkm__dtr_window(rkm__dtr *d, uint64_t need)
{
    const rkm_graph *g = d->g;
    int64_t now = (int64_t)d->out.n, nt = (int64_t)g->n_tensors;
    if (!rkm__reserve(g->ctx, (void **)&d->cost, &d->cap_cost, d->n_blk + 1, sizeof *d->cost)) {
        d->failed = -1;
        return 0;
    }
    for (size_t k = 0; k < d->n_blk; k++) { /* each block's cost, or -1: it stays */
        int64_t w = d->own[k];
        uint64_t b = d->end[k] - d->at[k];
        if (w >= 0 && w < nt && d->s.D[w] && !d->lock_t[w])
            d->cost[k] = rkm__dtr_h(d->score, rkm__dtr_cost(d, (int32_t)w), b, now - d->last_t[w] + 1) * (double)b;
        else if (w >= nt && d->s.P[w - nt] && !d->lock_p[w - nt])
            d->cost[k] = rkm__dtr_h(d->score, g->ops[w - nt].fwd, b, now - d->last_p[w - nt] + 1) * (double)b;
        else
            d->cost[k] = -1;
    }
    size_t best_i = 0, best_j = 0, j = 0;
    double best = INFINITY, cost = 0;
    for (size_t i = 0; i < d->n_blk; i++) { /* runs i..j-1: the hole from block i-1's end to block j's start */
        uint64_t from = i ? d->end[i - 1] : 0;
        if (j < i) j = i, cost = 0;
        for (; j < d->n_blk && d->at[j] < from + need && d->cost[j] >= 0; j++) cost += d->cost[j];
        uint64_t to = j < d->n_blk ? d->at[j] : d->cap;
        if (to >= from + need && j > i && cost < best) best = cost, best_i = i, best_j = j;
        if (j > i) cost -= d->cost[i]; /* block i leaves the run */
    }
    if (!isfinite(best)) return 0;
    for (size_t k = best_i; k < best_j && !d->failed; k++) { /* evicting moves the later blocks down one */
        int64_t w = d->own[best_i];
        rkm__dtr_apply(d, w < nt ? RKM_STEP_FREE : RKM_STEP_FREE_SAVED, (int32_t)(w < nt ? w : w - nt), 0);
    }
    return 1;
}

/* Append a step and apply it (it is valid by construction: a rule broken
 * here is a bug, caught again at the plan's birth). */
static void rkm__dtr_apply(rkm__dtr *d, int32_t kind, int32_t index, int32_t save)
{
    rkm_step st = {kind, index, save, 0};
    uint64_t pk;
    int32_t obj;
    if (d->failed) return;
    if (!rkm__steps_push(&d->out, kind, index, save)) {
        d->failed = -1;
        return;
    }
    if (kind == RKM_STEP_FWD) d->time += d->g->ops[index].fwd;
    if (kind == RKM_STEP_BWD) d->time += d->g->ops[index].bwd;
    if (rkm__sim_step(&d->s, &st, &pk, &obj) != RKM_RULE_NONE || pk > d->budget || d->out.n > d->max_steps ||
        d->time > d->max_time)
        d->failed = 1;
    if (kind == RKM_STEP_FREE) rkm__dtr_unalloc(d, &d->off_t[index]);
    if (kind == RKM_STEP_FREE_SAVED) rkm__dtr_unalloc(d, &d->off_p[index]);
    if (kind == RKM_STEP_FREE_GRAD) rkm__dtr_unalloc(d, &d->off_g[index]);
}

/* Evict the least of rkm__dtr_victim; none left: the budget cannot be met. */
static void rkm__dtr_evict(rkm__dtr *d)
{
    int is_op = 0;
    int32_t id = -1;
    if (!rkm__dtr_victim(d, &is_op, &id)) d->failed = 1;
    else rkm__dtr_apply(d, is_op ? RKM_STEP_FREE_SAVED : RKM_STEP_FREE, id, 0);
}

/* Room for compute step (kind, index, save): evict until its new buffers
 * are placed in the arena, then run it; its workspace goes after it. */
static int rkm__dtr_run(rkm__dtr *d, int32_t kind, int32_t index, int32_t save)
{
    rkm_step st = {kind, index, save, 0};
    uint64_t ws = UINT64_MAX, need;
    while (!d->failed && (need = rkm__dtr_place(d, &st, &ws, 0)) != 0)
        if (!d->failed && !rkm__dtr_window(d, need)) rkm__dtr_evict(d); /* a hole for all of it, at the least cost */
    while (d->bytes_mode && !d->failed && d->s.mem + d->step_need > d->budget) rkm__dtr_evict(d); /* room by bytes */
    if (d->failed) return 0;
    rkm__dtr_apply(d, kind, index, save);
    rkm__dtr_unalloc(d, &ws);
    return !d->failed;
}

/* Free t if it is a live activation that nothing pins or will read. */
static void rkm__dtr_release(rkm__dtr *d, int32_t t)
{
    const rkm__tensor *x = &d->g->tensors[t];
    int needed = d->uses[t] > 0 || (t == d->g->loss && !d->s.loss_done);
    if (d->s.D[t] && !(x->flags & RKM_TENSOR_INPUT) && !d->lock_t[t] && !needed)
        rkm__dtr_apply(d, RKM_STEP_FREE, t, 0);
}

static void rkm__dtr_lock(rkm__dtr *d, const int32_t *list, int32_t n, int32_t by)
{
    for (int32_t k = 0; k < n; k++) d->lock_t[list[k]] += by;
}

static void rkm__dtr_touch(rkm__dtr *d, const int32_t *list, int32_t n)
{
    for (int32_t k = 0; k < n; k++) d->last_t[list[k]] = (int64_t)d->out.n;
}

static int rkm__dtr_ensure(rkm__dtr *d, int32_t t);

/* Make each tensor of list live and pin it, in order, until one cannot be;
 * returns how many were pinned (the caller unpins them with rkm__dtr_lock). */
static int32_t rkm__dtr_pin(rkm__dtr *d, const int32_t *list, int32_t n)
{
    int32_t k = 0;
    for (; k < n && !d->failed; k++) {
        rkm__dtr_ensure(d, list[k]);
        d->lock_t[list[k]]++;
    }
    return k;
}

/* Run op i's forward (save: with its saved state), making its inputs live
 * first; its outputs are left for the caller to use or release. */
static int rkm__dtr_forward(rkm__dtr *d, int32_t i, int save)
{
    const rkm__op *o = &d->g->ops[i];
    int32_t k = rkm__dtr_pin(d, o->in, o->n_in);
    if (!d->failed) rkm__dtr_run(d, RKM_STEP_FWD, i, save);
    rkm__dtr_lock(d, o->in, k, -1);
    rkm__dtr_touch(d, o->in, o->n_in);
    rkm__dtr_touch(d, o->out, o->n_out);
    if (save) d->last_p[i] = (int64_t)d->out.n;
    return !d->failed;
}

/* Make t live, recomputing its producer (and what that needs). */
static int rkm__dtr_ensure(rkm__dtr *d, int32_t t)
{
    if (d->failed) return 0;
    if (d->s.D[t]) return 1;
    if (d->depth > (int32_t)d->g->n_ops) return !(d->failed = 1);
    d->depth++;
    int32_t p = d->g->tensors[t].producer;
    int ok = rkm__dtr_forward(d, p, 0);
    d->depth--;
    if (ok) {
        const rkm__op *o = &d->g->ops[p];
        for (int32_t k = 0; k < o->n_out; k++)
            if (o->out[k] != t) rkm__dtr_release(d, o->out[k]);
    }
    return ok;
}

/* One op of the forward pass: run with its saved state if its backward
 * wants one, then drop what no later step reads. */
static void rkm__dtr_fwd_step(rkm__dtr *d, int32_t i)
{
    const rkm__op *o = &d->g->ops[i];
    if (!rkm__dtr_forward(d, i, rkm__saves_phantom(o))) return;
    for (int32_t k = 0; k < o->n_in; k++) d->uses[o->in[k]]--;
    for (int32_t k = 0; k < o->n_in + o->n_out; k++) rkm__dtr_release(d, o->in[k]);
}

static void rkm__dtr_loss(rkm__dtr *d)
{
    int32_t l = d->g->loss;
    if (!rkm__dtr_ensure(d, l)) return;
    d->lock_t[l]++;
    rkm__dtr_run(d, RKM_STEP_LOSS, l, 0);
    d->lock_t[l]--;
    rkm__dtr_release(d, l);
}

/* One backward: its saved state and saved tensors made live and pinned,
 * room for the new gradients, then everything it alone needed freed. */
static void rkm__dtr_bwd_step(rkm__dtr *d, int32_t i)
{
    const rkm_graph *g = d->g;
    const rkm__op *o = &g->ops[i];
    if (o->phantom > 0 && !d->s.P[i] && !rkm__dtr_forward(d, i, 1)) return;
    d->lock_p[i]++;
    int32_t k = rkm__dtr_pin(d, o->saved, o->n_saved);
    if (!d->failed) rkm__dtr_run(d, RKM_STEP_BWD, i, 0);
    d->lock_p[i]--;
    rkm__dtr_lock(d, o->saved, k, -1);
    if (d->failed) return;
    if (d->s.P[i]) rkm__dtr_apply(d, RKM_STEP_FREE_SAVED, i, 0);
    for (int32_t j = 0; j < o->n_out; j++)
        if (g->tensors[o->out[j]].has_grad) rkm__dtr_apply(d, RKM_STEP_FREE_GRAD, o->out[j], 0);
    for (int32_t j = 0; j < o->n_saved; j++) d->uses[o->saved[j]]--;
    for (int32_t j = 0; j < o->n_saved; j++) rkm__dtr_release(d, o->saved[j]);
    for (int32_t j = 0; j < o->n_in + o->n_out; j++) rkm__dtr_release(d, o->in[j]);
}

/* Whatever is still live at the end that the contract wants gone. */
static void rkm__dtr_end(rkm__dtr *d)
{
    const rkm_graph *g = d->g;
    for (size_t i = 0; i < g->n_ops && !d->failed; i++)
        if (d->s.P[i]) rkm__dtr_apply(d, RKM_STEP_FREE_SAVED, (int32_t)i, 0);
    for (size_t t = 0; t < g->n_tensors && !d->failed; t++)
        if (d->s.D[t] && !(g->tensors[t].flags & RKM_TENSOR_INPUT)) rkm__dtr_apply(d, RKM_STEP_FREE, (int32_t)t, 0);
}

static void rkm__dtr_free(rkm__dtr *d)
{
    rkm_context *ctx = d->g->ctx;
    size_t nt = d->g->n_tensors + 1, no = d->g->n_ops + 1;
    rkm__free(ctx, d->lock_t, (2 * nt + 2 * no) * sizeof(int64_t));
    rkm__free(ctx, d->off_t, (2 * nt + no) * sizeof *d->off_t);
    rkm__free(ctx, d->at, d->cap_blk * sizeof *d->at);
    rkm__free(ctx, d->end, d->cap_blk * sizeof *d->end);
    rkm__free(ctx, d->own, d->cap_blk * sizeof *d->own);
    rkm__free(ctx, d->cost, d->cap_cost * sizeof *d->cost);
    rkm__sim_free(&d->s);
    rkm__steps_free(&d->out);
}

/* Per tensor, the program's reads: forwards reading it, backwards saving it. */
static rkm_result rkm__dtr_init(rkm__dtr *d, const rkm_graph *g, uint64_t budget, int score, int bytes_mode,
                                double max_time)
{
    memset(d, 0, sizeof *d);
    d->g = g;
    d->budget = budget;
    d->bytes_mode = bytes_mode;
    d->cap = bytes_mode ? UINT64_MAX : budget;
    d->score = score;
    d->max_time = max_time;
    d->out.ctx = g->ctx;
    d->max_steps = 16 * (2 * g->n_ops + g->n_tensors) + 64;
    size_t nt = g->n_tensors + 1, no = g->n_ops + 1;
    int64_t *mem = rkm__calloc(g->ctx, 2 * nt + 2 * no, sizeof(int64_t));
    if (!mem) return rkm__nomem(g->ctx, "dtr");
    /* int32 arrays share the int64 allocation's first half */
    d->lock_t = (int32_t *)mem;
    d->lock_p = d->lock_t + nt;
    d->uses = d->lock_p + no;
    d->last_t = mem + nt + no;
    d->last_p = d->last_t + nt;
    d->off_t = rkm__alloc(g->ctx, (2 * nt + no) * sizeof *d->off_t);
    rkm_result r = d->off_t ? rkm__sim_init(g, &d->s) : rkm__nomem(g->ctx, "dtr");
    if (r) {
        rkm__free(g->ctx, mem, (2 * nt + 2 * no) * sizeof(int64_t));
        rkm__free(g->ctx, d->off_t, (2 * nt + no) * sizeof *d->off_t);
        d->lock_t = NULL;
        d->off_t = NULL;
        return r;
    }
    d->off_g = d->off_t + nt;
    d->off_p = d->off_g + nt;
    for (size_t i = 0; i < 2 * nt + no; i++) d->off_t[i] = UINT64_MAX;
    for (size_t t = 0; t < g->n_tensors && d->failed == 0; t++) /* the inputs first, as a plan's layout has them */
        if ((g->tensors[t].flags & RKM_TENSOR_INPUT) && g->tensors[t].bytes &&
            !rkm__dtr_alloc(d, g->tensors[t].bytes, -1, &d->off_t[t]) && !d->failed)
            d->failed = 1;
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *o = &g->ops[i];
        for (int32_t k = 0; k < o->n_in; k++) d->uses[o->in[k]]++;
        if (o->has_bwd)
            for (int32_t k = 0; k < o->n_saved; k++) d->uses[o->saved[k]]++;
    }
    return RKM_OK;
}

/* DTR's steps for `budget` with eviction score `score` into *draft;
 * draft->n == 0 when it cannot meet the budget. */
static rkm_result rkm__dtr_steps(const rkm_graph *g, uint64_t budget, int score, int bytes_mode, double max_time,
                                 rkm__steps *draft)
{
    rkm__dtr d;
    rkm_result r = rkm__dtr_init(&d, g, budget, score, bytes_mode, max_time);
    if (r) return r;
    for (size_t i = 0; i < g->n_ops && !d.failed; i++) rkm__dtr_fwd_step(&d, (int32_t)i);
    if (!d.failed) rkm__dtr_loss(&d);
    for (size_t i = g->n_ops; i-- > 0 && !d.failed;)
        if (g->ops[i].has_bwd) rkm__dtr_bwd_step(&d, (int32_t)i);
    if (!d.failed) rkm__dtr_end(&d);
    if (d.failed < 0) r = rkm__nomem(g->ctx, "dtr");
    if (!d.failed) {
        *draft = d.out;
        d.out.s = NULL;
        d.out.n = d.out.cap = 0;
    }
    rkm__dtr_free(&d);
    return r;
}

/* ===========================================================================
 * 12. Planner: algorithms, flattening, budgets
 * ========================================================================= */

#define RKM_DEFAULT_SLOTS 1000
#define RKM_DEFAULT_TIME_LIMIT 60.0
#define RKM_DEFAULT_ILP_TIME_LIMIT 0.03
#define RKM_DEFAULT_PEAK_POINTS 5
#define RKM_DEFAULT_KEPT_POINTS 10
#define RKM_DEFAULT_NEST_OPS 24
#define RKM_DEFAULT_ILP_BUDGET 2.0
#define RKM_MAX_ALIGNMENT ((uint64_t)1 << 30)
/* Plans for a budget whose arena is over it: planned again for that much
 * less, this many times at most (the first arena misses the aligned peak on
 * about one plan in ten, and the next fits). */
#define RKM_LAYOUT_TRIES 4

struct rkm_planner {
    const rkm_graph *g;      /* what it plans with: the user's graph, sizes rounded up to the alignment */
    const rkm_graph *user;   /* the user's graph: its plans are born there */
    rkm_graph *own;          /* g when it is a copy (sizes not already multiples of the alignment) */
    rkm_context *ctx;
    rkm_solve_desc d;
    uint64_t base_peak;      /* the graph's figures */
    double base_time;
    uint64_t lower_bound;
    double t0;               /* planner creation time: the time budget runs from here */
    rkm__bopts *bo;          /* per block, NULL for checkmate and none */
    uint64_t q;              /* bytes per DP slot */
    rkm__dp_block *dpb;      /* the chain in slots */
    rkm__dp_option *dpo;
    size_t n_dpo;
    rkm__dp_table table;     /* built once, for M = slots (rotor, rockmate) */
    double create_seconds;
    rkm__ilp_stats ilp;      /* ILP counters */
    uint64_t min_budget;     /* cached by rkm_planner_min_budget; 0: not yet */
    rkm_plan *min_plan;      /* the plan that meets it (handed out: laid out, on the user's graph) */
    uint64_t dtr_min;        /* DTR's smallest budget, once bisected; 0: not yet */
    uint64_t dtr_min_at;     /* the budget DTR made that plan for (in place, its peak is lower) */
    int32_t ilp_skipped;     /* block ILP solves left out: time_limit ran out */
    uint64_t chain_floor;    /* the least peak of the chain DP's plans, once scanned; 0: not yet */
    int64_t chain_floor_slots; /* the slot budget whose plan peaks there */
    int32_t depth;           /* 0; a nested planner (one block planned as a graph): its parent's + 1 */
    double pool;             /* block ILP work left (d.ilp_budget at first), in seconds of its calibration */
    int32_t nested;          /* classes whose options came from a nested planner */
    uint64_t kick_work;      /* the kicks' squeeze work per solve (bench/bench_kick sets 0 to compare) */
};

/* The planner's figures so far, ILP counters included. */
static void rkm__planner_figures(const rkm_planner *pl, rkm_planner_stats *st)
{
    memset(st, 0, sizeof *st);
    st->algo = pl->d.algo;
    st->blocks = pl->g->n_blocks;
    st->block_classes = pl->g->n_classes;
    st->options = (int32_t)pl->n_dpo;
    st->ilp_solves = pl->ilp.solves;
    st->ilp_optimal = pl->ilp.optimal;
    st->ilp_suboptimal = pl->ilp.suboptimal;
    st->ilp_infeasible = pl->ilp.infeasible;
    st->ilp_timeout = pl->ilp.timeout;
    st->ilp_failed = pl->ilp.failed;
    st->ilp_skipped = pl->ilp_skipped;
    st->ilp_seconds = pl->ilp.seconds;
    st->create_seconds = pl->create_seconds;
    st->nested_classes = pl->nested;
}

static uint64_t rkm__ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* Bytes and DP slots: the planner's only conversions. A slot is pl->q
 * bytes above the input tensors (always live). */

/* Slots for a byte count, rounded up (so the DP never under-counts). */
static int32_t rkm__slots_up(const rkm_planner *pl, uint64_t bytes)
{
    uint64_t s = rkm__ceil_div(bytes, pl->q);
    return s > INT32_MAX / 4 ? INT32_MAX / 4 : (int32_t)s;
}

/* The slots a budget (absolute bytes) affords, rounded down and at most the
 * table's; -1 when the inputs alone do not fit. */
static int64_t rkm__budget_slots(const rkm_planner *pl, uint64_t budget)
{
    if (budget < pl->g->input_bytes) return -1;
    uint64_t m = (budget - pl->g->input_bytes) / pl->q;
    return m > (uint64_t)pl->d.slots ? pl->d.slots : (int64_t)m;
}

/* The absolute bytes of m slots: the budget they stand for. */
static uint64_t rkm__slots_budget(const rkm_planner *pl, int64_t m) { return pl->g->input_bytes + (uint64_t)m * pl->q; }

/* The DP's view of the chain: every figure converted to slots, the one
 * place where block figures (absolute bytes, section 8) become the DP's
 * (slots above the inputs, section 10): tensor sizes round up on their own,
 * memory figures round up once the inputs are taken off. */
static rkm_result rkm__planner_chain(rkm_planner *pl)
{
    const rkm_graph *g = pl->g;
    size_t n_opt = 0;
    for (int32_t b = 0; b < g->n_blocks; b++) n_opt += pl->bo[b].n_opt;
    pl->dpb = rkm__calloc(pl->ctx, (size_t)g->n_blocks, sizeof *pl->dpb);
    pl->dpo = rkm__calloc(pl->ctx, n_opt, sizeof *pl->dpo);
    pl->n_dpo = n_opt;
    if (!pl->dpb || !pl->dpo) return rkm__nomem(pl->ctx, "planner");
    size_t at = 0;
    for (int32_t b = 0; b < g->n_blocks; b++) {
        const rkm__block *k = &g->blocks[b];
        const rkm__bopts *bo = &pl->bo[b];
        rkm__dp_block *x = &pl->dpb[b];
        x->in_sz = k->in >= 0 ? rkm__slots_up(pl, g->tensors[k->in].bytes) : 0;
        x->g_out = k->out != g->loss ? rkm__slots_up(pl, g->tensors[k->out].bytes) : 0;
        x->tfn = bo->tfn;
        x->pfn = rkm__slots_up(pl, bo->pfn - g->input_bytes);
        uint64_t out_bytes = g->tensors[k->out].bytes;
        x->opt = pl->dpo + at;
        x->n_opt = (int32_t)bo->n_opt;
        for (size_t i = 0; i < bo->n_opt; i++, at++) {
            const rkm__option *o = &bo->opt[i];
            rkm__dp_option *y = &pl->dpo[at];
            y->tf = o->tf;
            y->tb = o->tb;
            /* The DP's kept is besides x_{i-1} and x_i; x_in rounds up with
             * it, as the DP subtracts them together. */
            y->kept = rkm__slots_up(pl, o->kept - out_bytes - g->input_bytes) - x->in_sz;
            y->pf = rkm__slots_up(pl, o->pf - g->input_bytes);
            y->pb = rkm__slots_up(pl, o->pb - g->input_bytes);
        }
    }
    return RKM_OK;
}

/* Turn block-level operations into graph-level steps. */
static rkm_result rkm__flatten(const rkm_planner *pl, const rkm__dp_op *ops, size_t n, rkm__steps *p)
{
    const rkm_graph *g = pl->g;
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        const rkm__bopts *bo = &pl->bo[ops[i].block];
        const rkm_step *s = NULL;
        size_t m = 0;
        switch (ops[i].kind) {
        case RKM__DP_FWD_OPT: s = bo->opt[ops[i].option].steps, m = bo->opt[ops[i].option].n_fwd; break;
        case RKM__DP_BWD_OPT:
            s = bo->opt[ops[i].option].steps + bo->opt[ops[i].option].n_fwd, m = bo->opt[ops[i].option].n_bwd;
            break;
        case RKM__DP_FWD_NOSAVE: s = bo->nosave, m = bo->n_nosave; break;
        case RKM__DP_FREE_OUT: ok = rkm__steps_push(p, RKM_STEP_FREE, g->blocks[ops[i].block].out, 0); break;
        }
        for (size_t k = 0; k < m && ok; k++) ok = rkm__steps_push(p, s[k].kind, s[k].index, s[k].save);
    }
    return ok ? RKM_OK : rkm__nomem(pl->ctx, "plan");
}

static double rkm__elapsed(const rkm_planner *pl) { return rkm__now() - pl->t0; }

/* Peak a block's ops need at least: the inputs stay live throughout, plus
 * the largest single step. */
static uint64_t rkm__block_floor(const rkm_graph *g, const rkm__block *b)
{
    uint64_t need = 0;
    for (int32_t i = b->ops[0]; i <= b->ops[b->n_ops - 1]; i++) {
        const rkm__op *o = &g->ops[i];
        uint64_t f = rkm__bytes_union(g, o->in, o->n_in, o->out, o->n_out, 0) + rkm__fwd_ws_most(o);
        uint64_t k = o->has_bwd ? rkm__bytes_union(g, o->saved, o->n_saved, NULL, 0, 0) + o->phantom + o->bwd_ws +
                                      rkm__bytes_union(g, o->out, o->n_out, o->in, o->n_in, 1)
                                : 0;
        if (f > need) need = f;
        if (k > need) need = k;
    }
    return g->input_bytes + need;
}

/* Add a schedule found on block `from` to every block of its class. */
static rkm_result rkm__class_add(rkm_planner *pl, rkm__sim *s, const rkm__block *from, const rkm_step *steps, size_t nf,
                                 size_t nb)
{
    const rkm_graph *g = pl->g;
    for (int32_t k = 0; k < g->n_blocks; k++) {
        if (g->blocks[k].cls != from->cls) continue;
        rkm__option o;
        memset(&o, 0, sizeof o);
        o.n_fwd = nf;
        o.n_bwd = nb;
        o.steps = rkm__alloc(pl->ctx, (nf + nb) * sizeof *o.steps);
        if (!o.steps) return rkm__nomem(pl->ctx, "block options");
        for (size_t t = 0; t < nf + nb; t++) o.steps[t] = rkm__map_step(g, from, &g->blocks[k], steps[t]);
        int valid;
        if (!rkm__bopts_add(pl->ctx, s, &g->blocks[k], &pl->bo[k], &o, &valid)) return rkm__nomem(pl->ctx, "block options");
    }
    return RKM_OK;
}

/* Blocks of more ops than this have no block ILP when a nested planner
 * gave them options: the ILP reaches its work limit on them (U-Nets' blocks
 * of 27 and 37 ops: 14 of 23 solves) and its options are the nested ones'
 * or worse. */
#define RKM_ILP_FLAT_OPS 24
/* Blocks of more ops than this get no block ILP at all (their options are
 * the two extremes, and the nested planner's where they nest): every solve
 * reached its work limit on them (dag60's 59-op block: 6 of 6; a 100-op
 * random DAG's 99-op block: 10 of 10, 0.13 s each, planning 1.4 s), and the
 * chain DP's plan with those options stayed at 650 % overhead. DTR, the
 * squeeze and (up to 64 ops) the whole-graph ILP plan such graphs: without
 * these solves the 100-op DAG plans in 0.06..0.18 s, no slower at 90..45 %
 * (15.63 -> 14.92 % at 45 %), dag60 in half the time, 0.1 % slower once
 * (16.51 -> 16.62 % at 50 %). */
#define RKM_ILP_MAX_OPS 48
#define RKM_ILP_MIN_SHARE 0.1
/* rockmate's DTR candidates: on graphs of at most this many ops x tensors
 * (about 6000 ops; gpt2-xl has 485) */
#define RKM_DTR_MAX_WORK 4e7
static rkm_result rkm__nest_options(rkm_planner *pl, rkm__sim *s, const rkm__block *b, uint64_t peak_lo,
                                    uint64_t peak_hi, double allow, int *nested);

/* A class's claim on the block ILP budget: its blocks' forward time (what
 * recomputing can cost, so what a better option can save) times its ops
 * (what a solve of its block takes); never 0 for a block with ops. */
static double rkm__class_weight(const rkm_planner *pl, int32_t cls)
{
    const rkm_graph *g = pl->g;
    double w = 0;
    for (int32_t k = 0; k < g->n_blocks; k++) {
        const rkm__block *b = &g->blocks[k];
        if (b->cls != cls) continue;
        double fwd = pl->base_time * 1e-6;
        for (int32_t j = 0; j < b->n_ops; j++) fwd += g->ops[b->ops[j]].fwd;
        w += fwd * b->n_ops;
    }
    return w;
}

/* ILP options of block b's class, from `allow` seconds of solver work (the
 * class's share): solve on b over a grid of (peak_budget, kept_budget) pairs
 * and replay every schedule on every block of the class (mapped op for op);
 * replay decides what becomes an option. Per peak budget the kept budgets
 * go from loose to tight: a schedule that already fits a tighter kept
 * budget is that budget's answer too (the optimum of a looser problem that
 * is feasible in a tighter one), and a proven infeasible kept budget ends
 * the row. A solve gets at most ilp_time_limit, and what is left of the
 * share and of time_limit; once either is spent the rest are left out. */
static rkm_result rkm__class_ilp(rkm_planner *pl, rkm__sim *s, const rkm__block *b, uint64_t peak_lo, uint64_t peak_hi,
                                 double allow)
{
    const rkm_graph *g = pl->g;
    const rkm__option all = pl->bo[b - g->blocks].opt[0]; /* copied: adding options may move the array */
    /* kept when nothing but the inputs, x_in and x_out is */
    uint64_t kept_lo = g->input_bytes + (b->in >= 0 ? g->tensors[b->in].bytes : 0) + g->tensors[b->out].bytes;
    rkm__ilp_block *ib;
    rkm_result r = rkm__ilp_block_create(g, b->ops, b->n_ops, b->in, b->out, b->out == g->loss, &ib);
    if (r) return r;
    int32_t np = pl->d.ilp_peak_points, nk = pl->d.ilp_kept_points;
    double work0 = pl->ilp.work;
    for (int32_t i = 0; i < np && !r; i++) {
        double fp = np > 1 ? (double)i / (np - 1) : 1.0;
        uint64_t peak_budget = peak_lo + (uint64_t)((double)(peak_hi - peak_lo) * fp);
        uint64_t kept = UINT64_MAX; /* kept memory of the row's last schedule */
        for (int32_t j = nk - 1; j >= 0 && !r; j--) {
            double left = pl->d.time_limit - rkm__elapsed(pl), share = allow - (pl->ilp.work - work0);
            double fk = nk > 1 ? (double)j / (nk - 1) : 1.0;
            uint64_t kept_budget = kept_lo + (uint64_t)((double)(all.kept - kept_lo) * fk);
            if (kept <= kept_budget) continue;
            if (left <= 0 || share <= 0) {
                pl->ilp_skipped++;
                continue;
            }
            rkm_step *steps = NULL;
            size_t nf = 0, nb = 0;
            int found = 0;
            double lim = fmin(pl->d.ilp_time_limit, fmin(left, share));
            r = rkm__ilp_block_solve(ib, peak_budget, kept_budget, lim, &steps, &nf, &nb, &pl->ilp, &found);
            if (!r && !found && pl->ilp.proven) break;
            if (r || !found) continue;
            rkm__option o = {steps, nf, nb, 0, 0, 0, 0, 0, 0};
            if (rkm__option_measure(s, b, &o)) kept = o.kept;
            r = rkm__class_add(pl, s, b, steps, nf, nb);
            rkm__free(pl->ctx, steps, (nf + nb) * sizeof *steps);
        }
    }
    rkm__ilp_block_destroy(ib);
    return r;
}

/* Options of one class, solved on its first block: a nested planner's
 * where the block nests, the block ILP's unless the nested planner covered
 * a block too big for it or the block is too big for the ILP at all. The
 * class spends the block ILP budget left times its weight w over wl, its
 * own and that of the classes still to come, so what one class leaves goes
 * to the next. */
static rkm_result rkm__class_options(rkm_planner *pl, rkm__sim *s, int32_t cls, double w, double wl)
{
    const rkm_graph *g = pl->g;
    int32_t rep = 0;
    while (g->blocks[rep].cls != cls) rep++;
    const rkm__block *b = &g->blocks[rep];
    /* The block's baseline (its only option yet) bounds the grid. */
    const rkm__option *all = &pl->bo[rep].opt[0];
    uint64_t peak_hi = all->pf > all->pb ? all->pf : all->pb, peak_lo = rkm__block_floor(g, b);
    if (peak_lo > peak_hi) peak_lo = peak_hi;
    double work0 = pl->ilp.work, allow = pl->pool * w / wl;
    int nested = 0;
    rkm_result r = rkm__nest_options(pl, s, b, peak_lo, peak_hi, allow, &nested);
    double left = allow - (pl->ilp.work - work0);
    if (!r && !(nested && b->n_ops > RKM_ILP_FLAT_OPS) && b->n_ops <= RKM_ILP_MAX_OPS) {
        /* a share below a tenth of one solve's limit buys no solve but costs
         * the model's build (a chain of 5000 distinct blocks: 17 s of it);
         * it is spent all the same, or the last of many such classes would
         * get the others' and build after all */
        if (left < RKM_ILP_MIN_SHARE * pl->d.ilp_time_limit) {
            pl->ilp_skipped += pl->d.ilp_peak_points * pl->d.ilp_kept_points;
            pl->pool = fmax(0, pl->pool - left);
        } else
            r = rkm__class_ilp(pl, s, b, peak_lo, peak_hi, left);
    }
    pl->pool = fmax(0, pl->pool - (pl->ilp.work - work0));
    return r;
}

/* Every class's options, heaviest class first (by rkm__class_weight, then
 * in order): what it leaves of its share goes to the lighter ones, which
 * often need less than they would be given (peer-gpt: with the default
 * budget, lightest first leaves 12 of 72 solves out, heaviest first none). */
static rkm_result rkm__planner_classes(rkm_planner *pl, rkm__sim *s)
{
    int32_t n = pl->g->n_classes;
    double *w = rkm__alloc(pl->ctx, (size_t)n * sizeof *w), wl = 0;
    int32_t *order = rkm__alloc(pl->ctx, (size_t)n * sizeof *order);
    rkm_result r = w && order ? RKM_OK : rkm__nomem(pl->ctx, "planner");
    for (int32_t c = 0; c < n && !r; c++) {
        w[c] = rkm__class_weight(pl, c);
        wl += w[c];
        int32_t k = c; /* insertion, stable: equal weights keep their order */
        for (; k > 0 && w[order[k - 1]] < w[c]; k--) order[k] = order[k - 1];
        order[k] = c;
    }
    for (int32_t i = 0; i < n && !r; i++) {
        r = rkm__class_options(pl, s, order[i], w[order[i]], wl);
        wl -= w[order[i]];
    }
    rkm__free(pl->ctx, w, (size_t)n * sizeof *w);
    rkm__free(pl->ctx, order, (size_t)n * sizeof *order);
    return r;
}

/* Every block's options: the two extremes, and for rockmate the ILP's. */
static rkm_result rkm__planner_options(rkm_planner *pl)
{
    const rkm_graph *g = pl->g;
    pl->bo = rkm__calloc(pl->ctx, (size_t)g->n_blocks, sizeof *pl->bo);
    if (!pl->bo) return rkm__nomem(pl->ctx, "planner");
    rkm__sim s;
    rkm_result r = rkm__sim_init(g, &s);
    for (int32_t b = 0; b < g->n_blocks && !r; b++) r = rkm__bopts_extremes(&s, &g->blocks[b], &pl->bo[b]);
    if (!r && pl->d.algo == RKM_ALGO_ROCKMATE) r = rkm__planner_classes(pl, &s);
    if (pl->ilp_skipped && !pl->depth)
        rkm__log(pl->ctx, RKM_LOG_WARN,
                 "%s ran out: %d block ILP solves left out; plans may be worse",
                 rkm__elapsed(pl) >= pl->d.time_limit ? "the time limit" : "the block ILP budget (ilp_budget)",
                 (int)pl->ilp_skipped);
    if (pl->ilp.solves > 0 && pl->ilp.timeout == pl->ilp.solves && !pl->depth)
        rkm__log(pl->ctx, RKM_LOG_WARN,
                 "every block ILP solve (%d) reached its work limit (ilp_time_limit %g s): the options are the "
                 "solver's best within it; a larger ilp_time_limit may find better ones",
                 (int)pl->ilp.solves, pl->d.ilp_time_limit);
    for (int32_t b = 0; b < g->n_blocks && !r; b++)
        qsort(pl->bo[b].opt, pl->bo[b].n_opt, sizeof *pl->bo[b].opt, rkm__option_cmp);
    if (s.g) rkm__sim_free(&s);
    return r;
}

void rkm_planner_destroy(rkm_planner *pl)
{
    if (!pl) return;
    if (pl->bo)
        for (int32_t b = 0; b < pl->g->n_blocks; b++) rkm__bopts_free(pl->ctx, &pl->bo[b]);
    rkm__free(pl->ctx, pl->bo, (size_t)pl->g->n_blocks * sizeof *pl->bo);
    rkm__free(pl->ctx, pl->dpb, (size_t)pl->g->n_blocks * sizeof *pl->dpb);
    rkm__free(pl->ctx, pl->dpo, pl->n_dpo * sizeof *pl->dpo);
    rkm__dp_table_free(pl->ctx, &pl->table);
    rkm_plan_destroy(pl->min_plan);
    rkm_graph_destroy(pl->own);
    rkm__free(pl->ctx, pl, sizeof *pl);
}

#ifdef RKM_OMIT_SOLVER
#define RKM__ALGO_BEST RKM_ALGO_ROTOR
#else
#define RKM__ALGO_BEST RKM_ALGO_ROCKMATE
#endif

/* A count option: 0 means default; negative refused. */
static rkm_result rkm__desc_count(rkm_context *ctx, const char *what, int32_t *v, int32_t dflt)
{
    if (*v < 0) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: %s is %d (positive, or 0 for the default)", what, (int)*v);
    if (*v == 0) *v = dflt;
    return RKM_OK;
}

/* A seconds option: 0 means default; negative, NaN or infinite refused. */
static rkm_result rkm__desc_seconds(rkm_context *ctx, const char *what, double *v, double dflt)
{
    if (!(*v >= 0) || !isfinite(*v))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: %s is %g (finite and positive, or 0 for the default)", what, *v);
    if (*v == 0) *v = dflt;
    return RKM_OK;
}

static rkm_result rkm__desc_defaults(const rkm_graph *g, const rkm_solve_desc *desc, rkm_solve_desc *d)
{
    memset(d, 0, sizeof *d);
    if (desc) *d = *desc;
    rkm_context *ctx = g->ctx;
    if ((int)d->algo < 0 || d->algo >= RKM_ALGO_COUNT)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: algorithm %d does not exist", (int)d->algo);
    if (d->algo == RKM_ALGO_DEFAULT) d->algo = RKM__ALGO_BEST;
    rkm_result r;
    if ((r = rkm__desc_count(ctx, "slots", &d->slots, RKM_DEFAULT_SLOTS)) ||
        (r = rkm__desc_count(ctx, "ilp_peak_points", &d->ilp_peak_points, RKM_DEFAULT_PEAK_POINTS)) ||
        (r = rkm__desc_count(ctx, "ilp_kept_points", &d->ilp_kept_points, RKM_DEFAULT_KEPT_POINTS)) ||
        (r = rkm__desc_seconds(ctx, "time_limit", &d->time_limit, RKM_DEFAULT_TIME_LIMIT)) ||
        (r = rkm__desc_seconds(ctx, "ilp_time_limit", &d->ilp_time_limit, RKM_DEFAULT_ILP_TIME_LIMIT)) ||
        (r = rkm__desc_seconds(ctx, "ilp_budget", &d->ilp_budget, RKM_DEFAULT_ILP_BUDGET)))
        return r;
    if (d->alignment == 0) d->alignment = RKM_ARENA_ALIGN;
    if ((d->alignment & (d->alignment - 1)) || d->alignment > RKM_MAX_ALIGNMENT)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "solve desc: alignment %llu is not a power of two up to %llu",
                        (unsigned long long)d->alignment, (unsigned long long)RKM_MAX_ALIGNMENT);
    if (d->nest_ops == 0) d->nest_ops = RKM_DEFAULT_NEST_OPS;
    if (d->nest_ops < 0) d->nest_ops = INT32_MAX;
#ifdef RKM_OMIT_SOLVER
    if (d->algo == RKM_ALGO_ROCKMATE || d->algo == RKM_ALGO_CHECKMATE)
        return rkm__err(ctx, RKM_ERROR_UNSUPPORTED, "solve: %s needs lp_solve, left out by RKM_OMIT_SOLVER",
                        rkm_algo_name(d->algo));
#endif
    return RKM_OK;
}

static rkm_result rkm__planner_dp(rkm_planner *pl);

static uint64_t rkm__kick_work(const rkm_graph *g);

static int rkm__uses_chain(rkm_algo a) { return a == RKM_ALGO_ROCKMATE || a == RKM_ALGO_ROTOR || a == RKM_ALGO_SQRT; }

/* A planner for g with settings d (defaults applied), `depth` levels
 * below the one the user made: nested planners do not log. */
static rkm_result rkm__planner_make(const rkm_graph *g, const rkm_solve_desc *desc, int32_t depth, rkm_planner **out)
{
    const rkm_solve_desc d = *desc;
    rkm_result r = RKM_OK;
    const rkm_graph_stats gs = g->stats;
    rkm_planner *pl = rkm__calloc(g->ctx, 1, sizeof *pl);
    if (!pl) return rkm__nomem(g->ctx, "rkm_planner_create");
    pl->g = pl->user = g;
    pl->ctx = g->ctx;
    pl->d = d;
    pl->depth = depth;
    pl->pool = d.ilp_budget;
    pl->kick_work = rkm__kick_work(g);
    pl->t0 = rkm__now();
    pl->base_peak = gs.baseline_peak;
    pl->base_time = gs.baseline_time;
    pl->lower_bound = gs.lower_bound;
    uint64_t span = gs.baseline_peak - g->input_bytes;
    pl->q = span ? rkm__ceil_div(span, (uint64_t)d.slots) : 1;
    if (rkm__uses_chain(d.algo)) {
        r = rkm__planner_options(pl);
        if (!r) r = rkm__planner_chain(pl);
        if (!r && !depth)
            rkm__log(pl->ctx, RKM_LOG_INFO, "%s: %d blocks in %d classes, %zu options (%d classes nested); %d ILP "
                     "solves in %.3f s", rkm_algo_name(d.algo), (int)g->n_blocks, (int)g->n_classes, pl->n_dpo,
                     (int)pl->nested, (int)pl->ilp.solves, pl->ilp.seconds);
        double t = rkm__now();
        if (!r && d.algo != RKM_ALGO_SQRT) r = rkm__planner_dp(pl);
        if (!r && d.algo != RKM_ALGO_SQRT && !depth)
            rkm__log(pl->ctx, RKM_LOG_INFO, "chain DP: %d blocks x %d slots (%llu bytes each) in %.3f s", (int)g->n_blocks,
                     (int)d.slots, (unsigned long long)pl->q, rkm__now() - t);
    }
    if (r) {
        rkm_planner_destroy(pl);
        return r;
    }
    pl->create_seconds = rkm__elapsed(pl);
    *out = pl;
    return RKM_OK;
}

rkm_result rkm_planner_create(const rkm_graph *g, const rkm_solve_desc *desc, rkm_planner **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_create: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_planner_create");
    if (r) return r;
    rkm_solve_desc d;
    rkm_graph *ag;
    if ((r = rkm__desc_defaults(g, desc, &d)) || (r = rkm__graph_aligned(g, d.alignment, &ag))) return r;
    if ((r = rkm__planner_make(ag ? ag : g, &d, 0, out))) {
        rkm_graph_destroy(ag);
        return r;
    }
    (*out)->user = g;
    (*out)->own = ag;
    return RKM_OK;
}

/* The chain DP's table, if it fits under RKM_DP_MAX_BYTES. Rotor without it
 * has nothing to plan with: refused, with the figure and the knob. Rockmate
 * goes on without the chain DP (sqrt, DTR), with a warning. */
static rkm_result rkm__planner_dp(rkm_planner *pl)
{
    int32_t n = pl->g->n_blocks, M = pl->d.slots;
    double need = rkm__dp_bytes(pl->dpb, n, M);
    if (need <= RKM_DP_MAX_BYTES) return rkm__dp_solve(pl->ctx, pl->dpb, n, M, &pl->table);
    if (pl->d.algo == RKM_ALGO_ROCKMATE) {
        rkm__log(pl->ctx, RKM_LOG_WARN, "chain DP left out: %d blocks x %d slots would take %.3g GiB (the cap is %.3g GiB)",
                 (int)n, (int)M, need / 1073741824.0, RKM_DP_MAX_BYTES / 1073741824.0);
        return RKM_OK;
    }
    int32_t fit = M;
    while (fit > 1 && rkm__dp_bytes(pl->dpb, n, fit) > RKM_DP_MAX_BYTES) fit /= 2;
    char hint[96];
    if (rkm__dp_bytes(pl->dpb, n, fit) <= RKM_DP_MAX_BYTES)
        snprintf(hint, sizeof hint, "use %d slots or fewer (rkm_solve_desc.slots, --slots)", (int)fit);
    else
        snprintf(hint, sizeof hint, "the chain has too many blocks for the DP at any slot count");
    return rkm__err(pl->ctx, RKM_ERROR_NOMEM,
                    "chain DP: %d blocks x %d slots would take %.3g GiB, over the planner's cap of %.3g GiB: %s, or "
                    "plan with rockmate or dtr",
                    (int)n, (int)M, need / 1073741824.0, RKM_DP_MAX_BYTES / 1073741824.0, hint);
}

/* Birth of a draft the planner made (taken): an invalid one is a bug. */
static rkm_result rkm__planned_birth(rkm_planner *pl, rkm__steps *draft, rkm_plan **out)
{
    rkm_result r = rkm__lower_inplace(pl->g, draft);
    if (r) {
        rkm__steps_free(draft);
        return r;
    }
    r = rkm__plan_birth(pl->g, draft, NULL, out);
    if (r != RKM_ERROR_PLAN) return r;
    char why[RKM_ERRMSG_SIZE];
    snprintf(why, sizeof why, "%s", rkm_context_errmsg(pl->ctx));
    return rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: the %s plan does not replay: %s",
                    rkm_algo_name(pl->d.algo), why);
}

static rkm_result rkm__planner_try(rkm_planner *pl, uint64_t budget, rkm_plan **out);

/* The planner's plan p (taken) as the host gets it: born on the user's
 * graph (p is of the aligned one, unless they are the same) and laid out
 * at the desc's alignment. */
static rkm_result rkm__planner_handout(rkm_planner *pl, rkm_plan *p, rkm_plan **out)
{
    *out = NULL;
    rkm_result r = RKM_OK;
    if (pl->g != pl->user) {
        rkm__steps d;
        r = rkm__steps_copy(pl->ctx, p->steps, p->n_steps, &d, "plan");
        if (!r && (r = rkm__plan_birth(pl->user, &d, NULL, out)) == RKM_ERROR_PLAN)
            r = rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: the %s plan does not replay on the user's graph",
                         rkm_algo_name(pl->d.algo));
        if (!r) (*out)->stats.gap = p->stats.gap;
        rkm_plan_destroy(p);
        if (r) return r;
    } else
        *out = p;
    if ((r = rkm__plan_seal(*out, pl->d.alignment))) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* A plan for `budget` whose arena fits it, or *out NULL: the algorithm's
 * plan for the budget (its peak, counted at the alignment, within it), and
 * where that plan's layout misses its aligned peak by more than the room
 * left, the plan for that much less, RKM_LAYOUT_TRIES times at most. *need
 * (if not NULL): the least arena of the plans that did not fit, 0 if
 * none. */
static rkm_result rkm__planner_fit(rkm_planner *pl, uint64_t budget, rkm_plan **out, uint64_t *need)
{
    *out = NULL;
    if (need) *need = 0;
    uint64_t b = budget;
    for (int k = 0; k < RKM_LAYOUT_TRIES; k++) {
        rkm_plan *p, *q;
        rkm_result r = rkm__planner_try(pl, b, &p);
        if (r || !p) return r;
        if ((r = rkm__planner_handout(pl, p, &q))) return r;
        uint64_t arena = q->stats.arena_bytes, at = q->stats.aligned_peak;
        if (arena <= budget) {
            *out = q;
            return RKM_OK;
        }
        rkm_plan_destroy(q);
        if (need && (!*need || arena < *need)) *need = arena;
        /* below this plan's own aligned peak: a budget between the two
         * would give the same plan */
        uint64_t below = at < b ? at : b;
        if (below <= arena - budget) break;
        b = below - (arena - budget);
    }
    return RKM_OK;
}

/* The planner's figures of a plan it hands out; over budget is a bug. */
static rkm_result rkm__planner_finish(rkm_planner *pl, rkm_plan *p, uint64_t budget, double t_start)
{
    rkm_plan_stats *st = &p->stats;
    if (st->peak > budget || st->arena_bytes > budget)
        return rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: the %s plan peaks at %llu bytes in an arena of "
                        "%llu, over the budget of %llu", rkm_algo_name(pl->d.algo), (unsigned long long)st->peak,
                        (unsigned long long)st->arena_bytes, (unsigned long long)budget);
    st->algo = pl->d.algo;
    st->budget = budget;
    st->solve_seconds = pl->create_seconds + (rkm__now() - t_start);
    return RKM_OK;
}

/* A draft from a block-level schedule; freed on failure. */
static rkm_result rkm__draft_from_ops(rkm_planner *pl, const rkm__dp_ops *ops, rkm__steps *d)
{
    rkm_result r = rkm__flatten(pl, ops->v, ops->n, d);
    if (r) rkm__steps_free(d);
    return r;
}

/* The chain DP's block-level schedule for m slots into ops, or ops empty
 * when it has none. */
static rkm_result rkm__chain_ops(rkm_planner *pl, int sqrt_rule, int64_t m, rkm__dp_ops *ops)
{
    const rkm_graph *g = pl->g;
    if (sqrt_rule) return rkm__dp_sqrt(pl->ctx, pl->dpb, g->n_blocks, ops);
    if (!pl->table.n) return RKM_OK; /* left out: over RKM_DP_MAX_BYTES */
    double opt = rkm__dp_opt(&pl->table, 0, g->n_blocks - 1, (int32_t)m), t = 0;
    int64_t peak = 0;
    if (!isfinite(opt)) return RKM_OK;
    rkm_result r = rkm__dp_schedule(pl->ctx, &pl->table, (int32_t)m, ops);
    /* The block-level schedule must be the DP's own answer (its time is
     * summed in another order, hence the relative tolerance). */
    if (!r) r = rkm__dp_eval(pl->ctx, pl->dpb, g->n_blocks, ops, &t, &peak);
    if (!r && (fabs(t - opt) > 1e-9 * opt || peak > (int64_t)m))
        r = rkm__err(pl->ctx, RKM_ERROR_INTERNAL, "internal error: chain DP schedule takes %g s and %lld slots, not %g s in %llu",
                     t, (long long)peak, opt, (unsigned long long)m);
    return r;
}

/* The chain's plan for `budget` (sqrt_rule: sqrt's fixed checkpoints, else
 * the DP's), or *out NULL when it has none. */
static rkm_result rkm__solve_chain(rkm_planner *pl, int sqrt_rule, uint64_t budget, rkm_plan **out)
{
    *out = NULL;
    int64_t m = rkm__budget_slots(pl, budget);
    if (m < 0) return RKM_OK;
    rkm__dp_ops ops = {NULL, 0, 0};
    rkm__steps d = {pl->ctx, NULL, 0, 0};
    rkm_result r = rkm__chain_ops(pl, sqrt_rule, m, &ops);
    if (!r && ops.n) r = rkm__draft_from_ops(pl, &ops, &d);
    rkm__dp_ops_free(pl->ctx, &ops);
    if (!r && d.n) r = rkm__planned_birth(pl, &d, out);
    if (!r && *out && (*out)->stats.peak > budget) { /* sqrt: a fixed schedule fits or not */
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* Slot budgets the chain DP tries above a given one. Sizes round up to
 * slots one by one, so a plan for m slots may peak well below m slots'
 * bytes, and one for more slots may still fit them: the floor scans this
 * many above the smallest feasible budget for the least peak, and a budget
 * tries this many above its own for a faster plan that fits. */
#define RKM__SLOTS_UP 16

/* The chain DP's floor: the least peak among its plans for the smallest
 * feasible slot budget and the RKM__SLOTS_UP above it, and that budget.
 * Computed once; 0 when the DP has no plan at all. */
static rkm_result rkm__chain_floor(rkm_planner *pl, uint64_t *peak, int64_t *slots)
{
    if (!pl->chain_floor && pl->table.n) {
        int64_t m = 0;
        rkm_result r = rkm__dp_min_slots(pl->ctx, pl->dpb, pl->g->n_blocks, &m);
        if (r == RKM_ERROR_BUDGET) r = RKM_OK; /* no DP plan */
        for (int64_t k = m; !r && m > 0 && k <= m + RKM__SLOTS_UP && k <= pl->d.slots; k++) {
            rkm_plan *p;
            r = rkm__solve_chain(pl, 0, rkm__slots_budget(pl, k), &p);
            if (!r && p && (!pl->chain_floor || p->stats.peak < pl->chain_floor)) {
                pl->chain_floor = p->stats.peak;
                pl->chain_floor_slots = k;
            }
            rkm_plan_destroy(p);
        }
        if (r) return r;
    }
    *peak = pl->chain_floor;
    *slots = pl->chain_floor_slots;
    return RKM_OK;
}

static rkm_plan *rkm__faster(rkm_plan *a, rkm_plan *b);

/* The chain DP's plan for `budget`: below the DP's own slot budget but at
 * or above its floor, the floor's plan, so that every budget from the
 * reported floor up has a plan. */
static rkm_result rkm__solve_dp_at(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    rkm_result r = rkm__solve_chain(pl, 0, budget, out);
    uint64_t floor;
    int64_t slots;
    if (r || *out || (r = rkm__chain_floor(pl, &floor, &slots)) || !floor || budget < floor) return r;
    return rkm__solve_chain(pl, 0, rkm__slots_budget(pl, slots), out);
}

/* The fastest of the chain DP's plans for the RKM__SLOTS_UP slot budgets
 * above `budget`'s own that still peak within it, when faster than `own`
 * (rkm__solve_dp_at's plan), else *out NULL. Sizes round up to slots one
 * by one, so a plan for more slots than the budget affords often fits it
 * in bytes (on mlp16 at 36.85 %: 51.4 % overhead for 2 slots more, against
 * 75.7 %). Only slot budgets where the DP's time falls are flattened. */
static rkm_result rkm__solve_dp_up(rkm_planner *pl, uint64_t budget, const rkm_plan *own, rkm_plan **out)
{
    *out = NULL;
    int64_t m = rkm__budget_slots(pl, budget);
    if (!own || m < 0) return RKM_OK; /* below the floor: none, as the floor says */
    double last = rkm__dp_opt(&pl->table, 0, pl->g->n_blocks - 1, (int32_t)m);
    rkm_result r = RKM_OK;
    for (int64_t k = m + 1; k <= m + RKM__SLOTS_UP && k <= pl->d.slots && !r; k++) {
        double opt = rkm__dp_opt(&pl->table, 0, pl->g->n_blocks - 1, (int32_t)k);
        if (!(opt < last)) continue;
        last = opt;
        rkm_plan *p = NULL;
        r = rkm__solve_chain(pl, 0, rkm__slots_budget(pl, k), &p);
        if (p && (p->stats.peak > budget || !(p->stats.time < own->stats.time))) {
            rkm_plan_destroy(p);
            p = NULL;
        }
        *out = rkm__faster(*out, p);
    }
    return r;
}

/* The chain DP's plan for `budget`: the faster of rkm__solve_dp_at's and
 * rkm__solve_dp_up's. Below the floor there is still no plan (the floor
 * stays the smallest budget met); above it the result is monotone in the
 * budget: a larger one tries the same slot budgets or ones the DP says are
 * faster. */
static rkm_result rkm__solve_dp(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    rkm_plan *up = NULL;
    rkm_result r = rkm__solve_dp_at(pl, budget, out);
    if (!r) r = rkm__solve_dp_up(pl, budget, *out, &up);
    *out = rkm__faster(up, *out);
    return r;
}

static rkm_result rkm__dtr_min_budget(rkm_planner *pl, uint64_t *out);
static rkm_result rkm__solve_dtr(rkm_planner *pl, uint64_t budget, rkm_plan **out);

/* ---- nesting: a big block planned as a graph of its own ------------------
 *
 * A block without separators inside may have some once its input is held:
 * a U-Net's outer block is a pooling, the whole inner U-Net and a decoder
 * level, tied together only by the skip tensor, which is the block's input.
 * The block as a graph of its own (its input and the graph's inputs are
 * inputs there, a stand-in loss reads and saves its output) is cut into a
 * chain by the same structure detection, and a planner one level down (the
 * same pipeline, so big blocks there nest again) gives it options: its
 * chain DP's plans at a grid of peak budgets, mapped back op for op, are
 * offered to the block like the ILP's, and the replay decides as always.
 * Budgets are the same bytes at both levels: the nested graph's inputs
 * are exactly what is live all the time in the block's own replay. */
#define RKM_NEST_PEEL 4   /* the nested chain's largest block has at most the block's ops minus this */
#define RKM_NEST_DEPTH 16 /* levels at most */
#define RKM_NEST_POINTS 8 /* peak budgets of the grid */

/* Op `op` of g added to h, its tensors renamed by `to` (g's id -> h's);
 * the outputs become h's tensors (their names are their ids in g, so none
 * can clash) and map[h's id] = g's id. ids: scratch for the three lists. */
static rkm_result rkm__nest_op(const rkm_graph *g, rkm_graph *h, int32_t op, int32_t *to, int32_t *map, int32_t *ids)
{
    const rkm__op *o = &g->ops[op];
    char name[32];
    rkm_result r = RKM_OK;
    for (int32_t k = 0; k < o->n_out && !r; k++) {
        const rkm__tensor *t = &g->tensors[o->out[k]];
        snprintf(name, sizeof name, "t%d", (int)o->out[k]);
        r = rkm_graph_add_tensor(h, name, t->bytes, t->flags & RKM_TENSOR_NOGRAD, &to[o->out[k]]);
        if (!r) map[to[o->out[k]]] = o->out[k];
    }
    int32_t *in = ids, *out = in + o->n_in, *saved = out + o->n_out;
    for (int32_t k = 0; k < o->n_in; k++) in[k] = to[o->in[k]];
    for (int32_t k = 0; k < o->n_out; k++) out[k] = to[o->out[k]];
    for (int32_t k = 0; k < o->n_saved; k++) saved[k] = to[o->saved[k]];
    snprintf(name, sizeof name, "o%d", (int)op);
    /* in-place words left out: planner models do not count them anyway */
    rkm_op_desc d = {name, o->fwd, o->bwd, in, o->n_in, out, o->n_out, saved, o->n_saved,
                     o->phantom, o->fwd_ws, o->bwd_ws, o->scratch, 0};
    return r ? r : rkm_graph_add_op(h, &d, NULL);
}

/* The loss of h: g's loss when block b has it, else a stand-in that reads
 * and saves b's output (so that the output is live when the forward part
 * of a nested plan ends, as a block option leaves it). */
static rkm_result rkm__nest_loss(const rkm_graph *g, const rkm__block *b, rkm_graph *h, const int32_t *to)
{
    if (b->out == g->loss) return rkm_graph_set_loss(h, to[g->loss]);
    int32_t loss, x = to[b->out];
    rkm_result r = rkm_graph_add_tensor(h, "loss", 4, 0, &loss);
    rkm_op_desc d = {"loss", 0, 0, &x, 1, &loss, 1, &x, 1, 0, 0, 0, 0, 0};
    if (!r) r = rkm_graph_add_op(h, &d, NULL);
    return r ? r : rkm_graph_set_loss(h, loss);
}

/* Block b of g as a graph of its own, finalized, in *out; map[h's tensor]
 * = g's tensor (h's stand-in loss excepted). */
static rkm_result rkm__nest_graph(const rkm_graph *g, const rkm__block *b, int32_t *map, rkm_graph **out)
{
    *out = NULL;
    int32_t most = 0;
    for (int32_t j = 0; j < b->n_ops; j++) {
        const rkm__op *o = &g->ops[b->ops[j]];
        if (o->n_in + o->n_out + o->n_saved > most) most = o->n_in + o->n_out + o->n_saved;
    }
    int32_t *to = rkm__alloc(g->ctx, g->n_tensors * sizeof *to), *ids = rkm__alloc(g->ctx, (size_t)most * sizeof *ids);
    rkm_graph *h = NULL;
    rkm_result r = to && ids ? rkm_graph_create(g->ctx, &h) : rkm__nomem(g->ctx, "nested graph");
    char name[32];
    for (size_t t = 0; t < g->n_tensors && !r; t++) {
        to[t] = -1;
        if (!(g->tensors[t].flags & RKM_TENSOR_INPUT) && (int32_t)t != b->in) continue;
        snprintf(name, sizeof name, "t%zu", t);
        r = rkm_graph_add_tensor(h, name, g->tensors[t].bytes, RKM_TENSOR_INPUT, &to[t]);
        if (!r) map[to[t]] = (int32_t)t;
    }
    for (int32_t j = 0; j < b->n_ops && !r; j++) r = rkm__nest_op(g, h, b->ops[j], to, map, ids);
    if (!r) r = rkm__nest_loss(g, b, h, to);
    if (!r) r = rkm_graph_finalize(h);
    if (r && r != RKM_ERROR_NOMEM) { /* g was valid, so its block is: a bug */
        char why[RKM_ERRMSG_SIZE];
        snprintf(why, sizeof why, "%s", rkm_context_errmsg(g->ctx));
        r = rkm__err(g->ctx, RKM_ERROR_INTERNAL, "internal error: block %s..%s as a graph of its own: %s",
                     g->ops[b->ops[0]].name, g->ops[b->ops[b->n_ops - 1]].name, why);
    }
    rkm__free(g->ctx, to, g->n_tensors * sizeof *to);
    rkm__free(g->ctx, ids, (size_t)most * sizeof *ids);
    if (r) rkm_graph_destroy(h);
    else *out = h;
    return r;
}

/* Does h cut b into a chain worth planning (its largest block peels at
 * least RKM_NEST_PEEL ops off b)? */
static int rkm__nest_worth(const rkm_graph *h, const rkm__block *b)
{
    int32_t most = 0;
    for (int32_t k = 0; k < h->n_blocks; k++)
        if (h->blocks[k].n_ops > most) most = h->blocks[k].n_ops;
    return most <= b->n_ops - RKM_NEST_PEEL;
}

/* Nested plan p (of h) as block b's steps: in g's ids, the stand-in
 * loss's steps left out, the forward part (*nf steps) being what comes
 * before the loss step; *steps (p's step count long) is the caller's. */
static rkm_result rkm__nest_steps(const rkm_graph *g, const rkm__block *b, const rkm_plan *p, const int32_t *map,
                                  rkm_step **steps, size_t *n, size_t *nf)
{
    const rkm_graph *h = p->g;
    int stand = b->out != g->loss;
    int32_t loss_op = h->tensors[h->loss].producer;
    rkm_step *st = *steps = rkm__alloc(g->ctx, p->n_steps * sizeof *st);
    if (!st) return rkm__nomem(g->ctx, "nested options");
    *n = *nf = 0;
    for (size_t i = 0; i < p->n_steps; i++) {
        rkm_step x = p->steps[i];
        int on_op = rkm__step_on_op(x.kind);
        if (x.kind == RKM_STEP_LOSS) *nf = *n;
        if (stand && (on_op ? x.index == loss_op : x.index == h->loss)) continue;
        x.index = on_op ? b->ops[x.index] : map[x.index];
        st[(*n)++] = x;
    }
    return RKM_OK;
}

/* Nested plan p as an option offered to block b's class. */
static rkm_result rkm__nest_offer(rkm_planner *pl, rkm__sim *s, const rkm__block *b, const rkm_plan *p,
                                  const int32_t *map)
{
    rkm_step *st = NULL;
    size_t n = 0, nf = 0;
    rkm_result r = rkm__nest_steps(pl->g, b, p, map, &st, &n, &nf);
    if (!r) r = rkm__class_add(pl, s, b, st, nf, n - nf);
    if (st) rkm__free(pl->ctx, st, p->n_steps * sizeof *st);
    return r;
}

/* The nested planner's counters, added to its parent's (its classes only
 * when it gave options: `offered`). */
static void rkm__nest_count(rkm_planner *pl, const rkm_planner *sub, int offered)
{
    if (offered) pl->nested += 1 + sub->nested;
    pl->ilp_skipped += sub->ilp_skipped;
    pl->ilp.solves += sub->ilp.solves;
    pl->ilp.optimal += sub->ilp.optimal;
    pl->ilp.suboptimal += sub->ilp.suboptimal;
    pl->ilp.infeasible += sub->ilp.infeasible;
    pl->ilp.timeout += sub->ilp.timeout;
    pl->ilp.failed += sub->ilp.failed;
    pl->ilp.seconds += sub->ilp.seconds;
    pl->ilp.work += sub->ilp.work;
}

/* Block b's options from a nested planner (whose block ILP budget is
 * `allow`), over peak budgets from the nested floor (or the block's, if
 * higher) to peak_hi; *nested: some were offered. Nothing happens for
 * blocks of nest_ops ops or fewer, below RKM_NEST_DEPTH levels, once
 * time_limit is spent, or where b does not cut. */
static rkm_result rkm__nest_options(rkm_planner *pl, rkm__sim *s, const rkm__block *b, uint64_t peak_lo,
                                    uint64_t peak_hi, double allow, int *nested)
{
    const rkm_graph *g = pl->g;
    double left = pl->d.time_limit - rkm__elapsed(pl);
    *nested = 0;
    if (b->n_ops <= pl->d.nest_ops || pl->depth + 1 >= RKM_NEST_DEPTH || left <= 0) return RKM_OK;
    int32_t *map = rkm__alloc(pl->ctx, (g->n_tensors + 1) * sizeof *map);
    rkm_graph *h = NULL;
    rkm_planner *sub = NULL;
    rkm_result r = map ? rkm__nest_graph(g, b, map, &h) : rkm__nomem(pl->ctx, "nested graph");
    if (!r && rkm__nest_worth(h, b)) {
        rkm_solve_desc d = pl->d;
        d.time_limit = left;
        d.ilp_budget = allow > 0 ? allow : 1e-9;
        uint64_t floor = 0, dtr = 0;
        int64_t slots;
        r = rkm__planner_make(h, &d, pl->depth + 1, &sub);
        if (!r) r = rkm__chain_floor(sub, &floor, &slots);
        if (!r) r = rkm__dtr_min_budget(sub, &dtr);
        if (floor == 0 || dtr < floor) floor = dtr;
        /* grad(x_in) is not in h (its input has none): the nested plans are
         * made for that much less, so that the options fit the grid's peaks */
        uint64_t gx = b->in >= 0 && g->tensors[b->in].has_grad ? g->tensors[b->in].bytes : 0;
        uint64_t lo = floor + gx > peak_lo ? floor + gx : peak_lo;
        if (lo < gx) lo = gx; /* never: the block's floor counts x_in */
        uint64_t hi = peak_hi > lo ? peak_hi : lo;
        /* the chain DP's plan and DTR's at each point: DTR reaches below
         * the chain's floor, where the nested blocks' boundaries are held */
        for (int i = 0; i < 2 * RKM_NEST_POINTS && !r; i++) {
            rkm_plan *p = NULL;
            uint64_t budget = lo - gx + (uint64_t)((double)(hi - lo) * (i / 2) / (RKM_NEST_POINTS - 1));
            r = i % 2 ? rkm__solve_dtr(sub, budget, &p) : rkm__solve_dp(sub, budget, &p);
            if (!r && p) r = rkm__nest_offer(pl, s, b, p, map);
            *nested |= p != NULL;
            rkm_plan_destroy(p);
        }
        if (sub) rkm__nest_count(pl, sub, *nested);
    }
    rkm_planner_destroy(sub);
    rkm_graph_destroy(h);
    rkm__free(pl->ctx, map, (g->n_tensors + 1) * sizeof *map);
    return r;
}

static rkm_result rkm__solve_dtr(rkm_planner *pl, uint64_t budget, rkm_plan **out);

/* The whole-graph ILP's plan for `budget`, or *out NULL when none found. */
static rkm_result rkm__solve_checkmate(rkm_planner *pl, uint64_t budget, double time_limit, rkm_plan **out)
{
    *out = NULL;
    const rkm_graph *g = pl->g;
    rkm__ilp_block *ib;
    rkm_result r = rkm__ilp_block_create(g, g->block_ops, (int32_t)g->n_ops, -1, g->loss, 1, &ib);
    if (r) return r;
    rkm_step *steps = NULL;
    size_t nf = 0, nb = 0;
    int found = 0;
    r = rkm__ilp_block_solve(ib, budget, UINT64_MAX, time_limit, &steps, &nf, &nb, &pl->ilp, &found);
    if (!r && found) {
        rkm__steps d = {pl->ctx, steps, nf + nb, nf + nb}; /* the draft takes the steps */
        steps = NULL;
        r = rkm__planned_birth(pl, &d, out);
    }
    /* The gap to the LP bound: over the ILP's schedule family only. */
    if (!r && *out && pl->ilp.time > 0) (*out)->stats.gap = (pl->ilp.time - pl->ilp.bound) / pl->ilp.time;
    rkm__free(pl->ctx, steps, (nf + nb) * sizeof *steps);
    rkm__ilp_block_destroy(ib);
    return r;
}

/* A bytes-mode plan stays only if its layout fits the budget (*p NULL
 * otherwise): where it does, it is often faster than the allocator's, which
 * evicts to make holes a placer that knows every lifetime does not need.
 * The skyline and first fit only (the search's work, on every candidate,
 * made the planner fuzzer 8x slower); the plan's own layout at its birth
 * is never worse. */
static rkm_result rkm__dtr_fits(rkm_planner *pl, uint64_t budget, rkm_plan **p)
{
    size_t n = (*p)->n_buffers;
    rkm_buffer *b = rkm__alloc(pl->ctx, (n + 1) * sizeof *b);
    uint64_t arena = UINT64_MAX, peak;
    rkm_result r = b ? RKM_OK : rkm__nomem(pl->ctx, "dtr layout");
    if (b) memcpy(b, (*p)->buffers, n * sizeof *b);
    if (!r && rkm__layout(pl->ctx, b, n, pl->d.alignment, RKM__LAY_SKYLINE, &arena, &peak))
        r = rkm__nomem(pl->ctx, "dtr layout");
    rkm__free(pl->ctx, b, (n + 1) * sizeof *b);
    if (r || arena > budget) {
        rkm_plan_destroy(*p);
        *p = NULL;
    }
    return r;
}

/* The fastest of DTR's plans for exactly `budget` (one per eviction score
 * on the allocator, then in bytes mode where the layout fits), or *out
 * NULL where none meets it. first: stop at the first plan (to learn
 * whether there is one; the allocator's only). */
static rkm_result rkm__dtr_plan(rkm_planner *pl, uint64_t budget, int first, rkm_plan **out)
{
    *out = NULL;
    rkm_result r = RKM_OK;
    for (int k = 0; k < (first ? 1 : 2) * RKM__DTR_SCORES && !r && !(first && *out); k++) {
        rkm__steps d = {pl->ctx, NULL, 0, 0};
        rkm_plan *p = NULL;
        int bytes = k >= RKM__DTR_SCORES;
        /* a score whose compute passes the best plan's time stops there (a
         * thrashing one would run to max_steps) */
        r = rkm__dtr_steps(pl->g, budget, k % RKM__DTR_SCORES, bytes, *out ? (*out)->stats.time : INFINITY, &d);
        if (!r && d.n) r = rkm__planned_birth(pl, &d, &p);
        if (!r && p && bytes) r = rkm__dtr_fits(pl, budget, &p);
        *out = rkm__faster(*out, p);
    }
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

static rkm_result rkm__dtr_min_budget(rkm_planner *pl, uint64_t *out);

/* DTR's plan for `budget`, or *out NULL. Its success is not monotone in the
 * budget: where it fails, the plan made for its smallest budget (which fits
 * any larger one) stands in. */
static int rkm__dtr_affordable(const rkm_planner *pl);

static rkm_result rkm__solve_dtr(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    *out = NULL;
    if (!rkm__dtr_affordable(pl)) return RKM_OK;
    rkm_result r = rkm__dtr_plan(pl, budget, 0, out);
    if (r || *out) return r;
    uint64_t min;
    if ((r = rkm__dtr_min_budget(pl, &min)) || min > budget) return r;
    if ((r = rkm__dtr_plan(pl, min, 0, out)) || *out) return r;
    return rkm__dtr_plan(pl, pl->dtr_min_at, 1, out); /* the floor's own plan */
}

/* Whether rockmate tries DTR's plans: a DTR run is O(steps x live
 * buffers), which a long graph cannot afford among several candidates (a
 * chain of 20000 ops: 9 s a run); `--algo dtr` always runs. */
static int rkm__dtr_affordable(const rkm_planner *pl)
{
    return pl->d.algo == RKM_ALGO_DTR || (double)pl->g->n_ops * (double)pl->g->n_tensors <= RKM_DTR_MAX_WORK;
}

/* The faster of two plans (a on a tie); the other is destroyed. */
static rkm_plan *rkm__faster(rkm_plan *a, rkm_plan *b)
{
    if (!a || !b) return a ? a : b;
    int keep_a = a->stats.time <= b->stats.time;
    rkm_plan_destroy(keep_a ? b : a);
    return keep_a ? a : b;
}

static rkm_result rkm__solve_checkmate(rkm_planner *pl, uint64_t budget, double time_limit, rkm_plan **out);

/* ---- polish: local search on a plan's compute steps ----------------------
 *
 * Any valid plan is its compute steps (fwd, loss, bwd) plus frees. The
 * frees that follow from the compute steps alone are the earliest ones:
 * a tensor goes right after its last read before it is made again (or for
 * good), a saved state right after its backward, a gradient right after
 * the backward of its tensor's producer. No step's peak grows (a tensor
 * recomputed in place counts the same as one freed and made again), a
 * save whose state no backward reads is dropped, and a forward none of
 * whose outputs is read before it is made again is dead and goes. The
 * search drops one recomputing forward at a time (its outputs then live on
 * from the op's previous forward, which takes over its save) and keeps the
 * change when the simulator replays the result valid, within the budget
 * and faster. Work is counted in
 * replayed steps, not time, so results do not depend on the machine. */
#define RKM_POLISH_WORK 20000000u

typedef struct rkm__polish {
    const rkm_graph *g;
    rkm__sim sim;
    rkm__steps cur;   /* the compute steps of the best plan so far */
    rkm__steps cand;  /* a candidate's compute steps */
    rkm__steps full;  /* a candidate's whole plan */
    rkm__steps frees; /* scratch: frees after each compute step, backwards */
    rkm__steps low;   /* scratch: w->full run in place where it can */
    size_t *fr_at;    /* per candidate step: its first free in frees */
    size_t cap_at;
    uint8_t *need;    /* per tensor: read before it is made again */
    uint8_t *pneed;   /* per op: its backward comes before its next save */
    uint64_t budget, work;
    double time;
} rkm__polish;

static int rkm__is_compute(const rkm_step *s) { return s->kind == RKM_STEP_FWD || s->kind == RKM_STEP_LOSS || s->kind == RKM_STEP_BWD; }

/* Note `free t` after the step being scanned when nothing later reads t
 * (inputs are never freed). */
static int rkm__polish_free_unread(rkm__polish *w, int32_t t)
{
    if (w->need[t] || (w->g->tensors[t].flags & RKM_TENSOR_INPUT)) return 1;
    return rkm__steps_push(&w->frees, RKM_STEP_FREE, t, 0);
}

/* The frees after compute step s (scanning backwards, need says what later
 * steps read), then s's own reads; 0 on NOMEM, *dead for a dead forward. */
static int rkm__polish_scan(rkm__polish *w, rkm_step *s, int *dead)
{
    const rkm_graph *g = w->g;
    int ok = 1;
    *dead = 0;
    if (s->kind == RKM_STEP_LOSS) {
        ok = rkm__polish_free_unread(w, s->index);
        w->need[s->index] = 1;
        return ok;
    }
    const rkm__op *o = &g->ops[s->index];
    if (s->kind == RKM_STEP_BWD) {
        if (o->phantom > 0) ok = rkm__steps_push(&w->frees, RKM_STEP_FREE_SAVED, s->index, 0);
        for (int32_t k = 0; k < o->n_out && ok; k++)
            if (g->tensors[o->out[k]].has_grad) ok = rkm__steps_push(&w->frees, RKM_STEP_FREE_GRAD, o->out[k], 0);
        for (int32_t k = 0; k < o->n_saved && ok; k++) ok = rkm__polish_free_unread(w, o->saved[k]);
        for (int32_t k = 0; k < o->n_saved; k++) w->need[o->saved[k]] = 1;
        w->pneed[s->index] = 1;
        return ok;
    }
    s->save = s->save && w->pneed[s->index];
    if (s->save) w->pneed[s->index] = 0;
    int used = s->save;
    for (int32_t k = 0; k < o->n_out; k++) used |= w->need[o->out[k]];
    if (!used) {
        *dead = 1;
        return 1;
    }
    for (int32_t k = 0; k < o->n_in + o->n_out && ok; k++) ok = rkm__polish_free_unread(w, o->in[k]);
    for (int32_t k = 0; k < o->n_out; k++) w->need[o->out[k]] = 0;
    for (int32_t k = 0; k < o->n_in; k++) w->need[o->in[k]] = 1;
    return ok;
}

/* w->full: the candidate's compute steps (dead forwards left out) with the
 * earliest frees. 0 on NOMEM. */
static int rkm__polish_expand(rkm__polish *w)
{
    size_t n = w->cand.n;
    if (!rkm__reserve(w->g->ctx, (void **)&w->fr_at, &w->cap_at, n + 1, sizeof *w->fr_at)) return 0;
    memset(w->need, 0, w->g->n_tensors);
    memset(w->pneed, 0, w->g->n_ops);
    w->frees.n = w->full.n = 0;
    for (size_t i = n; i-- > 0;) {
        int dead;
        w->fr_at[i + 1] = w->frees.n;
        if (!rkm__polish_scan(w, &w->cand.s[i], &dead)) return 0;
        if (dead) w->cand.s[i].kind = -1; /* left out below */
    }
    w->fr_at[0] = w->frees.n;
    for (size_t i = 0; i < n; i++) {
        const rkm_step *s = &w->cand.s[i];
        if (s->kind < 0) continue;
        if (!rkm__steps_push(&w->full, s->kind, s->index, s->save)) return 0;
        /* the frees of step i are frees[fr_at[i+1] .. fr_at[i]), in scan order */
        for (size_t f = w->fr_at[i + 1]; f < w->fr_at[i]; f++)
            if (!rkm__steps_push(&w->full, w->frees.s[f].kind, w->frees.s[f].index, 0)) return 0;
    }
    return 1;
}

/* Replay w->full run in place where it can (in w->low: the squeeze reads
 * w->full's own steps): 1 when valid and within the budget (then *time),
 * -1 on NOMEM. */
static int rkm__polish_fits(rkm__polish *w, double *time)
{
    rkm_sim_result res;
    int32_t obj;
    const rkm__steps *run = &w->full;
    if (w->g->has_inplace) {
        if (!rkm__reserve(w->g->ctx, (void **)&w->low.s, &w->low.cap, w->full.n + 1, sizeof *w->low.s)) return -1;
        if (w->full.n) memcpy(w->low.s, w->full.s, w->full.n * sizeof *w->low.s);
        w->low.n = w->full.n;
        if (rkm__lower_inplace(w->g, &w->low)) return -1;
        run = &w->low;
    }
    rkm__sim_reset(&w->sim);
    w->work += run->n;
    if (!rkm__sim_run(&w->sim, run->s, run->n, &res, NULL)) return 0;
    if (rkm__sim_end(&w->sim, &obj) != RKM_RULE_NONE || res.peak > w->budget) return 0;
    *time = res.time;
    return 1;
}

/* Keep the candidate (its live compute steps) when it fits and is faster. */
static int rkm__polish_try(rkm__polish *w, int *kept)
{
    double t;
    *kept = 0;
    if (!rkm__polish_expand(w)) return 0;
    int fits = rkm__polish_fits(w, &t);
    if (fits < 0) return 0;
    if (!fits || !(t < w->time)) return 1;
    w->time = t;
    w->cur.n = 0;
    for (size_t i = 0; i < w->cand.n; i++)
        if (w->cand.s[i].kind >= 0 && !rkm__steps_push(&w->cur, w->cand.s[i].kind, w->cand.s[i].index, w->cand.s[i].save))
            return 0;
    *kept = 1;
    return 1;
}

/* The candidate without recomputing forward j (-1 when step j is not one):
 * index of the op's previous forward, which takes over j's save. */
static int64_t rkm__polish_drop(rkm__polish *w, size_t j)
{
    const rkm_step *c = w->cur.s;
    if (c[j].kind != RKM_STEP_FWD) return -1;
    size_t h = j;
    while (h-- > 0)
        if (c[h].kind == RKM_STEP_FWD && c[h].index == c[j].index) break;
    w->work += j - (h + 1); /* the search back counts as work too */
    if (h == (size_t)-1 || (c[j].save && c[h].save)) return -1;
    w->cand.n = 0;
    for (size_t i = 0; i < w->cur.n; i++)
        if (i != j && !rkm__steps_push(&w->cand, c[i].kind, c[i].index, c[i].save)) return -2;
    if (c[j].save) w->cand.s[h].save = 1;
    return (int64_t)h;
}

static void rkm__polish_free(rkm__polish *w)
{
    rkm__sim_free(&w->sim);
    rkm__steps_free(&w->cur);
    rkm__steps_free(&w->cand);
    rkm__steps_free(&w->full);
    rkm__steps_free(&w->frees);
    rkm__steps_free(&w->low);
    rkm__free(w->g->ctx, w->fr_at, w->cap_at * sizeof *w->fr_at);
    rkm__free(w->g->ctx, w->need, w->g->n_tensors);
    rkm__free(w->g->ctx, w->pneed, w->g->n_ops);
}

/* Drop recomputations while one fits, sweeping the steps in order until a
 * sweep keeps none or the work runs out. 0 on NOMEM. */
static int rkm__polish_search(rkm__polish *w)
{
    int kept = 1;
    while (kept && w->work < RKM_POLISH_WORK) {
        kept = 0;
        for (size_t j = 0; j < w->cur.n && w->work < RKM_POLISH_WORK; j++) {
            int k;
            int64_t h = rkm__polish_drop(w, j);
            if (h == -2 || (h >= 0 && !rkm__polish_try(w, &k))) return 0;
            if (h >= 0 && k) kept = 1, j--; /* step j is another one now */
        }
    }
    return 1;
}

static rkm_result rkm__polish_init(rkm__polish *w, const rkm_graph *g, const rkm_plan *p, uint64_t budget)
{
    memset(w, 0, sizeof *w);
    w->g = g;
    w->budget = budget;
    w->time = INFINITY; /* the first candidate, p's own compute steps, only has to fit */
    w->cur.ctx = w->cand.ctx = w->full.ctx = w->frees.ctx = w->low.ctx = g->ctx;
    w->need = rkm__alloc(g->ctx, g->n_tensors);
    w->pneed = rkm__alloc(g->ctx, g->n_ops);
    if (!w->need || !w->pneed || rkm__sim_init(g, &w->sim)) return rkm__nomem(g->ctx, "plan polish");
    for (size_t i = 0; i < p->n_steps; i++) {
        const rkm_step *s = &p->steps[i];
        if (rkm__is_compute(s) && !rkm__steps_push(&w->cand, s->kind, s->index, s->save))
            return rkm__nomem(g->ctx, "plan polish");
    }
    return RKM_OK;
}

/* *p replaced by a faster plan within the budget when the search finds one. */
static rkm_result rkm__polish_plan(rkm_planner *pl, uint64_t budget, rkm_plan **p)
{
    rkm__polish w;
    int kept = 0;
    rkm_result r = rkm__polish_init(&w, pl->g, *p, budget);
    if (!r && (!rkm__polish_try(&w, &kept) || (kept && !rkm__polish_search(&w)))) r = rkm__nomem(pl->ctx, "plan polish");
    if (!r && kept && w.time < (*p)->stats.time) {
        rkm__steps_free(&w.cand);
        w.cand = w.cur; /* expand the best */
        w.cur = (rkm__steps){pl->ctx, NULL, 0, 0};
        rkm_plan *np = NULL;
        if (!rkm__polish_expand(&w)) r = rkm__nomem(pl->ctx, "plan polish");
        if (!r) r = rkm__planned_birth(pl, &w.full, &np);
        if (!r) {
            rkm_plan_destroy(*p);
            *p = np;
        }
    }
    rkm__polish_free(&w);
    return r;
}

/* ---- squeeze: a plan over the budget brought within it -------------------
 *
 * A plan made for more memory than the budget is often much faster than
 * any the chain DP makes within it: the DP keeps a block's input live
 * through the block's whole backward and its checkpoints from their forward
 * on, where the best plans free such tensors and rebuild them partway. The
 * squeeze takes a plan that peaks above the budget and, while it does,
 * applies one move at the first step over it, on a tensor or saved state
 * that is live there but not used by the step:
 *   - a tensor is recomputed before its next reader (or right after the
 *     step): forwards of its producer and, back from it, of the producers
 *     of what is not live there (at most RKM_SQUEEZE_CHAIN ops);
 *   - an op's saved state is made by a forward just before its backward
 *     (with the same chain for the op's inputs) instead of where it was.
 * polish's expansion adds the earliest frees, which drop the tensor or state
 * in between. Each round takes the move with the least time added per byte
 * of excess removed (excess: bytes over the budget summed over the steps);
 * the search stops when the plan fits, when no move lowers the excess, or
 * when the work (replayed steps, not seconds) runs out. The caller polishes
 * what fits: the greedy moves leave recomputations that polish drops. */
#define RKM_SQUEEZE_CHAIN 32
#define RKM_SQUEEZE_WORK 20000000u
/* Lookahead: the RKM_SQUEEZE_LOOK moves of a round with the best scores are
 * each applied and pruned (recomputing forwards dropped while the excess
 * does not grow) and scored again, and the applied move is pruned too: a
 * move often makes other recomputations redundant, which its own score does
 * not see (gpt2-tiny at 27.98 %: recomputing h1.res3 from h1.res2 serves
 * gelu's backward too; 71.7 % overhead without the lookahead, 67.9 % with
 * it). It costs about that many prunes a round, so a solve's squeezes look
 * ahead for their first RKM_SQUEEZE_LOOK_WORK of work only (replayed steps:
 * gpt2-tiny's need 2 M in all; peer-gpt's would take 19 M, 0.25 s more), and
 * the kicks' squeezes not at all. */
#define RKM_SQUEEZE_LOOK 4
#define RKM_SQUEEZE_LOOK_WORK 4000000u

typedef struct rkm__squeeze {
    rkm__polish w;
    rkm__steps base; /* w.cur's whole plan (w.full is the candidates') */
    uint64_t *pk;   /* per step of w.full: its peak */
    size_t cap_pk;
    uint8_t *live;  /* per tensor: live before the first step over the budget */
    uint8_t *livep; /* per op: saved state live there */
    uint8_t *vlive; /* per tensor: live before the step a move inserts at */
    uint8_t *mark;  /* per op: in the recompute being built */
    size_t *pos;    /* per step of w.cur: its index in base */
    size_t cap_pos;
    double excess, time; /* of w.cur */
    uint64_t limit;      /* the work it may do */
    uint64_t look_limit; /* the work up to which rounds look ahead */
    int n_top;           /* the moves of a round with the best scores, best first */
    double top_score[RKM_SQUEEZE_LOOK];
    int32_t top_obj[RKM_SQUEEZE_LOOK];
    int top_early[RKM_SQUEEZE_LOOK];
} rkm__squeeze;

/* Replay w.full: 1 when valid (then *excess, *first: the first step over
 * the budget or -1, *time), 0 when not, -1 on NOMEM. */
static int rkm__squeeze_eval(rkm__squeeze *q, double *excess, int64_t *first, double *time)
{
    rkm__polish *w = &q->w;
    rkm_sim_result res;
    int32_t obj;
    if (!rkm__reserve(w->g->ctx, (void **)&q->pk, &q->cap_pk, w->full.n + 1, sizeof *q->pk)) return -1;
    rkm__sim_reset(&w->sim);
    w->work += w->full.n;
    if (rkm__sim_run_peaks(&w->sim, w->full.s, w->full.n, &res, NULL, q->pk, NULL) != 1 ||
        rkm__sim_end(&w->sim, &obj) != RKM_RULE_NONE)
        return 0;
    *excess = 0;
    *first = -1;
    for (size_t i = 0; i < w->full.n; i++) {
        if (q->pk[i] <= w->budget) continue;
        *excess += (double)(q->pk[i] - w->budget);
        if (*first < 0) *first = (int64_t)i;
    }
    *time = res.time;
    return 1;
}

/* Does compute step s read or make tensor t? */
static int rkm__step_touches(const rkm_graph *g, const rkm_step *s, int32_t t)
{
    int32_t n;
    const int32_t *v = rkm__step_objects(g, s, 0, &n);
    for (int32_t k = 0; k < n; k++)
        if (v[k] == t) return 1;
    return 0;
}

/* Does compute step s read tensor t? */
static int rkm__step_reads(const rkm_graph *g, const rkm_step *s, int32_t t)
{
    if (s->kind != RKM_STEP_FWD) return rkm__step_touches(g, s, t);
    const rkm__op *o = &g->ops[s->index];
    for (int32_t k = 0; k < o->n_in; k++)
        if (o->in[k] == t) return 1;
    return 0;
}

/* Mark op x and, back from it, the producers of what it reads that is
 * neither live (`live`) nor an input. The count of marked ops. */
static size_t rkm__squeeze_mark(rkm__squeeze *q, int32_t x, const uint8_t *live)
{
    const rkm_graph *g = q->w.g;
    size_t n = 0;
    memset(q->mark, 0, g->n_ops);
    q->mark[x] = 1;
    for (int32_t o = x; o >= 0; o--) { /* producers come first in graph order */
        if (!q->mark[o]) continue;
        n++;
        for (int32_t k = 0; k < g->ops[o].n_in; k++) {
            int32_t t = g->ops[o].in[k];
            if (!(g->tensors[t].flags & RKM_TENSOR_INPUT) && !live[t]) q->mark[g->tensors[t].producer] = 1;
        }
    }
    return n;
}

/* w.cand: w.cur with forwards of the marked ops (in graph order, which is
 * topological) before compute step v, op `saver`'s with save (-1: none),
 * and without the save of step h (SIZE_MAX: none). 0 on NOMEM. */
static int rkm__squeeze_insert(rkm__squeeze *q, size_t v, int32_t saver, size_t h)
{
    rkm__polish *w = &q->w;
    w->cand.n = 0;
    for (size_t i = 0; i < w->cur.n; i++) {
        if (i == v)
            for (int32_t o = 0; o < (int32_t)w->g->n_ops; o++)
                if (q->mark[o] && !rkm__steps_push(&w->cand, RKM_STEP_FWD, o, o == saver)) return 0;
        const rkm_step *s = &w->cur.s[i];
        if (!rkm__steps_push(&w->cand, s->kind, s->index, s->save && i != h)) return 0;
    }
    return 1;
}

/* w.cur: the compute steps of w.full (dead forwards are gone from it), and
 * where each is in it; base: w.full. 0 on NOMEM. */
static int rkm__squeeze_take(rkm__squeeze *q)
{
    rkm__polish *w = &q->w;
    w->cur.n = q->base.n = 0;
    for (size_t i = 0; i < w->full.n; i++)
        if (!rkm__steps_push(&q->base, w->full.s[i].kind, w->full.s[i].index, w->full.s[i].save)) return 0;
    for (size_t i = 0; i < w->full.n; i++) {
        const rkm_step *s = &w->full.s[i];
        if (!rkm__is_compute(s)) continue;
        if (!rkm__reserve(w->g->ctx, (void **)&q->pos, &q->cap_pos, w->cur.n + 1, sizeof *q->pos)) return 0;
        q->pos[w->cur.n] = i;
        if (!rkm__steps_push(&w->cur, s->kind, s->index, s->save)) return 0;
    }
    return 1;
}

/* `live`: the tensors live before base's step `at`; `livep` (when not
 * NULL) the ops whose saved state is. */
static void rkm__squeeze_live_at(rkm__squeeze *q, size_t at, uint8_t *live, uint8_t *livep)
{
    rkm__polish *w = &q->w;
    rkm_sim_result res;
    rkm__sim_reset(&w->sim);
    w->work += at;
    (void)rkm__sim_run(&w->sim, q->base.s, at, &res, NULL); /* a prefix of a valid plan */
    memcpy(live, w->sim.D, w->g->n_tensors);
    if (livep) memcpy(livep, w->sim.P, w->g->n_ops);
}

/* The next compute step after c that reads t, or w.cur.n. */
static size_t rkm__squeeze_next(rkm__squeeze *q, size_t c, int32_t t)
{
    size_t v = c + 1;
    while (v < q->w.cur.n && !rkm__step_reads(q->w.g, &q->w.cur.s[v], t)) v++;
    q->w.work += v - c;
    return v;
}

/* Build move `obj` at compute step c into w.cand: for a tensor t (obj <
 * n_tensors), recompute it before its next reader; for op o's saved state
 * (obj = n_tensors + o), save it again just before o's backward instead
 * of where it was saved. 0 when there is no such move, -1 on NOMEM. */
static int rkm__squeeze_move(rkm__squeeze *q, size_t c, int32_t obj, int early)
{
    const rkm_graph *g = q->w.g;
    const rkm_step *cur = q->w.cur.s;
    int32_t nt = (int32_t)g->n_tensors, x = obj < nt ? g->tensors[obj].producer : obj - nt;
    size_t v = c + 1, h = SIZE_MAX;
    if (obj < nt) {
        v = rkm__squeeze_next(q, c, obj);
    } else {
        while (v < q->w.cur.n && !(cur[v].kind == RKM_STEP_BWD && cur[v].index == x)) v++;
        for (h = c; h != SIZE_MAX && !(cur[h].kind == RKM_STEP_FWD && cur[h].index == x && cur[h].save); h--) {}
        q->w.work += v - c + (h == SIZE_MAX ? c : c - h);
        if (h == SIZE_MAX) return 0;
    }
    if (v == q->w.cur.n || (early && v == c + 1)) return 0;
    if (early) v = c + 1;
    rkm__squeeze_live_at(q, q->pos[v], q->vlive, NULL);
    if (obj < nt) q->vlive[obj] = 0; /* freed in between */
    if (rkm__squeeze_mark(q, x, q->vlive) > RKM_SQUEEZE_CHAIN) return 0;
    return rkm__squeeze_insert(q, v, obj < nt ? -1 : x, h) && rkm__polish_expand(&q->w) ? 1 : -1;
}

/* Keep move (obj, early) among the round's RKM_SQUEEZE_LOOK best scores
 * (on a tie, the one found first stays ahead). */
static void rkm__squeeze_top(rkm__squeeze *q, double score, int32_t obj, int early)
{
    int n = q->n_top, i = n;
    while (i > 0 && q->top_score[i - 1] > score) i--;
    if (i >= RKM_SQUEEZE_LOOK) return;
    if (n == RKM_SQUEEZE_LOOK) n--; /* the last one falls out */
    for (int k = n; k > i; k--) {
        q->top_score[k] = q->top_score[k - 1];
        q->top_obj[k] = q->top_obj[k - 1];
        q->top_early[k] = q->top_early[k - 1];
    }
    q->top_score[i] = score, q->top_obj[i] = obj, q->top_early[i] = early;
    q->n_top = n + 1;
}

static int rkm__squeeze_apply(rkm__squeeze *q, int64_t *first, int32_t t, int early);

/* Drop recomputing forwards of w.cur while one leaves no more excess and
 * saves time (polish's move, judged by the excess first). 0 on NOMEM. */
static int rkm__squeeze_prune(rkm__squeeze *q, int64_t *first)
{
    rkm__polish *w = &q->w;
    for (size_t j = 0; j < w->cur.n && w->work < q->limit; j++) {
        double ex, time;
        int64_t f;
        int64_t h = rkm__polish_drop(w, j);
        if (h == -2 || (h >= 0 && !rkm__polish_expand(w))) return 0;
        int ok = h >= 0 ? rkm__squeeze_eval(q, &ex, &f, &time) : 0;
        if (ok < 0) return 0;
        if (!ok || ex > q->excess || !(time < q->time)) continue;
        q->excess = ex, q->time = time, *first = f;
        if (!rkm__squeeze_take(q)) return 0;
        j--; /* step j is another one now */
    }
    return 1;
}

/* Move (obj, early) applied and pruned: its excess *ex and time *time; then
 * w.cur back as it was (kept in *save). 0 on NOMEM. */
static int rkm__squeeze_look(rkm__squeeze *q, int64_t first, int32_t obj, int early, rkm__steps *save, double *ex,
                             double *time)
{
    rkm__polish *w = &q->w;
    double e0 = q->excess, t0 = q->time;
    save->n = 0;
    for (size_t i = 0; i < w->cur.n; i++)
        if (!rkm__steps_push(save, w->cur.s[i].kind, w->cur.s[i].index, w->cur.s[i].save)) return 0;
    if (!rkm__squeeze_apply(q, &first, obj, early) || !rkm__squeeze_prune(q, &first)) return 0;
    *ex = q->excess, *time = q->time;
    w->cand.n = 0;
    for (size_t i = 0; i < save->n; i++)
        if (!rkm__steps_push(&w->cand, save->s[i].kind, save->s[i].index, save->s[i].save)) return 0;
    if (!rkm__polish_expand(w) || rkm__squeeze_eval(q, &q->excess, &first, &q->time) <= 0 || !rkm__squeeze_take(q))
        return 0;
    q->excess = e0, q->time = t0;
    return 1;
}

/* Of the round's best moves, the one that scores best after a prune. 0 on
 * NOMEM. */
static int rkm__squeeze_pick(rkm__squeeze *q, int64_t first, int32_t *bt, int *be, double *bex)
{
    rkm__steps save = {q->w.g->ctx, NULL, 0, 0};
    double best = INFINITY;
    int ok = 1;
    for (int i = 0; i < q->n_top && ok; i++) {
        double ex = 0, time = 0;
        ok = rkm__squeeze_look(q, first, q->top_obj[i], q->top_early[i], &save, &ex, &time);
        double score = ok && ex < q->excess ? (time - q->time) / (q->excess - ex) : INFINITY;
        if (ok && score < best) best = score, *bt = q->top_obj[i], *be = q->top_early[i], *bex = ex;
    }
    rkm__steps_free(&save);
    return ok;
}

/* The best move of a round (w.cur first over the budget at w.full's step
 * `first`): recompute tensor *bt (-1: none) before its next reader, with
 * excess *bex. 0 on NOMEM. */
static int rkm__squeeze_round(rkm__squeeze *q, int64_t first, int32_t *bt, int *be, double *bex)
{
    rkm__polish *w = &q->w;
    const rkm_graph *g = w->g;
    size_t c = 0;
    while (q->pos[c] != (size_t)first) c++; /* over the budget: a compute step */
    rkm__squeeze_live_at(q, (size_t)first, q->live, q->livep);
    double bscore = INFINITY;
    *bt = -1;
    *bex = q->excess;
    const rkm_step *at = &w->cur.s[c];
    for (size_t t = 0; t < g->n_tensors + g->n_ops && w->work < q->limit; t++) {
        int32_t o = (int32_t)(t - g->n_tensors);
        if (t < g->n_tensors ? !q->live[t] || (g->tensors[t].flags & RKM_TENSOR_INPUT) || rkm__step_touches(g, at, (int32_t)t)
                             : !q->livep[o] || (at->kind == RKM_STEP_BWD && at->index == o))
            continue;
        for (int early = 0; early < 2; early++) {
            double ex, time;
            int64_t f;
            int ok = rkm__squeeze_move(q, c, (int32_t)t, early);
            if (ok > 0) ok = rkm__squeeze_eval(q, &ex, &f, &time);
            if (ok < 0) return 0;
            double score = ok && ex < q->excess ? (time - q->time) / (q->excess - ex) : INFINITY;
            if (score < bscore) {
                *bt = (int32_t)t, *be = early, *bex = ex;
                bscore = score;
            }
            if (w->work < q->look_limit && isfinite(score)) rkm__squeeze_top(q, score, (int32_t)t, early);
        }
    }
    int ok = q->n_top > 1 ? rkm__squeeze_pick(q, first, bt, be, bex) : 1;
    q->n_top = 0;
    return ok;
}

/* Apply the move for tensor t to w.cur (and w.full, q->excess, *first). 1
 * when done, 0 on NOMEM. */
static int rkm__squeeze_apply(rkm__squeeze *q, int64_t *first, int32_t t, int early)
{
    size_t c = 0;
    while (q->pos[c] != (size_t)*first) c++;
    return rkm__squeeze_move(q, c, t, early) > 0 && rkm__squeeze_eval(q, &q->excess, first, &q->time) > 0 && rkm__squeeze_take(q);
}

static void rkm__squeeze_free(rkm__squeeze *q)
{
    const rkm_graph *g = q->w.g;
    rkm__steps_free(&q->base);
    rkm__free(g->ctx, q->pk, q->cap_pk * sizeof *q->pk);
    rkm__free(g->ctx, q->live, g->n_tensors);
    rkm__free(g->ctx, q->vlive, g->n_tensors);
    rkm__free(g->ctx, q->livep, g->n_ops);
    rkm__free(g->ctx, q->mark, g->n_ops);
    rkm__free(g->ctx, q->pos, q->cap_pos * sizeof *q->pos);
    rkm__polish_free(&q->w);
}

/* Plan p (valid, any peak) squeezed within `budget`: *out, or NULL when
 * the search does not get there within *left work; rounds look ahead while
 * it has done less than *look_left (NULL: never). What it does is taken off
 * both. */
static rkm_result rkm__squeeze_plan(rkm_planner *pl, const rkm_plan *p, uint64_t budget, uint64_t *left,
                                    uint64_t *look_left, rkm_plan **out)
{
    const rkm_graph *g = pl->g;
    rkm__squeeze q;
    memset(&q, 0, sizeof q);
    q.limit = *left;
    q.look_limit = look_left && *look_left < *left ? *look_left : look_left ? *left : 0;
    *out = NULL;
    rkm_result r = rkm__polish_init(&q.w, g, p, budget);
    q.base.ctx = g->ctx;
    q.live = rkm__alloc(g->ctx, g->n_tensors);
    q.vlive = rkm__alloc(g->ctx, g->n_tensors);
    q.livep = rkm__alloc(g->ctx, g->n_ops);
    q.mark = rkm__alloc(g->ctx, g->n_ops);
    int64_t first = -1;
    int ok = !r && q.live && q.vlive && q.livep && q.mark && rkm__polish_expand(&q.w) ? rkm__squeeze_eval(&q, &q.excess, &first, &q.time) : -1;
    if (ok > 0) ok = rkm__squeeze_take(&q) ? 1 : -1;
    while (ok > 0 && first >= 0 && q.w.work < q.limit) {
        int32_t t;
        int early = 0;
        double ex;
        if (!rkm__squeeze_round(&q, first, &t, &early, &ex)) ok = -1;
        if (ok < 0 || t < 0) break;
        int look = q.w.work < q.look_limit;
        ok = rkm__squeeze_apply(&q, &first, t, early) && (!look || rkm__squeeze_prune(&q, &first)) ? 1 : -1;
    }
    if (ok < 0 && !r) r = rkm__nomem(pl->ctx, "plan squeeze");
    if (!r && ok > 0 && first < 0) r = rkm__planned_birth(pl, &q.base, out);
    *left = q.w.work < *left ? *left - q.w.work : 0;
    if (look_left) *look_left = q.w.work < *look_left ? *look_left - q.w.work : 0;
    rkm__squeeze_free(&q);
    return r;
}

/* The squeeze starts from the chain DP's plans for the budget's multiples
 * 1 + RKM_SQUEEZE_STEP * 2^i, i < RKM_SQUEEZE_STARTS (5 % to 160 % more
 * memory), and below the DP's floor from the floor's plan: on the bundled
 * graphs the start that squeezes best lies anywhere from 7 % to 86 % above
 * the budget, so one start is not enough. */
#define RKM_SQUEEZE_STARTS 6
#define RKM_SQUEEZE_STEP 0.05
#define RKM_SQUEEZE_DTR_STARTS 3

/* The chain DP's plan for start i of the squeeze at `budget` (-1: the
 * floor's, when the budget is below it), or NULL. */
static rkm_result rkm__squeeze_start(rkm_planner *pl, uint64_t budget, int i, rkm_plan **out)
{
    uint64_t floor;
    int64_t slots;
    *out = NULL;
    if (i < 0) {
        rkm_result r = rkm__chain_floor(pl, &floor, &slots);
        return r || !floor || floor <= budget ? r : rkm__solve_chain(pl, 0, rkm__slots_budget(pl, slots), out);
    }
    int dtr = i >= RKM_SQUEEZE_STARTS;
    double b = (double)budget * (1 + RKM_SQUEEZE_STEP * (double)(1u << (dtr ? i - RKM_SQUEEZE_STARTS : i)));
    uint64_t at = b >= 0x1p64 ? UINT64_MAX : (uint64_t)b;
    if (dtr && !rkm__dtr_affordable(pl)) return RKM_OK;
    return dtr ? rkm__dtr_plan(pl, at, 0, out) : rkm__solve_chain(pl, 0, at, out);
}

/* The fastest plan within `budget` that the squeeze makes from its starts,
 * each polished, or *out NULL. A start that fits already, or that is the
 * previous one's plan again, is left out. */
static rkm_result rkm__solve_squeezed(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    uint64_t left = RKM_SQUEEZE_WORK, look_left = RKM_SQUEEZE_LOOK_WORK, last_peak = 0;
    double last_time = -1;
    rkm_result r = RKM_OK;
    *out = NULL;
    for (int i = -1; i < RKM_SQUEEZE_STARTS + RKM_SQUEEZE_DTR_STARTS && !r && left > 0; i++) {
        rkm_plan *a = NULL, *b = NULL;
        r = rkm__squeeze_start(pl, budget, i, &a);
        if (!r && a && a->stats.peak > budget && !(a->stats.time == last_time && a->stats.peak == last_peak)) {
            last_time = a->stats.time;
            last_peak = a->stats.peak;
            r = rkm__squeeze_plan(pl, a, budget, &left, &look_left, &b);
            if (!r && b) r = rkm__polish_plan(pl, budget, &b);
        }
        rkm_plan_destroy(a);
        *out = rkm__faster(*out, b);
    }
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* Graphs this small also get the whole-graph ILP inside rockmate, for this
 * long a solve (its deterministic work limit): measured on the bundled
 * graphs of 25 to 47 ops, it finds resnet18's 60 % plan (7.3 % against
 * DTR's 18.1 %) in 0.2 s; the chain DP and DTR cover larger graphs. */
#define RKM_WHOLE_GRAPH_OPS 64
#define RKM_WHOLE_GRAPH_SECONDS 0.5

/* ---- kick: leave a local optimum of polish and squeeze -------------------
 *
 * Polish only drops recomputations and the squeeze only adds them, so a
 * plan they both leave alone may still be one swap away from a faster one
 * (mlp16 at 36.85 %: checkpoints at act5, act9, act13 where act4, act10,
 * act13 save two forwards). A kick drops one recomputing forward of the
 * best plan even where the plan then peaks over the budget, squeezes the
 * result back within it and polishes that; the best plan moves to the
 * first result that is faster, and the kicks start over from it. At most
 * RKM_KICK_TRIALS kicks a solve (each a squeeze and a polish): measured on
 * the bundled graphs, 64 reach what 200 do but on peer-gpt (27.05 % against
 * 26.72 % at 25 %) in 0.05 s instead of 0.11 s. */
#define RKM_KICK_TRIALS 64
/* The kicks' squeeze work on graphs too big for the whole-graph ILP, where
 * a kick's squeeze costs more and the squeeze's whole work took 0.3..0.5 s
 * on chains of 50-op random-DAG blocks (205 ops): half of it finds most of
 * what the whole does (40 %: 10.99 % against 10.92 %, 11.40 % unkicked) in
 * 0.1..0.2 s. Graphs of more than RKM_KICK_MAX_OPS get no kicks: on gpt2-xl
 * (485 ops) they found nothing at 90..25 % and cost 0.1..0.2 s a solve. */
#define RKM_KICK_WORK_LARGE (RKM_SQUEEZE_WORK / 2)
#define RKM_KICK_MAX_OPS 256
static uint64_t rkm__kick_work(const rkm_graph *g)
{
    if (g->n_ops > RKM_KICK_MAX_OPS) return 0;
    return g->n_ops <= RKM_WHOLE_GRAPH_OPS ? RKM_SQUEEZE_WORK : RKM_KICK_WORK_LARGE;
}

/* A copy of w.full as a plan when it replays valid at any peak, else NULL. */
static rkm_result rkm__kick_candidate(rkm_planner *pl, rkm__polish *w, rkm_plan **out)
{
    double t;
    uint64_t budget = w->budget;
    *out = NULL;
    w->budget = UINT64_MAX;
    int ok = rkm__polish_fits(w, &t);
    w->budget = budget;
    if (!ok) return RKM_OK;
    rkm__steps d = {pl->ctx, NULL, 0, 0};
    for (size_t i = 0; i < w->full.n; i++)
        if (!rkm__steps_push(&d, w->full.s[i].kind, w->full.s[i].index, w->full.s[i].save)) {
            rkm__steps_free(&d);
            return rkm__nomem(pl->ctx, "plan kick");
        }
    return rkm__planned_birth(pl, &d, out);
}

/* The kick of recomputing forward j of w.cur: squeezed within `budget` and
 * polished, into *best when faster (then *improved). */
static rkm_result rkm__kick_one(rkm_planner *pl, rkm__polish *w, size_t j, uint64_t budget, uint64_t *left,
                                rkm_plan **best, int *trials, int *improved)
{
    int64_t h = rkm__polish_drop(w, j);
    if (h == -2 || (h >= 0 && !rkm__polish_expand(w))) return rkm__nomem(pl->ctx, "plan kick");
    rkm_plan *a = NULL, *b = NULL;
    rkm_result r = h >= 0 ? rkm__kick_candidate(pl, w, &a) : RKM_OK;
    if (!r && a) {
        (*trials)++;
        r = rkm__squeeze_plan(pl, a, budget, left, NULL, &b); /* many kicks: no lookahead */
        if (!r && b) r = rkm__polish_plan(pl, budget, &b);
        if (!r && b && b->stats.time < (*best)->stats.time) {
            rkm_plan_destroy(*best);
            *best = b;
            b = NULL;
            *improved = 1;
        }
    }
    rkm_plan_destroy(a);
    rkm_plan_destroy(b);
    return r;
}

/* *best (within `budget`) replaced by the faster plans of at most
 * max_trials kicks. */
static rkm_result rkm__solve_kicked(rkm_planner *pl, uint64_t budget, int max_trials, rkm_plan **best)
{
    int trials = 0, improved = 1;
    rkm_result r = RKM_OK;
    uint64_t left = pl->kick_work;
    while (!r && improved && trials < max_trials && left > 0) {
        rkm__polish w;
        int kept = 0;
        improved = 0;
        r = rkm__polish_init(&w, pl->g, *best, budget);
        if (!r && !rkm__polish_try(&w, &kept)) r = rkm__nomem(pl->ctx, "plan kick");
        for (size_t j = 0; !r && kept && !improved && j < w.cur.n && trials < max_trials && left > 0; j++)
            r = rkm__kick_one(pl, &w, j, budget, &left, best, &trials, &improved);
        rkm__polish_free(&w);
    }
    return r;
}

/* A plan for less memory fits too, and the squeeze and the kicks are local
 * searches that can end better from a tighter start: on mlp16, rockmate's
 * plan costs 37.86 % at 36.85 % to 38 % of the baseline peak but 40.56 % at
 * 39 % to 42 %, and squeezing and kicking at 96 % or 90 % of those budgets
 * finds the 37.86 % plan again. So on graphs small enough for the kicks,
 * where the budget has a plan, these rungs below it are tried too, each
 * then polished at the budget itself. */
#define RKM_RUNGS 2
static const double rkm__rungs[RKM_RUNGS] = {0.96, 0.90};
/* Kicks a rung: 32 keep mlp16's 37.86 % at 37..42 % (16 lose it at 39, 41
 * and 42 %) and take peer-gpt's planning at 25 % from 1.00..1.03 s to
 * 0.90..0.95 s here, against 64. */
#define RKM_RUNG_KICK_TRIALS 32

/* The squeeze's plan for `target`, kicked there, then polished within
 * `budget` (>= target), or *out NULL. */
static rkm_result rkm__solve_rung(rkm_planner *pl, uint64_t target, uint64_t budget, rkm_plan **out)
{
    rkm_result r = rkm__solve_squeezed(pl, target, out);
    if (!r && *out) r = rkm__solve_kicked(pl, target, RKM_RUNG_KICK_TRIALS, out);
    if (!r && *out) r = rkm__polish_plan(pl, budget, out);
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* Rockmate's plan: the fastest of the chain DP's (its plan for the budget's
 * own slots and, apart, the faster one for a few slots more: each is
 * polished on its own, and the slower one before polish may end faster),
 * sqrt's, DTR's, for small graphs the whole-graph ILP's, and the squeeze's
 * of the DP's plans for more memory; any of them may have none. */
static rkm_result rkm__solve_rockmate(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    rkm_plan *p[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    rkm_result r = rkm__solve_dp_at(pl, budget, &p[0]);
    if (!r) r = rkm__solve_dp_up(pl, budget, p[0], &p[4]);
    if (!r) r = rkm__solve_chain(pl, 1, budget, &p[1]);
    if (!r) r = rkm__solve_dtr(pl, budget, &p[2]);
    if (!r && pl->g->n_ops <= RKM_WHOLE_GRAPH_OPS) {
        /* one candidate among four: if lp_solve fails on it, the others stand */
        r = rkm__solve_checkmate(pl, budget, RKM_WHOLE_GRAPH_SECONDS, &p[3]);
        if (r == RKM_ERROR_SOLVER) {
            rkm__log(pl->ctx, RKM_LOG_WARN, "whole-graph ILP left out: %s", rkm_context_errmsg(pl->ctx));
            r = RKM_OK;
        }
    }
    for (int k = 0; k < 5 && !r; k++)
        if (p[k]) r = rkm__polish_plan(pl, budget, &p[k]);
    if (!r) r = rkm__solve_squeezed(pl, budget, &p[5]); /* polished already */
    for (int k = 1; k < 6; k++) p[0] = rkm__faster(p[0], p[k]);
    if (!r && p[0]) r = rkm__solve_kicked(pl, budget, RKM_KICK_TRIALS, &p[0]);
    for (int k = 0; k < RKM_RUNGS && !r && p[0] && pl->g->n_ops <= RKM_WHOLE_GRAPH_OPS; k++) {
        rkm_plan *q = NULL;
        r = rkm__solve_rung(pl, (uint64_t)((double)budget * rkm__rungs[k]), budget, &q);
        p[0] = rkm__faster(p[0], q);
    }
    if (r) {
        rkm_plan_destroy(p[0]);
        return r;
    }
    *out = p[0];
    return RKM_OK;
}

/* One plan for `budget` from the planner's algorithm, or *out NULL. */
static rkm_result rkm__planner_try(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    *out = NULL;
    rkm_algo a = pl->d.algo;
    if (a != RKM_ALGO_SQRT && budget >= pl->base_peak) return rkm__plan_baseline(pl->g, out); /* nothing is faster */
    if (a == RKM_ALGO_ROCKMATE) return rkm__solve_rockmate(pl, budget, out);
    if (a == RKM_ALGO_DTR) return rkm__solve_dtr(pl, budget, out);
    if (a == RKM_ALGO_SQRT) { /* a fixed schedule; where it does not fit, the baseline may */
        rkm_result r = rkm__solve_chain(pl, 1, budget, out);
        return r || *out || budget < pl->base_peak ? r : rkm__plan_baseline(pl->g, out);
    }
    if (rkm__uses_chain(a)) return rkm__solve_dp(pl, budget, out);
    /* One solve's work is worth about its limit (on a slow machine it may
     * take longer: the wall-clock stop is RKM__ILP_WALL_SAFETY times it). */
    if (a == RKM_ALGO_CHECKMATE) return rkm__solve_checkmate(pl, budget, pl->d.time_limit / 2, out);
    return RKM_OK;
}

static rkm_result rkm__min_budget(rkm_planner *pl, uint64_t *out, uint64_t *at);

/* The smallest budget the planner meets, and the plan that meets it
 * (pl->min_plan): from the least budget the algorithm plans for (its peaks
 * counted at the alignment) upwards, by the least arena of the plans that
 * did not fit, else by steps that double from 1/256 of the way to the
 * baseline peak, until a plan fits (the baseline's arena always does);
 * then down, while the budget one byte under the plan's arena finds a
 * plan. The budget is that plan's arena: rkm_planner_solve meets any
 * budget from there on, with this plan where its own search finds none
 * (the searches are not monotone in the budget). */
static rkm_result rkm__min_budget_fit(rkm_planner *pl, uint64_t *out)
{
    uint64_t m, at;
    rkm_plan *p = NULL;
    rkm_result r = rkm__min_budget(pl, &m, &at);
    uint64_t step = pl->base_peak > m ? (pl->base_peak - m) / 256 : 0;
    for (int k = 0; !r && !p; k++) {
        uint64_t need = 0;
        if (k == 2 * RKM_LAYOUT_TRIES) { /* the baseline, laid out, fits its own arena */
            if (!(r = rkm__plan_baseline(pl->g, &p))) r = rkm__planner_handout(pl, p, &p);
        } else if (!(r = rkm__planner_fit(pl, m, &p, &need)) && !p) {
            uint64_t up = at > m ? at - m : step > pl->d.alignment ? step : pl->d.alignment;
            if (at > m) at = 0; /* first, the budget the least peak was made for */
            else step *= 2;
            m = need > m ? need : m + up;
        }
    }
    /* then down: a budget just under that arena may find another plan */
    for (int k = 0; !r && k < 4 * RKM_LAYOUT_TRIES && p->stats.arena_bytes; k++) {
        rkm_plan *q = NULL;
        if ((r = rkm__planner_fit(pl, p->stats.arena_bytes - 1, &q, NULL)) || !q) break;
        rkm_plan_destroy(p);
        p = q;
    }
    if (r) {
        rkm_plan_destroy(p);
        return r;
    }
    pl->min_plan = p;
    *out = p->stats.arena_bytes;
    return RKM_OK;
}

rkm_result rkm_planner_min_budget(rkm_planner *pl, uint64_t *out)
{
    if (!pl || !out) return pl ? rkm__err(pl->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_min_budget: out is NULL") : RKM_ERROR_ARGUMENT;
    if (!pl->min_budget) {
        rkm_result r = rkm__min_budget_fit(pl, &pl->min_budget);
        if (r) {
            pl->min_budget = 0;
            return r;
        }
    }
    *out = pl->min_budget;
    return RKM_OK;
}

/* Checkmate's smallest budget: bisection on bytes (feasibility is monotone
 * in the budget), 12 probes sharing the time limit. A probe that times out
 * counts as infeasible, so this is the least budget the solver could meet. */
static rkm_result rkm__min_budget_checkmate(rkm_planner *pl, uint64_t *out)
{
    rkm_result r = RKM_OK;
    uint64_t lo = pl->lower_bound, hi = pl->base_peak;
    for (int it = 0; it < 12 && lo < hi && !r; it++) {
        uint64_t mid = lo + (hi - lo) / 2;
        rkm_plan *p;
        r = rkm__solve_checkmate(pl, mid, pl->d.time_limit / 24, &p);
        if (!r && p) hi = p->stats.peak;
        else if (!r) lo = mid + 1;
        rkm_plan_destroy(p);
    }
    *out = hi;
    return r;
}

/* DTR's smallest budget: bisection between the lower bound and the baseline
 * peak (which the baseline meets) on the budgets it meets (DTR plans on an
 * allocator of the budget's bytes: a plan's peak can be below the arena it
 * needed). DTR's success is not monotone, so this is the least the
 * bisection found. Kept after the first call. */
static rkm_result rkm__dtr_min_budget(rkm_planner *pl, uint64_t *out)
{
    if (pl->dtr_min) {
        *out = pl->dtr_min;
        return RKM_OK;
    }
    rkm_result r = RKM_OK;
    uint64_t lo = pl->lower_bound, hi = pl->base_peak, at = pl->base_peak;
    for (int it = 0; it < 40 && lo < hi && !r; it++) {
        uint64_t mid = lo + (hi - lo) / 2;
        rkm_plan *p;
        r = rkm__dtr_plan(pl, mid, 1, &p);
        if (!r && p) hi = mid, at = mid;
        else if (!r) lo = mid + 1;
        rkm_plan_destroy(p);
    }
    if (!r) pl->dtr_min = hi, pl->dtr_min_at = at;
    *out = hi;
    return r;
}

/* On graphs small enough for the whole-graph ILP, rockmate's candidates
 * reach below the floors of the chain DP, sqrt and DTR (a random DAG of 60
 * ops: 41.5 % where they stop at 42.2 %): a bisection between the lower
 * bound and *out on the whole-graph ILP's plans (at a fifth of a solve's
 * work, which the solve's own search extends) and the squeeze's lowers *out
 * to the least peak met. */
#define RKM_FLOOR_STEPS 8
static rkm_result rkm__min_budget_small(rkm_planner *pl, uint64_t *out, uint64_t *at)
{
    rkm_result r = RKM_OK;
    uint64_t lo = pl->lower_bound;
    for (int it = 0; it < RKM_FLOOR_STEPS && lo < *out && !r; it++) {
        uint64_t mid = lo + (*out - lo) / 2;
        rkm_plan *p = NULL;
        r = rkm__solve_checkmate(pl, mid, RKM_WHOLE_GRAPH_SECONDS / 5, &p);
        if (r == RKM_ERROR_SOLVER) r = RKM_OK; /* as in rkm__solve_rockmate: the squeeze stands */
        if (!r && !p) r = rkm__solve_squeezed(pl, mid, &p);
        if (!r && p) *out = p->stats.peak, *at = mid;
        else if (!r) lo = mid + 1;
        rkm_plan_destroy(p);
    }
    return r;
}

/* The least peak of the plans the planner's algorithm makes (*out), and
 * the budget the plan of that peak was made for (*at, at least *out): the
 * searches are not monotone in the budget. */
static rkm_result rkm__min_budget(rkm_planner *pl, uint64_t *out, uint64_t *at)
{
    rkm_result r = RKM_OK;
    *out = *at = pl->base_peak;
    if (pl->d.algo == RKM_ALGO_ROTOR || pl->d.algo == RKM_ALGO_ROCKMATE) {
        uint64_t floor;
        int64_t slots;
        if (!(r = rkm__chain_floor(pl, &floor, &slots)) && floor && floor < *out) *out = *at = floor;
    } else if (pl->d.algo == RKM_ALGO_CHECKMATE)
        r = rkm__min_budget_checkmate(pl, out), *at = *out;
    /* sqrt's one schedule: rockmate has it among its candidates, so its
     * floor too (in place, it can peak below the chain DP's) */
    if (!r && (pl->d.algo == RKM_ALGO_SQRT || pl->d.algo == RKM_ALGO_ROCKMATE)) {
        rkm_plan *p;
        if (!(r = rkm__solve_chain(pl, 1, UINT64_MAX, &p)) && p && p->stats.peak < *out) *out = *at = p->stats.peak;
        rkm_plan_destroy(p);
    }
    if (!r && (pl->d.algo == RKM_ALGO_DTR || pl->d.algo == RKM_ALGO_ROCKMATE) && rkm__dtr_affordable(pl)) {
        uint64_t dtr;
        if (!(r = rkm__dtr_min_budget(pl, &dtr)) && dtr < *out) *out = dtr, *at = pl->dtr_min_at;
    }
    if (!r && pl->d.algo == RKM_ALGO_ROCKMATE && pl->g->n_ops <= RKM_WHOLE_GRAPH_OPS)
        r = rkm__min_budget_small(pl, out, at);
    if (*at < *out) *at = *out;
    return r;
}

rkm_result rkm_planner_solve(rkm_planner *pl, uint64_t budget, rkm_plan **out)
{
    if (!pl || !out) return pl ? rkm__err(pl->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_solve: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    double t = rkm__now();
    rkm_plan *p;
    rkm_result r = rkm__planner_fit(pl, budget, &p, NULL);
    if (r) return r;
    if (!p) {
        uint64_t min;
        if ((r = rkm_planner_min_budget(pl, &min))) return r;
        if (budget < min)
            return rkm__err(pl->ctx, RKM_ERROR_BUDGET,
                            "%s: no plan fits a budget of %llu bytes; the smallest it can meet is %llu bytes",
                            rkm_algo_name(pl->d.algo), (unsigned long long)budget, (unsigned long long)min);
        if ((r = rkm__plan_copy(pl->min_plan, &p))) return r;
    }
    if ((r = rkm__planner_finish(pl, p, budget, t))) {
        rkm_plan_destroy(p);
        return r;
    }
    *out = p;
    return RKM_OK;
}

rkm_result rkm_planner_stats_get(const rkm_planner *pl, rkm_planner_stats *out)
{
    if (!pl || !out) return pl ? rkm__err(pl->ctx, RKM_ERROR_ARGUMENT, "rkm_planner_stats_get: out is NULL") : RKM_ERROR_ARGUMENT;
    rkm__planner_figures(pl, out);
    return RKM_OK;
}

rkm_result rkm_plan_solve(const rkm_graph *g, const rkm_solve_desc *desc, uint64_t budget, rkm_plan **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_solve: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    rkm_planner *pl;
    rkm_result r = rkm_planner_create(g, desc, &pl);
    if (r) return r;
    r = rkm_planner_solve(pl, budget, out);
    rkm_planner_destroy(pl);
    return r;
}

rkm_result rkm_plan_stats_get(const rkm_plan *p, rkm_plan_stats *out)
{
    if (!p || !out) return p ? rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_stats_get: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = p->stats;
    return RKM_OK;
}

static const char *const rkm__algo_names[RKM_ALGO_COUNT] = {"default", "rockmate", "rotor", "sqrt", "checkmate", "none", "dtr"};

const char *rkm_algo_name(rkm_algo a) { return (int)a >= 0 && a < RKM_ALGO_COUNT ? rkm__algo_names[a] : "unknown"; }

rkm_result rkm_algo_from_name(rkm_context *ctx, const char *name, rkm_algo *out)
{
    if (!ctx) return RKM_ERROR_ARGUMENT;
    if (!name || !out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_algo_from_name: name or out is NULL");
    for (int a = 0; a < RKM_ALGO_COUNT; a++)
        if (strcmp(name, rkm__algo_names[a]) == 0) {
            *out = (rkm_algo)a;
            return RKM_OK;
        }
    return rkm__err(ctx, RKM_ERROR_ARGUMENT, "unknown algorithm '%.64s' (default, rockmate, rotor, sqrt, checkmate, none or dtr)",
                    name);
}

/* The number and unit of a budget; 0 if the text is not one. */
static int rkm__budget_value(const char *text, uint64_t baseline_peak, uint64_t *out)
{
    static const struct { const char *suffix; double mult; } units[] = {
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"%", -1}, {"B", 1}, {"", 1}};
    size_t n = rkm__decimal_len(text);
    if (n && (text[n] == 0 || (text[n] == 'B' && text[n + 1] == 0))) { /* bytes: exact when an integer */
        char digits[32];
        if (n < sizeof digits) {
            memcpy(digits, text, n);
            digits[n] = 0;
            if (rkm__parse_u64(digits, out)) return 1;
        }
    }
    const char *end = text + n;
    double v;
    if (!rkm__decimal_value(text, n, &v)) return 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) != 0) continue;
        double bytes = units[i].mult < 0 ? v / 100.0 * (double)baseline_peak : v * units[i].mult;
        if (bytes >= 18446744073709551615.0) return 0;
        *out = (uint64_t)bytes;
        return 1;
    }
    return 0;
}

rkm_result rkm_parse_budget(rkm_context *ctx, const char *text, uint64_t baseline_peak, uint64_t *out)
{
    if (!ctx) return RKM_ERROR_ARGUMENT;
    if (!text || !out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_parse_budget: text or out is NULL");
    if (rkm__budget_value(text, baseline_peak, out)) return RKM_OK;
    return rkm__err(ctx, RKM_ERROR_ARGUMENT,
                    "budget '%.64s': bytes (N or NB), optionally with KiB, MiB, GiB, KB, MB or GB, or N%% of the baseline peak", text);
}

/* ===========================================================================
 * 13. Executor and profiler
 * ========================================================================= */

static rkm_result rkm__cb_fail(const rkm_plan *p, size_t i, const char *which, int code)
{
    char text[RKM_NAME_MAX + 32];
    rkm_step_text(p->g, &p->steps[i], text, sizeof text);
    return rkm__err(p->ctx, RKM_ERROR_CALLBACK, "step %zu (%s): the %s callback returned %d", i, text, which, code);
}

/* The callback each step kind calls (by rkm_step_kind), for messages. */
static const char *const rkm__callback_names[] = {"forward", "loss", "backward", "free_tensor", "free_saved", "free_grad"};

/* The optional callback of a step that is neither fwd nor bwd. */
static int (*rkm__buffer_callback(const rkm_callbacks *cb, int32_t kind))(void *, const rkm_buffer_call *)
{
    switch (kind) {
    case RKM_STEP_LOSS: return cb->loss;
    case RKM_STEP_FREE: return cb->free_tensor;
    case RKM_STEP_FREE_SAVED: return cb->free_saved;
    default: return cb->free_grad;
    }
}

/* Call the host for step i. */
static int rkm__call_step(const rkm_plan *p, const rkm_callbacks *cb, size_t i)
{
    const rkm_step *st = &p->steps[i];
    const uint8_t *fl = p->flags + p->flag_off[i];
    const rkm__op *o = st->kind == RKM_STEP_FWD || st->kind == RKM_STEP_BWD ? &p->g->ops[st->index] : NULL;
    if (st->kind == RKM_STEP_FWD) {
        rkm_fwd_call c = {(int64_t)i, st->index, st->save,    fl[0],      o->in,
                          o->n_in,    o->out,     o->n_out,    fl + 2,     o->phantom,
                          o->fwd_ws + (fl[1] ? o->scratch : 0)};
        return cb->forward(cb->user, &c);
    }
    if (st->kind == RKM_STEP_BWD) {
        rkm_bwd_call c = {(int64_t)i, st->index, o->in,  o->n_in,     o->out,     o->n_out,
                          fl,               fl + o->n_in, o->saved, o->n_saved, o->phantom, o->bwd_ws};
        return cb->backward(cb->user, &c);
    }
    int (*fn)(void *, const rkm_buffer_call *) = rkm__buffer_callback(cb, st->kind);
    uint64_t bytes = st->kind == RKM_STEP_FREE_SAVED ? p->g->ops[st->index].phantom : p->g->tensors[st->index].bytes;
    rkm_buffer_call c = {(int64_t)i, st->index, bytes};
    return fn ? fn(cb->user, &c) : 0;
}

/* Profiling: the walk times every forward and backward call with a clock. */
typedef struct rkm__prof {
    double (*clock)(void *);
    void *user; /* the desc's, for clock and after_run */
    int (*after_run)(void *, int32_t);
    double *fwd, *bwd; /* [run * n_ops + op] */
    size_t n_ops;
    int32_t run;
} rkm__prof;

/* Walk the plan calling the host; with pr, time its forwards and backwards. */
static rkm_result rkm__walk(const rkm_plan *p, const rkm_callbacks *cb, rkm__prof *pr)
{
    for (size_t i = 0; i < p->n_steps; i++) {
        int32_t kind = p->steps[i].kind;
        int timed = pr && (kind == RKM_STEP_FWD || kind == RKM_STEP_BWD);
        double t0 = timed ? pr->clock(pr->user) : 0;
        int rc = rkm__call_step(p, cb, i);
        if (timed) {
            double *samples = kind == RKM_STEP_FWD ? pr->fwd : pr->bwd;
            samples[(size_t)pr->run * pr->n_ops + (size_t)p->steps[i].index] = pr->clock(pr->user) - t0;
        }
        if (rc) return rkm__cb_fail(p, i, rkm__callback_names[kind], rc);
    }
    return RKM_OK;
}

/* One profiling run, then the host's after_run hook. */
static rkm_result rkm__profile_run(const rkm_plan *p, const rkm_callbacks *cb, rkm__prof *pr)
{
    rkm_result r = rkm__walk(p, cb, pr);
    int rc = r || !pr->after_run ? 0 : pr->after_run(pr->user, pr->run);
    if (rc)
        return rkm__err(p->ctx, RKM_ERROR_CALLBACK, "rkm_graph_profile: the after_run callback returned %d after run %d",
                        rc, (int)pr->run);
    return r;
}

/* The callbacks every walk needs. */
static rkm_result rkm__callbacks_ok(rkm_context *ctx, const rkm_callbacks *cb, const char *fn)
{
    if (!cb) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: callbacks are NULL", fn);
    if (!cb->forward || !cb->backward)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the forward and backward callbacks are required", fn);
    return RKM_OK;
}

rkm_result rkm_plan_execute(const rkm_plan *p, const rkm_callbacks *cb)
{
    if (!p) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__callbacks_ok(p->ctx, cb, "rkm_plan_execute");
    return r ? r : rkm__walk(p, cb, NULL);
}


static double rkm__default_clock(void *user)
{
    (void)user;
    return rkm__now();
}

static int rkm__cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double rkm_trimmed_mean(double *samples, size_t n, double trim)
{
    if (n == 0 || !samples) return 0.0;
    if (!(trim > 0.0)) trim = 0.0; /* also NaN */
    if (trim > 0.5) trim = 0.5;
    qsort(samples, n, sizeof *samples, rkm__cmp_double);
    /* The epsilon keeps 0.2 * 10 from flooring to 1 on rounding. */
    size_t drop = (size_t)floor((double)n * trim + 1e-9);
    if (drop > (n - 1) / 2) drop = (n - 1) / 2;
    double sum = 0.0;
    for (size_t i = drop; i < n - drop; i++) sum += samples[i];
    return sum / (double)(n - 2 * drop);
}

static rkm_result rkm__profile_defaults(const rkm_graph *g, const rkm_profile_desc *desc, rkm_profile_desc *d)
{
    memset(d, 0, sizeof *d);
    if (desc) *d = *desc;
    if (d->runs < 0)
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "profile desc: runs is %d (positive, or 0 for the default)", (int)d->runs);
    if (!(d->trim >= 0 && d->trim < 0.5))
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "profile desc: trim is %g (in [0, 0.5), 0 for the default)", d->trim);
    if (d->runs == 0) d->runs = 5;
    if (d->trim == 0) d->trim = 0.2;
    if (!d->clock) d->clock = rkm__default_clock;
    return RKM_OK;
}

/* Each op's trimmed means over the runs' samples. */
static void rkm__profile_costs(const rkm_graph *g, const rkm__prof *pr, const rkm_profile_desc *d, double *col,
                               rkm_op_costs *costs)
{
    for (size_t i = 0; i < g->n_ops; i++) {
        rkm_op_costs *c = &costs[i];
        c->fwd_ws = g->ops[i].fwd_ws;
        c->bwd_ws = g->ops[i].bwd_ws;
        for (int32_t k = 0; k < d->runs; k++) col[k] = pr->fwd[(size_t)k * g->n_ops + i];
        c->fwd_seconds = rkm_trimmed_mean(col, (size_t)d->runs, d->trim);
        for (int32_t k = 0; k < d->runs; k++) col[k] = pr->bwd[(size_t)k * g->n_ops + i];
        c->bwd_seconds = g->ops[i].has_bwd ? rkm_trimmed_mean(col, (size_t)d->runs, d->trim) : 0;
    }
}

rkm_result rkm_graph_profile(const rkm_graph *g, const rkm_callbacks *cb, const rkm_profile_desc *desc, rkm_graph **out)
{
    if (!out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_profile: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!g) return RKM_ERROR_ARGUMENT;
    rkm_profile_desc d;
    rkm_result r = rkm__callbacks_ok(g->ctx, cb, "rkm_graph_profile");
    if (!r) r = rkm__profile_defaults(g, desc, &d);
    rkm_plan *p = NULL;
    if (!r) r = rkm__plan_baseline(g, &p);
    if (r) return r;
    size_t n = (size_t)d.runs * g->n_ops, size = (2 * n + (size_t)d.runs) * sizeof(double);
    rkm__prof pr = {d.clock, d.user, d.after_run, NULL, NULL, g->n_ops, 0};
    pr.fwd = rkm__calloc(g->ctx, 1, size);
    rkm_op_costs *costs = rkm__calloc(g->ctx, g->n_ops + 1, sizeof *costs);
    if (!pr.fwd || !costs) r = rkm__nomem(g->ctx, "rkm_graph_profile");
    if (!r) {
        pr.bwd = pr.fwd + n;
        for (pr.run = 0; pr.run < d.runs && !r; pr.run++) r = rkm__profile_run(p, cb, &pr);
    }
    if (!r) {
        rkm__profile_costs(g, &pr, &d, pr.bwd + n, costs); /* the last runs doubles: one op's samples */
        r = rkm_graph_with_costs(g, costs, out);
    }
    rkm__free(g->ctx, pr.fwd, size);
    rkm__free(g->ctx, costs, (g->n_ops + 1) * sizeof *costs);
    rkm_plan_destroy(p);
    return r;
}
/* ===========================================================================
 * 14. Arena: one allocation, an offset per buffer
 * ========================================================================= */

/* --- The offset allocator ------------------------------------------------ */

typedef struct rkm__arena_range {
    uint64_t off, len;
} rkm__arena_range;

/* A live block: where it starts, what it occupies, what was asked for.
 * (Not the library's rkm__block, a block of a graph.) */
typedef struct rkm__arena_block {
    uint64_t off, len, bytes;
} rkm__arena_block;

struct rkm_arena {
    rkm_context *ctx;
    uint64_t capacity;
    uint32_t max_blocks;
    rkm__arena_range *freel; /* sorted by offset, never adjacent (always coalesced) */
    uint32_t n_free;
    rkm__arena_block *used;  /* sorted by offset */
    uint32_t n_used;
    uint64_t current, peak, high_water;
    uint64_t align; /* RKM_ARENA_ALIGN; an exec in layout mode: its plan's */
};

/* bytes rounded up to the arena's alignment; the caller has checked it
 * fits. */
static uint64_t rkm__arena_aligned(const rkm_arena *a, uint64_t bytes)
{
    return (bytes + a->align - 1) / a->align * a->align;
}

rkm_result rkm_arena_create(rkm_context *ctx, uint64_t capacity, uint32_t max_blocks, rkm_arena **out)
{
    if (!ctx) return RKM_ERROR_ARGUMENT;
    if (!out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_create: out is NULL");
    *out = NULL;
    if (max_blocks == 0 || max_blocks == UINT32_MAX)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_create: max_blocks %lu is not in 1..%lu",
                                (unsigned long)max_blocks, (unsigned long)UINT32_MAX - 1);
    rkm_arena *a = rkm__calloc(ctx, 1, sizeof *a);
    if (a) {
        a->ctx = ctx;
        a->capacity = capacity;
        a->max_blocks = max_blocks;
        a->align = RKM_ARENA_ALIGN;
        /* n live blocks split the region into at most n + 1 free ranges. */
        a->freel = rkm__calloc(ctx, (size_t)max_blocks + 1, sizeof *a->freel);
        a->used = rkm__calloc(ctx, max_blocks, sizeof *a->used);
    }
    if (!a || !a->freel || !a->used) {
        rkm_arena_destroy(a);
        return rkm__err(ctx, RKM_ERROR_NOMEM, "rkm_arena_create: no memory for the lists of %lu blocks",
                                (unsigned long)max_blocks);
    }
    rkm_arena_clear(a);
    *out = a;
    return RKM_OK;
}

void rkm_arena_destroy(rkm_arena *a)
{
    if (!a) return;
    rkm__free(a->ctx, a->freel, ((size_t)a->max_blocks + 1) * sizeof *a->freel);
    rkm__free(a->ctx, a->used, a->max_blocks * sizeof *a->used);
    rkm__free(a->ctx, a, sizeof *a);
}

void rkm_arena_clear(rkm_arena *a)
{
    a->n_used = 0;
    a->current = 0;
    a->n_free = a->capacity > 0;
    if (a->n_free) {
        a->freel[0].off = 0;
        a->freel[0].len = a->capacity;
    }
}

/* Does free range r hold `bytes` at its start? A range that ends at the
 * region's end needs only the bytes themselves, not their aligned size: the
 * last block may be short, which is what makes the layout capacity exact. */
static int rkm__range_fits(const rkm_arena *a, const rkm__arena_range *r, uint64_t bytes, uint64_t aligned)
{
    if (r->len >= aligned) return 1;
    return r->len >= bytes && a->capacity - r->off == r->len;
}

/* First index in the used list whose offset is >= off. */
static uint32_t rkm__used_lower(const rkm_arena *a, uint64_t off)
{
    uint32_t lo = 0, hi = a->n_used;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a->used[mid].off < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Block b is now live: into the used list and the counts. */
static void rkm__arena_take(rkm_arena *a, rkm__arena_block b)
{
    uint32_t at = rkm__used_lower(a, b.off);
    memmove(&a->used[at + 1], &a->used[at], (a->n_used - at) * sizeof *a->used);
    a->used[at] = b;
    a->n_used++;
    a->current += b.bytes;
    if (a->current > a->peak) a->peak = a->current;
    if (b.off + b.bytes > a->high_water) a->high_water = b.off + b.bytes;
}

/* Drop free range i (it has been used up). */
static void rkm__free_remove(rkm_arena *a, uint32_t i)
{
    memmove(&a->freel[i], &a->freel[i + 1], (a->n_free - i - 1) * sizeof *a->freel);
    a->n_free--;
}

/* Why no block of `bytes` can be carved: the counts the caller needs. */
static rkm_result rkm__arena_full(const rkm_arena *a, uint64_t bytes)
{
    return rkm__err(a->ctx, RKM_ERROR_NOMEM,
                            "rkm_arena_alloc: no free range holds %llu bytes (%llu of %llu bytes in use, %lu of %lu "
                            "blocks live)",
                            (unsigned long long)bytes, (unsigned long long)a->current,
                            (unsigned long long)a->capacity, (unsigned long)a->n_used, (unsigned long)a->max_blocks);
}

rkm_result rkm_arena_alloc(rkm_arena *a, uint64_t bytes, uint64_t *offset)
{
    if (!a) return RKM_ERROR_ARGUMENT;
    if (!offset) return rkm__err(a->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_alloc: offset is NULL");
    *offset = RKM_ARENA_NONE;
    if (bytes == 0) return rkm__err(a->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_alloc: a block of 0 bytes");
    if (bytes > UINT64_MAX - (a->align - 1) || a->n_used == a->max_blocks) return rkm__arena_full(a, bytes);
    uint64_t aligned = rkm__arena_aligned(a, bytes);
    uint32_t i = 0;
    while (i < a->n_free && !rkm__range_fits(a, &a->freel[i], bytes, aligned)) i++;
    if (i == a->n_free) return rkm__arena_full(a, bytes);
    rkm__arena_range *r = &a->freel[i];
    rkm__arena_block b = {r->off, aligned < r->len ? aligned : r->len, bytes};
    r->off += b.len;
    r->len -= b.len;
    if (r->len == 0) rkm__free_remove(a, i);
    rkm__arena_take(a, b);
    *offset = b.off;
    return RKM_OK;
}

/* Layout mode: a block of `bytes` (> 0) exactly at `off` (aligned),
 * occupying its aligned size (shorter at the region's end, as in first
 * fit). 0 if any of those bytes is not free (a live block overlaps, or the
 * region ends) or max_blocks are live; the caller says why. */
static int rkm__arena_alloc_at(rkm_arena *a, uint64_t off, uint64_t bytes)
{
    if (bytes == 0 || off % a->align || bytes > UINT64_MAX - (a->align - 1)) return 0;
    if (a->n_used == a->max_blocks || off > a->capacity || a->capacity - off < bytes) return 0;
    uint64_t aligned = rkm__arena_aligned(a, bytes);
    uint64_t len = a->capacity - off < aligned ? a->capacity - off : aligned;
    uint32_t i = 0;
    while (i < a->n_free && a->freel[i].off + a->freel[i].len <= off) i++;
    if (i == a->n_free) return 0;
    rkm__arena_range r = a->freel[i];
    if (r.off > off || r.off + r.len - off < len) return 0;
    int before = r.off < off, after = off + len < r.off + r.len;
    if (before && after) {
        /* One range becomes two: n live blocks never make more than n + 1. */
        memmove(&a->freel[i + 1], &a->freel[i], (a->n_free - i) * sizeof *a->freel);
        a->n_free++;
        a->freel[i].len = off - r.off;
        a->freel[i + 1].off = off + len;
        a->freel[i + 1].len = r.off + r.len - (off + len);
    } else if (before) {
        a->freel[i].len = off - r.off;
    } else if (after) {
        a->freel[i].off = off + len;
        a->freel[i].len = r.off + r.len - (off + len);
    } else {
        rkm__free_remove(a, i);
    }
    rkm__arena_block b = {off, len, bytes};
    rkm__arena_take(a, b);
    return 1;
}

/* Give [off, off + len) back to the free list, merged with its neighbours.
 * The list has room: it never holds more than n_used + 1 ranges. */
static void rkm__free_insert(rkm_arena *a, uint64_t off, uint64_t len)
{
    uint32_t at = 0;
    while (at < a->n_free && a->freel[at].off < off) at++;
    int join_prev = at > 0 && a->freel[at - 1].off + a->freel[at - 1].len == off;
    int join_next = at < a->n_free && off + len == a->freel[at].off;
    if (join_prev && join_next) {
        a->freel[at - 1].len += len + a->freel[at].len;
        rkm__free_remove(a, at);
    } else if (join_prev) {
        a->freel[at - 1].len += len;
    } else if (join_next) {
        a->freel[at].off = off;
        a->freel[at].len += len;
    } else {
        memmove(&a->freel[at + 1], &a->freel[at], (a->n_free - at) * sizeof *a->freel);
        a->freel[at].off = off;
        a->freel[at].len = len;
        a->n_free++;
    }
}

rkm_result rkm_arena_free(rkm_arena *a, uint64_t offset)
{
    if (!a) return RKM_ERROR_ARGUMENT;
    uint32_t at = rkm__used_lower(a, offset);
    if (at == a->n_used || a->used[at].off != offset)
        return rkm__err(a->ctx, RKM_ERROR_ARGUMENT,
                                "rkm_arena_free: no live block starts at offset %llu (a double free or a stray "
                                "offset)",
                                (unsigned long long)offset);
    rkm__arena_block b = a->used[at];
    memmove(&a->used[at], &a->used[at + 1], (a->n_used - at - 1) * sizeof *a->used);
    a->n_used--;
    a->current -= b.bytes;
    rkm__free_insert(a, b.off, b.len);
    return RKM_OK;
}

void rkm_arena_stats_get(const rkm_arena *a, rkm_arena_stats *out)
{
    out->capacity = a->capacity;
    out->current = a->current;
    out->peak = a->peak;
    out->high_water = a->high_water;
    out->blocks = a->n_used;
}

void rkm_arena_reset_peak(rkm_arena *a) { a->peak = a->current; }

/* --- Running a plan with buffers carved from an arena ---------------------- */

#define RKM__EXEC_MSG 512

/* Non-zero value the wrappers (and rkm_arena_exec_host_fail) return to
 * rkm_plan_execute for their own failures; the host's own values pass
 * through unchanged. */
#define RKM__EXEC_FAILED (-0x524b4d)

/* What x->why holds: nothing, a failed scratch request of the call in
 * progress (repeated if the host then fails), or the reason of a failure
 * (the executor's own message names only the callback). */
enum { RKM__WHY_NONE, RKM__WHY_SCRATCH, RKM__WHY_FAILED };

struct rkm_arena_exec {
    rkm_context *ctx; /* the graph's */
    const rkm_graph *g;
    int32_t n_tensors, n_ops;
    rkm_arena *arena;
    int measure;
    int has_host;
    rkm_callbacks host;
    uint64_t *t_off, *g_off, *p_off; /* offsets of live data, gradients, phantoms */
    uint64_t *fwd_ws, *bwd_ws;       /* measure mode: largest workspace per op */
    uint64_t input_bytes;
    void *base;         /* desc.allocate: the region, base_bytes long */
    size_t base_bytes;
    /* Layout mode (lay != NULL): rkm_plan_layout's buffers; each buffer the
     * run creates must be the next one, and takes its offset. */
    rkm_buffer *lay;
    size_t n_lay, lay_next, lay_inputs;
    /* The step in progress: every step calls exactly one of the wrappers,
     * so counting them gives the steps that carry no index (loss, frees). */
    int64_t step;
    /* The call in progress (in_call = 0 outside forward/backward). */
    int in_call;
    const char *call_what, *call_name; /* "forward of" / "backward of", the op */
    uint64_t ws_off, ws_len, ws_used;  /* plan mode: reserved block and cursor */
    uint64_t scratch[RKM_ARENA_MAX_SCRATCH];
    int n_scratch;
    int why_kind;                      /* RKM__WHY_* */
    rkm_result fail_code;
    char why[RKM__EXEC_MSG];
};

/* Keep the reason of a failure for the end of the run (prefixed with the
 * step during one); returns what the wrapper gives the executor. */
static int rkm__exec_vfail(rkm_arena_exec *x, rkm_result code, const char *fmt, va_list ap)
{
    int n = x->step >= 0 ? snprintf(x->why, sizeof x->why, "step %lld: ", (long long)x->step) : 0;
    if (n < 0) n = 0;
    vsnprintf(x->why + n, sizeof x->why - (size_t)n, fmt, ap);
    x->why_kind = RKM__WHY_FAILED;
    x->fail_code = code;
    return RKM__EXEC_FAILED;
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static int rkm__exec_fail(rkm_arena_exec *x, rkm_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = rkm__exec_vfail(x, code, fmt, ap);
    va_end(ap);
    return rc;
}

int rkm_arena_exec_host_fail(rkm_arena_exec *x, rkm_result code, const char *fmt, ...)
{
    if (!x || !fmt) return RKM__EXEC_FAILED;
    va_list ap;
    va_start(ap, fmt);
    int rc = rkm__exec_vfail(x, code, fmt, ap);
    va_end(ap);
    return rc;
}

static const char *const rkm__kind_names[] = {"tensor", "phantom", "gradient", "workspace"};

static const char *rkm__kind_name(int32_t kind)
{
    return kind >= 0 && kind <= RKM_BUFFER_WORKSPACE ? rkm__kind_names[kind] : "?";
}

/* A wrapper starts step `step`: a failed scratch request of an earlier
 * call that then went through is no reason for this one. */
static void rkm__exec_enter(rkm_arena_exec *x, int64_t step)
{
    x->step = step;
    if (x->why_kind == RKM__WHY_SCRATCH) x->why_kind = RKM__WHY_NONE;
}

/* Layout mode: the buffer (kind, index, bytes), created by the step in
 * progress, is the layout's next one; carve it at the layout's offset.
 * Returns 0 or a wrapper failure: another plan's buffers are misuse. */
/* Layout mode: the buffer (kind, index, bytes) that the step in progress
 * creates is the layout's next one (*out). Returns 0 or a wrapper failure:
 * another plan's buffers are misuse. */
static int rkm__exec_lay_next(rkm_arena_exec *x, int32_t kind, int32_t index, uint64_t bytes, const char *what,
                              const char *name, const rkm_buffer **out)
{
    if (x->lay_next == x->n_lay)
        return rkm__exec_fail(x, RKM_ERROR_STATE, "%s %s is not in the layout: its %llu buffers are taken", what,
                              name, (unsigned long long)x->n_lay);
    const rkm_buffer *b = *out = &x->lay[x->lay_next];
    if (b->kind != kind || b->index != index || b->first_step != x->step || b->bytes != bytes)
        return rkm__exec_fail(x, RKM_ERROR_STATE,
                              "%s %s (%llu bytes) is not the layout's buffer %llu: %s %d of step %lld, "
                              "%llu bytes; was the exec made for another plan?",
                              what, name, (unsigned long long)bytes, (unsigned long long)x->lay_next,
                              rkm__kind_name(b->kind), (int)b->index, (long long)b->first_step,
                              (unsigned long long)b->bytes);
    return 0;
}

static int rkm__exec_take_layout(rkm_arena_exec *x, uint64_t *slot, int32_t kind, int32_t index, uint64_t bytes,
                                 const char *what, const char *name)
{
    /* The layout lists no workspace of zero bytes. */
    if (kind == RKM_BUFFER_WORKSPACE && bytes == 0) {
        *slot = 0;
        return 0;
    }
    const rkm_buffer *b;
    int rc = rkm__exec_lay_next(x, kind, index, bytes, what, name, &b);
    if (rc) return rc;
    if (bytes > 0 && !rkm__arena_alloc_at(x->arena, b->offset, bytes))
        return rkm__exec_fail(x, RKM_ERROR_STATE,
                              "layout: %s %s (%llu bytes) at offset %llu overlaps a live buffer or ends past "
                              "the arena's %llu bytes; was the exec made for another plan?",
                              what, name, (unsigned long long)bytes, (unsigned long long)b->offset,
                              (unsigned long long)x->arena->capacity);
    x->lay_next++;
    *slot = b->offset;
    return 0;
}

/* Carve `bytes` into *slot (which must not be live): buffer `index` of
 * `kind`, created by the step in progress. Zero bytes are live (at offset
 * 0 in first fit, at the layout's offset in layout mode) and take no
 * block. Returns 0 or a wrapper failure. */
static int rkm__exec_take(rkm_arena_exec *x, uint64_t *slot, int32_t kind, int32_t index, uint64_t bytes,
                          const char *what, const char *name)
{
    if (*slot != RKM_ARENA_NONE)
        return rkm__exec_fail(x, RKM_ERROR_INTERNAL, "%s %s is created while live", what, name);
    if (x->lay) return rkm__exec_take_layout(x, slot, kind, index, bytes, what, name);
    if (bytes == 0) {
        *slot = 0;
        return 0;
    }
    if (rkm_arena_alloc(x->arena, bytes, slot) != RKM_OK)
        return rkm__exec_fail(x, RKM_ERROR_NOMEM, "arena full: %s %s needs %llu bytes, %llu of %llu bytes in use",
                              what, name, (unsigned long long)bytes, (unsigned long long)x->arena->current,
                              (unsigned long long)x->arena->capacity);
    return 0;
}

/* An in-place run: *to (not live) takes over the live buffer *from, which
 * stays readable until the call returns (rkm__exec_inplace_end). In layout
 * mode the buffer is the layout's next one, at *from's offset. */
static int rkm__exec_take_over(rkm_arena_exec *x, const uint64_t *from, uint64_t *to, int32_t kind, int32_t index,
                               uint64_t bytes, const char *what, const char *name)
{
    if (*to != RKM_ARENA_NONE || *from == RKM_ARENA_NONE)
        return rkm__exec_fail(x, RKM_ERROR_INTERNAL, "%s %s: an in-place run needs it not live and its input live", what,
                              name);
    if (x->lay) {
        const rkm_buffer *b;
        int rc = rkm__exec_lay_next(x, kind, index, bytes, what, name, &b);
        if (rc) return rc;
        if (b->takes_over < 0 || b->offset != *from)
            return rkm__exec_fail(x, RKM_ERROR_STATE, "%s %s runs in place at step %lld, but the layout's buffer %llu "
                                  "does not take over its input's; was the exec made for another plan?", what, name,
                                  (long long)x->step, (unsigned long long)x->lay_next);
        x->lay_next++;
    }
    *to = *from;
    return 0;
}

/* After an in-place call (or its failure): the buffer taken over is no
 * longer its input's. */
static void rkm__exec_inplace_end(rkm_arena_exec *x, const rkm_fwd_call *f, const rkm_bwd_call *b)
{
    uint64_t *from = f && f->n_out && f->out_new[0] == RKM_OUT_INPLACE ? &x->t_off[f->in[0]]
                     : b && b->n_in && b->in_grad[0] == RKM_GRAD_INPLACE ? &x->g_off[b->out[0]] : NULL;
    const uint64_t *to = f ? &x->t_off[f->out[0]] : b ? &x->g_off[b->in[0]] : NULL;
    if (from && *from == *to) *from = RKM_ARENA_NONE;
}

/* Release *slot (of `bytes`) and mark it not live. */
static int rkm__exec_give(rkm_arena_exec *x, uint64_t *slot, uint64_t bytes, const char *what, const char *name)
{
    if (*slot == RKM_ARENA_NONE)
        return rkm__exec_fail(x, RKM_ERROR_INTERNAL, "%s %s is freed but not live", what, name);
    if (bytes > 0 && rkm_arena_free(x->arena, *slot) != RKM_OK)
        return rkm__exec_fail(x, RKM_ERROR_INTERNAL, "%s %s: the arena has no block at its offset %llu", what, name,
                              (unsigned long long)*slot);
    *slot = RKM_ARENA_NONE;
    return 0;
}

/* Before a forward/backward call: reserve the declared workspace (plan
 * mode) or start measuring (measure mode). */
static int rkm__exec_call_begin(rkm_arena_exec *x, uint64_t declared_ws, int32_t op)
{
    x->in_call = 1;
    x->n_scratch = 0;
    x->ws_used = 0;
    x->ws_len = 0;
    x->ws_off = RKM_ARENA_NONE;
    if (x->measure) {
        rkm_arena_reset_peak(x->arena);
        return 0;
    }
    x->ws_len = declared_ws;
    return rkm__exec_take(x, &x->ws_off, RKM_BUFFER_WORKSPACE, op, declared_ws, "workspace of", x->call_name);
}

/* After the call: release the workspace and keep the one measured. */
static int rkm__exec_call_end(rkm_arena_exec *x, uint64_t live_before, uint64_t created, uint64_t run_peak,
                              uint64_t *measured)
{
    int rc = 0;
    x->in_call = 0;
    if (!x->measure) return rkm__exec_give(x, &x->ws_off, x->ws_len, "workspace of", x->call_name);
    uint64_t ws = x->arena->peak - live_before - created;
    if (ws > *measured) *measured = ws;
    for (int i = 0; i < x->n_scratch && !rc; i++)
        if (rkm_arena_free(x->arena, x->scratch[i]) != RKM_OK)
            rc = rkm__exec_fail(x, RKM_ERROR_INTERNAL, "scratch buffer of %s at offset %llu: no block there",
                                x->call_name, (unsigned long long)x->scratch[i]);
    x->n_scratch = 0;
    /* The step's peak is the larger of the run so far and this call. */
    if (run_peak > x->arena->peak) x->arena->peak = run_peak;
    return rc;
}

/* What a forward creates: its new outputs and, with save, its phantom. */
static int rkm__exec_fwd_creates(rkm_arena_exec *x, const rkm_fwd_call *call, uint64_t *created)
{
    int rc = 0;
    for (int32_t k = 0; k < call->n_out && !rc; k++) {
        if (call->out_new[k] == RKM_OUT_LIVE) continue;
        const rkm__tensor *t = &x->g->tensors[call->out[k]];
        uint64_t *slot = &x->t_off[call->out[k]];
        if (call->out_new[k] == RKM_OUT_INPLACE) {
            rc = rkm__exec_take_over(x, &x->t_off[call->in[0]], slot, RKM_BUFFER_TENSOR, call->out[k], t->bytes, "tensor",
                                     t->name);
            continue;
        }
        rc = rkm__exec_take(x, slot, RKM_BUFFER_TENSOR, call->out[k], t->bytes, "tensor", t->name);
        *created += t->bytes;
    }
    if (!rc && call->save) {
        rc = rkm__exec_take(x, &x->p_off[call->op], RKM_BUFFER_PHANTOM, call->op, call->phantom, "saved state of",
                            x->call_name);
        *created += call->phantom;
    }
    return rc;
}

/* What a backward creates: its new input gradients; those it accumulates
 * into are live already. */
static int rkm__exec_bwd_creates(rkm_arena_exec *x, const rkm_bwd_call *call, uint64_t *created)
{
    int rc = 0;
    for (int32_t k = 0; k < call->n_in && !rc; k++) {
        int32_t id = call->in[k];
        const rkm__tensor *t = &x->g->tensors[id];
        if (call->in_grad[k] == RKM_GRAD_NEW) {
            rc = rkm__exec_take(x, &x->g_off[id], RKM_BUFFER_GRAD, id, t->bytes, "gradient of", t->name);
            *created += t->bytes;
        } else if (call->in_grad[k] == RKM_GRAD_INPLACE) {
            rc = rkm__exec_take_over(x, &x->g_off[call->out[0]], &x->g_off[id], RKM_BUFFER_GRAD, id, t->bytes,
                                     "gradient of", t->name);
        } else if (call->in_grad[k] == RKM_GRAD_ACCUMULATE && x->g_off[id] == RKM_ARENA_NONE) {
            rc = rkm__exec_fail(x, RKM_ERROR_INTERNAL, "gradient of %s is accumulated into but not live", t->name);
        }
    }
    return rc;
}

/* A forward (f) or backward (b) call: its buffers, its workspace, the
 * host's call, the workspace back. */
static int rkm__exec_call(rkm_arena_exec *x, int32_t op, int64_t step, uint64_t ws, const rkm_fwd_call *f,
                          const rkm_bwd_call *b)
{
    rkm__exec_enter(x, step);
    x->call_what = f ? "forward of" : "backward of";
    x->call_name = x->g->ops[op].name;
    uint64_t live_before = x->arena->current, run_peak = x->arena->peak, created = 0;
    int rc = f ? rkm__exec_fwd_creates(x, f, &created) : rkm__exec_bwd_creates(x, b, &created);
    if (rc || (rc = rkm__exec_call_begin(x, ws, op))) {
        rkm__exec_inplace_end(x, f, b);
        return rc;
    }
    if (x->has_host) rc = f ? x->host.forward(x->host.user, f) : x->host.backward(x->host.user, b);
    rkm__exec_inplace_end(x, f, b);
    int rc2 = rkm__exec_call_end(x, live_before, created, run_peak, f ? &x->fwd_ws[op] : &x->bwd_ws[op]);
    return rc ? rc : rc2;
}

static int rkm__exec_forward(void *user, const rkm_fwd_call *call)
{
    return rkm__exec_call(user, call->op, call->step, call->ws_bytes, call, NULL);
}

static int rkm__exec_backward(void *user, const rkm_bwd_call *call)
{
    return rkm__exec_call(user, call->op, call->step, call->ws_bytes, NULL, call);
}

static int rkm__exec_loss(void *user, const rkm_buffer_call *call)
{
    rkm_arena_exec *x = user;
    int32_t t = call->index;
    rkm__exec_enter(x, call->step);
    int rc = rkm__exec_take(x, &x->g_off[t], RKM_BUFFER_GRAD, t, call->bytes, "gradient of", rkm__tensor_name_of(x->g, t));
    if (!rc && x->has_host && x->host.loss) rc = x->host.loss(x->host.user, call);
    return rc;
}

/* Frees: the host hears first (its kernels that read the buffer are already
 * on the stream), then the range goes back to the arena. With one stream,
 * any kernel that later reuses the range is queued after those readers, so
 * releasing at once is safe in stream order: no synchronisation needed.
 * kind: the buffer kind, which says the slot table and the host's hook. */
static int rkm__exec_free(rkm_arena_exec *x, int32_t kind, const rkm_buffer_call *call)
{
    int (*hook)(void *, const rkm_buffer_call *) = kind == RKM_BUFFER_TENSOR ? x->host.free_tensor
                                                   : kind == RKM_BUFFER_GRAD ? x->host.free_grad
                                                                             : x->host.free_saved;
    int32_t id = call->index;
    rkm__exec_enter(x, call->step);
    int rc = x->has_host && hook ? hook(x->host.user, call) : 0;
    if (rc) return rc;
    if (kind == RKM_BUFFER_TENSOR)
        return rkm__exec_give(x, &x->t_off[id], call->bytes, "tensor", rkm__tensor_name_of(x->g, id));
    if (kind == RKM_BUFFER_GRAD)
        return rkm__exec_give(x, &x->g_off[id], call->bytes, "gradient of", rkm__tensor_name_of(x->g, id));
    return rkm__exec_give(x, &x->p_off[id], call->bytes, "saved state of", x->g->ops[id].name);
}

static int rkm__exec_free_tensor(void *user, const rkm_buffer_call *c) { return rkm__exec_free(user, RKM_BUFFER_TENSOR, c); }
static int rkm__exec_free_saved(void *user, const rkm_buffer_call *c) { return rkm__exec_free(user, RKM_BUFFER_PHANTOM, c); }
static int rkm__exec_free_grad(void *user, const rkm_buffer_call *c) { return rkm__exec_free(user, RKM_BUFFER_GRAD, c); }

void rkm_arena_exec_destroy(rkm_arena_exec *x)
{
    if (!x) return;
    size_t nt = (size_t)x->n_tensors, no = (size_t)x->n_ops;
    rkm_arena_destroy(x->arena);
    rkm__free(x->ctx, x->t_off, (nt * 2 + no * 3) * sizeof *x->t_off);
    rkm__free(x->ctx, x->lay, x->n_lay * sizeof *x->lay);
    rkm__free(x->ctx, x->base, x->base_bytes);
    rkm__free(x->ctx, x, sizeof *x);
}

/* Carve the inputs, in id order, from the empty arena (step -1). */
static rkm_result rkm__exec_take_inputs(rkm_arena_exec *x, const char *fn)
{
    for (int32_t t = 0; t < x->n_tensors; t++) {
        const rkm__tensor *ti = &x->g->tensors[t];
        if (!(ti->flags & RKM_TENSOR_INPUT)) continue;
        if (rkm__exec_take(x, &x->t_off[t], RKM_BUFFER_TENSOR, t, ti->bytes, "input", ti->name))
            return rkm__err(x->ctx, x->fail_code, "%s: %s", fn, x->why);
        x->input_bytes += ti->bytes;
    }
    return RKM_OK;
}

/* The exec's tables and its arena: over the plan's layout (layout mode,
 * plan not NULL) or over d->capacity (first fit). */
static rkm_result rkm__exec_tables(rkm_arena_exec *x, const rkm_arena_exec_desc *d, const rkm_plan *plan,
                                   const char *fn)
{
    size_t nt = (size_t)x->n_tensors, no = (size_t)x->n_ops;
    uint64_t capacity = d->capacity;
    x->t_off = rkm__calloc(x->ctx, nt * 2 + no * 3, sizeof *x->t_off);
    if (!x->t_off)
        return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: no memory for the offsets of %zu tensors and %zu ops",
                                fn, nt, no);
    if (plan) {
        x->n_lay = plan->n_buffers;
        x->lay = rkm__calloc(x->ctx, x->n_lay, sizeof *x->lay);
        if (!x->lay)
            return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: no memory for the layout's %zu buffers", fn,
                                    x->n_lay);
        rkm_result r = rkm_plan_layout(plan, 0, x->lay, &capacity); /* the plan's own */
        if (r != RKM_OK) return r;
    }
    x->g_off = x->t_off + nt;
    x->p_off = x->g_off + nt;
    x->fwd_ws = x->p_off + no;
    x->bwd_ws = x->fwd_ws + no;
    for (size_t i = 0; i < nt * 2 + no; i++) x->t_off[i] = RKM_ARENA_NONE;
    /* Live at once: data and gradient per tensor, a phantom per op, and one
     * workspace or RKM_ARENA_MAX_SCRATCH scratch buffers. */
    uint64_t blocks = (uint64_t)nt * 2 + no + RKM_ARENA_MAX_SCRATCH + 1;
    if (blocks >= UINT32_MAX)
        return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: %llu live blocks are more than an arena holds", fn,
                                (unsigned long long)blocks);
    rkm_result r = rkm_arena_create(x->ctx, capacity, (uint32_t)blocks, &x->arena);
    /* the alignment the plan was laid out at (a plan without a layout gets
     * one at RKM_ARENA_ALIGN) */
    if (r == RKM_OK && plan && plan->stats.alignment) x->arena->align = plan->stats.alignment;
    return r;
}

/* desc.allocate: the one block of the arena's capacity, from the context's
 * allocator. */
static rkm_result rkm__exec_region(rkm_arena_exec *x, const char *fn)
{
    uint64_t bytes = x->arena->capacity;
    if (bytes <= SIZE_MAX) x->base = rkm__alloc(x->ctx, (size_t)bytes);
    if (!x->base)
        return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: no memory for the arena's region of %llu bytes", fn,
                        (unsigned long long)bytes);
    x->base_bytes = (size_t)bytes;
    return RKM_OK;
}

/* The desc's rules, for both modes. */
static rkm_result rkm__exec_check_desc(rkm_context *ctx, const rkm_arena_exec_desc *d, const rkm_plan *plan,
                                       const char *fn)
{
    if (!d->graph->finalized)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the graph is not finalized", fn);
    if (d->host && (!d->host->forward || !d->host->backward))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the host's forward and backward are required", fn);
    if (d->allocate && !plan && d->capacity == RKM_ARENA_UNBOUNDED)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: allocate needs a bounded capacity", fn);
    if (plan && d->measure)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: layout mode does not measure (measure must be 0)", fn);
    if (plan && plan->g != d->graph)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the plan is not of the desc's graph", fn);
    return RKM_OK;
}

/* Both modes: layout (plan not NULL) or first fit. */
static rkm_result rkm__exec_create(const rkm_arena_exec_desc *d, const rkm_plan *plan, rkm_arena_exec **out,
                                   const char *fn)
{
    if (out) *out = NULL;
    if (!d || !d->graph) return RKM_ERROR_ARGUMENT; /* no context to tell */
    rkm_context *ctx = d->graph->ctx;
    if (!out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: out is NULL", fn);
    rkm_result r = rkm__exec_check_desc(ctx, d, plan, fn);
    if (r != RKM_OK) return r;
    rkm_arena_exec *x = rkm__calloc(ctx, 1, sizeof *x);
    if (!x) return rkm__err(ctx, RKM_ERROR_NOMEM, "%s: no memory for the exec", fn);
    x->ctx = ctx;
    x->g = d->graph;
    x->step = -1;
    x->n_tensors = (int32_t)d->graph->n_tensors;
    x->n_ops = (int32_t)d->graph->n_ops;
    x->measure = d->measure != 0;
    x->has_host = d->host != NULL;
    if (d->host) x->host = *d->host;
    r = rkm__exec_tables(x, d, plan, fn);
    if (r == RKM_OK && d->allocate) r = rkm__exec_region(x, fn);
    if (r == RKM_OK) r = rkm__exec_take_inputs(x, fn);
    if (r != RKM_OK) {
        rkm_arena_exec_destroy(x);
        return r;
    }
    x->lay_inputs = x->lay_next;
    *out = x;
    return RKM_OK;
}

rkm_result rkm_arena_exec_create(const rkm_arena_exec_desc *d, rkm_arena_exec **out)
{
    return rkm__exec_create(d, NULL, out, "rkm_arena_exec_create");
}

rkm_result rkm_arena_exec_create_layout(const rkm_arena_exec_desc *d, const rkm_plan *plan, rkm_arena_exec **out)
{
    if (d && d->graph && !plan) {
        if (out) *out = NULL;
        return rkm__err(d->graph->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_create_layout: plan is NULL");
    }
    return rkm__exec_create(d, plan, out, "rkm_arena_exec_create_layout");
}

int rkm_arena_exec_is_layout(const rkm_arena_exec *x) { return x && x->lay != NULL; }

/* Release the live buffer *slot of `bytes` (after a failed step). */
static void rkm__exec_drop(rkm_arena_exec *x, uint64_t *slot, uint64_t bytes)
{
    if (*slot == RKM_ARENA_NONE) return;
    if (bytes) (void)rkm_arena_free(x->arena, *slot);
    *slot = RKM_ARENA_NONE;
}

/* After a failed step: release everything but the inputs. */
static void rkm__exec_release(rkm_arena_exec *x)
{
    for (int32_t t = 0; t < x->n_tensors; t++) {
        const rkm__tensor *ti = &x->g->tensors[t];
        if (!(ti->flags & RKM_TENSOR_INPUT)) rkm__exec_drop(x, &x->t_off[t], ti->bytes);
        rkm__exec_drop(x, &x->g_off[t], ti->bytes);
    }
    for (int32_t o = 0; o < x->n_ops; o++) rkm__exec_drop(x, &x->p_off[o], x->g->ops[o].phantom);
    rkm__exec_drop(x, &x->ws_off, x->ws_len);
    for (int i = 0; i < x->n_scratch; i++) (void)rkm_arena_free(x->arena, x->scratch[i]);
    x->n_scratch = 0;
    x->in_call = 0;
}

/* After a plan that ran through: every buffer it created is gone, and in
 * layout mode it created the layout's buffers, all of them. */
static int rkm__exec_check_end(rkm_arena_exec *x, size_t num_steps)
{
    x->step = -1;
    if (x->lay && x->lay_next != x->n_lay)
        return rkm__exec_fail(x, RKM_ERROR_STATE, "after its %zu steps the plan created %llu of the layout's %llu "
                              "buffers; was the exec made for another plan?", num_steps,
                              (unsigned long long)x->lay_next, (unsigned long long)x->n_lay);
    if (x->arena->current != x->input_bytes)
        return rkm__exec_fail(x, RKM_ERROR_INTERNAL, "after its %zu steps the plan leaves %llu bytes besides the "
                              "inputs live", num_steps, (unsigned long long)(x->arena->current - x->input_bytes));
    return 0;
}

/* The run's message: the reason a wrapper or the host kept, else the
 * executor's (a host's own failure), with a failed scratch request of that
 * call after it. */
static rkm_result rkm__exec_report(rkm_arena_exec *x, rkm_result r)
{
    if (x->why_kind == RKM__WHY_FAILED) return rkm__err(x->ctx, x->fail_code, "%s", x->why);
    if (x->why_kind != RKM__WHY_SCRATCH || r != RKM_ERROR_CALLBACK) return r;
    char executor[RKM__EXEC_MSG];
    snprintf(executor, sizeof executor, "%s", rkm_context_errmsg(x->ctx));
    return rkm__err(x->ctx, r, "%s, after %s", executor, x->why);
}

rkm_result rkm_arena_exec_run(rkm_arena_exec *x, const rkm_plan *plan)
{
    if (!x) return RKM_ERROR_ARGUMENT;
    if (!plan) return rkm__err(x->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_run: plan is NULL");
    if (plan->g != x->g)
        return rkm__err(x->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_run: the plan is not of the exec's graph");
    rkm_callbacks cb = {x, rkm__exec_forward, rkm__exec_backward, rkm__exec_loss, rkm__exec_free_tensor,
                        rkm__exec_free_saved, rkm__exec_free_grad};
    x->why_kind = RKM__WHY_NONE;
    x->lay_next = x->lay_inputs;
    x->step = -1;
    rkm_arena_reset_peak(x->arena);
    rkm_result r = rkm_plan_execute(plan, &cb);
    if (r == RKM_OK && rkm__exec_check_end(x, plan->n_steps)) r = x->fail_code;
    if (r == RKM_OK) return RKM_OK;
    rkm__exec_release(x);
    return rkm__exec_report(x, r);
}

uint64_t rkm_arena_exec_tensor(const rkm_arena_exec *x, int32_t t)
{
    return x && t >= 0 && t < x->n_tensors ? x->t_off[t] : RKM_ARENA_NONE;
}

uint64_t rkm_arena_exec_grad(const rkm_arena_exec *x, int32_t t)
{
    return x && t >= 0 && t < x->n_tensors ? x->g_off[t] : RKM_ARENA_NONE;
}

uint64_t rkm_arena_exec_saved(const rkm_arena_exec *x, int32_t op)
{
    return x && op >= 0 && op < x->n_ops ? x->p_off[op] : RKM_ARENA_NONE;
}

void *rkm_arena_exec_base(const rkm_arena_exec *x) { return x ? x->base : NULL; }

void *rkm_arena_ptr(void *base, uint64_t offset)
{
    return base && offset != RKM_ARENA_NONE ? (char *)base + offset : NULL;
}

/* A failed scratch request: the message now (the host may read it) and,
 * unless a failure is kept already, again in the run's if the host fails. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
static rkm_result rkm__scratch_fail(rkm_arena_exec *x, rkm_result code, const char *fmt, ...)
{
    char msg[RKM__EXEC_MSG];
    int n = snprintf(msg, sizeof msg, "rkm_arena_exec_scratch: %s %s (step %lld): ", x->call_what, x->call_name,
                     (long long)x->step);
    if (n < 0 || (size_t)n >= sizeof msg) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (x->why_kind != RKM__WHY_FAILED) {
        memcpy(x->why, msg, sizeof msg);
        x->why_kind = RKM__WHY_SCRATCH;
    }
    return rkm__err(x->ctx, code, "%s", msg);
}

/* Plan mode: cut from the reserved block; the last buffer may be short of
 * its aligned size, as the declared workspace is exact. */
static rkm_result rkm__scratch_cut(rkm_arena_exec *x, uint64_t bytes, uint64_t aligned, uint64_t *offset)
{
    uint64_t left = x->ws_len - x->ws_used;
    if (left < bytes)
        return rkm__scratch_fail(x, RKM_ERROR_NOMEM,
                                 "%llu bytes, but %llu of the declared workspace of %llu bytes are left",
                                 (unsigned long long)bytes, (unsigned long long)left, (unsigned long long)x->ws_len);
    *offset = x->ws_off + x->ws_used;
    x->ws_used += left < aligned ? left : aligned;
    return RKM_OK;
}

rkm_result rkm_arena_exec_scratch(rkm_arena_exec *x, uint64_t bytes, uint64_t *offset)
{
    if (!x) return RKM_ERROR_ARGUMENT;
    if (!offset) return rkm__err(x->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_scratch: offset is NULL");
    *offset = RKM_ARENA_NONE;
    if (!x->in_call)
        return rkm__err(x->ctx, RKM_ERROR_STATE,
                                "rkm_arena_exec_scratch: outside a forward or backward callback (scratch lives "
                                "during one call)");
    if (bytes == 0) {
        *offset = 0;
        return RKM_OK;
    }
    if (bytes > UINT64_MAX - x->arena->align)
        return rkm__scratch_fail(x, RKM_ERROR_NOMEM, "%llu bytes", (unsigned long long)bytes);
    uint64_t aligned = rkm__arena_aligned(x->arena, bytes);
    if (!x->measure) return rkm__scratch_cut(x, bytes, aligned, offset);
    if (x->n_scratch == RKM_ARENA_MAX_SCRATCH)
        return rkm__scratch_fail(x, RKM_ERROR_NOMEM, "more than %d scratch buffers in one call",
                                 RKM_ARENA_MAX_SCRATCH);
    if (rkm_arena_alloc(x->arena, aligned, offset) != RKM_OK)
        return rkm__scratch_fail(x, RKM_ERROR_NOMEM, "%llu bytes: %llu of the arena's %llu bytes are in use",
                                 (unsigned long long)bytes, (unsigned long long)x->arena->current,
                                 (unsigned long long)x->arena->capacity);
    x->scratch[x->n_scratch++] = *offset;
    return RKM_OK;
}

void rkm_arena_exec_measured_ws(const rkm_arena_exec *x, int32_t op, uint64_t *fwd_ws, uint64_t *bwd_ws)
{
    int ok = x && op >= 0 && op < x->n_ops;
    if (fwd_ws) *fwd_ws = ok ? x->fwd_ws[op] : 0;
    if (bwd_ws) *bwd_ws = ok ? x->bwd_ws[op] : 0;
}

void rkm_arena_exec_arena_stats(const rkm_arena_exec *x, rkm_arena_stats *out) { rkm_arena_stats_get(x->arena, out); }

rkm_result rkm_arena_layout(const rkm_plan *plan, rkm_arena_layout_info *out)
{
    if (!plan) return RKM_ERROR_ARGUMENT;
    const rkm_graph *g = plan->g;
    rkm_context *ctx = plan->ctx;
    if (!out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_layout: out is NULL");
    memset(out, 0, sizeof *out);
    rkm_arena_exec_desc d = {.graph = g, .capacity = RKM_ARENA_UNBOUNDED};
    rkm_arena_exec *x;
    rkm_result r = rkm_arena_exec_create(&d, &x);
    if (r != RKM_OK) return r;
    r = rkm_arena_exec_run(x, plan);
    rkm_arena_stats st;
    rkm_arena_stats_get(x->arena, &st);
    rkm_arena_exec_destroy(x);
    if (r != RKM_OK) return r;
    if (st.peak != plan->stats.peak)
        return rkm__err(ctx, RKM_ERROR_INTERNAL, "rkm_arena_layout: the arena's peak %llu differs from the plan's "
                        "peak %llu", (unsigned long long)st.peak, (unsigned long long)plan->stats.peak);
    out->peak = st.peak;
    out->capacity = st.high_water;
    out->slack = st.high_water - st.peak;
    return RKM_OK;
}
