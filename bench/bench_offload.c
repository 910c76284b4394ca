/* bench_offload: rockmate with a copy link to host memory against
 * recompute-only, side by side.
 *
 *   build/bench/bench_offload [GRAPH...]
 *
 * For each graph (default: gpt2-xl-b4-t1024, gpt2-124M-b4-t64,
 * resnet18-like-b32) at 90..10 % of the baseline peak, at the
 * recompute-only smallest budget, half way from there to the graph's
 * lower bound, and each link's smallest budget where it is below that
 * floor (rkm_planner_min_budget, printed above the table with the time its
 * planner took to find it; no plan at all peaks below the lower bound):
 * the overhead (in % of the baseline time) of rockmate on the graph
 * without a link, with 450 GB/s
 * each way (NVLink-C2C class) and with 25 GB/s (PCIe 4.0 x16), each link
 * with 10 us a copy; the seconds the offloading plans wait for copies; and
 * planning time (create + solve, median of 3 runs, one core) of each, with
 * the ratio of the slower link's to recompute-only's. "-": no plan. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "../rockmate.h"
#include "bench.h"

static const double links[] = {0, 450e9, 25e9};
#define N_LINKS 3

typedef struct cell {
    int ok;
    double overhead, wait, seconds;
} cell;

/* Plan g at `budget` (create + solve), three times; the first plan's figures. */
static cell plan_cell(const rkm_graph *g, uint64_t budget)
{
    cell c = {0, 0, 0, 0};
    double t[3];
    for (int run = 0; run < 3; run++) {
        double t0 = bench_now();
        rkm_plan *p = NULL;
        rkm_solve_desc d = {0};
        rkm_result r = rkm_plan_solve(g, &d, budget, &p);
        t[run] = bench_now() - t0;
        rkm_plan_stats st;
        if (run == 0 && r == RKM_OK && rkm_plan_stats_get(p, &st) == RKM_OK) {
            c.ok = 1;
            c.overhead = 100 * st.overhead;
            c.wait = st.wait_seconds;
        }
        rkm_plan_destroy(p);
    }
    c.seconds = bench_median3(t);
    return c;
}

static void row(rkm_graph *const *g, const char *label, uint64_t budget, double pct)
{
    cell c[N_LINKS];
    for (int l = 0; l < N_LINKS; l++) c[l] = plan_cell(g[l], budget);
    printf("%-10s %6.2f", label, pct);
    for (int l = 0; l < N_LINKS; l++)
        if (c[l].ok) printf(" %8.2f", c[l].overhead);
        else printf(" %8s", "-");
    for (int l = 1; l < N_LINKS; l++)
        if (c[l].ok) printf(" %8.3f", c[l].wait);
        else printf(" %8s", "-");
    for (int l = 0; l < N_LINKS; l++) printf(" %7.2f", c[l].seconds);
    printf(" %6.2f\n", c[0].seconds > 0 ? (c[1].seconds > c[2].seconds ? c[1].seconds : c[2].seconds) / c[0].seconds : 0);
    fflush(stdout);
}

static void bench_graph(rkm_context *ctx, const char *name)
{
    rkm_graph *g[N_LINKS] = {NULL, NULL, NULL};
    g[0] = bench_load(ctx, name);
    if (!g[0]) return;
    for (int l = 1; l < N_LINKS; l++) {
        rkm_copy_desc c = {links[l], links[l], 1e-5};
        if (rkm_graph_with_copy(g[0], &c, &g[l])) fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
    }
    rkm_graph_stats st;
    rkm_graph_stats_get(g[0], &st);
    uint64_t min[N_LINKS] = {0, 0, 0}, floor;
    double secs[N_LINKS];
    for (int l = 0; l < N_LINKS; l++) { /* each link's smallest budget, from a planner of its own */
        rkm_planner *pl = NULL;
        double t0 = bench_now();
        if (!g[l] || rkm_planner_create(g[l], NULL, &pl) || rkm_planner_min_budget(pl, &min[l])) min[l] = 0;
        secs[l] = bench_now() - t0;
        rkm_planner_destroy(pl);
    }
    floor = min[0];
    printf("\n%s: baseline peak %llu bytes, time %.4f s; lower bound %.2f %%\n", name,
           (unsigned long long)st.baseline_peak, st.baseline_time, 100.0 * (double)st.lower_bound / (double)st.baseline_peak);
    printf("smallest budget (planner creation and search): recompute-only %.2f %% (%.2f s)", 100.0 * (double)floor / (double)st.baseline_peak, secs[0]);
    for (int l = 1; l < N_LINKS; l++)
        printf(", %s %.2f %% (%.2f s)", l == 1 ? "450 GB/s" : "25 GB/s", 100.0 * (double)min[l] / (double)st.baseline_peak, secs[l]);
    printf("\n");
    printf("%-10s %6s %8s %8s %8s %8s %8s %7s %7s %7s %6s\n", "budget", "%", "recomp", "450GB/s", "25GB/s", "wait450",
           "wait25", "s:rec", "s:450", "s:25", "ratio");
    for (int pct = 90; pct >= 10; pct -= 10) {
        char label[16];
        snprintf(label, sizeof label, "%d%%", pct);
        row(g, label, st.baseline_peak / 100 * (uint64_t)pct, pct);
    }
    if (floor) {
        uint64_t below = st.lower_bound + (floor - st.lower_bound) / 2;
        row(g, "floor", floor, 100.0 * (double)floor / (double)st.baseline_peak);
        row(g, "below", below, 100.0 * (double)below / (double)st.baseline_peak);
    }
    for (int l = 1; l < N_LINKS; l++) /* where a link's smallest budget is below the floor: planned there */
        if (min[l] && min[l] < floor) row(g, l == 1 ? "min450" : "min25", min[l], 100.0 * (double)min[l] / (double)st.baseline_peak);
    for (int l = 0; l < N_LINKS; l++) rkm_graph_destroy(g[l]);
}

int main(int argc, char **argv)
{
    static const char *const defaults[] = {"gpt2-xl-b4-t1024", "gpt2-124M-b4-t64", "resnet18-like-b32"};
    rkm_context *ctx;
    if (rkm_context_create(NULL, &ctx)) return 1;
    if (argc > 1)
        for (int i = 1; i < argc; i++) bench_graph(ctx, argv[i]);
    else
        for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++) bench_graph(ctx, defaults[i]);
    rkm_context_destroy(ctx);
    return 0;
}
