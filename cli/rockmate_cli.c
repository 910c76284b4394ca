/* rockmate_cli.c -- the `rockmate` command: info, plan, check, sweep and
 * pipeline over graph (.rkg) and plan (.rkp) files.
 *
 * It uses only the public API of rockmate.h. Every peak and time it prints
 * comes from the library's simulator, so the tool and the library agree to the
 * byte. Exit status: 0 success, 1 bad input, 2 bad usage, 3 no plan fits the
 * budget (see `rockmate --help`). */
#include "../rockmate.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CLI_OK = 0, CLI_INPUT = 1, CLI_USAGE = 2, CLI_BUDGET = 3 };

/* The algorithms the tool names, in rkm_algo order: all but RKM_ALGO_DEFAULT
 * (the tool's own default is rockmate). */
#define CLI_FIRST_ALGO RKM_ALGO_ROCKMATE
#define CLI_BARE_BUDGET_MIN 4096 /* bytes: a bare budget below it is refused (a forgotten %) */

/* clang-format off */
static const char cli_usage_text[] =
    "usage: rockmate COMMAND [OPTIONS]\n"
    "\n"
    "Plans activation re-materialization (checkpointing) for one training step.\n"
    "\n"
    "commands:\n"
    "  info  GRAPH [--json] [--algo A,A,...] [--slots N] [--time-limit S] [--align N]\n"
    "        size, baseline, lower bound, block structure, and the smallest\n"
    "        budget each algorithm can meet (default none,sqrt,rotor,rockmate);\n"
    "        with a copy link, rockmate's without it follows as \"(no copy)\"\n"
    "  plan  GRAPH --budget B [--algo A] [-o PLAN] [--json] [--svg FILE]\n"
    "        [--slots N] [--time-limit S] [--align N]\n"
    "        a plan whose arena (one allocation, every buffer at an offset)\n"
    "        fits budget B; -o writes it (- for standard output), --svg draws\n"
    "        its memory over the steps beside the baseline's (and the copies\n"
    "        in flight, where it offloads)\n"
    "  check GRAPH PLAN [--budget B] [--json] [--align N]\n"
    "        replays a plan file: valid or not, its peak, arena and time; with\n"
    "        --budget, whether its arena fits B (then its peak does too); the\n"
    "        arena at the file's alignment (its `align`, else 256) unless\n"
    "        --align N lays the plan out anew for a host that aligns to N\n"
    "  sweep GRAPH [--algo A,A,...] [--points N] [--json] [--svg FILE]\n"
    "        [--slots N] [--time-limit S] [--align N]\n"
    "        overhead against budget, from the smallest feasible budget to\n"
    "        100% of the baseline peak (N budgets, default 12, denser toward\n"
    "        the smallest, where the curves are steep); on a graph with a copy\n"
    "        link, rockmate's column is followed by \"(no copy)\": rockmate on\n"
    "        the same graph without the link (recompute only; dashed in --svg)\n"
    "  pipeline GRAPH --stages P --micro-batches M --budget B[,B,...]\n"
    "        [--schedule 1f1b|gpipe] [--link R] [--algo A] [-o DIR] [--json]\n"
    "        [--svg FILE] [--slots N] [--time-limit S] [--align N]\n"
    "        GRAPH cut into P stages on P devices, M micro-batches a step:\n"
    "        the cut (chosen for the least step time) and each stage's plan\n"
    "        (--algo, default rockmate) for its device's budget B (one for\n"
    "        every device, or P of them) with its micro-batches in flight;\n"
    "        per stage its first and last op, k in flight, overhead, kept\n"
    "        bytes per micro-batch, peak and arena; the step time; beside it\n"
    "        the uniform cut storing all (none), recomputing every block\n"
    "        (full) and with A; -o writes DIR/stageN.rkg and DIR/stageN.rkp,\n"
    "        --svg the schedule's timeline and each stage's memory\n"
    "  GRAPH may be - to read the graph from standard input, and so may\n"
    "  check's PLAN (but not both)\n"
    "\n"
    "options:\n"
    "  --budget B        bytes (a decimal number: 4096, 1.5e6, or 512B), optionally\n"
    "                    with KiB, MiB, GiB (powers of 1024) or KB, MB, GB (powers\n"
    "                    of 1000), or N% of the baseline peak; a bare number below\n"
    "                    4096 is refused as a likely forgotten % (write 512B);\n"
    "                    pipeline: a device's, N% of the whole graph's, or a list\n"
    "                    of P, one per stage (a list of another length: status 2)\n"
    "  --algo A          rockmate (default), rotor, sqrt, checkmate, dtr, full or\n"
    "                    none (full: every block recomputed from its input);\n"
    "                    info and sweep take a list (sweep's default:\n"
    "                    rockmate,rotor,sqrt,none); checkmate is slow but for\n"
    "                    small graphs, so it runs only when named; it needs\n"
    "                    lp_solve: a build without it (OMIT=1) refuses it and\n"
    "                    plans rockmate without its block ILP options\n"
    "  --json            print one JSON object (sweep: an array) on standard output;\n"
    "                    plan prints one with exit status 3 too: error (budget\n"
    "                    or timeout), error_id, message, budget and min_budget\n"
    "                    (the smallest budget that fits, bytes; null if unknown);\n"
    "                    plan's work and work_limit, info's min_budget_work: the\n"
    "                    planner call's work meter and its limit\n"
    "  -o, --output PLAN write the plan file (pipeline: DIR, made if missing)\n";
/* Two strings: C99 compilers need only take 4095 characters in one. */
static const char cli_usage_text2[] =
    ""
    "  --svg FILE        write a chart\n"
    "  --log             the chart's vertical axis on a log scale (memory of a\n"
    "                    plan at a small budget, overheads that span decades)\n"
    "  --copy D2H[,H2D[,LATENCY]]  plan with a copy link to host memory of D2H\n"
    "                    and H2D bytes a second (H2D: D2H; 450e9 or 450GB/s is\n"
    "                    NVLink-C2C, 25e9 PCIe 4.0 x16) and LATENCY a copy (S,\n"
    "                    default 0), in place of the graph's own (its `copy`\n"
    "                    statement); rockmate and dtr then offload where that is\n"
    "                    faster; --copy none: without\n"
    "  --slots N         memory slots of the chain dynamic program\n"
    "  --time-limit S    wall-clock seconds of planning per plan and algorithm\n"
    "                    (default 60), a safety stop: plans do not depend on it\n"
    "                    unless it is reached; then the best plan found so far\n"
    "                    is kept (plan says \"cut by the time limit\"), or, where\n"
    "                    none was, the exit status is 3\n"
    "  --ilp-time-limit S  effort per block ILP solve, in seconds of a current\n"
    "                    core (a deterministic amount of solver work; default\n"
    "                    0.03): more finds better block options, slower\n"
    "  --nest-ops N      rockmate plans a block of more than N ops as a graph of\n"
    "                    its own where, its input held, it cuts into smaller\n"
    "                    blocks (default 24; never: no nesting)\n"
    "  --points N        budgets in a sweep\n"
    "  --stages P        pipeline stages (devices), 1 to the graph's blocks (more:\n"
    "                    exit status 1, as the graph cannot be cut so)\n"
    "  --micro-batches M micro-batches a step (1 to 1000000)\n"
    "  --schedule S      1f1b (default: Megatron-LM's, min(P - s, M) in flight on\n"
    "                    stage s) or gpipe (all forwards, then all backwards)\n"
    "  --link R          bytes a second of the link between two stages, each way\n"
    "                    (25e9, 25GB/s); default: transfers take no time\n"
    "  --align N         the host's buffer alignment, a power of two of bytes\n"
    "                    (default 256): the arena is laid out, and a budget bounds\n"
    "                    it, at N\n"
    "  -v, --verbose     show the library's warnings and progress on stderr\n"
    "  --no-progress     no progress bar (info, plan and sweep draw one on stderr\n"
    "                    while they plan, erased when done, only where stderr is\n"
    "                    a terminal and --json is not given)\n"
    "  -h, --help        this text\n"
    "  --version         the library version\n"
    "  Numbers are decimal (4096, 0.5, 1.5e6; no sign, hex or spaces), counts\n"
    "  (--slots, --nest-ops, --points) digits only. Seconds S may end in s, ms,\n"
    "  us or ns (5us); bytes (--budget, --align) in B, KB, MB, GB, KiB, MiB or\n"
    "  GiB, and bytes a second (--copy) also in /s (25GB/s). A value with\n"
    "  anything else is refused (exit status 2)\n"
    "\n"
    "exit status: 0 success, 1 bad input, 2 bad usage, 3 no plan fits the budget\n"
    "(or none was found within --time-limit; pipeline: a stage's budget)\n";
/* clang-format on */

/* ===========================================================================
 * Command line parsing
 * ========================================================================= */

typedef enum cli_cmd { CMD_INFO, CMD_PLAN, CMD_CHECK, CMD_SWEEP, CMD_PIPELINE, CMD_COUNT } cli_cmd;

static const char *const cli_cmd_names[CMD_COUNT] = {"info", "plan", "check", "sweep", "pipeline"};
static const char *const cli_cmd_operands[CMD_COUNT][2] = {
    {"GRAPH", NULL}, {"GRAPH", NULL}, {"GRAPH", "PLAN"}, {"GRAPH", NULL}, {"GRAPH", NULL}};

enum { OPT_JSON, OPT_BUDGET, OPT_ALGO, OPT_OUTPUT, OPT_SVG, OPT_LOG, OPT_SLOTS, OPT_TIME, OPT_ILP_TIME, OPT_NEST, OPT_POINTS,
       OPT_ALIGN, OPT_VERBOSE, OPT_NO_PROGRESS, OPT_COPY, OPT_STAGES, OPT_MICRO, OPT_SCHEDULE, OPT_LINK, OPT_COUNT };

#define CMDS(i, p, c, s, pl) \
    ((i) << CMD_INFO | (p) << CMD_PLAN | (c) << CMD_CHECK | (s) << CMD_SWEEP | (pl) << CMD_PIPELINE)

/* clang-format off */
static const struct cli_optdef {
    const char *name, *alias;
    int has_value;
    unsigned cmds; /* bit per cli_cmd that accepts it */
} cli_optdefs[OPT_COUNT] = {
    [OPT_JSON] = {"--json", NULL, 0, CMDS(1, 1, 1, 1, 1)},
    [OPT_BUDGET] = {"--budget", NULL, 1, CMDS(0, 1, 1, 0, 1)},
    [OPT_ALGO] = {"--algo", NULL, 1, CMDS(1, 1, 0, 1, 1)},
    [OPT_OUTPUT] = {"--output", "-o", 1, CMDS(0, 1, 0, 0, 1)},
    [OPT_SVG] = {"--svg", NULL, 1, CMDS(0, 1, 0, 1, 1)},
    [OPT_LOG] = {"--log", NULL, 0, CMDS(0, 1, 0, 1, 0)},
    [OPT_SLOTS] = {"--slots", NULL, 1, CMDS(1, 1, 0, 1, 1)},
    [OPT_TIME] = {"--time-limit", NULL, 1, CMDS(1, 1, 0, 1, 1)},
    [OPT_ILP_TIME] = {"--ilp-time-limit", NULL, 1, CMDS(1, 1, 0, 1, 1)},
    [OPT_NEST] = {"--nest-ops", NULL, 1, CMDS(1, 1, 0, 1, 1)},
    [OPT_POINTS] = {"--points", NULL, 1, CMDS(0, 0, 0, 1, 0)},
    [OPT_ALIGN] = {"--align", NULL, 1, CMDS(1, 1, 1, 1, 1)},
    [OPT_VERBOSE] = {"--verbose", "-v", 0, CMDS(1, 1, 1, 1, 1)},
    [OPT_NO_PROGRESS] = {"--no-progress", NULL, 0, CMDS(1, 1, 0, 1, 1)},
    [OPT_COPY] = {"--copy", NULL, 1, CMDS(1, 1, 1, 1, 1)},
    [OPT_STAGES] = {"--stages", NULL, 1, CMDS(0, 0, 0, 0, 1)},
    [OPT_MICRO] = {"--micro-batches", NULL, 1, CMDS(0, 0, 0, 0, 1)},
    [OPT_SCHEDULE] = {"--schedule", NULL, 1, CMDS(0, 0, 0, 0, 1)},
    [OPT_LINK] = {"--link", NULL, 1, CMDS(0, 0, 0, 0, 1)},
};
/* clang-format on */

/* The progress bar: one line on stderr, redrawn with \r while the library
 * plans, erased before anything else is printed and after every planner
 * call, so that none of it stays in the output. Only where stderr is a
 * terminal, without --json and --no-progress. */
typedef struct cli_bar {
    int on;          /* drawing at all */
    int shown;       /* a bar is on the line now */
    char label[48];  /* what the command is at ("budget 3/12"), or "" */
} cli_bar;

typedef struct cli_opts {
    cli_cmd cmd;
    cli_bar *bar;     /* the progress bar (main's) */
    const char *operand[2];
    const char *value[OPT_COUNT]; /* the option's text; "" for a given flag; NULL if absent */
    rkm_algo algos[RKM_ALGO_COUNT];
    int n_algos;
    int32_t slots;     /* 0: library default */
    double time_limit;     /* 0: library default */
    double ilp_time_limit; /* 0: library default */
    int32_t nest_ops;      /* 0: library default; -1: never */
    int points;
    uint64_t alignment;    /* of the arena: --align, else RKM_ARENA_ALIGN */
    rkm_copy_desc copy;    /* --copy (all 0 for none) */
    int32_t stages, micro; /* pipeline: --stages, --micro-batches */
    rkm_pipe_schedule schedule;
    double link;           /* --link, bytes a second (0: free transfers) */
} cli_opts;

/* One line naming the problem, one line of hint; exit status 2. */
static int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "rockmate: %s%s", cmd ? cmd : "", cmd ? ": " : "");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'rockmate --help' for usage.\n");
    return CLI_USAGE;
}

static int cli_find_option(const char *arg, size_t len)
{
    for (int i = 0; i < OPT_COUNT; i++) {
        const struct cli_optdef *d = &cli_optdefs[i];
        if ((strlen(d->name) == len && strncmp(arg, d->name, len) == 0) ||
            (d->alias && strlen(d->alias) == len && strncmp(arg, d->alias, len) == 0))
            return i;
    }
    return -1;
}

/* Store one option (arg is argv[*i]; a value may be "=..." or the next
 * argument). Returns -1 when accepted, else the exit status. */
static int cli_take_option(cli_opts *o, int argc, char **argv, int *i)
{
    const char *arg = argv[*i], *cmd = cli_cmd_names[o->cmd];
    const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    int id = cli_find_option(arg, len);
    if (id < 0) return cli_usage_error(cmd, "unknown option '%.*s'", (int)len, arg);
    const struct cli_optdef *d = &cli_optdefs[id];
    if (!(d->cmds >> o->cmd & 1u)) return cli_usage_error(cmd, "option %s does not apply to '%s'", d->name, cmd);
    if (o->value[id]) return cli_usage_error(cmd, "option %s is given twice", d->name);
    if (!d->has_value) {
        if (eq) return cli_usage_error(cmd, "option %s takes no value", d->name);
        o->value[id] = "";
    } else if (eq) {
        o->value[id] = eq + 1;
    } else if (*i + 1 < argc) {
        o->value[id] = argv[++*i];
    } else {
        return cli_usage_error(cmd, "option %s needs a value", d->name);
    }
    if (d->has_value && !o->value[id][0]) return cli_usage_error(cmd, "option %s has an empty value", d->name);
    return -1;
}

/* Parse "rockmate,rotor" into o->algos. The library's "default" is not a
 * name here: the tool's own default is rockmate. */
static int cli_parse_algo_list(rkm_context *ctx, cli_opts *o, const char *list, int allow_list)
{
    const char *cmd = cli_cmd_names[o->cmd];
    o->n_algos = 0;
    for (const char *p = list;;) {
        size_t n = strcspn(p, ",");
        char name[32];
        rkm_algo a;
        if (n == 0 || n >= sizeof name) return cli_usage_error(cmd, "bad --algo list '%s'", list);
        memcpy(name, p, n);
        name[n] = 0;
        if (rkm_algo_from_name(ctx, name, &a) != RKM_OK || a == RKM_ALGO_DEFAULT) {
            /* The names from the library, so that the list cannot drift. */
            char names[128] = "";
            for (int k = CLI_FIRST_ALGO; k < RKM_ALGO_COUNT; k++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k > CLI_FIRST_ALGO ? ", " : "",
                         rkm_algo_name((rkm_algo)k));
            return cli_usage_error(cmd, "--algo: unknown algorithm '%s' (%s)", name, names);
        }
        for (int k = 0; k < o->n_algos; k++)
            if (o->algos[k] == a) return cli_usage_error(cmd, "--algo lists '%s' twice", name);
        if (o->n_algos == RKM_ALGO_COUNT) return cli_usage_error(cmd, "bad --algo list '%s'", list);
        o->algos[o->n_algos++] = a;
        if (!p[n]) break;
        if (!allow_list) return cli_usage_error(cmd, "--algo takes one algorithm here");
        p += n + 1;
    }
    return -1;
}

/* Option values are parsed whole, or refused with a usage error naming the
 * option: one helper per kind of value. Counts (cli_parse_count); byte
 * sizes and rates (cli_quantity with cli_byte_units, cli_rate) and
 * durations (cli_time_units); budgets go through rkm_parse_budget. */

/* A count: decimal digits alone (no sign, space or exponent), in [1, max]. */
static int cli_parse_count(const char *text, long max, long *out)
{
    long v = 0;
    if (!*text) return 0;
    for (const char *p = text; *p; p++) {
        if (!isdigit((unsigned char)*p) || v > (max - (*p - '0')) / 10) return 0;
        v = 10 * v + (*p - '0');
    }
    if (v < 1) return 0;
    *out = v;
    return 1;
}

/* A suffix: the value is the number times mul, divided by div (so that
 * 5us is exactly 5e-6, as the bare number reads). */
