"""What a check runs against: a running server or an engine opsctl starts for it.

A running server (:class:`UrlTarget`) or an engine opsctl
starts for it (:class:`EngineSpec`), and the live endpoint either becomes (:class:`Live`).

Engine sharing (used by :class:`opsctl.checks.session.EngineSession` and certify):
two specs can be served by ONE engine when :meth:`EngineSpec.engine_key` is equal, i.e.
the same model, load format, vLLM arguments, environment, test knobs, disabled patches,
context/batch limits and execution mode. Probes (``OPSCTL_PROBES``: batch, mm_uuid) only
observe, so they are not part of the key: an engine started with the union of the probes
its checks need serves them all. Anything that changes what the engine computes (a knob,
an argument such as ``--no-enable-prefix-caching``) makes a separate engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from opsctl.errors import BadInput

if TYPE_CHECKING:
    from opsctl.domain.rank_flags import RankArgs


@dataclass(frozen=True, slots=True)
class UrlTarget:
    """A running server (maybe started by opsctl: its run dir is then found by URL)."""

    url: str
    api_key: str | None = None
    # how long the first contact may wait for an answer (the command's --timeout, capped)
    connect_timeout: float = 5.0


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine for opsctl to start (and stop) for the check."""

    model: str | None = None  # embedded name or directory; None: the check's default
    load_format: str = "auto"
    extra_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    knobs: tuple[tuple[str, str], ...] = ()  # test-only (engine_patches.knobs)
    probes: frozenset[str] = frozenset()
    disable_patches: tuple[str, ...] = ()
    max_model_len: int = 256
    max_num_seqs: int = 8
    enforce_eager: bool = True
    # the model runs in the EngineCore process (one GPU's default layout; on CPU it saves
    # the Worker process's spawn): no check needs vLLM's multiprocess worker layout
    single_process: bool = True
    timeout: float = 300.0  # seconds to wait for /health
    api_key: str | None = None
    tp: int = 1  # tensor-parallel ranks
    dp: int = 1  # data-parallel engines

    def engine_key(self) -> tuple:
        """Equal keys: one engine can serve both specs (probes are unioned)."""
        return (
            self.model,
            self.load_format,
            self.extra_args,
            tuple(sorted(self.env)),
            tuple(sorted(self.knobs)),
            tuple(sorted(self.disable_patches)),
            self.max_model_len,
            self.max_num_seqs,
            self.enforce_eager,
            self.single_process,
            self.api_key,
            self.tp,
            self.dp,
        )

    def with_defaults(self, model: str | None = None, **changes) -> EngineSpec:
        """This spec with the check's default model (when none was given) and ``changes``."""
        return replace(self, model=self.model or model, **changes)

    def with_probes(self, *probes: str) -> EngineSpec:
        """This spec with ``probes`` added to its probes."""
        return replace(self, probes=self.probes | frozenset(probes))


Target = UrlTarget | EngineSpec


@dataclass(frozen=True)
class Live:
    """A reachable server a check talks to."""

    url: str
    api_key: str | None = None
    run_dir: Path | None = None  # opsctl run directory (probe events, ledger), if any
    external: bool = True  # False: opsctl started it for this check or session
    model: str | None = None  # the resolved model name when opsctl started it
    model_path: Path | None = None
    archetype: str | None = None
    server: object | None = field(default=None, compare=False)  # EngineServer, if ours


def url_or_model(url: str | None, model: str | None) -> str | None:
    """The CLI's rule for every command that checks a server: a URL or ``--model``.

    Never both (BadInput). Returns the URL normalised (``HOST:PORT`` ->
    ``http://HOST:PORT``; an invalid one is BadInput), or None when there is none."""
    from opsctl.domain.urls import normalise_url

    if url and model:
        raise BadInput("give either a URL or --model, not both")
    return normalise_url(url) if url else None


FIRST_CONTACT_CAP_S = 30.0


def url_target(url: str, api_key: str | None, timeout: float | None) -> UrlTarget:
    """The check target for a server at ``url``, its first contact capped at 30 s.

    Its first contact may wait the command's ``--timeout``, at most 30 s (a dead server
    should not hold a command for a long engine-start timeout)."""
    wait = min(timeout, FIRST_CONTACT_CAP_S) if timeout else 5.0
    return UrlTarget(url, api_key, connect_timeout=wait)


def parse_knobs(values: list[str] | None, *, url: str | None = None) -> dict[str, str]:
    """``["NAME=VALUE", ...]`` -> {NAME: VALUE}; unknown names and bad forms are BadInput."""
    from engine_patches import knobs

    out: dict[str, str] = {}
    for raw in values or []:
        name, sep, value = raw.partition("=")
        if not sep or not value:
            raise BadInput(f"--test-knob takes NAME=VALUE, not {raw!r}")
        if name not in knobs.KNOBS:
            raise BadInput(
                f"unknown test knob {name!r}", hint=f"known knobs: {', '.join(knobs.KNOBS)}"
            )
        out[name] = value
    if out and url:
        raise BadInput("--test-knob needs an engine opsctl starts (use --model, not a URL)")
    return out


def rank_args(
    tp: int | None, dp: int | None, extra: Sequence[str] = (), *, url: str | None = None
) -> RankArgs:
    """``--tp``/``--dp`` and vLLM's own rank flags among ``extra``: one ``RankArgs``.

    Unset ranks are 1. BadInput: ranks for a URL, a rank given both ways or twice, a size
    below 1."""
    from opsctl.domain import rank_flags

    if url and (tp is not None or dp is not None):
        raise BadInput(
            f"--tp and --dp are the ranks of an engine opsctl starts (--model), not of the "
            f"server at {url}"
        )
    try:
        return rank_flags.merge(tp, dp, extra)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def refuse_ranks(model: str | None, tp: int, dp: int, extra: Sequence[str] = ()) -> None:
    """BadInput now, before anything starts, for ranks vLLM or this machine would refuse.

    A tensor-parallel size the model's heads do not divide, a data-parallel option vLLM
    refuses for the model (among the vLLM arguments ``extra``), more ranks than CPUs."""
    if tp == 1 and dp == 1:
        return
    from opsctl.engine import server
    from opsctl.engine.model import resolve

    opts = server.LaunchOptions(model=resolve(model), tp=tp, dp=dp, extra_args=list(extra))
    server.refuse_ranks(opts)


def with_ranks(
    target: Target, tp: int | None, dp: int | None, default_model: str | None = None
) -> Target:
    """``target`` with the ranks asked for, refused now when they cannot run.

    An engine spec runs them (vLLM's multiprocess layout); a URL takes none (BadInput).
    ``default_model`` stands for a spec without a model in :func:`refuse_ranks`."""
    url = target.url if isinstance(target, UrlTarget) else None
    found = rank_args(tp, dp, url=url)
    if isinstance(target, UrlTarget) or (found.tp == 1 and found.dp == 1):
        return target
    refuse_ranks(target.model or default_model, found.tp, found.dp)
    return replace(target, tp=found.tp, dp=found.dp, single_process=False)
