"""Secrets out of forensics bundles (``opsctl runs bundle``), pure.

- an environment variable whose NAME contains KEY, TOKEN, SECRET, PASSWORD, PASSWD or
  CREDENTIAL (any case) keeps its name, its value becomes ``<redacted>``;
- an argv flag named like that (``--api-key X``, ``--hf-token=X``) loses its value;
- in text (server log, meta.json, probe events): every secret value found above (6
  characters or more, so ``false`` or ``1`` never wipe a log), ``Bearer X``, and
  ``api_key: X`` / ``'hf_token': ['X']`` / ``PASSWORD=X`` spellings, where the name's
  last word is one of those (``tokenizer``, ``max_tokens``, ``key_len`` are not secrets).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
MIN_SECRET_LEN = 6
_NOT_SECRETS = {"true", "false", "none", "null", "yes", "no"}
_WORD = r"(?:api[_-]?key|key|token|secret|password|passwd|credentials?)"
# name (a word of it is a secret word) + separator + optional [ and quote, then the value
_ASSIGN = re.compile(
    rf"(?i)((?<![\w])[\"']?(?:[\w.-]*[_.-])?{_WORD}[\"']?\s*[:=]\s*\[?\s*[\"']?)"
    r"([^\"'\s,\]}]+)"
)
_BEARER = re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=-]+)")


def is_secret_name(name: str) -> bool:
    """Whether a variable or option name looks like it holds a secret (SECRET_WORDS)."""
    upper = name.upper()
    return any(w in upper for w in SECRET_WORDS)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment, sorted, with the values of secret-looking names redacted."""
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in sorted(env.items())}


def secret_values(env: Mapping[str, str], argv: Iterable[str] = ()) -> set[str]:
    """The values worth hunting for in text: of secret-named variables and argv flags."""
    found = {v for k, v in env.items() if is_secret_name(k)}
    args = list(argv)
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, eq, value = arg.partition("=")
        if not is_secret_name(name):
            continue
        if eq:
            found.add(value)
        elif i + 1 < len(args):
            found.add(args[i + 1])
    return {v for v in found if len(v) >= MIN_SECRET_LEN and v.lower() not in _NOT_SECRETS}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """The command line with the values of secret-looking options redacted."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        if arg.startswith("--") and is_secret_name(name):
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def redact_text(text: str, secrets: Iterable[str] = ()) -> tuple[str, int]:
    """``text`` without the secrets (see the module doc) and how many were replaced."""
    count = 0
    for value in sorted(set(secrets), key=len, reverse=True):
        if value and value in text:
            count += text.count(value)
            text = text.replace(value, REDACTED)

    def sub(m: re.Match) -> str:
        nonlocal count
        if m.group(2) == REDACTED or m.group(2).startswith("<redacted"):
            return m.group(0)
        count += 1
        return m.group(1) + REDACTED

    text = _BEARER.sub(sub, text)
    text = _ASSIGN.sub(sub, text)
    return text, count
