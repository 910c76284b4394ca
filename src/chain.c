/* chain.c -- the chain DP (Rotor-style) over blocks and their options
 *
 * Uses (through internal.h): base.c. */
#include "internal.h"

/* Decisions: an option index, RKM__DP_CKPT + j, or RKM__DP_NONE. */
#define RKM__DP_CKPT 0x8000u
#define RKM__DP_NONE 0xFFFFu
/* Or'ed into a decision: its twin, x_{a-1} in host memory meanwhile. */
#define RKM__DP_OFF 0x10000u
#define RKM__DP_MAX_OPT 0x7FFF
#define RKM__DP_MAX_BLOCKS 0x7FFE
/* "No m is enough"; far from overflow when a few slot counts are added. */
#define RKM__DP_INF_SLOTS (INT64_MAX / 4)

#define RKM__DP_NOROW UINT32_MAX

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

/* Whether block a's candidates have twins: x_{a-1} may wait in host memory. */
static int rkm__dp_off(const rkm__dp_block *bl, int32_t a)
{
    return bl[a].in_sz > 0 && (bl[a].to_host > 0 || bl[a].from_host > 0);
}

/* The part of x_{a-1}'s offload that does not hide behind fwd seconds. */
static double rkm__dp_exposed(const rkm__dp_block *b, double fwd) { return b->to_host > fwd ? b->to_host - fwd : 0; }

/* What a twin adds to its candidate, whose forward takes fwd seconds: that
 * part, and the whole prefetch. */
static double rkm__dp_off_cost(const rkm__dp_block *b, double fwd) { return rkm__dp_exposed(b, fwd) + b->from_host; }

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
                  b->n_opt > RKM__DP_MAX_OPT || (b->n_opt > 0 && !b->opt) || !rkm__dp_time_ok(b->to_host) ||
                  !rkm__dp_time_ok(b->from_host);
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
    uint8_t *away;   /* away[i]: x_{i-1} in host memory, off the device */
    double *sent;    /* sent[i]: when x_{i-1}'s offload was issued, while in flight; else -1 */
    int32_t *kept;   /* kept[i]: 1 + the option whose kept state of block i is live, or 0 */
    int32_t front;   /* blocks > front have run their backward; grad(x_front) is live */
    int64_t mem, peak;
    double time;
} rkm__dp_state;

/* The start of a step: nothing live (x_{-1} is empty), no backward done. */
static void rkm__dp_state_reset(rkm__dp_state *s, int32_t n)
{
    memset(s->x, 0, (size_t)n);
    memset(s->away, 0, (size_t)n);
    for (int32_t i = 0; i < n; i++) s->sent[i] = -1;
    memset(s->kept, 0, (size_t)n * sizeof *s->kept);
    s->front = n - 1;
    s->mem = s->peak = 0;
    s->time = 0;
}

static int rkm__dp_fwd_ok(const rkm__dp_state *s, int32_t n, int32_t i)
{
    /* x_i must not exist twice, and a block with live kept state cannot run
     * forward again (its kept tensors would be made a second time). Forward
     * work on a block whose backward is done is useless; refusing it keeps
     * exhaustive searches small. */
    return (i == 0 || s->x[i - 1]) && !s->x[i] && !s->kept[i] && s->front >= i && (i + 1 == n || !s->away[i + 1]);
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
    case RKM__DP_FWD_OPT: /* one case, no fallthrough: clang's -Wimplicit-fallthrough */
    case RKM__DP_FWD_NOSAVE: {
        int save = op->kind == RKM__DP_FWD_OPT;
        if (save && (k < 0 || k >= bl[i].n_opt)) return "option out of range";
        if (!rkm__dp_fwd_ok(s, n, i)) return "forward needs x_{i-1}, no x_i, no kept state, backward not done";
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
        if (!s->x[i] || s->kept[i] || (i + 1 < n && (s->kept[i + 1] || s->sent[i + 1] >= 0)))
            return "free needs x_i live, not pinned, no copy in flight";
        peak = s->mem;
        mem = s->mem - out;
        t = 0;
        s->x[i] = 0;
        break;
    case RKM__DP_OFFLOAD_IN:
        if (!rkm__dp_off(bl, i) || !s->x[i - 1] || s->sent[i] >= 0) return "offload needs a link, x_{i-1} live, no copy";
        peak = mem = s->mem;
        t = 0;
        s->sent[i] = s->time;
        break;
    case RKM__DP_DROP_IN:
        if (s->sent[i] < 0) return "drop needs x_{i-1}'s offload issued";
        peak = s->mem;
        mem = s->mem - in;
        t = rkm__dp_exposed(&bl[i], s->time - s->sent[i]);
        s->sent[i] = -1;
        s->x[i - 1] = 0;
        s->away[i] = 1;
        break;
    case RKM__DP_FETCH_IN:
        if (!s->away[i]) return "fetch needs x_{i-1} in host memory";
        peak = mem = s->mem + in;
        t = bl[i].from_host;
        s->x[i - 1] = 1;
        s->away[i] = 0;
        break;
    default:
        return "unknown op kind";
    }
    s->mem = mem;
    s->peak = rkm__dp_max(s->peak, peak);
    s->time += t;
    return NULL;
}

