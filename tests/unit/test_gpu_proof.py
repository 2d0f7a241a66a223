"""Replays the GPU proof (issue 25, item 1): what `bash gpu/prove.sh STAGE` recorded on
the H200 machine (CUDA vLLM 0.26.0) and `bash gpu/unpack.sh` put under
tests/data/gpu/2026-12-03/STAGE/.

Fail-closed: with a recording missing, test_every_recording_is_present fails and lists
what is missing (every test here is marked ``gpu_recording``). For each JSON report
present: it validates against its schema in tests/data/schemas (or its schema is one the
repository has no schema file for, named in NO_SCHEMA_FILE), it goes through opsctl's own
renderers (the functions the CLI calls for its plain and rich output) without error, it
was recorded on CUDA vLLM 0.26.0 with the call's exit code matching its verdict, and
docs/gpu.md's per-check table states for every check what the recording says (pass, fail
or not applicable, with the reason).

The table docs/gpu.md must carry (any section; the header row exactly these four
columns, in this order; ``recording`` is STAGE/FILE under tests/data/gpu/2026-12-03,
FILE#CHECK for one of certify's checks, or ``-`` when nothing ran):

    | check | recording | result | reason |
    |---|---|---|---|
    | diag invariance, eager | serve/invariance-eager.json | pass | ... |
    | certify: kv-fail | certify/certify-llama.json#kv-fail | fail | ... |
    | diag lora, tiny-hybrid | - | not applicable | ... |

OPSCTL_GPU_PROOF_DIR points the replay at another folder (a fresh unpack to look at
before committing it, or a CPU dry run of prove.sh: OPSCTL_PROVE_LOCAL=1).
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

pytestmark = pytest.mark.gpu_recording

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("OPSCTL_GPU_PROOF_DIR") or ROOT / "tests/data/gpu/2026-12-03")
# later proofs (issue 34): their reports get the same schema, rendering and exit-code
# checks, and docs/gpu.md's table names them as DATE/STAGE/FILE
LATER = () if os.environ.get("OPSCTL_GPU_PROOF_DIR") else (ROOT / "tests/data/gpu/2026-12-04",)
SCHEMAS = ROOT / "tests/data/schemas"
GPU_DOC = ROOT / "docs/gpu.md"
VLLM, TORCH, GPU = "0.26.0", "2.11.0+cu130", "NVIDIA H200"

# what each stage of gpu/prove.sh writes (stdout of each call: NAME.json / NAME.txt)
EXPECTED = {
    "serve": [
        "facts.txt",
        "calls.jsonl",
        "summary.log",
        "version.json",
        "serve.jsonl",
        "status.json",
        "console-json.json",
        "console-plain.txt",
        "patches.json",
        "invariance-served.json",
        "sigkill.json",
        "invariance-eager.json",
    ],
    "checks": [
        "calls.jsonl",
        "summary.log",
        "usage-reranker.json",
        "mm-uuid-vlm.json",
        "kv-fail-hybrid.json",
    ],
    "lora": [
        "calls.jsonl",
        "summary.log",
        "lora-llama.json",
        "lora-vlm.json",
        "invariance-vlm.json",
    ],
    "certify": ["calls.jsonl", "summary.log", "certify-llama.json", "certify.xml"],
}
# opsctl documents the repository has no schema file for (their shape is asserted by
# their own CLI tests); anything else without tests/data/schemas/<name>-<N>.schema.json fails
NO_SCHEMA_FILE = {"opsctl.patches", "opsctl.certify", "opsctl.models.build"}
# prove.sh's own documents (not opsctl's)
PROVE_DOCS = {"sigkill.json", "fp32.json", "hang.json"}  # gpu/prove.sh's own documents


def _reports() -> list[Path]:
    found = []
    for folder in (DATA, *LATER):
        if folder.is_dir():
            found += sorted(p for p in folder.glob("*/*.json") if p.name not in PROVE_DOCS)
    return found


def _named(path: Path) -> str:
    """STAGE/FILE for the first proof's recordings, DATE/STAGE/FILE for a later one's."""
    stage = f"{path.parent.name}/{path.name}"
    return stage if path.parent.parent == DATA else f"{path.parent.parent.name}/{stage}"


REPORTS = _reports()
IDS = [_named(p) for p in REPORTS]


def _need(path: Path) -> Path:
    if not path.is_file():
        pytest.fail(f"recording missing: {path} (test_every_recording_is_present lists all)")
    return path


def _load(path: Path) -> dict[str, Any]:
    return json.loads(_need(path).read_text())


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _need(path).read_text().splitlines() if line.strip()]


def _calls(stage: str | Path) -> dict[str, dict]:
    path = (stage if isinstance(stage, Path) else DATA / stage) / "calls.jsonl"
    if not path.is_file():
        return {}
    return {r["name"]: r for r in _lines(path)}


def _schema_name(doc: dict) -> tuple[str, str]:
    name, _, version = str(doc.get("schema", "")).partition("/")
    return name, version


def test_every_recording_is_present():
    missing = [
        f"{stage}/{name}"
        for stage, names in EXPECTED.items()
        for name in names
        if not (DATA / stage / name).is_file()
    ]
    assert not missing, (
        f"GPU proof recordings missing under {DATA.relative_to(ROOT) if DATA.is_relative_to(ROOT) else DATA}: "
        f"{', '.join(missing)} (run `bash gpu/prove.sh STAGE` on the H200 machine and "
        "`bash gpu/unpack.sh DIR` here: gpu/README.md)"
    )


def test_recorded_on_an_h200_with_cuda_vllm_0_26():
    facts = _need(DATA / "serve" / "facts.txt").read_text()
    assert GPU in facts and f"torch {TORCH}" in facts and f"vllm {VLLM}" in facts, facts
    assert re.search(rf"^date_utc {DATA.name}T", facts, re.M), facts  # the folder's date
    version = _load(DATA / "serve" / "version.json")
    assert version["vllm_version"] == VLLM, version


@pytest.mark.parametrize("path", REPORTS, ids=IDS)
def test_report_follows_its_schema(path: Path):
    import jsonschema

    doc = _load(path)
    name, version = _schema_name(doc)
    assert name.startswith("opsctl.") and version.isdigit(), (path.name, doc.get("schema"))
    schema_file = SCHEMAS / f"{name}-{version}.schema.json"
    if not schema_file.is_file():
        assert name in NO_SCHEMA_FILE, f"{path.name}: no {schema_file.name} in tests/data/schemas"
        return
    jsonschema.Draft7Validator(json.loads(schema_file.read_text())).validate(doc)


def _renderer(doc: dict):
    """The function the CLI hands opsctl.output.emit for this document (None: none that
    renders from the document alone): a diag report's is its check's registered one."""
    from opsctl.commands import patches, status
    from opsctl.domain import check_registry as reg
    from opsctl.ui import render_certify

    name, _ = _schema_name(doc)
    loaded = [c.parts() for c in reg.checks(reg.DIAG)]
    diag = {f"opsctl.{p.schema.split('/')[0]}": p.render for p in loaded if p.render and p.schema}
    if name in diag:
        return lambda con: diag[name](con, doc)
    return {
        "opsctl.status": lambda con: status._render(con, doc),
        "opsctl.patches": lambda con: patches._render(con, doc),
        "opsctl.certify": render_certify.render(doc),
    }.get(name)


# version renders from a closure inside its command, models build prints a line per
# model, console from its snapshot (its plain table is recorded: console-plain.txt)
NOT_RENDERED = {"opsctl.version", "opsctl.models.build", "opsctl.console"}


def _assert_error_document_as_the_cli_emits_it(path: Path, doc: dict) -> None:
    """A call that failed before its report existed (e.g. no vLLM server answered): its
    opsctl.error/1 document is the one opsctl.output.error_document builds, and the call's
    stderr ends with the CLI's ``opsctl: error:`` line (and its hint) for the same message."""
    from opsctl.output import error_document

    assert doc == error_document(doc["command"], doc["exit_code"], doc["error"], doc["hint"])
    assert doc["error"] and doc["exit_code"] in (1, 3, 4, 130), doc
    err = _need(path.with_suffix(".err")).read_text().splitlines()
    said = "opsctl:" if doc["exit_code"] == 130 else "opsctl: error:"  # cli.py: an interrupt
    want = [f"{said} {doc['error']}"] + ([f"hint: {doc['hint']}"] if doc["hint"] else [])
    assert err[-len(want) :] == want, (path.name, err[-3:])


