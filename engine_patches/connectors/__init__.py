"""KV connectors shipped by opsctl, loaded by vLLM through ``kv_connector_module_path``.

- :mod:`engine_patches.connectors.fault_kv`: ``FaultInjectingConnector`` stores and
  reloads KV for every KV cache group and reports chosen loaded blocks as failed.
- :mod:`engine_patches.connectors.injection`: its contract (configuration, control
  file, injection plan, event kinds), pure, shared with opsctl.

Importing this package is cheap (no torch, no vLLM); the connector module is
imported by vLLM itself.
"""
