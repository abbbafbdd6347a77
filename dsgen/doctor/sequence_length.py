"""The sequence length a run trains at, where TRL's training arguments say more than the spec.

TRL's ``SFTConfig`` (a ``TrainingArguments`` subclass, so its JSON is what ``--training-args``
reads) truncates every sample to ``max_length`` (``max_seq_length`` before TRL 0.16; ``null``: no
truncation), and with ``packing`` it packs samples into rows of up to ``max_length`` tokens, filled
as far as the samples allow (``trl/data_utils.py`` ``pack_dataset``). So a run never trains longer
rows than ``max_length``, and a packed run trains its rows at about that length. The spec's
``training.sequence_length`` says the longest sample the user expects. The doctor prices the shorter of the two, or
``max_length`` itself when the run packs, and names the change as a finding.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from dsgen.spec.types import Spec

#: TRL's names for the truncation length, newest first.
LENGTH_KEYS = ("max_length", "max_seq_length")


def _length(trainer_args: Mapping[str, Any]) -> tuple[str, int] | None:
    for key in LENGTH_KEYS:
        value = trainer_args.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return key, value
    return None


def run_sequence_length(spec: Spec, trainer_args: Mapping[str, Any] | None) -> tuple[Spec, str | None]:
    """``spec`` at the length the run trains (packed: rows at ``max_length``), and a note when that
    is not the spec's own."""
    if trainer_args is None:
        return spec, None
    found = _length(trainer_args)
    if found is None:
        return spec, None
    key, cap = found
    packed = trainer_args.get("packing") is True
    stated = spec.training.sequence_length
    length = cap if packed else min(cap, stated)
    if length == stated and packed == spec.training.packed_samples:
        return spec, None
    training = replace(spec.training, sequence_length=length, packed_samples=packed or spec.training.packed_samples)
    if packed:
        note = (
            f"the training arguments pack samples into rows of up to {key} {cap:,} tokens (TRL's packing), filled to it"
        )
        if cap != stated:
            note += f", priced at {cap:,} tokens, not the spec's sequence_length {stated:,}"
    else:
        note = (
            f"the training arguments truncate samples to {key} {cap:,} tokens: priced at {cap:,}, "
            f"not the spec's sequence_length {stated:,}"
        )
    return replace(spec, training=training), note
