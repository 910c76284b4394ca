/* gpt2_pipe.c -- the CPU GPT-2 of gpt2.c trained as a pipeline over MPI:
 * P stages on P ranks, M micro-batches a step under 1F1B (or GPipe), each
 * rank running its stage's rockmate plan in one region, the stage's arena;
 * --dp D runs D replicas of the pipeline (P x D ranks) on shares of the
 * batch. After every step the loss and every parameter gradient are checked,
 * bit for bit, against the single-process trainer (the whole graph, in rank
 * 0) accumulating the same micro-batches in the same order.
 *
 *   mpirun -np P [--oversubscribe] build/gpt2_pipe [--micro-batches 8] [--schedule 1f1b|gpipe]
 *          [--dp 1] [--stages P] [--budget 50%] [--algo rockmate] [--link 0]
 *          [--layers 4] [--channels 64] [--heads 4] [--seq 32] [--batch 2] [--steps 3]
 *          [--dropout 0] [--inplace 0|1] [--lr 1e-3] [--seed 1337] [--data examples/data/fables.txt]
 *          [--check 1] [--fail-rank R --fail-step S [--fail-micro M] [--fail-kind callback|mpi]]
 *
 * Ranks: world rank r is stage r % P of replica r / P. Rank 0 builds the
 * graph, profiles its op times (as gpt2.c does), plans the pipeline
 * (rkm_pipeline_plan: the cut, and each stage's plan for the per-device
 * --budget with its micro-batches in flight) and broadcasts the op times,
 * the cut and each stage's plan file (rkm_plan_write); every rank then makes
 * the same graph (rkm_graph_with_costs), cuts it (rkm_graph_cut: the same
 * stage graphs) and reads its stage's plan back (the plan file's graph
 * fingerprint checks that the stage graphs are the ones planned).
 *
 * Memory: one region per rank, allocated once, of the stage's arena
 * (rkm_plan_stage_layout: a slot per micro-batch in flight plus the region
 * the running phase has to itself). Every buffer of micro-batch m lies at
 * its layout offset o, moved to m's slot (o + (m mod k) x slot) below the
 * slot size or past the k slots above it. The callbacks count the bytes as
 * the contract does: the measured peak must be the stage plan's predicted
 * peak with its micro-batches in flight (rkm_plan_stage_memory), to the
 * byte, and the region is within the budget; and no buffer they place may
 * share a byte with another live one, of any micro-batch.
 *
 * Order: each rank runs its phases in the order rkm_pipeline_simulate
 * replays (it gives the order: warm-up forwards, one forward one backward,
 * cool-down backwards; GPipe all forwards then all backwards), each phase
 * with rkm_plan_execute_phase. A forward phase of micro-batch m receives
 * its input (MPI_Irecv into m's input buffer in the region) and sends its
 * output (MPI_Isend from the region, completed before the bytes are used
 * again); a backward phase receives its output's gradient into the buffer
 * the `loss` step makes and sends its input's gradient back.
 *
 * Exactness: dropout masks are keyed by the micro-batch's number in the
 * run and the op, not by when a phase runs. Each stage adds its
 * micro-batches' parameter gradients in micro-batch order, as the
 * single-process trainer does. wte is used by two stages (the encoder on
 * the first, the tied lm_head on the last): each keeps its part, and the
 * first adds the last's to its own after the step (Megatron-LM's embedding
 * all-reduce); the replicas' gradients are summed in replica order on
 * replica 0 and sent back. The reference in rank 0 does the same sums: one
 * gradient buffer per replica, lm_head's part of wte in a buffer of its own.
 *
 * Failure: a callback or MPI call that fails on a rank prints one line
 * naming the rank, stage, replica, step, micro-batch and phase, and calls
 * MPI_Abort: mpirun ends every rank. --fail-rank R --fail-step S makes
 * rank R fail at step S, in micro-batch --fail-micro (default M / 2): in a
 * forward callback (--fail-kind callback) or through an MPI send to a rank
 * that does not exist (--fail-kind mpi).
 *
 * Exit status: 0 ok (every check passed), 1 a failure, 2 bad usage, 3 no
 * plan fits the budget. Build with mpicc (make builds it when mpicc is
 * found; make demo-pipeline runs it). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "gpt2_model.h"

#define PIPE_DEFAULT_DATA "examples/data/fables.txt"
#define PIPE_MAX_SLICES (4 * GPT2_NUM_PARAMS + 8)

/* Message tags: a kind and the micro-batch. */
enum { TAG_ACT, TAG_GRAD, TAG_TIED, TAG_DP, TAG_GATHER, TAG_LOSS, TAG_KINDS };
static int tag_of(int kind, int micro) { return micro * TAG_KINDS + kind; }

typedef struct options {
    gpt2_shape shape;
    int steps, micro, dp, stages, check;
    const char *budget, *algo, *data;
    rkm_algo algo_id;
    rkm_pipe_schedule schedule;
    float dropout, lr;
    uint64_t seed;
    double link_bw;
    int fail_rank, fail_step, fail_micro, fail_mpi;
} options;

/* A send in flight and the region's bytes it reads. */
typedef struct pending {
    MPI_Request req;
    uint64_t lo, hi;
} pending;

/* One parameter range of the gradient array: [off, off + len). */
typedef struct slice {
    size_t off, len;
} slice;

/* What each rank reports to rank 0 at the end. */
typedef struct rank_report {
    double fwd_ms, bwd_ms;    /* mean measured phase times */
    double recv_ms;           /* mean time a step waited in receives */
    double busy_ms;           /* mean time from the step's start to the rank's last phase's end */
    uint64_t peak, predicted; /* measured peak (the largest of every step), the prediction */
    uint64_t region, budget;
    int peaks_equal;          /* every step's measured peak == predicted */
    int clean;                /* every micro-batch left nothing live */
} rank_report;

typedef struct pipe_rank {
    options o;
    int rank, size, P, D, s, d; /* world rank, size; stages, replicas; my stage and replica */
    rkm_context *ctx;
    gpt2_graph gg;
    gpt2_model md;
    unsigned char *text;
    size_t text_n;
    /* the plan, the same on every rank */
    uint64_t budget, base_arena;
    double sim_step;
    int32_t *cuts;
    rkm_pipeline_stage_info *info;
    /* my stage */
    rkm_graph *sg;
    int32_t nt, no, *t2w, *o2w;
    int32_t in_w, out_w, out_s; /* whole ids of its input (-1: none) and output; the output's stage id */
    int first, last;
    rkm_plan *plan;
    int64_t nsteps, phase_step;
    rkm_buffer *buf;
    size_t nbuf, *bstart; /* buffers made at step i: [bstart[i + 1], bstart[i + 2]); inputs from bstart[0] */
    rkm_stage_memory mem;
    unsigned char *region;
    gpt2_step *mst; /* per micro-batch: its tensors, saved states and gradients */
    rkm_callbacks cb;
    rkm_pipe_phase *order; /* my 2M phases in the simulator's order */
    uint64_t cur, peak;    /* bytes live now (the contract's count), the step's peak */
    struct { uint64_t lo, hi; } *live; /* the live buffers' bytes in the region */
    int nlive, live_cap;
    pending pend[64];
    int npend;
    slice own[PIPE_MAX_SLICES]; /* the gradient ranges this rank reduces (wte: the first stage's) */
    int nown;
    size_t own_len, wte_off, wte_len;
    int tied; /* wte used on two stages: the first and the last */
    /* the step in progress */
    int step, micro, bwd, fail_armed;
    float *tmp, *packed;
    double *losses; /* D x M of the step (rank 0), or M of mine (last stage) */
    /* rank 0: every step's losses and gradients, for the reference */
    double *hist_loss;
    float *hist_grad;
    /* measurements */
    double fwd_s, bwd_s, recv_s, busy_s;
    int nfwd, nbwd, nsteps_timed;
    double *step_wall; /* rank 0: per step, the slowest rank's busy time */
    int peaks_equal, clean;
    uint64_t max_peak;
    char err[256];
} pipe_rank;

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------
 * Failure: one line, then every rank stops
 * ------------------------------------------------------------------------- */

static const char *phase_name(const pipe_rank *pr) { return pr->bwd ? "backward" : "forward"; }

/* Never returns: the line names where this rank was, and MPI_Abort makes
 * mpirun end every rank (those blocked in a receive included). */
