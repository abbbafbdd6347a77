"""The memoised pricing terms read nothing outside their keys.

Several terms of a candidate's price are memoised on the plan fields they read (commit 98e38b4,
dsgen/estimate/memo.py): on a miss the wrapper rebuilds a :class:`~dsgen.plan.Plan` from the key's
fields alone, every other field at its simplest, and prices that. Should a memoised term read a
field its key leaves out (today, or after an edit), it silently prices the simplest value of that
field, and dsgen reports a wrong number without an error. This guard records every call the
pricing makes to each memoised wrapper while the solver searches a spread of specs (dense and MoE
presets, one and two nodes with NVMe, ZeRO-0..3, CPU/NVMe and partial offload, full and selective
checkpointing, AutoTP/AutoEP, Ulysses SP with the ALST tricks, LoRA/QLoRA with DPO/GRPO, fp16 on
V100) and while it prices variants of those plans with one field changed at a time (every ZeRO
knob, micro-batch, accumulation, checkpointing, precision, offload ratio, long-context trick), then
compares each recorded result with the uncached function the wrapper stands for, called directly
with the real plan. Both are the same code on the same inputs, so they must be equal to the bit.

The wrappers (found by grepping dsgen/estimate for ``memo_tables``, ``lru_cache`` and ``simplest_plan(``,
the rebuilt plans) and what each stands for:

- ``memory._layout_terms``            -> ``memory._price_layout``
- ``memory._zero_buffer_bytes``       -> ``memory.buffer_bytes(local, plan)`` (keyed on fields, so
  paired with the plan of the ``estimate_memory`` call that made it)
- ``model_states.model_states``       -> ``model_states._plan_model_states``
- ``sequence_parallel._long_context_memory`` -> ``sequence_parallel._plan_long_context_memory``
  (paired with the plan of its ``long_context_memory`` call)
- ``throughput._communication_terms`` -> ``communication_s``, ``hook_s``, ``collective_latency_s``
- ``throughput._model_parallel_s``    -> ``model_parallel_comm_s``
- ``throughput.offload_s``            -> ``throughput._offload_s``

The other caches of dsgen/estimate (``lru_cache`` on functions of the values they read,
``identity_cache`` on whole immutable arguments) key on every argument, so they cannot read a field
outside their key. The guard is shown to bite by :func:`test_the_guard_sees_a_field_the_rebuilt_plan_drops`
and :func:`test_the_guard_sees_a_field_the_key_leaves_out`, which inject the two ways such a bug
happens and require a mismatch. It was also run against scratch copies of dsgen (never this
checkout) with one real edit each, and failed on exactly the edited wrapper every time: knobs out
of ``_layout_terms``' key and plan; ``offload_ratio`` out of its key alone; checkpointing no longer
passed to ``_zero_buffer_bytes``; ``offload_ratio`` pinned to 1.0 and accumulation to one step in
``model_states``' key; precision pinned to bf16 and the ALST tricks dropped in
``_long_context_memory``'s plan; accumulation out of ``_communication_terms``' key, and ``hook_s``
made to read the micro-batch; checkpointing out of ``_model_parallel_s``' key and plan;
``offload_ratio`` out of ``offload_s``' key, and ``_offload_s`` made to read the ZeRO stage.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from types import ModuleType
from typing import Any

import pytest

from dsgen.estimate import memory, model_states, sequence_parallel, throughput
from dsgen.intake.loader import load_spec_text
from dsgen.plan import ModelParallel, Plan, ZeroKnobs, simplest_plan
from dsgen.search.evaluation import evaluate
from dsgen.search.global_batch import global_batch_target
from dsgen.search.solver import _search
from dsgen.spec.types import Spec
from dsgen.vocabulary import Precision

_NVME = "  nvme: {path: /local_nvme, capacity_gib: 4000}\n"


def _spec(
    preset: str,
    *,
    gpu: str = "h100-80gb",
    gpus_per_node: int = 8,
    nodes: int = 1,
    cpu_gib: int = 1024,
    sequence_length: int = 4096,
    global_batch: int = 64,
    training: str = "",
    constraints: str = "",
) -> Spec:
    """A spec of ``preset`` on that hardware, NVMe declared (so NVMe offload is searched)."""
    return load_spec_text(
        f"model:\n  preset: {preset}\n"
        f"hardware:\n  gpu: {gpu}\n  gpus_per_node: {gpus_per_node}\n  nodes: {nodes}\n"
        f"  cpu_memory_gib: {cpu_gib}\n{_NVME}"
        f"training:\n  sequence_length: {sequence_length}\n  global_batch_size: {global_batch}\n{training}"
        f"constraints:\n  memory_headroom: 0.1\n{constraints}"
    )


_LORA = "  finetuning: lora\n  lora: {rank: 16, target_modules: all-linear}\n"
_QLORA = "  finetuning: qlora\n  lora: {rank: 16, target_modules: all-linear}\n  quantization: {bits: 4, type: nf4}\n"

#: name -> (spec, whether to run the long-context search too). Between them: dense and MoE, one and
#: two nodes, eager attention (selective checkpointing), ZeRO++, AutoTP and AutoEP, Ulysses SP 4
#: with every ALST trick set, LoRA + DPO with a separate reference, QLoRA + GRPO, fp16 on V100,
#: CPU and NVMe offload of either state, and a 70B whose ZeRO-3 offload the search splits.
SPECS: dict[str, tuple[Callable[[], Spec], bool]] = {
    "llama-8b eager": (lambda: _spec("llama-3.1-8b", training="  attention: eager\n"), False),
    "llama-8b 2 nodes zero++": (
        lambda: _spec("llama-3.1-8b", nodes=2, global_batch=128, constraints="  zeropp: full\n"),
        False,
    ),
    "qwen3-30b-a3b": (lambda: _spec("qwen3-30b-a3b", cpu_gib=2048), False),
    "mixtral 2 nodes": (lambda: _spec("mixtral-8x7b", nodes=2), False),
    "llama-8b 64k sp4": (
        lambda: _spec(
            "llama-3.1-8b",
            sequence_length=65536,
            global_batch=8,
            constraints="  sequence_parallel_size: 4\n  seq_parallel_communication_data_type: bf16\n",
        ),
        True,
    ),
    "lora dpo": (
        lambda: _spec(
            "llama-3.1-8b",
            global_batch=32,
            training=_LORA + "  objective: dpo\n  reference_model: separate\n",
        ),
        False,
    ),
    "qlora grpo 4090": (
        lambda: _spec(
            "qwen2.5-7b",
            gpu="rtx-4090",
            gpus_per_node=2,
            cpu_gib=128,
            sequence_length=768,
            global_batch=16,
            training=_QLORA + "  objective: grpo\n",
        ),
        False,
    ),
    "mistral fp16 v100": (
        lambda: _spec(
            "mistral-7b",
            gpu="v100-32gb",
            nodes=2,
            cpu_gib=768,
            sequence_length=2048,
            global_batch=128,
            training="  attention: sdpa\n",
        ),
        False,
    ),
    "llama-70b offload": (
        lambda: _spec("llama-3.1-70b", gpu="a100-80gb", cpu_gib=512, global_batch=32),
        False,
    ),
}


# ---------------------------------------------------------------------------------------------
# The wrappers and the uncached functions they stand for


@dataclass(frozen=True)
class Term:
    """A memoised wrapper: where it lives, the call whose plan it prices when its own arguments
    carry only plan fields (``outer``), and the uncached function it stands for (``direct``: the
    wrapper's bound arguments and the outer call's, to the value the wrapper must return)."""

    module: ModuleType
    name: str
    direct: Callable[[dict[str, Any], dict[str, Any]], Any]
    outer: tuple[ModuleType, str] | None = None

    @property
    def label(self) -> str:
        return f"{self.module.__name__.rsplit('.', 1)[-1]}.{self.name}"


def _communication_direct(a: dict[str, Any], _: dict[str, Any]) -> tuple[float, float, float, float]:
    shape, plan, hardware, trained = a["shape"], a["plan"], a["hardware"], a["trained"]
    overlappable, blocking = throughput.communication_s(shape, plan, hardware, trained)
    # the wrapper's contract: launch latency is 0 for a single ZeRO rank (its consumer adds it only above one)
    latency = throughput.collective_latency_s(shape, plan, hardware) if plan.zero_ranks > 1 else 0.0
    return overlappable, blocking, throughput.hook_s(shape, plan), latency


def _long_context_direct(_: dict[str, Any], o: dict[str, Any]) -> Any:
    training = o["training"]
    return sequence_parallel._plan_long_context_memory(
        o["shape"], o["plan"], training.sequence_length, training.attention, training.liger_kernel, o["logits_released"]
    )


TERMS: tuple[Term, ...] = (
    Term(memory, "_layout_terms", lambda a, _: memory._price_layout(**a)),
    Term(
        memory,
        "_zero_buffer_bytes",
        lambda a, o: memory.buffer_bytes(a["local"], o["plan"]),
        outer=(memory, "estimate_memory"),
    ),
    Term(
        model_states,
        "model_states",
        lambda a, _: model_states._plan_model_states(a["shape"], a["plan"], a["optimizer"], a["split"]),
    ),
    Term(
        sequence_parallel,
        "_long_context_memory",
        _long_context_direct,
        outer=(sequence_parallel, "long_context_memory"),
    ),
    Term(throughput, "_communication_terms", _communication_direct),
    Term(
        throughput,
        "_model_parallel_s",
        lambda a, _: throughput.model_parallel_comm_s(
            a["shape"],
            a["plan"],
            a["hardware"],
            a["training"],
            throughput.COLLECTIVE_EFFICIENCY,
            throughput.COLLECTIVE_LATENCY_S,
        ),
    ),
    Term(
        throughput,
        "offload_s",
        lambda a, _: throughput._offload_s(a["shape"], a["plan"], a["hardware"], a["training"], a["trained"]),
    ),
)


def clear_pricing_caches() -> None:
    """Empty every memo the wrappers keep, so entries made under an injected fault never outlive it."""
    for table in (
        memory._layout_tables,
        throughput._communication_tables,
        throughput._offload_tables,
        throughput._model_parallel_tables,
    ):
        table.cache_clear()  # type: ignore[attr-defined]
    for cached in (memory._zero_buffer_bytes, model_states._model_states, sequence_parallel._long_context_memory):
        cached.cache_clear()


# ---------------------------------------------------------------------------------------------
# Recording what the pricing asks each wrapper


@dataclass
class Call:
    """One call the pricing made to a memoised wrapper: its arguments, the outer call's, its result."""

    term: Term
    arguments: dict[str, Any]
    outer: dict[str, Any]
    result: Any
    spec: str


