/* test_arena_align.c -- the region an arena exec allocates (desc.allocate)
 * is aligned as its offsets are, so every buffer's address is: the plan's
 * alignment in layout mode, RKM_ARENA_ALIGN in first fit and measure
 * (rockmate.h, "Arena"). The context's allocator here returns blocks 16
 * bytes past a 4096-byte boundary, so that no run passes by the luck of
 * the C library's malloc. No GPU needed. */
#include "rockmate.h"
#include "test.h"

#include <stdint.h>

/* ---------------------------------------------------------------------------
 * An allocator whose blocks are misaligned on purpose
 * ------------------------------------------------------------------------- */

/* Each block is 16 bytes (malloc's own alignment, enough for the library's
 * structs) past a 4096-byte boundary, its size kept in the 16 bytes before
 * it: every size the library passes back must be the one it asked for. */
#define SKEW 16
static long long skew_live, skew_bad_sizes;

static void *skew_alloc(void *user, void *ptr, size_t old_size, size_t new_size)
{
    (void)user;
    char *old = ptr;
    if (old && *(size_t *)(old - SKEW) != old_size) skew_bad_sizes++;
    char *blk = NULL;
    if (new_size) {
        size_t total = (new_size + SKEW + 4095) / 4096 * 4096; /* C11 aligned_alloc: a multiple */
        if (new_size > SIZE_MAX - SKEW - 4095 || !(blk = aligned_alloc(4096, total))) return NULL;
        blk += SKEW;
        *(size_t *)(blk - SKEW) = new_size;
        if (old) memcpy(blk, old, old_size < new_size ? old_size : new_size);
        skew_live += (long long)new_size;
    }
    if (old) {
        skew_live -= (long long)old_size;
        free(old - SKEW);
    }
    return blk;
}

/* ---------------------------------------------------------------------------
 * A host that checks the address of every buffer a call can see
 * ------------------------------------------------------------------------- */

typedef struct aligner {
    rkm_arena_exec *x;
    char *base;
    uint64_t align;   /* what every address must be a multiple of */
    const char *label;
    long long checked, workspaces;
    int problems;
} aligner;

static int reported; /* runs that found misaligned addresses */

static void check_addr(aligner *a, uint64_t off, const char *what, int32_t index)
{
    char *p = rkm_arena_ptr(a->base, off);
    a->checked++;
    if (p && (uintptr_t)p % a->align == 0) return;
    if (a->problems++ < 3 && reported < 3) /* the first few: on the old code every run fails */
        fprintf(stderr, "%s: %s %d at offset %llu: address %p is not a multiple of %llu\n", a->label, what,
                (int)index, (unsigned long long)off, (void *)p, (unsigned long long)a->align);
}

/* The call's workspace as a host takes it: in two scratch buffers that
 * add up to it (each rounded up to the alignment, so the second starts
 * past the first's aligned end). */
static int check_workspace(aligner *a, uint64_t ws, int32_t op)
{
    uint64_t first = (ws + 1) / 2, rounded = (first + a->align - 1) / a->align * a->align, off;
    if (ws == 0) return 0;
    a->workspaces++;
    if (rkm_arena_exec_scratch(a->x, first, &off) != RKM_OK) return 1;
    check_addr(a, off, "scratch of op", op);
    if (ws <= rounded) return 0;
    if (rkm_arena_exec_scratch(a->x, ws - rounded, &off) != RKM_OK) return 1;
    check_addr(a, off, "scratch of op", op);
    return 0;
}

static int al_forward(void *user, const rkm_fwd_call *c)
{
    aligner *a = user;
    for (int32_t k = 0; k < c->n_in; k++) check_addr(a, rkm_arena_exec_tensor(a->x, c->in[k]), "tensor", c->in[k]);
    for (int32_t k = 0; k < c->n_out; k++)
        check_addr(a, rkm_arena_exec_tensor(a->x, c->out[k]), "tensor", c->out[k]);
    if (c->save) check_addr(a, rkm_arena_exec_saved(a->x, c->op), "saved state of op", c->op);
    return check_workspace(a, c->ws_bytes, c->op);
}

