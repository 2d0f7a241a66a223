"""The three vLLM 0.33 changes around opsctl's patches, each tested against 0.33's own
code (and 0.34's, where they are unchanged): the functions are read from the release's
wheel (downloaded once into $OPSCTL_HOME/wheels, never installed) and run on stand-in
objects.

- batch_gate: a paused engine (``pause_generation``) rejects new ADDs with a retryable
  error; the gate's held requests were accepted before the pause, so they join the
  scheduler before it and a handed-back one is not rejected;
- lora probe: a text-only adapter on a multimodal model is applied to its language
  model (``_get_text_lora_names``), so ``describe_adapter`` counts it there;
- dummy_fill: ``initialize_single_dummy_weight(name=)`` has an E8M0 scale branch the
  single-visit fallback keeps by passing the name.
"""

from __future__ import annotations

import ast
import queue
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Any, Literal, get_args

import pytest
import torch
from torch import nn

from engine_patches.patches import batch_gate as G
from engine_patches.patches import dummy_fill, lora_swap_probe
from opsctl.collectors.vllm_sources import WheelSources, fetch_wheel
from opsctl.domain import preflight as D

pytestmark = pytest.mark.wheels


@pytest.fixture(scope="module", params=["0.33.0", "0.34.0"])
def v033(request) -> WheelSources:
    """0.33.0's code, and 0.34.0's (the three changes carry over to it unchanged)."""
    reader = WheelSources(fetch_wheel(request.param))
    assert reader.version == request.param
    yield reader
    reader.close()


def load(reader: WheelSources, symbol: str, namespace: dict[str, Any]) -> Callable:
    """Compile one function of the release, as its source says, into ``namespace``."""
    module, qualname = D.split(symbol)
    text = D.extract(reader.read(module), qualname)
    assert text is not None, f"{symbol} not in vLLM {reader.version}"
    where = f"{symbol}@{reader.version}"
    code = compile("from __future__ import annotations\n" + text, where, "exec")
    exec(code, namespace)
    return namespace[qualname.rsplit(".", 1)[-1]]


# ---- batch_gate: pause rejects new ADDs --------------------------------------------------------


@dataclass
class RequestError:  # vllm.outputs.RequestError (0.33): what the client receives
    code: str
    message: str
    retryable: bool = False


CORE = "vllm.v1.engine.core"


def proc_class(reader: WheelSources) -> type:
    """A stand-in EngineCoreProc whose ADD dispatch, pause and pause-rejection are
    0.33's code."""
    from vllm.v1.engine import EngineCoreRequestType, FinishReason
    from vllm.v1.request import RequestStatus

    ns: dict[str, Any] = {
        "EngineCoreRequestType": EngineCoreRequestType,
        "FinishReason": FinishReason,
        "RequestStatus": RequestStatus,
        "RequestError": RequestError,
        "PauseMode": Literal["abort", "wait", "keep"],
        "PauseState": SimpleNamespace(PAUSED_ALL="all", PAUSED_NEW="new", UNPAUSED="none"),
        "get_args": get_args,
        "Future": object,
        "partial": partial,
    }

    class Core:
        def add_request(self, request, request_wave: int = 0):
            self.scheduler.requests[request.request_id] = request

        def abort_requests(self, request_ids):
            for rid in request_ids:
                self.scheduler.requests.pop(rid, None)

    class Proc(Core):
        _handle_client_request = load(reader, f"{CORE}:EngineCoreProc._handle_client_request", ns)
        _reject_add_while_paused = load(
            reader, f"{CORE}:EngineCoreProc._reject_add_while_paused", ns
        )
        pause_scheduler = load(reader, f"{CORE}:EngineCoreProc.pause_scheduler", ns)
        pause_generation = load(reader, f"{CORE}:EngineCoreProc.pause_generation", ns)

        def __init__(self) -> None:
            self.input_queue: queue.Queue = queue.Queue()
            self.reject_new_requests = False
            self.errors: list[tuple[str, str]] = []
            self.aborted: list[str] = []
            reqs: dict[str, Any] = {}
            self.scheduler = SimpleNamespace(
                requests=reqs,
                has_request=lambda rid: rid in reqs,
                set_pause_state=lambda state: None,
                finish_requests=self._finish_all,
            )

        def _finish_all(self, ids, status):
            gone = list(self.scheduler.requests.values())
            self.scheduler.requests.clear()
            return gone

        def _send_abort_outputs(self, requests):
            self.aborted += [r.request_id for r in requests]

        def _send_finish_outputs_to_client(self, ids, client_index, reason, error=None):
            self.errors += [(rid, error.code if error else str(reason)) for rid in ids]

        def _reject_add_in_shutdown(self, request):
            return False

        def _pause_complete(self):
            return True

        def _finish_pause(self, *args):
            pass

        def _handle_shutdown(self):
            return False

    return Proc


