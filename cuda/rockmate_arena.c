/* rockmate_arena.c -- see rockmate_arena.h. Plain C11, no CUDA. */
#include "rockmate_arena.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ===========================================================================
 * Allocation helpers (the rkm_alloc_fn convention)
 * ========================================================================= */

void *rkm_arena_default_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    (void)old_size;
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

typedef struct rkm__mem {
    rkm_alloc_fn fn;
    void *user;
} rkm__mem;

static rkm__mem rkm__mem_of(rkm_alloc_fn fn, void *user)
{
    rkm__mem m = {fn ? fn : rkm_arena_default_alloc, fn ? user : NULL};
    return m;
}

/* Zeroed n * elem bytes, or NULL (also on overflow). */
static void *rkm__mem_calloc(rkm__mem m, size_t n, size_t elem)
{
    if (elem && n > SIZE_MAX / elem) return NULL;
    size_t size = n * elem > 0 ? n * elem : 1;
    void *p = m.fn(m.user, NULL, 0, size);
    if (p) memset(p, 0, size);
    return p;
}

static void rkm__mem_free(rkm__mem m, void *p, size_t n, size_t elem)
{
    if (p) m.fn(m.user, p, n * elem > 0 ? n * elem : 1, 0);
}

/* ===========================================================================
 * 1. The offset allocator
 * ========================================================================= */

typedef struct rkm__range {
    uint64_t off, len;
} rkm__range;

/* A live block: where it starts, what it occupies, what was asked for. */
typedef struct rkm__block {
    uint64_t off, len, bytes;
} rkm__block;

struct rkm_arena {
    rkm__mem mem;
    uint64_t capacity;
    uint32_t max_blocks;
    rkm__range *freel; /* sorted by offset, never adjacent (always coalesced) */
    uint32_t n_free;
    rkm__block *used;  /* sorted by offset */
    uint32_t n_used;
    uint64_t current, peak, high_water;
};

rkm_result rkm_arena_create(uint64_t capacity, uint32_t max_blocks, rkm_alloc_fn alloc, void *alloc_user,
                            rkm_arena **out)
{
    if (!out) return RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (max_blocks == 0 || max_blocks == UINT32_MAX) return RKM_ERROR_ARGUMENT;
    rkm__mem m = rkm__mem_of(alloc, alloc_user);
    rkm_arena *a = rkm__mem_calloc(m, 1, sizeof *a);
    if (!a) return RKM_ERROR_NOMEM;
    a->mem = m;
    a->capacity = capacity;
    a->max_blocks = max_blocks;
    /* n live blocks split the region into at most n + 1 free ranges. */
    a->freel = rkm__mem_calloc(m, (size_t)max_blocks + 1, sizeof *a->freel);
    a->used = rkm__mem_calloc(m, max_blocks, sizeof *a->used);
    if (!a->freel || !a->used) {
        rkm_arena_destroy(a);
        return RKM_ERROR_NOMEM;
    }
    rkm_arena_clear(a);
    *out = a;
    return RKM_OK;
}

