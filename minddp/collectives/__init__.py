"""Collectives written from point-to-point messages, selectable as the wire's transport.

``TRANSPORTS`` maps a name to a function ``all_reduce(tensor, group)`` that
sums ``tensor`` in place across the group (``None`` = torch's own
all_reduce). The train command's ``--collective`` chooses from it.
"""

from __future__ import annotations

TRANSPORTS: dict = {"torch": None}
