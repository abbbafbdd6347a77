"""``model.hf``: a Hugging Face model id read from the local Hugging Face cache, never downloaded.

huggingface_hub is the oracle: the cache directory it reads from each environment
(``huggingface_hub.constants.HF_HUB_CACHE``) and the file its ``try_to_load_from_cache`` finds for
each id and revision are what dsgen's reader must find (dsgen/catalog/hf_cache.py says why it does
not import huggingface_hub itself).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsgen.api import load_spec
from dsgen.catalog import presets as presets_module
from dsgen.catalog.hf_cache import cached_config, hub_cache_dir
from dsgen.catalog.presets import get_model
from tests.cli_helpers import run_cli
from tests.conftest import EXAMPLES_DIR, require_module

TINY_CONFIG = EXAMPLES_DIR / "tiny-llama" / "config.json"


def _cache_model(cache: Path, model_id: str, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Lay ``model_id`` out in ``cache`` as huggingface_hub's downloads do: refs name the commit,
    the snapshot of that commit holds config.json."""
    repo = cache / ("models--" + model_id.replace("/", "--"))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (snapshot / "config.json").write_text(TINY_CONFIG.read_text())
    return snapshot / "config.json"


def test_dsgen_finds_the_config_huggingface_hub_finds(tmp_path: Path) -> None:
    hub = require_module("huggingface_hub")
    cache = tmp_path / "hub"
    _cache_model(cache, "Qwen/Qwen2.5-7B-Instruct", "a" * 40)
    _cache_model(cache, "gpt2", "b" * 40)
    _cache_model(cache, "meta-llama/Llama-3.1-8B", "c" * 40, refs=("main", "v1.0"))
    _cache_model(cache, "org/only-a-tag", "d" * 40, refs=("v2",))
    asked = [
        ("Qwen/Qwen2.5-7B-Instruct", "main"),
        ("gpt2", "main"),
        ("meta-llama/Llama-3.1-8B", "v1.0"),
        ("meta-llama/Llama-3.1-8B", "c" * 40),  # a commit hash, no ref
        ("org/only-a-tag", "main"),  # no ref for main: not found
        ("org/only-a-tag", "v2"),
        ("org/missing", "main"),
        ("Qwen/Qwen2.5-7B-Instruct", "e" * 40),  # a commit the cache does not hold
    ]
    found = 0
    for model_id, revision in asked:
        theirs = hub.try_to_load_from_cache(model_id, "config.json", cache_dir=cache, revision=revision)
        ours = cached_config(model_id, cache, revision)
        assert (str(ours) if ours else None) == (theirs if isinstance(theirs, str) else None), (model_id, revision)
        found += ours is not None
    assert found == 5


