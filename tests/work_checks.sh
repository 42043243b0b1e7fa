# work_checks.sh — sourced by the shell tests that count their failures: $work, a scratch
# directory removed when the test exits, and fail MESSAGE, which prints "FAIL: MESSAGE" and counts
# it in $failures. Each test ends with its own summary of $failures and its exit status.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
