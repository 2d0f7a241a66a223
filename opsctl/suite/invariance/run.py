"""`diag invariance` as a library call: batch invariance of tokens and logprobs (vLLM PR 56528).

Every prompt runs alone (BS=1) and all prompts together (BS=N, sent at once so the
engine batches them); tokens and logprobs are compared, bitwise unless ``atol``. Fails
closed: request errors, missing logprobs and short outputs are failures.

On a vision-language model (tiny-vlm: one image per prompt, tiny-vlm-multi: several, a
model directory: one unless ``images`` says more) the prompts carry images: prompt ``i``
carries ``1 + i % m`` images, each a different deterministic picture
(:mod:`opsctl.suite.invariance.judge_images`), sent through ``/v1/chat/completions`` (vLLM
0.32's completions API takes no images), BS=N as concurrent requests. The engine is
started with ``--mm-processor-cache-gb 0`` (read back from its engine_info record), the
``mm_uuid`` probe next to the ``batch`` probe, and the image limit; the report shows
the items the engine core received and the vision encoder ran per request, and fails
closed when a request's images did not all arrive.

Against an :class:`~opsctl.checks.target.EngineSpec` the check runs one engine per mode
(``default``: vLLM's default execution mode, ``eager``: ``--enforce-eager``, ``both``:
one then the other), each with the isolating settings this module owns
(:func:`isolated_spec`: prefix caching off, mm processor cache 0,
``VLLM_USE_FLASHINFER_SAMPLER=0`` and the ``batch`` probe; greedy and ignore_eos go
with every request), and reads them back from the engine's own records. Against a
:class:`~opsctl.checks.target.UrlTarget` it runs once on the server as it is and says
which settings it could not enforce. With ``mode="both"`` a mode whose engine fails is
reported as failed and the other mode's report is kept.

Example::

    from opsctl.suite.invariance import run as invariance
    from opsctl.checks.target import EngineSpec
    report = invariance.run(EngineSpec(model="tiny-llama"), invariance.Options(mode="eager"))
    print(report.verdict, report.runs[0]["summary"]["largest_diff"])
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import httpx

from opsctl.checks import events as ev
from opsctl.checks.report import FAIL, INCONCLUSIVE, PASS, ReasonedReport
from opsctl.checks.sampling import check_sampling
from opsctl.checks.session import EngineSession, opened
from opsctl.checks.target import EngineSpec, Live, Target, UrlTarget
from opsctl.collectors import completions as cc
from opsctl.collectors import engine_records, http, ledger
from opsctl.collectors.engine_records import EngineRecords
from opsctl.domain import findings as fd
from opsctl.domain import platform as plat
from opsctl.domain import probe_evidence as pe
from opsctl.domain.check_registry import GENERATIVE
from opsctl.domain.knobs import warning as knob_warning
from opsctl.errors import BadInput, CheckFailed, EngineUnreachable, OpsctlError, OpsTimeout
from opsctl.suite.invariance import collect_images as mmc
from opsctl.suite.invariance import judge as inv
from opsctl.suite.invariance import judge_calibration as cal
from opsctl.suite.invariance import judge_engine as eng
from opsctl.suite.invariance import judge_images as img
from opsctl.suite.invariance import run_images as mm

if TYPE_CHECKING:
    from pathlib import Path

    from opsctl.checks.registry import CertifyContext, Need, Outcome, Planning, ServerRef

PINNED = (
    "data-parallel server: every request went to engine {pin} (vLLM's X-data-parallel-rank "
    "header), so BS=N is one engine's batch, not several smaller ones counted as one"
)
TITLE = "diag invariance"
SCHEMA = "diag.invariance/3"  # 3: calibration per run, inconclusive, seeds sweep
DEFAULT_MODEL = "tiny-llama"
MODES = ("default", "eager", "both")
BATCH_VIA = ("list", "requests")  # None: list for text, requests for prompts with images
DEFAULT_PROMPTS = (
    "The quick brown fox jumps over the lazy dog",
    "Hello world, this is a test of",
    "Once upon a time there was",
    "vLLM serves large language models",
    "The cat sat on the mat and",
    "In the beginning the engine",
    "Numbers: one two three four",
    "A batch of prompts walks into a",
)
ISOLATING_ARGS = ("--no-enable-prefix-caching", "--mm-processor-cache-gb", "0")
ISOLATING_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
PROBES = frozenset({"batch", "gate"})
COLUMNS = ("mode", "#", "prompt", "status", "first divergence", "largest |Δ|")


@dataclass(frozen=True)
class Options:
    """What the CLI flags set. Invalid values are :class:`BadInput` (exit 2)."""

    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    batch_size: int | None = None  # N of BS=N; None: all prompts in one batch
    max_tokens: int = 16
    logprobs: int = 5  # top logprobs compared per position
    mode: str | None = None  # default | eager | both; None: default (a URL: as it is)
    atol: float | None = None  # logprob tolerance; None: bitwise
    batch_via: str | None = None  # list: one request, N prompts | requests: N at once
    timeout: float | None = None  # seconds for a started engine's /health; None: spec's
    tag: str | None = None  # request-id tag; None: a fresh opsctl-inv-XXXXXX
    images: int | None = None  # most images per prompt; None: the model's; 0: text only
    batch_attempts: int = 3  # BS=N sent again while the probe shows it short of N together
    seeds: tuple[int, ...] = ()  # a sweep: one seeded prompt set per seed, on one engine
    probes: int = 2  # planted differences measured per run (the sensitivity)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompts", tuple(self.prompts))
        object.__setattr__(self, "seeds", tuple(self.seeds))
        if any(s < 0 for s in self.seeds) or len(set(self.seeds)) != len(self.seeds):
            raise BadInput("--seeds must be distinct non-negative integers")
        if self.probes < 1:
            raise BadInput("probes must be at least 1")
        if self.mode is not None and self.mode not in MODES:
            raise BadInput(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if len(self.prompts) < 2:
            raise BadInput(f"{len(self.prompts)} prompt(s) given; a batch needs at least 2")
        check_sampling(self.max_tokens, self.logprobs, self.atol)
        if self.n < 2:
            raise BadInput("--batch-size must be at least 2 (BS=N is compared with BS=1)")
        if self.n > len(self.prompts):
            raise BadInput(
                f"--batch-size {self.n} is larger than the number of prompts ({len(self.prompts)})"
            )
        if self.timeout is not None and self.timeout <= 0:
            raise BadInput("--timeout must be positive")
        if self.batch_attempts < 1:
            raise BadInput("batch_attempts must be at least 1")
        if self.images is not None and self.images < 0:
            raise BadInput("--images must be 0 or more")
        if self.batch_via is not None and self.batch_via not in BATCH_VIA:
            raise BadInput(
                f"--batch-via must be one of {', '.join(BATCH_VIA)}, not {self.batch_via!r}"
            )

    @property
    def n(self) -> int:
        """N of BS=N: ``batch_size``, else the number of prompts."""
        return len(self.prompts) if self.batch_size is None else self.batch_size


class InvarianceReport(ReasonedReport):
    """The ``opsctl.diag.invariance/3`` document (its ``warnings``: each run has its own too)."""

    @property
    def runs(self) -> list[dict[str, Any]]:
        """One entry per mode's run: its comparisons, reasons and warnings."""
        return list(self.document["runs"])

    @property
    def timed_out(self) -> bool:
        """A mode's engine did not become healthy in time (``mode="both"``)."""
        return any(r.get("timed_out") for r in self.document["runs"])