void rkm_arena_destroy(rkm_arena *a)
{
    if (!a) return;
    rkm__mem m = a->mem;
    rkm__mem_free(m, a->freel, (size_t)a->max_blocks + 1, sizeof *a->freel);
    rkm__mem_free(m, a->used, a->max_blocks, sizeof *a->used);
    rkm__mem_free(m, a, 1, sizeof *a);
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
static int rkm__range_fits(const rkm_arena *a, const rkm__range *r, uint64_t bytes, uint64_t aligned)
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

static void rkm__used_insert(rkm_arena *a, rkm__block b)
{
    uint32_t at = rkm__used_lower(a, b.off);
    memmove(&a->used[at + 1], &a->used[at], (a->n_used - at) * sizeof *a->used);
    a->used[at] = b;
    a->n_used++;
}

rkm_result rkm_arena_alloc(rkm_arena *a, uint64_t bytes, uint64_t *offset)
{
    if (!a || !offset || bytes == 0) return RKM_ERROR_ARGUMENT;
    *offset = RKM_ARENA_NONE;
    if (bytes > UINT64_MAX - (RKM_ARENA_ALIGN - 1)) return RKM_ERROR_NOMEM;
    if (a->n_used == a->max_blocks) return RKM_ERROR_NOMEM;
    uint64_t aligned = (bytes + RKM_ARENA_ALIGN - 1) / RKM_ARENA_ALIGN * RKM_ARENA_ALIGN;
    uint32_t i = 0;
    while (i < a->n_free && !rkm__range_fits(a, &a->freel[i], bytes, aligned)) i++;
    if (i == a->n_free) return RKM_ERROR_NOMEM;
    rkm__range *r = &a->freel[i];
    rkm__block b = {r->off, aligned < r->len ? aligned : r->len, bytes};
    r->off += b.len;
    r->len -= b.len;
    if (r->len == 0) {
        memmove(&a->freel[i], &a->freel[i + 1], (a->n_free - i - 1) * sizeof *a->freel);
        a->n_free--;
    }
    rkm__used_insert(a, b);
    a->current += bytes;
    if (a->current > a->peak) a->peak = a->current;
    if (b.off + bytes > a->high_water) a->high_water = b.off + bytes;
    *offset = b.off;
    return RKM_OK;
}

/* Layout mode: a block of `bytes` (> 0) exactly at `off` (256-aligned),
 * occupying its aligned size (shorter at the region's end, as in first
 * fit). RKM_ERROR_NOMEM if any of those bytes is not free (a live block
 * overlaps, or the region ends) or max_blocks are live. */
static rkm_result rkm__arena_alloc_at(rkm_arena *a, uint64_t off, uint64_t bytes)
{
    if (bytes == 0 || off % RKM_ARENA_ALIGN) return RKM_ERROR_ARGUMENT;
    if (bytes > UINT64_MAX - (RKM_ARENA_ALIGN - 1)) return RKM_ERROR_NOMEM;
    if (a->n_used == a->max_blocks) return RKM_ERROR_NOMEM;
    if (off > a->capacity || a->capacity - off < bytes) return RKM_ERROR_NOMEM;
    uint64_t aligned = (bytes + RKM_ARENA_ALIGN - 1) / RKM_ARENA_ALIGN * RKM_ARENA_ALIGN;
    uint64_t len = a->capacity - off < aligned ? a->capacity - off : aligned;
    uint32_t i = 0;
    while (i < a->n_free && a->freel[i].off + a->freel[i].len <= off) i++;
    if (i == a->n_free) return RKM_ERROR_NOMEM;
    rkm__range r = a->freel[i];
    if (r.off > off || r.off + r.len - off < len) return RKM_ERROR_NOMEM;
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
        memmove(&a->freel[i], &a->freel[i + 1], (a->n_free - i - 1) * sizeof *a->freel);
        a->n_free--;
    }
    rkm__block b = {off, len, bytes};
    rkm__used_insert(a, b);
    a->current += bytes;
    if (a->current > a->peak) a->peak = a->current;
    if (off + bytes > a->high_water) a->high_water = off + bytes;
    return RKM_OK;
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
        memmove(&a->freel[at], &a->freel[at + 1], (a->n_free - at - 1) * sizeof *a->freel);
        a->n_free--;
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
    if (at == a->n_used || a->used[at].off != offset) return RKM_ERROR_ARGUMENT;
    rkm__block b = a->used[at];
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

/* ===========================================================================
 * 2. Running a plan with buffers carved from an arena
 * ========================================================================= */

#define RKM__EXEC_ERRMSG 512

/* Non-zero values the wrappers return to rkm_plan_execute for their own
 * failures (the host's own values pass through unchanged). */
#define RKM__EXEC_FAILED (-0x524b4d)

struct rkm_arena_exec {
    rkm__mem mem;
    const rkm_graph *g;
    int32_t n_tensors, n_ops;
    rkm_arena *arena;
    int measure;
    int has_host;
    rkm_callbacks host;
    uint64_t *t_off, *g_off, *p_off; /* offsets of live data, gradients, phantoms */
    uint64_t *fwd_ws, *bwd_ws;       /* measure mode: largest workspace per op */
    uint64_t input_bytes;
    /* Layout mode (lay != NULL): rkm_plan_layout's buffers, copied; each
     * buffer the run creates must be the next one, and takes its offset. */
    rkm_buffer *lay;
    size_t n_lay, cap_lay, lay_next, lay_inputs;
    int64_t cur_step;                  /* of the call in progress (or last one) */
    /* The call in progress (in_call = 0 outside forward/backward). */
    int in_call;
    uint64_t ws_off, ws_len, ws_used;  /* plan mode: reserved block and cursor */
    uint64_t scratch[RKM_ARENA_MAX_SCRATCH];
    int n_scratch;
    int failed;                        /* a wrapper set errmsg and failed */
    rkm_result fail_code;
    char errmsg[RKM__EXEC_ERRMSG];
};

static int rkm__exec_fail(rkm_arena_exec *x, rkm_result code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->errmsg, sizeof x->errmsg, fmt, ap);
    va_end(ap);
    x->failed = 1;
    x->fail_code = code;
    return RKM__EXEC_FAILED;
}

