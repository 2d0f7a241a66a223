"""Upgrade preflight, the pure part: source text of a vLLM release in, findings out.

A *symbol* is ``"module:Qualified.name"`` (``"vllm.v1.engine.core:EngineCore.add_request"``).
:func:`extract` finds its definition in a module's source with :mod:`ast` (no import)
and :func:`digest` hashes its normalised text (the text ``ast.get_source_segment(padded=True)`` gives, dedented, trailing
blanks dropped), so
two releases compare by text without either being installed. The *scope* of a symbol
is what encloses it (its class, or the module for a top-level function); the members
of a scope that changed between the verified release and the target release are what
"changed around" a patch's target.

No I/O here: :mod:`opsctl.collectors.vllm_sources` reads the sources,
:mod:`opsctl.checks.preflight` runs the patches' own upstream rules and builds the
report from these findings.
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import re
import textwrap
from dataclasses import dataclass, field

from opsctl.domain.records import record

DIGEST_CHARS = 16
EXCERPT_LINES = 24
MAX_AROUND = 12

# verdicts, worst first
MISSING = "missing"  # a target is gone: the patch would be skipped, the probe sees nothing
CHANGED = "changed"  # a target's code differs from the verified release: review it
UPSTREAM = "upstream"  # the patch's own rule finds the fix upstream: it stands down
REVIEW = "review"  # targets unchanged, code it relies on (watched) changed
UNCHANGED = "unchanged"  # targets and watched code identical to the verified release
UNKNOWN = "unknown"  # no recorded hashes to compare with
VERDICTS = (MISSING, CHANGED, UPSTREAM, REVIEW, UNCHANGED, UNKNOWN)


def split(symbol: str) -> tuple[str, str]:
    """``(module, qualname)`` of a ``module:qualname`` symbol."""
    module, _, qualname = symbol.partition(":")
    return module, qualname


def module_paths(module: str) -> tuple[str, str]:
    """Where a module's source lies in a wheel or site-packages (file, package)."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def scope_of(symbol: str) -> str:
    """``m:C.f`` -> ``m:C``; ``m:f`` -> ``m:`` (the module)."""
    module, qualname = split(symbol)
    return f"{module}:{qualname.rpartition('.')[0]}"


def _find(tree: ast.AST, qualname: str) -> ast.AST | None:
    node: ast.AST | None = tree
    for part in qualname.split(".") if qualname else ():
        body = getattr(node, "body", None) or []
        node = next(
            (
                n
                for n in reversed(body)  # the last definition wins, as at import time
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.name == part
            ),
            None,
        )
        if node is None:
            return None
    return node


