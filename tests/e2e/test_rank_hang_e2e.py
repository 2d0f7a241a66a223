"""The one TP=2 engine of the tier (tiny-llama, real seeded weights, Worker_TP0 and
Worker_TP1 under one EngineCore): first read as it is, then its ranks hung.

Read first (issue 44 items 2 and 6; they were the pooled `tp2` engine's two modules): the
process tree, the patch ledger per rank, `runs bundle`, `console --once --json` and
discovery name every rank; `diag invariance URL` and `certify URL` judge the server truly
(it keeps vLLM's prefix caching: invariance fails for that one setting, certify skips it;
certify fails the patch ledger for the armed hang knob alone, on every rank).

Then the rank that hangs (issue 44 item 4), under a closed-loop load:

- one worker SIGSTOPped: Worker_TP0 goes on into its next all-reduce and waits there;
- the test knob OPSCTL_HANG_RANK=TP1:FILE: Worker_TP1 blocks in planted_hang inside the
  model's forward (the vocabulary embedding) before the first all-reduce, while Worker_TP0
  enters that all-reduce (vLLM's CPU shared-memory all-reduce) and waits there.

For both, `console --once` says stalled, `opsctl stacks` exits 1 with verdict stuck, naming
Worker_TP1 as the culprit and Worker_TP0 waiting in the collective, and `opsctl runs bundle`
holds those stacks (collected/stacks.json). Released, every request answers 200. Then issue
45 item 4: the EngineCore stopped, `opsctl stacks` on a machine without py-spy never passes
and says why (a stopped process cannot run its stack handler; how to install py-spy). The
latencies measured are printed (pytest -s).

Last, the rank that died first (issue 44 item 5; was test_rank_death_e2e.py's own `serve
--tp 2`): Worker_TP1 SIGKILLed under load; vLLM tears the server down (0.9-10 s); what
serve's supervision says (the same EngineServer calls: ``track`` each second while it
serves, ``first_death`` and ``died_error`` for its stopped event and error line), then
`status`, the console's dead reason and `runs bundle` name Worker_TP1 first, SIGKILL, and
what the other ranks did. Serve's event stream around them: tests/unit/
test_first_death_supervision.py.

Engine starts: 1 (its own: the knob alters the engine, and the tests stop its processes;
the read-only tests run before them)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from opsctl.collectors.ledger import read_records
from opsctl.collectors.processes import members
from tests.cli.test_json_schemas import validate
from tests.conftest import OPSCTL, running_engine
from tests.e2e import rank_views
from tests.engine_cores import ClosedLoad
from tests.waiting import wait_until

pytestmark = pytest.mark.engine

RANKS = ["APIServer", "EngineCore", "Worker_TP0", "Worker_TP1"]
BODY = {"model": "tiny-llama", "prompt": "hello there", "max_tokens": 48, "ignore_eos": True}
EMBEDDING = "vllm/model_executor/layers/vocab_parallel_embedding.py"
SHM_ALL_REDUCE = "all_reduce (vllm/distributed/device_communicators/cpu_communicator.py:"


def opsctl(*args: str, env: dict | None = None, python: list[str] = OPSCTL) -> tuple[int, dict]:
    r = subprocess.run(
        [*python, *args, "--json"], capture_output=True, text=True, timeout=300, env=env
    )
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    from engine_patches import knobs

    trigger = tmp_path_factory.mktemp("rank-hang") / "hold"
    kw = dict(tp=2, single_process=False, max_model_len=512, max_num_seqs=16)
    # real weights: the invariance and certify reads compare outputs
    with running_engine("tiny-llama", knobs={knobs.HANG_RANK: f"TP1:{trigger}"}, **kw) as server:
        roles = {role: pid for pid, role, _state in members(server.pid)}
        # the first requests compile kernels (torch inductor, a g++ per shape): done before
        warm = ClosedLoad([server.url], 4, BODY).start()
        wait_until(lambda: warm.done[server.url] >= 8, 300, "warm-up requests")
        warm.stop(300)
        assert warm.failed == []
        yield server, trigger, roles
        trigger.unlink(missing_ok=True)
        for pid in roles.values():  # never leave a process stopped behind
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGCONT)


def stalled(url: str, since: float) -> tuple[dict, float]:
    """`console --once` on ``url``: stalled, exit 1; its endpoint and seconds since ``since``."""
    code, gate = opsctl("console", "--once", "--no-discover", url)
    took = time.monotonic() - since
    (e,) = gate["endpoints"]
    assert code == 1 and e["state"] == "stalled", e
    return e, took


def stuck(url: str) -> tuple[dict, float]:
    """`opsctl stacks` on ``url``: exit 1; its document and the seconds it took."""
    t0 = time.monotonic()
    code, st = opsctl("stacks", url)
    assert code == 1, st
    return st, time.monotonic() - t0


def bundled_stacks(server, tmp_path: Path) -> dict:
    out = tmp_path / "bundle.tar.gz"
    code, doc = opsctl("runs", "bundle", str(server.run_dir), "--out", str(out))
    assert code == 0, doc
    with tarfile.open(out) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("collected/stacks.json")]
        return json.loads(tar.extractfile(member).read())


def assert_culprit_and_waiter(doc: dict, roles: dict, status: str) -> None:
    assert doc["verdict"] == "stuck", doc["headline"]
    assert [(c["role"], c["pid"], c["status"]) for c in doc["culprits"]] == [
        ("Worker_TP1", roles["Worker_TP1"], status)
    ], doc["headline"]
    assert [(w["role"], w["status"]) for w in doc["waiting"]] == [("Worker_TP0", "collective")]
    assert "(collective)" in doc["waiting"][0]["line"], doc["waiting"]
    first = "[stopped]" if status == "stopped" else "stuck"
    assert doc["headline"].startswith(f"Worker_TP1 (pid {roles['Worker_TP1']}) {first}")
    assert f"; Worker_TP0 (pid {roles['Worker_TP0']}) waits in " in doc["headline"]


def answers_again(load: ClosedLoad, url: str, held: int, what: str) -> None:
    """The load at ``url`` moves past ``held`` answers, then stops with no request failed."""
    wait_until(lambda: load.done[url] > held, 300, what)
    load.stop(300)
    assert load.failed == []


def test_the_knob_is_armed_in_both_workers_only(tp2):
    server, _trigger, roles = tp2
    assert {"EngineCore", "Worker_TP0", "Worker_TP1"} <= set(roles), roles
    by_role = {}
    for rec in read_records(server.run_dir):
        (p,) = [p for p in rec["patches"] if p["name"] == "rank_hang_knob"]
        by_role[rec["role"]] = p["status"]
    assert by_role["worker"] == "applied" and by_role["engine_core"] == "skipped", by_role


# ---- read as it is: every view names each rank, the checks judge it (items 2 and 6) ----------


def test_tree_and_ledger_name_every_tp_rank(tp2):
    server, _trigger, _roles = tp2
    rank_views.check_tree(server.pid, RANKS)
    rank_views.check_ledger(Path(server.run_dir), RANKS)


def test_bundle_and_console_name_every_tp_rank(tp2, tmp_path):
    server, _trigger, _roles = tp2
    rank_views.check_bundle(Path(server.run_dir), RANKS, tmp_path)
    rank_views.check_console(server.url, server.pid, RANKS)


def test_invariance_on_a_tp2_url(tp2):
    server, _trigger, _roles = tp2
    rc, doc, _err = rank_views.invoke("diag", "invariance", server.url)
    (run,) = doc["runs"]
    rank_views.judged_as_is(rc, run)
    assert not any("data-parallel" in w for w in run["warnings"])  # one engine: no pin


def test_certify_url_on_tp2_reports_every_check(tp2):
    server, _trigger, _roles = tp2
    rc, doc, err = rank_views.invoke("certify", server.url)
    roles = rank_views.certified_as_is(rc, doc, err, "OPSCTL_HANG_RANK")
    # the patch ledger of every rank process: the API server, the EngineCore, both workers
    assert sorted(roles.values()) == ["api_server", "engine_core", "worker", "worker"], roles
    records = read_records(server.run_dir)
    assert {r["pid"] for r in records if r["role"] == "worker"} == {
        pid for pid, role in roles.items() if role == "worker"
    }


# ---- the rank that hangs (item 4) ------------------------------------------------------------


def test_a_worker_stopped_under_load_is_named_and_its_peer_waits_in_the_collective(tp2, tmp_path):
    server, _trigger, roles = tp2
    load = ClosedLoad([server.url], 8, BODY).start()
    wait_until(lambda: load.done[server.url] >= 4, 300, "the load flowing")
    os.kill(roles["Worker_TP1"], signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        e, console_s = stalled(server.url, t0)
        held = load.done[server.url]  # from now on nothing answers while TP1 is stopped
        st, stacks_s = stuck(server.url)
        validate(st)
        assert_culprit_and_waiter(st, roles, "stopped")
        (tp1,) = [p for p in st["processes"] if p["role"] == "Worker_TP1"]
        assert tp1["state"] == "stopped" and tp1["source"] == "py-spy", tp1  # no handler runs
        kept = bundled_stacks(server, tmp_path)
        assert_culprit_and_waiter(kept, roles, "stopped")
        assert load.done[server.url] == held and load.failed == []  # held, not failed
    finally:
        os.kill(roles["Worker_TP1"], signal.SIGCONT)
    answers_again(load, server.url, held, "answers again once continued")
    print(
        f"\nMEASURED sigstop Worker_TP1: console --once stalled after {console_s:.1f} s "
        f"(reason: {e['reason']}); opsctl stacks verdict in {stacks_s:.1f} s: {st['headline']}"
    )


def test_the_rank_held_before_the_all_reduce_is_named_with_the_frame_its_peer_waits_in(
    tp2, tmp_path
):
    server, trigger, roles = tp2
    trigger.touch()
    load = ClosedLoad([server.url], 8, BODY).start()
    t0 = time.monotonic()
    try:
        e, console_s = stalled(server.url, t0)
        st, stacks_s = stuck(server.url)
        validate(st)
        assert_culprit_and_waiter(st, roles, "stuck")
        (culprit,) = st["culprits"]
        assert culprit["line"].startswith("in planted_hang (") and "hang_knob.py" in culprit["line"]
        (waiter,) = st["waiting"]
        assert waiter["line"].startswith(f"waits in {SHM_ALL_REDUCE}"), waiter
        assert f"(collective) under forward ({EMBEDDING}:" in waiter["line"], waiter
        assert all(p["source"] == "signal" for p in st["processes"] if "Worker" in p["role"])
        kept = bundled_stacks(server, tmp_path)
        assert_culprit_and_waiter(kept, roles, "stuck")
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        held = load.done[server.url]
        assert held == 0 and load.failed == []  # the first step of the load never ended
    finally:
        trigger.unlink(missing_ok=True)
    answers_again(load, server.url, held, "answers again once released")
    print(
        f"\nMEASURED knob TP1 before the all-reduce: console --once stalled after "
        f"{console_s:.1f} s (reason: {e['reason']}); opsctl stacks verdict in {stacks_s:.1f} s: "
        f"{st['headline']}"
    )


def without_pyspy() -> tuple[list[str], dict]:
    """A command line and environment of opsctl on an interpreter with no py-spy beside
    it or on PATH (this venv's has one): the base Python with the venv's packages."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    path = os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "py-spy").exists()
    )
    assert not (base.parent / "py-spy").exists() and shutil.which("py-spy", path=path) is None
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PATH": path, "PYTHONPATH": f"{root}:{sysconfig.get_paths()['purelib']}"}
    return [str(base), "-m", "opsctl"], env