static int al_backward(void *user, const rkm_bwd_call *c)
{
    aligner *a = user;
    for (int32_t k = 0; k < c->n_in; k++)
        if (c->in_grad[k] != RKM_GRAD_NONE) check_addr(a, rkm_arena_exec_grad(a->x, c->in[k]), "gradient", c->in[k]);
    for (int32_t k = 0; k < c->n_out; k++)
        if (c->out_grad[k]) check_addr(a, rkm_arena_exec_grad(a->x, c->out[k]), "gradient", c->out[k]);
    for (int32_t k = 0; k < c->n_saved; k++)
        check_addr(a, rkm_arena_exec_tensor(a->x, c->saved[k]), "tensor", c->saved[k]);
    if (c->phantom) check_addr(a, rkm_arena_exec_saved(a->x, c->op), "saved state of op", c->op);
    return check_workspace(a, c->ws_bytes, c->op);
}

static int al_loss(void *user, const rkm_buffer_call *c)
{
    aligner *a = user;
    check_addr(a, rkm_arena_exec_grad(a->x, c->index), "gradient", c->index);
    return 0;
}

/* A prefetch: the device buffer the copy goes into. */
static int al_prefetch(void *user, const rkm_copy_call *c)
{
    aligner *a = user;
    uint64_t off = c->saved ? rkm_arena_exec_saved(a->x, c->index) : rkm_arena_exec_tensor(a->x, c->index);
    check_addr(a, off, c->saved ? "prefetched saved state of op" : "prefetched tensor", c->index);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Every plan of the small bundled graphs, in every mode
 * ------------------------------------------------------------------------- */

static const char *const mode_names[] = {"layout", "first-fit", "measure"};

/* Runs p twice on a region the exec allocates in `mode`; every address the
 * host sees, the region's base and the inputs included, must be a multiple
 * of the offsets' alignment. Returns the addresses checked. */
static long long run_aligned(rkm_plan *p, rkm_arena_mode mode, const char *graph, long long *workspaces)
{
    const rkm_graph *g = rkm_plan_graph(p);
    rkm_plan_stats ps;
    char label[160];
    CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK);
    snprintf(label, sizeof label, "%s, %s plan at alignment %llu, %s mode", graph, rkm_algo_name(ps.algo),
             (unsigned long long)ps.alignment, mode_names[mode]);
    aligner a = {NULL, NULL, mode == RKM_ARENA_LAYOUT ? ps.alignment : RKM_ARENA_ALIGN, label, 0, 0, 0};
    rkm_callbacks cb = {.user = &a, .forward = al_forward, .backward = al_backward, .loss = al_loss,
                        .offload = noop_copy, .prefetch = al_prefetch, .wait = noop_copy};
    rkm_arena_exec_desc d = {.graph = g, .mode = mode, .plan = p, .host = &cb, .allocate = 1};
    if (rkm_arena_exec_create(&d, &a.x) != RKM_OK) {
        fprintf(stderr, "%s: %s\n", label, rkm_context_errmsg(rkm_graph_context(g)));
        CHECK(0);
        return 0;
    }
    a.base = rkm_arena_exec_base(a.x);
    check_addr(&a, 0, "the region's base", -1);
    for (int32_t t = 0; t < rkm_graph_num_tensors(g); t++)
        if (rkm_arena_exec_tensor(a.x, t) != RKM_ARENA_NONE) check_addr(&a, rkm_arena_exec_tensor(a.x, t), "input", t);
    for (int step = 0; step < 2; step++)
        if (rkm_arena_exec_run(a.x, p) != RKM_OK) {
            fprintf(stderr, "%s: %s\n", label, rkm_context_errmsg(rkm_graph_context(g)));
            CHECK(0);
        }
    if (a.problems) fprintf(stderr, "%s: %d of %lld addresses misaligned\n", label, a.problems, a.checked);
    if (a.problems) reported++;
    CHECK(a.problems == 0);
    rkm_arena_exec_destroy(a.x);
    *workspaces += a.workspaces;
    return a.checked;
}

