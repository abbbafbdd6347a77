"""The built wheel carries its templates, schemas and presets: `dsgen new` works from an unpacked
wheel, in another directory, with the source checkout out of reach."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import EXAMPLES_DIR, REPO_ROOT


def test_wheel_runs_dsgen_new_from_another_directory(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO_ROOT)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("dsgen-*.whl")
    import dsgen

    assert wheel.name.startswith(f"dsgen-{dsgen.__version__}-"), "the version is dsgen.__version__"
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "dsgen/_data/templates/deepspeed/ds_config.json.j2",
        "dsgen/_data/templates/hf-trainer/training_args.json.j2",
        "dsgen/_data/templates/accelerate/accelerate_config.yaml.j2",
        "dsgen/_data/templates/lightning/lightning_trainer.json.j2",
        "dsgen/_data/templates/launch/slurm.sh.j2",
        "dsgen/_data/schemas/spec.schema.json",
        "dsgen/_data/schemas/deepspeed.schema.json",
        "dsgen/_data/schemas/sweep.schema.json",
        "dsgen/catalog/data/model-families.yaml",
        "dsgen/catalog/data/gpus/h100-80gb.yaml",
        "dsgen/catalog/data/models/llama-3.1-8b.yaml",
    ):
        assert required in names, f"{required} missing from {wheel.name}"
    data = REPO_ROOT / "dsgen" / "catalog" / "data"
    shipped = {f"dsgen/catalog/data/{p.relative_to(data).as_posix()}" for p in data.rglob("*.yaml")}
    assert len(shipped) >= 19 + 29 + 1 and shipped <= names, sorted(shipped - names)

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    spec = workdir / "spec.yaml"
    spec.write_text((EXAMPLES_DIR / "llama-3.1-8b-8xh100.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)  # the unpacked wheel, not the checkout
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import dsgen, sys; assert 'site' in dsgen.__file__, dsgen.__file__; "
            "from dsgen.cli import main; sys.argv = ['dsgen', 'new', 'spec.yaml']; main()",
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (workdir / "ds_config.json").is_file()
    assert "wrote" in run.stdout
