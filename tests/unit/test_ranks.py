"""opsctl.domain.ranks: vLLM process titles -> roles, DP inheritance, CPU binding."""

from __future__ import annotations

import pytest

from opsctl.domain import ranks


@pytest.mark.parametrize(
    ("title", "role"),
    [
        ("VLLM::EngineCore", "EngineCore"),
        ("VLLM::EngineCore_DP1", "EngineCore_DP1"),
        ("VLLM::Worker_TP1", "Worker_TP1"),
        ("VLLM::Worker_DP0_PP1_TP0", "Worker_DP0_PP1_TP0"),
        ("VLLM::Worker", "Worker"),
        ("VLLM::DPCoordinator", "DPCoordinator"),
        ("VLLM::APIServer_2", "APIServer_2"),
        ("MYPREFIX::Worker_TP3", "Worker_TP3"),  # VLLM_PROCESS_NAME_PREFIX
        ("python -m vllm.entrypoints.openai.api_server --model /m/Worker", None),
        ("g++ -O2 x.cpp", None),
    ],
)
def test_titles(title, role):
    rank = ranks.parse_title(title)
    assert (rank.role if rank else None) == role


def test_a_dp_worker_without_its_rank_in_the_title_takes_its_engines():
    # vLLM 0.32, --data-parallel-size 2: the workers are titled plain "VLLM::Worker"
    members = [
        ranks.Member(10, 1, "python -m vllm.entrypoints.openai.api_server", is_root=True),
        ranks.Member(11, 10, "VLLM::DPCoordinator"),
        ranks.Member(12, 10, "VLLM::EngineCore_DP0"),
        ranks.Member(13, 10, "VLLM::EngineCore_DP1"),
        ranks.Member(14, 13, "VLLM::Worker"),
        ranks.Member(15, 12, "VLLM::Worker"),
        ranks.Member(16, 10, "python -c from multiprocessing.resource_tracker import main"),
    ]
    found = {pid: (r.role if r else None) for pid, r in ranks.rank_ids(members).items()}
    assert found == {
        10: "APIServer",
        11: "DPCoordinator",
        12: "EngineCore_DP0",
        13: "EngineCore_DP1",
        14: "Worker_DP1",
        15: "Worker_DP0",
        16: None,
    }
    assert ranks.engine_of("Worker_DP1") == 1 and ranks.engine_of("EngineCore") == 0
    assert ranks.engine_of("APIServer") is None


def test_roles_sort_by_engine_then_rank():
    roles = ["Worker_DP1", "EngineCore_DP1", "APIServer", "DPCoordinator", "Worker_DP0"]
    roles += ["EngineCore_DP0"]
    assert sorted(roles, key=ranks.order_key) == [
        "APIServer",
        "DPCoordinator",
        "EngineCore_DP0",
        "Worker_DP0",
        "EngineCore_DP1",
        "Worker_DP1",
    ]


@pytest.mark.parametrize(
    ("cpus", "layout", "bind"),
    [
        ([0, 1], ranks.Layout(tp=2), "0|1"),
        ([0, 1], ranks.Layout(dp=2), "0|1"),
        (range(16), ranks.Layout(tp=2, dp=2), "0-3|4-7|8-11|12-15"),
        ([0, 1, 2, 3, 4], ranks.Layout(tp=2), "0-1|2-4"),
        ([2, 5, 6, 7], ranks.Layout(tp=2), "2,5|6-7"),
    ],
)
def test_cpu_binding_gives_each_rank_its_own_cpus(cpus, layout, bind):
    assert ranks.cpu_binding(cpus, layout) == bind


def test_fewer_cpus_than_ranks_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"TP=2 x DP=2 needs 4 CPUs .* may use 2 \(0-1\)"):
        ranks.cpu_binding([0, 1], ranks.Layout(tp=2, dp=2))
