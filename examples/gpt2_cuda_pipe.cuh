/* gpt2_cuda_pipe.cuh -- the stage mode of gpt2_cuda.cu: the CUDA GPT-2
 * trained as a pipeline over MPI, one rank per stage (examples/gpt2_pipe.c's
 * design on the device; docs/porting.md section 7). Included by
 * gpt2_cuda.cu when built with -DGPT2_CUDA_MPI (make: build/gpt2_cuda_mpi
 * with nvcc, build/tests/gpt2_cuda_pipe_dummy on the dummy device); host
 * code only (no kernel launches: the dummy build rewrites launches in the
 * .cu file alone).
 *
 *   mpirun -np P*D gpt2_cuda_mpi [--micro-batches 4] [--schedule 1f1b|gpipe] [--dp 1]
 *          [--budget 50%] [--algo rockmate] [--transport nccl|mpi] [--preset tiny|124M]
 *          [--layers L] [--channels C] [--heads NH] [--vocab V] [--batch B] [--seq T]
 *          [--steps 2] [--dropout 0] [--inplace 0|1] [--lr 1e-3] [--profile-runs 3]
 *          [--poison] [--check 1]
 *
 * As gpt2_pipe.c: world rank r is stage r % P of replica r / P. Rank 0
 * profiles the whole graph on its device (rkm_cuda_profile, event times and
 * workspaces; --profile-runs 0: the graph's guesses), plans the pipeline
 * (rkm_pipeline_plan) and broadcasts the op costs, the cut and each stage's
 * plan file; every rank rebuilds the graph with those costs, cuts it and
 * reads its stage's plan back. Each rank allocates one device region, the
 * stage arena (rkm_plan_stage_layout: a slot per micro-batch in flight and
 * the running phase's transient region), and its callbacks place every
 * buffer of micro-batch m at its layout offset in m's slot, count the bytes
 * as the contract does (the measured peak must be the stage plan's
 * predicted one, to the byte) and run gpt2_cuda.cu's kernels on them
 * (trainer.st_act and friends point the kernels at the micro-batch's
 * buffers). Phases run in rkm_pipeline_simulate's order.
 *
 * Transport of the boundary tensors (--transport):
 * - nccl (built with -DGPT2_HAVE_NCCL, the default there): rank 0's
 *   ncclUniqueId broadcast over MPI, ncclCommInitRank, one GPU per rank.
 *   Receives land in the region (the input's buffer, the buffer the `loss`
 *   step makes for grad(output)); a send leaves from a device staging
 *   buffer (the phase's output copied there on the stream), so that the
 *   region's bytes are free at once. The send after a phase and the receive
 *   before the next one are one NCCL group (Megatron-LM's
 *   send_forward_recv_backward): NCCL's sends block the stream until the
 *   peer receives, and 1F1B's first backward would otherwise wait for a
 *   forward that waits for it.
 * - mpi (any build; the only one on the dummy device): through pinned host
 *   memory: the output copied to a staging buffer of its own per
 *   micro-batch and sent with MPI_Isend (completed at the end of the step);
 *   a receive into pinned memory, then copied into the region on the
 *   stream.
 *
 * Exactness as gpt2_pipe.c: dropout masks keyed by the micro-batch's number
 * in the run; a stage adds its micro-batches' gradients in micro-batch
 * order on the device; wte's two parts (encoder on the first stage,
 * lm_head on the last) and the replicas are summed on the host in a fixed
 * order (MPI, as gpt2_pipe.c); the update is gpt2_model_update on the host,
 * the weights uploaded again. Rank 0 then runs the single-process trainer
 * on its device (the whole graph's baseline plan in a CUDA arena, the same
 * micro-batches in the same order, lm_head's part of wte in a buffer of its
 * own, trainer.head_wte) and compares every step's losses and gradients bit
 * for bit.
 *
 * Failure: a failed CUDA, NCCL or MPI call or callback prints one line
 * naming the rank, stage, replica, step, micro-batch and phase, and calls
 * MPI_Abort. Exit status as gpt2_pipe's: 0 ok, 1 a check failed or an
 * error, 2 bad usage, 3 no plan fits. */
#include <mpi.h>
#ifdef GPT2_HAVE_NCCL
#include <nccl.h>
#endif
#include <time.h>
#include <unistd.h>

enum { CP_TAG_ACT, CP_TAG_GRAD, CP_TAG_TIED, CP_TAG_DP, CP_TAG_GATHER, CP_TAG_LOSS, CP_TAG_KINDS };
static int cp_tag(int kind, int micro) { return micro * CP_TAG_KINDS + kind; }

#define CP_MAX_STAGES 64
#define CP_MAX_IDS 8
#define CP_MAX_SLICES (4 * GPT2_NUM_PARAMS + 8)

typedef struct cp_options {
    gpt2_shape shape;
    int steps, micro, dp, check, profile_runs, poison, nccl;
    const char *budget;
    rkm_algo algo;
    rkm_pipe_schedule schedule;
    float dropout, lr;
} cp_options;

typedef struct cp_slice {
    size_t off, len;
} cp_slice;

/* One micro-batch's buffers (whole-graph ids) and batch. */
typedef struct cp_micro {
    void **act, **grad, **saved;
    int32_t *h_tok, *h_first, *h_next; /* pinned: tokens then targets (2 x BT); the chains */
    int32_t *d_first, *d_next;         /* device: the encoder backward's chains */
    int n_first;
    float *h_loss;                     /* pinned: the per-position losses (last stage) */
    uint64_t key;
    double loss;
} cp_micro;

/* What each rank reports to rank 0. */
typedef struct cp_report {
    uint64_t peak, predicted, region, budget;
    int peaks_equal, clean;
} cp_report;

typedef struct cp_rank {
    cp_options o;
    int rank, size, P, D, s, d, local_rank;
    rkm_context *ctx;
    trainer tr;
    int32_t nt_w, no_w; /* the whole graph's tensors, ops */
    uint64_t budget, base_arena;
    double sim_step;
    int32_t *cuts;
    rkm_pipeline_stage_info *info;
    rkm_graph *sg;
    int32_t nt, no, *t2w, *o2w, in_w, out_w, out_s;
    int first, last;
    rkm_plan *plan;
    int64_t nsteps, phase_step;
    rkm_buffer *buf;
    size_t nbuf, *bstart;
    rkm_stage_memory mem;
    unsigned char *region, *region_alloc; /* device */
    cp_micro *mb, ref_mb;
    rkm_pipe_phase *order;
    uint64_t cur, peak, max_peak;
    struct cp_range { uint64_t lo, hi; } *live;
    int nlive, live_cap, peaks_equal, clean;
    /* transport */
    uint64_t act_bytes, grad_bytes; /* my output's (sent on), my input's gradient (sent back) */
    unsigned char **h_send;         /* mpi: pinned staging, one per micro-batch and kind (2M) */
    unsigned char *h_recv;          /* mpi: pinned staging for receives */
    MPI_Request *send_req;          /* mpi: 2M */
    unsigned char *d_send;          /* nccl: device staging for the send in flight */
    struct { uint64_t bytes; int peer, tag, live; } pend_send; /* the last phase's send, not yet issued */
#ifdef GPT2_HAVE_NCCL
    ncclComm_t comm;
#endif
    /* gradients */
    cp_slice own[CP_MAX_SLICES];
    int nown;
    size_t own_len, wte_off, wte_len;
    int tied;
    float *tmp, *packed;
    double *losses, *hist_loss;
    float *hist_grad;
    /* saved for trainer_free */
    int32_t *keep_first, *keep_next;
    int step, micro, bwd;
    char err[256];
} cp_rank;

/* ---------------------------------------------------------------------------
 * Failure: one line, then every rank stops (gpt2_pipe.c's die)
 * ------------------------------------------------------------------------- */

