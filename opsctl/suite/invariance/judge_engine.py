"""Batch invariance, engine side (pure): isolating settings, batch evidence, run findings.

Batch invariance, engine side: the isolating settings read back from the engine's
records, the evidence that the BS=N batch really formed, and what a run's engine records
add to its verdict (failures) and its report (warnings). Pure: no I/O, no UI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opsctl.domain import platform as plat
from opsctl.domain.generation import prompt_index
from opsctl.domain.records import record

if TYPE_CHECKING:
    from opsctl.suite.invariance.judge import Generated

# ---- settings: what was asked of the engine, and what it shows it got ----------------

VERIFIED, NOT_VERIFIED, MISMATCH, NOT_APPLICABLE, ENFORCED = (
    "verified",
    "not verified",
    "mismatch",
    "not applicable",
    "per request",
)


@dataclass(frozen=True, slots=True)
class SettingCheck:
    """One isolating setting: what was wanted, what the engine's records show, and whence."""

    name: str
    wanted: str
    seen: str
    status: str  # verified | not verified | mismatch | not applicable | per request
    source: str

    @property
    def failed(self) -> bool:
        """True when the engine ran with another value than wanted."""
        return self.status == MISMATCH

    def to_dict(self) -> dict[str, Any]:
        """The setting as the report's ``settings`` list holds it."""
        return record(self)


SENT_SOURCE = "sent with every request; checked in the responses"
INFO_SOURCE = "engine_info probe (EngineCore config)"
NO_LEDGER = "no opsctl ledger for this server"


def _cache_settings(engine_info: Mapping[str, Any] | None, images: bool) -> list[SettingCheck]:
    """Prefix caching off and the mm processor cache at 0 GiB (``--mm-processor-cache-gb
    0`` is accepted by a text-only model, which then has no multimodal config; a run
    with images needs the engine to show it at 0)."""
    if engine_info is None:
        why = f"{NO_LEDGER}: could not enforce or read back"
        return [
            SettingCheck("prefix caching", "off", "?", NOT_VERIFIED, why),
            SettingCheck("mm processor cache", "0 GiB", "?", NOT_VERIFIED, why),
        ]
    pc = engine_info.get("enable_prefix_caching")
    out = [
        SettingCheck(
            "prefix caching", "off", _fmt(pc), VERIFIED if pc is False else MISMATCH, INFO_SOURCE
        )
    ]
    mm = engine_info.get("mm_processor_cache_gb")
    if mm is None and images:
        out.append(
            SettingCheck("mm processor cache", "0 GiB", "not recorded", MISMATCH, INFO_SOURCE)
        )
    elif mm is None:
        how = f"{INFO_SOURCE}: text-only model, flag accepted"
        out.append(
            SettingCheck("mm processor cache", "0 GiB", "no multimodal config", NOT_APPLICABLE, how)
        )
    else:
        status = VERIFIED if float(mm) == 0.0 else MISMATCH
        out.append(SettingCheck("mm processor cache", "0 GiB", f"{mm} GiB", status, INFO_SOURCE))
    return out


def _sampler_setting(probe_env: Mapping[str, Any] | None) -> SettingCheck:
    name = "VLLM_USE_FLASHINFER_SAMPLER"
    if probe_env is None:
        why = "batch probe not active in this engine: could not read its env"
        return SettingCheck(name, "0", "?", NOT_VERIFIED, why)
    val = probe_env.get(name)
    status = VERIFIED if val == "0" else MISMATCH
    return SettingCheck(name, "0", _fmt(val), status, "batch probe (engine worker env)")


def _mode_setting(engine_info: Mapping[str, Any] | None, mode: str) -> SettingCheck:
    if engine_info is None:
        return SettingCheck("execution mode", mode, "?", NOT_VERIFIED, NO_LEDGER)
    eager = engine_info.get("enforce_eager")
    compilation = compilation_mode_name(engine_info.get("compilation_mode"))
    seen = f"enforce_eager={_fmt(eager)}, compilation={compilation}"
    status = VERIFIED if eager is (mode == "eager") else MISMATCH
    return SettingCheck("execution mode", mode, seen, status, INFO_SOURCE)


def check_engine_settings(
    engine_info: Mapping[str, Any] | None,
    probe_env: Mapping[str, Any] | None,
    *,
    mode: str | None,
    images: bool = False,
) -> list[SettingCheck]:
    """Engine-level isolating settings against what the engine recorded.

    ``engine_info``: the engine_info probe's record (None: no ledger, e.g. an external
    server opsctl did not start). ``probe_env``: env vars as the engine process saw them
    (batch probe), None when unknown. ``mode``: "eager" | "default" | None (not chosen).
    ``images``: the prompts carry images, so the mm processor cache must show 0 GiB.
    """
    out = [*_cache_settings(engine_info, images), _sampler_setting(probe_env)]
    if mode is not None:
        out.append(_mode_setting(engine_info, mode))
    return out


