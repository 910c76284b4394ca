/* bench_pipeline: pipeline plans four ways, side by side (issue 44).
 *
 *   build/bench/bench_pipeline [GRAPH ...]      (default: the three below)
 *
 * For gpt2-124M-b4-t64, gpt2-xl-b4-t1024 and peer-gpt, P in {2, 4, 8}
 * stages and M in {4, 8, 16} micro-batches under 1F1B, free links, the
 * same budget on every device: the step time (the pipeline replay's, in
 * ms) of
 *   store  the uniform cut (equal forward time per stage), every stage
 *          storing everything (algorithm none);
 *   full   the uniform cut, every block recomputed from its input
 *          (RKM_ALGO_FULL: Megatron-LM's full recomputation);
 *   unif   the uniform cut, each stage planned by rockmate for its budget
 *          with its micro-batches in flight;
 *   chosen the cut rkm_pipeline_plan chooses, with rockmate (the answer);
 * '-' where that way has no plan. Budgets: B100 is what the uniform
 * store-all cut needs on its fullest stage (its arena), then 75, 50, 35
 * and 25 % of it. full/ch is full's step time over chosen's; "best" says
 * whether chosen is the fastest of the four (= where tied). Then, at P = 4
 * and M = 8, the smallest per-device budget each way meets (bisection to
 * 1 % of B100), and the planning time of P = 8, M = 16 (chosen, one
 * core, median of 3). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "bench.h"

static const char *const graphs[] = {"gpt2-124M-b4-t64", "gpt2-xl-b4-t1024", "peer-gpt"};
static const int stages[] = {2, 4, 8}, micros[] = {4, 8, 16}, pcts[] = {100, 75, 50, 35, 25};
enum { STORE, FULL, UNIF, CHOSEN, WAYS };
static const char *const way_name[WAYS] = {"store", "full", "unif", "chosen"};

/* The way's step time at `budget` (NAN: no plan), its fullest stage's arena. */
static double way(const rkm_graph *g, int w, int32_t p, int32_t m, const int32_t *cuts, uint64_t budget, uint64_t *arena)
{
    rkm_pipeline_desc d = {0};
    d.stages = p, d.micro_batches = m, d.budget = budget;
    d.cuts = w == CHOSEN ? NULL : cuts;
    d.solve.algo = w == STORE ? RKM_ALGO_NONE : w == FULL ? RKM_ALGO_FULL : RKM_ALGO_ROCKMATE;
    rkm_pipeline *pp = NULL;
    if (arena) *arena = 0;
    if (rkm_pipeline_plan(g, &d, &pp) != RKM_OK) return NAN;
    for (int32_t s = 0; arena && s < p; s++) {
        rkm_pipeline_stage_info in;
        if (rkm_pipeline_stage(pp, s, &in, NULL, NULL) == RKM_OK && in.arena_bytes > *arena) *arena = in.arena_bytes;
    }
    double t = rkm_pipeline_step_time(pp);
    rkm_pipeline_destroy(pp);
    return t;
}

static void cell(double v)
{
    if (isnan(v)) printf(" %9s", "-");
    else printf(" %9.3f", v);
}

/* The smallest budget in [lo, hi] the way meets, to `step` bytes; 0: none up to hi. */
static uint64_t smallest(const rkm_graph *g, int w, int32_t p, int32_t m, const int32_t *cuts, uint64_t lo, uint64_t hi,
                         uint64_t step)
{
    if (isnan(way(g, w, p, m, cuts, hi, NULL))) return 0;
    while (hi - lo > step) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (isnan(way(g, w, p, m, cuts, mid, NULL))) lo = mid;
        else hi = mid;
    }
    return hi;
}

int main(int argc, char **argv)
{
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx)) return 1;
    const char *const *names = argc > 1 ? (const char *const *)argv + 1 : graphs;
    int n = argc > 1 ? argc - 1 : (int)(sizeof graphs / sizeof *graphs);
    for (int gi = 0; gi < n; gi++) {
        rkm_graph *g = bench_load(ctx, names[gi]);
        if (!g) continue;
        printf("\n%s\n%3s %3s %5s %12s", names[gi], "P", "M", "pct", "budget");
        for (int w = 0; w < WAYS; w++) printf(" %9s", way_name[w]);
        printf(" %7s %5s\n", "full/ch", "best");
        for (size_t pi = 0; pi < sizeof stages / sizeof *stages; pi++)
            for (size_t mi = 0; mi < sizeof micros / sizeof *micros; mi++) {
                int32_t p = stages[pi], m = micros[mi], cuts[8];
                if (rkm_graph_uniform_cut(g, p, cuts)) continue;
                uint64_t b100 = 0;
                if (isnan(way(g, STORE, p, m, cuts, UINT64_MAX / 8, &b100))) continue;
                for (size_t k = 0; k < sizeof pcts / sizeof *pcts; k++) {
                    uint64_t budget = pcts[k] == 100 ? b100 : b100 / 100 * (uint64_t)pcts[k];
                    double t[WAYS];
                    for (int w = 0; w < WAYS; w++) t[w] = way(g, w, p, m, cuts, budget, NULL);
                    printf("%3d %3d %4d%% %12llu", (int)p, (int)m, pcts[k], (unsigned long long)budget);
                    for (int w = 0; w < WAYS; w++) cell(isnan(t[w]) ? NAN : 1e3 * t[w]);
                    if (isnan(t[FULL]) || isnan(t[CHOSEN])) printf(" %7s", "-");
                    else printf(" %7.3f", t[FULL] / t[CHOSEN]);
                    int best = !isnan(t[CHOSEN]), tie = 0;
                    for (int w = 0; w < CHOSEN; w++) {
                        if (!isnan(t[w]) && (isnan(t[CHOSEN]) || t[w] < t[CHOSEN])) best = 0;
                        if (!isnan(t[w]) && t[w] == t[CHOSEN]) tie = 1;
                    }
                    printf(" %5s\n", best ? (tie ? "=" : "yes") : isnan(t[CHOSEN]) ? "-" : "NO");
                }
                if (p == 4 && m == 8) {
                    printf("    smallest budget met at P 4, M 8 (bytes, %% of B100):");
                    for (int w = 0; w < WAYS; w++) {
                        uint64_t s = smallest(g, w, p, m, cuts, 0, b100, b100 / 100);
                        if (s) printf("  %s %llu (%.0f%%)", way_name[w], (unsigned long long)s, 100.0 * (double)s / (double)b100);
                        else printf("  %s -", way_name[w]);
                    }
                    printf("\n");
                }
            }
        /* planning time, P = 8, M = 16, at half of B100 */
        int32_t cuts[8];
        uint64_t b100 = 0;
        if (!rkm_graph_uniform_cut(g, 8, cuts) && !isnan(way(g, STORE, 8, 16, cuts, UINT64_MAX / 8, &b100))) {
            double ts[3];
            for (int r = 0; r < 3; r++) {
                double t0 = bench_now();
                (void)way(g, CHOSEN, 8, 16, cuts, b100 / 2, NULL);
                ts[r] = bench_now() - t0;
            }
            printf("    planning P 8, M 16 at 50%% (chosen): %.2f s (median of 3)\n", bench_median3(ts));
        }
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
    return 0;
}
