"""FleetTable asks DataTable to re-measure a column only when its widest cell changes
(a changing figure of the same width costs no column measurement)."""

from __future__ import annotations

from opsctl.ui.panels.console import FleetTable


def test_a_column_is_re_measured_only_when_its_widest_cell_changes() -> None:
    t = FleetTable()
    assert t._width_changes("tps", "a", "12.5") is True  # first cell: 0 -> 4
    assert t._width_changes("tps", "b", "9.1") is False  # narrower than the widest
    assert t._width_changes("tps", "a", "13.0") is False  # same width: no re-measure
    assert t._width_changes("tps", "b", "1024.0") is True  # grows: 4 -> 6
    assert t._width_changes("tps", "b", "1.0") is True  # the widest shrank: 6 -> 4
    assert t._width_changes("gpu", "a", "GPU0 7% 130/140G") is True  # columns apart
    assert t._width_changes("tps", "a", "日本") is False  # 4 display cells, 2 characters
