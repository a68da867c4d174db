"""The runtime every command runs on: starting and stopping ranks, devices, torch releases, the console.

What lives here: :mod:`~minddp.runtime.launch` (start N local ranks or join torchrun, always tear
down), :mod:`~minddp.runtime.processes` (process trees and stop signals), :mod:`~minddp.runtime.hang`
(naming a stuck rank), :mod:`~minddp.runtime.device` (gloo/CPU, gloo on shared GPUs or NCCL, and
where a message lives), :mod:`~minddp.runtime.compat` (the torch 2.6-2.15 differences),
:mod:`~minddp.runtime.envflags`, :mod:`~minddp.runtime.profiling` (a rank's trace), :mod:`~minddp.runtime.keep`
(what a collective was handed, kept until its backend lets go: no abort at exit),
:mod:`~minddp.runtime.cli` (the conventions every command-line tool shares). Debug mode, the layer
above, has its own room: :mod:`minddp.debug`.

What it may import: torch and the standard library, and other runtime modules; nothing else of
minddp (tests/test_layers.py checks it).
"""