typedef struct cli_unit {
    const char *suffix;
    double mul, div;
} cli_unit;
/* Bytes: rkm_parse_budget's suffixes but %; a bare number is bytes. */
static const cli_unit cli_byte_units[] = {
    {"", 1, 1}, {"B", 1, 1},
    {"KB", 1e3, 1}, {"MB", 1e6, 1}, {"GB", 1e9, 1},
    {"KiB", 1024.0, 1}, {"MiB", 1048576.0, 1}, {"GiB", 1073741824.0, 1},
    {NULL, 0, 0}};
/* Seconds: a bare number is seconds. */
static const cli_unit cli_time_units[] = {
    {"", 1, 1}, {"s", 1, 1}, {"ms", 1, 1e3}, {"us", 1, 1e6}, {"ns", 1, 1e9}, {NULL, 0, 0}};

/* text[0..len): a decimal number as rkm_parse_budget reads one
 * ([0-9]*[.[0-9]*][(e|E)[+-]N], a digit before the exponent: no sign, space,
 * hex, inf or nan), then exactly one of units' suffixes. 1 with the value
 * (finite, >= 0) in *out; else 0. */
static int cli_quantity(const char *text, size_t len, const cli_unit *units, double *out)
{
    size_t n = 0, digits = 0;
    while (n < len && isdigit((unsigned char)text[n])) n++, digits++;
    if (n < len && text[n] == '.')
        for (n++; n < len && isdigit((unsigned char)text[n]); n++) digits++;
    if (n < len && digits && (text[n] == 'e' || text[n] == 'E')) {
        size_t e = n + 1 + (n + 1 < len && (text[n + 1] == '+' || text[n + 1] == '-'));
        if (e < len && isdigit((unsigned char)text[e])) /* else the 'e' is left to the suffix, and refused */
            for (n = e; n < len && isdigit((unsigned char)text[n]);) n++;
    }
    char num[64];
    if (!digits || n >= sizeof num) return 0;
    memcpy(num, text, n);
    num[n] = 0;
    for (const cli_unit *u = units; u->suffix; u++)
        if (strlen(u->suffix) == len - n && memcmp(text + n, u->suffix, len - n) == 0) {
            double v = strtod(num, NULL) * u->mul / u->div;
            if (!isfinite(v)) return 0;
            *out = v;
            return 1;
        }
    return 0;
}

/* A rate in bytes a second: a byte size, optionally followed by "/s" (25GB/s). */
static int cli_rate(const char *text, size_t len, double *out)
{
    if (len >= 2 && memcmp(text + len - 2, "/s", 2) == 0) len -= 2;
    return cli_quantity(text, len, cli_byte_units, out);
}

/* The --algo list, or the command's default: checkmate (the whole-graph
 * ILP) runs to its time limit on all but tiny graphs, so only on request.
 * Parsed last, once the context exists. */
static int cli_parse_algos(rkm_context *ctx, cli_opts *o)
{
    int one = o->cmd == CMD_PLAN || o->cmd == CMD_PIPELINE; /* one algorithm */
    const char *algos = o->value[OPT_ALGO]   ? o->value[OPT_ALGO]
                        : one                ? "rockmate"
                        : o->cmd == CMD_INFO ? "none,sqrt,rotor,rockmate"
                                             : "rockmate,rotor,sqrt,none";
    return cli_parse_algo_list(ctx, o, algos, !one);
}

/* A seconds option into *out (unchanged when absent); non-zero: the usage error's status. */
static int cli_seconds(const cli_opts *o, int opt, double *out)
{
    const char *text = o->value[opt];
    if (!text) return 0;
    double t;
    if (!cli_quantity(text, strlen(text), cli_time_units, &t) || !(t > 0))
        return cli_usage_error(cli_cmd_names[o->cmd], "%s wants a positive duration (seconds, or with s, ms, us "
                               "or ns), not '%s'", cli_optdefs[opt].name, text);
    *out = t;
    return 0;
}

/* --copy D2H[,H2D[,LATENCY]] (two rates, H2D D2H's by default, and a
 * duration, 0 by default) or none, into o->copy. -1 when accepted, else the
 * usage error's status. */
static int cli_parse_copy(cli_opts *o)
{
    static const char *const field[3] = {"D2H", "H2D", "LATENCY"};
    const char *text = o->value[OPT_COPY], *cmd = cli_cmd_names[o->cmd];
    double v[3] = {0, 0, 0};
    int n = 0;
    if (!text || strcmp(text, "none") == 0) return -1;
    for (const char *p = text;; p++) {
        size_t len = strcspn(p, ",");
        if (n == 3)
            return cli_usage_error(cmd, "--copy takes at most three values, D2H,H2D,LATENCY, not '%s'", text);
        if (n < 2 ? !cli_rate(p, len, &v[n]) || !(v[n] > 0) : !cli_quantity(p, len, cli_time_units, &v[n]))
            return cli_usage_error(cmd, "--copy: %s '%.*s' is not %s, in '%s'", field[n], (int)len, p,
                                   n < 2 ? "a positive rate in bytes a second (25e9, 25GB or 25GB/s; KB, MB, GB, "
                                           "KiB, MiB, GiB)"
                                         : "a duration (seconds, or with s, ms, us or ns)",
                                   text);
        n++;
        p += len;
        if (!*p) break;
    }
    o->copy.d2h_bytes_per_second = v[0];
    o->copy.h2d_bytes_per_second = n > 1 ? v[1] : v[0];
    o->copy.latency_seconds = v[2];
    return -1;
}

/* The budgets in a --budget list: its commas plus one. */
static int32_t cli_budget_count(const char *text)
{
    int32_t n = 1;
    for (; *text; text++) n += *text == ',';
    return n;
}

/* pipeline's own options: --stages and --micro-batches (required),
 * --schedule, --link, and a --budget list of one or P budgets (its texts
 * are parsed against the graph later). -1 when accepted, else the usage
 * error's status. */
static int cli_pipeline_options(cli_opts *o)
{
    const char *cmd = cli_cmd_names[o->cmd];
    long v;
    if (!o->value[OPT_STAGES]) return cli_usage_error(cmd, "--stages is required");
    if (!o->value[OPT_MICRO]) return cli_usage_error(cmd, "--micro-batches is required");
    if (!cli_parse_count(o->value[OPT_STAGES], INT32_MAX, &v))
        return cli_usage_error(cmd, "--stages wants an integer from 1 to %ld, not '%s'", (long)INT32_MAX,
                               o->value[OPT_STAGES]);
    o->stages = (int32_t)v;
    if (!cli_parse_count(o->value[OPT_MICRO], 1000000, &v))
        return cli_usage_error(cmd, "--micro-batches wants an integer from 1 to 1000000, not '%s'", o->value[OPT_MICRO]);
    o->micro = (int32_t)v;
    o->schedule = RKM_PIPE_1F1B;
    const char *sched = o->value[OPT_SCHEDULE];
    if (sched && strcmp(sched, "gpipe") == 0)
        o->schedule = RKM_PIPE_GPIPE;
    else if (sched && strcmp(sched, "1f1b") != 0)
        return cli_usage_error(cmd, "--schedule wants 1f1b or gpipe, not '%s'", sched);
    const char *link = o->value[OPT_LINK];
    if (link && (!cli_rate(link, strlen(link), &o->link) || !(o->link > 0)))
        return cli_usage_error(cmd, "--link wants a positive rate in bytes a second (25e9, 25GB or 25GB/s; KB, MB, GB, "
                               "KiB, MiB, GiB), not '%s'", link);
    int32_t n = cli_budget_count(o->value[OPT_BUDGET]);
    if (n != 1 && n != o->stages)
        return cli_usage_error(cmd, "--budget lists %d budgets for %d stages: give one budget, every device's, or one "
                               "per stage (%d)", (int)n, (int)o->stages, (int)o->stages);
    if (o->value[OPT_OUTPUT] && strcmp(o->value[OPT_OUTPUT], "-") == 0)
        return cli_usage_error(cmd, "-o wants a folder for the stage files, not - (standard output)");
    return -1;
}

/* Check and convert the numeric options. */
static int cli_convert_options(cli_opts *o)
{
    const char *cmd = cli_cmd_names[o->cmd];
    long v;
    if (o->value[OPT_SLOTS]) {
        if (!cli_parse_count(o->value[OPT_SLOTS], INT32_MAX, &v))
            return cli_usage_error(cmd, "--slots wants an integer from 1 to %ld, not '%s'", (long)INT32_MAX,
                                   o->value[OPT_SLOTS]);
        o->slots = (int32_t)v;
    }
    if (o->value[OPT_NEST]) {
        if (strcmp(o->value[OPT_NEST], "never") == 0) o->nest_ops = -1;
        else if (!cli_parse_count(o->value[OPT_NEST], INT32_MAX, &v))
            return cli_usage_error(cmd, "--nest-ops wants an integer from 1 to %ld or never, not '%s'", (long)INT32_MAX,
                                   o->value[OPT_NEST]);
        else o->nest_ops = (int32_t)v;
    }
    o->alignment = RKM_ARENA_ALIGN;
    if (o->value[OPT_ALIGN]) {
        const char *a = o->value[OPT_ALIGN];
        double bytes;
        if (!cli_quantity(a, strlen(a), cli_byte_units, &bytes) || !(bytes >= 1 && bytes <= (double)(1L << 30)) ||
            bytes != floor(bytes) || ((uint64_t)bytes & ((uint64_t)bytes - 1)))
            return cli_usage_error(cmd, "--align wants a power of two from 1 to %ld bytes (optionally with B, KB, "
                                   "KiB, ...), not '%s'", 1L << 30, a);
        o->alignment = (uint64_t)bytes;
    }
    int rc;
    if ((rc = cli_parse_copy(o)) >= 0) return rc;
    o->points = 12;
    if (o->value[OPT_POINTS]) {
        if (!cli_parse_count(o->value[OPT_POINTS], 10000, &v) || v < 2)
            return cli_usage_error(cmd, "--points wants an integer from 2 to 10000, not '%s'", o->value[OPT_POINTS]);
        o->points = (int)v;
    }
    if ((rc = cli_seconds(o, OPT_TIME, &o->time_limit)) || (rc = cli_seconds(o, OPT_ILP_TIME, &o->ilp_time_limit)))
        return rc;
    if ((o->cmd == CMD_PLAN || o->cmd == CMD_PIPELINE) && !o->value[OPT_BUDGET])
        return cli_usage_error(cmd, "--budget is required");
    if (o->cmd == CMD_PIPELINE && (rc = cli_pipeline_options(o)) >= 0) return rc;
    if (o->cmd == CMD_CHECK && strcmp(o->operand[0], "-") == 0 && strcmp(o->operand[1], "-") == 0)
        return cli_usage_error(cmd, "GRAPH and PLAN cannot both be - (standard input)");
    if (o->value[OPT_OUTPUT] && strcmp(o->value[OPT_OUTPUT], "-") == 0 && o->value[OPT_JSON])
        return cli_usage_error(cmd, "-o - and --json both want standard output");
    return -1;
}

/* Returns -1 to go on, or the exit status (0 after --help or --version).
 * The algorithm list is left to cli_parse_algos. */
static int cli_parse(int argc, char **argv, cli_opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(cli_usage_text, stdout);
            fputs(cli_usage_text2, stdout);
            return CLI_OK;
        }
    if (argc < 2) return cli_usage_error(NULL, "missing command (info, plan, check, sweep or pipeline)");
    if (strcmp(argv[1], "--version") == 0) {
        if (argc > 2) return cli_usage_error(NULL, "--version takes no arguments");
        printf("rockmate %s\n", rkm_version());
        return CLI_OK;
    }
    int c = 0;
    while (c < CMD_COUNT && strcmp(argv[1], cli_cmd_names[c]) != 0) c++;
    if (c == CMD_COUNT)
        return cli_usage_error(NULL, "unknown command '%s' (info, plan, check, sweep or pipeline)", argv[1]);
    o->cmd = (cli_cmd)c;
    const char *cmd = cli_cmd_names[c];
    int n_operands = 0, options_done = 0;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp(arg, "--") == 0) {
            options_done = 1;
        } else if (!options_done && arg[0] == '-' && arg[1]) {
            int rc = cli_take_option(o, argc, argv, &i);
            if (rc >= 0) return rc;
        } else if (n_operands < 2 && cli_cmd_operands[c][n_operands]) {
            o->operand[n_operands++] = arg;
        } else {
            return cli_usage_error(cmd, "unexpected argument '%s'", arg);
        }
    }
    if (n_operands < 2 && cli_cmd_operands[c][n_operands])
        return cli_usage_error(cmd, "missing %s", cli_cmd_operands[c][n_operands]);
    return cli_convert_options(o);
}

/* ===========================================================================
 * Output helpers: errors, sizes, JSON
 * ========================================================================= */

/* "rockmate: PREFIX: the library's message" on one line; the exit status for r. */
static int cli_fail(const rkm_context *ctx, rkm_result r, const char *prefix)
{
    const char *msg = rkm_context_errmsg(ctx);
    fprintf(stderr, "rockmate: %s%s", prefix ? prefix : "", prefix ? ": " : "");
    if (!*msg) msg = rkm_result_string(r);
    for (; *msg; msg++) fputc(*msg == '\n' || *msg == '\r' ? ' ' : *msg, stderr);
    fputc('\n', stderr);
    return r == RKM_ERROR_BUDGET || r == RKM_ERROR_TIMEOUT ? CLI_BUDGET : CLI_INPUT;
}

/* An error the tool itself finds: one line, exit status 1. */
static int cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("rockmate: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_INPUT;
}

/* ===========================================================================
 * The progress bar
 * ========================================================================= */

/* Erase the bar, if one is on the line: before any other output. */
static void cli_bar_clear(cli_bar *b)
{
    if (!b || !b->shown) return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    b->shown = 0;
}

/* rkm_solve_desc.progress: "rockmate solve budget 3/12 [#####     ] 45% best +27.3%".
 * The library calls it at most about ten times a second. */
static int cli_bar_draw(void *user, const rkm_progress *p)
{
    cli_bar *b = user;
    enum { WIDTH = 20 };
    char bar[WIDTH + 1], best[32] = "";
    int fill = (int)(p->fraction * WIDTH + 0.5);
    for (int i = 0; i < WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = 0;
    if (p->best_time > 0 && p->baseline_time > 0)
        snprintf(best, sizeof best, " best +%.1f%%", 100.0 * (p->best_time / p->baseline_time - 1));
    fprintf(stderr, "\rrockmate: %s %s%s%s [%s] %3.0f%%%s\033[K", rkm_algo_name(p->algo), p->stage_name,
            b->label[0] ? " " : "", b->label, bar, 100.0 * p->fraction, best);
    fflush(stderr);
    b->shown = 1;
    return 0;
}

/* Whether to draw: stderr a terminal, no --json, no --no-progress. */
static void cli_bar_init(cli_bar *b, const cli_opts *o)
{
    memset(b, 0, sizeof *b);
    b->on = isatty(STDERR_FILENO) && !o->value[OPT_JSON] && !o->value[OPT_NO_PROGRESS];
}

/* "1.23 MiB": a size for people; exact byte counts are printed beside it. */
static const char *cli_size(char *buf, size_t size, uint64_t bytes)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, size, "%" PRIu64 " B", bytes);
        return buf;
    }
    double v = (double)bytes / 1024;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, u++;
    snprintf(buf, size, "%.2f %s", v, units[u]);
    return buf;
}

static double cli_percent(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }

/* A JSON writer with indentation, so that the output reads well and parses. */
typedef struct cli_json {
    FILE *f;
    int depth;
    int first; /* nothing written yet in the current object or array */
} cli_json;

static void cli_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p == '\t')
            fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Start a member (key) or an element (key NULL). */
static void cli_json_key(cli_json *j, const char *key)
{
    if (j->depth > 0) fprintf(j->f, "%s\n%*s", j->first ? "" : ",", 2 * j->depth, "");
    j->first = 0;
    if (key) {
        cli_json_string(j->f, key);
        fputs(": ", j->f);
    }
}

static void cli_json_open(cli_json *j, const char *key, char bracket)
{
    cli_json_key(j, key);
    fputc(bracket, j->f);
    j->depth++;
    j->first = 1;
}

static void cli_json_close(cli_json *j, char bracket)
{
    j->depth--;
    if (!j->first) fprintf(j->f, "\n%*s", 2 * j->depth, "");
    fputc(bracket, j->f);
    j->first = 0;
    if (j->depth == 0) fputc('\n', j->f);
}

static void cli_json_u64(cli_json *j, const char *key, uint64_t v)
{
    cli_json_key(j, key);
    fprintf(j->f, "%" PRIu64, v);
}

static void cli_json_i64(cli_json *j, const char *key, int64_t v)
{
    cli_json_key(j, key);
    fprintf(j->f, "%" PRId64, v);
}

/* Non-finite numbers have no JSON form: null. */
static void cli_json_num(cli_json *j, const char *key, double v)
{
    cli_json_key(j, key);
    if (isfinite(v))
        fprintf(j->f, "%.9g", v);
    else
        fputs("null", j->f);
}

static void cli_json_str(cli_json *j, const char *key, const char *s)
{
    cli_json_key(j, key);
    if (s)
        cli_json_string(j->f, s);
    else
        fputs("null", j->f);
}

static void cli_json_bool(cli_json *j, const char *key, int v)
{
    cli_json_key(j, key);
    fputs(v ? "true" : "false", j->f);
}

static void cli_json_null(cli_json *j, const char *key)
{
    cli_json_key(j, key);
    fputs("null", j->f);
}

/* ===========================================================================
 * Graphs, planners, plan figures
 * ========================================================================= */

typedef struct cli_graph {
    const char *path;
    char name[128]; /* file name without folder and .rkg: chart titles */
    rkm_graph *g;
    rkm_graph_stats st;
    uint64_t alignment;      /* --align */
    uint64_t baseline_arena; /* at that alignment: the 100 % of a percent budget */
} cli_graph;

static void cli_graph_name(const char *path, char *buf, size_t size)
{
    const char *base = path;
    for (const char *p = path; *p; p++)
        if (*p == '/' || *p == '\\') base = p + 1;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".rkg") == 0) n -= 4;
    if (n >= size) n = size - 1;
    memcpy(buf, base, n);
    buf[n] = 0;
}

