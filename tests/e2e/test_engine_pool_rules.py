"""The suite's own order and pool rules (tests/engine_pool.py), as pure logic: modules
without engines run first, engine modules after, those sharing a pooled engine back to
back; the real pool is exercised by the modules that use it (test_invariance_e2e.py and
test_invariance_modes_e2e.py share one engine: the second asserts it started none)."""

from __future__ import annotations

from tests.engine_pool import SPECS, EnginePool, run_order


def test_cheap_modules_first_in_collection_order() -> None:
    modules = [(True, None), (False, None), (True, None), (False, None)]
    assert run_order(modules) == [1, 3, 0, 2]


def test_pool_users_back_to_back_at_the_first_users_place() -> None:
    modules = [
        (True, "a"),  # 0
        (True, None),  # 1
        (False, None),  # 2
        (True, "b"),  # 3
        (True, "a"),  # 4
        (True, "b"),  # 5
    ]
    assert run_order(modules) == [2, 0, 4, 1, 3, 5]


def test_with_costs_the_longest_engine_units_first() -> None:
    modules = [(True, None), (True, "a"), (False, None), (True, None), (True, "a")]
    assert run_order(modules) == [2, 0, 1, 4, 3]
    costs = [5.0, 10.0, 99.0, 30.0, 25.0]  # pool a: 35 s in all, before the 30 s module
    assert run_order(modules, costs) == [2, 1, 4, 3, 0]


def test_every_named_spec_builds_and_nothing_starts_without_a_test() -> None:
    pool = EnginePool()
    keys = {name: pool.spec(name).engine_key() for name in SPECS}
    assert len(set(keys.values())) == len(keys)  # one name per engine
    assert pool.alive is None and pool.starts == [] and "no engine" in pool.summary()
    pool.release()  # nothing alive: a no-op


def test_the_invariance_engine_is_what_the_check_asks_for() -> None:
    """The pooled spec must keep the key the check derives from its caller's spec, or
    test_invariance_modes_e2e.py's calls would start an engine of their own."""
    from engine_patches import knobs
    from opsctl.checks.target import EngineSpec
    from opsctl.suite.invariance import run as invariance

    caller = EngineSpec(knobs=((knobs.NUDGE, "zebra:3"),))
    for options in (
        invariance.Options(mode="eager", max_tokens=4),
        invariance.Options(mode="eager", max_tokens=4, batch_size=4),
    ):
        derived = invariance.isolated_spec(caller, "eager", options)
        pooled = SPECS["invariance-nudge"]()
        assert derived.engine_key() == pooled.engine_key()
        assert derived.probes <= pooled.probes
