"""patches: the engine-patch ledger of the run certified (the check's declaration).

Its code: opsctl.checks.hygiene (``certify_patches``) over the ledger the engine plugin
writes (opsctl.collectors.ledger).
"""

from __future__ import annotations

from opsctl.domain.check_registry import Check, Parts, Subject

NO_RUN_DIR = (
    "no opsctl run directory for this server (not started by opsctl): its patch ledger "
    "cannot be read"
)


def _load() -> Parts:
    from opsctl.checks import hygiene

    return Parts.of(hygiene, certify=hygiene.certify_patches)


def _applies(s: Subject) -> str | None:
    return None if s.run_dir else NO_RUN_DIR


CHECK = Check(
    "patches",
    "patch ledger: no failed patch, test knobs off",
    "The engine-patch ledger: no failed patch, no test knob on.",
    order=20,
    load=_load,
    certify=_applies,
)
