"""What ZeRO-3 holds at the start of backward for a mixture-of-experts model.

Measured on CPU ranks with DeepSpeed 0.19.8 and transformers 5.24 (``tests/z3_leaf_worker.py``,
``docs/zero3-leaf-measurements.md``), element for element on an 8- and a 4-layer tiny Mixtral:

* **Every MoE block's experts stay alive from its forward to its backward.** ZeRO-3 releases a
  gathered parameter by swapping in an empty tensor (``runtime/zero/partition_parameters.py``
  ``free_param``), but transformers 5's fused experts run ``_grouped_mm(input,
  weight.transpose(-2, -1), ...)`` (``integrations/moe.py``), and autograd saves that *view*, which
  keeps the gathered storage alive until the block's backward. DeepSpeed avoids this only for
  ``F.linear`` (``runtime/zero/linear.py``, ``LinearFunctionForZeroStage3`` saves the Parameter).
  So after the forward all MoE layers' experts are on the GPU, and ``stage3_max_live_parameters``
  does not bound them (a released parameter leaves the coordinator's count).
* **With the block a ZeRO-3 leaf (DeepSpeed 0.19.8's default for the transformers MoE blocks,
  ``runtime/zero/leaf_module_config.py``), its gradients arrive together**: leaf parameters get no
  per-parameter reduce hook (``stage3.py``, ``reduce_leaf_module_grads``), so the whole block's
  full-size gradients exist at once, outside the reduce bucket when an expert tensor is larger
  than it (``__add_grad_to_ipg_bucket`` copies only what fits).
* **The reuse distance keeps attention and the embedding gathered** from forward into backward:
  ``__params_to_release`` counts only a module's own parameters on its walk, a leaf MoE block has
  none (its router and experts are children), so the walk sums attention and the vocabulary
  matrices alone and, below ``stage3_max_reuse_distance``, releases nothing.

At the backward peak one rank holds, beyond the reduce bucket dsgen already prices: every MoE
layer's experts, one whole block's gradients, every layer's attention and the embedding (when the
reuse distance keeps them). With whole-layer checkpointing the forward saves no view (its graph is
rebuilt in backward), and AutoEP replaces the transformers block with its own layer; neither was
measured, so neither is priced here (the one-block term applies).
"""

from __future__ import annotations

from dsgen.catalog.model_shape import ModelShape
from dsgen.estimate.parameter_layout import parameter_shapes
from dsgen.estimate.sharding import is_expert_tensor
from dsgen.plan import Plan


def _expert_tensors(shape: ModelShape) -> list[int]:
    """Elements of each stacked expert tensor of one MoE block (``(experts, out, in)``)."""
    per_block = [s for s in parameter_shapes(shape) if is_expert_tensor(shape, s)]
    count = len(per_block) // max(shape.moe_layers, 1)
    return [a * b * c for a, b, c in per_block[:count]]


def applies(shape: ModelShape, plan: Plan) -> bool:
    """Whether the measured mechanism holds: ZeRO-3, an MoE model in transformers' fused layout,
    no whole-layer checkpointing, no AutoEP."""
    return (
        plan.zero_stage == 3
        and shape.is_moe
        and plan.checkpointing != "full"
        and plan.expert_parallel_size == 1
        and bool(_expert_tensors(shape))
    )


def backward_held_elements(shape: ModelShape, plan: Plan) -> int:
    """Elements ZeRO-3 holds at the start of backward beyond the reduce bucket (0 where
    :func:`applies` is false): every MoE layer's experts, the last block's full-size gradients
    where an expert tensor exceeds the bucket, and every layer's attention and the embedding where
    the reuse distance keeps them gathered."""
    if not applies(shape, plan):
        return 0
    experts = _expert_tensors(shape)
    held = shape.moe_layers * sum(experts)
    if max(experts) > plan.knobs.reduce_bucket_size:
        held += shape.mlp_parameters()  # the block's gradients, router and shared experts included
    attention, vocabulary = shape.num_layers * shape.attention_parameters(), shape.embedding_parameters()
    walk = 2 * attention + 2 * vocabulary  # the trace between the embedding's forward and its backward
    if walk < plan.knobs.max_reuse_distance:
        held += attention + vocabulary
    return held
