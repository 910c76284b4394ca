#!/usr/bin/env bash
# make llmc: without LLMC= it prints one line saying it is skipped and
# succeeds; with LLMC pointing at an llm.c checkout (make test LLMC=path, or
# LLMC in the environment) it builds examples/llmc.c against it and runs it,
# which checks every plan bit for bit against llm.c's own step; without a
# checkout that run is a skip, counted on the summary line.
# (tests/test_llmc.c covers the graph and host without a checkout.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
llmc=${LLMC:-}
passed=0
failed=0
skipped=0

out=$(env -u LLMC make -s --no-print-directory BUILD="$build" llmc LLMC= 2>&1)
rc=$?
if [[ $rc == 0 && $(wc -l <<<"$out") == 1 && $out == "llmc: skipped"* ]]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "FAIL make llmc without LLMC=: exit $rc, output:"
    printf '%s\n' "$out"
fi

if [[ -n $llmc && ! -f $llmc/train_gpt2.c ]]; then
    failed=$((failed + 1))
    echo "FAIL LLMC=$llmc is not an llm.c checkout (no train_gpt2.c)"
elif [[ -n $llmc ]]; then
    out=$(make -s --no-print-directory BUILD="$build" llmc LLMC="$llmc" 2>&1)
    rc=$?
    if [[ $rc == 0 ]] && grep -q '^llmc: ok' <<<"$out"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL make llmc LLMC=$llmc: exit $rc"
        printf '%s\n' "$out" | tail -n 20
    fi
else
    skipped=$((skipped + 1))
    echo "SKIP the run against llm.c: no llm.c checkout (LLMC)"
fi

echo "test_llmc.sh: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
