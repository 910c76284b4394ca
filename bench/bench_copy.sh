#!/usr/bin/env bash
# The GPT-2 trainer (examples/gpt2.c, default shape) with offloading on the
# CPU: two copy threads move bytes at the --copy bandwidth while the kernels
# go on (examples/copier.h), so a plan's waits are real. For each bandwidth
# it runs the trainer RUNS times at one budget and prints the medians of the
# simulator's predicted step time (from the profiled op times, plus the
# plan's waits), the measured one (the trainer's check: the fastest of three
# plan runs), and their ratio; the baseline's ratio beside it shows how far
# the profile alone is off on this machine. ALGO: the trainer's --algo
# (rockmate; dtr offloads too).
#   make demo && bash bench/bench_copy.sh [RUNS] [BUDGET] [ALGO]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
gpt2=${RKM_BUILD:-build}/gpt2
runs=${1:-5}
budget=${2:-25%}
algo=${3:-rockmate}
[[ -x $gpt2 ]] || { echo "bench_copy.sh: $gpt2 not built (make demo)"; exit 1; }

median() { sort -g | awk '{a[NR] = $1} END {print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

printf '%-9s %8s %9s %11s %11s %10s %10s %9s\n' copy offloads waits_ms plan_pred plan_meas meas/pred base_m/p overhead
for bw in none 1e9 2e8 5e7 2e7; do
    args=(--steps 1 --budget "$budget" --algo "$algo")
    [[ $bw != none ]] && args+=(--copy "$bw")
    rows=()
    for ((i = 0; i < runs; i++)); do
        out=$("$gpt2" "${args[@]}" 2>&1)
        grep -q '^demo: ok' <<<"$out" || { echo "bench_copy.sh: gpt2 ${args[*]} failed:"; tail -n 3 <<<"$out"; exit 1; }
        # check: loss L, baseline B ms (predicted PB), plan P ms (predicted PP)
        rows+=("$(sed -nE 's/^check: loss [-0-9.]+, baseline ([0-9.]+) ms \(predicted ([0-9.]+)\), plan ([0-9.]+) ms \(predicted ([0-9.]+)\)$/\1 \2 \3 \4/p' <<<"$out") $(sed -nE 's/^offload: ([0-9]+) offloads.*waits ([0-9.]+) ms.*/\1 \2/p' <<<"$out")")
    done
    col() { printf '%s\n' "${rows[@]}" | awk -v c="$1" '{print (NF >= c ? $c : 0)}' | median; }
    ratio() { printf '%s\n' "${rows[@]}" | awk -v a="$1" -v b="$2" '{print $a / $b}' | median; }
    printf '%-9s %8s %9.2f %11.1f %11.1f %10.3f %10.3f %8.1f%%\n' "$bw" "$(col 5)" "$(col 6)" "$(col 4)" "$(col 3)" \
        "$(ratio 3 4)" "$(ratio 1 2)" "$(printf '%s\n' "${rows[@]}" | awk '{print 100 * ($4 / $2 - 1)}' | median)"
done
