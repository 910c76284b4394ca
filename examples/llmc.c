/* llmc.c -- llm.c's own train_gpt2.c kernels, run through rockmate, checked
 * against llm.c's own gpt2_forward + gpt2_backward.
 *
 * Nothing of llm.c is in this repository: this file includes the user's
 * checkout (train_gpt2.c, with TESTING defined so that its main() is left
 * out, as llm.c's own test_gpt2.c does) and calls its functions. Build and
 * run it with
 *     make llmc LLMC=path/to/llm.c
 * which compiles  $(CC) -std=c11 ... -isystem $(LLMC) examples/llmc.c
 * (-isystem: llm.c's file is not held to our warning flags).
 *
 * It makes a small random GPT-2 in memory (no checkpoint, no dataset):
 * llm.c's GPT2 struct filled as gpt2_build_from_checkpoint fills it, with
 * random parameters, and a random batch. One step of llm.c's gpt2_forward,
 * gpt2_zero_grad, gpt2_backward gives the reference loss and parameter
 * gradients. Then the graph of the same step (llmc_graph.h) is planned at
 * several budgets (100 %, 60 %, 40 % of the baseline peak, and the smallest
 * the planner meets), and each plan is run with llm.c's kernels called one
 * graph op at a time (llmc_host.h), in both of the host's memory modes:
 * - malloc: one malloc per buffer, counted; the counted activation peak
 *   must be the plan's predicted peak, to the byte;
 * - arena: one rkm_arena_exec per plan (its layout: one region of the
 *   plan's arena_bytes, allocated once, the inputs filled once), each buffer
 *   at its offset in it; the arena's peak must be the predicted peak and
 *   the region (the "arena" column) at most the budget. The baseline,
 *   planned for no budget, is exempt from that bound: its arena is its
 *   buffers each rounded up to 256 bytes, a little over its peak.
 * Every run must give llm.c's loss and gradients bit for bit.
 *
 * Options (defaults shown): --layers 4 --channels 64 --heads 4 --seq 32
 * --batch 4 --vocab 250 --padded-vocab 256 --algo default --seed 1337.
 * Exit status: 0 ok, 1 a mismatch or failure, 2 bad usage. */
#define _GNU_SOURCE /* llm.c uses M_PI and POSIX calls */
#define TESTING     /* leave out llm.c's main() */
#include <train_gpt2.c>

#include "args.h"
#include "llmc_host.h"

typedef struct options {
    llmc_shape shape;
    rkm_algo algo;
    uint64_t seed;
} options;

static int usage(const char *why)
{
    fprintf(stderr,
            "%s\nusage: llmc [--layers N] [--channels N] [--heads N] [--seq N] [--batch N] [--vocab N]\n"
            "            [--padded-vocab N] [--algo default|rockmate|rotor|sqrt|dtr|checkmate|none] [--seed N]\n",
            why);
    return 2;
}

static int parse_args(rkm_context *ctx, int argc, char **argv, options *o)
{
    llmc_shape *s = &o->shape;
    memset(o, 0, sizeof *o);
    s->L = 4, s->C = 64, s->NH = 4, s->T = 32, s->B = 4, s->V = 250, s->Vp = 256;
    o->seed = 1337;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *n = !strcmp(a, "--layers") ? &s->L : !strcmp(a, "--channels") ? &s->C
               : !strcmp(a, "--heads") ? &s->NH : !strcmp(a, "--seq") ? &s->T
               : !strcmp(a, "--batch") ? &s->B : !strcmp(a, "--vocab") ? &s->V
               : !strcmp(a, "--padded-vocab") ? &s->Vp : NULL;
        if (!v) return usage("missing value");
        if (n) {
            if (!arg_int(v, 0, INT_MAX, n)) return usage("a shape: a whole number");
        }
        else if (!strcmp(a, "--algo")) {
            if (rkm_algo_from_name(ctx, v, &o->algo) != RKM_OK) return usage(rkm_context_errmsg(ctx));
        } else if (!strcmp(a, "--seed")) {
            if (!arg_u64(v, &o->seed)) return usage("--seed: a whole number");
        }
        else return usage("unknown option");
    }
    s->maxT = s->T;
    return llmc_shape_ok(s) ? 0 : usage("bad shape (heads must divide channels, padded-vocab >= vocab)");
}

