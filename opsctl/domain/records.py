"""Report records as JSON-ready dicts: the one ``to_dict`` of the domain's dataclasses.

A report's record is a frozen dataclass whose document keys follow its fields in
declaration order; :func:`record` writes that dict once for all of them, so a record's
``to_dict`` only names what differs (a renamed key, a computed one appended).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any


def plain(value: Any, tuples: bool = False) -> Any:
    """``value`` as a report holds it.

    A record (it has ``to_dict``) as its dict, a tuple as a list of such values (kept a
    tuple when ``tuples``), anything else as it is.
    """
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple) and not tuples:
        return [plain(v) for v in value]
    return value


def record(
    obj: Any, names: Mapping[str, str] | None = None, tuples: bool = False
) -> dict[str, Any]:
    """The dataclass ``obj``'s fields, in declaration order, as a report's dict.

    ``names``: field -> key for the fields the report names otherwise; values as
    :func:`plain` gives them (nested records as dicts, tuples as lists unless ``tuples``).
    """
    names = names or {}
    return {names.get(f.name, f.name): plain(getattr(obj, f.name), tuples) for f in fields(obj)}
