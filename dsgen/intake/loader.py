"""Read a spec file (plus ``--set`` overrides) into a validated, fully resolved :class:`Spec`.

Order of checks: YAML syntax and duplicate keys, then the JSON Schema (shape, types, unknown
keys with did-you-mean), then meaning (preset names, files, hardware support). Every error names
the key path and the line it came from.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

from dsgen.catalog.gpu import GpuSpec
from dsgen.catalog.linear_layers import linear_layer_names
from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError
from dsgen.estimate.objectives import GENERATION_OBJECTIVES, REFERENCE_OBJECTIVES
from dsgen.estimate.optimizers import (
    TORCH_FUSED_OPTIMIZERS,
    TORCH_OPTIMIZERS,
    client_optimizer_class,
    is_client_optimizer,
)
from dsgen.facts.release import normalize_release
from dsgen.intake.overrides import apply_overrides
from dsgen.intake.schema_errors import LARGEST_NUMBER, check_against_schema
from dsgen.resources import schema_path
from dsgen.spec.defaults import spec_default
from dsgen.spec.types import (
    Constraints,
    FineTuning,
    Freeze,
    Generation,
    Hardware,
    Lora,
    NvmeSpec,
    Optimizer,
    Output,
    Quantization,
    Scheduler,
    Spec,
    Training,
)
from dsgen.spec.yaml_source import SourceMap, format_path, load_yaml, read_source
from dsgen.vocabulary import Checkpointing

#: The keys of an inline GPU whose defaults the schema gives (peak_tflops_fp32 is derived).
_INLINE_GPU_DEFAULTS = (
    "name",
    "bf16",
    "fp16",
    "peak_tflops",
    "memory_bandwidth_gbps",
    "interconnect_bandwidth_gbps",
    "pcie_bandwidth_gbps",
)

# constraints.activation_checkpointing as the spec writes it -> the solver's checkpointing mode
CHECKPOINTING_PINS: dict[object, Checkpointing] = {False: "none", True: "full", "selective": "selective"}


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
    normalise_preset_names(data)
    check_against_schema(data, schema_path("spec"), source)
    return _SpecBuilder(source, base_dir).build(data)


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


def normalise_preset_names(data: dict[str, Any]) -> None:
    """Write preset names the way the schema's enums list them (``A100_80GB`` -> ``a100-80gb``),
    when they name a preset; an unknown name is left for the schema check to report."""
    from dsgen.catalog.presets import get_gpu, get_model

    for section, key, lookup in (("hardware", "gpu", get_gpu), ("model", "preset", get_model)):
        block = data.get(section)
        if isinstance(block, dict) and isinstance(block.get(key), str):
            with contextlib.suppress(DsgenError):  # an unknown name: the schema check reports it
                block[key] = lookup(block[key]).name


def _given(block: dict[str, Any], *keys: str, floats: tuple[str, ...] = ()) -> dict[str, Any]:
    """The keys a spec block sets (the dataclasses hold the schema's defaults for the others);
    ``floats`` are stored as floats even when written as integers."""
    return {key: float(block[key]) if key in floats else block[key] for key in keys if key in block}


class _SpecBuilder:
    """Schema-valid data -> dataclasses, with the semantic checks a schema cannot express."""

    def __init__(self, source: SourceMap, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir
        self.notes: list[str] = []

    def fail(self, path: tuple[str, ...], message: str, hint: str | None = None) -> DsgenError:
        return DsgenError(message, path=".".join(path), location=self.source.location(path), hint=hint)

    def build(self, data: dict[str, Any]) -> Spec:
        model = self.model(data["model"])
        hardware = self.hardware(data["hardware"])
        training = self.training(data["training"], hardware)
        constraints = self.constraints(data.get("constraints", {}), hardware)
        self.check_client_optimizer(training, constraints)
        self.check_long_context(model, hardware, training, constraints)
        self.check_liger(model, training, constraints)
        self.check_model_parallel(model, hardware, training, constraints)
        self.check_lora_targets(model, training)
        output = Output(**_given(data.get("output", {}), "target", "path", "launcher"))
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
            notes=tuple(self.notes),
        )

    # ---- model ---------------------------------------------------------------------------
    def model(self, block: dict[str, Any]) -> ModelShape:
        given = [k for k in ("preset", "hf", "hf_config", "architecture") if k in block]
        if len(given) != 1:
            found = f"got {', '.join(given)}" if given else "got none"
            raise self.fail(("model",), f"give exactly one of preset, hf, hf_config or architecture ({found})")
        if "hf_revision" in block and given != ["hf"]:
            raise self.fail(("model", "hf_revision"), "hf_revision names the revision of model.hf; give model.hf")
        kind = given[0]
        name = block.get("name")
        if kind == "preset":
            from dsgen.catalog.presets import get_model

            shape = get_model(block["preset"], path="model.preset", location=self.source.location(("model", "preset")))
        elif kind in ("hf", "hf_config"):
            from dsgen.catalog.hf_config import AssumptionWarning, shape_from_hf_config

            if kind == "hf":
                source = self.hf_source(block["hf"], block.get("hf_revision", spec_default("model.hf_revision")))
                if isinstance(source, str):  # not in the cache: the preset of its architecture
                    from dsgen.catalog.presets import get_model

                    return replace(get_model(source), name=name or block["hf"])
                config_file, name = source, name or block["hf"]
            else:
                config_file = self.base_dir / block["hf_config"]
            try:  # a file or a model folder
                present = (config_file / "config.json" if config_file.is_dir() else config_file).is_file()
            except OSError as exc:  # a name the file system refuses (too long, ...), not a missing file
                raise self.fail(("model", kind), f"cannot read {config_file}: {exc.strerror}") from None
            if not present:
                raise self.fail(("model", kind), f"file not found: {config_file}")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", AssumptionWarning)
                shape = shape_from_hf_config(config_file, name=name)
            # what the reader assumed travels with the spec, into the text output and --json's notes
            self.notes.extend(str(w.message) for w in caught if issubclass(w.category, AssumptionWarning))
        else:
            shape = self.architecture(block["architecture"], name or "custom")
        if name and shape.name != name:
            shape = replace(shape, name=name)
        return shape

    def hf_source(self, model_id: str, revision: str) -> Path | str:
        """Where Hugging Face model ``model_id`` is read from: its ``config.json`` in the local cache,
        else the name of the preset of its architecture (:func:`dsgen.catalog.presets.preset_for_hf_id`,
        said in the notes), else one clear error with the command that fetches the config (dsgen
        never downloads)."""
        from dsgen.catalog.hf_cache import cached_config, hub_cache_dir
        from dsgen.catalog.presets import preset_for_hf_id

        cache = hub_cache_dir()
        try:
            found = cached_config(model_id, cache, revision)
        except OSError as exc:
            raise self.fail(("model", "hf"), f"cannot read the Hugging Face cache {cache}: {exc.strerror}") from None
        if found is not None:
            return found
        preset = preset_for_hf_id(model_id)
        if preset is not None:
            self.notes.append(
                f"model.hf {model_id} is not in the local Hugging Face cache; priced as the preset {preset}, "
                "the same architecture (put its config.json in the cache to price the model itself)"
            )
            return preset
        at = "" if revision == spec_default("model.hf_revision") else f" at revision {revision}"
        raise self.fail(
            ("model", "hf"),
            f"{model_id}{at} is not in the local Hugging Face cache ({cache}); dsgen reads it, never downloads",
            hint=f"fetch its config once: hf download {model_id} config.json"
            + ("" if not at else f" --revision {revision}")
            + " (or set HF_HUB_CACHE, or give model.hf_config; no preset has its architecture)",
        )

    def architecture(self, arch: dict[str, Any], name: str) -> ModelShape:
        """An inline architecture: the numbers given, and the rest from the family's entry in
        ``model-families.yaml``, the file the presets of that family are built from."""
        from dsgen.catalog.presets import family_defaults

        values = {**family_defaults(arch.get("family", spec_default("$defs.architecture.family"))), **arch}
        heads = values["num_attention_heads"]
        hidden = values["hidden_size"]
        base = ("model", "architecture")
        if "kv_lora_rank" in values:  # multi-head latent attention: every head has its own key and value
            for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if key not in values:
                    raise self.fail((*base, key), "missing: multi-head latent attention (kv_lora_rank) needs it")
            values["head_dim"] = values["qk_nope_head_dim"] + values["qk_rope_head_dim"]
            values["num_key_value_heads"] = heads
        kv_heads = values.setdefault("num_key_value_heads", heads)
        if heads % kv_heads:
            raise self.fail(
                (*base, "num_key_value_heads"), f"must divide num_attention_heads ({heads}), got {kv_heads}"
            )
        if "head_dim" not in values:
            if hidden % heads:
                raise self.fail(
                    (*base, "num_attention_heads"),
                    f"must divide hidden_size ({hidden}) unless head_dim is given, got {heads}",
                )
            values["head_dim"] = hidden // heads
        if "intermediate_size" not in values:
            gelu = values["mlp"] == "gelu"
            values["intermediate_size"] = 4 * hidden if gelu else -(-int(8 * hidden / 3) // 256) * 256
        experts = values["num_experts"]
        if "experts_per_token" not in arch:
            values["experts_per_token"] = 2 if experts else 0  # Mixtral's top-2 routing
        per_token = values["experts_per_token"]
        if experts and not 1 <= per_token <= experts:
            raise self.fail(
                (*base, "experts_per_token"), f"must be between 1 and num_experts ({experts}), got {per_token}"
            )
        if values["learned_position_embeddings"]:  # a family with a learned table: one row per position
            values["learned_position_embeddings"] = values["max_position_embeddings"]
        return ModelShape(name=name, **values)

    # ---- hardware ------------------------------------------------------------------------
    def hardware(self, block: dict[str, Any]) -> Hardware:
        gpu_value = block["gpu"]
        if isinstance(gpu_value, str):
            from dsgen.catalog.presets import get_gpu

            gpu = get_gpu(gpu_value, path="hardware.gpu", location=self.source.location(("hardware", "gpu")))
        else:
            inline = {key: spec_default(f"$defs.gpu.{key}") for key in _INLINE_GPU_DEFAULTS} | gpu_value
            peak = inline["peak_tflops"]
            gpu = GpuSpec(
                name=inline["name"],
                memory_gib=inline["memory_gib"],
                bf16=inline["bf16"],
                fp16=inline["fp16"],
                peak_tflops_bf16=peak,
                peak_tflops_fp16=peak,
                peak_tflops_fp32=inline.get("peak_tflops_fp32", peak / 8),  # FP32 without tensor cores
                memory_bandwidth_gbps=inline["memory_bandwidth_gbps"],
                interconnect_bandwidth_gbps=inline["interconnect_bandwidth_gbps"],
                pcie_bandwidth_gbps=inline["pcie_bandwidth_gbps"],
                description="described inline in the spec",
            )
        nvme = block.get("nvme")
        return Hardware(
            gpu=gpu,
            nvme=NvmeSpec(**_given(nvme, "path", "capacity_gib", "bandwidth_gbps")) if nvme else None,
            cpu_memory_assumed="cpu_memory_gib" not in block,
            **_given(
                block,
                "gpus_per_node",
                "nodes",
                "cpu_memory_gib",
                "inter_node_bandwidth_gbps",
                "cpu_optimizer_gparams_per_s",
            ),
        )

    # ---- training ------------------------------------------------------------------------
    def training(self, block: dict[str, Any], hardware: Hardware) -> Training:
        precision = block.get("precision")
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
        optimizer = _given(
            opt,
            "type",
            "implementation",
            "lr",
            "weight_decay",
            "eps",
            "momentum",
            floats=("lr", "weight_decay", "eps", "momentum"),
        )
        kind = optimizer.get("type", Optimizer.type)
        if optimizer.get("implementation") == "torch" and kind not in TORCH_OPTIMIZERS:
            raise self.fail(
                ("training", "optimizer", "implementation"),
                f"torch has no {kind} optimizer dsgen models",
                hint=f"implementation torch is for {', '.join(TORCH_OPTIMIZERS)}",
            )
        if optimizer.get("implementation") == "torch-fused" and kind not in TORCH_FUSED_OPTIMIZERS:
            raise self.fail(
                ("training", "optimizer", "implementation"),
                f"torch has no fused {kind} optimizer dsgen models",
                hint=f"implementation torch-fused is for {', '.join(TORCH_FUSED_OPTIMIZERS)}",
            )
        if "betas" in opt:
            optimizer["betas"] = (float(opt["betas"][0]), float(opt["betas"][1]))
        attention = self.attention(block, gpu)
        return Training(
            finetuning=self.finetuning(block),
            attention=attention,
            deepspeed_version=self.deepspeed_version(block),
            optimizer=Optimizer(**optimizer),
            scheduler=Scheduler(**_given(block.get("scheduler", {}), "type", "warmup_steps", "total_steps")),
            **_given(
                block,
                "sequence_length",
                "global_batch_size",
                "tokens_per_step",
                "precision",
                "gradient_clipping",
                "mfu",
                "liger_kernel",
                "packed_samples",
                floats=("gradient_clipping",),
            ),
        )

    def finetuning(self, block: dict[str, Any]) -> FineTuning:
        """The method, its adapters, quantization or frozen part, the objective and its reference
        model and generation; a block that belongs to another method or objective is refused, so a
        spec never says something dsgen silently ignores."""
        method = block.get("finetuning", FineTuning.method)
        objective = block.get("objective", FineTuning.objective)
        owners = {"lora": ("lora", "qlora"), "quantization": ("qlora",), "freeze": ("freeze",)}
        for key, methods in owners.items():
            if key not in block or method in methods:
                continue
            if "finetuning" not in block:  # a block for a method the spec never chose: surely a mistake
                raise self.fail(
                    ("training", key),
                    f"training.{key} applies to finetuning {' or '.join(methods)}, not {method}",
                    hint=f"set training.finetuning: {methods[0]}, or remove training.{key}",
                )
            # the method was chosen (a sweep or --set may vary it): the other method's block is unused, and said so
            self.notes.append(f"training.{key} is not used: finetuning is {method}")
        if "generation" in block and objective not in GENERATION_OBJECTIVES:
            raise self.fail(
                ("training", "generation"),
                f"training.generation applies to objective grpo or ppo, not {objective}",
                hint="set training.objective: grpo, or remove training.generation",
            )
        lora_block = block.get("lora", {})
        lora = Lora(**_given(lora_block, "rank", "alpha", "dropout", floats=("alpha", "dropout")))
        if isinstance(lora_block.get("target_modules"), list):
            lora = replace(lora, target_modules=tuple(lora_block["target_modules"]))
        elif "target_modules" in lora_block:
            lora = replace(lora, target_modules=lora_block["target_modules"])
        quantization = Quantization(
            **_given(block.get("quantization", {}), "bits", "type", "double_quant", "block_size")
        )
        bits_of_type = {"nf4": 4, "fp4": 4, "gptq": 4, "awq": 4, "int8": 8}
        if quantization.bits != bits_of_type[quantization.type]:
            raise self.fail(
                ("training", "quantization", "bits"),
                f"quantization type {quantization.type} stores {bits_of_type[quantization.type]}-bit weights, "
                f"not {quantization.bits}-bit",
                hint=f"set bits: {bits_of_type[quantization.type]}",
            )
        freeze_block = block.get("freeze", {})
        freeze = Freeze(**_given(freeze_block, "trainable_layers"))
        if "trainable" in freeze_block:
            freeze = replace(freeze, trainable=tuple(freeze_block["trainable"]))
        generation = Generation(
            **_given(
                block.get("generation", {}),
                "num_generations",
                "max_prompt_length",
                "max_completion_length",
                "engine",
                "vllm_gpu_memory_utilization",
                "vllm_gpus",
                floats=("vllm_gpu_memory_utilization",),
            )
        )
        finetuning = FineTuning(
            method=method,
            lora=lora,
            quantization=quantization,
            freeze=freeze,
            objective=objective,
            reference_model=block.get("reference_model", FineTuning.reference_model),
            generation=generation,
        )
        self.check_reference_model(finetuning)
        if objective in GENERATION_OBJECTIVES and block["sequence_length"] != generation.sequence_length:
            raise self.fail(
                ("training", "sequence_length"),
                f"objective {objective} trains on prompt + completion: sequence_length {block['sequence_length']} "
                f"is not max_prompt_length + max_completion_length = {generation.sequence_length}",
                hint=f"set training.sequence_length: {generation.sequence_length}",
            )
        batch = block.get("global_batch_size")
        if objective in GENERATION_OBJECTIVES and batch is not None and batch % generation.num_generations:
            # TRL's GRPOConfig.__post_init__ raises unless the generation batch holds whole groups
            raise self.fail(
                ("training", "generation", "num_generations"),
                f"num_generations {generation.num_generations} does not divide global_batch_size {batch}: "
                "every prompt's completions must fall in one generation batch",
                hint="make global_batch_size a multiple of num_generations",
            )
        return finetuning

    def check_lora_targets(self, model: ModelShape, training: Training) -> None:
        """LoRA target names must name linear layers of this model's decoder (PEFT raises when a
        target matches no module: ``tuners_utils.py``, ``inject_adapter``)."""
        targets = training.finetuning.lora.target_modules
        if not training.finetuning.adapters or isinstance(targets, str):
            return
        names = linear_layer_names(model)
        known = set(names) | {name.split(".")[-1] for name in names}
        unknown = [name for name in targets if name not in known]
        if unknown:
            raise self.fail(
                ("training", "lora", "target_modules"),
                f"{', '.join(unknown)}: no linear layer of {model.name}'s decoder has that name",
                hint=f"this model's linear layers: {', '.join(names)}",
            )

    def check_reference_model(self, finetuning: FineTuning) -> None:
        """A reference model only where the objective reads one, and an adapter to disable only
        under LoRA or QLoRA (TRL's trainers raise or ignore it otherwise)."""
        chosen = finetuning.reference_model
        path = ("training", "reference_model")
        if chosen == "adapter-disabled" and not finetuning.adapters:
            raise self.fail(
                path,
                f"reference_model adapter-disabled needs a LoRA or QLoRA policy (finetuning is {finetuning.method})",
                hint="use reference_model: separate or precomputed",
            )
        uses_one = finetuning.objective in REFERENCE_OBJECTIVES or finetuning.objective == "grpo"
        if chosen not in ("auto", "none") and not uses_one:
            raise self.fail(
                path,
                f"objective {finetuning.objective} uses no reference model",
                hint="remove training.reference_model (or set it to none)",
            )

    def deepspeed_version(self, block: dict[str, Any]) -> str:
        """The release, ``0.X.Y`` (:func:`dsgen.facts.release.normalize_release`); YAML reads an
        unquoted 0.16 as a number, which stands for the profile's release."""
        given = block.get("deepspeed_version", spec_default("training.deepspeed_version"))
        try:
            return normalize_release(str(given))
        except ValueError as exc:
            raise self.fail(("training", "deepspeed_version"), str(exc)) from None

    def attention(self, block: dict[str, Any], gpu: GpuSpec) -> str:
        """The attention kernel: FlashAttention-2 needs compute capability 8.0 (gpu.runs_flash_attention),
        FlashAttention-3 a Hopper GPU (gpu.runs_flash_attention_3). Written by the user on a GPU that
        cannot run it, either is refused; left to the default it becomes sdpa
        (same memory in dsgen's model: both fused, no score matrix), with a note in the output."""
        given = block.get("attention")
        if given == "flash3" and not gpu.runs_flash_attention_3:
            raise self.fail(
                ("training", "attention"),
                f"FlashAttention-3 runs on Hopper GPUs (compute capability 9.0); {gpu.name} has {gpu.compute_capability}",
                hint="use attention: flash (FlashAttention-2) or sdpa",
            )
        if gpu.runs_flash_attention or given not in (None, "flash"):
            return str(given or spec_default("training.attention"))
        cc = gpu.compute_capability
        if given == "flash":
            raise self.fail(
                ("training", "attention"),
                f"FlashAttention-2 needs compute capability 8.0 or newer; {gpu.name} has {cc}",
                hint="use attention: sdpa (PyTorch's fused kernels run on this GPU) or eager",
            )
        if spec_default("training.attention") != "flash":
            return str(spec_default("training.attention"))
        self.notes.append(
            f"attention sdpa: the default, FlashAttention-2, needs compute capability 8.0 and {gpu.name} has {cc}"
        )
        return "sdpa"

    # ---- constraints ---------------------------------------------------------------------
    def check_client_optimizer(self, training: Training, constraints: Constraints) -> None:
        """Optimizers the training script builds itself (Adafactor, 8-bit AdamW) are not offloaded.

        DeepSpeed's optimizer offload steps with its own CPU Adam; with any other optimizer it
        refuses to start unless ``zero_force_ds_cpu_optimizer`` is false, and then runs the
        client's unfused code on the host, which is not a plan dsgen recommends or sizes.
        """
        optimizer = training.optimizer
        if is_client_optimizer(optimizer) and constraints.offload_optimizer not in (None, "none"):
            raise self.fail(
                ("constraints", "offload_optimizer"),
                f"optimizer offload runs DeepSpeed's own CPU Adam, not {client_optimizer_class(optimizer)} "
                f"(training.optimizer.type {optimizer.type}, implementation {optimizer.implementation})",
                hint="use offload_optimizer: none, or an optimizer DeepSpeed implements (adamw, adam, lion, adagrad)",
            )

    def check_long_context(
        self, model: ModelShape, hardware: Hardware, training: Training, constraints: Constraints
    ) -> None:
        """A pinned Ulysses degree must satisfy DeepSpeed's rules (dsgen.estimate.sequence_parallel.sp_violation
        names where DeepSpeed raises); TiledMLP patches a dense MLP's forward, not an MoE block."""
        from dsgen.estimate.sequence_parallel import sp_violation
        from dsgen.search.long_context import ALST_SINCE, TRICKS, alst_available

        sp = constraints.sequence_parallel_size
        if not alst_available(training.deepspeed_version):
            pinned = [("sequence_parallel_size", sp)] if sp is not None and sp > 1 else []
            pinned += [(name, True) for name in TRICKS if getattr(constraints, name) is True]
            if pinned:
                name, value = pinned[0]
                raise self.fail(
                    ("constraints", name),
                    f"{name}: {json.dumps(value)} needs DeepSpeed {'.'.join(map(str, ALST_SINCE))} or newer (ALST); "
                    f"training.deepspeed_version is {training.deepspeed_version}",
                    hint="use training.deepspeed_version: 0.19, or leave the long-context constraints to auto",
                )
        if sp is not None:
            why = sp_violation(model, sp, hardware.world_size, training.sequence_length, training.attention)
            if why:
                raise self.fail(
                    ("constraints", "sequence_parallel_size"), why, hint="use auto, 1, or a degree that satisfies it"
                )
        if constraints.tiled_mlp and model.is_moe:
            raise self.fail(
                ("constraints", "tiled_mlp"),
                f"{model.name} is a mixture of experts; TiledMLP tiles a dense MLP's forward",
                hint="use tiled_mlp: false or auto",
            )

    def check_model_parallel(
        self, model: ModelShape, hardware: Hardware, training: Training, constraints: Constraints
    ) -> None:
        """A pinned AutoTP or AutoEP degree must be one DeepSpeed runs and dsgen prices
        (dsgen.search.model_parallel_choices says why not); AutoTP and Ulysses exclude each other
        (``module_inject/auto_ep_folding.py``, ``runtime/engine.py``)."""
        from dsgen.search.model_parallel_choices import ep_violation, tp_violation

        tp, ep = constraints.tensor_parallel_size, constraints.expert_parallel_size
        if tp is not None:
            why = tp_violation(model, tp, hardware.gpus_per_node, training)
            if why:
                raise self.fail(
                    ("constraints", "tensor_parallel_size"), why, hint="use auto, 1, or a degree that satisfies it"
                )
            if tp > 1 and (constraints.sequence_parallel_size or 1) > 1:
                raise self.fail(
                    ("constraints", "tensor_parallel_size"),
                    "AutoTP and Ulysses sequence parallelism are mutually exclusive in DeepSpeed",
                    hint="pin one of tensor_parallel_size and sequence_parallel_size to 1",
                )
        if ep is not None:
            why = ep_violation(model, ep, hardware.world_size, training)
            if why:
                raise self.fail(
                    ("constraints", "expert_parallel_size"), why, hint="use auto, 1, or a degree that satisfies it"
                )
        if (tp or 1) > 1 and (ep or 1) > 1:
            raise self.fail(
                ("constraints", "tensor_parallel_size"),
                "AutoTP with AutoEP needs a tensor_parallel.partition_config for the attention, which dsgen does not write",
                hint="pin one of tensor_parallel_size and expert_parallel_size to 1",
            )

    def check_liger(self, model: ModelShape, training: Training, constraints: Constraints) -> None:
        """Liger-Kernel is modelled where its patch keeps the HF layer layout dsgen inventories
        (dsgen.estimate.activations.LIGER_FAMILIES); its fused linear cross-entropy is already a
        tiled loss, so DeepSpeed's TiledFusedLogitsLoss cannot be pinned beside it."""
        from dsgen.estimate.activations import LIGER_FAMILIES, liger_modelled

        if not training.liger_kernel:
            return
        if not liger_modelled(model):
            raise self.fail(
                ("training", "liger_kernel"),
                f"Liger-Kernel's memory is modelled for dense {', '.join(sorted(LIGER_FAMILIES))} models, "
                f"not {model.family}{' (mixture of experts)' if model.is_moe else ''}",
                hint="use liger_kernel: false",
            )
        if constraints.tiled_loss:
            raise self.fail(
                ("constraints", "tiled_loss"),
                "liger_kernel already computes the loss tile by tile (LigerFusedLinearCrossEntropyLoss); "
                "tiled_loss would replace it with DeepSpeed's TiledFusedLogitsLoss",
                hint="use tiled_loss: auto or false with liger_kernel: true",
            )

    def constraints(self, block: dict[str, Any], hardware: Hardware) -> Constraints:
        def pinned(key: str) -> Any:
            value = block.get(key)
            return None if value == "auto" else value  # "auto" (the default): the solver chooses

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
        checkpointing = CHECKPOINTING_PINS.get(pinned("activation_checkpointing"))
        if pinned("checkpoint_offload") is True and checkpointing not in (None, "full"):
            raise self.fail(
                ("constraints", "checkpoint_offload"),
                "checkpoint offload moves the inputs of checkpointed layers to host RAM, "
                "but activation_checkpointing is not true",
                hint="set activation_checkpointing: true (or auto), or checkpoint_offload: false",
            )
        return Constraints(
            sequence_parallel_size=pinned("sequence_parallel_size"),
            tiled_mlp=pinned("tiled_mlp"),
            tiled_loss=pinned("tiled_loss"),
            checkpoint_offload=pinned("checkpoint_offload"),
            zero_stage=stage,
            offload_optimizer=offload_optimizer,
            offload_param=offload_param,
            activation_checkpointing=checkpointing,
            micro_batch_size=pinned("micro_batch_size"),
            gradient_accumulation_steps=pinned("gradient_accumulation_steps"),
            zeropp=pinned("zeropp"),
            tensor_parallel_size=pinned("tensor_parallel_size"),
            expert_parallel_size=pinned("expert_parallel_size"),
            **_given(
                block,
                "memory_headroom",
                "allow_batch_rounding",
                "seq_parallel_communication_data_type",
                floats=("memory_headroom",),
            ),
        )
