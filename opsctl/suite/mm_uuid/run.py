"""diag mm-uuid as a library call: the identifier each multimodal item reached the core with.

Which identifier each multimodal item reached the
engine core with.

With an :class:`EngineSpec` (default model tiny-vlm-multi) the check opens one engine
per mode through the session, each with the ``mm_uuid`` engine probe on (probe
``mm_uuid``, i.e. OPSCTL_PROBES=mm_uuid): caches-off (prefix caching off and
``--mm-processor-cache-gb 0``, the mode vLLM PR 56432 fixed) and caches-on (the
contrast: missing UUIDs get content hashes). The two modes differ in their vLLM
arguments, so they never share an engine. With a :class:`UrlTarget` it checks that one
engine, in whatever mode it runs; it must have been started by opsctl with the probe on
(its run directory holds the probe's events: found from the URL, or
``Options.run_dir``).

Four cases (all explicit; some explicit and some None; an empty string; none), then a
UUID reused for a different image. A case's items go out ``images_per_request(model)``
at a time (the catalog's ``images_per_prompt`` for the served model, 1 for models opsctl
does not know); the probe's record of each request is found by its request id only.
tiny-vlm-multi (Idefics3) takes several images per prompt, so each case is ONE request;
tiny-vlm (BLIP-2) takes one, and the report then says so (an info finding).

The report's ``to_dict()`` is the ``opsctl.diag.mm_uuid/2`` document. Judgement:
opsctl.suite.mm_uuid.judge; HTTP and the probe's records: opsctl.collectors.mm_uuid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.checks import report as base
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import EngineSpec, Target, UrlTarget
from opsctl.collectors import engine_records, ledger
from opsctl.collectors import mm_uuid as collect
from opsctl.domain import platform as plat
from opsctl.domain import probe_evidence as pe
from opsctl.domain.findings import Finding, verdict
from opsctl.domain.knobs import warning as knob_warning
from opsctl.errors import BadInput, CheckFailed
from opsctl.suite.mm_uuid import judge

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext, Need, Outcome, Planning, ServerRef

SCHEMA = "diag.mm_uuid/2"  # 2: platform is a name or null, platform_note
TITLE = "diag mm-uuid"
DEFAULT_MODEL = judge.DEFAULT_MODEL
PROBE = "mm_uuid"
CACHE_ARGS: dict[str, tuple[str, ...]] = {
    judge.CACHES_OFF: ("--no-enable-prefix-caching", "--mm-processor-cache-gb", "0"),
    judge.CACHES_ON: ("--enable-prefix-caching", "--mm-processor-cache-gb", "4"),
}


@dataclass(frozen=True, slots=True)
class Options:
    """The UUID prefix, the modes to open engines in, the run directory and the waits."""

    uuid_prefix: str = "opsctl"  # prefix of the explicit UUIDs sent
    modes: tuple[str, ...] = judge.MODES  # engines to open for an EngineSpec target
    run_dir: Path | None = None  # a UrlTarget's run directory, when not found by URL
    timeout: float = 120.0  # seconds to wait for each HTTP answer (OpsTimeout past it)
    record_wait: float = 5.0  # seconds to wait for the probe's record of a request

    def __post_init__(self) -> None:
        if not self.modes or any(m not in CACHE_ARGS for m in self.modes):
            raise ValueError(f"modes are {judge.MODES}, not {self.modes!r}")
        if not self.uuid_prefix or any(c.isspace() for c in self.uuid_prefix):
            raise ValueError("uuid_prefix must be a non-empty string without spaces")
        if not self.timeout > 0 or self.record_wait < 0:
            raise ValueError("timeout must be positive and record_wait not negative")


@dataclass(frozen=True)
class MmUuidReport(base.KnobReport):
    """The mm-uuid report (``document`` is the JSON document)."""

    @property
    def items(self) -> list[dict[str, Any]]:
        """One entry per multimodal item sent: what was sent, what arrived, its verdict."""
        return list(self.document["items"])

    @property
    def failed_items(self) -> list[dict[str, Any]]:
        """The items whose verdict is not pass."""
        return [i for i in self.items if i["verdict"] != "pass"]


Report = MmUuidReport  # the name Parts.of reads (opsctl.domain.check_registry)


@dataclass(frozen=True, slots=True)
class ItemResult(ev.CaseResult):
    """One item judged (``name`` is "[mode] case #index"; ``detail`` says why)."""

    sent: str = ""
    identifier: str | None = None
    kind: str = ""

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: what was sent and what arrived."""
        return {"events": [f"{self.name}: sent {self.sent} -> {self.identifier!r} ({self.kind})"]}


