"""`opsctl diag lora` on real vLLM 0.32 CPU engines with the embedded seeded adapters.

Engines (each ~20-90 s to start on two cores):

1. tiny-llama served like an operator would (``--lora-modules`` alpha, beta; one LoRA
   slot more than adapters; runtime LoRA loading allowed; the batch and lora probes), for
   the URL paths: the listed adapters pass (library call with typed events, then the
   CLI); three adapters loaded at runtime on its three slots show vLLM 0.32's CPU bug:
   base-model requests batched with LoRA requests get the adapter of the last slot;
2. ``--model tiny-llama --max-loras 3`` with the planted OPSCTL_LORA_SWAP=lm: caught;
3. ``--model tiny-vlm-multi --max-loras 4`` (Idefics3, two images per request): passes,
   LoRA applied in language model, vision tower and connector;
4. the same with OPSCTL_LORA_SWAP=tower (images of two requests encoded with each
   other's adapters): caught, naming the request and its images;
5. ``--model tiny-vlm --max-loras 4 --atol 1e-4`` (BLIP-2, not bitwise batch-invariant on
   CPU): passes, its connector reported
   unsupported (no LoRA-capable layer), never as a pass.
"""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from engine_patches import knobs
from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.cli import app
from opsctl.embedded import lora as built
from opsctl.suite.invariance.judge_calibration import seeded_prompts
from opsctl.suite.lora import run as check
from opsctl.suite.lora.run_plan import PROBES
from tests.conftest import running_engine

pytestmark = pytest.mark.engine

runner = CliRunner()


# the check's default: the engine's gate probe holds a mixed send until all its requests
# arrived (assert_gathered), so the batch forms at once even under a CPU hog (128 tokens
# were needed before the gate, to keep the requests in flight long enough to meet)
MAX_TOKENS = 32


def diag(*args: str):
    r = runner.invoke(app, ["diag", "lora", *args, "--max-tokens", str(MAX_TOKENS), "--json"])
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    return r, doc


def rows(doc: dict) -> dict[int, dict]:
    return {r["index"]: r for r in doc["mixed"]["requests"]}


def swapped_requests(doc: dict) -> set[int]:
    """The mixed requests the OPSCTL_LORA_SWAP knob swapped (its records in the engine)."""
    ids = [rid for s in doc["mixed"]["swaps"] for rid in s["req_ids"]]
    return {int(rid.split("-mix-r")[1].split("-")[0]) for rid in ids}


def assert_gathered(doc: dict) -> None:
    """The engine's gate held the mixed batch until every request had arrived, then
    scheduled it at once: one send was enough (without the gate, under a CPU hog, the
    API server handed the requests over one by one and 6 sends never formed it)."""
    [attempt] = doc["mixed"]["attempts"]
    gathered = attempt["gathered"]
    assert gathered and gathered["why"] == "complete", attempt
    assert gathered["count"] == gathered["size"] == len(doc["mixed"]["requests"])
    assert attempt["batch"]["formed"] is True