RKM__PRIVATE void rkm__dp_ops_free(rkm_context *ctx, rkm__dp_ops *o)
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
RKM__PRIVATE rkm_result rkm__dp_eval(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, const rkm__dp_ops *ops,
                               double *time, int64_t *peak)
{
    rkm_result r = rkm__dp_check(ctx, bl, n);
    if (r != RKM_OK) return r;
    rkm__dp_state s;
    s.x = rkm__alloc(ctx, (size_t)n);
    s.away = rkm__alloc(ctx, (size_t)n);
    s.sent = rkm__alloc(ctx, (size_t)n * sizeof *s.sent);
    s.kept = rkm__calloc(ctx, (size_t)n, sizeof *s.kept);
    if (!s.x || !s.away || !s.sent || !s.kept) {
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
    int away = 0;
    for (int32_t i = 0; i < n; i++) away |= s.away[i] || s.sent[i] >= 0;
    if (s.front != -1 || s.mem != 0 || away) {
        r = rkm__err(ctx, RKM_ERROR_PLAN, "block schedule ends with backward not done, memory live or a copy");
        goto done;
    }
    *time = s.time;
    *peak = s.peak;
done:
    rkm__free(ctx, s.x, (size_t)n);
    rkm__free(ctx, s.away, (size_t)n);
    rkm__free(ctx, s.sent, (size_t)n * sizeof *s.sent);
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
            int off = rkm__dp_off(bl, a); /* the twins need x_{a-1}'s slots only around the segments */
            for (int32_t k = 0; k < bl[a].n_opt; k++) {
                int64_t st = rkm__dp_max(rkm__dp_pf(bl, n, a, k) + gb, rkm__dp_pb(bl, n, a, k)), kept = bl[a].opt[k].kept;
                int64_t in = a < b ? lo[rkm__dp_pair(n, a + 1, b)] : 0;
                best = rkm__dp_min(best, a < b ? rkm__dp_max(st, rkm__dp_add(in, ina + kept)) : st);
                if (off && a < b) best = rkm__dp_min(best, rkm__dp_max(st, rkm__dp_add(in, kept)));
            }
            for (int32_t j = a + 1; j <= b; j++) {
                need = rkm__dp_need(bl, n, a, b, j, need);
                int64_t in = lo[rkm__dp_pair(n, j, b)], st = rkm__dp_max(need, lo[rkm__dp_pair(n, a, j - 1)]);
                best = rkm__dp_min(best, rkm__dp_max(st, rkm__dp_add(in, off ? 0 : ina)));
            }
            lo[rkm__dp_pair(n, a, b)] = best;
        }
    }
}

/* The least M with Opt(1, n, M) finite; RKM_ERROR_BUDGET when there is none
 * (a block without options). */
RKM__PRIVATE rkm_result rkm__dp_min_slots(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int64_t *min)
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

/* A slot count as a term's, saturated (past M, so never feasible). */
static int32_t rkm__dp_i32(int64_t v) { return (int32_t)rkm__dp_min(v, INT32_MAX); }

/* Candidate x of decision dec, constant from cf, into t->cands if it is
 * feasible at all. */
static void rkm__dp_cand_add(rkm__dp_table *t, size_t *nc, rkm__dp_term x, int64_t cf, uint32_t dec)
{
    if (x.start <= t->M) t->cands[(*nc)++] = (rkm__dp_cand){x, rkm__dp_max(cf, x.start), dec};
}

/* The feasible candidates of pair (a, b) into t->cands, in tie-breaking
 * order, each followed by its twin where it has one (they read lo and hi
 * of shorter pairs only). */
