"""Server URLs as operators type them (pure): the one normaliser every command uses.

Accepted forms (docs/cli.md): ``http://HOST:PORT[/prefix]``, ``https://...`` and a bare
``HOST:PORT`` (read as ``http://HOST:PORT``). HOST is a DNS name, an IPv4 address or a
bracketed IPv6 address. Anything else is BadInput (exit 2, one line): a bare word
without a port (``notaurl``), a port outside 1..65535, an IPv4 literal that is not an
address (``256.1.1.1``), spaces, a query or fragment, another scheme.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

from opsctl.errors import BadInput

FORMS_HINT = "give http://HOST:PORT, https://HOST:PORT or HOST:PORT"
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")
_BARE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[^/:\s\[\]]+):\d+(/.*)?$")


def normalise_url(url: str) -> str:
    """``url`` as ``scheme://host[:port][/prefix]`` without a trailing slash, or BadInput.

    BadInput (exit 2) when it is not a usable http(s) base URL.
    """
    text = url.strip()
    if not text or any(c.isspace() for c in text):
        raise BadInput(f"not an http(s) URL: {url!r}", hint=FORMS_HINT)
    if "://" not in text:
        if not _BARE.match(text):
            raise BadInput(f"not an http(s) URL: {url!r}", hint=FORMS_HINT)
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port  # raises ValueError for a port that is not 0..65535
    except ValueError:
        raise BadInput(f"not a valid URL (bad port): {url!r}", hint=FORMS_HINT) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInput(f"not an http(s) URL: {url!r}", hint=FORMS_HINT)
    if port == 0:
        raise BadInput(f"not a valid URL (port 0): {url!r}", hint=FORMS_HINT)
    if parts.query or parts.fragment or parts.username or parts.password:
        raise BadInput(f"not a server base URL (query, fragment or user): {url!r}")
    host = _host(parts.hostname, url)
    netloc = f"{host}:{port}" if port else host
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def _host(hostname: str, url: str) -> str:
    if ":" in hostname:  # IPv6 (urlsplit strips the brackets)
        try:
            return f"[{ipaddress.IPv6Address(hostname)}]"
        except ValueError:
            raise BadInput(f"not a valid URL (bad IPv6 address): {url!r}") from None
    if re.fullmatch(r"[0-9.]+", hostname):
        try:
            return str(ipaddress.IPv4Address(hostname))
        except ValueError:
            raise BadInput(
                f"not a valid URL (bad IPv4 address {hostname}): {url!r}", hint=FORMS_HINT
            ) from None
    labels = hostname.rstrip(".").split(".")
    if len(hostname) > 253 or not all(_LABEL.match(label) for label in labels):
        raise BadInput(f"not a valid URL (bad host name {hostname!r}): {url!r}")
    return hostname


# the older name, kept for callers that validate
validate_url = normalise_url


def loopback_port(url: str) -> int | None:
    """The port of a URL naming this node's loopback, or None.

    Loopback: localhost, 127.x, ::1. None for another host's URL or one without a port.
    """
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if host == "localhost" or host.startswith("127.") or host == "::1":
        return parts.port
    return None
