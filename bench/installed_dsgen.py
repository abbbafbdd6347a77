"""The dsgen a speed bench times: the one installed beside the bench's own Python, as it is run.

Shared by bench/solve_speed.py and bench/sweep_speed.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def command() -> list[str]:
    """dsgen as its user runs it: the console script installed beside this interpreter, else ``-m``.

    Not whatever ``dsgen`` comes first on PATH, which may belong to another environment than the
    one whose Python runs the bench.
    """
    script = Path(sys.executable).parent / "dsgen"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "dsgen"]


def warm() -> None:
    """Bring dsgen to the state an installed copy is in: sources compiled, files in the page cache.

    pip writes the .pyc files of what it installs; an editable checkout gets them on its first
    run, unless PYTHONDONTWRITEBYTECODE is set (as in many container images). Then every run
    compiles dsgen's sources again and the bench would time the bytecode compiler, not dsgen.
    compileall writes them whatever that variable says.
    """
    located = subprocess.run(
        [sys.executable, "-c", "import dsgen, os; print(os.path.dirname(dsgen.__file__))"],
        capture_output=True,
        text=True,
        check=True,
    )
    subprocess.run([sys.executable, "-m", "compileall", "-q", located.stdout.strip()], check=True)
    subprocess.run([*command(), "presets", "gpus"], capture_output=True, check=True)
