"""Files a user hands in, read as data: nothing in them runs.

A pickle is a program: unpickling calls whatever function its file names (``os.system`` as readily
as ``torch.Size``). So a file someone downloads or is sent, a checkpoint above all, is never read
with Python's ``pickle.load`` or ``torch.load(..., weights_only=False)``. The two readers here:

1. :func:`load_torch_data`: a file ``torch.save`` wrote, through torch's own data-only reader
   (``torch.load(..., weights_only=True)``: tensors, containers, numbers, strings). minddp's files
   are written to need nothing more (:mod:`minddp.train.rng` stores numpy's random state as plain
   values), so no global is added to torch's list;
2. :func:`load_pickle_data`: a plain pickle (``torch.distributed.checkpoint``'s ``.metadata``, a
   saved table of measurements), with only the ``module.name`` pairs a caller names
   (``allowed(module, name)``), checked *before* the module is imported: a name not on the list is
   never looked up.

Either raises :class:`NotData` (a ``ValueError``) naming what the file asked to run; the callers
turn it into their one-line refusal. What minddp unpickles where, and why each place is safe:
``docs/reliability.md`` (Files a user hands in).

Example::

    >>> import io, pickle
    >>> class Payload:
    ...     def __reduce__(self):
    ...         return (print, ("this would run",))
    >>> load_pickle_data(io.BytesIO(pickle.dumps(Payload())), lambda module, name: False)
    Traceback (most recent call last):
    ...
    minddp.runtime.untrusted.NotData: it names builtins.print, which a data file never needs
    >>> load_pickle_data(io.BytesIO(pickle.dumps({"step": 3, "losses": [0.5]})), lambda module, name: False)
    {'step': 3, 'losses': [0.5]}
"""

from __future__ import annotations

import pickle
import re
from typing import IO, Any, Callable

import torch

from minddp.runtime import compat


class NotData(ValueError):
    """A file that asks to run code (or holds what no data file holds); ``str()`` says what, in one line."""


def refusal(path: str, exc: NotData, fix: str) -> str:
    """The one line for ``path`` refused because of ``exc``, ending with ``fix``."""
    return f"{path!r} was refused unread (nothing in it ran): {exc}; {fix}"


def load_torch_data(source: str | IO[bytes]) -> Any:
    """What ``torch.save`` wrote to ``source`` (a path or a binary file), on the CPU, read as data only.

    A refusal of torch's data-only reader is told by where it was raised (:func:`~minddp.runtime.compat.
    weights_only_refusal`), not by its wording, which torch may change; any other error is a damaged file's.
    """
    try:
        return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = compat.weights_only_refusal(exc)
        if refused is None:  # not torch's data-only refusal: a damaged file
            raise
        raise NotData(f"it {_refused(str(refused))}, which a data file never needs") from None


def _refused(message: str) -> str:
    """What torch's data-only reader refused, from its message (only to name it): ``names builtins.open``."""
    found = re.search(r"GLOBAL ([\w.]+)", message)  # "Unsupported global: GLOBAL x.y", "... GLOBAL x.y whose ..."
    if found:
        return f"names {found.group(1)}"
    first = (message.strip().splitlines() or ["see torch.load"])[0][:200]
    return f"holds what torch's data-only reader refuses ({first})"


def load_pickle_data(file: IO[bytes], allowed: Callable[[str, str], bool]) -> Any:
    """Unpickle ``file``, looking up only the globals for which ``allowed(module, name)`` is true."""
    return _DataUnpickler(file, allowed).load()


class _DataUnpickler(pickle.Unpickler):
    """Python's unpickler, with every global the file names checked first (the ``find_class`` hook)."""

    def __init__(self, file: IO[bytes], allowed: Callable[[str, str], bool]):
        super().__init__(file)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if not self._allowed(module, name):
            raise NotData(f"it names {module}.{name}, which a data file never needs")
        return super().find_class(module, name)
