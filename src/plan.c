/* plan.c -- the plan object: birth (a replay), seal (its layout), hand-out, copies, files (.rkp)
 *
 * Uses (through internal.h): base.c, graph.c, text.c, sim.c, layout.c. */
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
    rkm__graph_free_holder(ctx, p, sizeof *p, p->g);
}

/* Append a copy of *st (a step as given: the birth checks it; `save`
 * means something on forward and copy steps only). */
RKM__PRIVATE int rkm__steps_push_step(rkm__steps *l, const rkm_step *st)
{
    int save = st->kind == RKM_STEP_FWD || st->kind >= RKM_STEP_OFFLOAD;
    if (!rkm__steps_push(l, st->kind, st->index, save ? st->save : 0)) return 0;
    l->s[l->n - 1].inplace = st->inplace;
    return 1;
}

/* Shrink to exactly n steps so that the owner frees with n * size. */
RKM__PRIVATE rkm_step *rkm__steps_take(rkm__steps *l)
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

RKM__PRIVATE void rkm__steps_free(rkm__steps *l)
{
    rkm__free(l->ctx, l->s, l->cap * sizeof *l->s);
    l->s = NULL;
    l->n = l->cap = 0;
}

/* A draft of the n given steps (each as rkm__steps_push_step copies it),
 * for a birth; out of memory names `what` and leaves nothing. */
