"""`diag lora` as a library call and as a command, against the LoRA stand-in server (no
engine): the server's adapters, runtime loading (allowed or not), an adapter that is not
applied, what cannot be shown without the engine's probes, and the exit codes of bad
input and an unreachable server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.cli import app
from opsctl.domain.platform import NOT_STARTED_NOTE
from opsctl.embedded import lora as built
from opsctl.errors import BadInput
from opsctl.suite.lora import run as check
from tests.standins.lora import BASE, VERSION, Behaviour, lora_server

OPTS = check.Options(max_tokens=4, logprobs=2)


@pytest.fixture
def adapter_dirs(tmp_path) -> list[Path]:
    paths = built.ensure("tiny-llama", tmp_path / "adapters")
    return [paths["alpha"], paths["beta"]]


def test_listed_adapters_pass_but_the_batch_is_unverified_without_probes() -> None:
    b = Behaviour(adapters={"a1": "/srv/a1", "a2": "/srv/a2"})
    seen: list[ev.Event] = []
    with lora_server(b) as url:
        report = check.run(UrlTarget(url), OPTS, seen.append)
    doc = report.to_dict()
    assert doc["schema"] == "opsctl.diag.lora/3" and report.verdict == "unverified"
    failure = check.outcome(report, OPTS).failure  # not judged is never a pass: exit 1
    assert failure is not None and "unverified (not judged: not a pass)" in failure.message
    assert "no batch probe on this server" in report.reasons[0]
    assert [s["verdict"] for s in doc["single"]] == ["pass", "pass"]
    assert {r["status"] for r in doc["mixed"]["requests"]} == {"identical"}
    assert doc["mixed"]["verdict"] == "unverified" and doc["mixed"]["batch"]["source"] == "none"
    assert doc["model"] == BASE and doc["vllm_version"] == VERSION
    assert doc["platform"] is None and doc["platform_note"] == NOT_STARTED_NOTE
    assert doc["engine"] is None
    assert {"alone", "mixed"} <= set(doc["durations_s"]) and "seconds" not in doc
    assert all(a["duration_s"] >= 0 for a in doc["mixed"]["attempts"])
    assert [a["source"] for a in doc["adapters"]] == ["server", "server"]
    assert doc["support"] == [
        {
            "part": "language",
            "status": "unknown",
            "wrapped_modules": None,
            "detail": doc["support"][0]["detail"],
        }
    ]
    # 3 models x 6 requests alone, the 6 base requests alone again (the floor), 6 together
    assert len(b.models_used) == 30 and b.models_used.count("a1") == 8
    assert doc["calibration"]["floor"] == 0.0 and doc["calibration"]["conclusive"]
    assert doc["seeds"] is None and [s["seed"] for s in doc["sweep"]] == [None]
    kinds = [type(e).__name__ for e in seen]
    assert kinds[0] == "Started" and kinds[-1] == "Finished" and "Table" in kinds
    assert any(isinstance(e, ev.Phase) and e.name.startswith("mixed batch: 6") for e in seen)


def test_an_adapter_that_changes_nothing_fails() -> None:
    b = Behaviour(adapters={"a1": "/srv/a1", "a2": "/srv/a2"}, inert={"a2"})
    with lora_server(b) as url:
        report = check.run(UrlTarget(url), OPTS)
    assert report.verdict == "fail" and not report.passed
    assert report.reasons[0].startswith("adapter a2: output equals the base model's on all 6")


def test_runtime_loading_loads_uses_and_unloads(adapter_dirs) -> None:
    b = Behaviour(allow_load=True)
    options = check.Options(adapters=tuple(map(str, adapter_dirs)), max_tokens=4, logprobs=2)
    with lora_server(b) as url:
        report = check.run(UrlTarget(url), options)
    assert [n for n, _ in b.loaded] == ["alpha", "beta"] and b.unloaded == ["alpha", "beta"]
    assert b.loaded[0][1] == str(adapter_dirs[0].resolve())
    doc = report.to_dict()
    assert doc["loaded_at_runtime"] == ["alpha", "beta"] and report.verdict == "unverified"
    assert [a["source"] for a in doc["adapters"]] == ["dir", "dir"]
    assert "alpha" in b.models_used and not b.adapters


def test_runtime_loading_refused_is_bad_input(adapter_dirs) -> None:
    options = check.Options(adapters=tuple(map(str, adapter_dirs)))
    with lora_server(Behaviour()) as url, pytest.raises(BadInput, match="does not allow runtime"):
        check.run(UrlTarget(url), options)


def test_too_few_adapters_is_bad_input() -> None:
    only = Behaviour(adapters={"only": "/srv/only"})
    with lora_server(only) as url, pytest.raises(BadInput, match="lists 1 LoRA adapter"):
        check.run(UrlTarget(url), OPTS)


def test_plan_refuses_before_anything_starts(tmp_path, adapter_dirs) -> None:
    with pytest.raises(BadInput, match="does not exist"):
        check.plan(EngineSpec("tiny-llama"), check.Options(adapters=(str(tmp_path / "nope"),)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match=r"has no adapter_config\.json"):
        check.plan(EngineSpec("tiny-llama"), check.Options(adapters=(str(tmp_path / "empty"),)))
    with pytest.raises(BadInput, match="needs a generative model"):
        check.plan(EngineSpec("tiny-reranker"), OPTS)
    with pytest.raises(BadInput, match="below the 2 adapters"):
        check.plan(EngineSpec("tiny-llama"), check.Options(max_loras=1))
    with pytest.raises(BadInput, match="needs an engine opsctl starts"):
        check.plan(UrlTarget("http://127.0.0.1:9"), check.Options(max_loras=3))
    with pytest.raises(BadInput, match="at least 2"):
        check.plan(EngineSpec("tiny-llama"), check.Options(adapters=(str(adapter_dirs[0]),)))


def test_engine_spec_carries_every_lora_argument() -> None:
    plan = check.plan(EngineSpec("tiny-vlm-multi"), check.Options(max_loras=4))
    spec = plan.target
    assert isinstance(spec, EngineSpec) and plan.images == 2
    args = list(spec.extra_args)
    assert args[args.index("--max-loras") + 1] == "4" and "--enable-lora" in args
    assert args[args.index("--max-lora-rank") + 1] == "8"
    assert "--enable-tower-connector-lora" in args and "--no-enable-prefix-caching" in args
    assert json.loads(args[args.index("--limit-mm-per-prompt") + 1]) == {"image": 2}
    mods = args[args.index("--lora-modules") + 1 : args.index("--lora-modules") + 4]
    assert [m.split("=")[0] for m in mods] == ["alpha", "beta", "vision"]
    assert spec.probes >= {"batch", "lora", "gate"} and spec.enforce_eager is False
    assert spec.max_num_seqs == 8
    text = check.plan(EngineSpec(), check.Options()).target
    assert isinstance(text, EngineSpec) and text.model == "tiny-llama"
    assert "--enable-tower-connector-lora" not in text.extra_args


def cli(*args: str):
    return CliRunner().invoke(app, ["diag", "lora", *args])


def test_cli_json_and_exit_codes(tmp_path) -> None:
    with lora_server(Behaviour(adapters={"a1": "/srv/a1", "a2": "/srv/a2"})) as url:
        r = cli(url, "--json", "--max-tokens", "4")
        assert r.exit_code == 1, r.stderr  # unverified: not judged, never a pass
        doc = json.loads(r.stdout)
        assert doc["schema"] == "opsctl.diag.lora/3" and doc["verdict"] == "unverified"
        assert "no batch probe" in r.stderr
        human = cli(url, "--max-tokens", "4")
        assert human.exit_code == 1 and "UNVERIFIED" in human.stdout and "platform" in human.stdout
        r = cli(url, "--max-loras", "3")
        assert r.exit_code == 2 and "needs an engine opsctl starts" in r.stderr
    r = cli("--model", "tiny-llama", "--adapters", str(tmp_path / "missing"), "--adapters", "x")
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        f"opsctl: error: adapter directory {tmp_path / 'missing'} does not exist"
    ]
    r = cli("http://127.0.0.1:9", "--json")
    assert r.exit_code == 3 and "no server answered" in r.stderr


def test_a_sweep_runs_every_seed_on_one_server_and_totals_them() -> None:
    from opsctl.suite.invariance import judge_calibration as cal

    b = Behaviour(adapters={"a1": "/srv/a1", "a2": "/srv/a2"})
    with lora_server(b) as url:
        report = check.run(UrlTarget(url), check.Options(max_tokens=4, seeds=(1, 3)))
    doc = report.to_dict()
    assert doc["seeds"] == [1, 3] and [s["seed"] for s in doc["sweep"]] == [1, 3]
    assert doc["totals"] == {"pass": 0, "fail": 0, "inconclusive": 2}  # unverified: not judged
    assert report.verdict == "unverified" and doc["detail_seed"] == 1
    assert all(r.startswith("[seed ") for r in doc["reasons"])
    for seed in (1, 3):  # each seed's own prompts reached the server
        assert set(cal.seeded_prompts(seed, 8)[:6]) <= set(b.prompts_used)


def test_calibration_floor_sensitivity_and_the_rule() -> None:
    from opsctl.suite.invariance import judge as inv
    from opsctl.suite.lora import judge as D

    def g(lp: float, tok: int = 1) -> inv.Generated:
        return inv.Generated((tok, 2), (lp, -1.0), (None, None))

    alone = {(None, 0): g(-0.5), ("a", 0): g(-0.55), ("b", 0): g(-0.52)}
    c = D.calibration(alone, {0: g(-0.505)}, ["a", "b"], [0], max_tokens=2, atol=None)
    assert c.floor == pytest.approx(0.005) and c.sensitivity == pytest.approx(0.03)
    assert not c.conclusive  # 0.03 is under 10 x the bound (2 x 0.005): a swap hides
    found = D.Findings("pass", (), (), "pass")
    evidence = D.MixedEvidence("batch probe", 1, 6, 3, 3)
    out = check.calibrated(found, c, [], evidence)
    assert out.verdict == "inconclusive" and "to make it conclusive" in out.reasons[-1]
    distinct = {**alone, ("b", 0): g(-0.5, tok=7)}  # adapters differ in a token
    sure = D.calibration(distinct, {0: g(-0.5)}, ["a", "b"], [0], max_tokens=2, atol=None)
    assert sure.conclusive and check.calibrated(found, sure, [], evidence) is found