static uint64_t rkm__tensor_bytes(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

static const char *rkm__tensor_name(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(g, t, &ti) == RKM_OK ? ti.name : "?";
}

static const char *const rkm__kind_names[] = {"tensor", "phantom", "gradient", "workspace"};

static const char *rkm__kind_name(int32_t kind)
{
    return kind >= 0 && kind <= RKM_BUFFER_WORKSPACE ? rkm__kind_names[kind] : "?";
}

/* Step value for a buffer whose creation step the callback does not know
 * (the loss): any step from the current one on matches. */
#define RKM__STEP_ANY INT64_MIN

/* Layout mode: the buffer (kind, index, step, bytes) is the layout's next
 * one; carve it at the layout's offset. Returns 0 or a wrapper failure. */
static int rkm__exec_take_layout(rkm_arena_exec *x, uint64_t *slot, int32_t kind, int32_t index, int64_t step,
                                 uint64_t bytes, const char *what, const char *name)
{
    /* The layout lists no workspace of zero bytes. */
    if (kind == RKM_BUFFER_WORKSPACE && bytes == 0) {
        *slot = 0;
        return 0;
    }
    if (x->lay_next == x->n_lay)
        return rkm__exec_fail(x, RKM_ERROR_STATE, "%s %s (step %lld) is not in the layout: its %llu buffers are taken",
                              what, name, (long long)step, (unsigned long long)x->n_lay);
    const rkm_buffer *b = &x->lay[x->lay_next];
    int step_ok = step == RKM__STEP_ANY ? b->first_step >= x->cur_step : b->first_step == step;
    if (b->kind != kind || b->index != index || !step_ok || b->bytes != bytes)
        return rkm__exec_fail(x, RKM_ERROR_STATE,
                              "%s %s (step %lld, %llu bytes) is not the layout's buffer %llu: %s %d of step %lld, "
                              "%llu bytes; was the exec made for another plan?",
                              what, name, (long long)step, (unsigned long long)bytes, (unsigned long long)x->lay_next,
                              rkm__kind_name(b->kind), (int)b->index, (long long)b->first_step,
                              (unsigned long long)b->bytes);
    if (step == RKM__STEP_ANY) x->cur_step = b->first_step;
    if (bytes > 0 && rkm__arena_alloc_at(x->arena, b->offset, bytes) != RKM_OK) {
        rkm_arena_stats st;
        rkm_arena_stats_get(x->arena, &st);
        return rkm__exec_fail(x, RKM_ERROR_NOMEM,
                              "layout: %s %s (%llu bytes) at offset %llu overlaps a live buffer or ends past "
                              "the arena's %llu bytes",
                              what, name, (unsigned long long)bytes, (unsigned long long)b->offset,
                              (unsigned long long)st.capacity);
    }
    x->lay_next++;
    *slot = b->offset;
    return 0;
}

/* Carve `bytes` into *slot (which must not be live): buffer `index` of
 * `kind`, created by step `step`. Zero bytes are live (at offset 0 in first
 * fit, at the layout's offset in layout mode) and take no block. Returns 0
 * or a wrapper failure. */
static int rkm__exec_take(rkm_arena_exec *x, uint64_t *slot, int32_t kind, int32_t index, int64_t step,
                          uint64_t bytes, const char *what, const char *name)
{
    if (*slot != RKM_ARENA_NONE)
        return rkm__exec_fail(x, RKM_ERROR_STATE, "%s %s is allocated twice", what, name);
    if (x->lay) return rkm__exec_take_layout(x, slot, kind, index, step, bytes, what, name);
    if (bytes == 0) {
        *slot = 0;
        return 0;
    }
    rkm_result r = rkm_arena_alloc(x->arena, bytes, slot);
    if (r != RKM_OK) {
        rkm_arena_stats st;
        rkm_arena_stats_get(x->arena, &st);
        return rkm__exec_fail(x, RKM_ERROR_NOMEM,
                              "arena full: %s %s needs %llu bytes, %llu of %llu bytes in use", what, name,
                              (unsigned long long)bytes, (unsigned long long)st.current,
                              (unsigned long long)st.capacity);
    }
    return 0;
}

/* Release *slot (of `bytes`) and mark it not live. */
static int rkm__exec_give(rkm_arena_exec *x, uint64_t *slot, uint64_t bytes, const char *what, const char *name)
{
    if (*slot == RKM_ARENA_NONE) return rkm__exec_fail(x, RKM_ERROR_STATE, "%s %s is freed but not live", what, name);
    if (bytes > 0 && rkm_arena_free(x->arena, *slot) != RKM_OK)
        return rkm__exec_fail(x, RKM_ERROR_STATE, "%s %s: the arena has no block at its offset", what, name);
    *slot = RKM_ARENA_NONE;
    return 0;
}

/* Before a forward/backward call: reserve the declared workspace (plan
 * mode) or start measuring (measure mode). */
static int rkm__exec_call_begin(rkm_arena_exec *x, uint64_t declared_ws, int32_t op, int64_t step,
                                const char *opname)
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
    return rkm__exec_take(x, &x->ws_off, RKM_BUFFER_WORKSPACE, op, step, declared_ws, "workspace of", opname);
}

