"""Shared test plumbing.

Optional oracles (torch, transformers, DeepSpeed, the config corpus) are requested through
:func:`require_module` and the ``corpus_dir`` fixture. On a developer machine without them the
test is skipped with a reason saying how to install them; under ``DSGEN_REQUIRE_ALL=1`` (set by
``.ci/run``) a missing oracle is a failure instead, so CI can never go green by skipping.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = REPO_ROOT / "examples"


def _missing(reason: str) -> None:
    if os.environ.get("DSGEN_REQUIRE_ALL") == "1":
        pytest.fail(f"required oracle unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a rendezvous the test starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def require_module(name: str) -> ModuleType:
    """Import an optional oracle dependency or skip (fail under DSGEN_REQUIRE_ALL=1)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        _missing(f"{name} is not importable ({exc}); install with: pip install -e '.[test,deepspeed]'")
        raise


def bench_module(stem: str) -> ModuleType:
    """A script of bench/ imported as a module (once per session), for tests that run its measurement
    or read its corpus; bench/ goes on ``sys.path`` so the script's own sibling imports resolve."""
    name = f"dsgen_bench_{stem}"
    if name not in sys.modules:
        bench_dir = str(REPO_ROOT / "bench")
        if bench_dir not in sys.path:
            sys.path.insert(0, bench_dir)
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{stem}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def single_threaded_bench(stem: str, *oracles: str) -> Iterator[ModuleType]:
    """:func:`bench_module` for a module-scoped fixture of a bench that measures with torch: its
    oracles required, torch held to one thread (the measurements count bytes, and the 2-core
    machine runs other tests beside them), the thread count restored afterwards."""
    for oracle in oracles:
        require_module(oracle)
    module = bench_module(stem)
    threads = module.torch.get_num_threads()
    module.torch.set_num_threads(1)
    try:
        yield module
    finally:
        module.torch.set_num_threads(threads)


CORPUS_MIN_CONFIGS = 300  # the shared corpus holds 345 real configs


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    """The real-world DeepSpeed config corpus, from $DSGEN_CORPUS."""
    value = os.environ.get("DSGEN_CORPUS")
    if not value or not Path(value).is_dir():
        _missing("DSGEN_CORPUS is not set to the corpus directory (e.g. ../shared/corpus)")
    corpus = Path(value)  # type: ignore[arg-type]
    found = sum(1 for _ in corpus.glob("*.json"))
    if found < CORPUS_MIN_CONFIGS:  # a test looping over an empty corpus would pass vacuously
        _missing(f"DSGEN_CORPUS={value} holds {found} configs; the corpus has {CORPUS_MIN_CONFIGS} or more")
    return corpus


def pytest_configure(config: pytest.Config) -> None:
    """Compile dsgen's sources once, before any test starts a ``dsgen`` process.

    A pip-installed dsgen ships its bytecode, but this checkout's editable install only gets it
    when Python may write it, and many CI images set PYTHONDONTWRITEBYTECODE: every ``dsgen``
    subprocess of the suite (hundreds) would then compile every module it imports again, about
    0.15 s each. ``compileall`` writes the bytecode whatever that variable says, and skips what is
    current."""
    import compileall

    compileall.compile_dir(REPO_ROOT / "dsgen", quiet=1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under DSGEN_REQUIRE_ALL=1 any skipped test fails the run: a skip can hide a regression."""
    if os.environ.get("DSGEN_REQUIRE_ALL") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reporter.write_line(f"DSGEN_REQUIRE_ALL=1: {len(skipped)} test(s) were skipped; failing the run", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
