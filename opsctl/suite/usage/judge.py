"""`diag usage`: engine inputs of /score and /rerank requests, and their reported ``usage``.

The reported ``usage`` is held to an independent count of those inputs. Pure: no I/O;
the token counts are collected first (opsctl.collectors.scoring) and come in as numbers.

Engine inputs, as vLLM 0.32 builds them (vllm/entrypoints/pooling/scoring/io_processor.py):
- cross-encoder: one input per document, ``tokenizer(text=query, text_pair=document)``
  (a single query is repeated for every document; N queries pair with N documents);
- bi-encoder (and late interaction): every query once and every document once, each
  tokenized alone with special tokens; scores are computed after the engine.
``usage.prompt_tokens`` and ``total_tokens`` must both equal the sum of the lengths of
those inputs; top_n only trims the returned results, never the processed inputs.

The exact count comes from the model's own tokenizer (``tokenizer(text=q, text_pair=d)``,
what vLLM calls); without it from /tokenize and the pair template inferred from it
(opsctl.suite.usage.judge_tokens). When no count can be derived the row is ``unverified``
(never a mismatch: a guess must not fail a correct server).

Also here: which model kind a server has (:func:`declared_kind`, :func:`kind_from_probes`)
and when the check refuses (a generative model, a server without /score).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding, verdict
from opsctl.domain.records import record
from opsctl.errors import BadInput

CROSS, BI = "cross-encoder", "bi-encoder"
KINDS = (CROSS, BI)

LONG_DOC = (
    "Operators of large deployments run many replicas behind a proxy. Each replica "
    "serves a reranker that scores documents against a query, and the proxy bills "
    "every request by the prompt tokens the engine reports. When the reported usage "
    "drifts from what the engine really processed, invoices and rate limits drift "
    "with it, so the count must come from the exact inputs the engine received: the "
    "query and the document joined for a cross encoder, every text once for an "
    "embedding model. This long document exists to make that difference visible."
)


@dataclass(frozen=True, slots=True)
class UsageCase:
    """One request the check sends: endpoint, queries, documents and ``top_n``."""

    name: str
    endpoint: str  # "score" | "rerank"
    queries: tuple[str, ...]
    documents: tuple[str, ...]
    top_n: int | None = None

    def body(self, model: str) -> dict[str, Any]:
        """The request's JSON body for ``model``."""
        if self.endpoint == "score":
            q: Any = self.queries[0] if len(self.queries) == 1 else list(self.queries)
            d: Any = self.documents[0] if len(self.documents) == 1 else list(self.documents)
            return {"model": model, "text_1": q, "text_2": d}
        body: dict[str, Any] = {
            "model": model,
            "query": self.queries[0],
            "documents": list(self.documents),
        }
        if self.top_n is not None:
            body["top_n"] = self.top_n
        return body


def default_cases() -> tuple[UsageCase, ...]:
    """The cases the check sends, /score and /rerank, one or several documents."""
    q = "What is the capital of France?"
    docs = (
        "Paris is the capital of France.",
        "Berlin is the capital of Germany, and Rome is the capital of Italy.",
        "The cat sat.",
    )
    return (
        UsageCase("one document", "score", (q,), docs[:1]),
        UsageCase("several documents", "score", (q,), docs),
        UsageCase(
            "text pairs (N:N)",
            "score",
            (q, "How do I reset my password?", "Hello world!"),
            (docs[0], "Open the settings page and choose a new password.", "How are you today?"),
        ),
        UsageCase("long document", "score", (q,), (LONG_DOC,)),
        UsageCase("one document", "rerank", (q,), docs[:1]),
        UsageCase("several documents", "rerank", (q,), docs),
        UsageCase("top_n=1 of 3", "rerank", (q,), docs, top_n=1),
        UsageCase("long document", "rerank", (q,), (docs[0], LONG_DOC)),
    )


Input = str | tuple[str, str]


def engine_inputs(kind: str, case: UsageCase) -> list[Input]:
    """The inputs the engine runs for ``case`` on a model of ``kind``."""
    if kind == CROSS:
        if len(case.queries) == 1:
            return [(case.queries[0], d) for d in case.documents]
        if len(case.queries) != len(case.documents):
            raise ValueError("N queries need N documents")
        return list(zip(case.queries, case.documents, strict=True))
    if kind == BI:
        texts: list[Input] = [*case.queries, *case.documents]
        return texts
    raise ValueError(f"unknown model kind {kind!r}")


