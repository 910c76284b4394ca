#!/usr/bin/env python3
"""docs/figures.py: every figure README.md quotes, from the command that makes it.

    python3 docs/figures.py            regenerate all of them (minutes): rewrite
                                       README.md between its figure markers and
                                       redraw docs/*.svg with the README's commands
    python3 docs/figures.py --check    regenerate the deterministic ones only (seconds)
                                       and exit 1, naming each figure, where README.md
                                       or docs/*.svg differ from them; writes nothing
    python3 docs/figures.py --no-bench the full mode without bench/bench_layout (the
                                       one figure that needs minutes keeps its value)

Options: --build DIR (default $RKM_BUILD, else build), where build/rockmate,
build/gpt2 and build/bench/bench_layout are (the full mode builds them with
make; --check expects them built, as tests/test_readme_figures.sh does).

A figure in README.md sits between <!-- figures:NAME --> and <!-- /figures -->
(HTML comments: invisible on GitHub; inline in a sentence, or on their own
lines around a block). Each NAME is one entry of figures() below, which says
what command makes it and of which kind it is:

  det     the same on every machine (peaks, overheads on graphs with fixed
          costs, smallest budgets, counts, constants of src/internal.h):
          --check regenerates and compares it
  timing  seconds on this machine (median of RUNS runs): full mode only
  bench   expensive (bench_layout plans some 349 plans, minutes) and not quite
          deterministic (it gives checkmate a 10 s wall-clock limit, so under
          load a plan can drop out): full mode only
  demo    the demo's transcript: the demo profiles its op times when it runs,
          so its step times, plan (peak, arena, overhead, steps, classes) and
          solve time vary; --check compares only its deterministic figures
          (DEMO_FACTS: the model, ops, tensors, baseline peak, budget, losses,
          digest)

The charts docs/*.svg come from deterministic plans: --check draws them
again in a temporary folder and compares them byte for byte.
"""
import difflib
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
RUNS = 3  # timing figures: the median of this many runs

PEER = "tests/graphs/peer-gpt.rkg"
SWEEP_SVG = "docs/sweep-peer-gpt.svg"
TINY = "tests/graphs/gpt2-tiny.rkg"
PLAN_SVG = "docs/plan-gpt2-tiny-40.svg"
PLAN_ARGS = ["plan", TINY, "--budget", "40%", "--svg"]  # + the SVG's path
PIPE_SVG = "docs/pipeline-gpt2-tiny.svg"
PIPE_ARGS = ["pipeline", TINY, "--stages", "3", "--micro-batches", "4", "--budget", "50%", "--svg"]
RESNET = "tests/graphs/resnet18-like-b32.rkg"
SWEEP_ALGOS = ["rockmate", "rotor", "sqrt"]  # the table's columns (the chart also draws none)

MARKER = re.compile(r"<!-- figures:([a-z0-9-]+) -->(.*?)<!-- /figures -->", re.S)


class Fail(Exception):
    pass


def run(argv, timed=False):
    """Run argv from the repository root; its stdout (and seconds if timed)."""
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        raise Fail("%s: exit status %d\n%s" % (" ".join(map(shlex.quote, argv)), p.returncode, p.stderr[-2000:]))
    return (p.stdout, dt) if timed else p.stdout


def start(argv):
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p):
    out, err = p.communicate()
    if p.returncode != 0:
        raise Fail("%s: exit status %d\n%s" % (" ".join(map(shlex.quote, p.args)), p.returncode, err[-2000:]))
    return out


def pct(x, nd=2):
    return "0 %" if x == 0 else "%.*f %%" % (nd, x)


# ---- the demo ----

