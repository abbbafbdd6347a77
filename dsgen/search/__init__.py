"""The search: the candidate plans (ZeRO stage, offload, knobs, micro-batch and accumulation,
checkpointing, AutoTP, AutoEP, Ulysses and ALST), each priced once (:mod:`.evaluation`), judged
(:mod:`.verdict`), ranked by one rule (:mod:`.ranking`) and chosen (:mod:`.solver`); the frontier is
the same search bisected over one dimension (:mod:`.frontier`).

May import :mod:`dsgen.estimate` and everything below it. ``lint-imports`` holds every package to
its layer (pyproject.toml, ``[tool.importlinter]``).
"""
