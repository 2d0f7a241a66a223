"""Stand-ins and shared setup the tests import (issue 36 item 5).

- base.py: :class:`~tests.standins.base.StandInVllm`, the stand-in vLLM server (threaded,
  one port): /health, /version, /v1/models, /metrics, an API key, a delay; a stand-in
  overrides only what differs. admin.py (admin routes), completions.py (completions, chat,
  /tokenize), lora.py (adapters), mm_uuid.py (the mm_uuid probe), scoring.py
  (/score, /rerank) and fleet.py (keyed, slow, hung) are its behaviours.
- vllm_server.py: many endpoints in modes on one asyncio thread (healthy, busy, stalled,
  hung, dead, unauthorized, notvllm, keyed) for the console's tests and the benchmark.
- Real engines: tests/conftest.py ``running_engine`` (one), ``two_engines`` (two at once),
  tests/engine_pool.py (shared read-only engines).
- Shared setup: kv_scheduler.py (vLLM's Scheduler without an engine), patch_env.py,
  fleet_source.py, diag_app.py, cli_result.py, shm_watch.py.
"""
