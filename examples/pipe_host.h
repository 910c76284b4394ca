/* pipe_host.h -- the host side of a GPT-2 pipeline stage over MPI, one copy
 * for examples/gpt2_pipe.c (the CPU trainer) and examples/gpt2_cuda_pipe.cuh
 * (gpt2_cuda.cu's stage mode): the plan broadcast (rank 0 plans, every rank
 * rebuilds and cuts the graph and reads its stage's plan), the stage's ids
 * and layout, where micro-batch m's buffers lie in the region and the checks
 * on them, the gradient sums in a fixed order (wte's two parts, the --dp
 * replicas), the digest and the report's shared lines. gpt2_pipe.c's header
 * tells the design.
 *
 * Device-independent: the region is the caller's (host or device memory),
 * only offsets into it are computed and its bytes are never read here; the
 * gradient sums work on the host model's gradients. Plain C11 that also
 * compiles as C++ (nvcc, the dummy device's g++): explicit casts, no
 * designated initializers or compound literals. */
#ifndef ROCKMATE_EXAMPLES_PIPE_HOST_H
#define ROCKMATE_EXAMPLES_PIPE_HOST_H

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt2_model.h"
#include "args.h"

#define PIPE_MAX_STAGES 64
#define PIPE_MAX_IDS 8
#define PIPE_MAX_SLICES (4 * GPT2_NUM_PARAMS + 8)
#define PIPE_DIGEST_INIT 0xcbf29ce484222325ull /* FNV-1a's offset basis */

/* Message tags: a kind and the micro-batch. */
enum { PIPE_TAG_ACT, PIPE_TAG_GRAD, PIPE_TAG_TIED, PIPE_TAG_DP, PIPE_TAG_GATHER, PIPE_TAG_LOSS, PIPE_TAG_KINDS };
static inline int pipe_tag(int kind, int micro) { return micro * PIPE_TAG_KINDS + kind; }

/* The options both trainers take. */
typedef struct pipe_options {
    gpt2_shape shape;
    int steps, micro, dp, check;
    const char *budget;
    rkm_algo algo;
    rkm_pipe_schedule schedule;
    float dropout, lr;
    double link_bw; /* bytes per second of a link between stages; 0: free links */
} pipe_options;

/* One parameter range of the gradient array: [off, off + len). */
typedef struct pipe_slice {
    size_t off, len;
} pipe_slice;

/* Bytes [lo, hi) of the region. */
typedef struct pipe_range {
    uint64_t lo, hi;
} pipe_range;

typedef struct pipe_host {
    const char *prog; /* the messages' first word */
    pipe_options o;
    int rank, size, P, D, s, d; /* world rank, size; stages, replicas; my stage and replica */
    rkm_context *ctx;
    gpt2_graph *gg;  /* the whole graph (its g: rank 0's costs once the plan is received) */
    gpt2_model *md;  /* the host model: its gradients are what reduce_step sums */
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
    unsigned char *region; /* the caller's: host or device memory of mem.arena_bytes */
    rkm_pipe_phase *order; /* my 2M phases in the simulator's order */
    uint64_t cur, peak, max_peak; /* bytes live now (the contract's count), the step's peak, every step's */
    pipe_range *live;             /* the live buffers' bytes in the region */
    int nlive, live_cap, peaks_equal, clean;
    pipe_slice own[PIPE_MAX_SLICES]; /* the gradient ranges this rank reduces (wte: the first stage's) */
    int nown;
    size_t own_len, wte_off, wte_len;
    int tied; /* wte used on two stages: the first and the last */
    float *tmp, *packed;
    double *losses;     /* M: my micro-batches' losses (last stage) */
    double *hist_loss;  /* rank 0: every step's D x M losses */
    float *hist_grad;   /* rank 0: every step's summed gradients */
    /* the step in progress */
    int step, micro, bwd;
    char err[256];
} pipe_host;

static inline double pipe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------
 * Failure: one line, then every rank stops
 * ------------------------------------------------------------------------- */

/* Never returns: the line names where this rank was, and MPI_Abort makes
 * mpirun end every rank (those blocked in a receive included). */
