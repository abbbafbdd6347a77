"""DeepSpeed version profiles: what differs between 0.14, 0.16 and 0.19.

The schema in ``schemas/deepspeed.schema.json`` describes DeepSpeed 0.19.8. Older releases are
described as patches on it, gathered by diffing the pydantic models and ``runtime/config.py`` of
the 0.14.5, 0.16.9 and 0.19.8 wheels (and checked against the corpus oracles):

* 0.19.8 rejects the legacy blocks (``amp``, ``compression_training``, ...) that 0.14/0.16 read;
* ``fp16``/``bf16`` became strict pydantic models in 0.17.1, so unknown keys there were ignored
  before (and ``min_loss_scale: 0.5`` was fine);
* newer keys (``zenflow``, ``compute_grad_norm``, ``torch_autocast``, ``compile.passes``, ...)
  are unknown to older releases, which rejects them in strict sections and ignores them elsewhere.

Keeping every difference here, as data, means the schema stays a single 0.19.8 document and a
new DeepSpeed release is one more profile.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dsgen.facts.release import RELEASES, normalize_version, release_key

# A patch is (operation, property path from the root, argument):
#   drop     - the key does not exist in that release (unknown there)
#   replace  - the key has this schema in that release
#   merge    - update some keywords of the key's schema (None deletes a keyword)
#   loosen   - the section is dict-based (unknown keys ignored) instead of pydantic
Patch = tuple[str, tuple[str, ...], Any]

_LEGACY_BLOCK = {"type": ["object", "null"], "default": None, "x-dsgen-parser": "free"}
_LEGACY_FLAG = {"type": "boolean", "default": False}
_Z = "zero_optimization"

_PATCHES_0_16: tuple[Patch, ...] = (
    # Top-level keys added after 0.16.
    *(
        ("drop", (key,), None)
        for key in (
            "managed_gradient_accumulation",
            "disable_python_gc",
            "gradient_allreduce_op",
            "torch_autocast",
            "expert_parallel",
            "datastates_ckpt",
            "log_level",
        )
    ),
    *(("drop", ("data_types", key), None) for key in ("param_dtype", "buffer_dtype", "keep_in_fp32_modules")),
    *(("drop", ("checkpoint", key), None) for key in ("checkpoint_serialization", "writer")),
    # ZeRO: newer fields, and the ones 0.19.8 removed.
    *(
        ("drop", (_Z, key), None)
        for key in (
            "compute_grad_norm",
            "zenflow",
            "stage3_allgather_sequential",
            "allgather_sequential",
            "parameter_alignment",
            "enable_sanity_checks",
            "save_muon_momentum_buffer_in_memory",
            "leaf_module",
        )
    ),
    ("merge", (_Z, "reduce_bucket_size"), {"exclusiveMinimum": None, "minimum": 0}),
    ("replace", (_Z, "mics_shard_size"), {"type": "integer", "default": -1}),
    ("replace", (_Z, "mics_hierarchical_params_gather"), {"type": "boolean", "default": False}),
    ("replace", (_Z, "zeropp_loco_param"), dict(_LEGACY_BLOCK)),
    *(("drop", (_Z, "offload_optimizer", key), None) for key in ("cpuadam_cores_perc", "super_offload")),
    ("merge", (_Z, "offload_optimizer", "pin_memory"), {"default": False}),
    ("merge", (_Z, "offload_param", "pin_memory"), {"default": False}),
    # fp16/bf16 were read with dict.get before 0.17.1: unknown keys ignored, numbers unchecked.
    ("loosen", ("fp16",), None),
    *(
        ("merge", ("fp16", key), {"type": "number"})
        for key in (
            "initial_scale_power",
            "loss_scale_window",
            "hysteresis",
            "min_loss_scale",
        )
    ),
    *(("loosen", (section,), None) for section in ("bf16", "bfloat16")),
    *(
        ("drop", (section, key), None)
        for section in ("bf16", "bfloat16")
        for key in (
            "check_grad_overflow",
            "bf16_master_weights_and_grads",
            "bf16_optimizer_states",
        )
    ),
    ("drop", ("hybrid_engine", "enable_cuda_graph"), None),
    ("merge", ("hybrid_engine", "max_out_tokens"), {"exclusiveMinimum": None}),
    *(
        ("drop", ("compile", key), None)
        for key in (
            "autoep_non_moe",
            "free_activation_threshold",
            "keep_all_input_tensors",
            "keep_int_input_tensors",
            "offload_activation_pin_memory",
            "passes",
        )
    ),
    *(
        ("drop", ("tensor_parallel", key), None)
        for key in (
            "partition_config",
            "preset_model",
            "vocab_parallel_ce_backend",
            "vocab_parallel_lm_head",
        )
    ),
    # Legacy blocks that 0.19.8 rejects were read normally.
    *(
        ("replace", (key,), dict(_LEGACY_BLOCK))
        for key in (
            "nebula",
            "compression_training",
            "amp",
            "quantize_training",
            "eigenvalue",
            "sparse_attention",
            "elasticity",
            "curriculum_learning",
            "progressive_layer_drop",
        )
    ),
    *(("replace", (key,), dict(_LEGACY_FLAG)) for key in ("sparse_gradients", "graph_harvesting")),
)

_PATCHES_0_14: tuple[Patch, ...] = (
    *_PATCHES_0_16,
    ("drop", ("compile",), None),
    ("drop", ("tensor_parallel",), None),
    ("drop", ("aio", "use_gds"), None),
    *(
        ("drop", (_Z, key), None)
        for key in (
            "stage3_module_granularity_threshold",
            "module_granularity_threshold",
            "log_trace_cache_warnings",
            "zeropp_loco_param",
        )
    ),
)

# Optimizer names DeepSpeed resolves itself (lower-cased); 0.19.8 dropped the 1-bit family.
_DS_OPTIMIZERS_0_19 = frozenset({"adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon"})
_ONEBIT = frozenset({"onebitadam", "zerooneadam", "onebitlamb"})


@dataclass(frozen=True)
class Profile:
    """Everything about one DeepSpeed release that the validator needs."""

    version: str
    release: str
    patches: tuple[Patch, ...] = ()
    deepspeed_optimizers: frozenset[str] = field(default=_DS_OPTIMIZERS_0_19)

    @property
    def removed_keys_are_errors(self) -> bool:
        """Only 0.19.8 refuses the legacy blocks; older releases still read them."""
        return self.version == "0.19"

    def at_least(self, version: str) -> bool:
        return release_key(self.version) >= release_key(version)


PROFILES: dict[str, Profile] = {
    "0.19": Profile("0.19", RELEASES["0.19"]),
    "0.16": Profile("0.16", RELEASES["0.16"], _PATCHES_0_16, _DS_OPTIMIZERS_0_19 | _ONEBIT),
    "0.14": Profile("0.14", RELEASES["0.14"], _PATCHES_0_14, _DS_OPTIMIZERS_0_19 | _ONEBIT),
}


def profile(version: str) -> Profile:
    return PROFILES[normalize_version(version)]


def apply_patches(schema: dict[str, Any], patches: tuple[Patch, ...]) -> None:
    """Apply a profile's patches to a (deep-copied) 0.19.8 schema in place."""
    for op, path, arg in patches:
        parent = _properties_of(schema, path[:-1])
        if parent is None:
            continue  # the enclosing section was dropped by an earlier patch
        name = path[-1]
        if op == "drop":
            parent.pop(name, None)
        elif op == "replace":
            parent[name] = dict(arg)
        elif op == "merge":
            target = parent[name]
            for keyword, value in arg.items():
                if value is None:
                    target.pop(keyword, None)
                else:
                    target[keyword] = value
        elif op == "loosen":
            section = parent[name]
            section.pop("additionalProperties", None)
            section["x-dsgen-parser"] = "dict"
        else:  # pragma: no cover - guarded by the tests over PROFILES
            raise ValueError(f"unknown schema patch operation {op!r}")


def _properties_of(schema: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node = schema
    for name in path:
        node = node.get("properties", {}).get(name)
        if node is None:
            return None
    return node.setdefault("properties", {})


def removed_keys(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(pointer, x-dsgen-removed annotation)`` for every key the schema marks removed."""
    stack: list[tuple[str, dict[str, Any]]] = [("", schema)]
    while stack:
        pointer, node = stack.pop()
        for name, child in node.get("properties", {}).items():
            child_pointer = f"{pointer}/{name}"
            if "x-dsgen-removed" in child:
                yield child_pointer, child["x-dsgen-removed"]
            elif isinstance(child, dict):
                stack.append((child_pointer, child))
