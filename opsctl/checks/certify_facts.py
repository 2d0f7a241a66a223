"""What a certification records about its engines and the build it certified.

Read after the run, from the session, the run directories and the model files:

- :func:`engines`: every engine start: model, URL, run directory, the argv it ran,
  arguments, environment, test knobs, probes, time to healthy, the checks it served,
  and its stop report;
- :func:`fingerprint`: vLLM version, platform (the patch ledger's "platform" field),
  model (name, path, sha256 of config.json and of each weights file), engine args,
  patch ledger summary, opsctl version.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from opsctl.checks.certify_plan import Facts
from opsctl.checks.session import EngineSession
from opsctl.checks.target import Target, UrlTarget
from opsctl.collectors import certify as certify_col
from opsctl.collectors import ledger
from opsctl.suite.patches.judge import ledger_summary


def engines(session: EngineSession) -> list[dict[str, Any]]:
    """One record per engine ``session`` started: spec, argv, timing, served checks, stop."""
    served = getattr(session, "served", {})
    out = []
    for i, start in enumerate(session.starts):
        spec, live = start.spec, start.live
        stop = getattr(live.server, "stop_report", None)
        out.append(
            {
                "index": i,
                "model": live.model,
                "url": live.url,
                "run_dir": str(live.run_dir) if live.run_dir else None,
                "argv": certify_col.read_meta(live.run_dir).get("argv"),
                "extra_args": list(spec.extra_args),
                "env": dict(spec.env),
                "test_knobs": dict(spec.knobs),
                "probes": sorted(spec.probes),
                "enforce_eager": spec.enforce_eager,
                "single_process": spec.single_process,
                "max_model_len": spec.max_model_len,
                "max_num_seqs": spec.max_num_seqs,
                "healthy_after_s": round(start.seconds, 2),
                "served": list(served.get(id(start), start.served)),
                "stop": _stop(stop),
            }
        )
    return out


def _stop(report: Any) -> dict[str, Any] | None:
    """An engine's stop report, its duration as ``duration_s``."""
    if report is None:
        return None
    out = asdict(report)
    out["duration_s"] = round(float(out.pop("seconds")), 2)
    return out


def _run_dirs(facts: Facts, engine_docs: list[dict[str, Any]]) -> list[Path]:
    dirs = [Path(e["run_dir"]) for e in engine_docs if e.get("run_dir")]
    return dirs or ([facts.run_dir] if facts.run_dir else [])


def fingerprint(target: Target, facts: Facts, engine_docs: list[dict[str, Any]]) -> dict[str, Any]:
    """What was certified. The ledger is the main (first) engine's, or the URL's run's."""
    dirs = _run_dirs(facts, engine_docs)
    records = ledger.read_records(dirs[0]) if dirs else []
    summary = ledger_summary(records) if records else None
    version = summary["vllm_version"] if summary else None
    if version is None and isinstance(target, UrlTarget):
        from opsctl.collectors.completions import server_version

        version = server_version(target.url, api_key=target.api_key)
    if isinstance(target, UrlTarget):
        argv = certify_col.read_meta(facts.run_dir).get("argv")
        args = [{"engine": None, "argv": argv}] if argv else []
    else:
        args = [{"engine": e["index"], "argv": e["argv"]} for e in engine_docs]
    return {
        "vllm_version": version,
        "platform": summary["platform"] if summary else None,
        "model": {"name": facts.subject.model, **certify_col.model_files(facts.model_path)},
        "engine_args": args,
        "patch_ledger": summary,
        "opsctl_version": certify_col.opsctl_version(),
    }


def bare_fingerprint() -> dict[str, Any]:
    """The fingerprint of a certification that reached nothing.

    Every fact is unknown (null) but opsctl's own version."""
    return {
        "vllm_version": None,
        "platform": None,
        "model": {"name": None, **certify_col.model_files(None)},
        "engine_args": [],
        "patch_ledger": None,
        "opsctl_version": certify_col.opsctl_version(),
    }
