"""What a long-context plan adds to a bundle: Accelerate's SP settings and the calls no file can carry.

Accelerate 1.15 reads Ulysses SP from its config file's ``parallelism_config`` block (keys
``parallelism_config_sp_*``, which ``accelerate launch`` exports as ``PARALLELISM_CONFIG_SP_*``:
``commands/launch.py`` and ``utils/launch.py`` ``prepare_extend_env_parallelism_config``), and an
``Accelerator`` built without a ``ParallelismConfig`` reads those variables when
``ACCELERATE_USE_PARALLELISM_CONFIG`` is true (``accelerator.py``; ``ParallelismConfig.__post_init__``,
``DeepSpeedSequenceParallelConfig.__post_init__``). The HF Trainer builds its Accelerator that way
unless ``TrainingArguments(parallelism_config=...)`` is given (``trainer.py``
``create_accelerator_and_postprocess``), and then registers ``UlyssesSPAttentionHF``, wraps the
data loader (``deepspeed_ulysses_dl_adapter``) and reduces the loss over the SP group
(``deepspeed_sp_compute_loss``) itself. TiledMLP, the tiled loss and checkpoint offload are code
in every case.
"""

from __future__ import annotations

from dsgen.catalog.gpu import GpuSpec
from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError
from dsgen.estimate.sequence_parallel import tiled_mlp_shards
from dsgen.facts.release import release_key
from dsgen.plan import Plan
from dsgen.spec.types import Spec
from dsgen.units import FP32, gib
from dsgen.vocabulary import HF_ATTN_IMPLEMENTATION


def check_target(plan: Plan, target: str) -> None:
    """Refuse a Ulysses plan for a framework that cannot run it. Lightning's DeepSpeedStrategy calls
    ``deepspeed.initialize`` without an ``mpu``, and without one DeepSpeed's sequence-parallel size is
    1 (``utils/groups.py`` ``_get_sequence_parallel_world_size``), so gradients would not be averaged
    over the SP group."""
    if target == "lightning" and plan.sequence_parallel_size > 1:
        raise DsgenError(
            f"the plan uses Ulysses sequence parallelism (sequence_parallel_size {plan.sequence_parallel_size}), "
            "which Lightning's DeepSpeedStrategy cannot start: it passes no mpu to deepspeed.initialize",
            path="output.target",
            hint="use --target hf-trainer, accelerate or deepspeed, or pin constraints.sequence_parallel_size: 1",
        )


def ds_config_keys(plan: Plan) -> dict[str, object]:
    """Top-level DeepSpeed keys: ``sequence_parallel_size`` and the gradient-reduction dtype
    the plan was priced with (DeepSpeed's default, written so the config says it)."""
    if plan.sequence_parallel_size == 1:
        return {}
    return {
        "sequence_parallel_size": plan.sequence_parallel_size,
        "seq_parallel_communication_data_type": plan.long_context.communication_dtype,
    }


def accelerate_parallelism_config(spec: Spec, plan: Plan) -> dict[str, object]:
    """The ``parallelism_config`` block of ``accelerate_config.yaml`` (empty without SP).

    ``dp_shard_size`` is the plan's data-parallel size (GPUs / SP): with the DeepSpeed SP backend
    Accelerate rewrites ``train_batch_size`` as micro x accumulation x ``dp_replicate_size x
    dp_shard_size`` (``Accelerator._prepare_deepspeed``), and DeepSpeed then asserts it against
    micro x accumulation x world / SP; left at its default of 1, every plan with fewer SP ranks
    than GPUs stops at "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step *
    world_size" (Hugging Face's ALST example config sets it the same way)."""
    if plan.sequence_parallel_size == 1:
        return {}
    return {
        "parallelism_config_dp_shard_size": plan.batch_parallel_size,
        "parallelism_config_sp_size": plan.sequence_parallel_size,
        "parallelism_config_sp_backend": "deepspeed",
        "parallelism_config_sp_seq_length": str(spec.training.sequence_length),
        "parallelism_config_sp_seq_length_is_variable": False,
        "parallelism_config_sp_attn_implementation": HF_ATTN_IMPLEMENTATION[spec.training.attention],
    }


