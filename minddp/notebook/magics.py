"""IPython magics that run notebook cells on persistent ranks, in the style of nbdistributed.

::

    %load_ext minddp.notebook
    %dist_init --world-size 2          # start the ranks (gloo on CPU, NCCL on GPUs)
    %%distributed                      # this cell runs on every rank
    %%rank 0                           # ... only on rank 0 (also: %%rank [0,1])
    %dist_status                       # ranks, pids, backend
    %dist_mode on                      # every following cell runs on the ranks (magics stay local)
    %dist_shutdown                     # stop the ranks (also done when the kernel stops)

Each rank's namespace starts with ``torch``, ``dist``, ``rank``,
``world_size`` and ``device``, and keeps whatever the cells define. A rank's
exception fails the cell with that rank's traceback; ranks stuck waiting for
it are released (see :mod:`minddp.notebook.cluster`, step 3).

Example::

    In [1]: %load_ext minddp.notebook
    In [2]: %dist_init --world-size 2
    In [3]: %%distributed
       ...: dist.get_rank(), dist.get_world_size()
    [rank 0]
    (0, 2)
    [rank 1]
    (1, 2)
"""

from __future__ import annotations

import argparse
import re
import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from minddp.notebook.cluster import Cluster
from minddp.notebook.display import LiveView, show

_cluster: Cluster | None = None
_AUTO = "--dist-mode"  # the magic line %dist_mode on puts above a plain cell (not a line of the cell)


def current_cluster() -> Cluster | None:
    """The cluster that ``%dist_init`` started in this process, if any."""
    return _cluster


def _init_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%dist_init", add_help=False, exit_on_error=False)
    parser.add_argument("-n", "--world-size", "--num-processes", dest="world_size", type=int, default=2)
    parser.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    parser.add_argument(
        "--timeout", dest="timeout_s", type=float, default=None, help="seconds before a collective gives up"
    )
    return parser


def parse_ranks(line: str) -> list[int]:
    """``"0"``, ``"[0]"``, ``"[0, 1]"``, ``"0,1"`` and ``"0 1"`` -> a list of ranks."""
    tokens = re.split(r"[\s,]+", line.strip().strip("[]").strip())
    if not tokens or tokens == [""] or not all(t.isdigit() for t in tokens):
        raise UsageError(f"%%rank needs rank numbers, e.g. %%rank 0 or %%rank [0,1]; got {line!r}")
    return [int(t) for t in tokens]


