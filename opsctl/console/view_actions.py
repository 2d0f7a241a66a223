"""The console's actions on the UI side: keys, ``:`` commands, modals, notifications.

The work itself is opsctl.console.actions / servers (no Textual there); it runs in
worker threads (checks in their own threads, the rest in Textual thread workers), and
the UI thread only renders what they report.

Every action is refused under ``--readonly`` (and in a replay); stop, restart, reaping
and the admin calls that change a server (reset_prefix_cache, sleep, pause, ...) ask
first in a :class:`~opsctl.console.view_modals.ConfirmScreen`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.message import Message

from opsctl.console import actions as act
from opsctl.console import servers as console_servers
from opsctl.console import verbs
from opsctl.console.judge import EndpointView
from opsctl.console.view_checks import ChecksScreen
from opsctl.console.view_modals import ConfirmScreen, PickScreen, StartServerScreen
from opsctl.domain import admin_routes as adm
from opsctl.errors import OpsctlError


class JobEvent(Message):
    """A check job's new progress snapshot, posted from its thread to the app."""

    def __init__(self, job: act.CheckJob, snap: dict[str, Any]) -> None:
        super().__init__()
        self.job = job
        self.snap = snap


class ServerChanged(Message):
    """A server this console manages changed state (starting, ready, failed)."""

    def __init__(self, managed: console_servers.Managed) -> None:
        super().__init__()
        self.managed = managed


