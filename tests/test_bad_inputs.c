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
    {"loss twice", 0, "rockmate-graph 1\ntensor x 4 input\ntensor y 4\nop f fwd=1 bwd=1 in=x out=y\nloss y\nloss y\n", RKM_ERROR_GRAPH, "bad.rkg:6: loss: given twice (a graph has exactly one loss or output statement)"},
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
    {"bad plan header", 1, "rockmate-plan 3\n", RKM_ERROR_PARSE, "bad.rkp:1: the first statement must be the header"},
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
    {"gradient live at the end", 1, "rockmate-plan 1\nfwd f save\nfwd g\nloss\nfree l\nbwd g\nfree_grad l\nfree a\nbwd f\nfree_saved f\n", RKM_ERROR_PLAN, "bad.rkp: step 9 (end of plan): end: no gradient may be live (but a stage input's): a"},
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
    rkm_callbacks cb = {.forward = noop_fwd};
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

/* Every public function given a NULL object: RKM_ERROR_ARGUMENT (or, for
 * one without a result, nothing done and a neutral answer), no crash under
 * the sanitizers, and the context's message left alone (there is no
 * context to write to). Then each NULL pointer argument beside a valid
 * object: RKM_ERROR_ARGUMENT with a message naming the call. The list
 * follows rockmate.h; a function added there belongs here. */
TEST(null_arguments_are_refused)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL, *gout;
    rkm_plan *p = NULL, *pout;
    rkm_planner *pl = NULL, *plout;
    rkm_arena *a = NULL, *aout;
    rkm_arena_exec *x = NULL, *xout;
    CHECK(rkm_graph_read_string(ctx, PLAN_GRAPH, strlen(PLAN_GRAPH), "g.rkg", &g) == RKM_OK);
    if (!g) return;
    rkm_solve_desc sd = {.algo = RKM_ALGO_ROTOR};
    CHECK(rkm_planner_create(g, &sd, &pl) == RKM_OK);
    CHECK(rkm_plan_baseline(g, &p) == RKM_OK);
    CHECK(rkm_arena_create(ctx, 4096, 4, &a) == RKM_OK);
    rkm_callbacks cb = {.forward = noop_fwd, .backward = noop_bwd};
    rkm_arena_exec_desc xd = {.graph = g, .plan = p, .host = &cb, .allocate = 1};
    CHECK(rkm_arena_exec_create(&xd, &x) == RKM_OK);
    if (!pl || !p || !a || !x) return;

    /* A failure of our own, which no NULL-object call below may overwrite. */
    CHECK(rkm_graph_find_op(g, "f") == 0);
    CHECK(rkm_algo_from_name(ctx, "marker", &sd.algo) == RKM_ERROR_ARGUMENT);
    char marker[256];
    snprintf(marker, sizeof marker, "%s", rkm_context_errmsg(ctx));

    const rkm_result A = RKM_ERROR_ARGUMENT;
    /* The call fails with A and clears the output it was given. */
