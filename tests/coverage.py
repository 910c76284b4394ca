#!/usr/bin/env python3
"""Line and branch coverage of src/*.c from a --coverage build (make coverage).

    python3 tests/coverage.py BUILD

Reads every BUILD/**/*.gcda through gcov's JSON output (gcov -t -j -b, no
lcov or gcovr needed) and adds up the counts of each source line over all
the objects that hold it: the sources' own objects (tests that include
src/internal.h, and the src/*.c files such a test includes itself), and
rockmate.c, compiled into the tests that include it
and into the tests' library, whose lines are mapped back to src/ (rockmate.c
is src/'s files one after another, each under a "/* ==== src/F ==== */"
line, their `#include "internal.h"` lines left out). A line counts when it
is executable in any object, covered when it ran in any; a branch (gcov's
arcs out of a line's blocks, by index) is covered when taken at least once.

Prints a table, per file and in total, and writes the lines never run to
BUILD/coverage-uncovered.txt (FILE:LINE, one a line). Exit status 1 when
there is no coverage data, or rockmate.c is not src/'s amalgamation."""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
MARKER = re.compile(r"^/\* ==== (src/[A-Za-z0-9_.]+) ==== \*/$")


def amalgamation_map():
    """rockmate.c's line number -> (src file, its line number)."""
    with open(os.path.join(ROOT, "rockmate.c")) as f:
        lines = f.read().split("\n")
    where = {}
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            i += 1
            continue
        name = m.group(1)
        with open(os.path.join(ROOT, name)) as f:
            src = f.read().split("\n")
        if src and src[-1] == "":
            src.pop()
        j = i + 2  # the marker, then a blank line
        for n, text in enumerate(src, 1):
            if text == '#include "internal.h"':
                continue
            if j >= len(lines) or lines[j] != text:
                sys.exit("coverage.py: rockmate.c line %d is not %s:%d: run make amalgamation" % (j + 1, name, n))
            where[j + 1] = (name, n)
            j += 1
        i = j
    return where


def gcov_json(gcda):
    """gcov's JSON for one data file (its notes file beside it)."""
    r = subprocess.run(["gcov", "-t", "-j", "-b", gcda], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("coverage.py: gcov %s failed: %s" % (gcda, r.stderr.strip()))
    return json.loads(r.stdout)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tests/coverage.py BUILD")
    build = sys.argv[1]
    gcdas = sorted(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, build)) for f in fs
                   if f.endswith(".gcda"))
    if not gcdas:
        print("coverage.py: no .gcda files under %s: build with --coverage and run the tests first" % build)
        return 1
    amal = amalgamation_map()
    count = {}     # (file, line) -> times run
    branches = {}  # (file, line) -> [times taken, by branch index]
    version = ""
    for gcda in gcdas:
        d = gcov_json(gcda)
        version = d.get("gcc_version", version)
        for f in d["files"]:
            path = os.path.relpath(os.path.normpath(os.path.join(d["current_working_directory"], f["file"])), ROOT)
            if path != "rockmate.c" and not re.fullmatch(r"src/[^/]+\.c", path):
                continue
            for ln in f["lines"]:
                key = amal.get(ln["line_number"]) if path == "rockmate.c" else (path, ln["line_number"])
                if key is None or not key[0].endswith(".c"):
                    continue  # src/internal.h's lines: not src/*.c
                count[key] = count.get(key, 0) + ln["count"]
                b = branches.setdefault(key, [])
                for k, br in enumerate(ln["branches"]):
                    if k == len(b):
                        b.append(0)
                    b[k] += br["count"]

    files = sorted(set(p for p, _ in count) | set(
        os.path.join("src", f) for f in os.listdir(os.path.join(ROOT, "src")) if f.endswith(".c")))
    rows = []
    for name in files:
        keys = [k for k in count if k[0] == name]
        lt, lh = len(keys), sum(1 for k in keys if count[k] > 0)
        bt = sum(len(branches[k]) for k in keys)
        bh = sum(1 for k in keys for c in branches[k] if c > 0)
        rows.append((name, lh, lt, bh, bt))

    def pct(h, t):
        return "%5.1f%%" % (100.0 * h / t) if t else "    - "

    print("coverage of src/*.c by the programs run in %s (gcov, gcc %s):" % (build, version))
    print("%-22s %-18s %s" % ("file", "lines", "branches"))
    for name, lh, lt, bh, bt in rows + [("total", *[sum(r[i] for r in rows) for i in range(1, 5)])]:
        print("%-22s %5d/%-5d %6s %5d/%-5d %6s" % (name, lh, lt, pct(lh, lt), bh, bt, pct(bh, bt)))
    out = os.path.join(ROOT, build, "coverage-uncovered.txt")
    with open(out, "w") as f:
        for name, n in sorted(k for k in count if count[k] == 0):
            f.write("%s:%d\n" % (name, n))
    print("lines never run: %s" % os.path.relpath(out, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
