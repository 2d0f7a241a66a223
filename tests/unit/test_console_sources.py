"""Where endpoints come from: URLs, the TOML targets file, discovery of opsctl runs and
of vLLM API server processes (listening port through psutil), merging."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from opsctl.console import discovery, targets
from opsctl.console.judge import Target
from opsctl.errors import BadInput


def test_urls_are_normalised_and_bad_ones_refused():
    assert targets.from_urls(["127.0.0.1:8000/"])[0].url == "http://127.0.0.1:8000"
    assert targets.from_urls(["http://h:1"])[0].source == "argument"
    for bad in ("ftp://h:1", "http://", "http://h:99999"):
        with pytest.raises(BadInput):
            targets.from_urls([bad])


def test_targets_file(tmp_path):
    f = tmp_path / "t.toml"
    f.write_text(
        '[[targets]]\nname = "n1"\nurl = "http://10.0.0.5:8000"\napi_key_env = "K1"\n'
        'labels = { node = "n1", role = "decode" }\n[[targets]]\nurl = "10.0.0.6:8000"\n'
    )
    a, b = targets.from_targets_file(f)
    assert (a.name, a.url, a.source, a.api_key_env) == (
        "n1",
        "http://10.0.0.5:8000",
        "targets",
        "K1",
    )
    assert dict(a.labels) == {"node": "n1", "role": "decode"}
    assert b.name == "10.0.0.6:8000"
    f.write_text("[[targets]]\nname = 1 2\n")
    with pytest.raises(BadInput, match="not valid TOML"):
        targets.from_targets_file(f)
    f.write_text('[[targets]]\nname = "x"\n')
    with pytest.raises(BadInput, match="needs a url"):
        targets.from_targets_file(f)
    with pytest.raises(BadInput, match="cannot read"):
        targets.from_targets_file(tmp_path / "missing.toml")


def test_merge_keeps_one_row_per_server_explicit_source_first_local_pid_kept():
    arg = Target("a", "http://localhost:8000", "argument")
    found = Target("pid 5", "http://127.0.0.1:8000", "discovered", pid=5, pid_started=1.0)
    run = Target("run", "http://127.0.0.1:9000", "opsctl-run", pid=7, run_dir="/r")
    proc = Target("pid 7", "http://0.0.0.0:9000", "discovered", pid=7)
    merged = {t.url: t for t in targets.merge([arg], [found, run, proc])}
    assert len(merged) == 2
    assert merged["http://localhost:8000"].source == "argument"
    assert merged["http://localhost:8000"].pid == 5
    assert merged["http://127.0.0.1:9000"].source == "opsctl-run"


@pytest.mark.parametrize(
    ("cmd", "want"),
    [
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--port", "1"], True),
        (["/venv/bin/vllm", "serve", "m"], True),
        (["python", "-m", "vllm.entrypoints.cli.main", "serve", "m"], True),
        (["python", "-m", "vllm.entrypoints.cli.main", "bench"], False),
        (["python", "-c", "from multiprocessing.spawn import spawn_main"], False),
        (["vim", "vllm", "serve"], False),
        ([], False),
    ],
)
def test_api_server_command_lines(cmd, want):
    assert discovery.is_api_server(cmd) is want


def test_listening_port_read_through_psutil():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        me = psutil.Process()
        assert discovery.listening_port(me, []) == port
        assert discovery.listening_port(me, ["--port", str(port)]) == port


def test_a_fake_api_server_process_is_discovered_with_its_port():
    """A process whose argv names vLLM's API module and listens: found with pid + port."""
    code = (
        "import socket,sys,time\ns=socket.socket();s.bind(('127.0.0.1',0));s.listen(1)\n"
        "print(s.getsockname()[1],flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "-m", "vllm.entrypoints.openai.api_server"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(proc.stdout.readline())
        found = [t for t in discovery.discover_processes() if t.pid == proc.pid]
        assert len(found) == 1
        assert found[0].url == f"http://127.0.0.1:{port}" and found[0].source == "discovered"
        state = discovery.local_state(found[0], with_roles=True)
        assert state.alive and state.procs[0].role == "APIServer"
    finally:
        proc.kill()
        proc.wait()
    gone = discovery.local_state(found[0])
    assert not gone.alive and str(proc.pid) in gone.reason


def test_opsctl_runs_live_ones_only(tmp_path):
    me = psutil.Process()

    def run(name: str, **meta) -> None:
        d = tmp_path / name
        d.mkdir()
        (d / "meta.json").write_text(json.dumps({"url": "http://127.0.0.1:8123", **meta}))

    run("live", pid=os.getpid(), pids={str(os.getpid()): me.create_time()}, model="m")
    run("reused", pid=os.getpid(), pids={str(os.getpid()): me.create_time() - 1000})
    run("stopped", pid=os.getpid(), stopped_at=time.time())
    run("dead-owner-gone", pid=999999, owner_pid=999998)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text("{")
    found = discovery.discover_runs(tmp_path)
    assert [t.run_dir.rsplit("/", 1)[1] for t in found] == ["live"]
    t = found[0]
    assert (t.source, t.pid, t.name) == ("opsctl-run", os.getpid(), "m@live")


def test_console_help_and_collectors_import_neither_torch_nor_vllm():
    from tests.unit.test_import_rules import HEAVY, modules_after

    mods = modules_after(
        "from opsctl.__main__ import main\nimport opsctl.console.direct, opsctl.console.report\n"
        "try:\n    main(['console', '--help'])\nexcept SystemExit:\n    pass\n"
    )
    assert "opsctl.commands.console" in mods
    assert not {m for m in mods if m.split(".")[0] in HEAVY}
