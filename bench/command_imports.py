"""What each dsgen command imports, and what the imports cost: ``python -X importtime`` per command.

Each command runs in a fresh interpreter (``python -X importtime -m dsgen ...``); the table sums
the import time of each package's own modules (every module's *self* time, given to its
top-level package: dsgen, typer, PyYAML, Jinja2, jsonschema, jsonschema_rs; jsonschema's
dependencies referencing, attrs and rpds count as jsonschema, everything else as "other", the
standard library's email package that jsonschema_rs's extension imports included) and says which of
dsgen's heavier parts the command loaded at all.
Import times move with the machine's load; which packages a command loads does not (that is
what tests/test_command_imports.py holds). Median of ``--runs`` runs per command.

Run: .venv/bin/python bench/command_imports.py [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "examples" / "llama-3.1-8b-8xh100.yaml"
#: Packages shown as columns; everything else is summed under "other".
PACKAGES = ("dsgen", "typer", "yaml", "jinja2", "jsonschema", "jsonschema_rs")
#: Packages that only ever come in as a column's dependencies, and count as that column.
DEPENDENCIES = {
    "referencing": "jsonschema",
    "attrs": "jsonschema",
    "attr": "jsonschema",
    "rpds": "jsonschema",
    "jsonschema_specifications": "jsonschema",
    "markupsafe": "jinja2",
    "_yaml": "yaml",
}
#: dsgen's parts whose presence per command the table reports.
PARTS = (
    "dsgen.search.solver",
    "dsgen.targets.render",
    "dsgen.sweeps.runner",
    "dsgen.sweeps.name_template",
    "dsgen.validate",
    "dsgen.doctor",
)


def commands(tmp: Path) -> dict[str, list[str]]:
    config = tmp / "ds_config.json"
    return {
        "presets gpus": ["presets", "gpus"],
        "schema spec": ["schema", "spec"],
        "solve": ["solve", str(SPEC), "--json"],
        "explain": ["explain", str(SPEC)],
        "new": ["new", str(SPEC), "-o", str(config), "--force"],
        "validate": ["validate", str(config), "--world-size", "8"],
        "doctor": ["doctor", str(config), "--spec", str(SPEC)],
        "sweep --dry-run": ["sweep", str(REPO / "examples" / "sweep" / "sweep.yaml"), "--dry-run"],
    }


def importtime(args: list[str]) -> tuple[dict[str, float], set[str]]:
    """(ms per top-level package, the modules loaded) of one run of ``dsgen ARGS``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "dsgen", *args], capture_output=True, text=True, cwd=REPO
    )
    per_package: dict[str, float] = defaultdict(float)
    loaded: set[str] = set()
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _, name = line[len("import time:") :].split("|")
        module = name.strip()
        loaded.add(module)
        top = module.split(".")[0]
        top = DEPENDENCIES.get(top, top)
        per_package[top if top in PACKAGES else "other"] += int(own) / 1000
    return per_package, loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = commands(Path(tmp))
        subprocess.run([sys.executable, "-m", "dsgen", *table["new"]], capture_output=True, check=True)
        header = ["command", *PACKAGES, "other", "total ms", "loads"]
        print(" | ".join(header))
        print(" | ".join("---" for _ in header))
        for name, argv in table.items():
            runs = [importtime(argv) for _ in range(args.runs)]
            medians = {p: statistics.median(r[0].get(p, 0.0) for r in runs) for p in (*PACKAGES, "other")}
            total = statistics.median(sum(r[0].values()) for r in runs)
            loaded = runs[0][1]
            parts = [
                part.removeprefix("dsgen.")
                for part in PARTS
                if any(m == part or m.startswith(part + ".") for m in loaded)
            ]
            cells = [
                name,
                *(f"{medians[p]:.0f}" for p in (*PACKAGES, "other")),
                f"{total:.0f}",
                ", ".join(parts) or "-",
            ]
            print(" | ".join(cells))


if __name__ == "__main__":
    main()
