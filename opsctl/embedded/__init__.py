"""Embedded tiny models, generated offline (no downloads), deterministic byte for byte."""
