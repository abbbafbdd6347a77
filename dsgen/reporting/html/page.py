"""Render a report page with Jinja2, escaping every value (spec strings reach the page)."""

from __future__ import annotations

from functools import cache
from typing import Any

from dsgen.resources import template_dir
from dsgen.units import gib

#: How the pages print each kind of number (a browser test reads them back the same way).
FORMATS = {
    "gib": gib,
    "percent": lambda value: f"{value:.0%}",
    "seconds": lambda value: f"{value:.2f} s",
    "number": lambda value: f"{value:,.0f}",
}


@cache
def _environment() -> Any:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(
        loader=FileSystemLoader(str(template_dir() / "html")),
        undefined=StrictUndefined,
        autoescape=True,  # model names, sweep values and reasons come from user files
        trim_blocks=True,
        lstrip_blocks=True,
    )
    for name, format_value in FORMATS.items():
        env.filters[name] = format_value
    env.filters["unit"] = lambda value, kind: FORMATS[kind](value)
    env.filters["svg"] = lambda value: f"{value:.2f}"
    return env


def render_page(name: str, context: dict[str, Any]) -> str:
    """The page ``templates/html/<name>`` with ``context``."""
    return str(_environment().get_template(name).render(**context))
