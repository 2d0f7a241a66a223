"""A session-wide pool of real vLLM engines for tests that only read from theirs.

Which module starts what, and who may share, is in tests/ENGINES.md.

A module that only sends requests to its engine and reads its records declares the pooled
engines it uses, by name, with ``pytest.mark.pool("name")`` (in ``pytestmark``), and gets
one from the session fixture ``engine_pool`` (tests/conftest.py)::

    pytestmark = [pytest.mark.engine, pytest.mark.pool("no-logprobs")]

    @pytest.fixture(scope="module")
    def engine(engine_pool):
        return engine_pool.engine("no-logprobs")   # a Live: .url, .run_dir, .server

A module whose engine no other module asks for passes its spec along:
``engine_pool.engine("mm-uuid-rewrite", EngineSpec(...))``; an engine shared by modules
is named in ``SPECS`` below.

or, for a library call that takes a session, ``engine_pool.session_for("name")``: the
check's own spec then finds the pooled engine through the session's compatibility rule
(same ``EngineSpec.engine_key()``, probes included), exactly as two checks share one
engine in certify.

Rules (the pool is opsctl's :class:`~opsctl.checks.session.EngineSession`, used as is):

- started on first use, kept while the tests that declared its name run back to back
  (tests/conftest.py orders modules by pool name), stopped after the last of them;
- ONE engine alive at a time: asking for another name stops the current one first. A
  pytest process holds the engine lock (OPSCTL_ENGINE_LOCK) while it has an engine
  alive, so an engine left running while a later test starts one in a subprocess
  (``opsctl diag --model``, ``opsctl serve``, bare vLLM) would make that test wait on
  us for ever: conftest stops the pooled engine before any test that did not declare
  its name;
- stopped at the session end, also after a failure or Ctrl-C (session fixture
  finalizer; a failed start is stopped by EngineSession itself), and opsctl's lifetime
  policy (owner watchdog, parent-death signal) covers a pytest killed outright.

A test that kills, signals or freezes its engine, loads adapters into it or judges its
start or stop keeps its own engine (``tests.conftest.running_engine``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from opsctl.checks.session import EngineSession
from opsctl.checks.target import EngineSpec, Live

MARK = "pool"


def _invariance_nudge() -> EngineSpec:
    # The engine `diag invariance --mode eager` itself asks for (isolating settings, batch
    # probe, room for 8), with the test-only nudge armed for prompts containing "zebra"
    # (none of the default prompts): read by test_invariance_e2e.py and by the library
    # calls of test_invariance_modes_e2e.py.
    from engine_patches import knobs
    from opsctl.suite.invariance import run as invariance

    spec = EngineSpec(knobs=((knobs.NUDGE, "zebra:3"),))
    return invariance.isolated_spec(spec, "eager", invariance.Options())


def _no_logprobs() -> EngineSpec:
    from opsctl.suite.invariance.run import ISOLATING_ARGS

    return EngineSpec("tiny-llama", extra_args=(*ISOLATING_ARGS, "--max-logprobs", "0"))


def _tiny_embed() -> EngineSpec:
    return EngineSpec("tiny-embed", timeout=400.0)


# name -> the spec (built lazily: importing this module must stay cheap for conftest)
SPECS: dict[str, Callable[[], EngineSpec]] = {
    "invariance-nudge": _invariance_nudge,
    "no-logprobs": _no_logprobs,
    "tiny-embed": _tiny_embed,
}


# Seconds an engine module took (setup + tests; fresh clone fc7 of stop 23 and the new
# modules' first runs, the eleven longest from an engine tier of 2026-12-07; rounded):
# only the ORDER of the engine tier uses them, so that the two xdist workers start with
# the longest units and end together. A module not listed
# counts as DEFAULT_COST.
COSTS: dict[str, float] = {
    "test_lora_e2e.py": 245,
    "test_serve_e2e.py": 170,
    "test_lifetime_e2e.py": 115,
    "test_kv_fail.py": 140,
    "test_certify_e2e.py": 100,
    "test_invariance_modes_e2e.py": 70,
    "test_console_e2e.py": 95,
    "test_console_prometheus_e2e.py": 135,  # with the stall alert (was test_alerts_e2e)
    # the tier's one DP=2 engine: views and checks read, SIGSTOP, hang, idle hang, SIGKILL
    "test_dp_stall_e2e.py": 260,
    "test_mm_uuid_e2e.py": 75,
    "test_invariance_images_e2e.py": 55,
    "test_console_actions_e2e.py": 55,
    "test_certify_nudge_e2e.py": 45,
    "test_usage_e2e.py": 40,
    "test_runs_e2e.py": 35,
    "test_invariance_e2e.py": 30,
    "test_certify_url_e2e.py": 20,
    "test_invariance_no_logprobs_e2e.py": 15,
    "test_certify_cli.py": 15,
    # the tier's one TP=2 engine: views and checks read, then stop, knob, no py-spy, kill
    "test_rank_hang_e2e.py": 115,
    "test_stacks_merge_e2e.py": 80,  # a TP=2 server over two nodes (bare multi-node)
    # issue 44 (ranks): a TP=2 and a DP=2 serve SIGKILLed once their ranks exist; two
    # TP=2 kv-fail runs
    "test_ranks_lifetime_e2e.py": 110,
    "test_ranks_diag_e2e.py": 105,
}
DEFAULT_COST = 60.0

# Engine modules that must not run beside each other on the two engine workers: one
# xdist unit (module name -> unit name). None now: test_tee_e2e and
# test_console_actions_e2e were here (the tee's client-disconnect test failed beside the
# other); the cause was the test's own client, which closed its connection at once
# (next(s.iter_lines()) dropped the generator, httpcore closed the half-read response):
# on busy cores the tee recorded that real close before the console looked. Fixed in the
# test (the iterator kept; an attempt in which vLLM finished first is tried again).
SAME_WORKER: dict[str, str] = {}


def module_cost(path: str) -> float:
    return COSTS.get(os.path.basename(path), DEFAULT_COST)


def run_order(
    modules: list[tuple[bool, str | None]], costs: list[float] | None = None
) -> list[int]:
    """The order to run modules in, as indices into ``modules`` (collection order, each
    ``(starts engines, first pool name or None)``): modules without engines first, then
    engine modules; those declaring the same pool name back to back, at the place of the
    first of them. With ``costs`` (seconds per module), the engine units (a module, or
    the modules of one pool name) longest first. Otherwise collection order."""
    anchor: dict[str, int] = {}
    pool_cost: dict[str, float] = {}
    for i, (_, name) in enumerate(modules):
        if name is not None:
            anchor.setdefault(name, i)
            pool_cost[name] = pool_cost.get(name, 0.0) + (costs[i] if costs else 0.0)

    def key(i: int) -> tuple:
        engine, name = modules[i]
        if not engine:
            return (0, 0.0, i, "", i)
        if name is not None:
            return (1, -pool_cost[name], anchor[name], name, i)
        return (1, -(costs[i] if costs else 0.0), i, "", i)

    return sorted(range(len(modules)), key=key)


@dataclass
class PoolStart:
    name: str
    url: str
    seconds: float  # to healthy, as EngineServer measured it
    uses: int = 0


@dataclass
class EnginePool:
    session: EngineSession = field(default_factory=EngineSession)
    alive: str | None = None  # the name of the one engine running, if any
    starts: list[PoolStart] = field(default_factory=list)
    stop_seconds: float = 0.0

    def spec(self, name: str) -> EngineSpec:
        try:
            return SPECS[name]()
        except KeyError:
            raise KeyError(f"no pooled engine {name!r}; known: {', '.join(SPECS)}") from None

    def engine(self, name: str, spec: EngineSpec | None = None) -> Live:
        """The pooled engine ``name``, started now unless it is the one alive. ``spec``:
        a module's own engine (a name no other module uses); else SPECS[name]."""
        spec = spec or self.spec(name)
        if self.alive != name:
            self.release()
        before = len(self.session.starts)
        live = self.session.engine(spec, label=f"test-pool-{name}")
        if len(self.session.starts) > before:  # a start (first use, or more probes)
            self.starts.append(PoolStart(name, live.url, self.session.starts[-1].seconds))
        self.alive = name
        self.starts[-1].uses += 1
        return live

    def session_for(self, name: str) -> EngineSession:
        """The pool's session with ``name`` alive in it: a check given this session and a
        spec with the same engine key reuses the engine instead of starting one."""
        self.engine(name)
        return self.session

    def release(self) -> None:
        """Stop the engine alive, if any (the next name, or a test that starts its own)."""
        if self.alive is None:
            return
        t0 = time.monotonic()
        try:
            self.session.close()
        finally:
            self.alive = None
            self.stop_seconds += time.monotonic() - t0

    close = release

    def summary(self) -> str:
        if not self.starts:
            return "engine pool: no engine started"
        uses = sum(s.uses for s in self.starts)
        secs = sum(s.seconds for s in self.starts)
        names = ", ".join(f"{s.name} ({s.seconds:.0f} s, {s.uses} uses)" for s in self.starts)
        return (
            f"engine pool: {len(self.starts)} engine(s) started in {secs:.0f} s, served "
            f"{uses} module/test requests ({uses - len(self.starts)} without a start); "
            f"stops {self.stop_seconds:.0f} s: {names}"
        )


