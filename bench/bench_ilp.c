/* bench_ilp.c -- per-solve times of the block ILP (section 9).
 *
 * For each block: a grid of (peak, kept) budgets like the planner's (peak
 * from the block's floor -- what some step always needs -- to the store-all
 * peak, kept from x_in + x_out to the store-all kept memory), solved in
 * increasing order with a 1 s limit per solve (LIMIT=seconds to change).
 * Then the whole-graph form (Checkmate's) at a few budgets.
 *
 *   build/bench/bench_ilp [GRAPHS_DIR] [--quick]
 */
#include "../rockmate.c"

#ifndef RKM_OMIT_SOLVER

static const char *dir = "tests/graphs";
static double limit = 1.0; /* seconds per block solve */

static rkm_graph *load(rkm_context *ctx, const char *file)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    rkm_graph *g = NULL;
    if (rkm_graph_read_file(ctx, path, &g) != RKM_OK) fprintf(stderr, "%s: %s\n", path, rkm_context_errmsg(ctx));
    return g;
}

/* The schedule without recomputation: its peak and kept memory. */
static void store_all(rkm__ilp_block *b, uint64_t *peak, uint64_t *kept)
{
    rkm__ilp_sched s;
    rkm_result r;
    *peak = *kept = 0;
    if (!rkm__ilp_sched_alloc(&b->shape, &s)) return;
    memset(b->scratch.gr.x, 0, (size_t)b->shape.n);
    rkm__ilp_greedy_sched(&b->shape, &b->scratch.gr, &s);
    if (rkm__ilp_measure(&b->shape, &b->scratch.rp, &s, &r)) {
        *peak = s.peak;
        *kept = s.kept;
    }
    rkm__ilp_sched_free(b->shape.ctx, &s);
}

/* One block over an np x nk grid; prints one line. */
static void bench_block(const char *label, rkm_graph *g, const int32_t *ops, int32_t n, int32_t x_in, int32_t x_out,
                        int np, int nk)
{
    rkm__ilp_block *b = NULL;
    double t0 = rkm__now();
    if (rkm__ilp_block_create(g, ops, n, x_in, x_out, x_out == g->loss, &b) != RKM_OK) {
        printf("%-28s create failed: %s\n", label, rkm_context_errmsg(g->ctx));
        return;
    }
    double t_create = rkm__now() - t0;
    uint64_t p0, k0, lo = b->memo.min_peak, lk = b->memo.min_kept;
    store_all(b, &p0, &k0);
    rkm__ilp_stats st;
    memset(&st, 0, sizeof st);
    int found = 0, proven = 0, solves = 0;
    double worst = 0, gap = 0, tsum = 0;
    for (int i = 0; i < np; i++)
        for (int j = 0; j < nk; j++) {
            uint64_t peak = lo + (uint64_t)((double)(p0 - lo) * i / (np - 1));
            uint64_t kept = lk + (uint64_t)((double)(k0 - lk) * (double)j / (nk - 1));
            rkm_step *s = NULL;
            size_t nf = 0, nb = 0;
            int f = 0;
            double t1 = rkm__now();
            if (rkm__ilp_block_solve(b, peak, kept, limit, &s, &nf, &nb, &st, &f) != RKM_OK) break;
            double dt = rkm__now() - t1;
            tsum += dt;
            worst = dt > worst ? dt : worst;
            solves++;
            found += f;
            proven += st.proven;
            if (f && st.time > 0 && (st.time - st.bound) / st.time > gap) gap = (st.time - st.bound) / st.time;
            rkm__free(g->ctx, s, (nf + nb) * sizeof *s);
        }
    printf("%-30s %3d ops %4d cols %4d rows create %5.1f ms | %2d solves %7.1f ms, mean %5.1f, max %6.1f | "
           "found %2d proven %2d | lp opt %2d sub %2d inf %d timeout %2d fail %d | worst gap %4.1f%%\n",
           label, n, b->model.ncols, b->model.nrows, 1e3 * t_create, solves, 1e3 * tsum,
           1e3 * tsum / (solves ? solves : 1),
           1e3 * worst, found, proven, st.optimal, st.suboptimal, st.infeasible, st.timeout, st.failed, 100 * gap);
    rkm__ilp_block_destroy(b);
}

/* A block given by its first and last op and its separators. */
static void named_block(rkm_graph *g, const char *label, const char *first, const char *last, const char *x_in,
                        const char *x_out, int np, int nk)
{
    int32_t a = rkm_graph_find_op(g, first), z = rkm_graph_find_op(g, last), ops[256], n = 0;
    int32_t xi = x_in ? rkm_graph_find_tensor(g, x_in) : -1, xo = rkm_graph_find_tensor(g, x_out);
    if (a < 0 || z < a || z - a >= 256 || xo < 0) {
        printf("%-28s not found\n", label);
        return;
    }
    for (int32_t v = a; v <= z; v++) ops[n++] = v;
    bench_block(label, g, ops, n, xi, xo, np, nk);
}

