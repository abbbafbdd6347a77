"""Search precision x ZeRO stage x offload x checkpointing x micro-batch for the fastest plan that fits.

The search is exhaustive over the (small) discrete space: every candidate is priced by the pure
memory and step-time models, then ranked by :func:`dsgen.search.ranking.rank_within_error` (no plan ahead
of one faster and smaller; within the step-time model's measured error, room to spare, fewer moving
parts, simplicity). It is deterministic: candidates are generated in a fixed order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal, TypeVar

from dsgen.catalog.model_shape import ModelShape
from dsgen.errors import DsgenError, InfeasibleError
from dsgen.estimate.kernel_limits import KERNEL_LIMIT_HINT, kernel_limit
from dsgen.estimate.memory import estimate_memory
from dsgen.estimate.optimizers import is_client_optimizer
from dsgen.estimate.throughput import STEP_TIME_TIE_BAND, step_time_floor
from dsgen.facts.frameworks import marks_moe_leaf, runs_own_script, target_violation
from dsgen.facts.model_parallel import Layout, autoep_preset_for, violations
from dsgen.plan import LongContext, ModelParallel, Plan, ZeroKnobs
from dsgen.search.evaluation import Evaluation, evaluate, usable_bytes
from dsgen.search.global_batch import batch_splits, global_batch_target
from dsgen.search.knob_variants import ZEROPP_CHOICES, knob_variants, with_zeropp
from dsgen.search.long_context import long_context_choices, sequence_parallel_degrees, tricks_within
from dsgen.search.model_parallel_choices import expert_parallel_degrees, model_facts, tensor_parallel_degrees
from dsgen.search.ranking import rank_key, rank_within_error, ties_fastest
from dsgen.search.verdict import FitVerdict
from dsgen.spec.types import Spec
from dsgen.vocabulary import CHECKPOINTING_MODES, OFFLOAD_DEVICES, Accounting, Checkpointing, OffloadDevice, Precision

T = TypeVar("T")

#: What a solve is for: ``full`` prices every candidate (solve, explain, the doctor: the ranking,
#: the alternatives); ``choice`` only what can be chosen (new, sweep: the plan written), skipping
#: candidates that cannot enter the rule's band (:func:`_search`, pruning 4). Both choose the same plan.
Scope = Literal["full", "choice"]


@dataclass(frozen=True)
class Alternative:
    """The best plan found for one ZeRO stage that was not chosen."""

    zero_stage: int
    evaluation: Evaluation | None  # None when the stage was excluded by a pin
    reason: str


@dataclass(frozen=True)
class SolveResult:
    """Everything one solve found: the chosen plan, every feasible plan ranked, and why others lost."""

    spec: Spec
    best: Evaluation | None  # fastest feasible plan, or the pinned plan when everything is pinned
    ranked: tuple[Evaluation, ...]  # every feasible plan, fastest first
    alternatives: tuple[Alternative, ...]
    closest: Evaluation | None  # the candidate that misses by least, when nothing fits
    candidates_evaluated: int
    fully_pinned: bool
    offload_alternatives: tuple[tuple[str, Evaluation, str], ...] = ()  # (offload choice, its best plan, reason)
    batch_note: str | None = None  # set when the global batch was rounded or needs Ulysses SP
    accounting: Accounting = "dsgen"
    # (layout label, its best plan, reason) for each AutoTP / AutoEP layout not chosen ("none": neither)
    model_parallel_alternatives: tuple[tuple[str, Evaluation, str], ...] = ()

    @property
    def feasible(self) -> bool:
        return self.best is not None and self.best.feasible

    @property
    def fit(self) -> FitVerdict | None:
        """The calibrated verdict of the plan shown (the chosen one, else the closest miss)."""
        shown = self.best if self.best is not None else self.closest
        return shown.fit if shown is not None else None


def resolve_precision(spec: Spec) -> Precision:
    """bf16 where the GPU supports it, else fp16, else fp32 — unless the spec pins one."""
    chosen = spec.training.precision
    if chosen != "auto":
        return chosen
    gpu = spec.hardware.gpu
    if gpu.bf16:
        return "bf16"
    return "fp16" if gpu.fp16 else "fp32"


def _choices(pinned: T | None, options: list[T]) -> list[T]:
    return options if pinned is None else [pinned]


OFFLOAD_RATIOS = (1.0, 0.75, 0.5, 0.25)


@dataclass(frozen=True)  # one per searched structure
class _Structure:
    """The choices of a plan other than batch split and knob sizes."""

    stage: int
    offload_optimizer: OffloadDevice
    offload_param: OffloadDevice
    offload_ratio: float
    zeropp: str
    checkpointing: Checkpointing
    long_context: LongContext = LongContext()
    model_parallel: ModelParallel = ModelParallel()

    @property
    def batch_ranks_divisor(self) -> int:
        """GPUs per distinct micro-batch: the Ulysses degree times the AutoTP degree."""
        return self.long_context.sequence_parallel_size * self.model_parallel.tensor_parallel_size


def _structures(spec: Spec, search: bool = False) -> Iterator[_Structure]:
    """:func:`_base_structures` times the model-parallel layouts each allows (none first) and the
    long-context choices (Ulysses degree ascending, then tiling and checkpoint offload, fewest
    tricks first); without ``search`` the unpinned long-context dimensions stay off (see
    :func:`solve`)."""
    degrees = sequence_parallel_degrees(spec, search)
    layouts = model_parallel_layouts(spec)
    # what each depends on, asked once: bases differ in far more than the refusal rules read
    refused: dict[tuple[object, ...], bool] = {}
    choices: dict[tuple[int, Checkpointing], list[LongContext]] = {}
    for base in _base_structures(spec):
        for layout in layouts:
            for sp in degrees:
                key = (base.stage, base.offload_optimizer, base.offload_param, base.zeropp, layout, sp)
                if key not in refused:
                    refused[key] = _refused(spec, base, layout, sp)
                if refused[key]:  # e.g. AutoTP with Ulysses (autotp-ulysses)
                    continue
                lc_key = (sp, base.checkpointing)
                if lc_key not in choices:
                    choices[lc_key] = long_context_choices(spec, sp, base.checkpointing, search)
                for long_context in choices[lc_key]:
                    yield replace(base, long_context=long_context, model_parallel=layout)


def model_parallel_layouts(spec: Spec) -> list[ModelParallel]:
    """The AutoTP and AutoEP layouts to search: none, then each TP degree, then each EP degree
    (dsgen.search.model_parallel_choices; dsgen does not combine the two). A fully pinned spec keeps
    its pins, and ``auto`` is off there, as for Ulysses."""
    c = spec.constraints
    if c.fully_pinned:
        return [ModelParallel(c.tensor_parallel_size or 1, c.expert_parallel_size or 1)]
    layouts = [ModelParallel(tp, 1) for tp in tensor_parallel_degrees(spec)]
    layouts += [ModelParallel(1, ep) for ep in expert_parallel_degrees(spec)]
    # a pin is a pin: a pinned degree excludes every layout with another one (the degrees of the
    # unpinned dimension list 1 beside the rest, which would otherwise search the unpinned layout)
    return [
        layout
        for layout in dict.fromkeys(layouts)
        if c.tensor_parallel_size in (None, layout.tensor_parallel_size)
        and c.expert_parallel_size in (None, layout.expert_parallel_size)
    ]


#: ZeRO++ as the spec pins it -> the knobs' label (dsgen.plan.ZeroKnobs.zeropp)
ZEROPP_LABELS = {"none": "none", "hpz": "hpz", "full": "hpz+qwz+qgz"}


def unmet_pins(spec: Spec, plan: Plan) -> tuple[str, ...]:
    """The ``constraints`` keys whose pinned value ``plan`` does not carry (none, for any plan the
    search proposes: :func:`solve` checks, so a pin is never dropped without a word)."""
    c = spec.constraints
    lc = plan.long_context
    carried = {
        "zero_stage": (c.zero_stage, plan.zero_stage),
        "offload_optimizer": (c.offload_optimizer, plan.offload_optimizer),
        "offload_param": (c.offload_param, plan.offload_param),
        "activation_checkpointing": (c.activation_checkpointing, plan.checkpointing),
        "micro_batch_size": (c.micro_batch_size, plan.micro_batch_size),
        "gradient_accumulation_steps": (c.gradient_accumulation_steps, plan.gradient_accumulation_steps),
        "zeropp": (None if c.zeropp is None else ZEROPP_LABELS[c.zeropp], plan.knobs.zeropp),
        "sequence_parallel_size": (c.sequence_parallel_size, lc.sequence_parallel_size),
        "tiled_mlp": (c.tiled_mlp, lc.tiled_mlp),
        "tiled_loss": (c.tiled_loss, lc.tiled_loss),
        "checkpoint_offload": (c.checkpoint_offload, lc.checkpoint_offload),
        # DeepSpeed reads the reduction dtype only under Ulysses (fp32 without SP)
        "seq_parallel_communication_data_type": (
            c.seq_parallel_communication_data_type if lc.sequence_parallel_size > 1 else None,
            lc.communication_dtype,
        ),
        "tensor_parallel_size": (c.tensor_parallel_size, plan.tensor_parallel_size),
        "expert_parallel_size": (c.expert_parallel_size, plan.expert_parallel_size),
    }
    return tuple(key for key, (pinned, value) in carried.items() if pinned is not None and pinned != value)


def pins_a_dimension(spec: Spec) -> bool:
    """Whether a constraint pins one of :data:`PINNABLE_KEYS`. Without one, no plan the search
    proposes misses a pin: the one value always set, ``seq_parallel_communication_data_type``, is
    the one every Ulysses plan carries (:func:`dsgen.search.long_context.long_context_choices`)."""
    c = spec.constraints
    return any(getattr(c, key) is not None for key in PINNABLE_KEYS)


def _refused(spec: Spec, base: _Structure, layout: ModelParallel, sp: int) -> bool:
    """Whether the spec's DeepSpeed release refuses this structure's model-parallel layout
    (:func:`dsgen.facts.model_parallel.violations`, the rules ``validate`` and ``doctor`` apply), or the
    spec's target cannot run it (``new`` would refuse the plan)."""
    if not layout.active:
        return False
    ep = layout.expert_parallel_size
    if target_violation(spec.output.target, layout.tensor_parallel_size, ep, base.stage) is not None:
        return True  # the spec's target cannot run it (dsgen.targets.model_parallel)
    model = spec.model
    found = violations(
        Layout(
            world=spec.hardware.world_size,
            tp=layout.tensor_parallel_size,
            ep=ep,
            autoep=ep > 1,
            sp=sp,
            zero_stage=base.stage,
            offload_optimizer=base.offload_optimizer != "none",
            offload_param=base.offload_param != "none",
            quantized_gradients="qgz" in base.zeropp,
            hpz=2 if "hpz" in base.zeropp else 1,
            release=spec.training.deepspeed_version,
            ep_preset=autoep_preset_for(model.family, spec.training.deepspeed_version) if ep > 1 else None,
            model=model_facts(model),
        )
    )
    return any(v.raises for v in found)


