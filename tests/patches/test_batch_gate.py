"""The gate probe (engine_patches/patches/batch_gate.py) without an engine: inert unless
asked; on vLLM 0.32's real ``EngineCore.add_request`` (run on a stand-in core) a marked
group reaches the scheduler only once complete, all at once and in arrival order;
unmarked requests pass at once; a group that never fills is handed back through the
core's input queue after the hold time; an aborted held request is dropped."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest

from engine_patches.patches import batch_gate as G
from engine_patches.registry import APPLIED, SKIPPED
from opsctl.collectors.ledger import read_events
from tests.standins.patch_env import clean_patch_env


@pytest.fixture(autouse=True)
def _clean(monkeypatch, tmp_path):
    clean_patch_env(monkeypatch, tmp_path)
    yield
    G.undo()


def request(rid: str) -> SimpleNamespace:
    return SimpleNamespace(
        request_id=rid,
        pooling_params=None,
        kv_transfer_params=None,
        ec_transfer_params=None,
        abort_immediately=False,
    )


def core() -> SimpleNamespace:
    added: list[str] = []
    scheduler = SimpleNamespace(add_request=lambda r: added.append(r.request_id))
    return SimpleNamespace(scheduler=scheduler, input_queue=queue.Queue(), added=added)


def test_marker_round_trip_and_bounds() -> None:
    m = G.marker(6)
    assert G.parse(f"chatcmpl-tag-1-{m}-mix-r0-alpha-abcd-0") == (m, 6)
    assert G.parse("cmpl-opsctl-lora-1-mix-r0") is None
    with pytest.raises(ValueError):
        G.marker(0)


def test_inert_unless_asked(monkeypatch) -> None:
    from vllm.v1.engine.core import EngineCore

    before = EngineCore.add_request
    assert G.apply().status == SKIPPED
    assert EngineCore.add_request is before
    monkeypatch.setenv("OPSCTL_PROBES", "batch,gate")
    assert G.apply().status == APPLIED
    assert EngineCore.add_request is not before
    G.apply()  # idempotent: wrapped once
    assert EngineCore.add_request.__wrapped__ is before
    G.undo()
    assert EngineCore.add_request is before


def test_pause_is_wrapped_on_032_and_undone(monkeypatch) -> None:
    """0.32 has pause_scheduler (wrapped: held requests join the scheduler first) and no
    _reject_add_while_paused (0.33+; nothing to wrap); undo restores both owners."""
    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    pause, shutdown = EngineCoreProc.pause_scheduler, EngineCoreProc._handle_shutdown
    inproc_pause = EngineCore.pause_scheduler  # in-process core: no gate, never wrapped
    assert not hasattr(EngineCoreProc, "_reject_add_while_paused")
    monkeypatch.setenv("OPSCTL_PROBES", "gate")
    outcome = G.apply()
    assert outcome.status == APPLIED and "before a pause" in outcome.detail
    assert EngineCoreProc.pause_scheduler.__wrapped__ is pause
    assert EngineCore.pause_scheduler is inproc_pause
    assert not hasattr(EngineCoreProc, "_reject_add_while_paused")
    G.undo()
    assert EngineCoreProc.pause_scheduler is pause
    assert EngineCoreProc._handle_shutdown is shutdown
    assert EngineCore.pause_scheduler is inproc_pause


def test_real_add_request_holds_a_group_until_complete(monkeypatch, tmp_path) -> None:
    from vllm.v1.engine.core import EngineCore

    monkeypatch.setenv("OPSCTL_PROBES", "gate")
    G.apply()
    c, m = core(), G.marker(3)
    EngineCore.add_request(c, request(f"a-{m}-r0"))
    EngineCore.add_request(c, request("plain-1"))  # not marked: straight through
    EngineCore.add_request(c, request(f"a-{m}-r1"))
    assert c.added == ["plain-1"]
    EngineCore.add_request(c, request(f"a-{m}-r2"))
    assert c.added == ["plain-1", f"a-{m}-r0", f"a-{m}-r1", f"a-{m}-r2"]
    [rec] = read_events(tmp_path, "gate")
    assert rec["why"] == "complete" and rec["count"] == 3 and rec["group"] == m
    assert rec["req_ids"] == [f"a-{m}-r{i}" for i in range(3)]


def test_in_process_core_is_never_gated(monkeypatch) -> None:
    from vllm.v1.engine.core import EngineCore

    monkeypatch.setenv("OPSCTL_PROBES", "gate")
    G.apply()
    c = core()
    del c.input_queue  # an in-process EngineCore: no queue a timer could hand back through
    m = G.marker(2)
    EngineCore.add_request(c, request(f"b-{m}-r0"))
    assert c.added == [f"b-{m}-r0"]


def test_unfilled_group_is_handed_back_after_the_hold(tmp_path) -> None:
    q: queue.Queue = queue.Queue()
    gate = G.Gate(lambda r, w: q.put((r, w)), hold_s=0.2)
    m = G.marker(4)
    first, second = request(f"x-{m}-0"), request(f"x-{m}-1")
    assert gate.add(first, 0) == [] and gate.add(second, 0) == []
    back = [q.get(timeout=30), q.get(timeout=30)]
    assert [r.request_id for r, _ in back] == [first.request_id, second.request_id]
    # handed back through the input queue, they now pass the gate
    assert gate.add(first, 0) == [(first, 0)]
    assert gate.add(second, 0) == [(second, 0)]
    [rec] = read_events(tmp_path, "gate")
    assert rec["why"] == "timeout" and rec["count"] == 2 and rec["size"] == 4


def test_aborted_held_request_is_dropped() -> None:
    q: queue.Queue = queue.Queue()
    gate = G.Gate(lambda r, w: q.put((r, w)), hold_s=0.2)
    m = G.marker(2)
    gate.add(request(f"y-{m}-0"), 0)
    gate.abort([f"y-{m}-0"])
    assert gate.groups == {}
    with pytest.raises(queue.Empty):
        q.get(timeout=1.0)  # the timer found nothing to hand back


def test_abort_while_handed_back_drops_it_and_late_members_pass() -> None:
    q: queue.Queue = queue.Queue()
    gate = G.Gate(lambda r, w: q.put((r, w)), hold_s=0.2)
    m = G.marker(3)
    first = request(f"z-{m}-0")
    gate.add(first, 0)
    q.get(timeout=30)  # the timer handed it back; the ADD is still on the queue
    gate.abort([first.request_id])  # the client gave up before the core re-added it
    assert gate.add(first, 0) == []  # so it never reaches the scheduler
    late = request(f"z-{m}-1")
    assert gate.add(late, 0) == [(late, 0)]  # its group timed out: no second hold


def test_shutdown_hands_held_requests_to_the_scheduler(monkeypatch, tmp_path) -> None:
    from vllm.v1.engine.core import EngineCore

    monkeypatch.setenv("OPSCTL_PROBES", "gate")
    G.apply()
    c, m = core(), G.marker(3)
    EngineCore.add_request(c, request(f"s-{m}-0"))
    assert c.added == []
    seen = []
    shutdown = G._wrap_shutdown(lambda self: seen.append(list(self.added)) or False)
    c.is_running = lambda: True
    assert shutdown(c) is False and seen == [[]]  # running: nothing flushed
    c.is_running = lambda: False
    shutdown(c)
    assert seen[-1] == [f"s-{m}-0"]  # added before vLLM's shutdown handling ran
    [rec] = read_events(tmp_path, "gate")
    assert rec["why"] == "shutdown" and rec["count"] == 1


def test_abort_on_a_core_without_a_gate_is_untouched(monkeypatch, tmp_path) -> None:
    from vllm.v1.engine.core import EngineCore

    monkeypatch.setenv("OPSCTL_PROBES", "gate")
    G.apply()
    finished = []
    c = SimpleNamespace(
        scheduler=SimpleNamespace(finish_requests=lambda ids, st: finished.append(ids))
    )
    EngineCore.abort_requests(c, ["r1"])
    assert finished == [["r1"]] and read_events(tmp_path, "gate") == []