Report = InvarianceReport  # the name Parts.of reads (opsctl.domain.check_registry)


def isolated_spec(spec: EngineSpec, mode: str, options: Options) -> EngineSpec:
    """The engine one mode runs on: ``spec`` (default tiny-llama) with the isolating settings.

    The isolating arguments and environment, the batch probe (and the mm_uuid probe and
    the image limit when the prompts carry images), room for the batch and the execution
    mode. Idempotent, so a planner can pass its result back in."""
    images = mm.spec_images(spec, options.images, DEFAULT_MODEL)
    args = spec.extra_args
    n = len(ISOLATING_ARGS)
    if not any(args[i : i + n] == ISOLATING_ARGS for i in range(len(args))):
        args = (*args, *ISOLATING_ARGS)
    args = mm.with_limit(args, images)
    return spec.with_defaults(
        DEFAULT_MODEL,
        extra_args=args,
        env=tuple(sorted({**dict(spec.env), **ISOLATING_ENV}.items())),
        probes=spec.probes | (mm.PROBES if images else PROBES),
        enforce_eager=mode == "eager",
        max_num_seqs=max(spec.max_num_seqs, options.n),
        timeout=options.timeout or spec.timeout,
    )


def plan(target: Target, options: Options) -> list[tuple[str | None, Target]]:
    """The runs to do, as (mode, target): one on a URL's server, one engine per mode of a spec.

    A URL is one run on the server as it is (mode None unless given). Refuses (BadInput)
    what cannot work before anything starts: ``both`` on a URL, a pooling model."""
    if isinstance(target, UrlTarget):
        if options.mode == "both":
            raise BadInput("--mode both needs opsctl to start the engine (use --model, not a URL)")
        return [(options.mode, target)]
    from opsctl.engine.model import resolve

    resolved = resolve(target.model or DEFAULT_MODEL)
    if resolved.archetype not in GENERATIVE:
        raise BadInput(
            f"{resolved.name} is a {resolved.archetype} model; diag invariance needs a "
            "generative model (e.g. tiny-llama)"
        )
    if options.batch_via == "list" and mm.spec_images(target, options.images, DEFAULT_MODEL):
        raise BadInput(mm.LIST_REFUSAL)
    modes = ["default", "eager"] if options.mode == "both" else [options.mode or "default"]
    return [(m, isolated_spec(target, m, options)) for m in modes]