#define NULLED(call, out) ((out) = (void *)1, (call) == A && (out) == NULL)
    int32_t id = 0;
    uint64_t u = 7, u2 = 7;
    double dsec = 1;
    char buf[16] = "x";
    rkm_step step = {RKM_STEP_FWD, 0, 0, 0};
    rkm_op_desc od = {"h", 1, 1, &id, 1, &id, 1, NULL, 0, 0, 0, 0, 0, 0};
    rkm_tensor_info ti;
    rkm_block_info bi;
    rkm_graph_stats gs;
    rkm_plan_stats ps;
    rkm_planner_stats pst;
    rkm_arena_stats as = {1, 1, 1, 1, 1};
    rkm_arena_capacity_info li;
    rkm_buffer bufs[64];
    rkm_op_costs costs[2] = {{1, 1, 0, 0}, {1, 1, 0, 0}};
    rkm_profile_desc prof = {0};

    /* NULL objects. */
    CHECK(rkm_context_create(NULL, NULL) == A);
    CHECK(strcmp(rkm_context_errmsg(NULL), "") == 0);
    CHECK(rkm_context_realloc(NULL, NULL, 0, 8) == NULL);
    CHECK(rkm_context_fail(NULL, RKM_ERROR_IO, "x") == RKM_ERROR_IO);
    rkm_context_destroy(NULL);
    CHECK(NULLED(rkm_graph_create(NULL, &gout), gout));
    rkm_graph_destroy(NULL);
    CHECK(rkm_graph_add_tensor(NULL, "t", 1, 0, &id) == A);
    CHECK(rkm_graph_add_op(NULL, &od, &id) == A);
    CHECK(rkm_graph_set_loss(NULL, 0) == A);
    CHECK(rkm_graph_finalize(NULL) == A);
    CHECK(NULLED(rkm_graph_read_file(NULL, "x.rkg", &gout), gout));
    CHECK(NULLED(rkm_graph_read_string(NULL, "x", 1, "x", &gout), gout));
    CHECK(rkm_graph_write(NULL, sbuf_write, NULL) == A);
    CHECK(rkm_graph_write_file(NULL, "/nonexistent/x.rkg") == A);
    CHECK(NULLED(rkm_graph_with_costs(NULL, costs, &gout), gout));
    CHECK(rkm_graph_context(NULL) == NULL && rkm_graph_is_finalized(NULL) == 0);
    CHECK(rkm_graph_num_tensors(NULL) == 0 && rkm_graph_num_ops(NULL) == 0 && rkm_graph_loss(NULL) == -1);
    CHECK(rkm_graph_find_tensor(NULL, "x") == -1 && rkm_graph_find_op(NULL, "f") == -1);
    CHECK(rkm_graph_tensor_info(NULL, 0, &ti) == A);
    rkm_op_desc od_out; /* not od: a failed info call zeroes its output */
    CHECK(rkm_graph_op_info(NULL, 0, &od_out) == A);
    CHECK(rkm_graph_stats_get(NULL, &gs) == A);
    CHECK(rkm_graph_time_bound(NULL, 100, &dsec) == A);
    CHECK(rkm_graph_block_info(NULL, 0, &bi) == A);
    CHECK(NULLED(rkm_graph_profile(NULL, &cb, &prof, &gout), gout));
    rkm_step_text(NULL, &step, buf, sizeof buf);
    CHECK(buf[0] == '\0');
    rkm_step_text(g, &step, NULL, 8);
    CHECK(NULLED(rkm_plan_create(NULL, &step, 1, NULL, &pout), pout));
    CHECK(NULLED(rkm_plan_read_file(NULL, "x.rkp", NULL, &pout), pout));
    CHECK(NULLED(rkm_plan_read_string(NULL, "x", 1, "x", NULL, &pout), pout));
    CHECK(NULLED(rkm_plan_baseline(NULL, &pout), pout));
    rkm_plan_destroy(NULL);
    CHECK(rkm_plan_write(NULL, sbuf_write, NULL) == A);
    CHECK(rkm_plan_write_file(NULL, "/nonexistent/x.rkp") == A);
    CHECK(rkm_plan_graph(NULL) == NULL && rkm_plan_num_steps(NULL) == 0 && rkm_plan_steps(NULL) == NULL);
    CHECK(rkm_plan_mem_after(NULL) == NULL && rkm_plan_step_peaks(NULL) == NULL && rkm_plan_num_buffers(NULL) == 0);
    CHECK(rkm_plan_layout(NULL, 0, bufs, &u) == A);
    CHECK(rkm_plan_stats_get(NULL, &ps) == A);
    CHECK(NULLED(rkm_planner_create(NULL, &sd, &plout), plout));
    rkm_planner_destroy(NULL);
    CHECK(NULLED(rkm_planner_solve(NULL, 100, &pout), pout));
    CHECK(rkm_planner_min_budget(NULL, &u) == A);
    CHECK(rkm_planner_stats_get(NULL, &pst) == A);
    CHECK(NULLED(rkm_plan_solve(NULL, &sd, 100, &pout), pout));
    CHECK(rkm_algo_from_name(NULL, "rotor", &sd.algo) == A);
    CHECK(rkm_parse_budget(NULL, "1", 0, &u) == A);
    CHECK(rkm_graph_baseline_arena(NULL, 0, &u) == A);
    CHECK(rkm_plan_execute(NULL, &cb) == A);
    CHECK(NULLED(rkm_arena_create(NULL, 1024, 4, &aout), aout));
    rkm_arena_destroy(NULL);
    CHECK(rkm_arena_alloc(NULL, 1, &u) == A);
    CHECK(rkm_arena_free(NULL, 0) == A);
    CHECK(rkm_arena_stats_get(NULL, &as) == A);
    CHECK(as.capacity == 0 && as.current == 0 && as.peak == 0 && as.high_water == 0 && as.blocks == 0);
    rkm_arena_reset_peak(NULL);
    rkm_arena_clear(NULL);
    CHECK(NULLED(rkm_arena_exec_create(NULL, &xout), xout));
    rkm_arena_exec_desc xd0 = {0};
    CHECK(NULLED(rkm_arena_exec_create(&xd0, &xout), xout));
    rkm_arena_exec_destroy(NULL);
    CHECK(rkm_arena_exec_mode(NULL) == RKM_ARENA_LAYOUT);
    CHECK(rkm_arena_exec_run(NULL, p) == A);
    CHECK(rkm_arena_exec_host_fail(NULL, RKM_ERROR_IO, "x") != 0);
    CHECK(rkm_arena_exec_tensor(NULL, 0) == RKM_ARENA_NONE && rkm_arena_exec_grad(NULL, 0) == RKM_ARENA_NONE);
    CHECK(rkm_arena_exec_saved(NULL, 0) == RKM_ARENA_NONE && rkm_arena_exec_base(NULL) == NULL);
    CHECK(rkm_arena_ptr(NULL, 0) == NULL);
    CHECK(rkm_arena_exec_scratch(NULL, 8, &u) == A);
    CHECK(rkm_arena_exec_measured_ws(NULL, 0, &u, &u2) == A);
    CHECK(u == 0 && u2 == 0);
    as.capacity = 1;
    CHECK(rkm_arena_exec_stats_get(NULL, &as) == A);
    CHECK(as.capacity == 0);
    CHECK(rkm_arena_capacity(NULL, RKM_ARENA_LAYOUT, &li) == A);
    CHECK(rkm_trimmed_mean(NULL, 3, 0.2) == 0.0);
    CHECK(strcmp(rkm_context_errmsg(ctx), marker) == 0);
