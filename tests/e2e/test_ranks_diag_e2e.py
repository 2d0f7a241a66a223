"""The diags that start their own engine, with `--tp 2` (issue 44, item 6): two engine
starts, through the CLI: `diag kv-fail --tp 2` on tiny-hybrid, patched and `--no-patch`.
(`diag invariance --model tiny-llama --tp 2` passed here on its isolated TP=2 engine, batch
probe formed; the tier no longer starts that engine, for time: its plan keeps the ranks
and the probes, tests/unit/test_rank_launch.py, and invariance on a TP=2 server is read in
test_rank_hang_e2e.py.)

With TP=2 each worker holds one of the model's two KV heads. On main the fault-injecting
connector wrote both workers' KV into one folder per prompt (the first rank's part won),
so the other rank reloaded foreign heads: the failure-free round trip changed tokens and
the patched run failed ("comparison inconclusive"), and every injection was counted twice
(8 for 4 blocks). Now each rank stores and reloads its own part, every rank fails the same
blocks (counted once, compared across ranks), and the verdicts are those of one rank:
patched passes, `--no-patch` shows the engine death the patch prevents.

The patched run is also the polite stop of every rank (what SIGINT, SIGTERM and SIGHUP of
`opsctl serve --tp 2` reach: one handler, opsctl.engine.lifetime, then this stop; was a
serve SIGINTed mid-start in test_ranks_lifetime_e2e.py, one TP=2 start more): under the
operator's own thread binding, which vLLM honours, its stop leaves no rank, no segment its
tree held and nothing in its $TMPDIR."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.test_kv_fail import OPSCTL, SAME_THREADS, assert_died_unpatched, diag
from tests.e2e.test_serve_e2e import gone, left_in, run_watched

pytestmark = pytest.mark.engine

BINDING = "1|0"  # the operator's own: rank 0 on CPU 1 (opsctl derives "0|1")


@pytest.fixture(scope="module")
def patched():
    """``diag kv-fail --tp 2`` with the operator's binding and a $TMPDIR of its own, its
    process tree and the segments it held watched: (rc, doc, stderr, watch, tmp)."""
    tmp = Path(tempfile.mkdtemp(prefix="ot-", dir="/tmp"))  # short: vLLM's socket paths
    env = {**os.environ, **SAME_THREADS, "TMPDIR": str(tmp), "VLLM_CPU_OMP_THREADS_BIND": BINDING}
    args = [*OPSCTL, "diag", "kv-fail", "--json", "--model", "tiny-hybrid", "--tp", "2"]
    try:
        proc, watch = run_watched(args, 1500, env)
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            pytest.fail(f"no JSON (rc {proc.returncode}); stderr:\n{proc.stderr[-3000:]}")
        yield proc.returncode, doc, proc.stderr, watch, tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def unpatched():
    return diag("--model", "tiny-hybrid", "--tp", "2", "--no-patch")


def events(doc: dict, kind: str) -> list[dict]:
    path = Path(doc["run_dir"]) / "events" / f"{kind}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_patched_tp2_passes_with_every_rank_its_own_kv(patched):
    rc, doc, err, _watch, _tmp = patched
    assert rc == 0, err[-3000:]
    assert doc["verdict"] == "pass", doc["findings"]
    assert [g["spec"] for g in doc["kv_cache_groups"]] == ["SlidingWindowSpec", "FullAttentionSpec"]
    assert all(r["roundtrip"]["identical"] for r in doc["requests"])  # each rank's own heads
    assert doc["engine_alive"] and doc["outputs_identical"] and doc["requests_failed"] == 0
    targets = doc["injection"]["targets"]
    assert doc["failures_injected"] == 2 * len(targets)  # one per group, counted once
    assert any(r["sensitivity"] and not r["sensitivity"]["identical"] for r in doc["requests"])
    (agree,) = [f for f in doc["findings"] if f["code"] == "kv_fail.ranks_agree"]
    assert agree["message"].startswith("all 2 ranks injected the same")
    # the connector ran on both workers, each with its rank, and both failed the same blocks
    workers = [e for e in events(doc, "kv_connector") if e.get("role") == "worker"]
    assert sorted(e["rank"] for e in workers) == [0, 1] and {e["world"] for e in workers} == {2}
    per_rank = Counter()
    for e in events(doc, "kv_injections"):
        per_rank[e["rank"]] += 1
    assert per_rank[0] == per_rank[1] > 0 and set(per_rank) == {0, 1}
    stored = Path(doc["run_dir"]) / "kv_store"
    parts = {p.name for key in stored.iterdir() if key.is_dir() for p in key.iterdir()}
    assert parts == {"rank0", "rank1"}


def test_its_stop_leaves_no_rank_no_segment_and_keeps_the_operators_binding(patched):
    rc, doc, err, watch, tmp = patched
    assert rc == 0, err[-3000:]
    log = (Path(doc["run_dir"]) / "server.log").read_text()
    assert f"VLLM_CPU_OMP_THREADS_BIND='{BINDING}'" in log and "local_rank=0, core ids=[1]" in log
    # the watch saw the ranks: their cpushm segments (vLLM never unlinks them itself)
    assert len([n for n in watch.names() if "-cpushm_" in n]) >= 2, sorted(watch.names())
    assert gone(watch.members), sorted(watch.members)
    assert watch.left() == set(), f"held {sorted(watch.names())}, left {watch.left()}"
    assert left_in(tmp) == []


def test_unpatched_tp2_shows_the_engine_death(unpatched):
    rc, doc, err = unpatched
    assert rc == 1, err[-3000:]
    assert_died_unpatched(doc, err)