@pytest.mark.parametrize("path", REPORTS, ids=IDS)
def test_report_renders_plain_and_rich(path: Path):
    from opsctl.output import PIPE_WIDTH, PlainConsole

    doc = _load(path)
    if _schema_name(doc)[0] == "opsctl.error":
        _assert_error_document_as_the_cli_emits_it(path, doc)
        return
    render = _renderer(doc)
    if render is None:
        assert _schema_name(doc)[0] in NOT_RENDERED, doc.get("schema")
        return
    plain = PlainConsole(file=io.StringIO(), soft_wrap=True, width=PIPE_WIDTH)
    render(plain)
    rich = Console(record=True, width=200, color_system=None, file=io.StringIO())
    render(rich)
    for text in (plain.file.getvalue(), rich.export_text()):
        assert text.strip(), path.name
        if isinstance(doc.get("verdict"), str) and doc["schema"] != "opsctl.diag.usage/2":
            assert doc["verdict"].lower() in text.lower(), (path.name, text[-500:])


@pytest.mark.parametrize("path", REPORTS, ids=IDS)
def test_report_is_from_cuda_vllm_and_its_exit_code_matches(path: Path):
    doc = _load(path)
    if "platform" in doc:
        assert doc["platform"] == "cuda", path.name
    if "vllm_version" in doc and doc["vllm_version"] is not None:
        assert doc["vllm_version"] == VLLM, path.name
    call = _calls(path.parent).get(path.stem)
    assert call is not None and not call["skipped"], f"{path.name}: not in calls.jsonl"
    verdict = doc.get("verdict")
    if verdict == "pass":
        assert call["rc"] == 0, (path.name, call)
    elif verdict == "fail":
        assert call["rc"] == 1, (path.name, call)
    if "exit_code" in doc:
        # 124: gpu/prove.sh's `timeout -s INT` ended the call (opsctl itself said 130)
        timed_out = call["rc"] == 124 and doc["exit_code"] == 130
        assert call["rc"] == doc["exit_code"] or timed_out, (path.name, call)