/* All of standard input, NUL-terminated (malloc'd); NULL on failure. */
static char *cli_read_stdin(size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
        if (n == cap) {
            char *nb = cap < SIZE_MAX / 4 ? realloc(buf, 2 * cap + 1) : NULL;
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(stdin)) {
        free(buf);
        return NULL;
    }
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* A graph from a file, or from standard input for "-". */
static rkm_result cli_graph_read(rkm_context *ctx, const char *path, rkm_graph **g)
{
    if (strcmp(path, "-") != 0) return rkm_graph_read_file(ctx, path, g);
    size_t len;
    char *text = cli_read_stdin(&len);
    if (!text) return rkm_context_fail(ctx, RKM_ERROR_IO, "<stdin>: cannot read: %s", strerror(errno));
    rkm_result r = rkm_graph_read_string(ctx, text, len, "<stdin>", g);
    free(text);
    return r;
}

static int cli_graph_load(rkm_context *ctx, const char *path, const cli_opts *o, cli_graph *G)
{
    memset(G, 0, sizeof *G);
    G->path = path;
    G->alignment = o->alignment;
    cli_graph_name(path, G->name, sizeof G->name);
    rkm_result r = cli_graph_read(ctx, path, &G->g);
    if (r) return cli_fail(ctx, r, NULL);
    if (o->value[OPT_COPY]) { /* the graph with --copy's link (or none) in place of its own */
        rkm_graph *with;
        r = rkm_graph_with_copy(G->g, &o->copy, &with);
        rkm_graph_destroy(G->g);
        G->g = with;
        if (r) return cli_fail(ctx, r, path);
    }
    r = rkm_graph_stats_get(G->g, &G->st);
    if (!r) r = rkm_graph_baseline_arena(G->g, o->alignment, &G->baseline_arena);
    if (r) return cli_fail(ctx, r, path);
    return CLI_OK;
}

/* Budgets are parsed against the baseline's arena at --align; bad text is
 * usage. */
static int cli_budget(const cli_graph *G, const char *text, const char *cmd, uint64_t *out)
{
    if (rkm_parse_budget(G->g, text, G->alignment, out) != RKM_OK)
        return cli_usage_error(cmd, "--budget wants bytes (optionally with B, KiB/MiB/GiB or KB/MB/GB) or N%% (of the "
                               "baseline's arena), not '%s'", text);
    /* A bare number is bytes; a small one is almost surely a forgotten %. */
    size_t n = strlen(text);
    if (n && isdigit((unsigned char)text[n - 1]) && *out < CLI_BARE_BUDGET_MIN)
        return cli_usage_error(cmd,
                               "--budget '%s' is %" PRIu64 " bytes, below 4 KiB: write '%s%%' for a share of the "
                               "baseline's arena, or '%sB' if bytes are meant",
                               text, *out, text, text);
    return CLI_OK;
}

/* One algorithm's planner (`none` too: its plan is the baseline, where the
 * baseline's arena fits the budget). */
typedef struct cli_planner {
    const cli_graph *G;
    rkm_algo algo;
    rkm_planner *pl;
    cli_bar *bar;    /* erased after every planner call */
} cli_planner;

/* The planner options of the command line (and the progress bar). */
static void cli_solve_desc(const cli_opts *o, rkm_algo algo, rkm_solve_desc *d)
{
    memset(d, 0, sizeof *d);
    d->algo = algo;
    d->slots = o->slots;
    d->time_limit = o->time_limit;
    d->ilp_time_limit = o->ilp_time_limit;
    d->nest_ops = o->nest_ops;
    d->alignment = o->alignment;
    if (o->bar && o->bar->on) {
        d->progress = cli_bar_draw;
        d->progress_user = o->bar;
    }
}

static rkm_result cli_planner_open(const cli_graph *G, rkm_algo algo, const cli_opts *o, cli_planner *cp)
{
    cp->G = G;
    cp->algo = algo;
    cp->pl = NULL;
    rkm_solve_desc d;
    cli_solve_desc(o, algo, &d);
    cp->bar = o->bar;
    rkm_result r = rkm_planner_create(G->g, &d, &cp->pl);
    cli_bar_clear(cp->bar);
    return r;
}

static void cli_planner_close(cli_planner *cp)
{
    rkm_planner_destroy(cp->pl);
    cp->pl = NULL;
}

static rkm_result cli_planner_min(cli_planner *cp, uint64_t *out)
{
    rkm_result r = rkm_planner_min_budget(cp->pl, out);
    cli_bar_clear(cp->bar);
    return r;
}

/* A plan for the budget, and the planner's counters once it made it. */
static rkm_result cli_planner_solve(cli_planner *cp, uint64_t budget, rkm_plan **out, rkm_planner_stats *pls)
{
    *out = NULL;
    memset(pls, 0, sizeof *pls);
    rkm_result r = rkm_planner_solve(cp->pl, budget, out);
    cli_bar_clear(cp->bar);
    rkm_result e = rkm_planner_stats_get(cp->pl, pls); /* the call's work, plan or not */
    return r ? r : e;
}

/* Why plan found no plan (exit status 3, or 1 for another error on the
 * way): the error, its one line for stderr (without "rockmate: "), and
 * the smallest budget where the planner gave it. */
typedef struct cli_nofit {
    rkm_result error;
    int has_min;
    uint64_t min;
    char message[2048];
} cli_nofit;

/* Names of the results for JSON, in rkm_result's order. */
static const char *const cli_result_names[] = {"ok",     "nomem",   "argument",    "state",    "io",
                                               "parse",  "graph",   "plan",        "budget",   "callback",
                                               "solver", "timeout", "unsupported", "internal",
                                               "cancelled"};
_Static_assert(sizeof cli_result_names / sizeof *cli_result_names == RKM_RESULT_COUNT, "a name per rkm_result");

/* The line cli_fail prints, into nf->message. */
static void cli_nofit_fail(const rkm_context *ctx, rkm_result r, const char *prefix, cli_nofit *nf)
{
    const char *msg = rkm_context_errmsg(ctx);
    if (!*msg) msg = rkm_result_string(r);
    nf->error = r;
    snprintf(nf->message, sizeof nf->message, "%s%s%s", prefix ? prefix : "", prefix ? ": " : "", msg);
    for (char *c = nf->message; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
}

/* e, the planner's RKM_ERROR_BUDGET or RKM_ERROR_TIMEOUT, into nf: for a
 * budget, "no rotor plan fits in ...; the smallest budget rotor can meet
 * is ..."; the exit status. */
static int cli_budget_fail(rkm_context *ctx, cli_planner *cp, rkm_result e, uint64_t budget, cli_nofit *nf)
{
    const char *name = rkm_algo_name(cp->algo);
    uint64_t peak = cp->G->st.baseline_peak, min;
    char a[32], b[32];
    memset(nf, 0, sizeof *nf);
    rkm_result r = e == RKM_ERROR_BUDGET ? cli_planner_min(cp, &min) : e;
    if (r) {
        cli_nofit_fail(ctx, r, cp->G->path, nf);
    } else {
        nf->error = e;
        nf->has_min = 1;
        nf->min = min;
        snprintf(nf->message, sizeof nf->message,
                 "no %s plan fits in %s (%" PRIu64 " bytes, %.1f%% of the baseline peak); "
                 "the smallest budget %s can meet is %s (%" PRIu64 " bytes, %.1f%%)",
                 name, cli_size(a, sizeof a, budget), budget, cli_percent((double)budget, (double)peak), name,
                 cli_size(b, sizeof b, min), min, cli_percent((double)min, (double)peak));
    }
    fprintf(stderr, "rockmate: %s\n", nf->message);
    return nf->error == RKM_ERROR_BUDGET || nf->error == RKM_ERROR_TIMEOUT ? CLI_BUDGET : CLI_INPUT;
}

/* What the tool reports about one plan. */
typedef struct cli_result {
    int has_algo, has_budget;
    rkm_algo algo;
    uint64_t budget;
    rkm_plan *plan;        /* NULL for a plan file the library refused (check) */
    rkm_sim_result sim;    /* a refused plan's figures, up to the failure */
    char message[512];     /* why it was refused */
    rkm_plan_stats ps;     /* a plan's own figures */
    rkm_planner_stats pls; /* the planner's counters once it made the plan; zero without one */
    uint64_t alignment;    /* of the layout below */
    uint64_t aligned_peak; /* the most bytes live in a step, each buffer rounded up to the alignment */
    uint64_t arena;        /* the plan's one-allocation layout at that alignment */
    size_t n_buffers;
} cli_result;

/* The most bytes of buffers b[0..n) live in one step, each rounded up to
 * align; an in-place chain (takes_over) is one buffer over its lifetime. */
static uint64_t cli_aligned_peak(const rkm_buffer *b, size_t n, size_t n_steps, uint64_t align)
{
    size_t *head = malloc((n + 1) * sizeof *head);
    int64_t *last = malloc((n + 1) * sizeof *last);
    uint64_t *d = calloc(n_steps + 3, sizeof *d), live = 0, most = 0; /* steps -1 .. n_steps, shifted by one */
    if (head && last && d) {
        for (size_t i = 0; i < n; i++) {
            head[i] = b[i].takes_over >= 0 ? head[b[i].takes_over] : i;
            last[i] = b[i].last_step;
            if (last[i] > last[head[i]]) last[head[i]] = last[i];
        }
        for (size_t i = 0; i < n; i++) {
            if (head[i] != i) continue;
            uint64_t size = (b[i].bytes + align - 1) & ~(align - 1);
            d[b[i].first_step + 1] += size;
            d[last[i] + 2] -= size;
        }
        for (size_t s = 0; s < n_steps + 2; s++) {
            live += d[s];
            if (live > most) most = live;
        }
    }
    free(head);
    free(last);
    free(d);
    return most;
}

/* Gather a plan's figures and its layout at the tool's alignment (the plan
 * stays owned by the caller): the plan's own where the alignments agree,
 * and where align is 0 (check without --align: the file's). */
static rkm_result cli_result_fill(const cli_graph *G, rkm_plan *plan, uint64_t align, cli_result *r)
{
    r->plan = plan;
    rkm_result e = rkm_plan_stats_get(plan, &r->ps);
    if (e) return e;
    if (!align) align = r->ps.alignment ? r->ps.alignment : RKM_ARENA_ALIGN;
    r->n_buffers = rkm_plan_num_buffers(plan);
    r->alignment = align;
    r->aligned_peak = r->ps.aligned_peak;
    r->arena = r->ps.arena_bytes;
    if (align == r->ps.alignment) return RKM_OK;
    rkm_buffer *buffers = malloc((r->n_buffers ? r->n_buffers : 1) * sizeof *buffers);
    if (!buffers) return rkm_context_fail(rkm_graph_context(G->g), RKM_ERROR_NOMEM, "out of memory");
    e = rkm_plan_layout(plan, align, buffers, &r->arena);
    if (!e) r->aligned_peak = cli_aligned_peak(buffers, r->n_buffers, rkm_plan_num_steps(plan), align);
    free(buffers);
    return e;
}

static void cli_json_ilp(cli_json *j, const rkm_planner_stats *pls)
{
    cli_json_open(j, "ilp", '{');
    cli_json_i64(j, "solves", pls->ilp_solves);
    cli_json_i64(j, "optimal", pls->ilp_optimal);
    cli_json_i64(j, "suboptimal", pls->ilp_suboptimal);
    cli_json_i64(j, "infeasible", pls->ilp_infeasible);
    cli_json_i64(j, "timeout", pls->ilp_timeout);
    cli_json_i64(j, "failed", pls->ilp_failed);
    cli_json_i64(j, "skipped", pls->ilp_skipped);
    cli_json_num(j, "seconds", pls->ilp_seconds);
    cli_json_close(j, '}');
}

/* The solve's work and its limit (rkm_planner_stats); null where no
 * planner made the plan (check). */
static void cli_json_work(cli_json *j, const rkm_planner_stats *pls)
{
    if (pls->work_limit) {
        cli_json_u64(j, "work", pls->work);
        cli_json_u64(j, "work_limit", pls->work_limit);
    } else {
        cli_json_null(j, "work");
        cli_json_null(j, "work_limit");
    }
}

/* A plan's steps and recomputed forwards, refused or not. */
static size_t cli_steps(const cli_result *r) { return r->plan ? rkm_plan_num_steps(r->plan) : r->sim.num_steps; }
static size_t cli_recomputes(const cli_result *r) { return r->plan ? r->ps.recomputes : r->sim.recomputes; }

/* The members of a plan object (plan, check and sweep share them). */
/* A stage graph's plan (its output's gradient comes from the next stage):
 * its two phases and what a micro-batch keeps between them; 0 otherwise. */
static int cli_plan_phases(const cli_graph *G, const rkm_plan *p, int64_t *at, rkm_stage_memory *sm)
{
    if (!p || rkm_graph_output(G->g) < 0) return 0;
    *at = rkm_plan_phase_step(p);
    return rkm_plan_stage_memory(p, RKM_PIPE_GPIPE, 0, 1, 1, 0, sm) == RKM_OK;
}

static void cli_json_plan_members(cli_json *j, const cli_graph *G, const cli_result *r)
{
    int valid = r->plan != NULL;
    int64_t at;
    rkm_stage_memory sm;
    if (cli_plan_phases(G, r->plan, &at, &sm)) { /* a stage's: the phases, docs/formats.md */
        cli_json_i64(j, "phase_step", at);
        cli_json_u64(j, "kept_bytes", sm.kept_bytes);
        cli_json_u64(j, "forward_peak", sm.fwd_peak);
        cli_json_u64(j, "backward_peak", sm.bwd_peak);
    }
    cli_json_str(j, "graph", G->path);
    cli_json_str(j, "algo", r->has_algo ? rkm_algo_name(r->algo) : NULL);
    if (r->has_budget)
        cli_json_u64(j, "budget", r->budget);
    else
        cli_json_null(j, "budget");
    if (valid) {
        cli_json_u64(j, "peak", r->ps.peak);
        cli_json_num(j, "time", r->ps.time);
    } else {
        cli_json_null(j, "peak");
        cli_json_null(j, "time");
    }
    cli_json_u64(j, "baseline_peak", G->st.baseline_peak);
    cli_json_u64(j, "baseline_arena", G->baseline_arena);
    cli_json_num(j, "baseline_time", G->st.baseline_time);
    if (valid && G->st.baseline_time > 0)
        cli_json_num(j, "overhead", r->ps.overhead);
    else
        cli_json_null(j, "overhead");
    cli_json_num(j, "peak_percent", valid ? cli_percent((double)r->ps.peak, (double)G->st.baseline_peak) : NAN);
    cli_json_num(j, "solve_seconds", r->ps.solve_seconds);
    cli_json_i64(j, "cut", valid ? r->ps.cut : 0);
    cli_json_work(j, &r->pls);
    cli_json_i64(j, "blocks", G->st.blocks);
    cli_json_i64(j, "block_classes", G->st.block_classes);
    cli_json_i64(j, "options", r->pls.options);
    cli_json_i64(j, "nested_classes", r->pls.nested_classes);
    cli_json_u64(j, "steps", cli_steps(r));
    cli_json_u64(j, "recomputes", cli_recomputes(r));
    if (valid) {
        cli_json_u64(j, "aligned_peak", r->aligned_peak);
        cli_json_u64(j, "arena_bytes", r->arena);
        cli_json_u64(j, "arena_alignment", r->alignment);
        cli_json_u64(j, "buffers", r->n_buffers);
    }
    if (valid && r->ps.offloads) {
        cli_json_u64(j, "offloads", r->ps.offloads);
        cli_json_u64(j, "host_peak", r->ps.host_peak);
        cli_json_num(j, "wait_seconds", r->ps.wait_seconds);
        cli_json_num(j, "d2h_seconds", r->ps.d2h_seconds);
        cli_json_num(j, "h2d_seconds", r->ps.h2d_seconds);
    }
    cli_json_ilp(j, &r->pls);
    if (r->has_algo && r->algo == RKM_ALGO_CHECKMATE) cli_json_num(j, "gap", r->ps.gap);
}

/* ===========================================================================
 * SVG charts
 * ========================================================================= */

/* Okabe-Ito colours (readable by colour-blind readers), one per algorithm
 * (the tool never plans with RKM_ALGO_DEFAULT). */
static const char *const cli_algo_color[RKM_ALGO_COUNT] = {
    [RKM_ALGO_ROCKMATE] = "#0072B2", [RKM_ALGO_ROTOR] = "#D55E00", [RKM_ALGO_SQRT] = "#009E73",
    [RKM_ALGO_CHECKMATE] = "#CC79A7", [RKM_ALGO_NONE] = "#555555", [RKM_ALGO_DTR] = "#E69F00",
    [RKM_ALGO_FULL] = "#56B4E9"};
enum { MARK_CIRCLE, MARK_SQUARE, MARK_TRIANGLE, MARK_DIAMOND, MARK_CROSS, MARK_NONE };

typedef struct cli_axis {
    double lo, hi, step;
    int decimals;
    int log;      /* 1: positions by log10(v + shift), ticks at 1, 2, 5 x 10^k */
    double shift; /* > 0 on a log axis, so that v = 0 has a place */
} cli_axis;

/* Round [lo, hi] out to ticks of 1, 2, 2.5 or 5 times a power of ten: the
 * finest step that gives at most want + 1 intervals. */
static void cli_axis_nice(cli_axis *a, double lo, double hi, int want)
{
    static const double mult[] = {1, 2, 2.5, 5, 10, 20};
    if (!(hi > lo)) hi = lo + (lo != 0 ? fabs(lo) : 1.0);
    double mag = pow(10, floor(log10((hi - lo) / want)));
    for (int k = 0; k < 6; k++) {
        a->step = mult[k] * mag;
        a->lo = floor(lo / a->step + 1e-9) * a->step;
        a->hi = ceil(hi / a->step - 1e-9) * a->step;
        if ((a->hi - a->lo) / a->step <= want + 1 + 1e-9) break;
    }
    a->decimals = 0;
    while (a->decimals < 6) {
        double s = a->step * pow(10, a->decimals);
        if (fabs(s - floor(s + 0.5)) < 1e-6 * s) break;
        a->decimals++;
    }
}

/* A log axis over [lo, hi]: hi rounded up to a tick of 1, 2 or 5 x 10^k. */
static void cli_axis_log(cli_axis *a, double lo, double hi, double shift)
{
    if (!(hi > lo)) hi = lo + 1;
    double p = pow(10, floor(log10(hi)));
    a->hi = hi <= p ? p : hi <= 2 * p ? 2 * p : hi <= 5 * p ? 5 * p : 10 * p;
    a->lo = lo;
    a->log = 1;
    a->shift = shift;
    a->step = 0;
    a->decimals = 0;
}

/* The tick values of an axis, at most max of them. */
static int cli_axis_ticks(const cli_axis *a, double *t, int max)
{
    int n = 0;
    if (!a->log) {
        for (double v = a->lo; v <= a->hi + a->step * 1e-6 && n < max; v += a->step) t[n++] = v;
        return n;
    }
    t[n++] = a->lo;
    for (double p = pow(10, floor(log10(a->shift))); p <= a->hi * (1 + 1e-9) && n < max; p *= 10)
        for (int m = 1; m <= 5 && n < max; m += m == 1 ? 1 : 3) /* 1, 2, 5 */
            if (p * m > a->lo && p * m >= a->shift * (1 - 1e-9) && p * m <= a->hi * (1 + 1e-9)) t[n++] = p * m;
    return n;
}

typedef struct cli_chart {
    FILE *f;
    double x0, y0, w, h; /* plot area, pixels, y0 at the top */
    cli_axis x, y;
} cli_chart;

static double cli_sx(const cli_chart *c, double v) { return c->x0 + c->w * (v - c->x.lo) / (c->x.hi - c->x.lo); }
static double cli_axis_pos(const cli_axis *a, double v) { return a->log ? log10(v + a->shift) : v; }
static double cli_sy(const cli_chart *c, double v)
{
    double lo = cli_axis_pos(&c->y, c->y.lo), hi = cli_axis_pos(&c->y, c->y.hi);
    return c->y0 + c->h * (1 - (cli_axis_pos(&c->y, v) - lo) / (hi - lo));
}

static void cli_svg_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '"')
            fputs("&quot;", f);
        else
            fputc(*s, f);
    }
}

