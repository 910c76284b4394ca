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
 * The host logic that the CUDA stage mode (examples/gpt2_cuda_pipe.cuh)
 * shares, the plan broadcast to the gradient sums, is examples/pipe_host.h.
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
#include "pipe_host.h"

#define PIPE_DEFAULT_DATA "examples/data/fables.txt"

/* The options of this trainer only (the shared ones: pr->h.o). */
typedef struct options {
    int stages;
    const char *algo, *data;
    uint64_t seed;
    int fail_rank, fail_step, fail_micro, fail_mpi;
} options;

/* A send in flight and the region's bytes it reads. */
typedef struct pending {
    MPI_Request req;
    uint64_t lo, hi;
} pending;

/* What each rank reports to rank 0 at the end. */
typedef struct rank_report {
    double fwd_ms, bwd_ms; /* mean measured phase times */
    double recv_ms;        /* mean time a step waited in receives */
    double busy_ms;        /* mean time from the step's start to the rank's last phase's end */
    pipe_mem_report mem;   /* the peaks (the largest of every step, the prediction), the region */
} rank_report;

typedef struct pipe_rank {
    pipe_host h; /* the stage, its plan, layout and region (pipe_host.h) */
    options o;
    gpt2_graph gg;
    gpt2_model md;
    unsigned char *text;
    size_t text_n;
    gpt2_step *mst; /* per micro-batch: its tensors, saved states and gradients */
    rkm_callbacks cb;
    pending pend[64];
    int npend;
    int fail_armed;
    /* measurements */
    double fwd_s, bwd_s, recv_s, busy_s;
    int nfwd, nbwd, nsteps_timed;
    double *step_wall; /* rank 0: per step, the slowest rank's busy time */
} pipe_rank;

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
    pipe_options *c = &pr->h.o;
    options *o = &pr->o;
    const char *why = NULL;
    memset(c, 0, sizeof *c);
    memset(o, 0, sizeof *o);
    c->shape.L = 4, c->shape.C = 64, c->shape.NH = 4, c->shape.V = 256, c->shape.B = 2, c->shape.T = 32;
    c->steps = 3, c->micro = 8, c->dp = 1, c->check = 1, c->budget = "50%", o->data = PIPE_DEFAULT_DATA;
    c->lr = 1e-3f, o->seed = 1337, o->fail_rank = -1, o->fail_step = -1, o->fail_micro = -1;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *n = pipe_int_option(c, a), taken;
        if (!n)
            n = !strcmp(a, "--stages") ? &o->stages : !strcmp(a, "--fail-rank") ? &o->fail_rank
              : !strcmp(a, "--fail-step") ? &o->fail_step : !strcmp(a, "--fail-micro") ? &o->fail_micro : NULL;
        if (!v) return usage(pr->h.rank, strcmp(a, "-h") && strcmp(a, "--help") ? "missing value" : "");
        if (n) {
            if (!arg_int(v, 0, INT_MAX, n)) return usage(pr->h.rank, "a shape or count: a whole number");
        } else if ((taken = pipe_value_option(c, a, v, &why)) != 0) {
            if (taken < 0) return usage(pr->h.rank, why);
        } else if (!strcmp(a, "--algo")) o->algo = v;
        else if (!strcmp(a, "--data")) o->data = v;
        else if (!strcmp(a, "--link")) {
            if (!arg_double(v, &c->link_bw) || c->link_bw < 0) return usage(pr->h.rank, "--link: bytes per second");
        } else if (!strcmp(a, "--seed")) {
            if (!arg_u64(v, &o->seed)) return usage(pr->h.rank, "--seed: a whole number");
        } else if (!strcmp(a, "--fail-kind") && (!strcmp(v, "callback") || !strcmp(v, "mpi")))
            o->fail_mpi = !strcmp(v, "mpi");
        else return usage(pr->h.rank, "unknown option");
    }
    c->shape.dropout = c->dropout > 0.0f;
    c->algo = RKM_ALGO_DEFAULT;
    if (o->algo && rkm_algo_from_name(pr->h.ctx, o->algo, &c->algo) != RKM_OK) return usage(pr->h.rank, "unknown --algo");
    if ((why = pipe_options_check(&pr->h, o->stages)) != NULL) return usage(pr->h.rank, why);
    if (o->fail_micro < 0) o->fail_micro = c->micro / 2;
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
    return pr->text && pr->text_n > (size_t)pr->h.o.shape.B * (size_t)pr->h.o.shape.T + 1 ? 0 : -1;
}