#undef NULLED

    /* NULL pointers beside valid objects: refused by name. */
#define CALL(expr, frag) check_call(#expr, (expr), A, (frag), ctx)
    CALL(rkm_graph_read_file(ctx, "x.rkg", NULL), "rkm_graph_read_file: out is NULL");
    CALL(rkm_graph_read_file(ctx, NULL, &gout), "rkm_graph_read_file: path is NULL");
    CALL(rkm_graph_read_string(ctx, NULL, 4, "x", &gout), "rkm_graph_read_string: text is NULL");
    CALL(rkm_graph_write(g, NULL, NULL), "rkm_graph_write: write function is NULL");
    CALL(rkm_graph_write_file(g, NULL), "path is NULL");
    CALL(rkm_graph_with_costs(g, NULL, &gout), "rkm_graph_with_costs: costs is NULL");
    CALL(rkm_graph_tensor_info(g, 0, NULL), "rkm_graph_tensor_info: out is NULL");
    CALL(rkm_graph_op_info(g, 0, NULL), "rkm_graph_op_info: out is NULL");
    CALL(rkm_graph_stats_get(g, NULL), "rkm_graph_stats_get: out is NULL");
    CALL(rkm_graph_time_bound(g, 100, NULL), "rkm_graph_time_bound: extra_seconds is NULL");
    CALL(rkm_graph_block_info(g, 0, NULL), "rkm_graph_block_info: out is NULL");
    CALL(rkm_graph_profile(g, NULL, &prof, &gout), "rkm_graph_profile: callbacks are NULL");
    CALL(rkm_graph_profile(g, &cb, &prof, NULL), "rkm_graph_profile: out is NULL");
    CALL(rkm_plan_create(g, &step, 1, NULL, NULL), "rkm_plan_create");
    CALL(rkm_plan_read_file(g, NULL, NULL, &pout), "rkm_plan_read_file: path is NULL");
    CALL(rkm_plan_read_string(g, NULL, 4, "x", NULL, &pout), "rkm_plan_read_string: text is NULL");
    CALL(rkm_plan_baseline(g, NULL), "rkm_plan_baseline");
    CALL(rkm_plan_write(p, NULL, NULL), "rkm_plan_write: write function is NULL");
    CALL(rkm_plan_write_file(p, NULL), "path is NULL");
    CALL(rkm_plan_layout(p, 0, NULL, &u), "rkm_plan_layout: an output pointer is NULL");
    CALL(rkm_plan_layout(p, 0, bufs, NULL), "rkm_plan_layout: an output pointer is NULL");
    CALL(rkm_plan_stats_get(p, NULL), "rkm_plan_stats_get: out is NULL");
    CALL(rkm_planner_create(g, &sd, NULL), "rkm_planner_create: out is NULL");
    CALL(rkm_planner_solve(pl, 100, NULL), "rkm_planner_solve: out is NULL");
    CALL(rkm_planner_min_budget(pl, NULL), "rkm_planner_min_budget: out is NULL");
    CALL(rkm_planner_stats_get(pl, NULL), "rkm_planner_stats_get: out is NULL");
    CALL(rkm_plan_solve(g, &sd, 100, NULL), "rkm_plan_solve: out is NULL");
    CALL(rkm_algo_from_name(ctx, NULL, &sd.algo), "rkm_algo_from_name: name or out is NULL");
    CALL(rkm_algo_from_name(ctx, "rotor", NULL), "rkm_algo_from_name: name or out is NULL");
    CALL(rkm_parse_budget(g, NULL, 0, &u), "rkm_parse_budget: text or out is NULL");
    CALL(rkm_parse_budget(g, "1", 0, NULL), "rkm_parse_budget: text or out is NULL");
    CALL(rkm_graph_baseline_arena(g, 0, NULL), "rkm_graph_baseline_arena: out is NULL");
    CALL(rkm_plan_execute(p, NULL), "rkm_plan_execute: callbacks are NULL");
    CALL(rkm_arena_create(ctx, 1024, 4, NULL), "rkm_arena_create: out is NULL");
    CALL(rkm_arena_alloc(a, 1, NULL), "rkm_arena_alloc: offset is NULL");
    CALL(rkm_arena_exec_create(&xd, NULL), "rkm_arena_exec_create: out is NULL");
    CALL(rkm_arena_exec_run(x, NULL), "rkm_arena_exec_run: plan is NULL");
    CALL(rkm_arena_exec_scratch(x, 8, NULL), "rkm_arena_exec_scratch: offset is NULL");
    CALL(rkm_arena_capacity(p, RKM_ARENA_FIRST_FIT, NULL), "rkm_arena_capacity: out is NULL");
    CALL(rkm_arena_stats_get(a, NULL), "rkm_arena_stats_get: out is NULL");
    CALL(rkm_arena_exec_stats_get(x, NULL), "rkm_arena_exec_stats_get: out is NULL");
    CALL(rkm_arena_exec_measured_ws(x, -1, &u, &u2), "rkm_arena_exec_measured_ws: op -1 is not in 0..");
    rkm_graph *b = NULL;
    CHECK(rkm_graph_create(ctx, &b) == RKM_OK);
    if (b) {
        CALL(rkm_graph_create(ctx, NULL), "rkm_graph_create: out is NULL");
        CALL(rkm_graph_add_tensor(b, NULL, 4, 0, &id), "name is NULL");
        CALL(rkm_graph_add_op(b, NULL, &id), "rkm_graph_add_op: desc or its name is NULL");
        CHECK(rkm_graph_add_tensor(b, "x", 4, RKM_TENSOR_INPUT, &id) == RKM_OK);
        od.in = NULL;
        CALL(rkm_graph_add_op(b, &od, &id), "in");
        od.in = &id;
        od.out = NULL;
        CALL(rkm_graph_add_op(b, &od, &id), "out");
        rkm_graph_destroy(b);
    }
