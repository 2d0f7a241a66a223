"""`diag lora` as a library call: LoRA adapters alone and in one mixed batch.

LoRA adapters applied alone and in one mixed batch (vLLM
PR 55897: LoRA on multimodal towers and connectors; does a mixed-adapter batch map each
request and each image to its own adapter?).

Cases (decisions in :mod:`opsctl.suite.lora.judge`):

1. single-adapter validation: every request alone with every adapter and with the base
   model; each adapter must change the output (it is really applied);
2. one mixed batch: requests with adapter A, adapter B (C...) and none, several images
   per request on a multi-image model, sent together; each output must equal the same
   request run alone with the same adapter (tokens exact, logprobs by the invariance
   rules); the batch probe must show requests of different adapters in one step;
3. support per part (language model, vision tower, connector) from the engine's LoRA
   manager (the ``lora`` probe) and the measurements; unsupported parts say so.

Against an :class:`~opsctl.checks.target.EngineSpec` the check starts the engine (default
tiny-llama) with ``--enable-lora``, ``--max-loras`` (one slot per adapter unless
``Options.max_loras``),
``--max-lora-rank``, ``--lora-modules`` (the model's embedded adapters, or
``Options.adapters``), ``--enable-tower-connector-lora`` on a vision-language model,
prefix caching off, the batch and lora probes, and without ``--enforce-eager`` (the
engine records the compilation mode vLLM picks: NONE, forced for LoRA on CPU). Against a
:class:`~opsctl.checks.target.UrlTarget` it uses the adapters the server lists, or loads
``Options.adapters`` (or the embedded ones of an embedded model) through vLLM's dynamic
LoRA loading when the server allows it, and unloads what it loaded.

Example::

    from opsctl.suite.lora import run as lora
    from opsctl.checks.target import EngineSpec
    report = lora.run(EngineSpec(model="tiny-vlm-multi"), lora.Options())
    print(report.verdict, report.support, report.first_divergence)
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from engine_patches.patches import batch_gate
from opsctl.checks import events as ev
from opsctl.checks.report import ReasonedReport
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import EngineSpec, Live, Target
from opsctl.collectors import engine_records, ledger
from opsctl.domain import findings as fd
from opsctl.domain import platform as plat
from opsctl.domain import probe_evidence as pe
from opsctl.domain.knobs import warning as knob_warning
from opsctl.errors import BadInput, CheckFailed
from opsctl.suite.invariance import judge as inv
from opsctl.suite.invariance import judge_calibration as cal
from opsctl.suite.lora import collect as collect
from opsctl.suite.lora import judge, judge_support
from opsctl.suite.lora.run_plan import (
    Adapter,
    Options,
    Plan,
    embedded_adapters,
    images_for,
    plan,
)

if TYPE_CHECKING:
    from pathlib import Path

    from opsctl.checks.registry import Outcome

TITLE = "diag lora"
SCHEMA = "diag.lora/3"  # 3: calibration, inconclusive, seeds sweep (seeds, sweep, totals)


class LoraReport(ReasonedReport):
    """The ``opsctl.diag.lora/3`` document and its verdict."""

    @property
    def support(self) -> dict[str, str]:
        """Each part's LoRA support status (language model, vision tower, connector)."""
        return {p["part"]: p["status"] for p in self.document["support"]}

    @property
    def first_divergence(self) -> dict[str, Any] | None:
        """Where the mixed batch first differed from the requests alone (None: nowhere)."""
        return self.document["mixed"]["first_divergence"]


Report = LoraReport  # the name Parts.of reads (opsctl.domain.check_registry)


# ---- run ------------------------------------------------------------------------------------


