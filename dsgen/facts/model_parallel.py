"""DeepSpeed's AutoTP and AutoEP rules: which model-parallel layouts a DeepSpeed release runs.

Pure functions over frozen dataclasses, no I/O, standard library only (like
:mod:`dsgen.facts.release`), so the solver, ``dsgen doctor`` and ``dsgen validate``
(:mod:`dsgen.validate.rules.model_parallel`) read one list. ``docs/model-parallel.md`` is the table.

A :class:`Layout` is what a run asks for (AutoTP ``tensor_parallel.autotp_size``, AutoEP
``expert_parallel``, Ulysses ``sequence_parallel_size``, the ZeRO stage and its options, the
release) plus what the model is (:class:`ModelFacts`). :func:`violations` returns what that
release refuses, each with the DeepSpeed function that raises and its message, or, where DeepSpeed
runs but not as asked (``raises=False``), what it does instead.

Every rule was read in the DeepSpeed 0.19.8 wheel; the release boundaries were read in DeepSpeed's
git tags (v0.16.3/v0.16.4, v0.19.1 .. v0.19.5): see the ``*_SINCE`` constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsgen.facts.release import release_key

# -- release boundaries (first release that runs the combination) --------------------------------
#: AutoTP training (``tensor_parallel.autotp_size``): v0.16.4 adds ``get_tensor_parallel_config`` to
#: ``runtime/config.py`` (v0.16.3 has no ``tensor_parallel`` and ignores the key); DeepSpeed's
#: blog ``blogs/huggingface-tp`` (PR #7206) states "deepspeed >= 0.16.4".
AUTOTP_SINCE = "0.16.4"
#: AutoTP with ZeRO-3: v0.16.4 .. v0.19.3 assert in ``_configure_tensor_parallel_states``; v0.19.4
#: replaces the assert with "AutoTP + ZeRO stage 3 is supported for both inference and training".
AUTOTP_ZERO3_SINCE = "0.19.4"
#: AutoEP (``expert_parallel``): ``module_inject/auto_ep*.py`` first ship in v0.19.2.
AUTOEP_SINCE = "0.19.2"
#: AutoEP with ZeRO-3: v0.19.2 asserts "MoE not supported with Stage 3" (``_configure_zero_optimizer``);
#: v0.19.3 adds ``_validate_zero3_moe_compatibility``.
AUTOEP_ZERO3_SINCE = "0.19.3"
#: AutoEP with AutoTP: v0.19.2 ``validate_autoep_config`` raises "AutoEP does not currently support
#: AutoTP"; v0.19.3 adds the folding (``module_inject/auto_ep_folding.py``).
AUTOEP_AUTOTP_SINCE = "0.19.3"
#: AutoEP + AutoTP + ZeRO-3: refused by v0.19.3 .. v0.19.5 (``validate_folding_global``: "AutoEP+AutoTP
#: with ZeRO stage 3 is reserved ...", and ``_validate_zero3_moe_compatibility``: "AutoEP with ZeRO
#: Stage 3 does not support AutoTP yet"); 0.19.8 has neither check. 0.19.6 and 0.19.7 were not read,
#: so they count as refusing (the solver proposes only what is known to run).
AUTOEP_AUTOTP_ZERO3_SINCE = "0.19.8"
#: AutoTP reads the model's HuggingFace ``tp_plan`` (``module_inject/tp_plan_converter.py``, first in
#: v0.18.9) and refuses a plan with styles it cannot apply, which the MoE models' plans have
#: (Transformers 5: ``moe_tp_experts``, ``packed_colwise``) unless a partition_config or preset is given.
HF_TP_PLAN_CHECK_SINCE = "0.18.9"


@dataclass(frozen=True)
class AutoEPPreset:
    """One AutoEP preset (``module_inject/auto_ep_presets/<name>.py``): the HF ``model_type`` values
    it replaces, and the first release that has it."""

    name: str
    hf_model_types: tuple[str, ...]
    since: str


#: ``auto_ep_presets/registry.py`` ``PRESET_MODELS``; every preset needs Transformers >= 5
#: (``min_transformers_version``: 5.0.0, Qwen3.5 5.2.0, MiniMax-M3 5.15.0). v0.19.2 .. v0.19.5 ship the
#: first five; minimax_m3 is in 0.19.8 (not in the v0.19.6 development tree).
AUTOEP_PRESETS: tuple[AutoEPPreset, ...] = (
    AutoEPPreset("mixtral", ("mixtral",), AUTOEP_SINCE),
    AutoEPPreset("qwen3_moe", ("qwen3_moe", "qwen2_moe"), AUTOEP_SINCE),
    AutoEPPreset("qwen3_5_moe", ("qwen3_5_moe_text",), AUTOEP_SINCE),
    AutoEPPreset("deepseek_v2", ("deepseek_v2",), AUTOEP_SINCE),
    AutoEPPreset("deepseek_v3", ("deepseek_v3",), AUTOEP_SINCE),
    AutoEPPreset("minimax_m3", ("minimax_m3_vl_text",), "0.19.8"),
)


def autoep_presets(release: str) -> tuple[AutoEPPreset, ...]:
    """The AutoEP presets ``release`` has (none before :data:`AUTOEP_SINCE`)."""
    return tuple(p for p in AUTOEP_PRESETS if _at_least(release, p.since))


def autoep_preset_for(model_type: str, release: str) -> str | None:
    """The preset AutoEP picks for an HF ``model_type`` (``preset_name_for_hf_model_type``), or None."""
    return next((p.name for p in autoep_presets(release) if model_type in p.hf_model_types), None)


# -- the layout -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFacts:
    """What the rules need to know about the model.

    ``moe_experts`` is the routed-expert count of each MoE layer (None: a dense model);
    ``model_type`` is the HF ``config.model_type``; ``kv_heads`` the key/value head count.
    Unknown facts are None and the rules that need them stay silent.
    """

    moe_experts: tuple[int, ...] | None = None
    model_type: str | None = None
    kv_heads: int | None = None


@dataclass(frozen=True)
class Layout:
    """A model-parallel layout as the DeepSpeed config states it, on ``world`` ranks.

    ``tp``: ``tensor_parallel.autotp_size`` (0 and 1 mean no AutoTP); ``autoep``:
    ``expert_parallel.enabled``; ``ep``: ``expert_parallel.autoep_size``; ``sp``: Ulysses
    ``sequence_parallel_size``. ``offload_optimizer`` / ``offload_param``: the ZeRO block is present
    (DeepSpeed tests ``is not None``, so a block with device "none" counts). ``partition_config``:
    ``tensor_parallel.partition_config`` or ``tensor_parallel.preset_model`` is set. ``world`` None:
    unknown (the world-size rules stay silent).
    """

    world: int | None = None
    tp: int = 1
    ep: int = 1
    autoep: bool = False
    sp: int = 1
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    quantized_gradients: bool = False
    hpz: int = 1
    release: str = "0.19.8"
    partition_config: bool = False
    ep_preset: str | None = None
    model: ModelFacts = field(default_factory=ModelFacts)

    @property
    def autotp(self) -> bool:
        return self.tp > 1


@dataclass(frozen=True)
class Violation:
    """One rule a layout breaks.

    ``rule``: a stable id (``docs/model-parallel.md``); ``field``: the config key (dotted) it
    concerns; ``message``: what DeepSpeed says (quoted) or does; ``source``: the DeepSpeed file and
    function; ``since``: the first release that supports the combination, where that is the point;
    ``raises``: DeepSpeed refuses the layout (False: it runs, but not as the layout says).
    """

    rule: str
    field: str
    message: str
    source: str
    since: str | None = None
    raises: bool = True


def _at_least(release: str, since: str) -> bool:
    return release_key(release) >= release_key(since)


def violations(layout: Layout) -> tuple[Violation, ...]:
    """Everything ``layout.release`` refuses in ``layout`` (and, with ``raises=False``, what it
    silently does otherwise), in a fixed order: releases, AutoTP, AutoEP."""
    found = [*_release_violations(layout), *_autotp_violations(layout), *_autoep_violations(layout)]
    return tuple(found)


def _release_violations(lay: Layout) -> list[Violation]:
    out: list[Violation] = []
    rel = lay.release
    if lay.autotp and not _at_least(rel, AUTOTP_SINCE):
        out.append(
            Violation(
                "autotp-release",
                "tensor_parallel.autotp_size",
                f"DeepSpeed {rel} has no AutoTP training: DeepSpeedConfig does not read tensor_parallel, so the run "
                "is plain data parallel with the whole model on every rank",
                "runtime/config.py DeepSpeedConfig._initialize_params (tensor_parallel_config from 0.16.4)",
                AUTOTP_SINCE,
                raises=False,
            )
        )
    elif lay.autotp and lay.zero_stage == 3 and not _at_least(rel, AUTOTP_ZERO3_SINCE):
        out.append(
            Violation(
                "autotp-zero3-release",
                "zero_optimization.stage",
                "Currently, the compatibility between 'autotp' and 'zero_stage = 3' has not been validated",
                "runtime/engine.py DeepSpeedEngine._configure_tensor_parallel_states (AssertionError, 0.16.4-0.19.3)",
                AUTOTP_ZERO3_SINCE,
            )
        )
    if not lay.autoep:
        return out
    if not _at_least(rel, AUTOEP_SINCE):
        out.append(
            Violation(
                "autoep-release",
                "expert_parallel",
                f"DeepSpeed {rel} has no AutoEP: DeepSpeedConfig ignores expert_parallel, so every rank holds every "
                "expert",
                "module_inject/auto_ep_config.py (first in 0.19.2)",
                AUTOEP_SINCE,
                raises=False,
            )
        )
        return out
    if lay.zero_stage == 3 and not _at_least(rel, AUTOEP_ZERO3_SINCE):
        out.append(
            Violation(
                "autoep-zero3-release",
                "zero_optimization.stage",
                "MoE not supported with Stage 3",
                "runtime/engine.py DeepSpeedEngine._configure_zero_optimizer (AssertionError, 0.19.2)",
                AUTOEP_ZERO3_SINCE,
            )
        )
    if lay.autotp and not _at_least(rel, AUTOEP_AUTOTP_SINCE):
        out.append(
            Violation(
                "autoep-autotp-release",
                "tensor_parallel.autotp_size",
                f"AutoEP does not currently support AutoTP (tensor_parallel.autotp_size={lay.tp}). Disable AutoTP for "
                "this run; AutoEP+AutoTP support is planned as follow-up work.",
                "module_inject/auto_ep_config.py validate_autoep_config (ValueError, 0.19.2)",
                AUTOEP_AUTOTP_SINCE,
            )
        )
    elif lay.autotp and lay.zero_stage == 3 and not _at_least(rel, AUTOEP_AUTOTP_ZERO3_SINCE):
        out.append(
            Violation(
                "autoep-autotp-zero3-release",
                "zero_optimization.stage",
                "AutoEP+AutoTP with ZeRO stage 3 is reserved for the separate ZeRO-3 composition lane. Use ZeRO stage "
                "0, 1, or 2 for this folding MVP.",
                "module_inject/auto_ep_folding.py validate_folding_global (ValueError, 0.19.3-0.19.5)",
                AUTOEP_AUTOTP_ZERO3_SINCE,
            )
        )
    return out


def _autotp_violations(lay: Layout) -> list[Violation]:
    if not lay.autotp or not _at_least(lay.release, AUTOTP_SINCE):
        return []
    out: list[Violation] = []
    if lay.world is not None and lay.world % lay.tp:
        out.append(
            Violation(
                "autotp-world",
                "tensor_parallel.autotp_size",
                f"tensor_parallel.autotp_size={lay.tp} must divide the stage size (world_size={lay.world}); without "
                "AutoEP the (world // tp, tp) device mesh fails to build",
                "module_inject/auto_ep_folding.py build_folding_spec (with AutoEP); utils/groups.py "
                "_init_tp_mesh_device (without)",
            )
        )
    if lay.sp > 1:
        if lay.autoep and _at_least(lay.release, AUTOEP_SINCE):
            message = (
                "tensor_parallel.autotp_size and Ulysses sequence parallelism are mutually exclusive for AutoEP "
                f"folding (autotp_size={lay.tp}, sp_size={lay.sp})."
            )
            source = "module_inject/auto_ep_folding.py validate_folding_global (ValueError)"
        else:
            message = (
                "Data inconsistency within the TP group. Please check the Dataloader implementation to ensure "
                "consistency. (AutoTP replaces the Ulysses mpu with its own groups, and the sequence shards differ "
                "within a TP group: the first forward fails)"
            )
            source = (
                "runtime/engine.py DeepSpeedEngine._configure_tensor_parallel_states "
                "(check_dataloader_inputs_same_across_ranks)"
            )
        out.append(Violation("autotp-ulysses", "sequence_parallel_size", message, source))
    if lay.model.moe_experts is not None and not lay.partition_config:
        checked = _at_least(lay.release, HF_TP_PLAN_CHECK_SINCE)
        message = (
            "HuggingFace tp_plan contains unsupported partition style(s): ['moe_tp_experts', 'packed_colwise']. "
            "Applying only the supported entries could shard one half of a column/row pair, so the plan is rejected "
            "as a whole. Provide an explicit 'tensor_parallel.partition_config' for this model instead."
        )
        if not checked:
            message = (
                f"DeepSpeed {lay.release} shards an MoE model with its heuristic AutoTP parser (module names only); "
                "give an explicit tensor_parallel.partition_config (not verified before 0.18.9)"
            )
        out.append(
            Violation(
                "autotp-moe-partition",
                "tensor_parallel.partition_config",
                message,
                "module_inject/tp_plan_converter.py TPPlanConverter.convert, from "
                "runtime/engine.py DeepSpeedEngine._apply_autotp_partitioning (ValueError)",
                raises=checked,
            )
        )
    kv = lay.model.kv_heads
    if kv is not None and lay.tp > kv:
        out.append(
            Violation(
                "autotp-kv-heads",
                "tensor_parallel.autotp_size",
                f"AutoTP: autotp_size ({lay.tp}) exceeds the model's key-value head count ({kv}); ranks beyond the "
                "head count hold no attention shard and attention throughput will not scale past that point.",
                "runtime/engine.py DeepSpeedEngine._apply_autotp_partitioning (a warning)",
                raises=False,
            )
        )
    return out


def _autoep_violations(lay: Layout) -> list[Violation]:
    if not lay.autoep or not _at_least(lay.release, AUTOEP_SINCE):
        return []
    out: list[Violation] = []
    ep = lay.ep
    if lay.world is not None and ep >= 1 and lay.world % ep:
        out.append(
            Violation(
                "autoep-size-world",
                "expert_parallel.autoep_size",
                f"expert_parallel.autoep_size * expert_parallel.expert_tensor_parallel_size ({ep} * 1 = {ep}) must "
                f"divide the stage size (world_size={lay.world} / pp_size=1 = {lay.world}).",
                "module_inject/auto_ep_folding.py build_folding_spec (ValueError)",
            )
        )
    for index, experts in enumerate(lay.model.moe_experts or ()):
        if ep > experts:
            message = (
                f"autoep_size={ep} exceeds num_experts={experts} in MoE layer {index}. "
                "Each rank must own at least one expert."
            )
        elif experts % ep:
            message = f"num_experts={experts} in MoE layer {index} is not divisible by autoep_size={ep}."
        else:
            continue
        out.append(
            Violation(
                "autoep-size-experts",
                "expert_parallel.autoep_size",
                message,
                "module_inject/auto_ep_config.py validate_autoep_post_detection (ValueError)",
            )
        )
        break
    out.extend(_autoep_model_violations(lay))
    if lay.zero_stage == 3 and _at_least(lay.release, AUTOEP_ZERO3_SINCE):
        zero3 = "runtime/engine.py DeepSpeedEngine._validate_zero3_moe_compatibility (AssertionError)"
        if lay.sp > 1:
            msg = (
                f"AutoEP with ZeRO Stage 3 does not support sequence parallelism yet (sequence_parallel_size={lay.sp})."
            )
            out.append(Violation("autoep-zero3-conflict", "sequence_parallel_size", msg, zero3))
        if lay.quantized_gradients:
            msg = "AutoEP with ZeRO Stage 3 does not support zero_quantized_gradients yet."
            out.append(Violation("autoep-zero3-conflict", "zero_optimization.zero_quantized_gradients", msg, zero3))
        if lay.hpz > 1:
            msg = (
                "AutoEP with ZeRO Stage 3 does not support hpZeRO secondary tensor groups yet "
                f"(zero_optimization.zero_hpz_partition_size={lay.hpz})."
            )
            out.append(Violation("autoep-zero3-conflict", "zero_optimization.zero_hpz_partition_size", msg, zero3))
    if lay.autotp and _at_least(lay.release, AUTOEP_AUTOTP_SINCE):
        folding = "module_inject/auto_ep_folding.py validate_folding_global (ValueError)"
        if ep == 1:
            msg = (
                "AutoEP+AutoTP folding requires expert_parallel.autoep_size > 1. The ep=1 local-computation path "
                "would duplicate routed-token gradients across TP lanes."
            )
            out.append(Violation("autoep-autotp-conflict", "expert_parallel.autoep_size", msg, folding))
        if lay.offload_optimizer or lay.offload_param:
            which = "offload_optimizer" if lay.offload_optimizer else "offload_param"
            msg = (
                "ZeRO optimizer/parameter offload with AutoEP+AutoTP folding is not validated yet. Disable offload or "
                "run a follow-up proof for per-family replica groups."
            )
            out.append(Violation("autoep-autotp-conflict", f"zero_optimization.{which}", msg, folding))
    return out


def _autoep_model_violations(lay: Layout) -> list[Violation]:
    presets = autoep_presets(lay.release)
    names = [p.name for p in presets]
    if lay.ep_preset is not None and lay.ep_preset not in names:
        return [
            Violation(
                "autoep-model-type",
                "expert_parallel.preset_model",
                f"Unknown preset_model '{lay.ep_preset}'. Available presets: {names}",
                "module_inject/auto_ep_config.py validate_autoep_config (ValueError)",
            )
        ]
    if lay.model.moe_experts is None:
        if lay.model.model_type is None and lay.ep_preset is None:
            return []
        # A dense model: nothing to replace. With a preset AutoEP raises; without it only warns.
        return [
            Violation(
                "autoep-model-type",
                "expert_parallel.enabled",
                "AutoEP: no MoE layers detected in model.",
                "module_inject/auto_ep.py AutoEP.ep_parser (a warning; a ValueError when preset_model is set)",
                raises=lay.ep_preset is not None,
            )
        ]
    model_type = lay.model.model_type
    if lay.ep_preset is None and model_type is not None and autoep_preset_for(model_type, lay.release) is None:
        later = next((p for p in AUTOEP_PRESETS if model_type in p.hf_model_types), None)
        supported = sorted(t for p in presets for t in p.hf_model_types)
        return [
            Violation(
                "autoep-model-type",
                "expert_parallel.preset_model",
                f"AutoEP has no preset for model_type '{model_type}' (supported: {supported}): it detects no MoE "
                "layer ('AutoEP: no MoE layers detected in model.') and every rank holds every expert",
                "module_inject/auto_ep_presets/registry.py preset_name_for_hf_model_type; module_inject/auto_ep.py "
                "AutoEP.ep_parser (a warning)",
                later.since if later is not None else None,
                raises=False,
            )
        ]
    return []


# -- the batch under AutoTP -----------------------------------------------------------------------
@dataclass(frozen=True)
class TpBatch:
    """The batch of a run with AutoTP (and Ulysses SP), as DeepSpeed counts it and as it is.

    ``asserted_world``: the ``world_size`` ``DeepSpeedConfig._batch_assertion`` checks
    ``train_batch_size`` against (no mpu, the config path: ``dist.get_world_size()``, divided by
    ``sequence_parallel_size`` when the config has it; AutoTP does not divide it).
    ``train_batch_size``: micro x accumulation x asserted_world, the only value DeepSpeed accepts.
    ``data_parallel``: ranks that hold different samples (world / (tp x sp)).
    ``samples_per_step``: the distinct samples one optimizer step consumes (the ranks of a TP group
    consume one micro-batch). ``overcount``: train_batch_size / samples_per_step, i.e. tp.
    """

    asserted_world: int | float
    train_batch_size: int | float
    data_parallel: int
    samples_per_step: int
    overcount: int


def batch_world(world: int, sp: int = 1) -> int | float:
    """``DeepSpeedConfig.world_size`` without an mpu (``runtime/config.py`` ``DeepSpeedConfig.__init__``):
    the whole world, divided (true division, as DeepSpeed does) by ``sequence_parallel_size``. AutoTP
    does not divide it: a 2-rank run with ``autotp_size`` 2 accepts ``train_batch_size = micro x
    accumulation x 2`` and refuses ``x 1`` ("2 != 1 * 2 * 2"), tests/test_model_parallel_rules.py."""
    return world / sp if sp > 1 else world


def tp_batch(micro: int, accumulation: int, world: int, tp: int = 1, sp: int = 1) -> TpBatch:
    """The batch DeepSpeed asserts and the batch a step consumes, for ``world`` ranks in TP groups of
    ``tp`` (and SP groups of ``sp``). ValueError when tp x sp does not divide the world."""
    tp, sp = max(tp, 1), max(sp, 1)
    if world < 1 or world % (tp * sp):
        raise ValueError(f"tp {tp} x sp {sp} does not divide the world size {world}")
    asserted = batch_world(world, sp)
    data_parallel = world // (tp * sp)
    samples = micro * accumulation * data_parallel
    return TpBatch(asserted, micro * accumulation * asserted, data_parallel, samples, tp)
