"""Upgrade preflight as a library call: each patch and probe against another vLLM release.

`opsctl patches --against VERSION|WHEEL`: read a vLLM release's sources without installing
it and say, per patch and probe of :mod:`engine_patches`, whether its targets exist, whether
they are unchanged against the release it was verified on, whether the fix is already
upstream (the patch's own rule, the one its apply function runs), and what changed around
it.

``run(source, options, progress) -> Report`` (schema ``opsctl.preflight/1``). ``source``
is a version (``"0.33.0"``: its wheel, cached under ``$OPSCTL_HOME/wheels`` or
downloaded there once), a wheel file, or None for the installed vLLM. The verified
release's hashes are data in the repo (``engine_patches/verified_hashes.json``,
written by :func:`record_hashes`), so no verified release needs to be installed; its
text (installed, or its cached wheel) only adds diff excerpts.

Verdict per patch (worst first): missing (a target is gone: the patch is skipped, the
probe records nothing), upstream (its own rule finds the fix upstream: it stands down),
changed (a target's code differs from the verified release), review (targets
identical, code it relies on changed), unchanged, unknown (nothing recorded). The
report: fail when a target is missing (exit 1), unverified when one changed or needs
review or cannot be compared (exit 0 with a warning), pass otherwise. Bad input (not a
version, no such wheel) is BadInput.

Example::

    from opsctl.checks import preflight
    report = preflight.run("0.33.0")
    for p in report.to_dict()["patches"]: print(p["name"], p["verdict"])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsctl.checks import events as ev
from opsctl.checks.report import FAIL, PASS, UNVERIFIED, Report
from opsctl.domain import kv_routes
from opsctl.domain import preflight as preflight_dom

SCHEMA = "preflight"
TITLE = "patches --against"
COLUMNS = ("patch", "kind", "exists", "unchanged", "upstream", "changed around", "verdict")


def hashes_path() -> Path:
    """The path of the verified release's hashes, shipped with engine_patches."""
    import engine_patches

    return Path(engine_patches.__file__).parent / "verified_hashes.json"


@dataclass(frozen=True, slots=True)
class Options:
    """The wheel cache, the verified hashes and whether to read the baseline's text."""

    cache: Path | None = None  # wheel cache (default $OPSCTL_HOME/wheels)
    hashes: Path | None = None  # verified hashes (default engine_patches/verified_hashes.json)
    baseline: bool = True  # read the verified release's text (installed or cached) for diffs


def _patches() -> list[Any]:
    from engine_patches import catalog

    return catalog.patches()


def _all_symbols(patches) -> list[str]:
    return list(
        dict.fromkeys(
            s for p in patches for s in (*p.symbols, *p.watch, *(alt for _, alt in p.alternatives))
        )
    )


class _Texts:
    """Symbol and scope lookups on one reader, each module parsed text read once."""

    def __init__(self, reader) -> None:
        self.reader = reader
        self._modules: dict[str, str | None] = {}

    def module(self, name: str) -> str | None:
        if name not in self._modules:
            self._modules[name] = self.reader.read(name)
        return self._modules[name]

    def symbol(self, symbol: str) -> str | None:
        module, qualname = preflight_dom.split(symbol)
        return preflight_dom.extract(self.module(module), qualname)

    def scope(self, scope: str) -> dict[str, str] | None:
        module, qualname = preflight_dom.split(scope)
        return preflight_dom.members(self.module(module), qualname)


def record_hashes(reader, patches=None) -> dict:
    """The digests of a release that ``verified_hashes.json`` keeps per verified release.

    ``{"symbols": {symbol: digest}, "scopes": {scope: {member: digest}}}``."""
    texts = _Texts(reader)
    names = _all_symbols(patches if patches is not None else _patches())
    return {
        "symbols": {s: preflight_dom.digest(texts.symbol(s)) for s in names},
        "scopes": {
            sc: texts.scope(sc) for sc in dict.fromkeys(preflight_dom.scope_of(s) for s in names)
        },
    }


def write_hashes(reader, path: Path | None = None) -> Path:
    """Record ``reader``'s release into the hashes file (the verified releases' data)."""
    path = path or hashes_path()
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[str(reader.version).split("+")[0]] = record_hashes(reader)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def _verified_release(patch, recorded: dict) -> str | None:
    """The newest release the patch was verified on that has recorded hashes."""
    known = [r for r in patch.verified_on if r in recorded]
    return (
        max(known, key=lambda r: tuple(int(x) for x in r.split(".") if x.isdigit()))
        if known
        else None
    )


def _baseline_reader(release: str | None, options: Options):
    from opsctl.collectors import vllm_sources as S

    if release is None or not options.baseline:
        return None
    if (S.installed_version() or "").split("+")[0] == release:
        return S.InstalledSources()
    wheel = S.cached_wheel(release, options.cache)
    return S.WheelSources(wheel) if wheel is not None else None


