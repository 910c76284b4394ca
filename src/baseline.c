/* baseline.c -- the baseline plan, its arena (the 100 % of a budget), lower bounds
 *
 * Uses (through internal.h): base.c, graph.c, text.c (decimal numbers), sim.c, plan.c. */
#include "internal.h"

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

RKM__PRIVATE int rkm__saves_phantom(const rkm__op *o) { return o->phantom > 0 && o->has_bwd; }

/* In-place runs, made from a valid plan: a `fwd OP` of an op that declares
 * RKM_OP_INPLACE, whose in[0] is live and out[0] is not, and after which
 * the next step that touches in[0] is `free in[0]`, becomes `fwd OP
 * inplace` and that free goes; a `bwd OP` of an op that declares
 * RKM_OP_GRAD_INPLACE whose grad(in[0]) is not live yet becomes `bwd OP
 * inplace` and the `free_grad out[0]` after it goes. Between the two steps
 * the plan holds one buffer fewer, and no step's peak grows: the plan stays
 * valid and never peaks higher. One decision cannot undo another's
 * conditions: a tensor freed early is touched by nothing in between. */

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
RKM__PRIVATE rkm_result rkm__lower_inplace(const rkm_graph *g, rkm__steps *d)
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
RKM__PRIVATE rkm_result rkm__plan_baseline(const rkm_graph *g, rkm_plan **out)
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

rkm_result rkm_graph_baseline_arena(const rkm_graph *g, uint64_t alignment, uint64_t *out)
{
    if (!g || !out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_baseline_arena: out is NULL") : RKM_ERROR_ARGUMENT;
    *out = 0;
    if (alignment & (alignment - 1))
        return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_baseline_arena: alignment %llu is not a power of two",
                        (unsigned long long)alignment);
    rkm_result r = rkm__check_finalized(g, "rkm_graph_baseline_arena");
    rkm_plan *p = NULL;
    if (!r) r = rkm__plan_handout(rkm__plan_baseline(g, &p), alignment ? alignment : RKM_ARENA_ALIGN, &p);
    if (!r && !p->stats.alignment)
        r = rkm__err(g->ctx, RKM_ERROR_GRAPH, "rkm_graph_baseline_arena: the baseline's buffers rounded up to %llu bytes "
                                              "add up past 64 bits", (unsigned long long)(alignment ? alignment : RKM_ARENA_ALIGN));
    if (!r) *out = p->stats.arena_bytes;
    rkm_plan_destroy(p);
    return r;
}

/* The number and unit of a budget; 0 if the text is not one (*r says why
 * where that is not the text). A percentage is of the baseline's arena at
 * `alignment`, laid out only when the text is one. */
static int rkm__budget_value(const rkm_graph *g, const char *text, uint64_t alignment, uint64_t *out, rkm_result *r)
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
        uint64_t whole = 0;
        if (units[i].mult < 0 && (*r = rkm_graph_baseline_arena(g, alignment, &whole))) return 0;
        double bytes = units[i].mult < 0 ? v / 100.0 * (double)whole : v * units[i].mult;
        if (bytes >= 18446744073709551615.0) return 0;
        *out = (uint64_t)bytes;
        return 1;
    }
    return 0;
}

rkm_result rkm_parse_budget(const rkm_graph *g, const char *text, uint64_t alignment, uint64_t *out)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    if (!text || !out) return rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_parse_budget: text or out is NULL");
    rkm_result r = RKM_OK;
    *out = 0;
    if (rkm__budget_value(g, text, alignment, out, &r)) return RKM_OK;
    if (r) return r;
    return rkm__err(g->ctx, RKM_ERROR_ARGUMENT,
                    "budget '%.64s': bytes (N or NB), optionally with KiB, MiB, GiB, KB, MB or GB, or N%% of the "
                    "baseline's arena",
                    text);
}

/* Sum of bytes of the distinct tensors among two id lists (a, then b). */
RKM__PRIVATE uint64_t rkm__bytes_union(const rkm_graph *g, const int32_t *a, int32_t na, const int32_t *b, int32_t nb,
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

/* The largest single step's need: no plan can peak below it. *op, *bwd:
 * that step (-1: the loss step, which holds the inputs, the loss and its
 * gradient). */
RKM__PRIVATE uint64_t rkm__lower_bound(const rkm_graph *g, int32_t *op, int *bwd)
{
    uint64_t lb = g->input_bytes + 2 * g->tensors[g->loss].bytes;
    *op = -1;
    *bwd = 0;
    for (size_t i = 0; i < g->n_ops; i++) {
        const rkm__op *o = &g->ops[i];
        /* a run in place has out[0] in in[0]'s bytes, and grad(in[0]) in grad(out[0])'s */
        uint64_t f = g->input_bytes + rkm__bytes_union(g, o->in, o->n_in, o->out, o->n_out, 0) + o->fwd_ws +
                     (rkm__saves_phantom(o) ? o->phantom : o->scratch) - /* each run holds at least the scratch */
                     (o->flags & RKM_OP_INPLACE ? g->tensors[o->out[0]].bytes : 0);
        if (f > lb) lb = f, *op = (int32_t)i, *bwd = 0;
        if (!o->has_bwd) continue;
        uint64_t b = g->input_bytes + rkm__bytes_union(g, o->saved, o->n_saved, NULL, 0, 0) + o->phantom + o->bwd_ws +
                     rkm__bytes_union(g, o->out, o->n_out, o->in, o->n_in, 1) -
                     (o->flags & RKM_OP_GRAD_INPLACE ? g->tensors[o->in[0]].bytes : 0);
        if (b > lb) lb = b, *op = (int32_t)i, *bwd = 1;
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
    /* with a copy link a state that does not fit can wait in host memory */
    if (budget >= g->stats.baseline_peak || g->copy.d2h_bytes_per_second > 0) return RKM_OK;
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
RKM__PRIVATE rkm_result rkm__graph_figures(rkm_graph *g)
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
        int32_t op;
        int bwd;
        st->lower_bound = rkm__lower_bound(g, &op, &bwd);
        st->blocks = g->n_blocks;
        st->block_classes = g->n_classes;
    }
    rkm__steps_free(&d);
    return r;
}

rkm_result rkm_graph_stats_get(const rkm_graph *g, rkm_graph_stats *out)
{
    if (out) memset(out, 0, sizeof *out); /* zeroed on every error (rockmate.h) */
    if (!g || !out) return g ? rkm__err(g->ctx, RKM_ERROR_ARGUMENT, "rkm_graph_stats_get: out is NULL") : RKM_ERROR_ARGUMENT;
    rkm_result r = rkm__check_finalized(g, "rkm_graph_stats_get");
    if (!r) *out = g->stats;
    return r;
}

