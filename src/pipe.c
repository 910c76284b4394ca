/* pipe.c -- the pipeline simulator: a step of P stages and M micro-batches replayed across devices
 *
 * Uses (through internal.h): base.c, layout.c, plan.c.
 *
 * The step time of a pipeline comes from a replay, not a formula, so that
 * uneven stages and slow links count as they run: each stage is one device that runs its micro-batches' forward and
 * backward phases one at a time, in the order its schedule gives, and a
 * phase starts when its device is free and what it reads has arrived. A
 * forward of micro-batch m at stage s > 0 reads m's output of stage s - 1,
 * a backward of m at stage s < P - 1 reads the gradient of that output
 * from stage s + 1 (the last stage's backward follows its own forward: the
 * loss is its). Each boundary has a link per direction that carries one
 * transfer at a time, in the order they were sent (every stage runs its
 * forwards, and its backwards, in micro-batch order), so a transfer waits
 * for the one before it as well as for its producer.
 *
 * The schedules are Megatron-LM's non-interleaved 1F1B (stage s runs
 * min(P - s - 1, M) warm-up forwards, then one forward and one backward
 * while forwards remain, then the cool-down backwards) and GPipe (every
 * forward, then every backward): the same order with M warm-up forwards.
 * A stage then holds at most min(P - s, M) micro-batches in flight (their
 * forward run and their backward not), M with GPipe: what its memory must
 * hold. The public entry: rkm_pipeline_simulate (rockmate.h). */
#include "internal.h"

/* Warm-up forwards of stage s. */
static int32_t rkm__pipe_warmup(rkm_pipe_schedule kind, int32_t s, int32_t p, int32_t m)
{
    int32_t w = kind == RKM_PIPE_GPIPE ? m : p - s - 1;
    return w < m ? w : m;
}

/* Phase j (0 .. 2M-1) of a stage's order with `warm` warm-up forwards:
 * micro-batch *micro, *bwd. */
static void rkm__pipe_phase(int32_t warm, int32_t m, int32_t j, int32_t *micro, int32_t *bwd)
{
    if (j < warm) { /* warm-up: forwards */
        *micro = j, *bwd = 0;
    } else if (j < warm + 2 * (m - warm)) { /* steady: forward warm + i, then backward i */
        int32_t i = (j - warm) / 2;
        *bwd = (j - warm) % 2;
        *micro = *bwd ? i : warm + i;
    } else { /* cool-down: the last warm backwards */
        *micro = j - warm - (m - warm), *bwd = 1;
    }
}

/* Where micro-batch `micro`'s forward (bwd 0) or backward runs in that
 * order: rkm__pipe_phase's inverse. */
static int32_t rkm__pipe_pos(int32_t warm, int32_t m, int32_t micro, int32_t bwd)
{
    if (!bwd) return micro < warm ? micro : warm + 2 * (micro - warm);
    return micro < m - warm ? warm + 2 * micro + 1 : warm + 2 * (m - warm) + (micro - (m - warm));
}

/* Time ev[0 .. 2pm): stage s's phases in its order at ev[s * 2m ...],
 * by passes over the stages, each stage as far as what its next phase
 * reads has been timed. Every phase reads an earlier one of its own stage
 * or of a neighbour, so a pass that times none means the orders deadlock
 * (these two cannot). link[2s], link[2s + 1]: when stage s's link to
 * s + 1, to s - 1, is free. 0 on a deadlock. */