/* Text at (x, y); extra holds attributes such as a size or an anchor. */
static void cli_svg_text(FILE *f, double x, double y, const char *extra, const char *text)
{
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" %s>", x, y, extra);
    cli_svg_escaped(f, text);
    fputs("</text>\n", f);
}

static void cli_svg_begin(FILE *f, int width, int height)
{
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"14\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            width, height, width, height);
}

static void cli_svg_titles(FILE *f, double x, const char *title, const char *subtitle)
{
    cli_svg_text(f, x, 24, "font-size=\"18\" font-weight=\"bold\"", title);
    if (subtitle) cli_svg_text(f, x, 45, "font-size=\"14\" fill=\"#444444\"", subtitle);
}

/* Grid lines, frame, tick labels and axis titles. */
static void cli_chart_axes(const cli_chart *c, const char *xlabel, const char *ylabel)
{
    FILE *f = c->f;
    char label[64];
    double xt[64], yt[64];
    int nx = cli_axis_ticks(&c->x, xt, 64), ny = cli_axis_ticks(&c->y, yt, 64);
    fputs("<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n", f);
    for (int i = 0; i < nx; i++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", cli_sx(c, xt[i]), c->y0,
                cli_sx(c, xt[i]), c->y0 + c->h);
    for (int i = 0; i < ny; i++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", c->x0, cli_sy(c, yt[i]), c->x0 + c->w,
                cli_sy(c, yt[i]));
    fputs("</g>\n", f);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333333\"/>\n", c->x0,
            c->y0, c->w, c->h);
    for (int i = 0; i < nx; i++) {
        snprintf(label, sizeof label, "%.*f", c->x.decimals, xt[i]);
        cli_svg_text(f, cli_sx(c, xt[i]), c->y0 + c->h + 18, "text-anchor=\"middle\"", label);
    }
    for (int i = 0; i < ny; i++) {
        if (c->y.log)
            snprintf(label, sizeof label, "%g", yt[i]);
        else
            snprintf(label, sizeof label, "%.*f", c->y.decimals, yt[i]);
        cli_svg_text(f, c->x0 - 6, cli_sy(c, yt[i]) + 4, "text-anchor=\"end\"", label);
    }
    cli_svg_text(f, c->x0 + c->w / 2, c->y0 + c->h + 38, "text-anchor=\"middle\" font-size=\"15\"", xlabel);
    char rot[96];
    double ly = c->y0 + c->h / 2, lx = c->x0 - 52;
    snprintf(rot, sizeof rot, "text-anchor=\"middle\" font-size=\"15\" transform=\"rotate(-90 %.1f %.1f)\"", lx, ly);
    cli_svg_text(f, lx, ly, rot, ylabel);
}

static void cli_svg_marker(FILE *f, int mark, double x, double y, const char *color)
{
    switch (mark) {
    case MARK_CIRCLE: fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", x, y, color); break;
    case MARK_SQUARE:
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"7\" height=\"7\" fill=\"%s\"/>\n", x - 3.5, y - 3.5, color);
        break;
    case MARK_TRIANGLE:
        fprintf(f, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"/>\n", x, y - 4.5, x + 4.2, y + 3, x - 4.2,
                y + 3, color);
        break;
    case MARK_DIAMOND:
        fprintf(f, "<path d=\"M%.1f %.1fL%.1f %.1fL%.1f %.1fL%.1f %.1fZ\" fill=\"%s\"/>\n", x, y - 4.5, x + 4.5, y, x,
                y + 4.5, x - 4.5, y, color);
        break;
    case MARK_CROSS:
        fprintf(f, "<path d=\"M%.1f %.1fL%.1f %.1fM%.1f %.1fL%.1f %.1f\" stroke=\"%s\" stroke-width=\"1.8\"/>\n", x - 4,
                y - 4, x + 4, y + 4, x - 4, y + 4, x + 4, y - 4, color);
        break;
    default: break;
    }
}

typedef struct cli_legend_item {
    const char *label, *color, *dash; /* dash: NULL for a solid line */
    double width, opacity;
    int mark;
} cli_legend_item;

/* A legend column to the right of the plot area. */
static void cli_svg_legend(FILE *f, double x, double y, const cli_legend_item *items, int n)
{
    for (int i = 0; i < n; i++) {
        const cli_legend_item *it = &items[i];
        double ly = y + 20.0 * i;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"%.1f\" "
                "stroke-opacity=\"%.2f\"%s%s%s/>\n",
                x, ly, x + 26, ly, it->color, it->width, it->opacity, it->dash ? " stroke-dasharray=\"" : "",
                it->dash ? it->dash : "", it->dash ? "\"" : "");
        cli_svg_marker(f, it->mark, x + 13, ly, it->color);
        cli_svg_text(f, x + 34, ly + 4, "", it->label);
    }
}

/* The unit that keeps memory tick labels short. */
static void cli_mem_unit(uint64_t max, double *scale, const char **name)
{
    static const char *const names[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    *scale = 1;
    while (u < 4 && (double)max / *scale >= 1024 * 1.5) *scale *= 1024, u++;
    *name = names[u];
}

/* One memory curve over a plan: live memory after each step and each
 * step's peak (the plan's own arrays). */
typedef struct cli_series {
    size_t n;
    const uint64_t *live, *peak;
    uint64_t max;
} cli_series;

static rkm_result cli_series_make(const rkm_plan *plan, cli_series *s)
{
    rkm_plan_stats ps;
    rkm_result r = rkm_plan_stats_get(plan, &ps);
    s->n = rkm_plan_num_steps(plan);
    s->live = rkm_plan_mem_after(plan);
    s->peak = rkm_plan_step_peaks(plan);
    s->max = ps.peak;
    return r;
}

/* A step function over x = fraction of the step sequence, with runs of equal
 * values merged so that long plans stay small. */
static void cli_svg_steps(const cli_chart *c, const uint64_t *v, size_t n, double scale, const char *attrs)
{
    if (!n) return;
    fprintf(c->f, "<polyline fill=\"none\" %s points=\"", attrs);
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && v[i] == v[i - 1]) continue;
        double x = cli_sx(c, 100.0 * (double)i / (double)n);
        if (i > 0) fprintf(c->f, "%.2f,%.2f ", x, cli_sy(c, (double)v[i - 1] / scale));
        fprintf(c->f, "%.2f,%.2f ", x, cli_sy(c, (double)v[i] / scale));
    }
    fprintf(c->f, "%.2f,%.2f\"/>\n", cli_sx(c, 100.0), cli_sy(c, (double)v[n - 1] / scale));
}

static int cli_svg_close(FILE *f, const char *path)
{
    fputs("</svg>\n", f);
    int bad = ferror(f), err = errno;
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "rockmate: %s: could not write the SVG file: %s\n", path, strerror(bad ? err : errno));
        return CLI_INPUT;
    }
    return CLI_OK;
}

static FILE *cli_svg_open(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "rockmate: %s: cannot open for writing: %s\n", path, strerror(errno));
    return f;
}

enum { SVG_W = 880, SVG_H = 436, SVG_LEFT = 78, SVG_TOP = 62, SVG_PLOT_W = 580, SVG_PLOT_H = 320 };

/* Draw one plan's two curves (step peaks light, live memory solid) and fill
 * their two legend entries. */
static void cli_plan_svg_series(const cli_chart *c, const cli_series *s, double scale, const char *color,
                                const char *who, char labels[2][96], cli_legend_item items[2])
{
    char attrs[128];
    snprintf(attrs, sizeof attrs, "stroke=\"%s\" stroke-width=\"1\" stroke-opacity=\"0.45\"", color);
    cli_svg_steps(c, s->peak, s->n, scale, attrs);
    snprintf(attrs, sizeof attrs, "stroke=\"%s\" stroke-width=\"1.6\"", color);
    cli_svg_steps(c, s->live, s->n, scale, attrs);
    snprintf(labels[0], sizeof labels[0], "%s: live memory", who);
    snprintf(labels[1], sizeof labels[1], "%s: step peaks", who);
    items[0] = (cli_legend_item){labels[0], color, NULL, 1.6, 1, MARK_NONE};
    items[1] = (cli_legend_item){labels[1], color, NULL, 1, 0.45, MARK_NONE};
}

/* The copies in flight, two bands along the plot's floor (offloads, then
 * prefetches): a bar from each copy step to the wait that ends it. Their
 * legend entries go into items; returns how many (0 without copies). */
static int cli_plan_svg_copies(const cli_chart *c, const rkm_plan *plan, cli_legend_item *items)
{
    static const char *const color[2] = {"#009E73", "#CC79A7"};
    const rkm_step *st = rkm_plan_steps(plan);
    size_t n = rkm_plan_num_steps(plan);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        int k = st[i].kind == RKM_STEP_OFFLOAD ? 0 : st[i].kind == RKM_STEP_PREFETCH ? 1 : -1;
        size_t w = i + 1;
        if (k < 0) continue;
        while (w < n && !(st[w].kind == RKM_STEP_WAIT && st[w].index == st[i].index && st[w].save == st[i].save))
            w++;
        fprintf(c->f,
                "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"5\" fill=\"%s\" fill-opacity=\"0.6\"/>\n",
                cli_sx(c, 100.0 * (double)i / (double)n), c->y0 + c->h - (k ? 7 : 14),
                cli_sx(c, 100.0 * (double)w / (double)n) - cli_sx(c, 100.0 * (double)i / (double)n), color[k]);
        seen |= 1 << k;
    }
    if (!seen) return 0;
    items[0] = (cli_legend_item){"offloads in flight", color[0], NULL, 5, 0.6, MARK_NONE};
    items[1] = (cli_legend_item){"prefetches in flight", color[1], NULL, 5, 0.6, MARK_NONE};
    return 2;
}

/* The plan's memory over its steps beside the baseline's (x: position in
 * each step sequence, so both span the same width), and the budget. */
static int cli_plan_svg(const char *path, const cli_graph *G, const cli_result *r, const cli_series *plan,
                        const cli_series *base, int log_axis)
{
    int is_base = r->algo == RKM_ALGO_NONE; /* the plan is the baseline: one series */
    uint64_t top = plan->max > base->max ? plan->max : base->max;
    if (r->budget > top && r->budget <= top + top / 4) top = r->budget;
    if (r->arena > top && r->arena <= top + top / 4) top = r->arena;
    double scale;
    const char *unit, *algo = rkm_algo_name(r->algo);
    cli_mem_unit(top, &scale, &unit);
    FILE *f = cli_svg_open(path);
    if (!f) return CLI_INPUT;
    cli_chart c = {f, SVG_LEFT, SVG_TOP, SVG_PLOT_W, SVG_PLOT_H, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}};
    cli_axis_nice(&c.x, 0, 100, 5);
    if (log_axis) /* a thousandth of the top: the plan's low steps stay apart */
        cli_axis_log(&c.y, 0, (double)top / scale, (double)top / scale / 1000);
    else
        cli_axis_nice(&c.y, 0, (double)top / scale, 6);
    char title[256], sub[256], ylabel[64], a[32], b[32], labels[4][96];
    if (is_base)
        snprintf(title, sizeof title, "%s: activation memory, baseline plan", G->name);
    else
        snprintf(title, sizeof title, "%s: activation memory, %s plan and baseline", G->name, algo);
    char c3[32];
    snprintf(sub, sizeof sub, "budget %s (%.1f%% of baseline arena), peak %s, arena %s, overhead %.2f%%",
             cli_size(a, sizeof a, r->budget), cli_percent((double)r->budget, (double)G->baseline_arena),
             cli_size(b, sizeof b, r->ps.peak), cli_size(c3, sizeof c3, r->arena),
             100 * (r->ps.time / G->st.baseline_time - 1));
    if (r->ps.offloads) {
        size_t len = strlen(sub);
        snprintf(sub + len, sizeof sub - len, ", %zu offloads, host peak %s", r->ps.offloads,
                 cli_size(a, sizeof a, r->ps.host_peak));
    }
    snprintf(ylabel, sizeof ylabel, "memory (%s)", unit);
    cli_svg_begin(f, SVG_W, SVG_H);
    cli_svg_titles(f, SVG_LEFT, title, sub);
    cli_chart_axes(&c, "position in the step sequence (%)", ylabel);
    cli_legend_item items[8];
    int n = is_base ? 2 : 4;
    if (!is_base) cli_plan_svg_series(&c, base, scale, "#999999", "baseline", labels + 2, items + 2);
    cli_plan_svg_series(&c, plan, scale, is_base ? "#555555" : cli_algo_color[r->algo], is_base ? "baseline" : algo,
                        labels, items);
    static const struct { const char *label, *color, *dash; } lines[2] = {{"budget", "#111111", "7 4"},
                                                                          {"arena", "#D55E00", "2 3"}};
    uint64_t at[2] = {r->budget, r->arena};
    for (int k = 0; k < 2; k++) { /* the budget, and the arena a host allocates for the plan */
        if ((double)at[k] / scale > c.y.hi) continue;
        double y = cli_sy(&c, (double)at[k] / scale);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.2\" "
                "stroke-dasharray=\"%s\"/>\n",
                c.x0, y, c.x0 + c.w, y, lines[k].color, lines[k].dash);
        items[n++] = (cli_legend_item){lines[k].label, lines[k].color, lines[k].dash, 1.2, 1, MARK_NONE};
    }
    if (r->plan) n += cli_plan_svg_copies(&c, r->plan, items + n);
    cli_svg_legend(f, SVG_LEFT + SVG_PLOT_W + 22, SVG_TOP + 10, items, n);
    return cli_svg_close(f, path);
}

/* ===========================================================================
 * Commands
 * ========================================================================= */

static void cli_text_ilp(const cli_result *r)
{
    const rkm_planner_stats *pls = &r->pls;
    printf("  planning       %.3f s", r->ps.solve_seconds);
    if (pls->ilp_solves)
        printf("; ILP: %d solves (%d optimal, %d suboptimal, %d infeasible, %d timed out, %d failed) in %.3f s",
               (int)pls->ilp_solves, (int)pls->ilp_optimal, (int)pls->ilp_suboptimal, (int)pls->ilp_infeasible,
               (int)pls->ilp_timeout, (int)pls->ilp_failed, pls->ilp_seconds);
    if (pls->ilp_skipped)
        printf("; %d ILP solves skipped: the time limit or the ILP budget ran out, the plan may be worse",
               (int)pls->ilp_skipped);
    if (r->plan && r->ps.cut) printf("; cut by the time limit: the best plan found by then");
    printf("\n");
}

/* The readable summary of a valid plan. */
static void cli_text_plan(const cli_graph *G, const cli_result *r)
{
    char a[32], b[32], c[32];
    double bp = (double)G->st.baseline_peak;
    if (r->has_budget)
        printf("  budget         %-12s (%" PRIu64 " bytes, %.1f%% of the baseline's arena)\n",
               cli_size(a, sizeof a, r->budget), r->budget, cli_percent((double)r->budget, (double)G->baseline_arena));
    printf("  peak           %-12s (%" PRIu64 " bytes, %.1f%% of the baseline peak)\n",
           cli_size(a, sizeof a, r->ps.peak), r->ps.peak, cli_percent((double)r->ps.peak, bp));
    printf("  baseline peak  %-12s (%" PRIu64 " bytes)\n", cli_size(a, sizeof a, G->st.baseline_peak),
           G->st.baseline_peak);
    printf("  time           %.9g s (baseline %.9g s, overhead %.2f%%)\n", r->ps.time, G->st.baseline_time,
           100 * r->ps.overhead);
    printf("  aligned peak   %-12s (%" PRIu64 " bytes: each buffer rounded up to %" PRIu64 " bytes)\n",
           cli_size(a, sizeof a, r->aligned_peak), r->aligned_peak, r->alignment);
    printf("  arena          %-12s (%" PRIu64 " bytes, one allocation for %zu buffers: %s%s)\n",
           cli_size(a, sizeof a, r->arena), r->arena, r->n_buffers,
           r->arena == r->aligned_peak ? "the aligned peak" : "over the aligned peak",
           r->has_budget ? (r->arena <= r->budget ? ", within the budget" : ", over the budget") : "");
    printf("  steps          %zu (%zu recomputed forwards)\n", rkm_plan_num_steps(r->plan), r->ps.recomputes);
    int64_t at;
    rkm_stage_memory sm;
    if (cli_plan_phases(G, r->plan, &at, &sm))
        printf("  phases         a pipeline stage's: forward steps 0-%lld (peak %s), backward from step %lld (the loss "
               "step: the output's gradient arrives; peak %s); a micro-batch keeps %s (%" PRIu64 " bytes) between them\n",
               (long long)at - 1, cli_size(a, sizeof a, sm.fwd_peak), (long long)at,
               cli_size(b, sizeof b, sm.bwd_peak), cli_size(c, sizeof c, sm.kept_bytes), sm.kept_bytes);
    printf("  blocks         %d in %d classes", (int)G->st.blocks, (int)G->st.block_classes);
    if (r->pls.options) printf(", %d options", (int)r->pls.options);
    if (r->pls.nested_classes) printf(" (%d classes from nested planners)", (int)r->pls.nested_classes);
    printf("\n");
}

