/* dtr.c -- DTR: dynamic tensor rematerialization, simulated offline
 *
 * Uses (through internal.h): base.c, plan.c, sim.c, baseline.c. */
#include "internal.h"

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
 * up to the alignment, so the offsets are aligned.
 *
 * On a graph with a copy link (`--algo dtr`, and rockmate's candidates
 * beside its pass's: rkm__dtr_offloads; its search edits DTR's
 * recompute-only plans only), eviction has a third choice: a live
 * tensor or saved state (a copy slot) whose copy to host memory, issued
 * right after its last write (behind the offloads issued before it), has
 * ended by now leaves the device at no cost to the compute stream (its
 * offload goes into the plan after that write, its wait, which does not
 * wait, before its free), and a later step that needs it prefetches it
 * back and waits for the copy instead of recomputing it. The cost of
 * evicting it is then the less of its recomputation and that prefetch's
 * wait: offload where the copy hides behind compute and bringing it back
 * costs less than recomputing it, recompute where it does not. In the
 * plan the offload may go before offloads placed earlier, right after its
 * write, where all of them still end by their waits (rkm__dtr_off_place):
 * the stream's idle time early on serves the later evictions. A prefetch
 * is on demand here, waited for at once (its wait priced whole, or at
 * RKM__PREFETCH_PRICE of it); rkm__dtr_hoist then moves the plan's
 * prefetches ahead of need. The simulator times each plan, and
 * rkm__dtr_plan keeps the fastest of DTR recompute-only and these, at
 * either price, with saved states sent to host memory too or not (each
 * choice the greedy makes moves the later ones: neither is always
 * faster). */

/* An offload of copy slot t (rkm__copy_slot: a tensor, or n_tensors + op
 * for an op's saved state), issued after out step `at`, planned to end at
 * `end`, by `due` (its wait) at the latest. */
typedef struct rkm__dtr_off {
    int64_t at;
    int32_t t;
    double end, due;
} rkm__dtr_off;

typedef struct rkm__dtr {
    const rkm_graph *g;
    rkm__sim s;
    rkm__steps out;
    uint64_t budget;
    uint64_t cap;          /* the allocator's bytes: the budget, or unbounded in bytes mode */
    uint64_t step_need;    /* the bytes the step being placed creates */
    int bytes_mode;        /* evict by bytes live, as counted (the placer lays the plan out after) */
    size_t max_steps;      /* a plan longer than this is thrashing: give up */
    double compute, max_time; /* compute so far; over max_time (a plan already found) it cannot win: give up */
    double time;           /* the compute clock: compute and the waits for prefetches */
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
    size_t n_blk, cap_at, cap_end, cap_own; /* apart: a growth that fails leaves them apart */
    double *cost;          /* per block, rkm__dtr_window's scratch */
    size_t cap_cost;
    uint64_t *off_t, *off_g, *off_p;
    /* Copies (the header's comment): */
    int copies;            /* evictions may send copy slots to host memory */
    double price;          /* of the prefetch's copy time, what eviction to host costs */
    int saved;             /* saved states go to host memory too, not only tensors */
    int64_t *wrote;        /* per copy slot: the out step that last wrote it (-1: none) */
    double *clock;         /* per out step: the compute clock after it */
    size_t cap_clock;
    rkm__dtr_off *off;     /* the offloads, in issue order (by at) */
    size_t n_off, cap_off;
    double d2h_end;        /* when the last of them ends */
} rkm__dtr;

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

/* When an offload of live copy slot t issued after its last write (out
 * step *at, or the last offload's where that is later: the stream keeps
 * the plan's order) would end. */
static double rkm__dtr_off_end(const rkm__dtr *d, int32_t t, int64_t *at)
{
    int64_t q = d->wrote[t];
    if (d->n_off && d->off[d->n_off - 1].at > q) q = d->off[d->n_off - 1].at;
    *at = q;
    double start = d->clock[q] > d->d2h_end ? d->clock[q] : d->d2h_end;
    return start + rkm__copy_seconds(d->g, t, d->g->copy.d2h_bytes_per_second);
}

