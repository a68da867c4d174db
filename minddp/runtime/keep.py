"""Tensors and callbacks handed to a collective's backend, kept from Python until the backend has let go of them.

A backend holds what it was handed (gloo: its Work, on a worker thread) until it drops its finished Work, which
can be after ``wait()`` returned. The thread that drops a tensor's last C++ reference takes the GIL to let go of its
Python object, and frees it if Python had let go first; so does the worker that drops a Python callback chained
with ``Future.then``. Once the interpreter has begun to finalize, taking the GIL ends the worker thread
inside a destructor that may not throw, and the process aborts ("terminate called without an active exception").

1. :func:`held` keeps each tensor it is given, with its C++ use count (:func:`~minddp.runtime.compat.use_count`) and
   Python reference count then; each call on the main thread first lets go of those whose counts are both back
   there: no C++ holder is left, nor a reference a worker has yet to drop, so no worker ever frees one;
2. :func:`then` chains a callback through a wrapper counted alive until torch drops it;
3. at exit (``atexit``, which runs before finalization begins), :func:`drain` waits, the GIL released, until every
   kept tensor is released and every wrapper dropped, for :data:`DRAIN_S` at most (a stuck collective never
   hangs the exit), then lets go of the tensors on the main thread.

:func:`all_gather` and :func:`all_gather_object` are torch's, their tensors kept (debug mode's gathers).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> everyone = [None] * dist.get_world_size()
    >>> all_gather_object(everyone, {"bucket sizes": [1024]})
    >>> everyone, all_gather(torch.ones(2))
    ([{'bucket sizes': [1024]}], [tensor([1., 1.])])
    >>> drain()                                       # the backend has let go: nothing left to wait for
    True
"""

from __future__ import annotations

import atexit
import io
import pickle
import sys
import threading
import time

import torch
import torch.distributed as dist

from minddp.runtime import compat
from minddp.runtime.device import message_device
from minddp.runtime.untrusted import load_pickle_data

#: The longest :func:`drain` waits at exit for the backend to let go (a collective that never ends holds on).
DRAIN_S = 3.0
#: How often :func:`drain` looks again, sleeping in between (the GIL released, so the workers can finish).
POLL_S = 0.002

_lock = threading.Lock()
_kept: list[tuple[torch.Tensor, int]] = []  # (tensor, its C++ use count when handed over)
_callbacks = [0]  # wrappers of :func:`then` torch still holds


def held(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Step 1: keep ``tensors`` (about to be handed to a collective) until the backend has let go; returns them."""
    counts = [compat.use_count(t) for t in tensors]
    if None in counts:  # a torch without the count (compat warned): nothing kept, as before
        return tensors
    released = _prune() if threading.current_thread() is threading.main_thread() else []
    with _lock:
        kept = {id(t) for t, _ in _kept}  # one already kept keeps its first count: the lower one
        _kept.extend((t, n) for t, n in zip(tensors, counts) if id(t) not in kept)
    del released  # let go here, on the main thread
    return tensors


def _states(entries: list) -> list[int]:
    """For each kept ``(tensor, count)``: :data:`BUSY` (a C++ holder left), :data:`ALONE` (no C++ holder, and no
    Python reference but ours: none a worker has yet to drop), or 1 (no C++ holder, others' Python references too).

    From torch 2.9 or so, a tensor C++ holds also holds its Python object, and the thread that drops the last C++
    reference lets go of that after the count fell, once it has the GIL: only the Python count tells it has.
    """
    return [
        BUSY if use > n else ALONE if refs <= _ALONE_REFS else 1
        for (_, n), (use, refs) in zip(entries, _counts(entries))
    ]


def _counts(entries: list) -> list[tuple[int, int]]:
    """Each kept tensor's C++ use count and Python reference count (ours: its entry, this loop, the call's)."""
    return [(compat.use_count(t), sys.getrefcount(t)) for t, _ in entries]


BUSY, ALONE = 0, 2
#: The Python reference count :func:`_counts` sees of a tensor held by its entry alone.
_ALONE_REFS = _counts([(torch.empty(0), 0)])[0][1]


def _prune() -> list:
    """Take out the kept tensors held by nobody else (:data:`ALONE`), to be freed by the caller."""
    with _lock:
        states = _states(_kept)
        out = [e for e, s in zip(_kept, states) if s == ALONE]
        _kept[:] = [e for e, s in zip(_kept, states) if s != ALONE]
    return out


def pending() -> tuple[int, int]:
    """How many kept tensors a backend still holds, and how many :func:`then` callbacks torch has not dropped."""
    with _lock:
        return _states(_kept).count(BUSY), _callbacks[0]


class _Counted:
    """A callback counted alive (in :func:`pending`) from when it is chained until torch drops it."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn
        with _lock:
            _callbacks[0] += 1

    def __call__(self, future):
        return self.fn(future)

    def __del__(self):
        with _lock:
            _callbacks[0] -= 1


def then(future: torch.futures.Future, fn) -> torch.futures.Future:
    """Step 2: ``future.then(fn)``, with ``fn`` counted alive until torch has run it and dropped it."""
    return future.then(_Counted(fn))


def drain(limit_s: float = DRAIN_S) -> bool:
    """Step 3: wait, sleeping, until the backends hold no kept tensor and torch no callback, ``limit_s`` at most;
    then, after one more sleep (a worker that dropped its reference takes the GIL to let go of the Python object),
    let go here of every kept tensor no backend holds. Whether everything was let go."""
    deadline = time.monotonic() + limit_s
    while pending() != (0, 0) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    time.sleep(POLL_S)
    with _lock:
        states = _states(_kept)
        released = [e for e, s in zip(_kept, states) if s != BUSY]
        _kept[:] = [e for e, s in zip(_kept, states) if s == BUSY]
    del released
    return pending() == (0, 0)


def all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (the same shape and dtype on each), in group rank order; its tensors :func:`held`."""
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    held(tensor, *out)
    dist.all_gather(out, tensor, group=group)
    return out


def all_gather_object(object_list: list, obj, group: dist.ProcessGroup | None = None) -> None:
    """torch's ``all_gather_object``: ``object_list[r]`` = rank ``r``'s ``obj``, sent pickled as bytes in tensors
    minddp keeps (:func:`all_gather`) and read back as data only (numbers, strings, containers: no global)."""
    data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    device = message_device(group)
    sizes = all_gather(torch.tensor([data.numel()], device=device), group)
    padded = torch.zeros(max(int(n) for n in sizes), dtype=torch.uint8)
    padded[: data.numel()] = data
    for r, (row, n) in enumerate(zip(all_gather(padded.to(device), group), sizes)):
        object_list[r] = load_pickle_data(io.BytesIO(row[: int(n)].cpu().numpy().tobytes()), lambda *_: False)


atexit.register(drain)
