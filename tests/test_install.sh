#!/usr/bin/env bash
# make install into a temporary prefix, then the README's commands: the C
# example linked against the shared library (pkg-config, PKG_CONFIG_PATH,
# LD_LIBRARY_PATH) and fully statically (pkg-config --static), both run;
# the soname is versioned; make uninstall leaves nothing behind. Then the
# README's Vendoring commands, in a folder holding only rockmate.h,
# rockmate.c and the example, each program run (with lp_solve, without it,
# and a shared library of the user's own from the two files). Then what a
# new user copies first: the README's program and the quick start at the
# top of rockmate.h, compiled as C11 (gcc, clang) and as C++11, 17 and 20
# (g++, clang++) under -Wall -Wextra -Werror, linked and run; and the strict
# matrix: rockmate.c and the CLI under gcc and clang with -Wall -Wextra
# -Wpedantic -Wimplicit-fallthrough -Werror, with and without
# RKM_OMIT_SOLVER. A compiler that is not there is a skip, counted.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
skipped=0
skip() {
    skipped=$((skipped + 1))
    echo "test_install.sh: skipped: $*"
}
check() {
    local name=$1
    shift
    if "$@" >>"$tmp/log" 2>&1; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $name" >&2; tail -5 "$tmp/log" >&2; fi
}
prefix=$tmp/prefix
awk '/^```c/{f=1;next} /^```/{if(f)exit} f' README.md >"$tmp/app.c"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
check "make install" make -s BUILD="$build" install PREFIX="$prefix"
check "the soname is versioned" bash -c "readelf -d '$prefix/lib/librockmate.so.0' | grep -q 'SONAME.*librockmate.so.0'"
if command -v pkg-config >/dev/null; then
    check "shared link as the README says" bash -c "cc -std=c11 '$tmp/app.c' \$(pkg-config --cflags --libs rockmate) -o '$tmp/app'"
    check "the shared program runs with LD_LIBRARY_PATH" env LD_LIBRARY_PATH="$prefix/lib" "$tmp/app"
    check "fully static link as the README says" \
        bash -c "cc -std=c11 '$tmp/app.c' \$(pkg-config --static --cflags --libs rockmate) -static -o '$tmp/app_static' 2>'$tmp/ld.err'"
    check "the static program runs" "$tmp/app_static"
else
    skip "pkg-config not found: the link checks"
fi
check "make uninstall" make -s BUILD="$build" uninstall PREFIX="$prefix"
check "uninstall leaves nothing" test ! -e "$prefix"
# Vendoring: the README's `cc` lines of that section, in order (with
# lp_solve, then without), each program run from here (it reads
# tests/graphs/).
vendor=$tmp/vendor
mkdir -p "$vendor" && cp rockmate.h rockmate.c "$tmp/app.c" "$vendor/"
awk '/^## /{f = $0 == "## Vendoring"; next} f && /^    cc /{sub(/^    /, ""); print}' README.md >"$tmp/vendor.lines"
check "the README's Vendoring section has three compile and three link lines" test "$(wc -l <"$tmp/vendor.lines")" -eq 6
has_lp=0
printf '#include <lpsolve/lp_lib.h>\n' | cc -E -x c - >/dev/null 2>&1 && has_lp=1
while IFS= read -r line; do
    if ((!has_lp)) && [[ $line == *lpsolve55* || ($line == *" -c "* && $line != *RKM_OMIT_SOLVER*) ]]; then
        skip "no lp_solve here: $line"
        continue
    fi
    check "vendoring: $line" bash -c "cd '$vendor' && $line"
    case $line in
    *"-o app"*) check "vendoring: the program runs ($line)" "$vendor/app" ;; # from here: it reads tests/graphs/
    esac
    case $line in
    *"rockmate.o -lm -o app"*)
        check "vendoring without lp_solve links nothing but libc and libm" \
            bash -c "! ldd '$vendor/app' | grep -qE 'lpsolve|colamd|suitesparse'" ;;
    *"-lmyrockmate"*)
        check "vendoring: the program runs on the shared library made from the two files" \
            bash -c "ldd '$vendor/app' | grep -q 'libmyrockmate.so => $vendor/'" ;;
    esac
done <"$tmp/vendor.lines"

# What a new user copies first, in C and C++. The quick start is a fragment:
# it runs inside a main() that gives it its budget and callbacks, on a graph
# copied as model.rkg.
first=$tmp/first
mkdir -p "$first" && cp rockmate.h "$first/" && cp tests/graphs/gpt2-tiny.rkg "$first/model.rkg"
mkdir -p "$first/tests/graphs" && cp tests/graphs/gpt2-tiny.rkg "$first/tests/graphs/"
cp "$tmp/app.c" "$first/readme.c"
{
    printf '#include <stdio.h>\n#include "rockmate.h"\n'
    printf 'static int fwd(void *u, const rkm_fwd_call *c) { (void)u, (void)c; return 0; }\n'
    printf 'static int bwd(void *u, const rkm_bwd_call *c) { (void)u, (void)c; return 0; }\n'
    printf 'int main(void)\n{\n    uint64_t budget_bytes = (uint64_t)1 << 40;\n'
    printf '    rkm_callbacks callbacks = RKM_ZERO;\n    callbacks.forward = fwd;\n    callbacks.backward = bwd;\n'
    awk '/^ \* QUICK START/{f=1; next} /^ \* CONVENTIONS/{exit} f && /^ \*     /{sub(/^ \*     /, "    "); print}' rockmate.h
    printf '    return 0;\n}\n'
} >"$first/quickstart.c"
check "rockmate.h's quick start was found" grep -q rkm_plan_solve "$first/quickstart.c"
lib=$build/librockmate.a
[[ $lib == /* ]] || lib=$PWD/$lib
solver_libs="-llpsolve55 -lcolamd -ldl"
((has_lp)) || solver_libs=""
for prog in readme quickstart; do
    for compiler in gcc clang g++ clang++; do
        if ! command -v $compiler >/dev/null; then
            skip "$compiler not found: $prog.c"
            continue
        fi
        case $compiler in
        g++ | clang++) stds="c++11 c++17 c++20" lang="-x c++" ;;
        *) stds="c11" lang="" ;;
        esac
        for std in $stds; do
            exe=$first/$prog-$compiler-$std
            check "$prog.c compiles as $std with $compiler -Wall -Wextra -Werror" \
                $compiler -std=$std -Wall -Wextra -Werror -I"$first" $lang -c "$first/$prog.c" -o "$exe.o"
            check "$prog.c ($compiler, $std) links and runs" \
                bash -c "$compiler '$exe.o' '$lib' $solver_libs -lm -pthread -o '$exe' && cd '$first' && '$exe' >/dev/null"
        done
    done
done

# The strict matrix: the library and the CLI, with and without lp_solve.
for compiler in gcc clang; do
    if ! command -v $compiler >/dev/null; then
        skip "$compiler not found: the strict matrix"
        continue
    fi
    for defs in "" "-DRKM_OMIT_SOLVER"; do
        if ((!has_lp)) && [[ -z $defs ]]; then
            skip "no lp_solve here: $compiler strict build with the solver"
            continue
        fi
        for src in rockmate.c cli/rockmate_cli.c; do
            check "$compiler -Wimplicit-fallthrough ... -Werror ${defs:-(lp_solve)} $src" \
                $compiler -std=c11 -Wall -Wextra -Wpedantic -Wimplicit-fallthrough -Werror -ffp-contract=off -I. $defs \
                -O0 -c "$src" -o /dev/null
        done
    done
done
echo "test_install.sh: $passed passed, $failed failed, $skipped skipped"
((failed == 0))