static void die(pipe_rank *pr, const char *what)
{
    char where[64] = "outside the phases";
    if (pr->micro >= 0) snprintf(where, sizeof where, "micro-batch %d, %s phase", pr->micro, phase_name(pr));
    fflush(stdout);
    fprintf(stderr, "gpt2_pipe: FAILED on rank %d (stage %d of %d, replica %d), step %d, %s: %s; aborting every rank\n",
            pr->rank, pr->s, pr->P, pr->d, pr->step, where, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* An MPI call's status: its error string, then die. */
static void mpi_ok(pipe_rank *pr, int rc, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING], line[MPI_MAX_ERROR_STRING + 96];
    int len = 0;
    if (rc == MPI_SUCCESS) return;
    MPI_Error_string(rc, msg, &len);
    snprintf(line, sizeof line, "%s: %.*s", call, len, msg);
    die(pr, line);
}

static int cb_fail(pipe_rank *pr, const char *what, int32_t id)
{
    snprintf(pr->err, sizeof pr->err, "%s (id %d)", what, (int)id);
    return 1;
}

/* ---------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------- */

static int usage(int rank, const char *why)
{
    if (rank == 0)
        fprintf(stderr,
                "%s\nusage: mpirun -np P*D gpt2_pipe [--micro-batches M] [--schedule 1f1b|gpipe] [--dp D] [--stages P]\n"
                "            [--budget B|N%%|NMiB] [--algo rockmate|rotor|sqrt|checkmate|none] [--link BYTES_PER_S]\n"
                "            [--layers N] [--channels N] [--heads N] [--seq N] [--batch N] [--steps N]\n"
                "            [--dropout P] [--inplace 0|1] [--lr LR] [--seed N] [--data FILE] [--check 0|1]\n"
                "            [--fail-rank R --fail-step S [--fail-micro M] [--fail-kind callback|mpi]]\n",
                why);
    return 2;
}

static int parse_args(pipe_rank *pr, int argc, char **argv)
{
    options *o = &pr->o;
    memset(o, 0, sizeof *o);
    o->shape.L = 4, o->shape.C = 64, o->shape.NH = 4, o->shape.V = 256, o->shape.B = 2, o->shape.T = 32;
    o->steps = 3, o->micro = 8, o->dp = 1, o->check = 1, o->budget = "50%", o->data = PIPE_DEFAULT_DATA;
    o->lr = 1e-3f, o->seed = 1337, o->fail_rank = -1, o->fail_step = -1, o->fail_micro = -1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *n = !strcmp(a, "--layers") ? &o->shape.L : !strcmp(a, "--channels") ? &o->shape.C
               : !strcmp(a, "--heads") ? &o->shape.NH : !strcmp(a, "--seq") ? &o->shape.T
               : !strcmp(a, "--batch") ? &o->shape.B : !strcmp(a, "--steps") ? &o->steps
               : !strcmp(a, "--micro-batches") ? &o->micro : !strcmp(a, "--dp") ? &o->dp
               : !strcmp(a, "--stages") ? &o->stages : !strcmp(a, "--check") ? &o->check
               : !strcmp(a, "--fail-rank") ? &o->fail_rank : !strcmp(a, "--fail-step") ? &o->fail_step
               : !strcmp(a, "--fail-micro") ? &o->fail_micro : NULL;
        double x;
        if (!v) return usage(pr->rank, strcmp(a, "-h") && strcmp(a, "--help") ? "missing value" : "");
        if (n) {
            if (!arg_int(v, 0, INT_MAX, n)) return usage(pr->rank, "a shape or count: a whole number");
        } else if (!strcmp(a, "--budget")) o->budget = v;
        else if (!strcmp(a, "--algo")) o->algo = v;
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--dropout") || !strcmp(a, "--lr")) {
            if (!arg_double(v, &x)) return usage(pr->rank, "--dropout, --lr: a decimal number");
            *(a[2] == 'd' ? &o->dropout : &o->lr) = (float)x;
        } else if (!strcmp(a, "--link")) {
            if (!arg_double(v, &o->link_bw) || o->link_bw < 0) return usage(pr->rank, "--link: bytes per second");
        } else if (!strcmp(a, "--seed")) {
            if (!arg_u64(v, &o->seed)) return usage(pr->rank, "--seed: a whole number");
        } else if (!strcmp(a, "--schedule") && (!strcmp(v, "1f1b") || !strcmp(v, "gpipe")))
            o->schedule = !strcmp(v, "gpipe") ? RKM_PIPE_GPIPE : RKM_PIPE_1F1B;
        else if (!strcmp(a, "--inplace") && (!strcmp(v, "0") || !strcmp(v, "1")))
            o->shape.inplace = !strcmp(v, "1");
        else if (!strcmp(a, "--fail-kind") && (!strcmp(v, "callback") || !strcmp(v, "mpi")))
            o->fail_mpi = !strcmp(v, "mpi");
        else return usage(pr->rank, "unknown option");
    }
    o->shape.dropout = o->dropout > 0.0f;
    o->algo_id = RKM_ALGO_DEFAULT;
    if (o->algo && rkm_algo_from_name(pr->ctx, o->algo, &o->algo_id) != RKM_OK) return usage(pr->rank, "unknown --algo");
    if (!gpt2_shape_ok(&o->shape) || o->steps < 1 || o->micro < 1 || o->dp < 1 ||
        !(o->dropout >= 0.0f && o->dropout < 1.0f))
        return usage(pr->rank, "bad configuration (heads must divide channels, 0 <= dropout < 1, steps, "
                               "micro-batches and dp at least 1)");
    if (pr->size % o->dp || (o->stages && o->stages * o->dp != pr->size))
        return usage(pr->rank, "the number of ranks must be stages x dp (mpirun -np)");
    pr->D = o->dp;
    pr->P = pr->size / o->dp;
    if (o->fail_micro < 0) o->fail_micro = o->micro / 2;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Data: the bundled text, bytes as tokens; micro-batch q of the run reads
 * B rows of T tokens at q x B x T (wrapping), on every rank alike
 * ------------------------------------------------------------------------- */

static int text_load(pipe_rank *pr)
{
    FILE *f = fopen(pr->o.data, "rb");
    long size;
    if (!f) return -1;
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (pr->text = (unsigned char *)malloc((size_t)size)) != NULL)
        pr->text_n = fread(pr->text, 1, (size_t)size, f);
    fclose(f);
    return pr->text && pr->text_n > (size_t)pr->o.shape.B * (size_t)pr->o.shape.T + 1 ? 0 : -1;
}

static void batch_at(const pipe_rank *pr, uint64_t q, int32_t *tokens, int32_t *targets)
{
    size_t bt = (size_t)pr->o.shape.B * (size_t)pr->o.shape.T, span = pr->text_n - bt - 1;
    size_t pos = (size_t)((q * bt) % span);
    for (size_t i = 0; i < bt; i++) {
        if (tokens) tokens[i] = pr->text[pos + i];
        if (targets) targets[i] = pr->text[pos + i + 1];
    }
}

/* Micro-batch m of replica d at step t (from 1): its number in the run,
 * which keys its dropout masks and picks its rows. */
static uint64_t micro_id(const pipe_rank *pr, int t, int d, int m)
{
    return ((uint64_t)(t - 1) * (uint64_t)pr->D + (uint64_t)d) * (uint64_t)pr->o.micro + (uint64_t)m;
}

/* Waits for request q without spinning: a rank that waits while rank 0
 * profiles the op times or runs the reference alone must not take the
 * CPU from it (busy-polling ranks made the profiled times several times
 * too long on 2 cores). Open MPI progresses in MPI_Test. */
static void idle_wait(pipe_rank *pr, MPI_Request *q, const char *call)
{
    struct timespec nap = {0, 2000000};
    int done = 0;
    for (;;) {
        mpi_ok(pr, MPI_Test(q, &done, MPI_STATUS_IGNORE), call);
        if (done) return;
        nanosleep(&nap, NULL);
    }
}

/* ---------------------------------------------------------------------------
 * Planning (rank 0) and what every rank receives of it
 * ------------------------------------------------------------------------- */

typedef struct membuf {
    char *p;
    size_t n, cap;
} membuf;

static int membuf_write(void *user, const char *data, size_t len)
{
    membuf *b = (membuf *)user;
    if (b->n + len > b->cap) {
        size_t cap = (b->n + len) * 2;
        char *p = (char *)realloc(b->p, cap);
        if (!p) return 1;
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, data, len);
    b->n += len;
    return 0;
}

/* The profiled graph (gpt2.c's profile_graph: three baseline steps through
 * the counting allocator) in place of the built one. */
static int profile_graph(pipe_rank *pr)
{
    rkm_profile_desc pd;
    gpt2_step prof;
    rkm_callbacks cb;
    rkm_graph *profiled = NULL;
    size_t bt = (size_t)pr->o.shape.B * (size_t)pr->o.shape.T;
    int32_t *tok = (int32_t *)malloc(2 * bt * sizeof(int32_t));
    rkm_result r = RKM_ERROR_NOMEM;
    memset(&pd, 0, sizeof pd);
    pd.runs = 3;
    if (tok && gpt2_step_init(&prof, &pr->gg, &pr->md, pr->o.dropout, pr->o.seed) == 0) {
        batch_at(pr, 0, tok, tok + bt);
        cb = gpt2_callbacks(&prof);
        if (gpt2_step_load(&prof, tok, tok + bt) == 0) r = rkm_graph_profile(pr->gg.g, &cb, &pd, &profiled);
        gpt2_step_unload(&prof);
        gpt2_step_free(&prof);
    }
    free(tok);
    gpt2_model_zero_grad(&pr->md);
    if (r != RKM_OK) {
        printf("gpt2_pipe: FAILED profile: %s\n", rkm_context_errmsg(pr->ctx));
        return 1;
    }
    rkm_graph_destroy(pr->gg.g);
    pr->gg.g = profiled;
    return 0;
}

#define PIPE_MAX_STAGES 64

/* What rank 0 broadcasts first. */
typedef struct plan_header {
    int32_t status; /* 0: planned; else every rank exits with it */
    uint64_t budget, base_arena;
    double sim_step;
    uint64_t text_len[PIPE_MAX_STAGES]; /* each stage's plan file */
} plan_header;