def run(
    target: Target,
    options: Options,
    progress: ev.Progress = ev.ignore,
    session: EngineSession | None = None,
) -> InvarianceReport:
    """Run the comparison on ``target`` (every mode of ``options``); see the module doc."""
    runs = plan(target, options)
    started = time.monotonic()
    tag = options.tag or f"opsctl-inv-{uuid.uuid4().hex[:6]}"
    progress(
        ev.Started(
            TITLE,
            f"BS=1 vs BS={options.n}: {len(options.prompts)} prompts x {options.max_tokens} "
            f"tokens, {inv.comparison_label(options.atol)}",
        )
    )
    job = _Job(options, tag, progress, session)
    docs = [d for mode, t in runs for d in job.run_mode(mode, t, only=len(runs) == 1)]
    verdict = cal.sweep_verdict([r["verdict"] for r in docs])
    progress(ev.Finished(verdict, "  |  ".join(f"{_run_label(r)}: {r['verdict']}" for r in docs)))
    return _report(options, tag, verdict, docs, time.monotonic() - started)


def _run_label(run: dict) -> str:
    """A run's name in lines: its mode, and its seed in a sweep."""
    seed = run.get("seed")
    return run["mode"] if seed is None else f"{run['mode']} seed {seed}"


def seed_options(options: Options, seed: int | None) -> Options:
    """The options of one seed of a sweep: its own prompt set (None: ``options`` as given)."""
    if seed is None:
        return options
    return replace(options, prompts=cal.seeded_prompts(seed, len(options.prompts)), seeds=())


def _sweep_doc(runs: list[dict]) -> list[dict]:
    """One line per run of a sweep: mode, seed, verdict and what decided it."""
    out = []
    for r in runs:
        c = r.get("calibration") or {}
        out.append(
            {
                "mode": r["mode"],
                "seed": r.get("seed"),
                "verdict": r["verdict"],
                "reasons": list(r["summary"].get("reasons") or []),
                "largest_diff": r["summary"].get("largest_diff"),
                "floor": c.get("floor"),
                "sensitivity": c.get("sensitivity"),
            }
        )
    return out


def _report(
    options: Options, tag: str, verdict: str, runs: list[dict], seconds: float
) -> InvarianceReport:
    from opsctl import output

    knobs = ledger.knobs_of([r.get("run_dir") for r in runs])
    line = knob_warning(knobs)
    vias = [r["batch"]["via"] for r in runs if r["batch"].get("via")]
    doc = output.document(
        SCHEMA,
        **plat.agreed([r.get("platform") for r in runs], _platform_note(runs)),
        vllm_version=plat.joined([r.get("vllm_version") for r in runs]),
        verdict=verdict,
        reasons=[f"[{_run_label(r)}] {x}" for r in runs for x in r["summary"]["reasons"]],
        comparison=inv.comparison_label(options.atol),
        atol=options.atol,
        prompts=len(options.prompts),
        batch_size=options.n,
        batch_via=vias[0] if vias else options.batch_via or "list",
        images_per_prompt=max((r["images"]["max_per_prompt"] for r in runs), default=0),
        max_tokens=options.max_tokens,
        logprobs=options.logprobs,
        request_tag=tag,
        runs=runs,
        seeds=list(options.seeds) or None,
        sweep=_sweep_doc(runs),
        totals=cal.sweep_totals([r["verdict"] for r in runs]),
        duration_s=round(seconds, 2),
        test_knobs=knobs,
        warnings=[line] if line else [],
    )
    return InvarianceReport(verdict, doc)


