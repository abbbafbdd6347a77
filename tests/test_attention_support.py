"""FlashAttention is never assumed on a GPU that cannot run it (FlashAttention-2 needs compute
capability 8.0: Ampere or newer; V100 is 7.0, T4 7.5)."""

from __future__ import annotations

import pytest

from dsgen.api import solve_spec
from dsgen.errors import DsgenError
from dsgen.intake.loader import load_spec_text
from dsgen.reporting.report import human_summary, result_dict
from tests.conftest import EXAMPLES_DIR


def spec(gpu: str, attention: str | None) -> str:
    chosen = f", attention: {attention}" if attention else ""
    return (
        "model: {preset: gpt2}\n"
        f"hardware: {{gpu: {gpu}, gpus_per_node: 1, cpu_memory_gib: 64}}\n"
        f"training: {{sequence_length: 512, global_batch_size: 8{chosen}}}\n"
    )


@pytest.mark.parametrize("gpu", ["v100-32gb", "v100-16gb", "t4"])
def test_the_default_becomes_sdpa_with_a_note_on_pre_ampere_gpus(gpu: str) -> None:
    loaded = load_spec_text(spec(gpu, None), file="spec.yaml", base_dir=EXAMPLES_DIR)
    assert loaded.training.attention == "sdpa"
    assert len(loaded.notes) == 1 and "needs compute capability 8.0" in loaded.notes[0]
    result = solve_spec(loaded)
    assert loaded.notes[0] in result_dict(result)["notes"]
    assert f"note      {loaded.notes[0]}" in human_summary(result)


@pytest.mark.parametrize("gpu", ["v100-32gb", "t4"])
def test_flash_written_by_the_user_on_a_pre_ampere_gpu_is_refused(gpu: str) -> None:
    with pytest.raises(DsgenError, match=r"training\.attention") as caught:
        load_spec_text(spec(gpu, "flash"), file="spec.yaml", base_dir=EXAMPLES_DIR)
    assert "compute capability 8.0" in str(caught.value)


@pytest.mark.parametrize("gpu", ["a100-80gb", "l4", "h100-80gb", "rtx-4090", "mi300x"])
def test_flash_stays_where_it_runs(gpu: str) -> None:
    loaded = load_spec_text(spec(gpu, None), file="spec.yaml", base_dir=EXAMPLES_DIR)
    assert loaded.training.attention == "flash" and loaded.notes == ()


def test_sdpa_and_eager_are_kept_on_a_v100() -> None:
    for attention in ("sdpa", "eager"):
        loaded = load_spec_text(spec("v100-32gb", attention), file="spec.yaml", base_dir=EXAMPLES_DIR)
        assert loaded.training.attention == attention and loaded.notes == ()