def sp_environment(spec: Spec, plan: Plan) -> dict[str, str]:
    """The variables an Accelerator (the HF Trainer's too) builds its ParallelismConfig from."""
    block = accelerate_parallelism_config(spec, plan)
    if not block:
        return {}
    env = {"ACCELERATE_USE_PARALLELISM_CONFIG": "true"}
    for key, value in block.items():
        name = "PARALLELISM_CONFIG_" + key.removeprefix("parallelism_config_").upper()
        env[name] = str(value)  # Accelerate compares the strings: "False" reads as false
    return env


def long_context_templates(spec: Spec, plan: Plan) -> dict[str, object]:
    """The templates' ``long_context`` variable (docs/templates.md)."""
    return {
        "ds_keys": ds_config_keys(plan),
        "accelerate": accelerate_parallelism_config(spec, plan),
        "env": sp_environment(spec, plan),
    }


def attention_note(spec: Spec) -> str | None:
    """How the script must load the model for the attention kernel memory was sized for (sdpa is
    transformers' default, so it needs no line)."""
    attention = spec.training.attention
    if attention in ("sdpa", "eager"):
        return None
    kernel = "FlashAttention-3, which runs on Hopper GPUs" if attention == "flash3" else "FlashAttention"
    return (
        f'load the model with attn_implementation="{HF_ATTN_IMPLEMENTATION[attention]}" (memory was sized for {kernel})'
    )


def liger_note(spec: Spec, plan: Plan, target: str) -> str:
    """How the model gets Liger-Kernel's kernels (memory was sized for them). Under TiledMLP the
    MLP stays transformers' (Liger's SwiGLU off), as ArcticTraining's LigerModelFactory does."""
    swiglu = "" if not plan.long_context.tiled_mlp else " (swiglu off: TiledMLP patches the MLP)"
    if target == "hf-trainer":
        return f"pip install liger-kernel: training_args.json's use_liger_kernel makes the Trainer apply it{swiglu}"
    keyword = "swiglu=False" if plan.long_context.tiled_mlp else ""
    return (
        "pip install liger-kernel and patch the model class before from_pretrained: "
        f"from liger_kernel.transformers import apply_liger_kernel_to_{spec.model.family}; "
        f"apply_liger_kernel_to_{spec.model.family}({keyword}){swiglu}"
    )


def unsharded_evaluation_bytes(shape: ModelShape, sequence_length: int, eval_batch: int, dtype_bytes: int) -> int:
    """The least an evaluation forward of whole sequences holds beyond the model states: its
    16-bit logits, the fp32 copy transformers' loss makes of them (``loss_utils.ForCausalLMLoss``
    upcasts) and the fp32 log-softmax ``cross_entropy`` computes from that copy, all alive at once
    (a real forward on CPU peaks 6 % above this: tests/test_sp_evaluation.py)."""
    return eval_batch * sequence_length * shape.vocab_size * (dtype_bytes + 2 * FP32)


def unsharded_evaluation_cost(
    shape: ModelShape, sequence_length: int, eval_batch: int, dtype_bytes: int, gpu: GpuSpec
) -> str:
    """What each rank runs when an evaluation bypasses Ulysses SP, and the least that takes
    (:func:`unsharded_evaluation_bytes`) against the GPU's capacity."""
    need = unsharded_evaluation_bytes(shape, sequence_length, eval_batch, dtype_bytes)
    sequences = "sequence" if eval_batch == 1 else "sequences"
    against = "more than" if need > gpu.memory_bytes else "of"
    return (
        f"each rank runs {eval_batch} whole {sequence_length:,}-token {sequences}, whose 16-bit logits and the "
        f"loss's two fp32 copies alone take {gib(need)} per GPU, {against} the {gib(gpu.memory_bytes)} one "
        f"{gpu.name} holds"
    )


#: The first DeepSpeed release whose ``UlyssesSPAttentionHF`` takes ``disable_in_eval``
#: (deepspeedai/DeepSpeed#7821, a972f7c: an eval-mode forward calls the plain attention), which
#: Accelerate sets wherever the release has it (``accelerator.py`` ``_prepare_deepspeed``).
EVAL_BYPASS_SINCE: tuple[int, ...] = (0, 18, 6)