def _base_structures(spec: Spec) -> Iterator[_Structure]:
    """Every allowed combination of stage, offload (with partial-offload share), ZeRO++ and
    checkpointing, in a fixed order (simplest first)."""
    c = spec.constraints
    hw = spec.hardware
    offload_targets: list[OffloadDevice] = [d for d in OFFLOAD_DEVICES if d != "nvme" or hw.nvme]
    # selective recomputation drops the eager attention's s x s tensors; flash and sdpa never keep
    # them, so there it would only cost time (it stays available as a pin)
    eager = spec.training.attention == "eager"
    # a target that runs its framework's own script cannot recompute selectively, and some cannot
    # mark a MoE block as a ZeRO-3 leaf (dsgen.facts.frameworks); a pin is still priced, then refused
    own_script = runs_own_script(spec.output.target)
    checkpointing_modes = [m for m in CHECKPOINTING_MODES if m != "selective" or (eager and not own_script)]
    moe_leaf = spec.model.num_experts == 0 or marks_moe_leaf(spec.output.target)
    stages = [0, 1, 2, 3] if moe_leaf else [0, 1, 2]
    for stage in _choices(c.zero_stage, stages):
        # ZeRO-1/2 treat an NVMe optimizer device as CPU offload; only ZeRO-3 swaps to NVMe.
        optimizer_targets: list[OffloadDevice] = offload_targets if stage == 3 else ["none", "cpu"]
        if stage == 0 or is_client_optimizer(spec.training.optimizer):
            # a client optimizer (Adafactor, 8-bit AdamW) is never offloaded: see the spec loader
            optimizer_offloads: list[OffloadDevice] = ["none"]
        elif c.offload_optimizer is None:
            optimizer_offloads = optimizer_targets
        else:
            optimizer_offloads = [c.offload_optimizer] if c.offload_optimizer in optimizer_targets else []
        param_offloads: list[OffloadDevice] = _choices(c.offload_param, offload_targets) if stage == 3 else ["none"]
        if spec.training.finetuning.method == "qlora" and c.offload_param is None:
            # PEFT's DeepSpeed guide: ZeRO-3 with QLoRA and CPU offload uses more GPU memory than
            # without; dsgen does not propose it (a pinned offload is priced as asked)
            param_offloads = ["none"]
        for offload_optimizer in optimizer_offloads:
            for offload_param in param_offloads:
                if c.offload_optimizer not in (None, offload_optimizer) or c.offload_param not in (None, offload_param):
                    continue  # a pinned offload this stage cannot do (parameters: ZeRO-3 only)
                if offload_param != "none" and offload_optimizer == "none" and c.offload_optimizer is None:
                    continue  # DeepSpeed offloads parameters only alongside optimizer states
                # partial offload (offload_optimizer.ratio < 1) exists only for ZeRO-3 CPU offload
                # and needs DeepSpeedCPUAdam, i.e. an Adam-family optimizer
                partial = (
                    stage == 3
                    and offload_optimizer == "cpu"
                    and offload_param == "none"
                    and spec.training.optimizer.type in ("adam", "adamw")
                )
                # ZeRO++ targets multi-node ZeRO-3 with parameters on the GPU
                zeroppable = stage == 3 and hw.nodes > 1 and offload_param == "none"
                zeropps = ZEROPP_CHOICES[c.zeropp or "auto"] if zeroppable else ["none"]
                if c.zeropp not in (None, "none") and not zeroppable:
                    continue  # a pinned ZeRO++ needs multi-node ZeRO-3 with parameters on the GPU
                for ratio in OFFLOAD_RATIOS if partial else (1.0,):
                    for zeropp in zeropps:
                        for checkpointing in _choices(c.activation_checkpointing, checkpointing_modes):
                            yield _Structure(stage, offload_optimizer, offload_param, ratio, zeropp, checkpointing)


