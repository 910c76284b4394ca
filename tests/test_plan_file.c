/* Plan files (.rkp) of version 2: the alignment and the fingerprint of the
 * graph a plan was made for, and version 1 files reading as before. */
#include "../src/internal.h"
#include "test.h"

/* In-place ops, a nograd tensor, a phantom with scratch, both workspaces
 * and a copy link: every field the fingerprint covers is set somewhere. */
static const char G_FP[] = "rockmate-graph 1\ntensor x 16 input\ntensor h 1000\ntensor a 1000\ntensor m 8 nograd\n"
                           "tensor l 4\nop f fwd=0.5 bwd=1.25 in=x out=h,m saved=x fwd_ws=8\n"
                           "op g fwd=1 bwd=2 in=h out=a saved=a inplace grad_inplace\n"
                           "op k fwd=3 bwd=4 in=a,m out=l saved=a,m phantom=64 scratch=32 bwd_ws=16\n"
                           "loss l\ncopy d2h=1e9 h2d=5e8 latency=1e-6\n";

/* G_FP's fingerprint as docs/formats.md defines it, worked out by an
 * implementation of that text of its own (Python, struct.pack('<...')):
 * the same on every machine. */
static const char FP_G_FP[] = "graph tensors 5 724222b6ae89e95a 7fbb24e16d2dfe567fe3e625\n"
                              "graph ops 3 c92b1edce22eea9c 7d3d393a8d0737bf\n"
                              "graph structure 3 cbaea72b8d04cc01 69152d764042d270\n"
                              "graph copy 8c06c9ffc72df9f5\n";

static rkm_graph *load_text(rkm_context *ctx, const char *text)
{
    rkm_graph *g = NULL;
    if (rkm_graph_read_string(ctx, text, strlen(text), "fp.rkg", &g) != RKM_OK)
        fprintf(stderr, "fp.rkg: %s\n", rkm_context_errmsg(ctx));
    CHECK(g != NULL);
    return g;
}

static char *plan_text_of(const rkm_plan *p)
{
    sbuf b = {0};
    CHECK(p && rkm_plan_write(p, sbuf_write, &b) == RKM_OK && b.data);
    return b.data;
}

/* The writer's header, alignment and fingerprint, byte for byte. */
TEST(fingerprint_is_the_documented_one)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load_text(ctx, G_FP);
    rkm_plan *p = NULL;
    if (g) CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
    char *t = p ? plan_text_of(p) : NULL;
    char want[512];
    snprintf(want, sizeof want, "rockmate-plan 2\nalign 256\n%s", FP_G_FP);
    if (t && strncmp(t, want, strlen(want)) != 0) fprintf(stderr, "written:\n%s", t);
    CHECK(t && strncmp(t, want, strlen(want)) == 0 && strcmp(t + strlen(want), test_plan_steps(t)) == 0);
    free(t);
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* A plan made at alignment 64 (and 1) reads back at it, with the same
 * layout: the alignment, the figures and every offset. */