def test_console_once_names_the_process_roles_of_the_served_engine():
    doc = _load(DATA / "serve" / "console-json.json")
    serve = _lines(DATA / "serve" / "serve.jsonl")
    ready = serve[0]
    assert ready["event"] == "ready"
    (ep,) = [e for e in doc["endpoints"] if e["url"] == ready["url"]]
    assert ep["state"] == "ready" and ep["vllm_version"] == VLLM
    roles = {p["role"] for p in ep["pids"]}
    assert {"APIServer", "EngineCore"} <= roles, ep["pids"]
    assert {p["pid"] for p in ep["pids"]} >= set(ready["pids"].values()) - {None}
    plain = _need(DATA / "serve" / "console-plain.txt").read_text().splitlines()
    assert plain[0].split()[:4] == ["name", "url", "source", "state"]
    assert any(ready["url"] in line and " ready " in f" {line} " for line in plain[1:]), plain


def test_sigkill_of_opsctl_serve_leaves_no_engine_within_15_s():
    kill = _load(DATA / "serve" / "sigkill.json")
    serve = _lines(DATA / "serve" / "serve.jsonl")
    assert [e["event"] for e in serve] == ["ready"]  # killed: no stopped event
    engine = set(serve[0]["pids"].values())
    assert engine <= {p["pid"] for p in kill["tree_before"]}, (engine, kill["tree_before"])
    assert kill["left_after_30s"] == []
    assert kill["gone_after_s"] is not None and kill["gone_after_s"] <= 15.0, kill
    assert kill["verdict"] == "pass"
    # docs/gpu.md states the measured time
    assert f"gone {kill['gone_after_s']:.1f} s after SIGKILL" in GPU_DOC.read_text()