#undef CALL
    /* The ones without a result: nothing done, nothing crashed. */
    CHECK(rkm_arena_exec_measured_ws(x, 0, NULL, NULL) == RKM_OK);
    CHECK(rkm_context_fail(ctx, RKM_ERROR_IO, NULL) == RKM_ERROR_IO);
    CHECK(rkm_arena_exec_host_fail(x, RKM_ERROR_IO, NULL) != 0);
    CHECK(rkm_graph_find_tensor(g, NULL) == -1 && rkm_graph_find_op(g, NULL) == -1);

    rkm_arena_exec_destroy(x);
    rkm_arena_destroy(a);
    rkm_plan_destroy(p);
    rkm_planner_destroy(pl);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Every call that fills a struct zeroes all of it on every error, whatever
 * the cause (rockmate.h): each output starts as 0xff bytes and must come
 * back all zero, for a NULL object, an id out of range, a graph not yet
 * finalized, a bad mode. */
static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i]) return 0;
    return 1;
}

TEST(failed_getters_zero_their_output)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL, *b = NULL;
    CHECK(rkm_graph_read_string(ctx, PLAN_GRAPH, strlen(PLAN_GRAPH), "g.rkg", &g) == RKM_OK);
    CHECK(rkm_graph_create(ctx, &b) == RKM_OK);
    rkm_plan *p = NULL;
    CHECK(g && rkm_plan_baseline(g, &p) == RKM_OK);
    if (!g || !b || !p) return;
    rkm_graph_stats gs;
    rkm_plan_stats ps;
    rkm_planner_stats pst;
    rkm_arena_stats as;
    rkm_arena_capacity_info ci;
    rkm_copy_desc cd;
    rkm_tensor_info ti;
    rkm_op_desc od;
    rkm_block_info bi;
    /* ZEROED(call, out): the call fails and out is all zero bytes after it. */
