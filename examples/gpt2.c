/* gpt2.c -- train a small GPT-2 on the CPU through rockmate, in the style of
 * llm.c's train_gpt2.c: byte-level tokens from a bundled text, fp32, AdamW.
 * Every activation, saved state, activation gradient and workspace is
 * rockmate's to place, under a memory budget; the plan recomputes what does
 * not fit. --memory says where they live:
 * - arena (the default): one region per plan, laid out by the library
 *   (gpt2_step_open: one allocation, before training); a training step
 *   allocates nothing, and the measured peak is the arena's.
 * - malloc: each buffer is allocated and freed inside the callbacks through
 *   a counting allocator (gpt2_mem), whose peak is measured.
 * Both give the same losses and gradients, bit for bit (the digest line),
 * and a measured peak equal to the predicted one, to the byte.
 *
 * At the end it checks the promise: one step under the baseline plan and one
 * under the chosen plan, from the same parameters and batch, must give the
 * same loss and the same parameter gradients, bit for bit.
 *
 * Build (from the repository root):
 *   gcc -std=c11 -O2 -Wall -Wextra -Wpedantic -ffp-contract=off -I. examples/gpt2.c rockmate.c \
 *       -o build/gpt2 -llpsolve55 -lcolamd -lm -ldl
 * (or `make demo`). Run from the repository root (defaults shown):
 *   build/gpt2 [--layers 4] [--channels 128] [--heads 4] [--seq 64] [--batch 4] [--steps 10]
 *              [--budget 40%] [--algo rockmate] [--dropout 0] [--lr 1e-3] [--seed 1337]
 *              [--data examples/data/fables.txt] [--memory arena] [--inplace 0] [--copy 0]
 * --inplace 1 declares GELU's and the residual adds' backwards in place
 * (RKM_OP_GRAD_INPLACE): the residual stream's gradient then stays in one
 * buffer down the layers, as llm.c's dresidual; gradients are the same.
 * --copy BW (bytes a second, e.g. 2e9) gives the profiled graph a copy link
 * to host memory of BW each way (docs/formats.md, "Offloading"): the plan may
 * then offload activations and saved states to host buffers and prefetch
 * them back. Two copy threads (examples/copier.h) move the bytes at BW while
 * the kernels go on, so waits are real; the measured host peak must equal
 * the predicted one, to the byte, and the check shows the step's measured
 * time beside the simulator's.
 * --budget takes bytes, KiB/MiB/GiB, N% of the baseline's arena, or "min".
 * Without --algo the library's default plans: rockmate (without its ILP
 * options in a build without lp_solve, make OMIT=1). The op costs are profiled first, and the
 * profiled graph is the one planned and run (profiling runs through the
 * counting allocator: the arenas are laid out for the profiled graph's plans).
 * Exit status: 0 ok, 1 a failure (the check included), 2 bad usage, 3 no
 * plan of the algorithm fits the budget. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "gpt2_model.h"

#define GPT2_DEFAULT_DATA "examples/data/fables.txt"

typedef struct options {
    gpt2_shape shape;
    int steps;
    const char *budget, *algo, *data; /* algo NULL: the library's default */
    rkm_algo algo_id;
    float dropout, lr;
    uint64_t seed;
    int arena; /* --memory arena (1, the default) or malloc (0) */
    double copy_bw; /* --copy: bytes a second each way; 0: no copy link */
} options;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int usage(const char *why)
{
    fprintf(stderr,
            "%s\nusage: gpt2 [--layers N] [--channels N] [--heads N] [--seq N] [--batch N] [--steps N]\n"
            "            [--budget B|N%%|NMiB|min] [--algo rockmate|rotor|sqrt|checkmate|none]\n"
            "            [--dropout P] [--lr LR] [--seed N] [--data FILE] [--memory arena|malloc]\n"
            "            [--inplace 0|1] [--copy BYTES_PER_SECOND]\n",
            why);
    return 2;
}

