"""One persistent rank of a notebook cluster: wait for a cell, run it, report, repeat.

:func:`minddp.runtime.launch.launch` runs one function per rank and ends the ranks; a notebook needs
ranks that *stay*, so that ``model`` built in one cell is still there in the next. Each worker:

1. joins the default process group (:func:`minddp.runtime.launch.join_group`) and fills a namespace
   with ``torch``, ``dist``, ``rank``, ``world_size`` and ``device``;
2. waits on its own queue for a cell, a request to destroy or rebuild its group, or the order to stop;
3. runs a cell (:func:`run_cell`: output captured and passed on live, a trailing expression
   evaluated, figures rendered to PNG);
4. sends one report back, the exception included, and goes back to step 2.

A watchdog thread ends it when the process that started the cluster is gone.
``notebooks/README.md`` (*How the notebooks run*) tells the whole cycle.

Example::

    >>> # started by minddp.notebook.Cluster; a cell reaches it as
    >>> run_cell("x = rank * 10\\nx + 1", {"rank": 0}, "<In [3], rank 0>")["value_repr"]
    '1'
"""

from __future__ import annotations

import ast
import contextlib
import io
import linecache
import os
import pickle
import signal
import sys
import threading
import traceback
from typing import Any, Callable

from minddp.runtime.processes import HELPER_BLOCKED, Outbox, watch_parent

#: The names the runner puts in every rank's namespace before any cell runs, and the modules among them.
RUNNER_NAMES = ("torch", "dist", "rank", "world_size", "device")
RUNNER_MODULES = {"torch": "torch", "dist": "torch.distributed"}

#: matplotlib backend for ranks: draws off-screen; ``plt.show()`` keeps the figure for the report.
MPL_BACKEND = "module://minddp.notebook.mpl_backend"


def worker_main(rank, world_size, port, placement, timeout_s, parent_pid, parent_path, commands, reports, interfaces):
    """Steps 1-4 for one rank; ``commands`` is this rank's queue, ``reports`` its pipe to the kernel
    (:meth:`~minddp.runtime.processes.ChildPipes.mailbox`); ``interfaces``: the kernel's
    :func:`~minddp.runtime.loopback.rank_env`."""
    reports = Outbox(reports)
    sys.path[:] = parent_path
    os.environ["MPLBACKEND"] = MPL_BACKEND  # before any cell imports matplotlib
    watch_parent(parent_pid, exit_code=0)
    running = threading.Event()
    # Jupyter's "interrupt" (and the parent's release step) sends SIGINT: it
    # should stop a running cell, never the idle worker.
    signal.signal(signal.SIGINT, lambda *_: _interrupt(running))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELPER_BLOCKED)  # the process server's mask (rank_context)

    import torch
    import torch.distributed as dist

    from minddp.runtime.launch import join_group, leave_group

    # Step 1: join and prepare the namespace the cells see.
    generation = 0
    try:
        join_group(rank, world_size, port, placement, timeout_s, prefix=f"nb{generation}/", interfaces=interfaces)
    except BaseException:  # noqa: BLE001 - the parent must hear why the rank never came up
        reports.put(("failed", rank, os.getpid(), traceback.format_exc()))
        return
    given = (torch, dist, rank, world_size, placement.device(rank))
    namespace: dict[str, Any] = {"__name__": "__main__", **dict(zip(RUNNER_NAMES, given, strict=True))}
    reports.put(("ready", rank, os.getpid(), None))

    while True:
        # Step 2: the next command.
        kind, cell_id, body = commands.get()
        if kind == "stop":
            break
        if kind == "abort":
            # Closing this rank's connections makes every peer blocked in a
            # collective with it fail at once ("Connection closed by peer").
            leave_group()
            reports.put(("aborted", rank, cell_id, None))
        elif kind == "regroup":
            generation = cell_id
            try:
                leave_group()
                join_group(rank, world_size, port, placement, timeout_s, prefix=f"nb{generation}/")
                reports.put(("regrouped", rank, cell_id, None))
            except BaseException:  # noqa: BLE001
                reports.put(("regrouped", rank, cell_id, traceback.format_exc()))
        elif kind == "run":
            # Steps 3 and 4.
            running.set()

            def send(stream: str, text: str, cell_id=cell_id) -> None:  # live output, as it is printed
                reports.put(("stream", rank, cell_id, stream, text))

            body, name = body  # name: the notebook's "In [N]" (or "cell N"), so a traceback names a cell one can find
            try:
                report = run_cell(body, namespace, f"<{name}, rank {rank}>", send)
            finally:
                running.clear()
            reports.put(("done", rank, cell_id, report))
    leave_group()


