"""A run whose ranks are all on this machine listens on this machine only: the loopback address.

What a local run opens to connections (``docs/reliability.md``, *What listens where*):

1. the **rendezvous store** (a ``TCPStore`` server in the launcher, the notebook's kernel or the
   ``ft`` coordinator): torch's server binds every interface (``::``/``0.0.0.0``) whatever host it
   is given, so :func:`loopback_store` binds the socket itself, on ``127.0.0.1`` (``::1`` where a
   machine has no IPv4 loopback), and hands torch the bound socket (``master_listen_fd``);
2. the **ranks' own connections** (gloo's pairs, NCCL's bootstrap): each backend binds the address
   the machine's hostname resolves to, often the network's; :func:`rank_env`, called by the local
   launchers, names the loopback interface for both (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``),
   handed to every rank they start and set there before its group exists. A value the user set
   is kept, and the launcher says so in one line (the connections may then leave the machine);
   so it does when no interface carries the loopback address, naming what to set.

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
import sys
from datetime import timedelta

import torch.distributed as dist

from minddp.runtime import compat
from minddp.runtime.cli import fresh_line


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
        fd = os.dup(sock.fileno())  # the store owns (and closes) this copy; ours closes here
        try:
            return compat.store_on_socket(
                host,
                port,
                fd,
                world_size=world_size,
                timeout=timeout or timedelta(seconds=300),
                wait_for_workers=wait_for_workers,
            )
        except BaseException:
            _close_if_still(fd, sock)  # not taken over: it would stay open (and listening) for ever
            raise


def _close_if_still(fd: int, sock: socket.socket) -> None:
    """Close ``fd`` if it is still a copy of ``sock`` (a store that failed may have closed it already, and the
    number been reused since: that file is someone else's)."""
    try:
        mine, now = os.fstat(sock.fileno()), os.fstat(fd)
    except OSError:  # closed already
        return
    if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
        os.close(fd)


@functools.lru_cache(maxsize=None)
def loopback_interface() -> str | None:
    """The name of the interface that carries the loopback address (``lo`` on Linux, ``lo0`` on macOS)."""
    import psutil

    host = loopback_host()
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == host for a in addresses):
            return name
    return None


#: The variables that name the interface of each backend's own connections (gloo's, NCCL's).
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")

_said: set[str] = set()  # the lines rank_env said in this process (a run of several stages launches often)


def rank_env(environ=None) -> dict[str, str]:
    """The environment a local rank gets so that its backend's connections stay on the loopback interface.

    Called by a launcher, which hands the result to its ranks. A variable set in ``environ``
    (``os.environ``) is the user's choice and is kept, with one line on stderr naming the interface it
    picks; without an interface that carries the loopback address a variable the user did not set is
    left out, with one line saying so and what to set. Each line once per process.
    """
    environ = os.environ if environ is None else environ
    interface = loopback_interface()
    env = {name: environ[name] for name in IFNAME_VARIABLES if environ.get(name)}
    chosen = sorted(f"{name}={value}" for name, value in env.items() if value != interface)
    if chosen:
        _say_once(
            f"the ranks' own connections use the interface set in {' and '.join(chosen)}, not the loopback "
            f"interface ({interface or 'none found'}): they may be reachable from the network; unset it to keep "
            "this local run on this machine"
        )
    missing = [name for name in IFNAME_VARIABLES if name not in env]
    if interface is None and missing:
        _say_once(
            f"no network interface carries the loopback address {loopback_host()}, so gloo and NCCL bind the "
            "address this machine's name resolves to (possibly the network's); set "
            f"{' and '.join(missing)} to the loopback interface's name (lo on Linux, lo0 on macOS)"
        )
    return {**{name: interface for name in missing if interface is not None}, **env}


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(f"{fresh_line()}minddp: {line}", file=sys.stderr, flush=True)