/* ctx names the algorithms. */
static int parse_args(rkm_context *ctx, int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->shape.L = 4, o->shape.C = 128, o->shape.NH = 4, o->shape.V = 256, o->shape.B = 4, o->shape.T = 64;
    o->steps = 10, o->budget = "40%", o->data = GPT2_DEFAULT_DATA;
    o->lr = 1e-3f, o->seed = 1337, o->arena = 1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *n = !strcmp(a, "--layers") ? &o->shape.L : !strcmp(a, "--channels") ? &o->shape.C
               : !strcmp(a, "--heads")  ? &o->shape.NH : !strcmp(a, "--seq") ? &o->shape.T
               : !strcmp(a, "--batch")  ? &o->shape.B : !strcmp(a, "--steps") ? &o->steps : NULL;
        if (!v) return usage(strcmp(a, "-h") && strcmp(a, "--help") ? "missing value" : "");
        double x;
        if (n) {
            if (!arg_int(v, 0, INT_MAX, n)) return usage("a shape or --steps: a whole number");
        } else if (!strcmp(a, "--budget")) o->budget = v;
        else if (!strcmp(a, "--algo")) o->algo = v;
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--dropout") || !strcmp(a, "--lr")) {
            if (!arg_double(v, &x)) return usage("--dropout, --lr: a decimal number");
            *(a[2] == 'd' ? &o->dropout : &o->lr) = (float)x;
        } else if (!strcmp(a, "--seed")) {
            if (!arg_u64(v, &o->seed)) return usage("--seed: a whole number");
        }
        else if (!strcmp(a, "--memory") && (!strcmp(v, "arena") || !strcmp(v, "malloc")))
            o->arena = !strcmp(v, "arena");
        else if (!strcmp(a, "--inplace") && (!strcmp(v, "0") || !strcmp(v, "1")))
            o->shape.inplace = !strcmp(v, "1");
        else if (!strcmp(a, "--copy")) {
            if (!arg_double(v, &o->copy_bw) || !(o->copy_bw > 0)) return usage("--copy: bytes per second, a positive number");
        }
        else return usage("unknown option");
    }
    o->shape.dropout = o->dropout > 0.0f;
    o->algo_id = RKM_ALGO_DEFAULT;
    if (o->algo && rkm_algo_from_name(ctx, o->algo, &o->algo_id) != RKM_OK) return usage("unknown --algo");
    if (!gpt2_shape_ok(&o->shape) || o->steps < 0 || !(o->dropout >= 0.0f && o->dropout < 1.0f))
        return usage("bad configuration (heads must divide channels, 0 <= dropout < 1)");
    return 0;
}

/* The bundled text, bytes as tokens. */
typedef struct dataset {
    unsigned char *bytes;
    size_t n, pos;
    int32_t *tokens, *targets; /* one batch */
} dataset;

static int data_load(dataset *ds, const char *path, const gpt2_shape *s)
{
    FILE *f = fopen(path, "rb");
    long size;
    size_t need = (size_t)s->B * (size_t)s->T;
    memset(ds, 0, sizeof *ds);
    if (!f) return -1;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (ds->bytes = (unsigned char *)malloc((size_t)size)) != NULL)
        ds->n = fread(ds->bytes, 1, (size_t)size, f);
    fclose(f);
    ds->tokens = (int32_t *)malloc(need * sizeof(int32_t));
    ds->targets = (int32_t *)malloc(need * sizeof(int32_t));
    return ds->bytes && ds->tokens && ds->targets && ds->n > need ? 0 : -1;
}

static void data_free(dataset *ds)
{
    free(ds->bytes);
    free(ds->tokens);
    free(ds->targets);
}

/* The next B rows of T tokens, read on through the text (as llm.c's loader). */
static void data_next(dataset *ds, const gpt2_shape *s)
{
    size_t bt = (size_t)s->B * (size_t)s->T;
    if (ds->pos + bt + 1 > ds->n) ds->pos = 0;
    for (size_t i = 0; i < bt; i++) {
        ds->tokens[i] = ds->bytes[ds->pos + i];
        ds->targets[i] = ds->bytes[ds->pos + i + 1];
    }
    ds->pos += bt;
}

typedef struct trainer {
    options opt;
    rkm_context *ctx;
    gpt2_graph gg;
    gpt2_model model;
    gpt2_step st;
    dataset ds;
    rkm_plan *base, *plan;
    rkm_arena_exec *base_ax, *plan_ax; /* --memory arena: their execs, one region each */
    uint64_t plan_arena;               /* --memory arena: the bytes the plan's region holds */
    rkm_plan_stats ps;
    copier cp;  /* --copy: the copy streams (st.cp points here while open) */
    uint64_t budget;
    uint64_t digest; /* of every training step's loss and parameter gradients */
} trainer;

