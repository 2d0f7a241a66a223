"""The console's stacks of a stalled endpoint (issue 35 item 2): taken once when it is
judged stalled, again only after it recovered and stalled anew, or on demand; remote
endpoints never (stacks are local only); the drill-in's lines. The taking itself is a
stand-in here (opsctl stacks on real processes: tests/unit/test_stacks.py; on a real
stalled engine in the console: tests/e2e/test_console_e2e.py)."""

from __future__ import annotations

import threading
from dataclasses import replace

from opsctl.console import judge as c
from opsctl.console.judge_state import EndpointTracker
from opsctl.console.stall_stacks import AT_STALL, ON_DEMAND, StallStacks, target_of
from opsctl.stacks.judge_verdict import diagnose, headline_of
from tests.waiting import wait_until


def view(url: str = "http://127.0.0.1:8000", state: str = c.STALLED, pid: int | None = 42):
    v = EndpointTracker(c.Target("n", url, "argument", pid=pid)).view
    return replace(v, state=state)


class Taker:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, target: str):
        self.calls.append(target)
        self.gate.wait(10)
        return "EngineCore (pid 43): in planted_hang (x.py:1)", ("APIServer (pid 42): ...",), None


def test_taken_once_per_stall_and_again_after_a_recovery():
    take = Taker()
    s = StallStacks(take)
    for _ in range(3):
        s.observe([view()])
    wait_until(lambda: s.get("http://127.0.0.1:8000").done, 10, "taken")
    assert take.calls == ["42"]
    assert s.get("http://127.0.0.1:8000").why == AT_STALL
    s.observe([view(state=c.BUSY)])
    s.observe([view()])
    wait_until(lambda: len(take.calls) == 2, 10, "second stall taken")
    lines = s.lines("http://127.0.0.1:8000")
    wait_until(lambda: s.get("http://127.0.0.1:8000").done, 10, "done")
    lines = s.lines("http://127.0.0.1:8000")
    assert lines[0].startswith("stacks taken at the stall (") and "planted_hang" in lines[0]
    assert lines[1] == "  APIServer (pid 42): ..."


def test_remote_endpoints_are_never_taken_and_the_key_says_why():
    take = Taker()
    s = StallStacks(take)
    remote = view("http://10.0.0.5:8000", pid=None)
    s.observe([remote])
    assert take.calls == [] and s.lines(remote.target.url) == []
    assert target_of(remote) is None
    assert "local only" in s.take_now(remote)


def test_on_demand_while_one_runs_is_refused_then_allowed():
    take = Taker()
    take.gate.clear()
    s = StallStacks(take)
    ready = view(state=c.READY)
    assert s.take_now(ready) is None
    assert s.lines(ready.target.url)[0].startswith("stacks: being taken (on demand")
    assert s.take_now(ready) == "stacks are being taken already"
    take.gate.set()
    wait_until(lambda: s.get(ready.target.url).done, 10, "done")
    assert s.get(ready.target.url).why == ON_DEMAND and take.calls == ["42"]


def test_a_failing_take_is_a_line_not_an_exception():
    def boom(target):
        raise RuntimeError("py-spy vanished")

    s = StallStacks(boom)
    s.observe([view()])
    wait_until(lambda: s.get("http://127.0.0.1:8000").done, 10, "done")
    assert s.lines("http://127.0.0.1:8000")[0].endswith("RuntimeError: py-spy vanished")


def test_the_headline_is_read_from_the_documents_processes():
    """The console's line comes from the document: the same verdict over the dicts as over
    the processes (opsctl.stacks.judge_verdict; its cases: tests/unit/test_stack_verdict.py)."""
    from tests.unit.test_stack_verdict import IDLE_CORE, PLANTED, proc, server

    procs = server(proc(4, "Worker", PLANTED), core=IDLE_CORE)
    line = headline_of([p.to_dict() for p in procs])
    assert line == diagnose(procs).headline
    assert line.startswith("Worker (pid 4) stuck: in planted_hang")
