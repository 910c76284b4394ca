/* plan.c -- plans: steps, plan files (.rkp), copies
 *
 * Uses (through internal.h): base.c, graph.c, rkg.c, sim.c, layout.c. */
#include "internal.h"

void rkm_plan_destroy(rkm_plan *p)
{
    if (!p) return;
    rkm_context *ctx = p->ctx;
    rkm__free(ctx, p->steps, p->n_steps * sizeof *p->steps);
    rkm__free(ctx, p->mem_after, (p->n_steps + 1) * sizeof *p->mem_after);
    rkm__free(ctx, p->step_peak, (p->n_steps + 1) * sizeof *p->step_peak);
    rkm__free(ctx, p->flag_off, (p->n_steps + 1) * sizeof *p->flag_off);
    rkm__free(ctx, p->flags, p->n_flags);
    if (p->peer) rkm__free(ctx, p->peer, p->n_steps * sizeof *p->peer);
    rkm__free(ctx, p->buffers, p->cap_buffers * sizeof *p->buffers);
    rkm__free(ctx, p, sizeof *p);
}

/* Append a copy of *st (a step as given: the birth checks it; `save`
 * means something on forward and copy steps only). */
RKM_PRIVATE int rkm__steps_push_step(rkm__steps *l, const rkm_step *st)
{
    int save = st->kind == RKM_STEP_FWD || st->kind >= RKM_STEP_OFFLOAD;
    if (!rkm__steps_push(l, st->kind, st->index, save ? st->save : 0)) return 0;
    l->s[l->n - 1].inplace = st->inplace;
    return 1;
}

/* Shrink to exactly n steps so that the owner frees with n * size. */
RKM_PRIVATE rkm_step *rkm__steps_take(rkm__steps *l)
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

RKM_PRIVATE void rkm__steps_free(rkm__steps *l)
{
    rkm__free(l->ctx, l->s, l->cap * sizeof *l->s);
    l->s = NULL;
    l->n = l->cap = 0;
}

/* A draft of the n given steps (each as rkm__steps_push_step copies it),
 * for a birth; out of memory names `what` and leaves nothing. */
RKM_PRIVATE rkm_result rkm__steps_copy(rkm_context *ctx, const rkm_step *steps, size_t n, rkm__steps *d, const char *what)
{
    *d = (rkm__steps){ctx, NULL, 0, 0};
    for (size_t i = 0; i < n; i++)
        if (!rkm__steps_push_step(d, &steps[i])) {
            rkm__steps_free(d);
            return rkm__nomem(ctx, what);
        }
    return RKM_OK;
}

/* Does a step of this kind name an op (fwd, bwd, free_saved), not a tensor?
 * (A copy step names an op when it copies its saved state: `save`.) */
RKM_PRIVATE int rkm__step_on_op(int32_t kind)
{
    return kind == RKM_STEP_FWD || kind == RKM_STEP_BWD || kind == RKM_STEP_FREE_SAVED;
}

/* A copy step's slot in the simulator's copy arrays: the tensor, or after
 * the tensors the op whose saved state it copies. */
RKM_PRIVATE size_t rkm__copy_slot(const rkm_graph *g, const rkm_step *st)
{
    return st->save ? g->n_tensors + (size_t)st->index : (size_t)st->index;
}

RKM_PRIVATE inline int rkm__step_index_ok(const rkm_graph *g, const rkm_step *s)
{
    int compute = s->kind == RKM_STEP_FWD || s->kind == RKM_STEP_BWD;
    if (s->inplace != 0 && !(compute && s->inplace == 1)) return 0;
    switch (s->kind) {
    case RKM_STEP_FWD: return s->index >= 0 && (size_t)s->index < g->n_ops && (s->save == 0 || s->save == 1);
    case RKM_STEP_BWD:
    case RKM_STEP_FREE_SAVED: return s->index >= 0 && (size_t)s->index < g->n_ops;
    case RKM_STEP_LOSS: return s->index == g->loss;
    case RKM_STEP_FREE:
    case RKM_STEP_FREE_GRAD:
    case RKM_STEP_OFFLOAD:
    case RKM_STEP_PREFETCH:
    case RKM_STEP_WAIT:
    case RKM_STEP_FREE_HOST:
        return s->index >= 0 && (s->save == 0 ? (size_t)s->index < g->n_tensors
                                 : s->save == 1 && (size_t)s->index < g->n_ops && g->ops[s->index].phantom > 0);
    default: return 0;
    }
}