@dataclass
class _State:
    """What the check has seen so far (one check run)."""

    observations: list[judge.Observation] = field(default_factory=list)
    reuse: list[judge.Observation] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    images_per_request: int = 1


def images_per_request(model: str) -> int:
    """Images one request carries for the served model ``model``.

    The catalog's ``images_per_prompt`` for an embedded model, else 1 (always accepted)."""
    from opsctl.embedded import catalog

    spec = catalog.CATALOG.get(model)
    return max(1, spec.images_per_prompt) if spec is not None else 1


def model_args(model: str) -> list[str]:
    """Engine arguments the model needs for the check (a multi-image limit)."""
    n = images_per_request(model)
    return ["--limit-mm-per-prompt", json.dumps({"image": n})] if n > 1 else []


def mode_spec(spec: EngineSpec, mode: str, model_name: str) -> EngineSpec:
    """The engine of one mode: the spec with the mode's cache arguments and the probe.

    The spec's model (default tiny-vlm-multi), its cache arguments, the model's image
    limit and the probe."""
    extra = (*spec.extra_args, *CACHE_ARGS[mode], *model_args(model_name))
    return spec.with_defaults(DEFAULT_MODEL, extra_args=extra).with_probes(PROBE)


def run(
    target: Target,
    options: Options,
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> MmUuidReport:
    """Check which identifier each multimodal item reached the engine core with."""
    progress(ev.Started(TITLE))
    progress(ev.Table(tuple(TABLE_COLUMNS), ()))
    state = _State()
    if isinstance(target, UrlTarget):
        _check_url(target, options, progress, session, state)
    else:
        _check_engines(target, options, progress, session, state)
    found = [*judge.findings(state.observations, state.reuse), *probe_findings(state.runs)]
    v = verdict(found)
    rows = tuple(tuple(r) for r in table_rows(state.observations))
    progress(ev.Finished(v, judge.summary(state.observations), rows=rows))
    return MmUuidReport(v, _document(state, options, found, v))


def probe_findings(runs: list[dict[str, Any]]) -> list[Finding]:
    """What each engine's ledger says of the mm_uuid probe.

    Could not hook (fail) or unverified on this vLLM (warning), once per distinct finding."""
    out: dict[tuple[str, str], Finding] = {}
    for r in runs:
        if r.get("run_dir"):
            records = ledger.read_records(Path(r["run_dir"]))
            for f in pe.probe_findings(records, ("mm_uuid",), "mm_uuid"):
                out.setdefault((f.code, f.message), f)
    return list(out.values())


def _document(state: _State, options: Options, found: list, v: str) -> dict[str, Any]:
    from opsctl.output import document

    knobs: dict[str, str] = {}
    for r in state.runs:
        knobs.update(ledger.knobs_of([r["run_dir"]]))
    warning = knob_warning(knobs)
    found_ids = [engine_records.identity(Path(r["run_dir"])) for r in state.runs]
    return document(
        SCHEMA,
        **plat.agreed([p for p, _ in found_ids], plat.NO_RECORD_NOTE),
        vllm_version=plat.joined([v for _, v in found_ids]),
        runs=state.runs,
        uuid_prefix=options.uuid_prefix,
        images_per_request=state.images_per_request,
        items=[
            {**o.to_dict(), "verdict": judge.judge_item(o)[0], "why": judge.judge_item(o)[1]}
            for o in state.observations
        ],
        reuse=[o.to_dict() for o in state.reuse],
        findings=[f.to_dict() for f in found],
        verdict=v,
        test_knobs=knobs,
        warnings=[warning] if warning else [],
    )


def _alert_knobs(run_dir: Path, progress: ev.Progress) -> None:
    if warning := knob_warning(ledger.knobs_of([run_dir])):
        progress(ev.Alert(warning))


def _check_url(
    target: UrlTarget,
    options: Options,
    progress: ev.Progress,
    session: EngineSession | None,
    state: _State,
) -> None:
    with opened(target, session, progress, label="diag-mm-uuid") as live:
        run_dir = options.run_dir or live.run_dir
        if run_dir is None or not run_dir.is_dir():
            raise BadInput(
                f"no opsctl run directory found for {live.url}",
                hint="start the engine with opsctl (OPSCTL_PROBES=mm_uuid) or pass --run RUN",
            )
        applied, why = judge.probe_state(collect.probe_entries(run_dir))
        if not applied:
            raise BadInput(
                f"the mm_uuid engine probe is not active on {live.url} ({why})",
                hint="start the engine with OPSCTL_PROBES=mm_uuid in its environment",
            )
        mode, settings = judge.engine_mode(collect.engine_info(run_dir))
        _alert_knobs(run_dir, progress)
        _check_mode(live.url, run_dir, live.api_key, mode, options, progress, state)
        state.runs.append(
            {
                "mode": mode,
                "url": live.url,
                "run_dir": str(run_dir),
                "settings": settings,
                "engine_started": False,
            }
        )


def _check_engines(
    spec: EngineSpec,
    options: Options,
    progress: ev.Progress,
    session: EngineSession | None,
    state: _State,
) -> None:
    from opsctl.engine.model import resolve

    resolved = resolve(spec.model or DEFAULT_MODEL)
    if resolved.archetype != "vision-language":
        raise BadInput(
            f"{resolved.name} is a {resolved.archetype} model; diag mm-uuid needs a "
            f"vision-language model (e.g. {DEFAULT_MODEL})"
        )
    for mode in options.modes:
        progress(ev.Phase(f"starting engine ({mode})"))
        engine = mode_spec(spec, mode, resolved.name)
        with opened(engine, session, progress, label=f"diag-mm-uuid-{mode}") as live:
            assert live.run_dir is not None  # an engine opsctl started has one
            _alert_knobs(live.run_dir, progress)
            applied, why = judge.probe_state(collect.probe_entries(live.run_dir))
            if not applied:
                raise CheckFailed(f"the mm_uuid engine probe did not apply ({why})")
            seen_mode, settings = judge.engine_mode(collect.engine_info(live.run_dir))
            _check_mode(live.url, live.run_dir, live.api_key, mode, options, progress, state)
            state.runs.append(
                {
                    "mode": mode,
                    "url": live.url,
                    "run_dir": str(live.run_dir),
                    "settings": settings,
                    "engine_started": True,
                    "settings_mode": seen_mode,
                }
            )


def _check_mode(
    url: str,
    run_dir: Path,
    api_key: str | None,
    mode: str,
    options: Options,
    progress: ev.Progress,
    state: _State,
) -> None:
    """Every case, then the reused UUID, against one engine in ``mode``."""
    with collect.ChatSender(url, run_dir, options.timeout, api_key, options.record_wait) as sender:
        per_request = images_per_request(sender.served_model())
        state.images_per_request = per_request
        for case in judge.default_cases(options.uuid_prefix):
            for group in judge.batches(case.items, per_request):
                reply = sender.send([item for _, item in group])
                refusal = judge.image_refusal(reply, not state.observations, url, DEFAULT_MODEL)
                if refusal is not None:
                    raise refusal
                observed = judge.observe(mode, case.name, group, reply)
                state.observations.extend(observed)
                progress(ev.Phase(f"{mode}: {case.name}"))
                rows = tuple(tuple(r) for r in table_rows(state.observations))
                progress(ev.Table(tuple(TABLE_COLUMNS), rows))
                for o in observed:
                    progress(_item_result(o))
        reuse = judge.reuse_case(options.uuid_prefix)
        for i, item in enumerate(reuse.items):
            # one request per item: the point is what a LATER request gets for the UUID
            (o,) = judge.observe(mode, reuse.name, [(i, item)], sender.send([item]))
            state.reuse.append(o)
            progress(ev.Phase(f"{mode}: UUID reuse"))
            progress(
                ev.Log(
                    f"[{mode}] reuse #{i}: {item.color} sent {o.sent} -> {o.identifier!r}, "
                    f"output {o.output!r}"
                )
            )


def _item_result(o: judge.Observation) -> ItemResult:
    v, why = judge.judge_item(o)
    return ItemResult(f"[{o.mode}] {o.case} #{o.index}", v, why, o.sent, o.identifier, o.kind)


def certify(ctx: CertifyContext, progress: ev.Progress) -> MmUuidReport:
    """The mm-uuid check as certify runs it (both cache modes, certify's timeout)."""
    return run(ctx.target, Options(timeout=ctx.timeout), progress, ctx.session)


def shared_engine(spec: EngineSpec, planning: Planning, options: None) -> EngineSpec:
    """For a multimodal model the engine certify's checks share is the caches-off one."""
    if not planning.subject.multimodal:
        return spec
    return mode_spec(spec, judge.CACHES_OFF, planning.subject.model or "")


def engines(planning: Planning, options: None) -> Need:
    """Under certify: the run's common settings, one engine per cache mode."""
    from opsctl.checks.registry import Need

    model = planning.subject.model or ""
    return Need(planning.common, tuple(mode_spec(planning.common, m, model) for m in judge.MODES))


def on_server(server: ServerRef, progress: ev.Progress) -> MmUuidReport:
    """The mm-uuid check on a console's server (its run directory holds the probe's records)."""
    return run(server.url, Options(run_dir=server.run_dir), progress)


def outcome(report: MmUuidReport, options: Options) -> Outcome:
    """The exit rule: 1 when any item did not reach the engine core as expected."""
    from opsctl.checks.registry import Outcome

    info = (f"mm-uuid check: {report.verdict}",)
    warnings = (report.knob_warning,) if report.knob_warning else ()
    if report.verdict == "pass":
        return Outcome(info, warnings)
    if report.verdict in base.NOT_JUDGED:  # not judged: never a pass, never read as a fail
        why = f"mm-uuid {report.verdict} (not judged, so not a pass): see the report's findings"
        return Outcome(info, warnings, failure=CheckFailed(why))
    failed = (
        f"{len(report.failed_items)} multimodal item(s) did not reach the engine core as expected"
    )
    return Outcome(info, warnings, failure=CheckFailed(failed))


# ---- the results tables (live panel and terminal report) ---------------------


TABLE_COLUMNS = [
    "mode",
    "case",
    "#",
    "image",
    "uuid sent",
    "identifier at engine core",
    "kind",
    "verdict",
]


def table_rows(observations: list[judge.Observation]) -> list[list[str]]:
    """The rows of the results table, one per observation, its verdict last."""
    rows = []
    for o in observations:
        v, _ = judge.judge_item(o)
        rows.append(
            [o.mode, o.case, str(o.index), o.color, o.sent, _show(o.identifier), o.kind, v.upper()]
        )
    return rows


def reuse_rows(observations: list[judge.Observation]) -> list[list[str]]:
    """The rows of the reuse table, one per observation, its output last."""
    return [
        [o.mode, o.case, str(o.index), o.color, o.sent, _show(o.identifier), o.kind, repr(o.output)]
        for o in observations
    ]


def _show(identifier: str | None) -> str:
    if identifier is None:
        return "(not recorded)"
    if identifier == "":
        return "'' (empty)"
    return identifier
