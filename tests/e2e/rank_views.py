"""Shared checks of the TP=2 and DP=2 engines of tests/e2e/test_rank_hang_e2e.py and
tests/e2e/test_dp_stall_e2e.py: read-only, before those modules freeze or kill them, every
serve-side view of a real multi-rank server names each rank (issue 44, item 2) and the
checks judge such a server truly (item 6); at their end, one rank SIGKILLed under load is
named as the rank that died first (item 5)."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import threading
from pathlib import Path

import httpx
import jsonschema
from typer.testing import CliRunner

from opsctl.checks import bundle, patches
from opsctl.cli import app
from opsctl.collectors import ledger
from opsctl.collectors.processes import snapshot_tree
from opsctl.console import discovery
from opsctl.console.judge import Target
from opsctl.console.judge_state import DEAD, decide
from opsctl.domain.ranks import parse_title
from tests.conftest import OPSCTL
from tests.expect import expected as expected_verdicts
from tests.expect import verdicts


def rank_roles(roles) -> list[str]:
    """The vLLM rank roles of ``roles`` in their order (helpers left out)."""
    return [r for r in roles if parse_title(r) is not None]


def check_tree(pid: int, expected: list[str]) -> None:
    """The process tree: every rank named, in rank order, parents before children."""
    tree = snapshot_tree(pid)
    assert rank_roles(p.role for p in tree.processes) == expected, tree.processes


def in_ledger(expected: list[str]) -> list[str]:
    """The ranks with a ledger record: vLLM's DP coordinator loads no general plugin."""
    return [r for r in expected if r != "DPCoordinator"]


