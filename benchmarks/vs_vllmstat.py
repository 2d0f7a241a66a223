"""`opsctl console` beside vllmstat's TUI on one idle real vLLM server, side by side in
one run (issue 26 item 5: "on one idle real server the console stays below vllmstat's
CPU").

One run: starts one bare tiny-llama vLLM server (CPU vLLM, dummy weights, 127.0.0.1,
through the engine lock: tests/bare_vllm.py) and waits until /health answers; starts
both TUIs at the same time, each in its own real terminal (a tmux session, 200x50, on a
tmux server of our own socket):

- `opsctl console --no-discover --interval 1s URL` (discovery off so that it watches
  this one server, not the other engines on the host);
- `vllmstat -u URL` with every default (1 s refresh, GPU sampling on, no log tail,
  no proxy): polls /metrics once a second (/v1/models once), parses it with
  prometheus_client's parser, and each tick also samples GPUs (here: no DRM cards, so it
  tries `import pynvml` and looks for nvidia-smi on PATH every tick, finds neither).

When both screens show the server up (the console's row `ready`, vllmstat's
`● connected`), a warm-up (default 10 s), then one
measuring window (default 60 s) for both: CPU time (user + system) of each process tree
(children included, reaped ones too), RSS of the tree (peak of samples every 5 s),
requests each made to the server in the window (from the server's access log, matched
by each tree's client ports), and the load average. Then one screen of each (tmux
capture-pane). Stops what it started (tmux server, vLLM server) on exit, on Ctrl-C
(exit 130), SIGTERM and errors.

    VLLMSTAT=/tmp/vstat/bin/vllmstat .venv/bin/python benchmarks/vs_vllmstat.py \
        [--duration 60] [--warmup 10] [--url URL]

vllmstat 0.9.1 in its own venv:
`python3.11 -m venv /tmp/vstat && /tmp/vstat/bin/pip install -q vllmstat==0.9.1`.
`--url URL` watches a server that is already running (no engine start, no poll counts).
`benchmarks/console_scale.py --real` runs the same (``side_by_side``; its window is
console_scale's --duration). This file is the one home of the real-server comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OPSCTL_ENGINE_LOCK", "/tmp/opsctl-engine.lock")

from tests.waiting import wait_until  # noqa: E402

COLS, ROWS = 200, 50
ACCESS = re.compile(r"127\.0\.0\.1:(\d+) - \"GET (/\S*) HTTP")


def say(msg: str) -> None:
    print(f"vs_vllmstat: {msg}", file=sys.stderr, flush=True)


def vllmstat_exe() -> str:
    exe = os.environ.get("VLLMSTAT") or shutil.which("vllmstat") or "/tmp/vstat/bin/vllmstat"
    if not Path(exe).exists():
        raise SystemExit(
            "opsctl: error: vllmstat not found\n"
            "hint: python3.11 -m venv /tmp/vstat && /tmp/vstat/bin/pip install vllmstat==0.9.1"
        )
    return exe


def dist_version(python: str, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return r.stdout.strip() or "?"


class Tmux:
    """A tmux server on a socket of our own: kill-server ends only what we started."""

    def __init__(self) -> None:
        self.sock = f"opsctl-vs-vllmstat-{os.getpid()}"
        fd, conf = tempfile.mkstemp(prefix="vs-vllmstat-", suffix=".tmux.conf")
        with os.fdopen(fd, "w") as fh:
            fh.write("set -g status off\nset -g remain-on-exit on\nset -g history-limit 0\n")
        self.conf = conf
        self.pids: list[int] = []
        self.socket_path: str | None = None

    def run(self, *args: str) -> str:
        argv = ["tmux", "-L", self.sock, "-f", self.conf, *args]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:6])}...: {r.stderr.strip()}")
        return r.stdout

    def start(self, name: str, argv: list[str]) -> psutil.Process:
        self.run("new-session", "-d", "-s", name, "-x", str(COLS), "-y", str(ROWS), "--", *argv)
        pid, path = self.run(
            "display-message", "-p", "-t", name, "#{pane_pid} #{socket_path}"
        ).split()
        self.socket_path = path
        self.pids.append(int(pid))
        return psutil.Process(int(pid))

    def screen(self, name: str) -> str:
        return self.run("capture-pane", "-p", "-t", name)

    def dead(self, name: str) -> bool:
        return self.run("display-message", "-p", "-t", name, "#{pane_dead}").strip() == "1"

    def close(self) -> None:
        procs = []
        for pid in self.pids:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                procs += [p, *p.children(recursive=True)]
        with contextlib.suppress(Exception):
            self.run("kill-server")
        _, alive = psutil.wait_procs(procs, timeout=5)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        for path in (self.conf, self.socket_path):
            with contextlib.suppress(OSError, TypeError):
                os.unlink(path)


@dataclass
class Tool:
    name: str
    version: str
    argv: list[str]
    interval: str
    proc: psutil.Process | None = None
    cpu0: float = 0.0
    cpu1: float = 0.0
    rss_peak: int = 0
    nprocs: int = 0
    ports: set[int] = field(default_factory=set)

    def tree(self) -> list[psutil.Process]:
        assert self.proc is not None
        return [self.proc, *self.proc.children(recursive=True)]

    def cpu(self) -> float:
        """User + system seconds of the live tree, plus children it has reaped."""
        total = 0.0
        for i, p in enumerate(self.tree()):
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
                if i == 0:
                    total += t.children_user + t.children_system
        return total

    def sample(self, server_port: int | None) -> None:
        rss, n = 0, 0
        for p in self.tree():
            with contextlib.suppress(psutil.Error):
                rss += p.memory_info().rss
                n += 1
                if server_port is not None:
                    for c in p.net_connections(kind="tcp"):
                        if c.raddr and c.raddr.port == server_port:
                            self.ports.add(c.laddr.port)
        self.rss_peak = max(self.rss_peak, rss)
        self.nprocs = max(self.nprocs, n)


@dataclass
class Server:
    url: str
    port: int
    log: Path | None


class NoServer(Exception):
    pass


@contextlib.contextmanager
def vllm_server(url: str | None) -> Iterator[Server]:
    if url:
        import httpx

        url = url.rstrip("/")
        try:
            up = httpx.get(f"{url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            up = False
        if not up:
            raise NoServer(f"no vLLM server answered /health at {url}")
        yield Server(url, int(url.rsplit(":", 1)[1]), None)
        return
    from opsctl.engine.model import resolve
    from tests.bare_vllm import bare_vllm

    lock = os.environ["OPSCTL_ENGINE_LOCK"]
    with open(lock, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for the engine lock ({lock}): another engine is running")
    say("starting a bare tiny-llama vLLM server (dummy weights) ...")
    t0 = time.monotonic()
    with bare_vllm(str(resolve("tiny-llama").path), load_format="dummy") as s:
        say(f"server healthy at {s.url} after {time.monotonic() - t0:.0f} s")
        yield Server(s.url, s.port, s.log_path)


def log_size(server: Server) -> int:
    return server.log.stat().st_size if server.log else 0


def requests_in(server: Server, start: int, end: int) -> dict[int, int]:
    """Client port -> GET requests logged between two offsets of the server's log."""
    if server.log is None:
        return {}
    with open(server.log, "rb") as fh:
        fh.seek(start)
        text = fh.read(end - start).decode(errors="replace")
    counts: dict[int, int] = {}
    for m in ACCESS.finditer(text):
        counts[int(m.group(1))] = counts.get(int(m.group(1)), 0) + 1
    return counts


