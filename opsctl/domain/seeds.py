"""Seed lists for sweeps (``--seeds 0-9``, ``1,3,5``, ``0-4,9``): parsed once, for every check.

Pure. A sweep runs a check once per seed on one engine; the text an operator types is a
comma-separated list of plain non-negative integers and inclusive ranges ``N-M``. Anything
else (a negative number, ``4-2``, ``1.5``, an empty item, a repeat) is refused with the reason,
never read as something else.
"""

from __future__ import annotations

from opsctl.errors import BadInput

MAX_SEEDS = 1000  # a sweep longer than this is a typo, not a plan


def parse_seeds(text: str) -> list[int]:
    """The seeds ``text`` names, in its order; ValueError saying what is wrong."""
    seeds: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(
                f"{part!r} is not a seed: give N, N-M or a comma-separated list of them"
            )
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"{part!r}: the range ends before it starts")
        if len(seeds) + (last - first + 1) > MAX_SEEDS:
            raise ValueError(f"{text!r} names more than {MAX_SEEDS} seeds")
        seeds.extend(range(first, last + 1))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"seed {repeated[0]} is named twice in {text!r}")
    return seeds


def seeds_flag(text: str | None) -> tuple[int, ...]:
    """``--seeds``' value as a sweep's seeds; () without the flag.

    Bad input is BadInput (exit 2) naming the flag and what is wrong."""
    if text is None:
        return ()
    try:
        return tuple(parse_seeds(text))
    except ValueError as exc:
        raise BadInput(f"--seeds: {exc}") from None
