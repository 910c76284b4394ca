#!/usr/bin/env bash
# The library at the working tree against a build of commit REV, side by
# side in one run: a temporary git worktree of REV gets the working tree's
# bench/*.c and bench/*.h (so the harness is the same and only the library
# differs), both trees build the named benchmarks, and each benchmark runs
# in both at once, one core each (`taskset -c 0` REV's, `-c 1` the working
# tree's), both from the working tree's root (the same graphs and
# reference files), with --tsv. Then, per row (graph, budget, algorithm):
# the overhead old/new and the planning seconds old/new; at the end the
# rows whose overhead is equal, better (lower, or a plan where there was
# none) and worse (listed with their figures), and the geometric mean of
# new/old planning time over the rows timed in both. Seconds compare only
# within one run: the two runs share the machine.
#   bash bench/vs.sh REV [BENCH...]    (default: bench_quality bench_dagblocks)
# A BENCH is a bench/*.c with a --tsv option. RKM_BUILD: the working tree's
# build folder (default build). VS_OUT=DIR keeps the raw TSVs there.
# Long: use `nice -n 5` on a shared machine.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
build=${RKM_BUILD:-build}

if (($# < 1)) || [[ $1 == -h || $1 == --help ]]; then
    sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
fi
rev=$1
shift
(($#)) || set -- bench_quality bench_dagblocks
for b in "$@"; do
    [[ -f bench/$b.c ]] || { echo "vs.sh: no bench/$b.c"; exit 2; }
    grep -q -- '--tsv' "bench/$b.c" || { echo "vs.sh: bench/$b.c has no --tsv option"; exit 2; }
done
sha=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "vs.sh: $rev is no commit"; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/rkm-vs.XXXXXX") || exit 1
old=$tmp/tree
pids=()
# shellcheck disable=SC2317 # run by the trap
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    git -C "$root" worktree remove --force "$old" 2>/dev/null
    rm -rf "$tmp"
    git -C "$root" worktree prune
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

git worktree add --detach --quiet "$old" "$sha" || exit 1
cp bench/*.c bench/*.h "$old/bench/" || exit 1
targets=()
for b in "$@"; do targets+=("bench/$b"); done

echo "vs.sh: building ${targets[*]} at the working tree (HEAD $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- || echo ', with changes')) and at $(git rev-parse --short "$sha")"
make -j2 BUILD="$build" "${targets[@]/#/$build/}" >"$tmp/new.log" 2>&1 ||
    { tail -n 20 "$tmp/new.log"; echo "vs.sh: the working tree's build failed"; exit 1; }
make -C "$old" -j2 BUILD=build "${targets[@]/#/build/}" >"$tmp/old.log" 2>&1 ||
    { tail -n 20 "$tmp/old.log"; echo "vs.sh: $rev's build failed (the working tree's bench sources against $rev's library)"; exit 1; }

# One core each where there are two.
pin_old=() pin_new=()
if command -v taskset >/dev/null && (($(nproc) >= 2)); then
    pin_old=(taskset -c 0) pin_new=(taskset -c 1)
fi

status=0
for b in "$@"; do
    echo
    echo "== $b: $rev (old) against the working tree (new), started together${pin_old:+, one core each}"
    t0=$SECONDS
    "${pin_old[@]}" "$old/build/bench/$b" --tsv >"$tmp/$b.old" 2>"$tmp/$b.old.err" &
    pids=($!)
    "${pin_new[@]}" "$build/bench/$b" --tsv >"$tmp/$b.new" 2>"$tmp/$b.new.err" &
    pids+=($!)
    wait "${pids[0]}"
    rc_old=$?
    wait "${pids[1]}"
    rc_new=$?
    pids=()
    if ((rc_old || rc_new)); then
        echo "vs.sh: $b failed (old $rc_old, new $rc_new):"
        tail -n 5 "$tmp/$b.old.err" "$tmp/$b.new.err"
        status=1
        continue
    fi
    if [[ -n ${VS_OUT:-} ]]; then
        mkdir -p "$VS_OUT" && cp "$tmp/$b.old" "$tmp/$b.new" "$VS_OUT/"
    fi
    python3 - "$tmp/$b.old" "$tmp/$b.new" <<'EOF' || status=1
import math, sys

def read(path):
    rows = {}
    with open(path) as f:
        head = f.readline().rstrip("\n").split("\t")
        for line in f:
            r = dict(zip(head, line.rstrip("\n").split("\t")))
            rows[(r["graph"], r["budget"], r["algo"])] = r
    return rows

def num(v):
    return None if v in (None, "-") else float(v)

old, new = read(sys.argv[1]), read(sys.argv[2])
keys = [k for k in new if k in old]
print("%-18s %-12s %-9s %9s %9s %8s %8s" % ("graph", "budget", "algo", "ovh old", "ovh new", "s old", "s new"))
equal, better, worse, logs, moved_budget = 0, [], [], [], []
fmt = lambda v, f: "-" if v is None else f % v
for k in keys:
    o, n = old[k], new[k]
    oo, on = num(o["overhead"]), num(n["overhead"])
    so, sn = num(o["plan_s"]), num(n["plan_s"])
    if oo == on or (oo is not None and on is not None and abs(oo - on) < 5e-5):
        mark = "="
        equal += 1
    elif oo is None or (on is not None and on < oo):
        mark = "better"
        better.append(k)
    else:
        mark = "WORSE"
        worse.append((k, oo, on, so, sn))
    if o.get("budget_bytes") != n.get("budget_bytes"):
        moved_budget.append((k, o.get("budget_bytes"), n.get("budget_bytes")))
    if so and sn:
        logs.append(math.log(sn / so))
    print("%-18s %-12s %-9s %9s %9s %8s %8s  %s" % (k + (fmt(oo, "%.2f"), fmt(on, "%.2f"), fmt(so, "%.3f"),
                                                         fmt(sn, "%.3f"), mark)))
print("%d rows; overhead equal %d, better %d, worse %d" % (len(keys), equal, len(better), len(worse)))
for k, oo, on, so, sn in worse:
    print("  worse: %s %s %s: %s -> %s %% (planning %s -> %s s)" % (k + (fmt(oo, "%.2f"), fmt(on, "%.2f"),
                                                                      fmt(so, "%.3f"), fmt(sn, "%.3f"))))
for k in better:
    print("  better: %s %s %s: %s -> %s %%" % (k + (fmt(num(old[k]["overhead"]), "%.2f"),
                                                  fmt(num(new[k]["overhead"]), "%.2f"))))
for k, bo, bn in moved_budget:
    print("  budget differs: %s %s %s: %s -> %s bytes" % (k + (bo, bn)))
for side, a, b in (("old", old, new), ("new", new, old)):
    only = [k for k in a if k not in b]
    if only:
        print("  only in %s: %d rows, e.g. %s" % (side, len(only), " ".join(only[0])))
if logs:
    r = [math.exp(x) for x in logs]
    print("planning time new/old: geometric mean %.3f over %d rows timed in both (per row %.2f..%.2f)" %
          (math.exp(sum(logs) / len(logs)), len(logs), min(r), max(r)))
EOF
    echo "($b: $((SECONDS - t0)) s)"
done
exit $status