static int cli_write_stdout(void *user, const char *data, size_t len)
{
    (void)user;
    return fwrite(data, 1, len, stdout) != len;
}

static int cli_plan_outputs(rkm_context *ctx, const cli_opts *o, const cli_graph *G, cli_result *r)
{
    const char *out = o->value[OPT_OUTPUT];
    rkm_result e = RKM_OK;
    if (out)
        e = strcmp(out, "-") == 0 ? rkm_plan_write(r->plan, cli_write_stdout, NULL) : rkm_plan_write_file(r->plan, out);
    if (e) return cli_fail(ctx, e, NULL); /* the message names the file */
    if (!o->value[OPT_SVG]) return CLI_OK;
    cli_series ps, bs;
    rkm_plan *base = NULL;
    e = cli_series_make(r->plan, &ps);
    if (!e) e = rkm_plan_baseline(G->g, &base);
    if (!e) e = cli_series_make(base, &bs);
    int rc = e ? cli_fail(ctx, e, o->value[OPT_SVG]) : cli_plan_svg(o->value[OPT_SVG], G, r, &ps, &bs, o->value[OPT_LOG] != NULL);
    rkm_plan_destroy(base);
    return rc;
}

static int cmd_plan(rkm_context *ctx, const cli_opts *o)
{
    cli_graph G;
    cli_planner cp = {0};
    cli_result r;
    memset(&r, 0, sizeof r);
    int rc = cli_graph_load(ctx, o->operand[0], o, &G);
    if (!rc) rc = cli_budget(&G, o->value[OPT_BUDGET], "plan", &r.budget);
    rkm_result e = RKM_OK;
    if (!rc) e = cli_planner_open(&G, o->algos[0], o, &cp);
    if (!rc && !e) e = cli_planner_solve(&cp, r.budget, &r.plan, &r.pls);
    if (!rc && !e) e = cli_result_fill(&G, r.plan, o->alignment, &r);
    cli_nofit nf = {0};
    if (!rc && (e == RKM_ERROR_BUDGET || e == RKM_ERROR_TIMEOUT))
        rc = cli_budget_fail(ctx, &cp, e, r.budget, &nf);
    else if (!rc && e)
        rc = cli_fail(ctx, e, G.path);
    r.has_algo = r.has_budget = 1;
    r.algo = o->algos[0];
    if (!rc) rc = cli_plan_outputs(ctx, o, &G, &r);
    if (!rc && o->value[OPT_JSON]) {
        cli_json j = {stdout, 0, 1};
        cli_json_open(&j, NULL, '{');
        cli_json_plan_members(&j, &G, &r);
        cli_json_close(&j, '}');
    } else if (rc == CLI_BUDGET && nf.error && o->value[OPT_JSON]) {
        /* no plan: the error, the budget asked and the smallest that fits */
        cli_json j = {stdout, 0, 1};
        cli_json_open(&j, NULL, '{');
        cli_json_str(&j, "graph", G.path);
        cli_json_str(&j, "algo", rkm_algo_name(r.algo));
        cli_json_str(&j, "error", cli_result_names[nf.error]);
        cli_json_i64(&j, "error_id", (int64_t)nf.error);
        cli_json_str(&j, "message", nf.message);
        cli_json_u64(&j, "budget", r.budget);
        if (nf.has_min)
            cli_json_u64(&j, "min_budget", nf.min);
        else
            cli_json_null(&j, "min_budget");
        cli_json_u64(&j, "baseline_peak", G.st.baseline_peak);
        cli_json_work(&j, &r.pls);
        cli_json_close(&j, '}');
    } else if (!rc && !(o->value[OPT_OUTPUT] && strcmp(o->value[OPT_OUTPUT], "-") == 0)) {
        printf("%s: %s plan\n", G.path, rkm_algo_name(r.algo));
        cli_text_plan(&G, &r);
        cli_text_ilp(&r);
        if (o->value[OPT_OUTPUT]) printf("  plan file      %s\n", o->value[OPT_OUTPUT]);
        if (o->value[OPT_SVG]) printf("  chart          %s\n", o->value[OPT_SVG]);
    }
    rkm_plan_destroy(r.plan);
    cli_planner_close(&cp);
    rkm_graph_destroy(G.g);
    return rc;
}

/* Read the plan file (standard input for "-"): a plan the library
 * accepts, with its figures, or one it refuses (RKM_ERROR_PLAN: r->plan
 * NULL, r->sim and r->message say why). Anything else (unreadable, bad
 * syntax) is an error. */
static int cli_check_read(rkm_context *ctx, const cli_graph *G, const char *plan_path, uint64_t align, cli_result *r)
{
    rkm_result e;
    if (strcmp(plan_path, "-") != 0) {
        e = rkm_plan_read_file(G->g, plan_path, &r->sim, &r->plan);
    } else {
        size_t len;
        char *text = cli_read_stdin(&len);
        if (!text) return cli_error("<stdin>: cannot read: %s", strerror(errno));
        e = rkm_plan_read_string(G->g, text, len, "<stdin>", &r->sim, &r->plan);
        free(text);
    }
    if (e == RKM_ERROR_PLAN) {
        snprintf(r->message, sizeof r->message, "%s", rkm_context_errmsg(ctx));
        return CLI_OK;
    }
    if (e) return cli_fail(ctx, e, NULL);
    if ((e = cli_result_fill(G, r->plan, align, r)) != RKM_OK)
        return cli_fail(ctx, e, strcmp(plan_path, "-") == 0 ? "<stdin>" : plan_path);
    return CLI_OK;
}

static int cmd_check(rkm_context *ctx, const cli_opts *o)
{
    cli_graph G;
    cli_result r;
    memset(&r, 0, sizeof r);
    const char *plan_path = o->operand[1];
    const char *plan_name = strcmp(plan_path, "-") == 0 ? "<stdin>" : plan_path; /* for people */
    int rc = cli_graph_load(ctx, o->operand[0], o, &G);
    if (!rc && o->value[OPT_BUDGET]) {
        rc = cli_budget(&G, o->value[OPT_BUDGET], "check", &r.budget);
        r.has_budget = 1;
    }
    rc = rc ? rc : cli_check_read(ctx, &G, plan_path, o->value[OPT_ALIGN] ? o->alignment : 0, &r);
    if (rc) {
        rkm_plan_destroy(r.plan);
        rkm_graph_destroy(G.g);
        return rc;
    }
    /* the budget bounds the arena (which is >= the aligned peak >= the peak) */
    int valid = r.plan != NULL, fits = !r.has_budget || r.arena <= r.budget;
    char step[320] = "end of plan";
    if (!valid && r.sim.fail_step >= 0 && (size_t)r.sim.fail_step < r.sim.num_steps)
        rkm_step_text(G.g, &r.sim.failed, step, sizeof step);
    if (o->value[OPT_JSON]) {
        cli_json j = {stdout, 0, 1};
        cli_json_open(&j, NULL, '{');
        cli_json_str(&j, "plan", plan_path);
        cli_json_plan_members(&j, &G, &r);
        cli_json_bool(&j, "valid", valid);
        if (r.has_budget && valid) cli_json_bool(&j, "fits_budget", fits);
        if (!valid) {
            cli_json_i64(&j, "fail_step", r.sim.fail_step);
            cli_json_str(&j, "step", step);
            cli_json_str(&j, "rule", rkm_rule_string(r.sim.rule));
            cli_json_i64(&j, "rule_id", (int64_t)r.sim.rule);
            cli_json_str(&j, "message", r.message);
        }
        cli_json_close(&j, '}');
    } else if (valid) {
        printf("%s: valid plan for %s\n", plan_name, G.path);
        cli_text_plan(&G, &r);
    }
    if (!valid) {
        rc = CLI_INPUT;
        fprintf(stderr, "rockmate: %s\n", r.message); /* the message leads with file:line */
    } else if (!fits) {
        char a[32], b[32];
        rc = CLI_BUDGET;
        if (r.ps.peak > r.budget)
            fprintf(stderr,
                    "rockmate: %s: the plan peaks at %s (%" PRIu64 " bytes), over the budget %s (%" PRIu64 " bytes)\n",
                    plan_name, cli_size(a, sizeof a, r.ps.peak), r.ps.peak, cli_size(b, sizeof b, r.budget), r.budget);
        else
            fprintf(stderr,
                    "rockmate: %s: the plan's arena at %" PRIu64 "-byte alignment is %s (%" PRIu64 " bytes), over the "
                    "budget %s (%" PRIu64 " bytes), though its peak (%" PRIu64 " bytes) is within it\n",
                    plan_name, r.alignment, cli_size(a, sizeof a, r.arena), r.arena, cli_size(b, sizeof b, r.budget),
                    r.budget, r.ps.peak);
    }
    rkm_plan_destroy(r.plan);
    rkm_graph_destroy(G.g);
    return rc;
}

/* Per algorithm of `info`: its smallest budget, or why there is none. */
/* An algorithm's smallest budget for info: bytes, or why there is none;
 * skipped: ILP solves the time limit or the ILP budget left out (the figure may be higher);
 * cut: the time limit cut its search (the same). */
typedef struct cli_floor {
    uint64_t bytes, work, work_limit; /* the smallest budget; the call's work and its limit */
    int32_t skipped, cut;
    char why[256];
} cli_floor;

/* fl[a]'s smallest budget of algorithm a on G. */
static void cli_info_min_budget(const cli_graph *G, const cli_opts *o, rkm_algo a, cli_floor *fl)
{
    cli_planner cp;
    rkm_planner_stats pls;
    fl->why[0] = 0;
    rkm_result e = cli_planner_open(G, a, o, &cp);
    if (!e) e = cli_planner_min(&cp, &fl->bytes);
    if (e) snprintf(fl->why, sizeof fl->why, "%s: %s", rkm_result_string(e), rkm_context_errmsg(rkm_graph_context(G->g)));
    if (!e && cp.pl && rkm_planner_stats_get(cp.pl, &pls) == RKM_OK) {
        fl->skipped = pls.ilp_skipped, fl->cut = pls.cut;
        fl->work = pls.work, fl->work_limit = pls.work_limit;
    }
    cli_planner_close(&cp);
}

/* Every requested algorithm's; on a graph with a copy link, rockmate's
 * without it too (fl[CLI_NO_COPY]: its recompute-only floor, beside the
 * one offloading meets). */
#define CLI_NO_COPY RKM_ALGO_COUNT
static void cli_info_min_budgets(const cli_graph *G, const cli_opts *o, cli_floor fl[RKM_ALGO_COUNT + 1])
{
    for (int a = CLI_FIRST_ALGO; a <= RKM_ALGO_COUNT; a++)
        snprintf(fl[a].why, sizeof fl[a].why, "not requested (--algo %s)",
                 rkm_algo_name(a == CLI_NO_COPY ? RKM_ALGO_ROCKMATE : (rkm_algo)a));
    rkm_copy_desc c;
    for (int k = 0; k < o->n_algos; k++) {
        cli_info_min_budget(G, o, o->algos[k], &fl[o->algos[k]]);
        if (o->algos[k] != RKM_ALGO_ROCKMATE || rkm_graph_copy_get(G->g, &c) != RKM_OK || !(c.d2h_bytes_per_second > 0))
            continue;
        cli_graph nocopy = *G;
        cli_floor *nc = &fl[CLI_NO_COPY];
        nocopy.g = NULL;
        if (rkm_graph_with_copy(G->g, NULL, &nocopy.g) == RKM_OK)
            cli_info_min_budget(&nocopy, o, RKM_ALGO_ROCKMATE, nc);
        else
            snprintf(nc->why, sizeof nc->why, "%s", rkm_context_errmsg(rkm_graph_context(G->g)));
        rkm_graph_destroy(nocopy.g);
    }
}

/* Whether info shows rockmate without the copy link. */
static int cli_info_no_copy(const cli_graph *G)
{
    rkm_copy_desc c;
    return rkm_graph_copy_get(G->g, &c) == RKM_OK && c.d2h_bytes_per_second > 0;
}

/* The budgets, in % of the baseline peak, where info gives the time bound. */
static const int cli_bound_pcts[] = {90, 80, 70, 60, 50, 40, 30, 25, 20};
#define CLI_N_BOUNDS (sizeof cli_bound_pcts / sizeof cli_bound_pcts[0])

/* The overhead no plan can beat at bound budget k; -1 below the lower bound. */
static double cli_overhead_bound(const cli_graph *G, size_t k)
{
    double extra;
    uint64_t budget = (uint64_t)((double)G->st.baseline_peak * cli_bound_pcts[k] / 100.0);
    if (rkm_graph_time_bound(G->g, budget, &extra) != RKM_OK || !(G->st.baseline_time > 0)) return -1;
    return extra / G->st.baseline_time;
}

static void cli_info_json(const cli_graph *G, const cli_floor fl[RKM_ALGO_COUNT + 1])
{
    cli_json j = {stdout, 0, 1};
    rkm_tensor_info ti;
    rkm_op_desc oi;
    cli_json_open(&j, NULL, '{');
    cli_json_str(&j, "graph", G->path);
    cli_json_str(&j, "name", G->name);
    cli_json_i64(&j, "ops", rkm_graph_num_ops(G->g));
    cli_json_i64(&j, "tensors", rkm_graph_num_tensors(G->g));
    int32_t loss = rkm_graph_loss(G->g);
    cli_json_str(&j, "loss", rkm_graph_tensor_info(G->g, loss, &ti) == RKM_OK ? ti.name : NULL);
    cli_json_u64(&j, "input_bytes", G->st.input_bytes);
    cli_json_u64(&j, "baseline_peak", G->st.baseline_peak);
    cli_json_u64(&j, "baseline_arena", G->baseline_arena);
    cli_json_num(&j, "baseline_time", G->st.baseline_time);
    cli_json_u64(&j, "lower_bound", G->st.lower_bound);
    cli_json_open(&j, "overhead_bound", '{');
    for (size_t k = 0; k < CLI_N_BOUNDS; k++) {
        char key[8];
        double v = cli_overhead_bound(G, k);
        snprintf(key, sizeof key, "%d%%", cli_bound_pcts[k]);
        if (v < 0)
            cli_json_null(&j, key);
        else
            cli_json_num(&j, key, v);
    }
    cli_json_close(&j, '}');
    cli_json_i64(&j, "blocks", G->st.blocks);
    cli_json_i64(&j, "block_classes", G->st.block_classes);
    cli_json_open(&j, "block_list", '[');
    for (int32_t b = 0; b < G->st.blocks; b++) {
        rkm_block_info bi;
        if (rkm_graph_block_info(G->g, b, &bi) != RKM_OK) continue;
        cli_json_open(&j, NULL, '{');
        cli_json_i64(&j, "ops", bi.n_ops);
        cli_json_str(&j, "first_op", bi.n_ops && rkm_graph_op_info(G->g, bi.ops[0], &oi) == RKM_OK ? oi.name : NULL);
        cli_json_str(&j, "last_op",
                     bi.n_ops && rkm_graph_op_info(G->g, bi.ops[bi.n_ops - 1], &oi) == RKM_OK ? oi.name : NULL);
        cli_json_str(&j, "input", rkm_graph_tensor_info(G->g, bi.input, &ti) == RKM_OK ? ti.name : NULL);
        cli_json_str(&j, "output", rkm_graph_tensor_info(G->g, bi.output, &ti) == RKM_OK ? ti.name : NULL);
        cli_json_i64(&j, "class", bi.class_id);
        cli_json_close(&j, '}');
    }
    cli_json_close(&j, ']');
    cli_json_open(&j, "min_budget", '{');
    for (int a = CLI_FIRST_ALGO; a < RKM_ALGO_COUNT; a++) {
        if (fl[a].why[0])
            cli_json_null(&j, rkm_algo_name((rkm_algo)a));
        else
            cli_json_u64(&j, rkm_algo_name((rkm_algo)a), fl[a].bytes);
    }
    cli_json_close(&j, '}');
    if (cli_info_no_copy(G)) { /* rockmate's without the copy link */
        if (fl[CLI_NO_COPY].why[0])
            cli_json_null(&j, "min_budget_no_copy");
        else
            cli_json_u64(&j, "min_budget_no_copy", fl[CLI_NO_COPY].bytes);
    }
    cli_json_open(&j, "min_budget_reason", '{');
    for (int a = CLI_FIRST_ALGO; a < RKM_ALGO_COUNT; a++)
        if (fl[a].why[0]) cli_json_str(&j, rkm_algo_name((rkm_algo)a), fl[a].why);
    cli_json_close(&j, '}');
    cli_json_open(&j, "ilp_skipped", '{');
    for (int a = CLI_FIRST_ALGO; a < RKM_ALGO_COUNT; a++)
        if (fl[a].skipped) cli_json_i64(&j, rkm_algo_name((rkm_algo)a), fl[a].skipped);
    cli_json_close(&j, '}');
    /* each smallest budget's call: its work and limit (rkm_planner_stats) */
    cli_json_open(&j, "min_budget_work", '{');
    for (int a = CLI_FIRST_ALGO; a < RKM_ALGO_COUNT; a++)
        if (!fl[a].why[0]) {
            cli_json_open(&j, rkm_algo_name((rkm_algo)a), '{');
            cli_json_u64(&j, "work", fl[a].work);
            cli_json_u64(&j, "work_limit", fl[a].work_limit);
            cli_json_close(&j, '}');
        }
    cli_json_close(&j, '}');
    cli_json_close(&j, '}');
}

