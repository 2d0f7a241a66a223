"""What every check returns: a frozen report with the verdict the exit code follows.

Its ``to_dict()`` is the ``--json`` document (schema ``opsctl.<name>/<int>``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

PASS, FAIL, UNVERIFIED = "pass", "fail", "unverified"
# the comparison could not tell a right result from a wrong one (its sensitivity is not clearly
# above its noise floor): never a pass (exit 1), a verdict of its own in JSON, JUnit and SARIF
INCONCLUSIVE = "inconclusive"
NOT_JUDGED = (UNVERIFIED, INCONCLUSIVE)  # a part that was not judged is never counted as passed


@dataclass(frozen=True)
class Report:
    """A check's result: its verdict and its JSON document.

    ``document`` is the JSON document (read-only view); ``verdict`` is pass | fail | unverified
    (exit 0, 1, 0 with a warning)."""

    verdict: str
    document: Mapping[str, Any]

    def __post_init__(self) -> None:
        # a private deep copy behind a read-only view: the report cannot change later
        frozen = MappingProxyType(copy.deepcopy(dict(self.document)))
        object.__setattr__(self, "document", frozen)

    @property
    def schema(self) -> str:
        """The document's schema, ``opsctl.<name>/<int>``."""
        return str(self.document["schema"])

    @property
    def passed(self) -> bool:
        """True unless the verdict is fail or inconclusive (unverified: each check's rule)."""
        return self.verdict not in (FAIL, INCONCLUSIVE)

    def to_dict(self) -> dict[str, Any]:
        """A deep copy: what a caller does to it never changes the report."""
        return copy.deepcopy(dict(self.document))


class ReasonedReport(Report):
    """A report whose document lists the ``reasons`` for its verdict and its ``warnings``."""

    @property
    def reasons(self) -> list[str]:
        """The reasons the document gives for its verdict."""
        return list(self.document["reasons"])

    @property
    def warnings(self) -> list[str]:
        """Report-level warnings (e.g. the test-knob warning)."""
        return list(self.document["warnings"])


class KnobReport(Report):
    """A report whose document lists the ``test_knobs`` of the engine it ran on."""

    @property
    def knob_warning(self) -> str | None:
        """The warning for the test knobs the engine ran with (None without any)."""
        from opsctl.domain.knobs import warning

        return warning(self.document["test_knobs"])
