"""opsctl.domain.seeds: what an operator types for a sweep, parsed or refused."""

from __future__ import annotations

import pytest

from opsctl.domain.seeds import parse_seeds


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("0-9", list(range(10))), ("1,3,5", [1, 3, 5]), ("0-2,9", [0, 1, 2, 9]), ("7", [7])],
)
def test_sweeps(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("-4", "not a seed"),
        ("4-2", "ends before it starts"),
        ("1.5", "not a seed"),
        ("1,,2", "not a seed"),
        ("0-x", "not a seed"),
        ("1,1", "named twice"),
        ("0-5000", "more than"),
    ],
)
def test_what_is_not_a_seed_list_is_refused_with_the_reason(text, why):
    with pytest.raises(ValueError, match=why):
        parse_seeds(text)
