"""The package layout pipelines rely on: stage packages that say what they may import, few loose
modules, and every module that moved still importable from its old path (with a warning)."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

import dsgen

PACKAGE_ROOT = Path(dsgen.__file__).resolve().parent


def test_the_top_level_holds_at_most_ten_modules_beside_the_stage_packages() -> None:
    modules = sorted(path.name for path in PACKAGE_ROOT.glob("*.py"))
    assert len(modules) <= 10, modules


def test_every_package_says_what_it_may_import() -> None:
    packages = sorted(path.parent for path in PACKAGE_ROOT.glob("*/__init__.py"))
    assert len(packages) >= 10
    for init in packages:
        module = importlib.import_module(f"dsgen.{init.name}")
        assert module.__doc__ and "May import" in module.__doc__, init.name


@pytest.mark.parametrize("old", sorted(dsgen.MOVED_MODULES))
def test_an_old_module_path_imports_the_moved_module_with_a_warning(old: str) -> None:
    new_module = importlib.import_module(dsgen.MOVED_MODULES[old])
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old_module = importlib.import_module(old)
    assert old_module is new_module
    assert [w.category for w in caught] == [DeprecationWarning]
    assert dsgen.MOVED_MODULES[old] in str(caught[0].message)


def test_a_submodule_of_a_moved_package_follows_it() -> None:
    sys.modules.pop("dsgen.html.charts", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("dsgen.html.charts")
    assert old is importlib.import_module("dsgen.reporting.html.charts")


def test_a_name_that_never_existed_still_fails_to_import() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dsgen.no_such_module")