def request(rid: str) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=rid, abort_immediately=False, kv_transfer_params=None, client_index=0
    )


@pytest.fixture
def gated(v033, monkeypatch, tmp_path):
    monkeypatch.setenv("OPSCTL_RUN_DIR", str(tmp_path))
    proc_cls = proc_class(v033)
    G.ORIGINALS.clear()
    wrapped = G.install(proc_cls, proc_cls)
    yield proc_cls, wrapped
    G.ORIGINALS.clear()  # never G.undo(): these originals belong to the stand-in


def add(proc, rid: str) -> None:
    from vllm.v1.engine import EngineCoreRequestType

    proc._handle_client_request(EngineCoreRequestType.ADD, (request(rid), 0))


def test_033_rejects_new_adds_while_paused_even_a_handed_back_held_one(v033):
    """The problem, on 0.33's code with the gate as it was (add/abort wrapped only)."""
    proc_cls = proc_class(v033)
    G.ORIGINALS.clear()
    try:
        G.ORIGINALS.wrap(proc_cls, "add_request", G._wrap_add, G.MARK)
        proc = proc_cls()
        group = G.marker(2, "abcd")
        add(proc, f"a-{group}")
        assert proc.scheduler.requests == {}  # held
        proc.pause_generation("wait")
        proc._opsctl_gate._expire(group)  # the hold timer hands it back via the queue
        _, (req, _wave) = proc.input_queue.get_nowait()
        add(proc, req.request_id)
        assert proc.errors == [(f"a-{group}", "engine_paused")]  # accepted, then refused
    finally:
        G.ORIGINALS.clear()


def test_gate_hands_held_requests_to_the_scheduler_before_a_pause(gated):
    proc_cls, wrapped = gated
    assert {"pause_scheduler", "_reject_add_while_paused"} <= set(wrapped)
    proc = proc_cls()
    group = G.marker(3, "beef")
    add(proc, f"a-{group}")
    add(proc, f"b-{group}")
    assert proc.scheduler.requests == {}
    proc.pause_generation("wait")  # drain: accepted work runs to the end
    assert set(proc.scheduler.requests) == {f"a-{group}", f"b-{group}"}
    assert proc.errors == []
    add(proc, "fresh")  # new work during a user pause is still refused, as 0.33 does
    assert proc.errors == [("fresh", "engine_paused")]


def test_abort_pause_aborts_held_requests_and_answers_their_clients(gated):
    proc_cls, _ = gated
    proc = proc_cls()
    group = G.marker(2, "cafe")
    add(proc, f"a-{group}")
    proc.pause_generation("abort")
    assert proc.aborted == [f"a-{group}"] and proc.scheduler.requests == {}


def test_handed_back_held_request_passes_a_pause(gated):
    proc_cls, _ = gated
    proc = proc_cls()
    group = G.marker(2, "d00d")
    add(proc, f"a-{group}")
    proc._opsctl_gate._expire(group)  # handed back before the pause, still in the queue
    proc.pause_generation("wait")
    _, (req, _wave) = proc.input_queue.get_nowait()
    add(proc, req.request_id)
    assert proc.errors == [] and set(proc.scheduler.requests) == {f"a-{group}"}


# ---- lora probe: text-only adapters on a VLM's language model ----------------------------------

