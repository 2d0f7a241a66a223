"""engine_info's describe() against vLLM 0.32's real config objects (no engine): the
settings kv-fail names vLLM's recovery defects by. On this CPU build async scheduling
is off and the V1 runner runs; a vLLM without the V2 runner setting records null (not
false: unknown is not "off"), and so does one whose setting raises."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

from engine_patches.patches.engine_info import describe
from opsctl.engine.model import resolve


@pytest.fixture(scope="module")
def scheduler():
    vc = VllmConfig(
        model_config=ModelConfig(model=str(resolve("tiny-llama").path), dtype="float32", seed=0),
        scheduler_config=SchedulerConfig(
            max_num_seqs=4, max_num_batched_tokens=1024, max_model_len=256, is_encoder_decoder=False
        ),
        cache_config=CacheConfig(block_size=32),
        device_config=DeviceConfig("cpu"),
    )
    full = FullAttentionSpec(block_size=32, num_kv_heads=1, head_size=8, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], full)]
    )
    return SimpleNamespace(vllm_config=vc, kv_cache_config=kv)


def test_cpu_vllm_records_async_scheduling_off_and_the_v1_runner(scheduler):
    info = describe(scheduler)
    assert info["async_scheduling"] is False
    assert info["v2_model_runner"] is False
    assert info["kv_cache_groups"][0]["spec"] == "FullAttentionSpec"


class _NoV2:
    """A vLLM config without ``use_v2_model_runner`` (releases before the V2 runner)."""

    def __init__(self, vc):
        self._vc = vc

    def __getattr__(self, name):
        if name == "use_v2_model_runner":
            raise AttributeError(name)
        return getattr(self._vc, name)


class _Raises(_NoV2):
    @property
    def use_v2_model_runner(self):
        raise ValueError("HiSparse requires Model Runner V2")


def test_a_missing_or_failing_setting_is_null(scheduler):
    for wrapper in (_NoV2, _Raises):
        s = SimpleNamespace(
            vllm_config=wrapper(scheduler.vllm_config), kv_cache_config=scheduler.kv_cache_config
        )
        info = describe(s)
        assert info["v2_model_runner"] is None, wrapper
        assert info["async_scheduling"] is False, wrapper
    s = SimpleNamespace(
        vllm_config=SimpleNamespace(
            **{k: getattr(scheduler.vllm_config, k) for k in ("model_config", "cache_config")},
            scheduler_config=SimpleNamespace(async_scheduling=None),
            compilation_config=None,
            kv_transfer_config=None,
        ),
        kv_cache_config=scheduler.kv_cache_config,
    )
    info = describe(s)
    assert info["async_scheduling"] is None and info["v2_model_runner"] is None
