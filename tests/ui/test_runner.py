"""The one Textual runner (opsctl.ui.runner) in a real terminal (a pty): a Textual app
run by it in a child process, idle in its event loop, gets SIGTERM; the app's
on_stop_signal hook runs, the app exits within seconds (the loop is woken, not left
asleep in select) and the process ends with Terminated, as every opsctl TUI does."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.waiting import wait_until

CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from textual.app import App
    from textual.widgets import Static
    from opsctl.engine import lifetime
    from opsctl.ui.runner import run_app

    marks = Path(sys.argv[1])

    class Idle(App):
        def compose(self):
            yield Static("idle")

        def on_ready(self):
            (marks / "ready").touch()

        def on_stop_signal(self):
            (marks / "hook").touch()

    lifetime.install()
    try:
        run_app(Idle())
    except lifetime.Terminated as exc:
        (marks / "terminated").write_text(str(exc))
        sys.exit(130)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_runs_the_hook_and_exits_the_app(tmp_path, sig):
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "80", "LINES": "24"}
    p = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        stdin=follower, stdout=follower, stderr=follower, env=env, start_new_session=True,
    )  # fmt: skip
    os.close(follower)

    def drain() -> None:  # the terminal's output, read so the app never blocks on it
        while True:
            try:
                if not os.read(leader, 65536):
                    return
            except OSError:
                return

    threading.Thread(target=drain, daemon=True).start()
    try:
        wait_until(lambda: (tmp_path / "ready").exists() or p.poll() is not None, 60, "ready")
        assert p.poll() is None, "the app ended before the signal"
        t0 = time.monotonic()
        p.send_signal(sig)
        rc = p.wait(30)
        took = time.monotonic() - t0
        assert rc == 130 and (tmp_path / "hook").exists(), rc
        assert (tmp_path / "terminated").read_text() == sig.name
        assert took < 15, took  # woken at once, not after a select timeout
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