@dataclass(frozen=True)
class _Measured:
    """What one mode measured on its server, before any decision."""

    live: Live
    model: str
    version: str | None
    tags: tuple[str, str]  # request-id tags of the BS=1 and BS=N phases
    alone: list[cc.Timed]
    together: list[cc.Timed]
    seconds: dict[str, float]  # engine, bs1, bsn
    sampler: tuple[tuple[float, ...], int | None, int | None]  # gauge samples, steps, tokens
    records: EngineRecords
    pictures: tuple[tuple[img.RGB, ...], ...]  # each prompt's images (all () for text)
    via: str  # list | requests
    text_tokens: list[int | None] | None = None  # /tokenize without images (no mm probe)
    platform: str | None = None  # what the engine's records (or server) name
    platform_note: str | None = None  # why platform is None
    attempts: int = 1  # BS=N phases sent until the batch formed (see Options.batch_attempts)
    pinned: int | None = None  # the data-parallel engine every request went to
    control: tuple[cc.Timed, ...] = ()  # every prompt alone again: the noise floor
    probes: tuple[cc.Timed, ...] = ()  # probe prompts with words more: the sensitivity

    @property
    def images(self) -> int:
        return max((len(p) for p in self.pictures), default=0)


class _Job:
    """One run of the check: its options, tag, progress and the live table's rows."""

    def __init__(
        self, options: Options, tag: str, progress: ev.Progress, session: EngineSession | None
    ) -> None:
        self.options, self.tag, self.progress, self.session = options, tag, progress, session
        self.rows: list[tuple[str, ...]] = []

    def run_mode(self, mode: str | None, target: Target, *, only: bool) -> list[dict]:
        """One mode's report entries (one per seed of a sweep). With several modes, an
        engine that fails (dies, times out) gives a failed entry and the check goes on;
        bad input never does."""
        try:
            return self._run_mode(mode, target)
        except (BadInput, EngineUnreachable):
            raise
        except OpsctlError as err:
            if only:
                raise
            self.progress(ev.Phase(f"{mode}: failed"))
            self.progress(ev.Log(f"{mode}: {err.message}", level="warning"))
            return [failed_run(mode, err.message, timed_out=isinstance(err, OpsTimeout))]

    def _run_mode(self, mode: str | None, target: Target) -> list[dict]:
        label = mode or "server as is"
        t_start = time.monotonic()
        if isinstance(target, EngineSpec):  # a URL is only checked for reachability
            self.progress(ev.Phase(f"{label}: preparing the engine"))
        self.progress(ev.Table(COLUMNS, tuple(self.rows)))
        docs = []
        with opened(
            target, self.session, self.progress, label=f"invariance-{mode or 'url'}"
        ) as live:
            engine_seconds = time.monotonic() - t_start
            knob_line = knob_warning(ledger.knobs_of([live.run_dir]))
            if knob_line:
                self.progress(ev.Alert(knob_line))
            pin = self._pin(live, label)
            with http.pinned_to_engine(pin):
                for seed in self.options.seeds or (None,):  # a sweep: every seed, one engine
                    docs.append(self._one_seed(live, mode, label, seed, engine_seconds, pin))
                    engine_seconds = 0.0
        return docs

    def _one_seed(
        self, live: Live, mode: str | None, label: str, seed: int | None, engine_s: float, pin
    ) -> dict:
        """One seed's measurement and decision on the open engine (its own prompts, tag)."""
        t0 = time.monotonic()
        job = _Job(seed_options(self.options, seed), self.tag, self.progress, self.session)
        job.rows = self.rows
        if seed is not None:
            job.tag, label = f"{self.tag}-s{seed}", f"{label} seed {seed}"
        measured = replace(job._measure(live, mode, label, engine_s), pinned=pin)
        doc = job._decide(measured, mode, label, time.monotonic() - t0 + engine_s)
        return {**doc, "seed": seed}

    def _pin(self, live: Live, label: str) -> int | None:
        """The data-parallel engine every request of the run goes to (None: one engine)."""
        try:
            with http.client(live.api_key, timeout=10.0) as c:
                r = c.get(f"{live.url}/metrics")
        except httpx.HTTPError:
            return None
        pin = eng.dp_pin(r.text) if r.status_code == 200 else None
        if pin is not None:
            self.progress(ev.Log(f"{label}: {PINNED.format(pin=pin)}"))
        return pin

    def _served_model(self, live: Live) -> tuple[str, str | None]:
        model = cc.served_model(live.url, api_key=live.api_key)
        if model is None:
            raise CheckFailed(f"{live.url}/v1/models listed no model")
        refusal = cc.completions_refusal(live.url, model, api_key=live.api_key)
        if refusal is not None:
            raise BadInput(
                f"{live.url} does not serve /v1/completions for {model} ({refusal}); "
                "diag invariance needs a generative model"
            )
        return model, cc.server_version(live.url, api_key=live.api_key)

    def _phase(self, label: str, side: str, what: str) -> Callable[[int, cc.Timed], None]:
        """Start the BS=1 or BS=N phase; the callback counts its finished requests."""
        name, total = f"{label}: {side}: {what}", len(self.options.prompts)
        self.progress(ev.Phase(name, 0, total))
        done = itertools.count(1)

        def on_done(i: int, res: cc.Timed) -> None:
            g = res.generated
            state = "error: " + g.error if g.error else f"{len(g.token_ids)} tokens"
            self.progress(ev.Phase(name, next(done), total))
            self.progress(ev.Log(f"{label}: {side} prompt {i}: {state} in {res.seconds:.2f} s"))

        return on_done

    def _measure(self, live: Live, mode: str | None, label: str, engine_s: float) -> _Measured:
        o, key = self.options, live.api_key
        model, version = self._served_model(live)
        pictures = mm.pictures(live, model, o.images, len(o.prompts))
        params = cc.CompletionParams(model, o.max_tokens, o.logprobs)
        alone_fn, together_fn, via = mm.senders(live, params, o.prompts, o.n, o.batch_via, pictures)
        n_img = sum(map(len, pictures))
        what = f" with {n_img} images" if n_img else ""
        tags = (f"{self.tag}-{mode or 'url'}-bs1", f"{self.tag}-{mode or 'url'}-bs{o.n}")
        on_done = self._phase(label, "BS=1", f"{len(o.prompts)} prompts{what} one at a time")
        t0 = time.monotonic()
        alone = alone_fn(tags[0], on_done)
        t_alone = time.monotonic() - t0
        base = f"{self.tag}-{mode or 'url'}"
        control, probes = self._calibration_runs(live, params, pictures, base, label)
        together, records, sampler, t_together, last_tag, attempts = self._together(
            live, together_fn, tags[1], label, what
        )
        tags = (tags[0], last_tag)
        text_tokens = None
        if n_img and records.mm_items is None:  # no engine probe: the usage cross-check
            text_tokens = mmc.text_token_counts(live.url, model, o.prompts, api_key=key)
        platform = eng.platform_of(records.info, records.probe_init) or plat.first(
            records.platform, engine_records.identity_at(None, live.url, key)[0]
        )
        note = None if platform else engine_records.platform_note(live.run_dir)
        return _Measured(
            live,
            model,
            version,
            tags,
            alone,
            together,
            {"engine": engine_s, "bs1": t_alone, "bsn": t_together},
            (tuple(sampler.samples), sampler.steps, sampler.tokens),
            records,
            pictures,
            via,
            text_tokens,
            platform,
            note,
            attempts,
            control=tuple(control),
            probes=tuple(probes),
        )

    def _calibration_runs(self, live: Live, params, pictures, tag: str, label: str):
        """The control (every prompt alone again: the floor) and the probes (the first
        prompts with a few words more, alone: the sensitivity); see judge_calibration."""
        o, k = self.options, min(self.options.probes, len(self.options.prompts))
        again, _, _ = mm.senders(live, params, o.prompts, o.n, o.batch_via, pictures)
        on_done = self._phase(label, "control", "every prompt alone again (the noise floor)")
        control = again(f"{tag}-ctl", on_done)
        planted = [cal.probe_prompt(p) for p in o.prompts[:k]]
        probe_fn, _, _ = mm.senders(live, params, planted, 2, o.batch_via, pictures[:k])
        self.progress(ev.Phase(f"{label}: probes: {k} planted differences", 0, k))
        probes = probe_fn(f"{tag}-prb", lambda i, res: None)
        return control, probes

    def _together(self, live: Live, together_fn: mm.Phase, tag: str, label: str, what: str):
        """The BS=N phase, sent again under a fresh tag while the batch probe shows
        fewer than N of them sampled together, or prompts that ran alone (separate
        requests, and the prompts of one request, reach the engine when the API server
        hands them over: on a busy machine the first can start before the last
        arrives), at most ``batch_attempts`` times. Returns (results, records, sampler, seconds, tag,
        attempts); the last attempt is what the check judges."""
        o = self.options
        for attempt in range(1, o.batch_attempts + 1):
            run_tag = tag if attempt == 1 else f"{tag}r{attempt}"
            again = f" (attempt {attempt})" if attempt > 1 else ""
            on_done = self._phase(label, f"BS={o.n}", f"prompts{what} sent together{again}")
            t0 = time.monotonic()
            with cc.RunningSampler(live.url, api_key=live.api_key) as sampler:
                together = together_fn(run_tag, on_done)
            seconds = time.monotonic() - t0
            sampler.settle(sum(len(t.generated.token_ids) for t in together))
            records = engine_records.read_after(live.run_dir, run_tag, len(o.prompts))
            probe = eng.batch_from_probe(list(records.batch), run_tag, o.n)
            full = (probe.max_batch or 0) >= o.n if probe is not None else True
            if probe is None or (full and not probe.alone) or attempt == o.batch_attempts:
                break
            if probe.alone:
                why = f"prompt(s) {list(probe.alone)} ran alone"
            else:  # a smaller batch is still a batch, but not the BS=N asked for
                why = f"at most {probe.max_batch} of the {o.n} prompts were sampled together"
            self.progress(
                ev.Log(
                    f"{label}: BS={o.n} attempt {attempt}: {why} (the requests reached the "
                    "engine one after another); sending again",
                    level="warning",
                )
            )
        return together, records, sampler, seconds, run_tag, attempt

    def _calibration(self, m: _Measured) -> cal.Calibration:
        """The run's floor (BS=1 twice) and sensitivity (the probes); see
        :mod:`opsctl.suite.invariance.judge_calibration`."""
        o = self.options
        pairs = [(a.generated, c.generated) for a, c in zip(m.alone, m.control, strict=False)]
        effects = [
            cal.first_position_effect(a.generated, p.generated)
            for a, p in zip(m.alone, m.probes, strict=False)
        ]
        return cal.calibrate(pairs, effects, o.max_tokens, o.atol)

    def _compare(self, m: _Measured, label: str, atol: float | None) -> list[inv.PromptResult]:
        o = self.options
        results = [
            inv.compare(
                i,
                a.generated,
                b.generated,
                max_tokens=o.max_tokens,
                logprobs=o.logprobs,
                atol=atol,
            )
            for i, (a, b) in enumerate(zip(m.alone, m.together, strict=True))
        ]
        for r in results:
            text = inv.divergence_text(r)
            prompt, diff = inv.preview(o.prompts[r.index]), inv.fmt_diff(r.largest_diff)
            self.rows.append((label, str(r.index), prompt, r.status, text, diff))
            if not r.passed:
                self.progress(
                    ev.CaseResult(f"{label}: prompt {r.index}", FAIL, f"{r.status}: {text}")
                )
        self.progress(ev.Table(COLUMNS, tuple(self.rows)))
        return results

    def _decide(self, m: _Measured, mode: str | None, label: str, total_s: float) -> dict:
        o, rec = self.options, m.records
        calib = self._calibration(m)
        results = self._compare(m, label, atol=calib.atol_for_compare())
        samples, steps, tokens = m.sampler
        evidence = eng.batch_from_probe(list(rec.batch), m.tags[1], o.n) or eng.batch_from_metrics(
            list(samples), o.n, steps, tokens
        )
        probe_env = rec.probe_init.get("env") if rec.probe_init else None
        settings = eng.check_engine_settings(rec.info, probe_env, mode=mode, images=m.images > 0)
        settings += eng.check_request_settings(
            [t.generated for t in m.alone + m.together], o.max_tokens
        )
        shared = eng.shared_steps(list(rec.batch), m.tags[0])
        findings = eng.assess_run(
            settings,
            evidence,
            batch_size=o.n,
            bs1_shared=shared,
            nudge=(rec.probe_init or {}).get("nudge"),
        )
        images = mm.evidence(m.pictures, m.tags, m.records, (m.alone, m.together), m.text_tokens)
        img_failures, img_warnings = img.assess(images, o.n)
        probes = probe_findings(m.live.run_dir, images=m.images > 0)
        failures = [*img_failures, *findings.failures, *pe.lines(probes, fd.FAIL)]
        warnings = [*img_warnings, *findings.warnings, *pe.lines(probes, fd.WARNING)]
        if m.pinned is not None:
            warnings.append(PINNED.format(pin=m.pinned))
        if m.attempts > 1:
            warnings.append(
                f"BS={o.n} was sent {m.attempts} times: before, some requests reached the "
                f"engine after the others had finished; attempt {m.attempts} is compared"
            )
        summary = _calibrated_summary(calib, results, o.atol, failures)
        self.progress(ev.Phase(f"{label}: done"))
        reasons = "; ".join(summary.reasons) or "all prompts matched"
        self.progress(ev.Log(f"{label}: verdict {summary.verdict}: {reasons}"))
        for w in warnings:
            self.progress(ev.Log(f"{label}: {w}", level="warning"))
        return {
            "mode": mode or "server as is",  # the label failed_run and progress use
            "requested_mode": mode,
            "verdict": summary.verdict,
            "url": m.live.url,
            "external": m.live.external,
            "run_dir": str(m.live.run_dir) if m.live.run_dir else None,
            "model": m.model,
            "vllm_version": m.version or rec.vllm_version,
            "platform": m.platform,
            "platform_note": m.platform_note,
            "execution": eng.execution_of(rec.info),
            "summary": summary.to_dict(),
            "calibration": calib.to_dict(),
            "settings": [s.to_dict() for s in settings],
            "batch": {
                **evidence.to_dict(),
                "via": m.via,
                "bs1_max_shared": shared,
                "attempts": m.attempts,
                "gathered": _gathered(rec.gathered, m.tags[1]),
            },
            "images": {**images.to_dict(), "max_per_prompt": m.images},
            "warnings": warnings,
            "prompts": [self._prompt_doc(m, r) for r in results],
            "durations_s": {
                "engine": round(m.seconds["engine"], 2),
                "bs1": round(m.seconds["bs1"], 3),
                "bsn": round(m.seconds["bsn"], 3),
                "total": round(total_s, 2),
            },
        }

    def _prompt_doc(self, m: _Measured, r: inv.PromptResult) -> dict:
        return {
            **r.to_dict(),
            "prompt": self.options.prompts[r.index],
            "images": len(m.pictures[r.index]),
            "alone_s": round(m.alone[r.index].seconds, 4),
            "batched_s": round(m.together[r.index].seconds, 4),
        }


