"""The catalog: GPU and model presets, Hugging Face ``config.json`` reading, and the model's shape
(:class:`.model_shape.ModelShape`: layers, widths, experts, every linear layer) that every estimate reads.

May import :mod:`dsgen.facts` and the foundation modules. ``lint-imports`` holds every package to
its layer (pyproject.toml, ``[tool.importlinter]``).
"""
