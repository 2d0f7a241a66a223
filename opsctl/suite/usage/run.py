"""diag usage as a library call: /score and /rerank usage against the engine inputs.

Verify /score and /rerank ``usage`` against an
independent count of the engine inputs.

``run(target, options, progress, session)`` sends /score and /rerank requests (one and
several documents, N:N text pairs, a long document, top_n) and compares
``usage.prompt_tokens`` / ``total_tokens`` with the token counts of the exact engine
inputs. Where the counts come from:

- the model directory is readable here (the server's /v1/models ``root``, or the spec's
  model): the model's own tokenizer, called as vLLM's scoring io_processor calls it, is
  the expected count; the server's /tokenize is the cross-check;
- otherwise the server's /tokenize: each text alone; for pairs the template is inferred
  from the special tokens /tokenize adds around one text. An unknown template makes the
  rows "unverified" (verdict "unverified", exit 1: never counted as passed), never a
  mismatch.

A target is a running server (:class:`UrlTarget`, the server's own model) or an engine
to start (:class:`EngineSpec`; its model must be given: a cross-encoder or bi-encoder,
refused before any start otherwise). The report's ``to_dict()`` is the
``opsctl.diag.usage/2`` document. Decisions: opsctl.suite.usage.judge (and judge_tokens);
HTTP and tokenizers: opsctl.collectors.scoring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opsctl.checks import events as ev
from opsctl.checks import report as base
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import EngineSpec, Target, UrlTarget
from opsctl.collectors import engine_records, ledger
from opsctl.collectors import scoring as collect
from opsctl.domain import platform as plat
from opsctl.domain.knobs import warning as knob_warning
from opsctl.errors import BadInput, CheckFailed
from opsctl.suite.usage import judge as U
from opsctl.suite.usage import judge_tokens as T

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext, Outcome, ServerRef

SCHEMA = "diag.usage/2"  # 2: platform is a name or null, platform_note
TITLE = "diag usage"
PROBE_TEXT = "hello world"  # tokenized with and without specials: the pair template
UNK_SAMPLE = "the capital of france"  # a vocabulary that maps it to [UNK] only is broken


@dataclass(frozen=True, slots=True)
class Options:
    """The model kind (None: detect) and the wait for each HTTP answer."""

    kind: str | None = None  # cross-encoder | bi-encoder; None: detect
    timeout: float = 60.0  # seconds to wait for each HTTP answer (OpsTimeout past it)

    def __post_init__(self) -> None:
        if self.kind is not None and self.kind not in U.KINDS:
            raise ValueError(f"kind must be one of {U.KINDS}, not {self.kind!r}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be positive, not {self.timeout}")


@dataclass(frozen=True)
class UsageReport(base.KnobReport):
    """The usage report (``document`` is the JSON document)."""

    @property
    def rows(self) -> list[dict[str, Any]]:
        """One row per request: the reported and the expected counts, and the verdict."""
        return list(self.document["rows"])

    def count(self, verdict: str) -> int:
        """How many requests got ``verdict`` (pass | fail | unverified)."""
        return sum(r["verdict"] == verdict for r in self.rows)


Report = UsageReport  # the name Parts.of reads (opsctl.domain.check_registry)


@dataclass(frozen=True, slots=True)
class RowResult(ev.CaseResult):
    """One request compared (``name`` is "endpoint case")."""

    reported: int | None = None
    expected: int | None = None

    def snapshot(self) -> dict[str, Any]:
        """The panel fields this event sets: one log line: reported vs expected and the verdict."""
        line = f"{self.name}: reported {self.reported}, expected {self.expected} -> {self.verdict}"
        return {"events": [line]}


@dataclass(frozen=True)
class Counting:
    """How this server's expected counts are made."""

    kind: str
    kind_source: str
    template: T.PairTemplate | None
    method: str
    source: str  # "local tokenizer" | "/tokenize"
    tokenizer: Any = None  # the model's own tokenizer, when readable here


