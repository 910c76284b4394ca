/* progress.c -- a planner call's deadline check, progress reports and their cancel; the algorithms' names
 *
 * Uses (through internal.h): base.c.
 *
 * A call reports as it starts (rkm__progress_begin) and then from its
 * planner's checks of the deadline (rkm__over), rate-limited; a callback
 * that returns non-zero marks the call cancelled, and rkm__over then
 * answers 1 as if the deadline had passed, so that a cancelled call
 * stops where a cut one would. The call's API function turns that into
 * RKM_ERROR_CANCELLED (rkm__progress_result). Reports read the planner
 * and change nothing it decides on: plans are the same with or without
 * a callback. Only the top planner reports: a nested one's checks are its
 * parent's (rkm__over). */
#include "internal.h"

static const char *const rkm__algo_names[RKM_ALGO_COUNT] = {"default", "rockmate", "rotor", "sqrt", "checkmate", "none", "dtr",
                                                                "full"};

const char *rkm_algo_name(rkm_algo a) { return (int)a >= 0 && a < RKM_ALGO_COUNT ? rkm__algo_names[a] : "unknown"; }

rkm_result rkm_algo_from_name(rkm_context *ctx, const char *name, rkm_algo *out)
{
    if (!ctx) return RKM_ERROR_ARGUMENT;
    if (!name || !out) return rkm__err(ctx, RKM_ERROR_ARGUMENT, "rkm_algo_from_name: name or out is NULL");
    for (int a = 0; a < RKM_ALGO_COUNT; a++)
        if (strcmp(name, rkm__algo_names[a]) == 0) {
            *out = (rkm_algo)a;
            return RKM_OK;
        }
    return rkm__err(ctx, RKM_ERROR_ARGUMENT, "unknown algorithm '%.64s' (default, rockmate, rotor, sqrt, checkmate, none, dtr or full)",
                    name);
}

static const char *const rkm__stage_names[] = {"", "create", "solve", "min_budget"};

/* A call (stage) starts: the first report, fraction 0. */
RKM__PRIVATE void rkm__progress_begin(rkm_planner *pl, rkm_stage stage, uint64_t budget)
{
    rkm__progress *g = &pl->prog;
    memset(g, 0, sizeof *g);
    g->p.stage = stage;
    g->p.stage_name = rkm__stage_names[stage];
    g->p.algo = pl->d.algo;
    g->p.baseline_time = pl->base_time;
    g->p.budget = stage == RKM_STAGE_SOLVE ? budget : 0;
    g->start = rkm__now();
    g->hi = 1;
    (void)rkm__progress_report(pl, g->start, 1);
}

/* How far the call is by its work meters: the part under way (a block
 * class, a probe) and how far it is, by the ILP solve's work, the search's
 * meter or the part's own measure. */
static double rkm__progress_work(const rkm_planner *pl)
{
    const rkm__progress *g = &pl->prog;
    double in = fmax(g->sub, g->ilp);
    if (pl->work_limit) in = fmax(in, (double)pl->work_spent / (double)pl->work_limit);
    return g->lo + (g->hi - g->lo) * fmin(fmax(in, 0), 1);
}

/* A report at `now` when one is due (force: always); 1 once cancelled. */
RKM__PRIVATE int rkm__progress_report(rkm_planner *pl, double now, int force)
{
    rkm__progress *g = &pl->prog;
    if (g->cancelled || !pl->d.progress) return g->cancelled;
    if (!force && now - g->last < RKM__PROGRESS_SECONDS) return 0;
    g->last = now;
    double span = pl->deadline - g->start, f = rkm__progress_work(pl);
    if (span > 0) f = fmax(f, (now - g->start) / span);
    if (!force) g->p.fraction = fmax(g->p.fraction, fmin(f, 1.0)); /* the first report says 0 */
    g->p.seconds = now - g->start;
    g->cancelled = pl->d.progress(pl->d.progress_user, &g->p) != 0;
    return g->cancelled;
}

