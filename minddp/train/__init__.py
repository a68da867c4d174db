"""The train command, ``python -m minddp.train``: configuration, data, models, checkpoints, outputs.

What lives here: :mod:`~minddp.train.run` (the command: parse, launch, train each stage, report),
:mod:`~minddp.train.config` (its options, checked before any rank starts), :mod:`~minddp.train.data`
and :mod:`~minddp.train.models` (the offline default and Hugging Face names, :mod:`~minddp.train.hub`),
:mod:`~minddp.train.checkpoint` and :mod:`~minddp.train.sharded_checkpoint` (saving and resuming,
whole or sharded), :mod:`~minddp.train.outputs` (trace and result folders that never lose a result).

What it may import: the runtime, the comm layer, the stages and sharded rungs, the ladder and the
trace analysis; not the tools (bench, step-time model, notebooks, exercises).
"""
