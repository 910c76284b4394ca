/* test_ilp.c -- the block ILP (src/ilp.c) against exhaustive search.
 *
 * The brute force walks every plan the simulator accepts, memoised on the
 * replay state (Dijkstra on time, steps over the budget cut off). In its
 * restricted form it walks exactly the family the ILP optimises over (the
 * forward pass once in order; then per backward op, in reverse order,
 * recomputations in topological order and the backward): there the optima
 * must be equal. In its general form it is the true optimum: never above the
 * ILP's. Gradients and saved states are freed right after the backward that
 * ends their use (never worse), everything else is a free choice. */
#include "../src/internal.h"
/* white box: the statics it calls are ilp_sched.c's and ilp.c's; the rest links
 * from the sources' objects (compiling the whole library into each test
 * took ~25 s of its build). */
#include "../src/ilp_sched.c"
#include "../src/ilp.c"
#include "test.h"

#ifndef RKM_OMIT_SOLVER

#include "tiny_graph.h"

/* ---- brute force --------------------------------------------------------- */

#define BF_MAX_OPS 10
#define BF_MAX_STATES (1u << 20)
/* The state table starts at this many slots and doubles, rehashed, up to
 * BF_MAX_STATES, where more than half full is an overflow as before: a
 * table of BF_MAX_STATES from the start was 40 MB to allocate and clear for
 * each of the hundreds of searches, most of a few hundred states (most of
 * this program's time went to the kernel's page faults and the clearing). */
#define BF_FIRST_STATES (1u << 12)

typedef struct bf {
    const rkm_graph *g;
    int32_t n, ops[BF_MAX_OPS], x_in, x_out, is_last;
    int32_t nb, bop[BF_MAX_OPS + 1]; /* restricted: backward order */
    uint64_t peak, kept;
    int restricted;
    rkm__sim s;
    /* hash map key -> slot, Dijkstra's heap */
    uint64_t *keys, *parent;
    rkm_step *via;       /* the step that reached each state (for debugging) */
    rkm_step last_step;  /* the step bf_push is offered */
    uint64_t from;       /* the state it comes from */
    double *dist;
    uint8_t *used, *done;
    size_t cap;
    tiny_heap heap;
    size_t n_states;
    int overflow;
} bf;

/* State key: D over tensors (bits 0-23), P and bwd over local ops (10 bits
 * each), phase, forwards run in F (4 bits), last recomputed op + 1 (4 bits). */
#define BF_P 24
#define BF_BD 34
#define BF_PHASE 44
#define BF_F 45
#define BF_LAST 49
static uint64_t bf_key(uint32_t D, uint32_t P, uint32_t bd, uint32_t phase, uint32_t f, int32_t last)
{
    return (uint64_t)D | (uint64_t)P << BF_P | (uint64_t)bd << BF_BD | (uint64_t)phase << BF_PHASE | (uint64_t)f << BF_F |
           (uint64_t)(last + 1) << BF_LAST;
}

static int32_t bf_local(const bf *p, int32_t op)
{
    for (int32_t v = 0; v < p->n; v++)
        if (p->ops[v] == op) return v;
    return -1;
}

/* Load a state into the simulator (gradients follow from the backwards run). */
static void bf_load(bf *p, uint64_t key)
{
    const rkm_graph *g = p->g;
    rkm__sim *s = &p->s;
    uint32_t D = (uint32_t)(key & 0xFFFFFF), P = (uint32_t)(key >> BF_P) & 0x3FF, bd = (uint32_t)(key >> BF_BD) & 0x3FF;
    int phase = (int)(key >> BF_PHASE) & 1;
    rkm__sim_reset(s);
    for (size_t t = 0; t < g->n_tensors; t++)
        if ((D >> t & 1) && !s->D[t]) rkm__sim_give_tensor(s, (int32_t)t);
    for (int32_t v = 0; v < p->n; v++) {
        s->bwd_done[p->ops[v]] = bd >> v & 1;
        if (P >> v & 1) {
            s->P[p->ops[v]] = 1;
            s->mem += g->ops[p->ops[v]].phantom;
        }
    }
    s->loss_done = phase && p->is_last;
    for (size_t t = 0; t < g->n_tensors; t++) {
        if (!g->tensors[t].has_grad) continue;
        int32_t recv = 0;
        for (int32_t v = 0; v < p->n; v++) {
            const rkm__op *o = &g->ops[p->ops[v]];
            if ((bd >> v & 1) && rkm__list_has(o->in, o->n_in, (int32_t)t)) recv++;
        }
        if ((int32_t)t == p->x_out && phase) recv = g->tensors[t].n_contrib;
        int32_t prod = g->tensors[t].producer, lp = bf_local(p, prod);
        if (recv == 0 || (lp >= 0 && (bd >> lp & 1))) continue;
        s->G[t] = 1;
        s->recv[t] = recv;
        s->mem += g->tensors[t].bytes;
    }
}