def test_a_stopped_engine_core_without_py_spy_never_passes_and_says_why(tp2):
    server, _trigger, roles = tp2
    python, env = without_pyspy()
    code, st = opsctl("stacks", server.url, env=env, python=python)
    assert code == 0 and st["verdict"] == "pass", st["headline"]  # armed: read by signal
    core = roles["EngineCore"]
    os.kill(core, signal.SIGSTOP)
    try:
        wait_until(lambda: psutil.Process(core).status() == "stopped", 30, "stopped")
        code, st = opsctl("stacks", server.url, env=env, python=python)
    finally:
        os.kill(core, signal.SIGCONT)
    validate(st)
    assert code == 1 and st["verdict"] == "stuck", st
    (c,) = st["culprits"]
    assert (c["role"], c["pid"], c["status"]) == ("EngineCore", core, "stopped")
    (p,) = [p for p in st["processes"] if p["pid"] == core]
    assert p["source"] == "none" and p["threads"] == []
    assert p["error"].startswith("stopped: its stack handler (SIGUSR2) cannot run"), p["error"]
    assert (
        p["error"].endswith("-m pip install py-spy)") and "no stack handler armed" not in p["error"]
    )
    assert st["headline"].startswith(f"EngineCore (pid {core}) [stopped]: stopped: its stack")
    others = [q for q in st["processes"] if q["role"] in ("APIServer", "Worker_TP0", "Worker_TP1")]
    assert {q["source"] for q in others} == {"signal"}  # the armed, running ones: read
    wait_until(lambda: opsctl("stacks", server.url)[1]["verdict"] == "pass", 120, "resumed")