/* Exit status 1 for a failure, 3 when no plan fits the budget (as the CLI). */
static int fail_with(trainer *tr, const char *what, int status)
{
    printf("demo: FAILED %s: %s%s%s\n", what, tr->st.err, tr->st.err[0] ? "; " : "", rkm_context_errmsg(tr->ctx));
    return status;
}

static int fail(trainer *tr, const char *what) { return fail_with(tr, what, 1); }

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* Graph, parameters, step buffers, text. */
static int setup_model(trainer *tr)
{
    const options *o = &tr->opt;
    rkm_graph_stats gs;
    if (gpt2_graph_build(tr->ctx, &o->shape, &tr->gg) != RKM_OK) return fail(tr, "graph");
    if (gpt2_model_init(&tr->model, &o->shape, o->seed) ||
        (o->arena ? gpt2_step_init_arena : gpt2_step_init)(&tr->st, &tr->gg, &tr->model, o->dropout, o->seed))
        return fail(tr, "out of memory");
    if (data_load(&tr->ds, o->data, &o->shape)) {
        printf("demo: FAILED cannot read %s (or it is shorter than one batch); run from the repository root or "
               "pass --data\n", o->data);
        return 1;
    }
    rkm_graph_stats_get(tr->gg.g, &gs);
    printf("gpt2: L=%d C=%d NH=%d V=%d B=%d T=%d dropout=%g, %zu parameters; %s, %zu bytes of text\n", o->shape.L,
           o->shape.C, o->shape.NH, o->shape.V, o->shape.B, o->shape.T, (double)o->dropout, tr->model.num_params,
           o->data, tr->ds.n);
    printf("graph: %d ops, %d tensors, %d blocks in %d classes, baseline peak %llu bytes\n",
           (int)rkm_graph_num_ops(tr->gg.g), (int)rkm_graph_num_tensors(tr->gg.g), (int)gs.blocks,
           (int)gs.block_classes, (unsigned long long)gs.baseline_peak);
    return 0;
}

/* The budget in bytes ("min": the least the algorithm can meet), then the plan. */
static int make_plan(trainer *tr, const rkm_solve_desc *sd)
{
    rkm_planner *pl = NULL;
    rkm_result r = rkm_planner_create(tr->gg.g, sd, &pl);
    if (r == RKM_OK && !strcmp(tr->opt.budget, "min")) r = rkm_planner_min_budget(pl, &tr->budget);
    else if (r == RKM_OK && rkm_parse_budget(tr->gg.g, tr->opt.budget, sd->alignment, &tr->budget) != RKM_OK) {
        rkm_planner_destroy(pl);
        return usage("bad --budget");
    }
    if (r == RKM_OK) r = rkm_planner_solve(pl, tr->budget, &tr->plan);
    rkm_planner_destroy(pl);
    if (r == RKM_ERROR_BUDGET) return fail_with(tr, "no plan fits the budget", 3);
    return r == RKM_OK ? 0 : fail(tr, "planning");
}

/* The graph with measured op times in place of its first guesses: it
 * replaces the built one (same ops and tensors), so the callbacks, the plans
 * and the teardown all use it. Profiling runs real training steps, in
 * malloc mode (rkm_graph_profile calls the callbacks itself, before any
 * arena exists); the parameter gradients they leave are zeroed by the next
 * step. */
static int profile_graph(trainer *tr)
{
    rkm_profile_desc pd;
    gpt2_step prof;
    rkm_callbacks cb;
    rkm_graph *profiled = NULL;
    rkm_result r;
    memset(&pd, 0, sizeof pd);
    pd.runs = 3;
    data_next(&tr->ds, &tr->opt.shape);
    if (gpt2_step_init(&prof, &tr->gg, &tr->model, tr->opt.dropout, tr->opt.seed)) return fail(tr, "out of memory");
    cb = gpt2_callbacks(&prof);
    if (gpt2_step_load(&prof, tr->ds.tokens, tr->ds.targets)) {
        gpt2_step_free(&prof);
        return fail(tr, "out of memory");
    }
    r = rkm_graph_profile(tr->gg.g, &cb, &pd, &profiled);
    if (r != RKM_OK) snprintf(tr->st.err, sizeof tr->st.err, "%s", prof.err);
    gpt2_step_unload(&prof);
    gpt2_step_free(&prof);
    if (r != RKM_OK) return fail(tr, "profile");
    rkm_graph_destroy(tr->gg.g);
    tr->gg.g = profiled;
    return 0;
}

