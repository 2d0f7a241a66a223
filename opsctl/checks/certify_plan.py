"""certify's planning: the facts certified and which engine each check runs on.

:class:`Facts` are the model, its kind and where it runs; compatible checks share one
engine.

Engines (``EngineSpec.engine_key()`` is the sharing rule, opsctl.checks.target): each
check declares its own (its :class:`~opsctl.domain.check_registry.Parts`' engine hooks,
called with a :class:`~opsctl.checks.registry.Planning`); this module names no check.

- the *main* engine serves every check that declares no engine of its own: the base
  engine shaped by each check's ``shared_base`` and ``shared_engine`` (today: for a
  generative model invariance's isolated engine, for a multimodal model also mm-uuid's
  caches-off engine: the same arguments, so the same key, one start serves both);
- a check's ``engines`` hook names the engine it is called with and the ones it opens
  (mm-uuid's caches-on engine, kv-fail's fault-injecting connector: never shared);
- a check that runs once the engines stopped (shutdown) opens none.

Probes only observe, so they are unioned through ``EngineSession.plan``.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opsctl.checks.registry import Need, Planning
from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.collectors.jsonfile import json_object
from opsctl.domain import certify as certify_dom
from opsctl.domain import check_registry as reg

POOLING_UNKNOWN = "pooling"  # a URL's pooling model whose config is not readable here


@dataclass(frozen=True)
class Facts:
    """What is certified: the :class:`certify_dom.Subject` and where its files are."""

    subject: certify_dom.Subject
    model_path: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None  # a URL's opsctl run directory, when found


def _kv_groups(config: dict[str, Any]) -> int:
    kinds = set(config.get("layer_types") or [])
    text = config.get("text_config")
    if not kinds and isinstance(text, dict):
        kinds = set(text.get("layer_types") or [])
    return max(1, len(kinds))


def target_of(
    url: str | None, model: str | None, load_format: str, api_key: str | None, knobs: dict
) -> UrlTarget | EngineSpec:
    """What the command line names: a URL or an engine to start.

    A URL is normalised (HOST:PORT is http://HOST:PORT); anything else is BadInput
    (exit 2, no report)."""
    from opsctl.checks.target import url_or_model
    from opsctl.domain.weights import check_load_format
    from opsctl.errors import BadInput

    if not url and not model:
        raise BadInput(
            "give a server URL or --model NAME|DIR", hint="e.g. opsctl certify --model tiny-llama"
        )
    base = url_or_model(url, model)
    check_load_format(load_format)
    if base:
        return UrlTarget(base, api_key)
    return EngineSpec(
        model=model, load_format=load_format, knobs=tuple(knobs.items()), api_key=api_key
    )


def managed_facts(spec: EngineSpec) -> Facts:
    """Facts of an engine certify starts (the model resolved, nothing started)."""
    from opsctl.engine.model import resolve
    from opsctl.suite.kv_fail.judge import servable

    resolved = resolve(spec.model)  # BadInput: unknown name, bad directory
    config = resolved.config
    subject = certify_dom.Subject(
        managed=True,
        model=resolved.name,
        archetype=resolved.archetype,
        kv_groups=_kv_groups(config),
        kv_refusal=servable(config),
        run_dir=True,
        local=True,
    )
    return Facts(subject, resolved.path, config)


FIRST_CONTACT_S = 30.0  # the most a URL's first answer is waited for (--timeout if less)


def url_facts(target: UrlTarget, session: EngineSession, timeout: float) -> Facts:
    """The facts of a running server (EngineUnreachable when no vLLM server answers).

    EngineUnreachable: nothing answered within ``min(timeout, FIRST_CONTACT_S)``, or not
    vLLM. The facts: its model (config from /v1/models ``root`` or its run directory when
    readable here), kind, run directory, whether it runs on this node and whether its
    mm_uuid probe is on."""
    from opsctl.collectors import certify as certify_col
    from opsctl.collectors.http import require_reachable
    from opsctl.collectors.scoring import ScoringApi
    from opsctl.domain.urls import normalise_url
    from opsctl.engine.model import archetype_of
    from opsctl.errors import BadInput, EngineUnreachable

    first = min(timeout, FIRST_CONTACT_S)
    require_reachable(normalise_url(target.url), first, target.api_key)
    with session.open(target) as live, ScoringApi(live.url, timeout, live.api_key) as api:
        try:
            served = api.served_model()
        except BadInput as err:  # it answered require_vllm a moment ago, then not
            raise EngineUnreachable(f"not a vLLM server: {err.message}") from None
        meta = certify_col.read_meta(live.run_dir)
        path = _readable_dir(meta.get("model_path") or served.root)
        config = _config(path)
        archetype = archetype_of(config) if config else _probe_kind(live.url, served.name, live)
    subject = certify_dom.Subject(
        managed=False,
        model=served.name,
        archetype=archetype,
        kv_groups=_kv_groups(config) if config else None,
        run_dir=live.run_dir is not None,
        local=live.run_dir is not None or is_local(live.url),
        mm_probe=_mm_probe(live.run_dir) if archetype == "vision-language" else None,
        prefix_caching=prefix_caching(live.url, live.api_key, timeout),
    )
    return Facts(subject, path, config, live.run_dir)


def prefix_caching(url: str, api_key: str | None, timeout: float) -> bool | None:
    """The server's own prefix caching, from its vllm:cache_config_info labels.

    None: no /metrics, or no such label."""
    from opsctl.collectors.http import client
    from opsctl.domain.metrics import parse_samples

    try:
        with client(api_key, timeout=min(timeout, FIRST_CONTACT_S)) as c:
            r = c.get(f"{url}/metrics")
            r.raise_for_status()
    except Exception:  # no /metrics is no answer, not an error of certify
        return None
    value = parse_samples(r.text).info.get("enable_prefix_caching")
    return {"True": True, "False": False}.get(str(value)) if value is not None else None


def _readable_dir(path: str | None) -> Path | None:
    if not path:
        return None
    p = Path(path)
    return p if (p / "config.json").is_file() else None


def _config(path: Path | None) -> dict[str, Any]:
    return {} if path is None else json_object(path / "config.json")


def _probe_kind(url: str, model: str, live) -> str:
    from opsctl.collectors.completions import completions_refusal

    refused = completions_refusal(url, model, api_key=live.api_key)
    return POOLING_UNKNOWN if refused else "decoder"


def _mm_probe(run_dir: Path | None) -> str | None:
    from opsctl.collectors.mm_uuid import probe_entries
    from opsctl.suite.mm_uuid.judge import probe_state

    if run_dir is None:
        return (
            "no opsctl run directory for this server: mm-uuid reads the mm_uuid engine "
            "probe's records (certify --model, or opsctl serve with OPSCTL_PROBES=mm_uuid)"
        )
    applied, why = probe_state(probe_entries(run_dir))
    return None if applied else f"the mm_uuid engine probe is not active on this server ({why})"


def is_local(url: str) -> bool:
    """Whether ``url`` names this node (loopback, or this host's own name)."""
    host = (urlsplit(url).hostname or "").lower()
    names = {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    return host in names or host.startswith("127.") or host == "::1"


# ---- engines ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The target each check is called with, and every engine spec the run will open."""

    targets: dict[str, Any]
    specs: list[EngineSpec]


def certify_options(options: Any, managed: bool) -> dict[str, Any]:
    """Each certify check's own options, from certify's (``managed``: certify starts it)."""
    out = {}
    for check in reg.checks(reg.CERTIFY):
        make = check.parts().certify_options
        if make is not None:
            out[check.name] = make(options, managed)
    return out


def engine_plan(
    base: EngineSpec, facts: Facts, checks: tuple[str, ...], options: dict[str, Any]
) -> Plan:
    """Targets and specs for the ``checks`` that run on engines certify starts.

    Every certify check shapes the shared engine (selected or not, so one selection's
    engine is another's); each selected one names its own (``options``: each check's)."""
    every = [(c, c.parts()) for c in reg.checks(reg.CERTIFY)]
    plan = Planning(base, facts.subject, base, base, options)
    common = base
    for c, parts in every:
        if parts.shared_base is not None:
            common = parts.shared_base(common, plan, options.get(c.name))
    main = common
    for c, parts in reversed(every):
        if parts.shared_engine is not None:
            main = parts.shared_engine(main, replace(plan, common=common), options.get(c.name))
    plan = replace(plan, common=common, main=main)
    targets: dict[str, Any] = {}
    specs: list[EngineSpec] = []
    for c, parts in every:
        if c.name not in checks:
            continue
        need = Need(main, () if c.after_engines else (main,))
        if parts.engines is not None:
            need = parts.engines(plan, options.get(c.name))
        targets[c.name] = need.target
        specs += need.specs
    return Plan(targets, specs)
