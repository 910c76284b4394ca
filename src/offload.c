/* offload.c -- offloading: a recompute-only plan's idle tensors sent to host memory
 *
 * Uses (through internal.h): base.c, plan.c, sim.c, layout.c, ilp.c, progress.c, produce.c.
 *
 * Below, "tensor" stands for a copy slot: a tensor or an op's saved state.
 * A plan keeps every tensor it does not recompute on the device from its
 * last read before a gap (typically a forward) to its next read after it
 * (the matching backward). With a copy link (docs/formats.md, "Offloading")
 * the tensor can spend that gap in host memory instead: `offload` once it
 * is written (reads may go on while it is copied), `wait`+`free` after its
 * last read before the gap once the copy is done, `prefetch` back just in
 * time for the next read, `wait` before it. rkm__offload_plan picks which
 * gaps, greedily, until the plan's peak fits the budget:
 *
 * - A tensor's gaps are its idle stretches in the base plan, where it is
 *   live and nothing reads, writes or frees it, up to a compute step that
 *   reads it. Any of them may be in the set: the first offloads, each frees
 *   and prefetches, the last frees the host copy (a tensor has one value,
 *   so one host copy serves every gap: test_offload
 *   planner_prefetches_twice).
 * - Timing is the base plan's compute timeline. Offloads are queued on the
 *   device-to-host stream in the order of their gaps, each as soon as its
 *   tensor is written (reads may go on while it is copied) and the copy
 *   before it is issued; a tensor is freed after the first compute step
 *   that ends once its copy has: its wait never waits. Prefetches are
 *   placed as late as the host-to-device stream allows (latest first, each
 *   ending when the next read starts or the later prefetch begins), issued
 *   before the last compute step that starts by then: their bytes are live
 *   as briefly as the stream allows, and waits are only where the stream is
 *   the bottleneck.
 * - While the plan peaks over the budget, the gap around the peak step of
 *   the largest tensor whose copies leave it off the device there (as they
 *   would alone) joins the set; a gap that helps nowhere never does.
 * - Where none does and the caller allows it (exposed), a tensor live across
 *   the peak step that the step does not touch (a new one, or one of the
 *   set whose copies are too late to clear it) is off the device across
 *   that step, and the compute stream waits for whatever of its copies does
 *   not hide (rkm__off_pick_exposed): the largest such tensor, or the
 *   smallest that covers the bytes over the budget (it waits less), both
 *   tried, the faster kept. Prefetches issued at one step queue in the order
 *   of their reads.
 *
 * The simulator measures every try; the planner (rkm__planner_offload)
 * keeps a result only if it is faster than the recompute-only plan and its
 * arena fits. */
#include "internal.h"

/* One gap of a tensor in the base plan (an item of the pass: a tensor has
 * one for each stretch it is live and idle) and its copies, in base step
 * indices: its last touch before the gap a and its last write before that
 * w, offload after step o (w <= o <= a: it may be read while copied), wait
 * and free after step f, prefetch before step p, wait before step b (its
 * next read). Of a tensor's gaps in the set, only the first (head) offloads
 * and only the last (tail) frees the host copy: the others free after a
 * and prefetch again from the same host copy (a tensor has one value). An
 * exposed copy (picked for a peak its hidden copies do not clear) is off
 * the device by f_max at the latest and back no sooner than p_min, and the
 * compute stream waits for what does not hide. */
typedef struct rkm__gap {
    int64_t a, b, w, o, f, p, f_max, p_min;
    double off_end, pre_start; /* the copies' planned times */
    int32_t slot;              /* its tensor (copy slot) */
    uint8_t head, tail;        /* rkm__off_place: the slot's first, last gap in the set */
} rkm__gap;

/* A sort key: ids ordered by key, then id (a total order: qsort gives the
 * same result on every C library). */
typedef struct rkm__off_key {
    int64_t key;
    int32_t id;
} rkm__off_key;

typedef struct rkm__off {
    const rkm_graph *g;
    const rkm_step *base;
    size_t n;
    double *ts, *te;   /* [n] each base step's start and end on the compute timeline */
    size_t n_slots;    /* copy slots: tensors, then ops' saved states */
    rkm__gap *gap;     /* [n_gaps] every slot's gaps, by slot, then a */
    size_t n_gaps, cap_gap;
    uint8_t *in;       /* [n_gaps] in the set (1), or never again (2) */
    int32_t *order;    /* [2 (n_gaps + 1)] the set by b, then the set itself */
    rkm__off_key *keys;/* [5 (n_gaps + 1)] sort scratch */
    int32_t *touch;    /* [n_touch]: the most slots one step touches */
    size_t n_touch;
    rkm__sim sim;
    uint64_t *peak;    /* [steps emitted] */
    int64_t *from;     /* [steps emitted] the base step each emitted step belongs to */
    size_t cap_peak, cap_from;
    rkm__steps out;
    int exposed;       /* copies may make the compute stream wait, and which (rkm__offload_plan) */
    const uint8_t *prefer; /* [n_slots] or NULL: slots picked before any other (rkm__offload_plan) */
} rkm__off;

