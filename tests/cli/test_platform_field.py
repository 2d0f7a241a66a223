"""Every report names the platform vLLM's ``current_platform`` reported in the engine,
next to the vLLM version (issue 14 point 3, vLLM's XPU CI change): top-level
``platform`` and ``vllm_version`` in each check's JSON and in its human header.

Played against the stand-ins with a fake run directory whose patch ledger names
platform "xpu": the value can only come from the engine's own record (nothing in opsctl
says "xpu"). A server opsctl did not start does not guess: issue 23's JSON rule makes
``platform`` a device name or null, never prose; the reason goes to ``platform_note``
(or stderr). Producers that still write prose into ``platform`` are marked xfail
(strict: the mark must go when the producer is fixed) with the file to change. diag
kv-fail needs a real engine, so its document fields are built from a ledger read from
disk the way the check reads it; certify belongs to its own tests.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from engram_tables import shared_table, unique_prefix
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.collectors.ledger import read_events, read_records
from opsctl.domain import platform as plat
from opsctl.suite.kv_fail import judge as kv
from opsctl.suite.kv_fail import judge_report as kvr
from tests.standins.vllm_server import StandInFleet

FAKE = "xpu"  # a platform this CPU machine cannot have: it must come from the ledger
VERSION = "0.32.0-ledger"


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private OPSCTL_HOME (its runs/ is where find_run_dir looks)."""
    h = tmp_path / "home"
    (h / "runs").mkdir(parents=True)
    real = Path(os.environ["OPSCTL_HOME"])
    if (real / "models").is_dir():
        (h / "models").symlink_to(real / "models", target_is_directory=True)
    monkeypatch.setenv("OPSCTL_HOME", str(h))
    return h


def ledger(run_dir: Path, pid: int = 1, **extra) -> Path:
    """One engine-core ledger record naming the fake platform."""
    (run_dir / "ledger").mkdir(parents=True, exist_ok=True)
    rec = {"pid": pid, "role": "engine_core", "time": time.time(), "platform": FAKE}
    rec.update({"vllm_version": VERSION, "patches": [], "test_knobs": {}, **extra})
    (run_dir / "ledger" / f"{pid}.json").write_text(json.dumps(rec))
    return run_dir


def register(run_dir: Path, url: str) -> None:
    meta = {"url": url, "pid": os.getpid(), "started_at": time.time()}
    (run_dir / "meta.json").write_text(json.dumps(meta))


def unknown(doc: dict) -> None:
    """The JSON rule for a platform nobody recorded: null, never prose; a note, where the
    document has one, says why."""
    assert doc["platform"] is None, doc["platform"]
    if "platform_note" in doc:
        assert isinstance(doc["platform_note"], str) and doc["platform_note"]


def unknown_line(human: str, note: str) -> None:
    """The human header of a report whose platform is null: the note, never "None"."""
    first = human.splitlines()[0]
    assert f"platform unknown ({note})" in first and "None" not in first, first


def prose_in(path: str):
    """xfail (strict) for a producer that still writes prose into ``platform``."""
    return pytest.mark.xfail(
        strict=True, reason=f"{path} still puts prose in `platform` (issue 23: null + note)"
    )


SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def validate(doc: dict) -> None:
    """``doc`` against its shipped schema (tests/data/schemas), where one is shipped."""
    import jsonschema

    name, version = doc["schema"].removeprefix("opsctl.").split("/")
    path = SCHEMAS / f"opsctl.{name}-{version}.schema.json"
    if path.is_file():
        jsonschema.Draft7Validator(json.loads(path.read_text())).validate(doc)


def kv_fail_document(engine: kvr.EngineFacts) -> dict:
    """The ``diag.kv-fail`` document the check builds around these engine facts (the
    check itself needs a real engine: tests/e2e)."""
    from opsctl.output import document
    from opsctl.suite.kv_fail.run import SCHEMA

    s = kv.Settings(rate=0.5, seed=3)
    work = kv.workload(s, 320)
    fields = kvr.report_fields(
        kvr.Facts(s),
        model="m",
        engine=engine,
        targets=work.targets,
        recoveries=(),
        metrics=None,
        phase_seconds={"store": 1.5},
        baseline=[],
        prompts=work.prompts,
        run_dir="r",
    )
    seeds = [kvr.seed_row(fields, 1, 2.0)]
    doc = document(
        SCHEMA,
        **fields,
        verdict_seed=3,
        seeds=seeds,
        totals=kvr.totals(seeds, 1),
        duration_s=2.0,
        test_knobs={},
        warnings=[],
    )
    validate(doc)
    return doc


