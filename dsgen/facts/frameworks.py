"""The programs that read dsgen's DeepSpeed JSON, and the model-parallel layouts each cannot run.

Facts about the frameworks rather than files dsgen writes, so that the search (which skips a layout
the chosen target cannot run) and the validator (which knows which "auto" each target fills) read
them from below, and :mod:`dsgen.targets` writes the files.
"""

from __future__ import annotations

#: Programs that read the DeepSpeed JSON (dsgen.validate.targets knows which "auto" each fills).
TARGETS: tuple[str, ...] = ("deepspeed", "hf-trainer", "accelerate", "lightning", "trl", "llamafactory")


#: LLaMA-Factory's ``stage`` and the objective it trains (``src/llamafactory/train/tuner.py``);
#: ``pt`` is next-token training like ``sft``. A ``dpo`` stage's ``pref_loss`` picks ORPO or SimPO.
LLAMAFACTORY_STAGES = {"pt": "sft", "sft": "sft", "dpo": "dpo", "kto": "kto", "rm": "reward", "ppo": "ppo"}
LLAMAFACTORY_PREF_LOSS = {"orpo": "orpo", "simpo": "simpo"}


def config_reader(target: str) -> str:
    """The program that reads ``target``'s DeepSpeed JSON. TRL's CLI (``trl sft|dpo|kto|grpo|reward``)
    runs TRL's trainers, subclasses of the HF Trainer (``trl/trainer/base_trainer.py``
    ``_BaseTrainer(Trainer)``), so the trl target's JSON is the HF Trainer's: the same "auto" keys, the
    same model-parallel limits. Only the files around it differ (dsgen.targets.trl_cli). LLaMA-Factory's
    trainers are the HF Trainer's and TRL's subclasses too (``src/llamafactory/train/sft/trainer.py``
    ``CustomSeq2SeqTrainer(Seq2SeqTrainer)``, ``train/dpo/trainer.py`` ``CustomDPOTrainer(DPOTrainer)``)."""
    return "hf-trainer" if target in ("trl", "llamafactory") else target


def runs_own_script(target: str) -> bool:
    """Whether ``target`` runs its framework's own training script, so that a plan needing calls
    in the user's script cannot run there: ALST's Ulysses SP, TiledMLP, tiled loss and checkpoint
    offload (dsgen.targets.long_context) and selective recomputation. TRL's and LLaMA-Factory's
    scripts make none of them; the solver does not search such plans for those targets, and a pin
    for one is refused (dsgen.targets.own_script)."""
    return target in ("trl", "llamafactory")


def marks_moe_leaf(target: str) -> bool:
    """Whether ``target``'s run marks a MoE block as a ZeRO-3 leaf, which ZeRO-3 on a MoE model
    needs. The user's script does it on the script targets; LLaMA-Factory's loader does it
    (``src/llamafactory/model/model_utils/moe.py`` ``add_z3_leaf_module``); TRL's scripts do not."""
    return target != "trl"


def target_violation(target: str, tp: int, ep: int, zero_stage: int) -> tuple[str, str] | None:
    """(why, hint) when ``target`` cannot run AutoTP degree ``tp`` / AutoEP degree ``ep`` at
    ``zero_stage``, else None. Pure, so a search can skip such layouts.

    * hf-trainer / accelerate, AutoTP at ZeRO-3: the model is loaded with transformers'
      ``from_pretrained`` while an ``HfDeepSpeedConfig`` is alive (``TrainingArguments`` at ZeRO-3;
      Accelerate's ``zero3_init_flag``), and transformers 5.24 refuses that load whenever the config
      has ``autotp_size`` > 1 (``integrations/deepspeed.py`` ``_apply_weight_conversions_to_state_dict``,
      NotImplementedError; every model has weight renamings, so it always runs).
    * lightning, AutoTP: ``DeepSpeedStrategy`` passes the config to ``deepspeed.initialize``, so AutoTP
      turns on, but its sampler gives each rank its own share of the data
      (``distributed_sampler_kwargs``: ``num_replicas=world_size, rank=global_rank``), and AutoTP's
      first forward then fails ("Data inconsistency within the TP group",
      ``runtime/engine.py`` ``_configure_tensor_parallel_states``).
    * lightning, AutoEP: the module DeepSpeed is given is the LightningModule, whose submodule names
      carry its own attribute prefix (``model.model.layers.0.mlp``), so the preset's
      ``moe_layer_pattern`` (``model\\.layers\\.\\d+\\.mlp``, matched in full) finds no MoE block and,
      with ``preset_model`` set, AutoEP raises "AutoEP: no MoE layers detected"
      (``module_inject/auto_ep.py`` ``AutoEP.ep_parser``); it also has no ``config`` to read the
      expert count from.
    """
    target = config_reader(target)
    if target in ("hf-trainer", "accelerate") and tp > 1 and zero_stage == 3:
        loader = (
            "TrainingArguments registers the ZeRO-3 config"
            if target == "hf-trainer"
            else "Accelerate's zero3_init_flag registers the ZeRO-3 config"
        )
        return (
            f"AutoTP (tensor_parallel_size {tp}) with ZeRO-3 cannot load a model through transformers: {loader}, "
            'and from_pretrained then raises NotImplementedError ("Weight conversions (e.g., MoE expert fusion) with '
            'DeepSpeed Tensor Parallelism are not yet implemented", transformers/integrations/deepspeed.py '
            "_apply_weight_conversions_to_state_dict)",
            "pin constraints.zero_stage to 0, 1 or 2 (AutoTP shards the weights itself), or "
            "constraints.tensor_parallel_size: 1",
        )
    if target == "lightning" and tp > 1:
        return (
            f"the plan uses AutoTP (tensor_parallel_size {tp}), which Lightning's DeepSpeedStrategy turns on (it passes "
            "the config to deepspeed.initialize) but cannot feed: its DistributedSampler gives every rank its own "
            "batches (num_replicas=world_size, rank=global_rank), and AutoTP's first forward stops at \"Data "
            'inconsistency within the TP group" (deepspeed/runtime/engine.py _configure_tensor_parallel_states)',
            "use --target hf-trainer, accelerate or deepspeed, or pin constraints.tensor_parallel_size: 1",
        )
    if target == "lightning" and ep > 1:
        return (
            f"the plan uses AutoEP (expert_parallel_size {ep}), which cannot find the MoE blocks under Lightning: "
            "DeepSpeedStrategy hands deepspeed.initialize the LightningModule, whose module names carry its own "
            "prefix (model.model.layers.N.mlp), so the preset's pattern model\\.layers\\.\\d+\\.mlp matches nothing "
            'and AutoEP raises "AutoEP: no MoE layers detected" (deepspeed/module_inject/auto_ep.py ep_parser)',
            "use --target hf-trainer, accelerate or deepspeed, or pin constraints.expert_parallel_size: 1",
        )
    return None
