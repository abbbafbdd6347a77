"""How a training script ends: every bundle whose framework leaves the process group alive says
how to tear it down, and the calls it names do tear it down in the installed frameworks' code.

A rank that exits with a gloo group alive can abort in interpreter shutdown (SIGABRT, "terminate
called without an active exception") after training finished; torchrun then reports the job as
failed (issue 20). The 2-rank launch test in test_targets.py runs a script that ends this way.
"""

from __future__ import annotations

import inspect

import pytest

from dsgen.api import load_spec, render_bundle, solve_spec
from tests.conftest import EXAMPLES_DIR, require_module


def _launch_header(target: str) -> str:
    # AutoTP pinned off: its subject is the plain bundle's launch script (Lightning refuses AutoTP by name)
    spec = load_spec(EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml", ["constraints.tensor_parallel_size=1"])
    plan = solve_spec(spec).best.plan  # type: ignore[union-attr]
    launcher = {"deepspeed": "torchrun"}.get(target)
    return render_bundle(spec, plan, target, launcher).files["launch.sh"].split("set -euo pipefail")[0]


@pytest.mark.parametrize(
    ("target", "call"),
    [
        ("hf-trainer", "trainer.accelerator.end_training()"),
        ("accelerate", "accelerator.end_training()"),
        ("deepspeed", "deepspeed.comm.destroy_process_group()"),
    ],
)
def test_the_launch_script_says_how_the_script_ends(target: str, call: str) -> None:
    assert call in _launch_header(target)


def test_lightning_needs_no_teardown_line() -> None:
    """Lightning registers the teardown itself; telling users to repeat it would be noise."""
    require_module("lightning")
    from lightning.fabric.utilities import distributed

    assert "atexit.register(_destroy_dist_connection)" in inspect.getsource(distributed._init_dist_connection)
    assert "destroy_process_group" in inspect.getsource(distributed._destroy_dist_connection)
    assert "destroy_process_group" not in _launch_header("lightning")


def test_the_named_calls_destroy_the_process_group() -> None:
    """Accelerate's end_training destroys the default group; DeepSpeed's comm forwards to torch's."""
    require_module("accelerate")
    require_module("deepspeed")
    from accelerate import Accelerator
    from accelerate.state import PartialState
    from deepspeed.comm.torch import TorchBackend

    assert "self.state.destroy_process_group()" in inspect.getsource(Accelerator.end_training)
    assert "torch.distributed.destroy_process_group(group)" in inspect.getsource(PartialState.destroy_process_group)
    source = inspect.getsource(TorchBackend.destroy_process_group)
    assert "torch.distributed.destroy_process_group" in source
