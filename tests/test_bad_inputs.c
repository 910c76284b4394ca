/* test_bad_inputs: a catalogue of bad inputs, each with the result it
 * must get and a fragment of its message (the file and line, or the step,
 * and the rule). Graph files, plan files (against a fixed graph), and API
 * misuse; the command line's are in test_cli.sh. A bad input never leaves
 * an object behind. */
#include "test.h"

#include <math.h>

typedef struct bad_input {
    const char *name;
    int is_plan;          /* 0: a .rkg text; 1: a .rkp text for PLAN_GRAPH */
    const char *text;     /* NULL: made by the test (too long to write here) */
    rkm_result code;
    const char *fragment; /* must appear in the context's message */
} bad_input;

static const char PLAN_GRAPH[] = "rockmate-graph 1\ntensor x 8 input\ntensor a 16\ntensor l 4\n"
                                 "op f fwd=1 bwd=2 in=x out=a saved=x phantom=8\nop g fwd=1 bwd=1 in=a out=l saved=a\n"
                                 "loss l\n";

static const bad_input bad_files[] = {
    {"empty", 0, "", RKM_ERROR_PARSE, "bad.rkg:1: the first statement must be the header"},
    {"no header", 0, "tensor x 4 input\n", RKM_ERROR_PARSE, "bad.rkg:1: the first statement must be the header"},
    {"bad header version", 0, "rockmate-graph 2\n", RKM_ERROR_PARSE, "bad.rkg:1: the first statement must be the header"},
    {"header twice", 0, "rockmate-graph 1\nrockmate-graph 1\n", RKM_ERROR_PARSE, "bad.rkg:2: unknown statement 'rockmate-graph'"},
    {"unknown statement", 0, "rockmate-graph 1\ntensr x 4\n", RKM_ERROR_PARSE, "bad.rkg:2: unknown statement 'tensr'"},
    {"tensor no size", 0, "rockmate-graph 1\ntensor x\n", RKM_ERROR_PARSE, "bad.rkg:2: expected 'tensor NAME BYTES"},
    {"tensor bad size", 0, "rockmate-graph 1\ntensor x -4\n", RKM_ERROR_PARSE, "bad.rkg:2: tensor x: '-4' is not a byte count"},
    {"tensor size overflow", 0, "rockmate-graph 1\ntensor x 99999999999999999999\n", RKM_ERROR_PARSE, "bad.rkg:2: tensor x: '99999999999999999999' is not a byte count"},
    {"tensor bad flag", 0, "rockmate-graph 1\ntensor x 4 inputt\n", RKM_ERROR_PARSE, "bad.rkg:2: tensor x: unknown flag 'inputt'"},
    {"tensor twice", 0, "rockmate-graph 1\ntensor x 4\ntensor x 4\n", RKM_ERROR_GRAPH, "bad.rkg:3: tensor x: declared twice"},
    {"bad name", 0, "rockmate-graph 1\ntensor x$ 4\n", RKM_ERROR_PARSE, "bad.rkg:2: tensor 'x$': a name is 1 to 255 characters"},
    {"name too long", 0, NULL, RKM_ERROR_PARSE, "bad.rkg:2: tensor 'aaaa"},
    {"op no out", 0, "rockmate-graph 1\ntensor x 4 input\nop f fwd=1 bwd=1 in=x\nloss x\n", RKM_ERROR_PARSE, "bad.rkg:3: op f: out= is required"},
    {"op unknown key", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y colour=red\nloss y\n", RKM_ERROR_PARSE, "bad.rkg:4: op f: unknown key 'colour'"},
    {"op key twice", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 fwd=2 bwd=1 in=x out=y\nloss y\n", RKM_ERROR_PARSE, "bad.rkg:4: op f: key fwd given twice"},
    {"op bad time", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=abc bwd=1 in=x out=y\nloss y\n", RKM_ERROR_PARSE, "bad.rkg:4: op f: fwd='abc' is not a non-negative decimal time"},
    {"op negative time", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=-1 bwd=1 in=x out=y\nloss y\n", RKM_ERROR_PARSE, "bad.rkg:4: op f: fwd='-1' is not a non-negative decimal time"},
    {"op nan time", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=nan bwd=1 in=x out=y\nloss y\n", RKM_ERROR_PARSE, "bad.rkg:4: op f: fwd='nan' is not a non-negative decimal time"},
    {"op reads undeclared", 0, "rockmate-graph 1\ntensor y 4\nop f fwd=1 bwd=1 in=z out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:3: in=: tensor z is not declared"},
    {"op reads unproduced", 0, "rockmate-graph 1\ntensor x 4\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:4: op f: reads x, which is neither an input nor an output of an earlier op"},
    {"op writes input", 0, "rockmate-graph 1\ntensor x 4 input\nop f fwd=1 bwd=1 in=x out=x\nloss x\n", RKM_ERROR_GRAPH, "bad.rkg:3: op f: writes x, which is an input"},
    {"two producers", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y\nop g fwd=1 bwd=1 in=x out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:5: op g: writes y, which op f already writes"},
    {"read and written", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x,y out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:4: op f: reads y"},
    {"saved not in lists", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\ntensor z 4\nop f fwd=1 bwd=1 in=x out=y saved=z\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:5: op f: saved tensor z is neither in in= nor in out="},
    {"list repeats", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x,x out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:4: op f: in names tensor x twice"},
    {"op twice", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\ntensor z 4\nop f fwd=1 bwd=1 in=x out=y\nop f fwd=1 bwd=1 in=y out=z\nloss z\n", RKM_ERROR_GRAPH, "bad.rkg:6: op f: declared twice"},
    {"no loss", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y\n", RKM_ERROR_GRAPH, "bad.rkg:4: no loss statement"},
    {"loss twice", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y\nloss y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:6: loss: given twice"},
    {"loss is input", 0, "rockmate-graph 1\ntensor x 4 input\nloss x\n", RKM_ERROR_GRAPH, "bad.rkg:3: loss: x is an input tensor"},
    {"loss nograd", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4 nograd\nop f fwd=1 bwd=1 in=x out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:5: loss: y is nograd"},
    {"loss undeclared", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y\nloss q\n", RKM_ERROR_GRAPH, "bad.rkg:5: loss: tensor q is not declared"},
    {"after loss", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y\nloss y\ntensor z 4\n", RKM_ERROR_GRAPH, "bad.rkg:6: tensor z: nothing may follow the loss statement"},
    {"not ancestor", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\ntensor z 4\nop f fwd=1 bwd=1 in=x out=y\nop g fwd=1 bwd=1 in=x out=z\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:6: op g: not an ancestor of the loss y"},
    {"tensor never written", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\ntensor w 4\nop f fwd=1 bwd=1 in=x out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:4: tensor w: not an input and no op writes it"},
    {"bytes overflow", 0, "rockmate-graph 1\ntensor x 9223372036854775807 input\ntensor y 9223372036854775807\nop f fwd=1 bwd=1 in=x out=y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:5: byte counts too large: their total must fit in 64 bits"},
    {"nul byte", 0, "rockmate-graph 1\ntensor x 4\0 input\n", RKM_ERROR_PARSE, "bad.rkg:2: a NUL byte is not allowed"},
    {"phantom bad", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y phantom=-3\nloss y\n", RKM_ERROR_PARSE, "bad.rkg:4: op f: phantom='-3' is not a byte count"},
    {"empty plan", 1, "", RKM_ERROR_PARSE, "bad.rkp:1: the first statement must be the header 'rockmate-plan 1'"},
    {"bad plan header", 1, "rockmate-plan 2\n", RKM_ERROR_PARSE, "bad.rkp:1: the first statement must be the header"},
    {"unknown step", 1, "rockmate-plan 1\nfwdd f\n", RKM_ERROR_PARSE, "bad.rkp:2: unknown step 'fwdd'"},
    {"fwd without op", 1, "rockmate-plan 1\nfwd\n", RKM_ERROR_PARSE, "bad.rkp:2: expected 'fwd OP [save] [inplace]'"},
    {"fwd bad save", 1, "rockmate-plan 1\nfwd f sav\n", RKM_ERROR_PARSE,
     "bad.rkp:2: expected 'fwd OP [save] [inplace]', not 'sav' as word 3"},
    {"fwd inplace before save", 1, "rockmate-plan 1\nfwd f inplace save\n", RKM_ERROR_PARSE,
     "bad.rkp:2: expected 'fwd OP [save] [inplace]', not 'save' as word 4"},
    {"bwd inplace twice", 1, "rockmate-plan 1\nbwd f inplace inplace\n", RKM_ERROR_PARSE,
     "bad.rkp:2: expected 'bwd OP [inplace]'"},
    {"free inplace", 1, "rockmate-plan 1\nfree a inplace\n", RKM_ERROR_PARSE, "bad.rkp:2: expected 'free NAME'"},
    {"loss with argument", 1, "rockmate-plan 1\nloss l\n", RKM_ERROR_PARSE, "bad.rkp:2: expected 'loss' alone"},
    {"unknown op", 1, "rockmate-plan 1\nfwd h\n", RKM_ERROR_PARSE, "bad.rkp:2: fwd: no op named 'h' in the graph"},
    {"unknown tensor", 1, "rockmate-plan 1\nfree q\n", RKM_ERROR_PARSE, "bad.rkp:2: free: no tensor named 'q' in the graph"},
    {"nul in plan", 1, "rockmate-plan 1\nfwd f\0\n", RKM_ERROR_PARSE, "bad.rkp:2: a NUL byte is not allowed"},
    {"input not live", 1, "rockmate-plan 1\nfwd g\n", RKM_ERROR_PLAN, "bad.rkp:2: step 0 (fwd g): fwd: every in tensor must be live: a"},
    {"save twice", 1, "rockmate-plan 1\nfwd f save\nfwd f save\n", RKM_ERROR_PLAN, "bad.rkp:3: step 1 (fwd f save): fwd save: the op's saved state must not be live already: f"},
    {"loss tensor missing", 1, "rockmate-plan 1\nloss\n", RKM_ERROR_PLAN, "bad.rkp:2: step 0 (loss): loss: the loss tensor must be live: l"},
    {"free an input", 1, "rockmate-plan 1\nfree x\n", RKM_ERROR_PLAN, "bad.rkp:2: step 0 (free x): free: an input tensor is never freed: x"},
    {"bwd twice", 1, "rockmate-plan 1\nfwd f save\nfwd g\nloss\nfree l\nbwd g\nfree_grad l\nfree a\nbwd f\nbwd f\nfree_saved f\nfree_grad a\n", RKM_ERROR_PLAN, "bad.rkp:10: step 8 (bwd f): bwd: each backward runs exactly once: f"},
    {"tensor live at the end", 1, "rockmate-plan 1\nfwd f save\nfwd g\nloss\nfree l\nbwd g\nfree_grad l\nbwd f\nfree_saved f\nfree_grad a\n", RKM_ERROR_PLAN, "bad.rkp: step 9 (end of plan): end: only input tensors may be live: a"},
    {"gradient live at the end", 1, "rockmate-plan 1\nfwd f save\nfwd g\nloss\nfree l\nbwd g\nfree_grad l\nfree a\nbwd f\nfree_saved f\n", RKM_ERROR_PLAN, "bad.rkp: step 9 (end of plan): end: no gradient may be live: a"},
    {"phantom missing", 1, "rockmate-plan 1\nfwd f\nfwd g\nloss\nfree l\nbwd g\nfree_grad l\nfree a\nbwd f\nfree_saved f\nfree_grad a\n", RKM_ERROR_PLAN, "bad.rkp:9: step 7 (bwd f): bwd: the op's saved state (phantom) must be live: f"},
    {"gradient missing", 1, "rockmate-plan 1\nfwd f save\nfwd g\nloss\nbwd f\n", RKM_ERROR_PLAN, "bad.rkp:5: step 3 (bwd f): bwd: the gradient of every output with a gradient must be live: a"},
    {"free_saved not live", 1, "rockmate-plan 1\nfree_saved f\n", RKM_ERROR_PLAN, "bad.rkp:2: step 0 (free_saved f): free_saved: the op's saved state must be live: f"},
};

/* The text of case b (the long-name case is built here). */
static char *case_text(const bad_input *b, size_t *len)
{
    char *t;
    if (b->text) {
        /* the NUL cases: the text goes on past its NUL */
        *len = strlen(b->text);
        if (strstr(b->name, "nul")) *len += 1 + strlen(b->text + *len + 1);
        t = malloc(*len + 1);
        memcpy(t, b->text, *len + 1);
        return t;
    }
    t = malloc(300);
    snprintf(t, 300, "rockmate-graph 1\ntensor %0256d 4\n", 0);
    for (char *p = strstr(t, "tensor ") + 7; *p == '0'; p++) *p = 'a';
    *len = strlen(t);
    return t;
}

static void check_file_case(const bad_input *b, const rkm_graph *pg, rkm_context *ctx)
{
    size_t len;
    char *text = case_text(b, &len);
    rkm_result r;
    void *out = (void *)1;
    if (b->is_plan) r = rkm_plan_read_string(pg, text, len, "bad.rkp", NULL, (rkm_plan **)&out);
    else r = rkm_graph_read_string(ctx, text, len, "bad.rkg", (rkm_graph **)&out);
    const char *msg = rkm_context_errmsg(ctx);
    int ok = r == b->code && out == NULL && strstr(msg, b->fragment) != NULL;
    if (!ok) fprintf(stderr, "%s: result %d (want %d), message '%s' (want '%s')\n", b->name, (int)r, (int)b->code, msg, b->fragment);
    CHECK(ok);
    free(text);
}

TEST(bad_files_are_refused_by_name)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *pg = NULL;
    CHECK(rkm_graph_read_string(ctx, PLAN_GRAPH, strlen(PLAN_GRAPH), "g.rkg", &pg) == RKM_OK);
    for (size_t k = 0; pg && k < N_OF(bad_files); k++) check_file_case(&bad_files[k], pg, ctx);
    rkm_graph_destroy(pg);
    rkm_context_destroy(ctx);
}

/* One call's result and the message it left, right after it. */
static void check_call(const char *name, rkm_result got, rkm_result want, const char *fragment, const rkm_context *ctx)
{
    const char *msg = rkm_context_errmsg(ctx);
    int ok = got == want && strstr(msg, fragment) != NULL;
    if (!ok) fprintf(stderr, "%s: result %d (want %d), message '%s' (want '%s')\n", name, (int)got, (int)want, msg, fragment);
    CHECK(ok);
}

/* API misuse: each call fails with its code and a message naming the call
 * and what is wrong, and leaves its output NULL. */
TEST(api_misuse_is_refused_by_name)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL, *b = NULL, *out = NULL;
    rkm_plan *p = NULL;
    rkm_planner *pl = NULL;
    CHECK(rkm_graph_read_string(ctx, PLAN_GRAPH, strlen(PLAN_GRAPH), "g.rkg", &g) == RKM_OK);
    CHECK(rkm_graph_create(ctx, &b) == RKM_OK);
    if (!g || !b) return;
    rkm_solve_desc sd = {0};
#define CALL(expr, want, frag) check_call(#expr, (expr), (want), (frag), ctx)
    int32_t id = 0;
    rkm_op_desc d = {"h", 1, 1, &id, 1, &id, 1, NULL, 0, 0, 0, 0, 0, 0};
    rkm_tensor_info ti;
    rkm_graph_stats gs;
    rkm_profile_desc pd = {.runs = -1};
    rkm_callbacks cb = {NULL, noop_fwd, NULL, NULL, NULL, NULL, NULL};
    CALL(rkm_graph_add_tensor(g, "y", 4, 0, NULL), RKM_ERROR_STATE, "finalized and read-only");
    CALL(rkm_graph_add_op(g, &d, NULL), RKM_ERROR_STATE, "finalized and read-only");
    CALL(rkm_graph_finalize(g), RKM_ERROR_STATE, "finalized and read-only");
    CALL(rkm_graph_tensor_info(g, 99, &ti), RKM_ERROR_ARGUMENT, "tensor id 99 does not exist");
    CALL(rkm_graph_stats_get(b, &gs), RKM_ERROR_STATE, "rkm_graph_stats_get: the graph is not finalized");
    CALL(rkm_graph_add_tensor(b, "x", 4, 8u, NULL), RKM_ERROR_ARGUMENT, "unknown flags");
    CALL(rkm_graph_set_loss(b, 5), RKM_ERROR_ARGUMENT, "loss: tensor id 5 does not exist");
    CALL(rkm_plan_baseline(b, &p), RKM_ERROR_STATE, "rkm_plan_baseline: the graph is not finalized");
    CALL(rkm_planner_create(b, &sd, &pl), RKM_ERROR_STATE, "rkm_planner_create: the graph is not finalized");
    sd.time_limit = NAN;
    CALL(rkm_planner_create(g, &sd, &pl), RKM_ERROR_ARGUMENT, "time_limit");
    sd.time_limit = 0;
    sd.algo = (rkm_algo)42;
    CALL(rkm_plan_solve(g, &sd, 1000, &p), RKM_ERROR_ARGUMENT, "algorithm 42 does not exist");
    CALL(rkm_graph_profile(g, &cb, &pd, &out), RKM_ERROR_ARGUMENT, "the forward and backward callbacks are required");
    cb.backward = noop_bwd;
    CALL(rkm_graph_profile(g, &cb, &pd, &out), RKM_ERROR_ARGUMENT, "runs is -1");
    pd.runs = 0;
    pd.trim = NAN;
    CALL(rkm_graph_profile(g, &cb, &pd, &out), RKM_ERROR_ARGUMENT, "trim is nan");
    CALL(rkm_plan_create(g, NULL, 3, NULL, &p), RKM_ERROR_ARGUMENT, "rkm_plan_create: steps is NULL");
    CALL(rkm_algo_from_name(ctx, "rotorr", &sd.algo), RKM_ERROR_ARGUMENT, "unknown algorithm 'rotorr'");
#undef CALL
    CHECK(p == NULL && pl == NULL && out == NULL);
    rkm_graph_destroy(b);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(bad_files_are_refused_by_name);
    RUN(api_misuse_is_refused_by_name);
    TEST_END();
}
