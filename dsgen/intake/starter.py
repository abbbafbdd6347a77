"""The commented starter spec ``dsgen init`` writes: a first spec that loads and solves as it is.

It sets only what a user must decide (model, GPUs, sequence length, batch) and names every other
knob in a comment, without a value: each default is written once, in ``schemas/spec.schema.json``,
and a starter that copied them would drift from it.

Importing this module is cheap (the CLI reads :class:`StarterOptions`' defaults to build ``dsgen
init``'s options); loading and writing happen in :func:`write_starter_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsgen.vocabulary import FineTuningMethod, Objective

#: Where ``dsgen init`` writes when given no path.
DEFAULT_PATH = "spec.yaml"

#: The sequences per optimizer step a starter asks for, rounded up to split over every GPU.
STARTER_BATCH = 256
#: The starter's sequence length, where the objective does not fix it (GRPO and PPO train on
#: prompt + completion, so theirs is the generation's lengths).
STARTER_SEQUENCE_LENGTH = 4096

TEMPLATE = """\
# A dsgen spec. Next: dsgen new {name}   (writes the DeepSpeed config, prints the plan)
# Every key: dsgen schema spec. Presets: dsgen presets gpus, dsgen presets models.
model:
  preset: {model}
  # or  hf_config: path/to/config.json      (a local Hugging Face config, relative to this file)
hardware:
  gpu: {gpu}
  gpus_per_node: {gpus_per_node}
  nodes: {nodes}
  # cpu_memory_gib: 1024                    host RAM per node; left out, plans stay within 512 and host RAM is not judged
  # inter_node_bandwidth_gbps: 50           per GPU, GB/s
  # nvme: {{path: /local_nvme, capacity_gib: 3500}}
training:
  sequence_length: {sequence_length:<22} {sequence_comment}
  global_batch_size: {global_batch_size:<20} # sequences per optimizer step, met exactly
{method}  # precision: bf16                         or fp16, fp32; left out, dsgen picks
  # packed_samples: true                    every sequence is sequence_length tokens (samples packed)
  # deepspeed_version: 0.18.5              the DeepSpeed you run (default 0.19.8): host RAM, ALST and checks follow it
  # optimizer: {{type: adamw, lr: 2.0e-5}}
# constraints:                              each pins one dimension of the search
#   zero_stage: 3
#   offload_optimizer: cpu
#   activation_checkpointing: true
output:
  path: ds_config.json
"""


@dataclass(frozen=True)
class StarterOptions:
    """What ``dsgen init`` fills in; the rest of the starter is comments."""

    gpu: str = "h100-80gb"
    model: str = "llama-3.1-8b"
    gpus_per_node: int = 8
    nodes: int = 1
    finetuning: FineTuningMethod = "full"
    objective: Objective = "sft"


def starter_batch(world_size: int) -> int:
    """:data:`STARTER_BATCH`, or the next multiple of ``world_size`` above it."""
    return -(-STARTER_BATCH // world_size) * world_size


def _method_lines(options: StarterOptions) -> str:
    """The training lines a method or objective other than full SFT adds: its key, and the keys
    that shape it in comments, at the schema's defaults (uncommented, they change nothing)."""
    from dsgen.estimate.objectives import GENERATION_OBJECTIVES, REFERENCE_OBJECTIVES
    from dsgen.spec.defaults import spec_default

    lora, generation = "training.lora.", "training.generation."
    lines = []
    if options.finetuning != "full":
        lines.append(f"  finetuning: {options.finetuning}")
    if options.finetuning in ("lora", "qlora"):
        rank, alpha, targets = (spec_default(lora + key) for key in ("rank", "alpha", "target_modules"))
        lines.append(f"  # lora: {{rank: {rank}, alpha: {alpha}, target_modules: {targets}}}   PEFT's LoraConfig")
    if options.finetuning == "qlora":
        bits, kind = spec_default("training.quantization.bits"), spec_default("training.quantization.type")
        lines.append(f"  # quantization: {{bits: {bits}, type: {kind}}}   the frozen linear layers (bitsandbytes)")
    if options.finetuning == "freeze":
        layers = spec_default("training.freeze.trainable_layers")
        lines.append(f"  # freeze: {{trainable_layers: {layers}}}   the last decoder layers that train")
    if options.objective != "sft":
        lines.append(f"  objective: {options.objective}")
    if options.objective in REFERENCE_OBJECTIVES:
        lines.append(
            "  # reference_model: separate   left out (auto): the adapter-disabled policy for LoRA, else a copy"
        )
    if options.objective in GENERATION_OBJECTIVES:
        count, prompt, completion = (
            spec_default(generation + key) for key in ("num_generations", "max_prompt_length", "max_completion_length")
        )
        lines.append(
            f"  # generation: {{num_generations: {count}, max_prompt_length: {prompt}, "
            f"max_completion_length: {completion}}}   engine: vllm-colocate to generate with vLLM"
        )
    return "".join(line + "\n" for line in lines)


def _sequence_length(options: StarterOptions) -> tuple[int, str]:
    """The starter's sequence length and its comment: a generating objective's is prompt +
    completion at the generation's defaults, which the spec checks."""
    from dsgen.estimate.objectives import GENERATION_OBJECTIVES
    from dsgen.spec.defaults import spec_default

    if options.objective not in GENERATION_OBJECTIVES:
        return STARTER_SEQUENCE_LENGTH, ""

    prompt = spec_default("training.generation.max_prompt_length")
    completion = spec_default("training.generation.max_completion_length")
    return prompt + completion, "# generation's max_prompt_length + max_completion_length"


def starter_spec(options: StarterOptions, name: str = DEFAULT_PATH) -> str:
    """The starter spec's text (``name`` is the file the next-step comment names)."""
    sequence_length, sequence_comment = _sequence_length(options)
    text = TEMPLATE.format(
        name=name,
        model=options.model,
        gpu=options.gpu,
        gpus_per_node=options.gpus_per_node,
        nodes=options.nodes,
        sequence_length=sequence_length,
        sequence_comment=sequence_comment,
        global_batch_size=starter_batch(options.gpus_per_node * options.nodes),
        method=_method_lines(options),
    )
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def write_starter_spec(path: str | Path, options: StarterOptions, *, force: bool = False) -> str:
    """Write the starter spec to ``path`` atomically; refuse an existing file without ``force``.

    The text is loaded as a spec first, so a bad ``--gpu`` or ``--model`` is reported (exit 2)
    and nothing is written. Returns the text written.
    """
    from dsgen.intake.loader import load_spec_text
    from dsgen.output import write_atomic

    target = Path(path)
    text = starter_spec(options, target.name)
    load_spec_text(text, file=str(target), base_dir=target.parent)
    write_atomic(target, text, force=force)
    return text