# ---- the rank that died first (item 5): last, it ends the engine -----------------------------


def test_sigkill_of_worker_tp1_under_load_is_named_first(tp2, tmp_path):
    from opsctl.engine import supervise

    server, _trigger, roles = tp2
    victim = roles["Worker_TP1"]
    with rank_views.Load(server.url, dp=False) as load:
        wait_until(lambda: load.busy(1), 180, "requests served and in flight",
                   lambda: (load.ok, load.inflight, load.codes[-5:]))  # fmt: skip

        def torn_down() -> bool:
            server.track()  # what serve's supervision does every second while it serves
            return server.exited() is not None

        server.track()  # as serve's supervision has, every second since ready: the roles
        os.kill(victim, signal.SIGKILL)
        wait_until(torn_down, 120, "vLLM tearing the server down", every=0.5)
    death = supervise.first_death(server)
    assert death is not None
    rank_views.check_first_death(death.to_dict(), "Worker_TP1", victim,
                                 {"EngineCore", "Worker_TP0", "APIServer"},
                                 server.exited())  # fmt: skip
    core = {f["role"]: f for f in death.to_dict()["others"]}["EngineCore"]
    assert core["fate"] in ("exited", "gone"), core  # the EngineCore died with its worker
    said = str(supervise.died_error(server))
    cause = death.to_dict()["cause"]  # killed by SIGKILL, or not seen (rank_views)
    assert said.startswith(f"engine died: Worker_TP1 (pid {victim}) died first: {cause}"), said
    rank_views.check_views_of_the_dead_run(
        Path(server.run_dir), server.pid, "Worker_TP1", tmp_path, server.url, cause
    )
