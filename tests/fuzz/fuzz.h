/* fuzz.h -- what the libFuzzer harnesses share: the suite's helpers
 * (tests/test.h: a write sink, no-op callbacks) and the checks every plan
 * must pass.
 *
 * Each harness defines LLVMFuzzerTestOneInput. Under `make fuzz` it is
 * linked with clang's libFuzzer; under `make test` with replay.c, which
 * feeds it every file of its corpus once (deterministic, no mutation). A
 * failed check aborts, which is how libFuzzer knows it found something. */
#ifndef RKM_FUZZ_H
#define RKM_FUZZ_H
#define TEST_HELPERS_ONLY /* sbuf, the no-op callbacks, contexts */
#include "../test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                  \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

/* A valid plan: its layouts (test_layout_error, at alignments 1, its own
 * and 4096) hold, its step peaks reach the peak, and it runs, in layout
 * mode too, where the arena exec's region is the plan's arena. */
static inline void fuzz_check_plan(const rkm_plan *p)
{
    rkm_plan_stats st;
    FUZZ_CHECK(rkm_plan_stats_get(p, &st) == RKM_OK);
    size_t steps = rkm_plan_num_steps(p);
    uint64_t max = 0;
    const uint64_t *pk = rkm_plan_step_peaks(p);
    for (size_t i = 0; i < steps; i++) max = pk[i] > max ? pk[i] : max;
    FUZZ_CHECK(steps == 0 || max == st.peak);
    static const uint64_t aligns[] = {1, 0, 4096};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        const char *why = test_layout_error(p, aligns[k], NULL, NULL);
        if (why) fprintf(stderr, "layout at alignment %llu: %s\n", (unsigned long long)aligns[k], why);
        FUZZ_CHECK(why == NULL);
    }
    rkm_callbacks cb = {.forward = noop_fwd, .backward = noop_bwd, .offload = noop_copy, .prefetch = noop_copy,
                        .wait = noop_copy};
    FUZZ_CHECK(rkm_plan_execute(p, &cb) == RKM_OK);
    /* the arena exec, in layout mode, runs it at its peak in the plan's arena */
    rkm_arena_exec_desc d = {.graph = rkm_plan_graph(p), .plan = p};
    rkm_arena_exec *x = NULL;
    if (rkm_arena_exec_create(&d, &x) == RKM_OK) {
        rkm_arena_stats as;
        FUZZ_CHECK(rkm_arena_exec_run(x, p) == RKM_OK);
        FUZZ_CHECK(rkm_arena_exec_stats_get(x, &as) == RKM_OK);
        FUZZ_CHECK(as.peak == st.peak && as.capacity == st.arena_bytes && as.high_water <= st.arena_bytes);
    }
    rkm_arena_exec_destroy(x);
}

static inline rkm_context *fuzz_ctx(void)
{
    rkm_context *ctx = NULL;
    FUZZ_CHECK(rkm_context_create(NULL, &ctx) == RKM_OK);
    return ctx;
}
#endif
