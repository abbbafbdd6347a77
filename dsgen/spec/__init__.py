"""What a spec says once it is read: the frozen dataclasses of its sections (:mod:`.types`), their
defaults taken from ``schemas/spec.schema.json`` (:mod:`.defaults`), the source locations messages
point at (:mod:`.yaml_source`), and the generated key reference (:mod:`.reference`). Reading and
checking a spec file is :mod:`dsgen.intake`.

May import :mod:`dsgen.catalog`, :mod:`dsgen.facts` and the foundation modules. ``lint-imports``
holds every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""
