/* rkg.c -- graph files (.rkg): reader and writer
 *
 * Uses (through internal.h): base.c, graph.c, text.c, structure.c (finalize). */
#include "internal.h"

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
    if (r->ntok < 3 || r->ntok > 6)
        return rkm__rerr(r, RKM_ERROR_PARSE, "expected 'tensor NAME BYTES [input] [grad] [nograd]'");
    if (!rkm__name_ok(r->tok[1]))
        return rkm__rerr(r, RKM_ERROR_PARSE, "tensor '%.64s': a name is 1 to 255 characters of [A-Za-z0-9_.:/[]-]", r->tok[1]);
    uint64_t bytes;
    if (!rkm__parse_u64(r->tok[2], &bytes))
        return rkm__rerr(r, RKM_ERROR_PARSE, "tensor %.64s: '%.64s' is not a byte count (unsigned 64-bit decimal)",
                         r->tok[1], r->tok[2]);
    unsigned flags = 0;
    for (int i = 3; i < r->ntok; i++) {
        unsigned f = strcmp(r->tok[i], "input") == 0 ? RKM_TENSOR_INPUT : strcmp(r->tok[i], "nograd") == 0 ? RKM_TENSOR_NOGRAD
                     : strcmp(r->tok[i], "grad") == 0 ? RKM_TENSOR_INPUT_GRAD : 0;
        if (!f) return rkm__rerr(r, RKM_ERROR_PARSE, "tensor %.64s: unknown flag '%.64s' (input, grad or nograd)", r->tok[1], r->tok[i]);
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

/* copy d2h=BYTES_PER_SECOND h2d=BYTES_PER_SECOND [latency=SECONDS] */
static rkm_result rkm__read_copy(rkm__reader *r, rkm_graph *g)
{
    static const char *const keys[] = {"d2h", "h2d", "latency"};
    double v[3] = {0, 0, 0};
    int seen[3] = {0, 0, 0};
    if (g->copy.d2h_bytes_per_second > 0) return rkm__rerr(r, RKM_ERROR_GRAPH, "copy: given twice (at most once)");
    for (int i = 1; i < r->ntok; i++) {
        char *eq = strchr(r->tok[i], '=');
        int k = 0;
        if (eq) *eq = 0;
        while (k < 3 && strcmp(r->tok[i], keys[k]) != 0) k++;
        if (!eq || k == 3 || seen[k])
            return rkm__rerr(r, RKM_ERROR_PARSE, "copy: expected 'copy d2h=BYTES_PER_SECOND h2d=BYTES_PER_SECOND "
                             "[latency=SECONDS]', not '%.64s' as word %d", r->tok[i], i + 1);
        if (!rkm__parse_time(eq + 1, &v[k]))
            return rkm__rerr(r, RKM_ERROR_PARSE, "copy: %s=%.64s is not a non-negative decimal number", keys[k], eq + 1);
        seen[k] = 1;
    }
    if (!seen[0] || !seen[1]) return rkm__rerr(r, RKM_ERROR_PARSE, "copy: d2h= and h2d= are required");
    rkm_copy_desc c = {v[0], v[1], v[2]};
    if (!(c.d2h_bytes_per_second > 0 && c.h2d_bytes_per_second > 0))
        return rkm__rerr(r, RKM_ERROR_GRAPH, "copy: both bandwidths must be positive");
    return rkm_graph_set_copy(g, &c);
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
        else if (strcmp(w, "copy") == 0) res = rkm__read_copy(r, g);
        else if (strcmp(w, "loss") == 0 || strcmp(w, "output") == 0) {
            if (r->ntok != 2) return rkm__rerr(r, RKM_ERROR_PARSE, "expected '%s TENSOR'", w);
            int32_t t = rkm_graph_find_tensor(g, r->tok[1]);
            if (t < 0) return rkm__rerr(r, RKM_ERROR_GRAPH, "%s: tensor %.64s is not declared", w, r->tok[1]);
            res = *w == 'l' ? rkm_graph_set_loss(g, t) : rkm_graph_set_output(g, t);
        } else
            return rkm__rerr(r, RKM_ERROR_PARSE, "unknown statement '%.64s' (tensor, op, loss, output or copy)", w);
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

/* The shortest %g form of x that reads back as exactly x. */
static void rkm__fmt_time(double x, char *buf, size_t size)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) return;
    }
}

/* A bandwidth: whole bytes per second as an integer, else as a time. */
static void rkm__fmt_rate(double x, char *buf, size_t size)
{
    if (x == floor(x) && x < 1e15) snprintf(buf, size, "%.0f", x);
    else rkm__fmt_time(x, buf, size);
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
    if (g->copy.d2h_bytes_per_second > 0) {
        char d[40], h[40], l[40];
        rkm__fmt_rate(g->copy.d2h_bytes_per_second, d, sizeof d);
        rkm__fmt_rate(g->copy.h2d_bytes_per_second, h, sizeof h);
        rkm__fmt_time(g->copy.latency_seconds, l, sizeof l);
        rkm__outf(o, "copy d2h=%s h2d=%s latency=%s\n", d, h, l);
    }
    for (size_t t = 0; t < g->n_tensors; t++) {
        const rkm__tensor *x = &g->tensors[t];
        rkm__outf(o, "tensor %s %llu%s%s%s\n", x->name, (unsigned long long)x->bytes,
                  x->flags & RKM_TENSOR_INPUT ? " input" : "", x->flags & RKM_TENSOR_INPUT_GRAD ? " grad" : "",
                  x->flags & RKM_TENSOR_NOGRAD ? " nograd" : "");
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
    rkm__outf(o, "%s %s\n", g->output ? "output" : "loss", g->tensors[g->loss].name);
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

static rkm_result rkm__graph_writer(const void *g, rkm_write_fn fn, void *user) { return rkm_graph_write(g, fn, user); }

rkm_result rkm_graph_write_file(const rkm_graph *g, const char *path)
{
    if (!g) return RKM_ERROR_ARGUMENT;
    return rkm__write_file(g->ctx, path, rkm__graph_writer, g);
}

