"""Tailing a server log (opsctl.console.logsource) with real vLLM 0.32 server logs
(tests/data/serverlogs) replayed by appending to a file: the load phase and decisive
lines as they arrive, rotation (a new file under the name), truncation, a missing file
as a reason, a big file read from its end only; the --log option and the targets
file's ``log`` key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opsctl.console import logsource, targets
from opsctl.console.judge import Target
from opsctl.console.logsource import LoggedSource, LogTail, parse_log_option
from opsctl.console.source import SourceDefaults
from opsctl.errors import BadInput

DATA = Path(__file__).resolve().parents[1] / "data/serverlogs"
HEALTHY = (DATA / "vllm-0.32-tiny-llama-healthy.log").read_bytes()
DEATH = (DATA / "vllm-0.32-no-such-arch-death.log").read_bytes()
ARCH = "Model architectures ['NoSuchArchForCausalLM'] are not supported"


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as fh:
        fh.write(data)


def test_replayed_start_shows_phases_as_they_arrive(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    tail = LogTail(str(log))
    assert tail.read().load_phase is None
    lines = HEALTHY.splitlines(keepends=True)
    seen = []
    for i in range(0, len(lines), 10):  # vLLM writes it in bursts
        append(log, b"".join(lines[i : i + 10]))
        f = tail.read()
        if f.load_phase and (not seen or seen[-1] != f.load_phase):
            seen.append(f.load_phase)
    assert seen[-1] == "ready" and len(seen) >= 3, seen
    assert f.decisive_lines == () and f.reason is None and f.tail
    assert not any('"GET /metrics' in line for line in f.tail)
    assert f.size_bytes == len(HEALTHY) == f.read_bytes


def test_death_then_rotation_then_truncation(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(DEATH)
    tail = LogTail(str(log))
    f = tail.read()
    assert f.decisive_lines and ARCH in f.decisive_lines[-1]
    # logrotate: moved away, a new file created under the name
    os.rename(log, tmp_path / "server.log.1")
    gone = tail.read()
    assert gone.reason == "log file not found" and gone.decisive_lines == ()
    log.write_bytes(HEALTHY[:4000])
    f = tail.read()
    assert f.reason is None and f.rotations == 1 and f.decisive_lines == ()
    # copytruncate: the same file cut to zero, then written again
    with log.open("r+b") as fh:
        fh.truncate(0)
    append(log, DEATH[:200])
    f = tail.read()
    assert f.rotations == 2 and f.read_bytes == 200
    append(log, DEATH[200:])
    assert ARCH in tail.read().decisive_lines[-1]


def test_replaced_file_same_size_is_a_rotation(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(DEATH)
    tail = LogTail(str(log))
    assert tail.read().decisive_lines
    new = tmp_path / "new.log"
    new.write_bytes(HEALTHY[: len(DEATH)])
    os.replace(new, log)  # another inode under the name
    f = tail.read()
    assert f.rotations == 1 and f.decisive_lines == ()


def test_big_file_read_from_its_end_only(tmp_path):
    log = tmp_path / "server.log"
    filler = b"(APIServer pid=1) INFO 12-02 22:29:14 [x.py:1] filler line\n" * 40_000
    log.write_bytes(DEATH + filler + DEATH)  # about 2.4 MB
    tail = LogTail(str(log), window=64 * 1024)
    f = tail.read()
    assert f.read_bytes <= 64 * 1024 and f.size_bytes == log.stat().st_size
    assert ARCH in f.decisive_lines[-1]  # the last death, within the end
    # more than a window appended between reads: only its end is taken
    append(log, filler + b"ValueError: the newest failure\n")
    f = tail.read()
    assert f.read_bytes <= 64 * 1024 and f.decisive_lines[-1] == "ValueError: the newest failure"


def test_missing_and_unreadable_are_reasons(tmp_path):
    f = LogTail(str(tmp_path / "nope.log")).read()
    assert f.reason == "log file not found" and f.tail == () and f.size_bytes is None
    d = tmp_path / "a-dir"
    d.mkdir()
    f = LogTail(str(d)).read()
    assert f.reason and f.reason.startswith("cannot read it")


def test_log_option_and_targets_file(tmp_path):
    assert parse_log_option("127.0.0.1:8000=/var/log/v.log") == (
        "http://127.0.0.1:8000", "/var/log/v.log",
    )  # fmt: skip
    for bad in ("http://127.0.0.1:8000", "=/x", "http://127.0.0.1:8000="):
        with pytest.raises(BadInput):
            parse_log_option(bad)
    tf = tmp_path / "targets.toml"
    tf.write_text(
        '[[targets]]\nurl = "http://10.0.0.5:8000"\nlog = "logs/node1.log"\n'
        '[[targets]]\nurl = "http://10.0.0.6:8000"\n'
    )
    a, b = targets.from_targets_file(tf)
    assert a.log_file == str(tmp_path / "logs/node1.log") and b.log_file is None
    tf.write_text('[[targets]]\nurl = "http://10.0.0.5:8000"\nlog = 5\n')
    with pytest.raises(BadInput, match="log must be a file path"):
        targets.from_targets_file(tf)


class _Source(SourceDefaults):
    def __init__(self, views):
        from opsctl.console.judge import FleetSnapshot

        self.snap = FleetSnapshot(0.0, tuple(views), 1.0)

    def collect(self):
        return self.snap


def _view(target: Target, state: str, reason: str | None):
    from opsctl.console.judge import EndpointView, EngineInfo, Figures

    return EndpointView(target, state, reason, Figures(), EngineInfo(), None, None, None,
                        None, 0, 0, None)  # fmt: skip


def test_logged_source_adds_facts_and_the_death_lines_to_a_dead_reason(tmp_path, monkeypatch):
    log = tmp_path / "server.log"
    log.write_bytes(DEATH)
    dead = Target("a", "http://127.0.0.1:1", "argument")
    other = Target("b", "http://127.0.0.1:2", "targets", log_file=str(tmp_path / "none.log"))
    plain = Target("c", "http://127.0.0.1:3", "argument")
    src = LoggedSource(
        _Source(
            [
                _view(dead, "unreachable", "connection refused"),
                _view(other, "ready", None),
                _view(plain, "ready", None),
            ]
        ),
        {"http://localhost:1": str(log)},  # same server, another spelling
    )
    a, b, c = src.collect().endpoints
    assert a.log is not None and ARCH in a.log.decisive_lines[-1]
    assert a.reason is not None and a.reason.startswith("connection refused; log: ")
    assert b.log is not None and b.log.reason == "log file not found" and b.reason is None
    assert c.log is None
    # read again only after READ_EVERY_S: the tail is not re-read on every collect
    monkeypatch.setattr(logsource, "READ_EVERY_S", 3600.0)
    append(log, b"ValueError: later\n")
    assert src.collect().endpoints[0].log.decisive_lines[-1] != "ValueError: later"
    monkeypatch.setattr(logsource, "READ_EVERY_S", 0.0)
    assert src.collect().endpoints[0].log.decisive_lines[-1] == "ValueError: later"


def test_no_log_no_change():
    src = _Source([_view(Target("c", "http://127.0.0.1:3", "argument"), "ready", None)])
    assert LoggedSource(src).collect() is src.snap