def sp_bypassed_in_eval(release: str) -> bool:
    """Whether Ulysses SP is off in eval mode under Accelerate (and so the HF Trainer)."""
    return release_key(release) >= EVAL_BYPASS_SINCE


def trainer_sp_evaluation(
    shape: ModelShape, sequence_length: int, eval_batch: int, dtype_bytes: int, gpu: GpuSpec, release: str
) -> tuple[str, str]:
    """(what to do, why) for an HF Trainer evaluation of a Ulysses plan. transformers wraps only
    the training DataLoader in ``UlyssesSPDataLoaderAdapter`` (``trainer.py``
    ``_prepare_for_training``) and takes the SP loss only while the model trains
    (``compute_loss``), so each rank is handed whole sequences. From :data:`EVAL_BYPASS_SINCE`
    Ulysses is off in eval mode, and the evaluation is a plain forward of the full sequence on every
    rank, with the ZeRO shards of the model states as in training. Before it, Ulysses stays on and
    its shape check refuses the unsharded batch."""
    if not sp_bypassed_in_eval(release):
        return (
            'keep evaluation off (eval_strategy "no", the default)',
            "before DeepSpeed 0.18.6 (#7821) Ulysses SP stays on in eval mode while the Trainer hands each rank "
            "whole, unsharded sequences, which UlyssesSPAttentionHF refuses (AssertionError: query input tensor "
            "does not match the required shape)",
        )
    cost = unsharded_evaluation_cost(shape, sequence_length, eval_batch, dtype_bytes, gpu)
    return (
        'keep evaluation off (eval_strategy "no", the default) or evaluate shorter sequences',
        "the Trainer evaluates without Ulysses SP (Accelerate registers it with disable_in_eval=True and "
        f"transformers shards only the training batches), so {cost}",
    )


def accelerate_evaluation_note(spec: Spec, plan: Plan) -> str:
    """How an Accelerate loop evaluates a Ulysses plan. ``accelerator.prepare`` wraps every
    DataLoader it is given together with the model in ``UlyssesSPDataLoaderAdapter``. From
    :data:`EVAL_BYPASS_SINCE` an eval-mode forward bypasses Ulysses, so an evaluation DataLoader
    prepared with the model would hand each rank a shard whose attention sees only itself; one
    prepared apart is not sharded, and each rank evaluates whole sequences. Before it, Ulysses
    stays on in eval mode and needs the sharded batches."""
    if not sp_bypassed_in_eval(spec.training.deepspeed_version):
        return (
            "prepare any evaluation DataLoader together with the model, so it is sharded over the SP group: "
            "before DeepSpeed 0.18.6 (#7821) Ulysses SP stays on in eval mode and refuses whole sequences"
        )
    cost = unsharded_evaluation_cost(
        spec.model, spec.training.sequence_length, plan.micro_batch_size, plan.dtype_bytes, spec.hardware.gpu
    )
    return (
        "evaluate (if at all) with a DataLoader prepared apart from the model, accelerator.prepare(eval_dataloader): "
        "Accelerate bypasses Ulysses SP in eval mode (disable_in_eval=True), so one prepared together with the model "
        f"would give each rank a shard that attends only to itself; whole sequences instead: {cost}"
    )