static uint64_t bf_store(const bf *p, uint32_t phase, uint32_t f, int32_t last)
{
    const rkm__sim *s = &p->s;
    uint32_t D = 0, P = 0, bd = 0;
    for (size_t t = 0; t < p->g->n_tensors; t++) D |= (uint32_t)s->D[t] << t;
    for (int32_t v = 0; v < p->n; v++) {
        P |= (uint32_t)s->P[p->ops[v]] << v;
        bd |= (uint32_t)s->bwd_done[p->ops[v]] << v;
    }
    return bf_key(D, P, bd, phase, f, last);
}

static size_t bf_slot(bf *p, uint64_t key)
{
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (p->cap - 1);
    while (p->used[i] && p->keys[i] != key) i = (i + 1) & (p->cap - 1);
    return i;
}

/* The table's arrays for cap slots (none used); 0 if out of memory. */
static int bf_alloc(bf *p, size_t cap)
{
    p->cap = cap;
    p->keys = malloc(cap * sizeof *p->keys);
    p->parent = malloc(cap * sizeof *p->parent);
    p->via = malloc(cap * sizeof *p->via);
    p->dist = malloc(cap * sizeof *p->dist);
    p->used = calloc(cap, 1);
    p->done = calloc(cap, 1);
    return p->keys && p->parent && p->via && p->dist && p->used && p->done;
}

static void bf_free(bf *p)
{
    free(p->keys), free(p->parent), free(p->via), free(p->dist), free(p->used), free(p->done);
}

/* Twice the slots, every state moved over; 0 if out of memory. */
static int bf_grow(bf *p)
{
    bf old = *p;
    if (!bf_alloc(p, 2 * old.cap)) {
        bf_free(p);
        *p = old;
        return 0;
    }
    for (size_t i = 0; i < old.cap; i++) {
        if (!old.used[i]) continue;
        size_t j = bf_slot(p, old.keys[i]);
        p->used[j] = 1, p->keys[j] = old.keys[i], p->parent[j] = old.parent[i], p->via[j] = old.via[i];
        p->dist[j] = old.dist[i], p->done[j] = old.done[i];
    }
    bf_free(&old);
    return 1;
}

static void bf_push(bf *p, uint64_t key, double d)
{
    size_t i = bf_slot(p, key);
    if (p->used[i] && (p->done[i] || p->dist[i] <= d)) return;
    if (!p->used[i]) {
        if (p->n_states + 1 > p->cap / 2 && p->cap < BF_MAX_STATES) {
            if (!bf_grow(p)) {
                p->overflow = 1;
                return;
            }
            i = bf_slot(p, key);
        }
        if (++p->n_states > p->cap / 2) {
            p->overflow = 1;
            return;
        }
        p->used[i] = 1;
        p->keys[i] = key;
    }
    p->dist[i] = d;
    p->parent[i] = p->from;
    p->via[i] = p->last_step;
    tiny_heap_push(&p->heap, d, key);
}

/* Apply one step from state `key`; push the successor if within the peak. */
static void bf_step(bf *p, uint64_t key, double d, rkm_step st, uint32_t phase, uint32_t f, int32_t last)
{
    bf_load(p, key);
    uint64_t pk;
    int32_t obj;
    if (rkm__sim_step(&p->s, &st, &pk, &obj) != RKM_RULE_NONE || pk > p->peak) return;
    p->from = key;
    p->last_step = st;
    double cost = st.kind == RKM_STEP_FWD ? p->g->ops[st.index].fwd : st.kind == RKM_STEP_BWD ? p->g->ops[st.index].bwd : 0;
    if (st.kind == RKM_STEP_BWD) tiny_free_after_bwd(&p->s, st.index);
    bf_push(p, bf_store(p, phase, f, last), d + cost);
}

/* The boundary between F and B: the loss step, or grad(x_out) given. */
static void bf_boundary(bf *p, uint64_t key, double d)
{
    bf_load(p, key);
    if (!p->s.D[p->x_out] || p->s.mem > p->kept) return;
    if (p->is_last) {
        bf_step(p, key, d, (rkm_step){RKM_STEP_LOSS, p->x_out, 0, 0}, 1, 0, -1);
        return;
    }
    if (p->s.mem + p->g->tensors[p->x_out].bytes > p->peak) return;
    rkm__sim_give_grad(&p->s, p->x_out);
    p->from = key;
    p->last_step = (rkm_step){-1, -1, 0, 0};
    bf_push(p, bf_store(p, 1, 0, -1), d);
}