TEST(plan_file_keeps_its_alignment)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = test_load_graph(ctx, "gpt2-tiny");
    rkm_graph_stats gs;
    if (g) CHECK(rkm_graph_stats_get(g, &gs) == RKM_OK);
    static const uint64_t aligns[] = {64, 1, 4096};
    for (size_t k = 0; g && k < N_OF(aligns); k++) {
        rkm_solve_desc d = {0};
        d.algo = RKM_ALGO_SQRT;
        d.alignment = aligns[k];
        rkm_plan *p = NULL, *q = NULL;
        CHECK(rkm_plan_solve(g, &d, gs.baseline_peak / 10 * 8, &p) == RKM_OK);
        char *t = p ? plan_text_of(p) : NULL;
        if (t) CHECK(rkm_plan_read_string(g, t, strlen(t), "a.rkp", NULL, &q) == RKM_OK);
        rkm_plan_stats ps, qs;
        if (q) {
            CHECK(rkm_plan_stats_get(p, &ps) == RKM_OK && rkm_plan_stats_get(q, &qs) == RKM_OK);
            CHECK_EQ_U64(qs.alignment, aligns[k]);
            CHECK(qs.alignment == ps.alignment && qs.aligned_peak == ps.aligned_peak &&
                  qs.arena_bytes == ps.arena_bytes);
            size_t n = rkm_plan_num_buffers(p);
            rkm_buffer *a = calloc(n + 1, sizeof *a), *b = calloc(n + 1, sizeof *b);
            uint64_t aa = 0, ab = 0;
            CHECK(a && b && rkm_plan_num_buffers(q) == n && rkm_plan_layout(p, 0, a, &aa) == RKM_OK &&
                  rkm_plan_layout(q, 0, b, &ab) == RKM_OK && aa == ab && memcmp(a, b, n * sizeof *a) == 0);
            free(a);
            free(b);
        }
        free(t);
        rkm_plan_destroy(q);
        rkm_plan_destroy(p);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* G_FP's text with one line replaced (`from` by `to`), read. */
static rkm_graph *load_edited(rkm_context *ctx, const char *from, const char *to)
{
    const char *at = strstr(G_FP, from);
    CHECK(at != NULL);
    if (!at) return NULL;
    char text[1024];
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - G_FP), G_FP, to, at + strlen(from));
    return load_text(ctx, text);
}

typedef struct other_graph {
    const char *from, *to; /* the edit of G_FP */
    int line;              /* of the plan file the message names */
    const char *says;
} other_graph;

static const other_graph others[] = {
    {"tensor a 1000\n", "tensor a 1000\ntensor b 4 input\n", 3,
     "the plan was made for a graph of 5 tensors; this one has 6"},
    {"tensor m 8 nograd", "tensor m 12 nograd", 3,
     "the plan was made for another graph: tensor sizes or flags differ at tensor 'm'"},
    {"tensor m 8 nograd", "tensor m 8", 3, "tensor sizes or flags differ at tensor 'm'"},
    {"tensor x 16 input", "tensor x 17 input", 3, "tensor sizes or flags differ at tensor 'x'"},
    {"tensor h 1000\ntensor a 1000", "tensor h 1004\ntensor a 1004", 3,
     "tensor sizes or flags differ at more than one tensor"},
    {"op k fwd=3 ", "op k fwd=3.5 ", 4, "the plan was made for another graph: op costs differ at op 'k' ("},
    {"scratch=32", "scratch=16", 4, "op costs differ at op 'k'"},
    {"fwd_ws=8", "fwd_ws=9", 4, "op costs differ at op 'f'"},
    {" inplace grad_inplace", " inplace", 4, "op costs differ at op 'g'"},
    {"bwd=1.25", "bwd=1.5", 4, "op costs differ at op 'f'"},
    {"fwd=0.5 bwd=1.25", "fwd=0.25 bwd=2.5", 4, "op costs differ at op 'f'"},
    {"fwd=1 bwd=2", "fwd=2 bwd=2", 4, "op costs differ at op 'g'"},
    {"op f fwd=0.5 bwd=1.25", "op f fwd=0.75 bwd=1.25", 4, "op costs differ at op 'f'"},
    {"op g fwd=1 bwd=2", "op g fwd=1 bwd=3", 4, "op costs differ at op 'g'"},
    {"fwd_ws=8\nop g fwd=1", "fwd_ws=9\nop g fwd=2", 4, "op costs differ at more than one op"},
    {"tensor l 4\nop f fwd=0.5", "tensor l 5\nop f fwd=0.6", 3, "tensor sizes or flags differ at tensor 'l'"},
    {"in=a,m out=l saved=a,m", "in=a,m out=l saved=a", 5,
     "the plan was made for another graph: the structure differs at op 'k' (in, out or saved lists)"},
    {"in=a,m out=l saved=a,m", "in=m,a out=l saved=a,m", 5, "the structure differs at op 'k'"},
    {"saved=x fwd_ws", "fwd_ws", 5, "the structure differs at op 'f'"},
    {"d2h=1e9", "d2h=2e9", 6, "the plan was made for another graph: the copy link differs (bandwidths or latency)"},
    {"latency=1e-6", "latency=0", 6, "the copy link differs"},
    {"copy d2h=1e9 h2d=5e8 latency=1e-6\n", "", 6, "the copy link differs"},
};

