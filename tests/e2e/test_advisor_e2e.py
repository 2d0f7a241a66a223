"""The advisor on a real engine, through ``opsctl console URL --once --json``.

One engine (the session pool, its own spec: the tests only send requests and read
/metrics): single-process tiny-llama with a KV cache of 12 blocks of 32 tokens
(``--block-size 32 --num-gpu-blocks-override 12``: 384 tokens) and prefix caching off.
Eight clients keep sending a two-token prompt with ``max_tokens`` 240 and
``ignore_eos``: each fits in one block, so several are admitted at once, and each needs
a new block every 32 tokens, so running requests are preempted (measured by hand on
this engine: 191 preemptions in 15 s, up to 4 running); every one finishes at the
length cap. (Prompts of ~60 tokens with ``max_tokens`` 180 settled into one request
running at a time, 7 waiting: no preemption in 811 requests.)

- under that load: kv_preemption, output_truncation and prefix_caching_off, with the
  window they were counted over;
- idle afterwards: the engine's lifetime counters still hold the preemptions and the
  length finishes, but they are outside the window of the look, so only
  prefix_caching_off (configuration) remains."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.checks.target import EngineSpec
from opsctl.console.judge_advisor import SHARES_MIN_FINISHED
from opsctl.domain.metrics import PREEMPTIONS, REQUEST_SUCCESS, RUNNING, parse_samples
from tests.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.pool("advisor-small-kv")]

SCHEMA = Path(__file__).resolve().parents[1] / "data/schemas/opsctl.console-4.schema.json"
PROMPT = "hi"  # a block each: many admitted at once, each then grows by a block per 32
CLIENTS = 8
MAX_TOKENS = 240  # within max_model_len 256
LOOK_S = 8  # the look under load: long enough for the advisor's minimum of finishes


@pytest.fixture(scope="module")
def engine(engine_pool):
    spec = EngineSpec(
        "tiny-llama",
        extra_args=(
            "--block-size",
            "32",
            "--num-gpu-blocks-override",
            "12",
            "--no-enable-prefix-caching",
        ),
        max_model_len=256,
        max_num_seqs=8,
    )
    return engine_pool.engine("advisor-small-kv", spec)


def model_id(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def samples(url: str):
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        return parse_samples(r.read().decode())


@contextlib.contextmanager
def load(url: str) -> Iterator[list[str]]:
    """CLIENTS threads sending completions back to back until the block ends; yields the
    errors they met (a client's error ends that client)."""
    model = model_id(url)
    stop = threading.Event()
    errors: list[str] = []
    body = json.dumps(
        {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    ).encode()

    def client() -> None:
        while not stop.is_set():
            req = urllib.request.Request(
                f"{url}/v1/completions", body, {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    r.read()
            except OSError as exc:
                errors.append(repr(exc))
                return

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        yield errors
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=300)


def once(url: str, interval: str = "2s") -> dict:
    """``opsctl console URL --once --json`` in a subprocess, looking for ``interval``; its
    findings checked against the opsctl.console/4 schema's definition."""
    import jsonschema

    r = subprocess.run(
        # --no-canary: a canary's 1-token request would itself read as a truncated
        # output and a small prompt in the next look's window (the advisor's subject here)
        [sys.executable, "-m", "opsctl", "console", url, "--once", "--json", "--no-discover",
         "--interval", interval, "--no-canary"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "opsctl.console/4"
    schema = json.loads(SCHEMA.read_text())
    finding = {**schema["definitions"]["finding"], "definitions": schema["definitions"]}
    for f in doc["endpoints"][0]["findings"]:
        jsonschema.Draft7Validator(finding).validate(f)
    return doc


def brief(doc: dict | None) -> dict:
    """What a failed wait shows: the figures the findings come from, and the findings."""
    if not doc:
        return {}
    keys = ("state", "requests_running", "requests_waiting", "kv_cache_usage",
            "preemptions_per_s", "preemptions_total", "finished_by_reason", "findings")  # fmt: skip
    return {"observed_s": doc["observed_s"], **{k: doc["endpoints"][0].get(k) for k in keys}}


def by_code(doc: dict) -> dict[str, dict]:
    (ep,) = doc["endpoints"]
    return {f["code"]: f for f in ep["findings"]}


def test_preemption_truncation_and_prefix_caching_off_under_load(engine):
    seen: dict = {}

    def both() -> bool:
        # shares need SHARES_MIN_FINISHED finished requests in the look's window: with
        # preemption on two busy cores about 3 finish a second (CI: 7 in a 2 s look)
        doc = once(engine.url, interval=f"{LOOK_S}s")
        seen["doc"] = doc
        codes = by_code(doc)
        return "kv_preemption" in codes and "output_truncation" in codes

    with load(engine.url) as errors:
        wait_until(
            both,
            timeout=300,
            what="kv_preemption and output_truncation in one --once look under load",
            show=lambda: json.dumps(brief(seen.get("doc")), indent=1),
            every=0.5,
        )
    assert not errors
    doc = seen["doc"]
    print(json.dumps(brief(doc)))  # the figures seen (pytest -s)
    found = by_code(doc)
    kv, trunc, prefix = (
        found["kv_preemption"],
        found["output_truncation"],
        found["prefix_caching_off"],
    )
    # counted over the look's window (what --once watched), not the server's lifetime
    for f in (kv, trunc):
        assert 0 < f["figures"]["window_s"] <= doc["observed_s"] + 0.5
        assert f["next"] == f"opsctl console {engine.url}"
    assert kv["severity"] == "warning" and kv["figures"]["preemptions"] >= 1
    assert kv["figures"]["preemptions_per_s"] >= 0.05
    assert trunc["figures"]["length_fraction"] == 1.0  # ignore_eos: every one at the cap
    assert trunc["severity"] == "warning" and trunc["figures"]["finished"] >= SHARES_MIN_FINISHED
    assert prefix["figures"] == {
        "enable_prefix_caching": False,
        "window_s": None,
        "source": "vllm:cache_config_info",
    }
    # the engine's own counters agree
    s = samples(engine.url)
    assert (s.get(PREEMPTIONS) or 0) >= kv["figures"]["preemptions"]
    assert s.labelled[REQUEST_SUCCESS].get("length", 0) >= trunc["figures"]["finished"]


def test_old_preemptions_and_truncations_age_out_when_idle(engine):
    s = samples(engine.url)
    if not (s.get(PREEMPTIONS) or 0):  # run alone: make the events first
        with load(engine.url):
            wait_until(lambda: (samples(engine.url).get(PREEMPTIONS) or 0) > 0, timeout=300)
    wait_until(lambda: (samples(engine.url).get(RUNNING) or 0) == 0, timeout=300, what="idle")
    s = samples(engine.url)
    assert (s.get(PREEMPTIONS) or 0) > 0 and s.labelled[REQUEST_SUCCESS]["length"] > 0
    doc = once(engine.url)
    print(json.dumps(brief(doc)))
    found = by_code(doc)
    assert doc["endpoints"][0]["state"] == "ready"
    # lifetime totals say preempted and truncated; the window of this look says nothing
    assert doc["endpoints"][0]["preemptions_total"] > 0
    assert set(found) == {"prefix_caching_off"}, found
