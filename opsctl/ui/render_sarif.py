"""SARIF 2.1.0 of a certify document (pure), for code-scanning uploads.

- one rule per finding code, its id the code itself ("usage.mismatch",
  "invariance.divergence", ...): ids stay stable across runs and versions, so alerts
  track over time; rules are sorted by id;
- one result per finding that is not "ok": level error (fail), warning, note (info);
- EVERY result has a location (code scanning rejects results without one): the
  ``artifact`` given (the model's config.json, or the report file), line 1;
- skipped checks are tool notifications (level note), not results;
- run properties carry the verdict, the summary and the fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from opsctl.domain.certify import NOT_JUDGED, model_of

SEVERITY = ("none", "note", "warning", "error")  # SARIF's levels, least first

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
VERSION = "2.1.0"
LEVELS = {"fail": "error", "warning": "warning", "info": "note"}


def rule_name(code: str) -> str:
    """ "usage.mismatch" -> "UsageMismatch" (SARIF's PascalCase rule name)."""
    words = code.replace("-", ".").replace("_", ".").split(".")
    return "".join(w[:1].upper() + w[1:] for w in words if w)


def _location(artifact: Mapping[str, str]) -> dict[str, Any]:
    loc: dict[str, Any] = {"uri": artifact["uri"]}
    if artifact.get("uriBaseId"):
        loc["uriBaseId"] = artifact["uriBaseId"]
    return {
        "physicalLocation": {"artifactLocation": loc, "region": {"startLine": 1}},
        "message": {"text": artifact.get("description") or artifact["uri"]},
    }


def _fingerprint(check: str, code: str, message: str, model: str) -> str:
    return hashlib.sha256(f"{model}\0{check}\0{code}\0{message}".encode()).hexdigest()[:32]


def _results(doc: Mapping[str, Any], artifact: Mapping[str, str]) -> list[dict[str, Any]]:
    model = str(model_of(doc) or "")
    out = []
    for check in doc.get("checks") or ():
        for f in check.get("findings") or ():
            level = LEVELS.get(str(f.get("severity")))
            if level is None:
                continue
            code, message = str(f["code"]), str(f.get("message") or f["code"])
            result: dict[str, Any] = {
                "ruleId": code,
                "level": level,
                "message": {"text": f"[{check['check']}] {message}"},
                "locations": [_location(artifact)],
                "partialFingerprints": {
                    "opsctlFinding/v1": _fingerprint(check["check"], code, message, model)
                },
                "properties": {"check": check["check"], "verdict": check.get("verdict")},
            }
            if f.get("details"):
                result["properties"]["details"] = f["details"]
            out.append(result)
        if check.get("verdict") in NOT_JUDGED:
            out.append(_not_judged(check, artifact, model))
    return out


def _not_judged(check: Mapping[str, Any], artifact: Mapping[str, str], model: str) -> dict:
    """The result of a check that ran without a judgement: SARIF's ``kind: open`` (the tool
    could not tell pass from fail; level ``none``, as the spec wants for a kind that is not
    ``fail``), its message the check's first finding or reason."""
    name, verdict = str(check["check"]), str(check.get("verdict"))
    code = f"{name}.{verdict}"
    why = str(check.get("first_finding") or check.get("reason") or verdict)
    return {
        "ruleId": code,
        "kind": "open",
        "level": "none",
        "message": {"text": f"[{name}] not judged ({verdict}): {why}"},
        "locations": [_location(artifact)],
        "partialFingerprints": {"opsctlFinding/v1": _fingerprint(name, code, verdict, model)},
        "properties": {"check": name, "verdict": verdict},
    }


def _rules(results: list[dict[str, Any]], doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    titles = {c["check"]: c.get("title") or c["check"] for c in doc.get("checks") or ()}
    rules: dict[str, dict[str, Any]] = {}
    for r in results:
        code, check = r["ruleId"], r["properties"]["check"]
        rule = rules.setdefault(
            code,
            {
                "id": code,
                "name": rule_name(code),
                "shortDescription": {"text": f"{check}: {code}"},
                "fullDescription": {"text": f"opsctl certify check {titles.get(check, check)}"},
                "defaultConfiguration": {"level": r["level"]},
                "properties": {"check": check},
            },
        )
        worst = max(r["level"], rule["defaultConfiguration"]["level"], key=SEVERITY.index)
        rule["defaultConfiguration"]["level"] = worst  # a rule's default level is its worst
    ordered = sorted(rules.values(), key=lambda x: x["id"])
    index = {rule["id"]: i for i, rule in enumerate(ordered)}
    for r in results:
        r["ruleIndex"] = index[r["ruleId"]]
    return ordered


def sarif_log(
    doc: Mapping[str, Any], artifact: Mapping[str, str], tool_version: str | None = None
) -> dict[str, Any]:
    """The SARIF log of one certify document.

    ``artifact``: {"uri", "uriBaseId"?, "description"?}: where every result points. A fleet
    target's document (it has a ``name``): its run is told apart by the name (automation id,
    properties).
    """
    results = _results(doc, artifact)
    rules = _rules(results, doc)
    version = tool_version or str((doc.get("fingerprint") or {}).get("opsctl_version") or "0")
    notes = [
        {
            "level": "note",
            "message": {"text": f"{c['check']} skipped: {c.get('reason')}"},
            "descriptor": {"id": "certify.skipped"},
        }
        for c in doc.get("checks") or ()
        if c.get("verdict") == "skipped"
    ]
    model = model_of(doc) or "model"
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "opsctl certify",
                "semanticVersion": version,
                "rules": rules,
            }
        },
        "automationDetails": {
            "id": f"opsctl-certify/{doc['name']}/"
            if doc.get("name")
            else f"opsctl-certify/{model}/"
        },
        "invocations": [
            {
                "executionSuccessful": doc.get("exit_code") in (0, 1),
                "exitCode": int(doc.get("exit_code") or 0),
                "toolExecutionNotifications": notes,
            }
        ],
        "results": results,
        "properties": {
            "verdict": doc.get("verdict"),
            "summary": doc.get("summary"),
            "fingerprint": doc.get("fingerprint"),
        },
    }
    if doc.get("name"):
        run["properties"].update(
            target=doc["name"], url=(doc.get("target") or {}).get("url"), state=doc.get("state")
        )
    return {"$schema": SCHEMA_URI, "version": VERSION, "runs": [run]}


