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

/* A valid plan: its layout never overlaps live buffers and holds the peak,
 * its step peaks reach the peak, and it runs. */
static inline void fuzz_check_plan(const rkm_plan *p)
{
    rkm_plan_stats st;
    FUZZ_CHECK(rkm_plan_stats_get(p, &st) == RKM_OK);
    size_t n = rkm_plan_num_buffers(p), steps = rkm_plan_num_steps(p);
    uint64_t max = 0;
    const uint64_t *pk = rkm_plan_step_peaks(p);
    for (size_t i = 0; i < steps; i++) max = pk[i] > max ? pk[i] : max;
    FUZZ_CHECK(steps == 0 || max == st.peak);
    rkm_buffer *b = calloc(n + 1, sizeof *b);
    uint64_t arena = 0;
    FUZZ_CHECK(b != NULL);
    rkm_result r = rkm_plan_layout(p, 256, b, &arena);
    FUZZ_CHECK(r == RKM_OK || r == RKM_ERROR_ARGUMENT || r == RKM_ERROR_NOMEM); /* ARGUMENT: past 64 bits */
    if (r == RKM_OK) {
        FUZZ_CHECK(arena >= st.peak);
        for (size_t i = 0; i < n; i++) {
            FUZZ_CHECK(b[i].offset % 256 == 0 && b[i].offset + b[i].bytes <= arena);
            if (b[i].takes_over >= 0) /* in place: the bytes of a buffer the same step ends */
                FUZZ_CHECK(b[i].takes_over < (int64_t)i && b[b[i].takes_over].offset == b[i].offset &&
                           b[b[i].takes_over].last_step == b[i].first_step);
            for (size_t j = i + 1; j < n && n < 2000; j++) {
                int live = b[i].first_step <= b[j].last_step && b[j].first_step <= b[i].last_step;
                int share = b[i].offset < b[j].offset + b[j].bytes && b[j].offset < b[i].offset + b[i].bytes;
                FUZZ_CHECK(b[j].takes_over == (int64_t)i || !(b[i].bytes && b[j].bytes && live && share));
            }
        }
    }
    free(b);
    rkm_callbacks cb = {NULL, noop_fwd, noop_bwd, NULL, NULL, NULL, NULL};
    FUZZ_CHECK(rkm_plan_execute(p, &cb) == RKM_OK);
    /* the arena exec, in layout mode, runs it at its peak */
    rkm_arena_exec_desc d = {.graph = rkm_plan_graph(p)};
    rkm_arena_exec *x = NULL;
    if (r == RKM_OK && rkm_arena_exec_create_layout(&d, p, &x) == RKM_OK) {
        rkm_arena_stats as;
        FUZZ_CHECK(rkm_arena_exec_run(x, p) == RKM_OK);
        rkm_arena_exec_arena_stats(x, &as);
        FUZZ_CHECK(as.peak == st.peak);
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
