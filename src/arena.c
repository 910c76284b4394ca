/* arena.c -- the arena: an offset allocator, plans run in one allocation
 *
 * Uses (through internal.h): base.c, graph.c, layout.c, exec.c. */
#include "internal.h"

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
    if (out) *out = NULL;
    if (!ctx) return RKM_ERROR_ARGUMENT;
    if (!out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_create: out is NULL");
    if (max_blocks == 0 || max_blocks == UINT32_MAX)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_create: max_blocks %lu is not in 1..%lu",
                                (unsigned long)max_blocks, (unsigned long)UINT32_MAX - 1);
    rkm_arena *a = rkm__calloc(ctx, 1, sizeof *a);
    if (a) {
        a->ctx = ctx;
        rkm__ctx_hold(ctx);
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
    rkm__ctx_free_holder(a->ctx, a, sizeof *a);
}

void rkm_arena_clear(rkm_arena *a)
{
    if (!a) return;
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

/* A NULL arena reads as an empty one, and says so. */
rkm_result rkm_arena_stats_get(const rkm_arena *a, rkm_arena_stats *out)
{
    if (!out) return a ? rkm__err(a->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_stats_get: out is NULL")
                       : RKM_ERROR_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (!a) return RKM_ERROR_ARGUMENT;
    out->capacity = a->capacity;
    out->current = a->current;
    out->peak = a->peak;
    out->high_water = a->high_water;
    out->blocks = a->n_used;
    return RKM_OK;
}

void rkm_arena_reset_peak(rkm_arena *a)
{
    if (a) a->peak = a->current;
}

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
    rkm_arena_mode mode;
    int measure;      /* mode == RKM_ARENA_MEASURE */
    int has_host;
    rkm_callbacks host;
    uint64_t *t_off, *g_off, *p_off; /* offsets of live data, gradients, phantoms */
    uint64_t *fwd_ws, *bwd_ws;       /* measure mode: largest workspace per op */
    uint64_t input_bytes;
    void *base;         /* desc.allocate: the region, aligned as the offsets are */
    void *block;        /* the allocation that holds it, block_bytes long */
    size_t block_bytes;
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

/* Copy steps: a prefetch carves the tensor's new buffer before the host
 * starts the copy into it; the others touch no device buffer. */
static int rkm__exec_copy(rkm_arena_exec *x, const rkm_copy_call *call, int (*hook)(void *, const rkm_copy_call *))
{
    rkm__exec_enter(x, call->step);
    return x->has_host && hook ? hook(x->host.user, call) : 0;
}

static int rkm__exec_offload(void *user, const rkm_copy_call *c)
{
    rkm_arena_exec *x = user;
    return rkm__exec_copy(x, c, x->host.offload);
}

static int rkm__exec_prefetch(void *user, const rkm_copy_call *c)
{
    rkm_arena_exec *x = user;
    rkm__exec_enter(x, c->step); /* before the take, whose failure names the step */
    int32_t i = c->index;
    int rc = c->saved ? rkm__exec_take(x, &x->p_off[i], RKM_BUFFER_PHANTOM, i, c->bytes, "saved state of", x->g->ops[i].name)
                      : rkm__exec_take(x, &x->t_off[i], RKM_BUFFER_TENSOR, i, c->bytes, "tensor",
                                       rkm__tensor_name_of(x->g, i));
    return rc ? rc : rkm__exec_copy(x, c, x->host.prefetch);
}

static int rkm__exec_wait(void *user, const rkm_copy_call *c)
{
    rkm_arena_exec *x = user;
    return rkm__exec_copy(x, c, x->host.wait);
}

static int rkm__exec_free_host(void *user, const rkm_copy_call *c)
{
    rkm_arena_exec *x = user;
    return rkm__exec_copy(x, c, x->host.free_host);
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
    rkm__free(x->ctx, x->block, x->block_bytes);
    rkm__graph_free_holder(x->ctx, x, sizeof *x, x->g);
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

/* The exec's tables and its arena over `capacity` bytes; in layout mode
 * also the plan's layout, whose arena is the capacity when none was given. */
static rkm_result rkm__exec_tables(rkm_arena_exec *x, const rkm_arena_exec_desc *d, uint64_t capacity)
{
    const char *fn = "rkm_arena_exec_create";
    size_t nt = (size_t)x->n_tensors, no = (size_t)x->n_ops;
    x->t_off = rkm__calloc(x->ctx, nt * 2 + no * 3, sizeof *x->t_off);
    if (!x->t_off)
        return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: no memory for the offsets of %zu tensors and %zu ops",
                                fn, nt, no);
    if (d->mode == RKM_ARENA_LAYOUT) {
        x->n_lay = d->plan->n_buffers;
        x->lay = rkm__calloc(x->ctx, x->n_lay, sizeof *x->lay);
        if (!x->lay)
            return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: no memory for the layout's %zu buffers", fn,
                                    x->n_lay);
        uint64_t arena_bytes;
        rkm_result r = rkm_plan_layout(d->plan, 0, x->lay, &arena_bytes); /* the plan's own */
        if (r != RKM_OK) return r;
        if (capacity && capacity < arena_bytes)
            return rkm__err(x->ctx, RKM_ERROR_ARGUMENT, "%s: capacity %llu is below the plan's arena of %llu "
                            "bytes (layout mode; 0 takes the arena)", fn, (unsigned long long)capacity,
                            (unsigned long long)arena_bytes);
        if (!capacity) capacity = arena_bytes;
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
    if (r == RKM_OK && x->lay && d->plan->stats.alignment) x->arena->align = d->plan->stats.alignment;
    return r;
}

/* desc.allocate: the region of the arena's capacity, from the context's
 * allocator, its base aligned as the offsets are (the arena's alignment),
 * so that every buffer's address is: the allocator promises no alignment
 * of its own, so the block is alignment - 1 bytes longer and the base is
 * its first aligned byte. */
static rkm_result rkm__exec_region(rkm_arena_exec *x)
{
    const char *fn = "rkm_arena_exec_create";
    uint64_t bytes = x->arena->capacity, align = x->arena->align, pad = align - 1;
    if (bytes > UINT64_MAX - pad || bytes + pad > SIZE_MAX)
        return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: the arena's region of %llu bytes, plus %llu to align its "
                        "base to %llu, is more than an allocation holds", fn, (unsigned long long)bytes,
                        (unsigned long long)pad, (unsigned long long)align);
    x->block = rkm__alloc(x->ctx, (size_t)(bytes + pad));
    if (!x->block)
        return rkm__err(x->ctx, RKM_ERROR_NOMEM, "%s: no memory for the arena's region of %llu bytes (%llu with "
                        "the padding that aligns its base to %llu)", fn, (unsigned long long)bytes,
                        (unsigned long long)(bytes + pad), (unsigned long long)align);
    x->block_bytes = (size_t)(bytes + pad);
    x->base = (char *)x->block + (align - (uint64_t)(uintptr_t)x->block % align) % align;
    return RKM_OK;
}

/* The desc's rules: each field means the same in every mode. */
static rkm_result rkm__exec_check_desc(rkm_context *ctx, const rkm_arena_exec_desc *d)
{
    const char *fn = "rkm_arena_exec_create";
    if (!d->graph->finalized) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the graph is not finalized", fn);
    if (d->mode != RKM_ARENA_LAYOUT && d->mode != RKM_ARENA_FIRST_FIT && d->mode != RKM_ARENA_MEASURE)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: mode %d is not RKM_ARENA_LAYOUT (0), RKM_ARENA_FIRST_FIT "
                        "(1) or RKM_ARENA_MEASURE (2)", fn, (int)d->mode);
    if (d->mode == RKM_ARENA_LAYOUT && !d->plan)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: layout mode (mode 0) needs desc.plan, the plan whose "
                        "layout it follows", fn);
    if (!d->plan && !d->capacity)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: capacity 0 sizes the region for desc.plan, which is NULL",
                        fn);
    if (d->plan && d->plan->g != d->graph)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: desc.plan is not of desc.graph", fn);
    if (d->host && (!d->host->forward || !d->host->backward))
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: the host's forward and backward are required", fn);
    if (d->allocate && d->capacity == RKM_ARENA_UNBOUNDED)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "%s: allocate needs a bounded capacity", fn);
    return RKM_OK;
}

