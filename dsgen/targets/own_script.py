"""What the targets that run their framework's own training script share: the plans they refuse,
and the commented YAML blocks with placeholders their config is written in.

TRL's CLI and LLaMA-Factory run their own scripts, so a plan that needs calls in the user's script
(:func:`dsgen.facts.frameworks.runs_own_script`) cannot run there. The solver does not search such
plans for these targets; a pin that asks for one ends here, named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsgen.errors import DsgenError
from dsgen.facts.frameworks import marks_moe_leaf
from dsgen.plan import Plan
from dsgen.spec.types import Spec

#: How every value the user must fill in starts; a launch.sh refuses to start while one is left.
PLACEHOLDER = "REQUIRED: "


@dataclass(frozen=True)  # one per part of a framework's YAML
class Section:
    """A commented block of a framework's YAML config: its title and its keys, in order."""

    title: str
    values: dict[str, Any]

    def yaml(self) -> str:
        """The block's keys as PyYAML writes them, which is how the frameworks' parsers read them back
        (``yaml.safe_load``: a float without a dot, ``1e-08``, would come back a string)."""
        import yaml

        return yaml.safe_dump(self.values, sort_keys=False, allow_unicode=True, width=1_000_000)


def refusal(spec: Spec, key: str, message: str, hint: str) -> DsgenError:
    """The error refusing what a framework's scripts cannot run, at the spec key that asks for it."""
    return DsgenError(message, path=key, location=spec.location(key), hint=hint)


def model_source(spec: Spec) -> str:
    """``model_name_or_path``: the spec's Hugging Face id when it names the model by one, else a placeholder."""
    if spec.names("model.hf") and not spec.names("model.name"):
        return spec.model.name
    return f"{PLACEHOLDER}the model's Hugging Face id or local folder"


def check_own_script(spec: Spec, plan: Plan, target: str, framework: str) -> None:
    """Refuse, naming the key to change, a plan ``framework``'s own scripts cannot run."""
    hint = "use --target hf-trainer and a training script of your own"
    if plan.long_context.active:
        raise DsgenError(
            f"the plan uses ALST ({plan.long_context.label()}), which needs calls in the training script that "
            f"{framework}'s scripts do not make (dsgen.targets.long_context)",
            path="output.target",
            hint=f"{hint}, or pin constraints.sequence_parallel_size: 1 and the tiling keys to false",
        )
    if plan.checkpointing == "selective":
        raise DsgenError(
            f"selective recomputation wraps the attention function in the training script; {framework}'s "
            "scripts checkpoint whole layers or nothing",
            path="output.target",
            hint=f"{hint}, or pin constraints.activation_checkpointing",
        )
    if plan.zero_stage == 3 and spec.model.num_experts > 0 and not marks_moe_leaf(target):
        raise DsgenError(
            "ZeRO-3 on a mixture-of-experts model needs its MoE block marked as a ZeRO-3 leaf "
            f"(deepspeed.utils.set_z3_leaf_modules) in the training script, which {framework}'s scripts do not do",
            path="output.target",
            hint=f"{hint}, or pin constraints.zero_stage: 2",
        )
