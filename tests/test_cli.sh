#!/usr/bin/env bash
# Tests of the command line tool build/rockmate: every command on every
# bundled graph, the JSON it prints, the files it writes, and its exit
# statuses (0 success, 1 bad input, 2 bad usage, 3 no plan fits the budget).
# Run from anywhere; prints "test_cli.sh: N passed, N failed, N skipped"
# and exits non-zero on failure. RKM_BUILD names the build folder (default build);
# RKM_CLI overrides the binary. Needs python3: the JSON and SVG checks run
# in one python process for the whole script (pycall), since python starts
# slowly (about 0.6 s of CPU a start here: 120 starts were half the run).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
cli=${RKM_CLI:-$build/rockmate}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. tests/lib.sh

# Build the tool if it is missing: through the Makefile, else directly.
if [[ ! -x $cli ]]; then
    if ! make -s BUILD="$build" "$build/rockmate" >&2 || [[ ! -x $cli ]]; then
        cli=$tmp/rockmate
        gcc -std=c11 -Wall -Wextra -Wpedantic -Werror -O1 -o "$cli" cli/rockmate_cli.c rockmate.c \
            -llpsolve55 -lcolamd -ldl -lm -pthread >&2 || { fail "build the CLI"; finish; }
    fi
fi
command -v python3 >/dev/null || { fail "python3 is needed for the JSON checks"; finish; }

# run ARGS...: runs the tool; sets rc, stdout in $tmp/out, stderr in $tmp/err.
run() {
    "$cli" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}
# expect NAME STATUS: the last run's exit status.
expect() {
    if [[ $rc == "$2" ]]; then ok; else fail "$1: exit status $rc, expected $2: $(head -c 400 "$tmp/err")"; fi
}
# stderr is exactly N lines, the first starting "rockmate: ".
err_lines() {
    [[ $(wc -l <"$tmp/err") == "$1" ]] && head -n 1 "$tmp/err" | grep -q '^rockmate: '
}
# stderr is one line that matches the extended regular expression.
err_is() {
    [[ $(wc -l <"$tmp/err") == 1 ]] && grep -qE "$1" "$tmp/err"
}

# The JSON and SVG checks. Each group prints "PASS name", "FAIL name: why"
# or "NOTE text" lines, which pycheck tallies; `values` prints figures.
cat >"$tmp/checks.py" <<'EOF'
import json, re, sys, xml.etree.ElementTree as ET

ALGOS = ["rockmate", "rotor", "sqrt", "checkmate", "none", "dtr", "full"]
PLAN_KEYS = ["algo", "budget", "peak", "time", "baseline_peak", "baseline_time", "overhead",
             "solve_seconds", "blocks", "block_classes", "steps", "ilp"]
ILP_KEYS = ["solves", "optimal", "suboptimal", "infeasible", "timeout", "failed", "seconds"]

def report(name, cond, why=""):
    print(("PASS " if cond else "FAIL ") + name + ("" if cond or not why else ": " + str(why)))

def load(path, name):
    try:
        with open(path) as f:
            d = json.load(f)
        report(name + ": JSON parses", True)
        return d
    except Exception as e:
        report(name + ": JSON parses", False, e)
        return None

def raw(path, key):
    """A top-level member's value exactly as the tool printed it."""
    m = re.search(r'^  "%s": (.*?),?$' % re.escape(key), open(path).read(), re.M)
    return m.group(1) if m else None

def plan_fields(d):
    return all(k in d for k in PLAN_KEYS) and all(k in d["ilp"] for k in ILP_KEYS)

def values(info):
    d = json.load(open(info))
    print(d["baseline_peak"], d["lower_bound"], *[json.dumps(d["min_budget"][a]) for a in ALGOS])

def graph(name, info_p, plan_p, check_p, ops, tensors, inb, file_steps):
    d = load(info_p, name + ": info")
    p = load(plan_p, name + ": plan --algo none")
    c = load(check_p, name + ": check")
    if d is None or p is None or c is None:
        return
    report(name + ": info ops, tensors, input_bytes match the file",
           [d["ops"], d["tensors"], d["input_bytes"]] == [int(ops), int(tensors), int(inb)])
    report(name + ": info fields", all(k in d for k in ["ops", "tensors", "baseline_peak", "baseline_time",
           "lower_bound", "input_bytes", "blocks", "block_classes", "block_list", "min_budget"]))
    bl = d["block_list"]
    bp0 = d["baseline_peak"]
    report(name + ": block list covers every op once, classes in range",
           len(bl) == d["blocks"] and sum(b["ops"] for b in bl) == d["ops"]
           and all(0 <= b["class"] < d["block_classes"] for b in bl))
    report(name + ": blocks chain: each block's input is the previous one's output",
           bl and bl[0]["input"] is None and all(bl[i]["input"] == bl[i - 1]["output"] for i in range(1, len(bl))))
    report(name + ": bounds ordered", d["input_bytes"] <= d["lower_bound"] <= d["baseline_peak"] and d["baseline_time"] > 0)
    mb, why = d["min_budget"], d.get("min_budget_reason", {})
    # sqrt's fixed checkpoints may need more than the baseline: no upper bound.
    report(name + ": min budgets: none is the baseline's arena, the others at least the lower bound or null with a reason",
           sorted(mb) == sorted(ALGOS) and mb["none"] == p["arena_bytes"] >= d["baseline_peak"]
           and all((v is None and why.get(a)) or (v is not None and d["lower_bound"] <= v) for a, v in mb.items()), mb)
    report(name + ": rotor and sqrt always have a smallest budget", mb["rotor"] is not None and mb["sqrt"] is not None, why)
    ob = d.get("overhead_bound", {})
    pcts = [90, 80, 70, 60, 50, 40, 30, 25, 20]
    vals = [ob.get("%d%%" % q, "missing") for q in pcts]
    report(name + ": overhead bound: null exactly below the lower bound, else >= 0 and growing as the budget shrinks",
           sorted(ob) == sorted("%d%%" % q for q in pcts)
           and all((v is None) == (int(bp0 * q / 100) < d["lower_bound"]) for v, q in zip(vals, pcts))
           and all(v >= 0 for v in vals if v is not None)
           and all(a <= b for a, b in zip([v for v in vals if v is not None], [v for v in vals if v is not None][1:])),
           ob)
    report(name + ": plan fields", plan_fields(p))
    bp = d["baseline_peak"]
    report(name + ": the baseline plan: algo none, at none's smallest budget, the baseline peak, no overhead, no recompute",
           [p["algo"], p["budget"], p["peak"], p["overhead"], p["recomputes"]] == ["none", mb["none"], bp, 0, 0])
    report(name + ": the plan file holds as many steps as reported", p["steps"] == int(file_steps))
    report(name + ": check fields, valid", plan_fields(c) and c["valid"] is True and c["steps"] == p["steps"])
    report(name + ": the arena holds the peak", p["arena_bytes"] >= p["peak"] and p["buffers"] > 0
           and [c["arena_bytes"], c["buffers"]] == [p["arena_bytes"], p["buffers"]])
    # Byte for byte: the baseline figures as check and info print them.
    for key in ["peak", "time"]:
        a, b = raw(check_p, key), raw(info_p, "baseline_" + key)
        report(name + ": check's %s equals info's baseline_%s, as printed" % (key, key), a is not None and a == b, (a, b))

