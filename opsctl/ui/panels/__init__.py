"""Reusable panels: each is a widget with ``update_snapshot(snapshot)``.

The future `opsctl dashboard` hosts many of them over many servers.
"""