/* One line of info's smallest budgets. */
static void cli_info_floor_row(const char *name, const cli_floor *fl, double bp)
{
    char a[32];
    if (fl->why[0])
        printf("    %-10s -            (%s)\n", name, fl->why);
    else
        printf("    %-10s %-12s (%" PRIu64 " bytes, %.1f%%)%s\n", name, cli_size(a, sizeof a, fl->bytes), fl->bytes,
               cli_percent((double)fl->bytes, bp),
               fl->cut       ? " -- cut by the time limit: may be lower with more"
               : fl->skipped ? " -- the time limit or the ILP budget ran out, ILP solves were skipped: may be lower with more"
                             : "");
}

static void cli_info_text(const cli_graph *G, const cli_floor fl[RKM_ALGO_COUNT + 1])
{
    char a[32];
    double bp = (double)G->st.baseline_peak;
    printf("%s\n", G->path);
    int n_ip = 0, n_gip = 0;
    for (int32_t i = 0; i < rkm_graph_num_ops(G->g); i++) {
        rkm_op_desc d;
        if (rkm_graph_op_info(G->g, i, &d) != RKM_OK) continue;
        n_ip += (d.flags & RKM_OP_INPLACE) != 0;
        n_gip += (d.flags & RKM_OP_GRAD_INPLACE) != 0;
    }
    printf("  ops            %d", (int)rkm_graph_num_ops(G->g));
    if (n_ip || n_gip) printf(" (in place: %d forwards, %d backwards)", n_ip, n_gip);
    printf("\n");
    printf("  tensors        %d (inputs: %s, %" PRIu64 " bytes)\n", (int)rkm_graph_num_tensors(G->g),
           cli_size(a, sizeof a, G->st.input_bytes), G->st.input_bytes);
    printf("  baseline peak  %-12s (%" PRIu64 " bytes)\n", cli_size(a, sizeof a, G->st.baseline_peak),
           G->st.baseline_peak);
    printf("  baseline time  %.9g s\n", G->st.baseline_time);
    printf("  lower bound    %-12s (%" PRIu64 " bytes, %.1f%% of the baseline peak)\n",
           cli_size(a, sizeof a, G->st.lower_bound), G->st.lower_bound, cli_percent((double)G->st.lower_bound, bp));
    printf("  least overhead (a bound over every plan) by budget:");
    for (size_t k = 0; k < CLI_N_BOUNDS; k++) {
        double v = cli_overhead_bound(G, k);
        if (v >= 0) printf(" %d%%: %.2f%%", cli_bound_pcts[k], 100.0 * v);
    }
    printf("\n");
    printf("  smallest budget per algorithm:\n");
    for (int k = CLI_FIRST_ALGO; k < RKM_ALGO_COUNT; k++) {
        cli_info_floor_row(rkm_algo_name((rkm_algo)k), &fl[k], bp);
        if (k == RKM_ALGO_ROCKMATE && cli_info_no_copy(G)) cli_info_floor_row("(no copy)", &fl[CLI_NO_COPY], bp);
    }
    printf("  blocks         %d in %d classes\n", (int)G->st.blocks, (int)G->st.block_classes);
    printf("    %5s %5s %6s  %-24s %s\n", "block", "class", "ops", "input", "output");
    for (int32_t b = 0; b < G->st.blocks; b++) {
        rkm_block_info bi;
        rkm_tensor_info in, out;
        if (rkm_graph_block_info(G->g, b, &bi) != RKM_OK) continue;
        int has_in = rkm_graph_tensor_info(G->g, bi.input, &in) == RKM_OK;
        int has_out = rkm_graph_tensor_info(G->g, bi.output, &out) == RKM_OK;
        printf("    %5d %5d %6d  %-24s %s\n", (int)b, (int)bi.class_id, (int)bi.n_ops, has_in ? in.name : "-",
               has_out ? out.name : "-");
    }
}

static int cmd_info(rkm_context *ctx, const cli_opts *o)
{
    cli_graph G;
    int rc = cli_graph_load(ctx, o->operand[0], o, &G);
    if (rc) return rc;
    cli_floor fl[RKM_ALGO_COUNT + 1];
    memset(fl, 0, sizeof fl);
    cli_info_min_budgets(&G, o, fl);
    if (o->value[OPT_JSON])
        cli_info_json(&G, fl);
    else
        cli_info_text(&G, fl);
    rkm_graph_destroy(G.g);
    return CLI_OK;
}

/* Sweep state: a planner per series, the budgets, the plans' figures. A
 * series is an algorithm on the graph; on a graph with a copy link rockmate,
 * the algorithm that offloads, has a second one on the same graph without
 * it (recompute only), its twin, so that the two curves are side by side. */
enum { CLI_SERIES = RKM_ALGO_COUNT + 1 };
typedef struct cli_sweep {
    const cli_graph *G;
    cli_graph nocopy; /* the graph without its copy link (g NULL: no twin) */
    int n_algos;      /* series */
    rkm_algo algo[CLI_SERIES];
    unsigned char twin[CLI_SERIES]; /* 1: planned on `nocopy` */
    cli_planner cp[CLI_SERIES];
    uint64_t min[CLI_SERIES];
    size_t n_budgets;
    uint64_t *budgets;
    cli_result *res; /* n_budgets x n_algos; plan NULL where infeasible */
    uint64_t alignment;
} cli_sweep;

static int cli_u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Budgets from the smallest algorithm minimum to the baseline peak, spaced
 * quadratically (lo + span * (i / steps)^2): denser toward the minimum,
 * where the overhead curves are steep; plus each algorithm's own minimum so
 * that every curve starts at it (even one above the baseline peak: sqrt's
 * fixed checkpoints can need more). */
static int cli_sweep_budgets(cli_sweep *s, int points)
{
    uint64_t hi = s->G->st.baseline_peak, lo = hi;
    for (int k = 0; k < s->n_algos; k++)
        if (s->min[k] < lo) lo = s->min[k];
    s->budgets = malloc(((size_t)points + CLI_SERIES) * sizeof *s->budgets);
    if (!s->budgets) return 0;
    size_t n = 0;
    uint64_t span = hi - lo, steps = (uint64_t)points - 1;
    for (uint64_t i = 0; i <= steps; i++) {
        double f = (double)i / (double)steps;
        s->budgets[n++] = i == steps ? hi : lo + (uint64_t)((double)span * f * f);
    }
    for (int k = 0; k < s->n_algos; k++) s->budgets[n++] = s->min[k];
    qsort(s->budgets, n, sizeof *s->budgets, cli_u64_cmp);
    s->n_budgets = 0;
    for (size_t i = 0; i < n; i++)
        if (s->n_budgets == 0 || s->budgets[i] != s->budgets[s->n_budgets - 1])
            s->budgets[s->n_budgets++] = s->budgets[i];
    return 1;
}

/* A series' name in tables and the chart's legend. */
static const char *cli_sweep_name(const cli_sweep *s, int k)
{
    return s->twin[k] ? "(no copy)" : rkm_algo_name(s->algo[k]);
}

/* Opens series n's planner (algo on G, or on the twin's graph) and finds
 * its minimum. 1 when it can plan; else a warning, and it is left out
 * (compiled out, out of time). */
static int cli_sweep_series(rkm_context *ctx, cli_sweep *s, const cli_opts *o, rkm_algo algo, int twin)
{
    int n = s->n_algos;
    rkm_result e = cli_planner_open(twin ? &s->nocopy : s->G, algo, o, &s->cp[n]);
    s->algo[n] = algo, s->twin[n] = (unsigned char)twin;
    if (!e) e = cli_planner_min(&s->cp[n], &s->min[n]);
    if (e) {
        char prefix[80];
        snprintf(prefix, sizeof prefix, "warning: %s%s left out of the sweep", rkm_algo_name(algo),
                 twin ? " without the copy link" : "");
        cli_fail(ctx, e, prefix);
        cli_planner_close(&s->cp[n]);
        return 0;
    }
    s->n_algos++;
    return 1;
}

/* Every series' planner. With a copy link, rockmate's twin follows it. */
static int cli_sweep_open(rkm_context *ctx, cli_sweep *s, const cli_opts *o)
{
    rkm_copy_desc c;
    if (rkm_graph_copy_get(s->G->g, &c) == RKM_OK && c.d2h_bytes_per_second > 0) {
        s->nocopy = *s->G;
        s->nocopy.g = NULL;
        rkm_result e = rkm_graph_with_copy(s->G->g, NULL, &s->nocopy.g);
        if (e) return cli_fail(ctx, e, s->G->path);
    }
    for (int k = 0; k < o->n_algos; k++)
        if (cli_sweep_series(ctx, s, o, o->algos[k], 0) && s->nocopy.g && o->algos[k] == RKM_ALGO_ROCKMATE)
            cli_sweep_series(ctx, s, o, o->algos[k], 1);
    if (s->n_algos == 0) {
        return cli_error("%s: no algorithm of the sweep could plan", s->G->path);
    }
    return CLI_OK;
}

static int cli_sweep_solve(rkm_context *ctx, cli_sweep *s, uint64_t align)
{
    s->alignment = align;
    s->res = calloc(s->n_budgets * (size_t)s->n_algos, sizeof *s->res);
    if (!s->res) return cli_fail(ctx, RKM_ERROR_NOMEM, "sweep");
    for (size_t i = 0; i < s->n_budgets; i++)
        for (int k = 0; k < s->n_algos; k++) {
            cli_result *r = &s->res[i * (size_t)s->n_algos + (size_t)k];
            r->has_algo = r->has_budget = 1;
            r->algo = s->algo[k];
            r->budget = s->budgets[i];
            if (r->budget < s->min[k]) continue;
            if (s->cp[k].bar)
                snprintf(s->cp[k].bar->label, sizeof s->cp[k].bar->label, "budget %zu/%zu", i + 1, s->n_budgets);
            rkm_result e = cli_planner_solve(&s->cp[k], r->budget, &r->plan, &r->pls);
            if (e == RKM_ERROR_TIMEOUT) continue; /* no plan within --time-limit: a gap, as below the smallest */
            if (!e) e = cli_result_fill(s->G, r->plan, align, r);
            if (e) return cli_fail(ctx, e, s->G->path);
        }
    return CLI_OK;
}

static void cli_sweep_free(cli_sweep *s)
{
    for (size_t i = 0; s->res && i < s->n_budgets * (size_t)s->n_algos; i++) rkm_plan_destroy(s->res[i].plan);
    for (int k = 0; k < s->n_algos; k++) cli_planner_close(&s->cp[k]);
    rkm_graph_destroy(s->nocopy.g);
    free(s->res);
    free(s->budgets);
}

/* A sweep result's figure in one of the text tables: its overhead (% of
 * the baseline time) or its arena (% of the baseline peak). */
static double cli_sweep_cell(const cli_graph *G, const cli_result *r, int arena)
{
    return arena ? cli_percent((double)r->arena, (double)G->st.baseline_peak)
                 : 100 * (r->ps.time / G->st.baseline_time - 1);
}

/* One table: a row per budget, a column per algorithm ('-': no plan). */
static void cli_sweep_table(const cli_sweep *s, int arena)
{
    char a[32];
    for (size_t i = 0; i < s->n_budgets; i++) {
        printf("%12s %8.2f", cli_size(a, sizeof a, s->budgets[i]),
               cli_percent((double)s->budgets[i], (double)s->G->st.baseline_peak));
        for (int k = 0; k < s->n_algos; k++) {
            const cli_result *r = &s->res[i * (size_t)s->n_algos + (size_t)k];
            if (r->plan)
                printf(" %10.2f", cli_sweep_cell(s->G, r, arena));
            else
                printf(" %10s", "-");
        }
        printf("\n");
    }
}

static void cli_sweep_text(const cli_sweep *s)
{
    const cli_graph *G = s->G;
    char a[32];
    printf("%s: baseline peak %s (%" PRIu64 " bytes), baseline time %.9g s\n", G->path,
           cli_size(a, sizeof a, G->st.baseline_peak), G->st.baseline_peak, G->st.baseline_time);
    printf("overhead (%% of the baseline time) per budget (%% of the baseline peak)\n");
    printf("%12s %8s", "budget", "budget%");
    for (int k = 0; k < s->n_algos; k++) printf(" %10s", cli_sweep_name(s, k));
    printf("\n");
    cli_sweep_table(s, 0);
    if (s->nocopy.g)
        printf("(no copy): rockmate without the graph's copy link, recompute only; rockmate's column offloads "
               "where that is faster\n");
    /* what a host allocates: within the budget by construction */
    printf("arena at %" PRIu64 "-byte alignment (%% of the baseline peak) per budget\n", s->alignment);
    cli_sweep_table(s, 1);
}

static void cli_sweep_json(const cli_sweep *s)
{
    cli_json j = {stdout, 0, 1};
    cli_json_open(&j, NULL, '[');
    for (size_t i = 0; i < s->n_budgets * (size_t)s->n_algos; i++) {
        if (!s->res[i].plan) continue;
        cli_json_open(&j, NULL, '{');
        cli_json_plan_members(&j, s->G, &s->res[i]);
        if (s->nocopy.g) cli_json_bool(&j, "copy_link", !s->twin[i % (size_t)s->n_algos]);
        cli_json_close(&j, '}');
    }
    cli_json_close(&j, ']');
}

/* Overhead (%) against budget (% of the baseline peak), a line per algorithm. */
static int cli_sweep_svg(const cli_sweep *s, const char *path, int log_axis)
{
    static const int marks[RKM_ALGO_COUNT] = {[RKM_ALGO_ROCKMATE] = MARK_CIRCLE, [RKM_ALGO_ROTOR] = MARK_SQUARE,
                                              [RKM_ALGO_SQRT] = MARK_TRIANGLE, [RKM_ALGO_CHECKMATE] = MARK_DIAMOND,
                                              [RKM_ALGO_NONE] = MARK_CROSS, [RKM_ALGO_DTR] = MARK_SQUARE,
                                              [RKM_ALGO_FULL] = MARK_TRIANGLE};
    const cli_graph *G = s->G;
    double bp = (double)G->st.baseline_peak, bt = G->st.baseline_time, ymax = 0;
    for (size_t i = 0; i < s->n_budgets * (size_t)s->n_algos; i++)
        if (s->res[i].plan && 100 * (s->res[i].ps.time / bt - 1) > ymax) ymax = 100 * (s->res[i].ps.time / bt - 1);
    FILE *f = cli_svg_open(path);
    if (!f) return CLI_INPUT;
    cli_chart c = {f, SVG_LEFT, SVG_TOP, SVG_PLOT_W, SVG_PLOT_H, {0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}};
    double x_lo = cli_percent((double)s->budgets[0], bp); /* padded so that no marker sits on the frame */
    cli_axis_nice(&c.x, x_lo - 0.02 * (100 - x_lo), 100, 6);
    if (log_axis) /* log10(1 + overhead in %): 0 % has a place */
        cli_axis_log(&c.y, 0, ymax > 0 ? ymax : 1, 1);
    else
        cli_axis_nice(&c.y, 0, ymax > 0 ? ymax : 1, 6);
    char title[256], sub[160], a[32];
    snprintf(title, sizeof title, "%s: compute overhead against memory budget", G->name);
    snprintf(sub, sizeof sub, "baseline: peak %s, time %.4g s; %d ops in %d blocks",
             cli_size(a, sizeof a, G->st.baseline_peak), bt, (int)rkm_graph_num_ops(G->g), (int)G->st.blocks);
    cli_svg_begin(f, SVG_W, SVG_H);
    cli_svg_titles(f, SVG_LEFT, title, sub);
    cli_chart_axes(&c, "budget (% of the baseline peak)", "overhead (% of the baseline time)");
    cli_legend_item items[CLI_SERIES];
    for (int k = s->n_algos - 1; k >= 0; k--) { /* the first algorithm listed is drawn on top */
        const char *color = cli_algo_color[s->algo[k]], *dash = s->twin[k] ? "6,4" : NULL;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s%s%s points=\"", color,
                dash ? " stroke-dasharray=\"" : "", dash ? dash : "", dash ? "\"" : "");
        for (size_t i = 0; i < s->n_budgets; i++) {
            const cli_result *r = &s->res[i * (size_t)s->n_algos + (size_t)k];
            if (r->plan)
                fprintf(f, "%.2f,%.2f ", cli_sx(&c, cli_percent((double)r->budget, bp)),
                        cli_sy(&c, 100 * (r->ps.time / bt - 1)));
        }
        fputs("\"/>\n", f);
        for (size_t i = 0; i < s->n_budgets; i++) {
            const cli_result *r = &s->res[i * (size_t)s->n_algos + (size_t)k];
            if (r->plan)
                cli_svg_marker(f, marks[s->algo[k]], cli_sx(&c, cli_percent((double)r->budget, bp)),
                               cli_sy(&c, 100 * (r->ps.time / bt - 1)), color);
        }
        cli_legend_item it = {s->twin[k] ? "rockmate, no copy" : rkm_algo_name(s->algo[k]), color, dash, 1.6, 1,
                              marks[s->algo[k]]};
        items[k] = it;
    }
    cli_svg_legend(f, SVG_LEFT + SVG_PLOT_W + 22, SVG_TOP + 10, items, s->n_algos);
    return cli_svg_close(f, path);
}

static int cmd_sweep(rkm_context *ctx, const cli_opts *o)
{
    cli_graph G;
    cli_sweep s;
    memset(&s, 0, sizeof s);
    int rc = cli_graph_load(ctx, o->operand[0], o, &G);
    if (rc) return rc;
    s.G = &G;
    rc = cli_sweep_open(ctx, &s, o);
    if (!rc && !cli_sweep_budgets(&s, o->points)) rc = cli_fail(ctx, RKM_ERROR_NOMEM, "sweep");
    if (!rc) rc = cli_sweep_solve(ctx, &s, o->alignment);
    if (!rc && o->value[OPT_SVG]) rc = cli_sweep_svg(&s, o->value[OPT_SVG], o->value[OPT_LOG] != NULL);
    if (!rc && o->value[OPT_JSON])
        cli_sweep_json(&s);
    else if (!rc)
        cli_sweep_text(&s);
    cli_sweep_free(&s);
    rkm_graph_destroy(G.g);
    return rc;
}