static inline void pipe_die(pipe_host *h, const char *what)
{
    char where[64] = "outside the phases";
    if (h->micro >= 0)
        snprintf(where, sizeof where, "micro-batch %d, %s phase", h->micro, h->bwd ? "backward" : "forward");
    fflush(stdout);
    fprintf(stderr, "%s: FAILED on rank %d (stage %d of %d, replica %d), step %d, %s: %s; aborting every rank\n",
            h->prog, h->rank, h->s, h->P, h->d, h->step, where, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* An MPI call's status: its error string, then die. */
static inline void pipe_mpi(pipe_host *h, int rc, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING], line[MPI_MAX_ERROR_STRING + 96];
    int len = 0;
    if (rc == MPI_SUCCESS) return;
    MPI_Error_string(rc, msg, &len);
    snprintf(line, sizeof line, "%s: %.*s", call, len, msg);
    pipe_die(h, line);
}

/* A callback's failure: the message for the phase's line, and 1. */
static inline int pipe_cb_fail(pipe_host *h, const char *what, int32_t id)
{
    snprintf(h->err, sizeof h->err, "%s (id %d)", what, (int)id);
    return 1;
}

/* A phase that failed (rkm_plan_execute_phase's result r): die. */
static inline void pipe_phase_failed(pipe_host *h)
{
    char what[sizeof h->err + 200];
    snprintf(what, sizeof what, "%s [rockmate: %s]", h->err[0] ? h->err : "the plan failed",
             rkm_context_errmsg(h->ctx));
    pipe_die(h, what);
}

/* Waits for request q without spinning: a rank that waits while rank 0
 * profiles the op times or runs the reference alone must not take the
 * CPU from it (busy-polling ranks made the profiled times several times
 * too long on 2 cores). Open MPI progresses in MPI_Test. */
static inline void pipe_idle_wait(pipe_host *h, MPI_Request *q, const char *call)
{
    struct timespec nap = {0, 2000000};
    int done = 0;
    for (;;) {
        pipe_mpi(h, MPI_Test(q, &done, MPI_STATUS_IGNORE), call);
        if (done) return;
        nanosleep(&nap, NULL);
    }
}

/* MPI started, this rank's place, a context: the start of both mains. */
static inline void pipe_start(pipe_host *h, const char *prog, int *argc, char ***argv)
{
    h->prog = prog;
    setvbuf(stdout, NULL, _IOLBF, 0);
    MPI_Init(argc, argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &h->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &h->size);
    h->micro = -1, h->peaks_equal = 1, h->clean = 1;
    if (rkm_context_create(NULL, &h->ctx) != RKM_OK) pipe_die(h, "context: out of memory");
}

/* The end of both runs: the others wait without spinning while rank 0 runs
 * the reference. */
static inline void pipe_idle_barrier(pipe_host *h)
{
    MPI_Request q;
    pipe_mpi(h, MPI_Ibarrier(MPI_COMM_WORLD, &q), "MPI_Ibarrier");
    pipe_idle_wait(h, &q, "MPI_Ibarrier");
}

/* ---------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------- */

/* The whole-number option a names, or NULL. */
static inline int *pipe_int_option(pipe_options *o, const char *a)
{
    return !strcmp(a, "--layers") ? &o->shape.L : !strcmp(a, "--channels") ? &o->shape.C
         : !strcmp(a, "--heads") ? &o->shape.NH : !strcmp(a, "--seq") ? &o->shape.T
         : !strcmp(a, "--batch") ? &o->shape.B : !strcmp(a, "--steps") ? &o->steps
         : !strcmp(a, "--micro-batches") ? &o->micro : !strcmp(a, "--dp") ? &o->dp
         : !strcmp(a, "--check") ? &o->check : NULL;
}

/* The other options both take, with their value v: 1 taken, 0 not one of
 * them (or not a value it takes: the caller's "unknown option"), -1 a bad
 * value (*why says why). */
static inline int pipe_value_option(pipe_options *o, const char *a, const char *v, const char **why)
{
    double x;
    if (!strcmp(a, "--budget")) {
        o->budget = v;
    } else if (!strcmp(a, "--dropout") || !strcmp(a, "--lr")) {
        if (!arg_double(v, &x)) return *why = "--dropout, --lr: a decimal number", -1;
        *(a[2] == 'd' ? &o->dropout : &o->lr) = (float)x;
    } else if (!strcmp(a, "--schedule") && (!strcmp(v, "1f1b") || !strcmp(v, "gpipe"))) {
        o->schedule = !strcmp(v, "gpipe") ? RKM_PIPE_GPIPE : RKM_PIPE_1F1B;
    } else if (!strcmp(a, "--inplace") && (!strcmp(v, "0") || !strcmp(v, "1"))) {
        o->shape.inplace = !strcmp(v, "1");
    } else {
        return 0;
    }
    return 1;
}

/* After the options: NULL and P, D set, or why the configuration is refused
 * (stages: --stages, 0 for any). */
static inline const char *pipe_options_check(pipe_host *h, int stages)
{
    const pipe_options *o = &h->o;
    if (!gpt2_shape_ok(&o->shape) || o->steps < 1 || o->micro < 1 || o->dp < 1 ||
        !(o->dropout >= 0.0f && o->dropout < 1.0f))
        return "bad configuration (heads must divide channels, 0 <= dropout < 1, steps, "
               "micro-batches and dp at least 1)";
    if (h->size % o->dp || (stages && stages * o->dp != h->size))
        return "the number of ranks must be stages x dp (mpirun -np)";
    h->D = o->dp;
    h->P = h->size / o->dp;
    return NULL;
}

/* Micro-batch m of replica d at step t (from 1): its number in the run,
 * which keys its dropout masks and picks its rows. */
static inline uint64_t pipe_micro_id(const pipe_host *h, int t, int d, int m)
{
    return ((uint64_t)(t - 1) * (uint64_t)h->D + (uint64_t)d) * (uint64_t)h->o.micro + (uint64_t)m;
}

static inline int pipe_peer(const pipe_host *h, int d, int s) { return d * h->P + s; }

/* ---------------------------------------------------------------------------
 * Planning (rank 0) and what every rank receives of it
 * ------------------------------------------------------------------------- */

typedef struct pipe_membuf {
    char *p;
    size_t n, cap;
} pipe_membuf;

static inline int pipe_membuf_write(void *user, const char *data, size_t len)
{
    pipe_membuf *b = (pipe_membuf *)user;
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

/* What rank 0 broadcasts first. */
typedef struct pipe_plan_header {
    int32_t status; /* 0: planned; else every rank exits with it */
    uint64_t budget, base_arena;
    double sim_step;
    uint64_t text_len[PIPE_MAX_STAGES]; /* each stage's plan file */
} pipe_plan_header;

/* Rank 0, the graph profiled: plan, write each stage's plan. The op costs
 * go to costs, the texts to *texts. */
static inline int pipe_plan_rank0(pipe_host *h, pipe_plan_header *hd, rkm_op_costs *costs, pipe_membuf *texts)
{
    rkm_graph *wg = h->gg->g;
    rkm_pipeline_desc pd;
    rkm_pipeline *pp = NULL;
    rkm_result r;
    int32_t nops = rkm_graph_num_ops(wg);
    for (int32_t op = 0; op < nops; op++) {
        rkm_op_desc oi;
        rkm_graph_op_info(wg, op, &oi);
        costs[op].fwd_seconds = oi.fwd_seconds, costs[op].bwd_seconds = oi.bwd_seconds;
        costs[op].fwd_ws = oi.fwd_ws, costs[op].bwd_ws = oi.bwd_ws;
    }
    if (rkm_parse_budget(wg, h->o.budget, 0, &hd->budget) != RKM_OK) {
        printf("%s: FAILED bad --budget: %s\n", h->prog, rkm_context_errmsg(h->ctx));
        return 2;
    }
    rkm_graph_baseline_arena(wg, 0, &hd->base_arena);
    memset(&pd, 0, sizeof pd);
    pd.stages = h->P;
    pd.micro_batches = h->o.micro;
    pd.schedule = h->o.schedule;
    pd.budget = hd->budget;
    pd.link_bytes_per_second = h->o.link_bw;
    pd.solve.algo = h->o.algo;
    r = rkm_pipeline_plan(wg, &pd, &pp);
    if (r != RKM_OK) {
        printf("%s: FAILED %s: %s\n", h->prog, r == RKM_ERROR_BUDGET ? "no plan fits the budget" : "pipeline planning",
               rkm_context_errmsg(h->ctx));
        return r == RKM_ERROR_BUDGET ? 3 : r == RKM_ERROR_ARGUMENT ? 2 : 1;
    }
    hd->sim_step = rkm_pipeline_step_time(pp);
    for (int s = 0; s < h->P && r == RKM_OK; s++) {
        const rkm_graph *sg;
        const rkm_plan *sp;
        size_t before = texts->n;
        r = rkm_pipeline_stage(pp, s, &h->info[s], &sg, &sp);
        if (r == RKM_OK) r = rkm_plan_write(sp, pipe_membuf_write, texts);
        hd->text_len[s] = texts->n - before;
        /* the cut: stage s's input is cut s - 1 (by name in the whole graph) */
        if (r == RKM_OK && s > 0) {
            rkm_tensor_info ti;
            for (int32_t t = 0; t < rkm_graph_num_tensors(sg); t++)
                if (rkm_graph_tensor_info(sg, t, &ti) == RKM_OK && (ti.flags & RKM_TENSOR_INPUT_GRAD))
                    h->cuts[s - 1] = rkm_graph_find_tensor(wg, ti.name);
        }
    }
    rkm_pipeline_destroy(pp);
    if (r != RKM_OK) {
        printf("%s: FAILED stage plans: %s\n", h->prog, rkm_context_errmsg(h->ctx));
        return 1;
    }
    return 0;
}

/* Every rank: the plan from rank 0, the graph with its op times, my stage
 * graph (the same cut) and my stage's plan read back. Rank 0 first runs
 * profile(user) (0, or the status every rank exits with), which leaves the
 * measured op costs in h->gg->g, then plans. */
static inline int pipe_receive_plan(pipe_host *h, int (*profile)(void *user), void *user)
{
    pipe_plan_header hd;
    int32_t nops = rkm_graph_num_ops(h->gg->g);
    rkm_op_costs *costs = (rkm_op_costs *)calloc((size_t)nops, sizeof *costs);
    pipe_membuf texts = {NULL, 0, 0};
    rkm_graph *g = NULL, *stages[PIPE_MAX_STAGES];
    size_t off = 0;
    memset(&hd, 0, sizeof hd);
    if (!costs) pipe_die(h, "out of memory");
    h->cuts = (int32_t *)calloc((size_t)h->P, sizeof *h->cuts);
    h->info = (rkm_pipeline_stage_info *)calloc((size_t)h->P, sizeof *h->info);
    if (!h->cuts || !h->info) pipe_die(h, "out of memory");
    if (h->rank == 0) {
        hd.status = profile(user);
        if (!hd.status) hd.status = pipe_plan_rank0(h, &hd, costs, &texts);
    }
    {
        MPI_Request q;
        pipe_mpi(h, MPI_Ibcast(&hd, (int)sizeof hd, MPI_BYTE, 0, MPI_COMM_WORLD, &q), "MPI_Ibcast");
        pipe_idle_wait(h, &q, "MPI_Ibcast");
    }
    if (hd.status) {
        free(costs);
        free(texts.p);
        return hd.status;
    }
    for (int s = 0; s < h->P; s++) off += hd.text_len[s];
    if (h->rank != 0 && !(texts.p = (char *)malloc(off + 1))) pipe_die(h, "out of memory");
    pipe_mpi(h, MPI_Bcast(costs, (int)((size_t)nops * sizeof *costs), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
    pipe_mpi(h, MPI_Bcast(h->cuts, h->P, MPI_INT32_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    pipe_mpi(h, MPI_Bcast(h->info, (int)((size_t)h->P * sizeof *h->info), MPI_BYTE, 0, MPI_COMM_WORLD),
             "MPI_Bcast");
    pipe_mpi(h, MPI_Bcast(texts.p, (int)off, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
    h->budget = hd.budget, h->base_arena = hd.base_arena, h->sim_step = hd.sim_step;
    /* rank 0's profiled graph is replaced too: every rank runs the same graph */
    if (rkm_graph_with_costs(h->gg->g, costs, &g) != RKM_OK) pipe_die(h, rkm_context_errmsg(h->ctx));
    rkm_graph_destroy(h->gg->g);
    h->gg->g = g;
    if (rkm_graph_cut(g, h->cuts, h->P - 1, stages) != RKM_OK) pipe_die(h, rkm_context_errmsg(h->ctx));
    for (int s = 0; s < h->P; s++)
        if (s == h->s) h->sg = stages[s];
        else rkm_graph_destroy(stages[s]);
    off = 0;
    for (int s = 0; s < h->s; s++) off += hd.text_len[s];
    if (rkm_plan_read_string(h->sg, texts.p + off, hd.text_len[h->s], "rank 0's stage plan", NULL, &h->plan) !=
        RKM_OK)
        pipe_die(h, rkm_context_errmsg(h->ctx));
    free(costs);
    free(texts.p);
    return 0;
}

/* ---------------------------------------------------------------------------
 * My stage: ids, the layout, the phases' order
 * ------------------------------------------------------------------------- */

static inline uint64_t pipe_wbytes(const pipe_host *h, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(h->gg->g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

/* The gradient ranges of the parameters stage s's ops use (whole ids
 * info[s].first_op..last_op), in order: what it reduces across replicas and
 * sends to rank 0. With wte on two stages, the first stage's sum of both
 * parts stands for it. */
static inline void pipe_stage_slices(const pipe_host *h, int s, pipe_slice *out, int *n, size_t *len)
{
    const gpt2_shape *sh = &h->o.shape;
    const rkm_pipeline_stage_info *in = &h->info[s];
    *n = 0, *len = 0;
    for (int32_t op = in->first_op; op <= in->last_op; op++) {
        const gpt2_opdef *d = &h->gg->ops[op];
        int params[2] = {d->weight, d->bias};
        for (int k = 0; k < 2; k++) {
            pipe_slice sl;
            int dup = 0, i;
            if (params[k] < 0) continue;
            sl.off = (size_t)(gpt2__w(h->md->g, sh, params[k], d->layer) - h->md->grads);
            sl.len = gpt2_param_slice(sh, params[k]);
            if (h->tied && s == h->P - 1 && sl.off == h->wte_off) continue;
            for (i = 0; i < *n; i++) dup |= out[i].off == sl.off;
            if (dup || *n == PIPE_MAX_SLICES) continue;
            for (i = (*n)++; i > 0 && out[i - 1].off > sl.off; i--) out[i] = out[i - 1];
            out[i] = sl;
            *len += sl.len;
        }
    }
}

/* My stage's ids (stage to whole), its slices, its layout (a slot per
 * micro-batch in flight: h->mem), the host buffers of the step and the
 * order of my phases. The region is the caller's to allocate, of
 * h->mem.arena_bytes at h->mem.alignment. */
static inline void pipe_stage_setup(pipe_host *h)
{
    const rkm_graph *wg = h->gg->g;
    rkm_tensor_info ti;
    rkm_op_desc oi;
    size_t M = (size_t)h->o.micro;
    h->first = h->s == 0;
    h->last = h->s == h->P - 1;
    h->nt = rkm_graph_num_tensors(h->sg);
    h->no = rkm_graph_num_ops(h->sg);
    h->t2w = (int32_t *)malloc((size_t)h->nt * sizeof *h->t2w);
    h->o2w = (int32_t *)malloc((size_t)h->no * sizeof *h->o2w);
    if (!h->t2w || !h->o2w) pipe_die(h, "out of memory");
    h->in_w = -1;
    for (int32_t t = 0; t < h->nt; t++) {
        rkm_graph_tensor_info(h->sg, t, &ti);
        if ((h->t2w[t] = rkm_graph_find_tensor(wg, ti.name)) < 0) pipe_die(h, "a stage tensor not in the graph");
        if (ti.flags & RKM_TENSOR_INPUT_GRAD) h->in_w = h->t2w[t];
    }
    for (int32_t op = 0; op < h->no; op++) {
        rkm_graph_op_info(h->sg, op, &oi);
        if ((h->o2w[op] = rkm_graph_find_op(wg, oi.name)) < 0) pipe_die(h, "a stage op not in the graph");
    }
    h->out_s = rkm_graph_loss(h->sg);
    h->out_w = h->t2w[h->out_s];
    if ((h->in_w >= 0) == h->first) pipe_die(h, "the stage's input does not match its place in the pipeline");
    for (int32_t op = 0; op < h->no; op++)
        if (h->o2w[op] != h->info[h->s].first_op + op) pipe_die(h, "the stage's ops are not the planned run of ops");
    h->tied = h->P > 1;
    h->wte_off = (size_t)(h->md->g[GPT2_WTE] - h->md->grads);
    h->wte_len = h->md->sizes[GPT2_WTE];
    pipe_stage_slices(h, h->s, h->own, &h->nown, &h->own_len);

    /* the stage's layout: a slot per micro-batch in flight */
    h->nsteps = (int64_t)rkm_plan_num_steps(h->plan);
    h->phase_step = rkm_plan_phase_step(h->plan);
    h->nbuf = rkm_plan_num_buffers(h->plan);
    h->buf = (rkm_buffer *)malloc((h->nbuf + 1) * sizeof *h->buf);
    h->bstart = (size_t *)calloc((size_t)h->nsteps + 3, sizeof *h->bstart);
    if (!h->buf || !h->bstart) pipe_die(h, "out of memory");
    if (rkm_plan_stage_layout(h->plan, h->o.schedule, h->s, h->P, h->o.micro, 0, h->buf, &h->mem) != RKM_OK)
        pipe_die(h, rkm_context_errmsg(h->ctx));
    /* buffers come in creation order: step by step, the inputs (step -1) first */
    for (size_t i = 1; i < h->nbuf; i++)
        if (h->buf[i].first_step < h->buf[i - 1].first_step) pipe_die(h, "the stage layout is not in creation order");
    for (size_t i = 0, at = 0; at < (size_t)h->nsteps + 2; at++) {
        while (i < h->nbuf && h->buf[i].first_step < (int64_t)at - 1) i++;
        h->bstart[at] = i;
    }
    h->bstart[h->nsteps + 2] = h->nbuf;
    if (h->mem.arena_bytes != h->info[h->s].arena_bytes || h->mem.peak != h->info[h->s].peak)
        pipe_die(h, "the stage layout differs from the planned stage");
    h->live_cap = (int)((size_t)(h->mem.in_flight + 1) * h->nbuf + 8);
    h->live = (pipe_range *)calloc((size_t)h->live_cap, sizeof *h->live);
    h->order = (rkm_pipe_phase *)malloc(2 * M * (size_t)h->P * sizeof *h->order);
    h->losses = (double *)calloc(M, sizeof *h->losses);
    h->tmp = (float *)malloc(h->md->num_params * sizeof(float));
    h->packed = (float *)malloc(h->md->num_params * sizeof(float));
    if (!h->live || !h->order || !h->losses || !h->tmp || !h->packed) pipe_die(h, "out of memory");

    /* the order of my phases: the simulator's */
    {
        rkm_pipe_stage *ps = (rkm_pipe_stage *)calloc((size_t)h->P, sizeof *ps);
        double t;
        if (!ps) pipe_die(h, "out of memory");
        for (int s = 0; s < h->P; s++) ps[s].fwd = h->info[s].fwd_seconds, ps[s].bwd = h->info[s].bwd_seconds;
        if (rkm_pipeline_simulate(h->ctx, ps, h->P, h->o.micro, h->o.schedule, h->order, NULL, &t) != RKM_OK)
            pipe_die(h, rkm_context_errmsg(h->ctx));
        memmove(h->order, h->order + (size_t)h->s * 2 * M, 2 * M * sizeof *h->order);
        free(ps);
    }
}

/* Rank 0's history of every step's losses and gradients, for the
 * reference and the digest. */
static inline void pipe_history_alloc(pipe_host *h)
{
    h->hist_loss = (double *)calloc((size_t)h->o.steps * (size_t)h->o.micro * (size_t)h->D, sizeof(double));
    h->hist_grad = (float *)calloc((size_t)h->o.steps * h->md->num_params, sizeof(float));
    if (!h->hist_loss || !h->hist_grad) pipe_die(h, "out of memory");
}

static inline void pipe_host_free(pipe_host *h)
{
    free(h->live), free(h->buf), free(h->bstart), free(h->order), free(h->losses), free(h->tmp);
    free(h->packed), free(h->hist_loss), free(h->hist_grad), free(h->t2w), free(h->o2w), free(h->cuts);
    free(h->info);
    rkm_plan_destroy(h->plan);
    rkm_graph_destroy(h->sg);
}

/* ---------------------------------------------------------------------------
 * Buffers in the region: the layout's offsets, counted and checked
 * ------------------------------------------------------------------------- */

/* Where buffer b of micro-batch m lies in the region. */
static inline uint64_t pipe_offset(const pipe_host *h, const rkm_buffer *b, int32_t m)
{
    uint64_t S = h->mem.slot_bytes, k = (uint64_t)h->mem.in_flight;
    return b->offset < S ? b->offset + ((uint64_t)m % k) * S : b->offset + (k - 1) * S;
}

/* The buffer of `kind` for stage id `index` that plan step `step` makes
 * (step -1: an input), in micro-batch m's place; counted as live, and
 * checked to share no byte with another live buffer (of any micro-batch).
 * NULL (with h->err) if the layout has none of that size, or it would
 * overlap. */
static inline void *pipe_place(pipe_host *h, int kind, int32_t index, int64_t step, int32_t m, uint64_t bytes)
{
    for (size_t i = h->bstart[step + 1]; i < h->bstart[step + 2]; i++) {
        const rkm_buffer *b = &h->buf[i];
        if (b->kind != kind || b->index != index) continue;
        uint64_t off = pipe_offset(h, b, m);
        if (b->bytes != bytes || off + bytes > h->mem.arena_bytes) {
            pipe_cb_fail(h, "a buffer's size or place disagrees with the stage layout", index);
            return NULL;
        }
        for (int j = 0; j < h->nlive; j++)
            if (h->live[j].lo < off + bytes && off < h->live[j].hi) {
                pipe_cb_fail(h, "a buffer overlaps another live one in the region", index);
                return NULL;
            }
        if (h->nlive == h->live_cap) {
            pipe_cb_fail(h, "more live buffers than the stage's micro-batches can hold", index);
            return NULL;
        }
        h->live[h->nlive].lo = off, h->live[h->nlive].hi = off + bytes;
        h->nlive++;
        h->cur += bytes;
        if (h->cur > h->peak) h->peak = h->cur;
        return h->region + off;
    }
    pipe_cb_fail(h, "a buffer the stage layout does not have", index);
    return NULL;
}

/* Buffer p of `bytes` is released (NULL with 0 bytes: nothing). */
static inline void pipe_unplace(pipe_host *h, const void *p, uint64_t bytes)
{
    uint64_t lo = (uint64_t)((const unsigned char *)p - h->region);
    if (!bytes) return;
    h->cur -= bytes;
    for (int j = 0; j < h->nlive; j++)
        if (h->live[j].lo == lo && h->live[j].hi == lo + bytes) {
            h->live[j] = h->live[--h->nlive];
            return;
        }
    h->clean = 0; /* released what was not placed */
}

/* The inputs of micro-batch m's forward phase placed, act[] (per whole
 * tensor) pointing at them: the previous stage's output, the tokens (first
 * stage), the targets (last stage). */
static inline void pipe_place_inputs(pipe_host *h, void **act, int32_t m)
{
    int32_t ins[3] = {h->in_w, h->first ? h->gg->tokens : -1, h->last ? h->gg->targets : -1};
    for (int i = 0; i < 3; i++) {
        int32_t t = ins[i], ts = -1;
        if (t < 0) continue;
        for (int32_t k = 0; k < h->nt; k++)
            if (h->t2w[k] == t) ts = k;
        if (ts < 0 || !(act[t] = pipe_place(h, RKM_BUFFER_TENSOR, ts, -1, m, pipe_wbytes(h, t)))) pipe_die(h, h->err);
    }
}

/* The grad(output) buffer the `loss` step makes for micro-batch m. */
static inline void *pipe_loss_grad_buffer(const pipe_host *h, int32_t m)
{
    int64_t st = h->phase_step;
    for (size_t i = h->bstart[st + 1]; i < h->bstart[st + 2]; i++)
        if (h->buf[i].kind == RKM_BUFFER_GRAD && h->buf[i].index == h->out_s)
            return h->region + pipe_offset(h, &h->buf[i], m);
    return NULL;
}

/* Stage ids to the whole graph's (at most PIPE_MAX_IDS); -1 if out of range. */
static inline int pipe_map_ids(const pipe_host *h, const int32_t *ids, int32_t n, int32_t *out)
{
    if (n < 0 || n > PIPE_MAX_IDS) return -1;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= h->nt) return -1;
        out[i] = h->t2w[ids[i]];
    }
    return 0;
}

/* A callback's micro-batch must be the phase's: m, or -1 (with h->err). */
static inline int32_t pipe_check_micro(pipe_host *h, int32_t m)
{
    if (m != h->micro) return pipe_cb_fail(h, "a call for another micro-batch than the phase's", m), -1;
    return m;
}

/* After a step's phases: nothing left live, the peak the prediction. */
static inline void pipe_step_checks(pipe_host *h)
{
    if (h->cur != 0 || h->nlive != 0) h->clean = 0;
    if (h->peak != h->mem.peak) h->peaks_equal = 0;
    if (h->peak > h->max_peak) h->max_peak = h->peak;
}

/* ---------------------------------------------------------------------------
 * After the phases: the gradients summed (wte's two parts, the replicas),
 * gathered to rank 0 with the losses
 * ------------------------------------------------------------------------- */

static inline void pipe_pack(const pipe_slice *sl, int n, const float *g, float *p)
{
    for (int i = 0; i < n; p += sl[i].len, i++) memcpy(p, g + sl[i].off, sl[i].len * sizeof(float));
}

static inline void pipe_unpack(const pipe_slice *sl, int n, const float *p, float *g)
{
    for (int i = 0; i < n; p += sl[i].len, i++) memcpy(g + sl[i].off, p, sl[i].len * sizeof(float));
}

static inline void pipe_send_floats(pipe_host *h, const float *p, size_t n, int dest, int tag)
{
    pipe_mpi(h, MPI_Send(p, (int)n, MPI_FLOAT, dest, tag, MPI_COMM_WORLD), "MPI_Send");
}

static inline void pipe_recv_floats(pipe_host *h, float *p, size_t n, int src, int tag)
{
    pipe_mpi(h, MPI_Recv(p, (int)n, MPI_FLOAT, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
}

/* The step's gradient sums over the host model's gradients, in a fixed
 * order: wte = first stage's part + last stage's part (per replica); then,
 * per stage, replica 0's + replica 1's + ... on replica 0, sent back to
 * every replica; wte's sum back to the last stage. Rank 0 gets every
 * gradient (into grads_out) and every loss (into the step's hist_loss). */
static inline void pipe_reduce_step(pipe_host *h, float *grads_out)
{
    float *g = h->md->grads;
    size_t M = (size_t)h->o.micro;
    h->micro = -1;
    if (h->tied && h->last) pipe_send_floats(h, g + h->wte_off, h->wte_len, pipe_peer(h, h->d, 0), PIPE_TAG_TIED);
    if (h->tied && h->first) {
        pipe_recv_floats(h, h->tmp, h->wte_len, pipe_peer(h, h->d, h->P - 1), PIPE_TAG_TIED);
        for (size_t i = 0; i < h->wte_len; i++) g[h->wte_off + i] = g[h->wte_off + i] + h->tmp[i];
    }
    pipe_pack(h->own, h->nown, g, h->packed);
    if (h->D > 1) {
        if (h->d == 0) {
            for (int e = 1; e < h->D; e++) {
                pipe_recv_floats(h, h->tmp, h->own_len, pipe_peer(h, e, h->s), PIPE_TAG_DP);
                for (size_t i = 0; i < h->own_len; i++) h->packed[i] += h->tmp[i];
            }
            for (int e = 1; e < h->D; e++) pipe_send_floats(h, h->packed, h->own_len, pipe_peer(h, e, h->s), PIPE_TAG_DP);
        } else {
            pipe_send_floats(h, h->packed, h->own_len, pipe_peer(h, 0, h->s), PIPE_TAG_DP);
            pipe_recv_floats(h, h->packed, h->own_len, pipe_peer(h, 0, h->s), PIPE_TAG_DP);
        }
        pipe_unpack(h->own, h->nown, h->packed, g);
    }
    if (h->tied && h->first) pipe_send_floats(h, g + h->wte_off, h->wte_len, pipe_peer(h, h->d, h->P - 1), PIPE_TAG_TIED);
    if (h->tied && h->last) pipe_recv_floats(h, g + h->wte_off, h->wte_len, pipe_peer(h, h->d, 0), PIPE_TAG_TIED);
    /* to rank 0: replica 0's gradients, every replica's losses */
    if (h->d == 0 && h->rank != 0) pipe_send_floats(h, h->packed, h->own_len, 0, PIPE_TAG_GATHER);
    if (h->last && h->rank != 0)
        pipe_mpi(h, MPI_Send(h->losses, (int)M, MPI_DOUBLE, 0, PIPE_TAG_LOSS, MPI_COMM_WORLD), "MPI_Send");
    if (h->rank == 0) {
        pipe_slice sl[PIPE_MAX_SLICES];
        int n;
        size_t len;
        pipe_unpack(h->own, h->nown, h->packed, grads_out);
        for (int s = 1; s < h->P; s++) {
            pipe_stage_slices(h, s, sl, &n, &len);
            pipe_recv_floats(h, h->tmp, len, s, PIPE_TAG_GATHER);
            pipe_unpack(sl, n, h->tmp, grads_out);
        }
        for (int d = 0; d < h->D; d++) {
            int src = pipe_peer(h, d, h->P - 1);
            double *dst = h->hist_loss + ((size_t)(h->step - 1) * (size_t)h->D + (size_t)d) * M;
            if (src == 0) memcpy(dst, h->losses, M * sizeof(double));
            else
                pipe_mpi(h, MPI_Recv(dst, (int)M, MPI_DOUBLE, src, PIPE_TAG_LOSS, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                         "MPI_Recv");
        }
    }
}

/* Rank 0: the mean of the step's D x M losses. */
static inline double pipe_step_loss(const pipe_host *h)
{
    size_t n = (size_t)h->o.micro * (size_t)h->D;
    const double *l = h->hist_loss + (size_t)(h->step - 1) * n;
    double mean = 0.0;
    for (size_t i = 0; i < n; i++) mean += l[i];
    return mean / (double)n;
}

/* ---------------------------------------------------------------------------
 * The digest and the reference's comparison
 * ------------------------------------------------------------------------- */

/* FNV-1a over n bytes. */
static inline uint64_t pipe_digest_add(uint64_t d, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) d = (d ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return d;
}

/* Rank 0: every step's losses and summed gradients. */
static inline uint64_t pipe_history_digest(const pipe_host *h)
{
    size_t n = (size_t)h->o.micro * (size_t)h->D, np = h->md->num_params;
    uint64_t digest = PIPE_DIGEST_INIT;
    for (int t = 1; t <= h->o.steps; t++) {
        digest = pipe_digest_add(digest, h->hist_loss + (size_t)(t - 1) * n, n * sizeof(double));
        digest = pipe_digest_add(digest, h->hist_grad + (size_t)(t - 1) * np, np * sizeof(float));
    }
    return digest;
}

/* The reference's replica d's gradients (grads) into its step's sum
 * (final), in replica order. */
static inline void pipe_ref_add_replica(float *final, const float *grads, size_t np, int d)
{
    if (d == 0) memcpy(final, grads, np * sizeof(float));
    else
        for (size_t i = 0; i < np; i++) final[i] += grads[i];
}

/* The reference's step t (its D x M losses, its summed gradients) into its
 * digest, and compared with the pipeline's: 1 where they differ. */
static inline int pipe_ref_step(const pipe_host *h, int t, const double *loss, const float *final, uint64_t *digest)
{
    size_t n = (size_t)h->o.micro * (size_t)h->D, np = h->md->num_params;
    *digest = pipe_digest_add(*digest, loss, n * sizeof(double));
    *digest = pipe_digest_add(*digest, final, np * sizeof(float));
    return memcmp(loss, h->hist_loss + (size_t)(t - 1) * n, n * sizeof(double)) ||
           memcmp(final, h->hist_grad + (size_t)(t - 1) * np, np * sizeof(float));
}

/* ---------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------- */

static inline double pipe_pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

/* The budget and each stage's line. */
static inline void pipe_print_stages(const pipe_host *h)
{
    printf("budget: %llu bytes per device (%.1f%% of the whole graph's baseline arena, %llu bytes)\n",
           (unsigned long long)h->budget, pipe_pct(h->budget, h->base_arena), (unsigned long long)h->base_arena);
    for (int s = 0; s < h->P; s++) {
        const rkm_pipeline_stage_info *in = &h->info[s];
        rkm_op_desc a, b;
        rkm_graph_op_info(h->gg->g, in->first_op, &a);
        rkm_graph_op_info(h->gg->g, in->last_op, &b);
        printf("stage %d: ops %s..%s (%d blocks); k=%d in flight, overhead %.2f%%, kept %llu bytes a micro-batch, "
               "predicted peak %llu, arena %llu bytes (%.1f%% of the budget)\n",
               s, a.name, b.name, (int)in->n_blocks, (int)in->in_flight, in->overhead * 100.0,
               (unsigned long long)in->kept_bytes, (unsigned long long)in->peak, (unsigned long long)in->arena_bytes,
               pipe_pct(in->arena_bytes, in->budget));
    }
}

/* What each rank reports to rank 0 of its memory. */
typedef struct pipe_mem_report {
    uint64_t peak, predicted, region, budget;
    int peaks_equal, clean;
} pipe_mem_report;

static inline void pipe_mem_report_fill(const pipe_host *h, pipe_mem_report *me)
{
    me->peak = h->max_peak, me->predicted = h->mem.peak;
    me->region = h->mem.arena_bytes, me->budget = h->budget;
    me->peaks_equal = h->peaks_equal, me->clean = h->clean;
}

/* Rank r's report judged into the run's verdicts (the line saying so when
 * it left buffers live). */
static inline void pipe_mem_report_check(const pipe_mem_report *a, int r, int *ok, int *peaks_ok, int *regions_ok)
{
    *peaks_ok &= a->peaks_equal && a->peak == a->predicted;
    *regions_ok &= a->region <= a->budget;
    *ok &= a->clean;
    if (!a->clean) printf("rank %d: buffers left live after a micro-batch or a step\n", r);
}

#endif
