#!/usr/bin/env bash
# Runs the GPT-2 trainer (examples/gpt2.c) end to end in a tiny shape. The
# trainer checks by itself that every step's measured activation peak is the
# predicted one and that one step under its plan gives the baseline's loss
# and gradients bit for bit; here we check its exit status and final line,
# and that its two memory modes (one arena per plan, the default, and a
# counted malloc per buffer) give the same digest.
# (tests/test_gpt2.c checks the model and every algorithm in depth.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
gpt2=${RKM_BUILD:-build}/gpt2
passed=0
failed=0
tiny=(--layers 2 --channels 64 --heads 2 --seq 32 --batch 2 --steps 2)

# expect NAME STATUS PATTERN ARGS...: exit status STATUS and PATTERN in the output.
expect() {
    local name=$1 want=$2 pattern=$3 out rc
    shift 3
    out=$("$gpt2" "$@" 2>&1)
    rc=$?
    if [[ $rc == "$want" ]] && grep -qE -- "$pattern" <<<"$out"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL $name: gpt2 $* -> exit $rc (want $want, output matching '$pattern')"
        printf '%s\n' "$out" | tail -n 20
    fi
}

if [[ ! -x $gpt2 ]]; then
    echo "test_gpt2.sh: $gpt2 not built"
    echo "test_gpt2.sh: 0 passed, 1 failed"
    exit 1
fi

ok='^demo: ok budget=([0-9]+) predicted_peak=([0-9]+) measured_peak=\2 overhead_predicted=[-0-9.]+% overhead_measured=[-0-9.]+% grads=identical( arena=[0-9]+)?$'
expect baseline 0 "$ok" "${tiny[@]}" --algo none --budget 100%
expect rotor_dropout_45 0 "$ok" "${tiny[@]}" --algo rotor --dropout 0.1 --budget 45%
expect rotor_min 0 "$ok" "${tiny[@]}" --algo rotor --budget min --steps 1
expect rockmate_dropout_50 0 "$ok" "${tiny[@]}" --algo rockmate --dropout 0.1 --budget 50%

# both_modes NAME ARGS...: --memory arena and --memory malloc each pass (the
# demo line, their memory line) and give the same digest (every training
# step's loss and parameter gradients, bit for bit) and the same peaks.
both_modes() {
    local name=$1 m out rc digests=() peaks=() bad=
    shift
    for m in arena malloc; do
        out=$("$gpt2" "$@" --memory "$m" 2>&1)
        rc=$?
        if [[ $rc != 0 ]] || ! grep -qE -- "$ok" <<<"$out" || ! grep -q "^memory: $m" <<<"$out"; then
            bad="--memory $m -> exit $rc"
            printf '%s\n' "$out" | tail -n 20
            break
        fi
        digests+=("$(grep '^digest: ' <<<"$out")")
        peaks+=("$(grep -oE 'predicted_peak=[0-9]+ measured_peak=[0-9]+' <<<"$out")")
    done
    if [[ -z $bad && ( ${digests[0]} != "${digests[1]}" || -z ${digests[0]} ) ]]; then
        bad="digests differ: '${digests[0]}' vs '${digests[1]}'"
    fi
    [[ -z $bad && ${peaks[0]} != "${peaks[1]}" ]] && bad="peaks differ: '${peaks[0]}' vs '${peaks[1]}'"
    if [[ -z $bad ]]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL $name: gpt2 $*: $bad"
    fi
}
both_modes modes_rotor_45 "${tiny[@]}" --algo rotor --budget 45%
both_modes modes_inplace_rotor_45 "${tiny[@]}" --inplace 1 --algo rotor --budget 45%

# same_inplace NAME ARGS...: with GELU's and the residual adds' backwards in
# place (--inplace 1) the trainer passes, and its digest is the one without.
same_inplace() {
    local name=$1 a b
    shift
    a=$("$gpt2" "$@" --inplace 0 2>&1 | grep '^digest: ')
    b=$("$gpt2" "$@" --inplace 1 2>&1)
    if grep -qE -- "$ok" <<<"$b" && [[ -n $a && $a == "$(grep '^digest: ' <<<"$b")" ]]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL $name: gpt2 $*: without --inplace '$a'; with:"
        printf '%s\n' "$b" | tail -n 5
    fi
}
same_inplace inplace_rockmate_40 "${tiny[@]}" --budget 40%
same_inplace inplace_dtr_min "${tiny[@]}" --algo dtr --budget min --steps 1
same_inplace inplace_dropout_none "${tiny[@]}" --algo none --dropout 0.1 --budget 100%
both_modes modes_sqrt_dropout "${tiny[@]}" --algo sqrt --dropout 0.1 --budget 100%
# offloads NAME BW BUDGET ARGS...: with a copy link (--copy) the plan offloads, both
# memory modes pass (the trainer checks the measured device and host peaks
# against the plan's, to the byte, and the gradients against the
# baseline's), and their digest is the one of the same run without a copy
# link: the copy threads change where bytes wait, never a value.
offloads() {
    local name=$1 bw=$2 budget=$3 m out want bad=
    shift 3
    want=$("$gpt2" "${tiny[@]}" --algo none --budget 100% "$@" 2>&1 | grep '^digest: ')
    for m in arena malloc; do
        out=$("$gpt2" "${tiny[@]}" --copy "$bw" --budget "$budget" "$@" --memory "$m" 2>&1)
        if ! grep -qE -- "$ok" <<<"$out" || ! grep -qE '^offload: [1-9][0-9]* offloads' <<<"$out"; then
            bad="--memory $m: no offload or not ok"
        elif [[ -z $want || $(grep '^digest: ' <<<"$out") != "$want" ]]; then
            bad="--memory $m: digest '$(grep '^digest: ' <<<"$out")', without copies '$want'"
        fi
        [[ -n $bad ]] && { printf '%s\n' "$out" | tail -n 12; break; }
    done
    if [[ -z $bad ]]; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL $name: gpt2 --copy $bw --budget $budget $*: $bad"
    fi
}
offloads offload_fast 1e9 30%
offloads offload_slow_dropout 3e7 35% --dropout 0.1
offloads offload_dtr_inplace 1e9 40% --algo dtr --inplace 1
expect too_small 3 '^demo: FAILED no plan fits the budget' "${tiny[@]}" --algo rotor --budget 1%
expect bad_usage 2 'usage' --heads 3
# option values are read whole (atoi took "2x" as 2, strtof "0.1p" as 0.1)
expect bad_steps_trailing 2 'usage' --steps 2x
expect bad_dropout_trailing 2 'usage' --dropout 0.1p
expect bad_seed_sign 2 'usage' --seed -1
expect bad_copy_unit 2 'usage' --copy 1GB
expect no_data 1 'cannot read' "${tiny[@]}" --data /nonexistent/text.txt

echo "test_gpt2.sh: $passed passed, $failed failed"
((failed == 0))
