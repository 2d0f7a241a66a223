"""patches: the engine-patch ledger of the run certified (the check's declaration).

The whole check is this folder, one file per role: ``judge.py`` (pure: the ledger's
summary and findings), ``run.py`` (the library call certify makes; it reads the ledger the
engine plugin writes through opsctl.checks.patches, which ``opsctl patches`` shows). A
certify check only; what it shares with engram and shutdown is
opsctl.checks.findings_report.
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Subject

NO_RUN_DIR = (
    "no opsctl run directory for this server (not started by opsctl): its patch ledger "
    "cannot be read"
)


def _applies(s: Subject) -> str | None:
    return None if s.run_dir else NO_RUN_DIR


CHECK = Check(
    "patches",
    "patch ledger: no failed patch, test knobs off",
    "The engine-patch ledger: no failed patch, no test knob on.",
    order=20,
    certify=_applies,
)