def _no_plan_for_pins(spec: Spec) -> DsgenError:
    """The error for pins that leave nothing to search (issue 14: was ``min()`` of nothing)."""
    c = spec.constraints
    layout = ModelParallel(c.tensor_parallel_size or 1, c.expert_parallel_size or 1)
    if layout.active:
        # a pinned AutoTP / AutoEP degree the target cannot run at any pinned stage: the target's reason
        stages = [c.zero_stage] if c.zero_stage is not None else [0, 1, 2, 3]
        tp, ep = layout.tensor_parallel_size, layout.expert_parallel_size
        refusals = [target_violation(spec.output.target, tp, ep, stage) for stage in stages]
        first = refusals[0]
        if first is not None and all(refusals):
            why, hint = first
            return DsgenError(why, path="output.target", location=spec.location("output.target"), hint=hint)
    pins: dict[str, object] = {
        "zero_stage": c.zero_stage,
        "offload_optimizer": c.offload_optimizer,
        "offload_param": c.offload_param,
        "activation_checkpointing": c.activation_checkpointing,
    }
    if c.offload_optimizer == "nvme" and ((c.zero_stage is not None and c.zero_stage < 3) or not spec.hardware.nvme):
        why = "optimizer offload to NVMe needs ZeRO-3 and hardware.nvme (ZeRO-1/2 only offload to CPU)"
    elif c.offload_param not in (None, "none") and is_client_optimizer(spec.training.optimizer):
        why = (
            f"parameter offload needs optimizer offload, which DeepSpeed does not do for the client "
            f"optimizer {spec.training.optimizer.type}"
        )
    elif c.offload_param not in (None, "none") and c.zero_stage is not None and c.zero_stage < 3:
        why = "parameter offload needs ZeRO-3"
    elif c.zeropp not in (None, "none"):
        pins = {"zeropp": c.zeropp, **pins}  # named first: it is the pin that cannot apply
        why = "ZeRO++ needs ZeRO-3 on more than one node with parameters on the GPU"
    else:
        why = "DeepSpeed supports no plan with all of them together"
    shown = ", ".join(f"{k}: {v}" for k, v in pins.items() if v is not None)
    key = next((k for k, v in pins.items() if v is not None), "zero_stage")
    return DsgenError(
        f"the pinned constraints ({shown}) leave no plan to search: {why}",
        path=f"constraints.{key}",
        location=spec.location(f"constraints.{key}"),
        hint="unpin one of them and let the solver choose",
    )


