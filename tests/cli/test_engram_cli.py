"""`opsctl engram inspect | plan | clean` through the CLI: exit codes, JSON on stdout,
one clear stderr line for bad input. Tables are real shared /dev/shm tables with their
own prefix (tests/engram_tables.py); no engine."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from engram_tables import deny_fds, planting, shared_table, shm_file, unique_prefix, write_byte
from typer.testing import CliRunner

from opsctl.cli import app
from tests.standins.cli_result import error_lines

runner = CliRunner()
GIB = 1024**3


@pytest.fixture(autouse=True)
def _planting():
    """Every test here may write tables into /dev/shm itself: hold the host lock shared."""
    with planting():
        yield


def invoke(*args):
    return runner.invoke(app, list(args))


def plan_json(*args: str) -> dict:
    """`engram plan --config deepseek-v4.1-flash ARGS --json`: exit 0, its JSON document."""
    r = invoke("engram", "plan", "--config", "deepseek-v4.1-flash", *args, "--json")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_plan_example_json_188_8_gib_per_node():
    doc = plan_json("--tp", "4", "--dp", "2", "--shm-size", "200G")
    assert doc["schema"] == "opsctl.engram.plan/2"
    assert doc["total_bytes"] / GIB == pytest.approx(188.8, abs=0.05)
    assert "total_gib" not in doc  # one name per fact: total_bytes
    assert doc["shm_total_bytes"] == doc["shm_free_bytes"] == 200 * GIB  # --shm-size 200G
    assert not {"shm_total", "shm_free"} & set(doc)
    shared = next(p for p in doc["placements"] if p["name"] == "shared")
    assert shared["per_node_bytes"] == doc["total_bytes"]
    assert shared["per_rank_bytes"] / GIB == pytest.approx(47.2, abs=0.05)
    assert doc["chosen"] == "shared" and doc["fits_shm"] is True


def test_plan_docker_default_shm_falls_back():
    doc = plan_json("--dp", "8", "--shm-size", "64M")
    assert doc["chosen"] == "dp-sharded" and doc["fits_shm"] is False


def test_plan_model_dir_and_rich_output(tmp_path):
    from importlib import resources

    cfg = json.loads(
        (resources.files("opsctl") / "data" / "deepseek-v4.1-flash-engram.json").read_text()
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = invoke("engram", "plan", "--model", str(tmp_path), "--tp", "2")
    assert r.exit_code == 0, r.stderr
    assert "188.8 GiB" in r.stdout and "decision" in r.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        ([], "exactly one"),
        (["--config", "deepseek-v4.1-flash", "--model", "/tmp"], "exactly one"),
        (["--config", "/nonexistent/x.json"], "no such config"),
        (["--config", "deepseek-v4.1-flash", "--shm-size", "lots"], "not a size"),
        (["--config", "deepseek-v4.1-flash", "--tp", "0"], ">= 1"),
        (["--config", "deepseek-v4.1-flash", "--tp", "32"], "without heads"),
        (["--config", "deepseek-v4.1-flash", "--block-size", "0"], "positive"),
        (["--config", "deepseek-v4.1-flash", "--block-size", "-32"], "positive"),
    ],
)
def test_plan_bad_input_exit_2(args, needle):
    r = invoke("engram", "plan", *args)
    assert r.exit_code == 2, r.stdout
    assert r.stdout == ""
    lines = error_lines(r)
    assert len(lines) == 1 and needle in lines[0]


def test_plan_config_without_engram_fields(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    r = invoke("engram", "plan", "--config", str(p))
    assert r.exit_code == 2 and "no Engram fields" in error_lines(r)[0]


def test_plan_default_block_is_vllms_32_and_128_is_an_override(tmp_path):
    from importlib import resources

    cfg = json.loads(
        (resources.files("opsctl") / "data" / "deepseek-v4.1-flash-engram.json").read_text()
    )
    cfg.pop("engram_scale_block_size")  # no opsctl key: the default must give 188.8 GiB
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg))
    doc = json.loads(invoke("engram", "plan", "--config", str(p), "--json").stdout)
    assert doc["spec"]["block"] == 32 and doc["total_bytes"] / GIB == pytest.approx(188.8, abs=0.05)
    assert "vLLM 0.32" in doc["spec"]["block_source"]
    r = invoke("engram", "plan", "--config", str(p), "--block-size", "128", "--json")
    assert json.loads(r.stdout)["total_bytes"] / GIB == pytest.approx(184.54, abs=0.01)


@pytest.mark.parametrize(
    "args",
    [
        ["--verify", "quick"],
        ["--prefix", "psm_"],
        ["--pid", "999999999"],
        ["--block-size", "0"],
        ["--block-size", "-1"],
    ],
)
def test_inspect_bad_input_exit_2(args):
    r = invoke("engram", "inspect", *args)
    assert r.exit_code == 2 and len(error_lines(r)) == 1


def test_inspect_json_ok_then_mismatch_exit_1():
    prefix = unique_prefix("cli")
    with shared_table(prefix, mappers=2, unlink=False) as t:
        write_byte(t.path, 4096 * 256 + 3, 0x7E)  # a scale byte
        t.unlink()
        r = invoke("engram", "inspect", "--prefix", prefix, "--verify", "full", "--json")
        assert r.exit_code == 1
        doc = json.loads(r.stdout)
        assert doc["schema"] == "opsctl.engram.inspect/2" and doc["verdict"] == "fail"
        (tab,) = doc["tables"]
        assert tab["verify"]["first_mismatch"] == {
            "offset": 4096 * 256 + 3,
            "value": 0x7E,
            "expected": 127,
            "region": "scales",
        }
        assert sorted(tab["mapper_pids"]) == sorted(t.pids) and tab["linked"] is False
        assert len(error_lines(r)) == 1 and "not constant-filled" in error_lines(r)[0]
        assert doc["shm"]["total_bytes"] >= doc["shm"]["free_bytes"] > 0
    prefix = unique_prefix("cliok")
    with shared_table(prefix, mappers=2) as t:
        r = invoke("engram", "inspect", "--prefix", prefix, "--json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["tables"][0]["verify"]["status"] == "constant" and doc["exit_code"] == 0
        assert doc["tables"][0]["block_choice"]["block"] == 32
        r = invoke("engram", "inspect", "--prefix", prefix, "--pid", str(t.pids[0]))
        assert r.exit_code == 0 and t.name in r.stdout and "constant" in r.stdout


def test_inspect_exit_1_when_verification_cannot_complete():
    """--block-size 64 on a 32-block table: no layout fits, verification cannot run."""
    prefix = unique_prefix("cliinc")
    with shared_table(prefix, mappers=1):
        r = invoke("engram", "inspect", "--prefix", prefix, "--block-size", "64", "--json")
        assert r.exit_code == 1, r.stderr
        doc = json.loads(r.stdout)
        assert doc["tables"][0]["verify"]["status"] == "unverifiable" and doc["exit_code"] == 1
        assert doc["verdict"] == "fail"
        lines = error_lines(r)
        assert len(lines) == 1 and "could not complete" in lines[0]
        r = invoke("engram", "inspect", "--prefix", prefix, "--verify", "none", "--json")
        assert r.exit_code == 0, r.stderr  # nothing was requested


def test_inspect_pid_filter_does_not_call_other_processes_tables_orphans():
    prefix = unique_prefix("clipid")
    with shared_table(prefix, mappers=1, unlink=False) as t:
        me = str(os.getpid())  # a live process that does not map the table
        r = invoke("engram", "inspect", "--prefix", prefix, "--pid", me, "--json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["tables"][0]["name"] == t.name and doc["tables"][0]["mappers"] == []
        assert "engram.orphan" not in {f["code"] for f in doc["findings"]}
        r = invoke("engram", "inspect", "--prefix", prefix, "--verify", "none", "--json")
        assert "engram.orphan" not in {f["code"] for f in json.loads(r.stdout)["findings"]}


def test_clean_dry_run_then_yes():
    prefix = unique_prefix("clicln")
    with (
        shm_file(f"{prefix}orphan", b"\0" * 100) as orphan,
        shared_table(prefix, mappers=1, unlink=False, suffix="busy") as t,
    ):
        r = invoke("engram", "clean", "--prefix", prefix, "--min-age", "0", "--json")
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["dry_run"] and [o["name"] for o in doc["orphans"]] == [os.path.basename(orphan)]
        assert doc["mapped"] == [t.name] and doc["removed"] == []
        assert os.path.exists(orphan)
        r = invoke("engram", "clean", "--prefix", prefix, "--min-age", "0", "--yes", "--json")
        doc = json.loads(r.stdout)
        if doc["unchecked_pids"]:  # e.g. a sandbox's PID 1 denies even root: refused
            assert r.exit_code == 1 and doc["removed"] == [] and os.path.exists(orphan)
            r = invoke(
                "engram",
                "clean",
                "--prefix",
                prefix,
                "--min-age",
                "0",
                "--yes",
                "--force",
                "--json",
            )
            doc = json.loads(r.stdout)
        assert r.exit_code == 0, r.stderr
        assert doc["removed"] == [os.path.basename(orphan)] and not os.path.exists(orphan)
        assert os.path.exists(t.path)


def test_clean_refuses_while_some_maps_are_unreadable_unless_forced(monkeypatch):
    """A process whose maps cannot be read might map an 'orphan': --yes keeps it and
    exits 1; --yes --force removes it. (Unreadable maps simulated: CI runs as root.)"""
    from opsctl.collectors import shm

    real = shm.scan_mappings

    def scan(*a, **kw):
        got = real(*a, **kw)
        denied = (4242, "permission denied reading /proc/4242/maps: Permission denied")
        return shm.MappingScan(got.taken_at, got.mappings, (*got.errors, denied))

    monkeypatch.setattr(shm, "scan_mappings", scan)
    prefix = unique_prefix("clideny")
    with shm_file(f"{prefix}orphan", b"\0" * 100) as orphan:
        r = invoke("engram", "clean", "--prefix", prefix, "--min-age", "0", "--yes", "--json")
        assert r.exit_code == 1 and os.path.exists(orphan)
        doc = json.loads(r.stdout)
        assert doc["removed"] == [] and doc["kept"] == [os.path.basename(orphan)]
        assert 4242 in doc["unchecked_pids"] and "--force" in doc["refused"]
        assert len(error_lines(r)) == 1 and "could not be read" in error_lines(r)[0]
        r = invoke(
            "engram", "clean", "--prefix", prefix, "--min-age", "0", "--yes", "--force", "--json"
        )
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["removed"] == [os.path.basename(orphan)]
        assert not os.path.exists(orphan)
        r = invoke("engram", "clean", "--prefix", prefix, "--force")
        assert r.exit_code == 2 and len(error_lines(r)) == 1


def test_clean_rejects_foreign_prefix():
    r = invoke("engram", "clean", "--prefix", "psm_", "--yes")
    assert r.exit_code == 2 and len(error_lines(r)) == 1


# ---- in use = mapped OR open; minimum age (issue 9, point 7) ---------------------------------

HOLD_OPEN = r"""
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)  # opened, not (yet) mapped: shm_open before mmap
print("ready", flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def held_open(path: str):
    """A child process holding ``path`` open (not mapped) until the block ends."""
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_OPEN, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().startswith("ready")
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def wait_age(path: str, seconds: float, timeout: float = 30) -> None:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        st = os.stat(path)
        if time.time() - max(st.st_mtime, st.st_ctime) >= seconds:
            return
        time.sleep(0.1)
    raise AssertionError(f"{path} did not age {seconds} s")


def clean_yes(prefix: str, *args: str):
    """clean --yes, forced only where this sandbox makes some process unreadable (the
    refusal itself is tested above)."""
    r = invoke("engram", "clean", "--prefix", prefix, "--yes", "--json", *args)
    if json.loads(r.stdout)["unchecked_pids"]:
        r = invoke("engram", "clean", "--prefix", prefix, "--yes", "--force", "--json", *args)
    return r, json.loads(r.stdout)


def test_clean_keeps_a_table_held_open_but_not_mapped():
    prefix = unique_prefix("cliopen")
    with shm_file(f"{prefix}opened", b"\x38" * 4096) as path, held_open(path) as child:
        r, doc = clean_yes(prefix, "--min-age", "0")
        assert r.exit_code == 0, r.stderr
        assert doc["open"] == [os.path.basename(path)] and doc["mapped"] == []
        assert doc["orphans"] == [] and doc["removed"] == [] and os.path.exists(path)
        assert "open, not mapped" in invoke("engram", "clean", "--prefix", prefix).stdout
        # once the holder is gone, the same file is an orphan and goes
        child.kill()
        child.wait(10)
        r, doc = clean_yes(prefix, "--min-age", "0")
        assert r.exit_code == 0 and doc["removed"] == [os.path.basename(path)]
        assert not os.path.exists(path)


def test_clean_keeps_a_table_held_open_after_unlink_and_relink_by_inode():
    """Matching is by device + inode: a descriptor on an unlinked table ("(deleted)")
    does not hold a new file of the same name."""
    prefix = unique_prefix("cliino")
    with shm_file(f"{prefix}t", b"\x38" * 4096) as path, held_open(path):
        os.unlink(path)
        with open(path, "wb") as fh:  # same name, new inode, nobody holds it
            fh.write(b"\x38" * 4096)
        r, doc = clean_yes(prefix, "--min-age", "0")
        assert r.exit_code == 0 and doc["removed"] == [os.path.basename(path)]


def test_clean_keeps_a_table_younger_than_the_minimum_age_then_removes_it_old():
    prefix = unique_prefix("cliyoung")
    with shm_file(f"{prefix}fresh", b"\x38" * 4096) as path:
        r, doc = clean_yes(prefix)  # default minimum age: 60 s
        assert r.exit_code == 0, r.stderr
        assert doc["min_age_s"] == 60 and doc["orphans"] == [] and doc["removed"] == []
        assert [o["name"] for o in doc["young"]] == [os.path.basename(path)]
        assert os.path.exists(path)
        wait_age(path, 1.0)
        r, doc = clean_yes(prefix, "--min-age", "1s")  # old, unmapped, not open: removed
        assert r.exit_code == 0, r.stderr
        assert doc["removed"] == [os.path.basename(path)] and not os.path.exists(path)


@pytest.mark.parametrize("value", ["soon", "-1", "5w", ""])
def test_clean_bad_min_age_exit_2(value):
    r = invoke("engram", "clean", "--min-age", value)
    assert r.exit_code == 2 and r.stdout == ""
    lines = error_lines(r)
    assert len(lines) == 1 and "--min-age" in lines[0]


def test_clean_refuses_when_some_fds_are_unreadable(monkeypatch):
    """Unreadable /proc/PID/fd counts like unreadable maps: --yes keeps everything."""
    deny_fds(monkeypatch, os.getppid())
    prefix = unique_prefix("clifd")
    with shm_file(f"{prefix}orphan", b"\0" * 100) as orphan:
        r = invoke("engram", "clean", "--prefix", prefix, "--min-age", "0", "--yes", "--json")
        doc = json.loads(r.stdout)
        assert r.exit_code == 1 and os.path.exists(orphan) and doc["removed"] == []
        assert os.getppid() in doc["unchecked_pids"] and "--force" in doc["refused"]


def test_inspect_says_each_finding_once_on_stdout_and_none_on_stderr():
    """stdout carries the result (findings included) once; stderr carries progress only:
    inspect once repeated every finding there as a progress line (issue 23)."""
    prefix = unique_prefix("clionce")
    with shared_table(prefix, mappers=2, unlink=False) as t:
        r = invoke("engram", "inspect", "--prefix", prefix)
        assert r.exit_code == 0, r.stderr
        j = invoke("engram", "inspect", "--prefix", prefix, "--json")
        assert j.exit_code == 0, j.stderr
    # "N process(es) exited during the scan" is about whatever else ran on the machine
    # during that one scan (another test's processes), not about this table
    findings = json.loads(j.stdout)["findings"]
    messages = [f["message"] for f in findings if f["code"] != "engram.process_exited"]
    assert any(t.name in m and "share one copy" in m for m in messages)  # a real finding
    for m in messages:
        assert r.stdout.count(m) == 1, m
        assert m not in r.stderr and m not in j.stderr, m
    assert "[engram inspect] done" in r.stderr  # progress still goes to stderr


def test_inspect_json_names_carry_units_and_unknown_platform_is_null():
    prefix = unique_prefix("cliunits")
    with shared_table(prefix, mappers=2) as t:
        r = invoke("engram", "inspect", "--prefix", prefix, "--verify", "full", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.engram.inspect/2"
    assert set(doc["shm"]) == {"total_bytes", "used_bytes", "free_bytes"}
    (tab,) = doc["tables"]
    assert tab["size_bytes"] == t.total and "size" not in tab
    assert tab["layout"]["total_bytes"] == t.total and "total" not in tab["layout"]
    for m in tab["mappers"]:
        assert m["rss_bytes"] > 0 and m["pss_bytes"] > 0 and not {"rss", "pss"} & set(m)
    v = tab["verify"]
    assert v["checked_bytes"] == t.total and v["duration_s"] > 0 and "seconds" not in v
    # the mappers are test processes, not engines opsctl started: unknown, said apart
    assert doc["platform"] is None and "was started by opsctl" in doc["platform_note"]


@pytest.mark.parametrize(("value", "seconds"), [("30", 30), ("30s", 30), ("5m", 300), ("0", 0)])
def test_clean_min_age_is_a_duration(value, seconds):
    r = invoke("engram", "clean", "--prefix", unique_prefix("cliage"), "--min-age", value, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.engram.clean/2" and doc["min_age_s"] == seconds
    assert "min_age" not in doc


def test_clean_orphan_fields_carry_units():
    prefix = unique_prefix("clifields")
    with shm_file(f"{prefix}orphan", b"\0" * 100):
        r = invoke("engram", "clean", "--prefix", prefix, "--min-age", "0", "--json")
        (o,) = json.loads(r.stdout)["orphans"]
        assert o["size_bytes"] == 100 and o["age_s"] >= 0 and not {"size", "age"} & set(o)


@pytest.mark.parametrize("command", ["inspect", "plan", "clean"])
def test_help_has_examples_exit_codes_and_help_on_every_option(command):
    import click
    import typer.main

    r = invoke("engram", command, "--help")
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    assert f"Examples: opsctl engram {command}" in text and "Exit codes: 0 ok" in text
    group = typer.main.get_command(app).commands["engram"]
    cmd = group.commands[command]
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            assert p.help, f"engram {command} {p.opts} has no help"


SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "schemas"


def validate(doc: dict) -> None:
    """Against the shipped schema named by the document (tests/data/schemas/
    opsctl.<name>-<N>.schema.json, draft-07, as tests/cli/test_json_schemas.py): every field
    known, units in the names, the old names (total_gib, shm_total, size, ...) refused."""
    import jsonschema

    name, _, version = doc["schema"].partition("/")
    schema = json.loads((SCHEMAS / f"{name}-{version}.schema.json").read_text())
    jsonschema.Draft7Validator(schema).validate(doc)


def test_every_engram_document_matches_its_shipped_schema():
    import jsonschema

    plan = json.loads(invoke("engram", "plan", "--config", "deepseek-v4.1-flash", "--json").stdout)
    validate(plan)
    with pytest.raises(jsonschema.ValidationError):
        validate({**plan, "total_gib": 188.8})  # one name per fact
    prefix = unique_prefix("clischema")
    orphan = f"/dev/shm/{prefix}orphan"
    try:
        with shared_table(prefix, mappers=2, unlink=False):
            with open(orphan, "wb") as fh:
                fh.write(b"\0" * 100)
            args = ("--prefix", prefix, "--json")
            inspect = json.loads(invoke("engram", "inspect", *args).stdout)
            clean = json.loads(invoke("engram", "clean", "--min-age", "0", *args).stdout)
    finally:
        if os.path.exists(orphan):
            os.unlink(orphan)
    assert clean["orphans"] and clean["mapped"]
    assert inspect["tables"] and inspect["tables"][0]["mappers"]
    validate(inspect)
    validate(clean)
    old = {**inspect, "shm": {"total": 1, "used": 0, "free": 1}}
    with pytest.raises(jsonschema.ValidationError):
        validate(old)
    with pytest.raises(jsonschema.ValidationError):
        validate({**inspect, "platform": "unknown (no process maps a table)"})  # prose
