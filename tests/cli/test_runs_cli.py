"""`opsctl runs list | clean` through the CLI, with run directories in a private
OPSCTL_HOME whose meta.json names real processes (small Python children), and a
private directory standing in for /dev/shm where segments are removed. No engine:
tests/e2e/test_runs_e2e.py reaps a real orphaned vLLM engine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.collectors import shm
from opsctl.suite.shutdown.collect import still_alive
from tests.engram_tables import deny_fds
from tests.standins.cli_result import error_lines

runner = CliRunner()

# A stand-in engine process: optionally holds a file open (fd) or maps it, optionally
# ignores SIGTERM, says "ready", then waits until killed or its stdin closes.
CHILD = r"""
import mmap, os, signal, sys
mode, path = sys.argv[1], sys.argv[2]
if mode.endswith("-stubborn"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
keep = []
if mode.startswith("open"):
    keep.append(os.open(path, os.O_RDWR))
elif mode.startswith("map"):
    fd = os.open(path, os.O_RDWR)
    keep.append(mmap.mmap(fd, os.fstat(fd).st_size))
    os.close(fd)
print("ready", flush=True)
sys.stdin.readline()
"""


class Children:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def spawn(self, mode: str = "none", path: str = "-") -> tuple[int, float]:
        p = subprocess.Popen(
            [sys.executable, "-c", CHILD, mode, path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        assert p.stdout is not None and p.stdout.readline().startswith("ready")
        return p.pid, psutil.Process(p.pid).create_time()

    def dead(self) -> tuple[int, float]:
        """The pid and start time of a process that has exited."""
        pid, started = self.spawn()
        proc = self.procs.pop()
        proc.kill()
        proc.wait(10)
        return pid, started

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.kill()
            with contextlib.suppress(Exception):
                p.wait(10)


@pytest.fixture
def children():
    c = Children()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    h = tmp_path / "home"
    (h / "runs").mkdir(parents=True)
    monkeypatch.setenv("OPSCTL_HOME", str(h))
    return h


@pytest.fixture
def shm_root(tmp_path, monkeypatch) -> Path:
    """A private directory as /dev/shm: clean --yes here never touches anyone else's."""
    root = tmp_path / "shm"
    root.mkdir()
    monkeypatch.setattr(shm, "SHM", root)
    return root


def invoke(*args):
    return runner.invoke(app, ["runs", *args])


def write_run(home: Path, name: str, owner: tuple[int, float], pids: dict, **extra) -> Path:
    d = home / "runs" / name
    d.mkdir()
    api = next(iter(pids), 1)
    meta = {
        "url": f"http://127.0.0.1:{8000 + len(name)}",
        "pid": api,
        "model": "tiny-llama",
        "model_path": "/models/tiny-llama",
        "load_format": "dummy",
        "started_at": time.time() - 30,
        "healthy_at": time.time() - 20,
        "owner_pid": owner[0],
        "owner_started": owner[1],
        "pids": {str(p): t for p, t in pids.items()},
        **extra,
    }
    (d / "meta.json").write_text(json.dumps(meta))
    (d / "server.log").write_text("log\n")
    return d


def me() -> tuple[int, float]:
    return os.getpid(), psutil.Process().create_time()


def running(pid: int, started: float) -> bool:
    """Still the very process recorded (opsctl's start-time rule), not a zombie."""
    return still_alive({pid: started}) == [pid]


def by_name(doc: dict) -> dict:
    return {r["name"]: r for r in doc["runs"]}


@pytest.fixture
def fleet(home, shm_root, children):
    """One run per state, each backed by real processes (or their absence)."""
    seg = shm_root / "psm_reapme"
    seg.write_bytes(b"\0" * 4096)
    live = children.spawn()
    orphan = children.spawn("open", str(seg))  # an orphaned engine holding its ring buffer
    reused = children.spawn()  # a live process that is NOT the recorded one
    gone_owner = children.dead()
    runs = {
        "1-live": write_run(home, "1-live", me(), dict([live])),
        "2-orphaned": write_run(home, "2-orphaned", gone_owner, dict([orphan])),
        "3-reused": write_run(home, "3-reused", gone_owner, {reused[0]: reused[1] - 100}),
        "4-stopped": write_run(
            home, "4-stopped", gone_owner, {99999999: 1.0}, stopped_at=time.time() - 5
        ),
        "5-dead": write_run(home, "5-dead", gone_owner, {children.dead()[0]: 1.0}),
    }
    bad = home / "runs" / "6-malformed"
    bad.mkdir()
    (bad / "meta.json").write_text('{"pid": "twelve"')
    (home / "runs" / "7-no-meta").mkdir()
    outside = home / "outside"
    outside.mkdir()
    (outside / "meta.json").write_text("{}")
    (home / "runs" / "8-link").symlink_to(outside)
    return {
        "runs": runs,
        "live": live,
        "orphan": orphan,
        "reused": reused,
        "segment": seg,
        "outside": outside,
    }


def test_list_shows_each_state_from_real_processes(fleet, home):
    r = invoke("list", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.runs.list/1" and doc["runs_dir"] == str(home / "runs")
    runs = by_name(doc)
    assert {n: x["state"] for n, x in runs.items()} == {
        "1-live": "live",
        "2-orphaned": "orphaned",
        "3-reused": "dead",  # the pid is alive but runs another process
        "4-stopped": "stopped",
        "5-dead": "dead",
        "6-malformed": "unknown",
        "7-no-meta": "unknown",
    }  # 8-link (a symlink) is not a run directory
    assert runs["2-orphaned"]["alive_pids"] == [fleet["orphan"][0]]
    assert runs["2-orphaned"]["owner_alive"] is False
    assert runs["3-reused"]["reused_pids"] == [fleet["reused"][0]]
    assert "not valid JSON" in runs["6-malformed"]["reason"]
    assert "no meta.json" in runs["7-no-meta"]["reason"]
    live = runs["1-live"]
    assert live["model"] == "tiny-llama" and live["url"].startswith("http://127.0.0.1:")
    assert live["disk_bytes"] == sum(p.stat().st_size for p in fleet["runs"]["1-live"].iterdir())
    assert doc["counts"]["live"] == 1 and doc["counts"]["unknown"] == 2
    r = invoke("list")
    assert r.exit_code == 0 and "orphaned" in r.stdout and "1 live" in r.stdout


def test_clean_dry_run_changes_nothing_then_yes_reaps_and_prunes(fleet, home):
    r = invoke("clean", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.runs.clean/2" and doc["dry_run"]
    actions = {x["name"]: x["action"] for x in doc["runs"]}
    assert actions == {
        "1-live": "keep",
        "2-orphaned": "reap",
        "3-reused": "prune",
        "4-stopped": "prune",
        "5-dead": "prune",
        "6-malformed": "keep",
        "7-no-meta": "keep",
    }
    assert all(d.exists() for d in fleet["runs"].values()) and running(*fleet["orphan"])
    assert "--yes" in r.stderr

    r = invoke("clean", "--yes", "--grace", "10s", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    (rep,) = doc["reaped"]
    assert rep["run"] == "2-orphaned" and rep["pids"] == [fleet["orphan"][0]]
    assert rep["signals"] == ["SIGTERM api-server"] and rep["leftover"] == []
    assert not running(*fleet["orphan"])
    assert rep["shm_removed"] == ["psm_reapme"] and not fleet["segment"].exists()
    assert running(*fleet["live"]) and running(*fleet["reused"])  # never someone else's
    assert sorted(doc["pruned"]) == ["3-reused", "4-stopped", "5-dead"]
    left = sorted(p.name for p in (home / "runs").iterdir())
    assert left == ["1-live", "2-orphaned", "6-malformed", "7-no-meta", "8-link"]
    assert (fleet["outside"] / "meta.json").exists()  # a symlink's target is never touched
    runs = by_name(json.loads(invoke("list", "--json").stdout))
    assert runs["2-orphaned"]["state"] == "dead" and runs["2-orphaned"]["reaped_at"]


def test_reap_escalates_to_sigkill_for_a_process_ignoring_sigterm(home, shm_root, children):
    stubborn = children.spawn("none-stubborn")
    write_run(home, "orphan", children.dead(), dict([stubborn]))
    r = invoke("clean", "--yes", "--grace", "1s", "--json")
    assert r.exit_code == 0, r.stderr
    (rep,) = json.loads(r.stdout)["reaped"]
    assert rep["signals"][-1] == "SIGKILL" and rep["leftover"] == []
    assert not running(*stubborn)


def test_older_than_keeps_recent_runs(home, children):
    gone = children.dead()
    d = write_run(home, "stopped", gone, {99999999: 1.0}, stopped_at=time.time() - 600)
    r = invoke("clean", "--yes", "--older-than", "1h", "--json")
    assert r.exit_code == 0, r.stderr
    (row,) = json.loads(r.stdout)["runs"]
    assert row["action"] == "keep" and "younger than" in row["reason"] and d.exists()
    r = invoke("clean", "--yes", "--older-than", "5m", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["pruned"] == ["stopped"]
    assert not d.exists()


def test_prune_removes_the_engine_tmpdir_made_for_that_run_only(home, children, short_tmp):
    """An engine whose opsctl was SIGKILLed leaves its private $TMPDIR (vLLM's IPC
    sockets) behind; pruning the run removes it, never one made for another run."""
    from opsctl.collectors import engine_tmp

    dead = write_run(home, "dead", children.dead(), {99999999: 1.0})
    tmp = short_tmp / f"{engine_tmp.PREFIX}dead"
    tmp.mkdir()
    (tmp / engine_tmp.MARKER).write_text(str(dead.resolve()))
    (tmp / "0b1e8c3e-ipc").write_text("")
    other_meta = dict(json.loads((dead / "meta.json").read_text()), tmp_dir=str(tmp))
    (dead / "meta.json").write_text(json.dumps(other_meta))
    claims = write_run(home, "claims", children.dead(), {99999998: 1.0})
    foreign = short_tmp / f"{engine_tmp.PREFIX}foreign"
    foreign.mkdir()
    (foreign / engine_tmp.MARKER).write_text(str(dead.resolve()))  # made for "dead"
    meta = dict(json.loads((claims / "meta.json").read_text()), tmp_dir=str(foreign))
    (claims / "meta.json").write_text(json.dumps(meta))
    r = invoke("clean", "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    assert sorted(json.loads(r.stdout)["pruned"]) == ["claims", "dead"]
    assert not tmp.exists()
    assert foreign.is_dir()


def test_a_run_whose_opsctl_still_runs_is_never_pruned(home):
    d = write_run(home, "mine", me(), {99999999: 1.0}, stopped_at=time.time() - 600)
    r = invoke("clean", "--yes", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["pruned"] == [] and d.exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["clean", "--older-than", "soon"], "--older-than: not a duration"),
        (["clean", "--older-than", "-1h"], "--older-than: not a duration"),
        (["clean", "--older-than", "5w"], "--older-than: not a duration"),
        (["clean", "--shm", "--min-age", "1x"], "--min-age: not a duration"),
        (["clean", "--grace", "later"], "--grace: not a duration"),
        (["clean", "--force"], "--force only makes sense"),
        (["clean", "--shm", "--force"], "--force only makes sense"),
    ],
)
def test_bad_input_exit_2_one_line(home, args, needle):
    d = write_run(home, "x", (1, 1.0), {99999999: 1.0}, stopped_at=1.0)
    r = invoke(*args)
    assert r.exit_code == 2, r.stdout
    assert r.stdout == "" and d.exists()
    lines = error_lines(r)
    assert len(lines) == 1 and needle in lines[0]


def wait_age(path: Path, seconds: float, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = path.stat()
        if time.time() - max(st.st_mtime, st.st_ctime) >= seconds:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} did not age {seconds} s")


def test_shm_lists_and_removes_only_free_old_vllm_segments(home, shm_root, children):
    names = ["psm_free", "psm_open", "sem.mp-mapped", "vllm_engram_t", "other"]
    for n in names:
        (shm_root / n).write_bytes(b"\1" * 8192)
    children.spawn("open", str(shm_root / "psm_open"))
    children.spawn("map", str(shm_root / "sem.mp-mapped"))
    (shm_root / "psm_link").symlink_to(shm_root / "other")

    # fresh: the default minimum age (60 s) keeps everything
    r = invoke("clean", "--shm", "--json")
    assert r.exit_code == 0, r.stderr
    segs = {s["name"]: s for s in json.loads(r.stdout)["shm"]["segments"]}
    assert set(segs) == {"psm_free", "psm_open", "sem.mp-mapped", "psm_link"}
    assert {n: s["status"] for n, s in segs.items()} == {
        "psm_free": "young",
        "psm_open": "in-use",
        "sem.mp-mapped": "in-use",
        "psm_link": "symlink",
    }
    assert segs["psm_open"]["holders"][0]["how"] == "open"
    # Python's mmap keeps a dup of the descriptor: mapped and open
    assert "mapped" in segs["sem.mp-mapped"]["holders"][0]["how"]

    wait_age(shm_root / "psm_free", 1.0)
    r = invoke("clean", "--shm", "--min-age", "1s", "--json")  # dry run
    s = json.loads(r.stdout)["shm"]
    assert s["free"] == ["psm_free"] and s["free_bytes"] == 8192
    assert s["pinned_bytes"] == (shm_root / "psm_free").stat().st_blocks * 512 > 0
    assert (shm_root / "psm_free").exists()
    r = invoke("clean", "--shm", "--min-age", "1s")
    assert "would remove (--yes)" in r.stdout and "pinning" in r.stdout

    r = invoke("clean", "--shm", "--min-age", "1s", "--yes", "--json")
    s = json.loads(r.stdout)["shm"]
    if s["unchecked_pids"]:  # e.g. a sandbox's PID 1 is unreadable even for root: refused
        assert r.exit_code == 1 and s["removed"] == [] and (shm_root / "psm_free").exists()
        assert "--force" in s["refused"] and len(error_lines(r)) == 1
        r = invoke("clean", "--shm", "--min-age", "1s", "--yes", "--force", "--json")
        s = json.loads(r.stdout)["shm"]
    assert r.exit_code == 0, r.stderr
    assert s["removed"] == ["psm_free"]
    assert sorted(p.name for p in shm_root.iterdir()) == sorted(
        ["psm_open", "sem.mp-mapped", "vllm_engram_t", "other", "psm_link"]
    )


def test_shm_dry_run_on_the_real_dev_shm_lists_a_leaked_segment(home):
    name = f"psm_opsctltest{uuid.uuid4().hex[:8]}"
    path = Path("/dev/shm") / name
    try:
        path.write_bytes(b"\1" * 4096)
        r = invoke("clean", "--shm", "--min-age", "0", "--json")
        assert r.exit_code == 0, r.stderr
        segs = {s["name"]: s for s in json.loads(r.stdout)["shm"]["segments"]}
        assert segs[name]["status"] == "orphan" and segs[name]["size_bytes"] == 4096
        assert path.exists()  # dry run
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def test_help_lists_runs_commands():
    r = runner.invoke(app, ["runs", "--help"])
    assert r.exit_code == 0 and "list" in r.stdout and "clean" in r.stdout


# ---- the library entry points (opsctl.checks.runs), called directly ---------------------------


def test_check_list_runs_reads_the_given_runs_dir(fleet, home):
    from opsctl.checks import runs

    report = runs.list_runs(runs.ListOptions(runs_dir=home / "runs"))
    doc = report.to_dict()
    assert report.verdict == "pass" and doc["schema"] == "opsctl.runs.list/1"
    assert by_name(doc)["2-orphaned"]["state"] == "orphaned"
    assert doc["counts"] == {"live": 1, "orphaned": 1, "stopped": 1, "dead": 2, "unknown": 2}


def test_check_clean_dry_run_hint_then_yes_with_events(fleet, home):
    from opsctl.checks import events as ev
    from opsctl.checks import runs

    dry = runs.clean(runs.CleanOptions(runs_dir=home / "runs"))
    assert dry.verdict == "pass" and dry.failure is None
    assert dry.hint == "4 item(s) listed; run again with --yes to act"  # 1 reap + 3 prunes
    assert running(*fleet["orphan"])
    events: list = []
    done = runs.clean(runs.CleanOptions(yes=True, grace=10, runs_dir=home / "runs"), events.append)
    assert done.verdict == "pass" and done.hint is None
    assert sorted(done.to_dict()["pruned"]) == ["3-reused", "4-stopped", "5-dead"]
    assert not running(*fleet["orphan"]) and running(*fleet["live"])
    logs = [e.text for e in events if isinstance(e, ev.Log)]
    assert "2-orphaned: reaped" in logs and "5-dead: pruned" in logs
    assert isinstance(events[-1], ev.Finished) and events[-1].verdict == "pass"


def test_check_clean_force_needs_shm_and_yes():
    from opsctl.checks import runs
    from opsctl.errors import BadInput

    with pytest.raises(BadInput, match="--force only makes sense"):
        runs.CleanOptions(force=True, yes=True)
    runs.CleanOptions(force=True, yes=True, shm=True)


def test_check_clean_refuses_segments_while_some_processes_are_unreadable(
    home, shm_root, monkeypatch
):
    """The refusal rule through the library: unreadable fds (simulated) keep every free
    segment and fail with the refusal line; force removes it."""
    from opsctl.checks import runs

    seg = shm_root / "psm_leak"
    seg.write_bytes(b"\1" * 4096)
    deny_fds(monkeypatch, os.getpid())
    report = runs.clean(runs.CleanOptions(yes=True, shm=True, min_age=0))
    s = report.to_dict()["shm"]
    assert report.verdict == "fail" and seg.exists() and s["kept"] == ["psm_leak"]
    assert report.failure == s["refused"] and "--force" in report.failure
    report = runs.clean(runs.CleanOptions(yes=True, shm=True, min_age=0, force=True))
    assert report.verdict == "pass" and report.to_dict()["shm"]["removed"] == ["psm_leak"]
    assert not seg.exists()


def test_list_with_no_runs_prints_nothing_on_stdout(tmp_path, monkeypatch):
    # nothing to list: no empty table and no message among the results (issue 23)
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path))
    r = invoke("list")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    assert r.stderr.strip() == f"no run directories in {tmp_path / 'runs'}"
    r = invoke("list", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["runs"] == []
