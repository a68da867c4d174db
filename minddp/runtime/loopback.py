"""A run whose ranks are all on this machine listens on this machine only: the loopback address.

What a local run opens to connections (``docs/reliability.md``, *What listens where*):

1. the **rendezvous store** (a ``TCPStore`` server in the launcher, the notebook's kernel or the
   ``ft`` coordinator): torch's server binds every interface (``::``/``0.0.0.0``) whatever host it
   is given, so :func:`loopback_store` binds the socket itself, on ``127.0.0.1`` (``::1`` where a
   machine has no IPv4 loopback), and hands torch the bound socket (``master_listen_fd``);
2. the **ranks' own connections** (gloo's pairs, NCCL's bootstrap): each backend binds the address
   the machine's hostname resolves to, often the network's; :func:`rank_env` names the loopback
   interface for both (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``), set in every rank the local
   launchers start, before its group exists.

Under torchrun none of this applies: the rendezvous and interfaces are what the user set up.

Example::

    >>> store = loopback_store(world_size=1)
    >>> store.host, store.port > 0
    ('127.0.0.1', True)
    >>> sorted(rank_env())
    ['GLOO_SOCKET_IFNAME', 'NCCL_SOCKET_IFNAME']
"""

from __future__ import annotations

import functools
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from minddp.runtime import compat


@functools.lru_cache(maxsize=None)
def loopback_host() -> str:
    """``127.0.0.1``, or ``::1`` on a machine without IPv4 loopback (the same answer in every process)."""
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
            return host
        except OSError:
            continue
    raise OSError("this machine has no loopback address (neither 127.0.0.1 nor ::1 can be bound)")


def loopback_store(
    port: int = 0, world_size: int | None = None, timeout: timedelta | None = None, wait_for_workers: bool = False
) -> dist.TCPStore:
    """A ``TCPStore`` server listening on the loopback address only, on ``port`` (0: one the OS picks)."""
    host = loopback_host()
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted server takes its port back at once
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        port = sock.getsockname()[1]
        return compat.store_on_socket(
            host,
            port,
            os.dup(sock.fileno()),  # the store owns (and closes) its copy; ours closes here
            world_size=world_size,
            timeout=timeout or timedelta(seconds=300),
            wait_for_workers=wait_for_workers,
        )


@functools.lru_cache(maxsize=None)
def loopback_interface() -> str | None:
    """The name of the interface that carries the loopback address (``lo`` on Linux, ``lo0`` on macOS)."""
    import psutil

    host = loopback_host()
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == host for a in addresses):
            return name
    return None


def rank_env() -> dict[str, str]:
    """The environment a local rank gets so that its backend's connections stay on the loopback interface."""
    interface = loopback_interface()
    return {} if interface is None else {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
