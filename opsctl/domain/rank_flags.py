"""The ranks an operator asks for (pure): opsctl's ``--tp``/``--dp`` and vLLM's own flags.

One grammar for every command that starts an engine: ``--tp N`` and ``--dp N``, or vLLM's
``--tensor-parallel-size N`` / ``-tp N`` and ``--data-parallel-size N`` / ``-dp N`` after
``--`` (``=N`` and underscore spellings too, as vLLM's parser takes them). Both read as the
same ranks; one rank given twice (both ways, or twice after ``--``) is refused, as is a
size below 1. :func:`head_refusal` refuses a tensor-parallel size the model's attention
heads do not divide, exactly where vLLM 0.32 refuses it (``ModelConfig.
verify_with_parallel_config`` for the query heads, ``QKVParallelLinear`` for the KV heads,
the latter only once the workers load the model).

Every refusal is a ``ValueError`` with one line for the operator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# vLLM's spellings of each rank flag (its parser also takes underscores for dashes)
FLAGS: dict[str, tuple[str, ...]] = {
    "tp": ("--tensor-parallel-size", "-tp"),
    "dp": ("--data-parallel-size", "-dp"),
}
OPSCTL_FLAG = {"tp": "--tp", "dp": "--dp"}


@dataclass(frozen=True, slots=True)
class RankArgs:
    """The ranks found in vLLM arguments (None: not given) and the arguments left."""

    tp: int | None = None
    dp: int | None = None
    rest: tuple[str, ...] = ()


def size(value: Any, flag: str) -> int:
    """``value`` as a rank count of at least 1 (ValueError naming ``flag`` otherwise)."""
    try:
        n = int(str(value), 10)
    except ValueError:
        raise ValueError(f"{flag} takes a whole number of ranks, not {value!r}") from None
    if n < 1:
        raise ValueError(f"{flag} must be at least 1, not {n}")
    return n


def _axis_of(arg: str) -> tuple[str, str, str | None] | None:
    """(axis, flag as written, value after '=') when ``arg`` is a rank flag; else None."""
    name, eq, value = arg.partition("=")
    spelled = name if name.startswith("-") and not name.startswith("--") else name.replace("_", "-")
    for axis, flags in FLAGS.items():
        if spelled in flags:
            return axis, name, value if eq else None
    return None


def split(args: Sequence[str]) -> RankArgs:
    """The rank flags among vLLM ``args``, and the other arguments in their order.

    ValueError: a rank flag without a value, given twice, or not a size of at least 1."""
    found: dict[str, int] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        hit = _axis_of(args[i])
        if hit is None:
            rest.append(args[i])
            i += 1
            continue
        axis, flag, value = hit
        if value is None:
            if i + 1 >= len(args):
                raise ValueError(f"{flag} needs a value (a number of ranks)")
            value, i = args[i + 1], i + 2
        else:
            i += 1
        if axis in found:
            raise ValueError(f"the {axis.upper()} size is given twice after '--' ({flag})")
        found[axis] = size(value, flag)
    return RankArgs(found.get("tp"), found.get("dp"), tuple(rest))


def merge(tp: int | None, dp: int | None, args: Sequence[str]) -> RankArgs:
    """opsctl's ``--tp``/``--dp`` and vLLM's flags among ``args`` as one set of ranks.

    Unset ranks are 1. ValueError: a rank given both ways, or any refusal of :func:`split`."""
    ours = {"tp": None if tp is None else size(tp, "--tp"),
            "dp": None if dp is None else size(dp, "--dp")}  # fmt: skip
    theirs = split(args)
    out: dict[str, int] = {}
    for axis in FLAGS:
        mine, vllm = ours[axis], getattr(theirs, axis)
        if mine is not None and vllm is not None:
            raise ValueError(
                f"the {axis.upper()} size is given twice: {OPSCTL_FLAG[axis]} {mine} and "
                f"vLLM's {FLAGS[axis][0]} {vllm} after '--' (give one)"
            )
        out[axis] = mine or vllm or 1
    return RankArgs(out["tp"], out["dp"], theirs.rest)


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, Mapping) and "num_attention_heads" in text else config


def heads(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """(attention heads, KV heads) of a model's config.json; None when it names none."""
    text = _text_config(config)
    q = text.get("num_attention_heads")
    if not isinstance(q, int) or q < 1:
        return None
    kv = text.get("num_key_value_heads")
    return q, kv if isinstance(kv, int) and kv >= 1 else q


def head_refusal(config: Mapping[str, Any], tp: int, model: str = "the model") -> str | None:
    """Why vLLM would refuse tensor-parallel size ``tp`` for this model; None if it would not.

    The attention heads must divide by ``tp``; the KV heads must divide by ``tp`` or, when
    there are fewer KV heads than ranks, divide ``tp`` (each then replicated)."""
    found = heads(config)
    if tp <= 1 or found is None:
        return None
    q, kv = found
    if q % tp:
        return f"{model} has {q} attention heads, which {tp} tensor-parallel ranks do not divide"
    if (kv % tp) if kv >= tp else (tp % kv):
        return (
            f"{model} has {kv} KV heads, which {tp} tensor-parallel ranks cannot share "
            f"(neither divides the other)"
        )
    return None


EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
EXTERNAL_LB = ("--data-parallel-external-lb", "--data-parallel-rank", "-dpr")


def experts(config: Mapping[str, Any]) -> int:
    """The model's routed experts as vLLM 0.32 counts them (0: not a mixture of experts)."""
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else config
    for key in EXPERT_KEYS:
        if key in text:
            n = text[key]
            n = n[0] if isinstance(n, list) and n else n
            if isinstance(n, int) and n:
                return n
            break
    blocks = text.get("block_configs") or []
    moe = [b.get("n_routed_experts", 0) for b in blocks if isinstance(b, Mapping)
           and b.get("block_type") == "moe"]  # fmt: skip
    return max(moe, default=0)


def dp_refusal(config: Mapping[str, Any], dp: int, args: Sequence[str]) -> str | None:
    """Why vLLM would refuse data parallelism with ``args`` for this model; None if not.

    vLLM 0.32 refuses external load balancing (``--data-parallel-external-lb`` or
    ``--data-parallel-rank``) with several engines of a model without experts
    (``EngineArgs.create_engine_config``), only once its API server runs."""
    if dp <= 1 or experts(config):
        return None
    for arg in args:
        name = arg.partition("=")[0]
        if (name if not name.startswith("--") else name.replace("_", "-")) in EXTERNAL_LB:
            return (
                f"vLLM refuses {name} with --dp {dp} for a model without experts: "
                "non-MoE models do not support external data parallel mode"
            )
    return None


def divisors_hint(config: Mapping[str, Any], most: int) -> str:
    """The tensor-parallel sizes up to ``most`` the model's heads allow, for a hint."""
    ok = [str(n) for n in range(1, max(1, most) + 1) if head_refusal(config, n) is None]
    return "--tp " + " or ".join(ok) if ok else "--tp 1"


def argv(tp: int, dp: int) -> list[str]:
    """vLLM's arguments for ``tp`` and ``dp`` (none for a size of 1)."""
    return [*(["--tensor-parallel-size", str(tp)] if tp > 1 else []),
            *(["--data-parallel-size", str(dp)] if dp > 1 else [])]  # fmt: skip