def long_context_notes(spec: Spec, plan: Plan, target: str) -> list[str]:
    """The exact calls the training script needs for the plan's ALST choices."""
    lc = plan.long_context
    notes: list[str] = []
    sp = lc.sequence_parallel_size
    attn = HF_ATTN_IMPLEMENTATION[spec.training.attention]
    framework_sp = target in ("hf-trainer", "accelerate")
    if sp > 1 and not framework_sp:
        notes.append(
            "register Ulysses SP before deepspeed.initialize: from deepspeed.runtime.sequence_parallel.ulysses_sp "
            "import UlyssesSPAttentionHF, UlyssesSPDataLoaderAdapter; "
            f"mpu = UlyssesSPAttentionHF.register_with_transformers(model_name_or_path=model, "
            f'core_attn_implementation="{attn}", sequence_parallel_size={sp}, '
            f"micro_batch_size={plan.micro_batch_size}, seq_length={spec.training.sequence_length}, "
            "seq_length_is_variable=False); then deepspeed.initialize(..., mpu=mpu)"
        )
        notes.append(
            "shard every batch over the SP group (batches must carry position_ids): "
            "dl = UlyssesSPDataLoaderAdapter(dl, sp_rank=mpu.get_sequence_parallel_rank(), "
            "sp_group=mpu.get_sequence_parallel_group(), sp_world_size=mpu.get_sequence_parallel_world_size(), "
            "device=model.device)"
        )
        notes.append(
            "reduce the loss over the SP group, weighted by each rank's tokens: "
            "losses = torch.distributed.nn.functional.all_gather(loss, group=mpu.get_sequence_parallel_group()); "
            "tokens = torch.distributed.nn.functional.all_gather((batch['shift_labels'] != -100).sum(), "
            "group=mpu.get_sequence_parallel_group()); "
            "loss = sum(l * t for l, t in zip(losses, tokens)) / max(sum(tokens), 1)"
        )
    elif sp > 1 and target == "accelerate":
        notes.append(
            "let Accelerate register Ulysses SP: accelerator.prepare(model, optimizer, dataloader) together "
            "(or accelerator.deepspeed_ulysses_dl_adapter(dataloader, model) after prepare(model)); batches must carry "
            "position_ids, and the loss must be reduced over the SP group weighted by tokens, as "
            "transformers.integrations.deepspeed.deepspeed_sp_compute_loss does"
        )
        notes.append(accelerate_evaluation_note(spec, plan))
    elif sp > 1:
        advice, why = trainer_sp_evaluation(
            spec.model,
            spec.training.sequence_length,
            plan.micro_batch_size,
            plan.dtype_bytes,
            spec.hardware.gpu,
            spec.training.deepspeed_version,
        )
        notes.append(f"{advice}: {why}")
        notes.append(
            "the Trainer turns SP on from the PARALLELISM_CONFIG_* variables launch.sh exports, or give "
            "TrainingArguments(parallelism_config=accelerate.parallelism_config.ParallelismConfig("
            f'dp_shard_size={plan.batch_parallel_size}, sp_backend="deepspeed", sp_size={sp}, '
            "sp_handler=accelerate.utils.DeepSpeedSequenceParallelConfig("
            f"sp_seq_length={spec.training.sequence_length}, sp_seq_length_is_variable=False, "
            f'sp_attn_implementation="{attn}")))'
        )
    if lc.tiled_mlp:
        shards = tiled_mlp_shards(spec.model, spec.training.sequence_length // sp)
        notes.append(
            "tile every MLP (DeepSpeed TiledMLP): wrap the MLP forward as "
            "TiledMLP.apply(mlp_forward, self, x, num_shards, [p for p in self.parameters()]) with "
            f"num_shards = math.ceil(x.shape[1] / {spec.model.hidden_size}) ({shards} here), "
            "from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP, and patch it into the model's MLP class "
            "(the TiledMLP docstring shows LlamaMLP.forward)"
        )
    if lc.tiled_loss:
        notes.append(
            "compute logits and loss in ~1 GiB fp32 tiles: "
            "TiledFusedLogitsLoss.apply(loss_fn, model, hidden_states, shift_labels, None, "
            "math.ceil(shift_labels.numel() * vocab_size * 4 / 2**30), [model.lm_head.weight], 'sum') "
            "(deepspeed.runtime.sequence_parallel.ulysses_sp), or Liger's LigerFusedLinearCrossEntropyLoss"
        )
    if lc.checkpoint_offload:
        notes.append(
            "offload the checkpointed layer inputs to host RAM: "
            "from arctic_training.monkey_patches import monkey_patch_checkpoint_function_with_cpu_offload; "
            "monkey_patch_checkpoint_function_with_cpu_offload(), with "
            "gradient_checkpointing_kwargs={'use_reentrant': True} (the patch replaces the reentrant CheckpointFunction)"
        )
    return notes
