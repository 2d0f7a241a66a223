"""Console actions (Pilot) against stand-in servers: admin calls (confirm, cancel, the
404 of a dev-mode route explained), checks run from the console (their panel, the
result on the row and in the drill-in, two at once while the UI keeps ticking), the
command mode, the help listing every key, and --readonly refusing every action."""

from __future__ import annotations

import threading
import time

import pytest
from textual import events
from textual.widgets import OptionList

from opsctl.console import targets
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.view_app import ConsoleApp, DetailScreen, HelpScreen, build_console_app
from opsctl.console.view_checks import ChecksScreen
from opsctl.console.view_modals import ConfirmScreen, PickScreen
from opsctl.console.view_screens import HELP
from opsctl.ui.panels.diag import DiagPanel
from tests.standins.admin import admin_server
from tests.standins.completions import completions_server
from tests.standins.scoring import stand_in as scoring_stand_in


async def wait_for(
    pilot, cond, timeout: float = 30.0, what: str = "the console", show=lambda: ""
) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {show()}"
        await pilot.pause(0.02)


def source(urls: list[str]) -> DirectScrapeSource:
    settings = Settings(interval_s=0.2, stall_window_s=1.0)
    src = DirectScrapeSource(targets.from_urls(urls), discover=False, settings=settings, timeout=2)
    src.start()
    return src


async def select(pilot, app: ConsoleApp, url: str) -> None:
    await wait_for(pilot, lambda: url in app.table.cells, what=f"row {url}")
    app.table.move_cursor(row=app.table.get_row_index(url))
    await pilot.pause()


async def pick(pilot, app: ConsoleApp, option: str) -> None:
    await wait_for(pilot, lambda: isinstance(app.screen, PickScreen), what="the pick list")
    ol = app.screen.query_one(OptionList)
    ids = [ol.get_option_at_index(i).id for i in range(ol.option_count)]
    ol.highlighted = ids.index(option)
    await pilot.press("enter")


async def command(pilot, text: str, typed: bool = False) -> None:
    """``:`` and Enter as keys; the text typed key by key (``typed``: each key costs the
    pilot two waits for an idle app, ~0.2 s on busy cores) or pasted into the command box.
    The readonly test and the first command of the admin test type theirs: a key the app
    binds ("a", "d", "n"...) must reach the box, not the binding."""
    if typed:
        await pilot.press("colon", *text, "enter")
        return
    await pilot.press("colon")
    box = pilot.app.command_box
    await wait_for(pilot, lambda: box.has_focus, what="the command box")
    box.post_message(events.Paste(text))
    await wait_for(pilot, lambda: box.value == text, what=f"{text!r} in the command box")
    await pilot.press("enter")


def logged(app: ConsoleApp, text: str) -> bool:
    return any(text in line for line in app.action_log)


def posts(handler) -> list[str]:
    return [p for m, p in handler.calls if m == "POST"]


@pytest.fixture
def admins():
    with admin_server(dev=True) as dev, admin_server(dev=False) as plain:
        yield dev, plain


@pytest.mark.anyio
async def test_admin_calls_confirm_cancel_and_the_404_explained(admins):
    (dev_url, dev), (plain_url, plain) = admins
    src = source([dev_url, plain_url])
    app = build_console_app(src, interval=0.2)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await select(pilot, app, dev_url)
            # destructive: asks; "n" cancels and nothing is sent
            await pilot.press("a")
            await pick(pilot, app, "reset_prefix_cache")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("n")
            await wait_for(pilot, lambda: logged(app, "cancelled: POST /reset_prefix_cache"))
            assert posts(dev) == []
            # "y" sends it
            await pilot.press("a")
            await pick(pilot, app, "reset_prefix_cache")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: logged(app, "'success': True"), what="reset answer")
            assert posts(dev) == ["/reset_prefix_cache"]
            # a query does not ask; sleep (destructive) does, through command mode
            await command(pilot, "admin sleep", typed=True)
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert "aborted" in str(app.screen.query_one("#detail").render())
            await pilot.press("y")
            await wait_for(pilot, lambda: "/sleep?level=1" in posts(dev), what="sleep")
            await command(pilot, "admin is_sleeping")
            await wait_for(pilot, lambda: logged(app, "'is_sleeping': True"), what="is_sleeping")
            # the server without dev mode: its 404 says what would expose the route
            await select(pilot, app, plain_url)
            await command(pilot, "admin reset_prefix_cache")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: logged(app, "VLLM_SERVER_DEV_MODE=1"), what="404 text")
            line = next(x for x in app.action_log if "VLLM_SERVER_DEV_MODE=1" in x)
            assert "development route" in line and "vLLM 0.32" in line
            await command(pilot, "admin load")  # registered always: a 404 means not vLLM 0.32
            await wait_for(pilot, lambda: logged(app, "registered by every vLLM 0.32 server"))
            await command(pilot, "admin frobnicate")
            await wait_for(pilot, lambda: logged(app, "unknown admin route 'frobnicate'"))
            await command(pilot, "bogus verb")
            await wait_for(pilot, lambda: logged(app, "not a console command"))
            assert posts(plain) == ["/reset_prefix_cache"]
            # from a drill-in, ':' acts on the endpoint shown there
            await select(pilot, app, dev_url)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
            app.table.move_cursor(row=app.table.get_row_index(plain_url))
            await command(pilot, "admin is_paused")
            await wait_for(pilot, lambda: logged(app, "'is_paused': False"), what="dev answer")
            assert ("GET", "/is_paused") in dev.calls and ("GET", "/is_paused") not in plain.calls
    finally:
        src.close()