/* Whether slot t is on the device in sim's state. */
static int rkm__slot_live(const rkm__sim *s, int32_t t)
{
    size_t nt = s->g->n_tensors;
    return (size_t)t < nt ? s->D[t] : s->P[(size_t)t - nt];
}

/* Whether v[j] of rkm__slot_touches(st) is written by st (a forward's
 * outputs, saved state and in-place input), not only read: an offload of
 * it may not be in flight then. */
static int rkm__slot_written(const rkm_graph *g, const rkm_step *st, int32_t j)
{
    return st->kind == RKM_STEP_FWD && (j >= g->ops[st->index].n_in || (j == 0 && st->inplace));
}

static int rkm__off_gap_cmp(const void *x, const void *y)
{
    const rkm__gap *u = x, *v = y;
    if (u->slot != v->slot) return u->slot < v->slot ? -1 : 1;
    return (u->a > v->a) - (u->a < v->a);
}

/* Gap of slot t from its touch a (w: its last write) to step b, noted (one
 * between two adjacent steps, or of an input, gains nothing); 0 when out of
 * memory. */
static int rkm__off_gap_note(rkm__off *o, int32_t t, int64_t a, int64_t b, int64_t w)
{
    const rkm_graph *g = o->g;
    if (b - a < 2 || ((size_t)t < g->n_tensors && (g->tensors[t].flags & RKM_TENSOR_INPUT))) return 1;
    if (!rkm__reserve(g->ctx, (void **)&o->gap, &o->cap_gap, o->n_gaps + 1, sizeof *o->gap)) return 0;
    /* f, p: where rkm__off_place (or a pick, until then) puts its copies */
    o->gap[o->n_gaps++] = (rkm__gap){a, b, w, -1, -1, INT64_MAX, INT64_MAX, -1, 0, 0, t, 0, 0};
    return 1;
}

/* The compute timeline and every tensor's gaps (where it is live and idle,
 * up to a compute step that reads it), from a replay of the base plan
 * (valid, no copy steps), by slot and start; last and wr: scratch. 0 when
 * out of memory. */
static int rkm__off_gaps(rkm__off *o, int64_t *last, int64_t *wr)
{
    const rkm_graph *g = o->g;
    rkm__sim_reset(&o->sim);
    for (size_t t = 0; t < o->n_slots; t++) last[t] = wr[t] = -1;
    for (size_t i = 0; i < o->n; i++) {
        const rkm_step *st = &o->base[i];
        o->ts[i] = o->sim.clock; /* the replay's compute clock: no copies, no waits */
        int32_t k = rkm__slot_touches(g, st, o->touch);
        int compute = st->kind == RKM_STEP_FWD || st->kind == RKM_STEP_BWD || st->kind == RKM_STEP_LOSS;
        for (int32_t j = 0; j < k; j++) {
            int32_t t = o->touch[j];
            int64_t a = last[t];
            if (!compute || a < 0 || !rkm__slot_live(&o->sim, t)) continue;
            if (!rkm__off_gap_note(o, t, a, (int64_t)i, wr[t] >= 0 && wr[t] <= a ? wr[t] : a)) return 0;
            last[t] = -1; /* a step that reads it twice: one gap */
        }
        uint64_t pk;
        int32_t obj;
        rkm__sim_step(&o->sim, st, &pk, &obj);
        o->te[i] = o->sim.clock;
        for (int32_t j = 0; j < k; j++) {
            last[o->touch[j]] = rkm__slot_live(&o->sim, o->touch[j]) ? (int64_t)i : -1;
            if (rkm__slot_written(g, st, j)) wr[o->touch[j]] = (int64_t)i;
        }
    }
    if (o->n_gaps) qsort(o->gap, o->n_gaps, sizeof *o->gap, rkm__off_gap_cmp);
    return 1;
}

/* The first compute step at or after i that ends at or after time x (the
 * last step if none). The compute clock never goes back, so the first step
 * at or after i that ends by then is a binary search away; zero-length
 * steps (frees) after it are skipped. */
static int64_t rkm__off_step_ending(const rkm__off *o, int64_t i, double x)
{
    int64_t hi = (int64_t)o->n - 1;
    while (i < hi) { /* te[lo..hi): the first >= x */
        int64_t mid = i + (hi - i) / 2;
        if (o->te[mid] >= x) hi = mid;
        else i = mid + 1;
    }
    for (; (size_t)i + 1 < o->n; i++)
        if (o->te[i] > o->ts[i]) return i;
    return (int64_t)o->n - 1;
}