def _search(
    spec: Spec, global_batch: int, accounting: Accounting, long_search: bool = False, scope: Scope = "full"
) -> tuple[list[Evaluation], int]:
    """Evaluate the search space with safe prunings; return the evaluations kept and the count.

    1. Knob variants are ordered fastest-first and never larger in GPU memory than the previous
       one, so the first that fits is the best setting for that plan; leaner ones are not tried.
    2. GPU memory grows with the micro-batch while gradients are accumulated, so once a micro-batch
       does not fit on the GPU even with the leanest knobs, no larger one that still accumulates
       can. The single-step split (accumulation 1) is still tried: ZeRO-2 holds a second gradient
       buffer only when it accumulates, so that split can need less memory than smaller ones.
    4. (``scope="choice"``: only the chosen plan is wanted) The rule picks among the feasible plans
       within ``STEP_TIME_TIE_BAND`` of the fastest (dsgen.search.ranking), and no plan outside that band
       can dominate one inside it. So once a feasible plan is found, a split whose step-time floor
       (:func:`dsgen.estimate.throughput.step_time_floor`: every term but the ZeRO communication,
       which the knobs move) is beyond the band of the fastest so far cannot be chosen, whatever
       its knobs and memory: it is not priced. What this skips is priced the same wherever it is
       kept; what it prices beyond (a split pruning 2 would have skipped after an overflow it no
       longer saw) cannot fit. The floor reads no knob, so NVMe's sub-groups, shrunk after the
       knobs are chosen, leave it where it was. Not in the long-context search, whose floors
       cost nearly what pricing does (measured: no faster).

    Most splits priced do not fit the GPU, and one that does not fit with its leanest knobs
    costs one pricing if those are priced first (``price_split``'s ``lean_first``), one per
    variant if not. Which order a split gets is a guess from the splits before it; the plan each
    split yields is the same in either order, so the guess moves the time, never the choice.
    """
    dp = spec.hardware.world_size
    precision = resolve_precision(spec)
    splits_by_divisor = _splits_by_degree(spec, global_batch, long_search)
    # (structure without its tricks, micro, accum) -> the trick sets that fit there: a plan with
    # more tricks than one that fits uses less GPU memory but never less time, so it is skipped
    fitted: dict[tuple[Family, int, int], list[LongContext]] = {}
    variants_by_stage = {stage: knob_variants(spec.model, stage) for stage in range(4)}
    variants_of: dict[tuple[int, str, bool], list[ZeroKnobs]] = {}  # one structure's, shared by its like
    if next(_structures(spec, long_search), None) is None:
        raise _no_plan_for_pins(spec)
    evaluated = 0
    # whether the last structure's first split fit the GPU: when it did not, the next structure's
    # first split is priced leanest first (see price_split); only the order of pricing reads it
    first_split_fitted = True
    beyond_s = float("inf")  # (4.) the band's edge above the fastest feasible plan priced so far
    pinned = pins_a_dimension(spec)  # else no plan can miss a pin (asked once, not per plan)

    def price(st: _Structure, knobs: ZeroKnobs, micro: int, accum: int) -> Evaluation:
        nonlocal evaluated, beyond_s
        evaluated += 1
        plan = _plan(st, precision, knobs, micro, accum, dp)
        priced = evaluate(spec, plan, accounting)
        if scope == "choice" and priced.feasible and not (pinned and unmet_pins(spec, plan)):
            beyond_s = min(beyond_s, priced.step.total_s * (1 + STEP_TIME_TIE_BAND))
        return priced

    def price_split(st: _Structure, variants: list[ZeroKnobs], micro: int, accum: int, lean_first: bool) -> Evaluation:
        """The split's plan: its first knob variant that fits the GPU (pruning 1), else its leanest.
        ``lean_first``: the split is unlikely to fit, so its leanest knobs are priced first; when they
        do not fit, no variant can (pruning 1's order) and the split costs one pricing, not one per
        variant. The order changes only what is priced, never the plan returned."""
        leanest = price(st, variants[-1], micro, accum) if lean_first else None
        if leanest is not None and not leanest.fits_gpu:
            return leanest
        for knobs in variants[:-1]:
            chosen = price(st, knobs, micro, accum)
            if chosen.fits_gpu:
                break
        else:
            chosen = leanest if leanest is not None else price(st, variants[-1], micro, accum)
        if chosen.fits_gpu and not chosen.fits_cpu and st.offload_optimizer == "nvme":
            chosen = _shrink_sub_groups(chosen, partial(price, st, micro=micro, accum=accum))
        return chosen

    usable_gpu = usable_bytes(spec)[0]

    def likely_overflows(last_fit: Evaluation, micro: int) -> bool:
        """Whether ``micro`` looks past the GPU, judged from the structure's last split that fit:
        its activations grown in proportion to the micro-batch. Only the order of pricing reads it."""
        gpu = last_fit.memory.gpu
        grown = (micro / last_fit.plan.micro_batch_size - 1) * (gpu.activations + gpu.transient)
        return gpu.total + grown > usable_gpu

    structures = list(_structures(spec, long_search))
    splits_of = [splits_by_divisor.get(st.batch_ranks_divisor, []) for st in structures]
    # (4.) each split's floor, and the families (structures that differ only in their trick sets)
    # lowest floor first. Not in the long-context search: its floors cost nearly what pricing
    # does, and most of what it prices cannot fit anyway (measured: slower than pricing it all).
    pruning = scope == "choice" and not long_search
    families = _families(structures)
    floors: dict[tuple[object, ...], float] = {}  # shared by structures that differ in what no floor reads

    def floor(index: int, position: int) -> float:
        st = structures[index]
        micro, accum = splits_of[index][position]
        # the fields the floor reads: below ZeRO-3 the stage moves it only through offload and the
        # long-context terms (ZeRO-3's hooks slow compute), the knobs never
        offloads = st.offload_optimizer != "none" or st.offload_param != "none"
        stage = st.stage if offloads or st.long_context.active else st.stage == 3
        key: tuple[object, ...] = (stage, st.offload_optimizer, st.offload_param, st.offload_ratio)
        key += (st.checkpointing, st.long_context, st.model_parallel, micro, accum)
        known = floors.get(key)
        if known is None:
            plan = _plan(st, precision, FLOOR_KNOBS, micro, accum, dp)
            known = floors[key] = step_time_floor(spec.model, plan, spec.hardware, spec.training)
        return known

    def lowest(family: tuple[Family, list[int]]) -> float:
        _, members = family
        return min((floor(i, p) for i in members for p in lowest_candidates(i)), default=0.0)

    def lowest_candidates(index: int) -> range:
        """The splits that can hold a structure's lowest floor: the largest micro-batch alone (the
        last split) where the floor never rises with the micro-batch (:func:`floor_falls_with_micro`)."""
        count = len(splits_of[index])
        return range(count - 1, count) if count and floor_falls_with_micro(structures[index]) else range(count)

    lowest_of: dict[Family, float] = {}  # each family's lowest floor, once: _structures makes one family once
    if pruning:
        lowest_of = {family: lowest((family, members)) for family, members in families}
        families.sort(key=lambda family: lowest_of[family[0]])  # stable: ties keep the search's own order

    # 3. (long-context search only) Tricks only lower GPU memory, so when a structure's leanest
    #    trick set does not fit the GPU at its leanest split and knobs, no other set of that
    #    structure and Ulysses degree can: one probe per (structure, degree) decides.
    probes: dict[Family, bool] = {}
    found: list[tuple[tuple[int, int, int], Evaluation]] = []  # (where the full search finds it, plan)
    for family in families:
        if pruning and lowest_of[family[0]] > beyond_s:
            break  # (4.) and so is every later family
        plain, members = family
        for index in members:
            st, splits = structures[index], splits_of[index]
            if not splits:
                continue
            variants_key = (st.stage, st.zeropp, st.offload_ratio < 1)  # what _knob_variants_for reads of st
            variants = variants_of.get(variants_key)
            if variants is None:
                variants = variants_of[variants_key] = _knob_variants_for(spec, st, variants_by_stage[st.stage])
            if long_search:
                if plain not in probes:
                    tried = _probe(spec, st, splits, partial(price, _leanest(spec, st)))
                    found.extend(((index, -1, n), e) for n, e in enumerate(tried))  # for the closest miss
                    probes[plain] = any(e.fits_gpu for e in tried)
                if not probes[plain]:
                    continue
            overflowed = False
            last_fit: Evaluation | None = None  # this structure's largest split so far that fits the GPU
            for position, (micro, accum) in enumerate(splits):
                if overflowed and accum > 1:
                    continue
                if any(tricks_within(done, st.long_context) for done in fitted.get((plain, micro, accum), ())):
                    continue
                if pruning and floor(index, position) > beyond_s:  # (4.)
                    continue
                # after an overflow (see 2.) the single-step split seldom fits
                guess = not first_split_fitted if last_fit is None else likely_overflows(last_fit, micro)
                chosen = price_split(st, variants, micro, accum, lean_first=overflowed or guess)
                found.append(((index, position, 0), chosen))
                last_fit = chosen if chosen.fits_gpu else last_fit
                if position == 0:
                    first_split_fitted = chosen.fits_gpu
                if chosen.feasible:
                    fitted.setdefault((plain, micro, accum), []).append(st.long_context)
                overflowed = overflowed or not chosen.fits_gpu
    # in the order the full search finds them, so that exact ties break the same way
    return [e for _, e in sorted(found, key=lambda item: item[0])], evaluated