static int bf_final(bf *p, uint64_t key)
{
    const rkm_graph *g = p->g;
    if (!(key >> BF_PHASE & 1) || (key >> BF_P & 0x3FF)) return 0;
    bf_load(p, key);
    for (int32_t v = 0; v < p->n; v++)
        if (g->ops[p->ops[v]].has_bwd && !p->s.bwd_done[p->ops[v]]) return 0;
    for (size_t t = 0; t < g->n_tensors; t++) {
        int want = (g->tensors[t].flags & RKM_TENSOR_INPUT) || (int32_t)t == p->x_in;
        if (p->s.D[t] != want) return 0;
    }
    return 1;
}

/* Successors of one state. */
static void bf_expand(bf *p, uint64_t key, double d)
{
    const rkm_graph *g = p->g;
    uint32_t phase = (uint32_t)(key >> BF_PHASE) & 1, f = (uint32_t)(key >> BF_F) & 15;
    int32_t last = (int32_t)((key >> BF_LAST) & 15) - 1;
    for (size_t t = 0; t < g->n_tensors; t++) {
        if ((g->tensors[t].flags & RKM_TENSOR_INPUT) || (int32_t)t == p->x_in || !(key >> t & 1)) continue;
        bf_step(p, key, d, (rkm_step){RKM_STEP_FREE, (int32_t)t, 0, 0}, phase, f, last);
    }
    for (int32_t v = 0; v < p->n; v++)
        if (key >> (BF_P + v) & 1) bf_step(p, key, d, (rkm_step){RKM_STEP_FREE_SAVED, p->ops[v], 0, 0}, phase, f, last);
    for (int32_t v = 0; v < p->n; v++)
        for (int32_t save = 0; save <= 1; save++) {
            rkm_step st = {RKM_STEP_FWD, p->ops[v], save, 0};
            if (!p->restricted) bf_step(p, key, d, st, phase, 0, -1);
            else if (!phase && (uint32_t)v == f) bf_step(p, key, d, st, 0, f + 1, -1);
            else if (phase && v > last) bf_step(p, key, d, st, 1, 0, v);
        }
    if (!phase && (!p->restricted || f == (uint32_t)p->n)) bf_boundary(p, key, d);
    if (!phase) return;
    uint32_t bd = (uint32_t)(key >> BF_BD) & 0x3FF;
    int32_t k = 0;
    while (k < p->nb && (bd >> p->bop[k] & 1)) k++;
    for (int32_t v = 0; v < p->n; v++) {
        if (!g->ops[p->ops[v]].has_bwd || (p->restricted && (k >= p->nb || v != p->bop[k]))) continue;
        bf_step(p, key, d, (rkm_step){RKM_STEP_BWD, p->ops[v], 0, 0}, 1, 0, -1);
    }
}

/* Least time of a block schedule within (peak, kept); -1 if none. If path
 * is not NULL it receives the steps of an optimal plan (at most 256; the
 * F/B boundary is a step of kind -1), *n_path their count. */
static double bf_solve(const rkm_graph *g, const int32_t *ops, int32_t n, int32_t x_in, int32_t x_out, uint64_t peak,
                       uint64_t kept, int restricted, rkm_step *path, size_t *n_path)
{
    bf p;
    memset(&p, 0, sizeof p);
    p.g = g, p.n = n, p.x_in = x_in, p.x_out = x_out, p.is_last = x_out == g->loss;
    p.peak = peak, p.kept = kept, p.restricted = restricted;
    memcpy(p.ops, ops, (size_t)n * sizeof *ops);
    for (int32_t v = n; v-- > 0;)
        if (g->ops[ops[v]].has_bwd) p.bop[p.nb++] = v;
    int table = bf_alloc(&p, BF_FIRST_STATES);
    double best = -1;
    if (g->n_tensors <= 24 && n <= BF_MAX_OPS && table && rkm__sim_init(g, &p.s) == RKM_OK) {
        rkm__sim_give_tensor(&p.s, x_in);
        p.from = UINT64_MAX;
        if (p.s.mem <= peak) bf_push(&p, bf_store(&p, 0, 0, -1), 0);
        while (p.heap.n && !p.overflow) {
            tiny_item it = tiny_heap_pop(&p.heap);
            size_t i = bf_slot(&p, it.id);
            if (p.done[i] || it.d > p.dist[i]) continue;
            p.done[i] = 1;
            if (bf_final(&p, it.id)) {
                best = it.d;
                size_t m = 0;
                for (uint64_t k = it.id; path && p.parent[bf_slot(&p, k)] != UINT64_MAX && m < 256;
                     k = p.parent[bf_slot(&p, k)])
                    path[m++] = p.via[bf_slot(&p, k)];
                for (size_t a = 0; path && a < m / 2; a++) {
                    rkm_step t = path[a];
                    path[a] = path[m - 1 - a];
                    path[m - 1 - a] = t;
                }
                if (n_path) *n_path = m;
                break;
            }
            bf_expand(&p, it.id, it.d);
        }
        rkm__sim_free(&p.s);
    }
    CHECK(!p.overflow && g->n_tensors <= 24);
    bf_free(&p);
    free(p.heap.v);
    return best;
}