/* The last step at or before b that starts by time x (0 if none does). */
static int64_t rkm__off_step_starting(const rkm__off *o, int64_t b, double x)
{
    int64_t lo = 0;
    while (lo < b) { /* the last of ts[lo..b] <= x */
        int64_t mid = b - (b - lo) / 2;
        if (o->ts[mid] <= x) lo = mid;
        else b = mid - 1;
    }
    return lo;
}

static int rkm__off_key_cmp(const void *x, const void *y)
{
    const rkm__off_key *u = x, *v = y;
    if (u->key != v->key) return u->key < v->key ? -1 : 1;
    return (u->id > v->id) - (u->id < v->id);
}

/* ids[0..m) ordered by their gap's a (by_b 0) or by b, latest first. */
static void rkm__off_sort(rkm__off *o, int32_t *ids, int32_t m, int by_b)
{
    for (int32_t k = 0; k < m; k++) o->keys[k] = (rkm__off_key){by_b ? -o->gap[ids[k]].b : o->gap[ids[k]].a, ids[k]};
    qsort(o->keys, (size_t)m, sizeof *o->keys, rkm__off_key_cmp);
    for (int32_t k = 0; k < m; k++) ids[k] = o->keys[k].id;
}

/* Whether a gap of gap i's slot before it (dir -1) or after it (+1) is in
 * the set: a slot's gaps are contiguous in o->gap, by start. */
static int rkm__off_in_set_beside(const rkm__off *o, int32_t i, int dir)
{
    for (int64_t j = (int64_t)i + dir; j >= 0 && (size_t)j < o->n_gaps && o->gap[j].slot == o->gap[i].slot; j += dir)
        if (o->in[j] == 1) return 1;
    return 0;
}

/* Where the set's copies go (gap o, f, p, times): offloads of the slots'
 * first gaps in the set (head) in the order of their gaps, each issued
 * once written and after the one before it (no copy ends later than issued
 * at the gap's start would); a later gap of a slot (its host copy made
 * already) frees after its last touch; prefetches latest first. Returns a
 * gap whose window is empty (it would come back before it left), -1 if
 * none is. */
static int32_t rkm__off_place(rkm__off *o, int32_t *set, int32_t m)
{
    const rkm_graph *g = o->g;
    rkm__off_sort(o, set, m, 0);
    for (int32_t k = 0; k < m; k++) {
        o->gap[set[k]].head = !rkm__off_in_set_beside(o, set[k], -1);
        o->gap[set[k]].tail = !rkm__off_in_set_beside(o, set[k], 1);
    }
    double d2h = 0, h2d = INFINITY;
    int64_t at = 0;
    for (int32_t k = 0; k < m; k++) {
        rkm__gap *x = &o->gap[set[k]];
        if (!x->head) {
            x->o = -1, x->f = x->a;
            continue;
        }
        x->o = at = x->w > at ? x->w : at;
        double start = o->te[at] > d2h ? o->te[at] : d2h;
        x->off_end = d2h = start + rkm__copy_seconds(g, x->slot, g->copy.d2h_bytes_per_second);
        x->f = rkm__off_step_ending(o, x->a + 1, x->off_end);
        if (x->f > x->f_max) x->f = x->f_max;
    }
    for (int32_t k = 0; k < m; k++) o->order[k] = set[k];
    rkm__off_sort(o, o->order, m, 1);
    for (int32_t k = 0; k < m; k++) {
        rkm__gap *x = &o->gap[o->order[k]];
        double end = o->ts[x->b] < h2d ? o->ts[x->b] : h2d;
        x->pre_start = h2d = end - rkm__copy_seconds(g, x->slot, g->copy.h2d_bytes_per_second);
        x->p = rkm__off_step_starting(o, x->b, x->pre_start);
        if (x->p < x->p_min) x->p = x->p_min;
        if (x->p <= x->f) return o->order[k];
    }
    return -1;
}

/* Record that the step just pushed belongs to base step `from`. */
static int rkm__off_note(rkm__off *o, int64_t from)
{
    if (!rkm__reserve(o->g->ctx, (void **)&o->peak, &o->cap_peak, o->out.n, sizeof *o->peak) ||
        !rkm__reserve(o->g->ctx, (void **)&o->from, &o->cap_from, o->out.n, sizeof *o->from))
        return 0;
    o->from[o->out.n - 1] = from;
    return 1;
}

/* Push a step on slot t (a copy of it, or the free of what it holds), from
 * base step `from`. */
