"""The models: GPU memory, host memory, NVMe and step time of one plan, term by term, each with its
source in ``docs/`` (memory-model.md, throughput-model.md and the pages they link).

May import :mod:`dsgen.spec`, :mod:`dsgen.catalog`, :mod:`dsgen.facts` and the foundation modules.
``lint-imports`` holds every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""