def invalid(inv1, tensor, inv2, steps):
    d = load(inv1, "plan freeing a dead tensor")
    if d is not None:
        report("invalid plan: --json prints the object, valid false, step 0 and the rule",
               d["valid"] is False and d["fail_step"] == 0 and "free" in d["rule"] and d["peak"] is None
               and d["step"] == "free " + tensor, d)
    d = load(inv2, "truncated plan")
    if d is not None:
        report("truncated plan: fails at the end of the plan", d["valid"] is False and d["fail_step"] == int(steps), d)

def nofit(name, out, err, budget, min_budget, error):
    """plan --json with exit status 3: the error, the budget asked, the smallest that fits."""
    d = load(out, name + ": plan --json, no plan fits")
    if d is None:
        return
    line = open(err).read().rstrip("\n")
    want_min = None if min_budget == "null" else int(min_budget)
    report(name + ": exit 3 --json: error and its id, the stderr line as message, the budget asked, the smallest budget",
           isinstance(d, dict) and d.get("error") == error and d.get("error_id") == {"budget": 8, "timeout": 11}[error]
           and "rockmate: " + str(d.get("message")) == line and d.get("budget") == int(budget)
           and "min_budget" in d and d["min_budget"] == want_min and d.get("baseline_peak", 0) > 0, d)

def odd(out, path):
    d = load(out, "info on an odd path")
    if d is not None:
        report("odd path: the JSON string gives the path back", d["graph"] == path, d["graph"])

def sweep_none(out):
    d = load(out, "sweep --algo none")
    if d is not None:
        report("sweep --algo none: one plan, the baseline, at its arena", isinstance(d, list) and len(d) == 1
               and d[0]["algo"] == "none" and d[0]["peak"] == d[0]["baseline_peak"]
               and d[0]["budget"] == d[0]["arena_bytes"], d)

def info_copy(out):
    d = load(out, "info --copy")
    if d is None:
        return
    m, nc = d["min_budget"]["rockmate"], d.get("min_budget_no_copy")
    report("info --copy: rockmate's smallest budget with the link below its recompute-only floor without it, "
           "at or above the lower bound", isinstance(m, int) and isinstance(nc, int) and d["lower_bound"] <= m < nc,
           (d["lower_bound"], m, nc))

def sweep_copy(out):
    d = load(out, "sweep --copy")
    if d is None:
        return
    by = {}
    for o in d:
        by.setdefault(o["budget"], {})[o.get("copy_link")] = o
    pairs = [v for v in by.values() if True in v and False in v]
    report("sweep --copy: rockmate with the copy link and its twin without, at every budget, the twin never "
           "offloading and rockmate never slower (it keeps the faster)",
           len(pairs) == len(by) and len(pairs) >= 3
           and all(p[False].get("offloads", 0) == 0 and p[True]["time"] <= p[False]["time"] for p in pairs)
           and any(p[True].get("offloads", 0) > 0 and p[True]["time"] < p[False]["time"] for p in pairs),
           [(b, v.get(True, {}).get("time"), v.get(False, {}).get("time")) for b, v in sorted(by.items())])

def svg(*paths):
    for path in paths:
        try:
            root = ET.parse(path).getroot()
            ns = "{http://www.w3.org/2000/svg}"
            text = " ".join(t.text or "" for t in root.iter(ns + "text"))
            report(path + ": SVG with curves, axis labels and sans-serif text", root.tag == ns + "svg"
                   and len(list(root.iter(ns + "polyline"))) > 0 and "%" in text
                   and root.get("font-family") == "sans-serif", text[:200])
        except Exception as e:
            report(path + ": SVG parses", False, e)

def planners(name, info_p, folder, sweep_p, algos):
    d = json.load(open(info_p))
    bp = d["baseline_peak"]
    for a in algos.split(","):
        m, why = d["min_budget"][a], d["min_budget_reason"].get(a, "")
        # Only checkmate's may be missing, and only where lp_solve is
        # compiled out (RKM_OMIT_SOLVER); any other error is a failure.
        if m is None and a == "checkmate" and why.startswith("feature compiled out"):
            print("SKIP %s: %s: %s" % (name, a, why))
        elif m is None:
            report("%s: %s has a smallest budget" % (name, a), False, why)
        if m is None:
            continue
        p = load("%s/p-%s.json" % (folder, a), "%s: %s plan" % (name, a))
        c = load("%s/c-%s.json" % (folder, a), "%s: %s check" % (name, a))
        if p is None or c is None:
            continue
        report("%s: %s plan at its smallest budget: fields, peak within it, time at least the baseline's" % (name, a),
               plan_fields(p) and p["algo"] == a and p["budget"] == m and p["peak"] <= m and p["overhead"] >= -1e-9, p)
        report("%s: %s: the written plan re-checks valid with the planner's peak, time and steps" % (name, a),
               c["valid"] is True and [c["peak"], c["time"], c["steps"]] == [p["peak"], p["time"], p["steps"]])
    s = load(sweep_p, name + ": sweep")
    if s is None:
        return
    mins = [d["min_budget"][a] for a in ALGOS if d["min_budget"][a] is not None]
    report(name + ": sweep: every plan within its budget, budgets up to the baseline peak (or a larger minimum), one at it",
           isinstance(s, list) and s and all(plan_fields(x) and x["peak"] <= x["budget"] <= max(mins) for x in s)
           and any(x["budget"] == bp for x in s))
    for a in ALGOS:
        m = d["min_budget"][a]
        got = sorted(x["budget"] for x in s if x["algo"] == a)
        if m is not None:
            report("%s: sweep: %s's curve starts at its smallest budget" % (name, a), got and got[0] == m, got[:1])
    # More memory never costs time to an exact chain DP.
    r = sorted((x["budget"], x["time"]) for x in s if x["algo"] == "rotor")
    report(name + ": sweep: rotor's time does not grow with the budget",
           all(r[i][1] >= r[i + 1][1] - 1e-12 for i in range(len(r) - 1)), r)

def arena_is_budget(name, out):
    j = json.load(open(out))
    report(name, j["arena_bytes"] == j["budget"] == j["baseline_arena"], j)

def floors(name, out, algos, lower, recompute, copies):
    """docs/formats.md's worked floors: without a link (copies "0") the lower bound
    and every algorithm's smallest budget; with one, every smallest budget and the
    recompute-only floor beside them."""
    j = json.load(open(out))
    m = j["min_budget"]
    if copies == "1":
        ok = all(m[a] == int(lower) for a in algos.split(",")) and j["min_budget_no_copy"] == int(recompute)
    else:
        ok = j["lower_bound"] == int(lower) and all(m[a] == int(recompute) for a in algos.split(","))
    report(name, ok, (j["lower_bound"], m, j.get("min_budget_no_copy")))

PIPE_STAGE_KEYS = ["stage", "first_op", "last_op", "first_block", "blocks", "in_flight", "budget", "fwd_seconds",
                   "bwd_seconds", "overhead", "kept_bytes", "peak", "arena_bytes"]
WAYS = ["uniform_store_all", "uniform_full_recompute", "uniform_rockmate", "chosen"]