def _calibrated_summary(
    calib: cal.Calibration,
    results: list[inv.PromptResult],
    atol: float | None,
    failures: list[str],
) -> inv.Summary:
    """The run's summary under the calibration rule: a request error or an engine finding
    fails; else a conclusive comparison passes within the bound and fails beyond it, and one
    that is not conclusive is ``inconclusive`` with the reason and what would make it
    conclusive."""
    summary = inv.summarize(results, atol, failures)
    if failures or any(r.status == inv.ERROR for r in results) or not results:
        return summary
    verdict = calib.judge(summary.verdict == PASS)
    reasons = summary.reasons
    if verdict == INCONCLUSIVE:
        reasons = (*reasons, calib.why_inconclusive())
    comparison = (
        summary.comparison if calib.bitwise or calib.atol else f"floor={cal.fmt(calib.floor)}"
    )
    return replace(summary, verdict=verdict, reasons=tuple(reasons), comparison=comparison)


def probe_findings(run_dir: Path | None, *, images: bool) -> list[fd.Finding]:
    """What the engine's ledger says of the probes this check reads.

    The probes: batch; with images also mm_uuid. Each could not hook (fails the run) or
    unverified on this vLLM (a warning); nothing for a server without a ledger."""
    if run_dir is None:
        return []
    probes = ("batch", "mm_uuid") if images else ("batch",)
    return pe.probe_findings(ledger.read_records(run_dir), probes, "invariance")