def _engine_facts(stage: str) -> dict[str, dict[str, str]]:
    """engine_facts.txt of a stage: run dir name -> its key=value facts."""
    facts: dict[str, dict[str, str]] = {}
    for line in _need(DATA / stage / "engine_facts.txt").read_text().splitlines():
        run, sep, rest = line.strip().partition(": ")
        if sep:
            facts[run] = dict(re.findall(r"(\w+)=((?:[^=]+?)(?=\s+\w+=|$))", rest))
    return facts


def test_serve_runs_vllm_default_execution_mode():
    """issue 25 item 5: `opsctl serve` without --eager leaves vLLM's default mode on: torch
    compile and CUDA graphs, the V2 model runner, async scheduling."""
    (ready,) = _lines(DATA / "serve" / "serve.jsonl")
    assert ready["event"] == "ready" and ready["eager"] is False, ready
    assert ready["single_process"] is False, ready
    facts = _engine_facts("serve")[Path(ready["run_dir"]).name]
    assert facts["enforce_eager"] == "False", facts
    assert facts["compilation"] == "VLLM_COMPILE", facts
    assert facts["cudagraph_mode"] == "FULL_AND_PIECEWISE", facts
    assert facts["v2_model_runner"] == "V2 Model Runner", facts
    assert facts["async_scheduling"] == "enabled", facts
    assert facts["error_lines"] == "0", facts
    eager = _load(DATA / "serve" / "invariance-eager.json")
    facts = _engine_facts("serve")[Path(eager["runs"][0]["run_dir"]).name]
    assert facts["enforce_eager"] == "True" and facts["cudagraph_mode"] == "NONE", facts


def test_the_served_unisolated_server_fails_invariance_closed():
    doc = _load(DATA / "serve" / "invariance-served.json")
    assert doc["verdict"] == "fail"
    assert any("prefix caching: wanted off, engine has True" in r for r in doc["reasons"]), doc[
        "reasons"
    ]


# ---- the runs by hand after the stages (extra/, its README) ---------------------------------
EXTRA = DATA / "extra"
RESHAPE = "cannot reshape tensor of 0 elements into shape [0, -1]"


def _assert_v2_encoder_reshape_crash(server_log: Path) -> None:
    log = _need(server_log).read_text()
    assert RESHAPE in log, server_log
    assert "vllm/v1/worker/gpu/mm/encoder_runner.py" in log, server_log  # the V2 runner's
    assert 'idefics2_vision_model.py", line 429' in log, server_log
    assert "EngineDeadError" in log, server_log


def test_tiny_vlm_multi_image_requests_crash_vllm_with_every_opsctl_patch_disabled():
    (ready, stopped) = _lines(EXTRA / "no-patches-vlm-multi" / "np-serve.jsonl")
    assert ready["event"] == "ready" and ready["model"] == "tiny-vlm-multi" and ready["eager"]
    assert stopped["event"] == "stopped" and stopped["leftover_pids"] == []
    doc = _load(EXTRA / "no-patches-vlm-multi" / "np-inv.json")
    assert doc["verdict"] == "fail" and doc["platform"] == "cuda"
    assert doc["vllm_version"] == VLLM
    (run,) = doc["runs"]
    assert run["run_dir"] == ready["run_dir"]
    assert run["summary"]["errors"] == run["summary"]["prompts"] == 8, run["summary"]
    assert run["batch"]["source"] == "none"  # no opsctl probe answered in that engine
    assert {s["source"] for s in run["settings"][:2]} == {
        "no opsctl ledger for this server: could not enforce or read back"
    }, run["settings"][:2]
    _assert_v2_encoder_reshape_crash(EXTRA / "no-patches-vlm-multi" / "server.log")


@pytest.mark.parametrize(
    "run",
    [
        "checks/runs/mm-uuid-vlm/20261203-015519-diag-mm-uuid-caches-off-tiny-vlm-multi-59129",
        "lora/runs/lora-vlm/20261203-020019-diag-lora-tiny-vlm-multi-40695",
        "lora/runs/invariance-vlm/20261203-020211-invariance-default-tiny-vlm-multi-44011",
    ],
)
def test_the_tiny_vlm_multi_stage_failures_are_the_same_vllm_crash(run: str):
    _assert_v2_encoder_reshape_crash(DATA / run / "server.log")


