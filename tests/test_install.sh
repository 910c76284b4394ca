#!/usr/bin/env bash
# make install into a temporary prefix, then the README's commands: the C
# example linked against the shared library (pkg-config, PKG_CONFIG_PATH,
# LD_LIBRARY_PATH) and fully statically (pkg-config --static), both run;
# the soname is versioned; make uninstall leaves nothing behind. Then the
# README's Vendoring commands, in a folder holding only rockmate.h,
# rockmate.c and the example, each program run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
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
    echo "test_install.sh: pkg-config not found, the link checks are skipped"
fi
check "make uninstall" make -s BUILD="$build" uninstall PREFIX="$prefix"
check "uninstall leaves nothing" test ! -e "$prefix"
# Vendoring: the README's `cc` lines of that section, in order (with
# lp_solve, then without), each program run from here (it reads
# tests/graphs/).
vendor=$tmp/vendor
mkdir -p "$vendor" && cp rockmate.h rockmate.c "$tmp/app.c" "$vendor/"
awk '/^## /{f = $0 == "## Vendoring"; next} f && /^    cc /{sub(/^    /, ""); print}' README.md >"$tmp/vendor.lines"
check "the README's Vendoring section has two compile and two link lines" test "$(wc -l <"$tmp/vendor.lines")" -eq 4
has_lp=0
printf '#include <lpsolve/lp_lib.h>\n' | cc -E -x c - >/dev/null 2>&1 && has_lp=1
while IFS= read -r line; do
    if ((!has_lp)) && [[ $line == *-llpsolve55* || ($line == *" -c "* && $line != *RKM_OMIT_SOLVER*) ]]; then
        echo "test_install.sh: no lp_solve here, skipped: $line"
        continue
    fi
    check "vendoring: $line" bash -c "cd '$vendor' && $line"
    case $line in
    *"-o app"*) check "vendoring: the program runs ($line)" "$vendor/app" ;;
    esac
done <"$tmp/vendor.lines"
check "vendoring without lp_solve links nothing but libc and libm" \
    bash -c "! ldd '$vendor/app' | grep -qE 'lpsolve|colamd|suitesparse'"
echo "test_install.sh: $passed passed, $failed failed"
((failed == 0))