def derivation(kind: str, case: UsageCase, method: str) -> str:
    """How the expected count is derived for ``kind`` and the case, counted by ``method``."""
    n_q, n_d = len(case.queries), len(case.documents)
    if kind == CROSS:
        pairs = n_d
        return f"{pairs} (query, document) pair(s), each tokenized together, via {method}"
    return (
        f"{n_q} quer{'y' if n_q == 1 else 'ies'} once + {n_d} document(s), each alone, via {method}"
    )


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One case's row: the usage the server reported against the count expected."""

    endpoint: str
    kind: str
    case: str
    documents: int
    reported_prompt: int | None
    reported_total: int | None
    expected: int | None  # None: not derivable (verdict "unverified")
    parts: tuple[int | None, ...]
    derivation: str
    verdict: str  # "pass" | "fail" | "unverified" (expected count not derivable)
    cross_check: int | None = None
    results: int | None = None  # how many results the response returned
    top_n: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The row in the report (``diag.usage/2``): token counts named ``*_tokens``."""
        return record(self, JSON_NAMES, tuples=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> UsageRow:
        """A row read back from its report (:meth:`to_dict`)."""
        fields = {f: d[JSON_NAMES.get(f, f)] for f in cls.__slots__}  # type: ignore[attr-defined]
        return cls(**{**fields, "parts": tuple(fields["parts"])})


# attribute -> report field: the token counts carry their unit (docs/cli.md, issue 23)
JSON_NAMES = {
    "reported_prompt": "reported_prompt_tokens",
    "reported_total": "reported_total_tokens",
    "expected": "expected_tokens",
    "parts": "input_tokens",  # one count per engine input
    "cross_check": "cross_check_tokens",
}


def compare(
    kind: str,
    case: UsageCase,
    usage: dict[str, Any] | None,
    parts: Sequence[int | None],
    *,
    method: str = "/tokenize",
    cross_parts: Sequence[int | None] | None = None,
    results: int | None = None,
) -> UsageRow:
    """Compare a response's ``usage`` with the independent count of the engine inputs.

    ``parts`` is the count of each of ``engine_inputs(kind, case)``, None for an input
    whose length is not derivable (e.g. a pair whose template is unknown): the row is
    then "unverified", not a mismatch. ``cross_parts``: a second count, for the
    cross-check column."""
    parts = tuple(parts)
    known = [p for p in parts if p is not None]
    expected = sum(known) if len(known) == len(parts) else None
    check: int | None = None
    if cross_parts is not None and None not in cross_parts:
        check = sum(c for c in cross_parts if c is not None)
    usage = usage or {}
    prompt = _int(usage.get("prompt_tokens"))
    total = _int(usage.get("total_tokens"))
    if expected is None:
        verdict_ = "unverified"
        note = "expected count not derivable (pair template unknown); usage not judged"
    else:
        verdict_ = "pass" if prompt == expected and total == expected else "fail"
        note = _mismatch_note(prompt, total, expected) if verdict_ == "fail" else ""
    return UsageRow(
        endpoint=f"/{case.endpoint}",
        kind=kind,
        case=case.name,
        documents=len(case.documents),
        reported_prompt=prompt,
        reported_total=total,
        expected=expected,
        parts=parts,
        derivation=derivation(kind, case, method),
        verdict=verdict_,
        cross_check=check,
        results=results,
        top_n=case.top_n,
        note=note,
    )


def _mismatch_note(prompt: int | None, total: int | None, expected: int) -> str:
    if prompt is None:
        return "response has no usage.prompt_tokens"
    note = f"prompt_tokens off by {prompt - expected:+d}"
    if total is not None and total != expected:
        note += f", total_tokens off by {total - expected:+d}"
    return note


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


# ---- which model, and refusals --------------------------------------------------------


def model_refusal(name: str, archetype: str) -> BadInput | None:
    """A model given by name that cannot serve /score and /rerank (before any start)."""
    if archetype in KINDS:
        return None
    return BadInput(
        f"{name} is a {archetype} model; diag usage needs a cross-encoder or a "
        "bi-encoder (e.g. tiny-reranker, tiny-embed)"
    )


def declared_kind(
    given: str | None,
    archetype: str | None,
    config_archetype: str | None,
    root: str | None,
    url: str,
) -> tuple[str, str] | None:
    """(kind, how it was determined) from what is known without asking the server.

    The sources: --kind, the embedded model's archetype, the model directory's config.json. A
    config.json of another kind of model is BadInput; None: probe the endpoints.
    """
    if given:
        return given, "--kind"
    if archetype in KINDS:
        return str(archetype), "embedded model archetype"
    if config_archetype in KINDS:
        return str(config_archetype), f"config.json under {root}"
    if config_archetype:
        raise BadInput(
            f"the model at {url} is a {config_archetype} model; diag usage needs a "
            "cross-encoder or a bi-encoder (a model serving /score and /rerank)"
        )
    return None


def kind_from_probes(embeddings: bool, classify: bool, url: str) -> tuple[str, str]:
    """(kind, how) from which endpoint answered a probe request (embeddings asked first)."""
    if embeddings:
        return BI, "/v1/embeddings answers"
    if classify:
        return CROSS, "/classify answers"
    raise BadInput(
        f"cannot tell whether the model at {url} is a cross- or bi-encoder",
        hint="pass --kind cross-encoder or --kind bi-encoder",
    )


def score_refusal(status: int, payload: Any, url: str) -> BadInput | None:
    """The first /score request's answer: anything but 200 means the model does not score."""
    if status == 200:
        return None
    if status == 404:
        return BadInput(
            f"{url} has no /score endpoint; is it serving a generative model?",
            hint="diag usage needs a cross-encoder or bi-encoder",
        )
    return BadInput(
        f"/score on {url} answered HTTP {status}: {str(payload)[:200]}",
        hint="diag usage needs a model that serves /score and /rerank",
    )