def floor_falls_with_micro(st: _Structure) -> bool:
    """Whether the step-time floor of ``st``'s splits never rises with the micro-batch, so that its
    largest split's floor is its lowest, to the last bit. Without the long-context terms the floor
    is compute + model-parallel traffic + offload + generation (:func:`step_time_floor`): offload
    and generation read no split; compute is the step's fixed FLOPs over a rate that only grows
    with the micro-batch's tokens (``_micro_batch_efficiency``); the AutoTP / AutoEP seconds are
    accumulation x (bytes in proportion to the micro-batch + a launch latency per collective)
    (``dsgen.estimate.model_parallel_time._step_seconds``), so at a fixed micro x accumulation
    the bytes stay and the latencies fall with every halving of the accumulation, by far more than
    a rounding. Each float operation on the way is correctly rounded, hence monotone. The
    long-context terms are not shown monotone, so their splits are all asked."""
    return not st.long_context.active


#: The knobs a floor is priced with: it reads none (:func:`dsgen.estimate.throughput.step_time_floor`).
FLOOR_KNOBS = ZeroKnobs()

#: A family of structures: the same structure but for its long-context trick sets (its stage,
#: offloads, ZeRO++, checkpointing, AutoTP/AutoEP layout and Ulysses degree).
Family = tuple[object, ...]


