"""FleetTable keeps a column's width unless a wider cell appears: only then does the
column grow and the window get repainted (a changing figure of the same or a smaller
width repaints its own row alone; tests/ui/test_fleet_table_updates.py)."""

from __future__ import annotations

from opsctl.ui.panels.console import FleetTable


def test_a_column_is_measured_again_only_when_a_wider_cell_appears() -> None:
    t = FleetTable()
    assert t._width_changes("tps", "12.5") is True  # first cell: 0 -> 4
    assert t._width_changes("tps", "9.1") is False  # narrower than the widest
    assert t._width_changes("tps", "13.0") is False  # same width: no re-measure
    assert t._width_changes("tps", "1024.0") is True  # grows: 4 -> 6
    assert t._width_changes("tps", "1.0") is False  # narrower again: the column keeps 6
    assert t._width_changes("tps", "1024.5") is False  # back to 6: still no re-measure
    assert t._width_changes("gpu", "GPU0 7% 130/140G") is True  # columns apart
    assert t._width_changes("tps", "日本語") is False  # 6 display cells, 3 characters
    assert t._width_changes("tps", "日本語本") is True  # 8 display cells