def unk_findings(sample: Sequence[str]) -> list[Finding]:
    """A tokenizer that maps a plain sentence to unknown tokens only (a broken vocab)."""
    if sum(1 for t in sample if "unk" in t.lower()) != len(sample):
        return []
    return [Finding(WARNING, "usage.all_unk", "the tokenizer maps a plain sentence to [UNK] only")]


def findings(rows: list[UsageRow]) -> list[Finding]:
    """The check's findings: mismatches, unverified rows, disagreeing counts, ``top_n``."""
    out: list[Finding] = []
    bad = [r for r in rows if r.verdict == "fail"]
    for r in bad:
        out.append(
            Finding(
                FAIL,
                "usage.mismatch",
                f"{r.endpoint} {r.kind} '{r.case}': reported prompt_tokens={r.reported_prompt} "
                f"total_tokens={r.reported_total}, expected {r.expected} ({r.note})",
                {"row": r.to_dict()},
            )
        )
    unverified = [r for r in rows if r.verdict == "unverified"]
    if unverified:
        out.append(
            Finding(
                WARNING,
                "usage.unverified",
                f"{len(unverified)} of {len(rows)} request(s) NOT verified (not judged, so "
                "never a pass: exit 1): the expected count could not be derived (pair template "
                "unknown; make the model directory readable here or pass --model)",
                {"rows": [f"{r.endpoint} {r.case}" for r in unverified]},
            )
        )
    disagree = [
        r
        for r in rows
        if r.cross_check is not None and r.expected is not None and r.cross_check != r.expected
    ]
    for r in disagree:
        out.append(
            Finding(
                WARNING,
                "usage.derivations_disagree",
                f"{r.endpoint} '{r.case}': expected count {r.expected} != cross-check count "
                f"{r.cross_check}",
                {"row": r.to_dict()},
            )
        )
    if rows and not bad and not unverified:
        kinds = sorted({r.kind for r in rows})
        out.append(
            Finding(
                OK,
                "usage.match",
                f"{len(rows)} request(s) on {', '.join(kinds)}: usage equals the engine-input "
                "token count",
                {},
            )
        )
    for r in rows:
        if r.top_n and r.results is not None and r.results > r.top_n:
            out.append(
                Finding(
                    WARNING,
                    "usage.top_n_ignored",
                    f"{r.endpoint} '{r.case}' returned {r.results} results for top_n={r.top_n}",
                    {},
                )
            )
        elif r.top_n and r.verdict == "pass":
            out.append(
                Finding(
                    INFO,
                    "usage.top_n_counts_all",
                    f"{r.endpoint} '{r.case}': {r.results} result(s) returned, usage still counts all "
                    f"{r.documents} documents the engine processed",
                    {},
                )
            )
    return out


def overall_verdict(rows: Sequence[UsageRow], found: Sequence[Finding]) -> str:
    """fail on any mismatch; "unverified" when some row could not be judged; else pass."""
    v = verdict(list(found))
    if v == "fail":
        return v
    return "unverified" if any(r.verdict == "unverified" for r in rows) else v


def summary(rows: Sequence[UsageRow], verdict_: str) -> str:
    """The one-line result under the live panel's verdict."""
    n_pass = sum(r.verdict == "pass" for r in rows)
    text = f"{n_pass}/{len(rows)} match"
    if verdict_ == "unverified":
        text += f", {sum(r.verdict == 'unverified' for r in rows)} unverified (not a pass)"
    return text