def failed_run(mode: str | None, reason: str, timed_out: bool = False) -> dict:
    """The report entry of a mode whose engine never got to run the comparison."""
    return {
        "mode": mode or "server as is",
        "verdict": FAIL,
        "error": reason,
        "timed_out": timed_out,
        "summary": {
            "verdict": FAIL,
            "reasons": [reason],
            "tokens_identical": False,
            "identical": 0,
            "within_atol": 0,
            "diverged": 0,
            "errors": 0,
            "largest_diff": None,
        },
        "batch": {"max_batch": 0, "source": "-"},
        "images": {"max_per_prompt": 0, "total": 0, "reached": None, "source": "-"},
        "execution": None,
        "platform": None,
        "platform_note": eng.FAILED_RUN_PLATFORM_NOTE,
        "vllm_version": None,
        "settings": [],
        "prompts": [],
        "warnings": [],
        "durations_s": {"engine": None, "bs1": None, "bsn": None, "total": None},
    }


def _platform_note(runs: list[dict]) -> str:
    """Why the report's platform is unknown: the first run's reason (else the engines
    recorded none)."""
    return next((r["platform_note"] for r in runs if r.get("platform_note")), plat.NO_RECORD_NOTE)


def _gathered(released, tag: str) -> dict[str, int] | None:
    """How the engine's gate probe released the judged BS=N groups: {"complete": n,
    "timeout": m}; None when no group of that send went through a gate."""
    ours = [
        r
        for r in released
        if any(eng.prompt_index(str(i), tag) is not None for i in r.get("req_ids") or ())
    ]
    if not ours:
        return None
    return {why: sum(1 for r in ours if r.get("why") == why) for why in ("complete", "timeout")}