/* Rank 0: profile, plan, write each stage's plan. The texts go to *texts. */
static int plan_rank0(pipe_rank *pr, plan_header *h, rkm_op_costs *costs, membuf *texts)
{
    rkm_pipeline_desc pd;
    rkm_pipeline *pp = NULL;
    rkm_result r;
    int32_t nops = rkm_graph_num_ops(pr->gg.g);
    if (profile_graph(pr)) return 1;
    for (int32_t op = 0; op < nops; op++) {
        rkm_op_desc oi;
        rkm_graph_op_info(pr->gg.g, op, &oi);
        costs[op].fwd_seconds = oi.fwd_seconds, costs[op].bwd_seconds = oi.bwd_seconds;
        costs[op].fwd_ws = oi.fwd_ws, costs[op].bwd_ws = oi.bwd_ws;
    }
    if (rkm_parse_budget(pr->gg.g, pr->o.budget, 0, &h->budget) != RKM_OK) {
        printf("gpt2_pipe: FAILED bad --budget: %s\n", rkm_context_errmsg(pr->ctx));
        return 2;
    }
    rkm_graph_baseline_arena(pr->gg.g, 0, &h->base_arena);
    memset(&pd, 0, sizeof pd);
    pd.stages = pr->P;
    pd.micro_batches = pr->o.micro;
    pd.schedule = pr->o.schedule;
    pd.budget = h->budget;
    pd.link_bytes_per_second = pr->o.link_bw;
    pd.solve.algo = pr->o.algo_id;
    r = rkm_pipeline_plan(pr->gg.g, &pd, &pp);
    if (r != RKM_OK) {
        printf("gpt2_pipe: FAILED %s: %s\n", r == RKM_ERROR_BUDGET ? "no plan fits the budget" : "pipeline planning",
               rkm_context_errmsg(pr->ctx));
        return r == RKM_ERROR_BUDGET ? 3 : r == RKM_ERROR_ARGUMENT ? 2 : 1;
    }
    h->sim_step = rkm_pipeline_step_time(pp);
    for (int s = 0; s < pr->P && r == RKM_OK; s++) {
        const rkm_graph *sg;
        const rkm_plan *sp;
        size_t before = texts->n;
        r = rkm_pipeline_stage(pp, s, &pr->info[s], &sg, &sp);
        if (r == RKM_OK) r = rkm_plan_write(sp, membuf_write, texts);
        h->text_len[s] = texts->n - before;
        /* the cut: stage s's input is cut s - 1 (by name in the whole graph) */
        if (r == RKM_OK && s > 0) {
            rkm_tensor_info ti;
            for (int32_t t = 0; t < rkm_graph_num_tensors(sg); t++)
                if (rkm_graph_tensor_info(sg, t, &ti) == RKM_OK && (ti.flags & RKM_TENSOR_INPUT_GRAD))
                    pr->cuts[s - 1] = rkm_graph_find_tensor(pr->gg.g, ti.name);
        }
    }
    rkm_pipeline_destroy(pp);
    if (r != RKM_OK) {
        printf("gpt2_pipe: FAILED stage plans: %s\n", rkm_context_errmsg(pr->ctx));
        return 1;
    }
    return 0;
}

/* Every rank: the plan from rank 0, the graph with its op times, my stage
 * graph (the same cut) and my stage's plan read back. */