/* ---- helpers ------------------------------------------------------------ */

static rkm_context *new_ctx(void)
{
    rkm_context_desc d = {0};
    d.alloc = test_count_alloc;
    rkm_context *ctx = NULL;
    *test_live_bytes() = 0; /* each test checks its own */
    CHECK(rkm_context_create(&d, &ctx) == RKM_OK);
    return ctx;
}

/* Replay a block schedule with the simulator, as the planner will. */
static int replay_block(const rkm_graph *g, int32_t x_in, int32_t x_out, const rkm_step *s, size_t nf, size_t nbw,
                        uint64_t *peak, uint64_t *kept, double *time)
{
    rkm__sim sim;
    rkm_sim_result r1, r2;
    if (rkm__sim_init(g, &sim) != RKM_OK) return 0;
    rkm__sim_give_tensor(&sim, x_in);
    int ok = rkm__sim_run(&sim, s, nf, &r1, NULL);
    *kept = sim.mem;
    if (ok && x_out != g->loss) rkm__sim_give_grad(&sim, x_out);
    ok = ok && rkm__sim_run(&sim, s + nf, nbw, &r2, NULL);
    if (ok) {
        *peak = r1.peak > r2.peak ? r1.peak : r2.peak;
        *time = r1.time + r2.time;
        for (size_t t = 0; t < g->n_tensors; t++) {
            int in = (g->tensors[t].flags & RKM_TENSOR_INPUT) || (int32_t)t == x_in;
            ok = ok && sim.D[t] == in && sim.G[t] == (in && (int32_t)t == x_in && g->tensors[t].has_grad);
        }
        for (size_t o = 0; o < g->n_ops; o++) ok = ok && !sim.P[o];
        ok = ok && (x_out != g->loss || sim.loss_done);
    }
    rkm__sim_free(&sim);
    return ok;
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-9 * (fabs(a) + fabs(b)) + 1e-15; }

/* One solve checked against the brute force (both forms if `general`) and
 * the replay. Returns 1 if the ILP found a schedule. */
static int check_solve2(rkm__ilp_block *b, const int32_t *ops, int32_t n, int32_t x_in, int32_t x_out, uint64_t peak,
                        uint64_t kept, int general_too, int *differs)
{
    const rkm_graph *g = b->shape.g;
    rkm__ilp_stats st = {0};
    rkm_step *s = NULL;
    size_t nf = 0, nbw = 0;
    int found = -1;
    CHECK(rkm__ilp_block_solve(b, peak, kept, 30.0, &s, &nf, &nbw, &st, &found) == RKM_OK);
    double restricted = bf_solve(g, ops, n, x_in, x_out, peak, kept, 1, NULL, NULL);
    double general = general_too ? bf_solve(g, ops, n, x_in, x_out, peak, kept, 0, NULL, NULL) : -1;
    CHECK(st.proven == 1);
    CHECK(found == (restricted >= 0));
    CHECK(st.failed == 0);
    if (general >= 0 && restricted >= 0) CHECK(general <= restricted * (1 + 1e-12));
    if (differs && general >= 0 && (restricted < 0 || !close_to(general, restricted))) ++*differs;
    if (found == 1) {
        uint64_t pk = 0, kp = 0;
        double tm = 0;
        CHECK(replay_block(g, x_in, x_out, s, nf, nbw, &pk, &kp, &tm));
        CHECK(pk <= peak);
        CHECK(kp <= kept);
        CHECK(close_to(tm, st.time));
        CHECK(close_to(st.time, restricted));
        if (!close_to(st.time, restricted))
            fprintf(stderr, "  peak %llu kept %llu: ilp %.12g restricted %.12g\n", (unsigned long long)peak,
                    (unsigned long long)kept, st.time, restricted);
    }
    rkm__free(g->ctx, s, (nf + nbw) * sizeof *s);
    return found == 1;
}

/* Store-all figures of a block (the schedule without recomputation). */
static void store_all(rkm__ilp_block *b, uint64_t *peak, uint64_t *kept)
{
    rkm__ilp_sched s;
    rkm_result r;
    CHECK(rkm__ilp_sched_alloc(&b->shape, &s));
    memset(b->scratch.gr.x, 0, (size_t)b->shape.n);
    rkm__ilp_greedy_sched(&b->shape, &b->scratch.gr, &s);
    CHECK(rkm__ilp_measure(&b->shape, &b->scratch.rp, &s, &r));
    *peak = s.peak;
    *kept = s.kept;
    rkm__ilp_sched_free(b->shape.ctx, &s);
}

