"""Engine sessions: start the engines checks need, share them, stop them all.

A check asks its session to :meth:`EngineSession.open` a target. A URL is checked for
reachability (and credentials) and yields a :class:`Live` endpoint (with the run
directory when opsctl started that server). An :class:`EngineSpec` yields an engine the
session started, or reuses one: an engine whose ``engine_key()`` equals the spec's and
whose probes include the spec's (the compatibility rule in :mod:`opsctl.checks.target`).
``plan(specs)`` tells the session up front which probes compatible specs will need, so
the first start already has them all (certify uses it to start as few engines as it can).

A session used as a context manager stops every engine it started on exit, whatever
happens (the process-wide lifetime policy covers signals, see opsctl.engine.lifetime).
A check called without a session gets a private one: its engine lives for that check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from opsctl.checks import events as ev
from opsctl.checks.target import EngineSpec, Live, Target, UrlTarget


@dataclass
class EngineStart:
    """One engine the session started, and which checks it served (for reports)."""

    spec: EngineSpec
    live: Live
    served: list[str] = field(default_factory=list)
    seconds: float = 0.0


class EngineSession:
    """The engines a run of checks shares: started once per engine key, stopped at close."""

    def __init__(self) -> None:
        self._probes: dict[tuple, frozenset[str]] = {}
        self._running: dict[tuple, EngineStart] = {}
        self.starts: list[EngineStart] = []  # every engine started, in order

    # ---- planning ------------------------------------------------------------
    def plan(self, specs: list[EngineSpec]) -> int:
        """Register the specs the session will be asked for.

        Returns how many engines they need (one per distinct engine key)."""
        for spec in specs:
            key = spec.engine_key()
            self._probes[key] = self._probes.get(key, frozenset()) | spec.probes
        return len({s.engine_key() for s in specs})

    # ---- use -----------------------------------------------------------------
    @contextlib.contextmanager
    def open(
        self, target: Target, progress: ev.Progress = ev.ignore, *, label: str = "check"
    ) -> Iterator[Live]:
        """The live endpoint of ``target``: the server at a URL, or the session's engine."""
        if isinstance(target, UrlTarget):
            yield self._url(target)
            return
        live = self.engine(target, progress, label=label)
        yield live

    def _url(self, target: UrlTarget) -> Live:
        from opsctl.collectors.http import require_reachable
        from opsctl.collectors.runs import find_run_dir
        from opsctl.domain.urls import validate_url

        base = validate_url(target.url)
        require_reachable(base, timeout=target.connect_timeout, api_key=target.api_key)
        return Live(base, target.api_key, find_run_dir(base), external=True)

    def engine(self, spec: EngineSpec, progress: ev.Progress = ev.ignore, *, label: str) -> Live:
        """A running engine for ``spec``: reused when compatible, else started."""
        key = spec.engine_key()
        probes = self._probes.get(key, frozenset()) | spec.probes
        running = self._running.get(key)
        if running is not None and probes <= running.spec.probes:
            running.served.append(label)
            progress(ev.EngineReady(running.live.url, None, reused=True))
            return running.live
        if running is not None:  # needs a probe it lacks: replace it
            self._stop(key, progress)
        start = self._start(spec.with_probes(*probes), progress, label)
        self._running[key] = start
        self.starts.append(start)
        return start.live

    def _start(self, spec: EngineSpec, progress: ev.Progress, label: str) -> EngineStart:
        from opsctl.engine.model import resolve
        from opsctl.engine.server import EngineServer, LaunchOptions

        resolved = resolve(spec.model)
        env = dict(spec.env)
        if spec.probes:
            env["OPSCTL_PROBES"] = ",".join(sorted(spec.probes))
        server = EngineServer(
            LaunchOptions(
                model=resolved,
                load_format=spec.load_format,
                extra_args=list(spec.extra_args),
                env=env,
                disable_patches=list(spec.disable_patches),
                label=label.replace(" ", "-"),
                max_model_len=spec.max_model_len,
                max_num_seqs=spec.max_num_seqs,
                enforce_eager=spec.enforce_eager,
                single_process=spec.single_process,
                knobs=dict(spec.knobs),
                api_key=spec.api_key,
                tp=spec.tp,
                dp=spec.dp,
            )
        )
        try:
            server.start()
            progress(ev.EngineStarting(resolved.name, str(server.run_dir), label))
            seconds = server.wait_healthy(spec.timeout)
        except BaseException:
            server.stop()
            raise
        progress(ev.EngineReady(server.url, seconds))
        live = Live(
            server.url,
            spec.api_key,
            server.run_dir,
            external=False,
            model=resolved.name,
            model_path=resolved.path,
            archetype=resolved.archetype,
            server=server,
        )
        return EngineStart(spec, live, [label], seconds)

    def _stop(self, key: tuple, progress: ev.Progress = ev.ignore) -> None:
        start = self._running.pop(key, None)
        if start is None or start.live.server is None:
            return
        report = start.live.server.stop()  # type: ignore[attr-defined]
        progress(ev.EngineStopped(start.live.url, report.seconds, tuple(report.leftover_pids)))

    def close(self, progress: ev.Progress = ev.ignore) -> None:
        """Stop every engine the session still runs."""
        for key in list(self._running):
            self._stop(key, progress)

    def __enter__(self) -> EngineSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def opened(
    target: Target,
    session: EngineSession | None,
    progress: ev.Progress = ev.ignore,
    *,
    label: str,
) -> Iterator[Live]:
    """``session.open(target)``, or a private session's when there is none.

    A private session stops its engine when the block ends (the usual case for one check
    on its own)."""
    if session is not None:
        with session.open(target, progress, label=label) as live:
            yield live
        return
    with EngineSession() as own, own.open(target, progress, label=label) as live:
        yield live
