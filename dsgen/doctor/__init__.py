"""``dsgen doctor``: size a DeepSpeed config the user already has against a cluster spec.

The config decides stage, offload, batch and buffer sizes (with DeepSpeed 0.19.8's defaults
for what it leaves out, :mod:`dsgen.doctor.config_to_plan`); the spec gives model, hardware,
sequence length, attention and what the training script does. The doctor predicts memory and
step time with the solver's own :func:`dsgen.search.evaluation.evaluate`, ranks fixes
(:mod:`dsgen.doctor.fixes`), explains the batch assertion (:mod:`dsgen.doctor.batch`) and reads
PyTorch's out-of-memory messages (:mod:`dsgen.doctor.oom_message`). docs/doctor.md maps every
config key to the memory model.

May import :mod:`dsgen.reporting` and everything below it; not :mod:`dsgen.sweeps`. ``lint-imports``
holds every package to its layer (pyproject.toml, ``[tool.importlinter]``).
"""