/* A small generator for the random model and batch (splitmix64). */
static uint64_t mix(uint64_t *state)
{
    uint64_t x = (*state += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float uniform(uint64_t *state) { return (float)(mix(state) >> 40) * (1.0f / 16777216.0f); }

/* llm.c's GPT2 with random parameters, set up as gpt2_build_from_checkpoint
 * sets it up after reading a file: layernorm weights near 1, biases and
 * the rest small. */
static void build_random_gpt2(GPT2 *model, const llmc_shape *s, uint64_t seed)
{
    float *ptr;
    memset(model, 0, sizeof *model);
    model->config.max_seq_len = s->maxT;
    model->config.vocab_size = s->V;
    model->config.padded_vocab_size = s->Vp;
    model->config.num_layers = s->L;
    model->config.num_heads = s->NH;
    model->config.channels = s->C;
    fill_in_parameter_sizes(model->param_sizes, model->config);
    model->num_parameters = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) model->num_parameters += model->param_sizes[i];
    model->params_memory = malloc_and_point_parameters(&model->params, model->param_sizes);
    ptr = model->params_memory;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int is_ln_weight = i == LLMC_LN1W || i == LLMC_LN2W || i == LLMC_LNFW;
        for (size_t j = 0; j < model->param_sizes[i]; j++) {
            float u = 2.0f * uniform(&seed) - 1.0f;
            *ptr++ = is_ln_weight ? 1.0f + 0.1f * u : 0.05f * u;
        }
    }
    model->mean_loss = -1.0f; /* the rest stays NULL/0, as after gpt2_build_from_checkpoint */
}

/* Our llmc_param order is llm.c's ParameterTensors order. */
static void point_params(const ParameterTensors *t, float *p[LLMC_NUM_PARAMS])
{
    p[LLMC_WTE] = t->wte, p[LLMC_WPE] = t->wpe, p[LLMC_LN1W] = t->ln1w, p[LLMC_LN1B] = t->ln1b;
    p[LLMC_QKVW] = t->qkvw, p[LLMC_QKVB] = t->qkvb, p[LLMC_ATTPROJW] = t->attprojw, p[LLMC_ATTPROJB] = t->attprojb;
    p[LLMC_LN2W] = t->ln2w, p[LLMC_LN2B] = t->ln2b, p[LLMC_FCW] = t->fcw, p[LLMC_FCB] = t->fcb;
    p[LLMC_FCPROJW] = t->fcprojw, p[LLMC_FCPROJB] = t->fcprojb, p[LLMC_LNFW] = t->lnfw, p[LLMC_LNFB] = t->lnfb;
}

typedef struct run {
    options opt;
    rkm_context *ctx;
    GPT2 model;
    int *tokens, *targets;
    float *ref_grads, ref_loss;
    llmc_graph gg;
    llmc_step st;  /* malloc mode */
    llmc_step sta; /* arena mode */
    int failed;
} run;

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* One step of llm.c's own training loop body (gpt2_update aside). */
static void llmc_reference(run *r)
{
    const llmc_shape *s = &r->opt.shape;
    size_t gbytes = r->model.num_parameters * sizeof(float);
    gpt2_forward(&r->model, r->tokens, r->targets, (size_t)s->B, (size_t)s->T);
    gpt2_zero_grad(&r->model);
    gpt2_backward(&r->model);
    r->ref_loss = r->model.mean_loss;
    r->ref_grads = (float *)malloc(gbytes);
    if (r->ref_grads) memcpy(r->ref_grads, r->model.grads_memory, gbytes);
}

static int same_as_reference(const run *r, const llmc_step *st)
{
    return !memcmp(&st->mean_loss, &r->ref_loss, sizeof(float)) &&
           !memcmp(r->model.grads_memory, r->ref_grads, r->model.num_parameters * sizeof(float));
}

/* One step of `plan` in arena mode through an exec of its own, made from
 * the plan's layout (its one allocation) and destroyed here; its stats
 * (peak, capacity) into *as. */