/* The wait for copy slot t's prefetch, as priced (d->price of its copy). */
static double rkm__dtr_back(const rkm__dtr *d, int32_t t)
{
    return d->price * rkm__copy_seconds(d->g, t, d->g->copy.h2d_bytes_per_second);
}

/* Whether evicting live copy slot t sends it to host memory: copies of it
 * allowed, its prefetch cheaper than its recomputation (rkm__dtr_cost; a
 * saved state's: its op's forward), and it has a host copy or its offload
 * would have ended by now. *cost (if not NULL): what evicting it costs
 * later, that prefetch's wait or the recomputation. */
static int rkm__dtr_to_host(const rkm__dtr *d, int32_t t, double *cost)
{
    size_t nt = d->g->n_tensors;
    double c = (size_t)t < nt ? rkm__dtr_cost(d, t) : d->g->ops[(size_t)t - nt].fwd, back = c;
    int64_t at;
    int host = d->copies && ((size_t)t < nt || d->saved) && (back = rkm__dtr_back(d, t)) < c &&
               (d->s.H[t] || (d->wrote[t] >= 0 && rkm__dtr_off_end(d, t, &at) <= d->time));
    if (cost) *cost = host ? back : c;
    return host;
}

static double rkm__dtr_evict_cost(const rkm__dtr *d, int32_t t)
{
    double c;
    rkm__dtr_to_host(d, t, &c);
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
        double h = rkm__dtr_h(d->score, rkm__dtr_evict_cost(d, (int32_t)t), x->bytes, now - d->last_t[t] + 1);
        if (!found || h < best) best = h, found = 1, *is_op = 0, *id = (int32_t)t;
    }
    for (size_t i = 0; i < g->n_ops; i++) {
        if (!d->s.P[i] || d->lock_p[i]) continue;
        double c = rkm__dtr_evict_cost(d, (int32_t)(g->n_tensors + i));
        double h = rkm__dtr_h(d->score, c, g->ops[i].phantom, now - d->last_p[i] + 1);
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
    if (!rkm__reserve(d->g->ctx, (void **)&d->at, &d->cap_at, d->n_blk + 1, sizeof *d->at) ||
        !rkm__reserve(d->g->ctx, (void **)&d->end, &d->cap_end, d->n_blk + 1, sizeof *d->end) ||
        !rkm__reserve(d->g->ctx, (void **)&d->own, &d->cap_own, d->n_blk + 1, sizeof *d->own)) {
        d->failed = -1;
        return 0;
    }
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
    } else if (st->kind == RKM_STEP_PREFETCH && st->save) {
        RKM__DTR_TAKE(g->ops[st->index].phantom, nt + st->index, &d->off_p[st->index]);
    } else if (st->kind == RKM_STEP_PREFETCH) {
        RKM__DTR_TAKE(g->tensors[st->index].bytes, st->index, &d->off_t[st->index]);
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
static void rkm__dtr_drop(rkm__dtr *d, int32_t t);

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
        int64_t w = d->own[k], last;
        uint64_t b = d->end[k] - d->at[k];
        if (w >= 0 && w < nt && d->s.D[w] && !d->lock_t[w]) last = d->last_t[w];
        else if (w >= nt && d->s.P[w - nt] && !d->lock_p[w - nt]) last = d->last_p[w - nt];
        else last = -1;
        d->cost[k] = last < 0 ? -1
                              : rkm__dtr_h(d->score, rkm__dtr_evict_cost(d, (int32_t)w), b, now - last + 1) * (double)b;
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
        rkm__dtr_drop(d, (int32_t)d->own[best_i]);
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
    double dt = kind == RKM_STEP_FWD ? d->g->ops[index].fwd : kind == RKM_STEP_BWD ? d->g->ops[index].bwd : 0;
    d->compute += dt;
    d->time += dt;
    if (d->copies && !rkm__reserve(d->g->ctx, (void **)&d->clock, &d->cap_clock, d->out.n, sizeof *d->clock)) {
        d->failed = -1;
        return;
    }
    if (d->copies) d->clock[d->out.n - 1] = d->time;
    if (d->copies && kind == RKM_STEP_FWD) { /* its outputs, and its saved state (made, or its scratch written) */
        const rkm__op *o = &d->g->ops[index];
        for (int32_t k = 0; k < o->n_out; k++) d->wrote[o->out[k]] = (int64_t)d->out.n - 1;
        if (save || o->scratch > 0) d->wrote[d->g->n_tensors + (size_t)index] = (int64_t)d->out.n - 1;
    }
    if (rkm__sim_step(&d->s, &st, &pk, &obj) != RKM_RULE_NONE || pk > d->budget || d->out.n > d->max_steps ||
        d->compute > d->max_time)
        d->failed = 1;
    if (kind == RKM_STEP_FREE) rkm__dtr_unalloc(d, &d->off_t[index]);
    if (kind == RKM_STEP_FREE_SAVED) rkm__dtr_unalloc(d, &d->off_p[index]);
    if (kind == RKM_STEP_FREE_GRAD) rkm__dtr_unalloc(d, &d->off_g[index]);
}

