"""What the report pages print for a plan, a method and a step: readable labels over the JSON's
field names, with the dimensions a plan leaves off hidden.

The JSON keeps DeepSpeed's and dsgen's field names (``seq_parallel_communication_data_type``,
``zeropp: {...}``) because tools parse them; a reader wants "Sequence-parallel comm dtype" and
"qwZ + hpZ 8", and only the choices the plan actually makes. Every value keeps the JSON path it came
from (:class:`Shown`), so the browser test still holds each printed value to the JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsgen.reporting.html.charts import NEUTRAL, TERM_COLOURS


@dataclass(frozen=True)
class Shown:
    """One JSON value as the page prints it.

    ``kind`` says how ``text`` relates to ``value``: ``None``, the value itself (a string, a number,
    or "yes"/"no" for a boolean); ``"label"``, a readable word for a string value that still spells
    it (``"adapter-disabled"`` as "adapter disabled"); otherwise a :data:`dsgen.reporting.html.page.FORMATS`
    kind, which the template formats.
    """

    path: str
    value: Any
    text: str = ""
    kind: str | None = None


#: A row of the plan section: its label, and what it prints (plain text and tied values in order).
Part = str | Shown


@dataclass(frozen=True)
class Item:
    label: str
    parts: tuple[Part, ...]


# ---- the plan ------------------------------------------------------------------------------

#: Readable labels of the plan keys, in the order the plan section lists them; a key the JSON
#: gains later is shown after these under its own name (underscores as spaces).
PLAN_LABELS = {
    "precision": "Precision",
    "zero_stage": "ZeRO stage",
    "micro_batch_size": "Micro-batch",
    "gradient_accumulation_steps": "Gradient accumulation",
    "data_parallel_size": "Data-parallel degree",
    "global_batch_size": "Global batch",
    "offload_optimizer": "Optimizer offload",
    "offload_param": "Parameter offload",
    "activation_checkpointing": "Activation checkpointing",
    "selective_recompute": "Selective recompute (attention)",
    "checkpoint_offload": "Checkpoint offload to host",
    "zeropp": "ZeRO++",
    "sequence_parallel_size": "Ulysses sequence parallel",
    "seq_parallel_communication_data_type": "Sequence-parallel comm dtype",
    "tiled_mlp": "Tiled MLP",
    "tiled_loss": "Tiled loss",
    "tensor_parallel_size": "AutoTP degree",
    "expert_parallel_size": "AutoEP degree",
}
#: Keys the plan section always shows: every plan has a precision, a stage and a batch split.
ALWAYS_SHOWN = frozenset(
    {
        "precision",
        "zero_stage",
        "micro_batch_size",
        "gradient_accumulation_steps",
        "data_parallel_size",
        "global_batch_size",
    }
)
#: Keys shown inside another key's row, never as a row of their own.
FOLDED = frozenset({"offload_optimizer_ratio"})


def _text(value: Any) -> str:
    """A plain JSON value as the plan section prints it (the browser test reads it back)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def is_off(key: str, value: Any) -> bool:
    """Whether a plan dimension is off: DeepSpeed's default of leaving the feature out (no offload,
    degree 1, a false switch, ZeRO++ with nothing on). The sequence-parallel comm dtype means nothing
    without sequence parallelism, so it is off there; the caller passes the whole plan for that."""
    if isinstance(value, Mapping):
        return all(is_off(sub, sub_value) for sub, sub_value in value.items())
    if value is None or value is False or value == "none":
        return True
    return key.endswith("_size") and value == 1


def zeropp_parts(zeropp: Mapping[str, Any] | str, path: str) -> tuple[Part, ...]:
    """ZeRO++ as its paper names the features, e.g. "qwZ + qgZ + hpZ 8", or "off".

    ``zeropp`` is the plan's dict (``hpz_partition_size``, ``quantized_weights``,
    ``quantized_gradients``) or a sweep manifest's short label (``"hpz+qwz"``).
    """
    if isinstance(zeropp, str):
        spelled = {"hpz": "hpZ", "qwz": "qwZ", "qgz": "qgZ"}
        shown = [spelled.get(part, part) for part in zeropp.split("+") if part and part != "none"]
        return (" + ".join(shown) or "off",)
    flags = (("qwZ", zeropp.get("quantized_weights")), ("qgZ", zeropp.get("quantized_gradients")))
    names = [name for name, on in flags if on]
    parts: list[Part] = [" + ".join(names)] if names else []
    hpz = zeropp.get("hpz_partition_size", 1)
    if hpz and hpz > 1:
        parts += [" + hpZ " if names else "hpZ ", Shown(f"{path}.hpz_partition_size", hpz, str(hpz))]
    return tuple(parts) or ("off",)