static size_t rkm__dp_cands(rkm__dp_table *t, int32_t a, int32_t b)
{
    const rkm__dp_block *bl = t->bl;
    int32_t n = t->n;
    int64_t gb = bl[b].g_out, ina = bl[a].in_sz, need = 0;
    int off = rkm__dp_off(bl, a);
    size_t nc = 0;
    for (int32_t k = 0; k < bl[a].n_opt; k++) {
        const rkm__dp_option *o = &bl[a].opt[k];
        int64_t start = rkm__dp_max(rkm__dp_pf(bl, n, a, k) + gb, rkm__dp_pb(bl, n, a, k));
        uint32_t p1 = a < b ? (uint32_t)rkm__dp_pair(n, a + 1, b) : RKM__DP_NOROW;
        for (int twin = 0; twin <= (off && a < b); twin++) { /* at a == b a twin frees nothing */
            int64_t sh = (twin ? 0 : ina) + o->kept, st = start, cf = 0;
            if (a < b) st = rkm__dp_max(st, rkm__dp_add(t->lo[p1], sh)), cf = rkm__dp_add(t->hi[p1], sh);
            /* st <= M bounds sh when the candidate is kept */
            double base = o->tf + o->tb + (twin ? rkm__dp_off_cost(&bl[a], o->tf) : 0);
            rkm__dp_term x = {base, rkm__dp_i32(st), a < b ? rkm__dp_i32(sh) : 0, p1, RKM__DP_NOROW};
            rkm__dp_cand_add(t, &nc, x, cf, (uint32_t)k | (twin ? RKM__DP_OFF : 0));
        }
    }
    double tsum = 0;
    for (int32_t j = a + 1; j <= b; j++) {
        need = rkm__dp_need(bl, n, a, b, j, need);
        tsum += bl[j - 1].tfn;
        uint32_t p1 = (uint32_t)rkm__dp_pair(n, j, b), p2 = (uint32_t)rkm__dp_pair(n, a, j - 1);
        for (int twin = 0; twin <= off; twin++) {
            int64_t sh = twin ? 0 : ina;
            int64_t start = rkm__dp_max(need, rkm__dp_max(rkm__dp_add(t->lo[p1], sh), t->lo[p2]));
            int64_t cf = rkm__dp_max(rkm__dp_add(t->hi[p1], sh), t->hi[p2]);
            double base = tsum + (twin ? rkm__dp_off_cost(&bl[a], tsum) : 0);
            rkm__dp_term x = {base, rkm__dp_i32(start), (int32_t)sh, p1, p2};
            rkm__dp_cand_add(t, &nc, x, cf, (RKM__DP_CKPT + (uint32_t)j) | (twin ? RKM__DP_OFF : 0));
        }
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

RKM__PRIVATE void rkm__dp_table_free(rkm_context *ctx, rkm__dp_table *t)
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

RKM__PRIVATE double rkm__dp_bytes(const rkm__dp_block *bl, int32_t n, int32_t M)
{
    int32_t max_opt = 0, twins = 0;
    for (int32_t i = 0; i < n; i++) {
        max_opt = bl[i].n_opt > max_opt ? bl[i].n_opt : max_opt;
        twins |= rkm__dp_off(bl, i);
    }
    double dn = (double)n, pairs = dn * (dn + 1) / 2;
    double terms = (pairs * max_opt + dn * (dn * dn - 1) / 6) * (twins ? 2 : 1);
    return pairs * ((double)(M + 1) * sizeof(double) + 24) + 2 * terms * sizeof(rkm__dp_term);
}

/* Opt(a, b, m) for every pair and every m in 0..M (0-based blocks). The
 * table keeps a pointer to bl, which must outlive it. Columns go in tiles of
 * RKM__DP_TILE, all pairs per tile (a cell needs only cells of shorter pairs
 * at the same or fewer slots): a candidate's cost at the end of the tile then
 * bounds it over the tile, which prunes far more than its cost at M, and a
 * tile reads less memory than whole rows. The solve stops between tiles
 * once rkm__now() passes `deadline` (the planner's time limit; INFINITY:
 * never): the table then holds the columns solved so far, at least the
 * first tile's (t->M is the last: a valid table for fewer slots), and *cut
 * (when not NULL) is 1. */
RKM__PRIVATE rkm_result rkm__dp_solve(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int32_t M, double deadline,
                                     rkm__dp_table *t, int *cut)
{
    if (cut) *cut = 0;
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
    t->n_cands = 2 * (max_opt + (size_t)n); /* each may have a twin */
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
        if (m0 > 0 && rkm__now() > deadline) {
            t->M = m0 - 1;
            if (cut) *cut = 1;
            break;
        }
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
RKM__PRIVATE double rkm__dp_opt(const rkm__dp_table *t, int32_t a, int32_t b, int32_t m)
{
    return t->cost[rkm__dp_pair(t->n, a, b) * t->row + (size_t)m];
}

/* The decision of cell (a, b, m): the first candidate, in tie-breaking order,
 * whose cost is the cell's (an option k, RKM__DP_CKPT + j, either or'ed
 * with RKM__DP_OFF for its twin), or RKM__DP_NONE
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

/* A twin's copy op of block a, where the decision is a twin (off). */
static int rkm__dp_twin(rkm_context *ctx, rkm__dp_stack *s, unsigned off, int32_t kind, int32_t a)
{
    return !off || rkm__dp_push(ctx, s, kind, a, -1, 0);
}

/* Push the work of cell (a, b, m) in reverse order of execution. */
static int rkm__dp_expand(rkm_context *ctx, rkm__dp_table *t, rkm__dp_stack *s, rkm__dp_task seg)
{
    const rkm__dp_block *bl = t->bl;
    int32_t a = seg.a, b = seg.b, m = seg.m;
    unsigned d = rkm__dp_decision(t, a, b, m), off = d != RKM__DP_NONE && (d & RKM__DP_OFF);
    int32_t in = off ? 0 : bl[a].in_sz;
    d &= ~RKM__DP_OFF;
    if (d < RKM__DP_CKPT) {
        int32_t k = (int32_t)d;
        return rkm__dp_push(ctx, s, RKM__DP_BWD_OPT, a, k, 0) && rkm__dp_twin(ctx, s, off, RKM__DP_FETCH_IN, a) &&
               (a == b || rkm__dp_push(ctx, s, -1, a + 1, b, m - in - bl[a].opt[k].kept)) &&
               rkm__dp_twin(ctx, s, off, RKM__DP_DROP_IN, a) && rkm__dp_push(ctx, s, RKM__DP_FWD_OPT, a, k, 0) &&
               rkm__dp_twin(ctx, s, off, RKM__DP_OFFLOAD_IN, a);
    }
    int32_t j = (int32_t)(d - RKM__DP_CKPT);
    if (!rkm__dp_push(ctx, s, -1, a, j - 1, m) || !rkm__dp_twin(ctx, s, off, RKM__DP_FETCH_IN, a) ||
        !rkm__dp_push(ctx, s, RKM__DP_FREE_OUT, j - 1, -1, 0) || !rkm__dp_push(ctx, s, -1, j, b, m - in) ||
        !rkm__dp_twin(ctx, s, off, RKM__DP_DROP_IN, a))
        return 0;
    for (int32_t i = j - 1; i >= a; i--)
        if ((i > a && !rkm__dp_push(ctx, s, RKM__DP_FREE_OUT, i - 1, -1, 0)) ||
            !rkm__dp_push(ctx, s, RKM__DP_FWD_NOSAVE, i, -1, 0))
            return 0;
    return rkm__dp_twin(ctx, s, off, RKM__DP_OFFLOAD_IN, a);
}

/* The schedule of Opt(1, n, m) from a table solved with M >= m, appended to
 * *ops (which the caller frees). RKM_ERROR_BUDGET if infeasible at m. */
RKM__PRIVATE rkm_result rkm__dp_schedule(rkm_context *ctx, rkm__dp_table *t, int32_t m, rkm__dp_ops *ops)
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
RKM__PRIVATE rkm_result rkm__dp_sqrt(rkm_context *ctx, const rkm__dp_block *bl, int32_t n, int32_t seg, rkm__dp_ops *ops)
{
    rkm_result r = rkm__dp_check(ctx, bl, n);
    if (r != RKM_OK) return r;
    for (int32_t i = 0; i < n; i++)
        if (bl[i].n_opt == 0) return rkm__err(ctx, RKM_ERROR_BUDGET, "chain DP: block %d has no option", (int)i);
    if (seg < 1)
        for (seg = 1; (int64_t)seg * seg < n;) seg++;
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