class _Tee(io.StringIO):
    """Captures what is written (for the report) and hands it to ``send`` as well, a line at a time.

    ``print`` writes a line in pieces (each argument, the separators, the
    newline); sending each piece would make one message per word, so text is
    passed on when a newline arrives or on ``flush()``.
    """

    def __init__(self, send: Callable[[str], None]):
        super().__init__()
        self._send, self._pending = send, ""

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in text:
            self.flush()
        return super().write(text)

    def flush(self) -> None:
        if self._pending:
            self._send(self._pending)
            self._pending = ""


def run_cell(body: Any, namespace: dict, filename: str, send: Callable[[str, str], None] | None = None) -> dict:
    """Step 3: run code (a string) or a pickled call, capture everything a notebook would show.

    With ``send``, every write to stdout/stderr also goes out at once as
    ``send("stdout" | "stderr", text)``, so a long cell can be followed live;
    the report still holds the complete output.
    """
    if send is None:
        out, err = io.StringIO(), io.StringIO()
    else:
        out, err = _Tee(lambda t: send("stdout", t)), _Tee(lambda t: send("stderr", t))
    report: dict[str, Any] = {
        "stdout": "",
        "stderr": "",
        "value": None,
        "value_repr": None,
        "figures": [],
        "error": None,
        "exc_type": None,
    }
    value = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if isinstance(body, str):
                value = _exec_source(body, namespace, filename)
            else:
                fn, args, kwargs = pickle.loads(body)
                filename = None
                value = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - a cell's failure is a report, not a crash
        report["error"] = _format_exception(exc, filename)
        report["exc_type"] = type(exc).__name__
    out.flush(), err.flush()  # a last line without a newline still reaches the live view
    report["stdout"], report["stderr"] = out.getvalue(), err.getvalue()
    report["figures"] = _collect_figures()
    if value is not None:
        report["value_repr"] = _safe_repr(value)
        report["value"] = _to_bytes(value)
    return report


def _exec_source(source: str, namespace: dict, filename: str) -> Any:
    """Run the cell; like a notebook, a final bare expression is the cell's value."""
    # Register the source so tracebacks can quote the failing line.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename=filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def _format_exception(exc: BaseException, filename: str | None) -> str:
    """The traceback from the cell's first frame on: the worker's own frames teach nothing."""
    tb = exc.__traceback__
    if filename is not None:
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
    if tb is None:  # a SyntaxError happens before any cell frame exists
        tb = exc.__traceback__ if filename is None else None
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _collect_figures() -> list[bytes]:
    """Every open matplotlib figure as PNG bytes, then closed (a figure shows once, like inline)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    pngs = []
    for num in plt.get_fignums():
        buf = io.BytesIO()
        plt.figure(num).savefig(buf, format="png", bbox_inches="tight")
        pngs.append(buf.getvalue())
    plt.close("all")
    return pngs


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # noqa: BLE001
        return f"<repr failed: {type(exc).__name__}: {exc}>"


def _to_bytes(value: Any) -> bytes | None:
    """The value itself for the Python API, or None when it cannot leave the process."""
    import torch

    buf = io.BytesIO()
    try:
        torch.save(value, buf)  # tensors as bytes, not shared memory that dies with the rank
    except Exception:  # noqa: BLE001 - e.g. a generator: the repr still shows it
        return None
    return buf.getvalue()


def _interrupt(running: threading.Event) -> None:
    if running.is_set():
        raise KeyboardInterrupt