def text_of(parts: Sequence[Part]) -> str:
    """The parts as one plain string (for a table cell that ties no value to the JSON)."""
    return "".join(part.text if isinstance(part, Shown) else part for part in parts)


def _plan_parts(key: str, value: Any, plan: Mapping[str, Any], prefix: str) -> tuple[Part, ...]:
    path = f"{prefix}.{key}"
    if key == "zeropp":
        return zeropp_parts(value, path)
    if key == "offload_optimizer":
        ratio = plan.get("offload_optimizer_ratio", 1.0)
        if 0 < ratio < 1:  # ZeRO-3's partial offload: say which share runs on the host
            return (
                Shown(path, value, _text(value)),
                ", ",
                Shown(f"{prefix}.offload_optimizer_ratio", ratio, kind="percent"),
                " of the optimizer step",
            )
    if isinstance(value, Mapping):  # a key added later as an object: each part by name
        inner: list[Part] = []
        for sub, sub_value in value.items():
            inner.extend([*([", "] if inner else []), f"{sub.replace('_', ' ')} "])
            inner.append(Shown(f"{path}.{sub}", sub_value, _text(sub_value)))
        return tuple(inner)
    return (Shown(path, value, _text(value)),)


def plan_items(plan: Mapping[str, Any], prefix: str = "plan") -> list[Item]:
    """The plan section's rows: readable labels, and only the dimensions the plan turns on."""
    order = [*(key for key in PLAN_LABELS if key in plan), *(key for key in plan if key not in PLAN_LABELS)]
    items = []
    for key in order:
        value = plan[key]
        if key in FOLDED:
            continue
        if key not in ALWAYS_SHOWN:
            if is_off(key, value):
                continue
            if key == "seq_parallel_communication_data_type" and is_off(
                "sequence_parallel_size", plan.get("sequence_parallel_size", 1)
            ):
                continue
        label = PLAN_LABELS.get(key, key.replace("_", " ").capitalize())
        items.append(Item(label, _plan_parts(key, value, plan, prefix)))
    return items


def offload_summary(plan: Mapping[str, Any]) -> str:
    """What a plan offloads, e.g. "optimizer offload cpu 25%, param offload cpu", or "no offload"."""
    parts = []
    if not is_off("offload_optimizer", plan.get("offload_optimizer", "none")):
        ratio = plan.get("offload_optimizer_ratio", 1.0) or 1.0
        share = f" {ratio:.0%}" if ratio < 1 else ""
        parts.append(f"optimizer offload {plan['offload_optimizer']}{share}")
    if not is_off("offload_param", plan.get("offload_param", "none")):
        parts.append(f"param offload {plan['offload_param']}")
    return ", ".join(parts) or "no offload"


def layout_summary(plan: Mapping[str, Any]) -> str:
    """The plan's model-parallel layout, e.g. "AutoTP 2", "AutoEP 4", or "no model parallelism"."""
    parts = [
        f"{name} {plan[key]}"
        for key, name in (("tensor_parallel_size", "AutoTP"), ("expert_parallel_size", "AutoEP"))
        if not is_off(key, plan.get(key, 1))
    ]
    return " + ".join(parts) or "no model parallelism"


def plan_summary(plan: Mapping[str, Any]) -> str:
    """One line for a plan in a table (alternatives, frontier points, sweep runs): the stage, then
    only what the plan turns on, then its batch split; e.g. "ZeRO-3, AutoEP 4, checkpointing,
    micro 1 × accum 8"."""
    parts = [f"ZeRO-{plan['zero_stage']}"]
    offload = offload_summary(plan)
    if offload != "no offload":
        parts.append(offload)
    zeropp = text_of(zeropp_parts(plan.get("zeropp", "none"), ""))
    if zeropp != "off":
        parts.append(f"ZeRO++ {zeropp}")
    layout = layout_summary(plan)
    if layout != "no model parallelism":
        parts.append(layout)
    if not is_off("sequence_parallel_size", plan.get("sequence_parallel_size", 1)):
        parts.append(f"Ulysses SP {plan['sequence_parallel_size']}")
    for key, label in (
        ("activation_checkpointing", "checkpointing"),
        ("selective_recompute", "selective recompute"),
        ("checkpoint_offload", "checkpoint offload"),
        ("tiled_mlp", "tiled MLP"),
        ("tiled_loss", "tiled loss"),
    ):
        if plan.get(key):
            parts.append(label)
    parts.append(f"micro {plan['micro_batch_size']} \u00d7 accum {plan['gradient_accumulation_steps']}")
    return ", ".join(parts)


# ---- the method ----------------------------------------------------------------------------

