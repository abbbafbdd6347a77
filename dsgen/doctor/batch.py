"""The batch triple as DeepSpeed derives and asserts it, and consistent values when it fails.

``DeepSpeedConfig.__init__`` (deepspeed/runtime/config.py) takes its batch world size from the
launcher's world size divided by ``sequence_parallel_size`` (no mpu: the HF/Accelerate case);
with AutoTP it is the *full* world size. ``_set_batch_related_parameters`` fills the missing
member of (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps) with
floor divisions, and ``_batch_assertion`` then asserts
``train_batch_size == micro * accumulation * world_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsgen.doctor.keys import get
from dsgen.validate.rules.batch import fill_batch_triple


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Parallel:
    """Model-parallel sizes the config states, and the data-parallel sizes they leave."""

    world_size: int
    sequence_parallel: int = 1
    tensor_parallel: int = 1  # AutoTP (tensor_parallel.autotp_size)
    pipeline_parallel: int = 1  # pipeline.stages when it is a number

    @property
    def batch_world(self) -> int | float:
        """The ``world_size`` of DeepSpeed's batch assertion (a true division with Ulysses, as
        DeepSpeed does, so its message shows e.g. ``4.0``)."""
        if self.sequence_parallel > 1:
            return self.world_size / self.sequence_parallel
        return self.world_size

    @property
    def data_parallel(self) -> int:
        """Ranks that hold different samples: what ZeRO partitions over."""
        return max(1, self.world_size // (self.sequence_parallel * self.tensor_parallel * self.pipeline_parallel))


def parallel_of(config: Mapping[str, Any], world_size: int, trainer_sp: int | None = None) -> Parallel:
    """The layout the config states; a Trainer ``parallelism_config.sp_size`` above 1 replaces the
    config's ``sequence_parallel_size``: accelerate then builds the mpu with it
    (``Accelerator._prepare_deepspeed``: ``UlyssesSPAttentionHF.register_with_transformers``) and
    ``DeepSpeedConfig.__init__`` divides the world by ``mpu.get_sequence_parallel_world_size()``
    without reading the config's key. At sp_size 1 there is no mpu and the config's key divides."""
    config_sp = max(1, _int(config.get("sequence_parallel_size")) or 1)
    return Parallel(
        world_size=world_size,
        sequence_parallel=trainer_sp if trainer_sp is not None and trainer_sp > 1 else config_sp,
        tensor_parallel=max(1, _int(get(config, "tensor_parallel.autotp_size", 1)) or 1),
        pipeline_parallel=max(1, _int(get(config, "pipeline.stages", 1)) or 1),
    )


@dataclass(frozen=True)
class Batch:
    """What DeepSpeed ends up with, and the assertion it raises (``error``) if any."""

    train_batch_size: int | None
    micro_batch_size: int | None
    gradient_accumulation_steps: int | None
    world: int | float
    error: str | None = None
    consistent: tuple[dict[str, int], ...] = ()  # alternatives DeepSpeed accepts

    @property
    def ok(self) -> bool:
        return self.error is None


def derive(config: Mapping[str, Any], parallel: Parallel) -> Batch:
    """Replay ``_set_batch_related_parameters`` and ``_batch_assertion`` on concrete values."""
    tb: int | float | None = _int(config.get("train_batch_size"))
    mb: int | float | None = _int(config.get("train_micro_batch_size_per_gpu"))
    ga: int | float | None = _int(config.get("gradient_accumulation_steps"))
    world = parallel.batch_world
    tb, mb, ga = fill_batch_triple(tb, mb, ga, world)
    if tb is None and mb is None:
        return Batch(
            None,
            None,
            None if ga is None else int(ga),
            world,
            error="Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided",
        )
    assert tb is not None and mb is not None and ga is not None
    problems = []
    for name, value in (
        ("Train batch size", tb),
        ("Micro batch size per gpu", mb),
        ("Gradient accumulation steps", ga),
    ):
        if value <= 0:
            problems.append(f"{name}: {value} has to be greater than 0")
    if not problems and tb != mb * ga * world:
        problems.append(
            "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
            f"gradient_acc_step * world_size {tb} != {mb} * {ga} * {world}"
        )
    as_ints = (int(tb), int(mb), int(ga))
    if problems:
        return Batch(*as_ints, world, error=problems[0], consistent=tuple(_consistent(*as_ints, world)))
    return Batch(*as_ints, world)


def _consistent(tb: int, mb: int, ga: int, world: int | float) -> list[dict[str, int]]:
    """Values DeepSpeed accepts at this world size: keep the global batch where it divides,
    else keep micro-batch and accumulation and restate the global batch."""
    options: list[dict[str, int]] = []
    if not float(world).is_integer() or world < 1:
        return options
    w = int(world)
    if tb > 0 and tb % w == 0:
        per_rank = tb // w
        if mb > 0 and per_rank % mb == 0:
            options.append(
                {
                    "train_batch_size": tb,
                    "train_micro_batch_size_per_gpu": mb,
                    "gradient_accumulation_steps": per_rank // mb,
                }
            )
        if ga > 0 and per_rank % ga == 0 and (per_rank // ga) != mb:
            options.append(
                {
                    "train_batch_size": tb,
                    "train_micro_batch_size_per_gpu": per_rank // ga,
                    "gradient_accumulation_steps": ga,
                }
            )
    if mb <= 0 or ga <= 0:
        mb, ga = max(mb, 1), max(ga, 1)
        if tb % (w * mb) == 0 and tb > 0:
            options.append(
                {
                    "train_batch_size": tb,
                    "train_micro_batch_size_per_gpu": mb,
                    "gradient_accumulation_steps": tb // (w * mb),
                }
            )
    if mb > 0 and ga > 0:
        options.append(
            {"train_batch_size": mb * ga * w, "train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga}
        )
    unique: list[dict[str, int]] = []
    for option in options:
        if option not in unique:
            unique.append(option)
    return unique
