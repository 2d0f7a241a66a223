"""`opsctl models build --out DIR` never deletes what it did not build: only a directory
carrying opsctl's marker file is replaced; anything else at the target path -> exit 2
with the path, nothing deleted, nothing built. A stand-in catalog entry with a trivial
builder keeps this fast (the real builders are tested in test_embedded_models.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl.cli import app
from opsctl.embedded import catalog
from tests.standins.cli_result import error_lines

runner = CliRunner()
NAME = "tiny-fake"


def build_fake(out: Path) -> None:
    (out / "config.json").write_text('{"model_type": "fake"}\n')


@pytest.fixture(autouse=True)
def fake_model(monkeypatch):
    spec = catalog.EmbeddedModel(NAME, "decoder", "stand-in", f"{__name__}:build_fake")
    monkeypatch.setitem(catalog.CATALOG, NAME, spec)
    return spec


def build(out: Path, *args: str):
    return runner.invoke(app, ["models", "build", NAME, "--out", str(out), "--json", *args])


def foreign_dir(out: Path) -> Path:
    d = out / NAME
    d.mkdir(parents=True)
    (d / "precious.txt").write_text("mine")
    return d


@pytest.mark.parametrize("force", [False, True])
def test_foreign_directory_is_never_replaced(tmp_path, force):
    d = foreign_dir(tmp_path)
    r = build(tmp_path, *(["--force"] if force else []))
    assert r.exit_code == 2 and r.stdout == ""
    (line,) = error_lines(r)
    assert str(d) in line and "not built by opsctl" in line
    assert (d / "precious.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [NAME]  # no temp dir left


@pytest.mark.parametrize(
    "marker",
    [
        None,  # no marker
        "not json",
        json.dumps({"name": "other-model", "version": 1}),  # another dir's marker copied in
        json.dumps(["x"]),
    ],
)
def test_missing_or_foreign_marker_refuses(tmp_path, marker):
    d = foreign_dir(tmp_path)
    if marker is not None:
        (d / catalog.MARKER).write_text(marker)
    r = build(tmp_path, "--force")
    assert r.exit_code == 2 and len(error_lines(r)) == 1
    assert (d / "precious.txt").exists()


def test_a_file_or_symlink_at_the_target_is_left_alone(tmp_path):
    (tmp_path / NAME).write_text("a file")
    r = build(tmp_path)
    assert r.exit_code == 2 and (tmp_path / NAME).read_text() == "a file"
    other = tmp_path / "elsewhere"
    other.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / NAME).symlink_to(other)
    r = build(out, "--force")
    assert r.exit_code == 2 and (out / NAME).is_symlink() and other.is_dir()


def test_out_that_is_a_file_is_bad_input(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    r = build(f)
    assert r.exit_code == 2 and len(error_lines(r)) == 1 and f.read_text() == "x"


def test_refuses_before_building_any_of_several(tmp_path, monkeypatch):
    other = catalog.EmbeddedModel("tiny-fake-2", "decoder", "stand-in", f"{__name__}:build_fake")
    monkeypatch.setitem(catalog.CATALOG, other.name, other)
    foreign_dir(tmp_path)
    r = runner.invoke(
        app, ["models", "build", "tiny-fake-2", NAME, "--out", str(tmp_path), "--json"]
    )
    assert r.exit_code == 2
    assert not (tmp_path / "tiny-fake-2").exists()  # nothing built


def test_own_directory_is_rebuilt_and_marked(tmp_path):
    r = build(tmp_path)
    assert r.exit_code == 0, r.stderr
    d = tmp_path / NAME
    marker = json.loads((d / catalog.MARKER).read_text())
    assert marker["name"] == NAME and marker["version"] == 1
    (d / "stale.bin").write_text("old")
    r = build(tmp_path, "--force")
    assert r.exit_code == 0, r.stderr
    assert not (d / "stale.bin").exists() and (d / "config.json").exists()
    assert json.loads(r.stdout)["models"][0]["path"] == str(d)
