/* gpt2_cuda_pipe.cuh -- the stage mode of gpt2_cuda.cu: the CUDA GPT-2
 * trained as a pipeline over MPI, one rank per stage (examples/gpt2_pipe.c's
 * design on the device; docs/porting.md section 7; the host logic both
 * share, device-independent, is examples/pipe_host.h). Included by
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


#include "pipe_host.h"

/* The options of the stage mode only (the shared ones: pr->h.o). */
typedef struct cp_options {
    int profile_runs, poison, nccl;
} cp_options;

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

typedef struct cp_rank {
    pipe_host h; /* the stage, its plan, layout and region (pipe_host.h) */
    cp_options o;
    int local_rank;
    trainer tr;
    int32_t nt_w, no_w; /* the whole graph's tensors, ops */
    unsigned char *region_alloc; /* device: h.region lies in it */
    cp_micro *mb, ref_mb;
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
    /* saved for trainer_free */
    int32_t *keep_first, *keep_next;
} cp_rank;

/* ---------------------------------------------------------------------------
 * Failure: a CUDA or NCCL call that fails dies as pipe_host.h says
 * ------------------------------------------------------------------------- */

static void cp_cuda(cp_rank *pr, cudaError_t e, const char *what)
{
    char line[300];
    if (e == cudaSuccess) return;
    snprintf(line, sizeof line, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    pipe_die(&pr->h, line);
}

#ifdef GPT2_HAVE_NCCL
static void cp_nccl(cp_rank *pr, ncclResult_t r, const char *what)
{
    char line[300];
    if (r == ncclSuccess) return;
    snprintf(line, sizeof line, "%s: %s", what, ncclGetErrorString(r));
    pipe_die(&pr->h, line);
}
#endif

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
    pipe_options *c = &pr->h.o;
    cp_options *o = &pr->o;
    gpt2_shape tiny = {2, 128, 4, 512, 2, 64, 0, 0}, gpt124 = {12, 768, 12, 50257, 8, 1024, 0, 0};
    const char *why = NULL;
    memset(c, 0, sizeof *c);
    memset(o, 0, sizeof *o);
    c->shape = tiny;
    c->steps = 2, c->micro = 4, c->dp = 1, c->check = 1, o->profile_runs = 3, c->budget = "50%", c->lr = 1e-3f;
    c->algo = RKM_ALGO_DEFAULT;
#ifdef GPT2_HAVE_NCCL
    o->nccl = 1;
#endif
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int taken;
        if (!strcmp(a, "--poison")) {
            o->poison = 1;
            continue;
        }
        if (!v) return cp_usage(pr->h.rank, "an option without its value");
        i++;
        int *n = pipe_int_option(c, a);
        if (!n) n = !strcmp(a, "--vocab") ? &c->shape.V : !strcmp(a, "--profile-runs") ? &o->profile_runs : NULL;
        if (n) {
            if (!arg_int(v, 0, INT_MAX, n)) return cp_usage(pr->h.rank, "a shape or count: a whole number");
        } else if ((taken = pipe_value_option(c, a, v, &why)) != 0) {
            if (taken < 0) return cp_usage(pr->h.rank, why);
        } else if (!strcmp(a, "--preset") && (!strcmp(v, "tiny") || !strcmp(v, "124M"))) {
            int inplace = c->shape.inplace; /* --inplace holds whichever comes first */
            c->shape = !strcmp(v, "tiny") ? tiny : gpt124;
            c->shape.inplace = inplace;
        } else if (!strcmp(a, "--algo")) {
            if (rkm_algo_from_name(pr->h.ctx, v, &c->algo) != RKM_OK) return cp_usage(pr->h.rank, "unknown --algo");
        } else if (!strcmp(a, "--transport") && (!strcmp(v, "nccl") || !strcmp(v, "mpi"))) {
            o->nccl = !strcmp(v, "nccl");
#ifndef GPT2_HAVE_NCCL
            if (o->nccl) return cp_usage(pr->h.rank, "--transport nccl: this build has no NCCL (nccl.h not found)");
#endif
        } else {
            return cp_usage(pr->h.rank, "unknown option");
        }
    }
    c->shape.dropout = c->dropout > 0.0f;
    if ((why = pipe_options_check(&pr->h, 0)) != NULL) return cp_usage(pr->h.rank, why);
    if (pr->h.P > PIPE_MAX_STAGES) return cp_usage(pr->h.rank, "at most 64 stages");
    return 0;
}

/* ---------------------------------------------------------------------------
 * The batch: micro-batch q of the run (every rank alike), its chains
 * ------------------------------------------------------------------------- */

/* Tokens and targets (the next token) of micro-batch q into mb's pinned
 * arrays, the per-token chains (prepare_chains's) queued to its device
 * arrays on the stream. */
