"""Notebook 09's plumbing for its last section (*A bucket cap of 0.5 MiB*): one compiled training step, in a line.

:func:`compile_at` builds a model wrapped in a DDP (torch's or minddp's) and compiled with either pattern (the model
first, nanoGPT's, or ``torch.compile(wrapper)``; the notebook's cell writes each out), trains one step and says what
happened: the refusal torch raised, or Dynamo's count of graph breaks in the step and the compiled pieces of one more
forward, each piece in brackets; with the line, how far the trained parameters lie from eager ddp's.
:func:`flat` is that comparison's vector, :func:`rounding_bound` the distance a change in the order of a sum's rounding
can explain; :func:`third_step` runs each of the figure's runs. The notebook keeps its claims in its cells; these
only compute and print. The notebook's other plumbing (its step's autograd nodes, the figure) is
:mod:`minddp.notebook.nodes`.

Example (one rank here; notebook 09 runs it on every rank): two layers of 16 KiB, a cap below one layer, so
one compiled piece per layer::

    >>> from minddp import DistributedDataParallel
    >>> from minddp.ladder.loop import train_step
    >>> def two_layers():
    ...     torch.manual_seed(0)
    ...     return torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 64, bias=False))
    >>> def loss_fn(model, x):
    ...     return model(x).square().mean()
    >>> batch, cap = [torch.ones(8, 64)], 0.01
    >>> eager = two_layers()
    >>> _ = train_step(DistributedDataParallel(eager, bucket_cap_mb=cap), torch.optim.SGD(eager.parameters(), lr=0.01),
    ...                batch, loss_fn)
    >>> def build(model):  # the model compiled, then wrapped
    ...     return DistributedDataParallel(torch.compile(model, backend="aot_eager"), bucket_cap_mb=cap)
    >>> line, apart = compile_at(build, two_layers(), batch, loss_fn, flat(eager))
    >>> print(line)
    trained a step; graph breaks: 0; one more forward's 2 pieces: [1.weight], [0.weight]
    >>> moved = (flat(eager) - flat(two_layers())).abs().max().item()  # the step's largest move, lr·max|g|
    >>> apart <= rounding_bound([moved], flat(eager).abs().max().item(), k=2 * 2 * 64 + 8)
    True
"""

from __future__ import annotations

import contextlib

import torch

from minddp.analysis import live
from minddp.ladder.loop import train_step
from minddp.notebook import nodes
from minddp.runtime.compat import dynamo_reset, graph_breaks


def third_step(ddp, model, data, loss_fn) -> dict:
    """Three SGD steps (lr 0.01) of ``ddp``, which wraps ``model`` (compiled or not), on ``data``'s next batches: the
    first compiles (a compiled model), the second rebuilds the buckets, the third is profiled. Returns the third's
    :func:`~minddp.notebook.nodes.node_view`, its bars the model's gradient nodes
    (:func:`~minddp.notebook.nodes.node_names` of one more forward), with ``buckets``
    (:func:`~minddp.notebook.nodes.bucket_names`), ``params`` (:func:`flat`, after the steps) and ``moved`` (each
    step's largest parameter move, lr·max|g|, for :func:`rounding_bound`)."""
    optimizer, moved = torch.optim.SGD(model.parameters(), lr=0.01), []
    for step in range(3):
        before, batch = flat(model), next(data)
        with live.profiler() if step == 2 else contextlib.nullcontext() as prof:
            train_step(ddp, optimizer, batch, loss_fn)
        moved.append((flat(model) - before).abs().max().item())
    with ddp.no_sync():  # a forward whose backward never runs: the names of the nodes the model records
        drawn = nodes.node_names(ddp(torch.randn_like(batch[0])))
    view = nodes.node_view(prof, drawn)
    view.update(buckets=nodes.bucket_names(ddp), params=flat(model), moved=moved)
    return view


def flat(model) -> torch.Tensor:
    """Every parameter of ``model`` in one vector, to compare two trainings."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def rounding_bound(moved: list[float], largest: float, k: int) -> float:
    """How far apart two float32 SGD trainings of the same model on the same data may end when they differ only in
    the order their sums round in (another BLAS layout of the same GEMM): ``moved`` holds each step's largest
    parameter move (lr·max|g|), ``largest`` the largest |parameter|, ``k`` the terms summed behind a
    weight's gradient (at most ``width`` a layer forward and ``width`` backward, then the batch's rows: for an MLP,
    ``k = 2 * depth * width + rows``).

    Each add rounds by at most 2⁻²⁴ of its size, so reordering a sum of ``k`` terms moves a gradient by up to
    about ``k``·2⁻²⁴ of the largest, and its step by that share of the step's move; the update ``p - lr·g`` then
    rounds once more, by up to 2⁻²⁴·|p|. Summed over the steps:

    >>> rounding_bound([1e-3, 1e-3], 0.5, k=2**10) == 2 * (2**10 * 2**-24 * 1e-3 + 2**-24 * 0.5)
    True
    """
    return sum(k * 2**-24 * m + 2**-24 * largest for m in moved)


def compile_at(build, model, batch, loss_fn, reference) -> tuple[str, float | None]:
    """One SGD training step (lr 0.01) of ``build(model)``: ``model`` wrapped in a DDP and compiled, the model
    first (``wrapper(torch.compile(model))``) or the wrapper (``torch.compile(wrapper(model))``).

    Returns a line and a distance. The line says what torch raised (:func:`~minddp.notebook.nodes.refusal`; the
    distance is then ``None``), or Dynamo's count of graph breaks in the step, then the compiled pieces of one more
    forward (:func:`~minddp.notebook.nodes.compiled_pieces`; under ``no_sync()``, its backward never runs), each as
    its parameters' names, in the order backward would run them. The distance is the largest |difference| between
    the trained parameters and ``reference`` (:func:`flat` of eager ddp after the same step), 0.0 when they
    agree to the bit."""
    dynamo_reset()
    wrapped = build(model)
    try:
        train_step(wrapped, torch.optim.SGD(model.parameters(), lr=0.01), batch, loss_fn)
    except Exception as error:  # what torch raises, said in one line, with the file of torch's that raised it
        return nodes.refusal(error), None
    apart = (flat(model) - reference).abs().max().item()
    breaks = graph_breaks()
    with wrapped.no_sync():  # a forward whose backward never runs, to walk its pieces
        pieces = nodes.compiled_pieces(wrapped(torch.randn_like(batch[0])), model)
    line = (
        f"trained a step; graph breaks: {breaks}; one more forward's {len(pieces)} piece{'s' * (len(pieces) != 1)}: "
        + ", ".join(f"[{', '.join(piece)}]" for piece in pieces)
    )
    return line, apart
