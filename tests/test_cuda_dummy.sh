#!/usr/bin/env bash
# Runs the CUDA GPT-2 trainer (examples/gpt2_cuda.cu) on the dummy device
# (tests/dummy: its host code, its kernels and cuda/ on the CPU, built by
# `make tests` with g++ and the sanitizers as build/tests/gpt2_cuda_dummy):
# - the tiny preset at 100/50/33 %/min, with and without dropout, with and
#   without in-place backwards, under rockmate and rotor, every buffer the
#   plans free poisoned: each plan's gradients and losses bit for bit the
#   baseline's, its measured peak the simulated one and within the budget,
#   the baseline's gradients against the CPU reference per parameter tensor
#   (--check-cpu), and nothing left behind (the dummy's summary line: no
#   fault, no pageable async copy, no allocation, stream, event or queued
#   operation at exit);
# - the checks themselves: --check-cpu fails when one small tensor's
#   gradient is perturbed; the default algorithm plans in both builds;
# - failures injected into CUDA calls (a launch in profiling, the events of
#   a timed step, the last cudaMalloc, a GEMM): a clean exit 3 that names
#   the CUDA error, and nothing leaked (the sanitizer's leak check);
# - offloading (--copy): two plans of copies checked as the matrix, and
#   failures injected into the pinned region, the copy streams and copies;
# - where nvcc built the example's PTX (make cuda): the kernels that sum
#   gradients hold no fused multiply-add (-fmad=false).
# - every plan's arena (the device region its layout reserves) within its
#   budget (gpt2_cuda --check-arena).
# What cannot run here is a SKIP line, counted as skipped.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
bin=$build/tests/gpt2_cuda_dummy
passed=0
failed=0
skipped=0

