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

#: Where ``dsgen init`` writes when given no path.
DEFAULT_PATH = "spec.yaml"

#: The sequences per optimizer step a starter asks for, rounded up to split over every GPU.
STARTER_BATCH = 256

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
  sequence_length: 4096
  global_batch_size: {global_batch_size:<20} # sequences per optimizer step, met exactly
  # precision: bf16                         or fp16, fp32; left out, dsgen picks
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


def starter_batch(world_size: int) -> int:
    """:data:`STARTER_BATCH`, or the next multiple of ``world_size`` above it."""
    return -(-STARTER_BATCH // world_size) * world_size


def starter_spec(options: StarterOptions, name: str = DEFAULT_PATH) -> str:
    """The starter spec's text (``name`` is the file the next-step comment names)."""
    return TEMPLATE.format(
        name=name,
        model=options.model,
        gpu=options.gpu,
        gpus_per_node=options.gpus_per_node,
        nodes=options.nodes,
        global_batch_size=starter_batch(options.gpus_per_node * options.nodes),
    )


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