def test_v2_nudge_run_batch_evidence_and_the_nudge_that_does_not_reach_logprobs():
    """On the V2 runner the batch probe hooks, sees the runner and the batch forming; the
    nudge test knob is applied but the verdict stays pass (docs/gpu.md: not proven)."""
    doc = _load(EXTRA / "nudge-v2" / "nudge-inv.json")
    assert doc["test_knobs"] == {"OPSCTL_PROBE_NUDGE": "opsctl-inv:2"}
    assert doc["verdict"] == "pass" and doc["platform"] == "cuda"
    (run,) = doc["runs"]
    assert run["mode"] == "eager" and run["execution"]["enforce_eager"] is True
    batch = run["batch"]
    assert batch["source"] == "batch probe" and batch["formed"] is True, batch
    assert batch["max_batch"] == batch["wanted"] == 8, batch
    events = _lines(EXTRA / "nudge-v2" / "run" / "events" / "batch.jsonl")
    kinds = [e["event"] for e in events]
    (init,) = [e for e in events if e["event"] == "init"]
    assert init["hooked"] == ["v1", "v2"] and init["role"] == "engine_core", init
    assert init["nudge"] == {"marker": "opsctl-inv", "position": 2, "delta": 0.01}, init
    (runner,) = [e for e in events if e["event"] == "runner"]
    assert runner["runner"] == "v2", runner
    assert kinds.count("step") == 148 and kinds.count("nudge") == 8, kinds
    core = _load(EXTRA / "nudge-v2" / "ledger" / "6944.json")
    assert core["role"] == "engine_core" and core["test_knobs"] == doc["test_knobs"]
    status = {p["name"]: p["status"] for p in core["patches"]}
    assert status["batch_probe"] == "applied", status
    assert {e["pid"] for e in events} == {core["pid"]}


def test_blip2_lora_engine_init_crashes_in_vllm_punica_wrapper():
    doc = _load(EXTRA / "blip2" / "lora-blip2.json")
    assert doc["schema"] == "opsctl.error/1" and doc["exit_code"] == 1
    assert doc["error"].startswith("engine exited with code 1 before becoming healthy"), doc
    log = _need(EXTRA / "blip2" / "lora-run" / "server.log").read_text()
    assert 'punica_wrapper/punica_base.py", line 138' in log
    assert "TypeError: empty() received an invalid combination of arguments - got (float," in log


def test_blip2_mm_uuid_caches_off_fails_on_exactly_the_explicit_uuids():
    """The 4 items that 'did not reach the engine core as expected' are the caches-off
    items sent with an explicit UUID; the engine core saw request-local identifiers for
    them (the probe's mm_uuid.jsonl), as for the items sent without one."""
    doc = _load(EXTRA / "blip2" / "mmuuid-blip2.json")
    assert doc["verdict"] == "fail" and doc["vllm_version"] == VLLM
    failed = [i for i in doc["items"] if i["verdict"] == "fail"]
    assert [(i["mode"], i["explicit_uuid"]) for i in failed] == [
        ("caches-off", "opsctl-all-0"),
        ("caches-off", "opsctl-all-1"),
        ("caches-off", "opsctl-some-0"),
        ("caches-off", ""),
    ], failed
    assert all(i["verdict"] == "pass" for i in doc["items"] if i["mode"] == "caches-on")
    seen = {
        e["request_id"]: e["items"]
        for e in _lines(EXTRA / "blip2" / "mm-uuid-caches-off-run" / "events" / "mm_uuid.jsonl")
    }
    for item in (i for i in doc["items"] if i["mode"] == "caches-off"):
        (core,) = seen[item["request_id"]]
        assert re.fullmatch(r"renderer0-mm-\d+-image-0", core["identifier"]), core
        assert core["identifier"] == core["mm_hash"] == item["identifier"], (core, item)


