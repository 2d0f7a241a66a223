"""Draw the README's pictures: docs/screens/console.svg and docs/screens/serve.svg.

    python docs/screens/make.py      # from the checkout's root (no engine starts)

Each is a screenshot (Textual's headless ``App.run_test`` and ``export_screenshot``) of the
app the CLI builds, fed what the UI tests feed it:

- the console (``build_console_app``): ``StaticSource`` of tests/ui/test_console_app.py,
  seven stand-in servers (healthy, busy, stalled, hung, dead, one that wants an API key,
  one that is not vLLM) answering with the /metrics recorded from a real tiny-llama server
  (tests/data/vllm_metrics_tiny_llama.txt), scraped 13 times a second apart;
- serve's dashboard (``build_serve_app``): the snapshots recorded from a real
  ``opsctl serve`` (tests/ui/fixtures/serve_snapshots.jsonl), replayed from starting to
  ready.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent


async def wait_for(pilot, cond, timeout: float = 30.0) -> None:
    """Pause until cond() holds; the app's polls run in a worker thread."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not draw in time")
        await pilot.pause(0.02)


async def settle(pilot) -> None:
    """Let tables measure their columns and every queued message run."""
    for _ in range(5):
        await pilot.pause(0.1)


async def console_svg() -> str:
    from opsctl.console.view_app import build_console_app
    from tests.standins.vllm_server import MODES
    from tests.ui.test_console_app import StaticSource

    app = build_console_app(StaticSource(), interval=3600)
    async with app.run_test(size=(250, 12)) as pilot:
        await wait_for(pilot, lambda: app.table.row_count == len(MODES))
        await settle(pilot)
        return app.export_screenshot(title="opsctl console")


async def serve_svg() -> str:
    import json

    from opsctl.serve.collect import from_dict
    from opsctl.serve.view_app import build_serve_app

    recorded = ROOT / "tests" / "ui" / "fixtures" / "serve_snapshots.jsonl"
    snaps = [from_dict(json.loads(line)) for line in recorded.read_text().splitlines()]
    frames = iter(snaps)  # each once; then StopIteration ends the dashboard's polling
    app = build_serve_app(lambda: next(frames), interval=0.01, clock=False)
    async with app.run_test(size=(140, 38)) as pilot:
        await wait_for(pilot, lambda: app.polls == len(snaps))
        await settle(pilot)
        return app.export_screenshot(title="opsctl serve")


def main() -> int:
    for name, draw in (("console", console_svg), ("serve", serve_svg)):
        path = OUT / f"{name}.svg"
        path.write_text(asyncio.run(draw()), encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
