"""vLLM release sources for the tests that check a patch's targets against a release."""

from __future__ import annotations


def release_sources(version: str, *modules: str) -> list[str | None]:
    """The sources of ``modules`` in vLLM ``version``'s wheel (None: not in it)."""
    from opsctl.collectors.vllm_sources import WheelSources, fetch_wheel

    wheel = WheelSources(fetch_wheel(version))
    try:
        return [wheel.read(m) for m in modules]
    finally:
        wheel.close()