class Recorder:
    """Replaces each wrapper (and each outer call) wherever a dsgen module holds it with a shim that
    records the call and returns the wrapper's own result, so the pricing runs unchanged."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.spec = ""
        self._outer: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def install(self, patch: pytest.MonkeyPatch) -> None:
        for term in TERMS:
            self._replace(patch, term.module, term.name, self._recording(term))
            if term.outer is not None:
                self._replace(patch, *term.outer, self._context(term.outer))

    @staticmethod
    def _replace(patch: pytest.MonkeyPatch, module: ModuleType, name: str, shim: Callable[..., Any]) -> None:
        """Every dsgen module's binding of the function, under whatever name it was imported."""
        original = getattr(module, name)
        bindings = [
            (held, attribute)
            for held in list(sys.modules.values())
            if held is not None and held.__name__.startswith("dsgen")
            for attribute, value in list(vars(held).items())
            if value is original
        ]
        assert (module, name) in bindings
        for held, attribute in bindings:
            patch.setattr(held, attribute, shim)

    def _context(self, outer: tuple[ModuleType, str]) -> Callable[..., Any]:
        module, name = outer
        original = getattr(module, name)
        signature = inspect.signature(original)
        stack = self._outer.setdefault((module.__name__, name), [])

        def shim(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            stack.append(dict(bound.arguments))
            try:
                return original(*args, **kwargs)
            finally:
                stack.pop()

        return shim

    def _recording(self, term: Term) -> Callable[..., Any]:
        original = getattr(term.module, term.name)
        signature = inspect.signature(original)
        stack = self._outer.setdefault((term.outer[0].__name__, term.outer[1]), []) if term.outer else []

        def shim(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            outer = stack[-1] if term.outer else {}
            self.calls.append(Call(term, dict(bound.arguments), outer, result, self.spec))
            return result

        return shim


def _identity(value: Any) -> Any:
    """A dedup key part: plain values and plans by value, the spec's objects by identity (the
    recorded calls keep them alive, so no identity is reused)."""
    if value is None or isinstance(value, (bool, int, float, str, Plan)):
        return value
    return id(value)


def _unique(calls: list[Call]) -> list[Call]:
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for call in calls:
        key = (
            call.term.label,
            tuple((k, _identity(v)) for k, v in call.arguments.items()),
            tuple((k, _identity(v)) for k, v in call.outer.items()),
        )
        if key not in seen:
            seen.add(key)
            kept.append(call)
    return kept


# ---------------------------------------------------------------------------------------------
# The plans priced: the solver's candidates, and variants one field at a time


def _one_field_variants(plan: Plan, spec: Spec) -> Iterator[Plan]:
    """``plan`` with one field (one ZeRO knob, one long-context trick) changed: a field a key left
    out would then give two plans one cache entry, or the rebuilt plan the wrong value."""
    k = plan.knobs
    knob_changes: dict[str, Any] = {
        "reduce_bucket_size": k.reduce_bucket_size // 8,
        "allgather_bucket_size": k.allgather_bucket_size // 8,
        "overlap_comm": not k.overlap_comm,
        "contiguous_gradients": not k.contiguous_gradients,
        "prefetch_bucket_size": k.prefetch_bucket_size * 8,
        "param_persistence_threshold": k.param_persistence_threshold * 100,
        "max_live_parameters": k.max_live_parameters // 20,
        "max_reuse_distance": k.max_reuse_distance // 20,
        "sub_group_size": k.sub_group_size // 50,
        "hpz_partition_size": spec.hardware.gpus_per_node if k.hpz_partition_size == 1 else 1,
        "quantized_weights": not k.quantized_weights,
        "quantized_gradients": not k.quantized_gradients,
        "pin_optimizer_offload": not k.pin_optimizer_offload,
        "pin_param_offload": not k.pin_param_offload,
        "gather_16bit_weights_on_model_save": not k.gather_16bit_weights_on_model_save,
    }
    assert set(knob_changes) == {f.name for f in fields(ZeroKnobs)}, "a new ZeroKnobs field: vary it here too"
    for name, value in knob_changes.items():
        yield replace(plan, knobs=replace(k, **{name: value}))
    yield replace(plan, micro_batch_size=plan.micro_batch_size * 2)
    yield replace(plan, gradient_accumulation_steps=plan.gradient_accumulation_steps + 1)
    if plan.gradient_accumulation_steps > 2:
        yield replace(plan, gradient_accumulation_steps=2)
    for mode in ("none", "selective", "full"):
        if mode != plan.checkpointing:
            yield replace(plan, checkpointing=mode)
    other: Precision = "fp16" if plan.precision == "bf16" else "bf16"
    if getattr(spec.hardware.gpu, other):  # what the GPU runs (a V100 has no bf16)
        yield replace(plan, precision=other)
    yield replace(plan, precision="fp32")  # 4-byte elements: bf16 and fp16 are both 2
    if plan.offload_optimizer != "none":
        yield replace(plan, offload_ratio=0.5 if plan.offload_ratio == 1.0 else 1.0)
        yield replace(plan, offload_ratio=0.3)
    lc = plan.long_context
    if lc.sequence_parallel_size > 1:
        for name in ("tiled_mlp", "tiled_loss", "checkpoint_offload"):
            if name != "checkpoint_offload" or plan.checkpointing == "full":
                flipped: dict[str, Any] = {name: not getattr(lc, name)}
                yield replace(plan, long_context=replace(lc, **flipped))
        dtype: Precision = "fp32" if lc.communication_dtype != "fp32" else "bf16"
        yield replace(plan, long_context=replace(lc, communication_dtype=dtype))


def _price(spec: Spec, plan: Plan) -> None:
    """Every pricing entry point that reaches the wrappers: both accountings, the step time (priced
    when first asked for) and the floor."""
    assert evaluate(spec, plan).step.total_s > 0
    memory.estimate_memory(
        spec.model,
        plan,
        spec.hardware,
        spec.training,
        "deepspeed-estimator",
        logits_released=spec.output.logits_released,
        trainer_saves_model=not spec.output.trainer_saves_model,
    )
    throughput.step_time_floor(spec.model, plan, spec.hardware, spec.training)


#: Every how-many-th candidate of a spec is varied field by field (the search itself already
#: prices every knob variant and split of each layout).
VARIED_EVERY = 9


def record(specs: dict[str, tuple[Callable[[], Spec], bool]], varied_every: int = VARIED_EVERY) -> list[Call]:
    """The calls the pricing makes to the wrappers while the solver searches ``specs`` and while
    variants of its candidates are priced (deduplicated)."""
    recorder = Recorder()
    with pytest.MonkeyPatch.context() as patch:
        recorder.install(patch)
        for name, (build, long_search) in specs.items():
            recorder.spec = name
            spec = build()
            target = global_batch_target(spec).sequences
            evaluations, _ = _search(spec, target, "dsgen")
            if long_search:
                evaluations += _search(spec, target, "dsgen", long_search=True)[0]
            plans = list(dict.fromkeys(e.plan for e in evaluations))
            for plan in plans[::varied_every]:
                _price(spec, plan)
                for variant in _one_field_variants(plan, spec):
                    _price(spec, variant)
    return _unique(recorder.calls)


def _difference(got: Any, want: Any) -> str:
    if is_dataclass(got) and is_dataclass(want) and type(got) is type(want):
        parts = [
            f"{f.name}: {_difference(getattr(got, f.name), getattr(want, f.name))}"
            for f in fields(got)
            if getattr(got, f.name) != getattr(want, f.name)
        ]
        return "{" + "; ".join(parts) + "}"
    return f"cached {got!r} != direct {want!r}"


def mismatches(calls: list[Call], term: Term) -> list[str]:
    """A line for each recorded call of ``term`` whose result differs from the direct function's."""
    out = []
    for call in calls:
        if call.term is not term:
            continue
        want = term.direct(call.arguments, call.outer)
        if call.result != want:
            plan = call.outer.get("plan", call.arguments.get("plan"))
            out.append(f"[{call.spec}] {plan}: {_difference(call.result, want)}")
    return out


# ---------------------------------------------------------------------------------------------
# The guard


@pytest.fixture(scope="module")
def calls() -> list[Call]:
    return record(SPECS)


@pytest.mark.parametrize("term", TERMS, ids=lambda t: t.label)
def test_a_memoised_term_equals_its_uncached_function_on_the_real_plan(calls: list[Call], term: Term) -> None:
    mine = [c for c in calls if c.term is term]
    assert len(mine) >= 50, f"{term.label}: only {len(mine)} calls recorded (is it still called?)"
    wrong = mismatches(calls, term)
    assert not wrong, f"{term.label} reads a plan field outside its key ({len(wrong)} of {len(mine)}):\n" + "\n".join(
        wrong[:5]
    )


def test_the_specs_reach_every_dimension(calls: list[Call]) -> None:
    """The guard is only as wide as the plans it sees: every dimension a key could leave out is
    priced with more than one value."""
    plans = {c.arguments["plan"] for c in calls if "plan" in c.arguments}
    seen: dict[str, set[Any]] = {
        "zero_stage": {p.zero_stage for p in plans},
        "offload_optimizer": {p.offload_optimizer for p in plans},
        "offload_param": {p.offload_param for p in plans},
        "checkpointing": {p.checkpointing for p in plans},
        "precision": {p.precision for p in plans},
        "offload_ratio": {p.offload_ratio < 1 for p in plans},
        "accumulates": {p.gradient_accumulation_steps > 1 for p in plans},
        "micro_batch_size": {p.micro_batch_size for p in plans},
        "tensor_parallel": {p.tensor_parallel_size > 1 for p in plans},
        "expert_parallel": {p.expert_parallel_size > 1 for p in plans},
        "sequence_parallel": {p.sequence_parallel_size > 1 for p in plans},
        "zeropp": {p.knobs.zeropp for p in plans},
    }
    for name in ("tiled_mlp", "tiled_loss", "checkpoint_offload"):
        seen[name] = {getattr(p.long_context, name) for p in plans if p.sequence_parallel_size > 1}
    seen["communication_dtype"] = {p.long_context.communication_dtype for p in plans if p.sequence_parallel_size > 1}
    for f in fields(ZeroKnobs):
        seen[f"knobs.{f.name}"] = {getattr(p.knobs, f.name) for p in plans}
    single = sorted(name for name, values in seen.items() if len(values) < 2)
    assert not single, f"priced with one value only: {single}"
    assert {"cpu", "nvme"} <= seen["offload_optimizer"] & seen["offload_param"]
    assert {0, 1, 2, 3} <= seen["zero_stage"]
    assert {"none", "selective", "full"} <= seen["checkpointing"]
    assert {"bf16", "fp16"} <= seen["precision"]


# ---------------------------------------------------------------------------------------------
# The guard bites: the two ways a key goes wrong, injected

#: For speed, one spec each: ZeRO++ knobs, offload and AutoTP in the first, the ALST tricks in the second.
_ZEROPP, _SP = "llama-8b 2 nodes zero++", "llama-8b 64k sp4"


def _record_one(name: str) -> list[Call]:
    return record({name: SPECS[name]}, varied_every=25)


def _forgetting(field_name: str) -> Callable[..., Plan]:
    """A ``simplest_plan`` that drops ``field_name``: the rebuilt plan then carries its default,
    as when a wrapper's key (and rebuilt plan) leaves out a field its function reads."""

    def build(precision: Any, **kwargs: Any) -> Plan:
        kwargs.pop(field_name, None)
        return simplest_plan(precision, **kwargs)

    return build


def _case_id(value: Any) -> str:
    """A case's id, the same in every process (pytest-xdist compares them): a set's members sorted."""
    if isinstance(value, ModuleType):
        return value.__name__.rsplit(".", 1)[-1]
    return "+".join(sorted(value)) if isinstance(value, set) else str(value)


@pytest.mark.parametrize(
    ("module", "field_name", "spec", "caught"),
    [
        (memory, "knobs", _ZEROPP, {"_layout_terms", "_zero_buffer_bytes"}),
        (model_states, "model_parallel", _ZEROPP, {"model_states"}),
        (sequence_parallel, "long_context", _SP, {"_long_context_memory"}),
        (throughput, "knobs", _ZEROPP, {"_communication_terms"}),
        (throughput, "model_parallel", _ZEROPP, {"_communication_terms", "_model_parallel_s", "offload_s"}),
    ],
    ids=_case_id,
)
def test_the_guard_sees_a_field_the_rebuilt_plan_drops(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, field_name: str, spec: str, caught: set[str]
) -> None:
    clear_pricing_caches()
    monkeypatch.setattr(module, "simplest_plan", _forgetting(field_name))
    try:  # the direct functions run under the fault too, as they would with the bug in dsgen
        calls = _record_one(spec)
        flagged = {term.name for term in TERMS if mismatches(calls, term)}
    finally:
        monkeypatch.undo()
        clear_pricing_caches()
    assert caught <= flagged, f"dropping {field_name} from {module.__name__}'s rebuilt plans went unseen"
    assert flagged <= {t.name for t in TERMS if t.module is module}, "a fault blamed on another module's term"


class _Projected(dict[Any, Any]):
    """A memo table that leaves every key part of one type out of its keys: as when a wrapper's
    key omits a field (the rebuilt plan still carries it, so the first plan's value is reused)."""

    def __init__(self, left_out: type) -> None:
        super().__init__()
        self.left_out = left_out

    def _key(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(part for part in key if not isinstance(part, self.left_out))

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(self._key(key), default)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(self._key(key), value)


@pytest.mark.parametrize(
    ("module", "table", "left_out", "term"),
    [
        (memory, "_layout_tables", ZeroKnobs, "_layout_terms"),
        (throughput, "_communication_tables", ZeroKnobs, "_communication_terms"),
        (throughput, "_model_parallel_tables", ModelParallel, "_model_parallel_s"),
        (throughput, "_offload_tables", ModelParallel, "offload_s"),
    ],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", str(v)).rsplit(".", 1)[-1],
)
def test_the_guard_sees_a_field_the_key_leaves_out(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, table: str, left_out: type, term: str
) -> None:
    # by the identities of the spec's objects, which each entry keeps alive (as memo_tables does)
    tables: dict[tuple[int, ...], tuple[tuple[Any, ...], _Projected]] = {}

    def projected(*context: Any) -> _Projected:
        return tables.setdefault(tuple(map(id, context)), (context, _Projected(left_out)))[1]

    clear_pricing_caches()
    monkeypatch.setattr(module, table, projected)
    try:
        calls = _record_one(_ZEROPP)
        found = mismatches(calls, next(t for t in TERMS if t.name == term))
    finally:
        monkeypatch.undo()
        clear_pricing_caches()
    assert found, f"{term} without {left_out.__name__} in its key went unseen"


def test_the_lru_keyed_wrappers_key_on_the_plan_fields_they_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lru_cache wrappers take their key as arguments: a field the call site stops passing
    (here the knobs, pinned to their defaults at the call) is a field the key leaves out."""
    real = model_states._model_states
    parameters = list(inspect.signature(real).parameters)

    def without_knobs(*args: Any) -> Any:
        args_list = list(args)
        args_list[parameters.index("knobs")] = ZeroKnobs()
        return real(*args_list)

    clear_pricing_caches()
    monkeypatch.setattr(model_states, "_model_states", without_knobs)
    try:
        calls = _record_one(_ZEROPP)
        found = mismatches(calls, next(t for t in TERMS if t.name == "model_states"))
    finally:
        monkeypatch.undo()
        clear_pricing_caches()
    assert found


# ---------------------------------------------------------------------------------------------
# The solver's shared floors (dsgen/search/solver.py, scope="choice"): one step_time_floor serves every
# structure that differs only in what no floor reads, by the solver's own key, which leaves out
# the knobs, and the stage below ZeRO-3 when nothing is offloaded and no long-context trick is on


def test_the_step_time_floor_reads_what_the_solver_shares_it_across(calls: list[Call]) -> None:
    # every priced plan passes through offload_s (which returns 0 at once when nothing is offloaded)
    priced = {c.arguments["plan"]: c.arguments for c in calls if c.term.name == "offload_s"}
    checked = 0
    for plan, a in list(priced.items())[::4]:
        shape, hardware, training = a["shape"], a["hardware"], a["training"]
        floor = throughput.step_time_floor(shape, plan, hardware, training)
        shared = [replace(plan, knobs=ZeroKnobs())]
        if (
            plan.zero_stage < 3
            and plan.offload_optimizer == plan.offload_param == "none"
            and not plan.long_context.active
        ):
            shared += [replace(plan, zero_stage=stage) for stage in range(3) if stage != plan.zero_stage]
        for other in shared:
            checked += 1
            assert throughput.step_time_floor(shape, other, hardware, training) == floor, (plan, other)
    assert checked > 1000


def test_the_floor_never_rises_with_the_micro_batch_without_long_context_terms(calls: list[Call]) -> None:
    # the solver orders families by their lowest floor and reads only the largest split's for such
    # structures (dsgen.search.solver.floor_falls_with_micro): every split of the same batch, compared
    priced = {c.arguments["plan"]: c.arguments for c in calls if c.term.name == "offload_s"}
    checked = model_parallel = 0
    for plan, a in list(priced.items())[::4]:
        if plan.long_context.active:
            continue
        per_rank = plan.micro_batch_size * plan.gradient_accumulation_steps
        micros = [m for m in range(1, per_rank + 1) if per_rank % m == 0]
        floors = [
            throughput.step_time_floor(
                a["shape"],
                replace(plan, micro_batch_size=m, gradient_accumulation_steps=per_rank // m),
                a["hardware"],
                a["training"],
            )
            for m in micros
        ]
        assert floors == sorted(floors, reverse=True), (plan, floors)  # never rising
        checked += len(micros) > 1
        model_parallel += len(micros) > 1 and plan.model_parallel.active
    assert checked > 200 and model_parallel > 50
