"""The alerts Prometheus holds, mapped to the console's endpoints by instance.

Read from GET /api/v1/alerts and mapped by the ``instance`` label, so that the console
and the alerts tell one story. Parsing and the mapping are pure
(opsctl.domain.alert_rules); this module only asks.

A Prometheus without alerts (no rules loaded) answers an empty list: every row shows none.
An answer that fails leaves the rows' alerts as they were and says why (``error``)."""

from __future__ import annotations

from dataclasses import replace

import httpx

from opsctl.console import judge_prom as prom
from opsctl.console.judge import EndpointView
from opsctl.domain.alert_rules import FiredAlert, firing_for, parse_alerts

ALERTS_PATH = "/api/v1/alerts"


async def fetch(client: httpx.AsyncClient, timeout: float) -> list[FiredAlert]:
    """Every alert Prometheus holds now (pending and firing); PromError on a bad answer."""
    r = await client.get(ALERTS_PATH, timeout=timeout)
    try:
        doc = r.json()
    except ValueError:
        raise prom.PromError(f"{ALERTS_PATH}: HTTP {r.status_code}, not JSON") from None
    return parse_alerts(prom.data_of(doc))


def with_alerts(view: EndpointView, instance: str, alerts: list[FiredAlert]) -> EndpointView:
    """``view`` carrying the firing alerts of the endpoint Prometheus labels ``instance``."""
    return replace(view, alerts=firing_for(alerts, instance))
