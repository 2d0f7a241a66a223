"""Fidelity cases of invariance, usage, mm-uuid and lora for ``benchmarks/fidelity.py``.

Each case is a check, a variant and the verdict a right check gives (``pass`` for the
control, ``fail`` for the planted fault), run over the seeds on ONE engine start:

- invariance (tiny-llama): ``control`` (expect pass) and ``nudge`` (expect fail: the test
  knob NUDGE adds 0.01 to the top logit at output position 3 of every request in a batch
  of more than one, i.e. every BS=N request). ``--seeds``: a sweep on one engine, one
  seeded prompt set per seed.
- lora (tiny-llama, its embedded adapters alpha and beta, ``--max-loras 3``): ``right``
  (expect pass) and ``swapped`` (expect fail: the test knob LORA_SWAP swaps two adapters'
  mapping in every step that mixes them). ``--seeds``: a sweep on one engine, one seeded
  prompt set per seed. A free LoRA slot, because with every slot in use vLLM 0.32 on CPU
  serves base-model rows batched with LoRA rows with the last slot's adapter (upstream
  PR 48421; the check's own default of one slot per adapter): measured 10 of 10 seeds
  failing, rightly (r2 and r5, the base requests, came back equal to beta's output), so
  that engine is no control.
- mm-uuid (tiny-vlm-multi, caches off): ``kept`` (expect pass) and ``rewritten`` (expect
  fail: the test knob MM_UUID_REWRITE rewrites one explicit UUID before the engine core
  sees it). mm-uuid has no seed-dependent input: a seed is one more run on the same engine.
- usage (tiny-reranker, dummy weights): ``honest`` (expect pass, the engine as it is) and
  ``inflated`` (expect fail: the same engine behind a stand-in proxy that adds one token to
  every /score and /rerank ``usage``). usage has no seed-dependent input either: a seed is
  one more run.

Every case returns one verdict per seed (pass | fail | inconclusive | unverified). Run::

    OPSCTL_ENGINE_LOCK=/tmp/opsctl-engine.lock \\
      python benchmarks/fidelity.py --checks invariance,usage,mm-uuid,lora --seeds 0-9
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fidelity import Case
from engine_patches import knobs
from tests.standins.base import JSONHandler, serving

NUDGE_MARKER = "-bs"  # in every BS=N request id (tag ...-bs<N>), never in BS=1's (alone)
MM_PREFIX = "fid"
MM_CANARY = f"{MM_PREFIX}-all-0"  # the first explicit UUID of the all-explicit case
USAGE_PATHS = ("/score", "/rerank", "/v1/score", "/v1/rerank", "/v2/rerank")


def _log(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


# ---- invariance ------------------------------------------------------------------------------


def invariance(knob: tuple[tuple[str, str], ...]):
    """A case runner: ``diag invariance`` swept over the seeds on one tiny-llama engine."""

    def run(seeds: Sequence[int]) -> list[str]:
        from opsctl.checks.target import EngineSpec
        from opsctl.suite.invariance import run as check

        report = check.run(EngineSpec("tiny-llama", knobs=knob), check.Options(seeds=tuple(seeds)))
        by_seed = {r["seed"]: r for r in report.runs}
        for s in seeds:
            c = by_seed[s].get("calibration") or {}
            _log(
                f"invariance seed {s}: {by_seed[s]['verdict']} (largest diff "
                f"{by_seed[s]['summary'].get('largest_diff')}, floor {c.get('floor')}, "
                f"sensitivity {c.get('sensitivity')})"
            )
        return [by_seed[s]["verdict"] for s in seeds]

    return run


# ---- lora ------------------------------------------------------------------------------------


def lora(knob: tuple[tuple[str, str], ...]):
    """A case runner: ``diag lora`` swept over the seeds on one tiny-llama engine."""

    def run(seeds: Sequence[int]) -> list[str]:
        from opsctl.checks.target import EngineSpec
        from opsctl.suite.lora import run as check

        options = check.Options(max_loras=3, seeds=tuple(seeds))  # a free slot: the module doc
        report = check.run(EngineSpec("tiny-llama", knobs=knob), options)
        by_seed = {s["seed"]: s for s in report.document["sweep"]}
        for s in seeds:
            line = by_seed[s]
            _log(f"lora seed {s}: {line['verdict']} {line['reasons'][:2]}")
        return [by_seed[s]["verdict"] for s in seeds]

    return run


# ---- mm-uuid ---------------------------------------------------------------------------------


def mm_uuid(knob: tuple[tuple[str, str], ...]):
    """A case runner: ``diag mm-uuid`` (caches off) once per seed on one tiny-vlm-multi engine."""

    def run(seeds: Sequence[int]) -> list[str]:
        from opsctl.checks.session import EngineSession
        from opsctl.checks.target import EngineSpec
        from opsctl.suite.mm_uuid import run as check

        spec = EngineSpec("tiny-vlm-multi", load_format="dummy", knobs=knob, timeout=400.0)
        options = check.Options(uuid_prefix=MM_PREFIX, modes=("caches-off",))
        out = []
        with EngineSession() as session:
            for s in seeds:
                report = check.run(spec, options, session=session)
                _log(f"mm-uuid seed {s}: {report.verdict} ({len(report.failed_items)} failed)")
                out.append(report.verdict)
        return out

    return run


# ---- usage -----------------------------------------------------------------------------------


class _Inflating(JSONHandler):
    """A stand-in proxy: forwards everything, adds one token to /score and /rerank usage."""

    upstream = ""

    def do_GET(self) -> None:
        self._forward("GET", None)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self._forward("POST", self.rfile.read(n))

    def _forward(self, method: str, body: bytes | None) -> None:
        import httpx

        headers = {
            k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")
        }
        r = httpx.request(
            method, self.upstream + self.path, content=body, headers=headers, timeout=120
        )
        data = r.content
        if self.path.split("?")[0] in USAGE_PATHS and r.status_code == 200:
            doc = json.loads(data)
            usage = doc.get("usage") or {}
            for key in ("prompt_tokens", "total_tokens"):
                if isinstance(usage.get(key), int):
                    usage[key] += 1
            data = json.dumps(doc).encode()
        self._send_bytes(r.status_code, data, r.headers.get("content-type", "application/json"))


@contextlib.contextmanager
def inflating_proxy(upstream: str) -> Iterator[str]:
    """A proxy on 127.0.0.1 in front of ``upstream`` that inflates usage by one token."""
    handler = type("Inflating", (_Inflating,), {"upstream": upstream.rstrip("/")})
    with serving(handler) as url:
        yield url


_USAGE: dict[str, list[str]] = {}  # variant -> verdicts (both variants share one engine)


def usage(variant: str):
    """A case runner: ``diag usage`` once per seed, honest and inflated, on one engine."""

    def run(seeds: Sequence[int]) -> list[str]:
        key = f"{variant}:{','.join(map(str, seeds))}"
        if key not in _USAGE:
            _usage_both(seeds)
        return _USAGE[key]

    return run


def _usage_both(seeds: Sequence[int]) -> None:
    from opsctl.checks.session import EngineSession
    from opsctl.checks.target import EngineSpec, UrlTarget
    from opsctl.suite.usage import run as check

    spec = EngineSpec("tiny-reranker", load_format="dummy", timeout=400.0)
    tail = ",".join(map(str, seeds))
    with EngineSession() as session:
        live = session.engine(spec, label="fidelity-usage")
        with inflating_proxy(live.url) as proxy:
            for variant, target in (("honest", spec), ("inflated", UrlTarget(proxy))):
                out = []
                for s in seeds:
                    report = check.run(target, check.Options(), session=session)
                    _log(f"usage {variant} seed {s}: {report.verdict}")
                    out.append(report.verdict)
                _USAGE[f"{variant}:{tail}"] = out


CASES = [
    Case("invariance", "control (no knob)", "pass", invariance(())),
    Case(
        "invariance",
        f"nudge {NUDGE_MARKER}:3",
        "fail",
        invariance(((knobs.NUDGE, f"{NUDGE_MARKER}:3"),)),
    ),
    Case("usage", "honest", "pass", usage("honest")),
    Case("usage", "inflated (+1 token proxy)", "fail", usage("inflated")),
    Case("mm-uuid", "kept", "pass", mm_uuid(())),
    Case("mm-uuid", "rewritten (knob)", "fail", mm_uuid(((knobs.MM_UUID_REWRITE, MM_CANARY),))),
    Case("lora", "right", "pass", lora(())),
    Case("lora", "swapped (LORA_SWAP=lm)", "fail", lora(((knobs.LORA_SWAP, "lm"),))),
]