def run(
    target: Target,
    options: Options,
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> UsageReport:
    """Check /score and /rerank usage of ``target`` against the engine inputs' counts."""
    archetype, model_dir = _given_model(target)
    where = f"checking {target.url}" if isinstance(target, UrlTarget) else "starting engine"
    progress(ev.Started(TITLE, where))
    progress(ev.Table(tuple(TABLE_COLUMNS), ()))
    with opened(target, session, progress, label="diag-usage") as live:
        if warning := knob_warning(ledger.knobs_of([live.run_dir])):
            progress(ev.Alert(warning))
        with collect.ScoringApi(live.url, options.timeout, live.api_key) as api:
            served = api.served_model()
            kind, how = _kind(api, served, options.kind, archetype, live.url)
            status, payload = api.call("score", U.default_cases()[0].body(served.name))
            if refusal := U.score_refusal(status, payload, live.url):
                raise refusal
            counting = _counting(api, kind, how, model_dir or served.root)
            sample = api.tokenize(UNK_SAMPLE, False)
            rows = _requests(api, served.name, counting, progress)
        found = [*U.findings(rows), *U.unk_findings(sample)]
        verdict = U.overall_verdict(rows, found)
        table = tuple(tuple(r) for r in table_rows(rows))
        progress(ev.Finished(verdict, U.summary(rows, verdict), rows=table))
        knobs = ledger.knobs_of([live.run_dir])
        platform, version = engine_records.identity_at(live.run_dir, live.url, live.api_key)
    template = counting.template
    doc = _document(
        url=live.url,
        **plat.fields(platform, note=engine_records.platform_note(live.run_dir)),
        vllm_version=version,
        model=served.name,
        kind=kind,
        kind_source=how,
        engine_started=not live.external,
        run_dir=str(live.run_dir) if live.run_dir and not live.external else None,
        pair_separator=template.suffix[0] if template and template.suffix else None,
        pair_template=template.name if template else None,
        expected_method=counting.method,
        expected_source=counting.source,
        local_cross_check=counting.source == "local tokenizer",
        rows=[r.to_dict() for r in rows],
        findings=[f.to_dict() for f in found],
        verdict=verdict,
        test_knobs=knobs,
    )
    return UsageReport(verdict, doc)


def _document(**fields: Any) -> dict[str, Any]:
    from opsctl.output import document

    knobs = fields["test_knobs"]
    warning = knob_warning(knobs)
    return document(SCHEMA, **fields, warnings=[warning] if warning else [])


def _given_model(target: Target) -> tuple[str | None, str | None]:
    """(archetype, model directory) of an engine spec's model; refused before any start
    unless it serves /score and /rerank."""
    if isinstance(target, UrlTarget):
        return None, None
    if not isinstance(target, EngineSpec) or not target.model:
        raise BadInput(
            "give a server URL or --model NAME", hint="e.g. opsctl diag usage --model tiny-reranker"
        )
    from opsctl.engine.model import resolve

    resolved = resolve(target.model)
    if refusal := U.model_refusal(resolved.name, resolved.archetype):
        raise refusal
    return resolved.archetype, str(resolved.path)


def _kind(
    api: collect.ScoringApi,
    served: collect.ServedModel,
    given: str | None,
    archetype: str | None,
    url: str,
) -> tuple[str, str]:
    from opsctl.engine.model import archetype_of

    config = collect.config_of(served.root)
    config_archetype = archetype_of(config) if config else None
    found = U.declared_kind(given, archetype, config_archetype, served.root, url)
    if found is not None:
        return found
    probe = {"model": served.name, "input": "probe"}
    embeddings = api.answers("/v1/embeddings", probe)
    return U.kind_from_probes(embeddings, not embeddings and api.answers("/classify", probe), url)


def _counting(api: collect.ScoringApi, kind: str, how: str, model_dir: str | None) -> Counting:
    template = None
    if kind == U.CROSS:
        with_specials, without = api.tokenize(PROBE_TEXT, True), api.tokenize(PROBE_TEXT, False)
        template = T.inferred_template(list(with_specials), list(without))
    tokenizer = collect.load_tokenizer(model_dir)
    if tokenizer is None:
        return Counting(kind, how, template, T.remote_method(kind, template), "/tokenize")
    method = T.local_method(kind, str(model_dir))
    return Counting(kind, how, template, method, "local tokenizer", tokenizer)


def _counts(
    api: collect.ScoringApi, counting: Counting, inputs: list[U.Input]
) -> tuple[tuple[int | None, ...], tuple[int | None, ...] | None]:
    """(expected parts, cross-check parts): the local tokenizer's counts checked against
    /tokenize's, or /tokenize's alone."""
    asked = T.tokenize_requests(inputs, counting.template)
    remote = T.remote_parts(inputs, api.token_lengths(asked), counting.template)
    if counting.tokenizer is None:
        return remote, None
    return collect.local_counts(counting.tokenizer, inputs), remote


def _requests(
    api: collect.ScoringApi, model: str, counting: Counting, progress: ev.Progress
) -> list[U.UsageRow]:
    cases = U.default_cases()
    rows: list[U.UsageRow] = []
    for n, case in enumerate(cases, 1):
        status, payload = api.call(case.endpoint, case.body(model))
        if status != 200:
            raise CheckFailed(
                f"/{case.endpoint} '{case.name}' answered HTTP {status}: {str(payload)[:200]}"
            )
        results = payload.get("data") if case.endpoint == "score" else payload.get("results")
        parts, cross = _counts(api, counting, U.engine_inputs(counting.kind, case))
        row = U.compare(
            counting.kind,
            case,
            payload.get("usage"),
            parts,
            method=counting.method,
            cross_parts=cross,
            results=len(results) if isinstance(results, list) else None,
        )
        rows.append(row)
        progress(ev.Phase(f"{n}/{len(cases)} requests", n, len(cases)))
        if n == 1:
            progress(
                ev.Log(
                    f"model {model}: {counting.kind} ({counting.kind_source}); "
                    f"expected counts from {counting.method}"
                )
            )
        progress(ev.Table(tuple(TABLE_COLUMNS), tuple(tuple(r) for r in table_rows(rows))))
        progress(
            RowResult(
                f"{row.endpoint} {case.name}", row.verdict, "", row.reported_prompt, row.expected
            )
        )
    return rows


def certify(ctx: CertifyContext, progress: ev.Progress) -> UsageReport:
    """The usage check as certify runs it (kind detected, certify's timeout)."""
    return run(ctx.target, Options(timeout=ctx.timeout), progress, ctx.session)


def on_server(server: ServerRef, progress: ev.Progress) -> UsageReport:
    """The usage check on a console's server."""
    return run(server.url, Options(), progress)


def outcome(report: UsageReport, options: Options) -> Outcome:
    """The exit rule: 1 on a mismatch, and 1 on "unverified" (not judged is never a pass)."""
    from opsctl.checks.registry import Outcome

    doc, rows = report.document, len(report.rows)
    info = (f"usage check on {doc['model']} ({doc['kind']}): {report.verdict}",)
    warnings = (report.knob_warning,) if report.knob_warning else ()
    if report.verdict == "unverified":
        why = (
            f"usage unverified (not judged, so not a pass): {report.count('unverified')} of "
            f"{rows} request(s) had no expected count (the pair template is unknown and the "
            "model's tokenizer is not readable here); not a mismatch"
        )
        return Outcome(info, warnings, failure=CheckFailed(why))
    if report.verdict in base.NOT_JUDGED:  # not judged: never a pass, never read as a fail
        why = f"usage {report.verdict} (not judged, so not a pass): see the report's findings"
        return Outcome(info, warnings, failure=CheckFailed(why))
    if report.verdict != "pass":
        failed = (
            f"{report.count('fail')} of {rows} usage report(s) differ from the engine-input count"
        )
        return Outcome(info, warnings, failure=CheckFailed(failed))
    return Outcome(info, warnings)


# ---- the results table (live panel and terminal report) ----------------------


TABLE_COLUMNS = [
    "endpoint",
    "model kind",
    "case",
    "reported prompt/total",
    "expected",
    "verdict",
    "how expected was derived",
]


def table_rows(rows: list[U.UsageRow] | tuple[U.UsageRow, ...]) -> list[list[str]]:
    """Rows for the table / live panel: endpoint, kind, case, reported, expected, verdict, derivation."""
    return [
        [
            r.endpoint,
            r.kind,
            r.case,
            f"{_s(r.reported_prompt)}/{_s(r.reported_total)}",
            f"{_s(r.expected)} = {'+'.join(_s(p) for p in r.parts)}",
            r.verdict.upper(),
            r.derivation,
        ]
        for r in rows
    ]


def _s(v: int | None) -> str:
    return "-" if v is None else str(v)
