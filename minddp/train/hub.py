"""The Hugging Face hub, seen from a machine that may be offline: can it be reached, is a name a local path.

Both the model and the data loaders ask these two questions before they pick
a hub download or their offline default.

Example::

    >>> hub_reachable()          # False on a machine without a network, within about two seconds
    False
"""

from __future__ import annotations

import os
import socket
import threading


def is_local_path(name: str) -> bool:
    """A ``--model``/``--dataset`` value meant as a path rather than a hub id or preset name."""
    return name.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(name))


def hub_reachable(host: str = "huggingface.co", timeout_s: float = 2.0) -> bool:
    """True if a TCP connection to the hub opens within ``timeout_s`` (DNS included).

    Runs in a daemon thread, because name resolution ignores socket timeouts
    and can block for much longer on a machine without a network.
    """
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False
    ok = []

    def attempt():
        try:
            socket.create_connection((host, 443), timeout=timeout_s).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(timeout_s + 0.5)
    return bool(ok)
