"""FleetTable keeps a column's width unless a wider cell appears: only then does the
column grow and the window get repainted (a changing figure of the same or a smaller
width repaints its own row alone; tests/ui/test_fleet_table_updates.py)."""

from __future__ import annotations

from opsctl.console.view_fleet_table import FleetTable


def test_a_column_is_measured_again_only_when_a_wider_cell_appears() -> None:
    t = FleetTable()
    run = t.columns["running"]  # the label "run": 3 cells
    assert run.content_width == 3
    assert t._grow("running", "12.5") is True  # wider than the label: 3 -> 4
    assert t._grow("running", "9.1") is False  # narrower than the widest
    assert t._grow("running", "13.0") is False  # same width: no re-measure
    assert t._grow("running", "1024.0") is True  # grows: 4 -> 6
    assert t._grow("running", "1.0") is False  # narrower again: the column keeps 6
    assert t._grow("running", "1024.5") is False  # back to 6: still no re-measure
    assert run.content_width == 6 and run.width == 8  # one cell of padding each side
    assert t._grow("waiting", "GPU0 7% 130/140G") is True  # columns apart
    assert run.content_width == 6 and t.columns["waiting"].content_width == 16
    assert t._grow("running", "日本語") is False  # 6 display cells, 3 characters
    assert t._grow("running", "日本語本") is True  # 8 display cells
    assert run.content_width == 8
    assert t._grow("restarts", "12") is False  # narrower than its label: the label's 8
    assert t._grow("gpu", "GPU0 7% 130/140G") is False  # no GPU column yet: nothing
    assert "gpu" not in t.columns
