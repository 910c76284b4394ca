# Sourced by the shell tests (test_cli.sh, test_progress_tty.sh): their
# counters and assertions, and the summary line tests/run.sh adds up,
# "NAME: N passed, N failed, N skipped". A check that cannot run in this
# build is a skip, never a pass.
passed=0
failed=0
skipped=0

ok() { passed=$((passed + 1)); }
fail() {
    failed=$((failed + 1))
    echo "FAIL: $*" >&2
}
skip() {
    skipped=$((skipped + 1))
    echo "SKIP $*"
}
# check NAME COMMAND...: one assertion, passes when COMMAND succeeds.
check() {
    local name=$1
    shift
    if "$@"; then ok; else fail "$name"; fi
}
# The summary line; exits non-zero when anything failed.
finish() {
    echo "$(basename "$0"): $passed passed, $failed failed, $skipped skipped"
    ((failed == 0))
    exit
}