static int rkm__pipe_replay(const rkm_pipe_stage *st, int32_t p, int32_t m, rkm_pipe_schedule kind, rkm_pipe_phase *ev,
                            int32_t *done, double *link)
{
    const int32_t n = 2 * m;
    int64_t left = (int64_t)p * n;
    for (int32_t s = 0; s < p; s++) {
        int32_t warm = rkm__pipe_warmup(kind, s, p, m);
        for (int32_t j = 0; j < n; j++) {
            rkm_pipe_phase *e = &ev[(size_t)s * n + j];
            *e = (rkm_pipe_phase){s, 0, 0, 0, 0, 0};
            rkm__pipe_phase(warm, m, j, &e->micro, &e->bwd);
        }
        done[s] = 0, link[2 * s] = link[2 * s + 1] = 0;
    }
    for (int progress = 1; left > 0 && progress;) {
        progress = 0;
        for (int32_t s = 0; s < p; s++)
            for (; done[s] < n; done[s]++, left--, progress = 1) {
                rkm_pipe_phase *e = &ev[(size_t)s * n + done[s]];
                int32_t from = e->bwd ? s + 1 : s - 1, to = e->bwd ? s - 1 : s + 1;
                double ready = 0;
                if (from >= 0 && from < p) { /* the neighbour's phase of the same micro-batch */
                    int32_t j = rkm__pipe_pos(rkm__pipe_warmup(kind, from, p, m), m, e->micro, e->bwd);
                    if (j >= done[from]) break; /* not timed yet */
                    ready = ev[(size_t)from * n + j].arrive;
                }
                double free_at = done[s] ? ev[(size_t)s * n + done[s] - 1].end : 0;
                e->start = ready > free_at ? ready : free_at;
                e->end = e->start + (e->bwd ? st[s].bwd : st[s].fwd);
                e->arrive = e->end;
                if (to >= 0 && to < p) { /* its output's transfer, behind the link's last one */
                    double *l = &link[2 * s + e->bwd];
                    *l = e->arrive = (e->end > *l ? e->end : *l) + (e->bwd ? st[s].send_bwd : st[s].send_fwd);
                }
            }
    }
    return left == 0;
}

rkm_result rkm_pipeline_simulate(rkm_context *ctx, const rkm_pipe_stage *stages, int32_t n_stages,
                                 int32_t micro_batches, rkm_pipe_schedule schedule, rkm_pipe_phase *phases,
                                 int32_t *in_flight, double *step_time)
{
    static const char *const name[4] = {"fwd", "bwd", "send_fwd", "send_bwd"};
    const int32_t p = n_stages, m = micro_batches;
    if (!ctx) return RKM_ERROR_ARGUMENT;
    if (!stages || !step_time) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_pipeline_simulate: stages or step_time is NULL");
    if (p < 1 || m < 1)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT,
                        "rkm_pipeline_simulate: %d stages and %d micro-batches: each must be at least 1", (int)p, (int)m);
    if (schedule != RKM_PIPE_1F1B && schedule != RKM_PIPE_GPIPE)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_pipeline_simulate: unknown schedule %d (RKM_PIPE_1F1B or RKM_PIPE_GPIPE)",
                        (int)schedule);
    if (m > INT32_MAX / 2 || (size_t)p > SIZE_MAX / 4 / sizeof *phases / (size_t)m)
        return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_pipeline_simulate: %d stages x %d micro-batches: too many", (int)p, (int)m);
    for (int32_t s = 0; s < p; s++) {
        const double v[4] = {stages[s].fwd, stages[s].bwd, stages[s].send_fwd, stages[s].send_bwd};
        for (int k = 0; k < 4; k++)
            if (!(v[k] >= 0 && v[k] < INFINITY))
                return rkm__err(ctx, RKM_ERROR_ARGUMENT,
                                "rkm_pipeline_simulate: stage %d: %s is %g: a time must be finite and at least 0", (int)s,
                                name[k], v[k]);
    }
    size_t n_ev = 2 * (size_t)p * (size_t)m;
    rkm_pipe_phase *ev = phases ? phases : rkm__alloc(ctx, n_ev * sizeof *ev);
    int32_t *done = rkm__alloc(ctx, (size_t)p * sizeof *done);
    double *link = rkm__alloc(ctx, 2 * (size_t)p * sizeof *link);
    rkm_result r = RKM_OK;
    if (!ev || !done || !link) r = rkm__nomem(ctx, "pipeline replay");
    else if (!rkm__pipe_replay(stages, p, m, schedule, ev, done, link))
        r = rkm__err(ctx, RKM_ERROR_INTERNAL, "rkm_pipeline_simulate: the schedule's orders deadlock");
    if (!r) {
        double end = 0;
        for (int32_t s = 0; s < p; s++) {
            int32_t live = 0, most = 0;
            for (int32_t j = 0; j < 2 * m; j++) {
                const rkm_pipe_phase *e = &ev[(size_t)s * 2 * m + j];
                live += e->bwd ? -1 : 1;
                if (live > most) most = live;
                if (e->end > end) end = e->end;
            }
            if (in_flight) in_flight[s] = most;
        }
        *step_time = end;
    }
    if (!phases) rkm__free(ctx, ev, n_ev * sizeof *ev);
    rkm__free(ctx, done, (size_t)p * sizeof *done);
    rkm__free(ctx, link, 2 * (size_t)p * sizeof *link);
    return r;
}