static void batch_at(const pipe_rank *pr, uint64_t q, int32_t *tokens, int32_t *targets)
{
    size_t bt = (size_t)pr->h.o.shape.B * (size_t)pr->h.o.shape.T, span = pr->text_n - bt - 1;
    size_t pos = (size_t)((q * bt) % span);
    for (size_t i = 0; i < bt; i++) {
        if (tokens) tokens[i] = pr->text[pos + i];
        if (targets) targets[i] = pr->text[pos + i + 1];
    }
}

/* ---------------------------------------------------------------------------
 * Planning (rank 0) and what every rank receives of it
 * ------------------------------------------------------------------------- */

/* The profiled graph (gpt2.c's profile_graph: three baseline steps through
 * the counting allocator) in place of the built one. */
static int profile_graph(pipe_rank *pr)
{
    rkm_profile_desc pd;
    gpt2_step prof;
    rkm_callbacks cb;
    rkm_graph *profiled = NULL;
    size_t bt = (size_t)pr->h.o.shape.B * (size_t)pr->h.o.shape.T;
    int32_t *tok = (int32_t *)malloc(2 * bt * sizeof(int32_t));
    rkm_result r = RKM_ERROR_NOMEM;
    memset(&pd, 0, sizeof pd);
    pd.runs = 3;
    if (tok && gpt2_step_init(&prof, &pr->gg, &pr->md, pr->h.o.dropout, pr->o.seed) == 0) {
        batch_at(pr, 0, tok, tok + bt);
        cb = gpt2_callbacks(&prof);
        if (gpt2_step_load(&prof, tok, tok + bt) == 0) r = rkm_graph_profile(pr->gg.g, &cb, &pd, &profiled);
        gpt2_step_unload(&prof);
        gpt2_step_free(&prof);
    }
    free(tok);
    gpt2_model_zero_grad(&pr->md);
    if (r != RKM_OK) {
        printf("gpt2_pipe: FAILED profile: %s\n", rkm_context_errmsg(pr->h.ctx));
        return 1;
    }
    rkm_graph_destroy(pr->gg.g);
    pr->gg.g = profiled;
    return 0;
}

/* Rank 0, before planning (pipe_receive_plan): the stage count checked,
 * the graph profiled. */
static int profile_rank0(void *user)
{
    pipe_rank *pr = (pipe_rank *)user;
    if (pr->h.P > PIPE_MAX_STAGES) {
        printf("gpt2_pipe: FAILED at most %d stages\n", PIPE_MAX_STAGES);
        return 2;
    }
    return profile_graph(pr);
}

/* ---------------------------------------------------------------------------
 * My stage: ids, buffers, the region
 * ------------------------------------------------------------------------- */

/* pipe_host.h's stage setup, then the region (host memory at the layout's
 * alignment) and a gpt2_step per micro-batch. */
static void stage_setup(pipe_rank *pr)
{
    size_t M = (size_t)pr->h.o.micro;
    pipe_stage_setup(&pr->h);
    {
        uint64_t a = pr->h.mem.alignment ? pr->h.mem.alignment : 256, bytes = (pr->h.mem.arena_bytes + a - 1) / a * a;
        pr->h.region = (unsigned char *)aligned_alloc((size_t)a, (size_t)(bytes ? bytes : a));
    }
    pr->mst = (gpt2_step *)calloc(M, sizeof *pr->mst);
    if (!pr->h.region || !pr->mst) pipe_die(&pr->h, "out of memory");
    for (size_t m = 0; m < M; m++)
        if (gpt2_step_init(&pr->mst[m], &pr->gg, &pr->md, pr->h.o.dropout, pr->o.seed)) pipe_die(&pr->h, "out of memory");
}

/* ---------------------------------------------------------------------------
 * The callbacks: stage ids to the whole graph's, buffers in the region, the
 * examples' kernels (gpt2_model.h)
 * ------------------------------------------------------------------------- */