def excerpt(screen: str, port: int, n: int = 5) -> list[str]:
    """Up to n lines of a screen that carry the server's data, else its first lines."""
    lines = [ln.rstrip() for ln in screen.splitlines() if ln.strip()]
    keys = (str(port), "tiny-llama", "KV", "kv", "running", "waiting", "idle", "healthy")
    picked = [i for i, ln in enumerate(lines) if any(k in ln for k in keys)][:n]
    picked += [i for i in range(len(lines)) if i not in picked][: max(0, 3 - len(picked))]
    return [lines[i] for i in sorted(picked)]


def showing(screen: str, port: int) -> bool:
    """A line naming the server's port that says it is up: the console's row `ready`,
    vllmstat's header `● connected`."""
    return any(
        str(port) in ln and (re.search(r"\bready\b", ln) or "● connected" in ln)
        for ln in screen.splitlines()
    )


def measure(duration: float, warmup: float, tmux: Tmux, server: Server) -> None:
    vs = vllmstat_exe()
    vs_python = str(Path(vs).parent / "python")
    tools = [
        Tool(
            "opsctl console",
            importlib.metadata.version("opsctl"),
            [
                sys.executable,
                "-m",
                "opsctl",
                "console",
                "--no-discover",
                "--interval",
                "1s",
                server.url,
            ],
            "1 s",
        ),
        Tool("vllmstat", dist_version(vs_python, "vllmstat"), [vs, "-u", server.url], "1 s"),
    ]
    for t in tools:
        t.proc = tmux.start(t.name.split()[-1], t.argv)
        say(f"{t.name}: pid {t.proc.pid} in tmux session {t.name.split()[-1]!r}")

    def drawn() -> bool:
        for t in tools:
            if tmux.dead(t.name.split()[-1]):
                raise RuntimeError(f"{t.name} exited: {tmux.screen(t.name.split()[-1])[-2000:]}")
        return all(showing(tmux.screen(t.name.split()[-1]), server.port) for t in tools)

    wait_until(drawn, 120, "both screens to show the server up", every=0.5)
    say(f"both drawing; warm-up {warmup:g} s")
    time.sleep(warmup)  # the warm-up is a time span by design, not a wait for a state

    say(f"measuring {duration:g} s ...")
    load0 = os.getloadavg()
    off0 = log_size(server)
    for t in tools:
        t.sample(server.port)
        t.cpu0 = t.cpu()
    t0 = time.monotonic()
    end = t0 + duration
    while (now := time.monotonic()) < end:
        time.sleep(min(5.0, end - now))  # the window is a time span by design
        for t in tools:
            if not t.proc.is_running() or tmux.dead(t.name.split()[-1]):
                raise RuntimeError(f"{t.name} exited during the window")
            t.sample(server.port)
    for t in tools:
        t.cpu1 = t.cpu()
    window = time.monotonic() - t0
    off1 = log_size(server)
    load1 = os.getloadavg()
    counts = requests_in(server, off0, off1)
    screens = {t.name: tmux.screen(t.name.split()[-1]) for t in tools}

    what = "One idle bare tiny-llama vLLM server" if server.log else "The server at --url"
    print(f"\n{what} ({server.url}), both TUIs at once, "
          f"{window:.0f} s window after {warmup:g} s warm-up, {COLS}x{ROWS} tmux panes\n")  # fmt: skip
    print("| tool | version | interval | CPU % of a core | CPU ms per s | RSS MiB | processes "
          "| requests to the server in the window |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for t in tools:
        cpu = 100 * (t.cpu1 - t.cpu0) / window
        reqs = sum(counts.get(p, 0) for p in t.ports) if server.log else None
        rq = f"{reqs} ({reqs / window:.2f}/s)" if reqs is not None else "n/a"
        print(f"| {t.name} | {t.version} | {t.interval} | {cpu:.2f} | {cpu * 10:.1f} "
              f"| {t.rss_peak / 2**20:.0f} | {t.nprocs} | {rq} |")  # fmt: skip
    if server.log:
        mine = set().union(*(t.ports for t in tools))
        other = sum(n for port, n in counts.items() if port not in mine)
        print(f"\nrequests in the window from client ports matched to neither tree: {other}")
    print(
        f"\nload average (1, 5, 15 min): start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}, "
        f"end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}; {psutil.cpu_count()} cores"
    )
    print(
        f"textual: opsctl's {importlib.metadata.version('textual')}, "
        f"vllmstat's {dist_version(vs_python, 'textual')}"
    )
    for t in tools:
        print(f"\n{t.name} screen (excerpt):")
        for line in excerpt(screens[t.name], server.port):
            print(f"    {line}")


def _sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def side_by_side(duration: float = 60.0, warmup: float = 10.0, url: str | None = None) -> int:
    """One run (the module's docstring); the exit code: 0, 1 failed, 2 bad input, 3 no
    server at ``url``, 130 interrupted."""
    if duration <= 0 or warmup < 0:
        print("opsctl: error: --duration must be > 0 and --warmup >= 0", file=sys.stderr)
        return 2
    if not shutil.which("tmux"):
        print("opsctl: error: tmux not found", file=sys.stderr)
        return 2
    vllmstat_exe()
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGHUP, _sigterm)
    try:
        with vllm_server(url) as server:
            tmux = Tmux()
            try:
                measure(duration, warmup, tmux, server)
            finally:
                tmux.close()
    except KeyboardInterrupt:
        say("interrupted; stopped what was started")
        return 130
    except NoServer as e:
        print(f"opsctl: error: {e}", file=sys.stderr)
        return 3
    except (RuntimeError, AssertionError, TimeoutError) as e:
        print(f"opsctl: error: {e}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="measuring window (s)")
    ap.add_argument("--warmup", type=float, default=10.0, help="after both draw (s)")
    ap.add_argument("--url", default=None, help="a running vLLM server (no engine start)")
    args = ap.parse_args()
    return side_by_side(args.duration, args.warmup, args.url)


if __name__ == "__main__":
    sys.exit(main())
