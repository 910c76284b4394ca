#!/bin/sh
# tests/gpu/run.sh -- the GPU checks, for a machine with an NVIDIA GPU (made
# for one H200; about 2-4 minutes, under 5). Run from the repository root:
#
#     sh tests/gpu/run.sh
#
# 1. builds the CUDA sources (make cuda) and the CPU test of their plain-C
#    half, and runs that test;
# 2. the CUDA trainer on a tiny GPT-2: GPU against the CPU reference
#    (--check-cpu), with and without dropout, at 100/50/33 % budgets;
# 3. the CUDA trainer on the GPT-2 124M shape (12 layers, C=768, 12 heads,
#    B=8, T=1024) at 100, 50 and 33 % of the baseline peak: per budget the
#    measured peak (the arena's), the simulated peak, the measured step time,
#    the predicted and measured overhead, and the gradient check (loss and
#    every parameter gradient bitwise against the baseline plan); then at
#    the smallest budget the planner meets ("min"). On this shape 33 % is
#    below what any plan can do: the softmax backward alone holds the
#    probabilities, their gradient and the logits' gradient (3 x 1.65 GB,
#    33.7 % of the 14.66 GB baseline peak: the graph's lower bound).
# Exit status: 0 when every step passed, else the first failure's.
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
status=0

step() { echo; echo "== $*"; }
run() { # run CMD... with a time limit; remember the first failure
    timeout "${LIMIT:-240}" "$@"
    rc=$?
    [ $rc -ne 0 ] && echo "-- FAILED ($rc): $*" && [ $status -eq 0 ] && status=$rc
    return $rc
}

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 || echo "nvidia-smi: not found"
command -v nvcc >/dev/null 2>&1 || PATH=$PATH:/usr/local/cuda/bin
nvcc --version 2>&1 | tail -n 1

# Without lp_solve the library builds without the solver: the ILP-based
# rockmate algorithm is then unavailable and rotor plans instead.
OMIT=0
ALGO=rockmate
case "$(${CC:-cc} -print-file-name=liblpsolve55.a)" in
/*) ;;
*) echo "lp_solve not found: building with OMIT=1, planning with rotor"; OMIT=1; ALGO=rotor ;;
esac

step "build (make cuda)"
LIMIT=200 run make -j"$JOBS" OMIT=$OMIT BUILD="$BUILD" lib cuda "$BUILD/tests/test_arena" || exit $status
[ -x "$BUILD/gpt2_cuda" ] || { echo "-- FAILED: $BUILD/gpt2_cuda was not built"; exit 1; }

step "CPU test of the arena bookkeeping"
LIMIT=60 run "$BUILD/tests/test_arena"

step "tiny GPT-2: GPU vs CPU reference, plans vs baseline"
LIMIT=60 run "$BUILD/gpt2_cuda" --preset tiny --check-cpu --algo $ALGO --budgets 100,50,33,min --steps 3 --profile-runs 3
step "tiny GPT-2 with dropout 0.1 (recomputed masks)"
LIMIT=60 run "$BUILD/gpt2_cuda" --preset tiny --dropout 0.1 --check-cpu --algo $ALGO --budgets 100,50,33,min --steps 3 --profile-runs 3

step "GPT-2 124M shape, B=8 T=1024, budgets 100/50/33 %"
LIMIT=200 run "$BUILD/gpt2_cuda" --preset 124M --algo $ALGO --budgets 100,50,33,min --steps 5 --profile-runs 5

step "result"
[ $status -eq 0 ] && echo "all GPU checks passed" || echo "GPU checks FAILED (first status $status)"
exit $status
