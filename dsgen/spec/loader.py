"""Read a spec file (plus ``--set`` overrides) into a validated, fully resolved :class:`Spec`.

Order of checks: YAML syntax and duplicate keys, then the JSON Schema (shape, types, unknown
keys with did-you-mean), then meaning (preset names, files, hardware support). Every error names
the key path and the line it came from.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from dsgen.catalog.gpu import GpuSpec
from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError
from dsgen.estimate.optimizers import CLIENT_OPTIMIZERS, is_client_optimizer
from dsgen.resources import schema_path
from dsgen.spec.overrides import apply_overrides
from dsgen.spec.schema_errors import check_against_schema
from dsgen.spec.types import (
    Constraints,
    Hardware,
    NvmeSpec,
    Optimizer,
    Output,
    Scheduler,
    Spec,
    Training,
)
from dsgen.spec.yaml_source import SourceMap, format_path, load_yaml, read_source

_ARCHITECTURE_TRAITS = (
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "dense_layers",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
)
# Layout defaults per family for inline ``architecture`` blocks (what each family's HF code builds).
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {},
    "qwen2": {"attention_bias": True},
    "phi3": {},
    "mixtral": {},
    "gemma2": {"mlp": "geglu", "norms_per_layer": 4, "tie_word_embeddings": True},
    "gpt2": {
        "mlp": "gelu",
        "norm": "layernorm",
        "tie_word_embeddings": True,
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
        "dropout": 0.1,
        "learned_positions": True,
    },
    "gpt_neox": {
        "mlp": "gelu",
        "norm": "layernorm",
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
    },
    "bert": {
        "mlp": "gelu",
        "norm": "layernorm",
        "attention_bias": True,
        "attention_out_bias": True,
        "mlp_bias": True,
        "dropout": 0.1,
        "learned_positions": True,
        "token_type_embeddings": 2,
        "embedding_norm": True,
        "final_norm": False,
        "pooler": True,
        "encoder_only": True,
    },
}

# constraints.activation_checkpointing as the spec writes it -> the solver's checkpointing mode
CHECKPOINTING_PINS = {False: "none", True: "full", "selective": "selective"}


def load_spec(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Spec:
    """Load and resolve the spec at ``path``. Raises :class:`DsgenError` on any bad input."""
    file = Path(path)
    text = read_source(file, "spec")
    return load_spec_text(text, file=str(file), base_dir=file.parent, overrides=overrides)


def load_spec_text(
    text: str,
    *,
    file: str | None = None,
    base_dir: Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
) -> Spec:
    """Like :func:`load_spec` for YAML text already in memory (``file`` is used in messages)."""
    data, source = load_yaml(text, file)
    return spec_from_data(data, source, base_dir=base_dir or Path.cwd(), overrides=overrides)


def spec_from_data(
    data: Any,
    source: SourceMap,
    *,
    base_dir: Path,
    overrides: list[str] | tuple[str, ...] = (),
) -> Spec:
    """Validate plain spec data (already parsed) and resolve presets into a :class:`Spec`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise DsgenError(
            "the spec must be a YAML mapping with model, hardware and training", location=source.location(())
        )
    apply_overrides(data, overrides, source)
    normalise_numbers(data, (), source)
    check_against_schema(data, schema_path("spec"), source)
    return _SpecBuilder(source, base_dir).build(data)


#: The largest magnitude a JSON number carries exactly; nothing in a spec comes near it.
LARGEST_NUMBER = 2**53


