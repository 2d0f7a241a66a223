#!/usr/bin/env bash
# `make test`: the two tiers of the suite.
#   1. the tests without an engine, on $WORKERS pytest-xdist workers (about 3.5 minutes;
#      they mostly wait on subprocesses, sockets and deadlines): a broken tree fails here;
#   2. the engine tests, one engine at a time (cheap modules first); the run ends with
#      its engine starts and their seconds.
# Each tier stops at its first failure (-x). TIERS=parallel runs them side by side
# (about 2 minutes less; seen flaky on 2 busy cores: timing-sensitive console tests
# beside real engines and a CPU hog), so it is not the default.
set -u
PY=${1:?usage: tests/tiers.sh PYTHON [WORKERS]}
WORKERS=${2:-4}
FAST=(-m pytest -x -q -n "$WORKERS" -m "not engine" --durations=10 tests)
ENGINE=(-m pytest -x -q -m engine --timeout=1800 --durations=25 tests)
t0=$(date +%s)
if [ "${TIERS:-serial}" != parallel ]; then
    "$PY" "${FAST[@]}" || exit
    echo "== tests without an engine: done after $(($(date +%s) - t0)) s"
    exec "$PY" "${ENGINE[@]}"
fi
log=$(mktemp /tmp/opsctl-fast-tier.XXXXXX)
# a background job of a non-interactive shell ignores SIGINT, and Python keeps an
# ignored SIGINT ignored: restore it, so Ctrl-C (and the interruption below) reach pytest
(trap - INT; exec "$PY" "${FAST[@]}") >"$log" 2>&1 &
fast=$!
(trap - INT; exec "$PY" "${ENGINE[@]}") &
engine=$!
# a stop of this script (CI cancelling the job) is Ctrl-C for both tiers
trap 'kill -INT "$fast" "$engine" 2>/dev/null' TERM
wait "$fast"
fast_rc=$?
echo
echo "== tests without an engine (beside the engine tests): exit $fast_rc after $(($(date +%s) - t0)) s"
cat "$log"
rm -f "$log"
if [ "$fast_rc" -ne 0 ]; then
    echo "== the fast tier failed: interrupting the engine tests" >&2
    kill -INT "$engine" 2>/dev/null
fi
wait "$engine"
engine_rc=$?
echo "== both tiers done in $(($(date +%s) - t0)) s (fast tier exit $fast_rc, engine tier exit $engine_rc)"
[ "$fast_rc" -ne 0 ] && exit "$fast_rc"
exit "$engine_rc"
