"""Active test knobs, as the engine's ledger records them, are a warning on top of a
diag report (``test_knobs`` + first ``warnings`` entry in JSON, a stderr warning above
the human report); an engine without knobs reports ``test_knobs: {}``. Played through
the mm-uuid stand-in (a server plus the run directory its "engine" wrote)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from engine_patches import knobs
from opsctl.cli import app
from opsctl.collectors.ledger import knobs_of
from opsctl.domain.knobs import warning
from tests.standins.mm_uuid import stand_in, write_run_dir

runner = CliRunner()


def arm(run_dir: Path, **armed: str) -> None:
    """Add a second process's ledger record that honoured ``armed`` knobs."""
    record = {"pid": 2, "role": "worker", "time": 2.0, "test_knobs": armed, "patches": []}
    (run_dir / "ledger" / "2.json").write_text(json.dumps(record))


def test_knobs_in_the_ledger_are_a_warning_on_top_of_the_report(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    arm(tmp_path, **{knobs.MM_UUID_REWRITE: "canary-all-0"})
    with stand_in(tmp_path) as url:
        r = runner.invoke(app, ["diag", "mm-uuid", url, "--run", str(tmp_path), "--json"])
        human = runner.invoke(app, ["diag", "mm-uuid", url, "--run", str(tmp_path)])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["test_knobs"] == {knobs.MM_UUID_REWRITE: "canary-all-0"}
    assert doc["warnings"][0].startswith("TEST KNOBS active")
    assert "OPSCTL_MM_UUID_REWRITE=canary-all-0" in doc["warnings"][0]
    assert "warning: TEST KNOBS active" in r.stderr
    assert human.exit_code == 0, human.output
    assert "warning: TEST KNOBS active" in human.stderr


def test_no_knobs_no_warning(tmp_path: Path) -> None:
    write_run_dir(tmp_path)
    arm(tmp_path)  # a process that recorded test_knobs {}
    with stand_in(tmp_path) as url:
        r = runner.invoke(app, ["diag", "mm-uuid", url, "--run", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["test_knobs"] == {} and doc["warnings"] == []
    assert "TEST KNOBS" not in r.stderr


def test_knobs_of_merges_the_processes_of_every_run_and_skips_missing_ones(tmp_path: Path):
    write_run_dir(tmp_path)
    arm(tmp_path, **{knobs.NUDGE: "zebra:3"})
    assert knobs_of([None, tmp_path]) == {knobs.NUDGE: "zebra:3"}
    assert knobs_of([None]) == {}
    assert warning(knobs_of([tmp_path])).startswith("TEST KNOBS active")
    assert "OPSCTL_PROBE_NUDGE=zebra:3" in warning({knobs.NUDGE: "zebra:3"})
    assert warning({}) is None
