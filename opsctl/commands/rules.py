"""`opsctl rules [--job NAME] [--for DURATION] [--out FILE]`: the Prometheus rules file.

The recording and alerting rules of opsctl's fleet alerts, from opsctl.domain.alert_rules
(the definition the console reads its stall window from too)."""

from __future__ import annotations

from pathlib import Path

import typer

from opsctl.commands.options import command, duration_option
from opsctl.errors import BadInput


def write_rules(text: str, out: Path) -> None:
    """Write ``text`` to ``out`` whole or not at all (a temporary file renamed over it)."""
    import os
    import tempfile

    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise BadInput(f"--out {out} is a directory", hint="name a file: --out rules.yml")
    if not parent.is_dir():
        raise BadInput(f"--out {out}: directory {parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=parent)
    except OSError as exc:
        raise BadInput(f"--out {out}: cannot write there ({exc.strerror})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def register(app: typer.Typer) -> None:
    """Add ``opsctl rules`` to ``app``."""
    from opsctl.domain.alert_rules import DEFAULT_FOR_S, dur

    @command(
        app,
        "rules",
        "Prometheus alerting rules for vLLM's failure modes.",
        "opsctl rules --out opsctl-rules.yml",
        "opsctl rules --job vllm --for 2m --out /etc/prometheus/opsctl-rules.yml",
        "opsctl rules --job vllm --for 30s",
    )
    def rules(
        job: str = typer.Option(
            None, "--job", metavar="NAME", help="only series of this Prometheus job label"
        ),
        for_s: float = duration_option(
            dur(DEFAULT_FOR_S),
            "--for",
            help="how long a condition holds before its alert fires (restarts fire at once)",
        ),
        out: Path = typer.Option(
            None, "--out", metavar="FILE", help="write the rules to FILE (default: stdout)"
        ),
    ) -> None:
        """Prometheus alerting rules for vLLM: stall, restarts, KV, queue, errors, TTFT."""
        import sys

        from opsctl.domain.alert_rules import rules_yaml

        if job is not None and not job.strip():
            raise BadInput("--job takes a job label value, not an empty string")
        text = rules_yaml(job, for_s)
        if out is None:
            sys.stdout.write(text)
            return
        write_rules(text, out)
        from opsctl.output import stderr_console

        stderr_console().print(f"wrote {out}", highlight=False)
