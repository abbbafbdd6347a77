"""Reading a spec file: YAML with line numbers, the schema check, ``--set`` overrides, and the checks
that need the rest of dsgen's knowledge (a pinned degree DeepSpeed refuses, an optimizer offload
cannot run), so that a bad spec stops at its line before any search. Also the starter spec ``dsgen
init`` writes (:mod:`.starter`) and the schema gate shared with :mod:`dsgen.validate`.

May import :mod:`dsgen.search` and everything below it. ``lint-imports`` holds every package to its
layer (pyproject.toml, ``[tool.importlinter]``).
"""
