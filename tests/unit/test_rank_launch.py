"""How an engine opsctl starts gets its ranks: vLLM's own flags read as ranks, the refusals
made before anything starts (heads, CPUs, a DP option vLLM refuses), the thread binding
(the operator's own wins), and the rank segments a stop removes (named after the run's
rendezvous file). The same on real engines: tests/e2e/test_ranks_launch_e2e.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine_patches import run_segments
from opsctl.checks.target import EngineSpec, UrlTarget, rank_args, with_ranks
from opsctl.engine import server
from opsctl.engine.model import resolve
from opsctl.errors import BadInput


@pytest.fixture(scope="module")
def llama():
    return resolve("tiny-llama")


def opts(model, **kw) -> server.LaunchOptions:
    return server.LaunchOptions(model=model, **kw)


def test_vllms_own_rank_flags_become_the_ranks(llama):
    got = server.with_rank_args(opts(llama, extra_args=["-tp", "2", "--seed", "3"]))
    assert (got.tp, got.dp, got.extra_args) == (2, 1, ["--seed", "3"])
    argv = server.build_argv(got, 8000)
    assert argv.count("--tensor-parallel-size") == 1 and "-tp" not in argv
    # an EngineServer reads them the same way (a library call, a check's extra args)
    assert server.EngineServer(opts(llama, extra_args=["--data-parallel-size=2"])).opts.dp == 2


def test_a_rank_given_both_ways_is_refused(llama):
    with pytest.raises(BadInput, match="TP size is given twice"):
        server.with_rank_args(opts(llama, tp=2, extra_args=["--tensor-parallel-size", "2"]))


def test_a_tp_size_the_heads_do_not_divide_is_refused_before_the_cpus(llama, monkeypatch):
    monkeypatch.setattr(server, "allowed_cpus", lambda: list(range(64)))
    with pytest.raises(BadInput, match="4 attention heads") as err:
        server.refuse_ranks(opts(llama, tp=3))
    assert "--tp 1 or 2 or 4" in (err.value.hint or "")
    server.refuse_ranks(opts(llama, tp=4))  # 2 KV heads, replicated: vLLM takes it


def test_more_ranks_than_cpus_is_refused(llama, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(server, "allowed_cpus", lambda: [0])
    with pytest.raises(BadInput, match=r"needs 2 CPUs .* may use 1 \(0\)"):
        server.refuse_ranks(opts(llama, dp=2))


def test_external_data_parallel_is_refused_for_a_model_without_experts(llama, monkeypatch):
    monkeypatch.setattr(server, "allowed_cpus", lambda: [0, 1])
    for flag in (["--data-parallel-external-lb"], ["--data-parallel-rank", "0"]):
        with pytest.raises(BadInput, match="non-MoE models do not support external"):
            server.refuse_ranks(opts(llama, dp=2, extra_args=flag))
    server.refuse_ranks(opts(llama, dp=2))  # internal load balancing: fine


def test_the_operators_binding_wins(llama, tmp_path, monkeypatch):
    monkeypatch.setattr(server, "has_gpu", lambda: False)
    monkeypatch.setattr(server, "allowed_cpus", lambda: [0, 1])
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert server.build_env(opts(llama, tp=2), tmp_path)["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1|0")
    assert server.build_env(opts(llama, tp=2), tmp_path)["VLLM_CPU_OMP_THREADS_BIND"] == "1|0"
    mine = opts(llama, tp=2, env={"VLLM_CPU_OMP_THREADS_BIND": "0|0"})
    assert server.build_env(mine, tmp_path)["VLLM_CPU_OMP_THREADS_BIND"] == "0|0"
    # and with the operator's binding, fewer CPUs than ranks is theirs to decide
    monkeypatch.setattr(server, "allowed_cpus", lambda: [0])
    server.refuse_ranks(opts(llama, tp=2))


def test_a_spec_takes_ranks_a_url_does_not(monkeypatch):
    monkeypatch.setattr(server, "allowed_cpus", lambda: [0, 1])
    spec = with_ranks(EngineSpec("tiny-llama"), 2, None)
    assert (spec.tp, spec.dp, spec.single_process) == (2, 1, False)
    assert with_ranks(EngineSpec("tiny-llama"), None, None) == EngineSpec("tiny-llama")
    with pytest.raises(BadInput, match="not of the server at http://h:1"):
        with_ranks(UrlTarget("http://h:1"), None, 2)
    with pytest.raises(BadInput, match="at least 1"):
        rank_args(0, None)


def test_a_runs_rank_segments_are_named_by_its_rendezvous_file(tmp_path):
    tmp, shm = tmp_path / "opsctl-eng-x", tmp_path / "shm"
    tmp.mkdir()
    shm.mkdir()
    ident = "vllm_dist_0123abcd"
    (tmp / ident).write_text("")
    (tmp / "some.sock").write_text("")
    mine = [f"{ident}-tp:0-[0-1]-cpushm_0", f"{ident}-tp:0-[0-1]-cpushm_1"]
    others = ["vllm_dist_ffff-tp:0-[0-1]-cpushm_0", "psm_1234", f"{ident}-not-a-rank-segment"]
    for name in mine + others:
        (shm / name).write_bytes(b"x")
    assert run_segments.idents(tmp) == [ident]
    assert run_segments.names([ident], str(shm)) == sorted(mine)
    held = shm / mine[0]
    with open(held) as fh:  # an open descriptor holds it: never removed
        removed, kept = run_segments.remove(tmp, str(shm))
        assert os.fstat(fh.fileno())
    assert removed == [mine[1]] and kept == [mine[0]]
    assert sorted(p.name for p in shm.iterdir()) == sorted([mine[0], *others])
    assert run_segments.remove(tmp, str(shm)) == ([mine[0]], [])
    assert run_segments.remove(None, str(shm)) == ([], [])
    assert Path(tmp / ident).exists()  # the rendezvous file is the TMPDIR's to remove


def test_opsctls_stop_takes_the_ring_buffers_its_run_wrote_down_as_made(tmp_path):
    """opsctl's stop removes what its run wrote down as made (a ring buffer made after
    its last look at what the engine maps), beside the ranks' segments; a recorded
    segment already unlinked, or someone else's, is not the run's."""
    from opsctl.collectors import shm as shm_collector

    tmp, shm = tmp_path / "opsctl-eng-x", tmp_path / "shm"
    (tmp / run_segments.MADE).mkdir(parents=True)
    shm.mkdir()
    ident = "vllm_dist_0123abcd"
    (tmp / ident).write_text("")
    for name in ("psm_made", "psm_unlinked_since"):
        (tmp / run_segments.MADE / name).write_text("")
    for name in ("psm_made", "psm_someone_elses", f"{ident}-tp:0-[0-1]-cpushm_0"):
        (shm / name).write_bytes(b"x")
    want = {"psm_made", f"{ident}-tp:0-[0-1]-cpushm_0"}
    assert shm_collector.rank_segments(tmp, shm) == want
    assert run_segments.made(tmp, str(shm)) == ["psm_made"]
    assert sorted(run_segments.remove(tmp, str(shm))[0]) == sorted(want)
    assert [p.name for p in shm.iterdir()] == ["psm_someone_elses"]


def test_invariances_own_engine_keeps_the_ranks_and_the_batch_probe():
    """`diag invariance --model tiny-llama --tp 2` (run on a real TP=2 engine once; the
    tier no longer starts it): the isolated engine of each mode keeps both ranks in vLLM's
    multiprocess layout, with the batch probe that shows BS=N formed, and its launch asks
    vLLM for them."""
    from opsctl.suite.invariance import run as invariance

    target = with_ranks(EngineSpec(model="tiny-llama"), 2, None)
    runs = invariance.plan(target, invariance.Options(mode="both"))
    assert [mode for mode, _ in runs] == ["default", "eager"]
    for _mode, spec in runs:
        assert (spec.tp, spec.dp, spec.single_process) == (2, 1, False), spec
        assert spec.probes >= invariance.PROBES
        launch = server.LaunchOptions(model=resolve("tiny-llama"), tp=spec.tp)
        argv = server.build_argv(launch, 8000)
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