static int rkm__off_push(rkm__off *o, int32_t kind, int32_t t, int64_t from)
{
    size_t nt = o->g->n_tensors;
    int saved = (size_t)t >= nt;
    if (saved && kind == RKM_STEP_FREE) kind = RKM_STEP_FREE_SAVED;
    int32_t index = saved ? (int32_t)((size_t)t - nt) : t;
    return rkm__steps_push(&o->out, kind, index, saved && kind != RKM_STEP_FREE_SAVED) && rkm__off_note(o, from);
}

/* The base step of a set member's event e: its prefetch goes before step
 * p (0), its wait and host free before b (1), its offload after o (2), its
 * wait and free after f (3). */
static int64_t rkm__off_event(const rkm__gap *x, int e)
{
    return e == 0 ? x->p : e == 1 ? x->b : e == 2 ? x->o : x->f;
}

/* Member k of the set in event e's order within a step (rkm__off_emit). */
static int32_t rkm__off_member(const rkm__off *o, const int32_t *set, int32_t m, int e, int32_t k)
{
    return e == 0 ? o->order[m - 1 - k] : set[k];
}

/* Push gap x's steps of event e, from base step `from`: its head offloads
 * and waits for that copy before its free, its tail frees the host copy
 * after its last prefetch. */
static int rkm__off_push_event(rkm__off *o, int e, const rkm__gap *x, int64_t from)
{
    int32_t t = x->slot;
    switch (e) {
    case 0: return rkm__off_push(o, RKM_STEP_PREFETCH, t, from);
    case 1: return rkm__off_push(o, RKM_STEP_WAIT, t, from) && (!x->tail || rkm__off_push(o, RKM_STEP_FREE_HOST, t, from));
    case 2: return rkm__off_push(o, RKM_STEP_OFFLOAD, t, from);
    default: return (!x->head || rkm__off_push(o, RKM_STEP_WAIT, t, from)) && rkm__off_push(o, RKM_STEP_FREE, t, from);
    }
}

/* The base plan with the set's copies (set and o->order as rkm__off_place
 * left them): each event's members sorted by their step and merged into the
 * base plan's steps in one pass. Within a step, copies go in their
 * stream's planned order: offloads in set order, prefetches by their next
 * read (o->order from its end; in set order, two prefetches issued at one
 * step could queue the later-needed one first). */
static int rkm__off_emit(rkm__off *o, const int32_t *set, int32_t m)
{
    rkm__off_key *ev[4];
    int32_t at[4] = {0, 0, 0, 0};
    for (int e = 0; e < 4; e++) {
        ev[e] = o->keys + (size_t)(e + 1) * (o->n_gaps + 1);
        for (int32_t k = 0; k < m; k++) ev[e][k] = (rkm__off_key){rkm__off_event(&o->gap[rkm__off_member(o, set, m, e, k)], e), k};
        qsort(ev[e], (size_t)m, sizeof *ev[e], rkm__off_key_cmp);
    }
    o->out.n = 0;
    for (size_t i = 0; i < o->n; i++) {
        int64_t s = (int64_t)i;
        for (int e = 0; e < 4; e++) {
            while (at[e] < m && ev[e][at[e]].key < s) at[e]++; /* never at a step: none emitted */
            if (e == 2 && (!rkm__steps_push_step(&o->out, &o->base[i]) || !rkm__off_note(o, s))) return 0;
            for (; at[e] < m && ev[e][at[e]].key == s; at[e]++)
                if (!rkm__off_push_event(o, e, &o->gap[rkm__off_member(o, set, m, e, ev[e][at[e]].id)], s)) return 0;
        }
    }
    return 1;
}

/* The emitted plan's peak step (-1 if it breaks a rule, which a bug would
 * be), its peak in *peak. */
static int64_t rkm__off_peak(rkm__off *o, uint64_t *peak)
{
    rkm_sim_result res;
    rkm__sim_reset(&o->sim);
    if (rkm__sim_run_peaks(&o->sim, o->out.s, o->out.n, &res, NULL, o->peak, NULL) != 1) return -1;
    *peak = res.peak;
    return res.peak_step;
}

/* A gap of the set (o->in 1) around base step s whose copies do not hide
 * there: held off the device across s instead (its free before s, its
 * prefetch after it, the compute stream waiting for the rest). */
static int rkm__off_exposes(const rkm__off *o, int32_t i, int64_t s)
{
    const rkm__gap *x = &o->gap[i];
    return o->in[i] == 1 && x->a < s && s < x->b && (x->f >= s || x->p <= s);
}

/* Whether a slot of x bytes is a better exposed copy than one of y, where
 * `need` bytes must leave the device: the compute stream waits for about
 * its copy's time, which grows with its bytes, so the smallest that covers
 * the need, else the largest. */
