"""certify's planning: the facts certified and which engine each check runs on.

:class:`Facts` are the model, its kind and where it runs; compatible checks share one
engine.

Engines (``EngineSpec.engine_key()`` is the sharing rule, opsctl.checks.target):

- the *main* engine serves liveness, the patch ledger, Engram hygiene, usage and
  invariance. For a generative model it is invariance's isolated engine (prefix caching
  off, mm processor cache 0, ``VLLM_USE_FLASHINFER_SAMPLER=0``, the execution mode under
  test); for a multimodal model that is also mm-uuid's caches-off engine (the same
  arguments, so the same key): one start serves both;
- mm-uuid's caches-on engine (different arguments);
- kv-fail's engine (the fault-injecting connector's arguments): never shared.

Probes only observe, so they are unioned through ``EngineSession.plan``.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from opsctl.checks import invariance, kv_fail, mm_uuid
from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec, UrlTarget
from opsctl.domain import certify as dom

POOLING_UNKNOWN = "pooling"  # a URL's pooling model whose config is not readable here


@dataclass(frozen=True)
class Facts:
    """What is certified: the :class:`dom.Subject` and where its files are."""

    subject: dom.Subject
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
    from opsctl.domain import kv_fail as kvd
    from opsctl.engine.model import resolve

    resolved = resolve(spec.model)  # BadInput: unknown name, bad directory
    config = resolved.config
    subject = dom.Subject(
        managed=True,
        model=resolved.name,
        archetype=resolved.archetype,
        kv_groups=_kv_groups(config),
        kv_refusal=kvd.servable(config),
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
    from opsctl.collectors import certify as col
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
        meta = col.read_meta(live.run_dir)
        path = _readable_dir(meta.get("model_path") or served.root)
        config = _config(path)
        archetype = archetype_of(config) if config else _probe_kind(live.url, served.name, live)
    subject = dom.Subject(
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
    if path is None:
        return {}
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _probe_kind(url: str, model: str, live) -> str:
    from opsctl.collectors.completions import completions_refusal

    refused = completions_refusal(url, model, api_key=live.api_key)
    return POOLING_UNKNOWN if refused else "decoder"


def _mm_probe(run_dir: Path | None) -> str | None:
    from opsctl.collectors.mm_uuid import probe_entries
    from opsctl.domain.mm_uuid import probe_state

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


def engine_plan(
    base: EngineSpec, facts: Facts, checks: tuple[str, ...], inv: invariance.Options
) -> Plan:
    """Targets and specs for the ``checks`` that run on engines certify starts."""
    s = facts.subject
    shared = base
    main = base
    if s.generative:
        shared = replace(
            base,
            env=tuple(sorted({**dict(base.env), **invariance.ISOLATING_ENV}.items())),
            enforce_eager=inv.mode == "eager",
            max_num_seqs=max(base.max_num_seqs, inv.n),
        )
        isolated = shared
        if s.multimodal:
            isolated = mm_uuid.mode_spec(shared, mm_uuid.D.CACHES_OFF, s.model or "")
        main = replace(
            invariance.isolated_spec(isolated, inv.mode or "default", inv), probes=frozenset()
        )
    targets: dict[str, Any] = {c: main for c in checks}
    specs = [main for c in checks if c in (dom.LIVENESS, dom.PATCHES, dom.ENGRAM, dom.USAGE)]
    if dom.INVARIANCE in checks:
        specs += [t for _, t in invariance.plan(main, inv) if isinstance(t, EngineSpec)]
    if dom.MM_UUID in checks:
        targets[dom.MM_UUID] = shared
        specs += [mm_uuid.mode_spec(shared, m, s.model or "") for m in mm_uuid.D.MODES]
    if dom.KV_FAIL in checks:
        targets[dom.KV_FAIL] = base
        specs.append(kv_fail.engine_spec(base, kv_fail.Options().settings))
    return Plan(targets, specs)