/* ---- one stage's memory with micro-batches in flight ----------------------
 *
 * Every micro-batch runs the same plan, so between its phases each holds
 * the same bytes (kept: live before the `loss` step), and a phase's step
 * peaks are the plan's own. The replay walks the stage's order adding what
 * the others hold.
 *
 * The layout is one micro-batch's, in [0, slot + transient): the buffers
 * live across the phase boundary (kept) are laid out first, alone, in
 * [0, slot); the others (transient) then go first fit, largest first,
 * around them, each wholly below `slot` or wholly above it. Below, a
 * buffer is in its micro-batch's own slot (where its kept buffers are not
 * at that time); above, in the one region that the running phase has to
 * itself. So micro-batch m's buffer at offset o lies at o + (m mod k) x
 * slot below `slot`, at o + (k - 1) x slot above it, and the arena is
 * k x slot + transient. */

/* A transient item's offset (units): the lowest, first fit among the
 * placed items that live when it does (lo/hi: their spans, n of them),
 * wholly below `cut` or at or above it. */
static uint64_t rkm__stage_fit(uint64_t *lo, uint64_t *hi, size_t n, uint64_t w, uint64_t cut)
{
    for (size_t i = 1; i < n; i++) /* by start: insertion sort, the lists are short */
        for (size_t j = i; j > 0 && lo[j] < lo[j - 1]; j--) {
            uint64_t a = lo[j], b = hi[j];
            lo[j] = lo[j - 1], hi[j] = hi[j - 1];
            lo[j - 1] = a, hi[j - 1] = b;
        }
    uint64_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (o < cut && o + w > cut) o = cut;
        if (hi[i] <= o) continue;
        if (o + w <= lo[i]) break;
        o = hi[i];
    }
    return o < cut && o + w > cut ? cut : o;
}

/* Offsets (bufs) and the slot and transient sizes of p's buffers at
 * `align`, L the phase boundary. */