LM = "language_model.model.layers.0"
TEXT_ONLY = [
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.k_proj",
    "model.layers.0.self_attn.v_proj",
    "model.layers.0.mlp.down_proj",
]


def manager(methods: dict[str, Callable]) -> Any:
    cls = type("Manager", (), methods)
    m = cls()
    m.supports_mm = True
    m.mm_mapping = SimpleNamespace(
        language_model=["language_model"], tower_model=["vision_tower"], connector=["mm_projector"]
    )
    m.modules = {f"{LM}.self_attn.qkv_proj": 0, f"{LM}.mlp.down_proj": 0, "vision_tower.fc1": 0}
    m.packed_modules = {
        f"{LM}.self_attn.qkv_proj": [f"{LM}.self_attn.{p}_proj" for p in ("q", "k", "v")]
    }
    return m


def describe(m) -> dict:
    adapter = SimpleNamespace(loras=dict.fromkeys(TEXT_ONLY))
    lora = SimpleNamespace(lora_name="text", lora_int_id=1, lora_path="/a")
    return lora_swap_probe.describe_adapter(lora, adapter, m)


def test_033_applies_text_only_adapters_to_the_language_model_and_the_probe_counts_them(v033):
    names = load(v033, "vllm.lora.model_manager:LoRAModelManager._get_text_lora_names", {})
    event = describe(manager({"_get_text_lora_names": names}))
    assert event["parts"] == {"language": {"modules": 4, "applied": 4}}
    assert event["text_only"] == 4


def test_032_manager_leaves_text_only_names_unused_and_the_probe_says_other():
    event = describe(manager({}))  # 0.32 has no _get_text_lora_names: weights unused
    assert event["parts"] == {"other": {"modules": 4, "applied": 0}}
    assert event["text_only"] == 0


# ---- dummy_fill: initialize_single_dummy_weight(name=) -----------------------------------------


def constants(reader: WheelSources, module: str, names: tuple[str, ...]) -> dict[str, Any]:
    tree = ast.parse(reader.read(module) or "")
    out = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id in names:
            out[target.id] = ast.literal_eval(node.value)
    return out


WEIGHT_UTILS = "vllm.model_executor.model_loader.weight_utils"


class Quantised(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(4, 4), requires_grad=False)
        self.register_buffer("weight_scale", torch.zeros(4, dtype=torch.uint8))


def init_033(v033) -> Callable:
    ns = constants(v033, WEIGHT_UTILS, ("_DUMMY_E8M0_SCALE_BYTE", "_DUMMY_FP8_RANGE"))
    ns |= {
        "torch": torch,
        "current_platform": SimpleNamespace(is_tpu=lambda: False, is_rocm=lambda: False),
    }
    return load(v033, f"{WEIGHT_UTILS}:initialize_single_dummy_weight", ns)


def test_single_visit_fallback_keeps_033s_e8m0_scale_branch(v033):
    init = init_033(v033)
    scale_byte = constants(v033, WEIGHT_UTILS, ("_DUMMY_E8M0_SCALE_BYTE",))[
        "_DUMMY_E8M0_SCALE_BYTE"
    ]
    assert dummy_fill.accepts_name(init)
    assert dummy_fill.accepts_name(dummy_fill.constant_fill_init(init))  # through the wrapper
    model = nn.Sequential(Quantised(), Quantised())
    assert dummy_fill.init_local_tensors(model, init) == 4
    for layer in model:
        assert bool((layer.weight_scale == scale_byte).all())  # E8M0 scales: fixed exponent
        assert 0 < float(layer.weight.abs().max()) <= 1e-3


def test_without_the_name_033_fills_scales_with_random_bytes(v033):
    """What the fallback lost before it passed name=: the scale branch never runs."""
    init = init_033(v033)
    layer = Quantised()
    init(layer.weight_scale)
    scale_byte = constants(v033, WEIGHT_UTILS, ("_DUMMY_E8M0_SCALE_BYTE",))[
        "_DUMMY_E8M0_SCALE_BYTE"
    ]
    assert not bool((layer.weight_scale == scale_byte).all())