/* A plan read against a graph that differs from the one it was made for
 * is refused, the message naming the plan file's line and the first
 * difference; its steps alone (a version 1 file) still read there. */
TEST(plan_file_refused_for_another_graph)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load_text(ctx, G_FP);
    rkm_plan *p = NULL;
    if (g) CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
    char *t = p ? plan_text_of(p) : NULL;
    for (size_t k = 0; t && k < N_OF(others); k++) {
        rkm_graph *o = load_edited(ctx, others[k].from, others[k].to);
        rkm_plan *q = (rkm_plan *)&ctx;
        rkm_result r = o ? rkm_plan_read_string(o, t, strlen(t), "fp.rkp", NULL, &q) : RKM_ERROR_ARGUMENT;
        const char *msg = rkm_context_errmsg(ctx);
        char where[32];
        snprintf(where, sizeof where, "fp.rkp:%d: ", others[k].line);
        int ok = r == RKM_ERROR_PARSE && q == NULL && strncmp(msg, where, strlen(where)) == 0 &&
                 strstr(msg, others[k].says) != NULL;
        if (!ok)
            fprintf(stderr, "other graph %zu: result %d, '%s' (want %s... %s)\n", k, (int)r, msg, where,
                    others[k].says);
        CHECK(ok);
        char v1[4096];
        snprintf(v1, sizeof v1, "rockmate-plan 1\n%s", test_plan_steps(t));
        q = NULL;
        r = o ? rkm_plan_read_string(o, v1, strlen(v1), "v1.rkp", NULL, &q) : RKM_ERROR_ARGUMENT;
        CHECK(r == RKM_OK || r == RKM_ERROR_PLAN); /* a rule may break: `bwd g inplace` without grad_inplace */
        rkm_plan_destroy(q);
        rkm_graph_destroy(o);
    }
    /* names are no part of it: with op k renamed, the fingerprint holds
     * and the first step that names k is what fails */
    rkm_graph *renamed = load_edited(ctx, "op k ", "op kk ");
    rkm_plan *q = NULL;
    if (renamed && t) {
        CHECK(rkm_plan_read_string(renamed, t, strlen(t), "fp.rkp", NULL, &q) == RKM_ERROR_PARSE);
        const char *msg = rkm_context_errmsg(ctx);
        CHECK(strstr(msg, "no op named 'k'") && strncmp(msg, "fp.rkp:", 7) == 0 && atoi(msg + 7) > 6);
    }
    rkm_graph_destroy(renamed);
    if (g && t) CHECK(rkm_plan_read_string(g, t, strlen(t), "fp.rkp", NULL, &q) == RKM_OK);
    rkm_plan_destroy(q);
    free(t);
    rkm_plan_destroy(p);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

typedef struct bad_v2 {
    const char *text; /* after the header */
    int line;
    const char *says;
} bad_v2;