/* Solve block (ops[0..n), x_in, x_out) over a grid of budgets against the
 * brute force (also the general one when `differs` is given: it counts the
 * budgets where a plan outside the ILP's family is faster). */
static void check_block(const rkm_graph *g, const int32_t *ops, int32_t n, int32_t x_in, int32_t x_out, int kept_grid,
                        int *n_found, int *differs)
{
    rkm__ilp_block *b = NULL;
    CHECK(rkm__ilp_block_create(g, ops, n, x_in, x_out, x_out == g->loss, &b) == RKM_OK);
    if (!b) return;
    uint64_t p0, k0, lo = b->shape.static_bytes;
    store_all(b, &p0, &k0);
    for (int i = 0; i <= 6; i++) {
        uint64_t peak = lo + (p0 - lo) * (uint64_t)i / 6;
        for (int j = kept_grid ? 1 : 3; j <= 3; j += 2) {
            uint64_t kept = j == 3 ? UINT64_MAX : lo + (k0 - lo) * (uint64_t)(j + 1) / 4;
            *n_found += check_solve2(b, ops, n, x_in, x_out, peak, kept, differs != NULL, differs);
        }
    }
    rkm__ilp_block_destroy(b);
}

/* ---- tests --------------------------------------------------------------- */

/* Whole-graph form (Checkmate's): the ILP's optimum is the brute force's. */
TEST(ilp_whole_graph_matches_brute_force)
{
    int found = 0, differs = 0, graphs = 0;
    for (uint64_t seed = 1; seed <= 12; seed++) {
        rkm_context *ctx = new_ctx();
        rng_seed(seed);
        rkm_graph *g = random_graph(ctx, rng_int(4, 6), 0);
        CHECK(g != NULL);
        if (g) {
            int32_t ops[BF_MAX_OPS];
            for (int32_t v = 0; v < (int32_t)g->n_ops; v++) ops[v] = v;
            check_block(g, ops, (int32_t)g->n_ops, -1, g->loss, 0, &found, &differs);
            graphs++;
        }
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
        CHECK(*test_live_bytes() == 0);
    }
    CHECK(graphs == 12);
    CHECK(found > 12); /* the budgets are not all infeasible */
    fprintf(stderr, "  whole graphs: %d schedules, %d where another family of plans is faster\n", found, differs);
}

/* Block form: both blocks of a graph with a separator, over (peak, kept). */
TEST(ilp_blocks_match_brute_force)
{
    int found = 0;
    for (uint64_t seed = 101; seed <= 108; seed++) {
        rkm_context *ctx = new_ctx();
        rng_seed(seed);
        int32_t n = rng_int(5, 7), cut = rng_int(2, n - 2);
        rkm_graph *g = random_graph(ctx, n, cut);
        CHECK(g != NULL);
        if (g) {
            int32_t ops[BF_MAX_OPS], sep = g->ops[cut - 1].out[0];
            for (int32_t v = 0; v < n; v++) ops[v] = v;
            check_block(g, ops, cut, -1, sep, 1, &found, NULL);
            check_block(g, ops + cut, n - cut, sep, g->loss, 1, &found, NULL);
        }
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
        CHECK(*test_live_bytes() == 0);
    }
    CHECK(found > 20);
}

static rkm_graph *load(rkm_context *ctx, const char *name)
{
    rkm_graph *g = test_load_graph(ctx, name);
    CHECK(g != NULL);
    return g;
}

/* The bundled hand-written graph (multi-output, nograd mask, an op without
 * backward, accumulation), cut into blocks by the structure detection. */
TEST(ilp_multi_output_graph_blocks)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = load(ctx, "multi-output");
    int found = 0;
    for (int32_t k = 0; g && k < g->n_blocks; k++) {
        rkm_block_info bi;
        CHECK(rkm_graph_block_info(g, k, &bi) == RKM_OK);
        if (bi.n_ops <= BF_MAX_OPS) check_block(g, bi.ops, bi.n_ops, bi.input, bi.output, 1, &found, NULL);
    }
    CHECK(found >= 4);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* GPT-2 blocks: every schedule replays valid within its budgets, and a
 * solve at the store-all budgets recomputes nothing. */
