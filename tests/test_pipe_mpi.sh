#!/usr/bin/env bash
# The GPT-2 trainer as a pipeline over MPI (examples/gpt2_pipe.c), tiny
# shapes: P = 2 and 4 stages, 1F1B and GPipe, with and without --dp 2,
# dropout on. The trainer checks by itself that every step's loss and
# parameter gradients are the single-process trainer's bit for bit (the
# whole graph in rank 0, the same micro-batches in the same order), that
# every rank's measured peak is its stage plan's predicted peak to the byte,
# and that its region (the stage arena) is within the budget; here we check
# its final line and each rank's line, and across runs:
# - every pipeline without --dp gives one digest, whatever P and the
#   schedule (a stage adds its micro-batches in micro-batch order under
#   both), and every pipeline with --dp 2 another (its replicas are summed
#   in replica order: another grouping of the same sums);
# - --dp 2 with M micro-batches a replica trains on the same 2M
#   micro-batches as one replica with 2M: the same step losses.
# Failure: a rank that fails mid-step (a callback, or an MPI call) ends
# every rank, with one line naming the rank, stage, replica, step and
# micro-batch; every rank's process is gone when mpirun returns.
# Skipped (each case a skip) where mpirun is not installed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
. tests/lib.sh
pipe=${RKM_BUILD:-build}/gpt2_pipe
tiny=(--layers 2 --channels 32 --heads 2 --seq 16 --batch 2 --steps 2 --dropout 0.1 --budget 50%)
mpirun_flags=(--oversubscribe --mca mpi_yield_when_idle 1)
[[ $(id -u) == 0 ]] && mpirun_flags+=(--allow-run-as-root)
# a hang guard only: a run that does not end is a failure, however long
guard=120

cases=(p2_1f1b p2_gpipe p4_1f1b p4_gpipe p2_dp2_1f1b p2_dp2_gpipe p4_dp2_1f1b p4_inplace digests digests_dp losses
       fail_callback fail_mpi)
if ! command -v mpirun >/dev/null 2>&1; then
    for c in "${cases[@]}"; do skip "$c: mpirun not found (Debian: libopenmpi-dev openmpi-bin; make test installs them as root)"; done
    finish
fi
if [[ ! -x $pipe ]]; then
    if command -v mpicc >/dev/null 2>&1; then
        fail "$pipe not built (mpicc is there: make examples)"
    else
        for c in "${cases[@]}"; do skip "$c: mpicc not found, $pipe not built"; done
    fi
    finish
fi

run_pipe() { timeout "$guard" mpirun "${mpirun_flags[@]}" -np "$@" 2>&1; }

declare -A digest loss_lines
# ok_run NAME RANKS P D ARGS...: exit 0, the final line ok and bit-identical,
# one line per rank with its peak equal to the prediction and its region
# within the budget.
ok_run() {
    local name=$1 np=$2 P=$3 D=$4 out rc line ranks
    shift 4
    out=$(run_pipe "$np" "$pipe" "${tiny[@]}" "$@")
    rc=$?
    line=$(grep -E "^gpt2_pipe: ok stages=$P dp=$D micro=[0-9]+ schedule=[a-z0-9]+ digest=[0-9a-f]{16} grads=bit-identical peaks=equal regions=within-budget$" <<<"$out")
    ranks=$(grep -cE '^rank [0-9]+ \(stage [0-9]+, replica [0-9]+\): measured peak ([0-9]+) bytes, predicted \1: equal; region [0-9]+ bytes \(the stage arena\), within the budget' <<<"$out")
    if [[ $rc == 0 && -n $line && $ranks == $((P * D)) ]]; then
        ok
        digest[$name]=$(grep -oE 'digest=[0-9a-f]+' <<<"$line")
        loss_lines[$name]=$(grep -E '^step [0-9]+/[0-9]+: loss' <<<"$out" | sed -E 's/, [0-9.]+ ms.*//')
    else
        fail "$name: gpt2_pipe -np $np $* -> exit $rc, $ranks of $((P * D)) rank lines ok"
        printf '%s\n' "$out" | tail -n 25
    fi
}

