"""`diag kv-fail` as a library call: KV load failures on a live engine (vLLM PR 50388).

``run(target, options, progress=ignore, session=None) -> KvFailReport``.

The target must be an :class:`~opsctl.checks.target.EngineSpec`: the check starts the
engine itself with opsctl's fault-injecting KV connector
(:mod:`engine_patches.connectors.fault_kv`; its ``--kv-transfer-config``, ``--block-size
32`` and ``--no-enable-prefix-caching`` are added to the spec's arguments, so it never
shares an engine with another check). A URL is refused (:class:`~opsctl.errors.BadInput`):
a server opsctl did not start with the connector cannot inject anything. To run without
opsctl's KV recovery patches (``--no-patch``), put :data:`NO_PATCH` (kv_hybrid_recompute,
kv_async_inflight, kv_rewind_v2) into the spec's ``disable_patches``.

One workload (greedy, logprobs, real seeded weights) goes through four phases on that
engine: ``store`` (failure-free baseline; the connector stores every prompt's KV for
every KV cache group), ``roundtrip`` (reload, nothing injected: must equal the
baseline), ``inject`` (reload with failed blocks reported: the engine must survive and
every non-failed request must equal its baseline) and ``sensitivity`` (the same blocks
corrupted silently: outputs should change, showing that the comparison would catch a
missed recovery). Decisions are :mod:`opsctl.suite.kv_fail.judge`'s, I/O is
:mod:`opsctl.suite.kv_fail.collect`'s.

Progress: :class:`~opsctl.checks.events.Started`, the engine's start events, a
:class:`~opsctl.checks.events.Phase` per phase, the live results
:class:`~opsctl.checks.events.Table` after each request, :class:`Injected` and
:class:`Recovered` as the connector and the patch record them, :class:`EngineDied` when
the engine dies, :class:`~opsctl.checks.events.Alert` for test knobs, and
:class:`~opsctl.checks.events.Finished`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from engine_patches.connectors.injection import InjectionPlan
from opsctl.checks import events as ev
from opsctl.checks import report as base
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import EngineSpec, Target, UrlTarget
from opsctl.domain.knobs import warning as knob_warning
from opsctl.errors import BadInput, CheckFailed
from opsctl.suite.kv_fail import judge
from opsctl.suite.kv_fail import judge_report as kvr

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext, Need, Outcome, Planning, ServerRef
    from opsctl.engine.model import ResolvedModel
    from opsctl.suite.kv_fail.collect import KvProbe

SCHEMA = "diag.kv-fail/3"  # 3: seeds, totals, verdict_seed; inconclusive; calibrated floor
TITLE = "diag kv-fail"
DEFAULT_MODEL = "tiny-hybrid"
PATCH_NAME = judge.PATCH_NAME  # the multi-group recovery patch
NO_PATCH = judge.RECOVERY_PATCHES  # --no-patch: the spec's disable_patches names them all
INCONCLUSIVE_CODE = "kv_fail.comparison_inconclusive"


@dataclass(frozen=True)
class Options:
    """The injection settings of diag kv-fail and its waits."""

    settings: judge.Settings = field(default_factory=judge.Settings)
    request_timeout: float = 180.0  # seconds for one completion
    settle: float = 5.0  # seconds a failed request's engine gets to show it still serves
    log_wait: float = 5.0  # seconds for vLLM's recovery lines to land after the inject phase
    # a sweep: every seed on one engine while it lives (empty: settings.seed alone)
    seeds: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LogLine(ev.Event):
    """An event the panel shows as one log line (:meth:`line`)."""

    def line(self) -> str:
        """The log line."""
        raise NotImplementedError

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: its one log line."""
        return {"events": [self.line()]}


@dataclass(frozen=True, slots=True)
class Injected(LogLine):
    """The connector injected a block (``request``: index in the workload, None if unknown)."""

    request: int | None
    injection: judge.Injection

    def line(self) -> str:
        """The block injected or corrupted."""
        i = self.injection
        verb = "injected" if i.reported else "corrupted silently"
        who = "?" if self.request is None else self.request
        return (
            f"{verb}: request #{who} group {i.group} block {i.block} "
            f"position {i.position} ({i.epoch})"
        )


@dataclass(frozen=True, slots=True)
class Recovered(LogLine):
    """The kv_hybrid_recompute patch recovered (or failed) requests hit by failures."""

    recovery: judge.Recovery

    def line(self) -> str:
        """What the patch recovered."""
        r = self.recovery
        return (
            f"patch: {r.action} {r.requests} request(s), {r.tokens} tokens "
            f"({r.groups} KV cache groups, policy {r.policy})"
        )