#define ZEROED(call, out) (memset(&(out), 0xff, sizeof(out)), (call) != RKM_OK && all_zero(&(out), sizeof(out)))
    CHECK(ZEROED(rkm_graph_stats_get(NULL, &gs), gs));
    CHECK(ZEROED(rkm_graph_stats_get(b, &gs), gs));
    CHECK(ZEROED(rkm_plan_stats_get(NULL, &ps), ps));
    CHECK(ZEROED(rkm_planner_stats_get(NULL, &pst), pst));
    CHECK(ZEROED(rkm_arena_stats_get(NULL, &as), as));
    CHECK(ZEROED(rkm_arena_exec_stats_get(NULL, &as), as));
    CHECK(ZEROED(rkm_arena_capacity(NULL, RKM_ARENA_LAYOUT, &ci), ci));
    CHECK(ZEROED(rkm_arena_capacity(p, (rkm_arena_mode)42, &ci), ci));
    CHECK(ZEROED(rkm_graph_copy_get(NULL, &cd), cd));
    CHECK(ZEROED(rkm_graph_tensor_info(NULL, 0, &ti), ti));
    CHECK(ZEROED(rkm_graph_tensor_info(g, 99, &ti), ti));
    CHECK(ZEROED(rkm_graph_op_info(NULL, 0, &od), od));
    CHECK(ZEROED(rkm_graph_op_info(g, -1, &od), od));
    CHECK(ZEROED(rkm_graph_block_info(NULL, 0, &bi), bi));
    CHECK(ZEROED(rkm_graph_block_info(b, 0, &bi), bi));
    CHECK(ZEROED(rkm_graph_block_info(g, 99, &bi), bi));
#undef ZEROED
    rkm_plan_destroy(p);
    rkm_graph_destroy(b);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(bad_files_are_refused_by_name);
    RUN(api_misuse_is_refused_by_name);
    RUN(null_arguments_are_refused);
    RUN(failed_getters_zero_their_output);
    TEST_END();
}