static void cp_load_micro(cp_rank *pr, cp_micro *mb, uint64_t q)
{
    trainer *tr = &pr->tr;
    size_t N = (size_t)tr->s.B * (size_t)tr->s.T, V = (size_t)tr->s.V;
    int32_t *tok = mb->h_tok, *tgt = mb->h_tok + N, *last = (int32_t *)malloc(V * sizeof(int32_t));
    if (!last) pipe_die(&pr->h, "out of host memory");
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
    if (!mb->act || !mb->grad || !mb->saved) pipe_die(&pr->h, "out of host memory");
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
 * Planning: rank 0 profiles, pipe_host.h plans and broadcasts
 * ------------------------------------------------------------------------- */

/* Rank 0, before planning: gpt2_cuda's profile (the baseline step through a
 * measuring arena; --profile-runs 0: the graph's guesses). */
static int cp_profile(void *user)
{
    cp_rank *pr = (cp_rank *)user;
    options so;
    if (pr->o.profile_runs <= 0) return 0;
    memset(&so, 0, sizeof so);
    so.profile_runs = pr->o.profile_runs, so.warmup = 1, so.poison = pr->o.poison;
    if (profile(&pr->tr, &so)) {
        printf("gpt2_cuda: FAILED profile: %s\n", pr->tr.err);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * My stage: pipe_host.h's setup, the region, the transport's buffers
 * ------------------------------------------------------------------------- */

static void cp_stage_setup(cp_rank *pr)
{
    size_t M = (size_t)pr->h.o.micro;
    pipe_stage_setup(&pr->h);
    {
        /* one cudaMalloc: the stage arena, its base at the layout's alignment */
        uint64_t a = pr->h.mem.alignment > 256 ? pr->h.mem.alignment : 256;
        cp_cuda(pr, cudaMalloc((void **)&pr->region_alloc, (size_t)(pr->h.mem.arena_bytes + a)), "the stage's region");
        pr->h.region = pr->region_alloc + ((a - (uint64_t)(uintptr_t)pr->region_alloc % a) % a);
        if (pr->o.poison)
            cp_cuda(pr, cudaMemsetAsync(pr->region_alloc, 0xff, (size_t)(pr->h.mem.arena_bytes + a), pr->tr.stream),
                    "poisoning");
    }
    pr->mb = (cp_micro *)calloc(M, sizeof *pr->mb);
    if (!pr->mb) pipe_die(&pr->h, "out of host memory");
    for (size_t m = 0; m < M; m++) cp_micro_init(pr, &pr->mb[m]);
    /* the transport's buffers, outside the budget (as the weights) */
    pr->act_bytes = pr->h.last ? 0 : pipe_wbytes(&pr->h, pr->h.out_w);
    pr->grad_bytes = pr->h.in_w >= 0 ? pipe_wbytes(&pr->h, pr->h.in_w) : 0;
    if (pr->o.nccl) {
        uint64_t b = pr->act_bytes > pr->grad_bytes ? pr->act_bytes : pr->grad_bytes;
        if (b) cp_cuda(pr, cudaMalloc((void **)&pr->d_send, (size_t)b), "the send's staging buffer");
    } else {
        uint64_t in = pr->h.in_w >= 0 ? pipe_wbytes(&pr->h, pr->h.in_w) : 0, out = pr->h.last ? 0 : pipe_wbytes(&pr->h, pr->h.out_w);
        uint64_t r = in > out ? in : out;
        pr->h_send = (unsigned char **)calloc(2 * M, sizeof *pr->h_send);
        pr->send_req = (MPI_Request *)malloc(2 * M * sizeof *pr->send_req);
        if (!pr->h_send || !pr->send_req) pipe_die(&pr->h, "out of host memory");
        for (size_t i = 0; i < 2 * M; i++) {
            uint64_t b = i < M ? pr->act_bytes : pr->grad_bytes;
            pr->send_req[i] = MPI_REQUEST_NULL;
            if (b) cp_cuda(pr, cudaMallocHost((void **)&pr->h_send[i], (size_t)b), "pinned staging");
        }
        if (r) cp_cuda(pr, cudaMallocHost((void **)&pr->h_recv, (size_t)r), "pinned staging");
    }
}

/* Buffer p of `bytes` released; poisoned in stream order with --poison. */
static void cp_unplace(cp_rank *pr, const void *p, uint64_t bytes)
{
    if (bytes && pr->o.poison)
        cp_cuda(pr, cudaMemsetAsync((void *)p, 0xff, (size_t)bytes, pr->tr.stream), "poisoning a freed buffer");
    pipe_unplace(&pr->h, p, bytes);
}

/* ---------------------------------------------------------------------------
 * The callbacks: stage ids to the whole graph's, buffers placed in the
 * region, then gpt2_cuda.cu's own callbacks on the whole graph's ids
 * ------------------------------------------------------------------------- */

static cp_micro *cp_micro_of(cp_rank *pr, int32_t m)
{
    return pipe_check_micro(&pr->h, m) < 0 ? NULL : &pr->mb[m];
}

/* The trainer's failure message, into the rank's. */
static int cp_trainer_failed(cp_rank *pr)
{
    snprintf(pr->h.err, sizeof pr->h.err, "%s", pr->tr.err);
    return 1;
}

static int cp_forward(void *user, const rkm_fwd_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t in[PIPE_MAX_IDS], out[PIPE_MAX_IDS], op;
    const gpt2_opdef *d;
    rkm_fwd_call w = *c;
    void *ws = NULL;
    if (!mb) return 1;
    if (c->op < 0 || c->op >= pr->h.no || c->n_out != 1 || pipe_map_ids(&pr->h, c->in, c->n_in, in) ||
        pipe_map_ids(&pr->h, c->out, c->n_out, out))
        return pipe_cb_fail(&pr->h, "forward: ids out of range", c->op);
    op = pr->h.o2w[c->op];
    d = &pr->tr.gg.ops[op];
    for (int i = 0; i < d->n_in; i++)
        if (!mb->act[d->in[i]]) return pipe_cb_fail(&pr->h, "forward: input not live", d->in[i]);
    if (c->out_new[0] == RKM_OUT_NEW) {
        if (mb->act[d->out]) return pipe_cb_fail(&pr->h, "forward: new output already live", d->out);
        if (!(mb->act[d->out] = pipe_place(&pr->h, RKM_BUFFER_TENSOR, c->out[0], c->step, c->micro, pipe_wbytes(&pr->h, d->out))))
            return 1;
    } else if (c->out_new[0] == RKM_OUT_INPLACE) {
        if (mb->act[d->out] || !mb->act[d->in[0]]) return pipe_cb_fail(&pr->h, "forward: in place without its input", op);
        mb->act[d->out] = mb->act[d->in[0]];
        mb->act[d->in[0]] = NULL;
    } else if (!mb->act[d->out]) {
        return pipe_cb_fail(&pr->h, "forward: output to recompute in place is not live", d->out);
    }
    if (c->save) {
        if (mb->saved[op]) return pipe_cb_fail(&pr->h, "forward: saved state already live", op);
        if (!(mb->saved[op] = pipe_place(&pr->h, RKM_BUFFER_PHANTOM, c->op, c->step, c->micro, c->phantom))) return 1;
    }
    if (c->ws_bytes && !(ws = pipe_place(&pr->h, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes))) return 1;
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
    int32_t in[PIPE_MAX_IDS], out[PIPE_MAX_IDS], saved[PIPE_MAX_IDS], op;
    const gpt2_opdef *d;
    rkm_bwd_call w = *c;
    void *ws = NULL;
    if (!mb) return 1;
    if (c->op < 0 || c->op >= pr->h.no || pipe_map_ids(&pr->h, c->in, c->n_in, in) || pipe_map_ids(&pr->h, c->out, c->n_out, out) ||
        pipe_map_ids(&pr->h, c->saved, c->n_saved, saved))
        return pipe_cb_fail(&pr->h, "backward: ids out of range", c->op);
    op = pr->h.o2w[c->op];
    d = &pr->tr.gg.ops[op];
    if (!mb->grad[d->out]) return pipe_cb_fail(&pr->h, "backward: output gradient not live", d->out);
    for (int i = 0; i < c->n_saved; i++)
        if (!mb->act[saved[i]]) return pipe_cb_fail(&pr->h, "backward: saved tensor not live", saved[i]);
    if (c->phantom && !mb->saved[op]) return pipe_cb_fail(&pr->h, "backward: saved state not live", op);
    for (int i = 0; i < d->n_in && i < c->n_in; i++) {
        int32_t t = d->in[i];
        if (c->in_grad[i] == RKM_GRAD_NEW) { /* cb_backward zeroes it */
            if (mb->grad[t]) return pipe_cb_fail(&pr->h, "backward: new gradient already live", t);
            if (!(mb->grad[t] = pipe_place(&pr->h, RKM_BUFFER_GRAD, c->in[i], c->step, c->micro, pipe_wbytes(&pr->h, t)))) return 1;
        } else if (c->in_grad[i] == RKM_GRAD_INPLACE) {
            if (mb->grad[t]) return pipe_cb_fail(&pr->h, "backward: in-place gradient already live", t);
            mb->grad[t] = mb->grad[d->out];
        } else if (c->in_grad[i] == RKM_GRAD_ACCUMULATE && !mb->grad[t]) {
            return pipe_cb_fail(&pr->h, "backward: gradient to accumulate into is not live", t);
        }
    }
    if (c->ws_bytes && !(ws = pipe_place(&pr->h, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes))) return 1;
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
    if (c->index != pr->h.out_s) return pipe_cb_fail(&pr->h, "loss: not the stage's output", c->index);
    if (!mb->act[pr->h.out_w] || mb->grad[pr->h.out_w])
        return pipe_cb_fail(&pr->h, "loss: output not live or gradient live", c->index);
    if (!(mb->grad[pr->h.out_w] = pipe_place(&pr->h, RKM_BUFFER_GRAD, c->index, c->step, c->micro, c->bytes))) return 1;
    if (!pr->h.last) return 0;
    w.index = pr->h.out_w;
    pr->tr.err[0] = 0;
    if (cb_loss(&pr->tr, &w)) return cp_trainer_failed(pr);
    cudaError_t e = cudaMemcpyAsync(mb->h_loss, pr->tr.d_losses, (size_t)(c->bytes), cudaMemcpyDeviceToHost,
                                    pr->tr.stream);
    if (e != cudaSuccess) return pipe_cb_fail(&pr->h, cudaGetErrorString(e), c->index);
    return 0;
}

static int cp_free_tensor(void *user, const rkm_buffer_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t t = c->index >= 0 && c->index < pr->h.nt ? pr->h.t2w[c->index] : -1;
    if (!mb) return 1;
    if (t < 0 || !mb->act[t]) return pipe_cb_fail(&pr->h, "free: tensor not live", c->index);
    cp_unplace(pr, mb->act[t], c->bytes);
    mb->act[t] = NULL;
    return 0;
}

static int cp_free_saved(void *user, const rkm_buffer_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t op = c->index >= 0 && c->index < pr->h.no ? pr->h.o2w[c->index] : -1;
    if (!mb) return 1;
    if (op < 0 || !mb->saved[op]) return pipe_cb_fail(&pr->h, "free_saved: saved state not live", c->index);
    cp_unplace(pr, mb->saved[op], c->bytes);
    mb->saved[op] = NULL;
    return 0;
}

static int cp_free_grad(void *user, const rkm_buffer_call *c)
{
    cp_rank *pr = (cp_rank *)user;
    cp_micro *mb = cp_micro_of(pr, c->micro);
    int32_t t = c->index >= 0 && c->index < pr->h.nt ? pr->h.t2w[c->index] : -1;
    if (!mb) return 1;
    if (t < 0 || !mb->grad[t]) return pipe_cb_fail(&pr->h, "free_grad: gradient not live", c->index);
    cp_unplace(pr, mb->grad[t], c->bytes);
    mb->grad[t] = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------
 * The transport: the last phase's send goes out with the next phase's
 * receive (one NCCL group), or through pinned host memory over MPI
 * ------------------------------------------------------------------------- */

/* After a phase: its output (or its input's gradient) at p is to be sent.
 * nccl: copied on the stream to the staging buffer, sent with the next
 * receive; mpi: copied to micro-batch m's pinned buffer of its kind and
 * sent at once (MPI_Isend, completed at the end of the step). */
static void cp_queue_send(cp_rank *pr, const void *p, uint64_t bytes, int peer, int kind, int32_t m)
{
    cudaStream_t st = pr->tr.stream;
    if (pr->o.nccl) {
        cp_cuda(pr, cudaMemcpyAsync(pr->d_send, p, (size_t)bytes, cudaMemcpyDeviceToDevice, st), "staging a send");
        pr->pend_send.bytes = bytes, pr->pend_send.peer = peer, pr->pend_send.tag = pipe_tag(kind, m);
        pr->pend_send.live = 1;
        return;
    }
    size_t i = (size_t)m + (kind == PIPE_TAG_GRAD ? (size_t)pr->h.o.micro : 0);
    pipe_mpi(&pr->h, pr->send_req[i] == MPI_REQUEST_NULL ? MPI_SUCCESS : MPI_Wait(&pr->send_req[i], MPI_STATUS_IGNORE),
           "MPI_Wait (a send)");
    cp_cuda(pr, cudaMemcpyAsync(pr->h_send[i], p, (size_t)bytes, cudaMemcpyDeviceToHost, st), "staging a send");
    cp_cuda(pr, cudaStreamSynchronize(st), "staging a send");
    pipe_mpi(&pr->h, MPI_Isend(pr->h_send[i], (int)bytes, MPI_BYTE, peer, pipe_tag(kind, m), MPI_COMM_WORLD, &pr->send_req[i]),
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
    pipe_mpi(&pr->h, MPI_Irecv(pr->h_recv, (int)bytes, MPI_BYTE, peer, pipe_tag(kind, m), MPI_COMM_WORLD, &q), "MPI_Irecv");
    pipe_mpi(&pr->h, MPI_Wait(&q, MPI_STATUS_IGNORE), "MPI_Wait (a receive)");
    cp_cuda(pr, cudaMemcpyAsync(p, pr->h_recv, (size_t)bytes, cudaMemcpyHostToDevice, st), "a receive to the device");
    cp_cuda(pr, cudaStreamSynchronize(st), "a receive to the device"); /* before h_recv takes the next */
}

/* The end of the step: every send done. */
static void cp_flush_sends(cp_rank *pr)
{
    if (pr->o.nccl) {
        cp_exchange(pr, NULL, 0, 0, 0, 0);
    } else {
        for (int i = 0; i < 2 * pr->h.o.micro; i++)
            if (pr->send_req[i] != MPI_REQUEST_NULL)
                pipe_mpi(&pr->h, MPI_Wait(&pr->send_req[i], MPI_STATUS_IGNORE), "MPI_Wait (a send)");
    }
    cp_cuda(pr, cudaStreamSynchronize(pr->tr.stream), "the step");
}

/* ---------------------------------------------------------------------------
 * The phases
 * ------------------------------------------------------------------------- */

static void cp_run_phase(cp_rank *pr, int bwd, int32_t m, const rkm_callbacks *cb)
{
    pr->h.bwd = bwd;
    pr->h.err[0] = 0;
    cp_bind(pr, &pr->mb[m]);
    rkm_result r = rkm_plan_execute_phase(pr->h.plan, bwd, m, cb);
    if (r == RKM_OK) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) snprintf(pr->h.err, sizeof pr->h.err, "a kernel: %s", cudaGetErrorString(e)), r = RKM_ERROR_CALLBACK;
    }
    if (r != RKM_OK) pipe_phase_failed(&pr->h);
}

static void cp_forward_phase(cp_rank *pr, int32_t m, const rkm_callbacks *cb)
{
    cp_micro *mb = &pr->mb[m];
    size_t N = (size_t)pr->tr.s.B * (size_t)pr->tr.s.T;
    pr->h.micro = m, pr->h.bwd = 0;
    cp_load_micro(pr, mb, pipe_micro_id(&pr->h, pr->h.step, pr->h.d, m));
    pipe_place_inputs(&pr->h, mb->act, m);
    cp_exchange(pr, pr->h.in_w >= 0 ? mb->act[pr->h.in_w] : NULL, pr->h.in_w >= 0 ? pipe_wbytes(&pr->h, pr->h.in_w) : 0,
                pipe_peer(&pr->h, pr->h.d, pr->h.s - 1), PIPE_TAG_ACT, m);
    if (pr->h.first)
        cp_cuda(pr, cudaMemcpyAsync(mb->act[pr->tr.gg.tokens], mb->h_tok, N * sizeof(int32_t), cudaMemcpyHostToDevice,
                                    pr->tr.stream), "tokens");
    if (pr->h.last)
        cp_cuda(pr, cudaMemcpyAsync(mb->act[pr->tr.gg.targets], mb->h_tok + N, N * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, pr->tr.stream), "targets");
    cp_run_phase(pr, 0, m, cb);
    if (!pr->h.last) {
        if (!mb->act[pr->h.out_w]) pipe_die(&pr->h, "the output is not live at the end of the forward phase");
        cp_queue_send(pr, mb->act[pr->h.out_w], pr->act_bytes, pipe_peer(&pr->h, pr->h.d, pr->h.s + 1), PIPE_TAG_ACT, m);
    }
}

static void cp_backward_phase(cp_rank *pr, int32_t m, const rkm_callbacks *cb)
{
    cp_micro *mb = &pr->mb[m];
    pr->h.micro = m, pr->h.bwd = 1;
    void *g = pr->h.last ? NULL : pipe_loss_grad_buffer(&pr->h, m);
    if (!pr->h.last && !g) pipe_die(&pr->h, "the stage layout has no buffer for the output's gradient");
    cp_exchange(pr, g, g ? pipe_wbytes(&pr->h, pr->h.out_w) : 0, pipe_peer(&pr->h, pr->h.d, pr->h.s + 1), PIPE_TAG_GRAD, m);
    cp_run_phase(pr, 1, m, cb);
    if (pr->h.last) { /* the losses were copied by the `loss` step: the mean, in order (fetch_results's) */
        size_t n = (size_t)pr->tr.s.B * (size_t)pr->tr.s.T;
        double sum = 0.0;
        cp_cuda(pr, cudaStreamSynchronize(pr->tr.stream), "the losses");
        for (size_t i = 0; i < n; i++) sum += mb->h_loss[i];
        pr->h.losses[m] = sum / (double)n;
    }
    for (int32_t t = 0; t < pr->nt_w; t++) {
        int input = t == pr->h.in_w || (pr->h.first && t == pr->tr.gg.tokens) || (pr->h.last && t == pr->tr.gg.targets);
        if (!mb->act[t] != !input || !mb->grad[t] != (t != pr->h.in_w)) pr->h.clean = 0;
    }
    for (int32_t op = 0; op < pr->no_w; op++)
        if (mb->saved[op]) pr->h.clean = 0;
    if (pr->h.in_w >= 0) {
        if (!mb->grad[pr->h.in_w]) pipe_die(&pr->h, "the input's gradient is not live at the end of the backward phase");
        cp_queue_send(pr, mb->grad[pr->h.in_w], pr->grad_bytes, pipe_peer(&pr->h, pr->h.d, pr->h.s - 1), PIPE_TAG_GRAD, m);
        cp_unplace(pr, mb->grad[pr->h.in_w], pr->grad_bytes);
        cp_unplace(pr, mb->act[pr->h.in_w], pr->grad_bytes);
        mb->grad[pr->h.in_w] = NULL;
        mb->act[pr->h.in_w] = NULL;
    }
    int32_t tk = pr->tr.gg.tokens, tg = pr->tr.gg.targets;
    if (pr->h.first) cp_unplace(pr, mb->act[tk], pipe_wbytes(&pr->h, tk)), mb->act[tk] = NULL;
    if (pr->h.last) cp_unplace(pr, mb->act[tg], pipe_wbytes(&pr->h, tg)), mb->act[tg] = NULL;
}

/* ---------------------------------------------------------------------------
 * After the phases: the update on the host
 * ------------------------------------------------------------------------- */

/* gpt2_model_update on the host, the weights uploaded again. */
static void cp_update(cp_rank *pr, gpt2_model *md, int t)
{
    gpt2_model_update(md, pr->h.o.lr, 0.0f, t);
    cp_cuda(pr, cudaMemcpy(pr->tr.params, md->params, md->num_params * sizeof(float), cudaMemcpyHostToDevice),
            "uploading the weights");
}

static void cp_train_step(cp_rank *pr, const rkm_callbacks *cb)
{
    size_t M = (size_t)pr->h.o.micro;
    double t0 = 0.0, busy, slowest = 0.0;
    pipe_mpi(&pr->h, MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    t0 = pipe_now();
    cp_cuda(pr, cudaMemsetAsync(pr->tr.grads, 0, pr->tr.host_model.num_params * sizeof(float), pr->tr.stream),
            "zero gradients");
    pr->h.cur = 0, pr->h.peak = 0;
    for (size_t i = 0; i < 2 * M; i++)
        if (pr->h.order[i].bwd) cp_backward_phase(pr, pr->h.order[i].micro, cb);
        else cp_forward_phase(pr, pr->h.order[i].micro, cb);
    pr->h.micro = -1;
    cp_flush_sends(pr);
    cp_bind(pr, NULL);
    busy = pipe_now() - t0;
    pipe_step_checks(&pr->h);
    /* the sums on the host (pipe_host.h's order) */
    cp_cuda(pr, cudaMemcpy(pr->tr.host_model.grads, pr->tr.grads, pr->tr.host_model.num_params * sizeof(float),
                           cudaMemcpyDeviceToHost), "fetching the gradients");
    pipe_reduce_step(&pr->h, pr->h.hist_grad ? pr->h.hist_grad + (size_t)(pr->h.step - 1) * pr->tr.host_model.num_params : NULL);
    pipe_mpi(&pr->h, MPI_Reduce(&busy, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD), "MPI_Reduce");
    if (pr->h.rank == 0)
        printf("step %d/%d: loss %.6f (mean of %d micro-batches), %.1f ms (the slowest rank)\n", pr->h.step, pr->h.o.steps,
               pipe_step_loss(&pr->h), (int)(M * (size_t)pr->h.D), slowest * 1e3);
    cp_update(pr, &pr->tr.host_model, pr->h.step);
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
    size_t M = (size_t)pr->h.o.micro, N = (size_t)tr->s.B * (size_t)tr->s.T, np, wl = pr->h.wte_len;
    float *final = NULL, *head = NULL;
    double *loss = (double *)malloc(M * (size_t)pr->h.D * sizeof(double));
    int bad = 0;
    *first_bad = 0;
    *digest = PIPE_DIGEST_INIT;
    if (gpt2_model_init(&md, &pr->h.o.shape, tr->seed) || !loss) pipe_die(&pr->h, "reference: out of host memory");
    np = md.num_params;
    final = (float *)malloc(np * sizeof(float));
    head = (float *)malloc(wl * sizeof(float));
    if (!final || !head) pipe_die(&pr->h, "reference: out of host memory");
    cp_micro_init(pr, &pr->ref_mb);
    cp_cuda(pr, cudaMemcpy(tr->params, md.params, np * sizeof(float), cudaMemcpyHostToDevice), "reference weights");
    if (pr->h.tied) cp_cuda(pr, cudaMalloc((void **)&tr->head_wte, wl * sizeof(float)), "reference: lm_head's wte part");
    if (rkm_plan_baseline(tr->gg.g, &base) != RKM_OK) pipe_die(&pr->h, rkm_context_errmsg(pr->h.ctx));
    {
        options so;
        memset(&so, 0, sizeof so);
        so.poison = pr->o.poison;
        if (arena_create(tr, &so, RKM_ARENA_LAYOUT, base, 0) != RKM_OK) pipe_die(&pr->h, lib_msg(tr));
    }
    for (int t = 1; t <= pr->h.o.steps; t++) {
        for (int d = 0; d < pr->h.D; d++) {
            cp_cuda(pr, cudaMemsetAsync(tr->grads, 0, np * sizeof(float), tr->stream), "reference: zero gradients");
            if (tr->head_wte)
                cp_cuda(pr, cudaMemsetAsync(tr->head_wte, 0, wl * sizeof(float), tr->stream), "reference: zero");
            for (size_t m = 0; m < M; m++) {
                cp_micro *mb = &pr->ref_mb;
                double s = 0.0;
                cp_load_micro(pr, mb, pipe_micro_id(&pr->h, t, d, (int)m));
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
                    pipe_die(&pr->h, tr->err);
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
            pipe_ref_add_replica(final, md.grads, np, d);
        }
        if (pipe_ref_step(&pr->h, t, loss, final, digest) && !bad) {
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

static void cp_print_plan(const cp_rank *pr)
{
    printf("gpt2_cuda: stage mode, L=%d C=%d NH=%d V=%d T=%d, micro-batches of B=%d rows, dropout=%g, inplace=%d, "
           "%zu parameters\n",
           pr->h.o.shape.L, pr->h.o.shape.C, pr->h.o.shape.NH, pr->h.o.shape.V, pr->h.o.shape.T, pr->h.o.shape.B,
           (double)pr->h.o.dropout, pr->h.o.shape.inplace, pr->tr.host_model.num_params);
    printf("pipeline: P=%d stages x D=%d replicas = %d ranks, M=%d micro-batches a step per replica, %s; transport %s; "
           "%s\n",
           pr->h.P, pr->h.D, pr->h.size, pr->h.o.micro, pr->h.o.schedule == RKM_PIPE_GPIPE ? "GPipe" : "1F1B",
           pr->o.nccl ? "NCCL (device to device)" : "MPI through pinned host memory",
           pr->o.profile_runs > 0 ? "op costs profiled on rank 0's device" : "op costs: the graph's guesses");
    pipe_print_stages(&pr->h);
    printf("simulated step: %.3f ms\n", pr->h.sim_step * 1e3);
}

static int cp_finish(cp_rank *pr)
{
    pipe_mem_report me, *all = NULL;
    int ok = 1, peaks_ok = 1, regions_ok = 1;
    memset(&me, 0, sizeof me);
    pipe_mem_report_fill(&pr->h, &me);
    if (pr->h.rank == 0 && !(all = (pipe_mem_report *)calloc((size_t)pr->h.size, sizeof *all))) pipe_die(&pr->h, "out of host memory");
    pipe_mpi(&pr->h, MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD),
           "MPI_Gather");
    if (pr->h.rank != 0) return 0;
    uint64_t digest = pipe_history_digest(&pr->h), ref_digest = 0;
    size_t M = (size_t)pr->h.o.micro;
    int first_bad = 0, same = -1;
    for (int r = 0; r < pr->h.size; r++) {
        const pipe_mem_report *a = &all[r];
        printf("rank %d (stage %d, replica %d): measured peak %llu bytes, predicted %llu: %s; region %llu bytes "
               "(the stage arena), %s the budget\n",
               r, r % pr->h.P, r / pr->h.P, (unsigned long long)a->peak, (unsigned long long)a->predicted,
               a->peaks_equal && a->peak == a->predicted ? "equal" : "DIFFERENT", (unsigned long long)a->region,
               a->region <= a->budget ? "within" : "OVER");
        pipe_mem_report_check(a, r, &ok, &peaks_ok, &regions_ok);
    }
    printf("digest: %016llx (every step's %d micro-batch losses and summed parameter gradients)\n",
           (unsigned long long)digest, (int)(M * (size_t)pr->h.D));
    if (pr->h.o.check) {
        same = cp_reference(pr, &ref_digest, &first_bad) == 0;
        printf("reference: %016llx (the single-process trainer on this device: the whole graph's baseline plan, the "
               "same %d x %d micro-batches in the same order, wte's two parts and the replicas summed as the "
               "pipeline sums them)%s\n",
               (unsigned long long)ref_digest, pr->h.D, pr->h.o.micro, same ? ": bit-identical" : ": DIFFERENT");
        if (!same) printf("reference: step %d differs\n", first_bad);
        ok &= same;
    }
    ok &= peaks_ok && regions_ok;
    printf("gpt2_cuda: %s stages=%d dp=%d micro=%d schedule=%s transport=%s digest=%016llx grads=%s peaks=%s "
           "regions=%s\n",
           ok ? "ok" : "FAILED", pr->h.P, pr->h.D, pr->h.o.micro, pr->h.o.schedule == RKM_PIPE_GPIPE ? "gpipe" : "1f1b",
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
    pipe_mpi(&pr->h, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, pr->h.rank, MPI_INFO_NULL, &node),
           "MPI_Comm_split_type");
    MPI_Comm_rank(node, &pr->local_rank);
    MPI_Comm_size(node, &local_size);
    MPI_Comm_free(&node);
#ifndef RKM_DUMMY_LAUNCH /* the dummy device is one device */
    int count = 0;
    cp_cuda(pr, cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    if (pr->o.nccl && count < local_size) {
        if (pr->h.rank == 0)
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
    if (pr->h.rank == 0) cp_nccl(pr, ncclGetUniqueId(&id), "ncclGetUniqueId");
    pipe_mpi(&pr->h, MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "MPI_Bcast (ncclUniqueId)");
    cp_nccl(pr, ncclCommInitRank(&pr->comm, pr->h.size, id, pr->h.rank), "ncclCommInitRank");
#else
    (void)pr;
#endif
}

static void cp_teardown(cp_rank *pr)
{
    for (int m = 0; pr->mb && m < pr->h.o.micro; m++) cp_micro_free(&pr->mb[m]);
    free(pr->mb);
    if (pr->h_send)
        for (int i = 0; i < 2 * pr->h.o.micro; i++) cudaFreeHost(pr->h_send[i]);
    free(pr->h_send);
    free(pr->send_req);
    cudaFreeHost(pr->h_recv);
    cudaFree(pr->d_send);
    cudaFree(pr->region_alloc);
#ifdef GPT2_HAVE_NCCL
    if (pr->comm) ncclCommDestroy(pr->comm);
#endif
    pipe_host_free(&pr->h);
    cp_bind(pr, NULL);
    trainer_free(&pr->tr);
}

static int pipe_main(int argc, char **argv)
{
    static cp_rank pr; /* large; one per process */
    int rc;
    pipe_start(&pr.h, "gpt2_cuda", &argc, &argv);
    pr.h.gg = &pr.tr.gg, pr.h.md = &pr.tr.host_model;
    rc = cp_parse(&pr, argc, argv);
    if (!rc) rc = cp_device(&pr);
    if (!rc) {
        pr.h.s = pr.h.rank % pr.h.P, pr.h.d = pr.h.rank / pr.h.P;
        if (trainer_init(&pr.tr, pr.h.ctx, &pr.h.o.shape, pr.h.o.dropout)) pipe_die(&pr.h, pr.tr.err);
        pr.keep_first = pr.tr.d_first, pr.keep_next = pr.tr.d_next;
        pr.nt_w = rkm_graph_num_tensors(pr.tr.gg.g);
        pr.no_w = rkm_graph_num_ops(pr.tr.gg.g);
        rc = pipe_receive_plan(&pr.h, cp_profile, &pr);
    }
    if (!rc) {
        rkm_callbacks cb;
        cp_stage_setup(&pr);
        cp_nccl_init(&pr);
        memset(&cb, 0, sizeof cb);
        cb.user = &pr;
        cb.forward = cp_forward, cb.backward = cp_backward, cb.loss = cp_loss;
        cb.free_tensor = cp_free_tensor, cb.free_saved = cp_free_saved, cb.free_grad = cp_free_grad;
        if (pr.h.rank == 0) {
            pipe_history_alloc(&pr.h);
            cp_print_plan(&pr);
        }
        for (pr.h.step = 1; pr.h.step <= pr.h.o.steps; pr.h.step++) cp_train_step(&pr, &cb);
        pr.h.step = pr.h.o.steps;
        rc = cp_finish(&pr);
        pipe_idle_barrier(&pr.h);
    }
    if (pr.tr.gg.g || pr.tr.stream) cp_teardown(&pr);
    rkm_context_destroy(pr.h.ctx);
    MPI_Finalize();
    return rc;
}