RKM__PRIVATE rkm_result rkm__steps_copy(rkm_context *ctx, const rkm_step *steps, size_t n, rkm__steps *d, const char *what)
{
    *d = (rkm__steps){ctx, NULL, 0, 0};
    for (size_t i = 0; i < n; i++)
        if (!rkm__steps_push_step(d, &steps[i])) {
            rkm__steps_free(d);
            return rkm__nomem(ctx, what);
        }
    return RKM_OK;
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
RKM__PRIVATE rkm_result rkm__plan_handout(rkm_result r, uint64_t alignment, rkm_plan **out)
{
    if (r == RKM_OK && !rkm__layout_fits(*out, alignment)) return RKM_OK;
    if (r == RKM_OK && (r = rkm__plan_seal(*out, alignment, NULL))) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    return r;
}

/* What every function that makes a plan of g checks first: *out cleared,
 * g given and finalized, its input (`what`) given when input_ok is 0. */
RKM__PRIVATE rkm_result rkm__plan_args(const rkm_graph *g, rkm_plan **out, int input_ok, const char *fn, const char *what)
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

/* A version 2 plan file fingerprints the graph it was made for, aspect by
 * aspect (docs/formats.md, "Plan file"): each object's record, little-endian,
 * doubles by their IEEE bits, hashed with FNV-1a 64; an aspect's hash is
 * the XOR of its objects' hashes, and its locator word b the low 32 bits of
 * the XOR over the objects whose index has bit b set, so that one object
 * that differs is named by its index. */
enum { RKM__FP_TENSORS, RKM__FP_OPS, RKM__FP_STRUCTURE, RKM__FP_COPY, RKM__FP_ASPECTS };
static const char *const rkm__fp_words[RKM__FP_ASPECTS] = {"tensors", "ops", "structure", "copy"};

static uint64_t rkm__fnv(uint64_t h, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
    return h;
}

static uint64_t rkm__fnv_f64(uint64_t h, double x)
{
    uint64_t v;
    memcpy(&v, &x, sizeof v);
    return rkm__fnv(h, v, 8);
}

static uint64_t rkm__fnv_ids(uint64_t h, const int32_t *ids, int32_t n)
{
    h = rkm__fnv(h, (uint32_t)n, 4);
    for (int32_t k = 0; k < n; k++) h = rkm__fnv(h, (uint32_t)ids[k], 4);
    return h;
}

/* The objects of aspect a: tensors; ops; ops then the loss; the link. */
static size_t rkm__fp_objects(const rkm_graph *g, int a)
{
    if (a == RKM__FP_COPY) return 1;
    return a == RKM__FP_TENSORS ? g->n_tensors : g->n_ops + (a == RKM__FP_STRUCTURE);
}

static uint64_t rkm__fp_object(const rkm_graph *g, int a, size_t i)
{
    uint64_t h = rkm__fnv(14695981039346656037ull, (uint32_t)i, 4);
    if (a == RKM__FP_TENSORS) {
        const rkm__tensor *t = &g->tensors[i];
        return rkm__fnv(rkm__fnv(h, t->bytes, 8), t->flags & (RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD | RKM_TENSOR_INPUT_GRAD), 4);
    }
    if (a == RKM__FP_COPY)
        return rkm__fnv_f64(rkm__fnv_f64(rkm__fnv_f64(h, g->copy.d2h_bytes_per_second), g->copy.h2d_bytes_per_second),
                            g->copy.latency_seconds);
    if (a == RKM__FP_STRUCTURE && i == g->n_ops) return rkm__fnv(h, (uint32_t)g->loss, 4); /* its last object */
    const rkm__op *o = &g->ops[i];
    if (a == RKM__FP_STRUCTURE) return rkm__fnv_ids(rkm__fnv_ids(rkm__fnv_ids(h, o->in, o->n_in), o->out, o->n_out),
                                                    o->saved, o->n_saved);
    h = rkm__fnv_f64(rkm__fnv_f64(h, o->fwd), o->bwd);
    h = rkm__fnv(rkm__fnv(h, o->phantom, 8), o->scratch, 8);
    h = rkm__fnv(rkm__fnv(h, o->fwd_ws, 8), o->bwd_ws, 8);
    return rkm__fnv(h, o->flags & (RKM_OP_INPLACE | RKM_OP_GRAD_INPLACE), 4);
}

/* Locator words for n objects: bits enough to write the indices 0..n-1. */
static int rkm__fp_bits(size_t n)
{
    int k = 0;
    while (k < 32 && ((size_t)1 << k) < n) k++;
    return k;
}

/* Aspect a of g: its hash and locator words (rkm__fp_bits of its objects). */
static void rkm__fp(const rkm_graph *g, int a, uint64_t *hash, uint32_t loc[32])
{
    size_t n = rkm__fp_objects(g, a);
    *hash = 0;
    memset(loc, 0, 32 * sizeof *loc);
    for (size_t i = 0; i < n; i++) {
        uint64_t h = rkm__fp_object(g, a, i);
        *hash ^= h;
        for (int b = 0; b < 32 && (i >> b); b++)
            if (i >> b & 1) loc[b] ^= (uint32_t)h;
    }
}

static void rkm__fp_write(rkm__out *o, const rkm_graph *g)
{
    for (int a = 0; a < RKM__FP_ASPECTS; a++) {
        uint64_t h;
        uint32_t loc[32];
        rkm__fp(g, a, &h, loc);
        rkm__outf(o, "graph %s", rkm__fp_words[a]);
        if (a != RKM__FP_COPY) rkm__outf(o, " %zu", a == RKM__FP_TENSORS ? g->n_tensors : g->n_ops);
        rkm__outf(o, " %016llx", (unsigned long long)h);
        int k = rkm__fp_bits(rkm__fp_objects(g, a));
        for (int b = 0; b < k; b++) rkm__outf(o, b ? "%08lx" : " %08lx", (unsigned long)loc[b]);
        rkm__outf(o, "\n");
    }
}

/* The first `digits` characters of s as lowercase hex digits (the caller
 * checks the token's length). */
static int rkm__parse_hex(const char *s, size_t digits, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < digits; i++, s++) {
        int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v << 4 | (unsigned)d;
    }
    *out = v;
    return 1;
}

/* The one object whose hash differs, from the XOR of the two hashes (d)
 * and of the two locators, or -1 where more than one differs. */
static int64_t rkm__fp_locate(uint64_t d, const uint32_t *loc, const uint32_t *had, int k, size_t n)
{
    uint32_t low = (uint32_t)d;
    size_t i = 0;
    if (!low) return -1;
    for (int b = 0; b < k; b++) {
        uint32_t x = loc[b] ^ had[b];
        if (x == low) i |= (size_t)1 << b;
        else if (x) return -1;
    }
    return i < n ? (int64_t)i : -1;
}

/* `graph ASPECT [COUNT] HASH [LOCATOR]`: g is the graph the plan was made
 * for, or the first difference is named. `seen`: the aspects read. */