@dataclass(frozen=True, slots=True)
class EngineDied(LogLine):
    """The engine died during ``phase``, at request ``request``."""

    phase: str
    request: int
    error: str | None

    def line(self) -> str:
        """Where the engine died."""
        return f"engine died at request #{self.request}: {self.error}"


@dataclass(frozen=True)
class KvFailReport(base.Report):
    """The ``diag.kv-fail`` document (schema 2) and its verdict."""

    @property
    def findings(self) -> list[dict]:
        """The document's findings (severity, code, message), in order."""
        return list(self.document.get("findings", []))

    @property
    def failures(self) -> list[str]:
        """Messages of the failed findings (why the verdict is fail)."""
        return [f["message"] for f in self.findings if f["severity"] == "fail"]

    @property
    def seeds(self) -> list[dict]:
        """Each seed's verdict and figures (one entry for a single-seed run)."""
        return list(self.document.get("seeds", []))

    @property
    def warnings(self) -> list[str]:
        """The document's warnings (e.g. the test-knob warning)."""
        return list(self.document.get("warnings", []))

    @property
    def run_dir(self) -> str | None:
        """The run directory of the engine the check started (None when there is none)."""
        return self.document.get("run_dir")


Report = KvFailReport  # the name Parts.of reads (opsctl.domain.check_registry)


def engine_spec(target: EngineSpec, settings: judge.Settings) -> EngineSpec:
    """The caller's spec with the default model and the connector's engine arguments."""
    from engine_patches.connectors.injection import kv_transfer_config

    args = (
        "--kv-transfer-config",
        kv_transfer_config(policy=settings.policy, route=settings.route),
        "--block-size",
        str(judge.BLOCK_SIZE),
        "--no-enable-prefix-caching",
    )
    return target.with_defaults(DEFAULT_MODEL, extra_args=(*target.extra_args, *args))


def request_route_supported() -> bool:
    """Whether the installed vLLM has the request-level failure route.

    Read from its sources, never imported: ``failed_recving`` in the connector base
    (vLLM 0.30+)."""
    from opsctl.collectors.vllm_sources import InstalledSources

    text = InstalledSources().read("vllm.distributed.kv_transfer.kv_connector.v1.base")
    return bool(text) and "failed_recving" in text


def validate(target: Target, options: Options) -> ResolvedModel:
    """The resolved model, once what cannot run is refused.

    BadInput for a URL, bad settings or a model the connector cannot serve."""
    from opsctl.engine.model import resolve

    if isinstance(target, UrlTarget):
        raise BadInput(
            f"diag kv-fail cannot run against {target.url}: it needs an engine opsctl starts "
            "with its fault-injecting KV connector (give a model, not a URL)"
        )
    try:
        options.settings.validate()
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if target.timeout <= 0:
        raise BadInput("--timeout must be positive")
    if options.settings.route == "requests" and not request_route_supported():
        raise BadInput(
            "--route requests needs a vLLM whose connectors can report failed requests "
            "(KVConnectorTransferResults.failed_recving, vLLM 0.30+); this one cannot",
            hint="use --route blocks",
        )
    resolved = resolve(target.model or DEFAULT_MODEL)  # BadInput: unknown name / bad dir
    why = judge.servable(resolved.config)
    if why:
        raise BadInput(f"the fault-injecting KV connector cannot serve {resolved.name}: {why}")
    return resolved


def _cell(c: judge.Comparison | None) -> str:
    if c is None:
        return "-"
    if c.identical:
        return "identical"
    return "tokens ok" if c.tokens_equal else f"differs@{c.first_divergence}"


def table(rows: tuple[kvr.RequestRow, ...]) -> tuple[tuple[str, ...], ...]:
    """The live results table (columns :data:`COLUMNS`)."""
    out = []
    for r in rows:
        o = r.inject_output
        outcome = "-" if o is None else ("failed" if o.failed else (o.finish_reason or "ok"))
        out.append(
            (
                str(r.index),
                str(r.prompt_tokens),
                "yes" if r.targeted else "no",
                _cell(r.roundtrip),
                str(r.injected_blocks),
                outcome,
                "n/a" if r.failed else _cell(r.inject),
                _cell(r.sensitivity),
            )
        )
    return tuple(out)


