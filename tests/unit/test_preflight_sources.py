"""The preflight end to end on a wheel made here from the installed vLLM's own sources
(no download): edits to its code show up as the verdicts an operator would read, and
the release's version comes from the wheel's METADATA."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from opsctl.checks import preflight
from opsctl.checks.report import FAIL
from opsctl.collectors.vllm_sources import InstalledSources, WheelSources, open_sources
from opsctl.domain import preflight as D

SCHED = "vllm.v1.core.sched.scheduler"
CORE = "vllm.v1.engine.core"
RUNNER = "vllm.v1.worker.gpu_model_runner"


def make_wheel(tmp_path: Path, version: str, edit) -> Path:
    installed = InstalledSources()
    modules = {D.split(s)[0] for p in preflight._patches() for s in (*p.symbols, *p.watch)}
    path = tmp_path / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
        z.writestr("vllm/__init__.py", "")
        for module in sorted(modules):
            text = installed.read(module)
            if text is not None:
                z.writestr(D.module_paths(module)[0], edit(module, text))
    return path


def edit(module: str, text: str) -> str:
    if module == SCHED:  # the fix lands upstream: no single-group-only failure path
        text = text.replace("with multiple KV cache groups", "with several groups handled")
        text = text.replace("(req_block_ids,) =", "req_block_ids, *_ =")
    if module == CORE:  # a probe's target disappears
        text = text.replace("def preprocess_add_request(", "def preprocess_request_renamed(")
    if module == RUNNER:  # a probe's target changes
        text = text.replace("def _sample(\n", "def _sample(  # changed\n", 1)
    return text


@pytest.fixture(scope="module")
def doc(tmp_path_factory) -> dict:
    wheel = make_wheel(tmp_path_factory.mktemp("wheel"), "0.99.0", edit)
    return preflight.run(wheel).to_dict()


def by_name(doc: dict) -> dict[str, dict]:
    return {p["name"]: p for p in doc["patches"]}


def test_version_from_metadata_and_unverified_note(doc):
    assert doc["vllm_version"] == "0.99.0" and doc["source"]["kind"] == "wheel"
    assert {p["note"] for p in doc["patches"]} == {"unverified on 0.99.0"}


def test_edits_become_verdicts(doc):
    patches = by_name(doc)
    kv = patches["kv_hybrid_recompute"]
    assert kv["upstream"] is True and kv["verdict"] == "upstream"
    mm = patches["mm_uuid_probe"]
    assert mm["verdict"] == "missing" and mm["targets"][0]["exists"] is False
    assert any(
        "preprocess_request_renamed (new)" in n for n in mm["changed_around"][f"{CORE}:EngineCore"]
    )
    batch = patches["batch_probe"]
    sample = batch["targets"][0]
    assert batch["verdict"] == "changed" and sample["unchanged"] is False
    assert "+def _sample(  # changed" in sample["diff"]["excerpt"]  # the verified text is at hand
    assert patches["engine_info_probe"]["verdict"] == "unchanged"
    assert doc["verdict"] == FAIL  # a target is missing


def test_without_recorded_hashes_nothing_is_claimed(tmp_path):
    wheel = make_wheel(tmp_path, "0.98.0", lambda m, t: t)
    doc = preflight.run(wheel, preflight.Options(hashes=tmp_path / "none.json")).to_dict()
    assert {p["unchanged"] for p in doc["patches"]} == {None}
    assert doc["verdict"] == "unverified" and doc["verified_releases"] == []


def test_package_modules_and_absent_modules(tmp_path):
    path = tmp_path / "vllm-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr("vllm/pkg/__init__.py", "def f():\n    return 1\n")
    reader = open_sources(str(path))
    assert isinstance(reader, WheelSources) and reader.version is None
    assert D.extract(reader.read("vllm.pkg"), "f") == "def f():\n    return 1\n"
    assert reader.read("vllm.missing") is None


def test_a_reader_beside_a_download_never_takes_the_half_written_wheel(tmp_path, monkeypatch):
    """fetch_wheel's download lands whole: while pip is still writing, another reader
    of the cache (a second opsctl, a test on another worker) finds no wheel and would
    download its own, never a half-written file (seen: a fresh clone's two fast-tier
    halves, one reading 0.33.0's wheel while the other still fetched it)."""
    from opsctl.collectors import vllm_sources

    cache = tmp_path / "wheels"
    whole = make_wheel(tmp_path, "0.33.0", lambda _m, text: text).read_bytes()
    seen: list[object] = []

    def pip_download(cmd, **_kw):  # writes the wheel where -d says, in two halves
        dest = Path(cmd[cmd.index("-d") + 1]) / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
        with open(dest, "wb") as f:
            f.write(whole[: len(whole) // 2])
            f.flush()
            seen.append(vllm_sources.cached_wheel("0.33.0", cache))  # the reader beside
            f.write(whole[len(whole) // 2 :])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(vllm_sources.subprocess, "run", pip_download)
    got = vllm_sources.fetch_wheel("0.33.0", cache)
    assert seen == [None]  # mid-download the cache held no wheel
    assert got == cache / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert got.read_bytes() == whole and WheelSources(got).version == "0.33.0"
    assert [p.name for p in cache.iterdir()] == [got.name]  # the private directory is gone
