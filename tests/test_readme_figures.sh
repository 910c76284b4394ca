#!/usr/bin/env bash
# The README's figures against the commands that make them: runs
# `python3 docs/figures.py --check`, which regenerates every deterministic
# figure README.md quotes (the peer-gpt sweep's table and smallest budgets,
# the demo's model, peaks, budget, losses and digest, resnet18's bound,
# constants of src/internal.h) and both charts in docs/, and fails naming
# each figure that drifted. Timing figures, the demo's profiled ones and
# bench_layout's (minutes) are left to the full mode, `python3
# docs/figures.py`, which rewrites them all. About 10 s: the sweep and the
# demo, side by side.
#
# Skipped in an OMIT=1 build: without lp_solve rockmate plans otherwise, and
# the README's figures are those of the default build.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
name=test_readme_figures.sh

if grep -q RKM_OMIT_SOLVER "$build/flags" 2>/dev/null; then
    echo "SKIP the README's figures: an OMIT=1 build plans without lp_solve"
    echo "$name: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
for b in rockmate gpt2; do
    if [[ ! -x $build/$b ]]; then
        echo "$name: $build/$b not built"
        echo "$name: 0 passed, 1 failed"
        exit 1
    fi
done

if python3 docs/figures.py --check --build "$build"; then
    echo "$name: 1 passed, 0 failed"
else
    echo "FAIL the README's figures drifted from the commands (above); python3 docs/figures.py regenerates them"
    echo "$name: 0 passed, 1 failed"
    exit 1
fi