def check_request_settings(completions: list[Generated], max_tokens: int) -> list[SettingCheck]:
    """Per-request settings (greedy, ignore_eos) checked against the responses.

    Per-request settings (sent with every request) checked against the responses:
    greedy -> the sampled token is the top-1 at every position; ignore_eos -> every
    completion ran to max_tokens with finish_reason "length".
    """
    usable = [g for g in completions if g.error is None and g.has_logprobs]
    argmax_ok = True
    for g in usable:
        for pos, (tok, top) in enumerate(zip(g.token_ids, g.top_logprobs, strict=False)):
            if not top:
                continue
            best = max(top.values())
            lp = g.logprobs[pos] if pos < len(g.logprobs) else None
            if lp is None or lp < best:
                argmax_ok = False
            if tok not in top:
                argmax_ok = False
    lengths_ok = all(
        len(g.token_ids) >= max_tokens and g.finish_reason in ("length", None) for g in usable
    )

    def sent(name: str, wanted: str, ok: bool, seen: str) -> SettingCheck:
        status = VERIFIED if ok and usable else (MISMATCH if usable else NOT_VERIFIED)
        return SettingCheck(name, wanted, seen, status, SENT_SOURCE)

    return [
        sent("greedy (temperature 0)", "argmax token", argmax_ok,
             "argmax at every position" if argmax_ok else "a sampled token was not the top-1"),
        sent("ignore_eos", "run to max_tokens", lengths_ok,
             "every completion reached max_tokens" if lengths_ok else "a completion stopped early"),
    ]  # fmt: skip


COMPILATION_MODES = {
    "0": "NONE",
    "1": "STOCK_TORCH_COMPILE",
    "2": "DYNAMO_TRACE_ONCE",
    "3": "VLLM_COMPILE",
}


def compilation_mode_name(mode: object) -> str:
    """vLLM's CompilationMode as recorded by the engine_info probe ("2") -> its name."""
    text = str(mode)
    return COMPILATION_MODES.get(text, text.rsplit(".", 1)[-1])


def _fmt(v: object) -> str:
    return "?" if v is None else str(v)


# ---- the batch that formed ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchEvidence:
    """What shows that the BS=N batch formed: largest co-batch, steps, prompts left alone."""

    source: str  # "batch probe" | "metrics (...)" | "none"
    max_batch: int | None  # largest number of this run's BS=N requests sampled together
    steps: int = 0  # sampling steps that included this run's BS=N requests
    wanted: int = 0
    alone: tuple[int, ...] = ()  # prompts never sampled together with another of ours
    per_prompt: dict[int, int] = field(default_factory=dict)  # prompt -> largest co-batch
    tokens: int | None = None  # generated tokens over those steps (metrics counters)

    @property
    def formed(self) -> bool | None:
        """True when the batch formed with no prompt alone; None without evidence."""
        if self.max_batch is None:
            return None
        return self.max_batch >= 2 and not self.alone

    def to_dict(self) -> dict[str, Any]:
        """The evidence as the report's ``batch`` object holds it."""
        return {
            "source": self.source,
            "max_batch": self.max_batch,
            "steps": self.steps,
            "wanted": self.wanted,
            "formed": self.formed,
            "alone": list(self.alone),
            "per_prompt": {str(k): v for k, v in sorted(self.per_prompt.items())},
            "tokens": self.tokens,
        }


def batch_from_probe(steps: list[dict], tag: str, wanted: int) -> BatchEvidence | None:
    """From batch-probe step records: how many BS=N requests were sampled in one step.

    From batch-probe step records: how many of this run's BS=N requests (ids carrying
    ``tag``) were sampled in one step, overall and per prompt. None when no step
    included them (probe not active in that engine).
    """
    best, n = 0, 0
    per_prompt: dict[int, int] = {}
    for s in steps:
        if s.get("event") != "step":
            continue
        ours = [
            i for i in (prompt_index(str(r), tag) for r in s.get("req_ids") or []) if i is not None
        ]
        if not ours:
            continue
        n += 1
        best = max(best, len(ours))
        for i in ours:
            per_prompt[i] = max(per_prompt.get(i, 0), len(ours))
    if n == 0:
        return None
    alone = tuple(sorted(i for i, k in per_prompt.items() if k < 2))
    return BatchEvidence("batch probe", best, n, wanted, alone, per_prompt)


def shared_steps(steps: list[dict], tag: str) -> int:
    """Largest batch (any requests) that a BS=1 request of this run was sampled in.

    Above 1, other traffic shared its steps, so that side was not truly BS=1.
    """
    best = 0
    for s in steps:
        if s.get("event") != "step":
            continue
        ids = [str(r) for r in s.get("req_ids") or []]
        if any(prompt_index(r, tag) is not None for r in ids):
            best = max(best, len(ids))
    return best


