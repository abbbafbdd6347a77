"""The Trainer's ``parallelism_config``: accelerate's ``ParallelismConfig`` as a JSON object.

``TrainingArguments.parallelism_config`` (transformers 5.24 ``training_args.py``) is an accelerate
``ParallelismConfig``; ``HfArgumentParser`` leaves a JSON object there as a dict, so a script builds
``ParallelismConfig(**obj)`` (with ``sp_handler=DeepSpeedSequenceParallelConfig(**obj["sp_handler"])``)
from the keys of those dataclasses (accelerate 1.15 ``parallelism_config.py``, ``utils/dataclasses.py``).
The checks here are the ones those constructors make (``ParallelismConfig.__post_init__``,
``DeepSpeedSequenceParallelConfig.__post_init__``), plus the JSON types they expect. A size left
``null`` is read by accelerate from ``PARALLELISM_CONFIG_*`` variables, which the doctor cannot see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dsgen.errors import DsgenError

SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")
BACKENDS = {"cp_backend": "torch", "sp_backend": "deepspeed"}  # the only values __post_init__ accepts
HANDLERS = ("tp_handler", "cp_handler", "sp_handler")
FIELDS = (*SIZES, *BACKENDS, *HANDLERS)  # dataclasses.fields(ParallelismConfig)
SP_HANDLER_FIELDS = ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")
# DeepSpeedSequenceParallelConfig.__post_init__: "'eager' and 'flex_attention' are not supported"
SP_REFUSED_ATTENTION = ("eager", "flex_attention")


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_parallelism_config(value: Any, source: str) -> None:
    """Raise :class:`DsgenError` (naming the field and ``source``) for what ParallelismConfig refuses."""
    where = f"{source}: parallelism_config"
    if value is None:
        return
    if not isinstance(value, dict):
        raise DsgenError(f"{where} must be a JSON object of ParallelismConfig fields or null, got {value!r}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise DsgenError(f"{where}.{unknown[0]} is not a ParallelismConfig field (fields: {', '.join(FIELDS)})")
    for key in SIZES:
        size = value.get(key)
        if size is not None and not _int(size):
            raise DsgenError(f"{where}.{key} must be an integer or null, got {size!r}")
        if size is not None and size < 1:
            raise DsgenError(f"{where}.{key} must be at least 1, got {size} (ParallelismConfig.__post_init__)")
    for key, accepted in BACKENDS.items():
        backend = value.get(key)
        if backend is not None and backend != accepted:
            raise DsgenError(f"{where}.{key} must be {accepted!r} or null, got {backend!r}")
    for key in HANDLERS:
        handler = value.get(key)
        if handler is not None and not isinstance(handler, dict):
            raise DsgenError(f"{where}.{key} must be a JSON object or null, got {handler!r}")
    cp, sp = value.get("cp_size") or 1, value.get("sp_size") or 1
    if cp > 1 and sp > 1:
        raise DsgenError(
            f"{where}: cp_size {cp} and sp_size {sp}: Context Parallelism (CP) and Sequence Parallelism (SP) are "
            "mutually exclusive (ParallelismConfig.__post_init__)"
        )
    _check_sp_handler(value.get("sp_handler"), f"{where}.sp_handler")


def _check_sp_handler(handler: Mapping[str, Any] | None, where: str) -> None:
    if handler is None:
        return
    unknown = sorted(set(handler) - set(SP_HANDLER_FIELDS))
    if unknown:
        raise DsgenError(
            f"{where}.{unknown[0]} is not a DeepSpeedSequenceParallelConfig field "
            f"(fields: {', '.join(SP_HANDLER_FIELDS)})"
        )
    length = handler.get("sp_seq_length")
    if length is not None and not _int(length):
        raise DsgenError(f"{where}.sp_seq_length must be an integer or null, got {length!r}")
    variable = handler.get("sp_seq_length_is_variable")
    if variable is not None and not isinstance(variable, bool):
        raise DsgenError(f"{where}.sp_seq_length_is_variable must be true, false or null, got {variable!r}")
    attention = handler.get("sp_attn_implementation")
    if attention is not None and not isinstance(attention, str):
        raise DsgenError(f"{where}.sp_attn_implementation must be a string or null, got {attention!r}")
    if attention in SP_REFUSED_ATTENTION:
        raise DsgenError(
            f"{where}.sp_attn_implementation {attention!r}: 'eager' and 'flex_attention' are not supported with "
            "sequence parallelism (DeepSpeedSequenceParallelConfig.__post_init__)"
        )


def trainer_sp_size(trainer_args: Mapping[str, Any] | None) -> int | None:
    """``parallelism_config.sp_size`` from the Trainer arguments; None when they do not say."""
    block = (trainer_args or {}).get("parallelism_config")
    size = block.get("sp_size") if isinstance(block, Mapping) else None
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        return size
    return None


def sp_disagreement(config: Mapping[str, Any], trainer_sp: int | None) -> str | None:
    """Why the config's ``sequence_parallel_size`` and the Trainer's ``sp_size`` cannot both hold.

    Neither transformers nor accelerate copies ``sp_size`` into the DeepSpeed config. With
    ``sp_size`` > 1 accelerate hands DeepSpeed an mpu and ``DeepSpeedConfig.__init__`` divides by
    its SP size; without an mpu (``sp_size`` 1, or ZeRO-3's ``zero.Init``, the "HF zero.init case"
    in the same function) it divides by the config's key. So two readings of one run disagree."""
    given = config.get("sequence_parallel_size")
    config_sp = given if _int(given) else None
    if trainer_sp is None or config_sp is None or config_sp == trainer_sp:
        return None
    if trainer_sp > 1:
        return (
            f"the training arguments' parallelism_config.sp_size is {trainer_sp}, the config's "
            f"sequence_parallel_size {config_sp}: the Trainer's wins in deepspeed.initialize (accelerate "
            "Accelerator._prepare_deepspeed passes the mpu of UlyssesSPAttentionHF.register_with_transformers"
            f"(sequence_parallel_size={trainer_sp}), and DeepSpeedConfig.__init__ divides the world by "
            "mpu.get_sequence_parallel_world_size()), but DeepSpeedConfig built without an mpu (zero.Init at "
            f"ZeRO-3) divides by {config_sp}; the doctor prices sp {trainer_sp}"
        )
    return (
        f"the training arguments' parallelism_config.sp_size is 1 (no Ulysses: accelerate registers no mpu), "
        f"but the config's sequence_parallel_size is {config_sp}: DeepSpeedConfig.__init__ still divides the "
        f"batch world size by it (runtime/config.py, no mpu) while no rank shards the sequence"
    )


def accelerate_data_parallel_size(trainer_args: Mapping[str, Any] | None) -> int:
    """``ParallelismConfig.data_parallel_size``: ``dp_replicate_size x dp_shard_size``, each 1
    when the training arguments leave it out (its ``__post_init__`` default; a ``null`` would be
    read from ``PARALLELISM_CONFIG_DP_*``, which the doctor cannot see, and counts as 1 too)."""
    block = (trainer_args or {}).get("parallelism_config")
    if not isinstance(block, Mapping):
        return 1
    sizes: list[int] = []
    for key in ("dp_replicate_size", "dp_shard_size"):
        size = block.get(key)
        sizes.append(size if isinstance(size, int) and not isinstance(size, bool) else 1)
    return math.prod(sizes)