def _family(st: _Structure) -> Family:
    sp = st.long_context.sequence_parallel_size
    return (
        st.stage,
        st.offload_optimizer,
        st.offload_param,
        st.offload_ratio,
        st.zeropp,
        st.checkpointing,
        st.model_parallel,
        sp,
    )


def _families(structures: list[_Structure]) -> list[tuple[Family, list[int]]]:
    """The indexes of ``structures`` grouped by family, in order: :func:`_structures` generates
    each family's members together."""
    families: list[tuple[Family, list[int]]] = []
    for index, st in enumerate(structures):
        family = _family(st)
        if families and families[-1][0] == family:
            families[-1][1].append(index)
        else:
            families.append((family, [index]))
    return families


def _plan(st: _Structure, precision: Precision, knobs: ZeroKnobs, micro: int, accum: int, dp: int) -> Plan:
    return Plan(
        precision=precision,
        zero_stage=st.stage,
        offload_optimizer=st.offload_optimizer,
        offload_param=st.offload_param,
        checkpointing=st.checkpointing,
        micro_batch_size=micro,
        gradient_accumulation_steps=accum,
        data_parallel_size=dp,
        knobs=knobs,
        offload_ratio=st.offload_ratio,
        long_context=st.long_context,
        model_parallel=st.model_parallel,
    )


