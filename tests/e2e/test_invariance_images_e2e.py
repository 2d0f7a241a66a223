"""`opsctl diag invariance` with images on a real vLLM CPU engine: tiny-vlm-multi
(Idefics3, several images per prompt, real seeded weights) in vLLM's default execution
mode (vLLM PR 56528's vision-language case). One engine for the module, started by the
check itself through a module-scoped EngineSession from the spec
``EngineSpec("tiny-vlm-multi", knobs=nudge)``: the check adds the isolating settings
(prefix caching off, ``--mm-processor-cache-gb 0``, VLLM_USE_FLASHINFER_SAMPLER=0), the
image limit and the batch + mm_uuid probes; the test-only nudge touches output position
3 of a request whose prompt contains "zebra", only when it is batched with others.

- the default prompts (no zebra) with 1, 2, 3, 4, 1, ... images each: every image
  reached the engine core (with its uuid) and the vision encoder, BS=8 formed one batch,
  the mm processor cache reads back 0, tokens and logprobs bitwise equal -> pass;
- the nudge caught on an image request: prompt 5 (2 images) diverges at position 3;
- the same engine checked by URL through the CLI (JSON and the human header).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engine_patches import knobs
from engine_patches.registry import platform_name
from opsctl.checks import events as ev
from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec
from opsctl.cli import app
from opsctl.collectors.ledger import read_events
from opsctl.suite.invariance import run as check

pytestmark = pytest.mark.engine

MODEL = "tiny-vlm-multi"
MARKER, NUDGE_POS, PLANTED = "zebra", 3, 5
SPEC = EngineSpec(MODEL, knobs=((knobs.NUDGE, f"{MARKER}:{NUDGE_POS}"),), timeout=600)
PLANTED_PROMPTS = tuple(
    "a zebra walks into the engine" if i == PLANTED else p
    for i, p in enumerate(check.DEFAULT_PROMPTS)
)
PER_PROMPT = [1, 2, 3, 4, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def session():
    with EngineSession() as s:
        yield s


@pytest.fixture(scope="module")
def passing(session):
    seen: list[ev.Event] = []
    report = check.run(SPEC, check.Options(tag="img-pass"), seen.append, session)
    return report, seen


def test_images_reach_the_engine_and_bs1_equals_bsn(passing, session):
    report, seen = passing
    doc = report.to_dict()
    (run,) = doc["runs"]
    assert report.verdict == "pass", (report.reasons, run["warnings"])
    assert doc["images_per_prompt"] == 4 and doc["batch_via"] == "requests"
    assert doc["platform"] == run["platform"] == platform_name()  # asked of vLLM, not assumed
    assert doc["vllm_version"] == run["vllm_version"] and run["vllm_version"]
    im = run["images"]
    assert im["per_prompt"] == PER_PROMPT and im["total"] == 20 and im["reached"] is True
    assert im["received"] == {"BS=1": PER_PROMPT, "BS=N": PER_PROMPT}
    assert im["encoded"] == {"BS=1": PER_PROMPT, "BS=N": PER_PROMPT}
    assert im["identifiers_matched"] == 40  # every image arrived with the uuid it was sent with
    assert im["encoder_max_batch"] >= 2  # images of several prompts ran the tower together
    batch = run["batch"]
    assert batch["source"] == "batch probe" and batch["formed"] is True
    assert batch["max_batch"] >= 2 and batch["alone"] == [] and batch["bs1_max_shared"] == 1
    # the engine's gate held each group of N image requests until all had arrived
    groups = -(-doc["prompts"] // doc["batch_size"])
    assert batch["gathered"] == {"complete": groups, "timeout": 0} and batch["attempts"] == 1
    status = {s["name"]: (s["status"], s["seen"]) for s in run["settings"]}
    assert status["mm processor cache"] == ("verified", "0.0 GiB")
    assert status["prefix caching"] == ("verified", "False")
    assert status["execution mode"][0] == "verified"
    assert run["execution"]["enforce_eager"] is False  # vLLM's default mode
    assert all(p["status"] == "identical" for p in run["prompts"]), run["prompts"]
    assert [p["images"] for p in run["prompts"]] == PER_PROMPT
    assert any("TEST NUDGE" in w for w in run["warnings"])  # armed, but no prompt matched
    (start,) = session.starts
    args = start.spec.extra_args
    assert args[args.index("--limit-mm-per-prompt") + 1] == json.dumps({"image": 4})
    assert start.spec.probes >= {"batch", "mm_uuid"}
    phases = [e.name for e in seen if isinstance(e, ev.Phase)]
    assert "default: BS=1: 8 prompts with 20 images one at a time" in phases


def test_nudge_on_an_image_request_is_caught(passing, session):
    options = check.Options(prompts=PLANTED_PROMPTS, tag="img-nudge")
    report = check.run(SPEC, options, ev.ignore, session)
    assert len(session.starts) == 1  # the same engine served both calls
    (run,) = report.runs
    assert report.verdict == "fail" and run["images"]["reached"] is True
    bad = [p for p in run["prompts"] if p["status"] != "identical"]
    assert [p["index"] for p in bad] == [PLANTED], run["prompts"]
    (p,) = bad
    assert p["images"] == PER_PROMPT[PLANTED] and p["status"] == "diverged"
    d = p["first_divergence"]
    assert d["position"] == NUDGE_POS and d["kind"] == "logprob"
    assert d["token_alone"] == d["token_batched"]
    assert f"[default] prompt {PLANTED}: first divergence at position {NUDGE_POS} (logprob)" in (
        report.reasons
    )
    nudges = [
        e for e in read_events(session.starts[0].live.run_dir, "batch") if e["event"] == "nudge"
    ]
    assert any("img-nudge" in n["req_id"] and f"-p{PLANTED}-" in n["req_id"] for n in nudges)
    assert all(n["num_reqs"] >= 2 for n in nudges)


def test_the_same_engine_by_url_through_the_cli(passing, session):
    url = session.starts[0].live.url
    runner = CliRunner()
    r = runner.invoke(app, ["diag", "invariance", url, "--json"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    (run,) = doc["runs"]
    assert run["external"] is True and run["run_dir"]  # found by URL: the engine's records
    assert run["images"]["reached"] is True and run["images"]["total"] == 20
    assert doc["platform"] == platform_name()
    human = runner.invoke(app, ["diag", "invariance", url])
    assert human.exit_code == 0, human.stderr
    first = human.stdout.splitlines()[0]
    assert first.startswith(f"diag invariance {MODEL} on vLLM {doc['vllm_version']}")
    assert f"platform {doc['platform']}" in first
    assert "images reached the engine" in human.stdout