static int rkm__off_fits_better(uint64_t x, uint64_t y, uint64_t need)
{
    if ((x >= need) != (y >= need)) return x >= need;
    return x >= need ? x < y : x > y;
}

/* Whether a pick takes slot t before slot u: the caller's preferred slots
 * first, then the larger (need 0, rkm__off_pick), or the better fit for
 * `need` (rkm__off_fits_better, rkm__off_pick_exposed). */
static int rkm__off_picks_before(const rkm__off *o, int32_t t, int32_t u, uint64_t need)
{
    int pt = o->prefer && o->prefer[t], pu = o->prefer && o->prefer[u];
    uint64_t bt = rkm__slot_bytes(o->g, t), bu = rkm__slot_bytes(o->g, u);
    if (pt != pu) return pt;
    return need ? rkm__off_fits_better(bt, bu, need) : bt > bu;
}

/* An exposed copy for a peak at base step s that no hidden copy clears,
 * `need` bytes over the budget there: the gap around s, of a slot live
 * there, the best fit for the need (rkm__off_fits_better; UINT64_MAX: the
 * largest): one of the set whose copies leave it live there
 * (rkm__off_exposes), or a new one. It is held off the device across s and
 * the frees after it (f_max, p_min, which only ever tighten: the greedy
 * ends); -1 if none. */
static int32_t rkm__off_pick_exposed(rkm__off *o, int64_t s, uint64_t need)
{
    int32_t best = -1;
    for (size_t u = 0; u < o->n_gaps; u++) {
        int32_t i = (int32_t)u;
        const rkm__gap *x = &o->gap[i];
        if (x->a >= s || s >= x->b) continue;
        if (best >= 0 && !rkm__off_picks_before(o, x->slot, o->gap[best].slot, need)) continue;
        if (rkm__off_exposes(o, i, s) || !o->in[i]) best = i; /* a gap: live across s in the base */
    }
    if (best >= 0) { /* back at the first compute step after s: the frees after s first lower the memory */
        rkm__gap *x = &o->gap[best];
        if (x->f_max > s - 1) x->f_max = s - 1;
        int64_t p = s + 1;
        while (p < x->b && o->te[p] == o->ts[p]) p++;
        if (x->p_min < p) x->p_min = p;
        x->f = x->f_max, x->p = x->p_min; /* until rkm__off_place: not exposed at s again */
    }
    return best;
}

/* The gap to add for a peak at base step s, `need` bytes over the budget:
 * the largest slot's gap around s whose copies, as they would be placed
 * alone, leave it off the device there (a slot with an earlier gap in the
 * set has its host copy: it frees at once); -1 if none. With o->exposed,
 * where no copy hides, an exposed one: the largest (1) or the best fit for
 * the need (2). */
static int32_t rkm__off_pick(rkm__off *o, int64_t s, uint64_t need)
{
    const rkm_graph *g = o->g;
    int32_t best = -1;
    for (size_t u = 0; u < o->n_gaps; u++) {
        int32_t i = (int32_t)u;
        rkm__gap *x = &o->gap[i];
        if (o->in[i] || x->a >= s || x->b <= s) continue;
        if (best >= 0 && !rkm__off_picks_before(o, x->slot, o->gap[best].slot, 0)) continue;
        double end = o->te[x->w] + rkm__copy_seconds(g, x->slot, g->copy.d2h_bytes_per_second);
        double start = o->ts[x->b] - rkm__copy_seconds(g, x->slot, g->copy.h2d_bytes_per_second);
        int64_t f = rkm__off_in_set_beside(o, i, -1) ? x->a : rkm__off_step_ending(o, x->a + 1, end);
        int64_t p = rkm__off_step_starting(o, x->b, start);
        if (f >= s || p <= s) continue;
        best = i, x->f = f, x->p = p;
    }
    return best >= 0 || !o->exposed ? best : rkm__off_pick_exposed(o, s, o->exposed == 2 ? need : UINT64_MAX);
}

static void rkm__off_free(rkm__off *o)
{
    rkm_context *ctx = o->g->ctx;
    size_t ng = o->n_gaps + 1;
    rkm__free(ctx, o->ts, 2 * (o->n + 1) * sizeof *o->ts);
    rkm__free(ctx, o->gap, o->cap_gap * sizeof *o->gap);
    rkm__free(ctx, o->in, ng);
    rkm__free(ctx, o->order, 2 * ng * sizeof *o->order);
    rkm__free(ctx, o->keys, 5 * ng * sizeof *o->keys);
    rkm__free(ctx, o->touch, o->n_touch * sizeof *o->touch);
    rkm__free(ctx, o->peak, o->cap_peak * sizeof *o->peak);
    rkm__free(ctx, o->from, o->cap_from * sizeof *o->from);
    rkm__steps_free(&o->out);
    rkm__sim_free(&o->sim);
}

