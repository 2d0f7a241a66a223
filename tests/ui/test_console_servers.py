"""Console server actions (Pilot) over stand-in engines (tests.standins.admin.StandInEngine:
a real process with a run directory and meta.json behind EngineServer's interface):
start from the form and from ``:serve``, kv-fail offered for a server opsctl started,
restart and stop with cancel and confirm, servers of this console stopped on exit; a
run another opsctl started is stopped by its meta pids but not restarted; an orphaned
engine reaped (``runs clean``); the forensics bundle of the dead run."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from textual.widgets import Input, OptionList

from opsctl.console import direct, discovery
from opsctl.console.direct import DirectScrapeSource
from opsctl.console.judge_state import Settings
from opsctl.console.servers import RESTART_FOREIGN
from opsctl.console.view_app import BUNDLE_NOTE, DetailScreen, build_console_app
from opsctl.console.view_checks import ChecksScreen
from opsctl.console.view_modals import ConfirmScreen, PickScreen, StartServerScreen
from opsctl.engine.model import ResolvedModel
from opsctl.engine.server import LaunchOptions
from tests.standins.admin import StandInEngine
from tests.ui.test_console_actions import COL, command, logged, pick, select, wait_for

MAMBA = {"architectures": ["MambaForCausalLM"], "model_type": "mamba"}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("OPSCTL_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(direct, "DISCOVER_EVERY_S", 0.3)
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "home" / "runs"
    runs.mkdir(parents=True)
    model = tmp_path / "tiny-mamba"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(MAMBA))
    return runs


def console(runs: Path):
    settings = Settings(interval_s=0.2, stall_window_s=1.0)
    src = DirectScrapeSource(
        [], discover=True, discover_fn=lambda: discovery.discover_runs(runs), settings=settings,
        timeout=2,
    )  # fmt: skip
    src.start()
    return src, build_console_app(src, interval=0.2, engine_factory=StandInEngine)


def alive(engine: StandInEngine) -> bool:
    return engine.proc is not None and engine.proc.poll() is None


def state_of(app, url: str) -> str | None:
    return next((v.state for v in app.last.endpoints if v.target.url == url), None)


async def confirm(pilot, app, key: str) -> None:
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm",
                   show=lambda: (app.screen, app.action_log[-3:]))  # fmt: skip
    await pilot.press(key)
    await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen))


@pytest.mark.anyio
async def test_start_check_restart_stop_and_exit_stop_servers_of_this_console(home):
    src, app = console(home)
    model = str(home.parent.parent / "tiny-mamba")
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, StartServerScreen))
            app.screen.query_one("#model", Input).value = model
            await pilot.click("#start")
            await wait_for(pilot, lambda: app.servers.managed and app.servers.managed[0].state
                           == "ready", what="stand-in engine ready")  # fmt: skip
            first = app.servers.managed[0]
            url, engine = first.url, first.server
            await wait_for(pilot, lambda: state_of(app, url) == "ready", what="row ready")
            assert logged(app, f"ready at {url}")
            await select(pilot, app, url)
            # kv-fail is offered (opsctl started it) and starts its own engine: this model
            # is refused before any start
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, PickScreen))
            ol = app.screen.query_one(OptionList)
            offered = [ol.get_option_at_index(i).id for i in range(ol.option_count)]
            assert offered == ["invariance", "kv-fail"]
            await pick(pilot, app, "kv-fail")
            await wait_for(pilot, lambda: isinstance(app.screen, ChecksScreen))
            job = app.jobs.jobs[0]
            await wait_for(pilot, lambda: not job.running, what="kv-fail refused")
            assert "cannot serve tiny-mamba" in (job.error or "")
            await pilot.press("escape")
            # restart: cancel, then confirm (same port, a new process)
            await pilot.press("R")
            await confirm(pilot, app, "n")
            assert alive(engine) and len(app.servers.managed) == 1
            await pilot.press("R")
            await confirm(pilot, app, "y")
            await wait_for(pilot, lambda: len(app.servers.managed) == 2
                           and app.servers.managed[1].state == "ready", what="restarted")  # fmt: skip
            second = app.servers.managed[1]
            assert second.url == url and not alive(engine) and alive(second.server)
            # the old run left the fleet and the new one joins it (the next discovery): its
            # row, ready, is what the next key acts on
            await wait_for(pilot, lambda: state_of(app, url) == "ready", what="row after restart")
            await select(pilot, app, url)
            # stop: cancel, then confirm
            await pilot.press("x")
            await confirm(pilot, app, "n")
            assert alive(second.server)
            await pilot.press("x")
            await confirm(pilot, app, "y")
            await wait_for(pilot, lambda: not alive(second.server), what="stopped")
            await wait_for(pilot, lambda: logged(app, "stopped in"))
            await wait_for(pilot, lambda: state_of(app, url) is None, what="stopped run gone")
            # one more, from command mode; the console's exit stops it
            await command(pilot, f"serve {model} --weights real")
            await wait_for(pilot, lambda: len(app.servers.managed) == 3
                           and app.servers.managed[2].state == "ready", what="3rd")  # fmt: skip
            third = app.servers.managed[2].server
            assert third.opts.load_format == "auto" and alive(third)
        assert not alive(third), "the console's exit stops the servers it started"
    finally:
        src.close()


def foreign(label: str, model: Path, orphan: bool = False) -> StandInEngine:
    """A run "another opsctl" started (this test process owns it; orphan: a dead owner)."""
    m = ResolvedModel("tiny-mamba", model, "decoder", False, MAMBA)
    engine = StandInEngine(LaunchOptions(model=m, label=label)).start()
    engine.wait_healthy(30)
    if orphan:
        meta_path = engine.run_dir / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta["owner_pid"], meta["owner_started"] = 999_999_9, 1.0  # nobody
        meta_path.write_text(json.dumps(meta))
    return engine


@pytest.mark.anyio
async def test_another_opsctls_run_is_stopped_not_restarted_orphans_reaped_dead_bundled(home):
    model = home.parent.parent / "tiny-mamba"
    other, orphan = foreign("serve", model), foreign("diag", model, orphan=True)
    src, app = console(home)
    try:
        async with app.run_test(size=(200, 50)) as pilot:
            await wait_for(pilot, lambda: state_of(app, other.url) == "ready"
                           and state_of(app, orphan.url) == "ready", what="both runs")  # fmt: skip
            await select(pilot, app, other.url)
            await pilot.press("R")
            await wait_for(pilot, lambda: logged(app, RESTART_FOREIGN))
            await pilot.press("x")
            await confirm(pilot, app, "n")
            assert alive(other)
            await pilot.press("x")
            await confirm(pilot, app, "y")
            await wait_for(pilot, lambda: other.proc.poll() is not None, what="foreign stop")
            await wait_for(pilot, lambda: logged(app, "1 process(es) stopped"))
            # its engine died under a live owner: a dead row, which offers its bundle
            await wait_for(pilot, lambda: state_of(app, other.url) == "dead", what="dead row",
                           show=lambda: [(v.target.url, v.state) for v in app.last.endpoints])  # fmt: skip
            await wait_for(pilot, lambda: app.table.cells[other.url][COL] == BUNDLE_NOTE)
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DetailScreen))
            block = app.screen.query_one("#d-actions")
            await wait_for(pilot, lambda: "forensics bundle" in str(block.render()))
            await pilot.press("b")
            await wait_for(pilot, lambda: logged(app, f"bundle of {other.run_dir.name}"))
            await pilot.press("escape")
            out = Path.cwd() / f"opsctl-bundle-{other.run_dir.name}.tar.gz"
            top = other.run_dir.name
            with tarfile.open(out) as tar:
                names = {n.split("/", 1)[1] for n in tar.getnames()}
                view = json.loads(tar.extractfile(f"{top}/collected/console.json").read())
            assert {"meta.json", "server.log", "collected/console.json"} <= names
            assert view["state"] == "dead" and view["url"] == other.url
            # runs clean: the orphan is listed in the question; n keeps it, y reaps it
            await pilot.press("c")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert orphan.run_dir.name in str(app.screen.query_one("#detail").render())
            await confirm(pilot, app, "n")
            assert alive(orphan)
            await command(pilot, "runs clean")
            await confirm(pilot, app, "y")
            await wait_for(pilot, lambda: orphan.proc.poll() is not None, what="reaped")
            await wait_for(pilot, lambda: logged(app, "runs clean: 1 reaped, 0 pruned"))
            # a reaped run is found no more: it leaves the fleet
            await wait_for(pilot, lambda: state_of(app, orphan.url) is None, what="reaped row")
    finally:
        src.close()
        for e in (other, orphan):
            if e.proc is not None:
                e.proc.kill()
                e.proc.wait()
