"""The hang knob's one-engine form (issue 44): while FILE.dp<N> exists only the EngineCore
of data-parallel rank N blocks, the rank read from the core's own parallel config at each
call; FILE itself still blocks every engine. The real DP=2 engine's case is
tests/e2e/test_dp_stall_e2e.py; here the wrapper's choice, and the vLLM 0.32 config field
it reads (a non-MoE DP engine keeps its rank only in ``data_parallel_index``)."""

from __future__ import annotations

from types import SimpleNamespace

from engine_patches.patches import hang_knob


def core(index: int | None, rank: int = 0) -> SimpleNamespace:
    """An object shaped as vLLM's EngineCore where the knob reads it (its vllm_config)."""
    parallel = SimpleNamespace(data_parallel_rank=rank)
    if index is not None:
        parallel.data_parallel_index = index
    return SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=parallel))


def test_the_rank_comes_from_the_index_vllm_keeps_for_an_independent_dp_engine():
    from vllm.config import ParallelConfig

    p = ParallelConfig(data_parallel_size=2, data_parallel_rank=1)
    p.data_parallel_index = 1
    p.reconfigure_for_independent_dp_rank()  # what EngineCoreProc does for a non-MoE rank
    assert (p.data_parallel_rank, p.data_parallel_index) == (0, 1)
    assert hang_knob.dp_rank(SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=p))) == 1
    assert hang_knob.dp_rank(core(None, rank=3)) == 3  # no index: the rank
    assert hang_knob.dp_rank(object()) is None


def test_only_the_engine_of_the_named_rank_is_held(tmp_path):
    trigger = str(tmp_path / "hold")
    held: list[str] = []

    def hang(path: str) -> None:
        held.append(path)

    step = hang_knob.hang_engine_while(trigger, hang)(lambda self: "stepped")
    assert step(core(0)) == step(core(1)) == "stepped" and held == []  # no file: inert
    (tmp_path / "hold.dp1").touch()
    assert step(core(0)) == "stepped" and held == []  # engine 0 goes on
    assert step(core(1)) == "stepped" and held == [f"{trigger}.dp1"]  # engine 1 was held
    (tmp_path / "hold").touch()
    step(core(0))
    assert held[-1] == trigger  # the plain file: every engine
