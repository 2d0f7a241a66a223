"""One vLLM OpenAI API server child process: start, wait for health, stop cleanly.

The server runs in its own session (process group). ``stop()`` sends SIGTERM to the
API server (vLLM then shuts its EngineCore and workers down and its resource tracker
unlinks the shm_broadcast ring buffers), escalates to SIGTERM/SIGKILL of every
descendant and the group within ``grace`` seconds, verifies with psutil that nothing
is left, and removes /dev/shm segments the run created that no live process maps.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

from engine_patches import knobs
from opsctl import paths
from opsctl.collectors import engine_tmp, http, shm
from opsctl.collectors.jsonfile import json_object
from opsctl.domain import deaths, ranks, serverlog
from opsctl.engine import lifetime
from opsctl.engine.model import ResolvedModel
from opsctl.engine.registry import EngineRegistry, process_engines
from opsctl.errors import BadInput, EngineDied, OpsTimeout

API_MODULE = "vllm.entrypoints.openai.api_server"
_OWNER_STARTED = psutil.Process().create_time()


@dataclass
class LaunchOptions:
    """How to start a server: model, load format, host, port, extra args and environment."""

    model: ResolvedModel
    load_format: str = "auto"
    host: str = "127.0.0.1"
    port: int | None = None  # None: a free port
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    disable_patches: list[str] = field(default_factory=list)
    max_model_len: int = 256
    max_num_seqs: int = 8
    run_dir: Path | None = None
    label: str = "serve"
    enforce_eager: bool = True  # False: vLLM's default execution mode (torch.compile / graphs)
    # True: the model runs inside the EngineCore process (vLLM's uni executor), as vLLM
    # runs one GPU by default; vLLM's CPU platform otherwise forces a separate Worker
    # process (mp executor), a spawn + `import vllm` (~8 s on 2 cores) per start. Check
    # engines use it; `opsctl serve` keeps vLLM's layout unless asked (--single-process).
    single_process: bool = False
    api_key: str | None = None  # given to vLLM (VLLM_API_KEY) and used for opsctl's own requests
    # ranks: tensor- and data-parallel sizes (vLLM's --tensor-parallel-size and
    # --data-parallel-size); more than one rank runs vLLM's multiprocess layout
    tp: int = 1
    dp: int = 1
    # test-only knobs (engine_patches.knobs.KNOBS): the only way a knob reaches an engine;
    # knobs in the inherited environment are stripped
    knobs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StopReport:
    """What stopping a server did: signals, survivors, segments removed, exit code."""

    seconds: float
    signals: list[str]
    leftover_pids: list[int]
    shm_removed: list[str]
    shm_kept: list[str]
    exit_code: int | None
    tmp_kept: str | None = None  # why the engine's private $TMPDIR was left, if it was


# /health is polled this often while an engine starts: a cheap local GET, and every
# 100 ms saved at the end of a start is saved by every engine a check or test starts
HEALTH_POLL_S = 0.1
TICK_S = 0.5  # process tree walk and progress callback while starting
KILL_WAIT_S = 30.0  # the longest wait for SIGKILLed processes to exit
TRACK_WHILE_STOPPING_S = 0.5  # how often a stop notes the segments its processes map
STARTING_POLITE_S = 3.0  # vLLM's own shutdown of a server not healthy yet, before SIGTERMs
PORT_RETRIES = 2  # new ports tried when the chosen one was taken before the server bound it


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (what ``bind(0)`` hands out)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


_PICK = random.SystemRandom()  # never a seeded stream two processes could share
# ports below the ephemeral range: many thousands, and only explicit binds take them
_PICK_SPAN = 16384


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for a server that binds it seconds later.

    vLLM's imports take ~10 s. Chosen below the kernel's ephemeral range: a port from
    ``bind(0)`` is one the kernel hands again to the next ``bind(0)`` or outgoing connection
    anywhere on the machine (vLLM's own ZMQ and torch.distributed ports are chosen that
    way), so a busy machine takes it before our server binds it. Below the range only
    explicit binds compete, at random over ~16k ports. Falls back to ``bind(0)`` where that
    range is too small."""
    lo = _ephemeral_low()
    first = max(1024, lo - _PICK_SPAN)
    if lo - first >= 1024:
        for _ in range(64):
            port = _PICK.randrange(first, lo)
            if port_free(host, port):
                return port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def reachable_url(host: str, port: int) -> str:
    """A URL an operator can use for a server bound to ``host``.

    For a wildcard bind, this machine's name (the bound 0.0.0.0 is no address to connect to
    from elsewhere)."""
    from opsctl.domain.exposure import is_wildcard

    if is_wildcard(host):
        host = socket.getfqdn() or socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def has_gpu() -> bool:
    """Whether this machine has an NVIDIA or AMD GPU device."""
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")