static const bad_v2 bad_v2s[] = {
    {"align 3\n", 2, "expected 'align N', N a power of two"},
    {"align 0\n", 2, "expected 'align N'"},
    {"align 2147483648\n", 2, "expected 'align N'"},
    {"align\n", 2, "expected 'align N'"},
    {"align 64\nalign 64\n", 3, "align: given twice"},
    {"fwd f\nalign 64\n", 3, "'align' comes before the steps"},
    {"fwd f\ngraph copy 8c06c9ffc72df9f5\n", 3, "'graph' comes before the steps"},
    {"graph copy 8c06c9ffc72df9f5\ngraph copy 8c06c9ffc72df9f5\n", 3, "graph copy: given twice"},
    {"graph links 1\n", 2, "expected 'graph tensors|ops|structure COUNT HASH [LOCATOR]'"},
    {"graph copy 8c06c9ffc72df9f\n", 2, "expected 'graph copy HASH'"},
    {"graph copy 8C06C9FFC72DF9F5\n", 2, "expected 'graph copy HASH'"},
    {"graph ops 3 c92b1edce22eea9c\n", 2, "expected 'graph ops COUNT HASH [LOCATOR]'"},
    {"graph ops 3 c92b1edce22eea9c 7d3d393a8d0737b\n", 2, "expected 'graph ops COUNT HASH [LOCATOR]'"},
    {"graph ops 3 c92b1edce22eea9c 7d3d393a8d0737bf 1\n", 2, "expected 'graph ops COUNT HASH [LOCATOR]'"},
    {"graph ops -3 c92b1edce22eea9c 7d3d393a8d0737bf\n", 2, "expected 'graph ops COUNT HASH [LOCATOR]'"},
    {"graph ops 5 c92b1edce22eea9c 7d3d393a8d0737bf\n", 2, "expected 'graph ops COUNT HASH [LOCATOR]'"},
    {"graph ops 4 c92b1edce22eea9c 7d3d393a8d0737bf\n", 2, "graph of 4 ops; this one has 3"},
    {"graph tensors 5 724222b6ae89e95a 7fbb24e16d2dfe567fe3e62x\n", 2, "expected 'graph tensors COUNT HASH"},
};

/* The statements of version 2, misused: refused with source:line. In a
 * version 1 file they are not statements at all. */
TEST(plan_file_version_2_syntax)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = load_text(ctx, G_FP);
    for (size_t k = 0; g && k < N_OF(bad_v2s); k++) {
        char text[512];
        snprintf(text, sizeof text, "rockmate-plan 2\n%s", bad_v2s[k].text);
        rkm_plan *p = (rkm_plan *)&ctx;
        rkm_result r = rkm_plan_read_string(g, text, strlen(text), "v2.rkp", NULL, &p);
        const char *msg = rkm_context_errmsg(ctx);
        char where[32];
        snprintf(where, sizeof where, "v2.rkp:%d: ", bad_v2s[k].line);
        int ok = r == RKM_ERROR_PARSE && p == NULL && strncmp(msg, where, strlen(where)) == 0 &&
                 strstr(msg, bad_v2s[k].says) != NULL;
        if (!ok)
            fprintf(stderr, "bad v2 %zu: result %d, '%s' (want %s... %s)\n", k, (int)r, msg, where, bad_v2s[k].says);
        CHECK(ok);
    }
    static const char *const v1[] = {"rockmate-plan 1\nalign 64\n", "rockmate-plan 1\ngraph copy 8c06c9ffc72df9f5\n"};
    for (size_t k = 0; g && k < N_OF(v1); k++) {
        rkm_plan *p = NULL;
        CHECK(rkm_plan_read_string(g, v1[k], strlen(v1[k]), "v1.rkp", NULL, &p) == RKM_ERROR_PARSE && !p);
        const char *msg = rkm_context_errmsg(ctx);
        CHECK(strncmp(msg, "v1.rkp:2: ", 10) == 0 && strstr(msg, "needs the header 'rockmate-plan 2'"));
    }
    /* every line optional: the steps alone, or any part of the fingerprint */
    rkm_plan *b = NULL;
    if (g) CHECK(rkm_plan_baseline(g, &b) == RKM_OK);
    char *t = b ? plan_text_of(b) : NULL;
    char text[4096];
    const char *parts[] = {"", "align 16\n", "graph ops 3 c92b1edce22eea9c 7d3d393a8d0737bf\n", FP_G_FP};
    for (size_t k = 0; t && k < N_OF(parts); k++) {
        snprintf(text, sizeof text, "rockmate-plan 2\n%s%s", parts[k], test_plan_steps(t));
        rkm_plan *p = NULL;
        rkm_plan_stats ps;
        CHECK(rkm_plan_read_string(g, text, strlen(text), "v2.rkp", NULL, &p) == RKM_OK);
        CHECK(p && rkm_plan_stats_get(p, &ps) == RKM_OK && ps.alignment == (k == 1 ? 16u : RKM_ARENA_ALIGN));
        rkm_plan_destroy(p);
    }
    free(t);
    rkm_plan_destroy(b);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* The plan files bundled in the repository (version 1) read as they did:
 * valid, laid out at 256. */