def certify(ctx: CertifyContext, progress: ev.Progress) -> InvarianceReport:
    """Batch invariance as certify runs it (the options certify planned engines with)."""
    return run(ctx.target, ctx.settings["invariance"], progress, ctx.session)


def certify_options(options: Any, managed: bool) -> Options:
    """The options certify runs (and plans engines for) invariance with.

    certify's ``invariance_mode`` on an engine it starts; a URL's server as it is."""
    return Options(mode=options.invariance_mode if managed else None, timeout=options.timeout)


def shared_base(spec: EngineSpec, planning: Planning, options: Options) -> EngineSpec:
    """What every engine of certify's run shares, for a generative model.

    The isolating environment, the execution mode under test and room for the batch."""
    if not planning.subject.generative:
        return spec
    return replace(
        spec,
        env=tuple(sorted({**dict(spec.env), **ISOLATING_ENV}.items())),
        enforce_eager=options.mode == "eager",
        max_num_seqs=max(spec.max_num_seqs, options.n),
    )


def shared_engine(spec: EngineSpec, planning: Planning, options: Options) -> EngineSpec:
    """The engine certify's checks share: for a generative model, the isolated one.

    Its probes are left to the specs that ask for them (certify's session unions them)."""
    if not planning.subject.generative:
        return spec
    return replace(isolated_spec(spec, options.mode or "default", options), probes=frozenset())


