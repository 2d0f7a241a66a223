"""opsctl.domain.deaths: the rank that died first, from exit records, roles and the log.

The exit records below are the ones engine_patches.exits wrote on this machine (vLLM 0.32,
CPU, tiny-llama under load) when one rank was SIGKILLed: a TP=2 worker, a DP=2
EngineCore, the DP coordinator (pids as recorded)."""

from __future__ import annotations

import pytest

from opsctl.domain import deaths

T0 = 1796554753.733
# TP=2, SIGKILL of Worker_TP1 (18332): its EngineCore saw it at once; the API server saw
# the EngineCore end 9.4 s later (SIGTERM); opsctl saw Worker_TP0 gone and the API server
# exit (code 0) ~10 s after the kill
TP_EXITS = [
    {"pid": 18332, "name": "VllmWorker-1", "exitcode": -9, "time": T0, "parent": 18317},
    {"pid": 18317, "name": "EngineCore", "exitcode": -15, "time": T0 + 9.432, "parent": 18251},
]
TP_ROLES = {18251: "APIServer", 18316: "resource tracker", 18317: "EngineCore",
            18331: "Worker_TP0", 18332: "Worker_TP1"}  # fmt: skip
TP_LOG = """(APIServer pid=18251) INFO 12-06 10:58:50 [api_server.py:1] vLLM API server version 0.32.0
(Worker_TP1 pid=18332) INFO 12-06 10:59:07 [parallel_state.py:1906] world_size=2 rank=1
(Worker_TP1 pid=18332) INFO 12-06 10:59:08 [cpu_worker.py:260] Explicitly set 1.0 GiB for KV cache
(Worker_TP0 pid=18331) INFO 12-06 10:59:08 [cpu_worker.py:260] Explicitly set 1.0 GiB for KV cache
(EngineCore pid=18317) ERROR 12-06 10:59:13 [multiproc_executor.py:315] Worker proc VllmWorker-1 died unexpectedly (exit code: -9), shutting down executor.
"""


def tp_death(**kw) -> deaths.FirstDeath:
    args = dict(gone={18331: T0 + 9.1, 18332: T0 + 0.6, 18317: T0 + 9.6},
                api=(18251, 0, T0 + 10.2), alive=(), log=TP_LOG)  # fmt: skip
    args.update(kw)
    found = deaths.first_death(TP_EXITS, TP_ROLES, **args)
    assert found is not None
    return found


def test_tp_worker_killed_first_is_named_with_sigkill_and_the_others_fates():
    d = tp_death()
    assert (d.role, d.pid, d.exitcode, d.signal) == ("Worker_TP1", 18332, -9, "SIGKILL")
    assert d.cause == f"killed by SIGKILL (exit code -9: {deaths.OOM_OR_KILL})"
    assert d.seen_by == "parent"  # its EngineCore's record, not opsctl's later sighting
    fates = {f.role: (f.fate, f.exitcode, f.after_s) for f in d.others}
    assert fates == {
        "Worker_TP0": ("gone", None, 9.1),
        "EngineCore": ("exited", -15, 9.4),
        "APIServer": ("exited", 0, 10.2),
    }
    assert [f.role for f in d.others] == ["Worker_TP0", "EngineCore", "APIServer"]  # by time
    assert not d.server_up and d.serving is None
    assert d.summary() == (
        f"Worker_TP1 (pid 18332) died first: killed by SIGKILL (exit code -9: "
        f"{deaths.OOM_OR_KILL}); then Worker_TP0 (pid 18331) gone (exit code not seen) +9.1 s, "
        "EngineCore (pid 18317) terminated by SIGTERM (exit code -15) +9.4 s, "
        "APIServer (pid 18251) exited with code 0 +10.2 s"
    )
    assert d.last_lines == (
        "INFO 12-06 10:59:07 [parallel_state.py:1906] world_size=2 rank=1",
        "INFO 12-06 10:59:08 [cpu_worker.py:260] Explicitly set 1.0 GiB for KV cache",
    )
    assert d.lines()[1] == "last lines of Worker_TP1 (pid 18332):"


def test_the_json_form_carries_every_fact():
    doc = tp_death().to_dict()
    assert doc["role"] == "Worker_TP1" and doc["signal"] == "SIGKILL" and doc["at"] == T0
    assert doc["others"][1] == {"pid": 18317, "role": "EngineCore", "fate": "exited",
                                "exitcode": -15, "signal": "SIGTERM", "after_s": 9.4}  # fmt: skip
    assert doc["summary"].startswith("Worker_TP1 (pid 18332) died first")


def test_ends_after_opsctl_began_its_stop_are_no_death():
    assert deaths.first_death(TP_EXITS, TP_ROLES, before=T0 - 1.0) is None
    # a stop begun after the kill: only what ended before it counts
    d = tp_death(before=T0 + 5.0)
    assert d.role == "Worker_TP1"
    # the others still ran when opsctl began to stop the server (read after that stop)
    assert [(f.role, f.fate, f.after_s) for f in d.others] == [
        ("APIServer", "stopped", 5.0), ("EngineCore", "stopped", 5.0),
        ("Worker_TP0", "stopped", 5.0),
    ]  # fmt: skip
    assert d.summary().endswith(
        "ended by opsctl's stop +5.0 s: APIServer (pid 18251), EngineCore (pid 18317), "
        "Worker_TP0 (pid 18331)"
    )


