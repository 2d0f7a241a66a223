"""vLLM's real Scheduler built without an engine, for the KV patches' tests.

Built the way upstream's tests/v1/kv_connector/unit/utils.py builds them: a
:class:`VllmConfig` on a CPU device (:func:`vllm_config`), a :class:`KVCacheConfig` of
the groups a test names, and the real scheduler class (:func:`scheduler`);
:class:`HmaConnector` is the mocked scheduler-side connector of a hybrid layout.
"""

from __future__ import annotations

from unittest.mock import Mock

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

init_none_hash(sha256)


class HmaConnector(Mock, SupportsHMA):
    """A mocked scheduler-side connector that keeps its hybrid-allocator identity."""

    def request_finished_all_groups(self, request, block_ids):
        """Keep no block for a finished request and send nothing (a mocked answer)."""
        return False, None


def example_transfer(policy: str) -> KVTransferConfig:
    """vLLM's ExampleConnector on both roles with ``policy`` for failed KV loads."""
    return KVTransferConfig(
        kv_connector="ExampleConnector", kv_role="kv_both", kv_load_failure_policy=policy
    )


def vllm_config(
    model_dir: str,
    kv_transfer: KVTransferConfig,
    *,
    block: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    prefix_caching: bool | None = True,
    **scheduler_kw,
) -> VllmConfig:
    """A float32, seed-0, CPU VllmConfig of ``model_dir`` with these scheduler limits.

    ``prefix_caching`` None leaves vLLM's default; ``scheduler_kw`` go to
    SchedulerConfig (``async_scheduling=True``...).
    """
    cache = {} if prefix_caching is None else {"enable_prefix_caching": prefix_caching}
    return VllmConfig(
        model_config=ModelConfig(model=model_dir, dtype="float32", seed=0),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            **scheduler_kw,
        ),
        cache_config=CacheConfig(block_size=block, **cache),
        kv_transfer_config=kv_transfer,
        device_config=DeviceConfig("cpu"),
    )


def attention(block: int, head_size: int = 1) -> FullAttentionSpec:
    """A full-attention spec of one float32 KV head."""
    return FullAttentionSpec(
        block_size=block, num_kv_heads=1, head_size=head_size, dtype=torch.float32
    )


def scheduler(
    config: VllmConfig,
    groups: list[KVCacheGroupSpec],
    num_blocks: int,
    cls: type[Scheduler] = Scheduler,
) -> Scheduler:
    """A ``cls`` scheduler over ``num_blocks`` KV blocks shared by ``groups``."""
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
    )
    config.cache_config.num_gpu_blocks = num_blocks
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=config.cache_config.block_size,
    )
