"""JUnit XML of certify documents (pure), as CI test reporters read it.

The readers: GitHub Actions test-report actions, GitLab's junit artifacts, Jenkins' junit step.

``testsuites`` > one ``testsuite`` per certified target > one ``testcase`` per check,
with ``failure`` (the check failed on its findings), ``error`` (it could not finish:
engine died, timeout) or ``skipped`` (with the reason); the message is the first
finding, the element text every finding with its details. The suite's ``properties``
carry the fingerprint (flattened to dotted names). Valid against the Jenkins xunit
plugin's junit-10.xsd (the test data under tests/data/schemas).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opsctl.domain.certify import NOT_JUDGED
from opsctl.ui.render_certify import title_of

PACKAGE = "opsctl.certify"
# characters XML 1.0 cannot carry at all (ElementTree writes them anyway: invalid XML)
_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def clean(text: object) -> str:
    """``text`` as XML can carry it (control characters such as ESC become U+FFFD)."""
    return _NOT_XML.sub("\ufffd", str(text))


def _time(seconds: Any) -> str:
    try:
        return f"{max(0.0, float(seconds)):.3f}"
    except (TypeError, ValueError):
        return "0.000"


def flatten(value: Any, prefix: str) -> Iterator[tuple[str, str]]:
    """(dotted name, text) pairs of a nested mapping; lists as compact JSON."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}.{k}")
    elif isinstance(value, list | tuple):
        yield prefix, clean(json.dumps(value, separators=(",", ":"), default=str))
    else:
        yield prefix, "" if value is None else clean(value)


def suite_name(doc: Mapping[str, Any]) -> str:
    """The run's title; a fleet target's (it has a ``name``) starts with its name."""
    return f"{doc['name']}: {title_of(doc)}" if doc.get("name") else title_of(doc)


def _finding_text(findings: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{f.get('severity')}: {f.get('code')}: {f.get('message')}")
        if f.get("details"):
            lines.append("  details: " + json.dumps(f["details"], default=str)[:2000])
    return clean("\n".join(lines))


def _first(findings: Sequence[Mapping[str, Any]], severity: str) -> Mapping[str, Any] | None:
    return next((f for f in findings if f.get("severity") == severity), None)


def testcase(check: Mapping[str, Any], target: str | None = None) -> ET.Element:
    """``target``: a fleet target's name, in the classname (one class per target)."""
    name = str(check["check"])
    case = ET.Element(
        "testcase",
        name=name,
        classname=clean(f"{PACKAGE}.{target}.{name}" if target else f"{PACKAGE}.{name}"),
        time=_time(check.get("duration_s")),
    )
    findings = list(check.get("findings") or [])
    verdict = check.get("verdict")
    message = clean(check.get("first_finding") or check.get("reason") or verdict)
    if verdict == "skipped":
        ET.SubElement(case, "skipped", message=clean(check.get("reason") or "skipped"))
    elif verdict in ("fail", "error", *NOT_JUDGED):
        # not judged (unverified, inconclusive) is a failure whose type says so: a CI gate
        # fails closed, and the reader sees it was no wrong result
        first = _first(findings, "fail")
        kind = "error" if verdict == "error" else "failure"
        code = first["code"] if first else f"{name}.{verdict}"
        if verdict in NOT_JUDGED:
            code = f"{name}.{verdict}"
        el = ET.SubElement(case, kind, type=clean(code), message=message)
        el.text = _finding_text(findings) or message
    if findings and verdict != "skipped":
        ET.SubElement(case, "system-out").text = _finding_text(findings)
    return case


def testsuite(doc: Mapping[str, Any], timestamp: str | None = None) -> ET.Element:
    """One document's ``testsuite``: counts, time, properties and a ``testcase`` per check."""
    checks = list(doc.get("checks") or [])
    attrs = {
        "name": clean(suite_name(doc)),
        "tests": str(len(checks)),
        "failures": str(sum(c.get("verdict") in ("fail", *NOT_JUDGED) for c in checks)),
        "errors": str(sum(c.get("verdict") == "error" for c in checks)),
        "skipped": str(sum(c.get("verdict") == "skipped" for c in checks)),
        "time": _time(doc.get("duration_s")),
    }
    if timestamp:
        attrs["timestamp"] = timestamp
    suite = ET.Element("testsuite", attrs)
    props = ET.SubElement(suite, "properties")
    pairs = [("verdict", str(doc.get("verdict"))), ("schema", str(doc.get("schema")))]
    if doc.get("name"):  # a fleet target
        pairs = [("target", clean(doc["name"])), ("verdict", str(doc.get("verdict")))]
        pairs += [("state", str(doc.get("state")))]
        pairs += list(flatten(doc.get("labels") or {}, "labels"))
    pairs += list(flatten(doc.get("fingerprint") or {}, "fingerprint"))
    pairs += list(flatten(doc.get("summary") or {}, "summary"))
    for name, value in pairs:
        ET.SubElement(props, "property", name=name, value=value)
    for check in checks:
        suite.append(testcase(check, doc.get("name")))
    return suite


def junit_xml(docs: Sequence[Mapping[str, Any]], timestamp: str | None = None) -> str:
    """The JUnit XML document (text) for one or more certify documents."""
    root = ET.Element("testsuites", name="opsctl certify")
    suites = [testsuite(d, timestamp) for d in docs]
    for key, tag in (("tests", "tests"), ("failures", "failures"), ("errors", "errors")):
        root.set(tag, str(sum(int(s.get(key) or 0) for s in suites)))
    root.set("time", _time(sum(float(d.get("duration_s") or 0) for d in docs)))
    root.extend(suites)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