static void cp_die(cp_rank *pr, const char *what)
{
    char where[64] = "outside the phases";
    if (pr->micro >= 0)
        snprintf(where, sizeof where, "micro-batch %d, %s phase", pr->micro, pr->bwd ? "backward" : "forward");
    fflush(stdout);
    fprintf(stderr, "gpt2_cuda: FAILED on rank %d (stage %d of %d, replica %d), step %d, %s: %s; aborting every rank\n",
            pr->rank, pr->s, pr->P, pr->d, pr->step, where, what);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void cp_mpi(cp_rank *pr, int rc, const char *call)
{
    char msg[MPI_MAX_ERROR_STRING], line[MPI_MAX_ERROR_STRING + 96];
    int len = 0;
    if (rc == MPI_SUCCESS) return;
    MPI_Error_string(rc, msg, &len);
    snprintf(line, sizeof line, "%s: %.*s", call, len, msg);
    cp_die(pr, line);
}

static void cp_cuda(cp_rank *pr, cudaError_t e, const char *what)
{
    char line[300];
    if (e == cudaSuccess) return;
    snprintf(line, sizeof line, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    cp_die(pr, line);
}

#ifdef GPT2_HAVE_NCCL
static void cp_nccl(cp_rank *pr, ncclResult_t r, const char *what)
{
    char line[300];
    if (r == ncclSuccess) return;
    snprintf(line, sizeof line, "%s: %s", what, ncclGetErrorString(r));
    cp_die(pr, line);
}
#endif

static int cp_cb_fail(cp_rank *pr, const char *what, int32_t id)
{
    snprintf(pr->err, sizeof pr->err, "%s (id %d)", what, (int)id);
    return 1;
}

/* Waits for q without spinning (gpt2_pipe.c's idle_wait): ranks waiting
 * while rank 0 profiles or runs the reference leave it the CPU. */
static void cp_idle_wait(cp_rank *pr, MPI_Request *q, const char *call)
{
    struct timespec nap = {0, 2000000};
    int done = 0;
    for (;;) {
        cp_mpi(pr, MPI_Test(q, &done, MPI_STATUS_IGNORE), call);
        if (done) return;
        nanosleep(&nap, NULL);
    }
}

static double cp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------
 * Options
 * ------------------------------------------------------------------------- */

static int cp_usage(int rank, const char *why)
{
    if (rank == 0)
        fprintf(stderr,
                "gpt2_cuda: %s\nusage: mpirun -np P*D gpt2_cuda_mpi [--micro-batches M] [--schedule 1f1b|gpipe] [--dp D]\n"
                "            [--budget B|N%%|NMiB] [--algo rockmate|rotor|sqrt|checkmate|none] [--transport nccl|mpi]\n"
                "            [--preset tiny|124M] [--layers L] [--channels C] [--heads NH] [--vocab V] [--batch B]\n"
                "            [--seq T] [--steps N] [--dropout P] [--inplace 0|1] [--lr LR] [--profile-runs N]\n"
                "            [--poison] [--check 0|1]\n",
                why);
    return 2;
}

static int cp_parse(cp_rank *pr, int argc, char **argv)
{
    cp_options *o = &pr->o;
    gpt2_shape tiny = {2, 128, 4, 512, 2, 64, 0, 0}, gpt124 = {12, 768, 12, 50257, 8, 1024, 0, 0};
    int inplace = 0;
    memset(o, 0, sizeof *o);
    o->shape = tiny;
    o->steps = 2, o->micro = 4, o->dp = 1, o->check = 1, o->profile_runs = 3, o->budget = "50%", o->lr = 1e-3f;
    o->algo = RKM_ALGO_DEFAULT;
#ifdef GPT2_HAVE_NCCL
    o->nccl = 1;
#endif
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "--poison")) {
            o->poison = 1;
            continue;
        }
        if (!v) return cp_usage(pr->rank, "an option without its value");
        i++;
        int *n = !strcmp(a, "--layers") ? &o->shape.L : !strcmp(a, "--channels") ? &o->shape.C
               : !strcmp(a, "--heads") ? &o->shape.NH : !strcmp(a, "--vocab") ? &o->shape.V
               : !strcmp(a, "--seq") ? &o->shape.T : !strcmp(a, "--batch") ? &o->shape.B
               : !strcmp(a, "--steps") ? &o->steps : !strcmp(a, "--micro-batches") ? &o->micro
               : !strcmp(a, "--dp") ? &o->dp : !strcmp(a, "--check") ? &o->check
               : !strcmp(a, "--profile-runs") ? &o->profile_runs : NULL;
        if (n) {
            if (!arg_int(v, 0, INT_MAX, n)) return cp_usage(pr->rank, "a shape or count: a whole number");
        } else if (!strcmp(a, "--preset") && (!strcmp(v, "tiny") || !strcmp(v, "124M"))) {
            o->shape = !strcmp(v, "tiny") ? tiny : gpt124;
        } else if (!strcmp(a, "--budget")) {
            o->budget = v;
        } else if (!strcmp(a, "--algo")) {
            if (rkm_algo_from_name(pr->ctx, v, &o->algo) != RKM_OK) return cp_usage(pr->rank, "unknown --algo");
        } else if (!strcmp(a, "--dropout") || !strcmp(a, "--lr")) {
            if (!arg_double(v, &x)) return cp_usage(pr->rank, "--dropout, --lr: a decimal number");
            *(a[2] == 'd' ? &o->dropout : &o->lr) = (float)x;
        } else if (!strcmp(a, "--schedule") && (!strcmp(v, "1f1b") || !strcmp(v, "gpipe"))) {
            o->schedule = !strcmp(v, "gpipe") ? RKM_PIPE_GPIPE : RKM_PIPE_1F1B;
        } else if (!strcmp(a, "--inplace") && (!strcmp(v, "0") || !strcmp(v, "1"))) {
            inplace = !strcmp(v, "1");
        } else if (!strcmp(a, "--transport") && (!strcmp(v, "nccl") || !strcmp(v, "mpi"))) {
            o->nccl = !strcmp(v, "nccl");
#ifndef GPT2_HAVE_NCCL
            if (o->nccl) return cp_usage(pr->rank, "--transport nccl: this build has no NCCL (nccl.h not found)");
#endif
        } else {
            return cp_usage(pr->rank, "unknown option");
        }
    }
    o->shape.dropout = o->dropout > 0.0f;
    o->shape.inplace = inplace;
    if (!gpt2_shape_ok(&o->shape) || o->steps < 1 || o->micro < 1 || o->dp < 1 ||
        !(o->dropout >= 0.0f && o->dropout < 1.0f))
        return cp_usage(pr->rank, "bad configuration (heads must divide channels, 0 <= dropout < 1, steps, "
                                  "micro-batches and dp at least 1)");
    if (pr->size % o->dp) return cp_usage(pr->rank, "the number of ranks must be stages x dp (mpirun -np)");
    pr->D = o->dp;
    pr->P = pr->size / o->dp;
    if (pr->P > CP_MAX_STAGES) return cp_usage(pr->rank, "at most 64 stages");
    return 0;
}

/* ---------------------------------------------------------------------------
 * The batch: micro-batch q of the run (every rank alike), its chains
 * ------------------------------------------------------------------------- */

static uint64_t cp_micro_id(const cp_rank *pr, int t, int d, int m)
{
    return ((uint64_t)(t - 1) * (uint64_t)pr->D + (uint64_t)d) * (uint64_t)pr->o.micro + (uint64_t)m;
}

/* Tokens and targets (the next token) of micro-batch q into mb's pinned
 * arrays, the per-token chains (prepare_chains's) queued to its device
 * arrays on the stream. */
static void cp_load_micro(cp_rank *pr, cp_micro *mb, uint64_t q)
{
    trainer *tr = &pr->tr;
    size_t N = (size_t)tr->s.B * (size_t)tr->s.T, V = (size_t)tr->s.V;
    int32_t *tok = mb->h_tok, *tgt = mb->h_tok + N, *last = (int32_t *)malloc(V * sizeof(int32_t));
    if (!last) cp_die(pr, "out of host memory");
    for (size_t i = 0; i <= N; i++) {
        int32_t v = (int32_t)(gpt2_mix(tr->seed * 31 + q * N + i) % (uint64_t)V);
        if (i < N) tok[i] = v;
        if (i > 0) tgt[i - 1] = v;
    }
    for (size_t v = 0; v < V; v++) last[v] = -1;
    mb->n_first = 0;
    for (size_t p = 0; p < N; p++) {
        mb->h_next[p] = -1;
        if (last[tok[p]] < 0) mb->h_first[mb->n_first++] = (int32_t)p;
        else mb->h_next[last[tok[p]]] = (int32_t)p;
        last[tok[p]] = (int32_t)p;
    }
    free(last);
    cp_cuda(pr, cudaMemcpyAsync(mb->d_first, mb->h_first, N * sizeof(int32_t), cudaMemcpyHostToDevice, tr->stream),
            "uploading the chains");
    cp_cuda(pr, cudaMemcpyAsync(mb->d_next, mb->h_next, N * sizeof(int32_t), cudaMemcpyHostToDevice, tr->stream),
            "uploading the chains");
    mb->key = q + 1;
}

static void cp_micro_init(cp_rank *pr, cp_micro *mb)
{
    size_t N = (size_t)pr->tr.s.B * (size_t)pr->tr.s.T;
    memset(mb, 0, sizeof *mb);
    mb->act = (void **)calloc((size_t)pr->nt_w, sizeof(void *));
    mb->grad = (void **)calloc((size_t)pr->nt_w, sizeof(void *));
    mb->saved = (void **)calloc((size_t)pr->no_w, sizeof(void *));
    if (!mb->act || !mb->grad || !mb->saved) cp_die(pr, "out of host memory");
    cp_cuda(pr, cudaMallocHost((void **)&mb->h_tok, 2 * N * sizeof(int32_t)), "pinned batch");
    cp_cuda(pr, cudaMallocHost((void **)&mb->h_first, N * sizeof(int32_t)), "pinned chains");
    cp_cuda(pr, cudaMallocHost((void **)&mb->h_next, N * sizeof(int32_t)), "pinned chains");
    cp_cuda(pr, cudaMallocHost((void **)&mb->h_loss, N * sizeof(float)), "pinned losses");
    cp_cuda(pr, cudaMalloc((void **)&mb->d_first, N * sizeof(int32_t)), "chains");
    cp_cuda(pr, cudaMalloc((void **)&mb->d_next, N * sizeof(int32_t)), "chains");
}

static void cp_micro_free(cp_micro *mb)
{
    free(mb->act), free(mb->grad), free(mb->saved);
    cudaFreeHost(mb->h_tok), cudaFreeHost(mb->h_first), cudaFreeHost(mb->h_next), cudaFreeHost(mb->h_loss);
    cudaFree(mb->d_first), cudaFree(mb->d_next);
}

/* The trainer's kernels see micro-batch mb (NULL: the arena again). */
static void cp_bind(cp_rank *pr, cp_micro *mb)
{
    trainer *tr = &pr->tr;
    tr->st_act = mb ? mb->act : NULL;
    tr->st_grad = mb ? mb->grad : NULL;
    tr->st_saved = mb ? mb->saved : NULL;
    tr->d_first = mb ? mb->d_first : pr->keep_first;
    tr->d_next = mb ? mb->d_next : pr->keep_next;
    if (mb) tr->n_first = mb->n_first, tr->key = mb->key;
}

/* ---------------------------------------------------------------------------
 * Planning (rank 0) and what every rank receives of it (gpt2_pipe.c's)
 * ------------------------------------------------------------------------- */

typedef struct cp_membuf {
    char *p;
    size_t n, cap;
} cp_membuf;