def pipeline(name, out, stages, micro, schedule, budgets, last_op, nulls):
    """pipeline --json: the stages in order covering the graph, each within its
    budget with its micro-batches in flight, the step time at least the
    bottleneck's and the critical path's, the four ways compared (`nulls`:
    those that must have no plan, with a reason)."""
    d = load(out, name)
    if d is None:
        return
    p, m = int(stages), int(micro)
    want_budgets = [int(b) for b in budgets.split(",")]
    if len(want_budgets) == 1:
        want_budgets *= p
    st = d.get("stages", [])
    report(name + ": the request echoed: stages, micro-batches, schedule, one budget per stage",
           [d.get("n_stages"), d.get("micro_batches"), d.get("schedule"), d.get("budgets")] == [p, m, schedule, want_budgets],
           {k: d.get(k) for k in ["n_stages", "micro_batches", "schedule", "budgets"]})
    report(name + ": a stage object per stage with every field",
           len(st) == p and all(all(k in s for k in PIPE_STAGE_KEYS) for s in st), st[:1])
    if len(st) != p or not all(all(k in s for k in PIPE_STAGE_KEYS) for s in st):
        return
    k_want = [m if schedule == "gpipe" else min(p - s, m) for s in range(p)]
    report(name + ": micro-batches in flight: 1F1B min(P - s, M), GPipe M", [s["in_flight"] for s in st] == k_want,
           [s["in_flight"] for s in st])
    report(name + ": the stages tile the graph: the first op first, the loss's op last, blocks in order, each "
           "stage's input the previous one's output",
           st[0]["first_block"] == 0 and st[0]["input"] is None and st[-1]["last_op"] == last_op
           and st[-1]["output"] is None
           and all(st[s]["first_block"] == st[s - 1]["first_block"] + st[s - 1]["blocks"]
                   and st[s]["input"] == st[s - 1]["output"] is not None for s in range(1, p)), st)
    report(name + ": every stage within its own budget: kept <= peak <= arena <= budget",
           all(s["budget"] == b and 0 < s["kept_bytes"] <= s["peak"] <= s["arena_bytes"] <= b
               for s, b in zip(st, want_budgets)), [(s["kept_bytes"], s["peak"], s["arena_bytes"], s["budget"]) for s in st])
    t = [s["fwd_seconds"] + s["bwd_seconds"] for s in st]
    report(name + ": the step time at least M x the slowest stage and one micro-batch through every stage",
           d["step_time"] >= m * max(t) * (1 - 1e-9) and d["step_time"] >= sum(t) * (1 - 1e-9), (d["step_time"], t))
    cmp, why = d.get("compare", {}), d.get("compare_reason", {})
    nulls = [w for w in nulls.split(",") if w]
    report(name + ": compare: the four ways, null exactly where named, with a reason naming the stage",
           sorted(cmp) == sorted(WAYS) and all((cmp[w] is None) == (w in nulls) for w in WAYS)
           and sorted(why) == sorted(nulls) and all("stage " in why[w] for w in nulls), (cmp, why))
    ok = [w for w in WAYS if cmp.get(w)]
    report(name + ": compare: each plan's step time, fullest stage's peak and arena, its cuts",
           all(isinstance(cmp[w]["step_time"], float) and cmp[w]["max_peak"] <= cmp[w]["max_arena"]
               and len(cmp[w]["cuts"]) == p - 1 for w in ok), cmp)
    c = cmp.get("chosen") or {}
    report(name + ": compare: the chosen cut is the per-stage table's, never slower than the uniform cut",
           c.get("step_time") == d["step_time"] and c.get("max_peak") == max(s["peak"] for s in st)
           and c.get("max_arena") == max(s["arena_bytes"] for s in st)
           and c.get("cuts") == [s["output"] for s in st[:-1]]
           and (cmp.get("uniform_rockmate") is None or c["step_time"] <= cmp["uniform_rockmate"]["step_time"]), c)

def pipe_slower(name, fast, slow):
    """The same stage plans (the uniform cut's) with a link take longer."""
    a, b = json.load(open(fast)), json.load(open(slow))
    ua, ub = a["compare"]["uniform_rockmate"], b["compare"]["uniform_rockmate"]
    report(name, b["link_bytes_per_second"] == 1e9 and a["link_bytes_per_second"] is None
           and ua["max_arena"] == ub["max_arena"] and ub["step_time"] > ua["step_time"], (ua, ub))

def pipe_nofit(name, out, err):
    d = load(out, name)
    if d is None:
        return
    line = open(err).read().rstrip("\n")
    report(name + ": exit 3 --json: the error, its id and the stderr line as message, no stages",
           d.get("error") == "budget" and d.get("error_id") == 8 and "rockmate: " + str(d.get("message")) == line
           and "stages" not in d and len(d.get("budgets", [])) == d.get("n_stages"), d)

def pipe_svg(path, stages, micro):
    """The chart: a bar per phase (forward #56B4E9, backward #E69F00), a memory
    line per stage, the stages named."""
    try:
        text = open(path).read()
        root = ET.fromstring(text)
        ns = "{http://www.w3.org/2000/svg}"
        texts = [t.text or "" for t in root.iter(ns + "text")]
        p, m = int(stages), int(micro)
        report(path + ": SVG from <svg to </svg>: a bar per phase, a memory line per stage, the stages named",
               text.lstrip().startswith("<?xml") and "<svg " in text and text.rstrip().endswith("</svg>")
               and root.tag == ns + "svg"
               and len([r for r in root.iter(ns + "rect") if r.get("fill") in ("#56B4E9", "#E69F00")]) == 2 * p * m
               and len(list(root.iter(ns + "polyline"))) == p
               and all("stage %d" % s in texts for s in range(p)), texts[:8])
    except Exception as e:
        report(path + ": SVG parses", False, e)

if sys.argv[1:] == ["--serve"]:
    # One call a line, its arguments separated by \x1f; each answer ends
    # with a \x04 line. An exception is the call's answer (a failure), but
    # for values, whose caller reads figures (there it goes to stderr).
    import traceback
    for line in sys.stdin:
        args = line.rstrip("\n").split("\x1f")
        try:
            globals()[args[0]](*args[1:])
        except Exception:
            print(traceback.format_exc().rstrip("\n"), file=sys.stderr if args[0] == "values" else sys.stdout)
        print("\x04", flush=True)
else:
    globals()[sys.argv[1]](*sys.argv[2:])
EOF
coproc PY { exec python3 -u "$tmp/checks.py" --serve; }

# pycall FUNCTION ARGS...: one call of a checks.py function in that python
# process, its output lines into the array `answer`; status 1 if python has
# ended.
pycall() {
    local IFS=$'\x1f' line
    answer=()
    [[ -n ${PY[1]:-} ]] && printf '%s\n' "$*" >&"${PY[1]}" || return 1
    while IFS= read -r -u "${PY[0]}" line; do
        [[ $line == $'\x04' ]] && return 0
        answer+=("$line")
    done
    return 1
}
# pycheck FUNCTION ARGS...: a group of checks; each PASS, FAIL or SKIP line
# its answer prints is counted, any other line (an exception) is a failure.
pycheck() {
    local line
    pycall "$@" || answer+=("python3 ended before its answer")
    for line in "${answer[@]}"; do
        case $line in
        PASS\ *) ok ;;
        FAIL\ *) fail "${line#FAIL }" ;;
        SKIP\ *) skip "${line#SKIP }" ;;
        *) fail "python check $1: $line" ;;
        esac
    done
}

# --- usage, version, usage errors (exit 2) ------------------------------------
g0=tests/graphs/multi-output.rkg
run --help
expect "--help" 0
check "--help prints usage on stdout" grep -q '^usage: rockmate' "$tmp/out"
run plan -h
expect "plan -h" 0
run --version
expect "--version" 0
version=$(sed -n 's/^#define RKM_VERSION_STRING "\(.*\)"/\1/p' rockmate.h)
check "--version prints the header's version" grep -qx "rockmate $version" "$tmp/out"

