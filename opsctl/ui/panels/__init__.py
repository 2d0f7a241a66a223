"""Reusable panels. Each panel is a widget with ``update_snapshot(snapshot)``; the future
`opsctl dashboard` hosts many of them over many servers."""