static int receive_plan(pipe_rank *pr)
{
    plan_header h;
    int32_t nops = rkm_graph_num_ops(pr->gg.g);
    rkm_op_costs *costs = (rkm_op_costs *)calloc((size_t)nops, sizeof *costs);
    membuf texts = {NULL, 0, 0};
    rkm_graph *g = NULL, *stages[PIPE_MAX_STAGES];
    size_t off = 0;
    int rc = 0;
    memset(&h, 0, sizeof h);
    if (!costs) die(pr, "out of memory");
    if (pr->rank == 0) {
        h.status = pr->P > PIPE_MAX_STAGES ? 2 : plan_rank0(pr, &h, costs, &texts);
        if (pr->P > PIPE_MAX_STAGES) printf("gpt2_pipe: FAILED at most %d stages\n", PIPE_MAX_STAGES);
    }
    {
        MPI_Request q;
        mpi_ok(pr, MPI_Ibcast(&h, (int)sizeof h, MPI_BYTE, 0, MPI_COMM_WORLD, &q), "MPI_Ibcast");
        idle_wait(pr, &q, "MPI_Ibcast");
    }
    if (h.status) {
        free(costs);
        free(texts.p);
        return h.status;
    }
    for (int s = 0; s < pr->P; s++) off += h.text_len[s];
    if (pr->rank != 0 && !(texts.p = (char *)malloc(off + 1))) die(pr, "out of memory");
    mpi_ok(pr, MPI_Bcast(costs, (int)((size_t)nops * sizeof *costs), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
    mpi_ok(pr, MPI_Bcast(pr->cuts, pr->P, MPI_INT32_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    mpi_ok(pr, MPI_Bcast(pr->info, (int)((size_t)pr->P * sizeof *pr->info), MPI_BYTE, 0, MPI_COMM_WORLD),
           "MPI_Bcast");
    mpi_ok(pr, MPI_Bcast(texts.p, (int)off, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
    pr->budget = h.budget, pr->base_arena = h.base_arena, pr->sim_step = h.sim_step;
    /* rank 0's profiled graph is replaced too: every rank runs the same graph */
    if (rkm_graph_with_costs(pr->gg.g, costs, &g) != RKM_OK) die(pr, rkm_context_errmsg(pr->ctx));
    rkm_graph_destroy(pr->gg.g);
    pr->gg.g = g;
    if (rkm_graph_cut(g, pr->cuts, pr->P - 1, stages) != RKM_OK) die(pr, rkm_context_errmsg(pr->ctx));
    for (int s = 0; s < pr->P; s++)
        if (s == pr->s) pr->sg = stages[s];
        else rkm_graph_destroy(stages[s]);
    off = 0;
    for (int s = 0; s < pr->s; s++) off += h.text_len[s];
    if (rkm_plan_read_string(pr->sg, texts.p + off, h.text_len[pr->s], "rank 0's stage plan", NULL, &pr->plan) !=
        RKM_OK)
        die(pr, rkm_context_errmsg(pr->ctx));
    free(costs);
    free(texts.p);
    return rc;
}

/* ---------------------------------------------------------------------------
 * My stage: ids, buffers, the region
 * ------------------------------------------------------------------------- */

/* The gradient ranges of the parameters stage s's ops use (whole ids
 * info[s].first_op..last_op), in order: what it reduces across replicas and
 * sends to rank 0. With wte on two stages, the first stage's sum of both
 * parts stands for it. */
static void stage_slices(const pipe_rank *pr, int s, slice *out, int *n, size_t *len)
{
    const gpt2_shape *sh = &pr->o.shape;
    const rkm_pipeline_stage_info *in = &pr->info[s];
    *n = 0, *len = 0;
    for (int32_t op = in->first_op; op <= in->last_op; op++) {
        const gpt2_opdef *d = &pr->gg.ops[op];
        int params[2] = {d->weight, d->bias};
        for (int k = 0; k < 2; k++) {
            slice sl;
            int dup = 0, i;
            if (params[k] < 0) continue;
            sl.off = (size_t)(gpt2__w(pr->md.g, sh, params[k], d->layer) - pr->md.grads);
            sl.len = gpt2_param_slice(sh, params[k]);
            if (pr->tied && s == pr->P - 1 && sl.off == pr->wte_off) continue;
            for (i = 0; i < *n; i++) dup |= out[i].off == sl.off;
            if (dup || *n == PIPE_MAX_SLICES) continue;
            for (i = (*n)++; i > 0 && out[i - 1].off > sl.off; i--) out[i] = out[i - 1];
            out[i] = sl;
            *len += sl.len;
        }
    }
}

static int stage_setup(pipe_rank *pr)
{
    const rkm_graph *wg = pr->gg.g;
    rkm_tensor_info ti;
    rkm_op_desc oi;
    size_t M = (size_t)pr->o.micro;
    pr->first = pr->s == 0;
    pr->last = pr->s == pr->P - 1;
    pr->nt = rkm_graph_num_tensors(pr->sg);
    pr->no = rkm_graph_num_ops(pr->sg);
    pr->t2w = (int32_t *)malloc((size_t)pr->nt * sizeof *pr->t2w);
    pr->o2w = (int32_t *)malloc((size_t)pr->no * sizeof *pr->o2w);
    if (!pr->t2w || !pr->o2w) die(pr, "out of memory");
    pr->in_w = -1;
    for (int32_t t = 0; t < pr->nt; t++) {
        rkm_graph_tensor_info(pr->sg, t, &ti);
        if ((pr->t2w[t] = rkm_graph_find_tensor(wg, ti.name)) < 0) die(pr, "a stage tensor not in the graph");
        if (ti.flags & RKM_TENSOR_INPUT_GRAD) pr->in_w = pr->t2w[t];
    }
    for (int32_t op = 0; op < pr->no; op++) {
        rkm_graph_op_info(pr->sg, op, &oi);
        if ((pr->o2w[op] = rkm_graph_find_op(wg, oi.name)) < 0) die(pr, "a stage op not in the graph");
    }
    pr->out_s = rkm_graph_loss(pr->sg);
    pr->out_w = pr->t2w[pr->out_s];
    if ((pr->in_w >= 0) == pr->first) die(pr, "the stage's input does not match its place in the pipeline");
    for (int32_t op = 0; op < pr->no; op++)
        if (pr->o2w[op] != pr->info[pr->s].first_op + op) die(pr, "the stage's ops are not the planned run of ops");
    pr->tied = pr->P > 1;
    pr->wte_off = (size_t)(pr->md.g[GPT2_WTE] - pr->md.grads);
    pr->wte_len = pr->md.sizes[GPT2_WTE];
    stage_slices(pr, pr->s, pr->own, &pr->nown, &pr->own_len);

    /* the stage's layout: a slot per micro-batch in flight */
    pr->nsteps = (int64_t)rkm_plan_num_steps(pr->plan);
    pr->phase_step = rkm_plan_phase_step(pr->plan);
    pr->nbuf = rkm_plan_num_buffers(pr->plan);
    pr->buf = (rkm_buffer *)malloc((pr->nbuf + 1) * sizeof *pr->buf);
    pr->bstart = (size_t *)calloc((size_t)pr->nsteps + 3, sizeof *pr->bstart);
    if (!pr->buf || !pr->bstart) die(pr, "out of memory");
    if (rkm_plan_stage_layout(pr->plan, pr->o.schedule, pr->s, pr->P, pr->o.micro, 0, pr->buf, &pr->mem) != RKM_OK)
        die(pr, rkm_context_errmsg(pr->ctx));
    /* buffers come in creation order: step by step, the inputs (step -1) first */
    for (size_t i = 1; i < pr->nbuf; i++)
        if (pr->buf[i].first_step < pr->buf[i - 1].first_step) die(pr, "the stage layout is not in creation order");
    for (size_t i = 0, at = 0; at < (size_t)pr->nsteps + 2; at++) {
        while (i < pr->nbuf && pr->buf[i].first_step < (int64_t)at - 1) i++;
        pr->bstart[at] = i;
    }
    pr->bstart[pr->nsteps + 2] = pr->nbuf;
    if (pr->mem.arena_bytes != pr->info[pr->s].arena_bytes || pr->mem.peak != pr->info[pr->s].peak)
        die(pr, "the stage layout differs from the planned stage");
    {
        uint64_t a = pr->mem.alignment ? pr->mem.alignment : 256, bytes = (pr->mem.arena_bytes + a - 1) / a * a;
        pr->region = (unsigned char *)aligned_alloc((size_t)a, (size_t)(bytes ? bytes : a));
    }
    pr->live_cap = (int)((size_t)(pr->mem.in_flight + 1) * pr->nbuf + 8);
    pr->live = calloc((size_t)pr->live_cap, sizeof *pr->live);
    pr->mst = (gpt2_step *)calloc(M, sizeof *pr->mst);
    pr->order = (rkm_pipe_phase *)malloc(2 * M * (size_t)pr->P * sizeof *pr->order);
    pr->losses = (double *)calloc(M * (size_t)pr->D, sizeof *pr->losses);
    pr->tmp = (float *)malloc(pr->md.num_params * sizeof(float));
    pr->packed = (float *)malloc(pr->md.num_params * sizeof(float));
    if (!pr->region || !pr->live || !pr->mst || !pr->order || !pr->losses || !pr->tmp || !pr->packed) die(pr, "out of memory");
    for (size_t m = 0; m < M; m++)
        if (gpt2_step_init(&pr->mst[m], &pr->gg, &pr->md, pr->o.dropout, pr->o.seed)) die(pr, "out of memory");

    /* the order of my phases: the simulator's */
    {
        rkm_pipe_stage *ps = (rkm_pipe_stage *)calloc((size_t)pr->P, sizeof *ps);
        double t;
        if (!ps) die(pr, "out of memory");
        for (int s = 0; s < pr->P; s++) ps[s].fwd = pr->info[s].fwd_seconds, ps[s].bwd = pr->info[s].bwd_seconds;
        if (rkm_pipeline_simulate(pr->ctx, ps, pr->P, pr->o.micro, pr->o.schedule, pr->order, NULL, &t) != RKM_OK)
            die(pr, rkm_context_errmsg(pr->ctx));
        memmove(pr->order, pr->order + (size_t)pr->s * 2 * M, 2 * M * sizeof *pr->order);
        free(ps);
    }
    return 0;
}

/* Where buffer b of micro-batch m lies in the region. */
static uint64_t dev_offset(const pipe_rank *pr, const rkm_buffer *b, int32_t m)
{
    uint64_t S = pr->mem.slot_bytes, k = (uint64_t)pr->mem.in_flight;
    return b->offset < S ? b->offset + ((uint64_t)m % k) * S : b->offset + (k - 1) * S;
}

/* The buffer of `kind` for stage id `index` that plan step `step` makes
 * (step -1: an input), in micro-batch m's place; counted as live, and
 * checked to share no byte with another live buffer (of any micro-batch).
 * NULL (with pr->err) if the layout has none of that size, or it would
 * overlap. */
static void *place(pipe_rank *pr, int kind, int32_t index, int64_t step, int32_t m, uint64_t bytes)
{
    for (size_t i = pr->bstart[step + 1]; i < pr->bstart[step + 2]; i++) {
        const rkm_buffer *b = &pr->buf[i];
        if (b->kind != kind || b->index != index) continue;
        uint64_t off = dev_offset(pr, b, m);
        if (b->bytes != bytes || off + bytes > pr->mem.arena_bytes) {
            cb_fail(pr, "a buffer's size or place disagrees with the stage layout", index);
            return NULL;
        }
        for (int j = 0; j < pr->nlive; j++)
            if (pr->live[j].lo < off + bytes && off < pr->live[j].hi) {
                cb_fail(pr, "a buffer overlaps another live one in the region", index);
                return NULL;
            }
        if (pr->nlive == pr->live_cap) {
            cb_fail(pr, "more live buffers than the stage's micro-batches can hold", index);
            return NULL;
        }
        pr->live[pr->nlive].lo = off, pr->live[pr->nlive].hi = off + bytes;
        pr->nlive++;
        pr->cur += bytes;
        if (pr->cur > pr->peak) pr->peak = pr->cur;
        return pr->region + off;
    }
    cb_fail(pr, "a buffer the stage layout does not have", index);
    return NULL;
}

/* Buffer p of `bytes` is released (NULL with 0 bytes: nothing). */
static void unplace(pipe_rank *pr, const void *p, uint64_t bytes)
{
    uint64_t lo = (uint64_t)((const unsigned char *)p - pr->region);
    if (!bytes) return;
    pr->cur -= bytes;
    for (int j = 0; j < pr->nlive; j++)
        if (pr->live[j].lo == lo && pr->live[j].hi == lo + bytes) {
            pr->live[j] = pr->live[--pr->nlive];
            return;
        }
    pr->clean = 0; /* released what was not placed */
}

static uint64_t wbytes(const pipe_rank *pr, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(pr->gg.g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

/* ---------------------------------------------------------------------------
 * The callbacks: stage ids to the whole graph's, buffers in the region, the
 * examples' kernels (gpt2_model.h)
 * ------------------------------------------------------------------------- */

#define PIPE_MAX_IDS 8

static int map_ids(const pipe_rank *pr, const int32_t *ids, int32_t n, int32_t *out)
{
    if (n < 0 || n > PIPE_MAX_IDS) return -1;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= pr->nt) return -1;
        out[i] = pr->t2w[ids[i]];
    }
    return 0;
}

static gpt2_step *micro_step(pipe_rank *pr, int32_t m)
{
    if (m != pr->micro) {
        cb_fail(pr, "a call for another micro-batch than the phase's", m);
        return NULL;
    }
    return &pr->mst[m];
}

static int pcb_forward(void *user, const rkm_fwd_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    int32_t in[PIPE_MAX_IDS], out[PIPE_MAX_IDS], op;
    const gpt2_opdef *d;
    float *ws = NULL;
    if (!st) return 1;
    if (pr->fail_armed && !pr->o.fail_mpi)
        return cb_fail(pr, "injected failure (--fail-rank, --fail-step)", pr->o2w[c->op]);
    if (c->op < 0 || c->op >= pr->no || c->n_out != 1 || map_ids(pr, c->in, c->n_in, in) ||
        map_ids(pr, c->out, c->n_out, out))
        return cb_fail(pr, "forward: ids out of range", c->op);
    op = pr->o2w[c->op];
    d = &pr->gg.ops[op];
    for (int i = 0; i < d->n_in; i++)
        if (!st->act[d->in[i]]) return cb_fail(pr, "forward: input not live", d->in[i]);
    if (c->out_new[0] == RKM_OUT_NEW) {
        if (st->act[d->out]) return cb_fail(pr, "forward: new output already live", d->out);
        if (!(st->act[d->out] = place(pr, RKM_BUFFER_TENSOR, c->out[0], c->step, c->micro, wbytes(pr, d->out))))
            return 1;
    } else if (c->out_new[0] == RKM_OUT_INPLACE) { /* in[0]'s buffer becomes out[0]'s */
        if (st->act[d->out] || !st->act[d->in[0]]) return cb_fail(pr, "forward: in place without its input", op);
        st->act[d->out] = st->act[d->in[0]];
        st->act[d->in[0]] = NULL;
    } else if (!st->act[d->out]) {
        return cb_fail(pr, "forward: output to recompute in place is not live", d->out);
    }
    if (c->save) {
        if (st->phantom[op]) return cb_fail(pr, "forward: saved state already live", op);
        if (!(st->phantom[op] = place(pr, RKM_BUFFER_PHANTOM, c->op, c->step, c->micro, c->phantom))) return 1;
    }
    if (c->ws_bytes && !(ws = (float *)place(pr, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes)))
        return 1;
    if (d->kind == GPT2_ATTENTION && !st->phantom[op] && c->ws_bytes < c->phantom)
        return cb_fail(pr, "forward: attention has nowhere to write its probabilities", op);
    gpt2__forward_kernel(st, d, op, c->save, ws);
    unplace(pr, ws, c->ws_bytes);
    return 0;
}

static int pcb_backward(void *user, const rkm_bwd_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    int32_t in[PIPE_MAX_IDS], out[PIPE_MAX_IDS], saved[PIPE_MAX_IDS], op;
    const gpt2_opdef *d;
    rkm_bwd_call w = *c;
    float *din[2] = {NULL, NULL}, *ws = NULL;
    if (!st) return 1;
    if (c->op < 0 || c->op >= pr->no || map_ids(pr, c->in, c->n_in, in) || map_ids(pr, c->out, c->n_out, out) ||
        map_ids(pr, c->saved, c->n_saved, saved))
        return cb_fail(pr, "backward: ids out of range", c->op);
    op = pr->o2w[c->op];
    d = &pr->gg.ops[op];
    w.op = op, w.in = in, w.out = out, w.saved = saved;
    if (!st->grad[d->out]) return cb_fail(pr, "backward: output gradient not live", d->out);
    for (int i = 0; i < c->n_saved; i++)
        if (!st->act[saved[i]]) return cb_fail(pr, "backward: saved tensor not live", saved[i]);
    if (c->phantom && !st->phantom[op]) return cb_fail(pr, "backward: saved state not live", op);
    for (int i = 0; i < d->n_in && i < c->n_in; i++) {
        int32_t t = d->in[i];
        if (c->in_grad[i] == RKM_GRAD_NEW) { /* the kernels add into it: zeroed */
            if (st->grad[t]) return cb_fail(pr, "backward: new gradient already live", t);
            if (!(st->grad[t] = (float *)place(pr, RKM_BUFFER_GRAD, c->in[i], c->step, c->micro, wbytes(pr, t))))
                return 1;
            memset(st->grad[t], 0, (size_t)wbytes(pr, t));
        } else if (c->in_grad[i] == RKM_GRAD_INPLACE) {
            if (st->grad[t]) return cb_fail(pr, "backward: in-place gradient already live", t);
            st->grad[t] = st->grad[d->out];
        } else if (c->in_grad[i] == RKM_GRAD_ACCUMULATE && !st->grad[t]) {
            return cb_fail(pr, "backward: gradient to accumulate into is not live", t);
        }
        if (c->in_grad[i] != RKM_GRAD_NONE) din[i] = st->grad[t];
    }
    if (c->ws_bytes) {
        if (!(ws = (float *)place(pr, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes))) return 1;
        memset(ws, 0, (size_t)c->ws_bytes);
    }
    gpt2__backward_kernel(st, d, &w, op, din, ws);
    if (c->n_in && c->in_grad[0] == RKM_GRAD_INPLACE) st->grad[d->out] = NULL; /* now grad(in[0]) */
    unplace(pr, ws, c->ws_bytes);
    return 0;
}

/* The `loss` step: the last stage seeds grad(loss) = 1/(B*T) and takes the
 * mean loss; another stage's grad(output) is where the next stage's
 * gradient was received (recv_grad, before this phase). */
static int pcb_loss(void *user, const rkm_buffer_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    float *g;
    if (!st) return 1;
    if (c->index != pr->out_s) return cb_fail(pr, "loss: not the stage's output", c->index);
    if (!st->act[pr->out_w] || st->grad[pr->out_w]) return cb_fail(pr, "loss: output not live or gradient live", c->index);
    if (!(g = (float *)place(pr, RKM_BUFFER_GRAD, c->index, c->step, c->micro, c->bytes))) return 1;
    st->grad[pr->out_w] = g;
    if (pr->last) {
        size_t n = (size_t)(c->bytes / sizeof(float));
        const float *losses = (const float *)st->act[pr->out_w];
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) {
            g[i] = 1.0f / (float)n;
            sum += losses[i];
        }
        st->loss = sum / (double)n;
    }
    return 0;
}

static int pcb_free_tensor(void *user, const rkm_buffer_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    int32_t t = c->index >= 0 && c->index < pr->nt ? pr->t2w[c->index] : -1;
    if (!st) return 1;
    if (t < 0 || !st->act[t]) return cb_fail(pr, "free: tensor not live", c->index);
    unplace(pr, st->act[t], c->bytes);
    st->act[t] = NULL;
    return 0;
}

static int pcb_free_saved(void *user, const rkm_buffer_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    int32_t op = c->index >= 0 && c->index < pr->no ? pr->o2w[c->index] : -1;
    if (!st) return 1;
    if (op < 0 || !st->phantom[op]) return cb_fail(pr, "free_saved: saved state not live", c->index);
    unplace(pr, st->phantom[op], c->bytes);
    st->phantom[op] = NULL;
    return 0;
}

static int pcb_free_grad(void *user, const rkm_buffer_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    int32_t t = c->index >= 0 && c->index < pr->nt ? pr->t2w[c->index] : -1;
    if (!st) return 1;
    if (t < 0 || !st->grad[t]) return cb_fail(pr, "free_grad: gradient not live", c->index);
    unplace(pr, st->grad[t], c->bytes);
    st->grad[t] = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Sends and receives
 * ------------------------------------------------------------------------- */

static int peer(const pipe_rank *pr, int d, int s) { return d * pr->P + s; }

/* Waits for the sends that read bytes of [lo, hi) of the region: before
 * those bytes are written again. */
static void wait_sends(pipe_rank *pr, uint64_t lo, uint64_t hi)
{
    int n = 0;
    for (int i = 0; i < pr->npend; i++) {
        if (pr->pend[i].lo < hi && lo < pr->pend[i].hi)
            mpi_ok(pr, MPI_Wait(&pr->pend[i].req, MPI_STATUS_IGNORE), "MPI_Wait (a send)");
        else
            pr->pend[n++] = pr->pend[i];
    }
    pr->npend = n;
}

static void isend(pipe_rank *pr, const void *p, uint64_t bytes, int dest, int tag)
{
    pending *q;
    if (pr->npend == (int)(sizeof pr->pend / sizeof pr->pend[0])) wait_sends(pr, 0, UINT64_MAX);
    q = &pr->pend[pr->npend];
    q->lo = (uint64_t)((const unsigned char *)p - pr->region);
    q->hi = q->lo + bytes;
    mpi_ok(pr, MPI_Isend(p, (int)bytes, MPI_BYTE, dest, tag, MPI_COMM_WORLD, &q->req), "MPI_Isend");
    pr->npend++;
}

/* Into the region at p: posted once the bytes are free, then waited for. */
static void recv_into(pipe_rank *pr, void *p, uint64_t bytes, int src, int tag)
{
    MPI_Request req;
    uint64_t lo = (uint64_t)((unsigned char *)p - pr->region);
    double t0 = now_seconds();
    wait_sends(pr, lo, lo + bytes);
    mpi_ok(pr, MPI_Irecv(p, (int)bytes, MPI_BYTE, src, tag, MPI_COMM_WORLD, &req), "MPI_Irecv");
    mpi_ok(pr, MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (a receive)");
    pr->recv_s += now_seconds() - t0;
}

/* ---------------------------------------------------------------------------
 * The phases
 * ------------------------------------------------------------------------- */

/* The region's bytes a phase of micro-batch m may write: its slot and the
 * transient region above the slots. */
static void phase_ranges(const pipe_rank *pr, int32_t m, uint64_t r[4])
{
    uint64_t S = pr->mem.slot_bytes, k = (uint64_t)pr->mem.in_flight;
    r[0] = ((uint64_t)m % k) * S, r[1] = r[0] + S;
    r[2] = k * S, r[3] = pr->mem.arena_bytes;
}

static void run_phase(pipe_rank *pr, int bwd, int32_t m)
{
    char what[sizeof pr->err + 200];
    rkm_result r;
    double t0 = now_seconds();
    pr->bwd = bwd;
    pr->err[0] = 0;
    r = rkm_plan_execute_phase(pr->plan, bwd, m, &pr->cb);
    if (r != RKM_OK) {
        snprintf(what, sizeof what, "%s [rockmate: %s]", pr->err[0] ? pr->err : "the plan failed",
                 rkm_context_errmsg(pr->ctx));
        die(pr, what);
    }
    t0 = now_seconds() - t0;
    if (pr->step > 1 || pr->o.steps == 1) {
        *(bwd ? &pr->bwd_s : &pr->fwd_s) += t0;
        (*(bwd ? &pr->nbwd : &pr->nfwd))++;
    }
}

/* Forward phase of micro-batch m: its inputs (the previous stage's output
 * received, the batch's tokens or targets), the plan's phase, its output
 * sent on. */
static void forward(pipe_rank *pr, int32_t m)
{
    gpt2_step *st = &pr->mst[m];
    uint64_t r[4], q = micro_id(pr, pr->step, pr->d, m);
    int32_t ins[3] = {pr->in_w, pr->first ? pr->gg.tokens : -1, pr->last ? pr->gg.targets : -1};
    pr->micro = m, pr->bwd = 0;
    phase_ranges(pr, m, r);
    wait_sends(pr, r[0], r[1]);
    wait_sends(pr, r[2], r[3]);
    st->key = q + 1;
    st->loss = NAN;
    st->err[0] = 0;
    for (int i = 0; i < 3; i++) {
        int32_t t = ins[i], ts = -1;
        if (t < 0) continue;
        for (int32_t k = 0; k < pr->nt; k++)
            if (pr->t2w[k] == t) ts = k;
        if (ts < 0 || !(st->act[t] = place(pr, RKM_BUFFER_TENSOR, ts, -1, m, wbytes(pr, t)))) die(pr, pr->err);
    }
    if (pr->in_w >= 0)
        recv_into(pr, st->act[pr->in_w], wbytes(pr, pr->in_w), peer(pr, pr->d, pr->s - 1), tag_of(TAG_ACT, m));
    if (pr->first) batch_at(pr, q, (int32_t *)st->act[pr->gg.tokens], NULL);
    if (pr->last) batch_at(pr, q, NULL, (int32_t *)st->act[pr->gg.targets]);
    pr->fail_armed = pr->rank == pr->o.fail_rank && pr->step == pr->o.fail_step && m == pr->o.fail_micro;
    if (pr->fail_armed && pr->o.fail_mpi) /* a send to a rank that does not exist: MPI's error */
        mpi_ok(pr, MPI_Send(pr->region, 1, MPI_BYTE, pr->size + 7, 0, MPI_COMM_WORLD), "MPI_Send (--fail-kind mpi)");
    run_phase(pr, 0, m);
    pr->fail_armed = 0;
    if (!pr->last) {
        if (!st->act[pr->out_w]) die(pr, "the output is not live at the end of the forward phase");
        isend(pr, st->act[pr->out_w], wbytes(pr, pr->out_w), peer(pr, pr->d, pr->s + 1), tag_of(TAG_ACT, m));
    }
}

/* The grad(output) buffer the `loss` step makes for micro-batch m. */
static void *loss_grad_buffer(const pipe_rank *pr, int32_t m)
{
    int64_t st = pr->phase_step;
    for (size_t i = pr->bstart[st + 1]; i < pr->bstart[st + 2]; i++)
        if (pr->buf[i].kind == RKM_BUFFER_GRAD && pr->buf[i].index == pr->out_s)
            return pr->region + dev_offset(pr, &pr->buf[i], m);
    return NULL;
}

/* Backward phase of micro-batch m: the output's gradient received (the
 * last stage seeds its own), the plan's phase, the input's gradient sent
 * back; then only the inputs and that gradient were left, and go. */
static void backward(pipe_rank *pr, int32_t m)
{
    gpt2_step *st = &pr->mst[m];
    uint64_t r[4];
    pr->micro = m, pr->bwd = 1;
    phase_ranges(pr, m, r);
    wait_sends(pr, r[0], r[1]); /* the output sent from m's slot, among others */
    wait_sends(pr, r[2], r[3]);
    if (!pr->last) {
        void *g = loss_grad_buffer(pr, m);
        if (!g) die(pr, "the stage layout has no buffer for the output's gradient");
        recv_into(pr, g, wbytes(pr, pr->out_w), peer(pr, pr->d, pr->s + 1), tag_of(TAG_GRAD, m));
    }
    run_phase(pr, 1, m);
    if (pr->last) pr->losses[m] = st->loss;
    /* what the plan leaves: the inputs and the gradient to send back */
    for (int32_t t = 0; t < rkm_graph_num_tensors(pr->gg.g); t++) {
        int input = t == pr->in_w || (pr->first && t == pr->gg.tokens) || (pr->last && t == pr->gg.targets);
        if (!st->act[t] != !input || !st->grad[t] != (t != pr->in_w)) pr->clean = 0;
    }
    for (int32_t op = 0; op < rkm_graph_num_ops(pr->gg.g); op++)
        if (st->phantom[op]) pr->clean = 0;
    if (pr->in_w >= 0) {
        if (!st->grad[pr->in_w]) die(pr, "the input's gradient is not live at the end of the backward phase");
        isend(pr, st->grad[pr->in_w], wbytes(pr, pr->in_w), peer(pr, pr->d, pr->s - 1), tag_of(TAG_GRAD, m));
        unplace(pr, st->grad[pr->in_w], wbytes(pr, pr->in_w));
        unplace(pr, st->act[pr->in_w], wbytes(pr, pr->in_w));
        st->grad[pr->in_w] = NULL;
        st->act[pr->in_w] = NULL;
    }
    if (pr->first) unplace(pr, st->act[pr->gg.tokens], wbytes(pr, pr->gg.tokens)), st->act[pr->gg.tokens] = NULL;
    if (pr->last) unplace(pr, st->act[pr->gg.targets], wbytes(pr, pr->gg.targets)), st->act[pr->gg.targets] = NULL;
}

/* ---------------------------------------------------------------------------
 * After the phases: the gradients summed (wte's two parts, the replicas),
 * gathered to rank 0 with the losses, and the update
 * ------------------------------------------------------------------------- */

static void pack(const slice *sl, int n, const float *g, float *p)
{
    for (int i = 0; i < n; p += sl[i].len, i++) memcpy(p, g + sl[i].off, sl[i].len * sizeof(float));
}

static void unpack(const slice *sl, int n, const float *p, float *g)
{
    for (int i = 0; i < n; p += sl[i].len, i++) memcpy(g + sl[i].off, p, sl[i].len * sizeof(float));
}

static void send_floats(pipe_rank *pr, const float *p, size_t n, int dest, int tag)
{
    mpi_ok(pr, MPI_Send(p, (int)n, MPI_FLOAT, dest, tag, MPI_COMM_WORLD), "MPI_Send");
}

static void recv_floats(pipe_rank *pr, float *p, size_t n, int src, int tag)
{
    mpi_ok(pr, MPI_Recv(p, (int)n, MPI_FLOAT, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
}

/* The step's gradient sums, in a fixed order: wte = first stage's part +
 * last stage's part (per replica); then, per stage, replica 0's + replica
 * 1's + ... on replica 0, sent back to every replica; wte's sum back to the
 * last stage. Rank 0 gets every gradient (into grads_out) and every loss. */
static void reduce_step(pipe_rank *pr, float *grads_out)
{
    float *g = pr->md.grads;
    size_t M = (size_t)pr->o.micro;
    pr->micro = -1;
    if (pr->tied && pr->last) send_floats(pr, g + pr->wte_off, pr->wte_len, peer(pr, pr->d, 0), TAG_TIED);
    if (pr->tied && pr->first) {
        recv_floats(pr, pr->tmp, pr->wte_len, peer(pr, pr->d, pr->P - 1), TAG_TIED);
        for (size_t i = 0; i < pr->wte_len; i++) g[pr->wte_off + i] = g[pr->wte_off + i] + pr->tmp[i];
    }
    pack(pr->own, pr->nown, g, pr->packed);
    if (pr->D > 1) {
        if (pr->d == 0) {
            for (int e = 1; e < pr->D; e++) {
                recv_floats(pr, pr->tmp, pr->own_len, peer(pr, e, pr->s), TAG_DP);
                for (size_t i = 0; i < pr->own_len; i++) pr->packed[i] += pr->tmp[i];
            }
            for (int e = 1; e < pr->D; e++) send_floats(pr, pr->packed, pr->own_len, peer(pr, e, pr->s), TAG_DP);
        } else {
            send_floats(pr, pr->packed, pr->own_len, peer(pr, 0, pr->s), TAG_DP);
            recv_floats(pr, pr->packed, pr->own_len, peer(pr, 0, pr->s), TAG_DP);
        }
        unpack(pr->own, pr->nown, pr->packed, g);
    }
    if (pr->tied && pr->first) send_floats(pr, g + pr->wte_off, pr->wte_len, peer(pr, pr->d, pr->P - 1), TAG_TIED);
    if (pr->tied && pr->last) recv_floats(pr, g + pr->wte_off, pr->wte_len, peer(pr, pr->d, 0), TAG_TIED);
    /* to rank 0: replica 0's gradients, every replica's losses */
    if (pr->d == 0 && pr->rank != 0) send_floats(pr, pr->packed, pr->own_len, 0, TAG_GATHER);
    if (pr->last && pr->rank != 0)
        mpi_ok(pr, MPI_Send(pr->losses, (int)M, MPI_DOUBLE, 0, TAG_LOSS, MPI_COMM_WORLD), "MPI_Send");
    if (pr->rank == 0) {
        slice sl[PIPE_MAX_SLICES];
        int n;
        size_t len;
        unpack(pr->own, pr->nown, pr->packed, grads_out);
        for (int s = 1; s < pr->P; s++) {
            stage_slices(pr, s, sl, &n, &len);
            recv_floats(pr, pr->tmp, len, s, TAG_GATHER);
            unpack(sl, n, pr->tmp, grads_out);
        }
        for (int d = 0; d < pr->D; d++) {
            int src = peer(pr, d, pr->P - 1);
            if (src == 0)
                memcpy(pr->hist_loss + (size_t)(pr->step - 1) * M * (size_t)pr->D, pr->losses, M * sizeof(double));
            else
                mpi_ok(pr, MPI_Recv(pr->hist_loss + ((size_t)(pr->step - 1) * (size_t)pr->D + (size_t)d) * M, (int)M,
                                    MPI_DOUBLE, src, TAG_LOSS, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                       "MPI_Recv");
        }
    }
}

/* FNV-1a over n bytes. */
static uint64_t digest_add(uint64_t d, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) d = (d ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return d;
}

/* ---------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------- */

static void train_step(pipe_rank *pr)
{
    size_t M = (size_t)pr->o.micro;
    double t0, busy, slowest = 0.0;
    mpi_ok(pr, MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    t0 = now_seconds();
    gpt2_model_zero_grad(&pr->md);
    pr->cur = 0, pr->peak = 0;
    for (size_t i = 0; i < 2 * M; i++)
        if (pr->order[i].bwd) backward(pr, pr->order[i].micro);
        else forward(pr, pr->order[i].micro);
    wait_sends(pr, 0, UINT64_MAX);
    busy = now_seconds() - t0;
    if (pr->cur != 0 || pr->nlive != 0) pr->clean = 0;
    if (pr->peak != pr->mem.peak) pr->peaks_equal = 0;
    if (pr->peak > pr->max_peak) pr->max_peak = pr->peak;
    reduce_step(pr, pr->hist_grad ? pr->hist_grad + (size_t)(pr->step - 1) * pr->md.num_params : NULL);
    mpi_ok(pr, MPI_Reduce(&busy, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD), "MPI_Reduce");
    if (pr->step > 1 || pr->o.steps == 1) pr->busy_s += busy, pr->nsteps_timed++;
    if (pr->rank == 0) {
        const double *l = pr->hist_loss + (size_t)(pr->step - 1) * M * (size_t)pr->D;
        double mean = 0.0;
        for (size_t i = 0; i < M * (size_t)pr->D; i++) mean += l[i];
        pr->step_wall[pr->step - 1] = slowest;
        printf("step %d/%d: loss %.6f (mean of %d micro-batches), %.1f ms (the slowest rank, from the barrier to "
               "its last phase's end)\n",
               pr->step, pr->o.steps, mean / (double)(M * (size_t)pr->D), (int)(M * (size_t)pr->D), slowest * 1e3);
    }
    gpt2_model_update(&pr->md, pr->o.lr, 0.0f, pr->step);
}

/* ---------------------------------------------------------------------------
 * The reference (rank 0): the whole graph's baseline plan, one micro-batch
 * at a time, adding into one gradient buffer per replica in micro-batch
 * order; lm_head's part of wte into its own buffer, added to the encoder's
 * after the replica's micro-batches; the replicas summed in order.
 * ------------------------------------------------------------------------- */

typedef struct ref_host {
    gpt2_step st;
    float *head_wte; /* lm_head's part of wte's gradient (the pipeline's last stage's) */
    int tied;
} ref_host;

static int ref_backward(void *user, const rkm_bwd_call *c)
{
    ref_host *rh = (ref_host *)user;
    const gpt2_opdef *d = &rh->st.gg->ops[c->op];
    float *keep = rh->st.model->g[GPT2_WTE];
    int rc;
    if (!(rh->tied && d->kind == GPT2_MATMUL && d->weight == GPT2_WTE)) return gpt2_cb_backward(&rh->st, c);
    rh->st.model->g[GPT2_WTE] = rh->head_wte;
    rc = gpt2_cb_backward(&rh->st, c);
    rh->st.model->g[GPT2_WTE] = keep;
    return rc;
}

static int ref_wrap_forward(void *u, const rkm_fwd_call *c) { return gpt2_cb_forward(&((ref_host *)u)->st, c); }
static int ref_wrap_loss(void *u, const rkm_buffer_call *c) { return gpt2_cb_loss(&((ref_host *)u)->st, c); }
static int ref_wrap_free_tensor(void *u, const rkm_buffer_call *c) { return gpt2_cb_free_tensor(&((ref_host *)u)->st, c); }
static int ref_wrap_free_saved(void *u, const rkm_buffer_call *c) { return gpt2_cb_free_saved(&((ref_host *)u)->st, c); }
static int ref_wrap_free_grad(void *u, const rkm_buffer_call *c) { return gpt2_cb_free_grad(&((ref_host *)u)->st, c); }

/* 0 when every step's losses and gradients are the pipeline's, bit for
 * bit; *digest: the reference's digest. */
static int reference(pipe_rank *pr, uint64_t *digest, int *first_bad)
{
    gpt2_model md;
    ref_host rh;
    rkm_plan *base = NULL;
    rkm_callbacks cb;
    size_t M = (size_t)pr->o.micro, bt = (size_t)pr->o.shape.B * (size_t)pr->o.shape.T, np;
    int32_t *tok = (int32_t *)malloc(2 * bt * sizeof(int32_t));
    float *final = NULL;
    double *loss = (double *)malloc(M * (size_t)pr->D * sizeof(double));
    int bad = 0;
    memset(&rh, 0, sizeof rh);
    *first_bad = 0;
    *digest = 0xcbf29ce484222325ull;
    if (gpt2_model_init(&md, &pr->o.shape, pr->o.seed) || !tok || !loss ||
        gpt2_step_init(&rh.st, &pr->gg, &md, pr->o.dropout, pr->o.seed) || rkm_plan_baseline(pr->gg.g, &base) != RKM_OK)
        die(pr, "reference: out of memory");
    np = md.num_params;
    rh.tied = pr->tied;
    rh.head_wte = (float *)calloc(md.sizes[GPT2_WTE], sizeof(float));
    final = (float *)malloc(np * sizeof(float));
    if (!rh.head_wte || !final) die(pr, "reference: out of memory");
    memset(&cb, 0, sizeof cb);
    cb.user = &rh;
    cb.forward = ref_wrap_forward, cb.backward = ref_backward, cb.loss = ref_wrap_loss;
    cb.free_tensor = ref_wrap_free_tensor, cb.free_saved = ref_wrap_free_saved, cb.free_grad = ref_wrap_free_grad;
    for (int t = 1; t <= pr->o.steps; t++) {
        for (int d = 0; d < pr->D; d++) {
            gpt2_model_zero_grad(&md);
            memset(rh.head_wte, 0, md.sizes[GPT2_WTE] * sizeof(float));
            for (size_t m = 0; m < M; m++) {
                uint64_t q = micro_id(pr, t, d, (int)m);
                batch_at(pr, q, tok, tok + bt);
                if (gpt2_step_load(&rh.st, tok, tok + bt)) die(pr, "reference: out of memory");
                rh.st.key = q + 1;
                rh.st.err[0] = 0;
                if (rkm_plan_execute(base, &cb) != RKM_OK || gpt2_step_leaks(&rh.st) != 0) {
                    char what[400];
                    snprintf(what, sizeof what, "reference step %d: %s [%s]", t, rh.st.err,
                             rkm_context_errmsg(pr->ctx));
                    die(pr, what);
                }
                loss[(size_t)d * M + m] = rh.st.loss;
            }
            if (rh.tied)
                for (size_t i = 0; i < md.sizes[GPT2_WTE]; i++) md.g[GPT2_WTE][i] = md.g[GPT2_WTE][i] + rh.head_wte[i];
            if (d == 0) memcpy(final, md.grads, np * sizeof(float));
            else
                for (size_t i = 0; i < np; i++) final[i] += md.grads[i];
        }
        *digest = digest_add(*digest, loss, M * (size_t)pr->D * sizeof(double));
        *digest = digest_add(*digest, final, np * sizeof(float));
        if (!bad && (memcmp(loss, pr->hist_loss + (size_t)(t - 1) * M * (size_t)pr->D, M * (size_t)pr->D * sizeof(double)) ||
                     memcmp(final, pr->hist_grad + (size_t)(t - 1) * np, np * sizeof(float)))) {
            bad = 1;
            *first_bad = t;
        }
        memcpy(md.grads, final, np * sizeof(float));
        gpt2_model_update(&md, pr->o.lr, 0.0f, t);
    }
    gpt2_step_unload(&rh.st);
    gpt2_step_free(&rh.st);
    rkm_plan_destroy(base);
    gpt2_model_free(&md);
    free(rh.head_wte);
    free(final);
    free(loss);
    free(tok);
    return bad;
}

/* ---------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------- */

static double pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

static void print_plan(const pipe_rank *pr)
{
    rkm_graph_stats gs;
    rkm_graph_stats_get(pr->gg.g, &gs);
    printf("gpt2_pipe: L=%d C=%d NH=%d V=%d T=%d, micro-batches of B=%d rows, dropout=%g, %zu parameters; %s\n",
           pr->o.shape.L, pr->o.shape.C, pr->o.shape.NH, pr->o.shape.V, pr->o.shape.T, pr->o.shape.B,
           (double)pr->o.dropout, pr->md.num_params, pr->o.data);
    printf("pipeline: P=%d stages x D=%d replicas = %d ranks, M=%d micro-batches a step per replica, %s; graph: %d "
           "ops, %d blocks, profiled on rank 0\n",
           pr->P, pr->D, pr->size, pr->o.micro, pr->o.schedule == RKM_PIPE_GPIPE ? "GPipe" : "1F1B",
           (int)rkm_graph_num_ops(pr->gg.g), (int)gs.blocks);
    printf("budget: %llu bytes per device (%.1f%% of the whole graph's baseline arena, %llu bytes)\n",
           (unsigned long long)pr->budget, pct(pr->budget, pr->base_arena), (unsigned long long)pr->base_arena);
    for (int s = 0; s < pr->P; s++) {
        const rkm_pipeline_stage_info *in = &pr->info[s];
        rkm_op_desc a, b;
        rkm_graph_op_info(pr->gg.g, in->first_op, &a);
        rkm_graph_op_info(pr->gg.g, in->last_op, &b);
        printf("stage %d: ops %s..%s (%d blocks); k=%d in flight, overhead %.2f%%, kept %llu bytes a micro-batch, "
               "predicted peak %llu, arena %llu bytes (%.1f%% of the budget)\n",
               s, a.name, b.name, (int)in->n_blocks, (int)in->in_flight, in->overhead * 100.0,
               (unsigned long long)in->kept_bytes, (unsigned long long)in->peak, (unsigned long long)in->arena_bytes,
               pct(in->arena_bytes, in->budget));
    }
    printf("simulated step: %.2f ms (rkm_pipeline_plan's replay of the stage plans' phase times%s)\n",
           pr->sim_step * 1e3, pr->o.link_bw > 0 ? " and the links" : ", free links");
}

static int finish(pipe_rank *pr)
{
    rank_report me, *all = NULL;
    int ok = 1, peaks_ok = 1, regions_ok = 1;
    memset(&me, 0, sizeof me);
    me.fwd_ms = pr->nfwd ? pr->fwd_s / pr->nfwd * 1e3 : 0.0;
    me.bwd_ms = pr->nbwd ? pr->bwd_s / pr->nbwd * 1e3 : 0.0;
    me.recv_ms = pr->nsteps_timed ? pr->recv_s / pr->o.steps * 1e3 : 0.0;
    me.busy_ms = pr->nsteps_timed ? pr->busy_s / pr->nsteps_timed * 1e3 : 0.0;
    me.peak = pr->max_peak, me.predicted = pr->mem.peak;
    me.region = pr->mem.arena_bytes, me.budget = pr->budget;
    me.peaks_equal = pr->peaks_equal, me.clean = pr->clean;
    if (pr->rank == 0 && !(all = (rank_report *)calloc((size_t)pr->size, sizeof *all))) die(pr, "out of memory");
    mpi_ok(pr, MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD),
           "MPI_Gather");
    if (pr->rank != 0) return 0;
    {
        uint64_t digest = 0xcbf29ce484222325ull, ref_digest = 0;
        size_t M = (size_t)pr->o.micro, np = pr->md.num_params;
        rkm_pipe_stage *ps = (rkm_pipe_stage *)calloc((size_t)pr->P, sizeof *ps);
        double replay = 0.0, wall = 0.0;
        int timed = 0, first_bad = 0, same = -1;
        if (!ps) die(pr, "out of memory");
        for (int r = 0; r < pr->size; r++) {
            const rank_report *a = &all[r];
            int s = r % pr->P;
            printf("rank %d (stage %d, replica %d): measured peak %llu bytes, predicted %llu: %s; region %llu bytes "
                   "(the stage arena), %s the budget; phases measured fwd %.3f ms bwd %.3f ms, predicted fwd %.3f "
                   "bwd %.3f; waited in receives %.2f ms a step\n",
                   r, s, r / pr->P, (unsigned long long)a->peak, (unsigned long long)a->predicted,
                   a->peaks_equal ? "equal" : "DIFFERENT", (unsigned long long)a->region,
                   a->region <= a->budget ? "within" : "OVER", a->fwd_ms, a->bwd_ms, pr->info[s].fwd_seconds * 1e3,
                   pr->info[s].bwd_seconds * 1e3, a->recv_ms);
            peaks_ok &= a->peaks_equal && a->peak == a->predicted;
            regions_ok &= a->region <= a->budget;
            ok &= a->clean;
            if (!a->clean) printf("rank %d: buffers left live after a micro-batch or a step\n", r);
            if (r < pr->P) ps[s].fwd = a->fwd_ms * 1e-3, ps[s].bwd = a->bwd_ms * 1e-3;
        }
        rkm_pipeline_simulate(pr->ctx, ps, pr->P, pr->o.micro, pr->o.schedule, NULL, NULL, &replay);
        free(ps);
        for (int t = (pr->o.steps > 1 ? 2 : 1); t <= pr->o.steps; t++, timed++) wall += pr->step_wall[t - 1];
        printf("step time: measured %.2f ms (mean of %d steps, the slowest rank), simulated %.2f ms; the simulator "
               "replaying the measured phase times: %.2f ms (%d ranks share %ld cores here: phases run slower than "
               "profiled and ranks wait for the CPU)\n",
               wall / timed * 1e3, timed, pr->sim_step * 1e3, replay * 1e3, pr->size, sysconf(_SC_NPROCESSORS_ONLN));
        for (int t = 1; t <= pr->o.steps; t++) {
            digest = digest_add(digest, pr->hist_loss + (size_t)(t - 1) * M * (size_t)pr->D,
                                M * (size_t)pr->D * sizeof(double));
            digest = digest_add(digest, pr->hist_grad + (size_t)(t - 1) * np, np * sizeof(float));
        }
        printf("digest: %016llx (every step's %d micro-batch losses and summed parameter gradients)\n",
               (unsigned long long)digest, (int)(M * (size_t)pr->D));
        if (pr->o.check) {
            same = reference(pr, &ref_digest, &first_bad) == 0;
            printf("reference: %016llx (the single-process trainer: the whole graph, the same %d x %d micro-batches "
                   "in the same order, wte's two parts and the replicas summed as the pipeline sums them)%s\n",
                   (unsigned long long)ref_digest, pr->D, pr->o.micro, same ? ": bit-identical" : ": DIFFERENT");
            if (!same) printf("reference: step %d differs\n", first_bad);
            ok &= same;
        }
        ok &= peaks_ok && regions_ok;
        printf("gpt2_pipe: %s stages=%d dp=%d micro=%d schedule=%s digest=%016llx grads=%s peaks=%s regions=%s\n",
               ok ? "ok" : "FAILED", pr->P, pr->D, pr->o.micro, pr->o.schedule == RKM_PIPE_GPIPE ? "gpipe" : "1f1b",
               (unsigned long long)digest, same < 0 ? "unchecked" : same ? "bit-identical" : "DIFFERENT",
               peaks_ok ? "equal" : "DIFFERENT", regions_ok ? "within-budget" : "OVER-budget");
    }
    free(all);
    return ok ? 0 : 1;
}

static void teardown(pipe_rank *pr)
{
    for (int m = 0; pr->mst && m < pr->o.micro; m++) gpt2_step_free(&pr->mst[m]);
    free(pr->mst);
    free(pr->region);
    free(pr->live);
    free(pr->buf);
    free(pr->bstart);
    free(pr->order);
    free(pr->losses);
    free(pr->tmp);
    free(pr->packed);
    free(pr->hist_loss);
    free(pr->hist_grad);
    free(pr->step_wall);
    free(pr->t2w);
    free(pr->o2w);
    free(pr->cuts);
    free(pr->info);
    free(pr->text);
    rkm_plan_destroy(pr->plan);
    rkm_graph_destroy(pr->sg);
    gpt2_model_free(&pr->md);
    if (pr->gg.g) gpt2_graph_free(&pr->gg);
    rkm_context_destroy(pr->ctx);
}

int main(int argc, char **argv)
{
    pipe_rank pr;
    int rc;
    memset(&pr, 0, sizeof pr);
    setvbuf(stdout, NULL, _IOLBF, 0);
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &pr.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &pr.size);
    pr.micro = -1, pr.peaks_equal = 1, pr.clean = 1;
    if (rkm_context_create(NULL, &pr.ctx) != RKM_OK) die(&pr, "context: out of memory");
    rc = parse_args(&pr, argc, argv);
    if (!rc && pr.o.fail_rank >= 0) /* the failure test checks that every one of them ends */
        printf("gpt2_pipe: rank %d is process %ld\n", pr.rank, (long)getpid());
    if (!rc) {
        pr.s = pr.rank % pr.P, pr.d = pr.rank / pr.P;
        if (gpt2_graph_build(pr.ctx, &pr.o.shape, &pr.gg) != RKM_OK) die(&pr, rkm_context_errmsg(pr.ctx));
        if (gpt2_model_init(&pr.md, &pr.o.shape, pr.o.seed)) die(&pr, "out of memory");
        if (text_load(&pr)) {
            if (pr.rank == 0)
                printf("gpt2_pipe: FAILED cannot read %s (or it is shorter than one micro-batch); run from the "
                       "repository root or pass --data\n", pr.o.data);
            rc = 1;
        }
    }
    if (!rc) {
        pr.cuts = (int32_t *)calloc((size_t)pr.P, sizeof *pr.cuts);
        pr.info = (rkm_pipeline_stage_info *)calloc((size_t)pr.P, sizeof *pr.info);
        if (!pr.cuts || !pr.info) die(&pr, "out of memory");
        rc = receive_plan(&pr);
    }
    if (!rc) {
        stage_setup(&pr);
        pr.cb.user = &pr;
        pr.cb.forward = pcb_forward, pr.cb.backward = pcb_backward, pr.cb.loss = pcb_loss;
        pr.cb.free_tensor = pcb_free_tensor, pr.cb.free_saved = pcb_free_saved, pr.cb.free_grad = pcb_free_grad;
        if (pr.rank == 0) {
            size_t n = (size_t)pr.o.steps * (size_t)pr.o.micro * (size_t)pr.D;
            pr.hist_loss = (double *)calloc(n, sizeof(double));
            pr.hist_grad = (float *)calloc((size_t)pr.o.steps * pr.md.num_params, sizeof(float));
            pr.step_wall = (double *)calloc((size_t)pr.o.steps, sizeof(double));
            if (!pr.hist_loss || !pr.hist_grad || !pr.step_wall) die(&pr, "out of memory");
            print_plan(&pr);
        }
        for (pr.step = 1; pr.step <= pr.o.steps; pr.step++) train_step(&pr);
        pr.step = pr.o.steps;
        rc = finish(&pr);
        {
            MPI_Request q; /* the others wait without spinning while rank 0 runs the reference */
            mpi_ok(&pr, MPI_Ibarrier(MPI_COMM_WORLD, &q), "MPI_Ibarrier");
            idle_wait(&pr, &q, "MPI_Ibarrier");
        }
    }
    teardown(&pr);
    MPI_Finalize();
    return rc;
}
