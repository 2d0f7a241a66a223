"""usage: /score and /rerank ``usage`` against the engine inputs (the check's declaration).

The whole check is this folder, one file per role (the registry loads each when a
surface needs it): ``judge.py`` and ``judge_tokens.py`` (pure: engine inputs, expected
counts, the verdict), ``run.py`` (the library call for diag, certify and the console,
and its exit rule), ``flags.py`` (``opsctl diag usage``'s flags), ``view.py`` (the text
renderer). Its HTTP and tokenizers are opsctl.collectors.scoring, which certify shares;
``opsctl.checks.usage`` re-exports run.py under the name the README documents.
"""

from __future__ import annotations

from opsctl.domain.check_registry import POOLING, Check, Offer, Subject, kind_name


def _applies(s: Subject) -> str | None:
    if s.pooling:
        return None
    return (
        f"{kind_name(s)} model: /score and /rerank usage needs a pooling model (cross-/bi-encoder)"
    )


CHECK = Check(
    "usage",
    "/score and /rerank usage against the engine inputs",
    "/score and /rerank usage against the engine inputs.",
    order=40,
    certify=_applies,
    offer=Offer(POOLING, "pooling /score, /rerank usage"),
    examples=(
        "opsctl diag usage --model tiny-reranker",
        "opsctl diag usage 127.0.0.1:8000 --json",
        "opsctl diag usage http://127.0.0.1:8000 --timeout 2m --no-tui",
    ),
)