METHOD_LABELS = {"full": "Full fine-tuning", "lora": "LoRA", "qlora": "QLoRA", "freeze": "Freeze-tuning"}
OBJECTIVE_LABELS = {
    "sft": "SFT",
    "dpo": "DPO",
    "kto": "KTO",
    "orpo": "ORPO",
    "simpo": "SimPO",
    "reward": "Reward model",
    "grpo": "GRPO",
    "ppo": "PPO",
}
REFERENCE_LABELS = {"separate": "separate copy", "adapter-disabled": "adapter disabled", "precomputed": "precomputed"}


def method_parts(finetuning: Mapping[str, Any] | None) -> tuple[Part, ...]:
    """The header's method line, e.g. "LoRA · DPO · reference model: adapter disabled"; a body
    without ``finetuning`` (an older JSON) trains every parameter on next-token loss."""
    if not finetuning:
        return ()
    method, objective = finetuning.get("method", "full"), finetuning.get("objective", "sft")
    parts: list[Part] = [
        Shown("finetuning.method", method, METHOD_LABELS.get(method, method), "label"),
        " \u00b7 ",
        Shown("finetuning.objective", objective, OBJECTIVE_LABELS.get(objective, objective), "label"),
    ]
    reference = finetuning.get("reference_model", "none")
    if reference not in (None, "none"):
        label = REFERENCE_LABELS.get(reference, reference)
        parts += [" \u00b7 reference model: ", Shown("finetuning.reference_model", reference, label, "label")]
    return tuple(parts)


# ---- the step and memory terms -------------------------------------------------------------

STEP_LABELS = {
    "compute_s": "compute",
    "exposed_comm_s": "exposed communication",
    "offload_s": "offload (PCIe, CPU optimizer, NVMe)",
    "generation_s": "generation",
}
MEMORY_LABELS = {
    "optimizer_states": "optimizer states",
    "frozen_parameters": "frozen parameters",
    "reference_model": "reference model",
    "value_model": "value model",
    "vllm_reserved": "vLLM's reserved share",
    "generation": "generation (KV cache)",
    "generation_gather": "generation: gathered ZeRO-3 weights",
}


@dataclass(frozen=True)
class Term:
    key: str
    label: str
    colour: str
    shown: Shown


def step_terms(step_time: Mapping[str, float]) -> list[Term]:
    """Every term of the step, in the JSON's order, each with the colour its bar segment has; a
    term the JSON gains later appears under its own name rather than going missing."""
    return [
        Term(
            key,
            STEP_LABELS.get(key, key.removesuffix("_s").replace("_", " ")),
            TERM_COLOURS.get(key, NEUTRAL),
            Shown(f"step_time.{key}", value, kind="seconds"),
        )
        for key, value in step_time.items()
    ]


def memory_label(term: str) -> str:
    """A GPU memory term's readable name."""
    return MEMORY_LABELS.get(term, term.replace("_", " "))


def _alternative_label(key: str, index: int, alt: Mapping[str, Any]) -> tuple[Part, ...]:
    """What an alternative is: its ZeRO stage, its layout, or what it offloads."""
    if key == "alternatives":
        return ("ZeRO-", Shown(f"{key}.{index}.zero_stage", alt["zero_stage"], str(alt["zero_stage"])))
    if key == "model_parallel_alternatives":
        layout = alt["layout"]
        shown = Shown(f"{key}.{index}.layout", layout, str(layout))
        return (shown, " (no AutoTP or AutoEP)") if layout == "none" else (shown,)
    for name in ("offload", "label"):  # the JSON's own label of the choice, where it gives one
        if isinstance(alt.get(name), str):
            return (Shown(f"{key}.{index}.{name}", alt[name], alt[name]),)
    return (offload_summary(alt["plan"]) if alt.get("plan") else "",)


def alternative_rows(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every road not taken, in the JSON's order: the best plan of each other ZeRO stage
    (``alternatives``), of each model-parallel layout (``model_parallel_alternatives``) and, where
    the JSON carries them, of each offload choice (``offload_alternatives``). Each row keeps its
    list's name and index, so the page ties its values to the JSON paths."""
    rows = []
    for key, kind in (
        ("alternatives", "ZeRO stage"),
        ("model_parallel_alternatives", "model parallelism"),
        ("offload_alternatives", "offload"),
    ):
        for index, alt in enumerate(body.get(key) or []):
            rows.append(
                {
                    "path": f"{key}.{index}",
                    "kind": kind,
                    "label": _alternative_label(key, index, alt),
                    "alt": alt,
                    "summary": plan_summary(alt["plan"]) if alt.get("plan") else "",
                }
            )
    return rows
