"""Collectives written from point-to-point messages, selectable as the wire's transport.

``TRANSPORTS`` maps a name to a function ``all_reduce(tensor, group)`` that
sums ``tensor`` in place across the group (``None`` = torch's own
all_reduce). The train command's ``--collective`` chooses from it:

* ``ring`` (:mod:`ring`): reduce-scatter + all-gather between neighbours,
  ``2 (n - 1) / n · bytes`` sent per rank, what NCCL and gloo do for large tensors;
* ``naive`` (:mod:`naive`): everything through rank 0, for contrast.

``python -m minddp.bench collectives --transports ring,naive`` measures them against gloo's own.

Example::

    >>> from minddp.comm import wire
    >>> wire.use_transport(TRANSPORTS["ring"])   # every comm hook now reduces over the ring
"""

from __future__ import annotations

from minddp.collectives.naive import naive_all_reduce
from minddp.collectives.ring import ring_all_reduce

TRANSPORTS: dict = {"torch": None, "ring": ring_all_reduce, "naive": naive_all_reduce}

__all__ = ["TRANSPORTS", "ring_all_reduce", "naive_all_reduce"]