def _knob_variants_for(spec: Spec, st: _Structure, stage_variants: list[ZeroKnobs]) -> list[ZeroKnobs]:
    """The knob variants of one structure: its stage's, with ZeRO++ and partial-offload sub-groups."""
    variants = [with_zeropp(k, st.zeropp, spec.hardware.gpus_per_node) for k in stage_variants]
    if st.offload_ratio < 1:
        # DeepSpeed applies offload_optimizer.ratio per optimizer sub-group: with one sub-group
        # everything is offloaded, so split the rank's partition into at least eight.
        groups = max(1_000_000, -(-spec.model.parameter_count() // spec.hardware.world_size // 8))
        variants = [replace(k, sub_group_size=min(k.sub_group_size, groups)) for k in variants]
    return variants


def _leanest(spec: Spec, st: _Structure) -> _Structure:
    """``st`` with the trick set that needs the least GPU memory (the last: most tricks)."""
    choices = long_context_choices(spec, st.long_context.sequence_parallel_size, st.checkpointing, search=True)
    return replace(st, long_context=choices[-1])


def _probe(
    spec: Spec, st: _Structure, splits: list[tuple[int, int]], price: Callable[[ZeroKnobs, int, int], Evaluation]
) -> list[Evaluation]:
    """``st`` priced with its leanest knobs at the smallest micro-batch and at the single-step
    split (its two leanest splits; see :func:`_search`)."""
    leanest = _knob_variants_for(spec, st, knob_variants(spec.model, st.stage))[-1]
    return [price(leanest, micro, accum) for micro, accum in dict.fromkeys((splits[0], max(splits)))]


def fits_any(spec: Spec) -> bool:
    """Whether some plan fits the spec: :func:`solve`'s feasibility alone, fast enough to bisect on.

    Every structure the search would price is tried once at its leanest: the smallest Ulysses
    degree and the largest one (larger degrees hold fewer tokens per GPU; only the fp32
    gradient-reduction copy appears with SP, so 1 is tried too), every trick it allows (with and
    without checkpoint offload, which trades GPU memory for host RAM), the smallest micro-batch
    and the leanest knobs. Only memory and the kernel limits are priced (the largest degree has
    the smallest per-rank query tensor), leanest structures (ZeRO-3, offload) first.
    """
    global_batch = global_batch_target(spec).sequences
    search = spec.long_context_searchable
    splits_by_divisor = _splits_by_degree(spec, global_batch, search)
    layouts = model_parallel_layouts(spec)
    # the splits are keyed by the GPUs that share a micro-batch, the Ulysses degree times the TP one
    degrees = [
        d
        for d in sequence_parallel_degrees(spec, search)
        if any(splits_by_divisor.get(d * layout.tensor_parallel_size) for layout in layouts)
    ]
    precision = resolve_precision(spec)
    usable_gpu, usable_cpu = usable_bytes(spec)
    leanest_knobs = {stage: knob_variants(spec.model, stage)[-1] for stage in range(4)}
    for base in reversed(list(_base_structures(spec))):
        knobs = _knob_variants_for(spec, base, [leanest_knobs[base.stage]])[0]
        for layout in reversed(layouts):  # the largest degrees hold the least
            for sp in dict.fromkeys((degrees[-1], degrees[0])) if degrees else ():
                if _refused(spec, base, layout, sp):
                    continue
                splits = splits_by_divisor.get(sp * layout.tensor_parallel_size)
                if not splits:
                    continue
                choices = long_context_choices(spec, sp, base.checkpointing, search)
                lean = {choices[-1], replace(choices[-1], checkpoint_offload=False)} & set(choices)
                micro, accum = splits[0]
                for long_context in lean:
                    st = replace(base, long_context=long_context, model_parallel=layout)
                    plan = _plan(st, precision, knobs, micro, accum, spec.hardware.world_size)
                    memory = estimate_memory(
                        spec.model,
                        plan,
                        spec.hardware,
                        spec.training,
                        logits_released=spec.output.logits_released,
                        trainer_saves_model=spec.output.trainer_saves_model,
                    )
                    if (
                        memory.gpu.total <= usable_gpu
                        and memory.cpu.total <= usable_cpu
                        and memory.nvme.total <= memory.nvme.capacity
                        and kernel_limit(spec.model, plan, spec.training.sequence_length, spec.training.attention)
                        is None
                    ):
                        return True
    return False


def _splits_by_degree(spec: Spec, global_batch: int, long_search: bool) -> dict[int, list[tuple[int, int]]]:
    """(micro-batch, accumulation) splits for each number of GPUs that share one micro-batch (the
    Ulysses degree, or the AutoTP degree): the batch is met over world / that many data-parallel
    ranks. A pin that fits no split is an error without either (as without SP) and simply leaves
    the larger degrees without plans."""
    world = spec.hardware.world_size
    tps = {layout.tensor_parallel_size for layout in model_parallel_layouts(spec)}
    divisors = sorted(
        {sp * tp for sp in sequence_parallel_degrees(spec, long_search) for tp in tps if sp == 1 or tp == 1}
    )
    splits: dict[int, list[tuple[int, int]]] = {}
    for divisor in divisors:
        if global_batch % (world // divisor):  # met at a larger degree (global_batch_target)
            splits[divisor] = []
            continue
        try:
            splits[divisor] = batch_splits(spec, world // divisor, global_batch)
        except DsgenError:
            if divisor == divisors[0]:
                raise
            splits[divisor] = []
    return splits


#: sub_group_size values tried, largest first, when host RAM is what an NVMe-offload plan lacks.
#: Its pinned swap buffers and fp32 gradient buffer scale with the largest sub-group
#: (ModelStates.nvme_optimizer_host); below 1e7 elements each NVMe transfer is
#: too small to keep the drive busy, so the search stops there.
NVME_SUB_GROUP_SIZES = (100_000_000, 50_000_000, 20_000_000, 10_000_000)


def _shrink_sub_groups(chosen: Evaluation, price: Callable[[ZeroKnobs], Evaluation]) -> Evaluation:
    """The first smaller ``sub_group_size`` whose host RAM fits, else the smallest tried."""
    for size in NVME_SUB_GROUP_SIZES:
        if size >= chosen.plan.knobs.sub_group_size:
            continue
        chosen = price(replace(chosen.plan.knobs, sub_group_size=size))
        if chosen.fits_cpu:
            break
    return chosen


def _best_of(evaluations: list[Evaluation], shape: ModelShape) -> Evaluation:
    fits = [e for e in evaluations if e.feasible]
    if fits:
        return rank_within_error(fits, shape, places=1)[0]
    return min(evaluations, key=lambda e: (e.shortfall(), rank_key(e)))


def _compare(top: Evaluation, best: Evaluation | None, fastest_s: float | None) -> str:
    """One line on a plan not chosen: its step time against the chosen plan's, and whether the
    two are a tie the ranking gave to the simpler plan."""
    if top.feasible:
        text = f"fits; {top.step.total_s:.2f} s/step"
        if best is not None and best.feasible and best.step.total_s > 0:
            text += f" ({top.step.total_s / best.step.total_s:.2f}x the chosen plan's step time"
            if fastest_s is not None and ties_fastest(top.step.total_s, fastest_s):
                text += f": a tie, within the model's {STEP_TIME_TIE_BAND:.0%} error"
            text += ")"
        return text
    return f"does not fit: {top.reason()}"


def solve(spec: Spec, accounting: Accounting = "dsgen", scope: Scope = "full") -> SolveResult:
    """Evaluate the search space and rank the feasible plans (pure function of its inputs).

    ``accounting="deepspeed-estimator"`` prices model states with DeepSpeed's own estimator
    instead of dsgen's (see :func:`dsgen.estimate.memory.estimate_memory`). ``scope="choice"``
    returns the same chosen plan (or closest miss) without the rest: ``ranked`` holds the chosen
    plan alone and the alternatives are empty (:data:`Scope`)."""
    target = global_batch_target(spec)
    evaluations, evaluated = _search(spec, target.sequences, accounting, scope=scope)
    if not any(e.feasible for e in evaluations) and spec.long_context_searchable:
        # ALST needs training-script changes no config carries (launch.sh lists them), so its
        # unpinned dimensions join the search only when no plan fits without them; then all
        # four are searched jointly with the others.
        more, counted = _search(spec, target.sequences, accounting, long_search=True, scope=scope)
        evaluations, evaluated = evaluations + more, evaluated + counted
    # a pin is a pin: the search proposes only pinned values, and nothing else is ever shown
    if pins_a_dimension(spec):
        evaluations = [e for e in evaluations if not unmet_pins(spec, e.plan)]
    if not evaluations:  # every structure lacked a batch split it could run
        raise _no_plan_for_pins(spec)
    feasible = [e for e in evaluations if e.feasible]
    feasible = (
        rank_within_error(feasible, spec.model, places=1)[:1]
        if scope == "choice"
        else rank_within_error(feasible, spec.model)
    )
    closest = None if feasible else min(evaluations, key=lambda e: (e.shortfall(), rank_key(e)))
    fastest_s = min((e.step.total_s for e in feasible), default=None)
    pinned = spec.constraints.fully_pinned
    # A fully pinned spec reports that exact plan, feasible or not.
    best = feasible[0] if feasible else (closest if pinned else None)
    shown = best or closest
    if scope == "choice":
        return SolveResult(
            spec, best, tuple(feasible), (), closest, evaluated, pinned, batch_note=target.note, accounting=accounting
        )
    alternatives = []
    for stage in range(4):
        if shown is not None and stage == shown.plan.zero_stage:
            continue
        of_stage = [e for e in evaluations if e.plan.zero_stage == stage]
        if not of_stage:
            alternatives.append(
                Alternative(stage, None, f"excluded by the pinned constraints ({pinned_constraints(spec)})")
            )
            continue
        top = _best_of(of_stage, spec.model)
        alternatives.append(Alternative(stage, top, _compare(top, best, fastest_s)))
    offload_choices = _roads_not_taken(evaluations, shown, best, fastest_s, spec.model, Plan.offload_label)
    return SolveResult(
        spec=spec,
        best=best,
        ranked=tuple(feasible),
        alternatives=tuple(alternatives),
        offload_alternatives=tuple(offload_choices),
        model_parallel_alternatives=_roads_not_taken(evaluations, shown, best, fastest_s, spec.model, _layout_label),
        closest=closest,
        candidates_evaluated=evaluated,
        fully_pinned=pinned,
        batch_note=target.note,
        accounting=accounting,
    )


def _layout_label(plan: Plan) -> str:
    return plan.model_parallel.label() or "none"


def _roads_not_taken(
    evaluations: list[Evaluation],
    shown: Evaluation | None,
    best: Evaluation | None,
    fastest_s: float | None,
    shape: ModelShape,
    label_of: Callable[[Plan], str],
) -> tuple[tuple[str, Evaluation, str], ...]:
    """The best plan of each value of one choice (``label_of``) other than the shown plan's, and
    how it compares: what ``explain`` lists under that choice."""
    if shown is None:
        return ()
    by_label: dict[str, list[Evaluation]] = {}
    for e in evaluations:
        by_label.setdefault(label_of(e.plan), []).append(e)
    by_label.pop(label_of(shown.plan), None)
    found = []
    for label in sorted(by_label):
        top = _best_of(by_label[label], shape)
        found.append((label, top, _compare(top, best, fastest_s)))
    return tuple(found)


def require_feasible(result: SolveResult) -> Evaluation:
    """The chosen plan, or an :class:`InfeasibleError` that says what came closest and by how much."""
    if result.feasible:
        assert result.best is not None
        return result.best
    miss = result.best if result.best is not None else result.closest
    assert miss is not None
    spec = result.spec
    what = "the pinned plan" if result.fully_pinned else "no plan fits; the closest is"
    pinned = pinned_constraints(spec)
    within = f" (within the pinned constraints {pinned})" if pinned and not result.fully_pinned else ""
    raise InfeasibleError(
        f"{what} {miss.plan.describe()}{within}: {miss.reason()}",
        hint=_infeasible_hint(spec, miss),
    )


def pinned_constraints(spec: Spec) -> str:
    """The constraints the spec pins, as the spec writes them (``zero_stage: 3, micro_batch_size: 8``)."""
    c = spec.constraints
    keys = [key for key in PINNABLE_KEYS if getattr(c, key) is not None]
    return ", ".join(f"{key}: {getattr(c, key)}" for key in keys)


#: The constraints that pin one dimension of the search (memory_headroom and allow_batch_rounding
#: are limits, not dimensions; seq_parallel_communication_data_type always has a value).
PINNABLE_KEYS = (
    "zero_stage",
    "offload_optimizer",
    "offload_param",
    "activation_checkpointing",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "zeropp",
    "sequence_parallel_size",
    "tiled_mlp",
    "tiled_loss",
    "checkpoint_offload",
    "tensor_parallel_size",
    "expert_parallel_size",
)


def _infeasible_hint(spec: Spec, miss: Evaluation) -> str:
    if miss.kernel_limit is not None:
        return KERNEL_LIMIT_HINT
    if not miss.fits_cpu and miss.memory.cpu.capacity_assumed:
        return "set hardware.cpu_memory_gib to the node's RAM (the verdict assumed the default), declare NVMe (hardware.nvme), or add nodes"
    if not miss.fits_cpu:
        return "add host RAM (hardware.cpu_memory_gib), declare NVMe (hardware.nvme), or add nodes"
    if not miss.fits_gpu:
        return "add GPUs or nodes, shorten training.sequence_length, or relax constraints"
    return "declare more NVMe capacity (hardware.nvme.capacity_gib)"