/* The graphs whose regions are small in real bytes (baseline peak at most
 * 64 MiB); gpt2-tiny twice, the second time with scratch (half of every
 * phantom as workspace), so that workspaces are checked too. */
static const char *const small_graphs[] = {"gpt2-tiny", "mlp16", "multi-output", "random30", "inplace-split",
                                           "dag60", "gpt2-tiny"};

TEST(every_buffer_address_is_aligned)
{
    rkm_context *ctx = test_new_ctx_alloc(skew_alloc);
    const uint64_t aligns[] = {1, 64, 256, 4096};
    const rkm_algo algos[] = {RKM_ALGO_ROTOR, RKM_ALGO_DTR};
    long long checked = 0, workspaces = 0;
    int plans = 0;
    for (size_t i = 0; i < N_OF(small_graphs); i++) {
        int scratch = i + 1 == N_OF(small_graphs);
        rkm_graph *g = scratch ? test_load_scratch_graph(ctx, small_graphs[i]) : test_load_graph(ctx, small_graphs[i]);
        for (size_t k = 0; g && k < N_OF(aligns); k++) {
            rkm_solve_desc sd;
            memset(&sd, 0, sizeof sd);
            sd.alignment = aligns[k];
            sd.algo = RKM_ALGO_NONE;
            rkm_plan *base = NULL;
            rkm_plan_stats bs;
            CHECK(rkm_plan_solve(g, &sd, UINT64_MAX, &base) == RKM_OK && rkm_plan_stats_get(base, &bs) == RKM_OK);
            if (!base) continue;
            CHECK(bs.alignment == aligns[k] && bs.peak <= (64u << 20));
            rkm_plan *todo[5] = {base};
            int n = 1;
            /* Planned plans at 3/4 and 1/2 of the baseline's arena, where
             * the algorithm meets them. */
            for (size_t al = 0; al < N_OF(algos); al++)
                for (uint64_t frac = 3; frac >= 2; frac--) {
                    sd.algo = algos[al];
                    if (rkm_plan_solve(g, &sd, bs.arena_bytes / 4 * frac, &todo[n]) == RKM_OK) n++;
                }
            for (int j = 0; j < n; j++) {
                for (int m = RKM_ARENA_LAYOUT; m <= RKM_ARENA_MEASURE; m++)
                    checked += run_aligned(todo[j], (rkm_arena_mode)m, small_graphs[i], &workspaces);
                rkm_plan_destroy(todo[j]);
            }
            plans += n;
        }
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
    fprintf(stderr, "  %d plans, %lld addresses, %lld workspaces checked\n", plans, checked, workspaces);
    CHECK(plans >= 60 && workspaces > 0);
    CHECK(skew_live == 0 && skew_bad_sizes == 0);
}

/* A region whose capacity plus the alignment's padding passes 64 bits is
 * refused as out of memory, saying why; nothing is left allocated. */
TEST(region_too_large_to_align)
{
    rkm_context *ctx = test_new_ctx_alloc(skew_alloc);
    rkm_graph *g = test_load_graph(ctx, "multi-output");
    rkm_arena_exec *x = NULL;
    rkm_arena_exec_desc d = {.graph = g, .mode = RKM_ARENA_FIRST_FIT, .capacity = UINT64_MAX - 1, .allocate = 1};
    CHECK(g && rkm_arena_exec_create(&d, &x) == RKM_ERROR_NOMEM && x == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "rkm_arena_exec_create: the arena's region of 18446744073709551614 "
                                          "bytes, plus 255 to align its base to 256, is more than an allocation "
                                          "holds") != NULL);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    CHECK(skew_live == 0 && skew_bad_sizes == 0);
}

int main(void)
{
    RUN(every_buffer_address_is_aligned);
    RUN(region_too_large_to_align);
    TEST_END();
}