/* The pass's state for base (gaps, timeline), all of it or nothing. */
static rkm_result rkm__off_init(rkm__off *o, const rkm_graph *g, const rkm_step *base, size_t n)
{
    memset(o, 0, sizeof *o);
    o->g = g;
    o->base = base;
    o->n = n;
    o->out = (rkm__steps){g->ctx, NULL, 0, 0};
    o->n_slots = g->n_tensors + g->n_ops;
    size_t ns = o->n_slots;
    o->n_touch = rkm__slot_touches_max(g);
    o->touch = rkm__alloc(g->ctx, o->n_touch * sizeof *o->touch);
    o->ts = rkm__alloc(g->ctx, 2 * (n + 1) * sizeof *o->ts);
    int64_t *last = rkm__alloc(g->ctx, 2 * ns * sizeof *last);
    int ok = o->ts && o->touch && last && rkm__sim_init(g, &o->sim) == RKM_OK;
    if (ok) {
        o->te = o->ts + n + 1;
        ok = rkm__off_gaps(o, last, last + ns);
    }
    rkm__free(g->ctx, last, 2 * ns * sizeof *last);
    size_t ng = o->n_gaps + 1;
    if (ok) { /* the gaps are known: what depends on their number */
        o->in = rkm__calloc(g->ctx, ng, 1);
        o->order = rkm__alloc(g->ctx, 2 * ng * sizeof *o->order);
        o->keys = rkm__alloc(g->ctx, 5 * ng * sizeof *o->keys); /* rkm__off_sort's, rkm__off_emit's four */
        ok = o->in && o->order && o->keys;
    }
    if (!ok) {
        rkm__off_free(o);
        return rkm__nomem(g->ctx, "offloading");
    }
    return RKM_OK;
}

/* The base plan's steps (valid on g, no copies) with copies that bring its
 * peak within `budget`, into *out (taken by the caller); out->n 0 when
 * none does; *work (NULL: not counted) grows by the steps it replayed.
 * g has a copy link. exposed 0: only copies that hide behind
 * compute; 1: where none does, copies the compute stream waits for, the
 * largest slot first; 2: the same, the best fit for the bytes over the
 * budget first (rkm__off_fits_better). */
RKM__PRIVATE rkm_result rkm__offload_plan(const rkm_graph *g, const rkm_step *base, size_t n, uint64_t budget,
                                         int exposed, const uint8_t *prefer, rkm__steps *out, uint64_t *work)
{
    rkm__off o;
    *out = (rkm__steps){g->ctx, NULL, 0, 0};
    rkm_result r = rkm__off_init(&o, g, base, n);
    if (r) return r;
    o.exposed = exposed;
    o.prefer = prefer;
    int32_t *set = o.order + o.n_gaps + 1, m = 0;
    for (;;) {
        int32_t bad = rkm__off_place(&o, set, m);
        if (bad >= 0) { /* it stays marked, never tried again */
            o.in[bad] = 2;
            int32_t k = 0;
            while (set[k] != bad) k++;
            memmove(set + k, set + k + 1, (size_t)(m - k - 1) * sizeof *set);
            m--;
            continue;
        }
        if (!rkm__off_emit(&o, set, m)) {
            r = rkm__nomem(g->ctx, "offloading");
            break;
        }
        if (work) *work += o.out.n;
        uint64_t peak;
        int64_t s = rkm__off_peak(&o, &peak);
        if (s >= 0 && peak <= budget) {
            *out = o.out;
            o.out = (rkm__steps){g->ctx, NULL, 0, 0};
            break;
        }
        /* as many as their bytes cover the excess at the peak step, largest
         * first: one replay for each such batch, not each slot */
        uint64_t got = 0;
        int32_t t, added = 0;
        while (s >= 0 && got < peak - budget && (t = rkm__off_pick(&o, o.from[s], peak - budget - got)) >= 0) {
            if (!o.in[t]) set[m++] = t; /* else one of the set, now exposed */
            o.in[t] = 1;
            got += rkm__slot_bytes(g, o.gap[t].slot);
            added++;
        }
        if (!added) break;
    }
    rkm__off_free(&o);
    return r;
}

/* What rkm__offload_fit asks of the offload pass. */
typedef struct rkm__off_ask {
    const rkm_plan *b;
    int exposed;
    const uint8_t *prefer;
} rkm__off_ask;

/* rkm__fit_less's maker: the offload pass's plan of a->b for `target`,
 * laid out as the host gets it (NULL: the pass found none). */
