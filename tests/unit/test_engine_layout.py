"""The launch of an engine in each layout: vLLM's own (serve's default) and the single
process layout of opsctl's check engines (argv, environment, OpenMP threads), and the
engine_core_fork patch's decision. The engines themselves: tests/e2e (every check engine
runs single-process; test_serve_e2e / test_lifetime_e2e cover vLLM's layout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opsctl.engine import server as srv
from opsctl.engine.model import ResolvedModel
from opsctl.engine.server import LaunchOptions, build_argv, build_env, cpu_worker_threads


def _opts(**kw) -> LaunchOptions:
    model = ResolvedModel("m", Path("/nonexistent/m"), "llama", embedded=False, config={})
    return LaunchOptions(model=model, **kw)


@pytest.fixture
def cpu(monkeypatch):
    monkeypatch.setattr(srv, "has_gpu", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2, 3})
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)


def test_vllms_layout_by_default(cpu, tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCTL_ENGINE_FORK", "1")  # inherited: never honoured
    opts = _opts()
    argv = build_argv(opts, 8000)
    env = build_env(opts, tmp_path)
    assert "--distributed-executor-backend" not in argv
    assert "OPSCTL_ENGINE_FORK" not in env
    assert env.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0"


def test_single_process_on_cpu_forks_with_the_workers_threads(cpu, tmp_path):
    opts = _opts(single_process=True)
    argv = build_argv(opts, 8000)
    i = argv.index("--distributed-executor-backend")
    assert argv[i + 1] == "uni"
    env = build_env(opts, tmp_path)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["OPSCTL_ENGINE_FORK"] == "1"
    assert env["OMP_NUM_THREADS"] == "3"  # 4 usable CPUs, 1 reserved by vLLM


def test_reserved_cpus_from_the_engines_environment(cpu, tmp_path):
    opts = _opts(single_process=True, env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "2"})
    assert build_env(opts, tmp_path)["OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize(
    ("cpus", "reserved", "threads"), [(2, None, 1), (1, None, 1), (8, "3", 5), (4, "x", 3)]
)
def test_cpu_worker_threads(monkeypatch, cpus, reserved, threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    env = {} if reserved is None else {"VLLM_CPU_NUM_OF_RESERVED_CPU": reserved}
    assert cpu_worker_threads(env) == threads


def test_single_process_on_a_gpu_is_vllms_own_default(monkeypatch, tmp_path):
    monkeypatch.setattr(srv, "has_gpu", lambda: True)
    opts = _opts(single_process=True)
    assert "--distributed-executor-backend" not in build_argv(opts, 8000)
    env = build_env(opts, tmp_path)
    assert "OPSCTL_ENGINE_FORK" not in env and "OMP_NUM_THREADS" not in {
        k for k in env if env[k] != os.environ.get(k)
    }


def test_eager_is_not_repeated_when_given_after_the_double_dash():
    argv = build_argv(_opts(enforce_eager=True, extra_args=["--enforce-eager"]), 8000)
    assert argv.count("--enforce-eager") == 1
    assert "--enforce-eager" not in build_argv(_opts(enforce_eager=False), 8000)


def test_fork_patch_is_skipped_unless_asked(monkeypatch):
    from engine_patches.patches import engine_core_fork as fork

    monkeypatch.delenv(fork.ENV, raising=False)
    out = fork.apply()
    assert out.status == "skipped" and fork.ENV in out.detail


def test_fork_patch_sets_fork_only_for_the_uni_executor(monkeypatch):
    """Applied in-process on this CPU vLLM: after the platform's own config step (which
    sets spawn), the wrapped step leaves fork for a uni executor and spawn otherwise."""
    from types import SimpleNamespace

    from vllm.platforms import cpu

    from engine_patches.patches import engine_core_fork as fork

    monkeypatch.setenv(fork.ENV, "1")
    calls = []

    def platform_step(klass, cfg):  # stands in for the platform's own method
        calls.append(cfg)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"

    monkeypatch.setattr(cpu.CpuPlatform, "check_and_update_config", classmethod(platform_step))
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    try:
        assert fork.apply().status == "applied"
        assert fork.apply().detail == "already applied in this process"
        for backend, method in (("uni", "fork"), ("mp", "spawn")):
            cfg = SimpleNamespace(
                parallel_config=SimpleNamespace(distributed_executor_backend=backend)
            )
            cpu.CpuPlatform.check_and_update_config(cfg)
            assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == method
        assert len(calls) == 2
    finally:
        fork.revert()
