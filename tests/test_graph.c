/* test_graph.c -- graph files and the graph builder: every rule of the
 * .rkg contract broken once (through the reader and through the API), read
 * and write round trips, and what finalize derives. */
#include "../src/internal.h"
#include "test.h"

#include <dirent.h>
#include <unistd.h>

/* -------------------------------------------------- .rkg rules, one by one */

/* Lines 1-4 of most cases; line 3 is blank, so a case's own lines start at 5. */
#define PRE "rockmate-graph 1\n# a comment\n\ntensor x 8 input\n"
/* Names of 255 bytes (the longest allowed) and 256. */
#define N63 "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
#define N64 N63 "n"
#define N255 N64 N64 N64 N63
#define N256 N64 N64 N64 N64

typedef struct bad_rkg {
    const char *text;
    rkm_result code;
    int line;          /* the line the message names; 0: any line */
    const char *words; /* '|'-separated: the message names the rule with one of them */
} bad_rkg;

static const bad_rkg bad_rkgs[] = {
    /* header */
    {"", RKM_ERROR_PARSE, 1, "header"},
    {"# only a comment\n", RKM_ERROR_PARSE, 0, "header"},
    {"tensor x 8 input\n", RKM_ERROR_PARSE, 1, "header"},
    {"# c\nrockmate-graph 2\ntensor x 8 input\n", RKM_ERROR_PARSE, 2, "header"},
    {"rockmate-graph 1 x\n", RKM_ERROR_PARSE, 1, "header"},
    {"rockmate-plan 1\n", RKM_ERROR_PARSE, 1, "header"},
    /* statements */
    {PRE "tensr a 16\n", RKM_ERROR_PARSE, 5, "tensr"},
    {PRE "tensor a 16\nop\n", RKM_ERROR_PARSE, 6, "op"},
    {PRE "tensor a 16\nloss\n", RKM_ERROR_PARSE, 6, "loss"},
    {PRE "tensor a 16\nop f fwd=1 bwd=1 in=x out=a\nloss a a\n", RKM_ERROR_PARSE, 7, "loss"},
    /* names: characters and length, in every place a name appears */
    {PRE "tensor a$ 16\n", RKM_ERROR_PARSE, 5, "name"},
    {PRE "tensor " N256 " 16\n", RKM_ERROR_PARSE, 5, "255|name"},
    {PRE "tensor a 16\nop f! fwd=1 bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "name"},
    {PRE "tensor a 16\nop " N256 " fwd=1 bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "255|name"},
    {PRE "tensor a 16\nop f fwd=1 bwd=1 in=x,a% out=a\n", RKM_ERROR_PARSE, 6, "name"},
    {PRE "tensor a 16\nop f fwd=1 bwd=1 in=x, out=a\n", RKM_ERROR_PARSE, 6, "name"},
    {PRE "tensor a 16\nop f fwd=1 bwd=1 in=,x out=a\n", RKM_ERROR_PARSE, 6, "name"},
    {PRE "tensor a 16\nop f fwd=1 bwd=1 in=x out=a saved=\n", RKM_ERROR_PARSE, 6, "name"},
    /* duplicates */
    {PRE "tensor x 4\n", RKM_ERROR_GRAPH, 5, "twice|duplicate"},
    {PRE "tensor a 4\ntensor b 4\nop f fwd=1 bwd=1 in=x out=a\nop f fwd=1 bwd=1 in=a out=b\nloss b\n", RKM_ERROR_GRAPH,
     8, "twice|duplicate"},
    /* byte counts */
    {PRE "tensor a -5\n", RKM_ERROR_PARSE, 5, "byte"},
    {PRE "tensor a 12a\n", RKM_ERROR_PARSE, 5, "byte"},
    {PRE "tensor a 1.5\n", RKM_ERROR_PARSE, 5, "byte"},
    {PRE "tensor a 0x10\n", RKM_ERROR_PARSE, 5, "byte"},
    {PRE "tensor a 18446744073709551616\n", RKM_ERROR_PARSE, 5, "byte"},
    {PRE "tensor a 99999999999999999999\n", RKM_ERROR_PARSE, 5, "byte"},
    {PRE "tensor a\n", RKM_ERROR_PARSE, 5, "tensor"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a phantom=-1\n", RKM_ERROR_PARSE, 6, "phantom"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a fwd_ws=abc\n", RKM_ERROR_PARSE, 6, "fwd_ws"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a bwd_ws=1e3\n", RKM_ERROR_PARSE, 6, "bwd_ws"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a phantom=18446744073709551616\n", RKM_ERROR_PARSE, 6, "phantom"},
    /* tensor flags */
    {PRE "tensor a 4 gradient\n", RKM_ERROR_PARSE, 5, "flag"},
    /* stage graphs: `input grad` and `output` */
    {PRE "tensor a 4 grad\n", RKM_ERROR_GRAPH, 5, "needs input"},
    {PRE "tensor a 4 input grad nograd\n", RKM_ERROR_GRAPH, 5, "cannot be nograd"},
    {PRE "tensor a 4 input grad grad\n", RKM_ERROR_PARSE, 5, "twice"},
    {PRE "tensor s 4 input grad\ntensor m 4 nograd\ntensor a 4\nop h fwd=1 bwd=1 in=s out=m\nop f fwd=1 bwd=1 in=x,m "
         "out=a\nloss a\n", RKM_ERROR_GRAPH, 5, "no op that reads it has a backward"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\noutput a\nloss a\n", RKM_ERROR_GRAPH, 8, "has an output already"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\nloss a\noutput a\n", RKM_ERROR_GRAPH, 8, "has a loss already"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\noutput x\n", RKM_ERROR_GRAPH, 7, "output: x is an input"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\noutput\n", RKM_ERROR_PARSE, 7, "expected 'output TENSOR'"},
    {PRE "tensor a 4 input input\n", RKM_ERROR_PARSE, 5, "flag|twice"},
    /* fwd= and bwd= */
    {PRE "tensor a 4\nop f bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "fwd"},
    {PRE "tensor a 4\nop f fwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "bwd"},
    {PRE "tensor a 4\nop f fwd=-1 bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "fwd"},
    {PRE "tensor a 4\nop f fwd=1 bwd=-0.5 in=x out=a\n", RKM_ERROR_PARSE, 6, "bwd"},
    {PRE "tensor a 4\nop f fwd=nan bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "fwd"},
    {PRE "tensor a 4\nop f fwd=inf bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "fwd"},
    {PRE "tensor a 4\nop f fwd=1e999 bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "fwd"},
    {PRE "tensor a 4\nop f fwd=1.5x bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "fwd"},
    {PRE "tensor a 4\nop f fwd= bwd=1 in=x out=a\n", RKM_ERROR_PARSE, 6, "fwd"},
    {PRE "tensor a 4\nop f fwd=1 bwd=garbage in=x out=a\n", RKM_ERROR_PARSE, 6, "bwd"},
    /* op keys */
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a phantm=4\n", RKM_ERROR_PARSE, 6, "phantm"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 fwd=2 in=x out=a\n", RKM_ERROR_PARSE, 6, "twice|repeat"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a out=a\n", RKM_ERROR_PARSE, 6, "twice|repeat"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 inx out=a\n", RKM_ERROR_PARSE, 6, "="},
    /* in= */
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=zz out=a\n", RKM_ERROR_GRAPH, 6, "zz"},
    {PRE "tensor a 4\ntensor b 4\nop f fwd=1 bwd=1 in=a out=b\n", RKM_ERROR_GRAPH, 7, "earlier|produced"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x,x out=a\n", RKM_ERROR_GRAPH, 6, "twice"},
    /* out= */
    {PRE "tensor a 4\nop f fwd=1 bwd=1 out=x\n", RKM_ERROR_GRAPH, 6, "input"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\nop g fwd=1 bwd=1 in=x out=a\n", RKM_ERROR_GRAPH, 7, "already"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a,a\n", RKM_ERROR_GRAPH, 6, "twice"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=zz\n", RKM_ERROR_GRAPH, 6, "zz"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=\n", RKM_ERROR_PARSE, 6, "out"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x\n", RKM_ERROR_PARSE, 6, "out"},
    /* saved= */
    {PRE "tensor a 4\ntensor b 4\nop f fwd=1 bwd=1 in=x out=a saved=b\n", RKM_ERROR_GRAPH, 7, "saved"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a saved=x,x\n", RKM_ERROR_GRAPH, 6, "twice"},
    /* loss */
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\n", RKM_ERROR_GRAPH, 0, "loss"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\nloss a\nloss a\n", RKM_ERROR_GRAPH, 8, "twice|once"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\nloss zz\n", RKM_ERROR_GRAPH, 7, "zz"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\nloss x\n", RKM_ERROR_GRAPH, 7, "input|produced"},
    {PRE "tensor a 4 nograd\nop f fwd=1 bwd=1 in=x out=a\nloss a\n", RKM_ERROR_GRAPH, 7, "nograd"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a\nloss a\ntensor c 4\n", RKM_ERROR_GRAPH, 8, "loss"},
    {PRE "tensor a 4\ntensor c 4\nop f fwd=1 bwd=1 in=x out=a\nloss a\nop g fwd=1 bwd=1 in=a out=c\n",
     RKM_ERROR_GRAPH, 9, "loss"},
    /* whole-graph rules */
    {PRE "tensor a 4\n# c is declared on line 6\ntensor c 4\nop f fwd=1 bwd=1 in=x out=a\nloss a\n", RKM_ERROR_GRAPH, 7,
     "writes|produced"},
    {PRE "tensor a 4\ntensor c 4\nop f fwd=1 bwd=1 in=x out=a\nop h fwd=1 bwd=1 in=x out=c\nloss a\n",
     RKM_ERROR_GRAPH, 8, "ancestor"},
    {PRE "tensor a 9223372036854775808\nop f fwd=1 bwd=1 in=x out=a\nloss a\n", RKM_ERROR_GRAPH, 0, "64"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a phantom=18446744073709551600\nloss a\n", RKM_ERROR_GRAPH, 0, "64"},
    {PRE "tensor a 4\nop f fwd=1 bwd=1 in=x out=a fwd_ws=18446744073709551600\nloss a\n", RKM_ERROR_GRAPH, 0, "64"},
};

/* Does msg hold one of the '|'-separated words? */
static int has_word(const char *msg, const char *words)
{
    char buf[128];
    while (*words) {
        size_t n = strcspn(words, "|");
        snprintf(buf, sizeof buf, "%.*s", (int)n, words);
        if (strstr(msg, buf)) return 1;
        words += n + (words[n] == '|');
    }
    return 0;
}

/* "src:LINE:" at the start of msg (any line number when line is 0); returns
 * what follows it, or NULL. */
static const char *after_location(const char *msg, const char *src, int line)
{
    size_t n = strlen(src);
    if (strncmp(msg, src, n) != 0 || msg[n] != ':') return NULL;
    const char *p = msg + n + 1;
    char *end;
    long l = strtol(p, &end, 10);
    if (end == p || *end != ':' || (line && l != line)) return NULL;
    return end + 1;
}

TEST(every_graph_rule_in_files)
{
    rkm_context *ctx = test_new_ctx();
    for (size_t k = 0; k < N_OF(bad_rkgs); k++) {
        const bad_rkg *b = &bad_rkgs[k];
        rkm_graph *g = (rkm_graph *)&ctx; /* must come back NULL */
        rkm_result r = rkm_graph_read_string(ctx, b->text, strlen(b->text), "case.rkg", &g);
        const char *msg = rkm_context_errmsg(ctx);
        const char *rest = after_location(msg, "case.rkg", b->line);
        int ok = r == b->code && g == NULL && rest && has_word(rest, b->words);
        if (!ok)
            fprintf(stderr, "bad rkg %zu: got %d (want %d), msg '%s' (want line %d and %s)\n", k, (int)r, (int)b->code,
                    msg, b->line, b->words);
        CHECK(ok);
        if (g && g != (rkm_graph *)&ctx) rkm_graph_destroy(g);
    }
    rkm_context_destroy(ctx);
}

/* Comments, blank lines, tabs, every name character, a 255-byte name, the
 * accepted number forms. */
TEST(graph_syntax_accepted)
{
    static const char text[] = "# leading comment\n\n  rockmate-graph 1   # header comment\n"
                               "tensor\tAz09_.:/[]-x 8 input nograd\n"
                               "tensor " N255 " 007\n"
                               "\t\n"
                               "tensor y 4 nograd input\n"
                               "tensor out 2\n"
                               "op o.1 fwd=1.5e-4 bwd=0 in=Az09_.:/[]-x,y out=" N255 " fwd_ws=0\n"
                               "op o.2 bwd=2.5E2 fwd=3 out=out in=" N255 " phantom=5 # tail\n"
                               "loss out";
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL;
    rkm_result r = rkm_graph_read_string(ctx, text, strlen(text), "ok.rkg", &g);
    if (r != RKM_OK) fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
    CHECK(r == RKM_OK);
    if (g) {
        CHECK(rkm_graph_is_finalized(g));
        CHECK(rkm_graph_num_tensors(g) == 4 && rkm_graph_num_ops(g) == 2);
        rkm_tensor_info ti;
        CHECK(rkm_graph_tensor_info(g, 0, &ti) == RKM_OK);
        CHECK(strcmp(ti.name, "Az09_.:/[]-x") == 0 && ti.flags == (RKM_TENSOR_INPUT | RKM_TENSOR_NOGRAD));
        CHECK(rkm_graph_tensor_info(g, 1, &ti) == RKM_OK);
        CHECK(strlen(ti.name) == 255 && ti.bytes == 7 && ti.flags == 0);
        rkm_op_desc oi;
        CHECK(rkm_graph_op_info(g, 0, &oi) == RKM_OK);
        CHECK(oi.fwd_seconds == 1.5e-4 && oi.bwd_seconds == 0 && oi.n_in == 2 && oi.n_out == 1);
        CHECK(rkm_graph_op_info(g, 1, &oi) == RKM_OK);
        CHECK(oi.fwd_seconds == 3 && oi.bwd_seconds == 250 && oi.phantom == 5);
        CHECK(rkm_graph_find_op(g, "o.2") == 1 && rkm_graph_find_op(g, "zz") == -1);
        CHECK(rkm_graph_find_tensor(g, "out") == 3 && rkm_graph_loss(g) == 3);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

TEST(read_file_errors)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = (rkm_graph *)&ctx;
    CHECK(rkm_graph_read_file(ctx, "tests/no/such/file.rkg", &g) == RKM_ERROR_IO);
    CHECK(g == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "tests/no/such/file.rkg") != NULL);
    CHECK(rkm_graph_read_string(ctx, "x", 1, "a", NULL) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_read_string(NULL, "x", 1, "a", &g) == RKM_ERROR_ARGUMENT);
    /* Only len bytes are read: what follows them is not looked at. */
    static const char two[] = "rockmate-graph 1\ntensor x 8 input\ntensor a 4\nop f fwd=1 bwd=1 in=x out=a\n"
                              "loss a\nGARBAGE";
    g = NULL;
    CHECK(rkm_graph_read_string(ctx, two, strlen(two) - 7, "slice", &g) == RKM_OK);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}


/* ------------------------------------------------ the same rules, by API */

/* xin(8, input), act(16), res(4); fop: xin -> act; with `full` also
 * gop: act -> res. Returns the tensor ids through t[]. */
static rkm_graph *small_builder(rkm_context *ctx, int32_t t[3], int32_t *f, int full)
{
    rkm_graph *g = NULL;
    CHECK(rkm_graph_create(ctx, &g) == RKM_OK);
    if (!g) return NULL;
    CHECK(rkm_graph_add_tensor(g, "xin", 8, RKM_TENSOR_INPUT, &t[0]) == RKM_OK);
    CHECK(rkm_graph_add_tensor(g, "act", 16, 0, &t[1]) == RKM_OK);
    CHECK(rkm_graph_add_tensor(g, "res", 4, 0, &t[2]) == RKM_OK);
    rkm_op_desc d;
    memset(&d, 0, sizeof d);
    d.name = "fop";
    d.fwd_seconds = 1;
    d.bwd_seconds = 2;
    d.in = &t[0];
    d.n_in = 1;
    d.out = &t[1];
    d.n_out = 1;
    CHECK(rkm_graph_add_op(g, &d, f) == RKM_OK);
    if (full) {
        d.name = "gop";
        d.in = &t[1];
        d.out = &t[2];
        CHECK(rkm_graph_add_op(g, &d, NULL) == RKM_OK);
    }
    return g;
}

/* The call failed with `code`, named `name` in its message, had no file
 * location, and left the graph's size as it was. */
static void check_api_error(rkm_context *ctx, const rkm_graph *g, rkm_result got, rkm_result code, const char *name,
                            int32_t nt, int32_t no)
{
    const char *msg = rkm_context_errmsg(ctx);
    int ok = got == code && strstr(msg, name) && !strstr(msg, ".rkg:") && rkm_graph_num_tensors(g) == nt &&
             rkm_graph_num_ops(g) == no;
    if (!ok) fprintf(stderr, "api error: got %d (want %d) msg '%s' (want '%s')\n", (int)got, (int)code, msg, name);
    CHECK(ok);
}

TEST(every_graph_rule_by_api)
{
    rkm_context *ctx = test_new_ctx();
    int32_t t[3], f = -1, id = -1;
    rkm_graph *g = small_builder(ctx, t, &f, 0);
    if (!g) {
        rkm_context_destroy(ctx);
        return;
    }
    char long_name[257];
    memset(long_name, 'n', 256);
    long_name[256] = 0;
    check_api_error(ctx, g, rkm_graph_add_tensor(g, "bad$", 4, 0, &id), RKM_ERROR_GRAPH, "bad$", 3, 1);
    check_api_error(ctx, g, rkm_graph_add_tensor(g, "", 4, 0, &id), RKM_ERROR_GRAPH, "name", 3, 1);
    check_api_error(ctx, g, rkm_graph_add_tensor(g, long_name, 4, 0, &id), RKM_ERROR_GRAPH, "nnnnnnnn", 3, 1);
    check_api_error(ctx, g, rkm_graph_add_tensor(g, "act", 4, 0, &id), RKM_ERROR_GRAPH, "act", 3, 1);
    check_api_error(ctx, g, rkm_graph_add_tensor(g, "newt", 4, 8u, &id), RKM_ERROR_ARGUMENT, "newt", 3, 1);
    check_api_error(ctx, g, rkm_graph_add_tensor(g, "newt", 4, RKM_TENSOR_INPUT_GRAD, &id), RKM_ERROR_GRAPH, "needs input",
                    3, 1);
    check_api_error(ctx, g, rkm_graph_add_tensor(g, NULL, 4, 0, &id), RKM_ERROR_ARGUMENT, "NULL", 3, 1);

    rkm_op_desc d;
    memset(&d, 0, sizeof d);
    int32_t in2[2], out2[2], bad = 99;
    d.fwd_seconds = 1;
    d.bwd_seconds = 1;
    d.in = &t[1];
    d.n_in = 1;
    d.out = &t[2];
    d.n_out = 1;
#define TRY_OP(code, name) check_api_error(ctx, g, rkm_graph_add_op(g, &d, &id), code, name, 3, 1)
    d.name = "fop";
    TRY_OP(RKM_ERROR_GRAPH, "fop"); /* declared twice */
    d.name = "gop?";
    TRY_OP(RKM_ERROR_GRAPH, "gop?");
    d.name = long_name;
    TRY_OP(RKM_ERROR_GRAPH, "nnnnnnnn");
    d.name = "gop";
    d.fwd_seconds = -1;
    TRY_OP(RKM_ERROR_GRAPH, "gop");
    d.fwd_seconds = NAN;
    TRY_OP(RKM_ERROR_GRAPH, "gop");
    d.fwd_seconds = 1;
    d.bwd_seconds = INFINITY;
    TRY_OP(RKM_ERROR_GRAPH, "gop");
    d.bwd_seconds = 1;
    d.in = &bad;
    TRY_OP(RKM_ERROR_ARGUMENT, "99");
    d.in = &t[2]; /* res is not produced yet */
    TRY_OP(RKM_ERROR_GRAPH, "res");
    in2[0] = in2[1] = t[1];
    d.in = in2;
    d.n_in = 2;
    TRY_OP(RKM_ERROR_GRAPH, "twice");
    d.in = &t[1];
    d.n_in = -1;
    TRY_OP(RKM_ERROR_ARGUMENT, "gop");
    d.n_in = 1;
    d.out = &t[0]; /* an input */
    TRY_OP(RKM_ERROR_GRAPH, "xin");
    d.out = &t[1]; /* already written by fop */
    TRY_OP(RKM_ERROR_GRAPH, "fop");
    out2[0] = out2[1] = t[2];
    d.out = out2;
    d.n_out = 2;
    TRY_OP(RKM_ERROR_GRAPH, "twice");
    d.out = NULL;
    d.n_out = 0;
    TRY_OP(RKM_ERROR_GRAPH, "out");
    d.out = &t[2];
    d.n_out = 1;
    d.saved = &t[0]; /* xin is neither in nor out of gop */
    d.n_saved = 1;
    TRY_OP(RKM_ERROR_GRAPH, "saved");
    d.saved = NULL;
    d.n_saved = 0;
    check_api_error(ctx, g, rkm_graph_add_op(g, NULL, &id), RKM_ERROR_ARGUMENT, "NULL", 3, 1);

    /* Loss rules; then the graph is completed and finalizes: the failed
     * calls changed nothing. */
    check_api_error(ctx, g, rkm_graph_set_loss(g, t[0]), RKM_ERROR_GRAPH, "xin", 3, 1);
    check_api_error(ctx, g, rkm_graph_set_loss(g, 17), RKM_ERROR_ARGUMENT, "17", 3, 1);
    CHECK(rkm_graph_loss(g) == -1);
    CHECK(rkm_graph_add_op(g, &d, &id) == RKM_OK && id == 1);
    check_api_error(ctx, g, rkm_graph_finalize(g), RKM_ERROR_GRAPH, "loss", 3, 2);
    CHECK(rkm_graph_set_loss(g, t[2]) == RKM_OK);
    check_api_error(ctx, g, rkm_graph_set_loss(g, t[2]), RKM_ERROR_GRAPH, "loss", 3, 2);
    check_api_error(ctx, g, rkm_graph_add_tensor(g, "late", 4, 0, &id), RKM_ERROR_GRAPH, "late", 3, 2);
    d.name = "late";
    check_api_error(ctx, g, rkm_graph_add_op(g, &d, &id), RKM_ERROR_GRAPH, "late", 3, 2);
    CHECK(rkm_graph_loss(g) == t[2]);
    CHECK(rkm_graph_finalize(g) == RKM_OK);
    CHECK(rkm_graph_is_finalized(g));
    CHECK(rkm_graph_find_op(g, "gop") == 1 && rkm_graph_find_op(g, "late") == -1);
    CHECK(rkm_graph_find_tensor(g, "late") == -1 && rkm_graph_find_tensor(g, "bad$") == -1);
    /* Read-only once finalized. */
    CHECK(rkm_graph_finalize(g) == RKM_ERROR_STATE);
    CHECK(rkm_graph_add_tensor(g, "c", 4, 0, &id) == RKM_ERROR_STATE);
    CHECK(rkm_graph_add_op(g, &d, &id) == RKM_ERROR_STATE);
    CHECK(rkm_graph_set_loss(g, t[1]) == RKM_ERROR_STATE);
    CHECK(rkm_graph_num_tensors(g) == 3 && rkm_graph_num_ops(g) == 2);
#undef TRY_OP
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* An op from tensor `in` to a new tensor `out_name` (bytes 4). */
static void add_simple_op(rkm_graph *g, const char *name, int32_t in, const char *out_name, unsigned flags,
                          int32_t *out)
{
    CHECK(rkm_graph_add_tensor(g, out_name, 4, flags, out) == RKM_OK);
    rkm_op_desc d;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.in = &in;
    d.n_in = 1;
    d.out = out;
    d.n_out = 1;
    CHECK(rkm_graph_add_op(g, &d, NULL) == RKM_OK);
}

/* A graph xin -> a (bytes a_bytes, fwd_ws ws) = loss, finalized. */
static rkm_result finalize_sized(rkm_context *ctx, uint64_t a_bytes, uint64_t ws)
{
    rkm_graph *g = NULL;
    int32_t x, a;
    CHECK(rkm_graph_create(ctx, &g) == RKM_OK);
    if (!g) return RKM_ERROR_NOMEM;
    CHECK(rkm_graph_add_tensor(g, "xin", 1, RKM_TENSOR_INPUT, &x) == RKM_OK);
    CHECK(rkm_graph_add_tensor(g, "big", a_bytes, 0, &a) == RKM_OK);
    rkm_op_desc d;
    memset(&d, 0, sizeof d);
    d.name = "fop";
    d.in = &x;
    d.n_in = 1;
    d.out = &a;
    d.n_out = 1;
    d.fwd_ws = ws;
    CHECK(rkm_graph_add_op(g, &d, NULL) == RKM_OK);
    CHECK(rkm_graph_set_loss(g, a) == RKM_OK);
    rkm_result r = rkm_graph_finalize(g);
    if (r) check_api_error(ctx, g, r, RKM_ERROR_GRAPH, "64", 2, 1);
    rkm_graph_destroy(g);
    return r;
}

TEST(whole_graph_rules_by_api)
{
    rkm_context *ctx = test_new_ctx();
    int32_t t[3], f, c;
    /* the loss may not be nograd */
    rkm_graph *g = small_builder(ctx, t, &f, 1);
    if (g) {
        add_simple_op(g, "mk", t[1], "msk", RKM_TENSOR_NOGRAD, &c);
        check_api_error(ctx, g, rkm_graph_set_loss(g, c), RKM_ERROR_GRAPH, "nograd", 4, 3);
    }
    rkm_graph_destroy(g);
    /* a tensor never produced */
    g = small_builder(ctx, t, &f, 1);
    if (g) {
        CHECK(rkm_graph_add_tensor(g, "orphan", 4, 0, &c) == RKM_OK);
        CHECK(rkm_graph_set_loss(g, t[2]) == RKM_OK);
        check_api_error(ctx, g, rkm_graph_finalize(g), RKM_ERROR_GRAPH, "orphan", 4, 2);
        CHECK(!rkm_graph_is_finalized(g));
    }
    rkm_graph_destroy(g);
    /* an op that is not an ancestor of the loss */
    g = small_builder(ctx, t, &f, 1);
    if (g) {
        add_simple_op(g, "side", t[0], "sideout", 0, &c);
        CHECK(rkm_graph_set_loss(g, t[2]) == RKM_OK);
        check_api_error(ctx, g, rkm_graph_finalize(g), RKM_ERROR_GRAPH, "side", 4, 3);
    }
    rkm_graph_destroy(g);
    /* Byte totals (2 x all tensors + phantoms + the largest workspace) must
     * fit in 64 bits: 2 x (1 + 2^63 - 2) + 1 = 2^64 - 1 fits, + 2 does not. */
    CHECK(finalize_sized(ctx, UINT64_MAX / 2 - 1, 1) == RKM_OK);
    CHECK(finalize_sized(ctx, UINT64_MAX / 2 - 1, 2) == RKM_ERROR_GRAPH);
    CHECK(finalize_sized(ctx, UINT64_MAX / 2 + 1, 0) == RKM_ERROR_GRAPH);
    rkm_context_destroy(ctx);
}

/* Calls that need a finalized graph say so. */
TEST(state_errors)
{
    rkm_context *ctx = test_new_ctx();
    int32_t t[3], f;
    rkm_graph *g = small_builder(ctx, t, &f, 1);
    if (g) {
        rkm_plan *p = (rkm_plan *)&ctx;
        const rkm_step st0 = {RKM_STEP_FWD, f, 0, 0};
        CHECK(rkm_plan_create(g, &st0, 1, NULL, &p) == RKM_ERROR_STATE && p == NULL);
        CHECK(strstr(rkm_context_errmsg(ctx), "not finalized") != NULL);
        p = (rkm_plan *)&ctx;
        CHECK(rkm_plan_read_string(g, "rockmate-plan 1\n", 16, "s.rkp", NULL, &p) == RKM_ERROR_STATE && p == NULL);
        rkm_graph *g2 = (rkm_graph *)&ctx;
        rkm_op_costs costs[1] = {{1, 1, 0, 0}};
        CHECK(rkm_graph_with_costs(g, costs, &g2) == RKM_ERROR_STATE && g2 == NULL);
        p = (rkm_plan *)&ctx;
        CHECK(rkm_plan_baseline(g, &p) != RKM_OK && p == NULL);
        rkm_graph_stats st;
        CHECK(rkm_graph_stats_get(g, &st) != RKM_OK);
        CHECK(rkm_graph_write(g, fail_write, NULL) == RKM_ERROR_STATE);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* NULL pointers and ids out of range are argument errors, never crashes. */
TEST(null_and_range_arguments)
{
    rkm_context *ctx = test_new_ctx();
    int32_t t[3], f, id;
    rkm_graph *g = small_builder(ctx, t, &f, 1);
    rkm_op_desc d;
    memset(&d, 0, sizeof d);
    CHECK(rkm_graph_create(ctx, NULL) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_add_tensor(NULL, "t", 1, 0, &id) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_add_op(NULL, &d, &id) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_set_loss(NULL, 0) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_finalize(NULL) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_write(NULL, fail_write, NULL) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_stats_get(NULL, NULL) == RKM_ERROR_ARGUMENT);
    CHECK(rkm_graph_num_tensors(NULL) == 0 && rkm_graph_num_ops(NULL) == 0 && rkm_graph_loss(NULL) == -1);
    CHECK(rkm_graph_find_tensor(NULL, "x") == -1 && rkm_graph_find_op(NULL, "f") == -1);
    if (g) {
        CHECK(rkm_graph_set_loss(g, t[2]) == RKM_OK);
        CHECK(rkm_graph_finalize(g) == RKM_OK);
        rkm_tensor_info ti;
        rkm_op_desc oi;
        CHECK(rkm_graph_tensor_info(g, -1, &ti) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_graph_tensor_info(g, 3, &ti) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_graph_op_info(g, 2, &oi) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_graph_op_info(g, 0, NULL) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_graph_find_tensor(g, NULL) == -1);
        CHECK(rkm_graph_write(g, NULL, NULL) == RKM_ERROR_ARGUMENT);
        rkm_op_costs costs[1] = {{-1, 1, 0, 0}};
        rkm_graph *g2 = NULL;
        CHECK(rkm_graph_with_costs(g, costs, &g2) == RKM_ERROR_GRAPH && g2 == NULL);
        costs[0].fwd_seconds = 1;
        costs[0].bwd_seconds = NAN;
        CHECK(rkm_graph_with_costs(g, costs, &g2) == RKM_ERROR_GRAPH && g2 == NULL);
        CHECK(rkm_graph_with_costs(g, costs, NULL) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_graph_with_costs(NULL, costs, &g2) == RKM_ERROR_ARGUMENT && g2 == NULL);
        rkm_plan *p = NULL;
        CHECK(rkm_plan_create(g, NULL, 0, NULL, NULL) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_read_string(g, "x", 1, "n", NULL, NULL) == RKM_ERROR_ARGUMENT);
        CHECK(rkm_plan_read_string(NULL, "x", 1, "n", NULL, &p) == RKM_ERROR_ARGUMENT && p == NULL);
        CHECK(rkm_plan_baseline(NULL, &p) == RKM_ERROR_ARGUMENT && p == NULL);
        CHECK(rkm_plan_num_steps(NULL) == 0 && rkm_plan_steps(NULL) == NULL && rkm_plan_graph(NULL) == NULL);
        CHECK(rkm_plan_mem_after(NULL) == NULL && rkm_plan_step_peaks(NULL) == NULL && rkm_plan_num_buffers(NULL) == 0);
    }
    rkm_graph_destroy(NULL);
    rkm_plan_destroy(NULL);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
    rkm_context_destroy(NULL);
    CHECK(rkm_context_create(NULL, NULL) == RKM_ERROR_ARGUMENT);
    CHECK(strcmp(rkm_context_errmsg(NULL), "") == 0);
    for (int r = 0; r <= RKM_RESULT_COUNT; r++) CHECK(rkm_result_string((rkm_result)r)[0] != '\0');
}

/* ----------------------------------------------------------- round trips */

static int same_ids(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* Every field of every tensor and op, and the derived facts, agree. */
static int same_graph(const rkm_graph *a, const rkm_graph *b)
{
    if (rkm_graph_num_tensors(a) != rkm_graph_num_tensors(b) || rkm_graph_num_ops(a) != rkm_graph_num_ops(b) ||
        rkm_graph_loss(a) != rkm_graph_loss(b))
        return 0;
    for (int32_t i = 0; i < rkm_graph_num_tensors(a); i++) {
        rkm_tensor_info x, y;
        if (rkm_graph_tensor_info(a, i, &x) || rkm_graph_tensor_info(b, i, &y)) return 0;
        if (strcmp(x.name, y.name) || x.bytes != y.bytes || x.flags != y.flags || x.producer != y.producer ||
            x.has_grad != y.has_grad || x.n_contributors != y.n_contributors)
            return 0;
    }
    for (int32_t i = 0; i < rkm_graph_num_ops(a); i++) {
        rkm_op_desc x, y;
        if (rkm_graph_op_info(a, i, &x) || rkm_graph_op_info(b, i, &y)) return 0;
        if (strcmp(x.name, y.name) || x.fwd_seconds != y.fwd_seconds || x.bwd_seconds != y.bwd_seconds ||
            !same_ids(x.in, x.n_in, y.in, y.n_in) || !same_ids(x.out, x.n_out, y.out, y.n_out) ||
            !same_ids(x.saved, x.n_saved, y.saved, y.n_saved) || x.phantom != y.phantom || x.fwd_ws != y.fwd_ws ||
            x.bwd_ws != y.bwd_ws)
            return 0;
    }
    rkm_graph_stats sa, sb;
    if (rkm_graph_stats_get(a, &sa) || rkm_graph_stats_get(b, &sb)) return 0;
    return sa.input_bytes == sb.input_bytes && sa.baseline_peak == sb.baseline_peak &&
           sa.baseline_time == sb.baseline_time && sa.lower_bound == sb.lower_bound && sa.blocks == sb.blocks &&
           sa.block_classes == sb.block_classes;
}

/* write g, read it back, write again: the same text and the same graph. */
static void round_trip(rkm_context *ctx, const rkm_graph *g, const char *what)
{
    sbuf a = {0}, b = {0};
    rkm_graph *h = NULL;
    CHECK(rkm_graph_write(g, sbuf_write, &a) == RKM_OK);
    rkm_result r = a.data ? rkm_graph_read_string(ctx, a.data, a.len, what, &h) : RKM_ERROR_IO;
    if (r != RKM_OK) fprintf(stderr, "%s: written text does not read back: %s\n", what, rkm_context_errmsg(ctx));
    CHECK(r == RKM_OK);
    if (h) {
        CHECK(rkm_graph_write(h, sbuf_write, &b) == RKM_OK);
        CHECK(b.data && a.len == b.len && strcmp(a.data, b.data) == 0);
        int same = same_graph(g, h);
        if (!same) fprintf(stderr, "%s: graph differs after a round trip\n", what);
        CHECK(same);
    }
    CHECK(rkm_graph_write(g, fail_write, NULL) == RKM_ERROR_IO);
    rkm_graph_destroy(h);
    free(a.data);
    free(b.data);
}

static int by_name(const void *a, const void *b) { return strcmp(a, b); }

/* Every *.rkg file of the bundled graphs folder. */
TEST(round_trip_bundled)
{
    static char names[64][256];
    size_t n = 0;
    DIR *dir = opendir(TEST_GRAPHS_DIR);
    CHECK(dir != NULL);
    for (struct dirent *d; dir && (d = readdir(dir)) != NULL && n < N_OF(names);) {
        size_t len = strlen(d->d_name);
        if (len > 4 && len < sizeof names[0] && strcmp(d->d_name + len - 4, ".rkg") == 0) strcpy(names[n++], d->d_name);
    }
    if (dir) closedir(dir);
    qsort(names, n, sizeof names[0], by_name);
    CHECK(n >= 8);
    for (size_t k = 0; k < n; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", TEST_GRAPHS_DIR, names[k]);
        rkm_context *ctx = test_new_ctx();
        rkm_graph *g = NULL;
        rkm_result r = rkm_graph_read_file(ctx, path, &g);
        if (r != RKM_OK) fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
        CHECK(r == RKM_OK);
        if (g) round_trip(ctx, g, path);
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
}

/* g with op `op`'s costs replaced (the others as they are): a new graph,
 * or NULL with the result in *r. */
static rkm_graph *with_op_costs(const rkm_graph *g, int32_t op, rkm_op_costs c, rkm_result *r)
{
    int32_t n = rkm_graph_num_ops(g);
    rkm_op_costs *costs = calloc((size_t)n + 1, sizeof *costs);
    for (int32_t i = 0; i < n; i++) {
        rkm_op_desc d;
        if (rkm_graph_op_info(g, i, &d) == RKM_OK) costs[i] = (rkm_op_costs){d.fwd_seconds, d.bwd_seconds, d.fwd_ws, d.bwd_ws};
    }
    if (op >= 0 && op < n) costs[op] = c;
    rkm_graph *out = NULL;
    *r = rkm_graph_with_costs(g, costs, &out);
    free(costs);
    return out;
}

/* Times that need all 17 digits, zero sizes and workspaces, a file written
 * to disk and read back. */
TEST(round_trip_api_graph)
{
    rkm_context *ctx = test_new_ctx();
    int32_t t[3], f, id;
    rkm_graph *g = small_builder(ctx, t, &f, 0);
    if (g) {
        rkm_op_desc d;
        memset(&d, 0, sizeof d);
        d.name = "gop";
        d.fwd_seconds = 0.1 + 0.2;
        d.bwd_seconds = 1.0 / 3.0;
        d.in = &t[1];
        d.n_in = 1;
        d.out = &t[2];
        d.n_out = 1;
        int32_t sv[2] = {t[2], t[1]};
        d.saved = sv;
        d.n_saved = 2;
        d.phantom = 12345678901234ull;
        d.bwd_ws = 3;
        CHECK(rkm_graph_add_op(g, &d, &id) == RKM_OK);
        CHECK(rkm_graph_set_loss(g, t[2]) == RKM_OK);
        CHECK(rkm_graph_finalize(g) == RKM_OK);
        rkm_result r;
        rkm_graph *g2 = with_op_costs(g, f, (rkm_op_costs){5e-324, 1.7976931348623157e308, 0, 7}, &r);
        CHECK(r == RKM_OK && g2);
        rkm_graph_destroy(g);
        g = g2;
        if (!g) goto done;
        round_trip(ctx, g, "api.rkg");
        char path[64];
        snprintf(path, sizeof path, "/tmp/rkm_test_graph_%ld.rkg", (long)getpid());
        CHECK(rkm_graph_write_file(g, path) == RKM_OK);
        rkm_graph *h = NULL;
        CHECK(rkm_graph_read_file(ctx, path, &h) == RKM_OK);
        CHECK(h && same_graph(g, h));
        rkm_graph_destroy(h);
        remove(path);
        CHECK(rkm_graph_write_file(g, "/nonexistent-dir/x.rkg") == RKM_ERROR_IO);
    }
done:
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* The longest lines the writer makes: 255-byte names everywhere, times of
 * 17 significant digits and extreme exponents, a 20-digit byte count; the
 * byte total is exactly 2^64 - 1: 2 x (1 + 8 + 7) + phantom + fwd_ws. */
TEST(round_trip_longest_lines)
{
    static const char text[] = "rockmate-graph 1\ntensor A" N63 N64 N63 "x 1 input\n"
                               "tensor B" N63 N64 N63 "y 8\n"
                               "tensor C" N63 N64 N63 "z 7 nograd\n"
                               "op O" N63 N64 N63 "n fwd=4.9406564584124654e-324 bwd=1.7976931348623157e308 in=A" N63
                               N64 N63 "x out=B" N63 N64 N63 "y,C" N63 N64 N63 "z saved=A" N63 N64 N63
                               "x phantom=18446744073709551000 fwd_ws=583\n"
                               "loss B" N63 N64 N63 "y\n";
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL;
    rkm_result r = rkm_graph_read_string(ctx, text, strlen(text), "long.rkg", &g);
    if (r) fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
    CHECK(r == RKM_OK);
    if (g) {
        round_trip(ctx, g, "long.rkg");
        rkm_graph *g2 = with_op_costs(g, 0, (rkm_op_costs){0.1 + 0.2, 1.0 / 3.0, 583, 583}, &r);
        CHECK(r == RKM_OK && g2);
        if (g2) round_trip(ctx, g2, "long.rkg");
        rkm_graph_destroy(g2);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* New costs keep the 64-bit rule: a workspace that would push the byte
 * total over 2^64 - 1 is refused, and the old graph stays as it is. */
TEST(with_costs_keeps_the_64_bit_rule)
{
    static const char text[] = "rockmate-graph 1\ntensor x 1 input\ntensor a 8\n"
                               "op f fwd=1 bwd=1 in=x out=a phantom=18446744073709551000\nloss a\n";
    /* total: 2 x 9 + 18446744073709551000 = 2^64 - 1 - 597 */
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL, *g2 = NULL, *g3 = NULL;
    CHECK(rkm_graph_read_string(ctx, text, strlen(text), "ws.rkg", &g) == RKM_OK);
    if (g) {
        rkm_result r;
        g2 = with_op_costs(g, 0, (rkm_op_costs){2, 3, 597, 597}, &r);
        CHECK(r == RKM_OK && g2);
        g3 = with_op_costs(g, 0, (rkm_op_costs){5, 5, 598, 0}, &r);
        CHECK(r == RKM_ERROR_GRAPH && !g3);
        CHECK(strstr(rkm_context_errmsg(ctx), "64 bits") != NULL);
        g3 = with_op_costs(g, 0, (rkm_op_costs){5, 5, 0, UINT64_MAX}, &r);
        CHECK(r == RKM_ERROR_GRAPH && !g3);
        rkm_op_desc oi;
        CHECK(rkm_graph_op_info(g, 0, &oi) == RKM_OK);
        CHECK(oi.fwd_seconds == 1 && oi.bwd_seconds == 1 && oi.fwd_ws == 0 && oi.bwd_ws == 0);
        if (g2) {
            CHECK(rkm_graph_op_info(g2, 0, &oi) == RKM_OK);
            CHECK(oi.fwd_seconds == 2 && oi.bwd_seconds == 3 && oi.fwd_ws == 597 && oi.bwd_ws == 597);
            round_trip(ctx, g2, "ws.rkg");
        }
    }
    rkm_graph_destroy(g2);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* A clock whose ticks vary in length: ops get varied measured times. */
static double uneven_clock(void *user)
{
    uint64_t *n = user;
    ++*n;
    return (double)(*n * 3 + *n % 7) * 1e-4;
}

/* PROFILE HOOK: after_run is called once after each run, after that run's
 * last backward, with the run's number; a failing hook stops profiling
 * with RKM_ERROR_CALLBACK and no graph. The backwards stand for a host
 * accumulating parameter gradients: the hook sees exactly one run's worth. */
typedef struct hook_log {
    int bwd_since_reset, runs_seen, bad, fail_at;
} hook_log;

static int hook_bwd(void *user, const rkm_bwd_call *c)
{
    (void)c;
    ((hook_log *)user)->bwd_since_reset++;
    return 0;
}

static int hook_fwd(void *user, const rkm_fwd_call *c)
{
    (void)user;
    (void)c;
    return 0;
}

static int hook_after_run(void *user, int32_t run)
{
    hook_log *h = user;
    if (run != h->runs_seen || h->bwd_since_reset != 3) h->bad++; /* EXEC_GRAPH-like: 3 backwards per step */
    h->bwd_since_reset = 0;
    h->runs_seen++;
    return run == h->fail_at ? 77 : 0;
}

TEST(profile_after_run_hook)
{
    static const char *G = "rockmate-graph 1\ntensor x 4 input\ntensor a 8\ntensor b 8\ntensor c 4\n"
                           "op f fwd=1 bwd=1 in=x out=a saved=x\nop g fwd=1 bwd=1 in=a out=b saved=a\n"
                           "op h fwd=1 bwd=1 in=b out=c saved=b\nloss c\n";
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL, *prof = NULL;
    CHECK(rkm_graph_read_string(ctx, G, strlen(G), "hook.rkg", &g) == RKM_OK);
    hook_log h = {0, 0, 0, -1};
    rkm_callbacks cb = {.user = &h, .forward = hook_fwd, .backward = hook_bwd};
    rkm_profile_desc pd = {.runs = 4, .after_run = hook_after_run, .user = &h};
    CHECK(g && rkm_graph_profile(g, &cb, &pd, &prof) == RKM_OK);
    CHECK(prof != NULL && h.runs_seen == 4 && h.bad == 0);
    rkm_graph_destroy(prof);
    prof = NULL;
    hook_log f = {0, 0, 0, 1};
    cb.user = pd.user = &f;
    CHECK(g && rkm_graph_profile(g, &cb, &pd, &prof) == RKM_ERROR_CALLBACK);
    CHECK(prof == NULL && f.runs_seen == 2 && f.bad == 0);
    CHECK(strstr(rkm_context_errmsg(ctx), "after_run callback returned 77 after run 1") != NULL);
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* Same steps, step for step. */
static int same_steps(const rkm_plan *a, const rkm_plan *b)
{
    size_t n = rkm_plan_num_steps(a);
    return n == rkm_plan_num_steps(b) && memcmp(rkm_plan_steps(a), rkm_plan_steps(b), n * sizeof(rkm_step)) == 0;
}

/* Blocks a and b of two graphs are the same: ops, separators, class. */
static int same_blocks(const rkm_graph *a, const rkm_graph *b)
{
    rkm_graph_stats sa, sb;
    if (rkm_graph_stats_get(a, &sa) || rkm_graph_stats_get(b, &sb) || sa.blocks != sb.blocks) return 0;
    for (int32_t k = 0; k < sa.blocks; k++) {
        rkm_block_info x, y;
        if (rkm_graph_block_info(a, k, &x) || rkm_graph_block_info(b, k, &y)) return 0;
        if (x.n_ops != y.n_ops || x.input != y.input || x.output != y.output || x.class_id != y.class_id ||
            !same_ids(x.ops, x.n_ops, y.ops, y.n_ops))
            return 0;
    }
    return 1;
}

/* A graph profiled in memory and the same graph written to .rkg and read
 * back are one graph: the same blocks, each of the same class, and the
 * same plan (rockmate's, which plans a class's blocks alike) at 40 %, a
 * budget where each recomputes. The blocks are compared directly, so one
 * budget suffices for the plans (100, 60 and 30 % were three more solves
 * of each graph, 1.8 s apiece on peer-gpt under the sanitizers). */
TEST(profiled_graph_plans_as_its_file)
{
    static const char *names[] = {"gpt2-tiny", "peer-gpt", "mlp16"};
    for (size_t k = 0; k < N_OF(names); k++) {
        rkm_context *ctx = test_new_ctx();
        rkm_graph *g = test_load_graph(ctx, names[k]), *prof = NULL, *back = NULL;
        uint64_t ticks = 0;
        rkm_profile_desc pd = {.runs = 3, .clock = uneven_clock, .user = &ticks};
        rkm_callbacks cb = {.forward = noop_fwd, .backward = noop_bwd};
        sbuf text = {0};
        CHECK(g && rkm_graph_profile(g, &cb, &pd, &prof) == RKM_OK);
        if (!prof) fprintf(stderr, "%s\n", rkm_context_errmsg(ctx));
        if (prof) CHECK(rkm_graph_write(prof, sbuf_write, &text) == RKM_OK);
        if (text.data) CHECK(rkm_graph_read_string(ctx, text.data, text.len, "profiled.rkg", &back) == RKM_OK);
        if (back) {
            CHECK(same_graph(prof, back));
            CHECK(same_blocks(prof, back));
            rkm_graph_stats s0, s1;
            CHECK(rkm_graph_stats_get(g, &s0) == RKM_OK && rkm_graph_stats_get(prof, &s1) == RKM_OK);
            CHECK(s0.baseline_time != s1.baseline_time); /* the profile did change the costs */
            /* and the classes: a graph that kept its old classes would plan differently */
            CHECK(s0.block_classes != s1.block_classes);
            static const double pcts[] = {40};
            rkm_solve_desc sd;
            memset(&sd, 0, sizeof sd); /* zero: the build's best algorithm */
            rkm_planner *on_prof = NULL, *on_back = NULL; /* one planner a graph: its block ILPs once */
            CHECK(rkm_planner_create(prof, &sd, &on_prof) == RKM_OK);
            CHECK(rkm_planner_create(back, &sd, &on_back) == RKM_OK);
            for (size_t i = 0; on_prof && on_back && i < N_OF(pcts); i++) {
                uint64_t budget = (uint64_t)((double)s1.baseline_peak * pcts[i] / 100);
                rkm_plan *a = NULL, *b = NULL;
                rkm_result ra = rkm_planner_solve(on_prof, budget, &a), rb = rkm_planner_solve(on_back, budget, &b);
                CHECK(ra == rb);
                if (a && b) {
                    rkm_plan_stats pa, pb;
                    CHECK(same_steps(a, b));
                    CHECK(rkm_plan_stats_get(a, &pa) == RKM_OK && rkm_plan_stats_get(b, &pb) == RKM_OK);
                    CHECK(pa.time == pb.time && pa.peak == pb.peak && pa.overhead == pb.overhead);
                    CHECK(pa.algo == pb.algo && pa.algo != RKM_ALGO_DEFAULT);
                }
                rkm_plan_destroy(a);
                rkm_plan_destroy(b);
            }
            rkm_planner_destroy(on_prof);
            rkm_planner_destroy(on_back);
        }
        free(text.data);
        rkm_graph_destroy(back);
        rkm_graph_destroy(prof);
        rkm_graph_destroy(g);
        rkm_context_destroy(ctx);
    }
}

/* ----------------------------------------------------- derived by finalize */

/* multi-output.rkg, worked by hand from its text: causal writes only the
 * nograd mask (no backward); h is read by split and residual, r by norm and
 * head (two contributors each); x and pos are inputs. */
TEST(derived_multi_output)
{
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = NULL;
    CHECK(rkm_graph_read_file(ctx, TEST_GRAPHS_DIR "/multi-output.rkg", &g) == RKM_OK);
    if (g) {
        static const struct {
            const char *name;
            int has_grad;
            int32_t contributors;
        } want[] = {{"x", 0, 0}, {"pos", 0, 0}, {"h", 1, 2},    {"q", 1, 1}, {"k", 1, 1},
                    {"v", 1, 1}, {"mask", 0, 0}, {"s", 1, 1},    {"a", 1, 1}, {"drop", 1, 1},
                    {"r", 1, 2}, {"n", 1, 1},    {"out", 1, 1},  {"loss", 1, 1}};
        for (size_t i = 0; i < N_OF(want); i++) {
            rkm_tensor_info ti;
            int32_t id = rkm_graph_find_tensor(g, want[i].name);
            CHECK(id == (int32_t)i);
            CHECK(rkm_graph_tensor_info(g, id, &ti) == RKM_OK);
            if (ti.has_grad != want[i].has_grad || ti.n_contributors != want[i].contributors)
                fprintf(stderr, "tensor %s: has_grad %d contributors %d\n", want[i].name, ti.has_grad,
                        (int)ti.n_contributors);
            CHECK(ti.has_grad == want[i].has_grad && ti.n_contributors == want[i].contributors);
        }
        for (int32_t o = 0; o < rkm_graph_num_ops(g); o++) {
            rkm_op_desc oi;
            CHECK(rkm_graph_op_info(g, o, &oi) == RKM_OK);
            int has_bwd = 0;
            for (int32_t k = 0; k < oi.n_out; k++) {
                rkm_tensor_info ti;
                has_bwd |= rkm_graph_tensor_info(g, oi.out[k], &ti) == RKM_OK && ti.has_grad;
            }
            CHECK(has_bwd == (strcmp(oi.name, "causal") != 0));
        }
        rkm_graph_stats st;
        CHECK(rkm_graph_stats_get(g, &st) == RKM_OK);
        CHECK_EQ_U64(st.input_bytes, 4096 + 512);
        CHECK(st.blocks >= 1 && st.block_classes >= 1 && st.block_classes <= st.blocks);
    }
    rkm_graph_destroy(g);
    rkm_context_destroy(ctx);
}

/* A NUL byte is not text: the line it is on is refused, not cut short. */
TEST(nul_byte_is_refused)
{
    static const char text[] = "rockmate-graph 1\ntensor x 8 input\ntensor y 8\0 junk\nop f fwd=1 bwd=1 in=x out=y\nloss y\n";
    rkm_context *ctx = test_new_ctx();
    rkm_graph *g = (rkm_graph *)1;
    CHECK(rkm_graph_read_string(ctx, text, sizeof text - 1, "nul.rkg", &g) == RKM_ERROR_PARSE);
    CHECK(g == NULL);
    CHECK(strstr(rkm_context_errmsg(ctx), "nul.rkg:3:") != NULL && strstr(rkm_context_errmsg(ctx), "NUL") != NULL);
    rkm_context_destroy(ctx);
}

int main(void)
{
    RUN(every_graph_rule_in_files);
    RUN(nul_byte_is_refused);
    RUN(graph_syntax_accepted);
    RUN(read_file_errors);
    RUN(every_graph_rule_by_api);
    RUN(whole_graph_rules_by_api);
    RUN(state_errors);
    RUN(null_and_range_arguments);
    RUN(round_trip_bundled);
    RUN(round_trip_api_graph);
    RUN(round_trip_longest_lines);
    RUN(with_costs_keeps_the_64_bit_rule);
    RUN(profiled_graph_plans_as_its_file);
    RUN(profile_after_run_hook);
    RUN(derived_multi_output);
    TEST_END();
}
