"""Liveness as a library call: the server is healthy, answers, and its engine progresses.

``run(target, options, progress, session) -> Report`` (schema ``liveness/2``: the
request's time is ``request.duration_s``):

1. ``/health`` answers 200;
2. one small request answers 200: a 4-token greedy completion for a generative model,
   one /score pair for a pooling model (``Options.generative``; None: asked of the
   server, a refused /v1/completions means pooling);
3. forward progress: the engine's own token counter in /metrics
   (``vllm:generation_tokens_total`` for generation, ``vllm:prompt_tokens_total`` for
   pooling) advanced past its value before the request. /health returns 503 only
   once the engine is dead (vLLM #45094): a stuck engine answers /health but this
   counter stands still.

Verdict fail on any of these; "unverified" when /metrics lacks the counter. Rules:
:func:`opsctl.suite.liveness.judge.liveness_findings`; HTTP: opsctl.suite.liveness.collect.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opsctl.checks import events as ev
from opsctl.checks.findings_report import verdict_of
from opsctl.checks.report import Report
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import Live, Target
from opsctl.suite.liveness import collect, judge

if TYPE_CHECKING:
    from opsctl.checks.registry import CertifyContext

SCHEMA = "liveness/2"
TITLE = "liveness"
PROMPT = "The engine is alive and"


@dataclass(frozen=True, slots=True)
class Options:
    """The request liveness sends (generative or pooling) and its waits."""

    generative: bool | None = None  # None: ask the server (/v1/completions refused: pooling)
    timeout: float = 60.0  # seconds for each HTTP answer
    progress_wait: float = 15.0  # seconds for the counter to advance after the answer
    max_tokens: int = 4

    def __post_init__(self) -> None:
        if not self.timeout > 0 or self.progress_wait < 0 or self.max_tokens < 1:
            raise ValueError("timeout must be positive, progress_wait >= 0, max_tokens >= 1")


def run(
    target: Target,
    options: Options = Options(),
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> Report:
    """Liveness of ``target``: /health, one request, forward progress; see the module doc."""
    from opsctl.output import document

    progress(ev.Started(TITLE))
    with opened(target, session, progress, label="liveness") as live:
        progress(ev.Phase("GET /health"))
        health = collect.health(live.url, min(options.timeout, 10.0))
        progress(ev.Log(f"/health -> {health.status or health.error}"))
        model = _served(live, options.timeout)  # None: unknown (the JSON's null)
        name = model or "?"  # what the request names when the server did not say
        generative = options.generative
        if generative is None:
            generative = _answers_completions(live, name, options.timeout)
        m, answer = _request(live, name, generative, options, health, progress)
    found = judge.liveness_findings(m)
    verdict = verdict_of(found)
    summary = next((f.message for f in found if f.severity != "ok"), found[-1].message)
    progress(ev.Finished(verdict, summary))
    doc = document(
        SCHEMA,
        url=live.url,
        model=model,
        generative=generative,
        health_status=m.health_status,
        request={
            "endpoint": m.endpoint,
            "status": m.request_status,
            "error": m.request_error,
            "duration_s": round(answer.seconds, 3),
            "tokens": m.tokens,
        },
        counter={"name": m.counter, "before": m.before, "after": m.after},
        findings=[f.to_dict() for f in found],
        verdict=verdict,
    )
    return Report(verdict, doc)


def _served(live: Live, timeout: float) -> str | None:
    from opsctl.collectors.completions import served_model

    return served_model(live.url, timeout, api_key=live.api_key) or live.model


def _answers_completions(live: Live, model: str, timeout: float) -> bool:
    from opsctl.collectors.completions import completions_refusal

    return completions_refusal(live.url, model, timeout, api_key=live.api_key) is None


def _request(
    live: Live,
    model: str,
    generative: bool,
    options: Options,
    health: collect.Answer,
    progress: ev.Progress,
) -> tuple[judge.Liveness, collect.Answer]:
    """The one request, with the counter read before and after it."""
    if generative:
        path, name = "/v1/completions", judge.GEN_COUNTER
        body: dict = {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": options.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
    else:
        path, name = "/score", judge.PROMPT_COUNTER
        body = {"model": model, "text_1": "is the engine alive", "text_2": PROMPT}
    before = collect.counter(live.url, name, live.api_key)
    progress(ev.Phase(f"POST {path}"))
    answer = collect.post(live.url, path, body, live.api_key, options.timeout)
    tokens = _tokens(answer.payload, generative)
    progress(ev.Log(f"{path} -> {answer.status or answer.error} in {answer.seconds:.2f} s"))
    progress(ev.Phase(f"waiting for {name} to advance"))
    t0 = time.monotonic()
    after = None
    if before is not None:
        deadline = t0 + (options.progress_wait if answer.status == 200 else 0.0)
        after = collect.wait_counter_above(live.url, name, before, live.api_key, deadline)
    waited = time.monotonic() - t0
    m = judge.Liveness(
        health.status, health.error, path, answer.status, answer.error, tokens, name,
        before, after, waited,
    )  # fmt: skip
    progress(ev.CaseResult("forward progress", "pass" if (after or 0) > (before or 0) else "fail"))
    return m, answer


def _tokens(payload: object, generative: bool) -> int | None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    value = usage.get("completion_tokens" if generative else "prompt_tokens")
    return int(value) if isinstance(value, int) else None


def certify(ctx: CertifyContext, progress: ev.Progress) -> Report:
    """Liveness as certify runs it: the facts say whether the model generates."""
    subject = ctx.facts.subject
    generative = subject.generative if subject.archetype else None
    return run(ctx.target, Options(generative, ctx.timeout), progress, ctx.session)
