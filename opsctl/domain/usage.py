"""`diag usage`: which engine inputs a /score or /rerank request produces, and whether
the reported ``usage`` matches an independent count of them (vLLM PR 56xxx, see
docs/upstream.md §5). Pure: no I/O; token counts come in through a ``count`` callable.

Engine inputs, as vLLM 0.32 builds them (vllm/entrypoints/pooling/scoring/io_processor.py):
- cross-encoder: one input per document, ``tokenizer(text=query, text_pair=document)``
  (a single query is repeated for every document; N queries pair with N documents);
- bi-encoder (and late interaction): every query once and every document once, each
  tokenized alone with special tokens; scores are computed after the engine.
``usage.prompt_tokens`` and ``total_tokens`` must both equal the sum of the lengths of
those inputs; top_n only trims the returned results, never the processed inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding, verdict

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
    name: str
    endpoint: str  # "score" | "rerank"
    queries: tuple[str, ...]
    documents: tuple[str, ...]
    top_n: int | None = None

    def body(self, model: str) -> dict[str, Any]:
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
    n_q, n_d = len(case.queries), len(case.documents)
    if kind == CROSS:
        pairs = n_d
        return f"{pairs} (query, document) pair(s), each tokenized together, via {method}"
    return (
        f"{n_q} quer{'y' if n_q == 1 else 'ies'} once + {n_d} document(s), each alone, via {method}"
    )


@dataclass(frozen=True, slots=True)
class UsageRow:
    endpoint: str
    kind: str
    case: str
    documents: int
    reported_prompt: int | None
    reported_total: int | None
    expected: int
    parts: tuple[int, ...]
    derivation: str
    verdict: str  # "pass" | "fail"
    cross_check: int | None = None
    results: int | None = None  # how many results the response returned
    top_n: int | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]


def compare(
    kind: str,
    case: UsageCase,
    usage: dict[str, Any] | None,
    count: Callable[[Input], int],
    *,
    method: str = "/tokenize",
    cross_count: Callable[[Input], int] | None = None,
    results: int | None = None,
) -> UsageRow:
    """Compare a response's ``usage`` with the independent count of the engine inputs."""
    inputs = engine_inputs(kind, case)
    parts = tuple(count(x) for x in inputs)
    expected = sum(parts)
    check = sum(cross_count(x) for x in inputs) if cross_count else None
    usage = usage or {}
    prompt = _int(usage.get("prompt_tokens"))
    total = _int(usage.get("total_tokens"))
    ok = prompt == expected and total == expected
    note = ""
    if prompt is None:
        note = "response has no usage.prompt_tokens"
    elif not ok:
        note = f"prompt_tokens off by {prompt - expected:+d}"
        if total is not None and total != expected:
            note += f", total_tokens off by {total - expected:+d}"
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
        verdict="pass" if ok else "fail",
        cross_check=check,
        results=results,
        top_n=case.top_n,
        note=note,
    )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def pair_text(query: str, document: str, sep: str) -> str:
    """A BERT-style pair rendered as one string: with special tokens added it tokenizes to
    ``[CLS] query [SEP] document [SEP]`` (the special token is matched before
    normalisation), exactly what ``tokenizer(text=query, text_pair=document)`` gives."""
    return f"{query} {sep} {document}"


def special_affixes(with_specials: list[str], without: list[str]) -> tuple[list[str], list[str]]:
    """Split the special tokens a tokenizer adds around a single text into (prefix, suffix)."""
    n = len(without)
    for start in range(len(with_specials) - n + 1):
        if with_specials[start : start + n] == without:
            return with_specials[:start], with_specials[start + n :]
    raise ValueError(
        "tokens without specials are not a contiguous part of the tokens with specials"
    )


def findings(rows: list[UsageRow], top_n_checked: bool = True) -> list[Finding]:
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
    disagree = [r for r in rows if r.cross_check is not None and r.cross_check != r.expected]
    for r in disagree:
        out.append(
            Finding(
                WARNING,
                "usage.derivations_disagree",
                f"{r.endpoint} '{r.case}': /tokenize count {r.expected} != local tokenizer "
                f"count {r.cross_check}",
                {"row": r.to_dict()},
            )
        )
    if rows and not bad:
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


@dataclass(frozen=True, slots=True)
class UsageReport:
    kind: str
    model: str
    url: str
    rows: tuple[UsageRow, ...]
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def verdict(self) -> str:
        return verdict(list(self.findings))


def table_rows(rows: list[UsageRow] | tuple[UsageRow, ...]) -> list[list[str]]:
    """Rows for the table / live panel: endpoint, kind, case, reported, expected, verdict, derivation."""
    return [
        [
            r.endpoint,
            r.kind,
            r.case,
            f"{_s(r.reported_prompt)}/{_s(r.reported_total)}",
            f"{r.expected} = {'+'.join(str(p) for p in r.parts)}",
            r.verdict.upper(),
            r.derivation,
        ]
        for r in rows
    ]


TABLE_COLUMNS = [
    "endpoint",
    "model kind",
    "case",
    "reported prompt/total",
    "expected",
    "verdict",
    "how expected was derived",
]


def _s(v: int | None) -> str:
    return "-" if v is None else str(v)
