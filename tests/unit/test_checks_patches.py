"""opsctl.checks.patches called directly (no CLI): the ledger of a run directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opsctl.checks import patches
from opsctl.errors import BadInput


def write_ledger(run_dir: Path, pid: int, t: float) -> None:
    (run_dir / "ledger").mkdir(parents=True, exist_ok=True)
    record = {
        "pid": pid,
        "role": "engine_core",
        "time": t,
        "vllm_version": "0.32.0",
        "patches": [{"name": "engine_info_probe", "status": "applied", "detail": "ok\nmore"}],
    }
    (run_dir / "ledger" / f"{pid}.json").write_text(json.dumps(record))


def test_run_dir_ledger_records(tmp_path):
    write_ledger(tmp_path, 12, 2.0)
    write_ledger(tmp_path, 11, 1.0)
    report = patches.run(patches.Options(run_dir=tmp_path))
    doc = report.to_dict()
    assert report.verdict == "pass" and doc["schema"] == "opsctl.patches/1"
    assert doc["run_dir"] == str(tmp_path) and [p["pid"] for p in doc["processes"]] == [11, 12]


def test_newest_run_by_default_and_bad_input(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    write_ledger(old, 1, 1.0)
    write_ledger(new, 2, 1.0)
    os.utime(old, (1, 1))
    assert patches.run(patches.Options(runs_root=tmp_path)).to_dict()["run_dir"] == str(new)
    with pytest.raises(BadInput, match="does not exist"):
        patches.run(patches.Options(run_dir=tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="no patch ledger"):
        patches.run(patches.Options(run_dir=tmp_path / "empty"))
    with pytest.raises(BadInput, match="no run directory with a ledger"):
        patches.run(patches.Options(runs_root=tmp_path / "empty"))