@functools.lru_cache(maxsize=64)
def _parsed(source: str) -> tuple[ast.Module, tuple[bytes, ...]] | None:
    """A module's tree and its lines as UTF-8 (ast offsets count bytes), parsed once."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return tree, tuple(line.encode() for line in source.splitlines(keepends=True))


def _segment(lines: tuple[bytes, ...], node: ast.AST) -> str:
    """``ast.get_source_segment(source, node, padded=True)`` on pre-split lines (the
    standard one splits the whole module again on every call)."""
    first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined,operator]
    col, end_col = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
    if first == last:
        return " " * col + lines[first][col:end_col].decode()
    body = [lines[first][col:].decode()]
    body += [ln.decode() for ln in lines[first + 1 : last]]
    body.append(lines[last][:end_col].decode())
    return " " * col + "".join(body)


def normalise(text: str) -> str:
    """Source text dedented, trailing spaces and blank lines dropped, one final newline."""
    lines = [line.rstrip() for line in textwrap.dedent(text).splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n"


def extract(source: str | None, qualname: str) -> str | None:
    """The normalised source of ``qualname`` in a module's ``source``, or None.

    None if absent, or the module is missing or does not parse.
    """
    parsed = _parsed(source) if source is not None else None
    if parsed is None:
        return None
    tree, lines = parsed
    node = _find(tree, qualname)
    if node is None or node is tree:
        return None
    return normalise(_segment(lines, node))


def digest(text: str | None) -> str | None:
    """The short sha256 of the normalised text (None when there is no text)."""
    if text is None:
        return None
    return hashlib.sha256(normalise(text).encode()).hexdigest()[:DIGEST_CHARS]


def members(source: str | None, scope_qualname: str) -> dict[str, str] | None:
    """``{name: digest}`` of the functions and classes directly in a scope, or None.

    The scope is a class, or the module when ``scope_qualname`` is empty; None when the scope is
    absent.
    """
    parsed = _parsed(source) if source is not None else None
    if parsed is None:
        return None
    tree, lines = parsed
    node = _find(tree, scope_qualname)
    if node is None:
        return None
    out: dict[str, str] = {}
    for child in getattr(node, "body", []):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[child.name] = digest(_segment(lines, child)) or ""
    return out


@dataclass(frozen=True, slots=True)
class Diff:
    """What changed between the verified and the target text: counts and a trimmed excerpt."""

    added: int
    removed: int
    excerpt: tuple[str, ...]  # the first changed lines of a unified diff, trimmed

    def to_dict(self) -> dict:
        """The diff as the report holds it (counts as ``*_lines``)."""
        return record(self, {"added": "added_lines", "removed": "removed_lines"})


def diff(old: str, new: str, limit: int = EXCERPT_LINES) -> Diff:
    """The :class:`Diff` from ``old`` (verified) to ``new`` (target), excerpt cut at ``limit``."""
    lines = list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), "verified", "target", n=1, lineterm=""
        )
    )
    body = [ln for ln in lines[2:]]
    added = sum(1 for ln in body if ln.startswith("+"))
    removed = sum(1 for ln in body if ln.startswith("-"))
    excerpt = body[:limit] + (
        [f"... {len(body) - limit} more diff lines"] if len(body) > limit else []
    )
    return Diff(added, removed, tuple(excerpt))


@dataclass(frozen=True, slots=True)
class SymbolFinding:
    """One patched or watched symbol of the target release against the verified release."""

    symbol: str
    exists: bool
    digest: str | None
    verified_digest: str | None
    verified_exists: bool | None  # None: nothing recorded for the verified release
    diff: Diff | None = None  # only when the verified text was at hand

    @property
    def unchanged(self) -> bool | None:
        """Same code as on the verified release; None when nothing was recorded.

        Absent on both counts as unchanged.
        """
        if self.verified_exists is None:
            return None
        if self.exists != self.verified_exists:
            return False
        return not self.exists or self.digest == self.verified_digest

    def to_dict(self) -> dict:
        """The symbol's finding as the report holds it (digests as ``*sha256_16``)."""
        return {
            "symbol": self.symbol,
            "exists": self.exists,
            "unchanged": self.unchanged,
            "sha256_16": self.digest,
            "verified_sha256_16": self.verified_digest,
            "verified_exists": self.verified_exists,
            "diff": None if self.diff is None else self.diff.to_dict(),
        }


def symbol_finding(
    symbol: str,
    target_text: str | None,
    recorded: dict[str, str | None] | None,
    verified_text: str | None,
) -> SymbolFinding:
    """One symbol of the target release against the verified release's recorded digests.

    ``recorded``: ``{symbol: digest or None when absent}``; None: nothing recorded.
    """
    found = digest(target_text)
    known = recorded is not None and symbol in recorded
    verified = recorded.get(symbol) if known and recorded is not None else None
    change = None
    if target_text is not None and verified_text is not None and found != verified:
        change = diff(verified_text, target_text)
    exists_before = (verified is not None) if known else None
    return SymbolFinding(symbol, target_text is not None, found, verified, exists_before, change)