jobs_max=${RKM_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
[[ $jobs_max =~ ^[1-9][0-9]*$ ]] || jobs_max=1
out_dir=$(mktemp -d) || exit 2
trap 'rm -rf "$out_dir"' EXIT

pass() { passed=$((passed + 1)); }
fail() {
    failed=$((failed + 1))
    echo "FAIL $*"
}
skip() {
    skipped=$((skipped + 1))
    echo "SKIP $*"
}

if [[ ! -x $bin ]]; then
    if command -v "${CXX:-g++}" >/dev/null 2>&1; then
        echo "test_cuda_dummy.sh: $bin not built"
        echo "test_cuda_dummy.sh: 0 passed, 1 failed"
        exit 1
    fi
    skip "the dummy device: no C++ compiler (${CXX:-g++})"
    echo "test_cuda_dummy.sh: 0 passed, 0 failed, 1 skipped"
    exit 0
fi
# start NAME ENV ARGS...: run the trainer in the background (at most
# jobs_max at once), its output and status into $out_dir/NAME.{out,rc}.
# ENV: VAR=VALUE for the dummy (RKM_DUMMY_FAIL), or "-".
start() {
    local name=$1 env=$2
    shift 2
    while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n; done
    (
        if [[ $env == - ]]; then "$bin" "$@"; else env "$env" "$bin" "$@"; fi >"$out_dir/$name.out" 2>&1
        echo $? >"$out_dir/$name.rc"
    ) &
}

out() { cat "$out_dir/$1.out"; }
rc() { cat "$out_dir/$1.rc"; }
show() { # the end of a run that failed
    echo "  gpt2_cuda_dummy $*"
    tail -n 25 "$out_dir/$1.out" | sed 's/^/  | /'
}

tiny=(--preset tiny --steps 1 --warmup 0 --profile-runs 1 --poison)
clean='0 faults, device peak [0-9]+ bytes; left at exit: 0 device and 0 pinned allocations, 0 streams, 0 events, 0 handles, 0 operations never run'

# The matrix, planned on the graph's cost guesses (profiling is run by the
# others). The CPU check does not depend on the algorithm (it compares the
# baseline's gradients): the rotor runs make it. The first run names no
# algorithm: the library's default must plan, in either build.
matrix=()
default=
for algo in rockmate rotor; do # rockmate in either build (without lp_solve: no ILP options)
    for dropout in 0 0.1; do
        for inplace in 0 1; do
            name="${algo}_d${dropout}_i${inplace}"
            matrix+=("$name")
            args=(--algo "$algo")
            [[ -z $default ]] && default=$name && args=()
            [[ $algo == rotor ]] && args+=(--check-cpu)
            start "$name" - --preset tiny --steps 1 --warmup 0 --profile-runs 0 --poison --check-arena \
                "${args[@]}" --dropout "$dropout" --inplace "$inplace" --budgets 100,50,33,min
        done
    done
done
# Offloading (--copy): the arena's copy streams, pinned buffers and events
# (cuda/rockmate_cuda.h), checked by the same rules; the dummy runs a copy
# only when an event orders it, so a missing wait or a copy that does not
# wait for the compute stream reads poison or stale bytes, and the
# gradients show it.
for c in d0_i0 d0.1_i1; do
    name="offload_rockmate_$c"
    matrix+=("$name")
    d=${c#d}
    start "$name" - --preset tiny --steps 1 --warmup 0 --profile-runs 0 --poison --check-arena --algo rockmate \
        --dropout "${d%_i*}" --inplace "${c##*_i}" --copy 1e9 --budgets 100,50,33,min
done
# Two steps per plan in the same arena: a warm-up one and a timed one.
start warm_twice - --preset tiny --poison --steps 1 --warmup 1 --profile-runs 1 --algo rotor --dropout 0.1 \
    --inplace 1 --budgets 50
# --check-perturb: one element of ln1w's gradient (a small tensor) moved by
# 5 % of that tensor's largest gradient. Its call counts are those of the
# runs with injected failures below, which take the same arguments.
probe=("${tiny[@]}" --algo rotor --budgets 100 --check-cpu --check-perturb ln1w)
start perturbed - "${probe[@]}"
# Injected failures: the first kernel launch (in profiling), the first GEMM.
start fail_launch RKM_DUMMY_FAIL=launch:1 "${probe[@]}"
start fail_gemm RKM_DUMMY_FAIL=gemm:1 "${probe[@]}"
wait

# A run of the matrix: exit 0, five result lines (baseline and four
# budgets), each identical to the baseline, measured peak = simulated peak
# <= budget; the CPU check where asked; the dummy's summary clean.
for name in "${matrix[@]}"; do
    o=$(out "$name")
    bad=
    [[ $(rc "$name") == 0 ]] || bad="exit $(rc "$name")"
    n=$(grep -cE '^result [^:]+: budget=[0-9]+ sim_peak=([0-9]+) measured_peak=\1 arena=[0-9]+ grads=identical$' <<<"$o")
    [[ -z $bad && $n != 5 ]] && bad="$n of 5 plans identical with measured peak = simulated"
    while read -r b p; do
        ((p <= b)) || bad="simulated peak $p over the budget $b"
    done < <(sed -nE 's/^result [^:]+: budget=([0-9]+) sim_peak=([0-9]+) .*/\1 \2/p' <<<"$o")
    if [[ -z $bad && $name == rotor_* ]] && ! grep -qE '^cpu check: loss .*: ok$' <<<"$o"; then
        bad="the CPU check did not pass"
    fi
    [[ -z $bad ]] && ! grep -qE "$clean" <<<"$o" && bad="the dummy's summary: $(grep '^cuda dummy: [0-9]' <<<"$o")"
    [[ -z $bad ]] && ! grep -q '^gpt2_cuda: all checks passed' <<<"$o" && bad="no 'all checks passed'"
    [[ -z $bad && $name == offload_* ]] && ! grep -qE '^[^ ]+ +[1-9][0-9]* offloads to pinned host memory' <<<"$o" &&
        bad="no plan offloads"
    [[ -z $bad && $name == "$default" ]] && ! grep -qE "^planner: ${name%%_*}$" <<<"$o" &&
        bad="the default algorithm is not ${name%%_*}: $(grep '^planner:' <<<"$o")"
    if [[ -z $bad ]]; then
        pass
    else
        fail "$name: $bad"
        show "$name"
    fi
    # The arena against the budget, per plan (a figure, or a check above).
    printf '  %-16s arena/budget bytes:' "$name"
    sed -nE 's/^result ([^:]+): budget=([0-9]+) sim_peak=[0-9]+ measured_peak=[0-9]+ arena=([0-9]+) .*/\1|\3|\2/p' <<<"$o" |
        while IFS='|' read -r label a b; do
            [[ $label == baseline ]] && continue
            printf ' %s %s/%s%s' "$label" "$a" "$b" "$( ((a > b)) && echo ' OVER')"
        done
    echo
done

# expect NAME STATUS PATTERN: a run's exit status and a line of its output.
expect() {
    local name=$1 want=$2 pattern=$3
    if [[ $(rc "$name") == "$want" ]] && grep -qE -- "$pattern" "$out_dir/$name.out"; then
        pass
    else
        fail "$name: exit $(rc "$name") (want $want), output matching '$pattern'"
        show "$name"
    fi
}
expect warm_twice 0 '^result 50%: .* grads=identical$'
expect perturbed 1 '^cpu check: ln1w: .*: MISMATCH$'
# ... and a check of all gradients at the scale of the largest would not
# have seen it: the move is below 1e-3 of the largest gradient.
moved=$(sed -nE 's/^cpu check: --check-perturb ln1w: its first gradient moved by ([0-9.e+-]+)$/\1/p' "$out_dir/perturbed.out")
largest=$(sed -nE 's/^cpu check: loss .*the largest of all ([0-9.e+-]+)\): .*/\1/p' "$out_dir/perturbed.out")
if [[ -n $moved && -n $largest ]] && awk -v m="$moved" -v l="$largest" 'BEGIN { exit !(m < 1e-3 * l) }'; then
    pass
else
    fail "perturbed_small: moved by '$moved', largest gradient '$largest': not below 1e-3 of it"
fi
# A failed launch in profiling: the CUDA error in the message.
expect fail_launch 3 'profile: .*too many resources requested for launch'
expect fail_launch 3 "$clean"
expect fail_gemm 3 'cuBLAS status 13'
expect fail_gemm 3 "$clean"

# The events of the last timed step, and the last cudaMalloc (the last
# plan's arena), made to fail (the counts from the run with the same
# arguments): exit 3, the error named, nothing leaked.
counts=$(grep '^cuda dummy: calls:' "$out_dir/perturbed.out")
events=$(sed -nE 's/.* cudaEventCreate=([0-9]+).*/\1/p' <<<"$counts")
mallocs=$(sed -nE 's/.* cudaMalloc=([0-9]+).*/\1/p' <<<"$counts")
if [[ -n $events && -n $mallocs ]]; then
    start fail_event0 RKM_DUMMY_FAIL=cudaEventCreate:$((events - 1)) "${probe[@]}"
    start fail_event1 RKM_DUMMY_FAIL=cudaEventCreate:"$events" "${probe[@]}"
    start fail_malloc RKM_DUMMY_FAIL=cudaMalloc:"$mallocs" "${probe[@]}"
    wait
    expect fail_event0 3 "creating the step's events: out of memory"
    expect fail_event0 3 "$clean"
    expect fail_event1 3 "creating the step's events: out of memory"
    expect fail_event1 3 "$clean"
    expect fail_malloc 3 'arena: .*cudaMalloc.*out of memory'
    expect fail_malloc 3 "$clean"
else
    fail "fail_counts: no call counts from the perturbed run: '$counts'"
    show perturbed
fi

# Injected failures of the copies: the pinned region and the copy streams
# at the arena's creation, and a copy in the middle of a step (an offload,
# a prefetch: the counts from a run with the same arguments): exit 3, the
# copy and the CUDA error named, nothing leaked or left queued.
copy_args=(--preset tiny --steps 1 --warmup 0 --profile-runs 1 --poison --algo rockmate --budgets 33 --copy 1e9)
start copy_counts - "${copy_args[@]}"
wait
counts=$(grep '^cuda dummy: calls:' "$out_dir/copy_counts.out")
asyncs=$(sed -nE 's/.* cudaMemcpyAsync=([0-9]+).*/\1/p' <<<"$counts")
pins=$(sed -nE 's/.* cudaMallocHost=([0-9]+).*/\1/p' <<<"$counts")
streams=$(sed -nE 's/.* cudaStreamCreate=([0-9]+).*/\1/p' <<<"$counts")
if [[ $(rc copy_counts) == 0 && -n $asyncs && -n $pins && -n $streams ]]; then
    start fail_pinned RKM_DUMMY_FAIL=cudaMallocHost:"$pins" "${copy_args[@]}"
    start fail_copy_stream RKM_DUMMY_FAIL=cudaStreamCreate:"$streams" "${copy_args[@]}"
    start fail_copy_mid RKM_DUMMY_FAIL=cudaMemcpyAsync:$((asyncs / 2)) "${copy_args[@]}"
    start fail_copy_late RKM_DUMMY_FAIL=cudaMemcpyAsync:$((asyncs - 3)) "${copy_args[@]}"
    wait
    expect fail_pinned 3 'rkm_cuda_arena_create: copies: cudaMallocHost .*out of memory'
    expect fail_pinned 3 "$clean"
    expect fail_copy_stream 3 'rkm_cuda_arena_create: copies: cudaStreamCreateWithFlags'
    expect fail_copy_stream 3 "$clean"
    expect fail_copy_mid 3 'step [0-9]+: (offload|prefetch) of (tensor|the saved state of op) [0-9]+: .*cudaErrorLaunchFailure'
    expect fail_copy_mid 3 "$clean"
    expect fail_copy_late 3 'step [0-9]+: (offload|prefetch) of (tensor|the saved state of op) [0-9]+: .*cudaErrorLaunchFailure'
    expect fail_copy_late 3 "$clean"
else
    fail "copy_counts: exit $(rc copy_counts), call counts '$counts'"
    show copy_counts
fi

# -fmad=false: the PTX of kernels that sum products into gradients (or
# their parts) without a math library call holds no fma (with nvcc's
# default -fmad=true they hold 10, 5, 1, 15 and 5).
ptx=$build/cuda/gpt2_cuda.ptx
if [[ -f $ptx ]]; then
    for k in layernorm_bwd_k colsum_part_k dropout_bwd_k softmax_bwd_k attn_softmax_bwd_k; do
        n=$(awk -v k="$k" '/^\.visible \.entry/ { inside = index($0, k "P") > 0 } inside && /fma\.rn\.f32/ { n++ }
                END { print n + 0 }' "$ptx")
        if grep -qE "^\.visible \.entry _Z[0-9]+${k}P" "$ptx" && [[ $n == 0 ]]; then
            pass
        else
            fail "fmad_$k: $n fma.rn.f32 in its PTX ($ptx), or no such kernel"
        fi
    done
else
    skip "the PTX checks: no $ptx (nvcc not found, or make cuda not run)"
fi

# the skips on the summary line itself, where tests/run.sh counts them
echo "test_cuda_dummy.sh: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
