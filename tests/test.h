/* test.h -- the tiny test framework of rockmate's suite.
 *
 * Each tests/test_*.c is one program: TEST(name) functions, run from main()
 * with RUN(name), ending with TEST_END() which prints
 * "<file>: N passed, N failed" (", N skipped" after it when some were) and
 * returns non-zero on failure. A test that cannot run in this build
 * (RKM_OMIT_SOLVER, say) says so with TEST_SKIP, or RUN_SOLVER in main(),
 * and counts as skipped, never as passed. It also compiles as C++
 * (tests/test_cuda.cc).
 * tests/run.sh runs every program and prints the total line. */
#ifndef RKM_TEST_H
#define RKM_TEST_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* TEST_HELPERS_ONLY: just the shared helpers below (the fuzz harnesses). */
#ifndef TEST_HELPERS_ONLY
static int test_passed, test_failed, test_skipped, test_current_failed, test_current_skipped;
static const char *test_current_name = "";

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            test_current_failed = 1;                                                 \
        }                                                                            \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                                        \
    do {                                                                                          \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);            \
        if (a_ != b_) {                                                                           \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%llu != %llu)\n", __FILE__, __LINE__, \
                    #a, #b, a_, b_);                                                              \
            test_current_failed = 1;                                                              \
        }                                                                                         \
    } while (0)

#define TEST(name) static void name(void)

/* TEST_SKIP("why"): the current test cannot run in this build; it prints
 * "SKIP name: why", counts as skipped (unless a check failed before) and
 * returns from the test, so free what it holds first. */
#define TEST_SKIP(why)                                                  \
    do {                                                                \
        fprintf(stderr, "SKIP %s: %s\n", test_current_name, why);       \
        test_current_skipped = 1;                                       \
        return;                                                         \
    } while (0)