def new_run_dir(label: str, model: str, port: int) -> Path:
    """Make a new, unique run directory for a server of ``model`` on ``port``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = paths.runs_dir()
    base.mkdir(parents=True, exist_ok=True)
    for i in range(1000):
        d = base / (f"{stamp}-{label}-{model}-{port}" + ("" if i == 0 else f"-{i}"))
        try:
            d.mkdir()
            return d
        except FileExistsError:
            continue
    raise BadInput(f"cannot create a run directory under {base}")


def build_argv(opts: LaunchOptions, port: int) -> list[str]:
    """The command line that starts vLLM's OpenAI API server for ``opts`` on ``port``."""
    argv = [
        sys.executable,
        "-m",
        API_MODULE,
        "--model",
        str(opts.model.path),
        "--served-model-name",
        opts.model.name,
        "--load-format",
        opts.load_format,
        "--max-model-len",
        str(opts.max_model_len),
        "--max-num-seqs",
        str(opts.max_num_seqs),
        *(
            ["--enforce-eager"]
            if opts.enforce_eager and "--enforce-eager" not in opts.extra_args
            else []
        ),
        "--host",
        opts.host,
        "--port",
        str(port),
    ]
    if not has_gpu():
        argv += ["--dtype", "float32", "--gpu-memory-utilization", "0.5"]
    if opts.tp > 1:
        argv += ["--tensor-parallel-size", str(opts.tp)]
    if opts.dp > 1:
        argv += ["--data-parallel-size", str(opts.dp)]
    if single_process(opts) and not has_gpu():  # one GPU runs "uni" by default
        argv += ["--distributed-executor-backend", "uni"]
    return argv + list(opts.extra_args)


def with_rank_args(opts: LaunchOptions) -> LaunchOptions:
    """``opts`` with vLLM's own rank flags among its extra arguments read as its ranks.

    ``--tensor-parallel-size``/``-tp`` and ``--data-parallel-size``/``-dp`` move from
    ``extra_args`` to ``tp``/``dp`` (so the thread binding is derived for them too).
    BadInput: a rank given both ways, twice, or below 1."""
    from dataclasses import replace

    from opsctl.domain import rank_flags

    try:
        found = rank_flags.merge(
            None if opts.tp == 1 else opts.tp, None if opts.dp == 1 else opts.dp, opts.extra_args
        )
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return replace(opts, tp=found.tp, dp=found.dp, extra_args=list(found.rest))


def refuse_ranks(opts: LaunchOptions) -> None:
    """BadInput, before anything starts, for ranks vLLM or this machine would refuse.

    A tensor-parallel size the model's heads do not divide (vLLM refuses it), or more
    ranks than CPUs this process may use (on CPU)."""
    from opsctl.domain import rank_flags

    why = rank_flags.head_refusal(opts.model.config, opts.tp, opts.model.name)
    if why:
        hint = rank_flags.divisors_hint(opts.model.config, max(opts.tp, 8))
        raise BadInput(why, hint=f"vLLM refuses it; try {hint}")
    why = rank_flags.dp_refusal(opts.model.config, opts.dp, opts.extra_args)
    if why:
        raise BadInput(why, hint="launch independent servers without --data-parallel-* flags")
    rank_env(opts)  # fewer CPUs than ranks


