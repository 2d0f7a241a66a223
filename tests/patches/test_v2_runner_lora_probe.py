"""The lora probe and OPSCTL_LORA_SWAP on vLLM's V2 model runner. Its LoRA code
(``vllm.v1.worker.gpu.lora_utils.LoraState`` and ``vllm.v1.worker.gpu.mm.lora.
set_active_mm_loras``, the name ``vllm.v1.worker.gpu.model_runner`` calls) imports on
this CPU vLLM 0.32, so the real functions run under the probe's wrappers here (the
CPU platform is told apart by ``platform_name``, which the tests set to ``cuda``).
The same targets, with the parameters the wrappers bind, are resolved in the real
0.26.0, 0.33.0 and 0.34.0 wheels (``wheels``)."""

from __future__ import annotations

import ast
from types import SimpleNamespace

import numpy as np
import pytest

from engine_patches import knobs
from engine_patches.patches import lora_swap_probe as P
from engine_patches.registry import APPLIED
from opsctl.collectors.ledger import read_events
from tests.standins.patch_env import clean_patch_env
from tests.wheel_sources import release_sources


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    clean_patch_env(monkeypatch, tmp_path, knobs.ENABLE, knobs.LORA_SWAP)
    monkeypatch.setattr(P, "platform_name", lambda: "cuda")
    yield
    P.undo()


def events(run_dir) -> list[dict]:
    return [
        {k: v for k, v in e.items() if k not in ("pid", "time")}
        for e in read_events(run_dir, "lora")
    ]


def lora_state(ids: list[int]):
    from vllm.v1.worker.gpu.lora_utils import LoraState

    state = LoraState(max_num_reqs=len(ids) + 2)
    state.lora_ids[: len(ids)] = ids
    return state


def test_apply_hooks_v2_lora_code(monkeypatch) -> None:
    from vllm.v1.worker.gpu import model_runner
    from vllm.v1.worker.gpu.lora_utils import LoraState

    original = model_runner.set_active_mm_loras
    monkeypatch.setenv("OPSCTL_PROBES", "lora")
    out = P.apply()
    assert out.status == APPLIED and "V2 runner hooked" in out.detail, out.detail
    assert model_runner.set_active_mm_loras is not original
    assert not getattr(LoraState.make_lora_inputs, "_opsctl_lora_swap", False)  # no knob
    P.undo()
    assert model_runner.set_active_mm_loras is original


def test_cpu_platform_keeps_v1_only(monkeypatch) -> None:
    from vllm.v1.worker.gpu import model_runner

    original = model_runner.set_active_mm_loras
    monkeypatch.setattr(P, "platform_name", lambda: "cpu")
    monkeypatch.setenv("OPSCTL_PROBES", "lora")
    out = P.apply()
    assert "V1 runner hooked" in out.detail and "V2" not in out.detail
    assert model_runner.set_active_mm_loras is original


def test_v2_lm_swap_only_in_a_mixed_batch(monkeypatch, tmp_path) -> None:
    from vllm.v1.worker.gpu.lora_utils import LoraState

    monkeypatch.setenv(knobs.ENABLE, "1")
    monkeypatch.setenv(knobs.LORA_SWAP, "lm")
    assert P.apply().status == APPLIED
    state = lora_state([1, 2, 0])
    prompt, tokens, _ = LoraState.make_lora_inputs(
        state, ["r0", "r1", "r2"], np.array([0, 1, 2]), np.array([2, 1, 1])
    )
    assert prompt == (2, 1, 0) and tokens == (2, 2, 1, 0)  # swapped for this step
    assert list(state.lora_ids[:3]) == [1, 2, 0]  # restored after the call
    alone = lora_state([1])
    assert LoraState.make_lora_inputs(alone, ["r0"], np.array([0]), np.array([3]))[0] == (1,)
    swaps = [e for e in events(tmp_path) if e["event"] == "swap"]
    assert swaps == [
        {"event": "swap", "scope": "lm", "req_ids": ["r0", "r1"], "lora_ids": [1, 2, 0]}
    ]


def test_v2_encoder_calls_recorded_and_tower_swapped(monkeypatch, tmp_path) -> None:
    from vllm.v1.worker.gpu import model_runner

    monkeypatch.setenv("OPSCTL_PROBES", "lora")
    monkeypatch.setenv(knobs.ENABLE, "1")
    monkeypatch.setenv(knobs.LORA_SWAP, "tower")
    assert P.apply().status == APPLIED
    state = lora_state([0, 3, 5])
    seen: list[list[int]] = []
    manager = SimpleNamespace(
        supports_tower_connector_lora=lambda: (
            seen.append([int(x) for x in state.lora_ids[:3]]) or False
        )
    )
    model_runner.set_active_mm_loras(  # the runner's call, by keyword as V2 makes it
        model=None,
        lora_manager=manager,
        encoder_cache=SimpleNamespace(mm_features={}),
        req_id_to_index={"a": 0, "b": 1, "c": 2},
        lora_state=state,
        scheduled_encoder_inputs={"b": [0], "c": [0, 1], "gone": [0]},
    )
    assert seen == [[0, 5, 3]]  # V2 read b and c's adapters swapped during the call
    assert list(state.lora_ids[:3]) == [0, 3, 5]
    got = [e for e in events(tmp_path) if e["event"] in ("encoder", "swap")]
    assert got == [
        {"event": "encoder", "req_ids": ["b", "c"], "lora_ids": [3, 5]},
        {"event": "swap", "scope": "tower", "req_ids": ["b", "c"], "lora_ids": [3, 5]},
    ]


def _functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.26.0", "0.33.0", "0.34.0"])
def test_v2_lora_targets_resolve_in_release_sources(version) -> None:
    runner, lora, mm = release_sources(
        version, P.V2_RUNNER, P.V2_LORA, "vllm.v1.worker.gpu.mm.lora"
    )
    assert runner and lora and mm, version
    assert "from vllm.v1.worker.gpu.mm.lora import set_active_mm_loras" in runner
    fn = _functions(ast.parse(mm))["set_active_mm_loras"]
    params = [a.arg for a in fn.args.args]
    for name in ("req_id_to_index", "lora_state", "scheduled_encoder_inputs"):
        assert name in params, (version, params)
    assert "lora_state.lora_ids[req_idx]" in ast.unparse(fn)  # the ids the swap changes
    state = next(
        n for n in ast.parse(lora).body if isinstance(n, ast.ClassDef) and n.name == "LoraState"
    )
    make = _functions(state)["make_lora_inputs"]
    assert [a.arg for a in make.args.args][:4] == [
        "self",
        "req_ids",
        "idx_mapping",
        "num_scheduled_tokens",
    ]
    assert "self.lora_ids[idx_mapping]" in ast.unparse(make)
    assert "self.lora_state.make_lora_inputs(" in runner


def test_without_either_runner_the_ledger_says_what_is_not_observable(monkeypatch) -> None:
    import sys

    import vllm.v1.worker as worker

    for name in ("gpu_input_batch", "gpu_model_runner"):
        monkeypatch.delattr(worker, name, raising=False)
        monkeypatch.setitem(sys.modules, f"vllm.v1.worker.{name}", None)
    monkeypatch.setattr(P, "_v2_modules", lambda: (None, None, "V2 not here"))
    monkeypatch.setenv("OPSCTL_PROBES", "lora")
    out = P.apply()
    assert out.status == APPLIED  # the manager and adapter records still work
    assert "cannot observe encoder calls on this vLLM" in out.detail and "V2 not here" in out.detail