class _Run:
    """The phases on one engine: what each got so far (mutable, kept out of the domain)."""

    def __init__(
        self,
        probe: KvProbe,
        model: str,
        work: judge.Workload,
        options: Options,
        progress: ev.Progress,
    ) -> None:
        self.probe, self.model, self.work = probe, model, work
        self.options, self.progress = options, progress
        self.outputs: dict[str, list[judge.Output]] = {}
        self.compared: set[str] = set()
        self.injected: dict[int, int] = {}
        self.seconds: dict[str, float] = {}
        self._index = {k: i for i, k in enumerate(work.keys)}

    def rows(self) -> tuple[kvr.RequestRow, ...]:
        w = self.work
        return kvr.request_rows(w.prompts, w.targets, self.outputs, self.compared, self.injected)

    def news(self) -> None:
        """Injections and recoveries recorded since the last look, as events."""
        for i in judge.lead(self.probe.tail.injections()):  # every rank makes the same
            self.progress(Injected(self._index.get(i.key or ""), i))
        for r in self.probe.tail.recoveries():
            self.progress(Recovered(r))

    def round(self, name: str, plan: InjectionPlan) -> bool:
        """One pass over every prompt; False when the engine died (the rest is not sent)."""
        self.progress(ev.Phase(name, 0, len(self.work.prompts)))
        self.probe.set_plan(plan)
        t0 = time.time()
        outs = self.outputs[name] = []
        try:
            for i, prompt in enumerate(self.work.prompts):
                s = self.options.settings
                out = self.probe.complete(
                    self.model, prompt, s.max_tokens, self.options.request_timeout
                )
                outs.append(out)
                alive = out.ok or self.probe.still_alive(self.options.settle)
                self.news()
                if not alive:
                    self.progress(EngineDied(name, i, out.error))
                self.progress(ev.Table(COLUMNS, table(self.rows())))
                if not alive:
                    return False
            return True
        finally:
            self.seconds[name] = round(time.time() - t0, 3)

    def store_and_roundtrip(self) -> str | None:
        """The baseline, then its reload; the phase the engine died in, if it did."""
        if not self.round("store", InjectionPlan(enabled=False, epoch="store")):
            return "store"
        if not self.round("roundtrip", InjectionPlan(enabled=False, epoch="roundtrip")):
            return "roundtrip"
        self.compared.add("roundtrip")
        return None

    def inject(self) -> tuple[str | None, judge.Accounting, tuple[str, ...], dict | None]:
        """Reload with failures reported: (died in, the engine's accounting, death lines,
        /metrics deltas over the phase)."""
        probe = self.probe
        mark, before = probe.log_mark(), probe.metrics()
        ok = self.round("inject", self.options.settings.plan(self.work.target_keys, "inject"))
        affected = judge.affected_requests(probe.injections())
        segment = probe.log_until(
            mark, lambda text: judge.recovery_logged(text, affected), self.options.log_wait
        )
        accounting = judge.account(segment)
        if not ok or not probe.alive():
            death = judge.death_lines(segment) or judge.death_lines(probe.log_text())
            return "inject", accounting, tuple(death), None
        self.compared.add("inject")
        return None, accounting, (), judge.metrics_delta(before, probe.metrics())

    def sensitivity(self) -> str | None:
        """The same blocks corrupted silently; the phase the engine died in, if it did."""
        plan = self.options.settings.plan(self.work.target_keys, "sensitivity", silent=True)
        if not self.round("sensitivity", plan):
            return "sensitivity"
        self.compared.add("sensitivity")
        return None


def _phases(r: _Run, patch_disabled: bool) -> tuple[kvr.Facts, dict | None]:
    """Every phase the engine lives through; the facts for the domain to judge."""
    accounting, metrics = judge.Accounting(), None
    death: tuple[str, ...] = ()
    died = r.store_and_roundtrip()
    if died is None:
        died, accounting, death, metrics = r.inject()
    injections = [i for i in judge.lead(r.probe.injections()) if i.epoch == "inject"]
    r.injected = judge.injected_blocks(injections, r.work.keys)
    sensitivity_ran = False
    if died is None and injections:
        died = r.sensitivity()
        sensitivity_ran = died is None
    facts = kvr.Facts(
        r.options.settings,
        r.rows(),
        roundtrip_loads=judge.roundtrip_loads(r.probe.transfers()),
        injections=len(injections),
        accounting=accounting,
        engine_alive=died is None and r.probe.alive(),
        died_in=died,
        death=death,
        sensitivity_ran=sensitivity_ran,
        patch_disabled=patch_disabled,
        ranks=len({i.rank for i in r.probe.injections()}) or 1,
        rank_disagreement=judge.rank_disagreement(r.probe.injections()),
    )
    return facts, metrics