/* After the call: release the workspace and return the one measured. */
static int rkm__exec_call_end(rkm_arena_exec *x, uint64_t live_before, uint64_t created, uint64_t run_peak,
                              uint64_t *measured, const char *opname)
{
    int rc = 0;
    x->in_call = 0;
    if (!x->measure) return rkm__exec_give(x, &x->ws_off, x->ws_len, "workspace of", opname);
    rkm_arena_stats st;
    rkm_arena_stats_get(x->arena, &st);
    uint64_t ws = st.peak - live_before - created;
    if (ws > *measured) *measured = ws;
    for (int i = 0; i < x->n_scratch && !rc; i++)
        if (rkm_arena_free(x->arena, x->scratch[i]) != RKM_OK)
            rc = rkm__exec_fail(x, RKM_ERROR_STATE, "scratch buffer of %s: no block at its offset", opname);
    x->n_scratch = 0;
    /* The step's peak is the larger of the run so far and this call. */
    x->arena->peak = st.peak > run_peak ? st.peak : run_peak;
    return rc;
}

static int rkm__exec_forward(void *user, const rkm_fwd_call *call)
{
    rkm_arena_exec *x = user;
    rkm_op_info oi;
    if (rkm_graph_op_info(x->g, call->op, &oi) != RKM_OK)
        return rkm__exec_fail(x, RKM_ERROR_ARGUMENT, "forward of op %d: no such op", (int)call->op);
    uint64_t live_before = x->arena->current, run_peak = x->arena->peak, created = 0;
    int rc = 0;
    x->cur_step = call->step;
    for (int32_t k = 0; k < oi.n_out && !rc; k++) {
        if (!call->out_new[k]) continue;
        uint64_t b = rkm__tensor_bytes(x->g, oi.out[k]);
        rc = rkm__exec_take(x, &x->t_off[oi.out[k]], RKM_BUFFER_TENSOR, oi.out[k], call->step, b, "tensor",
                            rkm__tensor_name(x->g, oi.out[k]));
        created += b;
    }
    if (!rc && call->save) {
        rc = rkm__exec_take(x, &x->p_off[call->op], RKM_BUFFER_PHANTOM, call->op, call->step, oi.phantom,
                            "saved state of", oi.name);
        created += oi.phantom;
    }
    if (rc) return rc;
    if ((rc = rkm__exec_call_begin(x, oi.fwd_ws, call->op, call->step, oi.name))) return rc;
    if (x->has_host) rc = x->host.forward(x->host.user, call);
    int rc2 = rkm__exec_call_end(x, live_before, created, run_peak, &x->fwd_ws[call->op], oi.name);
    return rc ? rc : rc2;
}