usage_case() {
    local name=$1
    shift
    run "$@"
    expect "usage: $name" 2
    check "usage: $name: one line and a hint on stderr" err_lines 2
    check "usage: $name: nothing on stdout" test ! -s "$tmp/out"
}
usage_case "no command"
usage_case "unknown command" frobnicate "$g0"
usage_case "unknown option" info "$g0" --frob
usage_case "missing GRAPH" info
usage_case "missing PLAN" check "$g0"
usage_case "extra operand" info "$g0" "$g0"
usage_case "plan without --budget" plan "$g0"
usage_case "option without value" plan "$g0" --budget
usage_case "option given twice" plan "$g0" --budget 1 --budget 2
usage_case "option of another command" check "$g0" x.rkp --svg x.svg
usage_case "unknown algorithm" plan "$g0" --budget 50% --algo magic
check "unknown algorithm: lists every algorithm, dtr and full included" \
    grep -q "(rockmate, rotor, sqrt, checkmate, none, dtr, full)" "$tmp/err"
usage_case "list for plan" plan "$g0" --budget 50% --algo rotor,sqrt
usage_case "algorithm twice" sweep "$g0" --algo rotor,rotor
usage_case "bad budget" plan "$g0" --budget 12XB
usage_case "bad --points" sweep "$g0" --points 1
usage_case "bare budget below 4 KiB" plan "$g0" --budget 50
check "bare budget below 4 KiB: the hint says 50% or 50B" grep -qE "'50%'.*'50B'" "$tmp/err"
run plan "$g0" --budget 50B --algo rotor
expect "explicit bytes below 4 KiB: planned or refused as a budget, not as usage" 3
usage_case "bad --slots" plan "$g0" --budget 50% --slots -3
usage_case "bad --ilp-time-limit" plan "$g0" --budget 50% --ilp-time-limit 0
# The default, rockmate, plans in either build; checkmate needs lp_solve.
run plan "$g0" --budget 95% -o /dev/null
expect "the default algorithm plans" 0
run plan tests/graphs/multi-output.rkg --budget 100% --algo checkmate -o /dev/null
lp_solve=$((rc == 0))
if ((lp_solve)); then # lp_solve is built in (not under OMIT=1)
    run plan tests/graphs/peer-gpt.rkg --budget 50% --ilp-time-limit 1e-6 -v -o /dev/null
    expect "--ilp-time-limit 1e-6 still plans" 0
    check "-v warns when every block ILP solve reaches its work limit" grep -q "every block ILP solve" "$tmp/err"
    run plan tests/graphs/peer-gpt.rkg --budget 50% --time-limit 1e-9 -o /dev/null
    expect "--time-limit 1e-9 still plans" 0
    check "a time limit that ran out is said" grep -q "ILP solves skipped: the time limit or the ILP budget ran out" "$tmp/out"
    check "a plan the time limit cut says so" grep -q "cut by the time limit" "$tmp/out"
    run plan tests/graphs/random30.rkg --budget 30% --time-limit 1e-9 -o /dev/null
    expect "no plan found within --time-limit" 3
    check "a time limit with no plan is named" grep -q "the time limit of 1e-09 s ran out" "$tmp/err"
    run plan tests/graphs/random30.rkg --budget 1271808 --time-limit 1e-9 --json
    expect "no plan found within --time-limit, --json" 3
    check "no plan found within --time-limit, --json: one line on stderr" err_lines 1
    pycheck nofit "time limit" "$tmp/out" "$tmp/err" 1271808 null timeout
else
    skip "the ILP time limits: lp_solve is compiled out"
    expect "without lp_solve, checkmate is bad input" 1
    check "without lp_solve, checkmate says it needs lp_solve" err_is "checkmate needs lp_solve"
    run plan tests/graphs/peer-gpt.rkg --budget 50% --json -o /dev/null
    expect "without lp_solve, rockmate plans" 0
    check "without lp_solve, rockmate makes no ILP solve" grep -q '"solves": 0' "$tmp/out"
fi
run plan tests/graphs/unet-d4.rkg --budget 60% -o "$tmp/nest.rkp"
expect "a U-Net plans with nesting" 0
check "plan says which classes came from nested planners" grep -q "2 classes from nested planners" "$tmp/out"
run plan tests/graphs/unet-d4.rkg --budget 60% --nest-ops never --json
expect "--nest-ops never plans" 0
check "--nest-ops never: no nested class" grep -q '"nested_classes": 0' "$tmp/out"
run check tests/graphs/unet-d4.rkg "$tmp/nest.rkp" --budget 60%
expect "the nested plan replays within its budget" 0
usage_case "bad --nest-ops" plan "$g0" --budget 50% --nest-ops sometimes
usage_case "--nest-ops 0" plan "$g0" --budget 50% --nest-ops 0
usage_case "bad --time-limit" plan "$g0" --budget 50% --time-limit soon
# Every option value is parsed whole (issue 42): trailing text, a unit the
# option does not take, a value too many; each a usage error whose line
# names the option. bad_value OPTION COMMAND VALUE...
names_option() { head -n 1 "$tmp/err" | grep -qF -- "$1"; }
bad_value() {
    local opt=$1 cmd=$2 v
    shift 2
    for v in "$@"; do
        local args=("$cmd" "$g0" "$opt" "$v")
        [[ $cmd == plan && $opt != --budget ]] && args+=(--budget 50%)
        usage_case "$cmd $opt $v" "${args[@]}"
        check "usage: $cmd $opt $v: the message names $opt" names_option "$opt"
    done
}
bad_value --budget plan 50%x 50s 50%,60% ' 50%'
bad_value --algo plan rotorx rotor,sqrt
bad_value --algo sweep rotor, rotor,magic rotor,rotor
bad_value --slots info 10x 10MB 10,20 +10 ' 10' 1e3
bad_value --time-limit info 5x 5MB 5,6 -5 0x1p3 inf
bad_value --ilp-time-limit info 0.03x 0.03GB 0.03,1 nan
bad_value --nest-ops info 24x 24KB 24,30 neverx
bad_value --points sweep 5x 5MB 5,6
bad_value --align info 64x 64s 64,128 3 0x40
bad_value --copy plan 1e9junk 1e9s 1e9,1e9,1GB 1e9,1e9,0,5 1e9, ,1e9 0 -1e9 1e400 1e9,1e9,-1 1e9,1e9,1us/s 0x10

# --- bad input (exit 1) ---------------------------------------------------------
# Standard output that cannot be written is an error, not a success.
if [[ -w /dev/full ]]; then
    for cmd in "info $g0" "info $g0 --json" "plan $g0 --algo none --budget 100% -o -" "plan $g0 --algo none --budget 100% --json"; do
        # shellcheck disable=SC2086
        "$cli" $cmd >/dev/full 2>"$tmp/err"
        rc=$?
        expect "$cmd into a full device" 1
        check "$cmd into a full device: one line saying so" err_is 'standard output|write'
    done
fi
printf 'rockmate-graph 1\ntensor x 4 input\ntensor y 4\nloss y\nop f fwd=1 bwd=1 in=x out=y\n' >"$tmp/lossfirst.rkg"
run info "$tmp/lossfirst.rkg"
expect "a loss statement before its op" 1
check "a loss statement before its op: says it comes after" err_is 'lossfirst\.rkg:4: loss: .*comes after'
run plan "$g0" --algo none --budget 100% --slots 99999999999
expect "--slots out of range" 2
check "--slots out of range: names the range" grep -q 'from 1 to 2147483647' "$tmp/err"
run plan "$g0" --algo none --budget 100% --svg /nonexistent-dir/x.svg
expect "--svg into a missing folder" 1
check "--svg into a missing folder: gives the reason" err_is 'x\.svg: cannot open for writing: No such file'
if [[ -w /dev/full ]]; then
    run plan "$g0" --algo none --budget 100% --svg /dev/full
    expect "--svg into a full device" 1
    check "--svg into a full device: gives the reason" err_is 'could not write the SVG file: No space'
