"""What several tests expect of a certify document or an invariance run, written once."""

from __future__ import annotations

# certify's checks on a single target, in the order the report lists them
CHECKS = ("liveness", "patches", "engram", "usage", "invariance", "mm-uuid", "kv-fail", "shutdown")

# what diag invariance verified of a CPU engine's settings (text prompts, greedy)
CPU_SETTINGS = {
    "prefix caching": "verified",
    "mm processor cache": "not applicable",
    "VLLM_USE_FLASHINFER_SAMPLER": "verified",
    "execution mode": "verified",
    "greedy (temperature 0)": "verified",
    "ignore_eos": "verified",
}


def verdicts(doc: dict) -> dict[str, str]:
    """Each check's verdict in a certify document."""
    return {c["check"]: c["verdict"] for c in doc["checks"]}


def expected(**named: str) -> dict[str, str]:
    """Every certify check "skipped" but those named by verdict.

    ``expected(pass_="liveness engram", error="patches")``: a trailing ``_`` spares a
    keyword.
    """
    table = dict.fromkeys(CHECKS, "skipped")
    for verdict, checks in named.items():
        for check in checks.split():
            assert check in table, check
            table[check] = verdict.rstrip("_")
    return table


def settings_status(run: dict) -> dict[str, str]:
    """Each setting's status in one run of an invariance report."""
    return {s["name"]: s["status"] for s in run["settings"]}