def cli(*args: str, codes: tuple[int, ...] = (0,)) -> tuple[dict, str]:
    """(JSON document, human output) of one command; the document matches its schema."""
    runner = CliRunner()
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code in codes, (args, r.stdout, r.stderr)
    validate(json.loads(r.stdout))
    human = runner.invoke(app, list(args))
    assert human.exit_code in codes, (args, human.stdout, human.stderr)
    return json.loads(r.stdout), human.stdout


def test_diag_usage_unknown_is_null():
    from tests.standins.scoring import stand_in

    with stand_in() as url:
        doc, human = cli("diag", "usage", url)
    assert doc["vllm_version"] is None
    unknown(doc)
    assert doc["platform_note"] == plat.NOT_STARTED_NOTE  # no run directory, no /server_info
    unknown_line(human, plat.NOT_STARTED_NOTE)


def test_diag_usage(home):
    from tests.standins.scoring import stand_in

    with stand_in() as url:
        register(ledger(home / "runs" / "u"), url)
        doc, human = cli("diag", "usage", url)
    assert (doc["platform"], doc["vllm_version"]) == (FAKE, VERSION)
    assert f"on vLLM {VERSION}, platform {FAKE}" in human.splitlines()[0]


def test_diag_mm_uuid(tmp_path):
    from tests.standins.mm_uuid import stand_in, write_run_dir

    write_run_dir(tmp_path)
    rec = json.loads((tmp_path / "ledger" / "1.json").read_text())
    (tmp_path / "ledger" / "1.json").write_text(json.dumps({**rec, "platform": FAKE}))
    with stand_in(tmp_path) as url:
        doc, human = cli("diag", "mm-uuid", url, "--run", str(tmp_path))
    assert (doc["platform"], doc["vllm_version"]) == (FAKE, "x")
    assert f"platform {FAKE}" in human.splitlines()[0]


def test_diag_mm_uuid_unknown_is_null(tmp_path):
    from tests.standins.mm_uuid import stand_in, write_run_dir

    write_run_dir(tmp_path)
    for path in (tmp_path / "ledger").glob("*.json"):
        rec = json.loads(path.read_text())
        rec.pop("platform", None)  # an engine that recorded no platform
        path.write_text(json.dumps(rec))
    with stand_in(tmp_path) as url:
        doc, human = cli("diag", "mm-uuid", url, "--run", str(tmp_path))
    unknown(doc)
    assert doc["platform_note"] == plat.NO_RECORD_NOTE  # a ledger without a platform
    unknown_line(human, plat.NO_RECORD_NOTE)


def test_diag_invariance(home, tmp_path):
    from tests.standins.completions import ENGINE_INFO, completions_server, write_run_dir
    from tests.standins.completions import VERSION as SERVED

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a\nb\n")
    args = ("--mode", "eager", "--prompts", str(prompts))
    with completions_server() as (url, _):
        run_dir = write_run_dir(home / "runs" / "r", info={**ENGINE_INFO, "platform": FAKE})
        register(run_dir, url)
        doc, human = cli("diag", "invariance", url, *args)
    assert (doc["platform"], doc["vllm_version"]) == (FAKE, SERVED)
    assert doc["runs"][0]["platform"] == FAKE
    assert f"on vLLM {SERVED}, platform {FAKE}" in human.splitlines()[0]


def test_diag_invariance_unknown_is_null(tmp_path):
    from tests.standins.completions import VERSION as SERVED
    from tests.standins.completions import completions_server

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a\nb\n")
    with completions_server() as (url, _):
        doc, human = cli("diag", "invariance", url, "--mode", "eager", "--prompts", str(prompts))
    assert doc["vllm_version"] == SERVED  # the server's /version
    unknown(doc)
    unknown(doc["runs"][0])
    assert doc["platform_note"] == doc["runs"][0]["platform_note"] == plat.NOT_STARTED_NOTE
    unknown_line(human, plat.NOT_STARTED_NOTE)


def test_status(home):
    with StandInFleet(["healthy"]) as fleet:
        url = fleet.urls[0]
        doc, _ = cli("status", url)
        unknown(doc)  # no /server_info, no ledger
        assert doc["vllm_version"] == "0.32.0"
        register(ledger(home / "runs" / "s"), url)
        doc, human = cli("status", url)
    assert doc["platform"] == FAKE
    cells = [[c for c in line.split() if c not in "│┃|"] for line in human.splitlines()]
    assert ["platform", FAKE] in cells


