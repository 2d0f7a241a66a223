"""The diagnostics library: every opsctl check as a plain Python call.

One module per check (kv_fail, usage, mm_uuid, invariance, engram, patches, status).
Each exposes ``run(target, options, progress=events.ignore, session=None) -> Report``:

- ``target``: :class:`~opsctl.checks.target.UrlTarget` (a running server) or
  :class:`~opsctl.checks.target.EngineSpec` (an engine opsctl starts and stops);
- ``options``: the check's frozen options dataclass (what its CLI flags set);
- ``progress``: a callback receiving typed :mod:`~opsctl.checks.events`;
- ``session``: an :class:`~opsctl.checks.session.EngineSession` to share engines
  between checks (compatibility rule in :mod:`opsctl.checks.target`); without one the
  check starts and stops its own engine.

The report is a frozen dataclass whose ``to_dict()`` is exactly the ``--json`` document
of the command. The CLI (opsctl.commands), the ``--tui`` panels, the console and
certify are views over these calls; nothing here imports Typer or Textual.

Example::

    from opsctl.checks import usage
    from opsctl.checks.target import EngineSpec
    report = usage.run(EngineSpec(model="tiny-reranker"), usage.Options())
    print(report.verdict, report.to_dict()["rows"][0])
"""