/* RKM_TEST_TIMES set: each test's CPU seconds on stderr (what to trim). */
#define RUN(name)                                                                      \
    do {                                                                               \
        clock_t t0_ = clock();                                                         \
        test_current_failed = test_current_skipped = 0;                                \
        test_current_name = #name;                                                     \
        name();                                                                        \
        if (test_current_failed) {                                                     \
            test_failed++;                                                             \
            fprintf(stderr, "FAIL %s\n", #name);                                       \
        } else if (test_current_skipped) {                                             \
            test_skipped++;                                                            \
        } else {                                                                       \
            test_passed++;                                                             \
        }                                                                              \
        if (getenv("RKM_TEST_TIMES"))                                                  \
            fprintf(stderr, "  %s: %.1f s\n", #name, (double)(clock() - t0_) / CLOCKS_PER_SEC); \
    } while (0)

/* A test compiled out in this build, counted as skipped. */
#define RUN_SKIPPED(name, why)                          \
    do {                                                \
        fprintf(stderr, "SKIP %s: %s\n", #name, why);   \
        test_skipped++;                                 \
    } while (0)

/* RUN_SOLVER(name): a test that needs lp_solve (its definition may be
 * compiled out under RKM_OMIT_SOLVER), skipped there; where it is not, the
 * name is still used (no unused-function warning). */
#ifdef RKM_OMIT_SOLVER
#define RUN_SOLVER(name) RUN_SKIPPED(name, "needs lp_solve (built with RKM_OMIT_SOLVER)")
#define RUN_SOLVER_DEFINED(name)                                                    \
    do {                                                                            \
        (void)name;                                                                 \
        RUN_SKIPPED(name, "needs lp_solve (built with RKM_OMIT_SOLVER)");           \
    } while (0)
#else
#define RUN_SOLVER(name) RUN(name)
#define RUN_SOLVER_DEFINED(name) RUN(name)
#endif

#define TEST_END()                                                                          \
    do {                                                                                    \
        if (test_skipped)                                                                   \
            printf("%s: %d passed, %d failed, %d skipped\n", __FILE__, test_passed, test_failed, \
                   test_skipped);                                                           \
        else                                                                                \
            printf("%s: %d passed, %d failed\n", __FILE__, test_passed, test_failed);       \
        return test_failed != 0;                                                            \
    } while (0)

#endif /* TEST_HELPERS_ONLY */

/* Where the bundled graphs are (the Makefile passes -DTEST_GRAPHS_DIR). */
#ifndef TEST_GRAPHS_DIR
#define TEST_GRAPHS_DIR "tests/graphs"
#endif

/* ------------------------------------------------------ shared helpers
 * Helpers more than one program uses; static inline, so a program that
 * uses none of them still builds warning-free. */

#include "../rockmate.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The bundled graphs, by name (no ".rkg"): an initializer list. */
#define TEST_BUNDLED_GRAPHS                                                                     \
    "gpt2-tiny", "gpt2-124M-b4-t64", "gpt2-xl-b4-t1024", "mlp16", "multi-output", "peer-gpt", \
        "random30", "resnet18-like-b32"

/* The path of bundled graph `name` (no ".rkg") into buf. */
static inline const char *test_graph_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s.rkg", TEST_GRAPHS_DIR, name);
    return buf;
}

/* A bundled graph that is missing or cannot be built fails the current
 * test, whatever the caller does with the NULL (a test that skips its work
 * on NULL would otherwise pass without having run). The fuzz harnesses
 * (TEST_HELPERS_ONLY) check the NULL themselves. */
#ifndef TEST_HELPERS_ONLY
#define TEST_GRAPH_FAILED() (test_current_failed = 1)
#else
#define TEST_GRAPH_FAILED() ((void)0)
#endif

/* Read bundled graph `name` (no ".rkg"); NULL, with the reader's message on
 * stderr and the current test failed, when it fails. */
static inline rkm_graph *test_load_graph(rkm_context *ctx, const char *name)
{
    char path[512];
    rkm_graph *g = NULL;
    test_graph_path(path, sizeof path, name);
    if (rkm_graph_read_file(ctx, path, &g) != RKM_OK) {
        fprintf(stderr, "test graph %s: %s\n", path, rkm_context_errmsg(ctx));
        TEST_GRAPH_FAILED();
    }
    return g;
}

/* Graph src rebuilt in its context with each op's desc changed by edit
 * (which may read src): RKM_OK and *out, or the builder's error (a graph
 * the edit breaks) and *out NULL. */
static inline rkm_result test_edited_copy(const rkm_graph *src, void (*edit)(const rkm_graph *src, rkm_op_desc *d),
                                          rkm_graph **out)
{
    rkm_graph *g = NULL;
    rkm_result r = rkm_graph_create(rkm_graph_context(src), &g);
    for (int32_t t = 0; !r && t < rkm_graph_num_tensors(src); t++) {
        rkm_tensor_info ti;
        r = rkm_graph_tensor_info(src, t, &ti);
        if (!r) r = rkm_graph_add_tensor(g, ti.name, ti.bytes, ti.flags, NULL);
    }
    for (int32_t i = 0; !r && i < rkm_graph_num_ops(src); i++) {
        rkm_op_desc d;
        r = rkm_graph_op_info(src, i, &d);
        if (!r) edit(src, &d);
        if (!r) r = rkm_graph_add_op(g, &d, NULL);
    }
    if (!r) r = rkm_graph_set_loss(g, rkm_graph_loss(src));
    if (!r) r = rkm_graph_finalize(g);
    if (r) rkm_graph_destroy(g);
    *out = r ? NULL : g;
    return r;
}

/* Bundled graph `name` rebuilt with each op's desc changed by edit (which
 * may read src). NULL, and the current test failed, when it cannot be
 * built. */
static inline rkm_graph *test_load_edited_graph(rkm_context *ctx, const char *name, const char *what,
                                                void (*edit)(const rkm_graph *src, rkm_op_desc *d))
{
    rkm_graph *src = test_load_graph(ctx, name), *g = NULL;
    rkm_result r = src ? test_edited_copy(src, edit, &g) : RKM_ERROR_ARGUMENT;
    if (r) fprintf(stderr, "test graph %s with %s: %s\n", name, what, rkm_context_errmsg(ctx));
    if (r) TEST_GRAPH_FAILED();
    rkm_graph_destroy(src);
    return g;
}

static inline void test_edit_scratch(const rkm_graph *src, rkm_op_desc *d)
{
    (void)src;
    d->scratch = d->phantom / 2;
}

/* Bundled graph `name` with scratch: every op with a phantom writes half of
 * it on every run (scratch = phantom / 2), as real normalisation and
 * attention kernels do. NULL when it cannot be built. */
static inline rkm_graph *test_load_scratch_graph(rkm_context *ctx, const char *name)
{
    return test_load_edited_graph(ctx, name, "scratch", test_edit_scratch);
}

/* Every op that can be declared in place is: `inplace` where its first input
 * and output have one size and the input is not an `input`, `grad_inplace`
 * where both also have a gradient (as if every such kernel were elementwise). */
static inline void test_edit_inplace(const rkm_graph *src, rkm_op_desc *d)
{
    rkm_tensor_info a, b;
    if (d->n_in < 1 || rkm_graph_tensor_info(src, d->in[0], &a) || rkm_graph_tensor_info(src, d->out[0], &b) ||
        a.bytes != b.bytes)
        return;
    if (!(a.flags & RKM_TENSOR_INPUT)) d->flags |= RKM_OP_INPLACE;
    if (a.has_grad && b.has_grad) d->flags |= RKM_OP_GRAD_INPLACE;
}

static inline rkm_graph *test_load_inplace_graph(rkm_context *ctx, const char *name)
{
    return test_load_edited_graph(ctx, name, "in-place ops", test_edit_inplace);
}

/* A context with the given allocator (NULL: the default one); the program
 * exits if it cannot be made. */
static inline rkm_context *test_new_ctx_alloc(rkm_alloc_fn alloc)
{
    rkm_context_desc d;
    memset(&d, 0, sizeof d);
    d.alloc = alloc;
    rkm_context *ctx = NULL;
    if (rkm_context_create(alloc ? &d : NULL, &ctx) != RKM_OK) {
        fprintf(stderr, "rkm_context_create failed\n");
        exit(2);
    }
    return ctx;
}

static inline rkm_context *test_new_ctx(void) { return test_new_ctx_alloc(NULL); }

/* A context allocator that counts the bytes outstanding (*test_live_bytes();
 * the sizes the library passes must match), so that a test can check that
 * everything it made went back, and the allocations (*test_alloc_calls():
 * calls that ask for bytes), so that one can check a call made none. */
static inline long long *test_live_bytes(void)
{
    static long long n;
    return &n;
}
static inline long long *test_alloc_calls(void)
{
    static long long n;
    return &n;
}
static inline void *test_count_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    *test_alloc_calls() += new_size > 0;
    *test_live_bytes() += (long long)new_size - (long long)(ptr ? old_size : 0);
    if (new_size == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, new_size);
}

/* xorshift64*: fixed seeds give the same sequences everywhere. */
static inline uint64_t *test_rng_state(void)
{
    static uint64_t state;
    return &state;
}
static inline void rng_seed(uint64_t s) { *test_rng_state() = s * 2654435761u + 0x9E3779B97F4A7C15u; }
static inline uint32_t rng_u32(void)
{
    uint64_t *x = test_rng_state();
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return (uint32_t)((*x * 0x2545F4914F6CDD1Dull) >> 32);
}
static inline int32_t rng_int(int32_t lo, int32_t hi) { return lo + (int32_t)(rng_u32() % (uint32_t)(hi - lo + 1)); }

/* An in-memory write sink: what rkm_graph_write / rkm_plan_write produce,
 * NUL-terminated. */
typedef struct sbuf {
    char *data;
    size_t len, cap;
} sbuf;

static inline int sbuf_write(void *user, const char *data, size_t len)
{
    sbuf *b = (sbuf *)user;
    if (b->len + len + 1 > b->cap) {
        size_t ncap = (b->len + len + 1) * 2;
        char *nd = (char *)realloc(b->data, ncap);
        if (!nd) return 1;
        b->data = nd;
        b->cap = ncap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

/* A write sink that always fails. */
static inline int fail_write(void *user, const char *data, size_t len)
{
    (void)user;
    (void)data;
    (void)len;
    return 1;
}

/* The steps of plan-file text: past its header, and past the `align` and
 * `graph` lines that the writer puts before the steps. */
static inline const char *test_plan_steps(const char *text)
{
    const char *s = text ? strchr(text, '\n') : NULL;
    while (s && (strncmp(s + 1, "align ", 6) == 0 || strncmp(s + 1, "graph ", 6) == 0)) s = strchr(s + 1, '\n');
    return s ? s + 1 : "";
}

/* Execution callbacks that do nothing. */
static inline int noop_fwd(void *user, const rkm_fwd_call *c)
{
    (void)user;
    (void)c;
    return 0;
}

static inline int noop_bwd(void *user, const rkm_bwd_call *c)
{
    (void)user;
    (void)c;
    return 0;
}

static inline int noop_copy(void *user, const rkm_copy_call *c)
{
    (void)user;
    (void)c;
    return 0;
}

/* The layout checker, for the suite and the fuzzers: rkm_plan_layout(p,
 * align) puts every buffer at an aligned offset inside the arena, a buffer
 * an in-place step takes over shares its offset, no two buffers live in
 * one step share a byte (each rounded up to the alignment), and the arena
 * is at least the aligned peak (the most aligned bytes live in a step,
 * counted here), which is at least the plan's peak; at the plan's own
 * alignment (align 0) the layout is the one its stats give. NULL, or what
 * is wrong; *arena, *aligned_peak (when not NULL) get the figures.
 * ARGUMENT from the layout (sizes past 64 bits) is not an error. */
static inline const char *test_layout_error(const rkm_plan *p, uint64_t align, uint64_t *arena_out,
                                            uint64_t *aligned_out)
{
    rkm_plan_stats st;
    if (rkm_plan_stats_get(p, &st) != RKM_OK) return "stats";
    uint64_t a = align ? align : st.alignment, arena = 0, live = 0, most = 0;
    size_t n = rkm_plan_num_buffers(p), steps = rkm_plan_num_steps(p);
    rkm_buffer *b = (rkm_buffer *)calloc(n + 1, sizeof *b);
    int64_t *last = (int64_t *)calloc(n + 1, sizeof *last);
    uint64_t *d = (uint64_t *)calloc(steps + 3, sizeof *d);
    const char *why = NULL;
    rkm_result r = b && last && d ? rkm_plan_layout(p, align, b, &arena) : RKM_ERROR_NOMEM;
    if (r != RKM_OK) why = r == RKM_ERROR_ARGUMENT ? NULL : "rkm_plan_layout failed";
#define TEST_LAYOUT_FAIL(text) do { why = text; goto done; } while (0)
    if (r != RKM_OK) goto done;
    for (size_t i = 0; i < n; i++) { /* the chains' lifetimes, in their first buffer */
        last[i] = b[i].last_step;
        if (b[i].takes_over >= 0) {
            size_t h = (size_t)b[i].takes_over;
            if (h >= i || b[h].offset != b[i].offset || b[h].last_step != b[i].first_step)
                TEST_LAYOUT_FAIL("an in-place buffer does not take over its predecessor's offset");
            while (b[h].takes_over >= 0) h = (size_t)b[h].takes_over;
            if (b[i].last_step > last[h]) last[h] = b[i].last_step;
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t size = (b[i].bytes + a - 1) & ~(a - 1);
        if (b[i].offset % a) TEST_LAYOUT_FAIL("an offset is not aligned");
        if (b[i].bytes && b[i].offset + size > arena) TEST_LAYOUT_FAIL("a buffer ends past the arena");
        if (b[i].first_step > b[i].last_step) TEST_LAYOUT_FAIL("a buffer ends before it starts");
        if (b[i].takes_over >= 0 || !b[i].bytes) continue;
        d[b[i].first_step + 1] += size; /* steps -1 .. steps, shifted by one */
        d[last[i] + 2] -= size;
        for (size_t j = i + 1; j < n; j++) {
            if (b[j].takes_over >= 0 || !b[j].bytes) continue;
            uint64_t sj = (b[j].bytes + a - 1) & ~(a - 1);
            int alive = b[i].first_step <= last[j] && b[j].first_step <= last[i];
            if (alive && b[i].offset < b[j].offset + sj && b[j].offset < b[i].offset + size)
                TEST_LAYOUT_FAIL("two buffers live in one step share bytes");
        }
    }
    for (size_t s = 0; s < steps + 2; s++) {
        live += d[s];
        if (live > most) most = live;
    }
    if (arena < most) TEST_LAYOUT_FAIL("the arena is below the aligned peak");
    if (most < st.peak) TEST_LAYOUT_FAIL("the aligned peak is below the peak");
    if (a == st.alignment && (arena != st.arena_bytes || most != st.aligned_peak))
        TEST_LAYOUT_FAIL("the plan's own layout differs from its stats");
    if (arena_out) *arena_out = arena;
    if (aligned_out) *aligned_out = most;
#undef TEST_LAYOUT_FAIL
done:
    free(b);
    free(last);
    free(d);
    return why;
}

#ifndef TEST_HELPERS_ONLY
/* The layout checker as a test check: at alignments 1, the plan's own, and
 * 4096. */
static inline void test_check_layouts(const rkm_plan *p)
{
    static const uint64_t aligns[] = {1, 0, 4096};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        const char *why = test_layout_error(p, aligns[k], NULL, NULL);
        if (why) fprintf(stderr, "layout at alignment %llu: %s\n", (unsigned long long)aligns[k], why);
        CHECK(why == NULL);
    }
}

/* The arena exec runs p in first fit and in layout mode, without a host,
 * and its peak is `peak` (in-place runs move buffers, they make none). */
static inline void test_check_arena_runs(const rkm_graph *g, const rkm_plan *p, uint64_t peak)
{
    for (int layout = 0; layout < 2; layout++) {
        rkm_arena_exec_desc d;
        rkm_arena_exec *x = NULL;
        rkm_arena_stats as;
        memset(&d, 0, sizeof d);
        memset(&as, 0, sizeof as);
        d.graph = g;
        d.mode = layout ? RKM_ARENA_LAYOUT : RKM_ARENA_FIRST_FIT;
        d.plan = layout ? p : NULL;
        d.capacity = RKM_ARENA_UNBOUNDED;
        CHECK(rkm_arena_exec_create(&d, &x) == RKM_OK);
        CHECK(x && rkm_arena_exec_run(x, p) == RKM_OK);
        CHECK(rkm_arena_exec_stats_get(x, &as) == RKM_OK);
        CHECK_EQ_U64(as.peak, peak);
        rkm_arena_exec_destroy(x);
    }
}
#endif

#endif