fi
"$cli" info - --json <"$g0" >"$tmp/stdin.json" 2>"$tmp/err"
rc=$?
expect "a graph on standard input" 0
"$cli" info "$g0" --json >"$tmp/file.json" 2>/dev/null
check "a graph on standard input: the same figures as from its file" \
    cmp -s <(grep -v '"graph"\|"name"\|seconds' "$tmp/stdin.json") <(grep -v '"graph"\|"name"\|seconds' "$tmp/file.json")
echo junk | "$cli" info - >/dev/null 2>"$tmp/err"
rc=$?
expect "junk on standard input" 1
check "junk on standard input: names <stdin>:1" err_is '<stdin>:1:'
# check GRAPH -: the plan from standard input (not both from it).
"$cli" plan "$g0" --algo none --budget 100% -o "$tmp/stdin-base.rkp" >/dev/null 2>&1
"$cli" check "$g0" "$tmp/stdin-base.rkp" --json >"$tmp/plan-file.json" 2>/dev/null
run check "$g0" - --json <"$tmp/stdin-base.rkp"
expect "a plan on standard input" 0
check "a plan on standard input: the same figures as from its file" \
    cmp -s <(grep -v '"plan"\|seconds' "$tmp/out") <(grep -v '"plan"\|seconds' "$tmp/plan-file.json")
run check "$g0" - --budget 4096B <"$tmp/stdin-base.rkp"
expect "a plan on standard input over --budget" 3
check "a plan on standard input over --budget: one line naming <stdin>" err_is '^rockmate: <stdin>: the plan peaks at'
run check "$g0" - <<<"junk"
expect "junk plan on standard input" 1
check "junk plan on standard input: names <stdin>:1" err_is '<stdin>:1:'
run check - - </dev/null
expect "usage: GRAPH and PLAN both -" 2
check "usage: GRAPH and PLAN both -: one line and a hint on stderr" err_lines 2
check "usage: GRAPH and PLAN both -: nothing on stdout" test ! -s "$tmp/out"
run info tests/graphs
expect "a folder given as a graph" 1
check "a folder given as a graph: says it is a directory" err_is 'tests/graphs: .*[Ii]s a directory'
run check "$g0" tests/graphs
expect "a folder given as a plan" 1
check "a folder given as a plan: says it is a directory" err_is 'tests/graphs: .*[Ii]s a directory'
run info "$tmp/absent.rkg"
expect "missing graph file" 1
check "missing graph file: one line naming it" err_is 'absent\.rkg'
printf 'rockmate-graph 1\ntensor x 16 input\nop f fwd=1 bwd=1 in=x,y out=z\ntensor z 16\nloss z\n' >"$tmp/bad.rkg"
run info "$tmp/bad.rkg" --json
expect "malformed graph" 1
check "malformed graph: one line naming file:line" err_is "^rockmate: $tmp/bad\.rkg:3"
check "malformed graph: nothing on stdout" test ! -s "$tmp/out"
printf 'not-a-graph 1\n' >"$tmp/bad2.rkg"
run plan "$tmp/bad2.rkg" --budget 100%
expect "bad header" 1
check "bad header: names file:line" err_is 'bad2\.rkg:1'