ok_run p2_1f1b 2 2 1 --micro-batches 4
ok_run p2_gpipe 2 2 1 --micro-batches 4 --schedule gpipe
ok_run p4_1f1b 4 4 1 --micro-batches 4
ok_run p4_gpipe 4 4 1 --micro-batches 4 --schedule gpipe
ok_run p2_dp2_1f1b 4 2 2 --micro-batches 2 --dp 2
ok_run p2_dp2_gpipe 4 2 2 --micro-batches 2 --dp 2 --schedule gpipe
ok_run p4_dp2_1f1b 8 4 2 --micro-batches 2 --dp 2
# GELU's and the residual adds' backwards in place: a stage's input
# gradient is then made in place by the residual add that reads it
ok_run p4_inplace 4 4 1 --micro-batches 4 --inplace 1

# same_values NAME KEY...: the runs KEY... all ran and agree.
same_values() {
    local name=$1 arr=$2 first k v
    shift 2
    declare -n values=$arr
    first=${values[$1]:-}
    for k in "$@"; do
        v=${values[$k]:-}
        if [[ -z $v || $v != "$first" ]]; then
            fail "$name: $1 '$first', $k '$v'"
            return
        fi
    done
    ok
}
same_values digests digest p2_1f1b p2_gpipe p4_1f1b p4_gpipe p4_inplace
# the dp runs: one digest among them, another than without dp
if [[ -n ${digest[p2_dp2_1f1b]:-} && ${digest[p2_dp2_1f1b]} == "${digest[p2_dp2_gpipe]:-}" &&
      ${digest[p2_dp2_1f1b]} == "${digest[p4_dp2_1f1b]:-}" && ${digest[p2_dp2_1f1b]} != "${digest[p2_1f1b]:-}" ]]; then
    ok
else
    fail "digests_dp: ${digest[p2_dp2_1f1b]:-} ${digest[p2_dp2_gpipe]:-} ${digest[p4_dp2_1f1b]:-} (without dp ${digest[p2_1f1b]:-})"
fi
same_values losses loss_lines p2_1f1b p2_dp2_1f1b p4_dp2_1f1b

# fail_run NAME RANKS PATTERN ARGS...: mpirun ends with a non-zero status
# (not the guard's), the line matching PATTERN is there, and every rank's
# process (each prints its pid under --fail-rank) has exited.
fail_run() {
    local name=$1 np=$2 pattern=$3 out rc pids p alive=
    shift 3
    out=$(run_pipe "$np" "$pipe" "${tiny[@]}" --steps 3 "$@")
    rc=$?
    pids=$(grep -oE '^gpt2_pipe: rank [0-9]+ is process [0-9]+$' <<<"$out" | awk '{print $NF}')
    # exited: gone, or a zombie that its new parent has not reaped yet
    for p in $pids; do [[ $(ps -o stat= -p "$p" 2>/dev/null) =~ ^[^Z] ]] && alive+=" $p"; done
    if [[ $rc != 0 && $rc != 124 && $(wc -w <<<"$pids") == "$np" && -z $alive ]] && grep -qE -- "$pattern" <<<"$out"; then
        ok
    else
        fail "$name: gpt2_pipe -np $np $* -> exit $rc, pids '$pids', still alive '$alive'"
        printf '%s\n' "$out" | tail -n 20
    fi
}
fail_run fail_callback 4 \
    '^gpt2_pipe: FAILED on rank 2 \(stage 2 of 4, replica 0\), step 2, micro-batch 2, forward phase: injected failure' \
    --micro-batches 4 --fail-rank 2 --fail-step 2
fail_run fail_mpi 4 \
    '^gpt2_pipe: FAILED on rank 3 \(stage 1 of 2, replica 1\), step 2, micro-batch 1, forward phase: MPI_Send \(--fail-kind mpi\): MPI_ERR_RANK' \
    --micro-batches 2 --dp 2 --fail-rank 3 --fail-step 2 --fail-kind mpi
finish