static int rkm__exec_backward(void *user, const rkm_bwd_call *call)
{
    rkm_arena_exec *x = user;
    rkm_op_info oi;
    if (rkm_graph_op_info(x->g, call->op, &oi) != RKM_OK)
        return rkm__exec_fail(x, RKM_ERROR_ARGUMENT, "backward of op %d: no such op", (int)call->op);
    uint64_t live_before = x->arena->current, run_peak = x->arena->peak, created = 0;
    int rc = 0;
    x->cur_step = call->step;
    for (int32_t k = 0; k < oi.n_in && !rc; k++) {
        int32_t t = oi.in[k];
        if (call->in_grad[k] == RKM_GRAD_NEW) {
            uint64_t b = rkm__tensor_bytes(x->g, t);
            rc = rkm__exec_take(x, &x->g_off[t], RKM_BUFFER_GRAD, t, call->step, b, "gradient of",
                                rkm__tensor_name(x->g, t));
            created += b;
        } else if (call->in_grad[k] == RKM_GRAD_ACCUMULATE && x->g_off[t] == RKM_ARENA_NONE) {
            rc = rkm__exec_fail(x, RKM_ERROR_STATE, "gradient of %s is accumulated into but not live",
                                rkm__tensor_name(x->g, t));
        }
    }
    if (rc) return rc;
    if ((rc = rkm__exec_call_begin(x, oi.bwd_ws, call->op, call->step, oi.name))) return rc;
    if (x->has_host) rc = x->host.backward(x->host.user, call);
    int rc2 = rkm__exec_call_end(x, live_before, created, run_peak, &x->bwd_ws[call->op], oi.name);
    return rc ? rc : rc2;
}

static int rkm__exec_loss(void *user, int32_t t)
{
    rkm_arena_exec *x = user;
    int rc = rkm__exec_take(x, &x->g_off[t], RKM_BUFFER_GRAD, t, RKM__STEP_ANY, rkm__tensor_bytes(x->g, t),
                            "gradient of", rkm__tensor_name(x->g, t));
    if (!rc && x->has_host && x->host.loss) rc = x->host.loss(x->host.user, t);
    return rc;
}

/* Frees: the host hears first (its kernels that read the buffer are already
 * on the stream), then the range goes back to the arena. With one stream,
 * any kernel that later reuses the range is queued after those readers, so
 * releasing at once is safe in stream order: no synchronisation needed. */
static int rkm__exec_free_tensor(void *user, int32_t t)
{
    rkm_arena_exec *x = user;
    int rc = x->has_host && x->host.free_tensor ? x->host.free_tensor(x->host.user, t) : 0;
    return rc ? rc : rkm__exec_give(x, &x->t_off[t], rkm__tensor_bytes(x->g, t), "tensor", rkm__tensor_name(x->g, t));
}

static int rkm__exec_free_saved(void *user, int32_t op)
{
    rkm_arena_exec *x = user;
    rkm_op_info oi;
    if (rkm_graph_op_info(x->g, op, &oi) != RKM_OK)
        return rkm__exec_fail(x, RKM_ERROR_ARGUMENT, "free_saved of op %d: no such op", (int)op);
    int rc = x->has_host && x->host.free_saved ? x->host.free_saved(x->host.user, op) : 0;
    return rc ? rc : rkm__exec_give(x, &x->p_off[op], oi.phantom, "saved state of", oi.name);
}

static int rkm__exec_free_grad(void *user, int32_t t)
{
    rkm_arena_exec *x = user;
    int rc = x->has_host && x->host.free_grad ? x->host.free_grad(x->host.user, t) : 0;
    return rc ? rc : rkm__exec_give(x, &x->g_off[t], rkm__tensor_bytes(x->g, t), "gradient of", rkm__tensor_name(x->g, t));
}