def _on_engine(
    probe: KvProbe,
    spec: EngineSpec,
    model: str,
    work: judge.Workload,
    options: Options,
    progress: ev.Progress,
) -> dict:
    """The check on a running engine: the report's fields, test knobs and warnings."""
    from opsctl.collectors import ledger

    if line := knob_warning(ledger.test_knobs(probe.records())):
        progress(ev.Alert(line))
    info = probe.engine_info()
    r = _Run(probe, model, work, options, progress)
    facts, metrics = _phases(r, PATCH_NAME in spec.disable_patches)
    records = probe.records()
    engine = kvr.engine_facts(info, records)
    facts = replace(facts, engine=engine)
    fields = kvr.report_fields(
        facts,
        model=model,
        engine=engine,
        targets=work.targets,
        recoveries=probe.recoveries(),
        metrics=metrics,
        phase_seconds=r.seconds,
        baseline=r.outputs.get("store", []),
        prompts=work.prompts,
        run_dir=str(probe.run_dir),
    )
    r.news()
    knobs = ledger.test_knobs(records)
    warning = knob_warning(knobs)
    summary = (
        f"injected {facts.injections} block(s), {fields['tokens_recomputed']} tokens "
        f"recomputed, {fields['requests_failed']} failed, engine "
        f"{'alive' if fields['engine_alive'] else 'DEAD'}"
    )
    return {
        **fields,
        "test_knobs": knobs,
        "warnings": [warning] if warning else [],
        "_finished": (summary, table(facts.rows)),
    }


def _sweep(
    spec: EngineSpec,
    session: EngineSession | None,
    resolved: ResolvedModel,
    options: Options,
    progress: ev.Progress,
) -> tuple[list[dict], list[dict], int]:
    """Every seed on as few engines as their deaths allow: each seed's fields, the seed
    rows and the engine starts. A seed whose engine died keeps its verdict; the next seed
    gets a fresh engine."""
    from opsctl.suite.kv_fail.collect import KvProbe

    seeds = list(options.seeds or (options.settings.seed,))
    vocab = int(resolved.config.get("vocab_size") or 320)
    runs: list[dict] = []
    rows: list[dict] = []
    starts = 0
    while len(runs) < len(seeds):
        starts += 1
        with opened(spec, session, progress, label="kv-fail") as live:
            assert live.run_dir is not None  # an engine opsctl started always has one
            while len(runs) < len(seeds):
                settings = replace(options.settings, seed=seeds[len(runs)])
                work = judge.workload(settings, vocab)
                t0 = time.time()
                if len(seeds) > 1:
                    progress(ev.Log(f"seed {settings.seed}: {work.describe(settings)}"))
                with KvProbe(live.url, live.run_dir, live.server, live.api_key) as probe:
                    fields = _on_engine(
                        probe,
                        spec,
                        resolved.name,
                        work,
                        replace(options, settings=settings),
                        progress,
                    )
                runs.append(fields)
                rows.append(kvr.seed_row(fields, starts, time.time() - t0))
                if len(seeds) > 1:
                    detail = fields["_finished"][0]
                    progress(ev.CaseResult(f"seed {settings.seed}", fields["verdict"], detail))
                if not fields["engine_alive"]:
                    break
    return runs, rows, starts


