#!/usr/bin/env bash
# bench_work.sh [BUILD]: each planner call's work meter on every graph of
# tests/graphs (issue 43's check). Per graph: rockmate's smallest budget
# (`info`) and a solve half way between the graph's lower bound and it
# (`plan`), both with --time-limit 1000 so that only the work ends them:
# the solve's result (budget expected: no plan there), its work and limit
# and the smallest budget's, and the seconds each took. The last line
# counts the graphs where the solve returned budget within its limit.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${1:-build}
cli=$build/rockmate
[[ -x $cli ]] || { echo "bench_work.sh: $cli not built (make all)" >&2; exit 2; }
ok=0 n=0
printf '%-22s %12s %12s %12s  %-8s %12s %12s %7s  %12s %12s %7s\n' graph lower_bound min_budget solve_at result \
    work limit s min_work min_limit s
for g in tests/graphs/*.rkg; do
    t0=$(date +%s.%N)
    info=$($cli info "$g" --json --algo rockmate --time-limit 1000 2>/dev/null) || { echo "$g: info failed" >&2; continue; }
    t1=$(date +%s.%N)
    read -r lb min mw ml < <(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); w=d["min_budget_work"]["rockmate"]
print(d["lower_bound"], d["min_budget"]["rockmate"], w["work"], w["work_limit"])' "$info")
    name=$(basename "$g" .rkg)
    if ((min <= lb + 1)); then
        printf '%-22s %12s %12s %12s  %-8s %12s %12s %7s  %12s %12s %7.2f\n' "$name" "$lb" "$min" - "(none)" - - - "$mw" "$ml" \
            "$(echo "$t1 - $t0" | bc)"
        continue
    fi
    n=$((n + 1))
    at=$((lb + (min - lb) / 2))
    plan=$($cli plan "$g" --budget "${at}B" --json --time-limit 1000 2>/dev/null)
    t2=$(date +%s.%N)
    read -r res w l < <(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d.get("error","ok"), d["work"], d["work_limit"])' "$plan")
    [[ $res == budget ]] && ((w <= l)) && ok=$((ok + 1))
    printf '%-22s %12s %12s %12s  %-8s %12s %12s %7.2f  %12s %12s %7.2f\n' "$name" "$lb" "$min" "$at" "$res" "$w" "$l" \
        "$(echo "$t2 - $t1" | bc)" "$mw" "$ml" "$(echo "$t1 - $t0" | bc)"
done
echo "budget within the work limit: $ok of $n graphs with a gap between the lower bound and the smallest budget"