# --- every bundled graph: info, the baseline plan, check ------------------------
# Independent figures straight from the file: op and tensor counts, input bytes.
file_figures() {
    awk '$1 == "op" { ops++ } $1 == "tensor" { t++; for (i = 4; i <= NF; i++) if ($i == "input") inb += $3 }
         END { printf "%d %d %d\n", ops, t, inb }' "$1"
}
plan_file_steps() { echo $(($(grep -cvE '^[[:space:]]*(#|$|align |graph )' "$1") - 1)); }
for g in tests/graphs/*.rkg; do
    name=$(basename "$g" .rkg)
    info=$tmp/$name.info.json
    run info "$g" --json --algo none,sqrt,rotor
    expect "$name: info --json" 0
    cp "$tmp/out" "$info"
    pycall values "$info"
    read -r bp lb _ _ _ _ nb _ <<<"${answer[0]:-}"
    if [[ -z ${nb:-} ]]; then
        fail "$name: info --json gives the baseline peak"
        continue
    fi

    # none's smallest budget: the baseline's arena (on resnet18-like-b32 its
    # 256-byte blocks take 128 bytes more than the peak)
    run plan "$g" --algo none --budget "$nb" -o "$tmp/$name.base.rkp" --json
    expect "$name: plan --algo none" 0
    cp "$tmp/out" "$tmp/$name.plan.json"
    check "$name: the plan file starts with its header" grep -q '^rockmate-plan 2' "$tmp/$name.base.rkp"
    run check "$g" "$tmp/$name.base.rkp" --json
    expect "$name: check of the baseline plan" 0
    cp "$tmp/out" "$tmp/$name.check.json"
    read -r f_ops f_tensors f_inputs <<<"$(file_figures "$g")"
    pycheck graph "$name" "$info" "$tmp/$name.plan.json" "$tmp/$name.check.json" "$f_ops" "$f_tensors" "$f_inputs" \
        "$(plan_file_steps "$tmp/$name.base.rkp")"

    run check "$g" "$tmp/$name.base.rkp" --budget "$((bp - 1))"
    expect "$name: check over --budget" 3
    check "$name: check over --budget: one line" err_lines 1
    run check "$g" "$tmp/$name.base.rkp" --budget "$nb"
    expect "$name: check at its own arena" 0
    # 100 % is the baseline's arena at --align: none plans there, at 1 and
    # 4096 too, its arena exactly the budget
    for al in 1 256 4096; do
        run plan "$g" --algo none --budget 100% --align $al --json
        expect "$name: plan --algo none --budget 100% --align $al" 0
        pycheck arena_is_budget "$name: at 100% (--align $al) none's arena is the budget" "$tmp/out"
    done
    run plan "$g" --algo none --budget "$((lb - 1))"
    expect "$name: plan --algo none below the lower bound" 3
    check "$name: exit 3 gives the smallest budget (the baseline's arena)" \
        err_is "smallest budget none can meet is [^(]*\($nb bytes"
    run plan "$g" --algo none --budget "$((lb - 1))" --json
    expect "$name: plan --algo none below the lower bound, --json" 3
    check "$name: exit 3 with --json: one line on stderr" err_lines 1
    pycheck nofit "$name" "$tmp/out" "$tmp/err" "$((lb - 1))" "$nb" budget
    for cmd in info plan check; do
        case $cmd in
        info) run info "$g" --algo none,sqrt,rotor ;;
        plan) run plan "$g" --algo none --budget "$nb" ;;
        check) run check "$g" "$tmp/$name.base.rkp" ;;
        esac
        expect "$name: $cmd (text)" 0
        check "$name: $cmd (text) prints a summary" test -s "$tmp/out"
    done
done

# --- invalid plans (exit 1) -------------------------------------------------------
g=tests/graphs/gpt2-tiny.rkg
base=$tmp/gpt2-tiny.base.rkp
tensor=$(awk '$1 == "tensor" && $0 !~ / input/ { print $2; exit }' "$g")
printf 'rockmate-plan 1\nfree %s\n' "$tensor" >"$tmp/inv1.rkp"
run check "$g" "$tmp/inv1.rkp" --json
expect "invalid plan (free of a dead tensor)" 1
check "invalid plan: one line naming step 0 and the rule" err_is 'step 0.*free'
cp "$tmp/out" "$tmp/inv1.json"
sed '$d' "$base" >"$tmp/inv2.rkp"
run check "$g" "$tmp/inv2.rkp" --json
expect "invalid plan (last step missing)" 1
cp "$tmp/out" "$tmp/inv2.json"
pycheck invalid "$tmp/inv1.json" "$tensor" "$tmp/inv2.json" "$(plan_file_steps "$tmp/inv2.rkp")"
printf 'rockmate-plan 1\nfwd no_such_op\n' >"$tmp/inv3.rkp"
run check "$g" "$tmp/inv3.rkp"
expect "plan naming an unknown op" 1
check "unknown op: names file:line" err_is 'inv3\.rkp:2'
run check "$g" "$tmp/absent.rkp"
expect "missing plan file" 1

# -o - writes the same plan to standard output.
run plan "$g" --algo none --budget 100% -o -
expect "plan -o -" 0
check "plan -o - equals the plan file" cmp -s "$tmp/out" "$base"

# Names in JSON are escaped: a graph path with a quote and a backslash.
odd="$tmp/we\"ird\\name.rkg"
cp "$g" "$odd"
run info "$odd" --json --algo none
expect "info on an odd path" 0
pycheck odd "$tmp/out" "$odd"

# --- charts and sweeps ----------------------------------------------------------------
run plan "$g" --algo none --budget 100% --svg "$tmp/plan.svg"
expect "plan --svg" 0
check "plan --svg: the title names the graph" grep -q 'gpt2-tiny' "$tmp/plan.svg"
run sweep "$g" --algo none --points 4 --json --svg "$tmp/sweep.svg"
expect "sweep --algo none" 0
pycheck sweep_none "$tmp/out"
run plan "$g" --algo rotor --budget 50% --svg "$tmp/plan-rotor.svg"
expect "plan --algo rotor --svg" 0
# The chart's per-step peaks are derived from the live memory; the tool warns
# if their maximum is not the simulator's peak.
check "plan --svg: the step peaks agree with the simulator (no warning)" test ! -s "$tmp/err"
run sweep "$g" --algo rotor,sqrt --points 5 --svg "$tmp/sweep2.svg"
expect "sweep --algo rotor,sqrt --svg" 0
check "sweep (text) prints a table" grep -q 'budget%' "$tmp/out"
run plan "$g" --algo rotor --budget 50% --log --svg "$tmp/plan-log.svg"
expect "plan --log --svg" 0
check "plan --log: ticks at 1, 2, 5 x 10^k" bash -c "grep -q '>0.5<' '$tmp/plan-log.svg' && grep -q '>5<' '$tmp/plan-log.svg'"
run sweep "$g" --algo rotor,sqrt --points 5 --log --svg "$tmp/sweep-log.svg"
expect "sweep --log --svg" 0
check "sweep --log: 1 % and 10 % ticks" bash -c "grep -q '>1<' '$tmp/sweep-log.svg' && grep -q '>10<' '$tmp/sweep-log.svg'"
# With a copy link (--copy): the sweep sets rockmate beside its twin planned
# without the link (the text's "(no copy)" column, the chart's dashed
# curve), and a plan's chart draws its copies in flight.
run sweep "$g" --algo rockmate --copy 25e9 --points 5 --json --svg "$tmp/sweep-copy.svg"
expect "sweep --copy --json --svg" 0
pycheck sweep_copy "$tmp/out"
check "sweep --copy --svg: the twin's dashed curve and legend" grep -q 'rockmate, no copy' "$tmp/sweep-copy.svg"
run sweep "$g" --algo rockmate,rotor --copy 25e9 --points 3
expect "sweep --copy (text)" 0
check "sweep --copy (text): the (no copy) column follows rockmate's" grep -qE 'budget% +rockmate +\(no copy\) +rotor$' "$tmp/out"
# info with a copy link: rockmate's smallest budget, where offloading goes
# below the recompute-only floor (resnet18-like-b32: 46.0 % against 57.4 %),
# and the floor without the link on the line after it.
run info tests/graphs/resnet18-like-b32.rkg --algo rockmate --copy 450e9 --json
expect "info --copy --json" 0
pycheck info_copy "$tmp/out"
run info tests/graphs/resnet18-like-b32.rkg --algo rockmate --copy 450e9
expect "info --copy (text)" 0
check "info --copy (text): the (no copy) line follows rockmate's" \
    bash -c "grep -A1 -E '^    rockmate +[0-9]' '$tmp/out' | grep -qE '^    \(no copy\) +[0-9]'"
run plan "$g" --copy 25e9 --budget 40% --svg "$tmp/plan-copy.svg"
expect "plan --copy --svg" 0
check "plan --copy --svg: copies in flight drawn" grep -q 'offloads in flight' "$tmp/plan-copy.svg"
# Units (issue 42): a value with one plans as the bare number does. same_plan
# NAME ARGS -- ARGS: the two plan files are the same bytes.
same_plan() {
    local name=$1 a=() b=()
    shift
    while [[ $1 != -- ]]; do a+=("$1"); shift; done
    shift
    b=("$@")
    run plan "$g" "${a[@]}" -o "$tmp/units-a.rkp"
    expect "$name: ${a[*]}" 0
    run plan "$g" "${b[@]}" -o "$tmp/units-b.rkp"
    expect "$name: ${b[*]}" 0
    check "$name: the same plan" cmp -s "$tmp/units-a.rkp" "$tmp/units-b.rkp"
}
same_plan "--copy with units" --budget 40% --copy 1GB,1GB,1us -- --budget 40% --copy 1e9,1e9,1e-6
check "--copy with units: the plan offloads (1 byte a second, or a latency of 1 s, would not)" \
    grep -q '^offload ' "$tmp/units-a.rkp"
same_plan "--copy with binary units and /s" --budget 40% --copy 1GiB/s,512MiB/s,5us \
    -- --budget 40% --copy 1073741824,536870912,5e-6
same_plan "--copy D2H alone" --budget 40% --copy 25GB/s -- --budget 40% --copy 25e9,25e9,0
same_plan "durations with units" --budget 50% --ilp-time-limit 30ms --time-limit 60s \
    -- --budget 50% --ilp-time-limit 0.03 --time-limit 60
run check "$g" "$base" --align 1KiB --json
expect "--align 1KiB" 0
check "--align 1KiB: laid out at 1024 bytes" grep -q '"arena_alignment": 1024,' "$tmp/out"
pycheck svg "$tmp/plan.svg" "$tmp/sweep.svg" "$tmp/plan-rotor.svg" "$tmp/sweep2.svg" "$tmp/plan-log.svg" "$tmp/sweep-log.svg" \
    "$tmp/sweep-copy.svg" "$tmp/plan-copy.svg"

# --- planners: every algorithm the library offers for the graph -----------------------
# On the graphs where each algorithm plans quickly and deterministically: the
# ILPs of rockmate (and checkmate's, on the smallest graph) solve to
# optimality well inside their time limits there, so that info, plan and
# sweep, run apart, find the same options. An algorithm whose min_budget is
# null fails, but checkmate compiled out (OMIT=1), a skip.
planner_algos() {
    case $1 in
    multi-output | inplace-split) echo rotor sqrt rockmate checkmate ;;
    gpt2-tiny | mlp16 | resnet18-like-b32 | gpt2-124M-b4-t64) echo rotor sqrt rockmate ;;
    *) echo rotor sqrt ;;
    esac
}
# inplace-split (issue 20): an in-place op whose input is read again later;
# checkmate's smallest budget was one its own plan refused.
for name in multi-output inplace-split gpt2-tiny mlp16 random30 peer-gpt resnet18-like-b32 gpt2-124M-b4-t64; do
    g=tests/graphs/$name.rkg
    algos=$(planner_algos "$name")
    list=$(echo $algos none | tr ' ' ,)
    info=$tmp/$name.planners.json
    run info "$g" --json --algo "$list"
    expect "$name: info --algo $list" 0
    cp "$tmp/out" "$info"
    declare -A min_of=()
    pycall values "$info"
    read -r bp lb 'min_of[rockmate]' 'min_of[rotor]' 'min_of[sqrt]' 'min_of[checkmate]' _ <<<"${answer[0]:-}"
    [[ -n ${bp:-} ]] || { fail "$name: info --algo $list gives the smallest budgets"; continue; }
    mkdir -p "$tmp/$name"
    for algo in $algos; do
        min=${min_of[$algo]:-null}
        [[ $min == null ]] && continue
        run plan "$g" --algo "$algo" --budget "$min" --json -o "$tmp/$name/p-$algo.rkp"
        expect "$name: $algo plans at its smallest budget" 0
        cp "$tmp/out" "$tmp/$name/p-$algo.json"
        run check "$g" "$tmp/$name/p-$algo.rkp" --json --budget "$min"
        expect "$name: $algo: the written plan re-checks within the budget" 0
        cp "$tmp/out" "$tmp/$name/c-$algo.json"
        if ((min > lb)); then
            run plan "$g" --algo "$algo" --budget "$((min - 1))"
            expect "$name: $algo one byte under its smallest budget" 3
            check "$name: $algo: exit 3 names the same smallest budget as info" \
                err_is "smallest budget $algo can meet is [^(]*\($min bytes"
        fi
        run plan "$g" --algo "$algo" --budget "$((lb - 1))"
        expect "$name: $algo below the lower bound" 3
    done
    run sweep "$g" --algo "$list" --points 5 --json
    expect "$name: sweep --algo $list" 0
    cp "$tmp/out" "$tmp/$name/sweep.json"
    pycheck planners "$name" "$info" "$tmp/$name" "$tmp/$name/sweep.json" "${algos// /,}"
done

# In place (docs/formats.md's second worked example): info counts the ops,
# check replays a plan with in-place steps, plan writes them. Its budgets
# are the contract's exact bytes (--align 1): at 256-byte alignment its
# tensors of a few hundred bytes each round up to whole blocks.
cp tests/fuzz/corpus/graph/seed-inplace-hand.rkg "$tmp/ip.rkg"
run info "$tmp/ip.rkg"
expect "in place: info" 0
check "in place: info counts the in-place ops" grep -q '^  ops            5 (in place: 2 forwards, 2 backwards)$' "$tmp/out"
check "in place: info's baseline peak" grep -q '(3304 bytes)' "$tmp/out"
printf 'rockmate-plan 1\nfwd fc\nfwd relu inplace\nfwd fc2\nfwd add inplace\nfree a\nfwd ce save\nloss\nfree loss\nbwd ce\nfree_saved ce\nfree_grad loss\nfree s\nfwd fc\nfwd relu inplace\nbwd add inplace\nbwd fc2\nfree_grad b\nbwd relu inplace\nfree a\nbwd fc\nfree_grad h\n' >"$tmp/ip.rkp"
run check "$tmp/ip.rkg" "$tmp/ip.rkp" --budget 3100B
expect "in place: check at the lower bound, 256-byte arena" 3
check "in place: says the arena is over, the peak within" err_is 'arena at 256-byte alignment is .* over the budget .* though its peak \(3100 bytes\) is within it'
run check "$tmp/ip.rkg" "$tmp/ip.rkp" --budget 3100B --align 1
expect "in place: check at the lower bound" 0
printf 'rockmate-plan 1\nfwd fc\nfwd relu inplace\nfree h\n' >"$tmp/ip-bad.rkp"
run check "$tmp/ip.rkg" "$tmp/ip-bad.rkp"
expect "in place: a free of the input run over" 1
check "in place: the message names the line and the rule" err_is 'ip-bad.rkp:4: step 2 \(free h\): free: the tensor must be live'
run plan "$tmp/ip.rkg" --algo sqrt --budget 3100B --align 1 -o "$tmp/ip-plan.rkp"
expect "in place: plan at the lower bound" 0
check "in place: the plan file runs in place" grep -q ' inplace$' "$tmp/ip-plan.rkp"

# docs/formats.md, "What sets the smallest budgets": the worked example. A
# rebuild of `a` needs f's workspace beside grad(b), keeping it adds its
# bytes to bwd l: 7104 without copies for every planner; with a link `a`
# waits on the host and every planner meets the lower bound, 6104.
awk '/^### What sets the smallest budgets/{f=1} f && /^```$/{n++; if (n==2) exit; next} f && n==1' docs/formats.md >"$tmp/floor.rkg"
floor_algos=rockmate,dtr,checkmate
((lp_solve)) || { floor_algos=rockmate,dtr; skip "floors: checkmate's: lp_solve is compiled out"; }
run info "$tmp/floor.rkg" --align 1 --algo $floor_algos --json
expect "floors: info" 0
pycheck floors "floors: recompute-only 7104 for $floor_algos, the lower bound 6104" "$tmp/out" $floor_algos 6104 7104 0
run info "$tmp/floor.rkg" --align 1 --algo $floor_algos --copy 1e6,1e6 --json
expect "floors: info with a link" 0
pycheck floors "floors: with copies 6104 for $floor_algos (7104 without)" "$tmp/out" $floor_algos 6104 7104 1
run plan "$tmp/floor.rkg" --align 1 --budget 6104 --copy 1e6,1e6 -o "$tmp/floor.rkp"
expect "floors: rockmate's plan at 6104" 0
awk '/^### What sets the smallest budgets/{f=1} f && /^```$/{n++; if (n==4) exit; next} f && n==3' docs/formats.md >"$tmp/floor-doc.rkp"
steps_of() { grep -vE '^(rockmate-plan|align|graph) ' "$1"; }
check "floors: the plan's steps are those docs/formats.md shows" cmp -s <(steps_of "$tmp/floor.rkp") <(steps_of "$tmp/floor-doc.rkp")

# A plan file keeps its alignment and the graph it was made for: check lays
# it out at the file's alignment unless --align names another, and refuses
# it against a graph that differs, naming the difference.
check "plan file: says its alignment" grep -qx 'align 1' "$tmp/ip-plan.rkp"
run check "$tmp/ip.rkg" "$tmp/ip-plan.rkp" --budget 3100B --json
expect "plan file: check at the file's alignment" 0
check "plan file: its arena's alignment is the file's" grep -q '"arena_alignment": 1,' "$tmp/out"
run check "$tmp/ip.rkg" "$tmp/ip-plan.rkp" --budget 3100B --align 256
expect "plan file: check --align over the file's" 3
sed 's/^tensor loss 4$/tensor loss 8/' "$tmp/ip.rkg" >"$tmp/ip-other.rkg"
run check "$tmp/ip-other.rkg" "$tmp/ip-plan.rkp"
expect "plan file: against a graph with another tensor size" 1
check "plan file: names the line and the tensor" \
    err_is "ip-plan.rkp:3: the plan was made for another graph: tensor sizes .* at tensor 'loss'"
sed 's/^op fc2 fwd=2 /op fc2 fwd=3 /' "$tmp/ip.rkg" >"$tmp/ip-other.rkg"
run check "$tmp/ip-other.rkg" "$tmp/ip-plan.rkp"
expect "plan file: against a graph with another op cost" 1
check "plan file: names the line and the op" \
    err_is "ip-plan.rkp:4: the plan was made for another graph: op costs differ at op 'fc2'"
run check "$tmp/ip.rkg" "$tmp/ip-plan.rkp" --copy 25e9
expect "plan file: against a graph with another copy link" 1
check "plan file: names the copy link" \
    err_is "ip-plan.rkp:6: the plan was made for another graph: the copy link differs"

# --- pipeline --------------------------------------------------------------------------
# gpt2-tiny in 3 stages, 4 micro-batches (6 blocks): the chosen cut with
# rockmate's stage plans beside the uniform cut's three ways; at 50 % of the
# whole graph's arena storing everything does not fit its first stage.
g=tests/graphs/gpt2-tiny.rkg
half=1641472 # 50 % of its baseline arena
pipe=(pipeline "$g" --stages 3 --micro-batches 4)
run "${pipe[@]}" --budget 50%
expect "pipeline at 50%" 0
check "pipeline (text): the stage table and the chosen cut's line" \
    bash -c "grep -qE '^  stage +blocks +first op +last op +k +overhead' '$tmp/out' && grep -qE '^    chosen cut, rockmate +[0-9.e-]+ s ' '$tmp/out'"
check "pipeline (text): a way with no plan says why" grep -qE '^    uniform cut, store all +no plan: pipeline: stage 0 ' "$tmp/out"
check "pipeline (text): nothing on stderr" test ! -s "$tmp/err"
rm -rf "$tmp/stages"
run "${pipe[@]}" --budget 50% --json -o "$tmp/stages" --svg "$tmp/pipe.svg"
expect "pipeline --json -o --svg" 0
cp "$tmp/out" "$tmp/pipe.json"
pycheck pipeline "pipeline 3x4 at 50%" "$tmp/pipe.json" 3 4 1f1b "$half" xent uniform_store_all,uniform_full_recompute
pycheck pipe_svg "$tmp/pipe.svg" 3 4
# Each stage's files: the graph reads back and the plan replays on it, its
# own arena within the stage's budget.
for s in 0 1 2; do
    run check "$tmp/stages/stage$s.rkg" "$tmp/stages/stage$s.rkp" --budget "$half"
    expect "pipeline -o: rockmate check accepts stage $s within its budget" 0
done
# check knows a stage plan's phases (the loss step splits them); the last
# stage ends at the loss: no phases line there.
run check "$tmp/stages/stage1.rkg" "$tmp/stages/stage1.rkp"
check "check: a stage plan's phases and what a micro-batch keeps" \
    grep -qE '^  phases         a pipeline stage.s: forward steps 0-[0-9]+ .*backward from step [0-9]+ .*keeps .* between them$' "$tmp/out"
run check "$tmp/stages/stage2.rkg" "$tmp/stages/stage2.rkp"
check "check: the last stage (a loss, not an output) has no phases line" bash -c "! grep -q 'phases' '$tmp/out'"
run check "$tmp/stages/stage1.rkg" "$tmp/stages/stage1.rkp" --json
check "check --json: a stage plan's phase_step and kept_bytes" \
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['phase_step'] > 0 and 0 < d['kept_bytes'] <= d['peak']" "$tmp/out"
check "pipeline -o: the stage graphs are stage graphs (input grad, output)" \
    bash -c "grep -q ' input grad\$' '$tmp/stages/stage1.rkg' && grep -q '^output ' '$tmp/stages/stage1.rkg' && grep -q '^loss ' '$tmp/stages/stage2.rkg'"
# GPipe holds all 4 micro-batches on every stage: more memory than 1F1B.
run "${pipe[@]}" --budget 60% --schedule gpipe --json
expect "pipeline --schedule gpipe" 0
pycheck pipeline "pipeline gpipe" "$tmp/out" 3 4 gpipe 1969766 xent uniform_store_all,uniform_full_recompute
run "${pipe[@]}" --budget 1969766,1641472,2MiB --json
expect "pipeline with a budget per stage" 0
pycheck pipeline "pipeline with a budget per stage" "$tmp/out" 3 4 1f1b 1969766,1641472,2097152 xent \
    uniform_store_all,uniform_full_recompute
run "${pipe[@]}" --budget 200% --json
expect "pipeline at 200%" 0
pycheck pipeline "pipeline at 200%: every way plans" "$tmp/out" 3 4 1f1b 6565888 xent ""
run "${pipe[@]}" --budget 50% --link 1e9 --json
expect "pipeline --link 1e9" 0
pycheck pipeline "pipeline --link" "$tmp/out" 3 4 1f1b "$half" xent uniform_store_all,uniform_full_recompute
pycheck pipe_slower "pipeline --link: the uniform cut's same stage plans take longer over the link" \
    "$tmp/pipe.json" "$tmp/out"
# Bad input: one line on stderr and the status of its kind.
run pipeline "$g" --stages 7 --micro-batches 4 --budget 50%
expect "pipeline: more stages than blocks" 1
check "pipeline: more stages than blocks: one line naming the rule" \
    err_is '^rockmate: tests/graphs/gpt2-tiny\.rkg: pipeline: 7 stages, but the graph has 6 block\(s\), so 6 stage\(s\) at most'
run "${pipe[@]}" --budget 10%
expect "pipeline: a budget no stage meets" 3
check "pipeline: a budget no stage meets: one line naming the stage and what it needs" \
    err_is '^rockmate: tests/graphs/gpt2-tiny\.rkg: pipeline: stage [0-9]+ \([0-9]+ in flight\) has no rockmate plan within its budget of 328294 bytes; it needs [0-9]+ bytes at least$'
run "${pipe[@]}" --budget 10% --json
expect "pipeline: a budget no stage meets, --json" 3
pycheck pipe_nofit "pipeline: a budget no stage meets" "$tmp/out" "$tmp/err"
usage_case "pipeline: --micro-batches 0" "${pipe[@]:0:4}" --micro-batches 0 --budget 50%
check "usage: pipeline: --micro-batches 0: names the option and its range" grep -q -- "--micro-batches wants an integer from 1" "$tmp/err"
usage_case "pipeline: a budget list of another length" "${pipe[@]}" --budget 50%,60%
check "usage: pipeline: a budget list of another length: names the rule" \
    grep -qF -- "--budget lists 2 budgets for 3 stages: give one budget, every device's, or one per stage (3)" "$tmp/err"
usage_case "pipeline: without --stages" pipeline "$g" --micro-batches 4 --budget 50%
usage_case "pipeline: without --micro-batches" pipeline "$g" --stages 3 --budget 50%
usage_case "pipeline: without --budget" "${pipe[@]}"
usage_case "pipeline: --stages 0" pipeline "$g" --stages 0 --micro-batches 4 --budget 50%
usage_case "pipeline: a bad budget in the list" "${pipe[@]}" --budget 50%,5x%,50%
usage_case "pipeline: unknown --schedule" "${pipe[@]}" --budget 50% --schedule zb
usage_case "pipeline: --link 0" "${pipe[@]}" --budget 50% --link 0
usage_case "pipeline: -o -" "${pipe[@]}" --budget 50% -o -
usage_case "pipeline: an algorithm list" "${pipe[@]}" --budget 50% --algo rotor,sqrt
usage_case "pipeline: an option of another command" "${pipe[@]}" --budget 50% --points 3
usage_case "--stages for another command" plan "$g" --budget 50% --stages 3
printf x >"$tmp/afile"
run "${pipe[@]}" --budget 50% -o "$tmp/afile"
expect "pipeline -o onto a file" 1
check "pipeline -o onto a file: one line naming it" err_is 'afile: cannot make the folder'

finish