static rkm_result rkm__stage_place(const rkm_plan *p, size_t L, uint64_t align, rkm_buffer *bufs, uint64_t *slot,
                                   uint64_t *trans)
{
    rkm_context *ctx = p->ctx;
    size_t nb = p->n_buffers, n1 = nb + 1;
    rkm_buffer *b = bufs;
    int64_t *last = rkm__alloc(ctx, n1 * sizeof *last);
    int32_t *order = rkm__alloc(ctx, n1 * sizeof *order);
    uint64_t *lo = rkm__alloc(ctx, n1 * sizeof *lo), *hi = rkm__alloc(ctx, n1 * sizeof *hi);
    uint8_t *kept = rkm__alloc(ctx, n1), *placed = rkm__alloc(ctx, n1);
    rkm_result r = last && order && lo && hi && kept && placed ? RKM_OK : rkm__nomem(ctx, "stage layout");
    if (!r) {
        if (nb) memcpy(b, p->buffers, nb * sizeof *b);
        for (size_t i = 0; i < nb; i++) last[i] = b[i].last_step; /* a chain's end, at its head */
        for (size_t i = nb; i-- > 0;)
            if (b[i].takes_over >= 0 && last[i] > last[b[i].takes_over]) last[b[i].takes_over] = last[i];
        for (size_t i = 0; i < nb; i++) {
            kept[i] = b[i].takes_over < 0 && b[i].first_step < (int64_t)L && last[i] >= (int64_t)L;
            placed[i] = 0;
        }
        /* the kept chains alone: the transient ones weigh nothing there */
        for (size_t i = 0; i < nb; i++) lo[i] = b[i].bytes;
        for (size_t i = 0; i < nb; i++)
            if (b[i].takes_over < 0 && !kept[i]) b[i].bytes = 0;
        uint64_t pk;
        if (rkm__layout(ctx, b, nb, align, RKM__LAY_ALL, NULL, slot, &pk)) r = rkm__nomem(ctx, "stage layout");
        for (size_t i = 0; i < nb; i++) b[i].bytes = lo[i];
    }
    if (!r) {
        size_t m = 0;
        for (size_t i = 0; i < nb; i++) {
            placed[i] = kept[i] && b[i].bytes;
            if (b[i].takes_over < 0 && !kept[i] && b[i].bytes) order[m++] = (int32_t)i;
        }
        for (size_t i = 1; i < m; i++) /* largest first, then by creation: deterministic */
            for (size_t j = i; j > 0; j--) {
                const rkm_buffer *x = &b[order[j]], *y = &b[order[j - 1]];
                if (!(x->bytes > y->bytes || (x->bytes == y->bytes && order[j] < order[j - 1]))) break;
                int32_t t = order[j];
                order[j] = order[j - 1], order[j - 1] = t;
            }
        uint64_t top = *slot / align, cut = *slot / align;
        for (size_t k = 0; k < m; k++) {
            size_t i = (size_t)order[k], n = 0;
            for (size_t j = 0; j < nb; j++)
                if (placed[j] && b[j].first_step <= last[i] && b[i].first_step <= last[j]) {
                    lo[n] = b[j].offset / align;
                    hi[n] = lo[n] + rkm__round_up(b[j].bytes, align) / align;
                    n++;
                }
            uint64_t w = rkm__round_up(b[i].bytes, align) / align, o = rkm__stage_fit(lo, hi, n, w, cut);
            b[i].offset = o * align;
            placed[i] = 1;
            if (o + w > top) top = o + w;
        }
        for (size_t i = 0; i < nb; i++) { /* a chain at its head's offset */
            size_t h = i;
            while (b[h].takes_over >= 0) h = (size_t)b[h].takes_over;
            b[i].offset = b[h].offset;
        }
        *trans = (top - cut) * align;
    }
    rkm__free(ctx, last, n1 * sizeof *last);
    rkm__free(ctx, order, n1 * sizeof *order);
    rkm__free(ctx, lo, n1 * sizeof *lo);
    rkm__free(ctx, hi, n1 * sizeof *hi);
    rkm__free(ctx, kept, n1);
    rkm__free(ctx, placed, n1);
    return r;
}

/* Plan p's peak as a stage of k in flight, exact bytes: its own peak plus
 * what k - 1 others keep (the order F0 .. Fk-1 B0 .. Bk-1's, 1F1B's and
 * GPipe's with k in flight). */
RKM__PRIVATE uint64_t rkm__stage_peak(const rkm_plan *p, int32_t k)
{
    return p->stats.peak + (uint64_t)(k - 1) * rkm__plan_kept(p);
}

/* What a micro-batch of plan p keeps between its phases: the memory
 * before its `loss` step. */
RKM__PRIVATE uint64_t rkm__plan_kept(const rkm_plan *p)
{
    return p->loss_step ? p->mem_after[p->loss_step - 1] : p->g->input_bytes;
}

/* The figures (and, with bufs, offsets) of plan p at stage order (warm,
 * m). */