static int cp_membuf_write(void *user, const char *data, size_t len)
{
    cp_membuf *b = (cp_membuf *)user;
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

typedef struct cp_header {
    int32_t status;
    uint64_t budget, base_arena;
    double sim_step;
    uint64_t text_len[CP_MAX_STAGES];
} cp_header;

static int cp_plan_rank0(cp_rank *pr, cp_header *h, rkm_op_costs *costs, cp_membuf *texts)
{
    trainer *tr = &pr->tr;
    rkm_pipeline_desc pd;
    rkm_pipeline *pp = NULL;
    rkm_result r;
    if (pr->o.profile_runs > 0) { /* gpt2_cuda's profile: the baseline step through a measuring arena */
        options so;
        memset(&so, 0, sizeof so);
        so.profile_runs = pr->o.profile_runs, so.warmup = 1, so.poison = pr->o.poison;
        if (profile(tr, &so)) {
            printf("gpt2_cuda: FAILED profile: %s\n", tr->err);
            return 1;
        }
    }
    for (int32_t op = 0; op < pr->no_w; op++) {
        rkm_op_desc oi;
        rkm_graph_op_info(tr->gg.g, op, &oi);
        costs[op].fwd_seconds = oi.fwd_seconds, costs[op].bwd_seconds = oi.bwd_seconds;
        costs[op].fwd_ws = oi.fwd_ws, costs[op].bwd_ws = oi.bwd_ws;
    }
    if (rkm_parse_budget(tr->gg.g, pr->o.budget, 0, &h->budget) != RKM_OK) {
        printf("gpt2_cuda: FAILED bad --budget: %s\n", rkm_context_errmsg(pr->ctx));
        return 2;
    }
    rkm_graph_baseline_arena(tr->gg.g, 0, &h->base_arena);
    memset(&pd, 0, sizeof pd);
    pd.stages = pr->P;
    pd.micro_batches = pr->o.micro;
    pd.schedule = pr->o.schedule;
    pd.budget = h->budget;
    pd.solve.algo = pr->o.algo;
    r = rkm_pipeline_plan(tr->gg.g, &pd, &pp);
    if (r != RKM_OK) {
        printf("gpt2_cuda: FAILED %s: %s\n", r == RKM_ERROR_BUDGET ? "no plan fits the budget" : "pipeline planning",
               rkm_context_errmsg(pr->ctx));
        return r == RKM_ERROR_BUDGET ? 3 : r == RKM_ERROR_ARGUMENT ? 2 : 1;
    }
    h->sim_step = rkm_pipeline_step_time(pp);
    for (int s = 0; s < pr->P && r == RKM_OK; s++) {
        const rkm_graph *sg;
        const rkm_plan *sp;
        size_t before = texts->n;
        r = rkm_pipeline_stage(pp, s, &pr->info[s], &sg, &sp);
        if (r == RKM_OK) r = rkm_plan_write(sp, cp_membuf_write, texts);
        h->text_len[s] = texts->n - before;
        if (r == RKM_OK && s > 0) {
            rkm_tensor_info ti;
            for (int32_t t = 0; t < rkm_graph_num_tensors(sg); t++)
                if (rkm_graph_tensor_info(sg, t, &ti) == RKM_OK && (ti.flags & RKM_TENSOR_INPUT_GRAD))
                    pr->cuts[s - 1] = rkm_graph_find_tensor(tr->gg.g, ti.name);
        }
    }
    rkm_pipeline_destroy(pp);
    if (r != RKM_OK) {
        printf("gpt2_cuda: FAILED stage plans: %s\n", rkm_context_errmsg(pr->ctx));
        return 1;
    }
    return 0;
}

static int cp_receive_plan(cp_rank *pr)
{
    trainer *tr = &pr->tr;
    cp_header h;
    rkm_op_costs *costs = (rkm_op_costs *)calloc((size_t)pr->no_w, sizeof *costs);
    cp_membuf texts = {NULL, 0, 0};
    rkm_graph *g = NULL, *stages[CP_MAX_STAGES];
    size_t off = 0;
    memset(&h, 0, sizeof h);
    if (!costs) cp_die(pr, "out of host memory");
    if (pr->rank == 0) h.status = cp_plan_rank0(pr, &h, costs, &texts);
    {
        MPI_Request q;
        cp_mpi(pr, MPI_Ibcast(&h, (int)sizeof h, MPI_BYTE, 0, MPI_COMM_WORLD, &q), "MPI_Ibcast");
        cp_idle_wait(pr, &q, "MPI_Ibcast");
    }
    if (h.status) {
        free(costs);
        free(texts.p);
        return h.status;
    }
    for (int s = 0; s < pr->P; s++) off += h.text_len[s];
    if (pr->rank != 0 && !(texts.p = (char *)malloc(off + 1))) cp_die(pr, "out of host memory");
    cp_mpi(pr, MPI_Bcast(costs, (int)((size_t)pr->no_w * sizeof *costs), MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast");
    cp_mpi(pr, MPI_Bcast(pr->cuts, pr->P, MPI_INT32_T, 0, MPI_COMM_WORLD), "MPI_Bcast");
    cp_mpi(pr, MPI_Bcast(pr->info, (int)((size_t)pr->P * sizeof *pr->info), MPI_BYTE, 0, MPI_COMM_WORLD),
           "MPI_Bcast");
    cp_mpi(pr, MPI_Bcast(texts.p, (int)off, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
    pr->budget = h.budget, pr->base_arena = h.base_arena, pr->sim_step = h.sim_step;
    if (rkm_graph_with_costs(tr->gg.g, costs, &g) != RKM_OK) cp_die(pr, rkm_context_errmsg(pr->ctx));
    rkm_graph_destroy(tr->gg.g);
    tr->gg.g = g;
    if (rkm_graph_cut(g, pr->cuts, pr->P - 1, stages) != RKM_OK) cp_die(pr, rkm_context_errmsg(pr->ctx));
    for (int s = 0; s < pr->P; s++)
        if (s == pr->s) pr->sg = stages[s];
        else rkm_graph_destroy(stages[s]);
    off = 0;
    for (int s = 0; s < pr->s; s++) off += h.text_len[s];
    if (rkm_plan_read_string(pr->sg, texts.p + off, h.text_len[pr->s], "rank 0's stage plan", NULL, &pr->plan) !=
        RKM_OK)
        cp_die(pr, rkm_context_errmsg(pr->ctx));
    free(costs);
    free(texts.p);
    return 0;
}

/* ---------------------------------------------------------------------------
 * My stage: ids, the layout, the region, the transport's buffers
 * ------------------------------------------------------------------------- */

static uint64_t cp_wbytes(const cp_rank *pr, int32_t t)
{
    rkm_tensor_info ti;
    return rkm_graph_tensor_info(pr->tr.gg.g, t, &ti) == RKM_OK ? ti.bytes : 0;
}

/* The gradient ranges of the parameters stage s uses (gpt2_pipe.c's
 * stage_slices): with wte on two stages, the first's sum stands for it. */
static void cp_stage_slices(const cp_rank *pr, int s, cp_slice *out, int *n, size_t *len)
{
    const gpt2_shape *sh = &pr->o.shape;
    const rkm_pipeline_stage_info *in = &pr->info[s];
    const gpt2_model *md = &pr->tr.host_model;
    *n = 0, *len = 0;
    for (int32_t op = in->first_op; op <= in->last_op; op++) {
        const gpt2_opdef *d = &pr->tr.gg.ops[op];
        int params[2] = {d->weight, d->bias};
        for (int k = 0; k < 2; k++) {
            cp_slice sl;
            int dup = 0, i;
            if (params[k] < 0) continue;
            sl.off = (size_t)(gpt2__w(md->g, sh, params[k], d->layer) - md->grads);
            sl.len = gpt2_param_slice(sh, params[k]);
            if (pr->tied && s == pr->P - 1 && sl.off == pr->wte_off) continue;
            for (i = 0; i < *n; i++) dup |= out[i].off == sl.off;
            if (dup || *n == CP_MAX_SLICES) continue;
            for (i = (*n)++; i > 0 && out[i - 1].off > sl.off; i--) out[i] = out[i - 1];
            out[i] = sl;
            *len += sl.len;
        }
    }
}

static void cp_stage_setup(cp_rank *pr)
{
    const rkm_graph *wg = pr->tr.gg.g;
    rkm_tensor_info ti;
    rkm_op_desc oi;
    size_t M = (size_t)pr->o.micro;
    pr->first = pr->s == 0;
    pr->last = pr->s == pr->P - 1;
    pr->nt = rkm_graph_num_tensors(pr->sg);
    pr->no = rkm_graph_num_ops(pr->sg);
    pr->t2w = (int32_t *)malloc((size_t)pr->nt * sizeof *pr->t2w);
    pr->o2w = (int32_t *)malloc((size_t)pr->no * sizeof *pr->o2w);
    if (!pr->t2w || !pr->o2w) cp_die(pr, "out of host memory");
    pr->in_w = -1;
    for (int32_t t = 0; t < pr->nt; t++) {
        rkm_graph_tensor_info(pr->sg, t, &ti);
        if ((pr->t2w[t] = rkm_graph_find_tensor(wg, ti.name)) < 0) cp_die(pr, "a stage tensor not in the graph");
        if (ti.flags & RKM_TENSOR_INPUT_GRAD) pr->in_w = pr->t2w[t];
    }
    for (int32_t op = 0; op < pr->no; op++) {
        rkm_graph_op_info(pr->sg, op, &oi);
        if ((pr->o2w[op] = rkm_graph_find_op(wg, oi.name)) < 0) cp_die(pr, "a stage op not in the graph");
    }
    pr->out_s = rkm_graph_loss(pr->sg);
    pr->out_w = pr->t2w[pr->out_s];
    if ((pr->in_w >= 0) == pr->first) cp_die(pr, "the stage's input does not match its place in the pipeline");
    pr->tied = pr->P > 1;
    pr->wte_off = (size_t)(pr->tr.host_model.g[GPT2_WTE] - pr->tr.host_model.grads);
    pr->wte_len = pr->tr.host_model.sizes[GPT2_WTE];
    cp_stage_slices(pr, pr->s, pr->own, &pr->nown, &pr->own_len);

    pr->nsteps = (int64_t)rkm_plan_num_steps(pr->plan);
    pr->phase_step = rkm_plan_phase_step(pr->plan);
    pr->nbuf = rkm_plan_num_buffers(pr->plan);
    pr->buf = (rkm_buffer *)malloc((pr->nbuf + 1) * sizeof *pr->buf);
    pr->bstart = (size_t *)calloc((size_t)pr->nsteps + 3, sizeof *pr->bstart);
    if (!pr->buf || !pr->bstart) cp_die(pr, "out of host memory");
    if (rkm_plan_stage_layout(pr->plan, pr->o.schedule, pr->s, pr->P, pr->o.micro, 0, pr->buf, &pr->mem) != RKM_OK)
        cp_die(pr, rkm_context_errmsg(pr->ctx));
    for (size_t i = 1; i < pr->nbuf; i++)
        if (pr->buf[i].first_step < pr->buf[i - 1].first_step) cp_die(pr, "the stage layout is not in creation order");
    for (size_t i = 0, at = 0; at < (size_t)pr->nsteps + 2; at++) {
        while (i < pr->nbuf && pr->buf[i].first_step < (int64_t)at - 1) i++;
        pr->bstart[at] = i;
    }
    pr->bstart[pr->nsteps + 2] = pr->nbuf;
    if (pr->mem.arena_bytes != pr->info[pr->s].arena_bytes || pr->mem.peak != pr->info[pr->s].peak)
        cp_die(pr, "the stage layout differs from the planned stage");
    {
        /* one cudaMalloc: the stage arena, its base at the layout's alignment */
        uint64_t a = pr->mem.alignment > 256 ? pr->mem.alignment : 256;
        cp_cuda(pr, cudaMalloc((void **)&pr->region_alloc, (size_t)(pr->mem.arena_bytes + a)), "the stage's region");
        pr->region = pr->region_alloc + ((a - (uint64_t)(uintptr_t)pr->region_alloc % a) % a);
        if (pr->o.poison)
            cp_cuda(pr, cudaMemsetAsync(pr->region_alloc, 0xff, (size_t)(pr->mem.arena_bytes + a), pr->tr.stream),
                    "poisoning");
    }
    pr->live_cap = (int)((size_t)(pr->mem.in_flight + 1) * pr->nbuf + 8);
    pr->live = (struct cp_rank::cp_range *)calloc((size_t)pr->live_cap, sizeof *pr->live);
    pr->mb = (cp_micro *)calloc(M, sizeof *pr->mb);
    pr->order = (rkm_pipe_phase *)malloc(2 * M * (size_t)pr->P * sizeof *pr->order);
    pr->losses = (double *)calloc(M, sizeof *pr->losses);
    pr->tmp = (float *)malloc(pr->tr.host_model.num_params * sizeof(float));
    pr->packed = (float *)malloc(pr->tr.host_model.num_params * sizeof(float));
    if (!pr->live || !pr->mb || !pr->order || !pr->losses || !pr->tmp || !pr->packed) cp_die(pr, "out of host memory");
    for (size_t m = 0; m < M; m++) cp_micro_init(pr, &pr->mb[m]);
    {
        rkm_pipe_stage *ps = (rkm_pipe_stage *)calloc((size_t)pr->P, sizeof *ps);
        double t;
        if (!ps) cp_die(pr, "out of host memory");
        for (int s = 0; s < pr->P; s++) ps[s].fwd = pr->info[s].fwd_seconds, ps[s].bwd = pr->info[s].bwd_seconds;
        if (rkm_pipeline_simulate(pr->ctx, ps, pr->P, pr->o.micro, pr->o.schedule, pr->order, NULL, &t) != RKM_OK)
            cp_die(pr, rkm_context_errmsg(pr->ctx));
        memmove(pr->order, pr->order + (size_t)pr->s * 2 * M, 2 * M * sizeof *pr->order);
        free(ps);
    }
    /* the transport's buffers, outside the budget (as the weights) */
    pr->act_bytes = pr->last ? 0 : cp_wbytes(pr, pr->out_w);
    pr->grad_bytes = pr->in_w >= 0 ? cp_wbytes(pr, pr->in_w) : 0;
    if (pr->o.nccl) {
        uint64_t b = pr->act_bytes > pr->grad_bytes ? pr->act_bytes : pr->grad_bytes;
        if (b) cp_cuda(pr, cudaMalloc((void **)&pr->d_send, (size_t)b), "the send's staging buffer");
    } else {
        uint64_t in = pr->in_w >= 0 ? cp_wbytes(pr, pr->in_w) : 0, out = pr->last ? 0 : cp_wbytes(pr, pr->out_w);
        uint64_t r = in > out ? in : out;
        pr->h_send = (unsigned char **)calloc(2 * M, sizeof *pr->h_send);
        pr->send_req = (MPI_Request *)malloc(2 * M * sizeof *pr->send_req);
        if (!pr->h_send || !pr->send_req) cp_die(pr, "out of host memory");
        for (size_t i = 0; i < 2 * M; i++) {
            uint64_t b = i < M ? pr->act_bytes : pr->grad_bytes;
            pr->send_req[i] = MPI_REQUEST_NULL;
            if (b) cp_cuda(pr, cudaMallocHost((void **)&pr->h_send[i], (size_t)b), "pinned staging");
        }
        if (r) cp_cuda(pr, cudaMallocHost((void **)&pr->h_recv, (size_t)r), "pinned staging");
    }
}

/* Where buffer b of micro-batch m lies in the region (gpt2_pipe.c's dev_offset). */
static uint64_t cp_offset(const cp_rank *pr, const rkm_buffer *b, int32_t m)
{
    uint64_t S = pr->mem.slot_bytes, k = (uint64_t)pr->mem.in_flight;
    return b->offset < S ? b->offset + ((uint64_t)m % k) * S : b->offset + (k - 1) * S;
}

/* gpt2_pipe.c's place: the layout's buffer of `kind` and stage id `index`
 * made at plan step `step` (-1: an input), in micro-batch m's place;
 * counted, and checked against every live buffer's bytes. */
static void *cp_place(cp_rank *pr, int kind, int32_t index, int64_t step, int32_t m, uint64_t bytes)
{
    for (size_t i = pr->bstart[step + 1]; i < pr->bstart[step + 2]; i++) {
        const rkm_buffer *b = &pr->buf[i];
        if (b->kind != kind || b->index != index) continue;
        uint64_t off = cp_offset(pr, b, m);
        if (b->bytes != bytes || off + bytes > pr->mem.arena_bytes) {
            cp_cb_fail(pr, "a buffer's size or place disagrees with the stage layout", index);
            return NULL;
        }
        for (int j = 0; j < pr->nlive; j++)
            if (pr->live[j].lo < off + bytes && off < pr->live[j].hi) {
                cp_cb_fail(pr, "a buffer overlaps another live one in the region", index);
                return NULL;
            }
        if (pr->nlive == pr->live_cap) {
            cp_cb_fail(pr, "more live buffers than the stage's micro-batches can hold", index);
            return NULL;
        }
        pr->live[pr->nlive].lo = off, pr->live[pr->nlive].hi = off + bytes;
        pr->nlive++;
        pr->cur += bytes;
        if (pr->cur > pr->peak) pr->peak = pr->cur;
        return pr->region + off;
    }
    cp_cb_fail(pr, "a buffer the stage layout does not have", index);
    return NULL;
}

/* Buffer p of `bytes` released; poisoned in stream order with --poison. */
static void cp_unplace(cp_rank *pr, const void *p, uint64_t bytes)
{
    uint64_t lo = (uint64_t)((const unsigned char *)p - pr->region);
    if (!bytes) return;
    pr->cur -= bytes;
    if (pr->o.poison)
        cp_cuda(pr, cudaMemsetAsync((void *)p, 0xff, (size_t)bytes, pr->tr.stream), "poisoning a freed buffer");
    for (int j = 0; j < pr->nlive; j++)
        if (pr->live[j].lo == lo && pr->live[j].hi == lo + bytes) {
            pr->live[j] = pr->live[--pr->nlive];
            return;
        }
    pr->clean = 0;
}

/* ---------------------------------------------------------------------------
 * The callbacks: stage ids to the whole graph's, buffers placed in the
 * region, then gpt2_cuda.cu's own callbacks on the whole graph's ids
 * ------------------------------------------------------------------------- */

static int cp_map_ids(const cp_rank *pr, const int32_t *ids, int32_t n, int32_t *out)
{
    if (n < 0 || n > CP_MAX_IDS) return -1;
    for (int32_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= pr->nt) return -1;
        out[i] = pr->t2w[ids[i]];
    }
    return 0;
}

static cp_micro *cp_micro_of(cp_rank *pr, int32_t m)
{
    if (m != pr->micro) {
        cp_cb_fail(pr, "a call for another micro-batch than the phase's", m);
        return NULL;
    }
    return &pr->mb[m];
}

/* The trainer's failure message, into the rank's. */
static int cp_trainer_failed(cp_rank *pr)
{
    snprintf(pr->err, sizeof pr->err, "%s", pr->tr.err);
    return 1;
}

static int cp_forward(void *user, const rkm_fwd_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t in[CP_MAX_IDS], out[CP_MAX_IDS], op;
    const gpt2_opdef *d;
    rkm_fwd_call w = *c;
    void *ws = NULL;
    if (!mb) return 1;
    if (c->op < 0 || c->op >= pr->no || c->n_out != 1 || cp_map_ids(pr, c->in, c->n_in, in) ||
        cp_map_ids(pr, c->out, c->n_out, out))
        return cp_cb_fail(pr, "forward: ids out of range", c->op);
    op = pr->o2w[c->op];
    d = &pr->tr.gg.ops[op];
    for (int i = 0; i < d->n_in; i++)
        if (!mb->act[d->in[i]]) return cp_cb_fail(pr, "forward: input not live", d->in[i]);
    if (c->out_new[0] == RKM_OUT_NEW) {
        if (mb->act[d->out]) return cp_cb_fail(pr, "forward: new output already live", d->out);
        if (!(mb->act[d->out] = cp_place(pr, RKM_BUFFER_TENSOR, c->out[0], c->step, c->micro, cp_wbytes(pr, d->out))))
            return 1;
    } else if (c->out_new[0] == RKM_OUT_INPLACE) {
        if (mb->act[d->out] || !mb->act[d->in[0]]) return cp_cb_fail(pr, "forward: in place without its input", op);
        mb->act[d->out] = mb->act[d->in[0]];
        mb->act[d->in[0]] = NULL;
    } else if (!mb->act[d->out]) {
        return cp_cb_fail(pr, "forward: output to recompute in place is not live", d->out);
    }
    if (c->save) {
        if (mb->saved[op]) return cp_cb_fail(pr, "forward: saved state already live", op);
        if (!(mb->saved[op] = cp_place(pr, RKM_BUFFER_PHANTOM, c->op, c->step, c->micro, c->phantom))) return 1;
    }
    if (c->ws_bytes && !(ws = cp_place(pr, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes))) return 1;
    pr->tr.st_ws = (unsigned char *)ws, pr->tr.st_ws_bytes = c->ws_bytes, pr->tr.st_ws_used = 0;
    w.op = op, w.in = in, w.out = out;
    pr->tr.err[0] = 0;
    int rc = cb_forward(&pr->tr, &w);
    if (ws) cp_unplace(pr, ws, c->ws_bytes);
    return rc ? cp_trainer_failed(pr) : 0;
}

static int cp_backward(void *user, const rkm_bwd_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t in[CP_MAX_IDS], out[CP_MAX_IDS], saved[CP_MAX_IDS], op;
    const gpt2_opdef *d;
    rkm_bwd_call w = *c;
    void *ws = NULL;
    if (!mb) return 1;
    if (c->op < 0 || c->op >= pr->no || cp_map_ids(pr, c->in, c->n_in, in) || cp_map_ids(pr, c->out, c->n_out, out) ||
        cp_map_ids(pr, c->saved, c->n_saved, saved))
        return cp_cb_fail(pr, "backward: ids out of range", c->op);
    op = pr->o2w[c->op];
    d = &pr->tr.gg.ops[op];
    if (!mb->grad[d->out]) return cp_cb_fail(pr, "backward: output gradient not live", d->out);
    for (int i = 0; i < c->n_saved; i++)
        if (!mb->act[saved[i]]) return cp_cb_fail(pr, "backward: saved tensor not live", saved[i]);
    if (c->phantom && !mb->saved[op]) return cp_cb_fail(pr, "backward: saved state not live", op);
    for (int i = 0; i < d->n_in && i < c->n_in; i++) {
        int32_t t = d->in[i];
        if (c->in_grad[i] == RKM_GRAD_NEW) { /* cb_backward zeroes it */
            if (mb->grad[t]) return cp_cb_fail(pr, "backward: new gradient already live", t);
            if (!(mb->grad[t] = cp_place(pr, RKM_BUFFER_GRAD, c->in[i], c->step, c->micro, cp_wbytes(pr, t)))) return 1;
        } else if (c->in_grad[i] == RKM_GRAD_INPLACE) {
            if (mb->grad[t]) return cp_cb_fail(pr, "backward: in-place gradient already live", t);
            mb->grad[t] = mb->grad[d->out];
        } else if (c->in_grad[i] == RKM_GRAD_ACCUMULATE && !mb->grad[t]) {
            return cp_cb_fail(pr, "backward: gradient to accumulate into is not live", t);
        }
    }
    if (c->ws_bytes && !(ws = cp_place(pr, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes))) return 1;
    pr->tr.st_ws = (unsigned char *)ws, pr->tr.st_ws_bytes = c->ws_bytes, pr->tr.st_ws_used = 0;
    w.op = op, w.in = in, w.out = out, w.saved = saved;
    pr->tr.err[0] = 0;
    int rc = cb_backward(&pr->tr, &w);
    if (c->n_in && c->in_grad[0] == RKM_GRAD_INPLACE) mb->grad[d->out] = NULL; /* now grad(in[0]) */
    if (ws) cp_unplace(pr, ws, c->ws_bytes);
    return rc ? cp_trainer_failed(pr) : 0;
}

/* The `loss` step: grad(output) placed; the last stage seeds it (cb_loss:
 * 1/(B*T), the losses copied to d_losses) and fetches the losses; another
 * stage's was received there before the phase. */
static int cp_loss(void *user, const rkm_buffer_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    rkm_buffer_call w = *c;
    if (!mb) return 1;
    if (c->index != pr->out_s) return cp_cb_fail(pr, "loss: not the stage's output", c->index);
    if (!mb->act[pr->out_w] || mb->grad[pr->out_w])
        return cp_cb_fail(pr, "loss: output not live or gradient live", c->index);
    if (!(mb->grad[pr->out_w] = cp_place(pr, RKM_BUFFER_GRAD, c->index, c->step, c->micro, c->bytes))) return 1;
    if (!pr->last) return 0;
    w.index = pr->out_w;
    pr->tr.err[0] = 0;
    if (cb_loss(&pr->tr, &w)) return cp_trainer_failed(pr);
    cudaError_t e = cudaMemcpyAsync(mb->h_loss, pr->tr.d_losses, (size_t)(c->bytes), cudaMemcpyDeviceToHost,
                                    pr->tr.stream);
    if (e != cudaSuccess) return cp_cb_fail(pr, cudaGetErrorString(e), c->index);
    return 0;
}

static int cp_free_tensor(void *user, const rkm_buffer_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t t = c->index >= 0 && c->index < pr->nt ? pr->t2w[c->index] : -1;
    if (!mb) return 1;
    if (t < 0 || !mb->act[t]) return cp_cb_fail(pr, "free: tensor not live", c->index);
    cp_unplace(pr, mb->act[t], c->bytes);
    mb->act[t] = NULL;
    return 0;
}

static int cp_free_saved(void *user, const rkm_buffer_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t op = c->index >= 0 && c->index < pr->no ? pr->o2w[c->index] : -1;
    if (!mb) return 1;
    if (op < 0 || !mb->saved[op]) return cp_cb_fail(pr, "free_saved: saved state not live", c->index);
    cp_unplace(pr, mb->saved[op], c->bytes);
    mb->saved[op] = NULL;
    return 0;
}

static int cp_free_grad(void *user, const rkm_buffer_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t t = c->index >= 0 && c->index < pr->nt ? pr->t2w[c->index] : -1;
    if (!mb) return 1;
    if (t < 0 || !mb->grad[t]) return cp_cb_fail(pr, "free_grad: gradient not live", c->index);
    cp_unplace(pr, mb->grad[t], c->bytes);
    mb->grad[t] = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------
 * The transport: the last phase's send goes out with the next phase's
 * receive (one NCCL group), or through pinned host memory over MPI
 * ------------------------------------------------------------------------- */

static int cp_peer(const cp_rank *pr, int d, int s) { return d * pr->P + s; }

/* After a phase: its output (or its input's gradient) at p is to be sent.
 * nccl: copied on the stream to the staging buffer, sent with the next
 * receive; mpi: copied to micro-batch m's pinned buffer of its kind and
 * sent at once (MPI_Isend, completed at the end of the step). */
static void cp_queue_send(cp_rank *pr, const void *p, uint64_t bytes, int peer, int kind, int32_t m)
{
    cudaStream_t st = pr->tr.stream;
    if (pr->o.nccl) {
        cp_cuda(pr, cudaMemcpyAsync(pr->d_send, p, (size_t)bytes, cudaMemcpyDeviceToDevice, st), "staging a send");
        pr->pend_send.bytes = bytes, pr->pend_send.peer = peer, pr->pend_send.tag = cp_tag(kind, m);
        pr->pend_send.live = 1;
        return;
    }
    size_t i = (size_t)m + (kind == CP_TAG_GRAD ? (size_t)pr->o.micro : 0);
    cp_mpi(pr, pr->send_req[i] == MPI_REQUEST_NULL ? MPI_SUCCESS : MPI_Wait(&pr->send_req[i], MPI_STATUS_IGNORE),
           "MPI_Wait (a send)");
    cp_cuda(pr, cudaMemcpyAsync(pr->h_send[i], p, (size_t)bytes, cudaMemcpyDeviceToHost, st), "staging a send");
    cp_cuda(pr, cudaStreamSynchronize(st), "staging a send");
    cp_mpi(pr, MPI_Isend(pr->h_send[i], (int)bytes, MPI_BYTE, peer, cp_tag(kind, m), MPI_COMM_WORLD, &pr->send_req[i]),
           "MPI_Isend");
}

/* Before a phase: the pending send (nccl) and a receive into p (NULL:
 * none) from `peer`. */
static void cp_exchange(cp_rank *pr, void *p, uint64_t bytes, int peer, int kind, int32_t m)
{
    cudaStream_t st = pr->tr.stream;
    if (pr->o.nccl) {
#ifdef GPT2_HAVE_NCCL
        if (!pr->pend_send.live && !p) return;
        cp_nccl(pr, ncclGroupStart(), "ncclGroupStart");
        if (pr->pend_send.live)
            cp_nccl(pr, ncclSend(pr->d_send, (size_t)pr->pend_send.bytes, ncclChar, pr->pend_send.peer, pr->comm, st),
                    "ncclSend");
        if (p) cp_nccl(pr, ncclRecv(p, (size_t)bytes, ncclChar, peer, pr->comm, st), "ncclRecv");
        cp_nccl(pr, ncclGroupEnd(), "ncclGroupEnd");
        pr->pend_send.live = 0;
#endif
        return;
    }
    if (!p) return;
    MPI_Request q;
    cp_mpi(pr, MPI_Irecv(pr->h_recv, (int)bytes, MPI_BYTE, peer, cp_tag(kind, m), MPI_COMM_WORLD, &q), "MPI_Irecv");
    cp_mpi(pr, MPI_Wait(&q, MPI_STATUS_IGNORE), "MPI_Wait (a receive)");
    cp_cuda(pr, cudaMemcpyAsync(p, pr->h_recv, (size_t)bytes, cudaMemcpyHostToDevice, st), "a receive to the device");
    cp_cuda(pr, cudaStreamSynchronize(st), "a receive to the device"); /* before h_recv takes the next */
}

/* The end of the step: every send done. */
static void cp_flush_sends(cp_rank *pr)
{
    if (pr->o.nccl) {
        cp_exchange(pr, NULL, 0, 0, 0, 0);
    } else {
        for (int i = 0; i < 2 * pr->o.micro; i++)
            if (pr->send_req[i] != MPI_REQUEST_NULL)
                cp_mpi(pr, MPI_Wait(&pr->send_req[i], MPI_STATUS_IGNORE), "MPI_Wait (a send)");
    }
    cp_cuda(pr, cudaStreamSynchronize(pr->tr.stream), "the step");
}

/* ---------------------------------------------------------------------------
 * The phases
 * ------------------------------------------------------------------------- */

static void cp_run_phase(cp_rank *pr, int bwd, int32_t m, const rkm_callbacks *cb)
{
    char what[sizeof pr->err + 200];
    pr->bwd = bwd;
    pr->err[0] = 0;
    cp_bind(pr, &pr->mb[m]);
    rkm_result r = rkm_plan_execute_phase(pr->plan, bwd, m, cb);
    if (r == RKM_OK) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) snprintf(pr->err, sizeof pr->err, "a kernel: %s", cudaGetErrorString(e)), r = RKM_ERROR_CALLBACK;
    }
    if (r != RKM_OK) {
        snprintf(what, sizeof what, "%s [rockmate: %s]", pr->err[0] ? pr->err : "the plan failed",
                 rkm_context_errmsg(pr->ctx));
        cp_die(pr, what);
    }
}

static void cp_forward_phase(cp_rank *pr, int32_t m, const rkm_callbacks *cb)
{
    cp_micro *mb = &pr->mb[m];
    size_t N = (size_t)pr->tr.s.B * (size_t)pr->tr.s.T;
    int32_t ins[3] = {pr->in_w, pr->first ? pr->tr.gg.tokens : -1, pr->last ? pr->tr.gg.targets : -1};
    pr->micro = m, pr->bwd = 0;
    cp_load_micro(pr, mb, cp_micro_id(pr, pr->step, pr->d, m));
    for (int i = 0; i < 3; i++) {
        int32_t t = ins[i], ts = -1;
        if (t < 0) continue;
        for (int32_t k = 0; k < pr->nt; k++)
            if (pr->t2w[k] == t) ts = k;
        if (ts < 0 || !(mb->act[t] = cp_place(pr, RKM_BUFFER_TENSOR, ts, -1, m, cp_wbytes(pr, t)))) cp_die(pr, pr->err);
    }
    cp_exchange(pr, pr->in_w >= 0 ? mb->act[pr->in_w] : NULL, pr->in_w >= 0 ? cp_wbytes(pr, pr->in_w) : 0,
                cp_peer(pr, pr->d, pr->s - 1), CP_TAG_ACT, m);
    if (pr->first)
        cp_cuda(pr, cudaMemcpyAsync(mb->act[pr->tr.gg.tokens], mb->h_tok, N * sizeof(int32_t), cudaMemcpyHostToDevice,
                                    pr->tr.stream), "tokens");
    if (pr->last)
        cp_cuda(pr, cudaMemcpyAsync(mb->act[pr->tr.gg.targets], mb->h_tok + N, N * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, pr->tr.stream), "targets");
    cp_run_phase(pr, 0, m, cb);
    if (!pr->last) {
        if (!mb->act[pr->out_w]) cp_die(pr, "the output is not live at the end of the forward phase");
        cp_queue_send(pr, mb->act[pr->out_w], pr->act_bytes, cp_peer(pr, pr->d, pr->s + 1), CP_TAG_ACT, m);
    }
}

static void *cp_loss_grad_buffer(const cp_rank *pr, int32_t m)
{
    int64_t st = pr->phase_step;
    for (size_t i = pr->bstart[st + 1]; i < pr->bstart[st + 2]; i++)
        if (pr->buf[i].kind == RKM_BUFFER_GRAD && pr->buf[i].index == pr->out_s)
            return pr->region + cp_offset(pr, &pr->buf[i], m);
    return NULL;
}

static void cp_backward_phase(cp_rank *pr, int32_t m, const rkm_callbacks *cb)
{
    cp_micro *mb = &pr->mb[m];
    pr->micro = m, pr->bwd = 1;
    void *g = pr->last ? NULL : cp_loss_grad_buffer(pr, m);
    if (!pr->last && !g) cp_die(pr, "the stage layout has no buffer for the output's gradient");
    cp_exchange(pr, g, g ? cp_wbytes(pr, pr->out_w) : 0, cp_peer(pr, pr->d, pr->s + 1), CP_TAG_GRAD, m);
    cp_run_phase(pr, 1, m, cb);
    if (pr->last) { /* the losses were copied by the `loss` step: the mean, in order (fetch_results's) */
        size_t n = (size_t)pr->tr.s.B * (size_t)pr->tr.s.T;
        double sum = 0.0;
        cp_cuda(pr, cudaStreamSynchronize(pr->tr.stream), "the losses");
        for (size_t i = 0; i < n; i++) sum += mb->h_loss[i];
        pr->losses[m] = sum / (double)n;
    }
    for (int32_t t = 0; t < pr->nt_w; t++) {
        int input = t == pr->in_w || (pr->first && t == pr->tr.gg.tokens) || (pr->last && t == pr->tr.gg.targets);
        if (!mb->act[t] != !input || !mb->grad[t] != (t != pr->in_w)) pr->clean = 0;
    }
    for (int32_t op = 0; op < pr->no_w; op++)
        if (mb->saved[op]) pr->clean = 0;
    if (pr->in_w >= 0) {
        if (!mb->grad[pr->in_w]) cp_die(pr, "the input's gradient is not live at the end of the backward phase");
        cp_queue_send(pr, mb->grad[pr->in_w], pr->grad_bytes, cp_peer(pr, pr->d, pr->s - 1), CP_TAG_GRAD, m);
        cp_unplace(pr, mb->grad[pr->in_w], pr->grad_bytes);
        cp_unplace(pr, mb->act[pr->in_w], pr->grad_bytes);
        mb->grad[pr->in_w] = NULL;
        mb->act[pr->in_w] = NULL;
    }
    int32_t tk = pr->tr.gg.tokens, tg = pr->tr.gg.targets;
    if (pr->first) cp_unplace(pr, mb->act[tk], cp_wbytes(pr, tk)), mb->act[tk] = NULL;
    if (pr->last) cp_unplace(pr, mb->act[tg], cp_wbytes(pr, tg)), mb->act[tg] = NULL;
}

/* ---------------------------------------------------------------------------
 * After the phases: gpt2_pipe.c's sums on the host, in a fixed order
 * ------------------------------------------------------------------------- */

static void cp_pack(const cp_slice *sl, int n, const float *g, float *p)
{
    for (int i = 0; i < n; p += sl[i].len, i++) memcpy(p, g + sl[i].off, sl[i].len * sizeof(float));
}

static void cp_unpack(const cp_slice *sl, int n, const float *p, float *g)
{
    for (int i = 0; i < n; p += sl[i].len, i++) memcpy(g + sl[i].off, p, sl[i].len * sizeof(float));
}

static void cp_send_floats(cp_rank *pr, const float *p, size_t n, int dest, int tag)
{
    cp_mpi(pr, MPI_Send(p, (int)n, MPI_FLOAT, dest, tag, MPI_COMM_WORLD), "MPI_Send");
}

static void cp_recv_floats(cp_rank *pr, float *p, size_t n, int src, int tag)
{
    cp_mpi(pr, MPI_Recv(p, (int)n, MPI_FLOAT, src, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
}

static void cp_reduce_step(cp_rank *pr, float *grads_out)
{
    float *g = pr->tr.host_model.grads;
    size_t M = (size_t)pr->o.micro;
    pr->micro = -1;
    cp_cuda(pr, cudaMemcpy(g, pr->tr.grads, pr->tr.host_model.num_params * sizeof(float), cudaMemcpyDeviceToHost),
            "fetching the gradients");
    if (pr->tied && pr->last) cp_send_floats(pr, g + pr->wte_off, pr->wte_len, cp_peer(pr, pr->d, 0), CP_TAG_TIED);
    if (pr->tied && pr->first) {
        cp_recv_floats(pr, pr->tmp, pr->wte_len, cp_peer(pr, pr->d, pr->P - 1), CP_TAG_TIED);
        for (size_t i = 0; i < pr->wte_len; i++) g[pr->wte_off + i] = g[pr->wte_off + i] + pr->tmp[i];
    }
    cp_pack(pr->own, pr->nown, g, pr->packed);
    if (pr->D > 1) {
        if (pr->d == 0) {
            for (int e = 1; e < pr->D; e++) {
                cp_recv_floats(pr, pr->tmp, pr->own_len, cp_peer(pr, e, pr->s), CP_TAG_DP);
                for (size_t i = 0; i < pr->own_len; i++) pr->packed[i] += pr->tmp[i];
            }
            for (int e = 1; e < pr->D; e++) cp_send_floats(pr, pr->packed, pr->own_len, cp_peer(pr, e, pr->s), CP_TAG_DP);
        } else {
            cp_send_floats(pr, pr->packed, pr->own_len, cp_peer(pr, 0, pr->s), CP_TAG_DP);
            cp_recv_floats(pr, pr->packed, pr->own_len, cp_peer(pr, 0, pr->s), CP_TAG_DP);
        }
        cp_unpack(pr->own, pr->nown, pr->packed, g);
    }
    if (pr->tied && pr->first) cp_send_floats(pr, g + pr->wte_off, pr->wte_len, cp_peer(pr, pr->d, pr->P - 1), CP_TAG_TIED);
    if (pr->tied && pr->last) cp_recv_floats(pr, g + pr->wte_off, pr->wte_len, cp_peer(pr, pr->d, 0), CP_TAG_TIED);
    if (pr->d == 0 && pr->rank != 0) cp_send_floats(pr, pr->packed, pr->own_len, 0, CP_TAG_GATHER);
    if (pr->last && pr->rank != 0)
        cp_mpi(pr, MPI_Send(pr->losses, (int)M, MPI_DOUBLE, 0, CP_TAG_LOSS, MPI_COMM_WORLD), "MPI_Send");
    if (pr->rank == 0) {
        cp_slice sl[CP_MAX_SLICES];
        int n;
        size_t len;
        cp_unpack(pr->own, pr->nown, pr->packed, grads_out);
        for (int s = 1; s < pr->P; s++) {
            cp_stage_slices(pr, s, sl, &n, &len);
            cp_recv_floats(pr, pr->tmp, len, s, CP_TAG_GATHER);
            cp_unpack(sl, n, pr->tmp, grads_out);
        }
        for (int d = 0; d < pr->D; d++) {
            int src = cp_peer(pr, d, pr->P - 1);
            double *dst = pr->hist_loss + ((size_t)(pr->step - 1) * (size_t)pr->D + (size_t)d) * M;
            if (src == 0) memcpy(dst, pr->losses, M * sizeof(double));
            else
                cp_mpi(pr, MPI_Recv(dst, (int)M, MPI_DOUBLE, src, CP_TAG_LOSS, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                       "MPI_Recv");
        }
    }
}

/* gpt2_model_update on the host, the weights uploaded again. */
static void cp_update(cp_rank *pr, gpt2_model *md, int t)
{
    gpt2_model_update(md, pr->o.lr, 0.0f, t);
    cp_cuda(pr, cudaMemcpy(pr->tr.params, md->params, md->num_params * sizeof(float), cudaMemcpyHostToDevice),
            "uploading the weights");
}

static uint64_t cp_digest_add(uint64_t d, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) d = (d ^ ((const unsigned char *)p)[i]) * 0x100000001b3ull;
    return d;
}

static void cp_train_step(cp_rank *pr, const rkm_callbacks *cb)
{
    size_t M = (size_t)pr->o.micro;
    double t0 = 0.0, busy, slowest = 0.0;
    cp_mpi(pr, MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    t0 = cp_now();
    cp_cuda(pr, cudaMemsetAsync(pr->tr.grads, 0, pr->tr.host_model.num_params * sizeof(float), pr->tr.stream),
            "zero gradients");
    pr->cur = 0, pr->peak = 0;
    for (size_t i = 0; i < 2 * M; i++)
        if (pr->order[i].bwd) cp_backward_phase(pr, pr->order[i].micro, cb);
        else cp_forward_phase(pr, pr->order[i].micro, cb);
    pr->micro = -1;
    cp_flush_sends(pr);
    cp_bind(pr, NULL);
    busy = cp_now() - t0;
    if (pr->cur != 0 || pr->nlive != 0) pr->clean = 0;
    if (pr->peak != pr->mem.peak) pr->peaks_equal = 0;
    if (pr->peak > pr->max_peak) pr->max_peak = pr->peak;
    cp_reduce_step(pr, pr->hist_grad ? pr->hist_grad + (size_t)(pr->step - 1) * pr->tr.host_model.num_params : NULL);
    cp_mpi(pr, MPI_Reduce(&busy, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD), "MPI_Reduce");
    if (pr->rank == 0) {
        const double *l = pr->hist_loss + (size_t)(pr->step - 1) * M * (size_t)pr->D;
        double mean = 0.0;
        for (size_t i = 0; i < M * (size_t)pr->D; i++) mean += l[i];
        printf("step %d/%d: loss %.6f (mean of %d micro-batches), %.1f ms (the slowest rank)\n", pr->step, pr->o.steps,
               mean / (double)(M * (size_t)pr->D), (int)(M * (size_t)pr->D), slowest * 1e3);
    }
    cp_update(pr, &pr->tr.host_model, pr->step);
}

/* ---------------------------------------------------------------------------
 * The reference (rank 0): the single-process trainer on this device, the
 * whole graph's baseline plan in a CUDA arena, one micro-batch at a time
 * ------------------------------------------------------------------------- */

static int cp_reference(cp_rank *pr, uint64_t *digest, int *first_bad)
{
    trainer *tr = &pr->tr;
    gpt2_model md;
    rkm_plan *base = NULL;
    size_t M = (size_t)pr->o.micro, N = (size_t)tr->s.B * (size_t)tr->s.T, np, wl = pr->wte_len;
    float *final = NULL, *head = NULL;
    double *loss = (double *)malloc(M * (size_t)pr->D * sizeof(double));
    int bad = 0;
    *first_bad = 0;
    *digest = 0xcbf29ce484222325ull;
    if (gpt2_model_init(&md, &pr->o.shape, tr->seed) || !loss) cp_die(pr, "reference: out of host memory");
    np = md.num_params;
    final = (float *)malloc(np * sizeof(float));
    head = (float *)malloc(wl * sizeof(float));
    if (!final || !head) cp_die(pr, "reference: out of host memory");
    cp_micro_init(pr, &pr->ref_mb);
    cp_cuda(pr, cudaMemcpy(tr->params, md.params, np * sizeof(float), cudaMemcpyHostToDevice), "reference weights");
    if (pr->tied) cp_cuda(pr, cudaMalloc((void **)&tr->head_wte, wl * sizeof(float)), "reference: lm_head's wte part");
    if (rkm_plan_baseline(tr->gg.g, &base) != RKM_OK) cp_die(pr, rkm_context_errmsg(pr->ctx));
    {
        options so;
        memset(&so, 0, sizeof so);
        so.poison = pr->o.poison;
        if (arena_create(tr, &so, RKM_ARENA_LAYOUT, base, 0) != RKM_OK) cp_die(pr, lib_msg(tr));
    }
    for (int t = 1; t <= pr->o.steps; t++) {
        for (int d = 0; d < pr->D; d++) {
            cp_cuda(pr, cudaMemsetAsync(tr->grads, 0, np * sizeof(float), tr->stream), "reference: zero gradients");
            if (tr->head_wte)
                cp_cuda(pr, cudaMemsetAsync(tr->head_wte, 0, wl * sizeof(float), tr->stream), "reference: zero");
            for (size_t m = 0; m < M; m++) {
                cp_micro *mb = &pr->ref_mb;
                double s = 0.0;
                cp_load_micro(pr, mb, cp_micro_id(pr, t, d, (int)m));
                tr->d_first = mb->d_first, tr->d_next = mb->d_next, tr->n_first = mb->n_first, tr->key = mb->key;
                cp_cuda(pr, cudaMemcpyAsync(rkm_cuda_tensor(tr->ca, tr->gg.tokens), mb->h_tok, N * sizeof(int32_t),
                                            cudaMemcpyHostToDevice, tr->stream), "reference: tokens");
                cp_cuda(pr, cudaMemcpyAsync(rkm_cuda_tensor(tr->ca, tr->gg.targets), mb->h_tok + N,
                                            N * sizeof(int32_t), cudaMemcpyHostToDevice, tr->stream),
                        "reference: targets");
                tr->err[0] = 0;
                rkm_result r = rkm_cuda_arena_run(tr->ca, base);
                if (r != RKM_OK) {
                    fail_lib(tr, "reference step", r);
                    cp_die(pr, tr->err);
                }
                cp_cuda(pr, cudaMemcpyAsync(mb->h_loss, tr->d_losses, N * sizeof(float), cudaMemcpyDeviceToHost,
                                            tr->stream), "reference: losses");
                cp_cuda(pr, cudaStreamSynchronize(tr->stream), "reference step");
                for (size_t i = 0; i < N; i++) s += mb->h_loss[i];
                loss[(size_t)d * M + m] = s / (double)N;
            }
            cp_cuda(pr, cudaMemcpy(md.grads, tr->grads, np * sizeof(float), cudaMemcpyDeviceToHost), "reference");
            if (tr->head_wte) {
                cp_cuda(pr, cudaMemcpy(head, tr->head_wte, wl * sizeof(float), cudaMemcpyDeviceToHost), "reference");
                for (size_t i = 0; i < wl; i++) md.g[GPT2_WTE][i] = md.g[GPT2_WTE][i] + head[i];
            }
            if (d == 0) memcpy(final, md.grads, np * sizeof(float));
            else
                for (size_t i = 0; i < np; i++) final[i] += md.grads[i];
        }
        *digest = cp_digest_add(*digest, loss, M * (size_t)pr->D * sizeof(double));
        *digest = cp_digest_add(*digest, final, np * sizeof(float));
        if (!bad && (memcmp(loss, pr->hist_loss + (size_t)(t - 1) * M * (size_t)pr->D, M * (size_t)pr->D * sizeof(double)) ||
                     memcmp(final, pr->hist_grad + (size_t)(t - 1) * np, np * sizeof(float)))) {
            bad = 1;
            *first_bad = t;
        }
        memcpy(md.grads, final, np * sizeof(float));
        cp_update(pr, &md, t);
    }
    rkm_cuda_arena_destroy(tr->ca);
    tr->ca = NULL;
    rkm_plan_destroy(base);
    cudaFree(tr->head_wte);
    tr->head_wte = NULL;
    cp_micro_free(&pr->ref_mb);
    gpt2_model_free(&md);
    free(final);
    free(head);
    free(loss);
    return bad;
}

/* ---------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------- */

static double cp_pct(uint64_t a, uint64_t b) { return b ? 100.0 * (double)a / (double)b : 0.0; }

static void cp_print_plan(const cp_rank *pr)
{
    const rkm_graph *g = pr->tr.gg.g;
    printf("gpt2_cuda: stage mode, L=%d C=%d NH=%d V=%d T=%d, micro-batches of B=%d rows, dropout=%g, inplace=%d, "
           "%zu parameters\n",
           pr->o.shape.L, pr->o.shape.C, pr->o.shape.NH, pr->o.shape.V, pr->o.shape.T, pr->o.shape.B,
           (double)pr->o.dropout, pr->o.shape.inplace, pr->tr.host_model.num_params);
    printf("pipeline: P=%d stages x D=%d replicas = %d ranks, M=%d micro-batches a step per replica, %s; transport %s; "
           "%s\n",
           pr->P, pr->D, pr->size, pr->o.micro, pr->o.schedule == RKM_PIPE_GPIPE ? "GPipe" : "1F1B",
           pr->o.nccl ? "NCCL (device to device)" : "MPI through pinned host memory",
           pr->o.profile_runs > 0 ? "op costs profiled on rank 0's device" : "op costs: the graph's guesses");
    printf("budget: %llu bytes per device (%.1f%% of the whole graph's baseline arena, %llu bytes)\n",
           (unsigned long long)pr->budget, cp_pct(pr->budget, pr->base_arena), (unsigned long long)pr->base_arena);
    for (int s = 0; s < pr->P; s++) {
        const rkm_pipeline_stage_info *in = &pr->info[s];
        rkm_op_desc a, b;
        rkm_graph_op_info(g, in->first_op, &a);
        rkm_graph_op_info(g, in->last_op, &b);
        printf("stage %d: ops %s..%s (%d blocks); k=%d in flight, overhead %.2f%%, kept %llu bytes a micro-batch, "
               "predicted peak %llu, arena %llu bytes (%.1f%% of the budget)\n",
               s, a.name, b.name, (int)in->n_blocks, (int)in->in_flight, in->overhead * 100.0,
               (unsigned long long)in->kept_bytes, (unsigned long long)in->peak, (unsigned long long)in->arena_bytes,
               cp_pct(in->arena_bytes, in->budget));
    }
    printf("simulated step: %.3f ms\n", pr->sim_step * 1e3);
}

static int cp_finish(cp_rank *pr)
{
    cp_report me, *all = NULL;
    int ok = 1, peaks_ok = 1, regions_ok = 1;
    memset(&me, 0, sizeof me);
    me.peak = pr->max_peak, me.predicted = pr->mem.peak, me.region = pr->mem.arena_bytes, me.budget = pr->budget;
    me.peaks_equal = pr->peaks_equal, me.clean = pr->clean;
    if (pr->rank == 0 && !(all = (cp_report *)calloc((size_t)pr->size, sizeof *all))) cp_die(pr, "out of host memory");
    cp_mpi(pr, MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD),
           "MPI_Gather");
    if (pr->rank != 0) return 0;
    uint64_t digest = 0xcbf29ce484222325ull, ref_digest = 0;
    size_t M = (size_t)pr->o.micro, np = pr->tr.host_model.num_params;
    int first_bad = 0, same = -1;
    for (int r = 0; r < pr->size; r++) {
        const cp_report *a = &all[r];
        printf("rank %d (stage %d, replica %d): measured peak %llu bytes, predicted %llu: %s; region %llu bytes "
               "(the stage arena), %s the budget\n",
               r, r % pr->P, r / pr->P, (unsigned long long)a->peak, (unsigned long long)a->predicted,
               a->peaks_equal && a->peak == a->predicted ? "equal" : "DIFFERENT", (unsigned long long)a->region,
               a->region <= a->budget ? "within" : "OVER");
        peaks_ok &= a->peaks_equal && a->peak == a->predicted;
        regions_ok &= a->region <= a->budget;
        ok &= a->clean;
        if (!a->clean) printf("rank %d: buffers left live after a micro-batch or a step\n", r);
    }
    for (int t = 1; t <= pr->o.steps; t++) {
        digest = cp_digest_add(digest, pr->hist_loss + (size_t)(t - 1) * M * (size_t)pr->D,
                               M * (size_t)pr->D * sizeof(double));
        digest = cp_digest_add(digest, pr->hist_grad + (size_t)(t - 1) * np, np * sizeof(float));
    }
    printf("digest: %016llx (every step's %d micro-batch losses and summed parameter gradients)\n",
           (unsigned long long)digest, (int)(M * (size_t)pr->D));
    if (pr->o.check) {
        same = cp_reference(pr, &ref_digest, &first_bad) == 0;
        printf("reference: %016llx (the single-process trainer on this device: the whole graph's baseline plan, the "
               "same %d x %d micro-batches in the same order, wte's two parts and the replicas summed as the "
               "pipeline sums them)%s\n",
               (unsigned long long)ref_digest, pr->D, pr->o.micro, same ? ": bit-identical" : ": DIFFERENT");
        if (!same) printf("reference: step %d differs\n", first_bad);
        ok &= same;
    }
    ok &= peaks_ok && regions_ok;
    printf("gpt2_cuda: %s stages=%d dp=%d micro=%d schedule=%s transport=%s digest=%016llx grads=%s peaks=%s "
           "regions=%s\n",
           ok ? "ok" : "FAILED", pr->P, pr->D, pr->o.micro, pr->o.schedule == RKM_PIPE_GPIPE ? "gpipe" : "1f1b",
           pr->o.nccl ? "nccl" : "mpi", (unsigned long long)digest,
           same < 0 ? "unchecked" : same ? "bit-identical" : "DIFFERENT", peaks_ok ? "equal" : "DIFFERENT",
           regions_ok ? "within-budget" : "OVER-budget");
    free(all);
    return ok ? 0 : 1;
}

/* ---------------------------------------------------------------------------
 * The device, NCCL, setup and teardown
 * ------------------------------------------------------------------------- */

/* One device per rank on its node (local rank modulo the devices); NCCL
 * refuses two ranks on one device, so nccl wants a device each. */
static int cp_device(cp_rank *pr)
{
    MPI_Comm node;
    int local_size = 1;
    cp_mpi(pr, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, pr->rank, MPI_INFO_NULL, &node),
           "MPI_Comm_split_type");
    MPI_Comm_rank(node, &pr->local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
#ifndef RKM_DUMMY_LAUNCH /* the dummy device is one device */
    int count = 0;
    cp_cuda(pr, cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (pr->o.nccl && count < local_size) {
        if (pr->rank == 0)
            printf("gpt2_cuda: FAILED --transport nccl wants a GPU per rank: %d ranks on this node, %d GPUs (use "
                   "--transport mpi to share them)\n",
                   local_size, count);
        return 2;
    }
    cp_cuda(pr, cudaSetDevice(pr->local_rank % count), "cudaSetDevice");
#else
    (void)local_size;
#endif
    return 0;
}

static void cp_nccl_init(cp_rank *pr)
{
#ifdef GPT2_HAVE_NCCL
    ncclUniqueId id;
    if (!pr->o.nccl) return;
    if (pr->rank == 0) cp_nccl(pr, ncclGetUniqueId(&id), "ncclGetUniqueId");
    cp_mpi(pr, MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast (ncclUniqueId)");
    cp_nccl(pr, ncclCommInitRank(&pr->comm, pr->size, id, pr->rank), "ncclCommInitRank");
#else
    (void)pr;
#endif
}

static void cp_teardown(cp_rank *pr)
{
    for (int m = 0; pr->mb && m < pr->o.micro; m++) cp_micro_free(&pr->mb[m]);
    free(pr->mb);
    if (pr->h_send)
        for (int i = 0; i < 2 * pr->o.micro; i++) cudaFreeHost(pr->h_send[i]);
    free(pr->h_send);
    free(pr->send_req);
    cudaFreeHost(pr->h_recv);
    cudaFree(pr->d_send);
    cudaFree(pr->region_alloc);
#ifdef GPT2_HAVE_NCCL
    if (pr->comm) ncclCommDestroy(pr->comm);
#endif
    free(pr->live), free(pr->buf), free(pr->bstart), free(pr->order), free(pr->losses), free(pr->tmp);
    free(pr->packed), free(pr->hist_loss), free(pr->hist_grad), free(pr->t2w), free(pr->o2w), free(pr->cuts);
    free(pr->info);
    rkm_plan_destroy(pr->plan);
    rkm_graph_destroy(pr->sg);
    cp_bind(pr, NULL);
    trainer_free(&pr->tr);
}

static int pipe_main(int argc, char **argv)
{
    static cp_rank pr; /* large; one per process */
    int rc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    MPI_Init(&argc, &argv);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &pr.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &pr.size);
    pr.micro = -1, pr.peaks_equal = 1, pr.clean = 1;
    if (rkm_context_create(NULL, &pr.ctx) != RKM_OK) cp_die(&pr, "context: out of memory");
    rc = cp_parse(&pr, argc, argv);
    if (!rc) rc = cp_device(&pr);
    if (!rc) {
        pr.s = pr.rank % pr.P, pr.d = pr.rank / pr.P;
        if (trainer_init(&pr.tr, pr.ctx, &pr.o.shape, pr.o.dropout)) cp_die(&pr, pr.tr.err);
        pr.keep_first = pr.tr.d_first, pr.keep_next = pr.tr.d_next;
        pr.nt_w = rkm_graph_num_tensors(pr.tr.gg.g);
        pr.no_w = rkm_graph_num_ops(pr.tr.gg.g);
        pr.cuts = (int32_t *)calloc((size_t)pr.P, sizeof *pr.cuts);
        pr.info = (rkm_pipeline_stage_info *)calloc((size_t)pr.P, sizeof *pr.info);
        if (!pr.cuts || !pr.info) cp_die(&pr, "out of host memory");
        rc = cp_receive_plan(&pr);
    }
    if (!rc) {
        rkm_callbacks cb;
        cp_stage_setup(&pr);
        cp_nccl_init(&pr);
        memset(&cb, 0, sizeof cb);
        cb.user = &pr;
        cb.forward = cp_forward, cb.backward = cp_backward, cb.loss = cp_loss;
        cb.free_tensor = cp_free_tensor, cb.free_saved = cp_free_saved, cb.free_grad = cp_free_grad;
        if (pr.rank == 0) {
            pr.hist_loss = (double *)calloc((size_t)pr.o.steps * (size_t)pr.o.micro * (size_t)pr.D, sizeof(double));
            pr.hist_grad = (float *)calloc((size_t)pr.o.steps * pr.tr.host_model.num_params, sizeof(float));
            if (!pr.hist_loss || !pr.hist_grad) cp_die(&pr, "out of host memory");
            cp_print_plan(&pr);
        }
        for (pr.step = 1; pr.step <= pr.o.steps; pr.step++) cp_train_step(&pr, &cb);
        pr.step = pr.o.steps;
        rc = cp_finish(&pr);
        MPI_Request q;
        cp_mpi(&pr, MPI_Ibarrier(MPI_COMM_WORLD, &q), "MPI_Ibarrier");
        cp_idle_wait(&pr, &q, "MPI_Ibarrier");
    }
    if (pr.tr.gg.g || pr.tr.stream) cp_teardown(&pr);
    rkm_context_destroy(pr.ctx);
    MPI_Finalize();
    return rc;
}