static rkm_result arena_step(run *r, const rkm_plan *plan, rkm_arena_stats *as)
{
    rkm_arena_exec *x = NULL;
    rkm_result res = llmc_step_open(&r->sta, plan, &x);
    if (res == RKM_OK) res = llmc_step_run_arena(&r->sta, x, plan, r->model.num_parameters);
    if (res == RKM_OK) rkm_arena_exec_stats_get(x, as);
    rkm_arena_exec_destroy(x);
    return res;
}

/* Both modes' steps of `plan`: 1 when both ran, `same` saying whether
 * both gave the reference's loss and gradients; else says why, 0. */
static int run_both(run *r, const char *label, const rkm_plan *plan, rkm_arena_stats *as, int *same)
{
    llmc_step *st = &r->st;
    rkm_result res = llmc_step_run(st, plan, r->model.num_parameters);
    if (res == RKM_OK) {
        *same = same_as_reference(r, st);
        st = &r->sta;
        res = arena_step(r, plan, as);
    }
    if (res == RKM_OK) {
        *same &= same_as_reference(r, st);
        return 1;
    }
    printf("llmc: FAILED %s: %s step: %s; %s\n", label, st->arena ? "arena" : "malloc", st->err,
           rkm_context_errmsg(r->ctx));
    return 0;
}

/* Run `plan` with llm.c's kernels in both modes and compare with the
 * reference: peaks (malloc's counted, the arena's) the predicted one, the
 * exec's region the plan's arena and, for a plan made for `budget`
 * (planned), within it. */
static void check_plan(run *r, const char *label, const rkm_plan *plan, uint64_t budget, uint64_t baseline_peak,
                       int planned)
{
    rkm_plan_stats ps;
    rkm_arena_stats as;
    int same = 0, peaks, fits;
    rkm_plan_stats_get(plan, &ps);
    if (!run_both(r, label, plan, &as, &same)) {
        r->failed = 1;
        return;
    }
    peaks = ps.peak == r->st.peak && ps.peak == as.peak && as.capacity == ps.arena_bytes;
    fits = ps.peak <= budget && (!planned || as.capacity <= budget);
    printf("%-9s budget %9llu (%5.1f%%)  %-8s predicted peak %9llu  measured %9llu  arena peak %9llu  arena %9llu  "
           "recomputes %3zu  loss %.6f  %s\n",
           label, (unsigned long long)budget, pct(budget, baseline_peak), rkm_algo_name(ps.algo),
           (unsigned long long)ps.peak, (unsigned long long)r->st.peak, (unsigned long long)as.peak,
           (unsigned long long)as.capacity, ps.recomputes, (double)r->st.mean_loss,
           !same ? "DIFFERENT" : !peaks ? "PEAK MISMATCH" : !fits ? "OVER BUDGET" : "bit-identical");
    if (!same || !peaks || !fits) r->failed = 1;
}

static int setup(run *r)
{
    const llmc_shape *s = &r->opt.shape;
    size_t BT = (size_t)s->B * (size_t)s->T;
    float *params[LLMC_NUM_PARAMS], *grads[LLMC_NUM_PARAMS];
    uint64_t seed = r->opt.seed ^ 0xbadc0ffeull;
    char why[256];
    build_random_gpt2(&r->model, s, r->opt.seed);
    r->tokens = (int *)malloc(BT * sizeof(int));
    r->targets = (int *)malloc(BT * sizeof(int));
    if (!r->tokens || !r->targets) return 1;
    for (size_t i = 0; i < BT; i++) {
        r->tokens[i] = (int)(mix(&seed) % (uint64_t)s->V);
        r->targets[i] = (int)(mix(&seed) % (uint64_t)s->V);
    }
    llmc_reference(r);
    if (!r->ref_grads) return 1;
    if (llmc_graph_build(r->ctx, s, &r->gg) != RKM_OK) {
        printf("llmc: FAILED graph: %s\n", rkm_context_errmsg(r->ctx));
        return 1;
    }
    if (!llmc_graph_order_forced(&r->gg, why, sizeof why)) {
        printf("llmc: FAILED %s\n", why);
        return 1;
    }
    point_params(&r->model.params, params);
    point_params(&r->model.grads, grads);
    if (llmc_step_init(&r->st, &r->gg, params, grads, r->tokens, r->targets)) return 1;
    return llmc_step_init_arena(&r->sta, &r->gg, params, grads, r->tokens, r->targets) ? 1 : 0;
}

