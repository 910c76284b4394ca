#!/usr/bin/env bash
# The command line tool's progress bar (rkm_solve_desc.progress): with
# stderr on a pseudo-terminal (python3's pty), info, plan and sweep draw a
# one-line bar there (\r, a percent) and erase it, so that a terminal shows
# exactly what it showed without one, and standard output is unchanged;
# with stderr not a terminal, with --json or with --no-progress, not one
# byte of it is written. Prints "test_progress_tty.sh: N passed, N failed,
# N skipped" (1 skipped without python3). RKM_BUILD names the build folder.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
build=${RKM_BUILD:-build}
cli=${RKM_CLI:-$build/rockmate}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. tests/lib.sh

if ! command -v python3 >/dev/null || ! python3 -c 'import pty' 2>/dev/null; then
    skip "the progress bar: python3 (with pty) is needed to give the tool a terminal"
    finish
fi
if [[ ! -x $cli ]]; then
    make -s BUILD="$build" "$build/rockmate" >&2 || { fail "build the CLI"; finish; }
fi

# tty NAME ARGS...: the tool with stderr on a pseudo-terminal (raw: no
# \n -> \r\n) and stdout in $tmp/NAME.out; stderr's bytes in $tmp/NAME.tty,
# what a terminal would show of them in $tmp/NAME.screen, the exit status
# in $tmp/NAME.rc.
tty() {
    local name=$1
    shift
    python3 - "$tmp/$name" "$cli" "$@" <<'EOF'
import os, pty, subprocess, sys, tty as ttymod
base, argv = sys.argv[1], sys.argv[2:]
master, slave = pty.openpty()
ttymod.setraw(slave)
with open(base + ".out", "wb") as out:
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=slave)
os.close(slave)
data = b""
while True:
    try:
        chunk = os.read(master, 65536)
    except OSError:
        break
    if not chunk:
        break
    data += chunk
rc = p.wait()
open(base + ".tty", "wb").write(data)
open(base + ".rc", "w").write("%d\n" % rc)
# A terminal: \r to column 0, \n to the next line, ESC [ K erases to the end.
lines, row, col, i = [[]], 0, 0, 0
while i < len(data):
    c = data[i:i + 1]
    if data.startswith(b"\x1b[K", i):
        del lines[row][col:]
        i += 3
        continue
    if c == b"\r":
        col = 0
    elif c == b"\n":
        row, col = row + 1, 0
        if row == len(lines):
            lines.append([])
    else:
        line = lines[row]
        line.extend([b" "] * (col - len(line)))
        if col < len(line):
            line[col] = c
        else:
            line.append(c)
        col += 1
    i += 1
text = b"\n".join(b"".join(l).rstrip(b" ") for l in lines)
open(base + ".screen", "wb").write(text.rstrip(b"\n") + (b"\n" if text.strip() else b""))
EOF
}

# plain NAME ARGS...: the tool without a terminal: $tmp/NAME.out, .err, .rc.
plain() {
    local name=$1
    shift
    "$cli" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null
    echo $? >"$tmp/$name.rc"
}

# The planning time in plan's text varies from run to run.
steady() { grep -v '^  planning ' "$1"; }
same_out() { diff <(steady "$tmp/$1.out") <(steady "$tmp/$2.out") >/dev/null; }
drew_bar() { grep -q $'\r' "$tmp/$1.tty" && grep -q '[0-9]%' "$tmp/$1.tty"; }
same_rc() { [[ $(cat "$tmp/$1.rc") == $(cat "$tmp/$2.rc") ]]; }

g=tests/graphs/mlp16.rkg
cases=(
    "plan plan $g --budget 40%"
    "info info $g"
    "sweep sweep $g --points 3"
    "nofit plan $g --budget 5%"
)
for c in "${cases[@]}"; do
    read -r -a a <<<"$c"
    name=${a[0]}
    args=("${a[@]:1}")
    tty "$name-tty" "${args[@]}"
    plain "$name" "${args[@]}"
    check "$name: a bar on the terminal" drew_bar "$name-tty"
    check "$name: nothing of it left on the screen" cmp -s "$tmp/$name-tty.screen" "$tmp/$name.err"
    check "$name: standard output as without a terminal" same_out "$name-tty" "$name"
    check "$name: the same exit status" same_rc "$name-tty" "$name"
    check "$name: no bar without a terminal" bash -c "! grep -q \$'[\\r\\x1b]' '$tmp/$name.err'"
done
check "plan: no terminal, nothing on stderr" test ! -s "$tmp/plan.err"
check "nofit: no terminal, one line on stderr" test "$(wc -l <"$tmp/nofit.err")" = 1

# --json and --no-progress: not one byte on the terminal.
tty json-tty plan "$g" --budget 40% --json
plain json plan "$g" --budget 40% --json
check "--json: nothing on the terminal" test ! -s "$tmp/json-tty.tty"
check "--json: the same JSON" bash -c "diff <(grep -v seconds '$tmp/json-tty.out') <(grep -v seconds '$tmp/json.out') >/dev/null"
tty quiet-tty sweep "$g" --points 3 --no-progress
check "--no-progress: nothing on the terminal" test ! -s "$tmp/quiet-tty.tty"
tty check-tty check "$g" "$tmp/none.rkp"
check "check plans nothing: no bar" bash -c "! grep -q \$'\\r' '$tmp/check-tty.tty'"

# -v: the library's log lines stay whole between the bar's frames.
tty verbose-tty plan "$g" --budget 40% -v
plain verbose plan "$g" --budget 40% -v
check "-v: a bar on the terminal" drew_bar verbose-tty
check "-v: the log lines as without a terminal" bash -c "diff <(sed 's/[0-9.]* s\\b/T s/g' '$tmp/verbose-tty.screen') <(sed 's/[0-9.]* s\\b/T s/g' '$tmp/verbose.err') >/dev/null"

finish
