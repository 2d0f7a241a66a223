"""`opsctl.suite.invariance.run.run` with images, called directly against the completions
stand-in playing a vision-language server (tests/standins/completions.py): prompts carry
1..m different images through /v1/chat/completions, the engine's records (mm_uuid probe,
batch-probe steps and encoder calls) show they arrived, the usage cross-check stands in
without probes, and a server that ignores images fails closed. The engine specs the
check asks for on tiny-vlm / tiny-vlm-multi, and the refusals. Real engine:
tests/e2e/test_invariance_images_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.domain import platform as plat
from opsctl.errors import BadInput
from opsctl.suite.invariance import run as check
from opsctl.suite.invariance.judge_images import PROBES_SOURCE, USAGE_SOURCE
from tests.standins.completions import (
    ENGINE_INFO,
    IMAGE_TOKENS,
    Behaviour,
    completions_server,
    register_run,
    write_run_dir,
)

PROMPTS = ("alpha beta", "a zebra crossing", "gamma delta", "epsilon")
MM_INFO = {
    **ENGINE_INFO,
    "multimodal": True,
    "mm_processor_cache_gb": 0.0,
    "limit_mm_per_prompt": {"image": 3},
}
MM_PROBE = [{"name": "mm_uuid_probe", "status": "applied", "detail": ""}]


def options(**kw) -> check.Options:
    return check.Options(**{"prompts": PROMPTS, "max_tokens": 4, "logprobs": 2, **kw})


def vlm_run_dir(home: Path, info: dict | None = None) -> Path:
    return write_run_dir(home / "runs" / "vlm", info=info or MM_INFO, patches=MM_PROBE)


def images_of(body: dict) -> list[str]:
    return [p["image_url"]["url"] for p in body["messages"][0]["content"] if "image_url" in p]


def test_images_reach_the_engine_and_the_batch_compares(home):
    run_dir = vlm_run_dir(home)
    b = Behaviour(run_dir=run_dir, hold=0.1)
    seen: list[ev.Event] = []
    with completions_server(b) as (url, _):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options(mode="eager", tag="im"), seen.append)
    assert report.verdict == "pass", report.reasons
    doc = report.to_dict()
    (run,) = doc["runs"]
    assert doc["images_per_prompt"] == 3 and doc["batch_via"] == "requests"
    im = run["images"]
    assert im["per_prompt"] == [1, 2, 3, 1] and im["total"] == 7 and im["reached"] is True
    assert im["source"] == PROBES_SOURCE and im["endpoint"] == "/v1/chat/completions"
    assert im["received"] == im["encoded"] == {"BS=1": [1, 2, 3, 1], "BS=N": [1, 2, 3, 1]}
    assert im["identifiers_matched"] == 14 and im["encoder_max_batch"] == 4
    assert [p["images"] for p in run["prompts"]] == [1, 2, 3, 1]
    assert run["batch"]["formed"] is True and run["batch"]["via"] == "requests"
    status = {s["name"]: (s["status"], s["seen"]) for s in run["settings"]}
    assert status["mm processor cache"] == ("verified", "0.0 GiB")
    # 14 chat requests: BS=1 (4), its control (4, the noise floor), 2 probes (the first
    # prompts with words more, their own images: the sensitivity) and BS=N (4). Each
    # prompt's images are the same ones in every phase, and no two prompts share an image;
    # every image went with a uuid naming its request
    assert len(b.chats) == 14 and not b.bodies[1:]  # only the refusal probe used completions
    by_prompt = [images_of(c) for c in b.chats[:4]]
    assert [images_of(c) for c in b.chats[4:8]] == by_prompt  # the control: the same again
    assert [images_of(c) for c in b.chats[8:10]] == by_prompt[:2]  # the probes
    assert sorted(map(sorted, by_prompt)) == sorted(map(sorted, map(images_of, b.chats[10:])))
    assert run["calibration"]["floor"] == 0.0 and run["calibration"]["conclusive"]
    flat = [u for urls in by_prompt for u in urls]
    assert len(set(flat)) == len(flat) == 7
    uuids = [p["uuid"] for p in b.chats[0]["messages"][0]["content"] if "uuid" in p]
    assert uuids == [f"{b.chats[0]['request_id']}-img0"]
    phases = [e.name for e in seen if isinstance(e, ev.Phase)]
    assert "eager: BS=1: 4 prompts with 7 images one at a time" in phases


def test_a_server_that_ignores_images_fails_closed(home):
    run_dir = vlm_run_dir(home)
    with completions_server(Behaviour(run_dir=run_dir, hold=0.1, drop_images=True)) as (url, _):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options())
    assert report.verdict == "fail"
    run = report.runs[0]
    assert run["images"]["reached"] is False
    assert run["images"]["received"]["BS=1"] == [None] * 4
    assert any(
        r.endswith(
            "images did not reach the engine: BS=1 prompt 0: no engine record of "
            "its request (1 image(s) sent)"
        )
        for r in report.reasons
    )
    assert all(p["status"] == "identical" for p in run["prompts"])  # tokens alone pass


def test_without_probes_the_token_counts_show_the_images(home):
    with completions_server(Behaviour(model="tiny-vlm-multi", hold=0.05)) as (url, _):
        report = check.run(UrlTarget(url), options())
    run = report.runs[0]
    assert report.verdict == "pass" and run["images"]["source"] == USAGE_SOURCE
    counts = [n * IMAGE_TOKENS for n in (1, 2, 3, 4)]
    assert run["images"]["image_tokens"] == {"BS=1": counts, "BS=N": counts}
    assert any("token counts only" in w for w in run["warnings"])
    assert run["platform"] is None and run["platform_note"] == plat.NOT_STARTED_NOTE
    with completions_server(Behaviour(model="tiny-vlm-multi", drop_images=True)) as (url, _):
        report = check.run(UrlTarget(url), options())
    assert report.verdict == "fail"
    assert any("0 image token(s) counted for 1 image(s)" in r for r in report.reasons)


def test_planted_divergence_of_an_image_request_is_found(home):
    run_dir = vlm_run_dir(home)
    b = Behaviour(run_dir=run_dir, hold=0.1, diverge=("zebra", 2, 4.77e-7))
    with completions_server(b) as (url, _):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options())
    assert report.verdict == "fail"
    run = report.runs[0]
    p = run["prompts"][1]
    assert (p["status"], p["images"]) == ("diverged", 2)
    assert p["first_divergence"]["position"] == 2 and p["first_divergence"]["kind"] == "logprob"
    assert "prompt 1: first divergence at position 2 (logprob)" in run["summary"]["reasons"]


def test_an_engine_without_the_mm_cache_setting_fails(home):
    info = {k: v for k, v in MM_INFO.items() if k != "mm_processor_cache_gb"}
    run_dir = vlm_run_dir(home, info)
    with completions_server(Behaviour(run_dir=run_dir, hold=0.05)) as (url, _):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options())
    assert report.verdict == "fail"
    assert any(
        "mm processor cache: wanted 0 GiB, engine has not recorded" in r for r in report.reasons
    )


def test_refusals(home):
    vlm = completions_server(Behaviour(model="tiny-vlm-multi"))
    with vlm as (url, _), pytest.raises(BadInput, match="--batch-via list"):
        check.run(UrlTarget(url), options(batch_via="list"))
    text = completions_server()  # a text-only model asked for images
    with text as (url, _), pytest.raises(BadInput, match="not a vision-language model"):
        check.run(UrlTarget(url), options(images=2))
    with pytest.raises(BadInput, match="not a vision-language model"):
        check.plan(EngineSpec("tiny-llama"), options(images=1))
    with pytest.raises(BadInput, match="--batch-via list"):
        check.plan(EngineSpec("tiny-vlm"), options(batch_via="list"))
    with pytest.raises(BadInput, match="--images"):
        options(images=-1)


def test_engine_specs_for_the_vlms():
    ((_, multi),) = check.plan(EngineSpec("tiny-vlm-multi"), options(mode="eager"))
    assert isinstance(multi, EngineSpec)
    args = multi.extra_args
    assert args[args.index("--limit-mm-per-prompt") + 1] == json.dumps({"image": 4})
    assert "--mm-processor-cache-gb" in args and multi.probes == {"batch", "gate", "mm_uuid"}
    assert check.isolated_spec(multi, "eager", options()) == multi  # idempotent
    two = check.isolated_spec(EngineSpec("tiny-vlm-multi"), "eager", options(images=2))
    assert json.dumps({"image": 2}) in two.extra_args
    ((_, single),) = check.plan(EngineSpec("tiny-vlm"), options())
    assert "--limit-mm-per-prompt" not in single.extra_args  # BLIP-2: one image per prompt
    assert single.probes == {"batch", "gate", "mm_uuid"}
    ((_, text),) = check.plan(EngineSpec("tiny-vlm"), options(images=0))
    assert text.probes == {"batch", "gate"}
    ((_, llama),) = check.plan(EngineSpec("tiny-llama"), options())
    assert llama.probes == {"batch", "gate"} and "--limit-mm-per-prompt" not in llama.extra_args


def test_bs_n_is_sent_again_when_its_requests_reached_the_engine_one_by_one(home):
    """The first BS=N attempt runs every request alone (as when a busy API server hands
    image requests over one after another): the check sends the phase again under a
    fresh tag, judges the attempt that batched, and says so."""
    run_dir = vlm_run_dir(home)
    b = Behaviour(run_dir=run_dir, hold=0.1, solo=14)  # BS=1, control, probes, attempt 1
    seen: list[ev.Event] = []
    with completions_server(b) as (url, _):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options(tag="re"), seen.append)
    assert report.verdict == "pass", report.reasons
    run = report.runs[0]
    assert run["batch"]["attempts"] == 2 and run["batch"]["alone"] == []
    assert run["images"]["received"]["BS=N"] == [1, 2, 3, 1]  # the judged attempt's records
    assert any("was sent 2 times" in w for w in run["warnings"])
    assert len(b.chats) == 18  # BS=1 (4), its control (4), the probes (2), 2 attempts of 4
    assert any(
        isinstance(e, ev.Log) and "attempt 1: prompt(s) [0, 1, 2, 3] ran alone" in e.text
        for e in seen
    )


def test_a_batch_that_never_forms_fails_after_the_last_attempt(home):
    run_dir = vlm_run_dir(home)
    b = Behaviour(run_dir=run_dir, hold=0.05, solo=100)
    with completions_server(b) as (url, _):
        register_run(run_dir, url)
        report = check.run(UrlTarget(url), options(batch_attempts=2))
    run = report.runs[0]
    assert report.verdict == "fail" and run["batch"]["attempts"] == 2
    assert len(b.chats) == 4 + 4 + 2 + 2 * 4  # BS=1, its control, the probes, 2 attempts
    assert any("ran alone in the BS=4 phase" in r for r in report.reasons)


def test_a_text_model_sends_no_images_and_says_so(home):
    with completions_server() as (url, b):
        report = check.run(UrlTarget(url), options())
    doc = report.to_dict()
    run = doc["runs"][0]
    assert report.verdict == "pass" and doc["images_per_prompt"] == 0
    assert (run["images"]["source"], run["images"]["reached"]) == (
        "text only: no images sent",
        None,
    )
    assert run["images"]["missing"] == [] and {p["images"] for p in run["prompts"]} == {0}
    assert doc["batch_via"] == "list" and not b.chats
