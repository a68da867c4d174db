"""Notebook 09's look at one profiled step by autograd node: whether a gradient node ended after each hand-over.

Autograd records one ``autograd::engine::evaluate_function: <node>`` range per node it runs. Notebook 09
splits them in two: a parameter's ``AccumulateGrad`` node (where the reducer's hook marks its gradient ready and,
once a bucket's last one is, hands the bucket over, ``c10d::allreduce_``), and every other node, a *gradient
node*; a compiled piece's gradient node is ``CompiledFunctionBackward``. :func:`node_view` reads one
``train_step`` under :func:`minddp.analysis.live.profiler` that way, on top of
:func:`~minddp.analysis.live.step_view`; :func:`picture` draws the three runs' backward passes, each scaled to its
own length (:func:`in_percent`), with the gradient nodes and the ``AccumulateGrad`` nodes as bars and the handovers
as ticks (each ``AccumulateGrad`` node edged dark, so the shortest show); :func:`bucket_names`,
:func:`node_names`, :func:`parameter_bytes`, :func:`compiled_pieces` and :func:`refusal` keep the notebook's
plumbing out of its cells.

Example (one rank here; notebook 09 runs it on every rank): two layers of 0.25 MiB, a bucket each::

    >>> from minddp import DistributedDataParallel
    >>> from minddp.ladder.loop import train_step
    >>> layers = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    >>> ddp = DistributedDataParallel(layers, bucket_cap_mb=0.25)
    >>> optimizer, batch = torch.optim.SGD(ddp.parameters(), lr=0.1), [torch.ones(8, 256)]
    >>> def loss_fn(model, x):
    ...     return model(x).square().mean()
    >>> for _ in range(2):                                # warm-up: the bucket plan is rebuilt after the first
    ...     _ = train_step(ddp, optimizer, batch, loss_fn)
    >>> with live.profiler() as prof:
    ...     _ = train_step(ddp, optimizer, batch, loss_fn)
    >>> view = node_view(prof)
    >>> view["calls"], view["inside_accumulate"]           # each bucket handed over inside an AccumulateGrad node
    (2, [True, True])
    >>> view["node_after_handover"]    # the first layer's backward ended after the first bucket, no node after the last
    [True, False]
"""

from __future__ import annotations

import os
import traceback

import torch

from minddp.analysis import live
from minddp.runtime import compat

NODE = "autograd::engine::evaluate_function"  #: one range per autograd node run
PIECE = f"{NODE}: CompiledFunctionBackward"  #: the gradient node of one compiled piece


def node_view(prof, drawn: set[str] | None = None) -> dict:
    """:func:`~minddp.analysis.live.step_view` of one profiled step, with, from the same events:

    * ``row``: the step's backward pass alone, from its first node's start (0 ms) to its last node's ``end``: one
      ``backward`` bar per gradient node named in ``drawn`` (every one if ``None``; the notebook passes the model's,
      :func:`node_names`, leaving out the loss's), one ``sent`` tick per handover and, under ``accumulate``, one
      span per ``AccumulateGrad`` node, nothing else (no forward, optimizer step or gloo range): the notebook reads
      the order of handovers and gradient nodes;
    * ``node_after_handover``: for each handover, in order, whether a gradient node ended after it (was still
      running then, or began after);
    * ``inside_accumulate``: for each handover, whether it fell inside an ``AccumulateGrad`` node's range;
    * ``pieces_run``: how many compiled pieces' gradient nodes ran; ``pieces_ended_at_handover`` and
      ``pieces_begun_at_handover``: for each handover, how many of them had ended, and begun, by then.
    """
    events = compat.profiler_events(prof)
    view = live.step_view(prof)
    handovers = sorted(e.time_range.start for e in events if e.name == live.CALL)  # when each bucket went to gloo
    ran = [e for e in events if e.name.startswith(NODE)]
    t0 = min(e.time_range.start for e in ran)  # the row's zero: the backward pass's first node starts
    accumulate = [e for e in ran if "AccumulateGrad" in e.name]
    nodes = [e for e in ran if "AccumulateGrad" not in e.name]  # gradient nodes
    pieces = [e for e in nodes if e.name == PIECE]

    def ms(picked) -> list[tuple[float, float]]:
        return sorted(((e.time_range.start - t0) / 1e3, (e.time_range.end - t0) / 1e3) for e in picked)

    view["node_after_handover"] = [any(e.time_range.end > t for e in nodes) for t in handovers]
    view["inside_accumulate"] = [
        any(e.time_range.start <= t <= e.time_range.end for e in accumulate) for t in handovers
    ]
    view["pieces_run"] = len(pieces)
    view["pieces_ended_at_handover"] = [sum(e.time_range.end <= t for e in pieces) for t in handovers]
    view["pieces_begun_at_handover"] = [sum(e.time_range.start <= t for e in pieces) for t in handovers]
    end = (max(e.time_range.end for e in ran) - t0) / 1e3  # the backward pass's last node ends
    sent = [(t - t0) / 1e3 for t in handovers]
    bars = [e for e in nodes if drawn is None or e.name.split(": ", 1)[1] in drawn]
    view["row"].update(forward=[], backward=ms(bars), optimizer=[], finish=[], messages=[], sent=sent, end=end)
    view["row"]["accumulate"] = ms(accumulate)
    return view


