"""`diag mm-uuid`: do explicit multimodal UUIDs reach the engine core unchanged (vLLM PR 56432)?

Pure: no I/O; the replies and the probe's records are collected by
opsctl.collectors.mm_uuid and come in as :class:`ChatReply` / :class:`EngineRecord`.

With prefix caching off and ``mm_processor_cache_gb=0`` vLLM used to skip content
hashing and give *every* item a request-local id ``<renderer>-mm-<n>-<modality>-<i>``,
explicit client UUIDs included; an encoder/consumer pair (EPD) then disagreed on the
identifier. Now explicit UUIDs are kept and only missing ones get request-local ids.
With caches on, missing ones get content hashes (same image -> same identifier).

A case is a list of items. The items of a case are sent together, ``images_per_request``
at a time, and every item the probe records for a request is matched to the item sent
at the same position (a request-local id must end in ``-image-<position>``).

Models: tiny-vlm-multi (Idefics3, the default) takes several images per prompt, so each
case is ONE request and the mixed case exercises an explicit UUID kept at index 0 next to
a request-local ``-image-1`` at index 1 in the same request. tiny-vlm (BLIP-2) takes
exactly one image per prompt (``get_supported_mm_limits() == {"image": 1}``;
``--limit-mm-per-prompt`` cannot raise it), so with it the mixed case is sent as separate
one-image requests and request-local ids are only ever ``-image-0``; the report then says
so (finding ``mm_uuid.one_image_per_request``, severity info, emitted whenever no request
carried more than one image).

An item's ``uuid`` is either a string (explicit; the empty string counts: vLLM tests
``is not None``), ``None`` (sent as JSON null) or :data:`ABSENT` (no ``uuid`` field).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsctl.domain.findings import FAIL, INFO, OK, WARNING, Finding
from opsctl.domain.records import record
from opsctl.errors import BadInput

ABSENT = "<absent>"
CACHES_OFF, CACHES_ON = "caches-off", "caches-on"
MODES = (CACHES_OFF, CACHES_ON)
DEFAULT_MODEL = "tiny-vlm-multi"  # several images per prompt: the mixed case in ONE request
REQUEST_LOCAL = re.compile(r"^.+-(?P<modality>[a-z_]+)-(?P<index>\d+)$")
CONTENT_HASH = re.compile(r"^[0-9a-f]{32,128}$")
COLORS = {
    "red": (220, 30, 30),
    "green": (30, 200, 60),
    "blue": (40, 60, 230),
    "white": (250, 250, 250),
}


@dataclass(frozen=True, slots=True)
class Item:
    """One image of a case: its colour and the UUID sent with it (None: null; ABSENT: no field)."""

    color: str
    uuid: str | None  # ABSENT: no field

    @property
    def explicit(self) -> bool:
        """True when the item carries a UUID value (neither absent nor null)."""
        return self.uuid is not None and self.uuid != ABSENT

    @property
    def sent_as(self) -> str:
        """The UUID as sent, for a human line: ``(no uuid field)``, ``null`` or its repr."""
        if self.uuid == ABSENT:
            return "(no uuid field)"
        if self.uuid is None:
            return "null"
        return repr(self.uuid)


@dataclass(frozen=True, slots=True)
class Case:
    """A named list of items sent together."""

    name: str
    items: tuple[Item, ...]


def default_cases(prefix: str = "opsctl") -> tuple[Case, ...]:
    """The cases the check sends: all explicit, some None, empty string, no UUIDs."""
    return (
        Case("all explicit", (Item("red", f"{prefix}-all-0"), Item("green", f"{prefix}-all-1"))),
        Case("some explicit, some None", (Item("red", f"{prefix}-some-0"), Item("green", None))),
        Case("empty string", (Item("blue", ""),)),
        Case("no UUIDs", (Item("red", ABSENT), Item("green", ABSENT))),
    )


def reuse_case(prefix: str = "opsctl") -> Case:
    """The same UUID for two different images, then the second image without a UUID."""
    u = f"{prefix}-reused"
    return Case(
        "UUID reused for a different image", (Item("red", u), Item("blue", u), Item("blue", ABSENT))
    )


def classify(identifier: str | None) -> str:
    """The kind of an engine identifier: missing, content hash, request-local or other."""
    if identifier is None:
        return "missing"
    if CONTENT_HASH.match(identifier):
        return "content hash"
    if REQUEST_LOCAL.match(identifier):
        return "request-local"
    return "other"


@dataclass(frozen=True, slots=True)
class Observation:
    """One item of one request in one mode: what was sent and what the engine core saw."""

    mode: str
    case: str
    index: int
    color: str
    sent: str  # Item.sent_as
    explicit_uuid: str | None  # the explicit value, None when not explicit
    identifier: str | None  # what the engine core received (None: no probe record)
    status: int  # HTTP status of the request
    output: str | None = None
    request_id: str | None = None
    position: int = 0  # the item's position inside its request
    sent_items: int = 1  # items sent in that request
    engine_items: int | None = None  # items the probe recorded for it (None: no record)
    note: str = ""  # why identifier is None, e.g. "no engine record for request X"

    @property
    def kind(self) -> str:
        """``kept`` when the explicit UUID arrived unchanged, else :func:`classify`'s kind."""
        if self.explicit_uuid is not None and self.identifier == self.explicit_uuid:
            return "kept"
        return classify(self.identifier)

    def to_dict(self) -> dict[str, Any]:
        """The observation as the report holds it, its identifier's ``kind`` appended."""
        return record(self) | {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """The engine-core probe's record of one request."""

    request_id: str | None  # the engine's id (starts with the HTTP response id)
    identifiers: tuple[str | None, ...]  # each recorded item's identifier, by position
    error: str | None = None  # the probe failed on this request


@dataclass(frozen=True, slots=True)
class ChatReply:
    """One chat request's answer and the probe's record of it (None: none arrived)."""

    status: int
    output: str | None = None
    response_id: str | None = None
    record: EngineRecord | None = None
    error_text: str = ""  # the start of a non-200 answer's body


def batches(items: Sequence[Item], per_request: int) -> list[list[tuple[int, Item]]]:
    """[(index, item)] groups of at most ``per_request`` items, in order."""
    indexed = list(enumerate(items))
    return [indexed[i : i + per_request] for i in range(0, len(indexed), per_request)]


def observe(
    mode: str, case: str, indexed: Sequence[tuple[int, Item]], reply: ChatReply
) -> list[Observation]:
    """One Observation per item sent in ONE request, matched to the probe's records by position.

    Never matched to "any new record".
    """
    record = reply.record
    recorded = record.identifiers if record is not None else ()
    note = ""
    if reply.status == 200 and record is None:
        note = f"no engine record for request {reply.response_id}"
    elif record is not None and record.error is not None:
        note = f"the probe failed on request {reply.response_id}: {record.error}"
    out = []
    for pos, (index, item) in enumerate(indexed):
        have = pos < len(recorded)
        out.append(
            Observation(
                mode,
                case,
                index,
                item.color,
                item.sent_as,
                item.uuid if item.explicit else None,
                recorded[pos] if have else None,
                reply.status,
                reply.output,
                record.request_id if record is not None else None,
                position=pos,
                sent_items=len(indexed),
                engine_items=len(recorded) if record is not None else None,
                note=note or ("" if have else f"the engine record has no item #{pos}"),
            )
        )
    return out


def image_refusal(reply: ChatReply, first: bool, url: str, model_hint: str) -> BadInput | None:
    """The very first image request answered 400: the server's model takes no images."""
    if reply.status != 400 or not first:
        return None
    return BadInput(
        f"the model at {url} rejected an image request: {reply.error_text}",
        hint=f"diag mm-uuid needs a vision-language model, e.g. --model {model_hint}",
    )


def probe_state(entries: Sequence[tuple[str, str]]) -> tuple[bool, str]:
    """(applied, why) of the mm_uuid probe from its engine-core ledger entries; newest counts.

    The entries come as (status, detail) pairs, oldest first.
    """
    if not entries:
        return False, "no engine-core ledger entry for mm_uuid_probe"
    status, detail = entries[-1]
    return status == "applied", f"{status}: {detail}"


def engine_mode(info: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(mode, settings) from the engine's own engine_info event (caches-off or caches-on).

    caches-off is prefix caching off AND no multimodal processor cache; unknown without
    the event.
    """
    if info is None:
        return "unknown", {}
    off = info.get("enable_prefix_caching") is False and info.get("mm_processor_cache_gb") in (
        0,
        0.0,
    )
    return (CACHES_OFF if off else CACHES_ON), {
        "enable_prefix_caching": info.get("enable_prefix_caching"),
        "mm_processor_cache_gb": info.get("mm_processor_cache_gb"),
    }


def summary(observations: Sequence[Observation]) -> str:
    """The one-line result under the live panel's verdict."""
    good = sum(judge_item(o)[0] == "pass" for o in observations)
    return f"{good}/{len(observations)} items as expected"


def judge_item(o: Observation) -> tuple[str, str]:
    """(verdict, why) for one item.

    Explicit UUIDs must arrive unchanged; missing ones must get a request-local id (caches off)
    or a content hash (caches on).
    """
    if o.status != 200:
        return "fail", f"request failed with HTTP {o.status}"
    if o.engine_items is not None and o.engine_items != o.sent_items:
        return "fail", (
            f"the engine core saw {o.engine_items} item(s) for a request of {o.sent_items}"
        )
    if o.identifier is None:
        return "fail", o.note or "the engine-core probe recorded nothing for this item"
    if o.explicit_uuid is not None:
        if o.identifier == o.explicit_uuid:
            return "pass", "explicit UUID kept"
        return "fail", f"explicit UUID {o.explicit_uuid!r} rewritten to {o.identifier!r}"
    want = "request-local" if o.mode == CACHES_OFF else "content hash"
    got = classify(o.identifier)
    if got == want == "request-local":
        m = REQUEST_LOCAL.match(o.identifier)
        if m is not None and (
            m.group("modality") != "image" or int(m.group("index")) != o.position
        ):
            return "fail", (
                f"missing UUID -> request-local id {o.identifier!r}, expected one ending in "
                f"'-image-{o.position}' (the item's position in its request)"
            )
    if got == want:
        return "pass", f"missing UUID -> {want} id"
    return "fail", f"missing UUID -> {got} id {o.identifier!r}, expected a {want} id"


def findings(
    observations: list[Observation], reuse: list[Observation] | None = None
) -> list[Finding]:
    """The check's findings: rewritten or unexpected identifiers, collisions, and reuse."""
    out: list[Finding] = []
    for o in observations:
        v, why = judge_item(o)
        if v == "fail":
            code = "mm_uuid.rewritten" if "rewritten" in why else "mm_uuid.unexpected"
            out.append(Finding(FAIL, code, f"[{o.mode}] {o.case} #{o.index}: {why}", o.to_dict()))
    # missing UUIDs in one mode must not collide across different requests (caches off)
    local = [
        o for o in observations if o.mode == CACHES_OFF and o.explicit_uuid is None and o.identifier
    ]
    ids = [o.identifier for o in local]
    if len(ids) != len(set(ids)):
        out.append(
            Finding(
                FAIL, "mm_uuid.collision", "request-local ids repeat across requests", {"ids": ids}
            )
        )
    by_mode: dict[str, list[Observation]] = {}
    for o in observations:
        by_mode.setdefault(o.mode, []).append(o)
    for mode, obs in by_mode.items():
        if all(judge_item(o)[0] == "pass" for o in obs):
            kept = sum(1 for o in obs if o.kind == "kept")
            out.append(
                Finding(
                    OK,
                    "mm_uuid.kept",
                    f"[{mode}] {kept} explicit UUID(s) kept, "
                    f"{len(obs) - kept} missing one(s) got {'request-local ids' if mode == CACHES_OFF else 'content hashes'}",
                    {},
                )
            )
    empty = [o for o in observations if o.explicit_uuid == "" and o.identifier == ""]
    if empty:
        out.append(
            Finding(
                WARNING,
                "mm_uuid.empty_string",
                "an empty-string UUID is kept as the identifier '' (every item sent with '' "
                "shares one identifier)",
                {"modes": sorted({o.mode for o in empty})},
            )
        )
    hashes = [o for o in observations if o.mode == CACHES_ON and o.kind == "content hash"]
    same_color: dict[str, set[str]] = {}
    for o in hashes:
        same_color.setdefault(o.color, set()).add(str(o.identifier))
    if hashes:
        stable = all(len(v) == 1 for v in same_color.values())
        out.append(
            Finding(
                INFO,
                "mm_uuid.content_hash",
                f"[caches-on] missing UUIDs got content hashes; same image -> same hash: {stable}",
                {"by_image": {k: sorted(v) for k, v in same_color.items()}},
            )
        )
    out.extend(reuse_findings(reuse or []))
    if observations and max(o.sent_items for o in observations) <= 1:
        out.append(one_image_finding())
    return out


def one_image_finding() -> Finding:
    """The note that a one-image model gets the mixed case as separate requests."""
    return Finding(
        INFO,
        "mm_uuid.one_image_per_request",
        "model accepts 1 image per prompt: mixed case sent as separate requests (explicit "
        "and missing UUIDs inside ONE request, and request-local indexes above 0, are not "
        "exercised)",
        {},
    )


def reuse_findings(reuse: list[Observation]) -> list[Finding]:
    """UUID reused for a different image: vLLM accepts it silently (a warning, not a fail)."""
    out: list[Finding] = []
    by_mode: dict[str, list[Observation]] = {}
    for o in reuse:
        by_mode.setdefault(o.mode, []).append(o)
    for mode, obs in by_mode.items():
        if len(obs) < 3:
            continue
        first, second, fresh = obs[0], obs[1], obs[2]
        if second.status != 200:
            out.append(
                Finding(
                    INFO,
                    "mm_uuid.reuse_rejected",
                    f"[{mode}] reusing UUID {first.explicit_uuid!r} for a different image was rejected "
                    f"(HTTP {second.status})",
                    {},
                )
            )
            continue
        same_id = first.identifier == second.identifier
        detail = {"first": first.to_dict(), "second": second.to_dict(), "fresh": fresh.to_dict()}
        evidence = ""
        if first.output is not None and second.output is not None and fresh.output is not None:
            if second.output == first.output and second.output != fresh.output:
                evidence = (
                    "; the second image's output equals the FIRST image's output, not the output "
                    "the same image gives without a UUID (stale embeddings served)"
                )
            elif second.output == fresh.output and first.output != fresh.output:
                evidence = "; the second image's output matches that image without a UUID (no stale reuse seen)"
            else:
                evidence = "; outputs cannot tell whether stale embeddings were used"
        out.append(
            Finding(
                WARNING,
                "mm_uuid.reuse_accepted",
                f"[{mode}] UUID {first.explicit_uuid!r} reused for a different image was accepted "
                f"silently (HTTP 200, identifier {'identical' if same_id else 'different'}){evidence}",
                detail,
            )
        )
    return out