RKM__PRIVATE rkm_result rkm__stage_memory(const rkm_plan *p, int32_t warm, int32_t m, uint64_t align, rkm_buffer *bufs,
                                          rkm_stage_memory *out)
{
    memset(out, 0, sizeof *out);
    size_t n = p->n_steps, nb = p->n_buffers, L = (size_t)p->loss_step;
    out->kept_bytes = rkm__plan_kept(p);
    for (size_t i = 0; i < n; i++) {
        uint64_t *pk = i < L ? &out->fwd_peak : &out->bwd_peak;
        if (p->step_peak[i] > *pk) *pk = p->step_peak[i];
    }
    int32_t live = 0;
    for (int32_t j = 0; j < 2 * m; j++) {
        int32_t micro, bwd;
        rkm__pipe_phase(warm, m, j, &micro, &bwd);
        uint64_t others = (uint64_t)(live - bwd) * out->kept_bytes, pk = others + (bwd ? out->bwd_peak : out->fwd_peak);
        if (pk > out->peak) out->peak = pk;
        live += bwd ? -1 : 1;
        if (live > out->in_flight) out->in_flight = live;
    }
    out->alignment = align;
    rkm_context *ctx = p->ctx;
    size_t size = (nb + 1) * sizeof(rkm_buffer);
    rkm_buffer *own = bufs ? bufs : rkm__alloc(ctx, size);
    uint64_t slot = 0, trans = 0, k = (uint64_t)out->in_flight;
    rkm_result r = own ? rkm__stage_place(p, L, align, own, &slot, &trans) : rkm__nomem(ctx, "stage layout");
    if (!r && ((slot && k > UINT64_MAX / slot) || !rkm__add_u64(slot * k, trans, &out->arena_bytes)))
        r = rkm__err(ctx, RKM_ERROR_ARGUMENT, "stage layout: %d slots of %llu bytes and %llu more pass 64 bits",
                     (int)out->in_flight, (unsigned long long)slot, (unsigned long long)trans);
    out->slot_bytes = slot, out->transient_bytes = trans;
    /* one micro-batch at a time: the plan's own layout is a slot too */
    if (!r && k == 1 && p->stats.alignment == align && p->stats.arena_bytes < out->arena_bytes) {
        out->slot_bytes = out->arena_bytes = p->stats.arena_bytes;
        out->transient_bytes = 0;
        if (bufs && nb) memcpy(bufs, p->buffers, nb * sizeof *bufs);
    }
    if (!bufs) rkm__free(ctx, own, size);
    if (r) memset(out, 0, sizeof *out);
    return r;
}

static rkm_result rkm__stage_args(const rkm_plan *p, rkm_pipe_schedule kind, int32_t stage, int32_t n_stages, int32_t m,
                                  uint64_t *align, const void *out, const char *fn)
{
    if (!out) return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "%s: out is NULL", fn);
    if (kind != RKM_PIPE_1F1B && kind != RKM_PIPE_GPIPE)
        return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "%s: unknown schedule %d (RKM_PIPE_1F1B or RKM_PIPE_GPIPE)", fn,
                        (int)kind);
    if (n_stages < 1 || stage < 0 || stage >= n_stages || m < 1 || m > INT32_MAX / 2)
        return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "%s: stage %d of %d, %d micro-batches (0 <= stage < stages, at "
                        "least 1 micro-batch)", fn, (int)stage, (int)n_stages, (int)m);
    if (*align & (*align - 1))
        return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "%s: alignment %llu is not a power of two", fn,
                        (unsigned long long)*align);
    if (!*align) *align = p->stats.alignment ? p->stats.alignment : RKM_ARENA_ALIGN;
    if (!rkm__layout_fits(p, *align))
        return rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "%s: the buffers rounded up to %llu bytes pass 64 bits", fn,
                        (unsigned long long)*align);
    return RKM_OK;
}

rkm_result rkm_plan_stage_layout(const rkm_plan *p, rkm_pipe_schedule schedule, int32_t stage, int32_t n_stages,
                                 int32_t micro_batches, uint64_t alignment, rkm_buffer *buffers, rkm_stage_memory *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!p) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__stage_args(p, schedule, stage, n_stages, micro_batches, &alignment, out, "rkm_plan_stage_layout");
    if (!r && !buffers && p->n_buffers) r = rkm__err(p->ctx, RKM_ERROR_ARGUMENT, "rkm_plan_stage_layout: buffers is NULL");
    if (r) return r;
    return rkm__stage_memory(p, rkm__pipe_warmup(schedule, stage, n_stages, micro_batches), micro_batches, alignment,
                             buffers, out);
}

rkm_result rkm_plan_stage_memory(const rkm_plan *p, rkm_pipe_schedule schedule, int32_t stage, int32_t n_stages,
                                 int32_t micro_batches, uint64_t alignment, rkm_stage_memory *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!p) return RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__stage_args(p, schedule, stage, n_stages, micro_batches, &alignment, out, "rkm_plan_stage_memory");
    return r ? r : rkm__stage_memory(p, rkm__pipe_warmup(schedule, stage, n_stages, micro_batches), micro_batches,
                                     alignment, NULL, out);
}
