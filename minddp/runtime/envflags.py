"""On/off switches read from the environment: the one reader, so every flag means the same.

A flag is on unless it is unset, empty, ``0`` or ``false`` (any case).

Example::

    >>> import os
    >>> os.environ["MINDDP_DEBUG"] = "1"            # MINDDP_DEBUG=1 python ...
    >>> env_flag("MINDDP_DEBUG")
    True
    >>> del os.environ["MINDDP_DEBUG"]
"""

from __future__ import annotations

import os


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` turns its switch on."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")
