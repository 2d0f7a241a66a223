"""FleetSource is complete: every source has every member, and a wrapper forwards each.

The console and ``--once`` read a source's members as plain attributes (no getattr with a
default), so every implementation (direct, Prometheus, replay) has every member of the
Protocol, and every wrapper (the advisor, GPUs, --tee, --log) forwards each member to the
source it wraps, also through a stack of wrappers as ``opsctl console`` builds it."""

from __future__ import annotations

import threading

import pytest

from opsctl.console.advice import AdvisedSource
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.gpus import GpuSource
from opsctl.console.judge import FleetSnapshot, Target
from opsctl.console.judge_state import Settings
from opsctl.console.logsource import LoggedSource
from opsctl.console.prometheus import PrometheusSource
from opsctl.console.replay import ReplaySource
from opsctl.console.source import FleetSource, SourceDefaults, WrappedSource
from opsctl.console.tee import TeedSource

MEMBERS = sorted(
    {*FleetSource.__annotations__, *(m for m in vars(FleetSource) if not m.startswith("_"))}
)
SOURCES = (DirectScrapeSource, PrometheusSource, ReplaySource)
WRAPPERS = (AdvisedSource, GpuSource, LoggedSource, TeedSource)


def test_the_protocol_names_what_the_console_reads():
    read = ["name", "live", "timeout", "paused", "attaches_gpus", "settings", "static", "lock",
            "start", "collect", "series", "refresh", "set_paused", "wait_settled", "close",
            "api_key_for", "tracker"]  # fmt: skip
    assert sorted(read) == MEMBERS


@pytest.mark.parametrize("cls", SOURCES + WRAPPERS, ids=lambda c: c.__name__)
def test_every_source_has_every_member(cls):
    assert [m for m in MEMBERS if not hasattr(cls, m)] == []
    assert "__getattr__" not in vars(cls)  # no member found by accident


class Recording(SourceDefaults):
    """A source whose every member says it is this one's; calls are recorded."""

    name = "inner"
    live = False
    timeout = 1.25
    paused = True
    attaches_gpus = False
    settings = Settings(interval_s=0.5)
    lock = threading.Lock()

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.static = [Target("a", "http://10.0.0.1:8000", "argument")]
        self.tracked = object()

    def start(self) -> None:
        self.calls.append(("start",))

    def collect(self) -> FleetSnapshot:
        return FleetSnapshot(1.0, (), 0.5, "inner")

    def series(self, url: str, name: str) -> list[float]:
        return [1.0, 2.0] if (url, name) == ("u", "gen") else []

    def refresh(self) -> None:
        self.calls.append(("refresh",))

    def set_paused(self, paused: bool) -> None:
        self.calls.append(("set_paused", paused))

    def wait_settled(self, timeout: float) -> bool:
        self.calls.append(("wait_settled", timeout))
        return True

    def close(self) -> None:
        self.calls.append(("close",))

    def api_key_for(self, target: Target) -> str | None:
        return f"key-of-{target.name}"

    def tracker(self, url: str):
        return self.tracked if url == "u" else None


def test_a_stack_of_wrappers_forwards_every_member():
    inner = Recording()
    outer = AdvisedSource(LoggedSource(WrappedSource(inner)))
    assert (outer.name, outer.live, outer.timeout, outer.paused) == ("inner", False, 1.25, True)
    assert outer.settings is inner.settings and outer.static is inner.static
    assert outer.lock is inner.lock and outer.attaches_gpus is False
    assert outer.api_key_for(inner.static[0]) == "key-of-a"
    assert outer.tracker("u") is inner.tracked and outer.tracker("v") is None
    assert outer.series("u", "gen") == [1.0, 2.0] and outer.collect().source == "inner"
    outer.start()
    outer.refresh()
    outer.set_paused(False)
    assert outer.wait_settled(3.0)
    outer.close()
    assert inner.calls == [("start",), ("refresh",), ("set_paused", False),
                           ("wait_settled", 3.0), ("close",)]  # fmt: skip
    with pytest.raises(AttributeError, match="wrapped source's"):
        outer.paused = False  # set_paused pauses; a wrapper holds no state of its own


def test_gpu_source_says_it_attaches_gpus_through_the_wrappers_above_it():
    gpu = GpuSource(Recording(), 0.5, read=lambda pids: None)
    try:
        assert AdvisedSource(gpu).attaches_gpus and not Recording().attaches_gpus
    finally:
        gpu.feed.close()


def test_the_defaults_are_those_of_a_live_source_without_extras():
    d = SourceDefaults()
    assert (d.live, d.timeout, d.paused, d.attaches_gpus) == (True, 10.0, False, False)
    assert d.settings is None and d.static is None
    assert d.api_key_for(Target("a", "http://h:1", "argument")) is None and d.tracker("u") is None
    with d.lock:  # a source without a loop thread: nothing to hold
        pass