/* Every block class the structure detection found (its first block). */
static void graph_classes(rkm_graph *g, const char *name, int np, int nk)
{
    for (int32_t c = 0; c < g->n_classes; c++)
        for (int32_t k = 0; k < g->n_blocks; k++) {
            if (g->blocks[k].cls != c) continue;
            char label[64];
            snprintf(label, sizeof label, "%s class %d (block %d)", name, (int)c, (int)k);
            bench_block(label, g, g->blocks[k].ops, g->blocks[k].n_ops, g->blocks[k].in, g->blocks[k].out, np, nk);
            break;
        }
}

/* The whole graph as one block (Checkmate's form) at fractions of the
 * store-all peak, each with `limit` seconds. */
static void whole_graph(rkm_graph *g, const char *name, double limit)
{
    int32_t *ops = rkm__alloc(g->ctx, g->n_ops * sizeof *ops);
    rkm__ilp_block *b = NULL;
    for (size_t v = 0; ops && v < g->n_ops; v++) ops[v] = (int32_t)v;
    if (!ops || rkm__ilp_block_create(g, ops, (int32_t)g->n_ops, -1, g->loss, 1, &b) != RKM_OK) {
        printf("%s whole graph: create failed\n", name);
        rkm__free(g->ctx, ops, g->n_ops * sizeof *ops);
        return;
    }
    uint64_t p0, k0;
    store_all(b, &p0, &k0);
    printf("%s whole graph: %zu ops, %d cols, %d rows, store-all peak %llu time %.6g\n", name, g->n_ops, b->model.ncols,
           b->model.nrows, (unsigned long long)p0, b->shape.base_time);
    const double frac[] = {0.9, 0.7, 0.5};
    for (int i = 0; i < 3; i++) {
        uint64_t peak = (uint64_t)((double)p0 * frac[i]);
        rkm__ilp_stats st;
        memset(&st, 0, sizeof st);
        rkm_step *s = NULL;
        size_t nf = 0, nb = 0;
        int f = 0;
        double t1 = rkm__now();
        if (rkm__ilp_block_solve(b, peak, UINT64_MAX, limit, &s, &nf, &nb, &st, &f) != RKM_OK) break;
        double dt = rkm__now() - t1;
        printf("  peak <= %3.0f%%: %s  time %.6g (overhead %5.2f%%)  %s  gap %5.2f%%  %.2f s\n", 100 * frac[i],
               f ? "found" : "none ", st.time, f ? 100 * (st.time / b->shape.base_time - 1) : 0,
               st.proven ? "proven" : "      ", f ? 100 * (st.time - st.bound) / st.time : 0, dt);
        rkm__free(g->ctx, s, (nf + nb) * sizeof *s);
    }
    rkm__ilp_block_destroy(b);
    rkm__free(g->ctx, ops, g->n_ops * sizeof *ops);
}

int main(int argc, char **argv)
{
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else dir = argv[i];
    }
    if (getenv("LIMIT")) limit = atof(getenv("LIMIT"));
    rkm_context *ctx = NULL;
    if (rkm_context_create(NULL, &ctx) != RKM_OK) return 1;
    printf("block ILP, per block: 5 peak x 6 kept budgets, %g s limit per solve\n", limit);
    rkm_graph *g = load(ctx, "gpt2-tiny.rkg");
    if (g) {
        named_block(g, "gpt2-tiny attention half", "h0.ln1", "h0.res2", "encoded", "h0.res2", 5, 6);
        named_block(g, "gpt2-tiny MLP half", "h0.ln2", "h0.res3", "h0.res2", "h0.res3", 5, 6);
        named_block(g, "gpt2-tiny layer", "h0.ln1", "h0.res3", "encoded", "h0.res3", 5, 6);
        graph_classes(g, "gpt2-tiny", 5, 6);
        whole_graph(g, "gpt2-tiny", quick ? 1.0 : 5.0);
    }
    rkm_graph_destroy(g);
    g = load(ctx, "peer-gpt.rkg");
    if (g) {
        named_block(g, "peer-gpt attention half", "34_x", "120_fv", "19_input0", "120_fv", 5, 6);
        named_block(g, "peer-gpt MLP half", "126_x", "158_fv", "120_fv", "158_fv", 5, 6);
        named_block(g, "peer-gpt layer", "34_x", "158_fv", "19_input0", "158_fv", 5, 6);
        graph_classes(g, "peer-gpt", 5, 6);
        whole_graph(g, "peer-gpt", quick ? 1.0 : 5.0);
    }
    rkm_graph_destroy(g);
    if (!quick) {
        g = load(ctx, "gpt2-xl-b4-t1024.rkg");
        if (g) graph_classes(g, "gpt2-xl", 5, 6);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
    return 0;
}

#else
int main(void)
{
    printf("bench_ilp: built without lp_solve (RKM_OMIT_SOLVER)\n");
    return 0;
}
#endif