@pytest.mark.anyio
async def test_readonly_refuses_every_action(admins):
    (dev_url, dev), _ = admins
    src = source([dev_url])
    app = build_console_app(src, interval=0.2, readonly=True)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await select(pilot, app, dev_url)
            assert "readonly" in str(app.header.render())
            for key in ("d", "n", "x", "R", "c", "a"):
                await pilot.press(key)
            for text in ("diag invariance", "serve", "stop", "restart", "runs clean",
                         "admin reset_prefix_cache"):  # fmt: skip
                await command(pilot, text, typed=True)
            await pilot.pause(0.3)
            refused = [x for x in app.action_log if x.startswith("readonly:")]
            assert len(refused) == 12, app.action_log
            assert len(app.screen_stack) == 1 and posts(dev) == [] and app.jobs.jobs == []
            assert app.servers.managed == []
    finally:
        src.close()


@pytest.mark.anyio
async def test_help_lists_every_key_and_command():
    with admin_server(dev=True) as (url, _):
        src = source([url])
        app = build_console_app(src, interval=0.2)
        try:
            async with app.run_test(size=(200, 60)) as pilot:
                await pilot.press("question_mark")
                await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
                shown = str(app.screen.query_one("#help").render())
                for b in ConsoleApp.BINDINGS:
                    key = {"enter": "Enter", "escape": "Esc"}.get(b.key, b.key_display or b.key)
                    assert f"  {key} " in shown or f" {key} " in shown, key
                for verb in ("diag CHECK", "serve [MODEL]", "stop", "restart", "runs clean",
                             "runs bundle", "admin ROUTE"):  # fmt: skip
                    assert verb in HELP
        finally:
            src.close()


@pytest.mark.anyio
async def test_two_checks_at_once_panel_row_and_drill_in():
    gate = threading.Event()  # the usage check's /score answers wait until both run
    with completions_server() as (gen_url, gen), scoring_stand_in(gate=gate) as score_url:
        src = source([gen_url, score_url])
        app = build_console_app(src, interval=0.2)
        try:
            async with app.run_test(size=(220, 60)) as pilot:
                await select(pilot, app, score_url)
                await command(pilot, "diag usage")  # held by the gate: still running below
                await wait_for(pilot, lambda: isinstance(app.screen, ChecksScreen))
                await pilot.press("escape")
                await select(pilot, app, gen_url)
                await pilot.press("d")  # kind unknown here: every URL check is offered
                await wait_for(pilot, lambda: isinstance(app.screen, PickScreen))
                ol = app.screen.query_one(OptionList)
                offered = [ol.get_option_at_index(i).id for i in range(ol.option_count)]
                assert offered == ["usage", "invariance", "mm-uuid"]
                await pick(pilot, app, "invariance")
                await wait_for(pilot, lambda: isinstance(app.screen, ChecksScreen))
                usage_job, inv_job = app.jobs.jobs
                assert usage_job.running  # both at once
                gate.set()
                ticks = app.ticks
                await wait_for(pilot, lambda: not inv_job.running and not usage_job.running,
                               timeout=60, what="both checks")  # fmt: skip
                assert app.ticks > ticks + 3  # the UI kept ticking meanwhile
                assert usage_job.started_at < inv_job.started_at < usage_job.finished_at
                # the final snapshot reaches the panel as a message after the job ended
                await wait_for(pilot, lambda: app.screen.query_one(DiagPanel).last.get("verdict")
                               == inv_job.verdict, what="the verdict in the panel")  # fmt: skip
                panel = app.screen.query_one(DiagPanel)
                assert inv_job.verdict == "pass"
                assert "invariance" in str(panel.border_title)
                await pilot.press("escape")
                await wait_for(pilot, lambda: app.table.cells[gen_url][COL] == "invariance: PASS")
                assert app.table.cells[score_url][COL].startswith("usage: PASS (8 request(s)")
                assert gen.bodies  # the check really talked to the server
                app.table.move_cursor(row=app.table.get_row_index(gen_url))
                await pilot.press("enter")
                await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
                block = app.screen.query_one("#d-actions")
                await wait_for(pilot, lambda: "invariance: PASS" in str(block.render()))
        finally:
            src.close()


COL = [k for k, _ in __import__("opsctl.console.view_panel", fromlist=["COLUMNS"]).COLUMNS].index(
    "check"
)


@pytest.mark.anyio
async def test_a_check_event_arriving_while_the_checks_screen_is_taken_down_is_dropped():
    """A job's last snapshot can arrive while the app exits (its widgets already gone):
    it used to raise NoMatches('#jobs') and kill the console."""
    from textual.app import App

    from opsctl.console.actions import CheckChoice, CheckJob

    job = CheckJob(1, CheckChoice("usage", "test"), "http://127.0.0.1:9", "local")
    app = App()
    async with app.run_test() as pilot:
        screen = ChecksScreen([job], show=1)
        await app.push_screen(screen)
        await wait_for(pilot, lambda: screen.ready, what="the checks screen")
        await screen.query_one("#jobs").remove()  # as during the app's teardown
        await screen.query_one(DiagPanel).remove()
        job.state = "done"
        screen.on_job_event(job, {"phase": "done", "verdict": "pass"})
        await pilot.pause()
        assert app.is_running and app.return_value is None and app._exception is None