def test_engram_inspect(home):
    prefix = unique_prefix("plat")
    doc, human = cli("engram", "inspect", "--prefix", prefix)
    unknown(doc)
    assert doc["platform_note"] == "no process maps a table"
    assert "platform unknown (no process maps a table)" in human.splitlines()[0]
    with shared_table(prefix, mappers=2) as table:
        doc, _ = cli("engram", "inspect", "--prefix", prefix)
        unknown(doc)
        assert "no mapping process was started by opsctl" in doc["platform_note"]
        assert doc["platform_pids"] == [] and doc["vllm_version"] is None
        mapper = table.pids[0]
        ledger(home / "runs" / "e", pid=mapper)
        ledger(home / "runs" / "old", pid=table.pids[1], time=1.0)  # an earlier pid owner
        doc, human = cli("engram", "inspect", "--prefix", prefix)
        ledger(home / "runs" / "other", pid=table.pids[1], platform="cuda")
        mixed, _ = cli("engram", "inspect", "--prefix", prefix)
    assert (doc["platform"], doc["vllm_version"], doc["platform_pids"]) == (
        FAKE,
        VERSION,
        [mapper],
    )
    assert doc["platform_note"] is None
    assert f"platform {FAKE}" in human.splitlines()[0]
    # two mappers whose engines name different platforms: not one name, so null + why
    unknown(mixed)
    note = mixed["platform_note"]
    assert "different platforms" in note and "xpu" in note and "cuda" in note


def test_diag_kv_fail_fields_from_the_ledger_on_disk(tmp_path):
    run_dir = ledger(tmp_path)
    (tmp_path / "events").mkdir()
    info = {"platform": "cpu", "kv_load_failure_policy": "recompute", "kv_cache_groups": []}
    (tmp_path / "events" / "engine_info.jsonl").write_text(json.dumps(info) + "\n")
    engine = kvr.engine_facts(read_events(run_dir, "engine_info")[-1], read_records(run_dir))
    doc = kv_fail_document(engine)
    assert doc["schema"] == "opsctl.diag.kv-fail/3"
    assert (doc["platform"], doc["vllm_version"]) == (FAKE, VERSION)  # the core's ledger
    assert doc["platform_note"] is None
    assert (doc["duration_s"], doc["phase_durations_s"]) == (2.0, {"store": 1.5})


def test_diag_kv_fail_unknown_is_null():
    from rich.console import Console

    from opsctl.suite.kv_fail.view import render

    engine = kvr.engine_facts({}, [{"role": "engine_core", "vllm_version": VERSION}])
    assert (engine.platform, engine.platform_note) == (None, plat.NO_RECORD_NOTE)
    doc = kv_fail_document(engine)
    unknown(doc)
    con = Console(record=True, width=200)
    render(con, doc)
    text = con.export_text()
    unknown_line(text, plat.NO_RECORD_NOTE)
    assert "(2.0 s, run r)" in text  # duration_s


def lora_unknown() -> tuple[dict, str]:
    from tests.standins.lora import Behaviour, lora_server

    with lora_server(Behaviour(adapters={"a1": "/srv/a1", "a2": "/srv/a2"})) as url:
        return cli("diag", "lora", url, "--max-tokens", "4", codes=(1,))  # unverified: exit 1


def test_diag_lora_unknown_is_null(home):
    from tests.standins.lora import VERSION as SERVED

    doc, _ = lora_unknown()
    assert doc["vllm_version"] == SERVED
    unknown(doc)
    assert doc["platform_note"] == plat.NOT_STARTED_NOTE


def test_diag_lora_unknown_human_line(home):
    _, human = lora_unknown()
    assert "platform unknown" in human or "platform -" in human
    assert "platform None" not in human


# ---- the rule itself (opsctl/domain/platform.py) ---------------------------------------


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("cpu", "cpu"),
        ("XPU", "xpu"),
        ("cuda", "cuda"),
        ("rocm", "rocm"),
        (None, None),
        ("", None),
        ("?", None),
        ("auto", None),
        ("unknown (not started by opsctl)", None),  # what older ledgers and reports wrote
        ("unknown (ImportError('vllm'))", None),
        (3, None),
    ],
)
def test_name_is_a_device_name_or_none(value, name):
    assert plat.name(value) == name


def test_fields_and_agreed():
    assert plat.fields(None, "unknown (x)", "xpu") == {"platform": "xpu", "platform_note": None}
    assert plat.fields(None, note="why") == {"platform": None, "platform_note": "why"}
    assert plat.agreed(["cpu", "cpu", None], "why") == {"platform": "cpu", "platform_note": None}
    assert plat.agreed([], "why") == {"platform": None, "platform_note": "why"}
    mixed = plat.agreed(["cpu", "xpu"], "why")
    assert mixed["platform"] is None and "cpu, xpu" in mixed["platform_note"]