# ---- accounting: every engine the session started (printed at the end by conftest) ------
# Run directories that appeared under $OPSCTL_HOME/runs while a test ran are attributed to
# its module (meta.json: started_at, healthy_at); bare vLLM servers (tests/bare_vllm.py)
# record their own start. A run is ours when its owner is this process or a descendant
# (``opsctl serve``/``diag`` in a subprocess): a watcher thread looks at each new run
# while its owner still lives, so runs of another pytest on the same OPSCTL_HOME are left
# out. A run whose owner was gone before the watcher saw it (a start that failed within
# a second) is counted as ours. Runs made under a test's private OPSCTL_HOME are not seen.


@dataclass
class Accounting:
    runs_root: Path | None = None
    by_module: dict[str, list[str]] = field(default_factory=dict)  # module -> run dir names
    bare: dict[str, list[float]] = field(default_factory=dict)  # module -> seconds to healthy
    ours: dict[str, bool] = field(default_factory=dict)  # run dir name -> owned by us
    others: int = 0  # runs of other processes seen during our tests (left out)
    merged: bool = False  # the xdist workers' accounting was merged in (controller)
    _watcher: threading.Thread | None = None

    def classify(self, name: str) -> bool | None:
        """True: owned by this process or a descendant; False: by someone else; None:
        not known (no meta.json yet, or the owner is gone)."""
        if name in self.ours:
            return self.ours[name]
        meta = self.meta(name)
        owner = meta.get("owner_pid")
        if not isinstance(owner, int):
            return None
        if owner == os.getpid():
            verdict: bool | None = True
        else:
            try:
                verdict = os.getpid() in {p.pid for p in psutil.Process(owner).parents()}
            except psutil.Error:
                verdict = None
        if verdict is not None:
            self.ours[name] = verdict
        return verdict

    def watch(self) -> None:
        """Classify new runs once a second while their owners live (daemon thread)."""
        if self._watcher is not None or self.runs_root is None:
            return
        known = self.listing()

        def loop() -> None:
            while True:
                for name in self.listing() - known:
                    self.classify(name)
                time.sleep(1.0)

        self._watcher = threading.Thread(target=loop, name="engine-accounting", daemon=True)
        self._watcher.start()

    def listing(self) -> frozenset[str]:
        try:
            return frozenset(os.listdir(self.runs_root)) if self.runs_root else frozenset()
        except OSError:
            return frozenset()

    def meta(self, name: str) -> dict:
        assert self.runs_root is not None
        try:
            return json.loads((self.runs_root / name / "meta.json").read_text())
        except (OSError, ValueError):
            return {}

    def own(self, names: frozenset[str]) -> list[str]:
        """The runs among ``names`` that this process owns (started in-process)."""
        return [n for n in sorted(names) if self.meta(n).get("owner_pid") == os.getpid()]

    @contextlib.contextmanager
    def watching(self, module: str) -> Iterator[None]:
        before, bare_before = self.listing(), len(bare_starts())
        try:
            yield
        finally:
            new = [n for n in sorted(self.listing() - before) if self.classify(n) is not False]
            self.others += len(self.listing() - before) - len(new)
            if new:
                self.by_module.setdefault(module, []).extend(new)
            bare = bare_starts()[bare_before:]
            if bare:
                self.bare.setdefault(module, []).extend(bare)

    def last_write(self, name: str) -> float | None:
        """The newest mtime of a file in the run directory ``name``."""
        if self.runs_root is None:
            return None
        try:
            times = [p.stat().st_mtime for p in (self.runs_root / name).rglob("*") if p.is_file()]
        except OSError:
            return None
        return max(times, default=None)

    def start_seconds(self, name: str) -> tuple[float, bool]:
        """(seconds from start to healthy, or to the stop when it never got there; healthy)"""
        meta = self.meta(name)
        started = meta.get("started_at")
        if not started:
            return 0.0, False
        if meta.get("healthy_at"):
            return float(meta["healthy_at"]) - float(started), True
        # never healthy: to its stop, or (killed with its owner: no stop recorded) to the
        # last write into its run directory
        end = meta.get("stopped_at") or self.last_write(name) or float(started)
        return max(0.0, float(end) - float(started)), False

    def export(self, pool_lines: list[str]) -> dict:
        """What an xdist worker sends its controller (JSON-able)."""
        return {"by_module": self.by_module, "bare": self.bare, "pools": pool_lines}

    def merge(self, data: dict) -> list[str]:
        """A worker's accounting into the controller's; its pool lines. Each worker left
        out the other's runs as "of other processes", so that count is dropped here."""
        for module, names in data.get("by_module", {}).items():
            self.by_module.setdefault(module, []).extend(names)
        for module, secs in data.get("bare", {}).items():
            self.bare.setdefault(module, []).extend(secs)
        self.merged = True
        return list(data.get("pools", []))

    def summary(self, pool_lines: list[str]) -> list[str]:
        rows, total_n, total_s, failed = [], 0, 0.0, 0
        modules = sorted(set(self.by_module) | set(self.bare))
        for module in modules:
            runs = [self.start_seconds(n) for n in self.by_module.get(module, [])]
            bare = self.bare.get(module, [])
            n, s = len(runs) + len(bare), sum(x for x, _ in runs) + sum(bare)
            unhealthy = sum(1 for _, ok in runs if not ok)
            total_n, total_s, failed = total_n + n, total_s + s, failed + unhealthy
            note = f" ({len(bare)} bare vLLM)" if bare else ""
            note += f" ({unhealthy} never healthy: stopped or killed while starting)" * bool(
                unhealthy
            )
            rows.append(f"  {module}: {n} engine start(s), {s:.0f} s{note}")
        if not rows and not any("started" in line for line in pool_lines):
            return []
        bare_n = sum(len(v) for v in self.bare.values())
        head = (
            f"{total_n} engine start(s) ({total_n - bare_n} opsctl runs, {bare_n} bare vLLM), "
            f"{total_s:.0f} s in engine starts (start to healthy; {failed} never healthy)"
        )
        if self.others and not self.merged:
            head += f"; {self.others} run(s) of other processes left out"
        return [head, *rows, *pool_lines]


ACCOUNTING = Accounting()


def bare_starts() -> list[float]:
    module = sys.modules.get("tests.bare_vllm")
    return getattr(module, "STARTS", []) if module is not None else []
