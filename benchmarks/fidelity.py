"""Fidelity of every check (issue 45 item 3): each check's planted fault and its control over
N seeds, and the confusion matrix of its verdicts.

A check is worth its false-fail and false-pass rate. For every case (a check, a variant, and
the verdict a right check gives: ``pass`` for the control, ``fail`` for the planted fault)
the benchmark runs the check over ``--seeds`` on real engines (one engine start per case
where the check can sweep seeds on one engine) and counts:

  right pass     expected pass, said pass
  false fail     expected pass, said fail
  right fail     expected fail, said fail
  false pass     expected fail, said pass
  inconclusive   said inconclusive (or unverified): not judged, never a pass

The cases live beside the checks they exercise: ``benchmarks/fidelity_kv_fail.py`` (kv-fail:
tiny-llama and tiny-hybrid, patched and ``--no-patch``, both routes) and
``benchmarks/fidelity_checks.py`` (invariance with and without the nudge knob, usage honest
and inflated, mm-uuid kept and rewritten, lora right and swapped). Each exposes ``CASES``, a
list of :class:`Case`.

    python benchmarks/fidelity.py [--seeds 0-9] [--checks kv-fail,invariance,...] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opsctl.domain.seeds import parse_seeds

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CASE_MODULES = ("benchmarks.fidelity_kv_fail", "benchmarks.fidelity_checks")
COLUMNS = ("right pass", "false fail", "right fail", "false pass", "inconclusive")
NOT_JUDGED = ("inconclusive", "unverified")


@dataclass(frozen=True)
class Case:
    """One check and variant, the verdict a right check gives, and how to run it.

    ``run(seeds)`` returns one verdict per seed (pass | fail | inconclusive | unverified), in
    the order of ``seeds``; it starts what it needs and stops it before returning."""

    check: str
    variant: str
    expect: str  # "pass" (the control) or "fail" (the planted fault)
    run: Callable[[Sequence[int]], list[str]] = field(compare=False)


def cell(expect: str, said: str) -> str:
    """The confusion-matrix column of one verdict."""
    if said in NOT_JUDGED:
        return "inconclusive"
    if expect == "pass":
        return "right pass" if said == "pass" else "false fail"
    return "right fail" if said == "fail" else "false pass"


def matrix(expect: str, verdicts: Sequence[str]) -> dict[str, int]:
    """How many of ``verdicts`` fall in each column."""
    out = dict.fromkeys(COLUMNS, 0)
    for v in verdicts:
        out[cell(expect, v)] += 1
    return out


def load_cases(checks: set[str] | None) -> list[Case]:
    cases: list[Case] = []
    for name in CASE_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        cases += [c for c in module.CASES if checks is None or c.check in checks]
    return cases


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--seeds", default="0-9", help="seeds: N-M or a comma-separated list")
    p.add_argument("--checks", default="", help="only these checks (comma-separated)")
    p.add_argument("--json", default="", help="also write the rows to this file")
    a = p.parse_args()
    try:
        seeds = parse_seeds(a.seeds)
    except ValueError as exc:
        raise SystemExit(f"--seeds: {exc}") from None
    cases = load_cases(set(a.checks.split(",")) if a.checks else None)
    if not cases:
        raise SystemExit("no fidelity case matches --checks")
    rows = []
    for case in cases:
        t0 = time.monotonic()
        verdicts = case.run(seeds)
        assert len(verdicts) == len(seeds), (case, verdicts)
        m = matrix(case.expect, verdicts)
        rows.append({"check": case.check, "variant": case.variant, "expect": case.expect,
                     "seeds": seeds, "verdicts": verdicts, **m,
                     "seconds": round(time.monotonic() - t0, 1)})  # fmt: skip
        print(f"{case.check} {case.variant}: {m} ({rows[-1]['seconds']} s)", file=sys.stderr)
    head = f"{'check':<12} {'variant':<28} {'expect':<6} " + " ".join(f"{c:>12}" for c in COLUMNS)
    print(head)
    for r in rows:
        cells = " ".join(f"{r[c]:>12}" for c in COLUMNS)
        print(f"{r['check']:<12} {r['variant']:<28} {r['expect']:<6} {cells}")
    wrong = sum(r["false fail"] + r["false pass"] for r in rows)
    unsure = sum(r["inconclusive"] for r in rows)
    print(f"{len(rows)} cases x {len(seeds)} seeds: {wrong} wrong verdicts, {unsure} inconclusive")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