def batch_from_metrics(
    running_samples: list[float],
    wanted: int,
    steps: int | None = None,
    tokens: int | None = None,
) -> BatchEvidence:
    """From /metrics.

    ``steps``/``tokens`` are the engine-step and generated-token counter deltas over the BS=N
    phase: one request adds at most one token per step, so ``tokens`` spread over ``steps``
    means at least ceil(tokens/steps) requests shared some step (a lower bound on the peak). The
    sampled running-requests gauge can only raise that bound; alone it may miss a short batch.
    """
    peak = int(max(running_samples)) if running_samples else None
    if steps is not None and steps > 0 and tokens is not None:
        return BatchEvidence(
            "metrics (generated tokens per engine step)",
            max(-(-tokens // steps), peak or 0),  # ceil(tokens / steps)
            steps,
            wanted,
            tokens=tokens,
        )
    if peak is None:
        return BatchEvidence("none", None, 0, wanted)
    return BatchEvidence(
        "metrics (peak vllm:num_requests_running)", peak, len(running_samples), wanted
    )


# ---- what the engine's records add to one run's verdict and report ------------------


@dataclass(frozen=True, slots=True)
class RunFindings:
    """What a run's engine records add: failures (the verdict) and warnings (shown only)."""

    failures: tuple[str, ...]  # fail the run (besides the prompts' own results)
    warnings: tuple[str, ...]  # shown with the run; the verdict does not change


def _batch_findings(evidence: BatchEvidence, batch_size: int) -> tuple[list[str], list[str]]:
    failures: list[str] = []
    warnings: list[str] = []
    if evidence.alone and evidence.source == "batch probe":
        failures.append(
            f"prompt(s) {list(evidence.alone)} ran alone in the BS={batch_size} phase "
            "(never sampled with another request): BS=N not tested for them"
        )
    elif evidence.formed is False:
        if evidence.source == "batch probe":
            failures.append(
                f"BS={batch_size} did not form a batch (batch probe: at most "
                f"{evidence.max_batch} request(s) per step)"
            )
        elif evidence.tokens is not None:
            warnings.append(
                f"could not show that BS={batch_size} formed a batch ({evidence.source}: "
                f"{evidence.tokens} tokens in {evidence.steps} steps); not conclusive without "
                "the batch probe"
            )
        else:
            warnings.append(
                f"could not show that BS={batch_size} formed a batch ({evidence.source}: "
                f"peak {evidence.max_batch}); the gauge is sampled, so this is not conclusive"
            )
    return failures, warnings


def assess_run(
    settings: Sequence[SettingCheck],
    evidence: BatchEvidence,
    *,
    batch_size: int,
    bs1_shared: int,
    nudge: object = None,
) -> RunFindings:
    """The run's failures and warnings from its settings and batch evidence.

    A mismatched setting or a BS=N batch the probe shows did not form fails the run;
    weaker evidence, a BS=1 request that shared its steps (``bs1_shared``: largest batch
    a BS=1 request was sampled in), a test nudge and settings that could not be verified
    are warnings. ``nudge``: the batch probe's record of a test nudge, if armed.
    """
    failures = [
        f"setting {s.name}: wanted {s.wanted}, engine has {s.seen}" for s in settings if s.failed
    ]
    batch_failures, warnings = _batch_findings(evidence, batch_size)
    failures += batch_failures
    if bs1_shared > 1:
        warnings.append(
            f"a BS=1 request shared a sampling step with {bs1_shared - 1} other request(s) "
            "(other traffic on this server): that side was not strictly BS=1"
        )
    elif evidence.formed is None:
        warnings.append("could not show that the batch formed (no batch probe, no metrics)")
    if nudge:
        warnings.append(f"TEST NUDGE active in this engine (OPSCTL_PROBE_NUDGE): {nudge}")
    not_enforced = [s.name for s in settings if s.status == NOT_VERIFIED]
    if not_enforced:
        warnings.append("could not enforce/verify on this server: " + ", ".join(not_enforced))
    return RunFindings(tuple(failures), tuple(warnings))


FAILED_RUN_PLATFORM_NOTE = "the engine of this mode did not run the comparison"


def platform_of(engine_info: Mapping | None, probe_init: Mapping | None) -> str | None:
    """The platform (a device name) the engine's own records name, or None.

    engine_info first, else the batch probe's init record; with neither, a report's
    ``platform`` is null, with a ``platform_note``.
    """
    return plat.first((engine_info or {}).get("platform"), (probe_init or {}).get("platform"))


def execution_of(engine_info: Mapping | None) -> dict[str, Any] | None:
    """The execution mode the engine recorded (None without an engine_info record)."""
    if engine_info is None:
        return None
    return {
        "enforce_eager": engine_info.get("enforce_eager"),
        "compilation_mode": compilation_mode_name(engine_info.get("compilation_mode")),
    }


_ENGINE_LABEL = re.compile(r'^vllm:num_requests_running\{[^}\n]*\bengine="(\d+)"', re.M)


def dp_engines(metrics_text: str) -> list[int]:
    """The data-parallel engines a server's /metrics text shows (its ``engine`` labels)."""
    return sorted({int(m) for m in _ENGINE_LABEL.findall(metrics_text)})


def dp_pin(metrics_text: str) -> int | None:
    """The engine to send every request of a run to: the first of several; None for one.

    A BS=N batch forms in ONE engine; a data-parallel server spreads concurrent requests
    over its engines (and sums their gauges in /metrics), so unpinned BS=N would be several
    smaller batches counted as one."""
    engines = dp_engines(metrics_text)
    return engines[0] if len(engines) > 1 else None