static rkm_result rkm__read_fp(rkm__reader *r, const rkm_graph *g, unsigned *seen)
{
    int a = 0;
    while (a < RKM__FP_ASPECTS && (r->ntok < 2 || strcmp(r->tok[1], rkm__fp_words[a]) != 0)) a++;
    if (a == RKM__FP_ASPECTS)
        return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'graph tensors|ops|structure COUNT HASH [LOCATOR]' or "
                         "'graph copy HASH'");
    if (*seen & 1u << a) return rkm__rerr(r, RKM_ERROR_PARSE, "graph %s: given twice", rkm__fp_words[a]);
    *seen |= 1u << a;
    size_t have = a == RKM__FP_TENSORS ? g->n_tensors : g->n_ops, n = rkm__fp_objects(g, a);
    int c = a != RKM__FP_COPY; /* a count before the hash */
    uint64_t count = 0, hash = 0;
    uint32_t had[32] = {0};
    int ok = r->ntok >= 3 + c && (!c || (rkm__parse_u64(r->tok[2], &count) && count < ((uint64_t)1 << 31)));
    int k = ok && c ? rkm__fp_bits((size_t)count + (a == RKM__FP_STRUCTURE)) : 0;
    const char *lt = r->ntok > 3 + c ? r->tok[3 + c] : "";
    ok = ok && r->ntok <= 3 + c + (k > 0) && strlen(r->tok[2 + c]) == 16 && rkm__parse_hex(r->tok[2 + c], 16, &hash) &&
         strlen(lt) == 8 * (size_t)k;
    for (int b = 0; ok && b < k; b++) {
        uint64_t v = 0;
        ok = rkm__parse_hex(lt + 8 * b, 8, &v);
        had[b] = (uint32_t)v;
    }
    if (!ok)
        return c ? rkm__rerr(r, RKM_ERROR_PARSE, "expected 'graph %s COUNT HASH [LOCATOR]' (COUNT below 2^31; HASH "
                             "16 hex digits; LOCATOR 8 a bit of the indices, where there are more than 1)",
                             rkm__fp_words[a])
                 : rkm__rerr(r, RKM_ERROR_PARSE, "expected 'graph copy HASH' (16 hex digits)");
    if (c && count != have)
        return rkm__rerr(r, RKM_ERROR_PARSE, "the plan was made for a graph of %llu %s; this one has %zu",
                         (unsigned long long)count, a == RKM__FP_TENSORS ? "tensors" : "ops", have);
    uint64_t h;
    uint32_t loc[32];
    rkm__fp(g, a, &h, loc);
    if (h == hash) return RKM_OK;
    int64_t i = rkm__fp_locate(h ^ hash, loc, had, k, n);
    static const char *const what[RKM__FP_ASPECTS][2] = {
        {"tensor sizes or flags differ", ""},
        {"op costs differ", " (seconds, phantom, scratch, workspaces or in-place flags)"},
        {"the structure differs", " (in, out or saved lists)"},
        {"the copy link differs", " (bandwidths or latency)"}};
    char at[RKM__NAME_MAX + 64] = "";
    if (a != RKM__FP_COPY) {
        const char *obj = a == RKM__FP_TENSORS ? "tensor" : "op";
        if (i < 0) snprintf(at, sizeof at, " at more than one %s", obj);
        else if ((size_t)i == g->n_ops && a == RKM__FP_STRUCTURE) snprintf(at, sizeof at, " at the loss");
        else snprintf(at, sizeof at, " at %s '%s'", obj, a == RKM__FP_TENSORS ? g->tensors[i].name : g->ops[i].name);
    }
    return rkm__rerr(r, RKM_ERROR_PARSE, "the plan was made for another graph: %s%s%s", what[a][0], at,
                     i == (int64_t)g->n_ops && a == RKM__FP_STRUCTURE ? "" : what[a][1]);
}

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