/* The offloads from k on, timed again on the stream behind off[k - 1]:
 * 1 if each still ends by its wait (then their ends are set). */
static int rkm__dtr_off_retime(rkm__dtr *d, size_t k, int set)
{
    double end = k ? d->off[k - 1].end : 0;
    for (; k < d->n_off; k++) {
        rkm__dtr_off *o = &d->off[k];
        double start = d->clock[o->at] > end ? d->clock[o->at] : end;
        end = start + rkm__copy_seconds(d->g, o->t, d->g->copy.d2h_bytes_per_second);
        if (end > o->due) return 0;
        if (set) o->end = end;
    }
    return 1;
}

/* Offload of slot t into the stream's order (d->off has room): right after
 * its last write where it and every offload after it still end by their
 * waits (the stream may be idle there), else after `at` (the last
 * offload's step or later: rkm__dtr_off_end, which hides). */
static void rkm__dtr_off_place(rkm__dtr *d, int32_t t, int64_t at)
{
    size_t n = d->n_off, k = n;
    while (k > 0 && d->off[k - 1].at > d->wrote[t]) k--;
    memmove(d->off + k + 1, d->off + k, (n - k) * sizeof *d->off);
    d->off[k] = (rkm__dtr_off){d->wrote[t], t, 0, d->time};
    d->n_off++;
    if (k < n && !rkm__dtr_off_retime(d, k, 0)) { /* not there: at the end */
        memmove(d->off + k, d->off + k + 1, (n - k) * sizeof *d->off);
        d->off[n] = (rkm__dtr_off){at, t, 0, d->time};
        k = n;
    }
    rkm__dtr_off_retime(d, k, 1);
    d->d2h_end = d->off[n].end;
}

/* Copy slot t as a copy step's index and save flag. */
static int32_t rkm__dtr_slot(const rkm__dtr *d, int32_t t, int32_t *save)
{
    size_t nt = d->g->n_tensors;
    *save = (size_t)t >= nt;
    return *save ? (int32_t)((size_t)t - nt) : t;
}

/* Send live copy slot t to host memory: its offload, after its last
 * write, is kept aside for rkm__dtr_merge (the simulator takes it now, so
 * that the wait and the frees that follow replay), its wait goes here. */
