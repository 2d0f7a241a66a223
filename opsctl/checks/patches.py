"""`opsctl patches` as a library call: the engine-patch ledger of a run directory.

What every vLLM process of that run really applied, read through opsctl.collectors.ledger.

``run(Options) -> Report`` (schema ``patches/1``); a run directory, not a server, so no
target and no engine session. ``processes`` are the ledger records in rank order, each
with ``rank``: the process's role (``Worker_TP1``, ``EngineCore_DP1``, ``APIServer``; ""
when its title is unknown) beside ``role``, its kind (api_server, engine_core, worker). Verdict pass: the ledger is shown, not judged. A missing
run directory or ledger is BadInput.

Example::

    from opsctl.checks import patches
    report = patches.run(patches.Options())  # the newest run; run_dir=Path(...) for another
    for proc in report.to_dict()["processes"]: print(proc["pid"], proc["rank"], proc["role"])
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from opsctl.checks.report import PASS, Report


@dataclass(frozen=True, slots=True)
class Options:
    """Which run's ledger to read (default: the newest run with a ledger)."""

    run_dir: Path | None = None  # None: the newest run with a ledger
    runs_root: Path | None = None  # where to look for it (default: opsctl.paths.runs_dir())


def run(options: Options = Options()) -> Report:
    """The ledger of ``options.run_dir`` (else the newest run's) as a ``patches/1`` report."""
    from opsctl import paths
    from opsctl.collectors.ledger import latest_run, read_records, with_ranks
    from opsctl.errors import BadInput
    from opsctl.output import document

    run_dir = options.run_dir
    if run_dir is None:
        root = options.runs_root or paths.runs_dir()
        run_dir = latest_run(root)
        if run_dir is None:
            raise BadInput(
                f"no run directory with a ledger under {root}",
                hint="start an engine with `opsctl serve` or pass --run DIR",
            )
    if not run_dir.is_dir():
        raise BadInput(f"run directory {run_dir} does not exist")
    records = read_records(run_dir)
    if not records:
        raise BadInput(f"{run_dir} has no patch ledger (ledger/*.json)")
    # in rank order, each with its rank (Worker_TP1, EngineCore_DP1...; "" when unknown)
    return Report(PASS, document("patches", run_dir=str(run_dir), processes=with_ranks(records)))