/* ===========================================================================
 * pipeline: the cut across devices and each stage's plan
 * ========================================================================= */

/* The four ways pipeline sets side by side, in its output's order: the
 * uniform cut (rkm_graph_uniform_cut) storing everything, recomputing
 * every block (Megatron-LM's "full"), with the stage planner (--algo), and
 * the cut rkm_pipeline_plan chooses with it, the answer. */
enum { WAY_STORE_ALL, WAY_FULL, WAY_UNIFORM, WAY_CHOSEN, CLI_WAYS };
static const char *const cli_way_keys[CLI_WAYS] = {"uniform_store_all", "uniform_full_recompute", "uniform_rockmate",
                                                   "chosen"};

typedef struct cli_way {
    rkm_algo algo;
    rkm_pipeline *pp; /* NULL: no plan, `why` says why */
    char why[1024];
    double step_time;
    uint64_t max_peak, max_arena; /* its fullest stage's */
} cli_way;

typedef struct cli_pipe {
    const cli_graph *G;
    const cli_opts *o;
    uint64_t *budgets; /* as given: one (every device's) or one per stage */
    int32_t n_budgets;
    cli_way way[CLI_WAYS];
} cli_pipe;

static uint64_t cli_pipe_budget(const cli_pipe *c, int32_t s) { return c->budgets[c->n_budgets > 1 ? s : 0]; }

/* The --budget list (its length was checked with the options), each
 * against the whole graph. */
static int cli_pipe_budgets(cli_pipe *c)
{
    const char *text = c->o->value[OPT_BUDGET];
    c->n_budgets = cli_budget_count(text);
    c->budgets = calloc((size_t)c->n_budgets, sizeof *c->budgets);
    char *copy = malloc(strlen(text) + 1);
    if (!c->budgets || !copy) {
        free(copy);
        return cli_fail(rkm_graph_context(c->G->g), RKM_ERROR_NOMEM, "pipeline");
    }
    strcpy(copy, text);
    int rc = CLI_OK;
    char *p = copy;
    for (int32_t i = 0; i < c->n_budgets && !rc; i++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        rc = cli_budget(c->G, p, "pipeline", &c->budgets[i]);
        p = comma ? comma + 1 : p + strlen(p);
    }
    free(copy);
    return rc;
}

/* Way w planned with `cuts` (NULL: the library chooses). A failure's
 * message goes into way->why; the result is returned. */
static rkm_result cli_pipe_plan(cli_pipe *c, int w, const int32_t *cuts)
{
    const cli_opts *o = c->o;
    cli_way *W = &c->way[w];
    rkm_pipeline_desc d;
    memset(&d, 0, sizeof d);
    d.stages = o->stages;
    d.micro_batches = o->micro;
    d.schedule = o->schedule;
    d.budget = c->budgets[0];
    if (c->n_budgets > 1) d.budgets = c->budgets, d.n_budgets = c->n_budgets;
    d.link_bytes_per_second = o->link;
    d.cuts = cuts;
    cli_solve_desc(o, W->algo, &d.solve);
    if (o->bar) snprintf(o->bar->label, sizeof o->bar->label, "%s cut", cuts ? "uniform" : "chosen");
    rkm_result e = rkm_pipeline_plan(c->G->g, &d, &W->pp);
    cli_bar_clear(o->bar);
    if (e) {
        const char *msg = rkm_context_errmsg(rkm_graph_context(c->G->g));
        snprintf(W->why, sizeof W->why, "%s", *msg ? msg : rkm_result_string(e));
        for (char *q = W->why; *q; q++)
            if (*q == '\n' || *q == '\r') *q = ' ';
        return e;
    }
    W->step_time = rkm_pipeline_step_time(W->pp);
    for (int32_t s = 0; s < rkm_pipeline_num_stages(W->pp); s++) {
        rkm_pipeline_stage_info in;
        if ((e = rkm_pipeline_stage(W->pp, s, &in, NULL, NULL)) != RKM_OK) return e;
        if (in.peak > W->max_peak) W->max_peak = in.peak;
        if (in.arena_bytes > W->max_arena) W->max_arena = in.arena_bytes;
    }
    return RKM_OK;
}

/* A stage graph's boundary tensors: its input from the previous stage
 * (`input grad`) and its output to the next; -1 where it has none. */
static void cli_stage_ends(const rkm_graph *sg, int32_t *in, int32_t *out)
{
    rkm_tensor_info ti;
    *in = -1;
    *out = rkm_graph_output(sg);
    for (int32_t t = 0; t < rkm_graph_num_tensors(sg); t++)
        if (rkm_graph_tensor_info(sg, t, &ti) == RKM_OK && (ti.flags & RKM_TENSOR_INPUT_GRAD)) *in = t;
}

static const char *cli_tensor_name(const rkm_graph *g, int32_t t)
{
    rkm_tensor_info ti;
    return t >= 0 && rkm_graph_tensor_info(g, t, &ti) == RKM_OK ? ti.name : NULL;
}

static const char *cli_op_name(const rkm_graph *g, int32_t op)
{
    rkm_op_desc d;
    return rkm_graph_op_info(g, op, &d) == RKM_OK ? d.name : "?";
}

/* "2+2+2": the blocks of each stage. */
static void cli_pipe_blocks(const rkm_pipeline *pp, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (int32_t s = 0; s < rkm_pipeline_num_stages(pp) && n < size; s++) {
        rkm_pipeline_stage_info in;
        rkm_pipeline_stage(pp, s, &in, NULL, NULL);
        int k = snprintf(buf + n, size - n, "%s%d", s ? "+" : "", (int)in.n_blocks);
        if (k < 0) break;
        n += (size_t)k;
    }
}

/* -o DIR: each stage's graph and plan, DIR/stageN.rkg and DIR/stageN.rkp. */
static int cli_pipe_write(rkm_context *ctx, const char *dir, const rkm_pipeline *pp)
{
    struct stat st;
    if (mkdir(dir, 0777) != 0 && !(errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)))
        return cli_error("%s: cannot make the folder: %s", dir, errno == EEXIST ? "a file is in the way" : strerror(errno));
    size_t size = strlen(dir) + 32;
    char *path = malloc(size);
    if (!path) return cli_fail(ctx, RKM_ERROR_NOMEM, "pipeline");
    rkm_result e = RKM_OK;
    for (int32_t s = 0; s < rkm_pipeline_num_stages(pp) && !e; s++) {
        const rkm_graph *sg;
        const rkm_plan *pl;
        e = rkm_pipeline_stage(pp, s, NULL, &sg, &pl);
        snprintf(path, size, "%s/stage%d.rkg", dir, (int)s);
        if (!e) e = rkm_graph_write_file(sg, path);
        snprintf(path, size, "%s/stage%d.rkp", dir, (int)s);
        if (!e) e = rkm_plan_write_file(pl, path);
    }
    free(path);
    return e ? cli_fail(ctx, e, NULL) : CLI_OK; /* the message names the file */
}

/* One stage of the chosen pipeline for the chart: its times, its in-flight
 * kept bytes, the share of its backward phase that recomputes. */
typedef struct cli_pipe_stage {
    rkm_pipeline_stage_info in;
    const rkm_graph *g;
    const rkm_plan *plan;
    double recompute; /* of the backward phase's time, in [0, 1] */
} cli_pipe_stage;

/* The seconds a plan step computes (forward or backward), on stage graph g. */
static double cli_step_seconds(const rkm_graph *g, const rkm_step *st)
{
    rkm_op_desc d;
    if ((st->kind != RKM_STEP_FWD && st->kind != RKM_STEP_BWD) || rkm_graph_op_info(g, st->index, &d) != RKM_OK)
        return 0;
    return st->kind == RKM_STEP_FWD ? d.fwd_seconds : d.bwd_seconds;
}

/* A step function, one point per change: pt(t, v) says the value is v
 * from t (seconds) on; runs of equal values merge. */
typedef struct cli_stepline {
    const cli_chart *c;
    double tscale, vscale; /* seconds and bytes to the axes' units */
    double v_last;
    int started;
} cli_stepline;

static void cli_stepline_pt(cli_stepline *l, double t, double v)
{
    double x = cli_sx(l->c, t * l->tscale);
    if (!l->started)
        fprintf(l->c->f, "%.2f,%.2f ", x, cli_sy(l->c, v / l->vscale));
    else if (v != l->v_last)
        fprintf(l->c->f, "%.2f,%.2f %.2f,%.2f ", x, cli_sy(l->c, l->v_last / l->vscale), x, cli_sy(l->c, v / l->vscale));
    l->started = 1;
    l->v_last = v;
}

/* Stage s's memory over the step: during a phase of a micro-batch, each
 * step's peak plus the kept bytes of the other micro-batches in flight
 * (as rkm_plan_stage_memory replays it); between phases, the kept bytes
 * of those in flight. A phase's steps are spread over its time by their
 * compute seconds. ph: the stage's 2M phases in its order. */
static void cli_pipe_svg_memory(cli_stepline *l, const cli_pipe_stage *ps, const rkm_pipe_phase *ph, int32_t m,
                                double t_end, const char *color)
{
    const rkm_step *st = rkm_plan_steps(ps->plan);
    const uint64_t *peaks = rkm_plan_step_peaks(ps->plan);
    size_t n = rkm_plan_num_steps(ps->plan), loss = (size_t)rkm_plan_phase_step(ps->plan);
    double kept = (double)ps->in.kept_bytes;
    int32_t held = 0; /* micro-batches in flight */
    fprintf(l->c->f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    cli_stepline_pt(l, 0, 0);
    for (int32_t k = 0; k < 2 * m; k++) {
        const rkm_pipe_phase *q = &ph[k];
        size_t i0 = q->bwd ? loss : 0, i1 = q->bwd ? n : loss;
        double others = (double)(q->bwd ? held - 1 : held) * kept, total = 0, at = 0;
        for (size_t i = i0; i < i1; i++) total += cli_step_seconds(ps->g, &st[i]);
        cli_stepline_pt(l, q->start, (double)held * kept);
        for (size_t i = i0; i < i1; i++) {
            double share = total > 0 ? at / total : (double)(i - i0) / (double)(i1 - i0);
            cli_stepline_pt(l, q->start + (q->end - q->start) * share, others + (double)peaks[i]);
            at += cli_step_seconds(ps->g, &st[i]);
        }
        held += q->bwd ? -1 : 1;
        cli_stepline_pt(l, q->end, (double)held * kept);
    }
    cli_stepline_pt(l, t_end, 0);
    fprintf(l->c->f, "%.2f,%.2f\"/>\n", cli_sx(l->c, t_end * l->tscale), cli_sy(l->c, 0));
}

/* The time axis' unit: seconds, milliseconds or microseconds. */
static void cli_time_unit(double t, double *scale, const char **label)
{
    *scale = t < 1e-3 ? 1e6 : t < 1 ? 1e3 : 1;
    *label = t < 1e-3 ? "time (\xc2\xb5s)" : t < 1 ? "time (ms)" : "time (s)";
}

/* The chart's stage figures and phases: the times rkm_pipeline_plan
 * replayed (each stage's two phases, each boundary tensor over the link),
 * replayed again for the phases. */
static rkm_result cli_pipe_phases(rkm_context *ctx, const cli_pipe *c, cli_pipe_stage *ps, rkm_pipe_stage *times,
                                  rkm_pipe_phase *ph, double *t_end)
{
    const rkm_pipeline *pp = c->way[WAY_CHOSEN].pp;
    int32_t p = rkm_pipeline_num_stages(pp);
    double link = c->o->link;
    for (int32_t s = 0; s < p; s++) {
        rkm_result e = rkm_pipeline_stage(pp, s, &ps[s].in, &ps[s].g, &ps[s].plan);
        if (e) return e;
        times[s].fwd = ps[s].in.fwd_seconds, times[s].bwd = ps[s].in.bwd_seconds;
        int32_t tin, tout;
        rkm_tensor_info ti;
        cli_stage_ends(ps[s].g, &tin, &tout);
        if (link > 0 && s < p - 1 && rkm_graph_tensor_info(ps[s].g, tout, &ti) == RKM_OK)
            times[s].send_fwd = (double)ti.bytes / link;
        if (link > 0 && s > 0 && rkm_graph_tensor_info(ps[s].g, tin, &ti) == RKM_OK)
            times[s].send_bwd = (double)ti.bytes / link;
        const rkm_step *st = rkm_plan_steps(ps[s].plan);
        double rec = 0; /* forwards in the backward phase: recomputation */
        for (size_t i = (size_t)rkm_plan_phase_step(ps[s].plan); i < rkm_plan_num_steps(ps[s].plan); i++)
            if (st[i].kind == RKM_STEP_FWD) rec += cli_step_seconds(ps[s].g, &st[i]);
        ps[s].recompute = ps[s].in.bwd_seconds > 0 ? fmin(1, rec / ps[s].in.bwd_seconds) : 0;
    }
    return rkm_pipeline_simulate(ctx, times, p, c->o->micro, c->o->schedule, ph, NULL, t_end);
}

/* --svg: the chosen pipeline's schedule, a row per stage with a bar per
 * phase (forward, backward, the backward's recomputation darker at its
 * start, the micro-batch's number on it where it fits), and below it each
 * stage's memory over the same time, with the budgets. */
static int cli_pipe_svg(rkm_context *ctx, const cli_pipe *c, const char *path)
{
    static const char *const stage_color[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                              "#E69F00", "#56B4E9", "#555555", "#F0E442"};
    enum { N_COLORS = sizeof stage_color / sizeof *stage_color };
    static const char *const fwd_color = "#56B4E9", *bwd_color = "#E69F00", *rec_color = "#B34700";
    const cli_opts *o = c->o;
    int32_t p = rkm_pipeline_num_stages(c->way[WAY_CHOSEN].pp), m = o->micro;
    cli_pipe_stage *ps = calloc((size_t)p, sizeof *ps);
    rkm_pipe_stage *times = calloc((size_t)p, sizeof *times);
    rkm_pipe_phase *ph = calloc(2 * (size_t)p * (size_t)m, sizeof *ph);
    double t_end = 0;
    rkm_result e = ps && times && ph ? cli_pipe_phases(ctx, c, ps, times, ph, &t_end) : RKM_ERROR_NOMEM;
    FILE *f = e ? NULL : cli_svg_open(path);
    if (!f) {
        free(ps), free(times), free(ph);
        return e ? cli_fail(ctx, e, path) : CLI_INPUT;
    }
    uint64_t top = 0;
    for (int32_t s = 0; s < p; s++)
        if (ps[s].in.peak > top) top = ps[s].in.peak;
    for (int32_t s = 0; s < c->n_budgets; s++) /* a budget near the peaks is drawn */
        if (c->budgets[s] > top && c->budgets[s] <= top + top / 4) top = c->budgets[s];
    double row = p <= 8 ? 24 : fmax(4, 192.0 / p), tl_top = SVG_TOP + 8, tl_h = row * p;
    double mem_top = tl_top + tl_h + 56, mem_h = 240;
    int n_legend = 3 + (p < N_COLORS ? p : N_COLORS) + 1;
    double height = fmax(mem_top + mem_h + 56, SVG_TOP + 20.0 * n_legend + 20);
    double tscale, mscale;
    const char *tlabel, *munit;
    cli_time_unit(t_end, &tscale, &tlabel);
    cli_mem_unit(top, &mscale, &munit);
    /* both charts' x in the time unit, the memory's y in munit */
    cli_chart tl = {f, SVG_LEFT, tl_top, SVG_PLOT_W, tl_h, {0, 0, 0, 0, 0, 0}, {0, 1, 1, 0, 0, 0}};
    cli_axis_nice(&tl.x, 0, t_end * tscale, 6);
    cli_chart mc = {f, SVG_LEFT, mem_top, SVG_PLOT_W, mem_h, tl.x, {0, 0, 0, 0, 0, 0}};
    cli_axis_nice(&mc.y, 0, (double)(top ? top : 1) / mscale, 5);
    char title[256], sub[256], ylabel[64], a[32];
    snprintf(title, sizeof title, "%s: pipeline of %d stage%s, %d micro-batch%s (%s)", c->G->name, (int)p,
             p > 1 ? "s" : "", (int)m, m > 1 ? "es" : "", o->schedule == RKM_PIPE_GPIPE ? "GPipe" : "1F1B");
    snprintf(sub, sizeof sub, "step time %.4g s, %s stage plans, budget %s%s", t_end, rkm_algo_name(o->algos[0]),
             cli_size(a, sizeof a, c->budgets[0]), c->n_budgets > 1 ? " on stage 0, one per stage" : " per device");
    cli_svg_begin(f, SVG_W, (int)ceil(height));
    cli_svg_titles(f, SVG_LEFT, title, sub);
    double ticks[64];
    int nt = cli_axis_ticks(&tl.x, ticks, 64);
    fputs("<g stroke=\"#e3e3e3\" stroke-width=\"1\">\n", f);
    for (int i = 0; i < nt; i++)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", cli_sx(&tl, ticks[i]), tl.y0,
                cli_sx(&tl, ticks[i]), tl.y0 + tl.h);
    fputs("</g>\n", f);
    for (int32_t s = 0; s < p; s++) {
        char label[32];
        double y = tl.y0 + row * s;
        snprintf(label, sizeof label, "stage %d", (int)s);
        if (row >= 10) cli_svg_text(f, tl.x0 - 6, y + row / 2 + 4, "text-anchor=\"end\"", label);
        for (int32_t k = 0; k < 2 * m; k++) {
            const rkm_pipe_phase *q = &ph[(size_t)s * 2 * (size_t)m + (size_t)k];
            double x0 = cli_sx(&tl, q->start * tscale), w = cli_sx(&tl, q->end * tscale) - x0;
            fprintf(f,
                    "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\" stroke=\"white\" "
                    "stroke-width=\"0.5\"/>\n",
                    x0, y + 1, w, row - 2, q->bwd ? bwd_color : fwd_color);
            if (q->bwd && ps[s].recompute > 0)
                fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n", x0, y + 1,
                        w * ps[s].recompute, row - 2, rec_color);
            if (w >= 12 && row >= 14) {
                snprintf(label, sizeof label, "%d", (int)q->micro);
                cli_svg_text(f, x0 + w / 2, y + row / 2 + 4, "text-anchor=\"middle\" font-size=\"10\"", label);
            }
        }
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333333\"/>\n", tl.x0,
            tl.y0, tl.w, tl.h);
    for (int i = 0; i < nt; i++) {
        char label[64];
        snprintf(label, sizeof label, "%.*f", tl.x.decimals, ticks[i]);
        cli_svg_text(f, cli_sx(&tl, ticks[i]), tl.y0 + tl.h + 18, "text-anchor=\"middle\"", label);
    }
    snprintf(ylabel, sizeof ylabel, "stage memory (%s)", munit);
    cli_chart_axes(&mc, tlabel, ylabel);
    for (int32_t s = 0; s < p; s++) {
        cli_stepline l = {&mc, tscale, mscale, 0, 0};
        cli_pipe_svg_memory(&l, &ps[s], &ph[(size_t)s * 2 * (size_t)m], m, t_end, stage_color[s % N_COLORS]);
    }
    for (int32_t s = 0; s < c->n_budgets; s++) { /* every device's budget, or each stage's in its colour */
        double y = cli_sy(&mc, (double)c->budgets[s] / mscale);
        if ((double)c->budgets[s] / mscale > mc.y.hi) continue;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.2\" "
                "stroke-dasharray=\"7 4\"/>\n",
                mc.x0, y, mc.x0 + mc.w, y, c->n_budgets > 1 ? stage_color[s % N_COLORS] : "#111111");
    }
    cli_legend_item items[3 + N_COLORS + 1];
    char labels[N_COLORS][32];
    int n = 0;
    items[n++] = (cli_legend_item){"forward", fwd_color, NULL, 8, 1, MARK_NONE};
    items[n++] = (cli_legend_item){"backward", bwd_color, NULL, 8, 1, MARK_NONE};
    items[n++] = (cli_legend_item){"recomputation", rec_color, NULL, 8, 1, MARK_NONE};
    for (int32_t s = 0; s < p && s < N_COLORS; s++) {
        snprintf(labels[s], sizeof labels[s], "stage %d memory", (int)s);
        items[n++] = (cli_legend_item){labels[s], stage_color[s], NULL, 1.5, 1, MARK_NONE};
    }
    items[n++] = (cli_legend_item){c->n_budgets > 1 ? "budgets (stage colours)" : "budget", "#111111", "7 4", 1.2, 1,
                                   MARK_NONE};
    cli_svg_legend(f, SVG_LEFT + SVG_PLOT_W + 22, SVG_TOP + 10, items, n);
    free(ps), free(times), free(ph);
    return cli_svg_close(f, path);
}