static void rkm__exec_free_tables(rkm_arena_exec *x)
{
    size_t nt = (size_t)x->n_tensors, no = (size_t)x->n_ops;
    rkm__mem_free(x->mem, x->t_off, nt * 2 + no * 3, sizeof *x->t_off);
    x->t_off = NULL;
}

void rkm_arena_exec_destroy(rkm_arena_exec *x)
{
    if (!x) return;
    rkm_arena_destroy(x->arena);
    rkm__exec_free_tables(x);
    rkm__mem_free(x->mem, x->lay, x->cap_lay, sizeof *x->lay);
    rkm__mem_free(x->mem, x, 1, sizeof *x);
}

/* Carve the inputs, in id order, from the empty arena. */
static rkm_result rkm__exec_take_inputs(rkm_arena_exec *x)
{
    for (int32_t t = 0; t < x->n_tensors; t++) {
        rkm_tensor_info ti;
        if (rkm_graph_tensor_info(x->g, t, &ti) != RKM_OK) return RKM_ERROR_ARGUMENT;
        if (!(ti.flags & RKM_TENSOR_INPUT)) continue;
        if (rkm__exec_take(x, &x->t_off[t], RKM_BUFFER_TENSOR, t, -1, ti.bytes, "input", ti.name))
            return x->fail_code;
        x->input_bytes += ti.bytes;
    }
    return RKM_OK;
}

/* Both modes: layout (lay, n_lay buffers over arena_bytes) or first fit
 * (lay NULL, over d->capacity). */
static rkm_result rkm__exec_create(const rkm_arena_exec_desc *d, const rkm_buffer *lay, size_t n_lay,
                                   uint64_t arena_bytes, rkm_arena_exec **out)
{
    if (!out) return RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!d || !d->graph || !rkm_graph_is_finalized(d->graph)) return RKM_ERROR_ARGUMENT;
    if (d->host && (!d->host->forward || !d->host->backward)) return RKM_ERROR_ARGUMENT;
    rkm__mem m = rkm__mem_of(d->alloc, d->alloc_user);
    rkm_arena_exec *x = rkm__mem_calloc(m, 1, sizeof *x);
    if (!x) return RKM_ERROR_NOMEM;
    x->mem = m;
    x->cur_step = -1;
    if (lay) {
        x->lay = rkm__mem_calloc(m, n_lay, sizeof *x->lay);
        if (!x->lay) {
            rkm__mem_free(m, x, 1, sizeof *x);
            return RKM_ERROR_NOMEM;
        }
        x->cap_lay = n_lay > 0 ? n_lay : 1;
        x->n_lay = n_lay;
        if (n_lay) memcpy(x->lay, lay, n_lay * sizeof *lay);
    }
    x->g = d->graph;
    x->n_tensors = rkm_graph_num_tensors(d->graph);
    x->n_ops = rkm_graph_num_ops(d->graph);
    x->measure = d->measure != 0;
    x->has_host = d->host != NULL;
    if (d->host) x->host = *d->host;
    size_t nt = (size_t)x->n_tensors, no = (size_t)x->n_ops;
    x->t_off = rkm__mem_calloc(m, nt * 2 + no * 3, sizeof *x->t_off);
    /* Live at once: data and gradient per tensor, a phantom per op, and one
     * workspace or RKM_ARENA_MAX_SCRATCH scratch buffers. */
    uint64_t blocks = (uint64_t)nt * 2 + no + RKM_ARENA_MAX_SCRATCH + 1;
    rkm_result r = RKM_ERROR_NOMEM;
    if (blocks < UINT32_MAX && x->t_off)
        r = rkm_arena_create(lay ? arena_bytes : d->capacity, (uint32_t)blocks, d->alloc, d->alloc_user, &x->arena);
    if (r != RKM_OK) {
        rkm_arena_exec_destroy(x);
        return r;
    }
    x->g_off = x->t_off + nt;
    x->p_off = x->g_off + nt;
    x->fwd_ws = x->p_off + no;
    x->bwd_ws = x->fwd_ws + no;
    for (size_t i = 0; i < nt * 2 + no; i++) x->t_off[i] = RKM_ARENA_NONE;
    if ((r = rkm__exec_take_inputs(x)) != RKM_OK) {
        rkm_arena_exec_destroy(x);
        return r;
    }
    x->lay_inputs = x->lay_next;
    *out = x;
    return RKM_OK;
}