def node_names(output) -> set[str]:
    """The names of the gradient nodes autograd reaches from ``output`` (every node but the ``AccumulateGrad`` ones):
    a model's output, those its forward records, without the loss's.

    >>> sorted(node_names(torch.nn.Linear(2, 2)(torch.ones(1, 2)).relu()))
    ['AddmmBackward0', 'ReluBackward0', 'TBackward0']
    """
    names, todo = set(), [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and not hasattr(node, "variable"):  # an AccumulateGrad node holds its parameter
            names.add(node.name())
            todo += [n for n, _ in node.next_functions]
    return names


def bucket_names(ddp) -> list[list[str]]:
    """``ddp``'s buckets (its ``bucket_plan``), each as its parameters' names in the model, in the bucket's order
    (a compiled model's names lose the prefix ``torch.compile``'s wrapper puts before them:
    :func:`~minddp.runtime.compat.uncompiled_name`)."""
    return [[compat.uncompiled_name(ddp.reducer.names[i]) for i in bucket] for bucket in ddp.bucket_plan]


def parameter_bytes(module) -> dict[str, int]:
    """Each parameter's size in bytes, by its name in the model: a compiled model's names lose the prefix
    ``torch.compile``'s wrapper puts before them (:func:`~minddp.runtime.compat.uncompiled_name`), so they match
    :func:`bucket_names` and :func:`compiled_pieces`."""
    return {compat.uncompiled_name(n): p.numel() * p.element_size() for n, p in module.named_parameters()}


def compiled_pieces(output, module) -> list[list[str]]:
    """The compiled pieces that autograd reached from ``output`` records, in the order backward runs them, each as
    the names in ``module`` of the parameters whose gradients it produces (in the forward's order).

    Each piece records one ``CompiledFunctionBackward`` node; its parameters' ``AccumulateGrad`` nodes (the ones
    with a ``variable``) hang off it, and the earlier piece's node is the other node it leads to."""
    names = {id(p): compat.uncompiled_name(n) for n, p in module.named_parameters()}
    found, node = [], output.grad_fn
    while node is not None:
        if "CompiledFunction" in node.name():
            found.append([names[id(n.variable)] for n, _ in node.next_functions if hasattr(n, "variable")])
        earlier = [n for n, _ in node.next_functions if n is not None and not hasattr(n, "variable")]
        node = earlier[0] if earlier else None
    return found


def raised_in(error: BaseException) -> str:
    """The file that raised ``error``, said from the folder that holds ``torch`` (a path that begins ``torch/``)."""
    root = os.path.dirname(os.path.dirname(torch.__file__))
    return os.path.relpath(traceback.extract_tb(error.__traceback__)[-1].filename, root)


def refusal(error: BaseException) -> str:
    """What torch raised, in one line: its type, its message's first line, and the file that raised it
    (:func:`raised_in`)."""
    return f"{type(error).__name__}: {str(error).strip().splitlines()[0]} (raised in {raised_in(error)})"


#: the library's legend words (minddp.analysis.timeline) -> notebook 09's
WORDS = {"backward": "the model's gradient nodes", "handed to the wire": "a bucket handed over"}
#: the pale bar's legend: the whole pass, seen where no bar is drawn
PALE = "the rest of the backward pass"
#: the ``AccumulateGrad`` nodes' bars: their legend and colour (a green no other bar of the figure has), and the darker
#: green of each bar's edge, so that a node too short to fill a pixel still shows as a line
ACCUMULATE, ACCUMULATE_COLOR, ACCUMULATE_EDGE = "the AccumulateGrad nodes", "#74c476", "#238b45"


def in_percent(row: dict) -> dict:
    """``row`` (a :func:`node_view`'s) with every time as a percentage of its backward pass, from its first node's
    start (0) to its last node's ``end`` (100): passes of different lengths then end together, and show only the
    order of events."""
    scale = 100 / row["end"]
    return dict(row, backward=[(s * scale, e * scale) for s, e in row["backward"]],
                accumulate=[(s * scale, e * scale) for s, e in row.get("accumulate", [])],
                sent=[t * scale for t in row["sent"]], end=100.0)  # fmt: skip


def picture(looks: dict, title: str):
    """The rows of ``looks`` (each a :func:`node_view`), each scaled to its own backward pass (:func:`in_percent`),
    as :func:`minddp.notebook.lesson.picture` draws them, over a pale bar for the whole pass and without the line
    where a step ends, with each row's ``accumulate`` spans as :data:`ACCUMULATE` bars and the legend in
    :data:`PALE`, :data:`WORDS` and :data:`ACCUMULATE`. Rank 0 draws; the others get ``None``."""
    from minddp.analysis.timeline import legend_above
    from minddp.notebook import lesson

    looks = {label: {"row": in_percent(look["row"])} for label, look in looks.items()}
    figure = lesson.picture(looks, "", rows=list(looks), title=title)
    if figure is None:
        return None
    ax = figure.axes[0]
    for line in [line for line in ax.get_lines() if line.get_label() == "step ends"]:
        line.remove()  # each pass ends at 100: the pale bar's end
    for y, look in enumerate(looks.values()):
        ax.broken_barh([(0, 100)], (y - 0.40, 0.40), facecolors="#e6e6e6", zorder=0.5, label=PALE)
        spans = [(s, e - s) for s, e in look["row"]["accumulate"]]
        ax.broken_barh(
            spans, (y - 0.40, 0.40), facecolors=ACCUMULATE_COLOR, edgecolors=ACCUMULATE_EDGE, linewidth=0.8,
            label=ACCUMULATE,
        )  # fmt: skip
    ax.set_xlabel("% of the row's backward pass, from its first node's start to its last node's end", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    named = {WORDS.get(label, label): h for label, h in zip(labels, handles) if not label.startswith("_")}
    order = [PALE, WORDS["backward"], ACCUMULATE, WORDS["handed to the wire"]]
    legend_above(ax, {key: named[key] for key in order if key in named}, len(order))
    return figure