TEST(bundled_version_1_plans_read)
{
    static const char *const files[][2] = {
        {"tests/graphs/gpt2-tiny.rkg", "bench/reference/plans/gpt2-tiny__30pct.rkp"},
        {"tests/graphs/gpt2-tiny.rkg", "bench/reference/plans/gpt2-tiny__40pct.rkp"},
        {"tests/graphs/gpt2-tiny.rkg", "bench/reference/plans/gpt2-tiny__60pct.rkp"},
        {"tests/graphs/gpt2-tiny.rkg", "bench/reference/plans/gpt2-tiny__80pct.rkp"},
        {"tests/graphs/gpt2-tiny.rkg", "bench/reference/plans/gpt2-tiny__atmin.rkp"},
        {"tests/graphs/mlp16.rkg", "bench/reference/plans/mlp16__40pct.rkp"},
        {"tests/graphs/mlp16.rkg", "bench/reference/plans/mlp16__60pct.rkp"},
        {"tests/graphs/mlp16.rkg", "bench/reference/plans/mlp16__80pct.rkp"},
        {"tests/graphs/mlp16.rkg", "bench/reference/plans/mlp16__atmin.rkp"},
        {"tests/graphs/dag4x50.rkg", "bench/reference/plans/dag4x50__30pct.rkp"},
        {"tests/graphs/dag4x50.rkg", "bench/reference/plans/dag4x50__40pct.rkp"},
        {"tests/graphs/dag4x50.rkg", "bench/reference/plans/dag4x50__70pct.rkp"},
        {"tests/graphs/peer-gpt.rkg", "bench/reference/peer-gpt/peer-0.206.rkp"},
        {"tests/graphs/peer-gpt.rkg", "bench/reference/peer-gpt/peer-0.300.rkp"},
        {"tests/graphs/peer-gpt.rkg", "bench/reference/peer-gpt/peer-0.400.rkp"},
        {"tests/graphs/peer-gpt.rkg", "bench/reference/peer-gpt/peer-0.500.rkp"},
        {"tests/graphs/peer-gpt.rkg", "bench/reference/peer-gpt/peer-0.600.rkp"},
        {"tests/graphs/peer-gpt.rkg", "bench/reference/peer-gpt/peer-0.800.rkp"},
        {"tests/graphs/peer-gpt.rkg", "bench/reference/peer-gpt/peer-1.000.rkp"},
        {"tests/graphs/dag6x30-s17.rkg", "bench/reference/dag-blocks/dag6x30-s17__30pct.rkp"},
        {"tests/graphs/dag6x30-s17.rkg", "bench/reference/dag-blocks/dag6x30-s17__50pct.rkp"},
        {"tests/graphs/dag6x30-s17.rkg", "bench/reference/dag-blocks/dag6x30-s17__70pct.rkp"},
        {"tests/graphs/dag6x30-s17.rkg", "bench/reference/dag-blocks/dag6x30-s17__90pct.rkp"},
    };
    rkm_context *ctx = test_new_ctx();
    for (size_t k = 0; k < N_OF(files); k++) {
        rkm_graph *g = NULL;
        rkm_plan *p = NULL;
        rkm_plan_stats ps;
        CHECK(rkm_graph_read_file(ctx, files[k][0], &g) == RKM_OK);
        if (g && rkm_plan_read_file(g, files[k][1], NULL, &p) != RKM_OK)
            fprintf(stderr, "%s: %s\n", files[k][1], rkm_context_errmsg(ctx));
        CHECK(p && rkm_plan_stats_get(p, &ps) == RKM_OK && ps.alignment == RKM_ARENA_ALIGN);
        rkm_plan_destroy(p);
        rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(fingerprint_is_the_documented_one);
    RUN(plan_file_keeps_its_alignment);
    RUN(plan_file_refused_for_another_graph);
    RUN(plan_file_version_2_syntax);
    RUN(bundled_version_1_plans_read);
    TEST_END();
}