rkm_result rkm_arena_exec_create(const rkm_arena_exec_desc *d, rkm_arena_exec **out)
{
    return rkm__exec_create(d, NULL, 0, 0, out);
}

rkm_result rkm_arena_exec_create_layout(const rkm_arena_exec_desc *d, rkm_plan *plan, rkm_arena_exec **out)
{
    if (!out) return RKM_ERROR_ARGUMENT;
    *out = NULL;
    if (!d || !plan || d->measure || rkm_plan_graph(plan) != d->graph) return RKM_ERROR_ARGUMENT;
    const rkm_buffer *b;
    size_t n;
    uint64_t arena_bytes;
    rkm_result r = rkm_plan_layout(plan, RKM_ARENA_ALIGN, &b, &n, &arena_bytes);
    if (r != RKM_OK) return r;
    return rkm__exec_create(d, b, n, arena_bytes, out);
}

int rkm_arena_exec_is_layout(const rkm_arena_exec *x) { return x && x->lay != NULL; }

/* After a failed step: release everything but the inputs. */
static void rkm__exec_release(rkm_arena_exec *x)
{
    for (int32_t t = 0; t < x->n_tensors; t++) {
        rkm_tensor_info ti;
        if (rkm_graph_tensor_info(x->g, t, &ti) != RKM_OK) continue;
        if (!(ti.flags & RKM_TENSOR_INPUT) && x->t_off[t] != RKM_ARENA_NONE) {
            if (ti.bytes) (void)rkm_arena_free(x->arena, x->t_off[t]);
            x->t_off[t] = RKM_ARENA_NONE;
        }
        if (x->g_off[t] != RKM_ARENA_NONE) {
            if (ti.bytes) (void)rkm_arena_free(x->arena, x->g_off[t]);
            x->g_off[t] = RKM_ARENA_NONE;
        }
    }
    for (int32_t o = 0; o < x->n_ops; o++) {
        rkm_op_info oi;
        if (x->p_off[o] == RKM_ARENA_NONE || rkm_graph_op_info(x->g, o, &oi) != RKM_OK) continue;
        if (oi.phantom) (void)rkm_arena_free(x->arena, x->p_off[o]);
        x->p_off[o] = RKM_ARENA_NONE;
    }
    if (x->ws_off != RKM_ARENA_NONE && x->ws_len) (void)rkm_arena_free(x->arena, x->ws_off);
    x->ws_off = RKM_ARENA_NONE;
    for (int i = 0; i < x->n_scratch; i++) (void)rkm_arena_free(x->arena, x->scratch[i]);
    x->n_scratch = 0;
    x->in_call = 0;
}