TEST(ilp_gpt2_blocks_replay)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = load(ctx, "gpt2-tiny");
    const char *parts[2][4] = {{"h0.ln1", "h0.res2", "encoded", "h0.res2"}, {"h0.ln2", "h0.res3", "h0.res2", "h0.res3"}};
    for (int p = 0; g && p < 2; p++) {
        int32_t a = rkm_graph_find_op(g, parts[p][0]), z = rkm_graph_find_op(g, parts[p][1]), ops[16], n = 0;
        int32_t x_in = rkm_graph_find_tensor(g, parts[p][2]), x_out = rkm_graph_find_tensor(g, parts[p][3]);
        for (int32_t v = a; v <= z; v++) ops[n++] = v;
        rkm__ilp_block *b = NULL;
        CHECK(rkm__ilp_block_create(g, ops, n, x_in, x_out, 0, &b) == RKM_OK);
        if (!b) continue;
        uint64_t p0, k0, lp = b->memo.min_peak, lk = b->memo.min_kept;
        store_all(b, &p0, &k0);
        int found_any = 0;
        double base = b->shape.base_time;
        for (int i = 0; i <= 5; i++)
            for (int j = 0; j <= 5; j++) {
                uint64_t peak = lp + (p0 - lp) * (uint64_t)i / 5, kept = lk + (k0 - lk) * (uint64_t)j / 5;
                rkm__ilp_stats st = {0};
                rkm_step *s = NULL;
                size_t nf = 0, nbw = 0;
                int found = -1;
                CHECK(rkm__ilp_block_solve(b, peak, kept, 10.0, &s, &nf, &nbw, &st, &found) == RKM_OK);
                CHECK(found == 0 || found == 1);
                if (found == 1) {
                    uint64_t pk, kp;
                    double tm;
                    found_any++;
                    CHECK(replay_block(g, x_in, x_out, s, nf, nbw, &pk, &kp, &tm));
                    CHECK(pk <= peak && kp <= kept);
                    CHECK(tm >= base * (1 - 1e-12) && st.bound <= tm * (1 + 1e-12));
                    if (i == 5 && j == 5) CHECK(close_to(tm, base) && st.proven);
                }
                rkm__free(ctx, s, (nf + nbw) * sizeof *s);
            }
        CHECK(found_any >= 6);
        rkm__ilp_block_destroy(b);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* A budget below what is always live: nothing found, proven, RKM_OK. */
TEST(ilp_infeasible_budget)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = load(ctx, "multi-output");
    if (g) {
        int32_t ops[16];
        for (int32_t v = 0; v < (int32_t)g->n_ops; v++) ops[v] = v;
        rkm__ilp_block *b = NULL;
        CHECK(rkm__ilp_block_create(g, ops, (int32_t)g->n_ops, -1, g->loss, 1, &b) == RKM_OK);
        rkm__ilp_stats st = {0};
        rkm_step *s = (rkm_step *)&st;
        size_t nf = 1, nbw = 1;
        int found = -1;
        uint64_t peaks[2] = {g->input_bytes, 0};
        for (int k = 0; k < 2 && b; k++) {
            CHECK(rkm__ilp_block_solve(b, peaks[k], UINT64_MAX, 5.0, &s, &nf, &nbw, &st, &found) == RKM_OK);
            CHECK(found == 0 && s == NULL && nf == 0 && nbw == 0 && st.proven == 1);
        }
        /* a kept budget below inputs + the loss tensor */
        CHECK(rkm__ilp_block_solve(b, UINT64_MAX, g->input_bytes, 5.0, &s, &nf, &nbw, &st, &found) == RKM_OK);
        CHECK(found == 0);
        rkm__ilp_block_destroy(b);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* A time limit too short for lp_solve: the call still returns, with a
 * schedule that replays within the budget whenever it reports one. */
TEST(ilp_time_limit)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = load(ctx, "gpt2-tiny");
    if (g) {
        int32_t ops[64];
        for (int32_t v = 0; v < (int32_t)g->n_ops; v++) ops[v] = v;
        rkm__ilp_block *b = NULL;
        CHECK(rkm__ilp_block_create(g, ops, (int32_t)g->n_ops, -1, g->loss, 1, &b) == RKM_OK);
        uint64_t p0, k0;
        if (b) store_all(b, &p0, &k0);
        for (int i = 1; i <= 3 && b; i++) {
            uint64_t peak = p0 - p0 / 2 * (uint64_t)i / 4;
            rkm__ilp_stats st = {0};
            rkm_step *s = NULL;
            size_t nf = 0, nbw = 0;
            int found = -1;
            CHECK(rkm__ilp_block_solve(b, peak, UINT64_MAX, 1e-4, &s, &nf, &nbw, &st, &found) == RKM_OK);
            CHECK(st.solves + (st.proven && st.solves == 0) >= 1);
            if (found == 1) {
                uint64_t pk, kp;
                double tm;
                CHECK(replay_block(g, -1, g->loss, s, nf, nbw, &pk, &kp, &tm));
                CHECK(pk <= peak && close_to(tm, st.time) && st.bound <= tm * (1 + 1e-12));
            }
            rkm__free(ctx, s, (nf + nbw) * sizeof *s);
        }
        rkm__ilp_block_destroy(b);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* A planning time limit that runs out says so: the skipped block ILP
 * solves are counted and a warning is logged, where an ample limit skips
 * nothing. (No timing is measured: 1e-9 s is over before the first solve.) */
static int warnings;
static void count_warnings(void *user, rkm_log_level level, const char *msg)
{
    (void)user;
    warnings += level == RKM_LOG_WARN && strstr(msg, "block ILP solves left out") != NULL;
}

TEST(planner_time_limit_is_reported)
{
    rkm_context_desc cd = {0};
    cd.log = count_warnings;
    rkm_context *ctx = NULL;
    CHECK(rkm_context_create(&cd, &ctx) == RKM_OK);
    rkm_graph *g = ctx ? load(ctx, "peer-gpt") : NULL;
    static const double limits[] = {1e-9, 0};
    for (size_t i = 0; i < 2 && g; i++) {
        rkm_solve_desc d = {0};
        d.algo = RKM_ALGO_ROCKMATE;
        d.time_limit = limits[i];
        rkm_planner *pl = NULL;
        rkm_planner_stats st;
        warnings = 0;
        CHECK(rkm_planner_create(g, &d, &pl) == RKM_OK);
        CHECK(pl && rkm_planner_stats_get(pl, &st) == RKM_OK);
        if (pl) CHECK(i == 0 ? st.ilp_skipped > 0 && warnings == 1 : st.ilp_skipped == 0 && warnings == 0);
        rkm_planner_destroy(pl);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Blocks that are not blocks are refused with a message. */
TEST(ilp_bad_blocks)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = load(ctx, "gpt2-tiny");
    if (g) {
        rkm__ilp_block *b = (rkm__ilp_block *)g;
        int32_t ln1 = rkm_graph_find_op(g, "h0.ln1"), qkv = rkm_graph_find_op(g, "h0.qkv");
        int32_t enc = rkm_graph_find_tensor(g, "encoded"), q = rkm_graph_find_tensor(g, "h0.qkv");
        int32_t ops[6] = {qkv, ln1};
        CHECK(rkm__ilp_block_create(g, ops, 2, enc, q, 0, &b) == RKM_ERROR_ARGUMENT && b == NULL); /* order */
        for (int32_t k = 0; k < 6; k++) ops[k] = ln1 + k; /* h0.ln1 .. h0.ln2: h0.res2 is read by h0.res3 */
        CHECK(rkm__ilp_block_create(g, ops, 6, enc, rkm_graph_find_tensor(g, "h0.ln2"), 0, &b) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(ctx), "outside") != NULL);
        CHECK(rkm__ilp_block_create(g, ops, 2, enc, rkm_graph_find_tensor(g, "h0.ln1"), 0, &b) == RKM_ERROR_ARGUMENT);
        CHECK(strstr(rkm_context_errmsg(ctx), "output") != NULL);                                 /* x_out read inside */
        CHECK(rkm__ilp_block_create(g, ops + 1, 1, -1, q, 0, &b) == RKM_ERROR_ARGUMENT); /* reads h0.ln1 */
        CHECK(rkm__ilp_block_create(g, ops, 2, enc, q, 1, &b) == RKM_ERROR_ARGUMENT);    /* last, x_out != loss */
        CHECK(rkm__ilp_block_create(g, ops, 0, enc, q, 0, &b) == RKM_ERROR_ARGUMENT);
        CHECK(rkm__ilp_block_create(g, ops, 2, q, q, 0, &b) == RKM_ERROR_ARGUMENT);      /* x_in made inside */
        CHECK(b == NULL);
        CHECK(rkm__ilp_block_create(g, ops, 2, enc, q, 0, &b) == RKM_OK); /* h0.ln1, h0.qkv: a block */
        rkm__ilp_block_destroy(b);
    }
    rkm_graph_destroy(g);
    rkm_graph *h = NULL;
    CHECK(rkm_graph_create(ctx, &h) == RKM_OK);
    rkm__ilp_block *b = NULL;
    int32_t none = 0;
    CHECK(rkm__ilp_block_create(h, &none, 1, -1, 0, 1, &b) == RKM_ERROR_STATE);
    rkm_graph_destroy(h);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* Solving budgets of one block in increasing order reuses what was found:
 * the times never increase with the budget. */
TEST(ilp_monotone_in_budget)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = load(ctx, "peer-gpt");
    if (g) {
        int32_t a = rkm_graph_find_op(g, "34_x"), z = rkm_graph_find_op(g, "120_fv"), ops[16], n = 0;
        for (int32_t v = a; v <= z; v++) ops[n++] = v;
        rkm__ilp_block *b = NULL;
        CHECK(rkm__ilp_block_create(g, ops, n, rkm_graph_find_tensor(g, "19_input0"), rkm_graph_find_tensor(g, "120_fv"),
                                    0, &b) == RKM_OK);
        uint64_t p0, k0;
        double prev = -1;
        if (b) store_all(b, &p0, &k0);
        for (int i = 0; i <= 8 && b; i++) {
            rkm__ilp_stats st = {0};
            rkm_step *s = NULL;
            size_t nf = 0, nbw = 0;
            int found = 0;
            CHECK(rkm__ilp_block_solve(b, p0 - p0 / 4 + p0 / 4 * (uint64_t)i / 8, UINT64_MAX, 5.0, &s, &nf, &nbw, &st,
                                       &found) == RKM_OK);
            if (found) {
                if (prev >= 0) CHECK(st.time <= prev);
                prev = st.time;
            }
            rkm__free(ctx, s, (nf + nbw) * sizeof *s);
        }
        CHECK(prev >= 0);
        rkm__ilp_block_destroy(b);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

/* A block of a random DAG is hard for the solver: its solves reach their
 * work limit, so the planner gives such a class fewer solves with more work
 * each (rkm__class_ilp). That pays because more work never gives a slower
 * schedule, and here often a faster one: on a 30-op DAG block, at a grid of
 * peak and kept budgets, each with a block of its own (nothing learnt from
 * another solve), once and twice the default work. */
TEST(ilp_more_work_on_a_hard_block)
{
    rkm_context *ctx = new_ctx();
    rkm_graph *g = load(ctx, "dag6x30-s17");
    const rkm__block *bk = g ? &g->blocks[3] : NULL;
    CHECK(!bk || bk->n_ops == 30);
    int faster = 0, timeouts = 0, solved = 0;
    for (int i = 0; i < 3 && bk; i++)
        for (int j = 0; j < 3; j++) {
            double t[2] = {0, 0};
            uint64_t peak = 0, kept = 0;
            for (int e = 0; e < 2; e++) {
                rkm__ilp_block *b = NULL;
                CHECK(rkm__ilp_block_create(g, bk->ops, bk->n_ops, bk->in, bk->out, 0, &b) == RKM_OK);
                if (!b) continue;
                uint64_t p0, k0;
                store_all(b, &p0, &k0);
                peak = p0 - p0 / 8 * (uint64_t)(i + 1); /* 7/8 .. 5/8 of the stored-all peak */
                kept = k0 - k0 / 4 * (uint64_t)(j + 1); /* 3/4 .. 1/4 of its kept */
                rkm__ilp_stats st = {0};
                rkm_step *s = NULL;
                size_t nf = 0, nbw = 0;
                int found = 0;
                CHECK(rkm__ilp_block_solve(b, peak, kept, RKM__DEFAULT_ILP_TIME_LIMIT * (1 + e), &s, &nf, &nbw, &st,
                                           &found) == RKM_OK);
                timeouts += st.timeout;
                if (found) {
                    uint64_t pk, kp;
                    double tm;
                    CHECK(replay_block(g, bk->in, bk->out, s, nf, nbw, &pk, &kp, &tm));
                    CHECK(pk <= peak && kp <= kept && close_to(tm, st.time));
                    t[e] = tm;
                }
                rkm__free(ctx, s, (nf + nbw) * sizeof *s);
                rkm__ilp_block_destroy(b);
            }
            if (t[0] > 0) CHECK(t[1] > 0 && t[1] <= t[0] * (1 + 1e-12));
            solved += t[0] > 0;
            faster += t[1] > 0 && t[1] < t[0] * (1 - 1e-9);
        }
    CHECK(solved >= 6 && timeouts >= 6 && faster >= 2);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(*test_live_bytes() == 0);
}

#else /* RKM_OMIT_SOLVER */

TEST(ilp_omitted)
{
    rkm_context *ctx = NULL;
    CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
    rkm_graph *g = NULL;
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/multi-output.rkg", &g) == RKM_OK);
    rkm__ilp_block *b = (rkm__ilp_block *)ctx;
    int32_t op = 0;
    if (g) CHECK(rkm__ilp_block_create(g, &op, 1, -1, g->loss, 1, &b) == RKM_ERROR_UNSUPPORTED && b == NULL);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

#endif

int main(void)
{
    RUN_SOLVER(ilp_bad_blocks);
    RUN_SOLVER(ilp_infeasible_budget);
    RUN_SOLVER(ilp_whole_graph_matches_brute_force);
    RUN_SOLVER(ilp_blocks_match_brute_force);
    RUN_SOLVER(ilp_multi_output_graph_blocks);
    RUN_SOLVER(ilp_gpt2_blocks_replay);
    RUN_SOLVER(ilp_time_limit);
    RUN_SOLVER(ilp_monotone_in_budget);
    RUN_SOLVER(planner_time_limit_is_reported);
    RUN_SOLVER(ilp_more_work_on_a_hard_block);
#ifdef RKM_OMIT_SOLVER
    RUN(ilp_omitted);
#endif
    TEST_END();
}
