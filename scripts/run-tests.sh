#!/bin/sh
# Runs `swift test` with the arguments given, under a deadline (TEST_TIMEOUT seconds, default
# 900): a suite that hangs fails in minutes instead of holding CI until its own limit, and the
# tests that started and never finished are named. Output is line-buffered (stdbuf), so that
# what a hung run printed last is really its last line.
set -u
limit="${TEST_TIMEOUT:-900}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
timeout --kill-after=10 "$limit" stdbuf -oL -eL "${SWIFT:-swift}" test "$@" 2>&1 | tee "$log"
# The pipeline's status is tee's; ask the log whether the run finished.
if grep -qE "^(✔|✘) Test run with" "$log"; then
    grep -qE "^✘ Test run with" "$log" && exit 1
    exit 0
fi
echo "run-tests: the test run did not finish within ${limit} s (or crashed). Started and not finished:"
grep -E '^◇ Test "' "$log" | sed 's/^◇ Test "\(.*\)" started\.$/\1/' | sort > "${log}.started"
grep -E '^(✔|✘) Test "' "$log" | sed 's/^. Test "\(.*\)" \(passed\|failed\|recorded\).*/\1/' | sort -u > "${log}.ended"
comm -23 "${log}.started" "${log}.ended" | sed 's/^/  /'
rm -f "${log}.started" "${log}.ended"
exit 1
