"""Who may reach a server `opsctl serve` starts (pure decisions).

- ``--host``, ``--port`` and ``--api-key`` belong to opsctl (it binds, probes and prints
  the URL from them): the same options among the extra vLLM args after ``--`` (also as
  ``--opt=value``, with underscores, or abbreviated as argparse would accept) are refused
  with a hint naming opsctl's flag.
- A host that is not loopback (127.0.0.0/8, ::1, localhost) is refused unless an API key
  is set or ``--insecure-bind`` is given. A wildcard bind (0.0.0.0, ::) listens on all
  interfaces.
"""

from __future__ import annotations

import ipaddress

from opsctl.errors import BadInput

# vLLM options opsctl owns -> the opsctl flag that sets them
OWNED_ARGS = {"host": "--host", "port": "--port", "api-key": "--api-key"}
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def owned_extra_arg(extra: list[str]) -> tuple[str, str] | None:
    """The first extra vLLM arg that sets an option opsctl owns: (as given, opsctl flag).

    vLLM's parser turns ``_`` into ``-`` and (argparse) accepts unique prefixes, so
    ``--api_key``, ``--host=0.0.0.0`` and ``--ho`` all count."""
    for arg in extra:
        if arg == "--":
            break
        if not arg.startswith("--") or len(arg) < 4:
            continue
        name = arg[2:].split("=", 1)[0].replace("_", "-").lower()
        for owned, flag in OWNED_ARGS.items():
            if owned.startswith(name):
                return arg, flag
    return None


def refuse_owned_args(extra: list[str]) -> None:
    """Refuse (BadInput) an argument after ``--`` that sets an option opsctl owns."""
    owned = owned_extra_arg(extra)
    if owned is not None:
        given, flag = owned
        raise BadInput(
            f"{given!r} after -- sets an option opsctl owns",
            hint=f"use opsctl's own {flag} (before --)",
        )


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (``localhost`` or a loopback address)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, it is not known to be local


def is_wildcard(host: str) -> bool:
    """Whether ``host`` binds every interface (``0.0.0.0``, ``::`` or empty)."""
    return host.strip("[]") in WILDCARD_HOSTS


def exposure_note(host: str, api_key: str | None, insecure_bind: bool) -> str | None:
    """How far a bind reaches, in words (None for loopback); BadInput if unauthenticated.

    Only a bind beyond loopback needs authentication.
    """
    if is_loopback(host):
        return None
    if not api_key and not insecure_bind:
        raise BadInput(
            f"refusing to serve an unauthenticated API on {host!r} (not a loopback address)",
            hint="set --api-key KEY (or VLLM_API_KEY), or pass --insecure-bind if you mean it",
        )
    where = "all interfaces" if is_wildcard(host) else host
    auth = "API key required on /v1" if api_key else "NO authentication (--insecure-bind)"
    return f"listening on {where} ({auth})"