/* --copy: the profiled graph gains the copy link (it replaces it, as the
 * profiled graph replaced the built one), and the copy threads start at
 * the same bandwidth. */
static int add_copy_link(trainer *tr)
{
    rkm_copy_desc c;
    rkm_graph *g = NULL;
    if (!(tr->opt.copy_bw > 0)) return 0;
    memset(&c, 0, sizeof c);
    c.d2h_bytes_per_second = c.h2d_bytes_per_second = tr->opt.copy_bw;
    if (rkm_graph_with_copy(tr->gg.g, &c, &g) != RKM_OK) return fail(tr, "copy link");
    rkm_graph_destroy(tr->gg.g);
    tr->gg.g = g;
    if (copier_open(&tr->cp, tr->opt.copy_bw, 0.0)) return fail(tr, "copy threads");
    tr->st.cp = &tr->cp;
    printf("copy: %.3g bytes a second each way, two copy threads\n", tr->opt.copy_bw);
    return 0;
}

/* --memory arena: an exec per plan, each with its region (the plan's
 * layout), allocated now, once. */
static int open_arenas(trainer *tr)
{
    rkm_arena_stats bs, ps;
    if (!tr->opt.arena) {
        printf("memory: malloc, a counted malloc and free per buffer in the callbacks\n");
        return 0;
    }
    if (gpt2_step_open(&tr->st, tr->base, &tr->base_ax) != RKM_OK ||
        gpt2_step_open(&tr->st, tr->plan, &tr->plan_ax) != RKM_OK)
        return fail(tr, "arena");
    rkm_arena_exec_stats_get(tr->base_ax, &bs);
    rkm_arena_exec_stats_get(tr->plan_ax, &ps);
    tr->plan_arena = ps.capacity;
    printf("memory: arena, one region per plan from its layout (baseline %llu bytes, plan %llu bytes: %s the "
           "budget), allocated once; a training step allocates nothing\n",
           (unsigned long long)bs.capacity, (unsigned long long)ps.capacity, ps.capacity <= tr->budget ? "within" : "OVER");
    return 0;
}

/* The profiled graph, its baseline plan and the chosen algorithm's plan
 * under the budget. */
static int setup_plans(trainer *tr)
{
    rkm_graph_stats gs;
    rkm_solve_desc sd;
    int rc;
    memset(&sd, 0, sizeof sd);
    sd.algo = tr->opt.algo_id;
    if ((rc = profile_graph(tr)) != 0 || (rc = add_copy_link(tr)) != 0) return rc;
    rkm_graph_stats_get(tr->gg.g, &gs);
    if (rkm_plan_baseline(tr->gg.g, &tr->base) != RKM_OK) return fail(tr, "baseline plan");
    if ((rc = make_plan(tr, &sd)) != 0) return rc;
    rkm_plan_stats_get(tr->plan, &tr->ps);
    printf("baseline: peak %llu bytes, step %.2f ms (profiled)\n", (unsigned long long)gs.baseline_peak,
           gs.baseline_time * 1e3);
    uint64_t base_arena = 0; /* the 100 % of a percent budget */
    rkm_graph_baseline_arena(tr->gg.g, sd.alignment, &base_arena);
    printf("budget: %llu bytes (%.1f%% of the baseline's arena, %llu bytes)\n", (unsigned long long)tr->budget,
           pct(tr->budget, base_arena), (unsigned long long)base_arena);
    printf("plan: %s, predicted peak %llu bytes (%.1f%%), arena %llu bytes, predicted overhead %.2f%%, %zu steps, "
           "%d blocks in %d classes, solved in %.3f s\n",
           rkm_algo_name(tr->ps.algo), (unsigned long long)tr->ps.peak, pct(tr->ps.peak, gs.baseline_peak),
           (unsigned long long)tr->ps.arena_bytes,
           tr->ps.overhead * 100.0, rkm_plan_num_steps(tr->plan), (int)gs.blocks, (int)gs.block_classes,
           tr->ps.solve_seconds);
    if (tr->ps.offloads)
        printf("offload: %zu offloads, predicted host peak %llu bytes, waits %.2f ms, copy streams busy %.2f ms "
               "(to host) and %.2f ms (back)\n",
               tr->ps.offloads, (unsigned long long)tr->ps.host_peak, tr->ps.wait_seconds * 1e3,
               tr->ps.d2h_seconds * 1e3, tr->ps.h2d_seconds * 1e3);
    return open_arenas(tr);
}