def run(
    target: Target,
    options: Options,
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> LoraReport:
    """Run every case on ``target``; see the module doc."""
    p = plan(target, options)
    tag = options.tag or f"opsctl-lora-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    progress(ev.Started(TITLE, "adapters alone, then one mixed batch"))
    progress(ev.Table(COLUMNS, ()))
    docs: list[tuple[int | None, LoraReport]] = []
    with opened(p.target, session, progress, label="diag-lora") as live:
        engine_s = time.monotonic() - started
        if line := knob_warning(ledger.knobs_of([live.run_dir])):
            progress(ev.Alert(line))
        job = _Job(live, options, tag, progress)
        try:
            job.prepare(p)
            for seed in options.seeds or (None,):  # a sweep: every seed on this one engine
                t0 = time.monotonic()
                job.tag = tag if seed is None else f"{tag}-s{seed}"
                measured = job.measure(seed)
                seconds = {"engine": engine_s, "total": time.monotonic() - t0 + engine_s}
                docs.append((seed, _decide(job, measured, seconds)))
                engine_s = 0.0
        finally:
            job.unload()
    return swept(docs, tag, time.monotonic() - started)


def swept(docs: list[tuple[int | None, LoraReport]], tag: str, seconds: float) -> LoraReport:
    """The report of every seed (one seed: its report as it is).

    A sweep's report details its first seed that did not pass (else its last), with the
    sweep's verdict, every seed's line and the totals."""
    verdicts = [r.verdict for _, r in docs]
    verdict = cal.sweep_verdict(verdicts) if len(docs) > 1 else verdicts[0]
    seed, shown = next(((s, r) for s, r in docs if r.verdict != judge.PASS), docs[-1])
    doc = shown.to_dict()
    reasons = doc["reasons"]
    if len(docs) > 1:
        reasons = [f"[seed {s}] {x}" for s, r in docs for x in r.reasons]
    sweep = [
        {"seed": s, "verdict": r.verdict, "reasons": r.reasons, **_calibration_line(r)}
        for s, r in docs
    ]
    doc.update(
        verdict=verdict,
        reasons=reasons,
        seeds=[s for s, _ in docs] if docs[0][0] is not None else None,
        detail_seed=seed,
        sweep=sweep,
        totals=cal.sweep_totals(verdicts),
        request_tag=tag,
    )
    doc["durations_s"]["total"] = round(seconds, 2)
    return LoraReport(verdict, doc)


def _calibration_line(r: LoraReport) -> dict[str, Any]:
    c = r.document["calibration"]
    return {"floor": c["floor"], "sensitivity": c["sensitivity"], "conclusive": c["conclusive"]}


@dataclass(frozen=True)
class _Attempt:
    """One send of the mixed batch (its own request-id tag)."""

    tag: str
    batched: tuple[inv.Generated, ...]
    seconds: float


@dataclass(frozen=True)
class _Measured:
    mixed: tuple[judge.LoraRequest, ...]
    alone: dict[judge.Key, inv.Generated]
    alone_seconds: float
    attempts: tuple[_Attempt, ...]  # the last one is the mixed batch judged
    facts: collect.EngineFacts
    identity: tuple[str | None, str | None]  # (platform, vLLM version) of the engine
    control: dict[int, inv.Generated] = field(default_factory=dict)  # base alone, again


class _Job:
    """One run of the check on one live server: its adapters, requests and progress."""

    def __init__(self, live: Live, options: Options, tag: str, progress: ev.Progress) -> None:
        self.live, self.options, self.tag, self.progress = live, options, tag, progress
        self.adapters: list[Adapter] = []
        self.loaded: list[str] = []
        self.images = 0
        self.served = collect.Served("")
        self.rows: list[tuple[str, ...]] = []

    def prepare(self, p: Plan) -> None:
        """The served model, the adapters (loaded at runtime on a URL when needed) and
        the images per request."""
        self.served = collect.served(self.live.url, api_key=self.live.api_key)
        if isinstance(p.target, EngineSpec):
            self.adapters, self.images = list(p.adapters), p.images or 0
            return
        self.adapters = self._url_adapters(list(p.adapters))
        archetype = self._archetype()
        self.images = (
            p.images
            if p.images is not None
            else images_for(self.served.base, archetype, self.options)
        )

    def _archetype(self) -> str | None:
        from opsctl.embedded import catalog
        from opsctl.engine.model import archetype_of

        spec = catalog.CATALOG.get(self.served.base)
        if spec is not None:
            return spec.archetype
        config = collect.model_config(self.served.base_root)
        return archetype_of(config) if config is not None else None

    def _url_adapters(self, wanted: list[Adapter]) -> list[Adapter]:
        url, listed = self.live.url, self.served.adapters
        if not wanted:
            have = [collect.served_adapter(n, root) for n, root in listed.items()]
            if len(have) >= 2:
                return [Adapter(n, path, "server", parts, rank) for n, path, parts, rank in have]
            from opsctl.embedded import lora as built

            if self.served.base not in built.ADAPTERS:
                raise BadInput(
                    f"{url} lists {len(have)} LoRA adapter(s); the mixed batch needs 2",
                    hint="start it with --enable-lora --lora-modules NAME=DIR ..., or pass "
                    "--adapters DIR ... to a server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
                )
            wanted = embedded_adapters(self.served.base)
        for a in wanted:
            if a.name not in listed:
                self._load(a)
        return wanted

    def _load(self, a: Adapter) -> None:
        assert a.path is not None
        status, text = collect.load_adapter(
            self.live.url, a.name, a.path, api_key=self.live.api_key
        )
        if status == 404:
            raise BadInput(
                f"{self.live.url} does not allow runtime LoRA loading (no /v1/load_lora_adapter)",
                hint="start it with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, or with --lora-modules",
            )
        if status != 200:
            raise BadInput(f"{self.live.url} refused adapter {a.name}: HTTP {status}: {text}")
        self.loaded.append(a.name)
        self.progress(ev.Log(f"loaded adapter {a.name} from {a.path} (runtime LoRA loading)"))

    def unload(self) -> None:
        for name in self.loaded:
            collect.unload_adapter(self.live.url, name, api_key=self.live.api_key)

    def _on_done(self, phase: str, total: int):
        done = [0]

        def on_done(req: judge.LoraRequest, res: collect.Timed) -> None:
            done[0] += 1
            g = res.generated
            state = "error: " + g.error if g.error else f"{len(g.token_ids)} tokens"
            self.progress(ev.Phase(phase, done[0], total))
            self.progress(ev.Log(f"{phase}: {req.describe()}: {state} in {res.seconds:.2f} s"))

        return on_done

    def measure(self, seed: int | None = None) -> _Measured:
        """Every request alone (with the base model and each adapter), the base requests
        alone again (the noise floor), then the mixed batch. ``seed``: its prompt set."""
        o, key, url = self.options, self.live.api_key, self.live.url
        names = [a.name for a in self.adapters]
        prompts = judge.PROMPTS if seed is None else cal.seeded_prompts(seed, len(judge.PROMPTS))
        mixed = judge.plan_mixed(names, self.images, prompts=prompts)
        alone_reqs = judge.alone_plan(mixed, names)
        params = collect.Params(self.served.base, o.max_tokens, o.logprobs, o.request_timeout)
        phase = f"alone: {len(alone_reqs)} requests one at a time"
        self.progress(ev.Phase(phase, 0, len(alone_reqs)))
        t0 = time.monotonic()
        alone = collect.run_alone(
            url, params, alone_reqs, self.tag, self._on_done(phase, len(alone_reqs)), api_key=key
        )
        base = [r.with_adapter(None) for r in mixed]
        phase = f"control: {len(base)} base-model requests alone again (the noise floor)"
        self.progress(ev.Phase(phase, 0, len(base)))
        control = collect.run_alone(
            url, params, base, f"{self.tag}-ctl", self._on_done(phase, len(base)), api_key=key
        )
        t_alone = time.monotonic() - t0
        attempts, facts = self._send_mixed(params, mixed)
        return _Measured(
            mixed,
            {(r.adapter, r.index): t.generated for r, t in zip(alone_reqs, alone, strict=True)},
            t_alone,
            tuple(attempts),
            facts,
            engine_records.identity_at(self.live.run_dir, url, key),
            {r.index: t.generated for r, t in zip(base, control, strict=True)},
        )

    def _send_mixed(
        self, params: collect.Params, mixed: tuple[judge.LoraRequest, ...]
    ) -> tuple[list[_Attempt], collect.EngineFacts]:
        """Send the mixed batch; again (up to ``attempts``) while the batch probe shows a
        request that never shared a step with another adapter's request (a request can
        finish before the next one arrives). Each send carries a gather marker: an engine
        with the ``gate`` probe (every engine this check starts) holds the requests until
        all arrived, so they are scheduled together; other servers ignore it."""
        out: list[_Attempt] = []
        for k in range(1, self.options.attempts + 1):
            tag = f"{self.tag}-{k}-{batch_gate.marker(len(mixed))}"
            phase = f"mixed batch: {len(mixed)} requests sent together (attempt {k})"
            self.progress(ev.Phase(phase, 0, len(mixed)))
            t0 = time.monotonic()
            together = collect.run_together(
                self.live.url,
                params,
                mixed,
                tag,
                self._on_done(phase, len(mixed)),
                api_key=self.live.api_key,
            )
            out.append(_Attempt(tag, tuple(t.generated for t in together), time.monotonic() - t0))
            facts = collect.engine_facts(self.live.run_dir, tag, len(mixed))
            evidence = judge.mixed_evidence(facts.steps, tag, mixed)
            if evidence.formed is not False:
                break
            self.progress(
                ev.Log(
                    f"attempt {k}: request(s) {list(evidence.apart)} never shared a step with "
                    "another adapter's request",
                    level="warning",
                )
            )
        return out, facts


# ---- decide and report ----------------------------------------------------------------------


def _single(job: _Job, m: _Measured) -> list[judge.SingleResult]:
    o, indexes = job.options, [r.index for r in m.mixed]
    return [
        judge.judge_single(a.name, indexes, m.alone, max_tokens=o.max_tokens, logprobs=o.logprobs)
        for a in job.adapters
    ]


def _decide(job: _Job, m: _Measured, seconds: dict[str, float]) -> LoraReport:
    o, facts = job.options, m.facts
    names = [a.name for a in job.adapters]
    indexes = [r.index for r in m.mixed]
    single = _single(job, m)
    kw = {"max_tokens": o.max_tokens, "logprobs": o.logprobs}
    calib = judge.calibration(
        m.alone, m.control, names, indexes, max_tokens=o.max_tokens, atol=o.atol
    )
    atol = calib.atol_for_compare() if not math.isinf(calib.floor) else o.atol
    sends = [judge.compare_mixed(m.mixed, m.alone, a.batched, atol=atol, **kw) for a in m.attempts]
    rows, last = sends[-1], m.attempts[-1]
    evidence = judge.mixed_evidence(facts.steps, last.tag, m.mixed)
    tower = (
        judge.mixed_evidence(facts.encoder, last.tag, m.mixed, event="encoder", source="lora probe")
        if job.images
        else None
    )
    found = judge.assess(
        single,
        rows,
        evidence,
        same_pairs=judge.identical_pairs(names, indexes, m.alone, **kw),
        alone_shared_max=judge.alone_shared(facts.steps, job.tag),
        swaps=facts.swaps,
        tower=tower,
        earlier=sends[:-1],
    )
    found = with_probe_findings(found, job.live.run_dir)
    found = calibrated(found, calib, single, evidence)
    parts = judge_support.support(
        job.images > 0,
        facts.manager,
        facts.adapters,
        {a.name: a.parts for a in job.adapters},
        single,
    )
    table = table_rows(single, rows, parts)
    for r in rows:
        if not r.result.passed:
            job.progress(
                ev.CaseResult(f"mixed {r.request.describe()}", judge.FAIL, r.result.status)
            )
    job.progress(ev.Table(COLUMNS, table))
    job.progress(ev.Finished(found.verdict, "; ".join(found.reasons) or "every case passed", table))
    seconds = {**seconds, "alone": m.alone_seconds, "mixed": sum(a.seconds for a in m.attempts)}
    doc = _document(job, m, found, single, sends, (evidence, tower), parts, seconds)
    doc["calibration"] = calib.to_dict()
    return LoraReport(found.verdict, doc)


def calibrated(
    found: judge.Findings,
    calib: cal.Calibration,
    single: Sequence[judge.SingleResult],
    evidence: judge.MixedEvidence,
) -> judge.Findings:
    """``found`` under the calibration rule (opsctl.suite.invariance.judge_calibration).

    A conclusive comparison keeps its verdict. One that is not (the smallest difference
    between two adapters is not clearly above the base model's run-to-run noise) cannot
    tell a swapped adapter from noise: its pass, unverified or mixed-batch divergence is
    ``inconclusive``, with the reason; an adapter not applied, a request error or a batch
    that never mixed adapters still fails."""
    if calib.conclusive:
        return found
    hard = any(s.verdict != judge.PASS for s in single) or evidence.formed is False
    if found.verdict == judge.FAIL and hard:
        return found
    return replace(
        found,
        verdict=cal.INCONCLUSIVE,
        reasons=(*found.reasons, calib.why_inconclusive()),
        mixed_verdict=cal.INCONCLUSIVE if found.mixed_verdict != judge.FAIL else judge.FAIL,
    )


def with_probe_findings(found: judge.Findings, run_dir: Path | None) -> judge.Findings:
    """``found`` with what the engine's ledger says of the probes this check reads.

    The probes are lora and batch: a probe that could not hook leaves the check unverified
    at best (its evidence was not seen), one unverified on this vLLM adds a warning."""
    if run_dir is None:
        return found
    probes = pe.probe_findings(ledger.read_records(run_dir), ("lora", "batch"), "lora")
    unhooked = pe.lines(probes, fd.FAIL)
    verdict = judge.UNVERIFIED if unhooked and found.verdict == judge.PASS else found.verdict
    return replace(
        found,
        verdict=verdict,
        reasons=(*found.reasons, *unhooked),
        warnings=(*found.warnings, *pe.lines(probes, fd.WARNING)),
    )


def _document(
    job: _Job,
    m: _Measured,
    found: judge.Findings,
    single: list[judge.SingleResult],
    sends: list[list[judge.MixedRow]],
    evidence: tuple[judge.MixedEvidence, judge.MixedEvidence | None],
    parts: list[judge_support.PartSupport],
    seconds: dict[str, float],
) -> dict[str, Any]:
    from opsctl import output

    o, facts, live = job.options, m.facts, job.live
    knobs = dict(facts.test_knobs)
    knob_line = knob_warning(knobs)
    return output.document(
        SCHEMA,
        verdict=found.verdict,
        reasons=list(found.reasons),
        warnings=([knob_line] if knob_line else []) + list(found.warnings),
        model=job.served.base,
        url=live.url,
        external=live.external,
        run_dir=str(live.run_dir) if live.run_dir else None,
        **plat.fields(m.identity[0], note=engine_records.platform_note(live.run_dir)),
        vllm_version=m.identity[1],
        engine=judge_support.engine_summary(facts.manager, facts.info, facts.adapters),
        adapters=[a.to_dict() for a in job.adapters],
        loaded_at_runtime=list(job.loaded),
        support=[p.to_dict() for p in parts],
        single=[s.to_dict() for s in single],
        mixed={
            "verdict": found.mixed_verdict,
            "requests": [r.to_dict() for r in sends[-1]],
            "attempts": [
                _attempt_doc(a, rows, facts) for a, rows in zip(m.attempts, sends, strict=True)
            ],
            "batch": evidence[0].to_dict(),
            "encoder": evidence[1].to_dict() if evidence[1] else None,
            "first_divergence": judge.first_divergence(sends[-1]),
            "swaps": [dict(s) for s in facts.swaps],
        },
        comparison=inv.comparison_label(o.atol),
        atol=o.atol,
        max_tokens=o.max_tokens,
        logprobs=o.logprobs,
        images_per_request=job.images,
        request_tag=job.tag,
        test_knobs=knobs,
        durations_s={k: round(v, 2) for k, v in seconds.items()},
    )


def _attempt_doc(a: _Attempt, rows: list[judge.MixedRow], facts: collect.EngineFacts) -> dict:
    gathered = [g for g in facts.gathered if str(g.get("group")) in a.tag]
    return {
        "tag": a.tag,
        "gathered": dict(gathered[-1]) if gathered else None,  # by the engine's gate probe
        "batch": judge.mixed_evidence(facts.steps, a.tag, [r.request for r in rows]).to_dict(),
        "diverged": [r.request.index for r in rows if not r.result.passed],
        "duration_s": round(a.seconds, 3),
    }


def outcome(report: LoraReport, options: Options) -> Outcome:
    """The exit rule: 0 only on pass, else 1 (saying why).

    Unverified and inconclusive exit 1 too: a part that was not judged is never counted as
    passed."""
    from opsctl.checks.registry import Outcome

    warnings = tuple(report.warnings)
    if report.verdict == judge.PASS:
        return Outcome(warnings=warnings)
    if report.verdict == judge.FAIL:
        failed = CheckFailed(
            "diag lora failed: " + "; ".join(report.reasons or ["see report"])[:600]
        )
        return Outcome(warnings=warnings, failure=failed)
    why = list(report.reasons)
    if report.verdict == cal.INCONCLUSIVE and not any("conclusive" in r for r in why):
        why.append(f"to make it conclusive {cal.REMEDY}")
    said = f"diag lora {report.verdict} (not judged: not a pass): "
    failed = CheckFailed(said + "; ".join(why)[:600])
    return Outcome(warnings=warnings, failure=failed)


# ---- the results table (live panel and terminal report) ----------------------


COLUMNS = ("case", "adapter", "request", "status", "detail")


def table_rows(
    single: Sequence[judge.SingleResult],
    rows: Sequence[judge.MixedRow],
    parts: Sequence[judge_support.PartSupport],
) -> tuple[tuple[str, ...], ...]:
    """The rows of the results table: support per part, single adapters, mixed requests."""
    out = [(f"support: {p.part}", "-", "-", p.status, p.detail) for p in parts]
    out += [("single", s.adapter, f"{s.requests} alone", s.verdict, s.detail) for s in single]
    out += [
        (
            "mixed",
            r.request.label,
            r.request.describe(),
            r.result.status,
            inv.divergence_text(r.result),
        )
        for r in rows
    ]
    return tuple(out)