def artifact_for(cwd: str, config: str | None, report: str) -> dict[str, str]:
    """Where results point: the model's config.json under ``cwd``, else the report file.

    ``cwd`` is the checkout code scanning resolves paths against: a path under it is
    relative (uriBaseId %SRCROOT%), any other an absolute file URI.
    """
    root = PurePosixPath(cwd)
    for path, what in ((config, "the certified model's config.json"), (report, "the report")):
        if path is None:
            continue
        p = PurePosixPath(path)
        if p.is_relative_to(root):
            return {
                "uri": p.relative_to(root).as_posix(),
                "uriBaseId": "%SRCROOT%",
                "description": what,
            }
    return {"uri": PurePosixPath(report).as_uri(), "description": "the report"}


def _config_of(doc: Mapping[str, Any]) -> str | None:
    """The certified model's config.json (from the fingerprint), None when no path."""
    path = ((doc.get("fingerprint") or {}).get("model") or {}).get("path")
    return posixpath.join(path, "config.json") if path else None


def sarif_text(docs: Sequence[Mapping[str, Any]], cwd: str, report: str) -> str:
    """The SARIF file of certify documents written to ``report`` (absolute) from ``cwd``.

    ONE log, one run per document: a single certify document, or a fleet's targets.
    Each run's results are located at the model's config.json when under ``cwd``, else
    at the report itself (:func:`artifact_for`).
    """
    runs = []
    for doc in docs:
        runs += sarif_log(doc, artifact_for(cwd, _config_of(doc), report))["runs"]
    log = {"$schema": SCHEMA_URI, "version": VERSION, "runs": runs}
    return json.dumps(log, indent=2, default=str) + "\n"
