"""Server URLs as operators type them (pure)."""

from __future__ import annotations

from urllib.parse import urlsplit

from opsctl.errors import BadInput


def validate_url(url: str) -> str:
    """``url`` without a trailing slash, or BadInput (exit 2) when it is not a usable
    http(s) base URL."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a bad port
    except ValueError:
        raise BadInput(f"not a valid URL: {url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"not an http(s) URL: {url!r}")
    if port == 0:
        raise BadInput(f"not a valid URL (port 0): {url!r}")
    return url.rstrip("/")