static void rkm__dtr_offload(rkm__dtr *d, int32_t t)
{
    int64_t at;
    int32_t save, x = rkm__dtr_slot(d, t, &save);
    rkm__dtr_off_end(d, t, &at);
    rkm_step st = {RKM_STEP_OFFLOAD, x, save, 0};
    uint64_t pk;
    int32_t obj;
    if (!rkm__reserve(d->g->ctx, (void **)&d->off, &d->cap_off, d->n_off + 1, sizeof *d->off)) {
        d->failed = -1;
        return;
    }
    if (rkm__sim_step(&d->s, &st, &pk, &obj) != RKM_RULE_NONE) {
        d->failed = 1;
        return;
    }
    rkm__dtr_off_place(d, t, at);
    rkm__dtr_apply(d, RKM_STEP_WAIT, x, save);
}

/* Evict live copy slot t: to host memory where rkm__dtr_to_host says so
 * (offloaded first unless it has a host copy), else dropped. */
static void rkm__dtr_drop(rkm__dtr *d, int32_t t)
{
    int32_t save, x = rkm__dtr_slot(d, t, &save);
    if (rkm__dtr_to_host(d, t, NULL) && !d->s.H[t]) rkm__dtr_offload(d, t);
    rkm__dtr_apply(d, save ? RKM_STEP_FREE_SAVED : RKM_STEP_FREE, x, 0);
}