def changed_members(verified: dict[str, str] | None, target: dict[str, str] | None) -> list[str]:
    """``["name (changed)", "name (new)", "name (gone)"]`` between two scopes' members."""
    if verified is None or target is None:
        return []
    out = [f"{n} (changed)" for n in verified if n in target and target[n] != verified[n]]
    out += [f"{n} (new)" for n in target if n not in verified]
    out += [f"{n} (gone)" for n in verified if n not in target]
    return out


@dataclass(frozen=True, slots=True)
class AttributeFinding:
    """One declared attribute (``module:Class.a|b``) against a release.

    ``found``: which of the names its class's source still has (None: none of them, or no such
    class).
    """

    attribute: str
    found: str | None
    class_exists: bool

    def to_dict(self) -> dict:
        """The finding as the report holds it."""
        return record(self)


def attribute_finding(attribute: str, class_source: str | None) -> AttributeFinding:
    """Whether ``Class`` still has one of the declared attribute names.

    Read from its source: assignments to ``self.<name>``, class-level annotations,
    properties and methods.
    """
    names = split(attribute)[1].split(".", 1)[1].split("|")
    if class_source is None:
        return AttributeFinding(attribute, None, False)
    for name in names:
        pattern = rf"(self\.{name}\b|^\s*{name}\s*[:=]|def {name}\()"
        if re.search(pattern, class_source, re.M):
            return AttributeFinding(attribute, name, True)
    return AttributeFinding(attribute, None, True)


@dataclass(frozen=True, slots=True)
class PatchFinding:
    """One patch against a release: its targets, watched symbols, attributes and rule."""

    name: str
    kind: str
    verified_on: tuple[str, ...]
    targets: tuple[SymbolFinding, ...]
    watched: tuple[SymbolFinding, ...]
    upstream: bool | None  # the patch's own rule; None: no rule, or it cannot decide
    upstream_why: str | None
    around: dict[str, list[str]] = field(default_factory=dict)  # scope -> changed members
    # (target, symbol used instead): targets this release lacks whose alternative it has
    replaced: tuple[tuple[str, str], ...] = ()
    attributes: tuple[AttributeFinding, ...] = ()

    @property
    def lost_attributes(self) -> list[str]:
        """Declared attributes none of whose names this release's class has."""
        return [a.attribute for a in self.attributes if a.found is None]

    @property
    def exists(self) -> bool:
        """True when every target symbol exists in the release."""
        return all(t.exists for t in self.targets)

    @property
    def unchanged(self) -> bool | None:
        """False when a target changed, None when one cannot be compared, else True."""
        states = [t.unchanged for t in self.targets]
        if False in states:
            return False
        return None if None in states else True

    @property
    def verdict(self) -> str:
        """The patch's verdict: missing, upstream, changed, unknown, review or unchanged."""
        if not self.exists:
            return MISSING
        if self.upstream is True:
            return UPSTREAM
        if self.unchanged is False or self.replaced:  # another code path: changed
            return CHANGED
        if self.unchanged is None:
            return UNKNOWN
        if any(w.unchanged is False for w in self.watched) or self.lost_attributes:
            return REVIEW
        return UNCHANGED

    def to_dict(self) -> dict:
        """The patch's finding as the ``preflight`` report holds it."""
        return {
            "name": self.name,
            "kind": self.kind,
            "verified_on": list(self.verified_on),
            "verdict": self.verdict,
            "exists": self.exists,
            "unchanged": self.unchanged,
            "upstream": self.upstream,
            "upstream_why": self.upstream_why,
            "targets": [t.to_dict() for t in self.targets],
            "watched": [w.to_dict() for w in self.watched],
            "replaced": [{"target": t, "instead": i} for t, i in self.replaced],
            "attributes": [a.to_dict() for a in self.attributes],
            "changed_around": {k: v[:MAX_AROUND] for k, v in self.around.items() if v},
            "changed_around_count": sum(len(v) for v in self.around.values()),
        }