def test_certify_junit_follows_the_xsd_and_its_document():
    """certify's --junit file: valid against junit-10.xsd (tests/data/schemas), one
    testcase per check of the JSON document, failure/error/skipped as its verdict."""
    import xml.etree.ElementTree as ET

    import xmlschema

    text = _need(DATA / "certify" / "certify.xml").read_text()
    xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd")).validate(text)
    doc = _load(DATA / "certify" / "certify-llama.json")
    cases = {c.get("name"): c for c in ET.fromstring(text).iter("testcase")}
    assert set(cases) == {c["check"] for c in doc["checks"]}
    tag = {"fail": "failure", "error": "error", "skipped": "skipped"}
    for check in doc["checks"]:
        children = {e.tag for e in cases[check["check"]]} - {"system-out"}
        want = tag.get(check["verdict"])
        assert children == ({want} if want else set()), (check["check"], check["verdict"])


# ---- docs/gpu.md's table against the recordings ---------------------------------------------
RESULTS = {"pass", "fail", "not applicable"}
CALL_OF = {"serve": "serve-ready"}  # recording stem -> its name in calls.jsonl
# recorded for the record, not checks the table must state
AUXILIARY = {"version.json", "models-build.json", "status-after.json"}
NORMAL = {"skipped": "not applicable", "skip": "not applicable", "n/a": "not applicable"}


def _table() -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    lines = GPU_DOC.read_text().splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip().lower() for c in line.strip().strip("|").split("|")]
        if cells != ["check", "recording", "result", "reason"]:
            continue
        for row in lines[i + 2 :]:
            if not row.strip().startswith("|"):
                break
            c = [x.strip() for x in row.strip().strip("|").split("|")]
            rows.append(
                {
                    "check": c[0],
                    "recording": c[1].strip("`"),
                    "result": c[2].replace("*", "").strip().lower(),
                    "reason": c[3] if len(c) > 3 else "",
                }
            )
    return rows


def _recorded_result(recording: str) -> str:
    """pass / fail / not applicable as the recording says: the document's verdict (or,
    for certify#CHECK, that check's), the console's and status's state, the exit code."""
    file, _, check = recording.partition("#")
    path = DATA / file
    if any(file.startswith(f"{later.name}/") for later in LATER):
        path = DATA.parent / file
    assert path.is_file(), f"docs/gpu.md names {recording}, not recorded"
    if path.suffix != ".json":  # serve.jsonl, console-plain.txt: the call's exit code
        rc = _calls(path.parent).get(CALL_OF.get(path.stem, path.stem), {}).get("rc")
        return "pass" if rc == 0 else "fail"
    doc = _load(path)
    if check:
        (c,) = [c for c in doc["checks"] if c["check"] == check]
        verdict = c["verdict"]
    elif "verdict" in doc:
        verdict = doc["verdict"]
    elif "state" in doc:
        verdict = "pass" if doc["state"] in ("ready", "busy") else "fail"
    else:
        rc = _calls(path.parent)[path.stem]["rc"]
        verdict = "pass" if rc == 0 else "fail"
    verdict = verdict.lower()
    return NORMAL.get(verdict, "fail" if verdict == "error" else verdict)


def test_docs_gpu_md_states_every_recorded_check():
    rows = _table()
    assert rows, "docs/gpu.md has no '| check | recording | result | reason |' table"
    named = {r["recording"].partition("#")[0] for r in rows}
    reports = {_named(p) for p in REPORTS} | {"serve/sigkill.json"}
    reports = {r for r in reports if r.rpartition("/")[2] not in AUXILIARY}
    assert not reports - named, f"recorded, not in docs/gpu.md's table: {sorted(reports - named)}"


@pytest.mark.parametrize("row", _table() if GPU_DOC.is_file() else [], ids=lambda r: r["check"])
def test_docs_gpu_md_result_matches_the_recording(row: dict[str, str]):
    result = NORMAL.get(row["result"], row["result"])
    assert result in RESULTS, row
    assert row["reason"], f"{row['check']}: no reason given"
    if row["recording"] in ("-", ""):
        assert result == "not applicable", row
        return
    assert _recorded_result(row["recording"]) == result, row