/* The per-stage table's widths: the ops' names. */
static int cli_pipe_name_width(const cli_graph *G, const rkm_pipeline *pp)
{
    int w = 8; /* "first op" */
    for (int32_t s = 0; s < rkm_pipeline_num_stages(pp); s++) {
        rkm_pipeline_stage_info in;
        rkm_pipeline_stage(pp, s, &in, NULL, NULL);
        int a = (int)strlen(cli_op_name(G->g, in.first_op)), b = (int)strlen(cli_op_name(G->g, in.last_op));
        if (a > w) w = a;
        if (b > w) w = b;
    }
    return w < 40 ? w : 40;
}

static const char *cli_way_label(const cli_pipe *c, int w, char *buf, size_t size)
{
    static const char *const what[CLI_WAYS] = {"uniform cut, store all", "uniform cut, full recompute", "uniform cut",
                                               "chosen cut"};
    if (w == WAY_UNIFORM || w == WAY_CHOSEN)
        snprintf(buf, size, "%s, %s", what[w], rkm_algo_name(c->way[w].algo));
    else
        snprintf(buf, size, "%s", what[w]);
    return buf;
}

static void cli_pipe_text(const cli_pipe *c)
{
    const cli_graph *G = c->G;
    const cli_opts *o = c->o;
    const rkm_pipeline *pp = c->way[WAY_CHOSEN].pp;
    int32_t p = rkm_pipeline_num_stages(pp);
    char a[32], b[32], d[32], e[32];
    printf("%s: pipeline of %d stage%s, %d micro-batch%s (%s), %s stage plans\n", G->path, (int)p, p > 1 ? "s" : "",
           (int)o->micro, o->micro > 1 ? "es" : "", o->schedule == RKM_PIPE_GPIPE ? "GPipe" : "1F1B",
           rkm_algo_name(o->algos[0]));
    for (int32_t s = 0; s < c->n_budgets; s++) {
        if (c->n_budgets > 1)
            printf("  budget %-7d %-12s", (int)s, cli_size(a, sizeof a, c->budgets[s]));
        else
            printf("  budget         %-12s", cli_size(a, sizeof a, c->budgets[s]));
        printf(" (%" PRIu64 " bytes, %.1f%% of the whole graph's baseline arena)%s\n", c->budgets[s],
               cli_percent((double)c->budgets[s], (double)G->baseline_arena), c->n_budgets > 1 ? "" : " on every device");
    }
    if (o->link > 0)
        printf("  link           %.4g bytes a second each way between stages\n", o->link);
    else
        printf("  link           none: transfers between stages take no time\n");
    printf("  step time      %.9g s (the baseline's %d micro-batch%s on one device: %.9g s)\n",
           c->way[WAY_CHOSEN].step_time, (int)o->micro, o->micro > 1 ? "es" : "", G->st.baseline_time * o->micro);
    int nw = cli_pipe_name_width(G, pp);
    printf("  %5s %7s  %-*s  %-*s %4s %9s %11s %11s %11s %11s\n", "stage", "blocks", nw, "first op", nw, "last op", "k",
           "overhead", "time", "kept", "peak", "arena");
    for (int32_t s = 0; s < p; s++) {
        rkm_pipeline_stage_info in;
        rkm_pipeline_stage(pp, s, &in, NULL, NULL);
        char blocks[32];
        if (in.n_blocks > 1)
            snprintf(blocks, sizeof blocks, "%d-%d", (int)in.first_block, (int)(in.first_block + in.n_blocks - 1));
        else
            snprintf(blocks, sizeof blocks, "%d", (int)in.first_block);
        printf("  %5d %7s  %-*s  %-*s %4d %8.2f%% %11.4g %11s %11s %11s\n", (int)s, blocks, nw,
               cli_op_name(G->g, in.first_op), nw, cli_op_name(G->g, in.last_op), (int)in.in_flight, 100 * in.overhead,
               in.fwd_seconds + in.bwd_seconds, cli_size(a, sizeof a, in.kept_bytes), cli_size(b, sizeof b, in.peak),
               cli_size(d, sizeof d, in.arena_bytes));
    }
    printf("  (k: micro-batches in flight; time: one micro-batch's forward and backward, s; kept: what one holds\n"
           "  between them; peak and arena: with k in flight)\n");
    printf("  %-47s %15s %11s %11s  %s\n", "compare", "step time", "max peak", "max arena", "blocks per stage");
    for (int w = 0; w < CLI_WAYS; w++) {
        const cli_way *W = &c->way[w];
        char label[64], blocks[256];
        cli_way_label(c, w, label, sizeof label);
        if (!W->pp) {
            printf("    %-45s no plan: %s\n", label, W->why);
            continue;
        }
        cli_pipe_blocks(W->pp, blocks, sizeof blocks);
        printf("    %-45s %13.6g s %11s %11s  %s\n", label, W->step_time, cli_size(a, sizeof a, W->max_peak),
               cli_size(e, sizeof e, W->max_arena), blocks);
    }
    if (o->value[OPT_OUTPUT])
        printf("  stage files    %s/stage0.rkg, stage0.rkp ... stage%d.rkg, stage%d.rkp\n", o->value[OPT_OUTPUT],
               (int)p - 1, (int)p - 1);
    if (o->value[OPT_SVG]) printf("  chart          %s\n", o->value[OPT_SVG]);
}

static void cli_pipe_json_budgets(cli_json *j, const cli_pipe *c)
{
    cli_json_open(j, "budgets", '[');
    for (int32_t s = 0; s < c->o->stages; s++) cli_json_u64(j, NULL, cli_pipe_budget(c, s));
    cli_json_close(j, ']');
}

/* The members every pipeline object has: what was asked. */
static void cli_pipe_json_head(cli_json *j, const cli_pipe *c)
{
    const cli_opts *o = c->o;
    cli_json_str(j, "graph", c->G->path);
    cli_json_str(j, "algo", rkm_algo_name(o->algos[0]));
    cli_json_i64(j, "n_stages", o->stages);
    cli_json_i64(j, "micro_batches", o->micro);
    cli_json_str(j, "schedule", o->schedule == RKM_PIPE_GPIPE ? "gpipe" : "1f1b");
    if (o->link > 0)
        cli_json_num(j, "link_bytes_per_second", o->link);
    else
        cli_json_null(j, "link_bytes_per_second");
    cli_pipe_json_budgets(j, c);
    cli_json_u64(j, "baseline_peak", c->G->st.baseline_peak);
    cli_json_u64(j, "baseline_arena", c->G->baseline_arena);
    cli_json_num(j, "baseline_time", c->G->st.baseline_time);
}

static void cli_pipe_json(const cli_pipe *c)
{
    const cli_graph *G = c->G;
    const char *dir = c->o->value[OPT_OUTPUT];
    const rkm_pipeline *pp = c->way[WAY_CHOSEN].pp;
    cli_json j = {stdout, 0, 1};
    cli_json_open(&j, NULL, '{');
    cli_pipe_json_head(&j, c);
    cli_json_num(&j, "step_time", c->way[WAY_CHOSEN].step_time);
    cli_json_open(&j, "stages", '[');
    for (int32_t s = 0; s < rkm_pipeline_num_stages(pp); s++) {
        rkm_pipeline_stage_info in;
        const rkm_graph *sg;
        const rkm_plan *pl;
        rkm_plan_stats ps;
        int32_t tin, tout;
        rkm_pipeline_stage(pp, s, &in, &sg, &pl);
        rkm_plan_stats_get(pl, &ps);
        cli_stage_ends(sg, &tin, &tout);
        cli_json_open(&j, NULL, '{');
        cli_json_i64(&j, "stage", s);
        cli_json_str(&j, "first_op", cli_op_name(G->g, in.first_op));
        cli_json_str(&j, "last_op", cli_op_name(G->g, in.last_op));
        cli_json_i64(&j, "first_block", in.first_block);
        cli_json_i64(&j, "blocks", in.n_blocks);
        cli_json_str(&j, "input", cli_tensor_name(sg, tin));
        cli_json_str(&j, "output", cli_tensor_name(sg, tout));
        cli_json_i64(&j, "in_flight", in.in_flight);
        cli_json_u64(&j, "budget", in.budget);
        cli_json_num(&j, "fwd_seconds", in.fwd_seconds);
        cli_json_num(&j, "bwd_seconds", in.bwd_seconds);
        cli_json_num(&j, "overhead", in.overhead);
        cli_json_u64(&j, "recomputes", ps.recomputes);
        cli_json_u64(&j, "kept_bytes", in.kept_bytes);
        cli_json_u64(&j, "peak", in.peak);
        cli_json_u64(&j, "arena_bytes", in.arena_bytes);
        cli_json_u64(&j, "arena_alignment", ps.alignment);
        if (dir) {
            char path[4096];
            snprintf(path, sizeof path, "%s/stage%d.rkg", dir, (int)s);
            cli_json_str(&j, "graph_file", path);
            snprintf(path, sizeof path, "%s/stage%d.rkp", dir, (int)s);
            cli_json_str(&j, "plan_file", path);
        }
        cli_json_close(&j, '}');
    }
    cli_json_close(&j, ']');
    cli_json_open(&j, "compare", '{');
    for (int w = 0; w < CLI_WAYS; w++) {
        const cli_way *W = &c->way[w];
        if (!W->pp) {
            cli_json_null(&j, cli_way_keys[w]);
            continue;
        }
        cli_json_open(&j, cli_way_keys[w], '{');
        cli_json_str(&j, "algo", rkm_algo_name(W->algo));
        cli_json_num(&j, "step_time", W->step_time);
        cli_json_u64(&j, "max_peak", W->max_peak);
        cli_json_u64(&j, "max_arena", W->max_arena);
        cli_json_open(&j, "cuts", '['); /* the tensors between the stages */
        for (int32_t s = 1; s < rkm_pipeline_num_stages(W->pp); s++) {
            rkm_pipeline_stage_info in;
            rkm_block_info bi;
            rkm_pipeline_stage(W->pp, s, &in, NULL, NULL);
            int ok = rkm_graph_block_info(G->g, in.first_block, &bi) == RKM_OK;
            cli_json_str(&j, NULL, ok ? cli_tensor_name(G->g, bi.input) : NULL);
        }
        cli_json_close(&j, ']');
        cli_json_close(&j, '}');
    }
    cli_json_close(&j, '}');
    cli_json_open(&j, "compare_reason", '{'); /* why a way has no plan */
    for (int w = 0; w < CLI_WAYS; w++)
        if (!c->way[w].pp) cli_json_str(&j, cli_way_keys[w], c->way[w].why);
    cli_json_close(&j, '}');
    cli_json_close(&j, '}');
}

static int cmd_pipeline(rkm_context *ctx, const cli_opts *o)
{
    cli_graph G;
    cli_pipe c;
    memset(&c, 0, sizeof c);
    c.G = &G, c.o = o;
    int rc = cli_graph_load(ctx, o->operand[0], o, &G);
    if (rc) return rc;
    rc = cli_pipe_budgets(&c);
    c.way[WAY_STORE_ALL].algo = RKM_ALGO_NONE;
    c.way[WAY_FULL].algo = RKM_ALGO_FULL;
    c.way[WAY_UNIFORM].algo = c.way[WAY_CHOSEN].algo = o->algos[0];
    /* the answer first: its refusal (a stage no plan fits, a bad desc) ends the command */
    rkm_result e = rc ? RKM_OK : cli_pipe_plan(&c, WAY_CHOSEN, NULL);
    if (!rc && (e == RKM_ERROR_BUDGET || e == RKM_ERROR_TIMEOUT)) {
        rc = CLI_BUDGET;
        fprintf(stderr, "rockmate: %s: %s\n", G.path, c.way[WAY_CHOSEN].why);
        if (o->value[OPT_JSON]) { /* as plan's: the error and the line on stderr */
            char message[1200];
            snprintf(message, sizeof message, "%s: %s", G.path, c.way[WAY_CHOSEN].why);
            cli_json j = {stdout, 0, 1};
            cli_json_open(&j, NULL, '{');
            cli_pipe_json_head(&j, &c);
            cli_json_str(&j, "error", cli_result_names[e]);
            cli_json_i64(&j, "error_id", (int64_t)e);
            cli_json_str(&j, "message", message);
            cli_json_close(&j, '}');
        }
    } else if (!rc && e) {
        rc = cli_fail(ctx, e, G.path);
    }
    int32_t *cuts = rc ? NULL : malloc((size_t)o->stages * sizeof *cuts); /* P - 1 of them; P <= blocks now */
    if (!rc && !cuts) rc = cli_fail(ctx, RKM_ERROR_NOMEM, "pipeline");
    if (!rc && (e = rkm_graph_uniform_cut(G.g, o->stages, cuts)) != RKM_OK) rc = cli_fail(ctx, e, G.path);
    for (int w = WAY_STORE_ALL; w <= WAY_UNIFORM && !rc; w++)
        if ((e = cli_pipe_plan(&c, w, cuts)) && e != RKM_ERROR_BUDGET && e != RKM_ERROR_TIMEOUT)
            rc = cli_fail(ctx, e, G.path);
    if (!rc && o->value[OPT_OUTPUT]) rc = cli_pipe_write(ctx, o->value[OPT_OUTPUT], c.way[WAY_CHOSEN].pp);
    if (!rc && o->value[OPT_SVG]) rc = cli_pipe_svg(ctx, &c, o->value[OPT_SVG]);
    if (!rc && o->value[OPT_JSON])
        cli_pipe_json(&c);
    else if (!rc)
        cli_pipe_text(&c);
    for (int w = 0; w < CLI_WAYS; w++) rkm_pipeline_destroy(c.way[w].pp);
    free(cuts);
    free(c.budgets);
    rkm_graph_destroy(G.g);
    return rc;
}

/* Library warnings and progress, with --verbose (errors are printed by the
 * command that got them, once). */
static void cli_log(void *user, rkm_log_level level, const char *message)
{
    if (level == RKM_LOG_ERROR) return;
    cli_bar_clear(user);
    fprintf(stderr, "rockmate: %s: %s\n", level == RKM_LOG_WARN ? "warning" : "info", message);
}

int main(int argc, char **argv)
{
    cli_opts o;
    int rc = cli_parse(argc, argv, &o);
    if (rc >= 0) return rc;
    cli_bar bar;
    cli_bar_init(&bar, &o);
    o.bar = &bar;
    rkm_context_desc cd;
    memset(&cd, 0, sizeof cd);
    if (o.value[OPT_VERBOSE]) {
        cd.log = cli_log;
        cd.log_user = &bar;
        cd.log_level = RKM_LOG_INFO;
    }
    rkm_context *ctx;
    if (rkm_context_create(&cd, &ctx) != RKM_OK) {
        fprintf(stderr, "rockmate: out of memory\n");
        return CLI_INPUT;
    }
    static int (*const commands[CMD_COUNT])(rkm_context *, const cli_opts *) = {cmd_info, cmd_plan, cmd_check,
                                                                                cmd_sweep, cmd_pipeline};
    rc = cli_parse_algos(ctx, &o);
    if (rc < 0) rc = commands[o.cmd](ctx, &o);
    rkm_context_destroy(ctx);
    /* What went to standard output must have arrived (a full disk, a closed pipe). */
    if ((fflush(stdout) != 0 || ferror(stdout)) && rc == CLI_OK) {
        fprintf(stderr, "rockmate: writing standard output failed: %s\n", strerror(errno));
        rc = CLI_INPUT;
    }
    return rc;
}
