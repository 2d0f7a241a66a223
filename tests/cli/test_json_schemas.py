"""Every command's --json document names its schema as ``opsctl.<name>/<integer>``.

A field can no longer become the schema version (``opsctl status --json`` once printed
``"schema": "opsctl.status/0.32.0"`` and lost the server's version). Each command runs
against a stand-in (server, run directory, /dev/shm table) where that is cheap; the
commands that need a real engine are listed in SKIPPED with the reason, and a test
checks that every command of the CLI is either run here or skipped on purpose.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest
import typer
from engram_tables import planting, shared_table, unique_prefix
from typer.testing import CliRunner

from opsctl.cli import app
from tests.standins.vllm_server import StandInFleet

SCHEMA = re.compile(r"^opsctl\.[a-z0-9_.]+/[0-9]+$")

# command -> why its JSON is not checked here
SKIPPED = {
    "serve": "JSON event lines of a real engine's lifetime (tests/e2e/test_serve_e2e.py)",
    "diag kv-fail": "injects KV load failures inside a real engine",
    "diag lora": "schema asserted in tests/unit/test_checks_lora.py (stand-in) and e2e",
    "certify": "schema asserted in tests/cli/test_certify_cli.py (stand-in) and e2e",
    "stacks": "needs a live vLLM process tree: its schema is validated in "
    "tests/e2e/test_console_e2e.py (a real engine) and tests/unit/test_stacks.py",
    "rules": "writes a Prometheus rules file (YAML, no --json): promtool checks and tests it "
    "(tests/unit/test_promtool_rules.py)",
}


@pytest.fixture(scope="module")
def fleet():
    with StandInFleet(["healthy"]) as f:
        yield f


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A private OPSCTL_HOME with one run directory holding a patch ledger."""
    run = tmp_path / "runs" / "20260101-000000-serve-tiny-llama-8000"
    (run / "ledger").mkdir(parents=True)
    record = {"pid": 7, "role": "engine_core", "time": 1.0, "vllm_version": "0.32.0"}
    record["patches"] = [{"name": "engine_info_probe", "status": "applied", "detail": ""}]
    (run / "ledger" / "7.json").write_text(json.dumps(record))
    (run / "meta.json").write_text(json.dumps({"url": "http://127.0.0.1:8000", "pid": 1}))
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path))
    return tmp_path


def run_json(*args: str, codes: tuple[int, ...] = (0,)) -> dict:
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code in codes, (args, r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert SCHEMA.match(doc["schema"]), (args, doc["schema"])
    return doc


def leaf_commands() -> set[str]:
    def walk(cmd, path: tuple[str, ...] = ()):
        subs = getattr(cmd, "commands", None)
        if not subs:
            yield " ".join(path)
            return
        for name, sub in subs.items():
            yield from walk(sub, (*path, name))

    return set(walk(typer.main.get_command(app)))


CHECKED = {
    "status",
    "version",
    "patches",
    "console",
    "models build",
    "models list",
    "engram inspect",
    "engram plan",
    "engram clean",
    "runs list",
    "runs clean",
    "runs bundle",
    "diag usage",
    "diag mm-uuid",
    "diag invariance",
}


def test_every_command_is_checked_or_skipped_with_a_reason():
    assert leaf_commands() == CHECKED | set(SKIPPED)
    assert not CHECKED & set(SKIPPED)


SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def validate(doc: dict) -> None:
    """``doc`` against its shipped schema (tests/data/schemas/opsctl.<name>-<N>.schema.json)."""
    import jsonschema

    name, version = doc["schema"].removeprefix("opsctl.").split("/")
    schema = json.loads((SCHEMAS / f"opsctl.{name}-{version}.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(doc)


def test_status_and_console_against_a_stand_in(fleet):
    doc = run_json("status", fleet.urls[0])
    assert doc["schema"] == "opsctl.status/3" and doc["vllm_version"] == "0.32.0"
    validate(doc)
    doc = run_json("console", fleet.urls[0], "--once", "--no-discover", "--interval", "0.2")
    assert doc["schema"] == "opsctl.console/4" and doc["endpoints"][0]["state"] == "ready"
    validate(doc)


def test_patches_runs_and_models(home, tmp_path):
    assert run_json("patches")["schema"] == "opsctl.patches/1"
    doc = run_json("runs", "list")
    assert doc["schema"] == "opsctl.runs.list/1" and len(doc["runs"]) == 1
    assert run_json("runs", "clean")["schema"] == "opsctl.runs.clean/2"
    doc = run_json("runs", "bundle", "20260101-000000-serve-tiny-llama-8000", "--out",
                   str(tmp_path / "bundle.tar.gz"))  # fmt: skip
    assert doc["schema"] == "opsctl.runs.bundle/2"
    assert run_json("models", "list")["schema"] == "opsctl.models.list/1"
    doc = run_json("models", "build", "tiny-llama", "--out", str(tmp_path / "models"))
    assert doc["schema"] == "opsctl.models.build/1"


def test_engram_plan_inspect_clean():
    doc = run_json("engram", "plan", "--config", "deepseek-v4.1-flash", "--shm-size", "64G")
    assert doc["schema"] == "opsctl.engram.plan/2"
    prefix = unique_prefix("schema")
    with shared_table(prefix, mappers=1):
        doc = run_json("engram", "inspect", "--prefix", prefix)
        assert doc["schema"] == "opsctl.engram.inspect/2" and len(doc["tables"]) == 1
    orphan = f"/dev/shm/{prefix}orphan"
    with planting():  # certify's engram check on another worker must not see it
        try:
            Path(orphan).write_bytes(b"\x38" * 64)
            doc = run_json("engram", "clean", "--prefix", prefix, "--min-age", "0")
            assert doc["schema"] == "opsctl.engram.clean/2" and doc["orphans"]
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(orphan)


def test_diag_usage_against_its_stand_in():
    from tests.standins.scoring import stand_in

    with stand_in() as url:
        assert run_json("diag", "usage", url)["schema"] == "opsctl.diag.usage/2"


def test_diag_mm_uuid_against_its_stand_in(tmp_path):
    from tests.standins.mm_uuid import stand_in, write_run_dir

    write_run_dir(tmp_path)
    with stand_in(tmp_path) as url:
        doc = run_json("diag", "mm-uuid", url, "--run", str(tmp_path))
    assert doc["schema"] == "opsctl.diag.mm_uuid/2"


def test_diag_invariance_against_its_stand_in(tmp_path, monkeypatch):
    from tests.standins.completions import completions_server, register_run, write_run_dir

    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path / "home"))
    run_dir = write_run_dir(tmp_path / "home" / "runs" / "r")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a\nb\n")
    with completions_server() as (url, _):
        register_run(run_dir, url)
        doc = run_json("diag", "invariance", url, "--mode", "eager", "--prompts", str(prompts))
    assert doc["schema"] == "opsctl.diag.invariance/3"


def test_status_every_state_and_error_and_version_match_their_schemas():
    import socket

    with StandInFleet(["dead", "notvllm", "unauthorized"]) as f:
        for url, state, code in zip(
            f.urls, ("dead", "unreachable", "unauthorized"), (1, 3, 3), strict=True
        ):
            doc = run_json("status", url, codes=(code,))
            assert doc["state"] == state
            validate(doc)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening: refused
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        doc = run_json("status", url, codes=(3,))
        assert doc["state"] == "unreachable" and doc["error"].startswith("no server answered")
        validate(doc)
        doc = run_json("diag", "usage", url, codes=(3,))
        assert doc["schema"] == "opsctl.error/1" and doc["command"] == "diag usage"
        validate(doc)
    validate(run_json("version"))
