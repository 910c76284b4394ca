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

static const char *const rkm__algo_names[RKM_ALGO_COUNT] = {"default", "rockmate", "rotor", "sqrt", "checkmate", "none", "dtr"};

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
    return rkm__err(ctx, RKM_ERROR_ARGUMENT, "unknown algorithm '%.64s' (default, rockmate, rotor, sqrt, checkmate, none or dtr)",
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
    if (g->p.stage == RKM_STAGE_SOLVE && pl->d.algo == RKM_ALGO_ROCKMATE)
        in = fmax(in, 1.0 - (double)pl->work_left / (double)RKM__SOLVE_WORK);
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

/* Past the call's deadline (time_limit), or cancelled by the progress
 * callback: 1, and the call is cut. Checked between candidates, moves and
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
    return pl->cut;
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
