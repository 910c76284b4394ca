#!/usr/bin/env bash
# The library's layers: each file of src/ uses only what the files before
# it in src/amalgamate.sh's FILES define (the order rockmate.c is made in),
# so the sources read bottom-up and have no cycles. Each file is compiled
# alone (the objects `make test` builds in BUILD/tests/src, else here), and
# every rkm_ symbol it leaves undefined (nm -u) must be defined (nm
# --defined-only) by a file before it. A reference to a later file fails,
# naming the file, the symbol and where it is defined; one to no file of
# src/ fails too (a declaration without a definition).
#
# No exception: the nested planner's recursion (nest.c planning a block as a
# graph of its own) goes through a function pointer that planner.c hands
# down (rkm__planner_maker), not through a symbol.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
passed=0
failed=0
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
ok() { passed=$((passed + 1)); }
command -v nm >/dev/null || { echo "test_layers.sh: 0 passed, 1 failed"; echo "FAIL: nm not found (binutils)"; exit 1; }
read -r -a files <<<"$(sed -n '/^FILES="/,/"$/p' src/amalgamate.sh | tr -d '"' | sed 's/FILES=//' | tr -s ' \n' ' ')"
objdir=$build/tests/src
tmp=
for f in "${files[@]}"; do
    if [[ ! -e $objdir/$f.o || $objdir/$f.o -ot src/$f.c || $objdir/$f.o -ot src/internal.h ]]; then
        tmp=$(mktemp -d)
        objdir=$tmp
        break
    fi
done
[[ -n $tmp ]] && trap 'rm -rf "$tmp"' EXIT
if [[ -n $tmp ]]; then
    for f in "${files[@]}"; do
        ${CC:-cc} -std=c11 -I. -O0 -c "src/$f.c" -o "$objdir/$f.o" || fail "src/$f.c does not compile alone"
    done
fi
declare -A pos def
for i in "${!files[@]}"; do pos[${files[i]}]=$i; done
for f in "${files[@]}"; do
    while read -r sym; do def[$sym]=$f; done < <(nm --defined-only -g "$objdir/$f.o" | awk '$3 ~ /^rkm/ { print $3 }')
done
for f in "${files[@]}"; do
    up=0
    while read -r sym; do
        d=${def[$sym]:-}
        if [[ -z $d ]]; then
            fail "src/$f.c uses $sym, which no file of src/ defines"
        elif ((pos[$d] > pos[$f])); then
            fail "src/$f.c uses $sym, defined in src/$d.c, a later file (src/amalgamate.sh's FILES)"
            up=$((up + 1))
        fi
    done < <(nm -u "$objdir/$f.o" | awk '$2 ~ /^rkm/ { print $2 }')
    ((up == 0)) && ok
done
echo "test_layers.sh: $passed passed, $failed failed"
((failed == 0))