ENVIRONMENTS = {
    "hf-hub-cache": {"HF_HUB_CACHE": "{tmp}/a", "HF_HOME": "{tmp}/b", "XDG_CACHE_HOME": "{tmp}/c"},
    "legacy-hub-cache": {"HUGGINGFACE_HUB_CACHE": "{tmp}/a", "HF_HOME": "{tmp}/b"},
    "hf-home": {"HF_HOME": "{tmp}/b", "XDG_CACHE_HOME": "{tmp}/c"},
    "xdg": {"XDG_CACHE_HOME": "{tmp}/c"},
    "home": {},
    "tilde": {"HF_HOME": "~/hf"},
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_the_cache_directory_is_the_one_huggingface_hub_reads(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_module("huggingface_hub")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "XDG_"))}
    env.update({key: value.format(tmp=tmp_path) for key, value in ENVIRONMENTS[name].items()}, HOME=str(tmp_path))
    theirs = subprocess.run(
        [sys.executable, "-c", "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    monkeypatch.setenv("HOME", str(tmp_path))  # expanduser reads the process's HOME
    assert str(hub_cache_dir(env)) == theirs


SPEC = """\
model:
  hf: {model}
{extra}hardware: {{gpu: h100-80gb, gpus_per_node: 2}}
training: {{sequence_length: 64, global_batch_size: 8}}
"""


def test_a_cached_model_id_reads_as_its_config_file_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    config = _cache_model(cache, "Qwen/Qwen2.5-7B-Instruct", "a" * 40, refs=("main", "v1"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    by_id = tmp_path / "by-id.yaml"
    by_id.write_text(SPEC.format(model="Qwen/Qwen2.5-7B-Instruct", extra="  hf_revision: v1\n"))
    by_file = tmp_path / "by-file.yaml"
    by_file.write_text(SPEC.replace("hf: {model}", f"hf_config: {config}").format(extra=""))
    from_id, from_file = load_spec(by_id).model, load_spec(by_file).model
    assert from_id.name == "Qwen/Qwen2.5-7B-Instruct"  # the cache wins over the qwen2.5-7b preset
    assert from_id == dataclasses.replace(from_file, name=from_id.name)
    assert from_id.parameter_count() == from_file.parameter_count() > 0
    assert json.loads(TINY_CONFIG.read_text())["hidden_size"] == from_id.hidden_size


def test_a_model_not_in_the_cache_is_one_error_with_the_command_that_fetches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(model="acme/Widget-7B", extra=""))  # no preset has its architecture
    result = run_cli(["new", str(spec), "-o", str(tmp_path / "out.json")], capsys)
    assert result.exit_code == 2
    assert "spec.yaml:2: model.hf: acme/Widget-7B is not in the local Hugging Face cache" in result.stderr
    assert "hf download acme/Widget-7B config.json" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out.json").exists()
    spec.write_text(SPEC.format(model="acme/Widget-7B", extra="  hf_revision: v9\n"))
    tagged = run_cli(["solve", str(spec)], capsys)
    assert tagged.exit_code == 2 and "at revision v9" in tagged.stderr and "--revision v9" in tagged.stderr


def test_a_revision_without_a_model_id_and_a_malformed_id_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("hf: {model}", "preset: gpt2").format(extra="  hf_revision: main\n"))
    result = run_cli(["solve", str(spec)], capsys)
    assert result.exit_code == 2 and "model.hf_revision" in result.stderr and "give model.hf" in result.stderr
    spec.write_text(SPEC.format(model="'../../etc/passwd'", extra=""))
    malformed = run_cli(["solve", str(spec)], capsys)
    assert malformed.exit_code == 2 and "spec.yaml:2: model.hf" in malformed.stderr


@pytest.mark.parametrize(
    ("model_id", "preset"),
    [
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("meta-llama/Llama-2-7b-chat-hf", "llama-2-7b"),
    ],
)
def test_a_model_id_not_in_the_cache_is_priced_as_the_preset_of_its_architecture_and_says_so(
    model_id: str, preset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(model=model_id, extra=""))
    loaded = load_spec(spec)
    assert loaded.model == dataclasses.replace(get_model(preset), name=model_id)
    assert any(f"priced as the preset {preset}" in note for note in loaded.notes), loaded.notes
    result = run_cli(["solve", str(spec)], capsys)
    assert result.exit_code == 0, result.stderr
    assert f"model.hf {model_id} is not in the local Hugging Face cache; priced as the preset {preset}" in (
        result.stdout + result.stderr
    )


def test_every_preset_names_its_own_repository_and_no_two_share_an_architecture() -> None:
    from dsgen.catalog.presets import _hf_ids, model_presets, preset_for_hf_id

    ids = _hf_ids()
    assert set(ids) == set(model_presets())
    for name, model_id in ids.items():
        assert preset_for_hf_id(model_id) == name
        # the first line of each preset file names the repository its numbers come from
        first = (Path(presets_module.MODELS_DIR) / f"{name}.yaml").read_text().splitlines()[0]
        assert first.startswith(f"# {model_id}:"), (name, first)
