"""What the user reads: the text report and ``explain``, the JSON contract's plan records, the
method summary, the difference a target makes, the frontier's table, and the HTML pages (:mod:`.html`).

May import :mod:`dsgen.targets` and everything below it. ``lint-imports`` holds every package to its
layer (pyproject.toml, ``[tool.importlinter]``).
"""
