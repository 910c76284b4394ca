/* test_threads: contexts used by different threads at once.
 *
 * The rule of rockmate.h's CONVENTIONS: a context (and everything made with
 * it) is used by one thread at a time; different contexts may be used in
 * parallel, the only shared state being the lock around lp_solve. Four
 * threads, each with its own context, read bundled graphs and plan them with
 * four algorithms at half the baseline, so four rockmate plannings (block
 * ILPs through lp_solve, in a build with it) run at once and meet at the
 * lock. Each job also makes one failing call (a tensor id out of range), so
 * every thread writes its own context's message while the others plan. The plans and the
 * messages must be those of the same work done one after another, byte for
 * byte. Built under ThreadSanitizer (build/tests/test_threads-tsan) so that
 * a data race fails the run. Nothing here shares a context between threads:
 * that is the documented race, not tested. */
#include "test.h"

#include <pthread.h>

#define N_THREADS 4
#define N_JOBS 4

/* One job: a graph, an algorithm, budgets; the plans' text, concatenated. */
typedef struct job {
    const char *graph;
    rkm_algo algo;
    sbuf out;
    int failed;
} job;

static const int pcts[] = {50};

static void run_job(job *j)
{
    rkm_context *ctx = NULL;
    rkm_graph *g = NULL;
    rkm_graph_stats gs;
    if (rkm_context_create(NULL, &ctx) != RKM_OK || !(g = test_load_graph(ctx, j->graph)) ||
        rkm_graph_stats_get(g, &gs) != RKM_OK) {
        j->failed = 1;
    } else {
        rkm_solve_desc d = {0};
        d.time_limit = 1000; /* the work meters end every call: no cut on a slow or busy machine */
        d.algo = j->algo;
        rkm_planner *pl = NULL;
        if (rkm_planner_create(g, &d, &pl) != RKM_OK) j->failed = 1;
        for (size_t i = 0; pl && i < N_OF(pcts); i++) {
            rkm_plan *p = NULL;
            rkm_result r = rkm_planner_solve(pl, gs.baseline_peak / 100 * (uint64_t)pcts[i], &p);
            if (r == RKM_OK) r = rkm_plan_write(p, sbuf_write, &j->out);
            else if (r == RKM_ERROR_BUDGET) r = sbuf_write(&j->out, "no plan\n", 8) ? RKM_ERROR_NOMEM : RKM_OK;
            if (r) j->failed = 1;
            rkm_plan_destroy(p);
        }
        /* A tensor id out of range fails: the message is this context's own. */
        rkm_tensor_info ti;
        const char *msg = rkm_context_errmsg(ctx);
        if (rkm_graph_tensor_info(g, rkm_graph_num_tensors(g), &ti) != RKM_ERROR_ARGUMENT || !*msg ||
            sbuf_write(&j->out, msg, strlen(msg)))
            j->failed = 1;
        rkm_planner_destroy(pl);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

static void *thread_main(void *arg)
{
    job *jobs = arg;
    for (int k = 0; k < N_JOBS; k++) run_job(&jobs[k]);
    return NULL;
}

static void init_jobs(job *jobs, int shift)
{
    static const char *graphs[] = {"gpt2-tiny", "mlp16", "random30", "multi-output"};
    static const rkm_algo algos[] = {RKM_ALGO_DEFAULT, RKM_ALGO_ROTOR, RKM_ALGO_DTR, RKM_ALGO_SQRT};
    for (int k = 0; k < N_JOBS; k++) {
        memset(&jobs[k], 0, sizeof jobs[k]);
        jobs[k].graph = graphs[(k + shift) % N_JOBS];
        jobs[k].algo = algos[k];
    }
}

TEST(parallel_plans_equal_sequential)
{
    job seq[N_THREADS][N_JOBS], par[N_THREADS][N_JOBS];
    for (int t = 0; t < N_THREADS; t++) {
        init_jobs(seq[t], t);
        init_jobs(par[t], t);
        thread_main(seq[t]);
    }
    pthread_t th[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) CHECK(pthread_create(&th[t], NULL, thread_main, par[t]) == 0);
    for (int t = 0; t < N_THREADS; t++) CHECK(pthread_join(th[t], NULL) == 0);
    for (int t = 0; t < N_THREADS; t++)
        for (int k = 0; k < N_JOBS; k++) {
            const job *a = &seq[t][k], *b = &par[t][k];
            CHECK(!a->failed && !b->failed);
            int same = a->out.data && b->out.data && strcmp(a->out.data, b->out.data) == 0;
            if (!same) fprintf(stderr, "%s / %s: plans differ between sequential and parallel runs\n", a->graph,
                               rkm_algo_name(a->algo));
            CHECK(same);
            free(seq[t][k].out.data);
            free(par[t][k].out.data);
        }
}

int main(void)
{
    RUN(parallel_plans_equal_sequential);
    TEST_END();
}
