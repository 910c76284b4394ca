#!/usr/bin/env bash
# DTR (`--algo dtr`) with and without a copy link, beside rockmate with it:
# for each graph at 90..10 % of its baseline peak, the overhead in % of DTR
# recompute-only (`recomp`), of DTR with 450 GB/s and with 25 GB/s each way
# (10 us a copy), of rockmate with each link, and DTR's planning seconds
# without a link and with 25 GB/s (`solve_seconds`: one run each, so noisy
# on a loaded machine). `-`: no plan. Every figure is the simulator's.
#   make cli && bash bench/bench_dtr_copy.sh [GRAPH...]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
cli=${RKM_BUILD:-build}/rockmate
[[ -x $cli ]] || { echo "bench_dtr_copy.sh: $cli not built (make cli)"; exit 1; }
(($#)) || set -- gpt2-xl-b4-t1024 gpt2-124M-b4-t64 resnet18-like-b32

# figures ALGO BUDGET [COPY]: "overhead% solve_seconds", or "- -"
figures() {
    "$cli" plan "tests/graphs/$3.rkg" --algo "$1" --budget "$2" ${4:+--copy "$4"} --no-progress --json 2>/dev/null |
        python3 -c 'import json, sys
try:
    d = json.load(sys.stdin); print("%.2f %.3f" % (100 * d["overhead"], d["solve_seconds"]))
except Exception:
    print("- -")'
}

for g in "$@"; do
    echo "$g"
    printf '%-6s %8s %8s %8s %9s %9s %8s %8s\n' budget recomp 450GB/s 25GB/s rock450 rock25 s:rec s:25
    for b in 90 80 70 60 50 40 30 20 10; do
        read -r rec srec < <(figures dtr "$b%" "$g")
        read -r f450 _ < <(figures dtr "$b%" "$g" 450e9,450e9,1e-5)
        read -r f25 s25 < <(figures dtr "$b%" "$g" 25e9,25e9,1e-5)
        read -r r450 _ < <(figures rockmate "$b%" "$g" 450e9,450e9,1e-5)
        read -r r25 _ < <(figures rockmate "$b%" "$g" 25e9,25e9,1e-5)
        printf '%-6s %8s %8s %8s %9s %9s %8s %8s\n' "$b%" "$rec" "$f450" "$f25" "$r450" "$r25" "$srec" "$s25"
    done
done