def layout(opts: LaunchOptions) -> ranks.Layout:
    """The ranks ``opts`` asks for."""
    return ranks.Layout(tp=opts.tp, dp=opts.dp)


def single_process(opts: LaunchOptions) -> bool:
    """Whether the model runs inside the EngineCore: asked for, and one rank only."""
    return opts.single_process and layout(opts).single


def allowed_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def rank_env(opts: LaunchOptions) -> dict[str, str]:
    """The environment several ranks need on this machine (CPU: the thread binding).

    On CPU, vLLM's OpenMP thread binding (one share of the CPUs this process may use per rank; vLLM's automatic binding wants a
    NUMA node per rank). Empty for one rank, on a GPU, or when the operator set a binding.
    BadInput when there are fewer CPUs than ranks."""
    lay = layout(opts)
    if lay.single or has_gpu():
        return {}
    given = opts.env.get("VLLM_CPU_OMP_THREADS_BIND") or os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if given and given != "auto":
        return {}
    try:
        return {"VLLM_CPU_OMP_THREADS_BIND": ranks.cpu_binding(allowed_cpus(), lay)}
    except ValueError as exc:
        raise BadInput(str(exc), hint="ask for fewer ranks (--tp/--dp)") from None


def cpu_worker_threads(env: dict[str, str]) -> int:
    """The OpenMP threads vLLM's CPU Worker process would compute with.

    The CPUs this process may use minus those vLLM reserves for the EngineCore (one, or
    ``VLLM_CPU_NUM_OF_RESERVED_CPU``), at least one. A single-process engine computes with
    as many, so its numerics (reduction order) match vLLM's multiprocess layout."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        reserved = int(env.get("VLLM_CPU_NUM_OF_RESERVED_CPU") or 1)
    except ValueError:
        reserved = 1
    return max(1, cpus - reserved)


def build_env(opts: LaunchOptions, run_dir: Path, tmp_dir: Path | None = None) -> dict[str, str]:
    """The environment of the engine process: ours plus opsctl's and the options' variables."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if tmp_dir is not None:  # vLLM's IPC sockets and rendezvous file: removed at stop
        env.update(engine_tmp.engine_env(tmp_dir))
    env.update(
        {
            "OPSCTL_RUN_DIR": str(run_dir),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    if opts.disable_patches:
        env["OPSCTL_DISABLE_PATCHES"] = ",".join(opts.disable_patches)
    env.pop("OPSCTL_ENGINE_FORK", None)
    env.update(rank_env(opts))
    if single_process(opts) and not has_gpu():  # one GPU runs this layout by default
        # vLLM's CPU platform turns "uni" into "mp" unless this is "0"; the API server's
        # AsyncLLM does not read it (its EngineCore is always a separate process)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # fork the EngineCore as vLLM does on one GPU (engine_patches engine_core_fork)
        env["OPSCTL_ENGINE_FORK"] = "1"
        env["OMP_NUM_THREADS"] = str(cpu_worker_threads({**env, **opts.env}))
    env.update(opts.env)
    env.update(lifetime.owner_env())  # the engine stops itself when this process is gone
    # vLLM reads its API key from VLLM_API_KEY too: an inherited one would lock opsctl out
    # of its own server. The key travels in the environment (not argv: /proc/PID/cmdline
    # is world-readable), and only when given.
    env.pop("VLLM_API_KEY", None)
    if opts.api_key:
        env["VLLM_API_KEY"] = opts.api_key
    return knobs.with_knobs(env, opts.knobs)


def stop_all() -> list[StopReport]:
    """Stop every engine this process started that is not stopped yet (any thread)."""
    return process_engines().stop_all()


def _parent_death_signal(owner_pid: int) -> Callable[[], None]:
    """preexec_fn: SIGTERM the API server when the thread that forked it dies. Covers
    the seconds before the plugin's owner watchdog runs (vLLM imports take ~10 s)."""

    def preexec() -> None:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        # the signal only fires for a death *after* prctl: an owner killed between the
        # fork and here has already left us to init (or a subreaper), so go now
        if os.getppid() != owner_pid:
            os._exit(1)

    return preexec


class EngineServer:
    """A supervised vLLM API server. Use as a context manager to guarantee stop()."""

    def __init__(self, opts: LaunchOptions, registry: EngineRegistry | None = None) -> None:
        self.opts = with_rank_args(opts)  # vLLM's -tp/-dp among extra args are its ranks
        # where this engine is registered while it may run: the process's registry, so
        # every way out of opsctl (a signal, the end of a command) can stop it
        self.registry = registry or process_engines()
        self.proc: subprocess.Popen | None = None
        self.port: int = 0
        self.run_dir: Path | None = None
        self.tmp_dir: Path | None = None  # the engine's private $TMPDIR
        self.started_at: float = 0.0
        self.healthy_at: float | None = None
        self.shm_before: set[str] = set()
        self.shm_seen: set[str] = set()  # segments our processes were seen mapping
        # pid -> create_time of every process of ours seen: a pid the kernel reuses for
        # someone else's process later is told apart by its start time, and never signalled
        self.known_pids: dict[int, float] = {}
        self._log_fh = None
        self.stop_report: StopReport | None = None
        self._lock_fh = None
        self._stop_lock = threading.Lock()
        self._log_from = 0  # where the current launch's output starts in server.log
        self._relaunches = 0

    # ---- start ---------------------------------------------------------------
    @property
    def url(self) -> str:
        """The server's base URL (``http://host:port``)."""
        host = f"[{self.opts.host}]" if ":" in self.opts.host else self.opts.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int:
        """The pid of the API server process; 0 before it started."""
        return self.proc.pid if self.proc else 0

    @property
    def log_path(self) -> Path:
        """The server's log file in its run directory."""
        assert self.run_dir is not None
        return self.run_dir / "server.log"

    def _take_engine_lock(self) -> None:
        if self._lock_fh is None:
            self._lock_fh = self.registry.queue.acquire()

    def _release_engine_lock(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh = None
            self.registry.queue.release()

    def _check_port(self, port: int) -> None:
        if not port_free(self.opts.host, port):
            raise BadInput(f"port {port} on {self.opts.host} is already in use")

    def start(self) -> EngineServer:
        """Start the server: queue for the engine lock, pick the port, launch vLLM."""
        opts = self.opts
        refuse_ranks(opts)  # heads, CPUs, layout: refused before anything starts
        if opts.port is not None:
            if not 0 < opts.port < 65536:
                raise BadInput(f"port {opts.port} is out of range 1..65535")
            self._check_port(opts.port)  # fail fast, before any wait for the lock
        # queue first, pick the port after: a port chosen before a long wait may be gone
        self._take_engine_lock()
        try:
            if opts.port is not None:
                self._check_port(opts.port)  # and again: it may have been taken meanwhile
                self.port = opts.port
            else:
                self.port = free_port(opts.host)
        except BaseException:
            self._release_engine_lock()
            raise
        self.run_dir = opts.run_dir or new_run_dir(opts.label, opts.model.name, self.port)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.shm_before = {f.name for f in shm.list_files()}
        self.tmp_dir = engine_tmp.create(self.run_dir)
        self._log_fh = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.started_at = time.time()
        self._launch()
        return self

    def _launch(self) -> None:
        opts = self.opts
        argv = build_argv(opts, self.port)
        assert self._log_fh is not None
        self._log_from = self._log_fh.tell()
        # the parent-death signal fires when the forking *thread* exits: only from the
        # main thread (a worker thread may end long before the engine should)
        pdeath = (
            threading.current_thread() is threading.main_thread()
            and knobs.NO_OWNER_WATCH not in opts.knobs
        )
        self.registry.add(self)
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_fh,
            stderr=subprocess.STDOUT,
            env=build_env(opts, self.run_dir, self.tmp_dir),
            start_new_session=True,
            cwd=str(self.run_dir),
            preexec_fn=_parent_death_signal(os.getpid()) if pdeath else None,
        )
        self._remember([self.proc.pid])
        self._write_meta(argv=argv)

    def _relaunch_on_a_new_port(self) -> bool:
        """After a death before health: when the port opsctl chose was taken before the
        server bound it (a race no pre-check closes), start again on another port, at
        most ``PORT_RETRIES`` times. Never for a port the operator named."""
        if self.opts.port is not None or self._relaunches >= PORT_RETRIES:
            return False
        if not serverlog.port_taken(self.launch_log_text()):
            return False
        # under the stop lock: a stop() from another thread (the console stopping a
        # starting server) either came first (no relaunch) or stops the new launch
        with self._stop_lock:
            if self.stop_report is not None:
                return False
            leftover = self._reap_dead_launch()
            if leftover:
                return False  # something of the dead launch still runs: stop() reports it
            old = self.port
            self.port = free_port(self.opts.host)
            self._relaunches += 1
            assert self._log_fh is not None
            self._log_fh.write(
                f"opsctl: port {old} was taken before the server bound it; "
                f"starting again on port {self.port}\n".encode()
            )
            self._log_fh.flush()
            self._launch()
        return True

    def _reap_dead_launch(self) -> list[int]:
        """Every process of a launch whose API server has exited, gone: SIGKILL what is
        left (nothing served yet); the pids still alive after 5 s."""
        pids = self._all_pids()
        self._signal_all(pids, kill=True)
        self._wait_gone(pids, time.time() + 5.0)
        return [p.pid for p in self._living(pids)]

    def _write_meta(self, **extra) -> None:
        assert self.run_dir is not None
        meta_path = self.run_dir / "meta.json"
        meta = json_object(meta_path)
        meta.update(
            {
                "url": self.url,
                "pid": self.pid,
                "tmp_dir": str(self.tmp_dir) if self.tmp_dir else None,
                "model": self.opts.model.name,
                "model_path": str(self.opts.model.path),
                "load_format": self.opts.load_format,
                "started_at": self.started_at,
                "healthy_at": self.healthy_at,
                # who owns the engine, and every engine process seen (pid -> start time):
                # `opsctl runs` tells live / orphaned / dead runs apart from these, and a
                # pid the kernel reused is never taken for ours
                "owner_pid": os.getpid(),
                "owner_started": _OWNER_STARTED,
                "pids": {str(pid): started for pid, started in sorted(self.known_pids.items())},
                **extra,
            }
        )
        meta_path.write_text(json.dumps(meta, indent=2, default=str) + "\n")

    # ---- observe -------------------------------------------------------------
    def exited(self) -> int | None:
        """The server's exit code; None while it runs (or before it started)."""
        return self.proc.poll() if self.proc else None

    def log_text(self) -> str:
        """The whole server log, over every launch."""
        return self._log_since(0)

    def launch_log_text(self) -> str:
        """The server log of the current launch (after a relaunch, not the dead one's)."""
        return self._log_since(self._log_from)

    def _log_since(self, offset: int) -> str:
        """server.log from byte ``offset``, read as ``Path.read_text`` reads a file
        (universal newlines: tqdm's ``\r`` ends a line; undecodable bytes replaced)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            return ""
        return io.TextIOWrapper(io.BytesIO(data), errors="replace").read()

    def track(self) -> None:
        """Remember our descendants, their /dev/shm segments, roles and ends.

        The segments they map (for cleanup), each process's rank role, and when a process
        of ours (the API server included) ended."""
        if not self.proc:
            return
        pids = [self.proc.pid]
        with contextlib.suppress(psutil.NoSuchProcess):
            pids += [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
        self._remember(pids)
        scan = shm.scan_mappings(pids)
        self.shm_seen.update(os.path.basename(m.path) for m in scan.mappings)
        self._note_ends()

    def _remember(self, pids: list[int]) -> None:
        new = False
        for pid in pids:
            if pid not in self.known_pids:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    self.known_pids[pid] = psutil.Process(pid).create_time()
                    new = True
        if new and self.run_dir is not None and self.stop_report is None:
            with contextlib.suppress(OSError):
                self._write_meta()

    def health(self, client: httpx.Client) -> bool:
        """Whether /health answers 200 within 2 s."""
        try:
            return client.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def death_error(self) -> Exception:
        """The error saying why the server exited before it became healthy.

        Bad arguments, else the rank that died first (how, and what the others did) and
        the log's decisive lines."""
        log = self.launch_log_text()
        rc = self.exited()
        bad_args = serverlog.argparse_error(log)
        if bad_args is not None:
            return BadInput(f"vLLM rejected the server arguments: {bad_args}")
        self.track()  # the API server's end, noted before the verdict
        lines = serverlog.decisive_lines(log)
        reason = " | ".join(lines) if lines else "no error line in the log"
        death = self.first_death()
        if death is not None and death.pid != self.pid:
            reason = f"{death.summary()} | {reason}"
        return EngineDied(
            f"engine exited with code {rc} before becoming healthy: {reason}",
            hint=f"full log: {self.log_path}",
        )

    def wait_healthy(
        self, timeout: float, on_tick: Callable[[EngineServer], None] | None = None
    ) -> float:
        """Block until /health is 200; returns seconds since start.

        Raises EngineDied / BadInput when the server exits first, OpsTimeout after
        ``timeout`` seconds."""
        deadline = self.started_at + timeout
        next_tick = 0.0  # process tracking and on_tick at most every TICK_S
        with httpx.Client(verify=http.tls_context()) as client:
            while True:
                if self.exited() is not None and not self._relaunch_on_a_new_port():
                    raise self.death_error()
                if time.monotonic() >= next_tick:
                    self.track()
                if self.health(client):
                    self.healthy_at = time.time()
                    self.track()
                    self._write_meta()
                    return self.healthy_at - self.started_at
                if time.monotonic() >= next_tick:
                    next_tick = time.monotonic() + TICK_S
                    if on_tick:
                        on_tick(self)
                if time.time() > deadline:
                    raise OpsTimeout(
                        f"server did not become healthy within {timeout:g} s",
                        hint=f"log: {self.log_path}",
                    )
                time.sleep(HEALTH_POLL_S)

    # ---- stop ----------------------------------------------------------------
    def _all_pids(self) -> list[int]:
        if self.proc:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._remember(
                    [c.pid for c in psutil.Process(self.proc.pid).children(recursive=True)]
                )
        # anything still in our process group (children re-parented to init)
        pgid = self.proc.pid if self.proc else None
        if pgid:
            for p in psutil.process_iter(["pid"]):
                with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError, PermissionError):
                    if os.getpgid(p.pid) == pgid:
                        self._remember([p.pid])
        return sorted(self.known_pids)

    def _living(self, pids: list[int]) -> list[psutil.Process]:
        out = []
        for pid in pids:
            try:
                p = psutil.Process(pid)
                started = self.known_pids.get(pid)
                if started is not None and abs(p.create_time() - started) > 0.05:
                    continue  # the pid was reused: not our process
                if p.status() != psutil.STATUS_ZOMBIE and pid != os.getpid():
                    out.append(p)
            except psutil.NoSuchProcess:
                continue
        return out

    def _wait_gone(self, pids: list[int], deadline: float, step: float = 0.1) -> bool:
        """Wait until none of ``pids`` lives, the deadline passes or a second stop signal
        asks to hurry; True when none lives."""
        looked = time.monotonic()
        while self._living(pids):
            if time.time() >= deadline or lifetime.hurry():
                return False
            time.sleep(step)
            if time.monotonic() - looked >= TRACK_WHILE_STOPPING_S:  # segments made meanwhile
                looked = time.monotonic()
                with contextlib.suppress(Exception):
                    self.track()
        return True

    def _freeze_and_track(self, pids: list[int]) -> list[int]:
        """SIGSTOP every living process of ours (children made since the stop began
        included), then note every segment they map or hold open: what SIGKILL will
        leave behind. Frozen, none can make a segment between the look and the kill
        (CI once found two shm_broadcast rings a TP=2 engine made during the polite
        phase of a stop mid-start, after the last ``track``, left linked)."""
        pids = sorted(set(pids) | set(self._all_pids()))
        for p in self._living(pids):
            with contextlib.suppress(psutil.Error):
                p.suspend()
        with contextlib.suppress(Exception):  # mappings and open descriptors in one scan
            held = shm.scan_holders([p.pid for p in self._living(pids)]).held_paths()
            self.shm_seen.update(os.path.basename(path) for path in held)
        return pids

    def _signal_all(self, pids: list[int], kill: bool) -> None:
        for p in self._living(pids):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill() if kill else p.terminate()

    def stop(self, grace: float = 15.0) -> StopReport:
        """Stop the server tree; idempotent and safe from any thread.

        Signals arriving meanwhile never abort it (``lifetime.shield``): a second one only
        skips the polite waits and goes straight to SIGKILL."""
        with self._stop_lock, lifetime.shield():
            if self.stop_report is None:
                self.stop_report = self._stop(grace)
                if self.run_dir:
                    with contextlib.suppress(OSError):
                        self._write_meta(stopped_at=time.time(), stop=asdict(self.stop_report))
            return self.stop_report

    def _stop(self, grace: float) -> StopReport:
        t0 = time.time()
        signals: list[str] = []
        if self.proc is None:  # never started (or Popen failed): nothing ran in tmp_dir
            tmp_kept = engine_tmp.remove(self.tmp_dir, self.run_dir) if self.run_dir else None
            self._release_engine_lock()
            return StopReport(0.0, [], [], [], [], None, tmp_kept)
        with contextlib.suppress(Exception):
            self.track()
        pids = self._all_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            signals.append("SIGTERM api-server")
        # vLLM's own shutdown gets most of the grace period (its resource tracker then
        # unlinks the ring buffers); descendants get SIGTERM, then SIGKILL. A server that
        # never became healthy serves nothing to drain, and its ranks busy loading ignore
        # the API server for seconds (measured: TP=2 and DP=2 signalled mid-start waited
        # the whole 9 s): a shorter polite phase
        polite = grace * 0.6 if self.healthy_at is not None else min(grace * 0.6, STARTING_POLITE_S)
        if not self._wait_gone(pids, t0 + polite) and not lifetime.hurry():
            self._signal_all(pids, kill=False)
            signals.append("SIGTERM descendants")
            self._wait_gone(pids, t0 + grace * 0.8)
        if self._living(pids):
            pids = self._freeze_and_track(pids)
            self._signal_all(pids, kill=True)
            signals.append("SIGKILL")
            # SIGKILL always ends them; a TP worker on 2 cores under a CPU hog took more
            # than 2 s, once more than 10 s, to exit: wait for it (a deadline, it returns
            # once they are gone) rather than call it left over, which skips the cleanup
            kill_deadline = max(t0 + grace, time.time() + KILL_WAIT_S)
            while self._living(pids) and time.time() < kill_deadline:
                time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1)
        leftover = [p.pid for p in self._living(pids)]
        removed: list[str] = []
        kept: list[str] = []
        tmp_kept: str | None = None
        if not leftover:
            # Only segments created during this run that *our* processes were seen
            # mapping: another engine's fresh segment (e.g. a multiprocessing semaphore
            # between sem_open in one process and its rebuild in a child) is never ours.
            new = {f.name for f in shm.list_files()} - self.shm_before
            # and the ranks' segments named after this run's rendezvous (a rank may have
            # made one after the last look at what our processes map)
            ours = self.shm_seen | shm.rank_segments(self.tmp_dir)
            removed, kept = shm.remove_unheld(new & ours)
            if self.run_dir is not None:
                tmp_kept = engine_tmp.remove(self.tmp_dir, self.run_dir)
        if self._log_fh:
            self._log_fh.close()
        self._release_engine_lock()
        self.registry.discard(self)
        return StopReport(
            round(time.time() - t0, 3),
            signals,
            leftover,
            removed,
            kept,
            self.proc.returncode,
            tmp_kept,
        )

    # ---- the ranks' ends (issue 44: the rank that died first) ----------------------------
    @property
    def ends(self) -> RankEnds:
        """What this server's supervision saw of its processes' roles and ends."""
        seen = self.__dict__.get("_ends")
        if seen is None:
            seen = self.__dict__["_ends"] = RankEnds()
        return seen

    def _note_ends(self) -> None:
        """Note each process's role while it lives, when one of ours disappears, and the
        API server's exit; recorded in meta.json for anyone reading the run later. Not
        while this server is being stopped: those ends are the stop's doing."""
        if self.proc is None or self.stop_report is not None or self._stop_lock.locked():
            return
        from opsctl.collectors.processes import members

        ends, now, changed = self.ends, time.time(), False
        for pid, role, _state in members(self.proc.pid):
            # a process on its way out shows no title (its command line is empty): a rank
            # role once seen is kept
            known = ends.roles.get(pid)
            if known != role and (known is None or ranks.parse_title(role) is not None):
                ends.roles[pid] = role
                changed = True
        for pid in self.known_pids:
            if pid not in ends.gone and not self._living([pid]):
                ends.gone[pid] = round(now, 3)
                changed = True
        rc = self.proc.poll()
        if rc is not None and ends.api_exit is None:
            ends.api_exit = (rc, round(now, 3))
            changed = True
        if changed and self.run_dir is not None:
            with contextlib.suppress(OSError):
                self._write_meta(**ends.meta_fields())

    def rank_ended(self) -> bool:
        """Whether something new ended since the last ask.

        An exit record appeared, or a rank process was seen gone (cheap: one stat and the
        tracked roles)."""
        if self.run_dir is None:
            return False
        ends = self.ends
        try:
            size = (self.run_dir / "exits.jsonl").stat().st_size
        except OSError:
            size = 0
        gone = sum(1 for pid in ends.gone if ranks.parse_title(ends.roles.get(pid, "")))
        news = (size, gone) != ends.told
        ends.told = (size, gone)
        return news and (size > 0 or gone > 0)

    def first_death(self, serving: bool | None = None) -> deaths.FirstDeath | None:
        """The rank of this server that ended first, how, and what the others did.

        None while every rank runs (or for ends after a stop opsctl asked for)."""
        if self.run_dir is None or self.proc is None:
            return None
        from opsctl.collectors import deaths as death_files

        # the API server's end when it came after the last track() (a caller's exited()
        # saw it first): without it the verdict said its exit code was never seen
        self._note_ends()
        ends = self.ends
        code, when = ends.api_exit if ends.api_exit else (None, None)
        return death_files.of_run(
            self.run_dir,
            api=(self.proc.pid, code, when),
            gone=dict(ends.gone),
            seen=dict(ends.roles),
            serving=serving,
            log=self.launch_log_text(),
        )


@dataclass
class RankEnds:
    """What supervision saw of a server's processes: roles while alive, and their ends."""

    roles: dict[int, str] = field(default_factory=dict)  # pid -> role (Worker_TP1, ...)
    gone: dict[int, float] = field(default_factory=dict)  # pid -> when seen gone
    api_exit: tuple[int, float] | None = None  # the API server's (exit code, when seen)
    told: tuple[int, int] = (0, 0)  # rank_ended's last look: exits.jsonl size, ranks gone

    def meta_fields(self) -> dict:
        """The fields meta.json records (``ranks``, ``seen_gone``, ``api_exit``)."""
        api = (
            None
            if self.api_exit is None
            else {"exitcode": self.api_exit[0], "time": self.api_exit[1]}
        )
        return {
            "ranks": {str(p): r for p, r in sorted(self.roles.items())},
            "seen_gone": {str(p): t for p, t in sorted(self.gone.items())},
            "api_exit": api,
        }
