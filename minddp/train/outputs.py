"""A run's outputs, checked before any rank starts: each path can be written, and the disk has room.

A run that trains for an hour and then cannot write its results has lost the
hour. So before any rank starts, for every output the run will write
(the trace folder, the checkpoint folder, the summary file):

1. **the path**: an existing folder, or one that can be created (no file in
   the way, on the path or at its end); a file path whose folder can be made;
2. **writable**: a small probe file is created and removed in the folder (or
   its nearest existing parent). This asks the file system itself, so a
   read-only mount or a quota counts, and so does root's exemption from
   permission bits (root *can* write there);
3. **room**: what the run will write is estimated (:func:`trace_bytes`,
   :func:`checkpoint_bytes`) and summed per file system; when it exceeds the
   free space the run is refused, naming both figures and what to change.

Every refusal is one line (a :class:`~minddp.runtime.cli.UsageError`: exit 2).

Example::

    >>> import os, tempfile
    >>> run = tempfile.mkdtemp()
    >>> plan = Outputs()
    >>> plan.folder("--trace-dir", os.path.join(run, "traces"), need=1000)    # bytes the traces will take
    >>> plan.file("--summary-json", os.path.join(run, "out", "summary.json"))
    >>> plan.check_room()                     # raises, naming the option, if a place cannot take it
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

from minddp.runtime.cli import UsageError

MIB = 2**20


def free_bytes(folder: str) -> int:
    """Bytes an unprivileged writer may still use on ``folder``'s file system."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def _existing_parent(path: str) -> str:
    """The nearest part of ``path`` that exists (``path`` itself if it does)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _probe(folder: str) -> str | None:
    """Create and remove a file in ``folder``; the OS's reason if that fails, else None."""
    try:
        fd, name = tempfile.mkstemp(prefix=".minddp-write-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    os.remove(name)
    return None


@dataclass
class Outputs:
    """Steps 1-3 for one run: add each output with :meth:`folder` / :meth:`file`, then :meth:`check_room`."""

    needs: list[tuple[str, str, int]] = field(default_factory=list)  # (flag, existing folder, bytes)

    def folder(self, flag: str, path: str, need: int = 0, shown: str | None = None) -> None:
        """``path`` is (or can become) a writable folder; ``need`` bytes will be written into it.

        ``shown``: the path the user gave, when ``path`` is the folder of a file they named.
        """
        shown = path if shown is None else shown
        if os.path.exists(path) and not os.path.isdir(path) and shown == path:
            raise UsageError(f"{flag} {path!r} is a file, not a folder; give a folder path (or move the file away)")
        base = _existing_parent(path)
        if not os.path.isdir(base):
            raise UsageError(
                f"{flag} {shown!r} cannot be created: {base!r} is a file, not a folder; give a path under a folder"
            )
        why = _probe(base)
        if why is not None:
            where = "" if base == os.path.abspath(shown) else f" (its existing parent {base!r})"
            raise UsageError(f"{flag} {shown!r}{where} is not writable ({why}); give a path you can write to")
        self.needs.append((flag, base, need))

    def file(self, flag: str, path: str, need: int = 64 * 1024) -> None:
        """``path`` is (or can become) a writable file."""
        if os.path.isdir(path):
            raise UsageError(
                f"{flag} {path!r} is a folder; give a file path (e.g. {os.path.join(path, 'summary.json')!r})"
            )
        self.folder(flag, os.path.dirname(path) or ".", need, shown=path)
        if os.path.exists(path):
            try:
                with open(path, "ab"):  # opens for writing without changing a byte
                    pass
            except OSError as exc:
                raise UsageError(
                    f"{flag} {path!r} is not writable ({exc.strerror or exc}); give another file"
                ) from None

    def check_room(self) -> None:
        """Step 3: per file system, the estimated bytes fit in the free space (else one line: figures and fixes)."""
        by_device: dict[int, list[tuple[str, str, int]]] = {}
        for flag, base, need in self.needs:
            by_device.setdefault(os.stat(base).st_dev, []).append((flag, base, need))
        for entries in by_device.values():
            need = sum(n for _, _, n in entries)
            free = free_bytes(entries[0][1])
            if need > free:
                flags = " and ".join(dict.fromkeys(f for f, _, n in entries if n))
                raise UsageError(
                    f"not enough free space: {flags} will need about {need / MIB:.1f} MiB on the file "
                    f"system of {entries[0][1]!r}, which has {free / MIB:.1f} MiB free; free some space, "
                    "write elsewhere, or write less (--profile-steps, --no-profile, --save-every 0)"
                )


# -- estimates ---------------------------------------------------------------------------------------

#: Trace bytes per parameter tensor: per profiled step, and per micro-batch of it (uncompressed JSON, CPU).
#: Measured on tiny-llama and small-llama (bucket-async, 5 profiled steps): 25-28 kB and 53-58 kB.
TRACE_BYTES_PER_TENSOR_STEP = 28_000
TRACE_BYTES_PER_TENSOR_MICRO = 58_000
#: gzip shrinks a trace at least this much (measured: 18x on tiny-llama); GPU traces hold kernels too (~2x the events).
GZIP_RATIO, GPU_FACTOR = 12, 2


def trace_bytes(tensors: int, profiled_steps: int, grad_accum: int, gzip: bool, gpu: bool = False) -> tuple[int, int]:
    """One rank's trace of one stage: ``(bytes it keeps, bytes while it is written)``.

    A gzipped trace is first written whole, then compressed beside it.
    """
    raw = profiled_steps * tensors * (TRACE_BYTES_PER_TENSOR_STEP + grad_accum * TRACE_BYTES_PER_TENSOR_MICRO)
    raw *= GPU_FACTOR if gpu else 1
    kept = raw // GZIP_RATIO if gzip else raw
    return kept, raw + kept if gzip else raw


def checkpoint_bytes(param_bytes: int, ranks: int, powersgd: bool) -> int:
    """One checkpoint file: the model, AdamW's two moments, and each rank's PowerSGD error memory if any."""
    return 3 * param_bytes + (ranks * param_bytes if powersgd else 0) + ranks * 64 * 1024