def run(
    target: Target,
    options: Options,
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> KvFailReport:
    """Run diag kv-fail on an engine started for ``target`` (an EngineSpec).

    With ``options.seeds`` every seed runs on one engine while it lives (a seed whose
    engine died is recorded and the next one gets a fresh engine); the document's top-level
    fields are those of the seed the verdict stands on (``verdict_seed``), ``seeds`` lists
    each seed's verdict and figures and ``totals`` the sweep's. A URL is BadInput. Raises
    BadInput for bad settings or a model the connector cannot serve, the engine start's
    errors (EngineDied, OpsTimeout); a dying engine *during* the phases is a finding
    (verdict fail), not an exception."""
    from opsctl.output import document

    resolved = validate(target, options)
    assert isinstance(target, EngineSpec)
    spec = engine_spec(target, options.settings)
    first = replace(options.settings, seed=(options.seeds or (options.settings.seed,))[0])
    work = judge.workload(first, int(resolved.config.get("vocab_size") or 320))
    started = time.time()
    progress(ev.Started(TITLE))
    progress(ev.Table(COLUMNS, table(kvr.request_rows(work.prompts, work.targets, {}, (), {}))))
    if not options.seeds or len(options.seeds) == 1:
        progress(ev.Log(work.describe(first)))
    else:
        seeds = ", ".join(map(str, options.seeds))
        progress(ev.Log(f"sweep of seeds {seeds}: every seed on one engine while it lives"))
    runs, rows, starts = _sweep(spec, session, resolved, options, progress)
    worst = kvr.worst_seed(rows)
    fields = runs[worst]
    knobs, warnings = fields.pop("test_knobs"), fields.pop("warnings")
    summary, last_table = fields.pop("_finished")
    total = kvr.totals(rows, starts)
    if len(rows) > 1:
        progress(ev.Table(kvr.SEED_COLUMNS, kvr.seed_table(rows)))
        summary = (
            f"{total['seeds']} seeds: {total['pass']} pass, {total['fail']} fail, "
            f"{total['inconclusive']} inconclusive; {starts} engine start(s)"
        )
        last_table = kvr.seed_table(rows)
    progress(ev.Finished(fields["verdict"], summary, last_table))
    doc = document(
        SCHEMA,
        **fields,
        verdict_seed=rows[worst]["seed"],
        seeds=rows,
        totals=total,
        duration_s=round(time.time() - started, 2),
        test_knobs=knobs,
        warnings=warnings,
    )
    return KvFailReport(doc["verdict"], doc)


def certify(ctx: CertifyContext, progress: ev.Progress) -> KvFailReport:
    """kv-fail as certify runs it: its own engine, certify's timeout for each request."""
    return run(ctx.target, Options(request_timeout=ctx.timeout), progress, ctx.session)


def engines(planning: Planning, options: None) -> Need:
    """Under certify: its own engine, the fault-injecting connector's, never shared."""
    from opsctl.checks.registry import Need

    return Need(planning.base, (engine_spec(planning.base, Options().settings),))


def on_server(server: ServerRef, progress: ev.Progress) -> KvFailReport:
    """kv-fail for a console's server: its own engine with the server's model."""
    from opsctl.checks.target import EngineSpec

    if not server.model:
        raise BadInput(f"no model known for {server.url.url}: kv-fail needs the run's model")
    return run(EngineSpec(model=server.model), Options(), progress)


def outcome(report: KvFailReport, options: Options) -> Outcome:
    """The exit rule: 0 when the engine survived and every non-failed output matched."""
    from opsctl.checks.registry import Outcome

    after = tuple(report.warnings)
    if report.verdict == "pass":
        return Outcome(after=after)
    doc = report.document
    total = doc.get("totals") or {}
    many = total.get("seeds", 1) > 1
    if report.verdict == kvr.INCONCLUSIVE:  # exit 1, and never reads as a failure
        unsure = [f["message"] for f in report.findings if f["code"] == INCONCLUSIVE_CODE]
        why = unsure[0] if unsure else "the comparison could not tell recovery from noise"
        if kvr.CONCLUSIVE_HINT not in why:
            why += f"; to make it conclusive: {kvr.CONCLUSIVE_HINT}"
        head = "kv-fail inconclusive"
        if many:
            head += f" ({total['inconclusive']} of {total['seeds']} seeds, seed {doc.get('verdict_seed')})"
        failed = CheckFailed(f"{head}: {why}"[:900], hint=f"run dir: {report.run_dir}")
        return Outcome(after=after, failure=failed)
    reasons = report.failures
    head = "kv-fail"
    if many:
        head += (
            f" ({total['fail']} of {total['seeds']} seeds failed, {total['inconclusive']} "
            f"inconclusive; seed {doc.get('verdict_seed')})"
        )
    failed = CheckFailed(
        f"{head}: " + "; ".join(reasons)[:600] if reasons else f"{head} check failed",
        hint=f"run dir: {report.run_dir}",
    )
    return Outcome(after=after, failure=failed)


# ---- the results table's columns ---------------------------------------------


COLUMNS = (  # the results table (live panel and terminal report)
    "#",
    "prompt",
    "target",
    "round trip",
    "injected",
    "outcome",
    "vs baseline",
    "silent corrupt",
)