/* The exec and its region (x is half-built until the inputs are carved). */
static rkm_result rkm__exec_build(rkm_arena_exec *x, const rkm_arena_exec_desc *d)
{
    uint64_t capacity = d->capacity;
    rkm_result r = RKM_OK;
    if (!capacity && d->mode != RKM_ARENA_LAYOUT) { /* the layout's arena comes with its tables */
        rkm_arena_capacity_info need;
        r = rkm_arena_capacity(d->plan, d->mode, &need);
        capacity = need.capacity;
    }
    if (r == RKM_OK) r = rkm__exec_tables(x, d, capacity);
    if (r == RKM_OK && d->allocate) r = rkm__exec_region(x);
    if (r == RKM_OK) r = rkm__exec_take_inputs(x, "rkm_arena_exec_create");
    return r;
}

rkm_result rkm_arena_exec_create(const rkm_arena_exec_desc *d, rkm_arena_exec **out)
{
    if (out) *out = NULL;
    if (!d || !d->graph) return RKM_ERROR_ARGUMENT; /* no context to tell */
    rkm_context *ctx = d->graph->ctx;
    if (!out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_create: out is NULL");
    rkm_result r = rkm__exec_check_desc(ctx, d);
    if (r != RKM_OK) return r;
    rkm_arena_exec *x = rkm__calloc(ctx, 1, sizeof *x);
    if (!x) return rkm__err(ctx, RKM_ERROR_NOMEM, "rkm_arena_exec_create: no memory for the exec");
    x->ctx = ctx;
    x->g = d->graph;
    rkm__graph_hold(x->g);
    x->step = -1;
    x->n_tensors = (int32_t)d->graph->n_tensors;
    x->n_ops = (int32_t)d->graph->n_ops;
    x->mode = d->mode;
    x->measure = d->mode == RKM_ARENA_MEASURE;
    x->has_host = d->host != NULL;
    if (d->host) x->host = *d->host;
    if ((r = rkm__exec_build(x, d)) != RKM_OK) {
        rkm_arena_exec_destroy(x);
        return r;
    }
    x->lay_inputs = x->lay_next;
    *out = x;
    return RKM_OK;
}

rkm_arena_mode rkm_arena_exec_mode(const rkm_arena_exec *x) { return x ? x->mode : RKM_ARENA_LAYOUT; }

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
    if (plan->peer && x->has_host && (!x->host.offload || !x->host.prefetch || !x->host.wait))
        return rkm__err(x->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_run: the plan copies tensors to the host: the "
                        "host's offload, prefetch and wait callbacks are required");
    rkm_callbacks cb = {.user = x, .forward = rkm__exec_forward, .backward = rkm__exec_backward,
                        .loss = rkm__exec_loss, .free_tensor = rkm__exec_free_tensor,
                        .free_saved = rkm__exec_free_saved, .free_grad = rkm__exec_free_grad,
                        .offload = rkm__exec_offload, .prefetch = rkm__exec_prefetch, .wait = rkm__exec_wait,
                        .free_host = rkm__exec_free_host};
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

rkm_result rkm_arena_exec_measured_ws(const rkm_arena_exec *x, int32_t op, uint64_t *fwd_ws, uint64_t *bwd_ws)
{
    int ok = x && op >= 0 && op < x->n_ops;
    if (fwd_ws) *fwd_ws = ok ? x->fwd_ws[op] : 0;
    if (bwd_ws) *bwd_ws = ok ? x->bwd_ws[op] : 0;
    if (!x) return RKM_ERROR_ARGUMENT;
    if (!ok)
        return rkm__err(x->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_measured_ws: op %d is not in 0..%d",
                        (int)op, (int)x->n_ops - 1);
    return RKM_OK;
}

rkm_result rkm_arena_exec_stats_get(const rkm_arena_exec *x, rkm_arena_stats *out)
{
    if (x && !out) return rkm__err(x->ctx, RKM_ERROR_ARGUMENT, "rkm_arena_exec_stats_get: out is NULL");
    return rkm_arena_stats_get(x ? x->arena : NULL, out);
}

/* First fit (and measure, which sizes like it): run the plan on an
 * unbounded region and take its high-water mark. */
static rkm_result rkm__first_fit_capacity(const rkm_plan *plan, rkm_arena_capacity_info *out)
{
    rkm_arena_exec_desc d = {.graph = plan->g, .mode = RKM_ARENA_FIRST_FIT, .capacity = RKM_ARENA_UNBOUNDED};
    rkm_arena_exec *x;
    rkm_result r = rkm_arena_exec_create(&d, &x);
    if (r != RKM_OK) return r;
    r = rkm_arena_exec_run(x, plan);
    rkm_arena_stats st;
    (void)rkm_arena_stats_get(x->arena, &st);
    rkm_arena_exec_destroy(x);
    if (r != RKM_OK) return r;
    if (st.peak != plan->stats.peak)
        return rkm__err(plan->ctx, RKM_ERROR_INTERNAL, "rkm_arena_capacity: the arena's peak %llu differs from "
                        "the plan's peak %llu", (unsigned long long)st.peak,
                        (unsigned long long)plan->stats.peak);
    out->capacity = st.high_water;
    return RKM_OK;
}

rkm_result rkm_arena_capacity(const rkm_plan *plan, rkm_arena_mode mode, rkm_arena_capacity_info *out)
{
    if (out) memset(out, 0, sizeof *out); /* zeroed on every error (rockmate.h) */
    if (!plan) return RKM_ERROR_ARGUMENT;
    rkm_context *ctx = plan->ctx;
    if (!out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_capacity: out is NULL");
    rkm_result r = RKM_OK;
    if (mode == RKM_ARENA_LAYOUT) {
        if (!plan->stats.alignment)
            return rkm__err(ctx, RKM_ERROR_NOMEM, "rkm_arena_capacity: the plan has no layout (its buffers "
                            "rounded up to %u bytes add up past 64 bits)", RKM_ARENA_ALIGN);
        out->capacity = plan->stats.arena_bytes;
    } else if (mode == RKM_ARENA_FIRST_FIT || mode == RKM_ARENA_MEASURE) {
        r = rkm__first_fit_capacity(plan, out);
    } else {
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_arena_capacity: mode %d is not RKM_ARENA_LAYOUT (0), "
                        "RKM_ARENA_FIRST_FIT (1) or RKM_ARENA_MEASURE (2)", (int)mode);
    }
    if (r != RKM_OK) return r;
    out->peak = plan->stats.peak;
    out->slack = out->capacity - out->peak;
    return RKM_OK;
}