const rkm_graph *rkm_plan_graph(const rkm_plan *p) { return p ? p->g : NULL; }
size_t rkm_plan_num_steps(const rkm_plan *p) { return p ? p->n_steps : 0; }
const rkm_step *rkm_plan_steps(const rkm_plan *p) { return p ? p->steps : NULL; }
const uint64_t *rkm_plan_mem_after(const rkm_plan *p) { return p ? p->mem_after : NULL; }
const uint64_t *rkm_plan_step_peaks(const rkm_plan *p) { return p ? p->step_peak : NULL; }
size_t rkm_plan_num_buffers(const rkm_plan *p) { return p ? p->n_buffers : 0; }

static const char *const rkm__step_words[RKM__STEP_KINDS] = {"fwd",     "loss",     "bwd",  "free",     "free_saved",
                                                             "free_grad", "offload", "prefetch", "wait", "free_host"};

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
    default: /* free, free_grad and the copy steps: a tensor, or (a copy step with save) a saved state; no
                case falls through, for clang's -Wimplicit-fallthrough takes no comment */
        if (s->kind >= RKM_STEP_OFFLOAD && s->save)
            snprintf(buf, size, "%s %s saved", rkm__step_words[s->kind], g->ops[s->index].name);
        else
            snprintf(buf, size, "%s %s", rkm__step_words[s->kind], g->tensors[s->index].name);
        break;
    }
}

/* A plan handed out by the API: born (r is the birth's result), then laid
 * out at `alignment`; on failure nothing is left. A read, built or baseline
 * plan whose buffers rounded up add up past 64 bits is handed out without a
 * layout (its alignment 0; rkm_plan_layout says why). */
RKM_PRIVATE rkm_result rkm__plan_handout(rkm_result r, uint64_t alignment, rkm_plan **out)
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
RKM_PRIVATE rkm_result rkm__plan_args(const rkm_graph *g, rkm_plan **out, int input_ok, const char *fn, const char *what)
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
    for (int k = 0; k < RKM__STEP_KINDS; k++)
        if (strcmp(w, rkm__step_words[k]) == 0) kind = k;
    if (kind < 0)
        return rkm__rerr(r, RKM_ERROR_PARSE, "unknown step '%.64s' (fwd, loss, bwd, free, free_saved, free_grad, offload, "
                         "prefetch, wait, free_host)", w);
    rkm_step st = {kind, 0, 0, 0};
    if (kind == RKM_STEP_LOSS) {
        if (r->ntok != 1) return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'loss' alone");
        st.index = g->loss;
    } else {
        int copy = kind >= RKM_STEP_OFFLOAD;
        int want_max = kind == RKM_STEP_FWD ? 4 : kind == RKM_STEP_BWD || copy ? 3 : 2;
        const char *form = kind == RKM_STEP_FWD ? "fwd OP [save] [inplace]" : kind == RKM_STEP_BWD ? "bwd OP [inplace]" : NULL;
        if (copy && r->ntok == 3 && strcmp(r->tok[2], "saved") != 0)
            return rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s TENSOR' or '%s OP saved', not '%.64s' as word 3", w, w,
                             r->tok[2]);
        st.save = copy && r->ntok == 3;
        if (r->ntok < 2 || r->ntok > want_max)
            return form ? rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s'", form) : rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s NAME'", w);
        for (int i = 2; i < r->ntok && !copy; i++) {
            int is_save = kind == RKM_STEP_FWD && strcmp(r->tok[i], "save") == 0 && i == 2;
            int is_inplace = strcmp(r->tok[i], "inplace") == 0 && !st.inplace;
            if (!is_save && !is_inplace)
                return rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s', not '%.64s' as word %d", form, r->tok[i], i + 1);
            st.save |= is_save;
            st.inplace |= is_inplace;
        }
        int on_op = rkm__step_on_op(kind) || st.save;
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

