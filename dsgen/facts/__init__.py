"""What DeepSpeed and the frameworks around it accept, read from their source: which release
behaves how (:mod:`.release`), the AutoTP and AutoEP rules and presets (:mod:`.model_parallel`), and
the programs that read dsgen's JSON with the layouts each cannot run (:mod:`.frameworks`).

May import only the foundation modules (errors, units, vocabulary, plan, inputs, output, resources).
``lint-imports`` holds every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""