/* ---- the call's work meter --------------------------------------------
 *
 * One a call: rkm_planner_create, rkm_planner_solve and
 * rkm_planner_min_budget each start it (rkm__work_start) and nothing
 * inside the call resets it. Every loop of the planner charges it what it
 * did, in one unit (RKM__WORK's comment in internal.h), and takes its
 * share from what is left, so no call spends more than its limit and a
 * call that finds no plan ends by work, as deterministically as one that
 * finds one. A nested planner's work is its top planner's. A part of a
 * call may be held to an allowance of its own (rkm__work_part): the
 * smallest budget is sought within the same amount whichever call seeks
 * it, so that it does not depend on the order of the calls. */
static rkm_planner *rkm__top(rkm_planner *pl)
{
    while (pl->parent) pl = pl->parent;
    return pl;
}

RKM__PRIVATE void rkm__work_start(rkm_planner *pl, uint64_t limit)
{
    pl->work_spent = 0;
    pl->work_limit = pl->work_cap = limit;
}

RKM__PRIVATE uint64_t rkm__work_left(rkm_planner *pl)
{
    const rkm_planner *t = rkm__top(pl);
    return t->work_spent < t->work_cap ? t->work_cap - t->work_spent : 0;
}

RKM__PRIVATE uint64_t rkm__work_spent(rkm_planner *pl) { return rkm__top(pl)->work_spent; }

RKM__PRIVATE void rkm__work_charge(rkm_planner *pl, uint64_t work)
{
    rkm_planner *t = rkm__top(pl);
    t->work_spent = work < UINT64_MAX - t->work_spent ? t->work_spent + work : UINT64_MAX;
}

/* An ILP solve on the call's meter. ILP work is counted in seconds (as
 * rkm__ilp_stats.work counts them), RKM__ILP_STEPS_PER_S units each, the
 * greedy's calibration. rkm__work_ilp_begin: the solve's work limit, at
 * most `lim` and what the meter has left; rkm__work_ilp_end charges what
 * it did within that (lp_solve stops at its limit, give or take the one
 * callback at which it sees it), ends its progress figure and checks the
 * deadline, where it may have stopped. */
RKM__PRIVATE rkm__ilp_turn rkm__work_ilp_begin(rkm_planner *pl, double lim)
{
    return (rkm__ilp_turn){fmin(lim, (double)rkm__work_left(pl) / RKM__ILP_STEPS_PER_S), pl->ilp.work};
}

RKM__PRIVATE void rkm__work_ilp_end(rkm_planner *pl, rkm__ilp_turn t)
{
    rkm__work_charge(pl, (uint64_t)(fmin(fmax(pl->ilp.work - t.work0, 0), t.lim) * RKM__ILP_STEPS_PER_S));
    pl->prog.ilp = 0;
    (void)rkm__over(pl);
}

/* The part that follows may spend `allow` more, whatever the part around
 * it has left (the call's limit is set to hold it: rkm__work_limit): the
 * cap before it, for rkm__work_part_end. */
RKM__PRIVATE uint64_t rkm__work_part(rkm_planner *pl, uint64_t allow)
{
    rkm_planner *t = rkm__top(pl);
    uint64_t was = t->work_cap;
    t->work_cap = allow < UINT64_MAX - t->work_spent ? t->work_spent + allow : UINT64_MAX;
    return was;
}

RKM__PRIVATE void rkm__work_part_end(rkm_planner *pl, uint64_t was) { rkm__top(pl)->work_cap = was; }

/* W: a solve's work, from the graph's size alone (the rule: internal.h,
 * RKM__WORK_MIN). */
RKM__PRIVATE uint64_t rkm__work_solve(const rkm_graph *g)
{
    double w = (double)RKM__WORK_PER_OBJECT * (double)(g->n_ops + g->n_tensors);
    return w < (double)RKM__WORK_MIN ? RKM__WORK_MIN : w >= 0x1p62 ? (uint64_t)1 << 62 : (uint64_t)w;
}

