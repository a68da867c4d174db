"""The rungs for slow links: talk every H steps instead of every step.

Every rung before these sends every gradient every step; across datacenters or over a home connection
that costs more than the step itself. These rungs let each replica train alone for ``sync_every`` (H)
optimizer steps and then sync, H times fewer messages:

=============  ==========================================  ==================================================
name           class                                       the one idea it adds
=============  ==========================================  ==================================================
``local-sgd``  :class:`~minddp.diloco.local_sgd.LocalSGD`  every H steps, average the weights
``diloco``     :class:`~minddp.diloco.diloco.DiLoCo`       every H steps, average the pseudo-gradient (synced
                                                           − local), step an outer optimizer from the synced
                                                           weights; streamed: K fragments one after
                                                           another, each sent τ steps early, mixed in
                                                           with α
=============  ==========================================  ==================================================

Both are used as torchft's are: a context manager around an ordinary loop, the sync taken in a
post-hook of the (inner) optimizer's step. What they check before any rank talks, and how the model is
cut into fragments: :mod:`minddp.diloco.fragments`. More: ``docs/diloco.md``.
"""

from minddp.diloco.diloco import OUTER_DEFAULTS, DiLoCo
from minddp.diloco.local_sgd import LocalSGD

__all__ = ["LocalSGD", "DiLoCo", "OUTER_DEFAULTS"]
