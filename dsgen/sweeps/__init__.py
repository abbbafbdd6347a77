"""``dsgen sweep``: a grid of specs expanded and solved (:mod:`.runner`, in worker processes), each run
named from its template (:mod:`.name_template`) and written with its manifest and report
(:mod:`.output`), and the cluster's submit files (:mod:`.submit`).

May import :mod:`dsgen.reporting` and everything below it; not :mod:`dsgen.doctor`. ``lint-imports``
holds every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""
