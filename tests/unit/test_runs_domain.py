"""opsctl.domain.runs: durations, meta.json parsing, run states, clean decisions;
opsctl.suite.engram.judge.segment_status. Pure, table-driven."""

from __future__ import annotations

import pytest

from opsctl.domain import runs as dom
from opsctl.suite.engram import judge as dom_engram

OWNER, OWNER_T = 100, 1000.0
API, API_T = 200, 1001.0
CORE, CORE_T = 201, 1003.0


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30s", 30),
        ("10m", 600),
        ("2h", 7200),
        ("1d", 86400),
        ("1.5h", 5400),
        ("90", 90),
        ("0", 0),
        (" 5 min ", 300),
        ("2H", 7200),
    ],
)
def test_parse_duration(text, seconds):
    assert dom.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "x", "-5s", "10w", "1e400", "3 days", "1h30m", "nan", "s"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="not a duration"):
        dom.parse_duration(text)


def meta(**kw) -> dict:
    doc = {
        "url": "http://127.0.0.1:8000",
        "pid": API,
        "model": "tiny-llama",
        "started_at": 1000.5,
        "owner_pid": OWNER,
        "owner_started": OWNER_T,
        "pids": {str(API): API_T, str(CORE): CORE_T},
    }
    doc.update(kw)
    return {k: v for k, v in doc.items() if v is not None}


@pytest.mark.parametrize(
    "doc,needle",
    [
        ([], "not a JSON object"),
        ("x", "not a JSON object"),
        (meta(pid="12"), "pid is not a pid"),
        (meta(pid=-1), "pid is not a pid"),
        (meta(owner_pid=True), "owner_pid is not a pid"),
        (meta(pids=[API]), "pids is not an object"),
        (meta(pids={"abc": 1.0}), "not a pid"),
        (meta(pids={str(API): "soon"}), "not a start time"),
        (meta(started_at="yesterday"), "started_at is not a number"),
        (meta(stopped_at=float("inf")), "stopped_at is not a number"),
        (meta(url=5), "url is not a string"),
    ],
)
def test_parse_meta_rejects_malformed(doc, needle):
    with pytest.raises(dom.MetaError, match=needle):
        dom.parse_meta(doc)


def test_parse_meta_reads_the_contract():
    m = dom.parse_meta(meta(stopped_at=2000.0, healthy_at=1010.0))
    assert m.pids == ((API, API_T), (CORE, CORE_T)) and m.owner_pid == OWNER
    assert m.stopped_at == 2000.0 and m.api_pid == API and not m.legacy
    assert dom.pids_to_look_up(m) == [OWNER, API, CORE]


def starts(owner=OWNER_T, api=API_T, core=CORE_T) -> dict:
    return {OWNER: owner, API: api, CORE: core}


@pytest.mark.parametrize(
    "doc,now,state,alive,owner_alive",
    [
        # owner and engine alive with their recorded start times
        (meta(), starts(), "live", (API, CORE), True),
        # owner gone, engine alive
        (meta(), starts(owner=None), "orphaned", (API, CORE), False),
        # owner's pid reused by another process: still orphaned
        (meta(), starts(owner=OWNER_T + 500), "orphaned", (API, CORE), False),
        # only the EngineCore left (API server died): orphaned all the same
        (meta(), starts(owner=None, api=None), "orphaned", (CORE,), False),
        # engine pids reused by other processes: nothing of ours alive -> dead
        (meta(), starts(owner=None, api=API_T + 60, core=CORE_T - 60), "dead", (), False),
        (meta(), starts(owner=None, api=None, core=None), "dead", (), False),
        # owner alive but the engine died: dead (its opsctl still runs)
        (meta(), starts(api=None, core=None), "dead", (), True),
        # stopped_at wins, whatever runs
        (meta(stopped_at=2000.0), starts(owner=None, api=None, core=None), "stopped", (), False),
        (meta(stopped_at=2000.0), starts(), "stopped", (API, CORE), True),
        # boot-time jitter of one second is the same process
        (meta(), starts(owner=None, api=API_T + 1.0), "orphaned", (API, CORE), False),
        # legacy meta (no owner, no start times): alive API server -> unknown, never reaped
        (
            meta(owner_pid=None, owner_started=None, pids=None),
            {API: 1001.0},
            "unknown",
            (API,),
            None,
        ),
        (meta(owner_pid=None, owner_started=None, pids=None), {API: 5000.0}, "dead", (), None),
        (meta(owner_pid=None, owner_started=None, pids=None), {}, "dead", (), None),
    ],
)
def test_assess_states(doc, now, state, alive, owner_alive):
    a = dom.assess(dom.parse_meta(doc), None, now)
    assert (a.state, a.alive_pids, a.owner_alive) == (state, alive, owner_alive), a.reason


