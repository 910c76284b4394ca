#!/usr/bin/env bash
# The CUDA trainer's stage mode (examples/gpt2_cuda_pipe.cuh) on the dummy
# device (tests/dummy), built by make tests with mpicxx around g++ and the
# sanitizers as build/tests/gpt2_cuda_pipe_dummy: ranks under mpirun, the
# boundary tensors through pinned host memory over MPI (the dummy has no
# NCCL). Tiny shapes: P = 2 under 1F1B and GPipe, P = 1, and P = 2 with
# --dp 2; dropout on, freed buffers poisoned; op costs profiled on rank 0's
# device in one run, the graph's guesses in the others. The trainer checks by
# itself that every step's losses and parameter gradients are, bit for bit,
# those of the single-process trainer on the same device (rank 0: the whole
# graph's baseline plan in a CUDA arena, the same micro-batches in the same
# order), that every rank's measured peak is its stage plan's predicted one
# to the byte, and that its region (the stage arena) is within the budget;
# here we check its final line, each rank's line, the dummy's summary per
# rank (no fault, nothing left allocated, created or queued), and across
# runs: one digest for P = 2 under both schedules (a stage adds its
# micro-batches in micro-batch order under both; P = 1 has no split of
# wte's gradient, and sums it in another order).
# LeakSanitizer is off in these runs: Open MPI's plugins leak at
# MPI_Finalize (dlopened, unloaded, unsymbolizable, so not suppressible by
# name); the dummy's summary line still checks device and pinned memory,
# and tests/test_cuda_dummy.sh runs the same kernels and callbacks' code
# under LeakSanitizer without MPI.
# Skipped (each case a skip) where mpirun or the build is not there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
. tests/lib.sh
bin=${RKM_BUILD:-build}/tests/gpt2_cuda_pipe_dummy
tiny=(--layers 2 --channels 32 --heads 2 --vocab 64 --seq 16 --batch 2 --steps 2 --dropout 0.1 --poison
      --budget 50% --transport mpi)
mpirun_flags=(--oversubscribe --mca mpi_yield_when_idle 1 -x ASAN_OPTIONS=detect_leaks=0)
[[ $(id -u) == 0 ]] && mpirun_flags+=(--allow-run-as-root)
guard=120 # a hang guard only
clean='^cuda dummy: .* 0 faults, device peak [0-9]+ bytes; left at exit: 0 device and 0 pinned allocations, 0 streams, 0 events, 0 handles, 0 operations never run$'

cases=(p2_1f1b p2_gpipe p1 p2_dp2 digests)
if ! command -v mpirun >/dev/null 2>&1; then
    for c in "${cases[@]}"; do skip "$c: mpirun not found (Debian: libopenmpi-dev openmpi-bin)"; done
    finish
fi
if [[ ! -x $bin ]]; then
    if command -v mpicxx >/dev/null 2>&1 && command -v "${CXX:-g++}" >/dev/null 2>&1; then
        fail "$bin not built (mpicxx and ${CXX:-g++} are there: make tests)"
    else
        for c in "${cases[@]}"; do skip "$c: mpicxx or ${CXX:-g++} not found, $bin not built"; done
    fi
    finish
fi

declare -A digest
# ok_run NAME RANKS P D ARGS...: exit 0, the final line ok and
# bit-identical, one line per rank with its peak equal to the prediction
# and its region within the budget, every rank's dummy summary clean.
ok_run() {
    local name=$1 np=$2 P=$3 D=$4 out rc line ranks cleans
    shift 4
    out=$(timeout "$guard" mpirun "${mpirun_flags[@]}" -np "$np" "$bin" "${tiny[@]}" "$@" 2>&1)
    rc=$?
    line=$(grep -E "^gpt2_cuda: ok stages=$P dp=$D micro=[0-9]+ schedule=[a-z0-9]+ transport=mpi digest=[0-9a-f]{16} grads=bit-identical peaks=equal regions=within-budget$" <<<"$out")
    ranks=$(grep -cE '^rank [0-9]+ \(stage [0-9]+, replica [0-9]+\): measured peak ([0-9]+) bytes, predicted \1: equal; region [0-9]+ bytes \(the stage arena\), within the budget$' <<<"$out")
    cleans=$(grep -cE "$clean" <<<"$out")
    if [[ $rc == 0 && -n $line && $ranks == "$np" && $cleans == "$np" ]]; then
        ok
        digest[$name]=$(grep -oE 'digest=[0-9a-f]+' <<<"$line")
    else
        fail "$name: gpt2_cuda_pipe_dummy -np $np $* -> exit $rc, $ranks of $np rank lines ok, $cleans of $np clean summaries"
        printf '%s\n' "$out" | grep -vE '^ +#|^$' | tail -n 25
    fi
}

ok_run p2_1f1b 2 2 1 --micro-batches 4 --profile-runs 0
# GPipe with its costs profiled on rank 0's device (rkm_cuda_profile) and
# backwards in place: another plan, the same values
ok_run p2_gpipe 2 2 1 --micro-batches 4 --schedule gpipe --profile-runs 1 --inplace 1
ok_run p1 1 1 1 --micro-batches 4 --profile-runs 0
ok_run p2_dp2 4 2 2 --micro-batches 2 --dp 2 --profile-runs 0
first=${digest[p2_1f1b]:-}
if [[ -n $first && $first == "${digest[p2_gpipe]:-}" ]]; then
    ok
else
    fail "digests: p2_1f1b '$first', p2_gpipe '${digest[p2_gpipe]:-}'"
fi
finish