/* One timed step under the plan (use_plan 1) or the baseline (0), in the
 * memory mode of the options; *ms its wall time. */
static int timed_step(trainer *tr, int use_plan, uint64_t key, double *ms)
{
    const rkm_plan *plan = use_plan ? tr->plan : tr->base;
    double t0 = now_seconds();
    rkm_result r = tr->opt.arena ? gpt2_step_run_arena(&tr->st, use_plan ? tr->plan_ax : tr->base_ax, plan, key)
                                 : gpt2_step_run(&tr->st, plan, key);
    *ms = (now_seconds() - t0) * 1e3;
    return r == RKM_OK ? 0 : fail(tr, "step");
}

/* FNV-1a over n bytes. */
static uint64_t digest_add(uint64_t d, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) d = (d ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return d;
}

static int train(trainer *tr)
{
    tr->digest = 0xcbf29ce484222325ull;
    for (int step = 1; step <= tr->opt.steps; step++) {
        double ms;
        data_next(&tr->ds, &tr->opt.shape);
        if (gpt2_step_load(&tr->st, tr->ds.tokens, tr->ds.targets)) return fail(tr, "out of memory");
        if (timed_step(tr, 1, (uint64_t)step, &ms)) return 1;
        tr->digest = digest_add(tr->digest, &tr->st.loss, sizeof tr->st.loss);
        tr->digest = digest_add(tr->digest, tr->model.grads, tr->model.num_params * sizeof(float));
        gpt2_model_update(&tr->model, tr->opt.lr, 0.0f, step);
        printf("step %d/%d: loss %.6f, %.1f ms, activation peak %llu bytes\n", step, tr->opt.steps, tr->st.loss, ms,
               (unsigned long long)tr->st.peak);
        if (tr->st.peak != tr->ps.peak) return fail(tr, "measured peak differs from the predicted peak");
        if (tr->st.host_peak != tr->ps.host_peak) return fail(tr, "measured host peak differs from the predicted one");
    }
    printf("digest: %016llx (every training step's loss and parameter gradients)\n", (unsigned long long)tr->digest);
    return 0;
}

#define CHECK_ROUNDS 3

typedef struct check_state {
    float *ref_grads;     /* the first baseline run's parameter gradients */
    double ref_loss;
    double best_ms[2];    /* fastest baseline run, fastest plan run */
    uint64_t peak;        /* the plan runs' measured peak (all must agree) */
    const char *bad;      /* the first thing that went wrong */
    int same;             /* losses and gradients all identical so far */
} check_state;

/* Run i of the check: even runs baseline, odd runs the plan. */
static int check_run(trainer *tr, int i, check_state *cs)
{
    size_t gbytes = tr->model.num_params * sizeof(float);
    uint64_t key = (uint64_t)tr->opt.steps + 1; /* one dropout key for all runs */
    double ms;
    if (timed_step(tr, i % 2, key, &ms)) return 1;
    if (ms < cs->best_ms[i % 2]) cs->best_ms[i % 2] = ms;
    if (i == 0) {
        memcpy(cs->ref_grads, tr->model.grads, gbytes);
        cs->ref_loss = tr->st.loss;
    } else if (memcmp(&cs->ref_loss, &tr->st.loss, sizeof cs->ref_loss) ||
               memcmp(cs->ref_grads, tr->model.grads, gbytes)) {
        cs->same = 0;
        cs->bad = "loss or gradients differ from the baseline's";
    }
    if (i % 2 && !cs->bad && cs->peak && cs->peak != tr->st.peak) cs->bad = "measured peak varies";
    if (i % 2 && !cs->bad && tr->st.host_peak != tr->ps.host_peak) cs->bad = "measured host peak differs from the predicted one";
    if (i % 2) cs->peak = tr->st.peak;
    return 0;
}

/* Baseline and plan, alternately, from the same parameters, batch and
 * dropout key: every run must reproduce the first baseline run exactly.
 * The fastest run of each gives the measured overhead. */