def assess(
    patch, target: _Texts, recorded: dict, baseline: _Texts | None
) -> preflight_dom.PatchFinding:
    """One patch against the target release's texts."""
    release = _verified_release(patch, recorded)
    data = recorded.get(release or "", {})
    digests, scopes = data.get("symbols"), data.get("scopes", {})

    def finding(symbol: str) -> preflight_dom.SymbolFinding:
        old = baseline.symbol(symbol) if baseline is not None else None
        if old is not None and preflight_dom.digest(old) != (digests or {}).get(symbol):
            old = None  # the text at hand is not the verified release's
        return preflight_dom.symbol_finding(symbol, target.symbol(symbol), digests, old)

    instead = dict(patch.alternatives)
    targets, replaced = [], []
    for s in patch.symbols:
        found = finding(s)
        if not found.exists and s in instead:
            alt = finding(instead[s])
            if alt.exists:  # this release lacks the target; the patch uses the other
                found = alt
                replaced.append((s, instead[s]))
        targets.append(found)
    upstream, why = None, None
    if patch.upstream is not None:
        upstream, why = patch.upstream({s: target.symbol(s) for s in patch.symbols})
    around = {
        sc: preflight_dom.changed_members(scopes.get(sc), target.scope(sc))
        for sc in dict.fromkeys(preflight_dom.scope_of(s) for s in (*patch.symbols, *patch.watch))
    }
    return preflight_dom.PatchFinding(
        name=patch.name,
        kind=patch.kind,
        verified_on=tuple(patch.verified_on),
        targets=tuple(targets),
        watched=tuple(finding(s) for s in patch.watch),
        replaced=tuple(replaced),
        attributes=tuple(
            preflight_dom.attribute_finding(a, target.symbol(a.rsplit(".", 1)[0]))
            for a in patch.attributes
        ),
        upstream=upstream,
        upstream_why=why,
        around=around,
    )


def table_row(p: dict) -> tuple[str, ...]:
    """One row of the preflight table for patch or probe ``p``."""

    def yn(v) -> str:
        return "-" if v is None else ("yes" if v else "no")

    return (
        p["name"],
        p["kind"],
        yn(p["exists"]),
        yn(p["unchanged"]),
        "n/a" if p["upstream_why"] is None else yn(p["upstream"]),
        str(p["changed_around_count"]),
        p["verdict"],
    )


def _verdict(findings: list[preflight_dom.PatchFinding]) -> str:
    verdicts = {f.verdict for f in findings}
    if preflight_dom.MISSING in verdicts:
        return FAIL
    if verdicts & {preflight_dom.CHANGED, preflight_dom.REVIEW, preflight_dom.UNKNOWN}:
        return UNVERIFIED
    return PASS


def run(
    source: str | Path | None, options: Options = Options(), progress: ev.Progress = ev.ignore
) -> Report:
    """Preflight of every patch and probe against ``source``; see the module doc."""
    from opsctl.collectors import vllm_sources as S
    from opsctl.output import document

    progress(ev.Started(TITLE, str(source or "installed vLLM")))
    progress(ev.Phase("reading the release's sources"))
    reader = S.open_sources(source, options.cache, log=lambda t: progress(ev.Log(t)))
    hashes = options.hashes or hashes_path()
    recorded = json.loads(hashes.read_text()) if hashes.is_file() else {}
    patches = _patches()
    releases = {_verified_release(p, recorded) for p in patches} - {None}
    baseline_reader = _baseline_reader(max(releases) if releases else None, options)
    try:
        target = _Texts(reader)
        baseline = _Texts(baseline_reader) if baseline_reader is not None else None
        findings = [assess(p, target, recorded, baseline) for p in patches]
        routes = kv_routes.routes({m: target.module(m) for m in kv_routes.MODULES})
    finally:
        reader.close()
        if baseline_reader is not None:
            baseline_reader.close()
    rows = [f.to_dict() for f in findings]
    version = reader.version
    release = (version or "").split("+")[0] or None
    for row, patch in zip(rows, patches, strict=True):
        row["verified"] = None if release is None else release in patch.verified_on
        row["note"] = None if row["verified"] in (True, None) else f"unverified on {release}"
    verdict = _verdict(findings)
    doc = document(
        SCHEMA,
        vllm_version=version,
        source={
            "kind": "installed" if isinstance(reader, S.InstalledSources) else "wheel",
            "path": reader.origin,
        },
        verified_releases=sorted(releases),
        baseline_path=None if baseline_reader is None else baseline_reader.origin,
        verdict=verdict,
        patches=rows,
        kv_failure_routes=[r.to_dict() for r in routes],
    )
    progress(ev.Finished(verdict, f"{len(rows)} patches and probes", tuple(map(table_row, rows))))
    return Report(verdict, doc)
