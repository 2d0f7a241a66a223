"""A real tensor-parallel server whose ranks span two "nodes": vLLM's multi-node layout
(``--nnodes 2``) run on this one machine, bare (without opsctl).

Node 0 is an API server with the EngineCore and Worker_TP0; node 1 is a headless
``vllm serve`` (tests/vllm_headless_node.py) with Worker_TP1 alone; they meet through
torch.distributed at a master address on 127.0.0.1 (vLLM 0.32 CPU falls back from its
shared-memory all-reduce to gloo's, the ranks being on different nodes). Each node gets
one CPU of this process's. Held under the engine lock while it runs; on exit both trees
stop and the /dev/shm segments they left (none a live process maps) are removed.
Start measured: about 60 s on 2 busy cores."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from opsctl.domain.ranks import Layout, cpu_binding
from opsctl.engine.server import free_port
from tests.bare_vllm import (
    API_MODULE,
    STARTS,
    BareServer,
    _engine_lock,
    _remove_left,
    stop_tree,
    wait_healthy,
)
from tests.standins.shm_watch import TreeShm

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class TwoNodes:
    head: BareServer  # node 0: the API server, EngineCore, Worker_TP0
    worker_node: subprocess.Popen  # node 1: the headless server, Worker_TP1

    @property
    def url(self) -> str:
        return self.head.url


def _spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
            cwd=ROOT, start_new_session=True,
        )  # fmt: skip


@contextlib.contextmanager
def two_nodes(model_dir: str, timeout: float = 400.0) -> Iterator[TwoNodes]:
    """The two nodes of a TP=2 server, healthy; stopped and cleaned up on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSCTL_")}
    env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    binds = cpu_binding(os.sched_getaffinity(0), Layout(tp=2)).split("|")
    common = [
        "--model", model_dir, "--served-model-name", "tiny-llama", "--load-format", "dummy",
        "--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--max-num-seqs", "8",
        "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "2", "--nnodes", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
    ]  # fmt: skip
    with _engine_lock():
        port = free_port()
        logs = [Path(tempfile.mkstemp(prefix=f"node{i}-", suffix=".log")[1]) for i in (0, 1)]
        head = _spawn(
            [sys.executable, "-m", API_MODULE, *common, "--node-rank", "0",
             "--host", "127.0.0.1", "--port", str(port)],
            {**env, "VLLM_CPU_OMP_THREADS_BIND": binds[0]}, logs[0],
        )  # fmt: skip
        node = _spawn(
            [sys.executable, "-m", "tests.vllm_headless_node", *common, "--node-rank", "1",
             "--headless"],
            {**env, "VLLM_CPU_OMP_THREADS_BIND": binds[1]}, logs[1],
        )  # fmt: skip
        watches = [TreeShm(p.pid).__enter__() for p in (head, node)]
        server = BareServer(head, port, logs[0])
        try:
            t0 = time.monotonic()
            wait_healthy(server, timeout)
            assert node.poll() is None, logs[1].read_text(errors="replace")[-2000:]
            STARTS.append(time.monotonic() - t0)  # one server (two nodes) in the summary
            yield TwoNodes(server, node)
        finally:
            for p in (node, head):
                stop_tree(p.pid)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
            for w in watches:
                w.__exit__(None, None, None)
                _remove_left(w)
            for log in logs:
                with contextlib.suppress(OSError):
                    log.unlink()