def check_ledger(run_dir: Path, expected: list[str]) -> None:
    """The patch ledger per rank: library entries, ``patches`` report, and its CLI table."""
    expected = in_ledger(expected)
    entries = ledger.entries(ledger.read_records(run_dir))
    ranked = list(dict.fromkeys(e.rank for e in entries if e.rank))
    assert ranked == expected, [(e.pid, e.role, e.rank) for e in entries]
    doc = patches.run(patches.Options(run_dir=run_dir)).to_dict()
    assert rank_roles(p["rank"] for p in doc["processes"]) == expected, doc["processes"]
    out = subprocess.run([*OPSCTL, "patches", "--run", str(run_dir)], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    for role in expected:
        assert f" {role} " in out.stdout, out.stdout


def check_bundle(run_dir: Path, expected: list[str], tmp: Path) -> None:
    """``runs bundle``'s processes by rank (live tree and ledger); no first death."""
    out = tmp / "b.tar.gz"
    doc = bundle.bundle(bundle.Options(run=str(run_dir), out=out, fetch=False)).to_dict()
    assert doc["first_death"] is None, doc["first_death"]
    with tarfile.open(out) as tar:
        procs = json.load(tar.extractfile(f"{run_dir.name}/collected/processes.json"))
        deaths = json.load(tar.extractfile(f"{run_dir.name}/collected/deaths.json"))
    assert rank_roles(p["role"] for p in procs["live"]) == expected, procs["live"]
    ledger_ranks = rank_roles(p["rank"] or "" for p in procs["ledger"])
    assert ledger_ranks == in_ledger(expected), procs["ledger"]
    assert deaths == {"first_death": None, "exits": []}, deaths


def check_console(url: str, api_pid: int, expected: list[str]) -> None:
    """``console --once --json``'s pids, and discovery of the server as a plain vLLM
    process (no run directory: as for a server opsctl did not start)."""
    # --no-discover: another test's server on this machine is no part of this verdict
    out = subprocess.run([*OPSCTL, "console", "--once", "--json", "--no-discover", url],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    (ep,) = json.loads(out.stdout)["endpoints"]
    assert rank_roles(p["role"] for p in ep["pids"]) == expected, ep["pids"]
    found = [t for t in discovery.discover_processes() if t.pid == api_pid]
    assert found and found[0].run_dir is None, found
    local = discovery.local_state(found[0], with_roles=True)
    assert local is not None and local.alive and local.first_death is None
    assert rank_roles(p.role for p in local.procs) == expected, local.procs


# ---- the checks on a multi-rank URL (item 6) ---------------------------------------------------

runner = CliRunner()
PREFIX_CACHING = "setting prefix caching: wanted off, engine has True"
TOKENS = re.compile(r'^vllm:generation_tokens_total\{[^}]*engine="(\d+)"[^}]*\} (\S+)$', re.M)


def invoke(*args: str) -> tuple[int, dict, str]:
    r = runner.invoke(app, [*args, "--json"])
    assert r.stdout.strip(), r.stderr[-3000:]
    return r.exit_code, json.loads(r.stdout), r.stderr


def judged_as_is(rc: int, run: dict) -> None:
    """A server not isolated for the check (it keeps vLLM's prefix caching): every prompt
    identical, the batch formed, and the verdict fails for that one setting."""
    prompts = run["prompts"]
    assert all(p["status"] == "identical" for p in prompts), prompts
    assert run["batch"]["formed"] is True and run["batch"]["max_batch"] >= 8, run["batch"]
    assert run["verdict"] == "fail" and run["summary"]["reasons"] == [PREFIX_CACHING], run
    assert rc == 1


def certified_as_is(rc: int, doc: dict, err: str, knob: str) -> dict:
    """certify URL on a server with the test knob ``knob`` armed (the module freezes or
    hangs its ranks with it later): liveness and Engram pass, the patch ledger fails for
    that knob alone (an engine altered on purpose is never certified), invariance is
    skipped with the setting it would fail on; the patch ledger's processes (pid -> role)."""
    assert verdicts(doc) == expected_verdicts(pass_="liveness engram", fail="patches"), doc
    reasons = {c["check"]: c["reason"] for c in doc["checks"] if c["verdict"] == "skipped"}
    assert "prefix caching on" in reasons["invariance"], reasons
    assert rc == 1, err[-2000:]
    found = next(c for c in doc["checks"] if c["check"] == "patches")["report"]
    assert list(found["summary"]["test_knobs"]) == [knob], found["summary"]
    assert found["summary"]["failed"] == [], found["summary"]  # no patch failed on any rank
    assert [f["code"] for f in found["findings"] if f["severity"] == "fail"] == [
        "patches.test_knobs"
    ], found["findings"]
    return {p["pid"]: p["role"] for p in found["summary"]["processes"]}


def tokens_per_engine(url: str) -> dict[str, float]:
    """Each DP engine's generated-token counter."""
    return {e: float(v) for e, v in TOKENS.findall(httpx.get(f"{url}/metrics").text)}


# ---- the rank that died first (item 5) ----------------------------------------------------------

OOM = "an out-of-memory kill or kill -9"
SERVE_SCHEMA = Path(__file__).parents[1] / "data" / "schemas" / "opsctl.serve-3.schema.json"


class Load:
    """Requests kept in flight (8 at a time) until stopped; DP: spread over both engines
    with vLLM's ``X-data-parallel-rank`` header. Counts, per rank, the requests answered
    200 and those sent and not answered yet."""

    def __init__(self, url: str, dp: bool) -> None:
        self.url, self.dp = url, dp
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = [0, 0]
        self.inflight = [0, 0]
        self.codes: list[object] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(8)]

    def _run(self, i: int) -> None:
        rank = i % 2 if self.dp else 0
        headers = {"X-data-parallel-rank": str(rank)} if self.dp else {}
        body = {"model": "tiny-llama", "prompt": "hello " * 5, "max_tokens": 200,
                "ignore_eos": True}  # fmt: skip
        while not self.stop.is_set():
            with self.lock:
                self.inflight[rank] += 1
            try:
                r = httpx.post(f"{self.url}/v1/completions", json=body, headers=headers, timeout=60)
                code: object = r.status_code
            except httpx.HTTPError as exc:
                code = type(exc).__name__
            with self.lock:
                self.inflight[rank] -= 1
                self.ok[rank] += code == 200
                self.codes.append(code)
            if code != 200:
                self.stop.wait(0.2)

    def busy(self, ranks: int) -> bool:
        """Every rank answered a request and has others in flight."""
        with self.lock:
            return all(self.ok[r] >= 1 and self.inflight[r] >= 1 for r in range(ranks))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(70)


def check_first_death(
    death: dict, victim: str, pid: int, others: set[str], api_exit: int | None
) -> None:
    """``death`` names ``victim`` first, killed by SIGKILL, and what each other rank did;
    it is valid as serve's events carry it (opsctl.serve/3: rank_died's body, stopped's
    ``first_death``). ``api_exit``: the API server's exit code as its parent saw it (0 on
    an idle host; under a CPU hog vLLM's teardown once ended it otherwise, and the fate
    must say what it was)."""
    validator = jsonschema.Draft7Validator(json.loads(SERVE_SCHEMA.read_text()))
    validator.validate({"schema": "opsctl.serve/3", "event": "rank_died", **death})
    assert death["role"] == victim and death["pid"] == pid, death
    if death["seen_by"] == "parent":  # its vLLM parent recorded the exit: the signal
        assert death["exitcode"] == -9 and death["signal"] == "SIGKILL", death
        assert OOM in death["cause"], death
    else:  # beside a CPU hog the parent once failed before recording it: said as unknown
        assert death["seen_by"] == "seen gone" and death["exitcode"] is None, death
        assert death["cause"] == "gone (exit code not seen)", death
    assert death["last_lines"], "the killed rank's last log lines"
    fates = {f["role"]: f for f in death["others"]}
    assert others <= set(fates), (others, fates)  # what every other rank did is said
    for role in others:
        # a worker of the dead engine may outlive the API server a moment (seen: DP)
        assert fates[role]["fate"] in ("exited", "gone", "alive"), fates[role]
    assert api_exit is not None, "the server was seen torn down"
    assert fates["APIServer"]["fate"] == "exited", fates["APIServer"]
    assert fates["APIServer"]["exitcode"] == api_exit, (fates["APIServer"], api_exit)
    assert fates["APIServer"]["after_s"] >= 0
    assert death["summary"].startswith(f"{victim} (pid {pid}) died first: {death['cause']}")


def check_views_of_the_dead_run(
    run_dir: Path, api_pid: int, victim: str, tmp: Path, url: str, cause: str = "killed by SIGKILL"
) -> None:
    """The console's dead reason, `opsctl status` and the run's bundle name the first death
    (``cause``: how it died, as the first death says it)."""
    from opsctl.checks import status
    from opsctl.checks.target import UrlTarget

    said = status.run(UrlTarget(url), status.Options(timeout=2.0, canary_timeout=None)).to_dict()
    assert said["state"] == "unreachable" and said["first_death"]["role"] == victim, said
    assert said["reason"].startswith(f"{victim} (pid "), said["reason"]
    target = Target("run", "http://127.0.0.1:1", "opsctl-run", pid=api_pid, run_dir=str(run_dir))
    local = discovery.local_state(target)
    assert local is not None and not local.alive
    assert local.first_death and local.first_death.startswith(f"{victim} (pid "), local
    state, reason = decide(None, local, None, False)
    assert state == DEAD and f"{victim} (pid " in reason and cause.split(" (")[0] in reason, reason
    out = tmp / "b.tar.gz"
    doc = bundle.bundle(bundle.Options(run=str(run_dir), out=out, fetch=False)).to_dict()
    assert doc["first_death"].startswith(f"{victim} (pid "), doc["first_death"]
    with tarfile.open(out) as tar:
        deaths = json.load(tar.extractfile(f"{run_dir.name}/collected/deaths.json"))
        procs = json.load(tar.extractfile(f"{run_dir.name}/collected/processes.json"))
    assert deaths["first_death"]["role"] == victim and deaths["exits"], deaths
    assert victim in {p["rank"] for p in procs["ledger"]}, procs