def demo_argv(build):
    """The Makefile's DEMO (what make demo runs), with $(BUILD) filled in."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        m = re.search(r"^DEMO = (.*)$", f.read(), re.M)
    if not m:
        raise Fail("Makefile: no DEMO = line (what make demo runs)")
    return shlex.split(m.group(1).replace("$(BUILD)", build))


def demo_block(out):
    """The transcript as README shows it: the first and last step, '...' between."""
    lines = out.rstrip("\n").split("\n")
    steps = [i for i, l in enumerate(lines) if re.match(r"step \d+/\d+:", l)]
    if len(steps) > 2:
        lines = lines[: steps[0] + 1] + ["..."] + lines[steps[-1]:]
    return "\n```\n" + "\n".join(lines) + "\n```\n"


# What --check compares in the demo's transcript (the rest comes from
# profiled op times): a name and a pattern, every match's groups.
DEMO_FACTS = [
    ("the model line", r"^(gpt2: .*)$"),
    ("the graph's ops and tensors", r"^graph: (\d+ ops, \d+ tensors),"),
    ("the baseline peak (graph line)", r"^graph: .*(baseline peak \d+ bytes)$"),
    ("the baseline peak", r"^baseline: (peak \d+ bytes)"),
    ("the budget", r"^(budget: .*)$"),
    ("the memory line's baseline", r"^memory: .*\((baseline \d+ bytes)"),
    ("a step's loss", r"^(step \d+/\d+: loss [0-9.]+)"),
    ("the digest", r"^(digest: .*)$"),
    ("the check's loss", r"^check: (loss [0-9.]+)"),
    ("the budget (in words)", r"(the budget of \d+ bytes)"),
    ("the demo line's budget", r"^demo: ok (budget=\d+)"),
]


def demo_facts(text):
    return [(name, re.findall(pat, text, re.M)) for name, pat in DEMO_FACTS]


def demo_shape(out):
    m = re.search(r"^gpt2: L=(\d+) C=(\d+) NH=(\d+) V=\d+ B=(\d+) T=(\d+)", out, re.M)
    if not m:
        raise Fail("the demo's first line is not 'gpt2: L=.. C=.. NH=.. V=.. B=.. T=..'")
    L, C, NH, B, T = m.groups()
    return "%s layers, %s channels, %s heads, T=%s, B=%s" % (L, C, NH, T, B)


# ---- the peer-gpt sweep ----

def sweep_table(plans):
    """Overhead per budget (a row) and algorithm (a column) from sweep --json."""
    base = plans[0]["baseline_peak"]
    cell = {(p["budget"], p["algo"]): p["overhead"] for p in plans}
    rows = ["| budget (% of baseline peak) | " + " | ".join(a + " overhead" for a in SWEEP_ALGOS) + " |",
            "|---" * (1 + len(SWEEP_ALGOS)) + "|"]
    for b in sorted({p["budget"] for p in plans}):
        cells = [pct(100 * cell[b, a]) if (b, a) in cell else "no plan" for a in SWEEP_ALGOS]
        rows.append("| %.2f | %s |" % (100 * b / base, " | ".join(cells)))
    return "\n\n" + "\n".join(rows) + "\n\n"  # blank lines: the markers do not touch the table


def internal_constant(name):
    with open(os.path.join(ROOT, "src", "internal.h")) as f:
        m = re.search(r"^#define %s (\S+)" % name, f.read(), re.M)
    if not m:
        raise Fail("src/internal.h: no #define %s" % name)
    return m.group(1)


# ---- everything ----

def figures(build, check, bench, svg_dir):
    """{name: (kind, text)}; with check, the det and demo ones only. The
    charts are drawn into svg_dir (docs/ itself in the full mode)."""
    cli = os.path.join(build, "rockmate")
    f = {}
    sweep_argv = [cli, "sweep", PEER, "--json", "--svg", os.path.join(svg_dir, os.path.basename(SWEEP_SVG))]
    if check:
        # the two slow ones side by side (two cores), the cheap ones meanwhile
        demo_p, sweep_p = start(demo_argv(build)), start(sweep_argv)
    else:
        # the demo alone first, its step times unloaded by the rest
        demo_out = run(demo_argv(build))
    run([cli] + PLAN_ARGS + [os.path.join(svg_dir, os.path.basename(PLAN_SVG))])
    run([cli] + PIPE_ARGS + [os.path.join(svg_dir, os.path.basename(PIPE_SVG))])

    bound = json.loads(run([cli, "info", RESNET, "--algo", "none", "--json"]))["overhead_bound"]["90%"]
    plan = json.loads(run([cli, "plan", RESNET, "--budget", "90%", "--json"]))
    if pct(100 * plan["overhead"]) != pct(100 * bound):
        raise Fail("resnet18-bound: rockmate's plan at 90 %% of %s has %s overhead, the bound is %s: the "
                   "README's sentence (rockmate's plan is that bound) no longer holds; rewrite it"
                   % (RESNET, pct(100 * plan["overhead"]), pct(100 * bound)))
    f["resnet18-bound"] = ("det", pct(100 * bound))
    f["whole-graph-seconds"] = ("det", internal_constant("RKM__WHOLE_GRAPH_SECONDS"))
    # the effort rule's level at W's floor (design.md, 'Effort'): need x ops^2 <= W
    w_min = float(internal_constant("RKM__WORK_MIN").rstrip("uU"))
    need = float(internal_constant("RKM__NEED_GRAPH_ILP"))
    f["whole-graph-ops"] = ("det", str(int(math.isqrt(int(w_min / need)))))
    per_object = float(internal_constant("RKM__WORK_PER_OBJECT").rstrip("uU"))
    f["work-floor-objects"] = ("det", str(int(w_min // per_object)))

    if check:
        demo_out = finish(demo_p)
        sweep_json = finish(sweep_p)
    else:
        times = []
        for _ in range(RUNS):
            sweep_json, dt = run(sweep_argv, timed=True)
            times.append(dt)
        f["sweep-seconds"] = ("timing", "%.1f" % statistics.median(times))
        floor = [run([cli, "info", PEER, "--algo", "rockmate"], timed=True)[1] for _ in range(RUNS)]
        f["sweep-floor-seconds"] = ("timing", "%.1f" % statistics.median(floor))
    plans = json.loads(sweep_json)
    f["sweep-points"] = ("det", str(len({p["budget"] for p in plans})))
    f["peer-gpt-table"] = ("det", sweep_table(plans))

    budget = demo_argv(build)[demo_argv(build).index("--budget") + 1]
    f["demo-budget"] = ("det", budget.replace("%", " %"))
    f["demo-shape"] = ("det", demo_shape(demo_out))
    f["demo-output"] = ("demo", demo_block(demo_out))

    if bench and not check:
        run(["make", "-s", "BUILD=" + build, os.path.join(build, "bench", "bench_layout")])
        out = run([os.path.join(build, "bench", "bench_layout")])
        m = re.search(r"^(\d+) plans: arena = aligned peak: old \d+, skyline alone \d+, new (\d+);", out, re.M)
        if not m:
            raise Fail("bench_layout: no summary line '<N> plans: arena = aligned peak: ...'")
        n, at = int(m.group(1)), int(m.group(2))
        f["layout-at-bound"] = ("bench", "%d of %d plans (%.1f %%)" % (at, n, 100 * at / n))
        sys.stderr.write("bench_layout: " + "\n".join(out.rstrip().split("\n")[-2:]) + "\n")
    return f


def readme_commands_ok(text):
    """The README names the commands that draw the charts; they must be ours."""
    flat = " ".join(text.split())
    want = ["rockmate sweep %s --svg %s" % (PEER, SWEEP_SVG), "rockmate %s %s" % (" ".join(PLAN_ARGS), PLAN_SVG),
            "rockmate %s %s" % (" ".join(PIPE_ARGS), PIPE_SVG)]
    return ["README.md no longer gives the command `%s` that docs/figures.py runs: make them agree" % w
            for w in want if w not in flat]


def main(argv):
    check = "--check" in argv
    bench = "--no-bench" not in argv
    build = os.environ.get("RKM_BUILD", "build")
    if "--build" in argv:
        build = argv[argv.index("--build") + 1]
    unknown = [a for a in argv if a.startswith("-") and a not in ("--check", "--no-bench", "--build")]
    if unknown:
        sys.stderr.write(__doc__)
        return 2
    with open(README) as fh:
        text = fh.read()
    problems = readme_commands_ok(text)
    in_readme = {}
    for m in MARKER.finditer(text):
        if m.group(1) in in_readme:
            problems.append("README.md: figure %s marked twice" % m.group(1))
        in_readme[m.group(1)] = m.group(2)
        # A line that starts with <!-- begins an HTML block: in a sentence
        # that would cut the paragraph and show the rest of the line raw.
        if "\n" not in m.group(2) and (m.start() == 0 or text[m.start() - 1] == "\n"):
            problems.append("README.md: figure %s starts a line: on GitHub that ends the paragraph; "
                            "move a word before it" % m.group(1))

    if not check:
        run(["make", "-s", "BUILD=" + build, "lib", "cli", os.path.join(build, "gpt2")])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            new = figures(build, check, bench, tmp if check else os.path.join(ROOT, "docs"))
        except Fail as e:
            sys.stderr.write("figures: %s\n" % e)
            return 1
        if check:
            for svg, how in ((SWEEP_SVG, "rockmate sweep %s --svg %s" % (PEER, SWEEP_SVG)),
                             (PLAN_SVG, "rockmate %s %s" % (" ".join(PLAN_ARGS), PLAN_SVG)),
                             (PIPE_SVG, "rockmate %s %s" % (" ".join(PIPE_ARGS), PIPE_SVG))):
                with open(os.path.join(tmp, os.path.basename(svg))) as a, open(os.path.join(ROOT, svg)) as b:
                    if a.read() != b.read():
                        problems.append("%s differs from what `%s` draws now" % (svg, how))

    for name in in_readme:
        if name not in new and name not in ("sweep-seconds", "sweep-floor-seconds", "layout-at-bound"):
            problems.append("README.md: figure %s: no command in docs/figures.py makes it" % name)
    for name, (kind, value) in new.items():
        if name not in in_readme:
            problems.append("README.md: figure %s (%s) has no <!-- figures:%s --> marker" % (name, kind, name))
        elif check and kind == "det" and (in_readme[name] != value if "\n" in value
                                          else " ".join(in_readme[name].split()) != value):
            if "\n" in value:  # a block: the lines that differ
                diff = difflib.unified_diff(in_readme[name].strip().split("\n"), value.strip().split("\n"),
                                            "README.md", "now", n=0, lineterm="")
                problems.append("figure %s drifted:\n  %s" % (name, "\n  ".join(list(diff)[2:])))
            else:
                problems.append("figure %s drifted:\n  README.md: %s\n  now:       %s"
                                % (name, " ".join(in_readme[name].split()), value))
        elif check and kind == "demo":
            for (fact, old), (_, now) in zip(demo_facts(in_readme[name]), demo_facts(value)):
                if old != now:
                    problems.append("figure %s drifted: %s:\n  README.md: %s\n  now:       %s"
                                    % (name, fact, "; ".join(old) or "(none)", "; ".join(now) or "(none)"))
    if check:
        for p in problems:
            sys.stderr.write("figures --check: %s\n" % p)
        if problems:
            sys.stderr.write("figures --check: README.md or docs/*.svg differ from the commands; "
                             "python3 docs/figures.py regenerates them\n")
            return 1
        print("figures --check: %d deterministic figures, the demo's and 3 charts as README.md has them"
              % sum(k == "det" for k, _ in new.values()))
        return 0
    if problems:
        for p in problems:
            sys.stderr.write("figures: %s\n" % p)
        return 1
    text = MARKER.sub(lambda m: "<!-- figures:%s -->%s<!-- /figures -->"
                      % (m.group(1), new[m.group(1)][1] if m.group(1) in new else m.group(2)), text)
    with open(README, "w") as fh:
        fh.write(text)
    for name, (kind, value) in sorted(new.items()):
        print("%-20s %-7s %s" % (name, kind, value.strip().split("\n")[0] + (" ..." if "\n" in value.strip() else "")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
