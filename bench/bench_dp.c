/* bench_dp.c -- time of the chain DP (section 10) against blocks, options
 * per block and memory slots. Prints one row per size: CPU milliseconds per
 * solve (the best of several runs; CPU time, as the machine may be shared),
 * the table's size and the least slot count any schedule needs.
 *
 *   build/bench/bench_dp        (make bench)
 *
 * Chains are random but shaped like real ones: every block has a "keep
 * everything" option (fastest, most memory) and options that keep less and
 * recompute more in their backward; M slots are about half of what keeping
 * everything needs. */
#include "../rockmate.c"

static uint64_t bench_rng = 88172645463325252ull;
static double bench_unif(void)
{
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return (double)(bench_rng >> 11) / 9007199254740992.0;
}

/* Sizes in bytes-like units, rounded up to slots of `slot` units. */
static int32_t bench_slots(double units, double slot) { return (int32_t)ceil(units / slot); }

static void bench_chain(rkm__dp_block *b, rkm__dp_option *o, int32_t n, int32_t k, int32_t M)
{
    double x[128], act[128];
    double total = 0;
    for (int32_t i = 0; i < n; i++) {
        x[i] = 0.5 + bench_unif();      /* separator x_i */
        act[i] = 2 + 4 * bench_unif();  /* what "keep everything" keeps */
        total += x[i] + act[i];
    }
    double slot = 0.5 * total / M; /* keeping everything needs about 2 M */
    for (int32_t i = 0; i < n; i++) {
        int32_t in = i ? bench_slots(x[i - 1], slot) : 0, out = i + 1 < n ? bench_slots(x[i], slot) : 0;
        double tf = 1 + bench_unif();
        b[i] = (rkm__dp_block){in, out, in + out + bench_slots(0.3 * act[i], slot), tf, k, o + (size_t)i * k};
        for (int32_t j = 0; j < k; j++) {
            double frac = k > 1 ? 1.0 - (double)j / (k - 1) : 1; /* share of activations kept */
            int32_t kept = bench_slots(frac * act[i], slot);
            double extra = (1 - frac) * tf * (0.5 + 0.5 * bench_unif()); /* recomputation in B */
            int32_t pf = in + out + kept + bench_slots(0.2 * act[i], slot);
            int32_t pb = in + out + kept + out + bench_slots(0.4 * act[i], slot);
            o[(size_t)i * k + j] = (rkm__dp_option){tf, 2 * tf + extra, kept, pf, pb};
        }
    }
}

int main(void)
{
    static const int32_t ns[] = {10, 30, 100}, ks[] = {2, 5, 20}, ms[] = {100, 300, 1000};
    static rkm__dp_block blocks[100];
    static rkm__dp_option opts[100 * 20];
    rkm_context *ctx = NULL;
    if (rkm_context_create(NULL, &ctx) != RKM_OK) return 1;
    printf("%7s %7s %6s %10s %9s %8s\n", "blocks", "options", "slots", "ms/solve", "table MB", "min m");
    for (size_t a = 0; a < 3; a++)
        for (size_t c = 0; c < 3; c++)
            for (size_t d = 0; d < 3; d++) {
                int32_t n = ns[a], k = ks[c], M = ms[d];
                bench_chain(blocks, opts, n, k, M);
                int64_t lo = 0;
                if (rkm__dp_min_slots(ctx, blocks, n, &lo) != RKM_OK) return 1;
                double best = INFINITY, spent = 0;
                double mb = 0;
                for (int run = 0; run < 3 || (spent < 0.3 && run < 50); run++) {
                    rkm__dp_table t;
                    clock_t t0 = clock();
                    if (rkm__dp_solve(ctx, blocks, n, M, INFINITY, &t, NULL) != RKM_OK) {
                        fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
                        return 1;
                    }
                    double dt = (double)(clock() - t0) / CLOCKS_PER_SEC;
                    spent += dt;
                    best = dt < best ? dt : best;
                    mb = (double)(rkm__dp_pairs(n) * t.row * sizeof(double)) / 1e6;
                    rkm__dp_table_free(ctx, &t);
                }
                printf("%7d %7d %6d %10.3f %9.1f %8lld\n", (int)n, (int)k, (int)M, 1e3 * best, mb, (long long)lo);
            }
    rkm_context_destroy(ctx);
    return 0;
}