static int plan_and_check(run *r)
{
    static const double budgets[] = {1.0, 0.6, 0.4};
    static const char *labels[] = {"100%", "60%", "40%"};
    rkm_graph_stats gs;
    rkm_solve_desc sd;
    rkm_planner *pl = NULL;
    rkm_plan *plan;
    uint64_t budget;
    rkm_graph_stats_get(r->gg.g, &gs);
    printf("graph: %d ops, %d tensors, %d blocks; baseline peak %llu bytes (llm.c's activation block: acts %zu + "
           "grads_acts %zu bytes)\n",
           (int)rkm_graph_num_ops(r->gg.g), (int)rkm_graph_num_tensors(r->gg.g), (int)gs.blocks,
           (unsigned long long)gs.baseline_peak, r->model.num_activations * sizeof(float),
           r->model.num_activations * sizeof(float));
    if (rkm_plan_baseline(r->gg.g, &plan) != RKM_OK) return 1;
    check_plan(r, "baseline", plan, gs.baseline_peak, gs.baseline_peak, 0);
    rkm_plan_destroy(plan);
    memset(&sd, 0, sizeof sd);
    sd.algo = r->opt.algo;
    if (rkm_planner_create(r->gg.g, &sd, &pl) != RKM_OK) {
        printf("llmc: FAILED planner: %s\n", rkm_context_errmsg(r->ctx));
        return 1;
    }
    for (int i = 0; i < 4; i++) {
        rkm_result res;
        if (i < 3) budget = (uint64_t)((double)gs.baseline_peak * budgets[i]);
        else if (rkm_planner_min_budget(pl, &budget) != RKM_OK) {
            printf("llmc: FAILED smallest budget: %s\n", rkm_context_errmsg(r->ctx));
            r->failed = 1;
            break;
        }
        res = rkm_planner_solve(pl, budget, &plan);
        if (res == RKM_ERROR_BUDGET) {
            printf("%-9s budget %9llu (%5.1f%%)  no plan of this algorithm fits\n", i < 3 ? labels[i] : "floor",
                   (unsigned long long)budget, pct(budget, gs.baseline_peak));
            continue;
        }
        if (res != RKM_OK) {
            printf("llmc: FAILED planning: %s\n", rkm_context_errmsg(r->ctx));
            r->failed = 1;
            break;
        }
        check_plan(r, i < 3 ? labels[i] : "floor", plan, budget, gs.baseline_peak, 1);
        rkm_plan_destroy(plan);
    }
    rkm_planner_destroy(pl);
    return 0;
}

int main(int argc, char **argv)
{
    run r;
    int rc;
    memset(&r, 0, sizeof r);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (rkm_context_create(NULL, &r.ctx) != RKM_OK) return 1;
    if ((rc = parse_args(r.ctx, argc, argv, &r.opt)) != 0) {
        rkm_context_destroy(r.ctx);
        return rc;
    }
    printf("llmc: llm.c's train_gpt2.c kernels, L=%d C=%d NH=%d V=%d Vp=%d B=%d T=%d, random parameters\n",
           r.opt.shape.L, r.opt.shape.C, r.opt.shape.NH, r.opt.shape.V, r.opt.shape.Vp, r.opt.shape.B, r.opt.shape.T);
    rc = setup(&r);
    if (!rc) {
        printf("reference: llm.c gpt2_forward + gpt2_backward, loss %.6f, %zu parameters\n", (double)r.ref_loss,
               r.model.num_parameters);
        rc = plan_and_check(&r);
    }
    if (!rc && r.failed) rc = 1;
    printf("llmc: %s\n", rc ? "FAILED (see above)"
                            : "ok: every plan gave llm.c's loss and gradients bit for bit in both modes, measured "
                              "peak = arena peak = predicted peak, every planned arena within its budget");
    if (r.st.gg) llmc_step_free(&r.st);
    if (r.sta.gg) llmc_step_free(&r.sta);
    if (r.gg.g) llmc_graph_free(&r.gg);
    gpt2_free(&r.model);
    free(r.tokens);
    free(r.targets);
    free(r.ref_grads);
    rkm_context_destroy(r.ctx);
    return rc;
}