def engines(planning: Planning, options: Options) -> Need:
    """Under certify: the shared engine, and the engine of each mode it runs."""
    from opsctl.checks.registry import Need

    specs = [t for _, t in plan(planning.main, options) if isinstance(t, EngineSpec)]
    return Need(planning.main, tuple(specs))


def on_server(server: ServerRef, progress: ev.Progress) -> InvarianceReport:
    """Batch invariance on a console's server, as it is configured."""
    return run(server.url, Options(), progress)


def outcome(report: InvarianceReport, options: Options) -> Outcome:
    """The exit rule: 0 only when every prompt of every seed matched.

    1 on a failure or an inconclusive comparison, 4 when an engine did not start."""
    from opsctl.checks.registry import Outcome

    warnings = tuple(report.warnings)  # after the run: never while a panel owns the terminal
    if report.timed_out:
        timed_out = "an engine did not become healthy within --timeout; see the report"
        return Outcome(warnings=warnings, failure=OpsTimeout(timed_out))
    if report.passed:
        return Outcome(warnings=warnings)
    if report.verdict == INCONCLUSIVE:  # never a pass: exit 1, saying what would decide it
        why = [r for r in report.reasons if "inconclusive" in r] or [
            *report.reasons,
            f"to make it conclusive {cal.REMEDY}",
        ]
        return Outcome(
            warnings=warnings,
            failure=CheckFailed("batch invariance inconclusive: " + "; ".join(why)[:600]),
        )
    failed = CheckFailed(
        "batch invariance failed: " + "; ".join(report.reasons or ["see report"])[:600],
        hint="--atol X allows a stated logprob tolerance" if options.atol is None else None,
    )
    return Outcome(warnings=warnings, failure=failed)