/* Evict the least of rkm__dtr_victim; none left: the budget cannot be met. */
static void rkm__dtr_evict(rkm__dtr *d)
{
    int is_op = 0;
    int32_t id = -1;
    if (!rkm__dtr_victim(d, &is_op, &id)) d->failed = 1;
    else rkm__dtr_drop(d, is_op ? (int32_t)(d->g->n_tensors + (size_t)id) : id);
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
    if (d->s.H[t] && !needed) rkm__dtr_apply(d, RKM_STEP_FREE_HOST, t, 0);
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

/* Whether copy slot t, not live, comes back from its host copy rather
 * than by recomputing (which costs `recompute` at least). */
static int rkm__dtr_fetches(const rkm__dtr *d, int32_t t, double recompute)
{
    return d->s.H[t] && rkm__dtr_back(d, t) < recompute;
}

/* Bring copy slot t back from its host copy: room for it (evicting as for
 * a compute step), the prefetch, and the wait for it, the copy's whole
 * time (the stream is idle: each prefetch is waited for at once). */
static int rkm__dtr_prefetch(rkm__dtr *d, int32_t t)
{
    int32_t save, x = rkm__dtr_slot(d, t, &save);
    if (!rkm__dtr_run(d, RKM_STEP_PREFETCH, x, save)) return 0;
    d->time += rkm__copy_seconds(d->g, t, d->g->copy.h2d_bytes_per_second);
    rkm__dtr_apply(d, RKM_STEP_WAIT, x, save);
    return !d->failed;
}

/* Make t live: prefetched from its host copy where that takes less than
 * its recomputation, else recomputing its producer (and what that
 * needs). */
static int rkm__dtr_ensure(rkm__dtr *d, int32_t t)
{
    if (d->failed) return 0;
    if (d->s.D[t]) return 1;
    if (rkm__dtr_fetches(d, t, rkm__dtr_cost(d, t))) return rkm__dtr_prefetch(d, t);
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
    int32_t slot = (int32_t)(g->n_tensors + (size_t)i);
    if (o->phantom > 0 && !d->s.P[i] &&
        !(rkm__dtr_fetches(d, slot, o->fwd) ? rkm__dtr_prefetch(d, slot) : rkm__dtr_forward(d, i, 1)))
        return;
    d->lock_p[i]++;
    int32_t k = rkm__dtr_pin(d, o->saved, o->n_saved);
    if (!d->failed) rkm__dtr_run(d, RKM_STEP_BWD, i, 0);
    d->lock_p[i]--;
    rkm__dtr_lock(d, o->saved, k, -1);
    if (d->failed) return;
    if (d->s.P[i]) rkm__dtr_apply(d, RKM_STEP_FREE_SAVED, i, 0);
    if (d->s.H[slot]) rkm__dtr_apply(d, RKM_STEP_FREE_HOST, i, 1);
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
    for (size_t i = 0; i < g->n_ops && !d->failed; i++) {
        if (d->s.P[i]) rkm__dtr_apply(d, RKM_STEP_FREE_SAVED, (int32_t)i, 0);
        if (d->s.H[g->n_tensors + i] && !d->failed) rkm__dtr_apply(d, RKM_STEP_FREE_HOST, (int32_t)i, 1);
    }
    for (size_t t = 0; t < g->n_tensors && !d->failed; t++) {
        if (d->s.D[t] && !(g->tensors[t].flags & RKM_TENSOR_INPUT)) rkm__dtr_apply(d, RKM_STEP_FREE, (int32_t)t, 0);
        if (d->s.H[t] && !d->failed) rkm__dtr_apply(d, RKM_STEP_FREE_HOST, (int32_t)t, 0);
    }
}

static void rkm__dtr_free(rkm__dtr *d)
{
    rkm_context *ctx = d->g->ctx;
    size_t nt = d->g->n_tensors + 1, no = d->g->n_ops + 1;
    rkm__free(ctx, d->lock_t, (3 * nt + 3 * no) * sizeof(int64_t));
    rkm__free(ctx, d->clock, d->cap_clock * sizeof *d->clock);
    rkm__free(ctx, d->off, d->cap_off * sizeof *d->off);
    rkm__free(ctx, d->off_t, (2 * nt + no) * sizeof *d->off_t);
    rkm__free(ctx, d->at, d->cap_at * sizeof *d->at);
    rkm__free(ctx, d->end, d->cap_end * sizeof *d->end);
    rkm__free(ctx, d->own, d->cap_own * sizeof *d->own);
    rkm__free(ctx, d->cost, d->cap_cost * sizeof *d->cost);
    rkm__sim_free(&d->s);
    rkm__steps_free(&d->out);
}

/* Per tensor, the program's reads: forwards reading it, backwards saving it. */
static rkm_result rkm__dtr_init(rkm__dtr *d, const rkm_graph *g, uint64_t budget, int score, int bytes_mode,
                                int copies, double max_time)
{
    memset(d, 0, sizeof *d);
    d->g = g;
    d->copies = copies && g->copy.d2h_bytes_per_second > 0;
    d->price = copies % 2 ? 1 : RKM__PREFETCH_PRICE;
    d->saved = copies <= 2;
    d->budget = budget;
    d->bytes_mode = bytes_mode;
    d->cap = bytes_mode ? UINT64_MAX : budget;
    d->score = score;
    d->max_time = max_time;
    d->out.ctx = g->ctx;
    d->max_steps = RKM__DTR_STEPS_PER_OBJECT * (2 * g->n_ops + g->n_tensors) + RKM__DTR_STEPS_MIN;
    size_t nt = g->n_tensors + 1, no = g->n_ops + 1;
    int64_t *mem = rkm__calloc(g->ctx, 3 * nt + 3 * no, sizeof(int64_t));
    if (!mem) return rkm__nomem(g->ctx, "dtr");
    /* int32 arrays share the int64 allocation's first half */
    d->lock_t = (int32_t *)mem;
    d->lock_p = d->lock_t + nt;
    d->uses = d->lock_p + no;
    d->last_t = mem + nt + no;
    d->last_p = d->last_t + nt;
    d->wrote = d->last_p + no; /* per copy slot: n_tensors + n_ops < nt + no */
    for (size_t t = 0; t < nt + no; t++) d->wrote[t] = -1;
    d->off_t = rkm__alloc(g->ctx, (2 * nt + no) * sizeof *d->off_t);
    rkm_result r = d->off_t ? rkm__sim_init(g, &d->s) : rkm__nomem(g->ctx, "dtr");
    if (r) {
        rkm__free(g->ctx, mem, (3 * nt + 3 * no) * sizeof(int64_t));
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

/* ---- prefetches ahead of need ----------------------------------------
 *
 * DTR's prefetches are on demand, each waited for at once. In its plan,
 * each is then moved up, in order, to the last step from which its copy
 * ends by the time the compute reaches its wait (on the compute clock
 * without waits, which moving the prefetches before it may remove too;
 * behind the prefetches moved before it on the stream), or as far up as
 * the budget lets it (each step it passes holds its bytes as well) and no
 * further than a step that touches the tensor or a prefetch left in
 * place. */

/* Whether step st reads, makes or frees copy slot t (rkm__slot_touches;
 * v: its scratch). */
static int rkm__dtr_touches(const rkm_graph *g, const rkm_step *st, int32_t t, int32_t *v)
{
    int32_t n = rkm__slot_touches(g, st, v);
    for (int32_t k = 0; k < n; k++)
        if (v[k] == t) return 1;
    return 0;
}

/* Where prefetch i of steps (peaks pk, compute clock cc before each step)
 * goes: before step to[i], from *floor up; *h2d: when the stream is free;
 * v: rkm__dtr_touches' scratch. */
static void rkm__dtr_hoist_one(const rkm_graph *g, uint64_t budget, const rkm_step *st, uint64_t *pk, const double *cc,
                               int64_t *to, int64_t i, int64_t *floor, double *h2d, int32_t *v)
{
    int32_t t = (int32_t)rkm__copy_slot(g, &st[i]);
    uint64_t bytes = rkm__slot_bytes(g, t);
    double copy = rkm__copy_seconds(g, t, g->copy.h2d_bytes_per_second);
    int64_t j = i;
    while (j > *floor && (cc[j] > *h2d ? cc[j] : *h2d) + copy > cc[i]) {
        const rkm_step *p = &st[j - 1];
        if (pk[j - 1] + bytes > budget || rkm__dtr_touches(g, p, t, v) || (p->kind == RKM_STEP_PREFETCH && to[j - 1] < 0))
            break;
        j--;
    }
    for (int64_t k = j; k < i; k++) pk[k] += bytes;
    *h2d = (cc[j] > *h2d ? cc[j] : *h2d) + copy;
    *floor = j;
    if (j < i) to[i] = j;
}

/* Plan p's steps with its prefetches moved up into *out (out->n 0: none
 * moved), from its step peaks (p->step_peak, as its birth replayed them);
 * the budget bounds every step's peak. */
RKM__PRIVATE rkm_result rkm__dtr_hoist(const rkm_plan *p, uint64_t budget, rkm__steps *out)
{
    const rkm_graph *g = p->g;
    const rkm_step *st = p->steps;
    size_t n = p->n_steps;
    uint64_t *pk = rkm__alloc(p->ctx, (n + 1) * sizeof *pk);
    double *cc = rkm__alloc(p->ctx, (n + 1) * sizeof *cc);
    int64_t *to = rkm__alloc(p->ctx, (n + 1) * sizeof *to);
    size_t nv = rkm__slot_touches_max(g);
    int32_t *v = rkm__alloc(p->ctx, nv * sizeof *v);
    rkm_result r = pk && cc && to && v ? RKM_OK : rkm__nomem(p->ctx, "dtr prefetches");
    int moved = 0;
    out->n = 0;
    if (!r) {
        memcpy(pk, p->step_peak, n * sizeof *pk);
        cc[0] = 0;
    }
    for (size_t i = 0; i < n && !r; i++) {
        const rkm__op *o = st[i].kind == RKM_STEP_FWD || st[i].kind == RKM_STEP_BWD ? &g->ops[st[i].index] : NULL;
        cc[i + 1] = cc[i] + (o ? (st[i].kind == RKM_STEP_FWD ? o->fwd : o->bwd) : 0);
        to[i] = -1;
    }
    int64_t floor = 0;
    double h2d = 0;
    for (size_t i = 0; i < n && !r; i++)
        if (st[i].kind == RKM_STEP_PREFETCH) {
            rkm__dtr_hoist_one(g, budget, st, pk, cc, to, (int64_t)i, &floor, &h2d, v);
            moved |= to[i] >= 0;
        }
    if (moved && !rkm__reserve(p->ctx, (void **)&out->s, &out->cap, n, sizeof *out->s))
        r = rkm__nomem(p->ctx, "dtr prefetches");
    for (size_t k = 0, i = 0; moved && !r && k < n; k++) { /* the prefetches moved before step k, then step k */
        for (; i < n && (to[i] < 0 || to[i] <= (int64_t)k); i++)
            if (to[i] == (int64_t)k) out->s[out->n++] = st[i];
        if (to[k] < 0) out->s[out->n++] = st[k];
    }
    rkm__free(p->ctx, pk, (n + 1) * sizeof *pk);
    rkm__free(p->ctx, cc, (n + 1) * sizeof *cc);
    rkm__free(p->ctx, to, (n + 1) * sizeof *to);
    rkm__free(p->ctx, v, nv * sizeof *v);
    return r;
}

/* d->out with the offloads in, each after its out step; 0 on NOMEM. */
static int rkm__dtr_merge(rkm__dtr *d)
{
    rkm__steps m = {d->g->ctx, NULL, 0, 0};
    if (!rkm__reserve(m.ctx, (void **)&m.s, &m.cap, d->out.n + d->n_off, sizeof *m.s)) return 0;
    size_t k = 0;
    for (size_t i = 0; i < d->out.n; i++) {
        m.s[m.n++] = d->out.s[i];
        for (; k < d->n_off && d->off[k].at == (int64_t)i; k++) {
            int32_t save, x = rkm__dtr_slot(d, d->off[k].t, &save);
            m.s[m.n++] = (rkm_step){.kind = RKM_STEP_OFFLOAD, .index = x, .save = save};
        }
    }
    rkm__steps_free(&d->out);
    d->out = m;
    return 1;
}

/* DTR's steps for `budget` with eviction score `score` into *draft (with
 * copies where the graph has a link and `copies` is 1..4: the prefetch
 * priced whole where it is odd, else at RKM__PREFETCH_PRICE; saved states
 * sent to host memory too at 1 and 2, tensors only at 3 and 4);
 * draft->n == 0 when it cannot meet the budget. */
RKM__PRIVATE rkm_result rkm__dtr_steps(const rkm_graph *g, uint64_t budget, int score, int bytes_mode, int copies,
                                      double max_time, uint64_t *work, rkm__steps *draft)
{
    rkm__dtr d;
    rkm_result r = rkm__dtr_init(&d, g, budget, score, bytes_mode, copies, max_time);
    if (r) return r;
    if (*work < d.max_steps) d.max_steps = (size_t)*work;
    for (size_t i = 0; i < g->n_ops && !d.failed; i++) rkm__dtr_fwd_step(&d, (int32_t)i);
    if (!d.failed) rkm__dtr_loss(&d);
    for (size_t i = g->n_ops; i-- > 0 && !d.failed;)
        if (g->ops[i].has_bwd) rkm__dtr_bwd_step(&d, (int32_t)i);
    if (!d.failed) rkm__dtr_end(&d);
    if (!d.failed && d.n_off && !rkm__dtr_merge(&d)) d.failed = -1;
    if (d.failed < 0) r = rkm__nomem(g->ctx, "dtr");
    *work = d.out.n < d.max_steps ? d.out.n : d.max_steps;
    if (!d.failed) {
        *draft = d.out;
        d.out.s = NULL;
        d.out.n = d.out.cap = 0;
    }
    rkm__dtr_free(&d);
    return r;
}

