#!/usr/bin/env bash
# `make test`: the two tiers of the suite (`make test-fast`: the first alone).
#   1. the tests without an engine: those that import torch and vLLM (VLLM_TESTS) in one
#      pytest process, beside the rest on $WORKERS pytest-xdist workers (which then never
#      import vLLM): under 3 minutes, they mostly wait on subprocesses, sockets and
#      deadlines; a broken tree fails here;
#   2. the engine tests on two workers, one engine at a time on each (see ENGINE);
#      the run ends with its engine starts and their seconds.
# Each stops at its first failure (-x). TIERS=parallel runs the two tiers side by side;
# not the default: in a fresh clone of 2026-12-07 the fast tier took 461 s beside the
# engine tests (183 s alone) and a timing-sensitive status test failed there.
# Python may write its bytecode caches here even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): every xdist worker and every `python -m opsctl` a test
# starts would otherwise compile opsctl and re-write the asserts of ~180 test modules
# again (6.5 s -> 2.2 s a collection, 0.9 -> 0.5 s an import of the console).
set -u
unset PYTHONDONTWRITEBYTECODE
PY=${1:?usage: tests/tiers.sh PYTHON [WORKERS] [fast]}
WORKERS=${2:-6}
ONLY=${3:-}
# the tests that import torch, transformers or vLLM (in the module or in the test): one
# process pays the ~10 s import once, instead of every xdist worker that gets one of them
# (a module, or one test of a module as its node id). Found with a plugin that logs, per
# xdist worker, the test after which torch/transformers/vllm first sat in sys.modules;
# a test that adds one of them to the fast tier belongs here
VLLM_TESTS=(tests/patches tests/unit/test_registry.py tests/unit/test_lora_adapters.py
            tests/unit/test_engine_layout.py tests/unit/test_mm_uuid_probe.py
            tests/unit/test_engine_tmp.py::test_torch_finds_its_shared_precompiled_headers_through_the_private_tmpdir
            tests/e2e/test_models_extra.py
            tests/unit/test_embedded_idefics3.py  # transformers' AutoProcessor
            tests/unit/test_preflight_registry.py  # registry.apply_all imports vLLM
            tests/unit/test_invariance_images_domain.py::test_engine_info_records_the_multimodal_settings
            tests/unit/test_probe_evidence.py::test_real_ledger_record_of_the_batch_probe_on_an_unverified_release
            tests/unit/test_usage_domain.py::test_roberta_template_matches_a_real_roberta_tokenizer
            tests/cli/test_usage_cli.py::test_local_tokenizer_is_the_primary_count)
# worksteal: an idle worker takes queued tests from a busy one, so a few long UI tests
# dealt late to one worker no longer make the tail
MAIN=(-m pytest -x -q -n "$WORKERS" --dist worksteal -m "not engine" --durations=10 tests)
for t in "${VLLM_TESTS[@]}"; do
    case "$t" in *::*) MAIN+=(--deselect="$t") ;; *) MAIN+=(--ignore="$t") ;; esac
done
VLLM=(-m pytest -x -q -m "not engine" "${VLLM_TESTS[@]}")
# the engine tests on $ENGINE_WORKERS xdist workers, each with its own engine lock (one
# engine at a time per worker; tests/conftest.py), a module (or the modules sharing a
# pooled engine) one unit, the longest units first (tests/engine_pool.py, COSTS): an
# engine mostly runs on one core (single-process engines get one OMP thread), so two
# workers keep both cores busy
# (ENGINE_WORKERS=3 was slower on 2 cores, 2026-12-07: three engines starting at once
# took twice as long each, and serve's 2nd-SIGTERM test missed its 8 s bound.
# ENGINE_WORKERS=1: one engine at a time, about 5 minutes slower. The two failures seen
# with two workers were understood and fixed: the tee test's own client closed its
# stream early (a dropped iterator), and on a busy host diag invariance judged a BS=8
# that formed only 5 together, which it now sends again)
ENGINE_WORKERS=${ENGINE_WORKERS:-2}
ENGINE=(-m pytest -x -q -m engine -n "$ENGINE_WORKERS" --dist loadgroup --no-loadscope-reorder
        --timeout=1800 --durations=25 tests)

fast_tier() {
    # the two halves side by side; the vLLM half's output after the other's
    local log rc_main rc_vllm
    log=$(mktemp /tmp/opsctl-vllm-tests.XXXXXX)
    (trap - INT; exec "$PY" "${VLLM[@]}") >"$log" 2>&1 &
    local vllm=$!
    "$PY" "${MAIN[@]}"
    rc_main=$?
    wait "$vllm"
    rc_vllm=$?
    echo "== the tests importing torch and vLLM (${VLLM_TESTS[*]}): exit $rc_vllm"
    cat "$log"
    rm -f "$log"
    [ "$rc_main" -ne 0 ] && return "$rc_main"
    return "$rc_vllm"
}

t0=$(date +%s)
if [ "$ONLY" = fast ]; then
    fast_tier
    rc=$?
    echo "== tests without an engine: exit $rc after $(($(date +%s) - t0)) s"
    exit "$rc"
fi
if [ "${TIERS:-serial}" != parallel ]; then
    fast_tier || exit
    echo "== tests without an engine: done after $(($(date +%s) - t0)) s"
    exec "$PY" "${ENGINE[@]}"
fi
log=$(mktemp /tmp/opsctl-fast-tier.XXXXXX)
# a background job of a non-interactive shell ignores SIGINT, and Python keeps an
# ignored SIGINT ignored: restore it, so Ctrl-C (and the interruption below) reach pytest
(trap - INT; fast_tier) >"$log" 2>&1 &
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