static rkm_result rkm__offload_make(rkm_planner *pl, uint64_t target, void *arg, rkm_plan **out)
{
    const rkm__off_ask *a = arg;
    rkm__steps d;
    uint64_t work = 0;
    *out = NULL;
    rkm_result r = rkm__offload_plan(pl->g, a->b->steps, a->b->n_steps, target, a->exposed, a->prefer, &d, &work);
    rkm__work_charge(pl, work);
    if (r || !d.n) return r;
    if ((r = rkm__plan_birth(pl->user, &d, NULL, out))) return r;
    return rkm__handout_seal(pl, out);
}

/* The base plan b (kept) with copies for `budget`, laid out as the host
 * gets it, or *out NULL: where the layout misses the aligned peak by more
 * than the room left, the copies for that much less (rkm__fit_less). */
RKM__PRIVATE rkm_result rkm__offload_fit(rkm_planner *pl, const rkm_plan *b, uint64_t budget, int exposed,
                                        const uint8_t *prefer, rkm_plan **out)
{
    rkm__off_ask a = {b, exposed, prefer};
    return rkm__fit_less(pl, budget, rkm__offload_make, &a, out, NULL);
}

/* Base b's plan with exposed copies for `budget` into *out (NULL: none):
 * the faster of the picks by the largest slot and by the best fit. The best
 * fit waits less where both fit (test_offload planner_meets_brute_force);
 * the largest clears a peak in fewer copies (resnet18-like-b32 at 50 %
 * with 25 GB/s fits only so). */
