"""The production ``minddp.DistributedDataParallel``: torch's DDP, drop-in, bit for bit, as fast.

Where the teaching stages (:mod:`minddp.stages`) show one idea per file, this
package is where they come together with what torch's DDP adds for real
training and for speed, kept apart so the ladder stays readable:

* :mod:`~minddp.ddp.distributed`: the module (torch's constructor, forward,
  ``no_sync``, ``register_comm_hook``);
* :mod:`~minddp.ddp.base`: what it shares with ``fsdp`` (the same start, ``no_sync``), not a teaching class;
* :mod:`~minddp.ddp.reducer`: buckets reduced during backward, in order,
  finished inside ``backward()``; unused parameters; bucket views;
* :mod:`~minddp.ddp.plan`: torch's first-iteration plan and the rebuild;
* :mod:`~minddp.ddp.fast`: the built-in average sent the way torch's C++
  reducer sends it (cached views, torch's rounding, no per-call checks);
* :mod:`~minddp.ddp.debug_reducer`: the reducer in debug mode (``MINDDP_DEBUG=1``): its collectives checked
  and labelled (its cross-rank guards, settings, plan, NaN/Inf, why a reduction did not finish, are debug
  mode's room's: :mod:`minddp.debug.ddp_guards`);
* :mod:`~minddp.ddp.buffers`: ``broadcast_buffers``.

Under ``torch.compile`` the module's graph is cut where its buckets fill (:mod:`minddp.runtime.compiling`,
``docs/ddp.md``, *Compiled*); the teaching stages get that from ``minddp.ladder.compile_ready``, outside their
files.

``docs/ddp.md`` maps each part to the teaching stage that introduced it.
"""

from minddp.ddp.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
