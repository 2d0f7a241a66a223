"""The engine's private $TMPDIR: made for one run, removed only when it is that one."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from opsctl.collectors import engine_tmp


@pytest.fixture
def tmpdir_env(short_tmp, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(short_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    yield short_tmp
    tempfile.tempdir = None


def test_made_in_tmpdir_and_removed_with_what_vllm_left_in_it(tmp_path, tmpdir_env):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    d = engine_tmp.create(run)
    assert d.parent == tmpdir_env and d.name.startswith(engine_tmp.PREFIX)
    env = engine_tmp.engine_env(d)
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(d)
    # torch's compile cache stays where it was (outside the per-engine directory)
    assert not env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(d))
    with socket.socket(socket.AF_UNIX) as s:  # what vLLM leaves: an IPC socket file
        s.bind(str(d / "0b1e8c3e-ipc"))
    (d / "vllm_dist_x").write_text("")
    assert engine_tmp.remove(d, run) is None
    assert list(tmpdir_env.iterdir()) == []
    assert engine_tmp.remove(d, run) is None  # already gone: fine


def test_never_removes_what_it_did_not_make_for_this_run(tmp_path, tmpdir_env):
    run, other = tmp_path / "r1", tmp_path / "r2"
    mine = engine_tmp.create(run)
    assert "another run" in engine_tmp.remove(mine, other)
    assert mine.is_dir()

    foreign = tmpdir_env / f"{engine_tmp.PREFIX}user"  # our prefix, no marker
    foreign.mkdir()
    assert "no opsctl marker" in engine_tmp.remove(foreign, run)
    assert foreign.is_dir()

    plain = tmpdir_env / "data"
    plain.mkdir()
    (plain / engine_tmp.MARKER).write_text(str(run.resolve()))
    assert "not an opsctl engine" in engine_tmp.remove(plain, run)
    assert plain.is_dir()

    link = tmpdir_env / f"{engine_tmp.PREFIX}link"
    os.symlink(mine, link)
    assert "not an opsctl engine" in engine_tmp.remove(link, run)
    assert mine.is_dir() and link.is_symlink()
    assert engine_tmp.remove(None, run) is None


def test_a_tmpdir_too_long_for_vllm_sockets_falls_back_to_slash_tmp(tmp_path, monkeypatch):
    long = tmp_path / ("x" * (engine_tmp.SUN_PATH_MAX - len(str(tmp_path))))
    long.mkdir()
    assert not engine_tmp.fits(str(long)) and engine_tmp.fits("/tmp")
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr(tempfile, "tempdir", None)
    try:
        run = tmp_path / "r1"
        d = engine_tmp.create(run)
        assert d is not None and d.parent == Path("/tmp"), d
        path = str(d / ("u" * engine_tmp.VLLM_SOCKET_NAME))
        with socket.socket(socket.AF_UNIX) as s:  # vLLM's longest socket path binds
            s.bind(path)
        assert engine_tmp.remove(d, run) is None and not d.exists()
    finally:
        tempfile.tempdir = None