def normalise_numbers(value: Any, path: tuple[str | int, ...], source: SourceMap) -> Any:
    """Refuse infinities, NaN and absurd magnitudes, and store whole floats (``nodes: 2.0``) as ints.

    YAML reads ``.inf`` and ``.nan`` as floats and JSON Schema calls ``2.0`` an integer; the
    estimates then fail deep inside arithmetic (``range(2.0)``, ``int(nan)``), far from the key.
    Changes ``value`` in place and returns it.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            value[key] = normalise_numbers(item, (*path, key), source)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            value[index] = normalise_numbers(item, (*path, index), source)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise DsgenError(
                f"must be a finite number, got {value}", path=format_path(path), location=source.location(path)
            )
        if abs(value) > LARGEST_NUMBER:
            shown = f"{value:.3g}" if isinstance(value, float) else f"an integer of {value.bit_length()} bits"
            raise DsgenError(
                f"must be at most 2**53 in magnitude, got {shown}",
                path=format_path(path),
                location=source.location(path),
            )
        if isinstance(value, float) and value.is_integer():
            return int(value)
    return value


class _SpecBuilder:
    """Schema-valid data -> dataclasses, with the semantic checks a schema cannot express."""

    def __init__(self, source: SourceMap, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir

    def fail(self, path: tuple[str, ...], message: str, hint: str | None = None) -> DsgenError:
        return DsgenError(message, path=".".join(path), location=self.source.location(path), hint=hint)

    def build(self, data: dict[str, Any]) -> Spec:
        model = self.model(data["model"])
        hardware = self.hardware(data["hardware"])
        training = self.training(data["training"], hardware)
        constraints = self.constraints(data.get("constraints", {}), hardware)
        self.check_client_optimizer(training, constraints)
        out = data.get("output", {})
        output = Output(target=out.get("target", "deepspeed"), path=out.get("path", "ds_config.json"))
        key_lines = tuple(
            (".".join(str(part) for part in path), line)
            for path, line in sorted(self.source.lines.items(), key=lambda item: item[1])
            if not self.source.is_overridden(tuple(path))
        )
        key_overrides = tuple(
            (".".join(str(part) for part in path), where) for path, where in self.source.overridden.items()
        )
        return Spec(
            model,
            hardware,
            training,
            constraints,
            output,
            source=self.source.file,
            key_lines=key_lines,
            key_overrides=key_overrides,
        )

    # ---- model ---------------------------------------------------------------------------
    def model(self, block: dict[str, Any]) -> ModelShape:
        given = [k for k in ("preset", "hf_config", "architecture") if k in block]
        if len(given) != 1:
            found = f"got {', '.join(given)}" if given else "got none"
            raise self.fail(("model",), f"give exactly one of preset, hf_config or architecture ({found})")
        kind = given[0]
        name = block.get("name")
        if kind == "preset":
            from dsgen.catalog.presets import get_model

            shape = get_model(block["preset"], path="model.preset", location=self.source.location(("model", "preset")))
        elif kind == "hf_config":
            from dsgen.catalog.hf_config import shape_from_hf_config

            config_file = self.base_dir / block["hf_config"]
            if not (
                config_file / "config.json" if config_file.is_dir() else config_file
            ).is_file():  # a file or a model folder
                raise self.fail(("model", "hf_config"), f"file not found: {config_file}")
            shape = shape_from_hf_config(config_file, name=name)
        else:
            shape = self.architecture(block["architecture"], name or "custom")
        if name and shape.name != name:
            from dataclasses import replace

            shape = replace(shape, name=name)
        return shape

    def architecture(self, arch: dict[str, Any], name: str) -> ModelShape:
        family = arch.get("family", "llama")
        defaults = dict(_FAMILY_DEFAULTS[family])
        heads = arch["num_attention_heads"]
        hidden = arch["hidden_size"]
        kv_heads = arch.get("num_key_value_heads", heads)
        base = ("model", "architecture")
        if heads % kv_heads:
            raise self.fail(
                (*base, "num_key_value_heads"), f"must divide num_attention_heads ({heads}), got {kv_heads}"
            )
        head_dim = arch.get("head_dim")
        if head_dim is None:
            if hidden % heads:
                raise self.fail(
                    (*base, "num_attention_heads"),
                    f"must divide hidden_size ({hidden}) unless head_dim is given, got {heads}",
                )
            head_dim = hidden // heads
        mlp = arch.get("mlp", defaults.pop("mlp", "swiglu"))
        intermediate = arch.get("intermediate_size")
        if intermediate is None:
            intermediate = 4 * hidden if mlp == "gelu" else -(-int(8 * hidden / 3) // 256) * 256
        experts = arch.get("num_experts", 0)
        per_token = arch.get("experts_per_token", 2 if experts else 0)
        if experts and not 1 <= per_token <= experts:
            raise self.fail(
                (*base, "experts_per_token"), f"must be between 1 and num_experts ({experts}), got {per_token}"
            )
        max_positions = arch.get("max_position_embeddings", 4096)
        learned = defaults.pop("learned_positions", False)
        # MoE and multi-head latent attention traits (issue 17): passed through as ModelShape fields
        traits = {k: arch[k] for k in _ARCHITECTURE_TRAITS if k in arch}
        if "kv_lora_rank" in traits:  # MLA: every head has its own key and value
            for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if key not in traits:
                    raise self.fail((*base, key), "missing: multi-head latent attention (kv_lora_rank) needs it")
            head_dim, kv_heads = traits.get("qk_nope_head_dim", 0) + traits.get("qk_rope_head_dim", 0), heads
        return ModelShape(
            name=name,
            family=family,
            num_layers=arch["num_layers"],
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            vocab_size=arch["vocab_size"],
            mlp=mlp,
            norm=arch.get("norm", defaults.pop("norm", "rmsnorm")),
            tie_word_embeddings=arch.get("tie_word_embeddings", defaults.pop("tie_word_embeddings", False)),
            attention_bias=arch.get("attention_bias", defaults.pop("attention_bias", False)),
            mlp_bias=arch.get("mlp_bias", defaults.pop("mlp_bias", False)),
            learned_position_embeddings=max_positions if learned else 0,
            num_experts=experts,
            experts_per_token=per_token,
            max_position_embeddings=max_positions,
            **defaults,
            **traits,
        )

    # ---- hardware ------------------------------------------------------------------------
    def hardware(self, block: dict[str, Any]) -> Hardware:
        gpu_value = block["gpu"]
        if isinstance(gpu_value, str):
            from dsgen.catalog.presets import get_gpu

            gpu = get_gpu(gpu_value, path="hardware.gpu", location=self.source.location(("hardware", "gpu")))
        else:
            peak = gpu_value.get("peak_tflops", 100.0)
            gpu = GpuSpec(
                name=gpu_value.get("name", "custom-gpu"),
                memory_gib=gpu_value["memory_gib"],
                bf16=gpu_value.get("bf16", True),
                fp16=gpu_value.get("fp16", True),
                peak_tflops_bf16=peak,
                peak_tflops_fp16=peak,
                peak_tflops_fp32=gpu_value.get("peak_tflops_fp32", peak / 8),
                memory_bandwidth_gbps=gpu_value.get("memory_bandwidth_gbps", 1000.0),
                interconnect_bandwidth_gbps=gpu_value.get("interconnect_bandwidth_gbps", 25.0),
                pcie_bandwidth_gbps=gpu_value.get("pcie_bandwidth_gbps", 25.0),
                description="described inline in the spec",
            )
        nvme = block.get("nvme")
        return Hardware(
            gpu=gpu,
            gpus_per_node=block.get("gpus_per_node", 8),
            nodes=block.get("nodes", 1),
            cpu_memory_gib=block.get("cpu_memory_gib", 512.0),
            inter_node_bandwidth_gbps=block.get("inter_node_bandwidth_gbps", 25.0),
            cpu_optimizer_gparams_per_s=block.get("cpu_optimizer_gparams_per_s", 2.0),
            nvme=NvmeSpec(nvme["path"], nvme["capacity_gib"], nvme.get("bandwidth_gbps", 3.0)) if nvme else None,
        )

    # ---- training ------------------------------------------------------------------------
    def training(self, block: dict[str, Any], hardware: Hardware) -> Training:
        precision = block.get("precision", "auto")
        gpu = hardware.gpu
        if precision == "bf16" and not gpu.bf16:
            raise self.fail(
                ("training", "precision"),
                f"bf16 is not supported by {gpu.name} (no bf16 hardware)",
                hint="use precision: fp16 (or auto, which picks fp16 on this GPU)",
            )
        if precision == "fp16" and not gpu.fp16:
            raise self.fail(("training", "precision"), f"fp16 is not supported by {gpu.name}")
        given = [k for k in ("global_batch_size", "tokens_per_step") if k in block]
        if len(given) != 1:
            found = f"got {' and '.join(given)}" if given else "got neither"
            raise self.fail(("training",), f"give exactly one of global_batch_size or tokens_per_step ({found})")
        opt = block.get("optimizer", {})
        betas = tuple(opt.get("betas", (0.9, 0.999)))
        sched = block.get("scheduler", {})
        return Training(
            sequence_length=block["sequence_length"],
            global_batch_size=block.get("global_batch_size"),
            tokens_per_step=block.get("tokens_per_step"),
            precision=precision,
            attention=block.get("attention", "flash"),
            gradient_clipping=float(block.get("gradient_clipping", 1.0)),
            mfu=block.get("mfu"),
            optimizer=Optimizer(
                type=opt.get("type", "adamw"),
                lr=float(opt.get("lr", 1e-4)),
                weight_decay=float(opt.get("weight_decay", 0.0)),
                betas=(float(betas[0]), float(betas[1])),
                eps=float(opt.get("eps", 1e-8)),
                momentum=float(opt.get("momentum", 0.9)),
            ),
            scheduler=Scheduler(
                type=sched.get("type", "warmup_decay"),
                warmup_steps=sched.get("warmup_steps", 100),
                total_steps=sched.get("total_steps", 10000),
            ),
        )

    # ---- constraints ---------------------------------------------------------------------
    def check_client_optimizer(self, training: Training, constraints: Constraints) -> None:
        """Optimizers the training script builds itself (Adafactor, 8-bit AdamW) are not offloaded.

        DeepSpeed's optimizer offload steps with its own CPU Adam; with any other optimizer it
        refuses to start unless ``zero_force_ds_cpu_optimizer`` is false, and then runs the
        client's unfused code on the host, which is not a plan dsgen recommends or sizes.
        """
        optimizer = training.optimizer.type
        if is_client_optimizer(optimizer) and constraints.offload_optimizer not in (None, "none"):
            raise self.fail(
                ("constraints", "offload_optimizer"),
                f"optimizer offload runs DeepSpeed's own CPU Adam, not {CLIENT_OPTIMIZERS[optimizer]} "
                f"(training.optimizer.type {optimizer})",
                hint="use offload_optimizer: none, or an optimizer DeepSpeed implements (adamw, adam, lion, adagrad)",
            )

    def constraints(self, block: dict[str, Any], hardware: Hardware) -> Constraints:
        def pinned(key: str) -> Any:
            value = block.get(key, "auto")
            return None if value == "auto" else value

        stage = pinned("zero_stage")
        offload_optimizer = pinned("offload_optimizer")
        offload_param = pinned("offload_param")
        for key, value in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
            if value == "nvme" and hardware.nvme is None:
                raise self.fail(
                    ("constraints", key),
                    "nvme offload needs hardware.nvme (path and capacity_gib)",
                )
        if offload_param not in (None, "none") and stage is not None and stage != 3:
            raise self.fail(
                ("constraints", "offload_param"),
                f"parameter offload needs ZeRO stage 3, but zero_stage is pinned to {stage}",
                hint="set zero_stage: 3 or offload_param: none",
            )
        if offload_optimizer not in (None, "none") and stage == 0:
            raise self.fail(
                ("constraints", "offload_optimizer"),
                "optimizer offload needs ZeRO stage 1, 2 or 3, but zero_stage is pinned to 0",
            )
        return Constraints(
            zero_stage=stage,
            offload_optimizer=offload_optimizer,
            offload_param=offload_param,
            activation_checkpointing=CHECKPOINTING_PINS.get(pinned("activation_checkpointing")),
            micro_batch_size=pinned("micro_batch_size"),
            gradient_accumulation_steps=pinned("gradient_accumulation_steps"),
            memory_headroom=float(block.get("memory_headroom", 0.10)),
            allow_batch_rounding=block.get("allow_batch_rounding", "none"),
        )