def test_nothing_ended_is_no_verdict_and_helpers_never_count():
    assert deaths.first_death([], TP_ROLES) is None
    # a compiler that came and went during the start, seen gone by opsctl: not a rank
    assert deaths.first_death([], {7: "compiler"}, gone={7: T0}) is None


DP_T = 1796554931.184


def test_dp_coordinator_killed_while_the_server_keeps_answering():
    exits = [{"pid": 20379, "name": "VLLM_DP_Coordinator", "exitcode": -9, "time": DP_T}]
    roles = {20206: "APIServer", 20456: "EngineCore_DP0", 20457: "EngineCore_DP1",
             20565: "Worker_DP1", 20569: "Worker_DP0"}  # fmt: skip
    alive = [20206, 20456, 20457, 20565, 20569]
    d = deaths.first_death(exits, roles, api=(20206, None, None), alive=alive, serving=True)
    assert d is not None and d.role == "DPCoordinator"  # from its multiprocessing name
    assert d.server_up and [f.fate for f in d.others] == ["alive"] * 5
    assert [f.role for f in d.others] == [
        "APIServer",
        "EngineCore_DP0",
        "Worker_DP0",
        "EngineCore_DP1",
        "Worker_DP1",
    ]  # rank order
    assert d.summary().endswith(
        "still alive: APIServer (pid 20206), EngineCore_DP0 (pid 20456), Worker_DP0 (pid 20569),"
        " EngineCore_DP1 (pid 20457), Worker_DP1 (pid 20565) (the API server still answers "
        "/health 200)"
    )
    assert d.lines()[1] == "DPCoordinator logged nothing opsctl could find"


def test_a_killed_api_server_is_named_from_opsctls_wait():
    d = deaths.first_death([], {}, api=(42, -9, T0), alive=())
    assert d is not None and (d.role, d.seen_by, d.signal) == ("APIServer", "opsctl", "SIGKILL")


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (-9, f"killed by SIGKILL (exit code -9: {deaths.OOM_OR_KILL})"),
        (-15, "terminated by SIGTERM (exit code -15)"),
        (-11, "killed by SIGSEGV (exit code -11)"),
        (1, "exited with code 1"),
        (0, "exited with code 0"),
        (None, "gone (exit code not seen)"),
    ],
)
def test_exit_codes_in_words(code, words):
    assert deaths.how_it_ended(code) == words


def test_roles_and_last_lines_from_vllms_log_prefixes():
    assert deaths.roles_from_log(TP_LOG) == {18251: "APIServer", 18332: "Worker_TP1",
                                             18331: "Worker_TP0", 18317: "EngineCore"}  # fmt: skip
    assert deaths.last_lines(TP_LOG, 18317, limit=1) == (
        "ERROR 12-06 10:59:13 [multiproc_executor.py:315] Worker proc VllmWorker-1 died "
        "unexpectedly (exit code: -9), shutting down executor.",
    )


def test_a_worker_without_a_known_title_is_named_by_its_process_name():
    exits = [{"pid": 5, "name": "VllmWorker-1", "exitcode": -9, "time": T0}]
    d = deaths.first_death(exits, {})
    assert d is not None and d.role == "Worker (local rank 1)"


def test_ends_seen_at_one_moment_put_the_kill_first():
    """A parent starved of CPU finds two children ended in one look (same time): its
    own SIGTERM of the survivor came after the kill from outside."""
    exits = [
        {"pid": 5229, "name": "VllmWorker-0", "exitcode": -15, "time": T0},
        {"pid": 5230, "name": "VllmWorker-1", "exitcode": -9, "time": T0},
    ]
    d = deaths.first_death(exits, {5229: "Worker_TP0", 5230: "Worker_TP1"})
    assert d is not None and d.role == "Worker_TP1" and d.others[0].role == "Worker_TP0"


def test_a_worker_and_its_engine_core_seen_gone_in_one_look_name_the_worker_first():
    """Beside a CPU hog (CI's 2 busy cores), SIGKILL of Worker_TP1: its EngineCore failed
    ("Executor failed") before vLLM's monitor thread recorded the worker's exit, and one
    look of opsctl found both gone with no exit code. The worker is named first (its end
    fails the EngineCore at once; an EngineCore's end leaves its workers alive for
    seconds, as Worker_TP0 was), and what is not known is said: exit code not seen."""
    roles = {18072: "APIServer", 18313: "EngineCore", 18345: "Worker_TP0",
             18346: "Worker_TP1"}  # fmt: skip
    seen = T0 + 0.5
    for order in ({18313: seen, 18346: seen}, {18346: seen, 18313: seen}):
        d = deaths.first_death([], roles, gone=order, api=(18072, 0, seen + 1.2),
                               alive=(18345,), log="")  # fmt: skip
        assert d is not None
        assert (d.role, d.pid, d.exitcode, d.seen_by) == ("Worker_TP1", 18346, None, "seen gone")
        assert d.cause == "gone (exit code not seen)"
        fates = {f.role: (f.fate, f.exitcode, f.after_s) for f in d.others}
        assert fates == {
            "EngineCore": ("gone", None, 0.0),
            "APIServer": ("exited", 0, 1.2),
            "Worker_TP0": ("alive", None, None),
        }