static gpt2_step *micro_step(pipe_rank *pr, int32_t m)
{
    return pipe_check_micro(&pr->h, m) < 0 ? NULL : &pr->mst[m];
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
        return pipe_cb_fail(&pr->h, "injected failure (--fail-rank, --fail-step)", pr->h.o2w[c->op]);
    if (c->op < 0 || c->op >= pr->h.no || c->n_out != 1 || pipe_map_ids(&pr->h, c->in, c->n_in, in) ||
        pipe_map_ids(&pr->h, c->out, c->n_out, out))
        return pipe_cb_fail(&pr->h, "forward: ids out of range", c->op);
    op = pr->h.o2w[c->op];
    d = &pr->gg.ops[op];
    for (int i = 0; i < d->n_in; i++)
        if (!st->act[d->in[i]]) return pipe_cb_fail(&pr->h, "forward: input not live", d->in[i]);
    if (c->out_new[0] == RKM_OUT_NEW) {
        if (st->act[d->out]) return pipe_cb_fail(&pr->h, "forward: new output already live", d->out);
        if (!(st->act[d->out] = pipe_place(&pr->h, RKM_BUFFER_TENSOR, c->out[0], c->step, c->micro, pipe_wbytes(&pr->h, d->out))))
            return 1;
    } else if (c->out_new[0] == RKM_OUT_INPLACE) { /* in[0]'s buffer becomes out[0]'s */
        if (st->act[d->out] || !st->act[d->in[0]]) return pipe_cb_fail(&pr->h, "forward: in place without its input", op);
        st->act[d->out] = st->act[d->in[0]];
        st->act[d->in[0]] = NULL;
    } else if (!st->act[d->out]) {
        return pipe_cb_fail(&pr->h, "forward: output to recompute in place is not live", d->out);
    }
    if (c->save) {
        if (st->phantom[op]) return pipe_cb_fail(&pr->h, "forward: saved state already live", op);
        if (!(st->phantom[op] = pipe_place(&pr->h, RKM_BUFFER_PHANTOM, c->op, c->step, c->micro, c->phantom))) return 1;
    }
    if (c->ws_bytes && !(ws = (float *)pipe_place(&pr->h, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes)))
        return 1;
    if (d->kind == GPT2_ATTENTION && !st->phantom[op] && c->ws_bytes < c->phantom)
        return pipe_cb_fail(&pr->h, "forward: attention has nowhere to write its probabilities", op);
    gpt2__forward_kernel(st, d, op, c->save, ws);
    pipe_unplace(&pr->h, ws, c->ws_bytes);
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
    if (c->op < 0 || c->op >= pr->h.no || pipe_map_ids(&pr->h, c->in, c->n_in, in) || pipe_map_ids(&pr->h, c->out, c->n_out, out) ||
        pipe_map_ids(&pr->h, c->saved, c->n_saved, saved))
        return pipe_cb_fail(&pr->h, "backward: ids out of range", c->op);
    op = pr->h.o2w[c->op];
    d = &pr->gg.ops[op];
    w.op = op, w.in = in, w.out = out, w.saved = saved;
    if (!st->grad[d->out]) return pipe_cb_fail(&pr->h, "backward: output gradient not live", d->out);
    for (int i = 0; i < c->n_saved; i++)
        if (!st->act[saved[i]]) return pipe_cb_fail(&pr->h, "backward: saved tensor not live", saved[i]);
    if (c->phantom && !st->phantom[op]) return pipe_cb_fail(&pr->h, "backward: saved state not live", op);
    for (int i = 0; i < d->n_in && i < c->n_in; i++) {
        int32_t t = d->in[i];
        if (c->in_grad[i] == RKM_GRAD_NEW) { /* the kernels add into it: zeroed */
            if (st->grad[t]) return pipe_cb_fail(&pr->h, "backward: new gradient already live", t);
            if (!(st->grad[t] = (float *)pipe_place(&pr->h, RKM_BUFFER_GRAD, c->in[i], c->step, c->micro, pipe_wbytes(&pr->h, t))))
                return 1;
            memset(st->grad[t], 0, (size_t)pipe_wbytes(&pr->h, t));
        } else if (c->in_grad[i] == RKM_GRAD_INPLACE) {
            if (st->grad[t]) return pipe_cb_fail(&pr->h, "backward: in-place gradient already live", t);
            st->grad[t] = st->grad[d->out];
        } else if (c->in_grad[i] == RKM_GRAD_ACCUMULATE && !st->grad[t]) {
            return pipe_cb_fail(&pr->h, "backward: gradient to accumulate into is not live", t);
        }
        if (c->in_grad[i] != RKM_GRAD_NONE) din[i] = st->grad[t];
    }
    if (c->ws_bytes) {
        if (!(ws = (float *)pipe_place(&pr->h, RKM_BUFFER_WORKSPACE, c->op, c->step, c->micro, c->ws_bytes))) return 1;
        memset(ws, 0, (size_t)c->ws_bytes);
    }
    gpt2__backward_kernel(st, d, &w, op, din, ws);
    if (c->n_in && c->in_grad[0] == RKM_GRAD_INPLACE) st->grad[d->out] = NULL; /* now grad(in[0]) */
    pipe_unplace(&pr->h, ws, c->ws_bytes);
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
    if (c->index != pr->h.out_s) return pipe_cb_fail(&pr->h, "loss: not the stage's output", c->index);
    if (!st->act[pr->h.out_w] || st->grad[pr->h.out_w]) return pipe_cb_fail(&pr->h, "loss: output not live or gradient live", c->index);
    if (!(g = (float *)pipe_place(&pr->h, RKM_BUFFER_GRAD, c->index, c->step, c->micro, c->bytes))) return 1;
    st->grad[pr->h.out_w] = g;
    if (pr->h.last) {
        size_t n = (size_t)(c->bytes / sizeof(float));
        const float *losses = (const float *)st->act[pr->h.out_w];
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
    int32_t t = c->index >= 0 && c->index < pr->h.nt ? pr->h.t2w[c->index] : -1;
    if (!st) return 1;
    if (t < 0 || !st->act[t]) return pipe_cb_fail(&pr->h, "free: tensor not live", c->index);
    pipe_unplace(&pr->h, st->act[t], c->bytes);
    st->act[t] = NULL;
    return 0;
}

static int pcb_free_saved(void *user, const rkm_buffer_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    int32_t op = c->index >= 0 && c->index < pr->h.no ? pr->h.o2w[c->index] : -1;
    if (!st) return 1;
    if (op < 0 || !st->phantom[op]) return pipe_cb_fail(&pr->h, "free_saved: saved state not live", c->index);
    pipe_unplace(&pr->h, st->phantom[op], c->bytes);
    st->phantom[op] = NULL;
    return 0;
}

static int pcb_free_grad(void *user, const rkm_buffer_call *c)
{
    pipe_rank *pr = (pipe_rank *)user;
    gpt2_step *st = micro_step(pr, c->micro);
    int32_t t = c->index >= 0 && c->index < pr->h.nt ? pr->h.t2w[c->index] : -1;
    if (!st) return 1;
    if (t < 0 || !st->grad[t]) return pipe_cb_fail(&pr->h, "free_grad: gradient not live", c->index);
    pipe_unplace(&pr->h, st->grad[t], c->bytes);
    st->grad[t] = NULL;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Sends and receives
 * ------------------------------------------------------------------------- */

/* Waits for the sends that read bytes of [lo, hi) of the region: before
 * those bytes are written again. */
static void wait_sends(pipe_rank *pr, uint64_t lo, uint64_t hi)
{
    int n = 0;
    for (int i = 0; i < pr->npend; i++) {
        if (pr->pend[i].lo < hi && lo < pr->pend[i].hi)
            pipe_mpi(&pr->h, MPI_Wait(&pr->pend[i].req, MPI_STATUS_IGNORE), "MPI_Wait (a send)");
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
    q->lo = (uint64_t)((const unsigned char *)p - pr->h.region);
    q->hi = q->lo + bytes;
    pipe_mpi(&pr->h, MPI_Isend(p, (int)bytes, MPI_BYTE, dest, tag, MPI_COMM_WORLD, &q->req), "MPI_Isend");
    pr->npend++;
}

/* Into the region at p: posted once the bytes are free, then waited for. */
static void recv_into(pipe_rank *pr, void *p, uint64_t bytes, int src, int tag)
{
    MPI_Request req;
    uint64_t lo = (uint64_t)((unsigned char *)p - pr->h.region);
    double t0 = pipe_now();
    wait_sends(pr, lo, lo + bytes);
    pipe_mpi(&pr->h, MPI_Irecv(p, (int)bytes, MPI_BYTE, src, tag, MPI_COMM_WORLD, &req), "MPI_Irecv");
    pipe_mpi(&pr->h, MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (a receive)");
    pr->recv_s += pipe_now() - t0;
}

/* ---------------------------------------------------------------------------
 * The phases
 * ------------------------------------------------------------------------- */

/* The region's bytes a phase of micro-batch m may write: its slot and the
 * transient region above the slots. */
static void phase_ranges(const pipe_rank *pr, int32_t m, uint64_t r[4])
{
    uint64_t S = pr->h.mem.slot_bytes, k = (uint64_t)pr->h.mem.in_flight;
    r[0] = ((uint64_t)m % k) * S, r[1] = r[0] + S;
    r[2] = k * S, r[3] = pr->h.mem.arena_bytes;
}

static void run_phase(pipe_rank *pr, int bwd, int32_t m)
{
    double t0 = pipe_now();
    pr->h.bwd = bwd;
    pr->h.err[0] = 0;
    if (rkm_plan_execute_phase(pr->h.plan, bwd, m, &pr->cb) != RKM_OK) pipe_phase_failed(&pr->h);
    t0 = pipe_now() - t0;
    if (pr->h.step > 1 || pr->h.o.steps == 1) {
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
    uint64_t r[4], q = pipe_micro_id(&pr->h, pr->h.step, pr->h.d, m);
    pr->h.micro = m, pr->h.bwd = 0;
    phase_ranges(pr, m, r);
    wait_sends(pr, r[0], r[1]);
    wait_sends(pr, r[2], r[3]);
    st->key = q + 1;
    st->loss = NAN;
    st->err[0] = 0;
    pipe_place_inputs(&pr->h, st->act, m);
    if (pr->h.in_w >= 0)
        recv_into(pr, st->act[pr->h.in_w], pipe_wbytes(&pr->h, pr->h.in_w), pipe_peer(&pr->h, pr->h.d, pr->h.s - 1),
                  pipe_tag(PIPE_TAG_ACT, m));
    if (pr->h.first) batch_at(pr, q, (int32_t *)st->act[pr->gg.tokens], NULL);
    if (pr->h.last) batch_at(pr, q, NULL, (int32_t *)st->act[pr->gg.targets]);
    pr->fail_armed = pr->h.rank == pr->o.fail_rank && pr->h.step == pr->o.fail_step && m == pr->o.fail_micro;
    if (pr->fail_armed && pr->o.fail_mpi) /* a send to a rank that does not exist: MPI's error */
        pipe_mpi(&pr->h, MPI_Send(pr->h.region, 1, MPI_BYTE, pr->h.size + 7, 0, MPI_COMM_WORLD), "MPI_Send (--fail-kind mpi)");
    run_phase(pr, 0, m);
    pr->fail_armed = 0;
    if (!pr->h.last) {
        if (!st->act[pr->h.out_w]) pipe_die(&pr->h, "the output is not live at the end of the forward phase");
        isend(pr, st->act[pr->h.out_w], pipe_wbytes(&pr->h, pr->h.out_w), pipe_peer(&pr->h, pr->h.d, pr->h.s + 1),
              pipe_tag(PIPE_TAG_ACT, m));
    }
}

/* Backward phase of micro-batch m: the output's gradient received (the
 * last stage seeds its own), the plan's phase, the input's gradient sent
 * back; then only the inputs and that gradient were left, and go. */
static void backward(pipe_rank *pr, int32_t m)
{
    gpt2_step *st = &pr->mst[m];
    uint64_t r[4];
    pr->h.micro = m, pr->h.bwd = 1;
    phase_ranges(pr, m, r);
    wait_sends(pr, r[0], r[1]); /* the output sent from m's slot, among others */
    wait_sends(pr, r[2], r[3]);
    if (!pr->h.last) {
        void *g = pipe_loss_grad_buffer(&pr->h, m);
        if (!g) pipe_die(&pr->h, "the stage layout has no buffer for the output's gradient");
        recv_into(pr, g, pipe_wbytes(&pr->h, pr->h.out_w), pipe_peer(&pr->h, pr->h.d, pr->h.s + 1), pipe_tag(PIPE_TAG_GRAD, m));
    }
    run_phase(pr, 1, m);
    if (pr->h.last) pr->h.losses[m] = st->loss;
    /* what the plan leaves: the inputs and the gradient to send back */
    for (int32_t t = 0; t < rkm_graph_num_tensors(pr->gg.g); t++) {
        int input = t == pr->h.in_w || (pr->h.first && t == pr->gg.tokens) || (pr->h.last && t == pr->gg.targets);
        if (!st->act[t] != !input || !st->grad[t] != (t != pr->h.in_w)) pr->h.clean = 0;
    }
    for (int32_t op = 0; op < rkm_graph_num_ops(pr->gg.g); op++)
        if (st->phantom[op]) pr->h.clean = 0;
    if (pr->h.in_w >= 0) {
        if (!st->grad[pr->h.in_w]) pipe_die(&pr->h, "the input's gradient is not live at the end of the backward phase");
        isend(pr, st->grad[pr->h.in_w], pipe_wbytes(&pr->h, pr->h.in_w), pipe_peer(&pr->h, pr->h.d, pr->h.s - 1), pipe_tag(PIPE_TAG_GRAD, m));
        pipe_unplace(&pr->h, st->grad[pr->h.in_w], pipe_wbytes(&pr->h, pr->h.in_w));
        pipe_unplace(&pr->h, st->act[pr->h.in_w], pipe_wbytes(&pr->h, pr->h.in_w));
        st->grad[pr->h.in_w] = NULL;
        st->act[pr->h.in_w] = NULL;
    }
    if (pr->h.first) pipe_unplace(&pr->h, st->act[pr->gg.tokens], pipe_wbytes(&pr->h, pr->gg.tokens)), st->act[pr->gg.tokens] = NULL;
    if (pr->h.last) pipe_unplace(&pr->h, st->act[pr->gg.targets], pipe_wbytes(&pr->h, pr->gg.targets)), st->act[pr->gg.targets] = NULL;
}

/* ---------------------------------------------------------------------------
 * Training
 * ------------------------------------------------------------------------- */

static void train_step(pipe_rank *pr)
{
    size_t M = (size_t)pr->h.o.micro;
    double t0, busy, slowest = 0.0;
    pipe_mpi(&pr->h, MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    t0 = pipe_now();
    gpt2_model_zero_grad(&pr->md);
    pr->h.cur = 0, pr->h.peak = 0;
    for (size_t i = 0; i < 2 * M; i++)
        if (pr->h.order[i].bwd) backward(pr, pr->h.order[i].micro);
        else forward(pr, pr->h.order[i].micro);
    wait_sends(pr, 0, UINT64_MAX);
    busy = pipe_now() - t0;
    pipe_step_checks(&pr->h);
    pipe_reduce_step(&pr->h, pr->h.hist_grad ? pr->h.hist_grad + (size_t)(pr->h.step - 1) * pr->md.num_params : NULL);
    pipe_mpi(&pr->h, MPI_Reduce(&busy, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD), "MPI_Reduce");
    if (pr->h.step > 1 || pr->h.o.steps == 1) pr->busy_s += busy, pr->nsteps_timed++;
    if (pr->h.rank == 0) {
        pr->step_wall[pr->h.step - 1] = slowest;
        printf("step %d/%d: loss %.6f (mean of %d micro-batches), %.1f ms (the slowest rank, from the barrier to "
               "its last phase's end)\n",
               pr->h.step, pr->h.o.steps, pipe_step_loss(&pr->h), (int)(M * (size_t)pr->h.D), slowest * 1e3);
    }
    gpt2_model_update(&pr->md, pr->h.o.lr, 0.0f, pr->h.step);
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
    size_t M = (size_t)pr->h.o.micro, bt = (size_t)pr->h.o.shape.B * (size_t)pr->h.o.shape.T, np;
    int32_t *tok = (int32_t *)malloc(2 * bt * sizeof(int32_t));
    float *final = NULL;
    double *loss = (double *)malloc(M * (size_t)pr->h.D * sizeof(double));
    int bad = 0;
    memset(&rh, 0, sizeof rh);
    *first_bad = 0;
    *digest = 0xcbf29ce484222325ull;
    if (gpt2_model_init(&md, &pr->h.o.shape, pr->o.seed) || !tok || !loss ||
        gpt2_step_init(&rh.st, &pr->gg, &md, pr->h.o.dropout, pr->o.seed) || rkm_plan_baseline(pr->gg.g, &base) != RKM_OK)
        pipe_die(&pr->h, "reference: out of memory");
    np = md.num_params;
    rh.tied = pr->h.tied;
    rh.head_wte = (float *)calloc(md.sizes[GPT2_WTE], sizeof(float));
    final = (float *)malloc(np * sizeof(float));
    if (!rh.head_wte || !final) pipe_die(&pr->h, "reference: out of memory");
    memset(&cb, 0, sizeof cb);
    cb.user = &rh;
    cb.forward = ref_wrap_forward, cb.backward = ref_backward, cb.loss = ref_wrap_loss;
    cb.free_tensor = ref_wrap_free_tensor, cb.free_saved = ref_wrap_free_saved, cb.free_grad = ref_wrap_free_grad;
    for (int t = 1; t <= pr->h.o.steps; t++) {
        for (int d = 0; d < pr->h.D; d++) {
            gpt2_model_zero_grad(&md);
            memset(rh.head_wte, 0, md.sizes[GPT2_WTE] * sizeof(float));
            for (size_t m = 0; m < M; m++) {
                uint64_t q = pipe_micro_id(&pr->h, t, d, (int)m);
                batch_at(pr, q, tok, tok + bt);
                if (gpt2_step_load(&rh.st, tok, tok + bt)) pipe_die(&pr->h, "reference: out of memory");
                rh.st.key = q + 1;
                rh.st.err[0] = 0;
                if (rkm_plan_execute(base, &cb) != RKM_OK || gpt2_step_leaks(&rh.st) != 0) {
                    char what[400];
                    snprintf(what, sizeof what, "reference step %d: %s [%s]", t, rh.st.err,
                             rkm_context_errmsg(pr->h.ctx));
                    pipe_die(&pr->h, what);
                }
                loss[(size_t)d * M + m] = rh.st.loss;
            }
            if (rh.tied)
                for (size_t i = 0; i < md.sizes[GPT2_WTE]; i++) md.g[GPT2_WTE][i] = md.g[GPT2_WTE][i] + rh.head_wte[i];
            pipe_ref_add_replica(final, md.grads, np, d);
        }
        if (pipe_ref_step(&pr->h, t, loss, final, digest) && !bad) {
            bad = 1;
            *first_bad = t;
        }
        memcpy(md.grads, final, np * sizeof(float));
        gpt2_model_update(&md, pr->h.o.lr, 0.0f, t);
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

static void print_plan(const pipe_rank *pr)
{
    rkm_graph_stats gs;
    rkm_graph_stats_get(pr->gg.g, &gs);
    printf("gpt2_pipe: L=%d C=%d NH=%d V=%d T=%d, micro-batches of B=%d rows, dropout=%g, %zu parameters; %s\n",
           pr->h.o.shape.L, pr->h.o.shape.C, pr->h.o.shape.NH, pr->h.o.shape.V, pr->h.o.shape.T, pr->h.o.shape.B,
           (double)pr->h.o.dropout, pr->md.num_params, pr->o.data);
    printf("pipeline: P=%d stages x D=%d replicas = %d ranks, M=%d micro-batches a step per replica, %s; graph: %d "
           "ops, %d blocks, profiled on rank 0\n",
           pr->h.P, pr->h.D, pr->h.size, pr->h.o.micro, pr->h.o.schedule == RKM_PIPE_GPIPE ? "GPipe" : "1F1B",
           (int)rkm_graph_num_ops(pr->gg.g), (int)gs.blocks);
    pipe_print_stages(&pr->h);
    printf("simulated step: %.2f ms (rkm_pipeline_plan's replay of the stage plans' phase times%s)\n",
           pr->h.sim_step * 1e3, pr->h.o.link_bw > 0 ? " and the links" : ", free links");
}

static int finish(pipe_rank *pr)
{
    rank_report me, *all = NULL;
    int ok = 1, peaks_ok = 1, regions_ok = 1;
    memset(&me, 0, sizeof me);
    me.fwd_ms = pr->nfwd ? pr->fwd_s / pr->nfwd * 1e3 : 0.0;
    me.bwd_ms = pr->nbwd ? pr->bwd_s / pr->nbwd * 1e3 : 0.0;
    me.recv_ms = pr->nsteps_timed ? pr->recv_s / pr->h.o.steps * 1e3 : 0.0;
    me.busy_ms = pr->nsteps_timed ? pr->busy_s / pr->nsteps_timed * 1e3 : 0.0;
    pipe_mem_report_fill(&pr->h, &me.mem);
    if (pr->h.rank == 0 && !(all = (rank_report *)calloc((size_t)pr->h.size, sizeof *all))) pipe_die(&pr->h, "out of memory");
    pipe_mpi(&pr->h, MPI_Gather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, 0, MPI_COMM_WORLD),
           "MPI_Gather");
    if (pr->h.rank != 0) return 0;
    {
        uint64_t digest = pipe_history_digest(&pr->h), ref_digest = 0;
        size_t M = (size_t)pr->h.o.micro;
        rkm_pipe_stage *ps = (rkm_pipe_stage *)calloc((size_t)pr->h.P, sizeof *ps);
        double replay = 0.0, wall = 0.0;
        int timed = 0, first_bad = 0, same = -1;
        if (!ps) pipe_die(&pr->h, "out of memory");
        for (int r = 0; r < pr->h.size; r++) {
            const rank_report *a = &all[r];
            const pipe_mem_report *am = &a->mem;
            int s = r % pr->h.P;
            printf("rank %d (stage %d, replica %d): measured peak %llu bytes, predicted %llu: %s; region %llu bytes "
                   "(the stage arena), %s the budget; phases measured fwd %.3f ms bwd %.3f ms, predicted fwd %.3f "
                   "bwd %.3f; waited in receives %.2f ms a step\n",
                   r, s, r / pr->h.P, (unsigned long long)am->peak, (unsigned long long)am->predicted,
                   am->peaks_equal ? "equal" : "DIFFERENT", (unsigned long long)am->region,
                   am->region <= am->budget ? "within" : "OVER", a->fwd_ms, a->bwd_ms, pr->h.info[s].fwd_seconds * 1e3,
                   pr->h.info[s].bwd_seconds * 1e3, a->recv_ms);
            pipe_mem_report_check(am, r, &ok, &peaks_ok, &regions_ok);
            if (r < pr->h.P) ps[s].fwd = a->fwd_ms * 1e-3, ps[s].bwd = a->bwd_ms * 1e-3;
        }
        rkm_pipeline_simulate(pr->h.ctx, ps, pr->h.P, pr->h.o.micro, pr->h.o.schedule, NULL, NULL, &replay);
        free(ps);
        for (int t = (pr->h.o.steps > 1 ? 2 : 1); t <= pr->h.o.steps; t++, timed++) wall += pr->step_wall[t - 1];
        printf("step time: measured %.2f ms (mean of %d steps, the slowest rank), simulated %.2f ms; the simulator "
               "replaying the measured phase times: %.2f ms (%d ranks share %ld cores here: phases run slower than "
               "profiled and ranks wait for the CPU)\n",
               wall / timed * 1e3, timed, pr->h.sim_step * 1e3, replay * 1e3, pr->h.size, sysconf(_SC_NPROCESSORS_ONLN));
        printf("digest: %016llx (every step's %d micro-batch losses and summed parameter gradients)\n",
               (unsigned long long)digest, (int)(M * (size_t)pr->h.D));
        if (pr->h.o.check) {
            same = reference(pr, &ref_digest, &first_bad) == 0;
            printf("reference: %016llx (the single-process trainer: the whole graph, the same %d x %d micro-batches "
                   "in the same order, wte's two parts and the replicas summed as the pipeline sums them)%s\n",
                   (unsigned long long)ref_digest, pr->h.D, pr->h.o.micro, same ? ": bit-identical" : ": DIFFERENT");
            if (!same) printf("reference: step %d differs\n", first_bad);
            ok &= same;
        }
        ok &= peaks_ok && regions_ok;
        printf("gpt2_pipe: %s stages=%d dp=%d micro=%d schedule=%s digest=%016llx grads=%s peaks=%s regions=%s\n",
               ok ? "ok" : "FAILED", pr->h.P, pr->h.D, pr->h.o.micro, pr->h.o.schedule == RKM_PIPE_GPIPE ? "gpipe" : "1f1b",
               (unsigned long long)digest, same < 0 ? "unchecked" : same ? "bit-identical" : "DIFFERENT",
               peaks_ok ? "equal" : "DIFFERENT", regions_ok ? "within-budget" : "OVER-budget");
    }
    free(all);
    return ok ? 0 : 1;
}

static void teardown(pipe_rank *pr)
{
    for (int m = 0; pr->mst && m < pr->h.o.micro; m++) gpt2_step_free(&pr->mst[m]);
    free(pr->mst);
    free(pr->h.region);
    free(pr->step_wall);
    free(pr->text);
    pipe_host_free(&pr->h);
    gpt2_model_free(&pr->md);
    if (pr->gg.g) gpt2_graph_free(&pr->gg);
    rkm_context_destroy(pr->h.ctx);
}

int main(int argc, char **argv)
{
    pipe_rank pr;
    int rc;
    memset(&pr, 0, sizeof pr);
    pipe_start(&pr.h, "gpt2_pipe", &argc, &argv);
    pr.h.gg = &pr.gg, pr.h.md = &pr.md;
    rc = parse_args(&pr, argc, argv);
    if (!rc && pr.o.fail_rank >= 0) /* the failure test checks that every one of them ends */
        printf("gpt2_pipe: rank %d is process %ld\n", pr.h.rank, (long)getpid());
    if (!rc) {
        pr.h.s = pr.h.rank % pr.h.P, pr.h.d = pr.h.rank / pr.h.P;
        if (gpt2_graph_build(pr.h.ctx, &pr.h.o.shape, &pr.gg) != RKM_OK) pipe_die(&pr.h, rkm_context_errmsg(pr.h.ctx));
        if (gpt2_model_init(&pr.md, &pr.h.o.shape, pr.o.seed)) pipe_die(&pr.h, "out of memory");
        if (text_load(&pr)) {
            if (pr.h.rank == 0)
                printf("gpt2_pipe: FAILED cannot read %s (or it is shorter than one micro-batch); run from the "
                       "repository root or pass --data\n", pr.o.data);
            rc = 1;
        }
    }
    if (!rc) {
        rc = pipe_receive_plan(&pr.h, profile_rank0, &pr);
    }
    if (!rc) {
        stage_setup(&pr);
        pr.cb.user = &pr;
        pr.cb.forward = pcb_forward, pr.cb.backward = pcb_backward, pr.cb.loss = pcb_loss;
        pr.cb.free_tensor = pcb_free_tensor, pr.cb.free_saved = pcb_free_saved, pr.cb.free_grad = pcb_free_grad;
        if (pr.h.rank == 0) {
            pipe_history_alloc(&pr.h);
            pr.step_wall = (double *)calloc((size_t)pr.h.o.steps, sizeof(double));
            if (!pr.step_wall) pipe_die(&pr.h, "out of memory");
            print_plan(&pr);
        }
        for (pr.h.step = 1; pr.h.step <= pr.h.o.steps; pr.h.step++) train_step(&pr);
        pr.h.step = pr.h.o.steps;
        rc = finish(&pr);
        pipe_idle_barrier(&pr.h);
    }
    teardown(&pr);
    MPI_Finalize();
    return rc;
}
