"""Endpoints from URL arguments and a TOML targets file, merged with discovered ones.

One row per base URL; an explicit source wins, local pids are kept.

Targets file::

    [[targets]]
    name = "gpu-node-1"
    url = "http://10.0.0.5:8000"
    api_key_env = "NODE1_VLLM_KEY"      # optional: name of the env var holding the key
    labels = { node = "n1", role = "decode" }
    log = "/var/log/vllm/node1.log"     # optional: its server log, tailed (console)"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from opsctl.console.judge import SOURCES, Target
from opsctl.errors import BadInput


def normalise_url(url: str) -> str:
    """An endpoint URL normalised by every command's rule; BadInput when unusable.

    The console's URL rule is every command's (opsctl.domain.urls.normalise_url:
    http(s)://HOST:PORT or a bare HOST:PORT, no trailing slash), checked at parse time;
    what the HTTP client would still refuse is BadInput (exit 2) here too, never a poll
    task's exception later (``http://256.1.1.1:9`` once read 'not polled')."""
    import httpx

    from opsctl.domain import urls

    out = urls.normalise_url(url)
    try:
        httpx.URL(out + "/metrics")
    except httpx.InvalidURL as exc:
        raise BadInput(f"not a valid URL: {url!r} ({exc})", hint=urls.FORMS_HINT) from None
    return out


def endpoint_key(url: str) -> tuple[str, int]:
    """(host, port) of a URL: the same server whatever the spelling (localhost, 0.0.0.0)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host in ("localhost", "0.0.0.0", "::", "::1", "127.0.0.1"):
        host = "127.0.0.1"
    return host, parts.port or (443 if parts.scheme == "https" else 80)


def from_urls(urls: list[str]) -> list[Target]:
    """Targets of URL arguments (named by host:port)."""
    out = []
    for u in urls:
        url = normalise_url(u)
        out.append(Target(name=urlsplit(url).netloc, url=url, source="argument"))
    return out


def from_targets_file(path: Path) -> list[Target]:
    """Targets of a TOML targets file; BadInput when unreadable or malformed."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise BadInput(f"cannot read targets file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"targets file {path} is not valid TOML: {exc}") from None
    items = doc.get("targets", [])
    if not isinstance(items, list):
        raise BadInput(f"{path}: 'targets' must be an array of tables ([[targets]])")
    out = []
    for i, item in enumerate(items, start=1):
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            raise BadInput(f"{path}: target #{i} needs a url")
        url = normalise_url(item["url"])
        labels = item.get("labels") or {}
        if not isinstance(labels, dict):
            raise BadInput(f"{path}: target #{i}: labels must be a table")
        env = item.get("api_key_env")
        log = item.get("log")
        if log is not None and (not isinstance(log, str) or not log.strip()):
            raise BadInput(f"{path}: target #{i}: log must be a file path (a string)")
        out.append(
            Target(
                name=str(item.get("name") or urlsplit(url).netloc),
                url=url,
                source="targets",
                labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                api_key_env=str(env) if env else None,
                log_file=_log_path(path, log) if log else None,
            )
        )
    return out


def _log_path(targets_file: Path, log: str) -> str:
    """A target's log path; a relative one is relative to the targets file."""
    p = Path(log.strip()).expanduser()
    return str(p if p.is_absolute() else targets_file.parent / p)


def merge(*groups: list[Target]) -> list[Target]:
    """One target per server; the first source in SOURCES order names it.

    A local pid or run dir learned from discovery is kept."""
    by_key: dict[tuple[str, int], Target] = {}
    rank = {s: i for i, s in enumerate(SOURCES)}
    for t in (t for g in groups for t in g):
        k = endpoint_key(t.url)
        old = by_key.get(k)
        if old is None:
            by_key[k] = t
            continue
        first, second = (old, t) if rank[old.source] <= rank[t.source] else (t, old)
        by_key[k] = replace(
            first,
            pid=first.pid or second.pid,
            pid_started=first.pid_started or second.pid_started,
            run_dir=first.run_dir or second.run_dir,
            log_file=first.log_file or second.log_file,
        )
    return list(by_key.values())