rkm_result rkm_arena_exec_run(rkm_arena_exec *x, const rkm_plan *plan)
{
    if (!x || !plan) return RKM_ERROR_ARGUMENT;
    if (rkm_plan_graph(plan) != x->g) {
        snprintf(x->errmsg, sizeof x->errmsg, "the plan is not of the exec's graph");
        return RKM_ERROR_ARGUMENT;
    }
    rkm_callbacks cb = {x, rkm__exec_forward, rkm__exec_backward, rkm__exec_loss, rkm__exec_free_tensor,
                        rkm__exec_free_saved, rkm__exec_free_grad};
    x->failed = 0;
    x->errmsg[0] = 0;
    x->lay_next = x->lay_inputs;
    x->cur_step = -1;
    rkm_arena_reset_peak(x->arena);
    rkm_result r = rkm_plan_execute(plan, &cb);
    if (r == RKM_OK && x->lay && x->lay_next != x->n_lay) {
        (void)rkm__exec_fail(x, RKM_ERROR_STATE, "the plan created %llu of the layout's %llu buffers",
                             (unsigned long long)x->lay_next, (unsigned long long)x->n_lay);
        r = RKM_ERROR_STATE;
    }
    if (r == RKM_OK && x->arena->current != x->input_bytes) {
        (void)rkm__exec_fail(x, RKM_ERROR_STATE, "%llu bytes besides the inputs are live after the plan",
                             (unsigned long long)(x->arena->current - x->input_bytes));
        r = RKM_ERROR_STATE;
    }
    if (r == RKM_OK) return RKM_OK;
    if (x->failed) r = x->fail_code;
    else snprintf(x->errmsg, sizeof x->errmsg, "%s", rkm_context_errmsg(rkm_graph_context(x->g)));
    rkm__exec_release(x);
    return r;
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

rkm_result rkm_arena_exec_scratch(rkm_arena_exec *x, uint64_t bytes, uint64_t *offset)
{
    if (!x || !offset) return RKM_ERROR_ARGUMENT;
    *offset = RKM_ARENA_NONE;
    if (!x->in_call) return RKM_ERROR_STATE;
    if (bytes == 0) {
        *offset = 0;
        return RKM_OK;
    }
    if (bytes > UINT64_MAX - RKM_ARENA_ALIGN) return RKM_ERROR_NOMEM;
    uint64_t aligned = (bytes + RKM_ARENA_ALIGN - 1) / RKM_ARENA_ALIGN * RKM_ARENA_ALIGN;
    if (!x->measure) {
        /* Cut from the reserved block; the last buffer may be short of its
         * aligned size, as the declared workspace is exact. */
        if (x->ws_len - x->ws_used < bytes) return RKM_ERROR_NOMEM;
        *offset = x->ws_off + x->ws_used;
        x->ws_used += x->ws_len - x->ws_used < aligned ? x->ws_len - x->ws_used : aligned;
        return RKM_OK;
    }
    if (x->n_scratch == RKM_ARENA_MAX_SCRATCH) return RKM_ERROR_NOMEM;
    rkm_result r = rkm_arena_alloc(x->arena, aligned, offset);
    if (r == RKM_OK) x->scratch[x->n_scratch++] = *offset;
    return r;
}

void rkm_arena_exec_measured_ws(const rkm_arena_exec *x, int32_t op, uint64_t *fwd_ws, uint64_t *bwd_ws)
{
    int ok = x && op >= 0 && op < x->n_ops;
    if (fwd_ws) *fwd_ws = ok ? x->fwd_ws[op] : 0;
    if (bwd_ws) *bwd_ws = ok ? x->bwd_ws[op] : 0;
}

void rkm_arena_exec_arena_stats(const rkm_arena_exec *x, rkm_arena_stats *out) { rkm_arena_stats_get(x->arena, out); }

const char *rkm_arena_exec_errmsg(const rkm_arena_exec *x) { return x ? x->errmsg : ""; }

rkm_result rkm_arena_layout(rkm_plan *plan, rkm_arena_layout_info *out, char *errmsg, size_t errmsg_size)
{
    if (!plan || !out) return RKM_ERROR_ARGUMENT;
    memset(out, 0, sizeof *out);
    if (errmsg && errmsg_size) errmsg[0] = 0;
    rkm_sim_result sim;
    rkm_result r = rkm_plan_simulate(plan, &sim, NULL);
    if (r != RKM_OK) {
        if (errmsg && errmsg_size)
            snprintf(errmsg, errmsg_size, "%s", rkm_context_errmsg(rkm_graph_context(rkm_plan_graph(plan))));
        return r;
    }
    rkm_arena_exec_desc d = {rkm_plan_graph(plan), RKM_ARENA_UNBOUNDED, 0, NULL, NULL, NULL};
    rkm_arena_exec *x;
    if ((r = rkm_arena_exec_create(&d, &x)) != RKM_OK) return r;
    r = rkm_arena_exec_run(x, plan);
    rkm_arena_stats st;
    rkm_arena_stats_get(x->arena, &st);
    if (r != RKM_OK && errmsg && errmsg_size) snprintf(errmsg, errmsg_size, "%s", x->errmsg);
    rkm_arena_exec_destroy(x);
    if (r != RKM_OK) return r;
    if (st.peak != sim.peak) {
        if (errmsg && errmsg_size)
            snprintf(errmsg, errmsg_size, "arena peak %llu differs from the simulated peak %llu",
                     (unsigned long long)st.peak, (unsigned long long)sim.peak);
        return RKM_ERROR_STATE;
    }
    out->peak = st.peak;
    out->capacity = st.high_water;
    out->slack = st.high_water - st.peak;
    return RKM_OK;
}