RKM__PRIVATE rkm_result rkm__offload_exposed(rkm_planner *pl, const rkm_plan *b, uint64_t budget, const uint8_t *prefer,
                                      rkm_plan **out)
{
    rkm_plan *e = NULL;
    rkm_result r = rkm__offload_fit(pl, b, budget, 1, prefer, out);
    if (!r) r = rkm__offload_fit(pl, b, budget, 2, prefer, &e);
    *out = rkm__faster(*out, e);
    if (r) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* Base b's plan with hidden copies into *q; where there is none, with
 * exposed ones into *x, the faster kept (copies the compute stream waits
 * for beat the recomputations they replace when these are long). */
RKM__PRIVATE rkm_result rkm__offload_try(rkm_planner *pl, const rkm_plan *b, uint64_t budget, const uint8_t *prefer,
                                   rkm_plan **q, rkm_plan **x)
{
    rkm_plan *e = NULL;
    rkm_result r = rkm__offload_fit(pl, b, budget, 0, prefer, q);
    if (!r && !*q && !(r = rkm__offload_exposed(pl, b, budget, prefer, &e))) *x = rkm__faster(*x, e);
    return r;
}

/* Whether the planner's algorithm offloads on its graph: rockmate and
 * checkmate on a graph with a copy link. */
RKM__PRIVATE int rkm__offloads(const rkm_planner *pl)
{
    return (pl->d.algo == RKM_ALGO_ROCKMATE || pl->d.algo == RKM_ALGO_CHECKMATE) && pl->g->copy.d2h_bytes_per_second > 0;
}

/* ---- checkmate with copies ---------------------------------------------- */

/* The whole-graph ILP with copies (ilp.c): the recomputations chosen
 * together with which slots wait in host memory and how they come back
 * (the compute stream's waits priced in); the offload pass places the
 * copies on that schedule (hidden, else exposed), the model's slots picked
 * first, and the simulator measures the plan. Into *out (NULL: none) only
 * where faster than `bound` (also lp_solve's cutoff); the solve gets
 * time_limit's work. Checkmate's; rockmate does without (design.md,
 * "Checkmate with copies": no plan changed on the bundled graphs). */
RKM__PRIVATE rkm_result rkm__ilp_offloads(rkm_planner *pl, uint64_t budget, double bound, double time_limit,
                                         rkm_plan **out)
{
    const rkm_graph *g = pl->g;
    *out = NULL;
    if (!RKM__HAVE_ILP) return RKM_OK;
    rkm__ilp_block *ib;
    rkm_result r = rkm__ilp_block_create_copies(g, &ib);
    if (r == RKM_ERROR_SOLVER) { /* as rkm__start_ilp: the other plans stand */
        rkm__log(pl->ctx, RKM_LOG_WARN, "whole-graph ILP with copies left out: %s", rkm_context_errmsg(pl->ctx));
        return RKM_OK;
    }
    if (r) return r;
    size_t ns = g->n_tensors + g->n_ops, n = 0;
    uint8_t *prefer = rkm__alloc(pl->ctx, ns);
    rkm_step *steps = NULL;
    int found = 0;
    rkm__ilp_block_deadline(ib, pl->deadline);
    rkm__ilp_block_watch(ib, rkm__progress_ilp, pl);
    rkm__ilp_turn t = rkm__work_ilp_begin(pl, time_limit);
    r = prefer ? rkm__ilp_block_solve_copies(ib, budget, bound, t.lim, &steps, &n, prefer, &pl->ilp, &found)
               : rkm__nomem(pl->ctx, "whole-graph ILP with copies");
    rkm__work_ilp_end(pl, t);
    rkm_plan *base = NULL, *x = NULL;
    if (!r && found) {
        rkm__steps d = {pl->ctx, steps, n, n}; /* the draft takes the steps */
        steps = NULL;
        r = rkm__planned_birth(pl, &d, &base);
    }
    if (!r && base) r = rkm__offload_try(pl, base, budget, prefer, out, &x); /* the model's offloads first */
    *out = rkm__faster(*out, x);
    if (r || (*out && !((*out)->stats.time < bound))) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    rkm_plan_destroy(base);
    rkm__free(pl->ctx, steps, n * sizeof *steps);
    rkm__free(pl->ctx, prefer, ns);
    rkm__ilp_block_destroy(ib);
    return r;
}

/* The whole-graph ILP's plan for `budget`, or *out NULL when none found;
 * with `copies`, for checkmate on a graph with a copy link, the faster of
 * that and the ILP with copies (rkm__ilp_offloads), with as much work
 * each. */
RKM__PRIVATE rkm_result rkm__solve_checkmate(rkm_planner *pl, uint64_t budget, double time_limit, int copies,
                                            rkm_plan **out)
{
    *out = NULL;
    /* without lp_solve only rockmate's candidates get here (checkmate is
     * refused): none from the whole-graph ILP */
    if (!RKM__HAVE_ILP) return RKM_OK;
    const rkm_graph *g = pl->g;
    rkm__ilp_block *ib;
    rkm_result r = rkm__ilp_block_create(g, g->block_ops, (int32_t)g->n_ops, -1, g->loss, 1, &ib);
    if (r) return r;
    rkm_step *steps = NULL;
    size_t nf = 0, nb = 0;
    int found = 0;
    rkm__ilp_block_deadline(ib, pl->deadline);
    rkm__ilp_block_watch(ib, rkm__progress_ilp, pl);
    /* A stage of k in flight: its peak plus k - 1 times its kept bytes
     * within the budget, so for kept budgets K on a grid up to budget / k
     * (the others hold K each), the schedule within budget - (k - 1) K
     * whose kept bytes are at most K; where it keeps less, K', once more
     * with budget - (k - 1) K' for its peak. The fastest of them. One
     * solve for a plain step. */
    int32_t k = pl->d.in_flight, points = k > 1 ? RKM__STAGE_KEPT_POINTS : 1;
    uint64_t lo = g->input_bytes, hi = budget / (uint64_t)k, kept = UINT64_MAX;
    for (int32_t j = 1, again = 0; j <= points && !r && (j == 1 || !rkm__over(pl)); j += !again) {
        if (k > 1 && !again) kept = lo + (hi > lo ? (hi - lo) / (uint64_t)points * (uint64_t)j : 0);
        uint64_t peak = k > 1 ? budget - (uint64_t)(k - 1) * kept : budget;
        rkm__ilp_turn t = rkm__work_ilp_begin(pl, time_limit / points);
        r = rkm__ilp_block_solve(ib, peak, kept, t.lim, &steps, &nf, &nb, &pl->ilp, &found);
        rkm__work_ilp_end(pl, t);
        rkm_plan *q = NULL;
        if (!r && found) {
            rkm__steps d = {pl->ctx, steps, nf + nb, nf + nb}; /* the draft takes the steps */
            steps = NULL;
            r = rkm__planned_birth(pl, &d, &q);
        }
        /* The gap to the LP bound: over the ILP's schedule family only. */
        if (!r && q && pl->ilp.time > 0 && k == 1) q->stats.gap = (pl->ilp.time - pl->ilp.bound) / pl->ilp.time;
        again = !again && q && k > 1 && rkm__plan_kept(q) < kept;
        if (again) kept = rkm__plan_kept(q);
        if (!r) r = rkm__prefer(pl, out, q, NULL);
        else rkm_plan_destroy(q);
        rkm__free(pl->ctx, steps, (nf + nb) * sizeof *steps);
        steps = NULL, nf = nb = 0;
    }
    rkm__ilp_block_destroy(ib);
    if (!r && copies && pl->d.algo == RKM_ALGO_CHECKMATE && rkm__offloads(pl)) { /* and with copies */
        rkm_plan *c = NULL;
        r = rkm__ilp_offloads(pl, budget, *out ? (*out)->stats.time : INFINITY, time_limit, &c);
        *out = rkm__faster(*out, c);
        if (r) { /* nothing half-built */
            rkm_plan_destroy(*out);
            *out = NULL;
        }
    }
    return r;
}