/* `align N`: the alignment the plan is laid out at. */
static rkm_result rkm__read_align(rkm__reader *r, unsigned *seen, uint64_t *align)
{
    uint64_t v;
    if (*seen & 1u << RKM__FP_ASPECTS) return rkm__rerr(r, RKM_ERROR_PARSE, "align: given twice");
    *seen |= 1u << RKM__FP_ASPECTS;
    if (r->ntok != 2 || !rkm__parse_u64(r->tok[1], &v) || !v || (v & (v - 1)) || v > RKM__MAX_ALIGNMENT)
        return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'align N', N a power of two from 1 to %llu",
                         (unsigned long long)RKM__MAX_ALIGNMENT);
    *align = v;
    return RKM_OK;
}

/* Parse .rkp text into d: syntax and names only, and for version 2 the
 * alignment (*align, left as it is when not given) and the graph's
 * fingerprint. *lines (capacity *cap) receives each step's line, for the
 * messages of the rules. */
static rkm_result rkm__read_steps(const rkm_graph *g, const char *text, size_t len, const char *source_name, rkm__steps *d,
                                  int32_t **lines, size_t *cap, uint64_t *align)
{
    rkm__reader r;
    memset(&r, 0, sizeof r);
    r.ctx = g->ctx;
    r.src = source_name ? source_name : "<string>";
    r.p = text ? text : "";
    r.end = r.p + len;
    rkm_result res = rkm__next_stmt(&r);
    int version = 0;
    if (!res && r.ntok == 2 && strcmp(r.tok[0], "rockmate-plan") == 0)
        version = strcmp(r.tok[1], "1") == 0 ? 1 : strcmp(r.tok[1], "2") == 0 ? 2 : 0;
    if (!res && !version) {
        if (!r.line) r.line = 1;
        res = rkm__rerr(&r, RKM_ERROR_PARSE,
                        "the first statement must be the header 'rockmate-plan 1' or 'rockmate-plan 2'");
    }
    unsigned seen = 0; /* the fingerprint's aspects read, and align */
    while (!res) {
        if ((res = rkm__next_stmt(&r)) || !r.ntok) break;
        int head = strcmp(r.tok[0], "align") == 0 ? 1 : strcmp(r.tok[0], "graph") == 0 ? 2 : 0;
        if (head && (version < 2 || d->n)) {
            res = rkm__rerr(&r, RKM_ERROR_PARSE, version < 2 ? "'%s' needs the header 'rockmate-plan 2'"
                                                             : "'%s' comes before the steps", r.tok[0]);
        } else if (head) {
            res = head == 1 ? rkm__read_align(&r, &seen, align) : rkm__read_fp(&r, g, &seen);
        } else {
            res = rkm__read_step(&r, g, d);
            if (!res && !rkm__reserve(g->ctx, (void **)lines, cap, d->n, sizeof **lines))
                res = rkm__nomem(g->ctx, r.src);
            if (!res) (*lines)[d->n - 1] = (int32_t)r.line;
        }
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
    uint64_t align = RKM_ARENA_ALIGN;
    if (!sim) sim = &tmp;
    if ((res = rkm__read_steps(g, text, len, source_name, &d, &lines, &cap, &align))) {
        rkm__steps_free(&d);
    } else if ((res = rkm__plan_birth(g, &d, sim, out)) == RKM_ERROR_PLAN) {
        /* The rule's message, led by the file and the step's line. */
        char msg[RKM__ERRMSG_SIZE];
        snprintf(msg, sizeof msg, "%s", g->ctx->errmsg);
        const char *src = source_name ? source_name : "<string>";
        if (sim->fail_step >= 0 && (size_t)sim->fail_step < sim->num_steps)
            rkm__err(g->ctx, res, "%s:%d: %s", src, (int)lines[sim->fail_step], msg);
        else
            rkm__err(g->ctx, res, "%s: %s", src, msg);
    }
    rkm__free(g->ctx, lines, cap * sizeof *lines);
    return rkm__plan_handout(res, align, out);
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
    rkm__outf(&o, "rockmate-plan 2\n");
    if (p->stats.alignment) rkm__outf(&o, "align %llu\n", (unsigned long long)p->stats.alignment);
    rkm__fp_write(&o, p->g);
    for (size_t i = 0; i < p->n_steps; i++) {
        char text[RKM__NAME_MAX + 32];
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
    size_t n = draft->n, nf = 0, copies = 0;
    for (size_t i = 0; i < n; i++) {
        const rkm_step *st = &draft->s[i];
        if (!rkm__step_index_ok(g, st)) continue;
        if (st->kind == RKM_STEP_FWD) nf += 2 + (size_t)g->ops[st->index].n_out;
        if (st->kind == RKM_STEP_BWD) nf += (size_t)g->ops[st->index].n_in + (size_t)g->ops[st->index].n_out;
        copies += st->kind == RKM_STEP_WAIT;
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
    rkm__graph_hold(g);
    p->ctx = g->ctx;
    p->steps = steps;
    p->n_steps = n;
    p->n_flags = nf + 1;
    p->mem_after = rkm__calloc(g->ctx, n + 1, sizeof *p->mem_after);
    p->step_peak = rkm__calloc(g->ctx, n + 1, sizeof *p->step_peak);
    p->flag_off = rkm__calloc(g->ctx, n + 1, sizeof *p->flag_off);
    p->flags = rkm__calloc(g->ctx, p->n_flags, 1);
    if (copies) p->peer = rkm__alloc(g->ctx, n * sizeof *p->peer);
    if (!p->mem_after || !p->step_peak || !p->flag_off || !p->flags || (copies && !p->peer)) {
        rkm_plan_destroy(p);
        return rkm__nomem(g->ctx, "plan");
    }
    *out = p;
    return RKM_OK;
}

/* p->peer of a valid plan with copies; open (a copy slot each) is
 * scratch. */
static void rkm__plan_peers(rkm_plan *p, int64_t *open)
{
    for (size_t t = 0; t < p->g->n_tensors + p->g->n_ops; t++) open[t] = -1;
    for (size_t i = 0; i < p->n_steps; i++) {
        const rkm_step *st = &p->steps[i];
        size_t slot = rkm__copy_slot(p->g, st);
        p->peer[i] = -1;
        if (st->kind == RKM_STEP_OFFLOAD || st->kind == RKM_STEP_PREFETCH) open[slot] = (int64_t)i;
        if (st->kind != RKM_STEP_WAIT) continue;
        p->peer[i] = open[slot];
        p->peer[open[slot]] = (int64_t)i;
    }
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
    p->stats.d2h_seconds = s.d2h_busy;
    p->stats.h2d_seconds = s.h2d_busy;
    if (ok == 1) rkm__recorder_end(&rc);
    if (ok == 1 && p->peer) rkm__plan_peers(p, rc.open_t);
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
RKM__PRIVATE rkm_result rkm__plan_birth(const rkm_graph *g, rkm__steps *draft, rkm_sim_result *res, rkm_plan **out)
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
    st->in_flight = 1;
    st->stage_peak = res->peak;
    st->time = res->time;
    st->recomputes = recomputes;
    st->baseline_peak = g->stats.baseline_peak;
    st->baseline_time = g->stats.baseline_time;
    st->overhead = st->baseline_time > 0 ? st->time / st->baseline_time - 1 : 0;
    st->host_peak = res->host_peak;
    st->wait_seconds = res->wait_seconds;
    for (size_t i = 0; i < p->n_steps; i++) st->offloads += p->steps[i].kind == RKM_STEP_OFFLOAD;
    *out = p;
    return RKM_OK;
}

/* A plan of the same steps, laid out as p is (birth and layout are
 * functions of the steps). */
RKM__PRIVATE rkm_result rkm__plan_copy(const rkm_plan *p, rkm_plan **out)
{
    rkm__steps d;
    rkm_result r = rkm__steps_copy(p->ctx, p->steps, p->n_steps, &d, "plan copy");
    if (r) return r;
    r = rkm__plan_birth(p->g, &d, NULL, out);
    if (!r && p->stats.alignment && (r = rkm__plan_seal(*out, p->stats.alignment, NULL))) {
        rkm_plan_destroy(*out);
        *out = NULL;
    }
    if (!r) {
        (*out)->stats.gap = p->stats.gap;
        (*out)->stats.in_flight = p->stats.in_flight; /* a stage's figures, as its planner set them */
        (*out)->stats.stage_peak = p->stats.stage_peak;
        (*out)->stats.stage_arena_bytes = p->stats.stage_arena_bytes;
    }
    return r;
}