class ActionsMixin:
    """Mixed into ConsoleApp (which provides readonly, jobs, servers, api_key, last)."""

    readonly: bool
    jobs: act.Jobs
    servers: console_servers.ServerManager
    api_key: str | None
    action_log: list[str]

    # ---- helpers -------------------------------------------------------------------------
    def say(self, text: str, ok: bool = True) -> None:
        """Notify ``text`` (an error when not ``ok``) and keep it in the action log (last 200)."""
        self.action_log.append(text)
        del self.action_log[:-200]
        self.notify(text, severity="information" if ok else "error", timeout=4 if ok else 15)  # type: ignore[attr-defined]

    def allowed(self, what: str) -> bool:
        """Whether ``what`` may run; under --readonly or in a replay, say why not and refuse."""
        if self.readonly:
            why = "this is a replay" if getattr(self, "replaying", False) else "--readonly"
            self.say(f"readonly: {what} is disabled ({why})", ok=False)
            return False
        return True

    def selected_view(self) -> EndpointView | None:
        """The endpoint under the fleet table's cursor, or None (then say to select one)."""
        url = self.selected_url()  # type: ignore[attr-defined]
        last = self.last  # type: ignore[attr-defined]
        view = next((v for v in last.endpoints if v.target.url == url), None) if last else None
        if view is None:
            self.say("select an endpoint first (↑/↓ in the fleet table)", ok=False)
        return view

    def background(self, work: Callable[[], str], ok_prefix: str = "") -> None:
        """``work()`` in a thread worker; its line (or its error) as a notification."""

        def run() -> None:
            try:
                text, ok = ok_prefix + work(), True
            except OpsctlError as exc:
                text, ok = exc.message + (f" (hint: {exc.hint})" if exc.hint else ""), False
            except Exception as exc:  # shown, never raised in the UI
                text, ok = f"{type(exc).__name__}: {exc}", False
            self.call_from_thread(self.say, text, ok)  # type: ignore[attr-defined]

        self.run_worker(run, thread=True, group="actions")  # type: ignore[attr-defined]

    def confirm(self, question: str, detail: str, then: Callable[[], None]) -> None:
        """Ask ``question`` in a ConfirmScreen; run ``then`` on yes, say "cancelled" otherwise."""

        def answered(yes: bool | None) -> None:
            if yes:
                then()
            else:
                self.say(f"cancelled: {question}", ok=True)

        self.push_screen(ConfirmScreen(question, detail), answered)  # type: ignore[attr-defined]

    def _model_path(self, view: EndpointView) -> str | None:
        m = self.servers.owned(view.target.url)
        return str(m.server.opts.model.path) if m and m.server else None  # type: ignore[attr-defined]

    # ---- checks --------------------------------------------------------------------------
    def action_run_check(self) -> None:
        """Pick a check that applies to the selected endpoint and start it (``d``)."""
        if not self.allowed("running a check") or (view := self.selected_view()) is None:
            return
        ours = self.servers.owned(view.target.url) is not None
        choices = act.applicable(view, ours=ours, model_path=self._model_path(view))

        def picked(name: str | None) -> None:
            choice = next((c for c in choices if c.name == name), None)
            if choice is not None:
                self.start_check(view, choice)

        options = [(c.name, f"{c.title}: {c.why}") for c in choices]
        title = f"run a check on {view.target.name}"
        self.push_screen(PickScreen(title, options), picked)  # type: ignore[attr-defined]

    def start_check(self, view: EndpointView, choice: act.CheckChoice) -> None:
        """Start ``choice`` on ``view`` as a job and show it in the checks screen."""
        try:
            call = act.check_call(choice, view, self.api_key, self._model_path(view))
        except OpsctlError as exc:
            self.say(exc.message, ok=False)
            return
        job = self.jobs.start(choice, view, call)
        self.say(f"{choice.title} started on {view.target.name} (j: checks)")
        self.push_screen(ChecksScreen(self.jobs.jobs, show=job.id))  # type: ignore[attr-defined]

    def action_checks(self) -> None:
        """Show the checks screen (``j``), unless it is on screen already."""
        if not isinstance(self.screen, ChecksScreen):  # type: ignore[attr-defined]
            self.push_screen(ChecksScreen(self.jobs.jobs))  # type: ignore[attr-defined]

    def on_job_event(self, message: JobEvent) -> None:
        """Pass a job's snapshot to the checks screen; say the verdict once the job has finished."""
        from textual.app import ScreenStackError

        try:
            screen = self.screen  # type: ignore[attr-defined]
        except ScreenStackError:  # a check's last event after the app closed its screens
            return
        if isinstance(screen, ChecksScreen):
            screen.on_job_event(message.job, message.snap)
        job = message.job
        if not job.running:
            self.say(f"{job.check.title} on {job.endpoint}: {job.note()}", ok=job.verdict == "pass")
        self.tick()  # type: ignore[attr-defined]

    # ---- servers -------------------------------------------------------------------------
    def action_new_server(self) -> None:
        """Ask for a server to start (the StartServerScreen form) and start it."""
        if not self.allowed("starting a server"):
            return
        from opsctl.embedded.catalog import CATALOG

        def submitted(req: console_servers.StartRequest | None) -> None:
            if req is not None:
                self.serve(req)

        self.push_screen(StartServerScreen(list(CATALOG), self.api_key), submitted)  # type: ignore[attr-defined]

    def serve(self, req: console_servers.StartRequest) -> None:
        """Start the server ``req`` asks for; it stops when the console exits."""
        self.servers.start(req)
        self.say(f"starting {req.model} ({req.weights} weights); it stops with the console")

    def on_server_changed(self, message: ServerChanged) -> None:
        """Say what became of a managed server: starting at its URL, ready, or failed."""
        m = message.managed
        if m.state == "ready":
            self.say(f"{m.request.model} ready at {m.url} after {m.seconds or 0:.0f} s")
        elif m.state == "failed":
            self.say(f"{m.request.model} did not start: {m.error}", ok=False)
        elif m.state == "starting" and m.url:
            self.say(f"{m.request.model} starting at {m.url} (run {m.run_dir})")
        self.tick()  # type: ignore[attr-defined]

    def action_stop_server(self) -> None:
        """Stop the selected server after a confirm: one this console started, or an opsctl run.

        A server not started by opsctl (no run directory) is refused.
        """
        if not self.allowed("stopping a server") or (view := self.selected_view()) is None:
            return
        m = self.servers.owned(view.target.url)
        if m is not None:
            detail = f"{m.request.model}, started by this console (run {m.run_dir})"
            self.confirm(f"stop {view.target.url}?", detail,
                         lambda: self.background(lambda: self.servers.stop_owned(m)))  # fmt: skip
        elif view.target.run_dir:
            run = view.target.run_dir
            detail = f"run {run}: its engine processes (pid and start time from meta.json)"
            self.confirm(f"stop {view.target.url}?", detail,
                         lambda: self.background(lambda: console_servers.stop_foreign(run)))  # fmt: skip
        else:
            self.say(f"{view.target.name} was not started by opsctl: opsctl stops only "
                     "servers it started (they have a run directory)", ok=False)  # fmt: skip

    def action_restart_server(self) -> None:
        """Restart the selected server on its port after a confirm (one this console started)."""
        if not self.allowed("restarting a server") or (view := self.selected_view()) is None:
            return
        m = self.servers.owned(view.target.url)
        if m is None:
            self.say(console_servers.RESTART_FOREIGN, ok=False)
            return

        def restart() -> str:
            new = self.servers.restart_owned(m)
            return f"restarting {new.request.model} on port {new.request.port}"

        detail = f"{m.request.model}: stopped, then started again on the same port"
        self.confirm(f"restart {view.target.url}?", detail, lambda: self.background(restart))

    def action_reap(self, older_than: float = float("inf")) -> None:
        """Reap orphaned engines (and prune runs older than ``older_than``) after a confirm."""
        if not self.allowed("reaping orphaned engines"):
            return

        def plan() -> None:
            rows = act.reap_plan()
            self.call_from_thread(self._confirm_reap, rows, older_than)  # type: ignore[attr-defined]

        self.run_worker(plan, thread=True, group="actions")  # type: ignore[attr-defined]

    def _confirm_reap(self, rows: list[dict[str, Any]], older_than: float) -> None:
        prune = older_than != float("inf")
        if not rows and not prune:
            self.say("runs clean: no orphaned engine to reap")
            return
        names = "\n".join(f"  {r['name']}: pids {r['alive_pids']} ({r['reason']})" for r in rows)
        what = f"reap {len(rows)} orphaned engine(s)" + (" and prune old runs" if prune else "")

        def work() -> str:
            rep = act.reap(older_than=older_than)
            doc = rep.to_dict()
            text = f"runs clean: {len(doc['reaped'])} reaped, {len(doc['pruned'])} pruned"
            if rep.failure:
                raise OpsctlError(f"{text}; {rep.failure}")
            return text

        self.confirm(f"{what}?", names or "(no orphan now)", lambda: self.background(work))

    # ---- admin, bundle -------------------------------------------------------------------
    def action_admin(self) -> None:
        """Pick a vLLM admin route and call it on the selected endpoint (``a``)."""
        if not self.allowed("admin calls") or (view := self.selected_view()) is None:
            return
        options = [
            (r.name, f"{r.method} {r.path}: {r.what}" + (" [dev mode]" if r.dev else ""))
            for r in adm.ROUTES.values()
        ]
        note = f"[dev mode]: only with {adm.DEV_ENV} (vLLM {adm.RULES_FROM})"

        def picked(name: str | None) -> None:
            if name:
                self.admin(view, name)

        title = f"vLLM admin call on {view.target.name}"
        self.push_screen(PickScreen(title, options, note), picked)  # type: ignore[attr-defined]

    def admin(self, view: EndpointView, name: str) -> None:
        """Call admin route ``name`` on ``view`` in the background (confirmed if destructive)."""
        try:
            r = adm.route(name)
        except KeyError as exc:
            self.say(str(exc.args[0]), ok=False)
            return

        def work() -> str:
            out = act.admin(view, r.name, self.api_key)
            if not out.ok:
                raise OpsctlError(f"{view.target.name}: {out.text}")
            return f"{view.target.name}: {out.text}"

        if r.destructive:
            detail = r.what + "".join(f"\n{x}" for x in (r.caveat, r.refused) if x)
            self.confirm(f"{r.method} {r.path} on {view.target.url}?", detail,
                         lambda: self.background(work))  # fmt: skip
        else:
            self.background(work)

    def action_stacks(self) -> None:
        """Take the selected endpoint's stacks now; the drill-in shows them.

        Read-only: allowed under --readonly, not in a replay.
        """
        view = self.selected_view()
        if view is None:
            return
        if getattr(self, "replaying", False):
            self.say("a replay has no processes to take stacks of", ok=False)
            return
        why = self.stall_stacks.take_now(view)  # type: ignore[attr-defined]
        if why is not None:
            self.say(why, ok=False)
        else:
            self.say(f"taking the stacks of {view.target.name} (drill in: Enter)")

    def action_bundle(self, out: Path | None = None) -> None:
        """Write the forensics bundle of the selected endpoint's run (to ``out`` when given)."""
        if (view := self.selected_view()) is None:
            return

        def work() -> str:
            doc = act.bundle(view, self.api_key, out).to_dict()
            return f"bundle of {doc['run']}: {doc['out']} ({doc['size_bytes']} bytes)"

        self.background(work)

    # ---- command mode --------------------------------------------------------------------
    def run_command(self, text: str) -> None:
        """Run a ``:`` command (quit, help, checks, stop, restart, diag, serve, runs-*, admin)."""
        try:
            cmd = verbs.parse(text)
        except OpsctlError as exc:
            self.say(exc.message, ok=False)
            return
        a = cmd.args
        simple = {
            "quit": self.exit,  # type: ignore[attr-defined]
            "help": self.action_help,  # type: ignore[attr-defined]
            "checks": self.action_checks,
            "stop": self.action_stop_server,
            "restart": self.action_restart_server,
        }
        if cmd.verb in simple:
            simple[cmd.verb]()
        elif cmd.verb == "diag":
            self._diag_command(a["check"])
        elif cmd.verb == "serve" and self.allowed("starting a server"):
            try:
                self.serve(console_servers.StartRequest(api_key=self.api_key, **a))
            except OpsctlError as exc:
                self.say(exc.message, ok=False)
        elif cmd.verb == "runs-clean":
            self.action_reap(a.get("older_than", float("inf")))
        elif cmd.verb == "runs-bundle":
            self.action_bundle(a.get("out"))
        elif cmd.verb == "admin" and self.allowed("admin calls"):
            view = self.selected_view()
            if view is not None:
                self.admin(view, a["route"])

    def _diag_command(self, name: str) -> None:
        if not self.allowed("running a check") or (view := self.selected_view()) is None:
            return
        ours = self.servers.owned(view.target.url) is not None
        try:
            choice = act.choose(view, name, ours=ours, model_path=self._model_path(view))
        except OpsctlError as exc:
            self.say(exc.message, ok=False)
            return
        self.start_check(view, choice)
