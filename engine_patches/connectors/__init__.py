"""KV connectors shipped by opsctl, loaded by vLLM through ``kv_connector_module_path``.

- :mod:`engine_patches.connectors.fault_kv`: ``FaultInjectingConnector`` stores and
  reloads KV for every KV cache group and reports chosen loaded blocks as failed
  (see :mod:`engine_patches.connectors.injection`).

Importing this package is cheap (no torch, no vLLM); the connector module is
imported by vLLM itself.
"""

from __future__ import annotations

import json

CONNECTOR_NAME = "FaultInjectingConnector"
MODULE_PATH = "engine_patches.connectors.fault_kv"


def kv_transfer_config(
    storage_path: str | None = None,
    *,
    policy: str = "recompute",
    inject: dict | None = None,
    role: str = "kv_both",
) -> str:
    """The ``--kv-transfer-config`` JSON that loads the fault-injecting connector.

    Without ``storage_path`` the connector stores under ``$OPSCTL_RUN_DIR/kv_store``.
    """
    extra: dict = {"inject": inject or {}}
    if storage_path:
        extra["storage_path"] = storage_path
    return json.dumps(
        {
            "kv_connector": CONNECTOR_NAME,
            "kv_connector_module_path": MODULE_PATH,
            "kv_role": role,
            "kv_load_failure_policy": policy,
            "kv_connector_extra_config": extra,
        }
    )