def test_assess_without_meta_is_unknown_with_the_reason():
    a = dom.assess(None, "meta.json is not valid JSON: x", {})
    assert a.state == "unknown" and a.reason == "meta.json is not valid JSON: x"
    assert dom.clean_decision(a, 0.0, 10**9, 0).action == "keep"


def test_reused_pids_are_reported():
    a = dom.assess(dom.parse_meta(meta()), None, starts(owner=None, api=API_T + 60))
    assert a.state == "orphaned" and a.alive_pids == (CORE,) and a.reused_pids == (API,)


NOW = 100_000.0


@pytest.mark.parametrize(
    "doc,now_starts,ended,older,action",
    [
        (meta(), starts(owner=None), None, 0, "reap"),
        (meta(), starts(), None, 0, "keep"),  # live
        (meta(stopped_at=NOW - 10), starts(owner=None, api=None, core=None), NOW - 10, 0, "prune"),
        # younger than --older-than: kept
        (meta(stopped_at=NOW - 10), starts(owner=None, api=None, core=None), NOW - 10, 60, "keep"),
        (
            meta(stopped_at=NOW - 7200),
            starts(owner=None, api=None, core=None),
            NOW - 7200,
            3600,
            "prune",
        ),
        # stopped, but an engine process survived: kept
        (meta(stopped_at=NOW - 7200), starts(owner=None), NOW - 7200, 0, "keep"),
        # dead while its opsctl still runs: kept (it may still stop / read it)
        (meta(), starts(api=None, core=None), NOW - 7200, 0, "keep"),
        (meta(), starts(owner=None, api=None, core=None), NOW - 7200, 0, "prune"),
    ],
)
def test_clean_decision(doc, now_starts, ended, older, action):
    a = dom.assess(dom.parse_meta(doc), None, now_starts)
    assert dom.clean_decision(a, ended, NOW, older).action == action


def test_ended_at_prefers_recorded_stop_then_reap_then_last_write():
    assert dom.ended_at(dom.parse_meta(meta(stopped_at=5.0, reaped_at=7.0)), 9.0) == 5.0
    assert dom.ended_at(dom.parse_meta(meta(reaped_at=7.0)), 9.0) == 7.0
    assert dom.ended_at(dom.parse_meta(meta()), 9.0) == 9.0


@pytest.mark.parametrize(
    "name,vllm",
    [
        ("psm_3f2a1b", True),
        ("sem.mp-abc123", True),
        ("vllm_engram_table0", False),  # engram has its own clean
        ("sem.other", False),
        ("pym-123-abc", False),
        ("mypsm_1", False),
    ],
)
def test_is_vllm_segment(name, vllm):
    assert dom.is_vllm_segment(name) is vllm


@pytest.mark.parametrize(
    "held,symlink,age,min_age,status",
    [
        (False, False, 120.0, 60.0, "orphan"),
        (False, False, 59.0, 60.0, "young"),
        (True, False, 1e6, 60.0, "in-use"),
        (True, False, 1.0, 60.0, "in-use"),
        (False, True, 1e6, 0.0, "symlink"),
        (False, False, 0.0, 0.0, "orphan"),
    ],
)
def test_segment_status(held, symlink, age, min_age, status):
    assert dom_engram.segment_status(held, symlink, age, min_age) == status


def test_clean_option_check_and_shm_refusal_rule():
    from opsctl.errors import BadInput

    for yes, with_shm in [(False, False), (True, False), (False, True)]:
        with pytest.raises(BadInput, match="--force only makes sense with --shm --yes"):
            dom.check_clean_options(yes, with_shm, force=True)
    dom.check_clean_options(True, True, force=True)
    line = dom.shm_refusal((5, 6), force=False)
    assert line is not None and "2 process(es)" in line and "--force" in line
    assert dom.shm_refusal((5, 6), force=True) is None and dom.shm_refusal((), False) is None


def test_clean_failure_and_hint_lines():
    assert dom.clean_failure([], [], None) is None
    assert dom.clean_failure([("r1", "boom"), ("r2", "x")], ["psm_a"], "refused") == "r1: boom"
    assert dom.clean_failure([], ["psm_a"], "refused!") == "refused!"
    assert dom.clean_failure([], ["a", "b"], None) == (
        "2 segment(s) kept (held again or not removable)"
    )
    assert dom.pending_hint(False, 2) == "2 item(s) listed; run again with --yes to act"
    assert dom.pending_hint(True, 2) is None and dom.pending_hint(False, 0) is None