/* The one effort rule (internal.h, RKM__NEED_GRAPH_ILP): does g afford a
 * part that costs `need` units per square of the `ops` it works on (g's
 * own or a block's)? Parts whose cost grows with the graph, not faster,
 * are bounded by the meter alone. */
RKM__PRIVATE int rkm__affords(const rkm_graph *g, int64_t ops, double need)
{
    return need * (double)ops * (double)ops <= (double)rkm__work_solve(g);
}

/* Past the call's deadline (time_limit), or cancelled by the progress
 * callback: 1, and the call is cut. Also 1, without a cut, once the
 * call's work (or its part's) is spent. Checked between candidates, moves and
 * probes, never inside one, so a call overruns its deadline by one such
 * unit of work and its finish (the slack rockmate.h gives); while it
 * returns 0 it changes nothing, so an uncut call is as deterministic as if
 * there were no limit. It is also where progress is reported (rkm__progress_report):
 * a nested planner's checks are its parent's. */
RKM__PRIVATE int rkm__over(rkm_planner *pl)
{
    if (pl->cut) return 1;
    double now = rkm__now();
    if (pl->parent ? rkm__over(pl->parent) : rkm__progress_report(pl, now, 0)) pl->cut = 1;
    if (now > pl->deadline) pl->cut = 1;
    return pl->cut || !rkm__work_left(pl);
}

/* The part [lo, hi] of the call's work starts (its progress `sub` 0); a
 * nested planner's parts are inside its parent's, which stands for them. */
RKM__PRIVATE void rkm__progress_part(rkm_planner *pl, double lo, double hi)
{
    if (pl->parent) return;
    pl->prog.lo = lo;
    pl->prog.hi = hi;
    pl->prog.sub = pl->prog.ilp = 0;
}

/* How far the part under way is, in [0, 1]. */
RKM__PRIVATE void rkm__progress_sub(rkm_planner *pl, double sub)
{
    if (!pl->parent) pl->prog.sub = sub;
}

/* A plan the call made: the fastest within a solve's budget so far. */
RKM__PRIVATE void rkm__progress_plan(rkm_planner *pl, const rkm_plan *p)
{
    rkm__progress *g = &pl->prog;
    if (pl->parent || !p || g->p.stage != RKM_STAGE_SOLVE || p->stats.peak > g->p.budget) return;
    if (g->p.best_time == 0 || p->stats.time < g->p.best_time) g->p.best_time = p->stats.time;
}

/* The whole-graph ILP's check (rkm__ilp_work.stop): its progress, then the
 * planner's rkm__over. */
RKM__PRIVATE int rkm__progress_ilp(void *user, double done)
{
    rkm_planner *pl = user;
    if (pl->d.algo == RKM_ALGO_CHECKMATE) pl->prog.ilp = done; /* rockmate's is one start of many */
    return rkm__over(pl);
}

/* The call's result: RKM_ERROR_CANCELLED with where it stopped when the
 * callback cancelled it and r is what a cut gives (a plan, none within the
 * time, none within the budget), else r. `what` names the API call. */
RKM__PRIVATE rkm_result rkm__progress_result(rkm_planner *pl, rkm_result r, const char *what)
{
    const rkm__progress *g = &pl->prog;
    if (!g->cancelled || (r != RKM_OK && r != RKM_ERROR_TIMEOUT && r != RKM_ERROR_BUDGET)) return r;
    char budget[48] = "";
    if (g->p.budget) snprintf(budget, sizeof budget, " for %llu bytes", (unsigned long long)g->p.budget);
    return rkm__err(pl->ctx, RKM_ERROR_CANCELLED,
                    "%s: cancelled by the progress callback in its %s stage (%s%s), %.0f %% done after %.3g s", what,
                    g->p.stage_name, rkm_algo_name(pl->d.algo), budget, 100 * g->p.fraction, rkm__now() - g->start);
}
