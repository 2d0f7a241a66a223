"""kv-fail: inject KV load failures and prove recovery (the check's declaration).

The whole check is this folder, one file per role (the registry loads each when a surface
needs it): ``judge.py`` (pure: settings, workload, comparison, recovery
accounting), ``judge_report.py`` (pure: rows, findings, verdict, the document),
``collect.py`` (completions, the connector's control and event files, the server log),
``run.py`` (the library call for diag, certify and the console, and its exit rule),
``flags.py`` (``opsctl diag kv-fail``'s flags), ``view.py`` (the text renderer). The
fault-injecting connector it starts engines with is engine_patches.connectors;
``opsctl.checks.kv_fail`` re-exports run.py under the name docs/python.md documents.
"""

from __future__ import annotations

from opsctl.domain.check_registry import GENERATIVE, Check, Offer, Subject


def _applies(s: Subject) -> str | None:
    if not s.managed:
        return (
            "a URL cannot host kv-fail injection: it needs an engine opsctl starts with its "
            "fault-injecting KV connector (certify --model)"
        )
    if s.kv_refusal:
        return f"the fault-injecting KV connector cannot serve {s.model}: {s.kv_refusal}"
    return None


CHECK = Check(
    "kv-fail",
    "KV load failure: engine survives, requests recompute",
    "Inject KV load failures and prove recovery.",
    order=70,
    certify=_applies,
    offer=Offer(GENERATIVE, "starts its own engine with this model", opsctl_started=True),
    examples=(
        "opsctl diag kv-fail",
        "opsctl diag kv-fail --model tiny-llama --rate 0.5 --json",
        "opsctl diag kv-fail --no-patch --fail-requests 2 --timeout 15m",
        "opsctl diag kv-fail --model tiny-llama --mode default --policy fail",
        "opsctl diag kv-fail --route requests --no-patch",
    ),
)
