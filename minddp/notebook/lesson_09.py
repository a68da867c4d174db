"""Notebook 09's plumbing for its last section (*A bucket cap of 0.5 MiB*): one compiled training step, in a line.

:func:`compile_at` wraps a model in a DDP (torch's or minddp's), compiles it with either pattern (the model
first, nanoGPT's, or ``torch.compile(wrapper)``), trains one step and says what happened: the refusal torch
raised, or whether the step trained to eager's bits, its buckets, Dynamo's count of graph breaks and the compiled
pieces of one more forward, each bucket and piece in brackets. :func:`flat` is the bit-for-bit comparison's
vector; :func:`untraced_calls` says where Dynamo broke a graph, and why. The notebook keeps its claims in its cells;
these only compute and print. The notebook's other plumbing (its step's autograd nodes, the figure) is
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
    >>> print(compile_at(DistributedDataParallel, two_layers(), True, batch, loss_fn, cap, "aot_eager", flat(eager)))
    trained a step to eager ddp's bits; the step's 1 bucket: [0.weight, 1.weight]; graph breaks: 0;
    one more forward's 2 pieces: [1.weight], [0.weight]
"""

from __future__ import annotations

import re

import torch

from minddp.ladder.loop import train_step
from minddp.notebook import nodes
from minddp.runtime.compat import dynamo_reset, graph_breaks


def flat(model) -> torch.Tensor:
    """Every parameter of ``model`` in one vector, to compare two trainings bit for bit."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def untraced_calls(reasons: dict) -> str:
    """The calls at which Dynamo broke a graph, in a line: ``reasons`` is Dynamo's counter of graph-break reasons
    (its ``counters["graph_break"]``: reason -> breaks); each reason as the call it names (``Class.method``), then
    Dynamo's reason in brief (the reason's first line), then its count.

    >>> untraced_calls({"Unsupported method call\\n  Explanation: ... method `log` of class `Logger`": 1, "Other": 2})
    'Logger.log (Unsupported method call) 1, Other 2'
    """

    def call(reason: str) -> str:
        brief = reason.strip().splitlines()[0]
        named = re.search(r"(?:method|function) `([^`]+)`(?: of class `([^`]+)`)?", reason)
        if named is None:
            return brief
        return f"{f'{named[2]}.{named[1]}' if named[2] else named[1]} ({brief})"

    return ", ".join(f"{call(reason)} {count}" for reason, count in reasons.items())


def compile_at(wrapper, model, model_first: bool, batch, loss_fn, cap: float, backend: str, reference) -> str:
    """One SGD training step (lr 0.01) of ``model`` in ``wrapper`` (a DDP class, given ``bucket_cap_mb=cap``),
    compiled with ``backend``: the model first, then wrapped (``model_first``), or ``torch.compile(wrapper)``.

    Returns, in a line, what torch raised (:func:`~minddp.notebook.nodes.refusal`), or: whether the step trained
    to the bits of ``reference`` (:func:`flat` of eager ddp after the same step), the step's buckets
    (:func:`~minddp.notebook.nodes.bucket_names`), Dynamo's count of graph breaks in the step, then the compiled
    pieces of one more forward (:func:`~minddp.notebook.nodes.compiled_pieces`; under ``no_sync()``, its backward
    never runs), each as its parameters' names, in the order backward would run them."""
    dynamo_reset()
    if model_first:
        wrapped = ddp = wrapper(torch.compile(model, backend=backend), bucket_cap_mb=cap)
    else:
        ddp = wrapper(model, bucket_cap_mb=cap)
        wrapped = torch.compile(ddp, backend=backend)
    try:
        train_step(wrapped, torch.optim.SGD(model.parameters(), lr=0.01), batch, loss_fn)
    except Exception as error:  # what torch raises, said in one line, with the file of torch's that raised it
        return nodes.refusal(error)
    bits = "to eager ddp's bits" if torch.equal(flat(model), reference) else "to bits that differ from eager's"
    step_buckets = nodes.bucket_names(ddp)  # a first step's plan
    breaks = graph_breaks()
    with wrapped.no_sync():  # a forward whose backward never runs, to walk its pieces
        pieces = nodes.compiled_pieces(wrapped(torch.randn_like(batch[0])), model)
    return (
        f"trained a step {bits}; the step's {_counted(step_buckets, 'bucket')}; graph breaks: {breaks}; "
        f"one more forward's {_counted(pieces, 'piece')}"
    )


def _counted(groups: list[list[str]], noun: str) -> str:
    """``groups`` of names counted and listed, each in brackets: ``2 pieces: [a], [b]``."""
    return f"{len(groups)} {noun}{'s' * (len(groups) != 1)}: " + ", ".join(f"[{', '.join(g)}]" for g in groups)
