#!/usr/bin/env bash
# Run the whole suite: every test program BUILD/tests/test_* and every
# tests/test_*.sh script, from the repository root. Each prints a line
# "NAME: N passed, N failed"; this adds them up and ends with the total line
# "N passed, N failed". Exit status 0 only if nothing failed.
#
# A program that exits non-zero without reporting a failure (a crash, a
# sanitizer report at exit, no summary line) counts as one more failure.
# RKM_TEST_TIMEOUT (seconds, default 300) stops a program that hangs; that
# is a failure too.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
build=${1:-build}
export RKM_BUILD=$build
limit=${RKM_TEST_TIMEOUT:-300}

total_passed=0
total_failed=0
failed_names=()

run_one() {
    local name=$1
    shift
    local out rc line passed=0 failed=0 start=$SECONDS
    echo "== $name"
    out=$(timeout "$limit" "$@" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    echo "-- $name: $((SECONDS - start)) s"
    line=$(printf '%s\n' "$out" | grep -E ': [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
    if [[ $line =~ :\ ([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
        passed=${BASH_REMATCH[1]}
        failed=${BASH_REMATCH[2]}
    fi
    if ((rc != 0 && failed == 0)); then
        if ((rc == 124)); then
            echo "$name: timed out after ${limit}s"
        else
            echo "$name: exit status $rc without a reported failure: counted as one"
        fi
        failed=1
    fi
    total_passed=$((total_passed + passed))
    total_failed=$((total_failed + failed))
    if ((failed != 0)); then failed_names+=("$name"); fi
}

shopt -s nullglob
for prog in "$build"/tests/test_*; do
    [[ -f $prog && -x $prog ]] || continue
    run_one "$(basename "$prog")" "$prog"
done
for script in tests/test_*.sh; do
    run_one "$(basename "$script")" bash "$script"
done

if ((${#failed_names[@]} != 0)); then
    echo "failing: ${failed_names[*]}"
fi
echo "$total_passed passed, $total_failed failed"
((total_failed == 0))
