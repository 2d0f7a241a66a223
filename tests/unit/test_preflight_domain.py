"""The preflight's pure part (opsctl.domain.preflight): symbols found in source text by
ast (no import), hashed on normalised text, compared with the verified release, and
the verdict per patch."""

from __future__ import annotations

import pytest

from opsctl.domain import preflight as D

OLD = """
import x


class Engine:
    def add(self, r):
        return r

    def stop(self):
        pass


def helper():
    return 1
"""

NEW = """
import x
import y


class Engine:
    def add(self, r):
        return r

    def stop(self):
        self.closed = True

    def pause(self):
        pass


def helper():
    return 1
"""


def test_extract_finds_methods_and_functions_and_normalises():
    assert D.extract(OLD, "Engine.add") == "def add(self, r):\n    return r\n"
    assert D.extract(OLD, "helper") == "def helper():\n    return 1\n"
    assert D.extract(OLD, "Engine.missing") is None
    assert D.extract(OLD, "Nope.add") is None
    assert D.extract(None, "Engine.add") is None
    assert D.extract("def (:", "f") is None  # does not parse: absent, never a crash


def test_digest_ignores_indentation_and_trailing_blanks_only():
    assert D.digest(D.extract(OLD, "Engine.add")) == D.digest(D.extract(NEW, "Engine.add"))
    assert D.digest("def f():\n    pass   \n\n") == D.digest("    def f():\n        pass\n")
    assert D.digest(D.extract(OLD, "Engine.stop")) != D.digest(D.extract(NEW, "Engine.stop"))


def test_last_definition_wins_as_at_import_time():
    src = "def f():\n    return 1\n\n\ndef f():\n    return 2\n"
    assert "return 2" in D.extract(src, "f")


def test_changed_members_around_a_target():
    old, new = D.members(OLD, "Engine"), D.members(NEW, "Engine")
    assert D.changed_members(old, new) == ["stop (changed)", "pause (new)"]
    assert D.changed_members(new, old) == ["stop (changed)", "pause (gone)"]
    assert D.members(OLD, "") == {
        "Engine": D.members(OLD, "")["Engine"],
        "helper": D.digest(D.extract(OLD, "helper")),
    }
    assert D.members(OLD, "Missing") is None and D.changed_members(None, new) == []


def test_scope_of_and_split():
    assert D.scope_of("vllm.a:C.f") == "vllm.a:C"
    assert D.scope_of("vllm.a:f") == "vllm.a:"
    assert D.module_paths("vllm.a.b") == ("vllm/a/b.py", "vllm/a/b/__init__.py")


def test_diff_excerpt_is_trimmed():
    old = "\n".join(f"line {i}" for i in range(100))
    new = "\n".join(f"LINE {i}" for i in range(100))
    d = D.diff(old, new, limit=10)
    assert (d.added, d.removed) == (100, 100)
    assert len(d.excerpt) == 11 and d.excerpt[-1].startswith("... ")


def _finding(symbol, text, recorded, verified_text=None):
    return D.symbol_finding(symbol, text, recorded, verified_text)


def test_symbol_finding_states():
    add = D.extract(OLD, "Engine.add")
    stop_old, stop_new = D.extract(OLD, "Engine.stop"), D.extract(NEW, "Engine.stop")
    rec = {
        "m:Engine.add": D.digest(add),
        "m:Engine.stop": D.digest(stop_old),
        "m:Engine.pause": None,
    }
    assert _finding("m:Engine.add", add, rec).unchanged is True
    changed = _finding("m:Engine.stop", stop_new, rec, stop_old)
    assert changed.unchanged is False and changed.diff is not None and changed.diff.added == 1
    assert _finding("m:Engine.stop", stop_new, rec).diff is None  # no verified text at hand
    gone = _finding("m:Engine.stop", None, rec)
    assert gone.exists is False and gone.unchanged is False
    new = _finding("m:Engine.pause", D.extract(NEW, "Engine.pause"), rec)
    assert new.unchanged is False and new.verified_exists is False
    assert _finding("m:Engine.pause", None, rec).unchanged is True  # absent on both
    assert _finding("m:Engine.add", add, None).unchanged is None  # nothing recorded
    assert _finding("m:other", add, rec).unchanged is None


def _patch(targets, watched=(), upstream=None, why=None):
    return D.PatchFinding("p", "patch", ("0.32.0",), tuple(targets), tuple(watched), upstream, why)


@pytest.mark.parametrize(
    ("targets", "watched", "upstream", "verdict"),
    [
        ([True], [], None, D.UNCHANGED),
        ([True], [False], None, D.REVIEW),
        ([False], [], None, D.CHANGED),
        ([False], [], True, D.UPSTREAM),
        ([None], [], None, D.UNKNOWN),
        (["gone"], [], True, D.MISSING),
    ],
)
def test_patch_verdict(targets, watched, upstream, verdict):
    def sf(state):
        if state == "gone":
            return D.SymbolFinding("m:f", False, None, "a", True)
        if state is None:
            return D.SymbolFinding("m:f", True, "a", None, None)
        return D.SymbolFinding("m:f", True, "a", "a" if state else "b", True)

    finding = _patch([sf(t) for t in targets], [sf(w) for w in watched], upstream, "why")
    assert finding.verdict == verdict
    doc = finding.to_dict()
    assert doc["verdict"] == verdict and doc["exists"] == (targets != ["gone"])


def test_a_declared_attribute_a_release_lost_asks_for_review():
    request_033 = (
        "class Request:\n    def __init__(self):\n        self.skip_reading_prefix_cache = False\n"
    )
    request_034 = "class Request:\n    prefix_cache_hit_limit: int | None = None\n"
    one = "vllm.v1.request:Request.skip_reading_prefix_cache"
    either = one + "|prefix_cache_hit_limit"
    assert D.attribute_finding(one, request_033).found == "skip_reading_prefix_cache"
    lost = D.attribute_finding(one, request_034)
    assert lost.found is None and lost.class_exists
    assert D.attribute_finding(either, request_034).found == "prefix_cache_hit_limit"
    assert D.attribute_finding(either, None).class_exists is False
    base = dict(name="p", kind="patch", verified_on=("0.32.0",), targets=(), watched=())
    kept = D.PatchFinding(
        **base,
        upstream=False,
        upstream_why="x",
        attributes=(D.attribute_finding(either, request_034),),
    )
    gone = D.PatchFinding(**base, upstream=False, upstream_why="x", attributes=(lost,))
    assert kept.verdict == D.UNCHANGED and kept.lost_attributes == []
    assert gone.verdict == D.REVIEW and gone.lost_attributes == [one]
    assert gone.to_dict()["attributes"] == [{"attribute": one, "found": None, "class_exists": True}]