static int check(trainer *tr)
{
    check_state cs;
    memset(&cs, 0, sizeof cs);
    cs.best_ms[0] = cs.best_ms[1] = 1e300;
    cs.same = 1;
    tr->ds.pos = 0;
    data_next(&tr->ds, &tr->opt.shape);
    if (!(cs.ref_grads = (float *)malloc(tr->model.num_params * sizeof(float))) ||
        gpt2_step_load(&tr->st, tr->ds.tokens, tr->ds.targets)) {
        free(cs.ref_grads);
        return fail(tr, "out of memory");
    }
    for (int i = 0; i < 2 * CHECK_ROUNDS && !cs.bad; i++)
        if (check_run(tr, i, &cs)) {
            free(cs.ref_grads);
            return 1;
        }
    free(cs.ref_grads);
    gpt2_step_unload(&tr->st);
    if (!cs.bad && cs.peak != tr->ps.peak) cs.bad = "measured peak differs from the predicted peak";
    if (!cs.bad && cs.peak > tr->budget) cs.bad = "measured peak over the budget";
    if (!cs.bad && tr->opt.arena && tr->plan_arena != tr->ps.arena_bytes) cs.bad = "arena differs from the plan's";
    if (!cs.bad && tr->opt.arena && tr->plan_arena > tr->budget) cs.bad = "arena over the budget";
    if (!cs.bad && tr->st.mem.cur != 0) cs.bad = "activation memory not back to zero";
    printf("check: loss %.6f, baseline %.1f ms (predicted %.1f), plan %.1f ms (predicted %.1f)\n", cs.ref_loss,
           cs.best_ms[0], tr->ps.baseline_time * 1e3, cs.best_ms[1], tr->ps.time * 1e3);
    if (!cs.bad)
        printf("in words: the training step ran in %.1f%% of the baseline's activation memory for %.1f%% more time "
               "(%.1f%% predicted), with %s gradients and loss, %s\n",
               100.0 * (double)cs.peak / (double)tr->ps.baseline_peak, (cs.best_ms[1] / cs.best_ms[0] - 1.0) * 100.0,
               tr->ps.overhead * 100.0, cs.same ? "bit-identical" : "DIFFERENT",
               tr->opt.arena ? "every buffer in one arena per plan" : "every buffer malloc'ed in the callbacks");
    if (!cs.bad && tr->opt.arena)
        printf("in words: the plan's arena, the one allocation the step ran in, is %llu bytes: the budget of %llu "
               "bytes or less (%.1f%% of it)\n",
               (unsigned long long)tr->plan_arena, (unsigned long long)tr->budget, pct(tr->plan_arena, tr->budget));
    printf("demo: %s%s%s budget=%llu predicted_peak=%llu measured_peak=%llu overhead_predicted=%.2f%% "
           "overhead_measured=%.2f%% grads=%s",
           cs.bad ? "FAILED (" : "ok", cs.bad ? cs.bad : "", cs.bad ? ")" : "", (unsigned long long)tr->budget,
           (unsigned long long)tr->ps.peak, (unsigned long long)cs.peak, tr->ps.overhead * 100.0,
           (cs.best_ms[1] / cs.best_ms[0] - 1.0) * 100.0, cs.same ? "identical" : "differ");
    if (tr->opt.arena) printf(" arena=%llu", (unsigned long long)tr->plan_arena);
    printf("\n");
    return cs.bad != NULL;
}

static void teardown(trainer *tr)
{
    if (tr->st.act) gpt2_step_unload(&tr->st);
    if (tr->st.cp) copier_close(&tr->cp);
    rkm_arena_exec_destroy(tr->plan_ax);
    rkm_arena_exec_destroy(tr->base_ax);
    rkm_plan_destroy(tr->plan);
    rkm_plan_destroy(tr->base);
    gpt2_step_free(&tr->st);
    gpt2_model_free(&tr->model);
    data_free(&tr->ds);
    if (tr->gg.g) gpt2_graph_free(&tr->gg);
    rkm_context_destroy(tr->ctx);
}

int main(int argc, char **argv)
{
    trainer tr;
    int rc;
    memset(&tr, 0, sizeof tr);
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows as it happens */
    if (rkm_context_create(NULL, &tr.ctx) != RKM_OK) {
        printf("demo: FAILED context: out of memory\n");
        return 1;
    }
    rc = parse_args(tr.ctx, argc, argv, &tr.opt);
    if (!rc) rc = setup_model(&tr);
    if (!rc) rc = setup_plans(&tr);
    if (!rc) rc = train(&tr);
    if (!rc) rc = check(&tr);
    teardown(&tr);
    return rc;
}