@pytest.fixture(scope="module")
def served():
    """tiny-llama with alpha and beta, three LoRA slots, runtime loading allowed."""
    paths = built.ensure("tiny-llama")
    args = ["--enable-lora", "--max-loras", "3", "--max-lora-rank", "8"]
    args += ["--no-enable-prefix-caching", "--lora-modules"]
    args += [f"{n}={p}" for n, p in paths.items()]
    probes = ",".join(sorted(PROBES))  # batch, gate, lora
    env = {"OPSCTL_PROBES": probes, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with running_engine("tiny-llama", extra_args=args, env=env, max_num_seqs=8) as server:
        yield server


def test_listed_adapters_pass_on_tiny_llama(served):
    seen: list[ev.Event] = []
    report = check.run(UrlTarget(served.url), check.Options(max_tokens=MAX_TOKENS), seen.append)
    doc = report.to_dict()
    assert report.verdict == "pass", (report.reasons, doc["mixed"]["requests"])
    assert doc["platform"] == "cpu" and doc["vllm_version"] == "0.32.0"
    assert [a["name"] for a in doc["adapters"]] == ["alpha", "beta"]
    assert [a["parts"] for a in doc["adapters"]] == [["language"], ["language"]]  # marker
    assert [s["verdict"] for s in doc["single"]] == ["pass", "pass"]
    assert all(s["differs_from_base"] == 6 for s in doc["single"])
    assert {r["status"] for r in doc["mixed"]["requests"]} == {"identical"}
    assert_gathered(doc)
    batch = doc["mixed"]["batch"]
    assert (
        batch["source"] == "batch probe" and batch["formed"] and batch["max_adapters_per_step"] == 3
    )
    engine = doc["engine"]
    assert engine["punica_wrapper"] == ["PunicaWrapperCPU"] and engine["max_loras"] == 3
    assert engine["compilation_mode"] == "NONE"
    assert doc["support"][0]["status"] == "applied"
    assert isinstance(seen[0], ev.Started) and isinstance(seen[-1], ev.Finished)
    assert seen[-1].verdict == "pass" and any(isinstance(e, ev.Table) for e in seen)


def test_cli_on_the_server_sweeps_two_seeds_calibrated(served):
    """``--seeds 3,5`` on the served engine (no start of its own): two seeded prompt sets,
    each calibrated on it (CPU: base twice is bitwise, floor 0; alpha and beta differ in
    tokens, so a swap between them is far above the floor)."""
    r, doc = diag(served.url, "--seeds", "3,5")
    assert r.exit_code == 0, r.stderr
    assert doc["schema"] == "opsctl.diag.lora/3" and doc["verdict"] == "pass"
    assert doc["run_dir"] and doc["external"] is True  # a URL, even to an opsctl run
    assert doc["seeds"] == [3, 5] and [s["seed"] for s in doc["sweep"]] == [3, 5]
    assert [s["verdict"] for s in doc["sweep"]] == ["pass", "pass"]
    assert doc["totals"] == {"pass": 2, "fail": 0, "inconclusive": 0}
    assert all(s["floor"] == 0.0 and s["conclusive"] for s in doc["sweep"])
    c = doc["calibration"]
    assert c["bitwise"] and c["floor_runs"] == 6 and c["probes"] == 1  # one adapter pair
    assert c["sensitivity_tokens_differ"] or c["sensitivity"] > 0
    sent = {r["prompt"] for r in doc["mixed"]["requests"]}  # the detailed seed's own prompts
    assert sent == set(seeded_prompts(doc["detail_seed"], 8)[:6])
    assert_gathered(doc)


def test_every_slot_in_use_base_requests_get_the_last_slots_adapter(served, tmp_path):
    """vLLM 0.32 on CPU: its torch LoRA ops gather the stacked weights with index -1 for a
    row without adapter, i.e. the last slot (upstream PR 48421, open). Three adapters
    loaded at runtime fill the three slots: base-model requests batched with them come
    back with one adapter's output; the adapters' own requests stay right."""
    dirs = []
    for i, spec in enumerate(built.adapters_for("tiny-llama")):
        d = tmp_path / ("gamma", "delta")[i]
        d.mkdir()
        built.write(d, "tiny-llama", spec)
        dirs.append(d)
    third = built.AdapterSpec("epsilon", ("language",), 5505, 1.0)
    (tmp_path / "epsilon").mkdir()
    built.write(tmp_path / "epsilon", "tiny-llama", third)
    dirs.append(tmp_path / "epsilon")
    args = [a for d in dirs for a in ("--adapters", str(d))]
    r, doc = diag(served.url, *args)
    assert r.exit_code == 1, r.stderr
    assert doc["loaded_at_runtime"] == ["gamma", "delta", "epsilon"]
    by_index = rows(doc)
    base = [r for r in by_index.values() if r["adapter"] is None]
    assert base and all(r["status"] == "diverged" for r in base)
    # served with the last slot's adapter: wholly (its output is that adapter's) or in
    # the steps it shared with LoRA requests
    got = {r["looks_like"] for r in base} - {None}
    assert len(got) == 1 and got <= {"gamma", "delta", "epsilon"}
    assert all(r["status"] == "identical" for r in by_index.values() if r["adapter"])
    assert any("upstream PR 48421" in x for x in doc["reasons"])
    assert "opsctl: error: diag lora failed" in r.stderr
    listed = httpx.get(f"{served.url}/v1/models").json()["data"]
    assert {m["id"] for m in listed} == {"tiny-llama", "alpha", "beta"}  # unloaded again


def test_planted_lm_swap_is_caught_on_a_started_engine():
    r, doc = diag(
        "--model", "tiny-llama", "--max-loras", "3", "--test-knob", f"{knobs.LORA_SWAP}=lm"
    )
    assert r.exit_code == 1, r.stderr
    assert doc["test_knobs"] == {knobs.LORA_SWAP: "lm"}
    assert doc["warnings"][0].startswith("TEST KNOBS active")
    assert doc["mixed"]["swaps"] and doc["mixed"]["swaps"][0]["scope"] == "lm"
    # exactly the requests the engine swapped diverge (a request swapped in every step it
    # ran comes back with the other request's adapter's output)
    swapped = swapped_requests(doc)
    by_index = rows(doc)
    assert {i for i, row in by_index.items() if row["status"] != "identical"} == swapped
    assert all(by_index[i]["looks_like"] != (by_index[i]["adapter"] or "base") for i in swapped)
    assert any(by_index[i]["adapter"] for i in swapped)
    first = doc["mixed"]["first_divergence"]
    assert first["request"] == min(swapped) and first["images"] == []
    assert doc["engine"]["enforce_eager"] is False and doc["engine"]["compilation_mode"] == "NONE"


def test_vlm_multi_image_passes_with_tower_and_connector_lora():
    report = check.run(EngineSpec("tiny-vlm-multi"), check.Options(max_loras=4))
    doc = report.to_dict()
    assert report.verdict == "pass", (report.reasons, doc["mixed"]["requests"])
    assert doc["images_per_request"] == 2 and doc["platform"] == "cpu"
    assert {p["part"]: p["status"] for p in doc["support"]} == {
        "language": "applied",
        "tower": "applied",
        "connector": "applied",
    }
    engine = doc["engine"]
    assert engine["tower_connector_lora"] is True
    assert engine["wrapped_modules"] == {"language": 8, "tower": 4, "connector": 1}
    assert doc["mixed"]["encoder"]["max_adapters_per_step"] >= 2
    assert all(len(r["images"]) == 2 for r in doc["mixed"]["requests"])


def test_vlm_tower_swap_is_caught_with_the_image():
    r, doc = diag(
        "--model", "tiny-vlm-multi", "--max-loras", "4", "--test-knob", f"{knobs.LORA_SWAP}=tower"
    )
    assert r.exit_code == 1, r.stderr
    swaps = doc["mixed"]["swaps"]
    assert swaps and {s["scope"] for s in swaps} == {"tower"}
    swapped = swapped_requests(doc)
    bad = {i for i, row in rows(doc).items() if row["status"] != "identical"}
    assert bad == swapped
    first = doc["mixed"]["first_divergence"]
    assert first["request"] == min(swapped) and len(first["images"]) == 2


def test_blip2_reports_its_connector_unsupported():
    # BLIP-2 on CPU is not batch-invariant: with the 8 requests gathered into one prefill
    # step every mixed row (the no-adapter ones too) keeps its tokens but its logprobs
    # differ from the request run alone by up to 8.3e-6 (measured, deterministic), so a
    # bitwise comparison fails. The tolerance is given and reported; a swapped adapter or
    # image moves logprobs by far more (the adapters' own effect is checked at 1e-3).
    r, doc = diag("--model", "tiny-vlm", "--max-loras", "4", "--atol", "1e-4")
    assert r.exit_code == 0, r.stderr
    assert doc["verdict"] == "pass" and doc["images_per_request"] == 1
    assert doc["comparison"] == "atol=0.0001"
    assert all(row["tokens_identical"] for row in rows(doc).values())
    assert_gathered(doc)
    support = {p["part"]: p for p in doc["support"]}
    assert support["tower"]["status"] == "applied" and support["tower"]["wrapped_modules"] == 3
    assert support["connector"]["status"] == "unsupported"
    assert support["connector"]["wrapped_modules"] == 0
    assert "no connector module" in support["connector"]["detail"]
