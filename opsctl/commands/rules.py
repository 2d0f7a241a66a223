"""`opsctl rules [--job NAME] [--for DURATION] [--out FILE] [--blackbox-out FILE]`.

The recording and alerting rules of opsctl's fleet alerts, from opsctl.domain.alert_rules
(the definition the console reads its stall window from too); with ``--blackbox-out``,
the blackbox exporter's module for the canary alert (VllmCanaryFailed), its scrape job
in the file's header and on stderr."""

from __future__ import annotations

from pathlib import Path

import typer

from opsctl.commands.options import command, duration_option
from opsctl.errors import BadInput


def write_rules(text: str, out: Path, flag: str = "--out") -> None:
    """Write ``text`` to ``out`` whole or not at all (a temporary file renamed over it)."""
    import os
    import tempfile

    parent = out.parent if str(out.parent) else Path(".")
    if out.is_dir():
        raise BadInput(f"{flag} {out} is a directory", hint=f"name a file: {flag} FILE.yml")
    if not parent.is_dir():
        raise BadInput(f"{flag} {out}: directory {parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=parent)
    except OSError as exc:
        raise BadInput(f"{flag} {out}: cannot write there ({exc.strerror})") from None
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
        "opsctl rules --job vllm --out opsctl-rules.yml --blackbox-out blackbox.yml",
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
        blackbox_out: Path = typer.Option(
            None,
            "--blackbox-out",
            metavar="FILE",
            help="also write the blackbox exporter's canary module (blackbox.yml) to FILE",
        ),
        canary_key_file: str = typer.Option(
            None,
            "--canary-key-file",
            metavar="PATH",
            help="with --blackbox-out: the exporter sends the API key in PATH as bearer token",
        ),
    ) -> None:
        """Prometheus alerting rules for vLLM: stall, restarts, KV, queue, errors, TTFT."""
        import sys

        from opsctl.domain.alert_rules import rules_yaml

        if job is not None and not job.strip():
            raise BadInput("--job takes a job label value, not an empty string")
        if canary_key_file is not None and blackbox_out is None:
            raise BadInput("--canary-key-file goes with --blackbox-out FILE")
        if blackbox_out is not None and out is not None and blackbox_out == out:
            raise BadInput("--blackbox-out and --out name the same file")
        text = rules_yaml(job, for_s)
        if blackbox_out is not None:
            _write_blackbox(blackbox_out, canary_key_file)
        if out is None:
            sys.stdout.write(text)
            return
        write_rules(text, out)
        from opsctl.output import stderr_console

        stderr_console().print(f"wrote {out}", highlight=False)


def _write_blackbox(path: Path, key_file: str | None) -> None:
    """Write blackbox.yml to ``path``; say on stderr which scrape job reads it."""
    import yaml

    from opsctl.domain.alert_rules import blackbox_yaml, canary_scrape_job
    from opsctl.output import stderr_console

    write_rules(blackbox_yaml(key_file), path, "--blackbox-out")
    job = yaml.safe_dump([canary_scrape_job(["HOST:PORT"])], sort_keys=False, width=1000)
    stderr_console().print(
        f"wrote {path}; scrape the canary with this job under scrape_configs in "
        f"prometheus.yml (targets: your vLLM servers; 127.0.0.1:9115: the exporter):\n{job}",
        highlight=False,
        markup=False,
    )