@magics_class
class DistributedMagics(Magics):
    auto = False

    @line_magic
    def dist_init(self, line: str) -> None:
        """Start ``--world-size`` ranks (default 2); restarts them if already running."""
        global _cluster
        try:
            args = _init_parser().parse_args(shlex.split(line))
        except (argparse.ArgumentError, SystemExit) as exc:
            raise UsageError(f"%dist_init [--world-size N] [--backend auto|gloo|nccl] [--timeout S]: {exc}")
        if _cluster is not None and _cluster.running:
            print(f"Stopping the running ranks (pids {_cluster.pids}) first.")
            _cluster.shutdown()
        try:
            _cluster = Cluster(args.world_size, backend=args.backend, timeout_s=args.timeout_s)
        except ValueError as exc:
            raise UsageError(str(exc))
        _cluster.start()
        print(f"Started {_cluster.world_size} ranks on {_cluster.backend} (pids {_cluster.pids}).")
        if _cluster.placement.device_type == "cuda":
            print(f"Devices: {_cluster.placement.why}.")
        print("Each rank has: torch, dist, rank, world_size, device.")
        print("Run a cell on every rank with %%distributed, on some with %%rank 0; stop with %dist_shutdown.")

    @cell_magic
    def distributed(self, line: str, cell: str) -> None:
        """Run this cell on every rank."""
        self._run(cell, None, magic_line=line.strip() != _AUTO)

    @cell_magic
    def rank(self, line: str, cell: str) -> None:
        """Run this cell on the ranks listed on the magic line, e.g. ``%%rank [0]``."""
        ranks = parse_ranks(line)
        cluster = self._require()
        if max(ranks) >= cluster.world_size:
            raise UsageError(f"%%rank {line.strip()}: this cluster has ranks 0..{cluster.world_size - 1}")
        self._run(cell, ranks)

    @line_magic
    def dist_status(self, line: str = "") -> None:
        """Which ranks run, with their pids and the backend."""
        if _cluster is None or not _cluster.running:
            print("No ranks running: start them with %dist_init --world-size 2")
            return
        print(f"{_cluster.world_size} ranks on {_cluster.backend}, restarts so far: {_cluster.restarts}")
        for rank, pid in enumerate(_cluster.pids):
            print(f"  rank {rank}: pid {pid}")

    @line_magic
    def dist_shutdown(self, line: str = "") -> None:
        """Stop the ranks this notebook started."""
        global _cluster
        if _cluster is None or not _cluster.running:
            print("No ranks running.")
            return
        pids = _cluster.pids
        _cluster.shutdown()
        print(f"Stopped {len(pids)} ranks (pids {pids}).")

    @line_magic
    def dist_mode(self, line: str = "") -> None:
        """``%dist_mode on``: every later cell runs on all ranks (cells starting with % or ! stay local)."""
        word = line.strip().lower() or ("off" if DistributedMagics.auto else "on")
        if word not in ("on", "off"):
            raise UsageError(f"%dist_mode takes on or off, got {line!r}")
        DistributedMagics.auto = word == "on"
        print(f"Distributed mode {word}: cells run {'on every rank' if DistributedMagics.auto else 'here'}.")

    def _run(self, cell: str, ranks: list[int] | None, magic_line: bool = True) -> None:
        """Run ``cell`` on ``ranks``, named as the notebook shows it: ``In [N]``, its lines counted from the
        magic's line (``%dist_mode on`` cells have none), so a traceback's ``<In [N], rank R>``, line L is
        the line a reader finds."""
        outputs = None
        name = f"In [{self.shell.execution_count}]"  # IPython numbers the running cell so, until it ends
        cell = "\n" * magic_line + cell
        # Live lines only where a front end can clear them again (a notebook, not a terminal).
        live = LiveView() if type(self.shell).__name__ == "ZMQInteractiveShell" else None
        try:
            outputs = self._require().run(cell, ranks=ranks, on_stream=live.write if live else None, name=name)
        except Exception as exc:
            outputs = getattr(exc, "outputs", None)
            if live:
                live.close()
            if outputs:
                show(outputs)  # what the ranks printed before failing, then the tracebacks
            raise
        if live:
            live.close()
        show(outputs)

    def _require(self) -> Cluster:
        if _cluster is None or not _cluster.running:
            raise UsageError("no ranks are running: start them with %dist_init --world-size 2")
        return _cluster


def _auto_transform(lines: list[str]) -> list[str]:
    """Input transformer for ``%dist_mode on``: send plain code cells to the ranks."""
    if not DistributedMagics.auto:
        return lines
    first = next((ln for ln in lines if ln.strip()), "")
    if not first or first.lstrip().startswith(("%", "!")):
        return lines
    return [f"%%distributed {_AUTO}\n", *lines]


def load_ipython_extension(ip) -> None:
    """``%load_ext minddp.notebook``."""
    ip.register_magics(DistributedMagics)
    if _auto_transform not in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.append(_auto_transform)


def unload_ipython_extension(ip) -> None:
    """``%unload_ext minddp.notebook``: stop the ranks; the magics stay registered (IPython's rule)."""
    global _cluster
    if _auto_transform in ip.input_transformers_cleanup:
        ip.input_transformers_cleanup.remove(_auto_transform)
    DistributedMagics.auto = False
    if _cluster is not None:
        _cluster.shutdown()
        _cluster = None
