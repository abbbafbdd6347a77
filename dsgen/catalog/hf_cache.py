"""A Hugging Face model id (``Qwen/Qwen2.5-7B-Instruct``) to the ``config.json`` already in the local
Hugging Face cache: the file ``transformers`` and ``huggingface_hub`` read for that id, offline.

dsgen never downloads. The cache's layout is huggingface_hub's (``file_download.py``,
``try_to_load_from_cache``): ``<cache>/models--<org>--<name>/refs/<revision>`` holds a commit hash
and ``snapshots/<hash>/config.json`` the file. The cache directory is huggingface_hub's too
(``constants.py``): ``HF_HUB_CACHE``, else the legacy ``HUGGINGFACE_HUB_CACHE``, else
``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
The few lines here stand in for ``huggingface_hub.try_to_load_from_cache`` because importing
huggingface_hub costs about 0.5 s per start (measured: 0.53-0.61 s against 0.02 s for a bare
interpreter), twice a cold ``dsgen new``; ``tests/test_hf_cache.py`` checks both find the same file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def hub_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The directory huggingface_hub caches models in, read from ``environ`` as it reads it."""
    env = os.environ if environ is None else environ

    def expand(value: str) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(value)))

    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return expand(env[key])
    if env.get("HF_HOME"):
        return expand(env["HF_HOME"]) / "hub"
    return expand(env.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface" / "hub"


def cached_config(model_id: str, cache_dir: Path, revision: str) -> Path | None:
    """The cached ``config.json`` of ``model_id`` at ``revision`` (a branch or tag the cache has a
    ref for, or a commit hash), or None when the cache does not hold it."""
    repo = cache_dir / ("models--" + model_id.replace("/", "--"))
    commit = revision
    ref = repo / "refs" / revision
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
    config = repo / "snapshots" / commit / "config.json"
    return config if config.is_file() else None
