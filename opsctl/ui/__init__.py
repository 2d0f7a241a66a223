"""Textual UI: apps, reusable panels (fed by the same snapshots/findings as --json)."""
