"""The verdict over a server's stacks (opsctl.stacks.judge_verdict), pure: the frames are
those of real stacks taken from a TP=2 vLLM 0.32 CPU engine (Worker_TP0 in the shared-memory
all-reduce under the vocabulary embedding, Worker_TP1 in the rank-hang knob's planted_hang,
idle workers in the message queue, the API server in uvloop). The real engine's case is
tests/e2e/test_rank_hang_e2e.py."""

from __future__ import annotations

import pytest

from opsctl.stacks import judge_verdict as V
from opsctl.stacks.judge import Frame, ProcessStacks, Thread, collective, where

SP = "/venv/lib/python3.11/site-packages/"
PY = "/usr/lib/python3.11/"


def f(func: str, path: str, line: int) -> Frame:
    return Frame(func, path if path.startswith("/") else SP + path, line)


IDLE_API = (
    f("run", "uvloop/__init__.py", 92),
    f("main", "vllm/entrypoints/launchers/api_server/entry.py", 232),
)
IDLE_CORE = (
    f("poll", "zmq/sugar/poll.py", 106),
    f("wait", "vllm/distributed/device_communicators/shm_broadcast.py", 210),
    f("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 971),
    f("get_response", "vllm/v1/executor/multiproc_executor.py", 440),
    f("step", "vllm/v1/engine/core.py", 674),
    f("run_busy_loop", "vllm/v1/engine/core.py", 1555),
)
IDLE_WORKER = (
    f("poll", "zmq/sugar/poll.py", 106),
    f("wait", "vllm/distributed/device_communicators/shm_broadcast.py", 210),
    f("dequeue", "vllm/distributed/device_communicators/shm_broadcast.py", 971),
    f("worker_busy_loop", "vllm/v1/executor/multiproc_executor.py", 1041),
)
EMBED = f("forward", "vllm/model_executor/layers/vocab_parallel_embedding.py", 562)
MODEL = (
    f("embed_input_ids", "vllm/model_executor/models/llama.py", 404),
    f("forward", "vllm/model_executor/models/llama.py", 418),
)
IN_ALL_REDUCE = (
    f("__call__", "torch/_ops.py", 1279),
    f("all_reduce", "vllm/distributed/device_communicators/cpu_communicator.py", 275),
    f("all_reduce", "vllm/distributed/device_communicators/cpu_communicator.py", 85),
    f("_all_reduce_out_place", "vllm/distributed/parallel_state.py", 750),
    f("all_reduce", "vllm/distributed/parallel_state.py", 745),
    f("tensor_model_parallel_all_reduce", "vllm/distributed/communication_op.py", 14),
    EMBED,
    *MODEL,
)
PLANTED = (
    f("planted_hang", "/repo/engine_patches/patches/hang_knob.py", 36),
    f("forward_before_all_reduce", "/repo/engine_patches/patches/rank_hang_knob.py", 51),
    f("_call_impl", "torch/nn/modules/module.py", 1789),
    *MODEL,
)
COMPILING = (
    f("communicate", PY + "subprocess.py", 1196),
    f("_run_compile_cmd", "torch/_inductor/cpp_builder.py", 696),
    *MODEL,
)
COMPUTING = (f("forward", "vllm/model_executor/layers/linear.py", 600), *MODEL)
COLLECTIVE_LINE = (
    "waits in all_reduce (vllm/distributed/device_communicators/cpu_communicator.py:275) "
    "(collective) under forward (vllm/model_executor/layers/vocab_parallel_embedding.py:562)"
)


def proc(pid, role, frames, state="sleeping", moved=False, asleep=True, host=None, error=None):
    threads = (Thread(hex(pid), frames),) if frames else ()
    source = "signal" if frames else "none"
    return ProcessStacks(pid, role, source, threads, state, error, host, moved, asleep)


def server(*workers, core=IDLE_CORE):
    return [
        proc(1, "APIServer", IDLE_API),
        proc(2, "resource tracker", ()),
        proc(3, "EngineCore", core),
        *workers,
    ]


def test_a_collective_is_named_with_the_layer_that_called_it():
    assert where(IN_ALL_REDUCE) == COLLECTIVE_LINE
    assert collective(IN_ALL_REDUCE)[1] == EMBED
    # vLLM's message queue sits beside the communicators: waiting for work, not a collective
    assert collective(IDLE_WORKER) is None and collective(PLANTED) is None
    native = (Frame("shm_allreduce", "/x/vllm/_C.abi3.so", 0), *IN_ALL_REDUCE)
    assert where(native) == COLLECTIVE_LINE


def test_a_decorators_wrapper_inside_the_collective_is_not_its_caller():
    """Beside a CPU hog, Worker_TP1 was stopped in the LM head's embedding, and Worker_TP0
    waited in the logits' all-gather: torch's deprecated ``_all_gather_base`` runs through
    typing_extensions' ``deprecated`` wrapper, which was named as the caller."""
    logits = f("_gather_logits", "vllm/model_executor/layers/logits_processor.py", 92)
    gather = (
        f("_all_gather_base", "torch/distributed/distributed_c10d.py", 4394),
        f("wrapper", "typing_extensions.py", 3140),
        f("all_gather", "vllm/distributed/device_communicators/base_device_communicator.py", 120),
        f("all_gather", "vllm/distributed/parallel_state.py", 800),
        f("tensor_model_parallel_all_gather", "vllm/distributed/communication_op.py", 20),
        logits,
        *MODEL,
    )
    assert collective(gather) == (gather[0], logits)
    assert where(gather).endswith(" (collective) under " + logits.short())


def test_the_rank_that_hangs_before_the_collective_is_the_culprit():
    d = V.diagnose(server(proc(11, "Worker_TP0", IN_ALL_REDUCE, "running", asleep=False),
                          proc(12, "Worker_TP1", PLANTED)))  # fmt: skip
    assert d.verdict == V.STUCK
    assert d.headline == (
        "Worker_TP1 (pid 12) stuck: in planted_hang (/repo/engine_patches/patches/hang_knob.py:36); "
        f"Worker_TP0 (pid 11) {COLLECTIVE_LINE}"
    )
    assert [(c.role, c.status) for c in d.culprits] == [("Worker_TP1", V.STUCK)]
    assert [(w.role, w.status) for w in d.waiting] == [("Worker_TP0", V.COLLECTIVE)]


def test_a_stopped_rank_is_the_culprit_and_its_peer_waits_for_it():
    d = V.diagnose(server(proc(11, "Worker_TP0", IN_ALL_REDUCE, "running", asleep=False),
                          proc(12, "Worker_TP1", IDLE_WORKER, "stopped", asleep=False)))  # fmt: skip
    assert d.verdict == V.STUCK
    assert d.headline.startswith("Worker_TP1 (pid 12) [stopped]: waits in wait (vllm/distributed/")
    assert d.headline.endswith(f"; Worker_TP0 (pid 11) {COLLECTIVE_LINE}")


def test_peers_waiting_in_one_collective_are_grouped():
    waiters = [
        proc(p, f"Worker_TP{r}", IN_ALL_REDUCE, "running") for p, r in ((10, 0), (12, 2), (13, 3))
    ]
    d = V.diagnose(server(*waiters, proc(11, "Worker_TP1", PLANTED)))
    assert d.headline.endswith(
        "; Worker_TP0 (pid 10), Worker_TP2 (pid 12), Worker_TP3 (pid 13) "
        + COLLECTIVE_LINE.replace("waits in", "wait in", 1)
    )


@pytest.mark.parametrize(
    "tp0, tp1, headline",
    [
        # healthy under load: a rank passing through the all-reduce, the other computing
        (dict(frames=IN_ALL_REDUCE, moved=True), dict(frames=COMPUTING, moved=True), "working: "),
        # the peer computes for longer (a compile): it moved, the waiter stayed
        (dict(frames=IN_ALL_REDUCE), dict(frames=COMPUTING, moved=True), "working: Worker_TP1"),
        # still, but running: computing in one long call, not blocked
        (dict(frames=COMPUTING, asleep=False), dict(frames=IDLE_WORKER), "working: Worker_TP0"),
        # asleep at one frame, waiting for the g++ it runs (a first request's compile)
        (dict(frames=IN_ALL_REDUCE), dict(frames=COMPILING), "working: Worker_TP1 (pid 12) in"),
    ],
)
def test_ranks_that_work_pass(tp0, tp1, headline):
    d = V.diagnose(server(proc(11, "Worker_TP0", **tp0), proc(12, "Worker_TP1", **tp1)))
    assert d.verdict == V.PASS and d.headline.startswith(headline) and not d.culprits


def test_ranks_all_held_in_a_collective_wait_for_a_rank_not_here():
    d = V.diagnose(
        server(proc(11, "Worker_TP0", IN_ALL_REDUCE), proc(12, "Worker_TP1", IN_ALL_REDUCE))
    )
    assert d.verdict == V.STUCK and not d.culprits and len(d.waiting) == 2
    assert "the rank they wait for is not among these processes" in d.headline
    assert "opsctl stacks --merge" in d.headline


def test_a_single_engine_stuck_on_a_lock_is_stuck_and_an_idle_one_passes():
    hung = (
        f("planted_hang", "/repo/engine_patches/patches/hang_knob.py", 36),
        f("step", "vllm/v1/engine/core.py", 674),
    )
    d = V.diagnose(server(proc(4, "Worker", IDLE_WORKER), core=hung))
    assert d.verdict == V.STUCK and d.headline.startswith(
        "EngineCore (pid 3) stuck: in planted_hang"
    )
    d = V.diagnose(server(proc(4, "Worker", IDLE_WORKER)))
    assert d.verdict == V.PASS
    assert d.headline.startswith(
        "every process waits where an idle engine waits: APIServer (pid 1)"
    )


def test_what_was_not_read_never_passes():
    why = "stopped: its stack handler (SIGUSR2) cannot run until the process is continued"
    stopped = [proc(1, "APIServer", IDLE_API), proc(3, "EngineCore", (), "stopped", error=why)]
    d = V.diagnose(stopped)
    assert d.verdict == V.STUCK and d.headline == f"EngineCore (pid 3) [stopped]: {why}"
    running = [
        proc(1, "APIServer", IDLE_API),
        proc(3, "EngineCore", (), error="py-spy is not installed"),
    ]
    d = V.diagnose(running)
    assert d.verdict == V.INCOMPLETE and "EngineCore (pid 3): py-spy is not installed" in d.headline
    assert [u.role for u in d.unread] == ["EngineCore"]
    d = V.diagnose([proc(1, "APIServer", (), error="py-spy may not trace pid 1")])
    assert d.verdict == V.FAIL and d.headline.startswith("no stacks could be read")
    # helpers (the resource tracker, a compiler) do not count
    helpers = [
        proc(1, "APIServer", IDLE_API),
        proc(9, "compiler", (), error="not a Python process"),
    ]
    assert V.diagnose(helpers).verdict == V.PASS


def test_settle_marks_moved_and_asleep_against_the_first_take():
    first = [
        proc(1, "Worker_TP0", IN_ALL_REDUCE, "running"),
        proc(2, "Worker_TP1", PLANTED),
        proc(3, "EngineCore", IDLE_CORE),
    ]
    second = [
        proc(1, "Worker_TP0", IN_ALL_REDUCE, "sleeping"),
        proc(2, "Worker_TP1", COMPUTING),
        proc(4, "Worker_TP2", PLANTED),
        proc(3, "EngineCore", ()),
    ]
    got = {p.pid: (p.moved, p.asleep) for p in V.settle(first, second)}
    assert got == {1: (False, False), 2: (True, True), 4: (None, None), 3: (None, True)}


def doc(host, *procs):
    return {
        "schema": "opsctl.stacks/2", "host": host, "target": "x", "pid": procs[0].pid,
        "taken_at": 1.0, "verdict": "pass", "headline": "h",
        "processes": [p.to_dict() for p in procs],
    }  # fmt: skip


def test_merge_keys_ranks_by_host_and_names_the_culprit_on_the_other_host():
    a = doc("node-a", proc(1, "APIServer", IDLE_API), proc(3, "EngineCore", IDLE_CORE),
            proc(11, "Worker_TP0", IN_ALL_REDUCE, "running"))  # fmt: skip
    b = doc(
        "node-b", proc(1, "APIServer", IDLE_API), proc(12, "Worker_TP1", IDLE_WORKER, "stopped")
    )
    alone = V.diagnose(V.merge([("a.json", a)])[0])
    assert "not among these processes" in alone.headline  # host a alone cannot say who
    procs, reports = V.merge([("a.json", a), ("b.json", b)])
    assert [r["host"] for r in reports] == ["node-a", "node-b"]
    assert {(p.host, p.role) for p in procs} >= {("node-a", "APIServer"), ("node-b", "APIServer")}
    d = V.diagnose(procs)
    assert d.verdict == V.STUCK
    assert d.headline.startswith("node-b/Worker_TP1 (pid 12) [stopped]: waits in")
    assert d.headline.endswith(f"; node-a/Worker_TP0 (pid 11) {COLLECTIVE_LINE}")


def test_merge_refuses_one_host_twice_and_what_is_not_a_report():
    a = doc("node-a", proc(1, "APIServer", IDLE_API), proc(11, "Worker_TP0", IN_ALL_REDUCE))
    with pytest.raises(ValueError, match=r"a\.json and b\.json both hold node-a's APIServer"):
        V.merge([("a.json", a), ("b.json", a)])
    with pytest.raises(ValueError, match=r"b\.json is not an opsctl\.stacks/2 report"):
        V.merge([("a.json", a), ("b.json", {**a, "schema": "opsctl.stacks/1"})])
