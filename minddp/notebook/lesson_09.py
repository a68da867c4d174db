"""Notebook 09's plumbing for its last section (*A bucket cap of 0.5 MiB, with either pattern*).

:func:`both_patterns` builds a model wrapped in a DDP (torch's or minddp's) and compiled with each pattern
(:data:`PATTERNS`: the model first, nanoGPT's, or the wrapper), trains one step of each (:func:`compile_at`) and prints
what happened: the refusal torch raised, or Dynamo's count of graph breaks in the step and the compiled pieces of one
more forward, each piece in brackets. It returns what the notebook's claims check, with how far the trained
parameters lie from eager ddp's (:func:`flat` is that comparison's vector, :func:`rounding_bound` the distance a
change in the order of a sum's rounding can explain). :func:`third_step` runs each of the figure's runs,
:func:`layer_numbers` names their buckets' layers. The notebook keeps its claims in its cells; these only compute
and print. The notebook's other plumbing (its step's autograd nodes, the figure) is :mod:`minddp.notebook.nodes`.

Example (one rank here; notebook 09 runs it on every rank): two layers of 16 KiB, a cap below one layer, so
one compiled piece per layer::

    >>> from minddp import DistributedDataParallel
    >>> class TwoLayers(torch.nn.Module):  # a class of one's own (Dynamo skips torch's, nn.Sequential too, if on top)
    ...     def __init__(self):
    ...         super().__init__()
    ...         torch.manual_seed(0)
    ...         self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64, bias=False) for _ in range(2))
    ...     def forward(self, x):
    ...         return self.layers[1](self.layers[0](x))
    >>> def loss_fn(model, x):
    ...     return model(x).square().mean()
    >>> batch = [torch.ones(8, 64)]
    >>> ours = both_patterns("ddp", DistributedDataParallel, TwoLayers, batch, loss_fn, 0.01, "aot_eager")
    ddp, either pattern: graph breaks: 0; pieces: [layers.1.weight], [layers.0.weight]
    >>> ours["raised"], ours["breaks"], ours["pieces"], ours["apart"] <= ours["bound"]
    ([None, None], [0, 0], [2, 2], True)
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch

from minddp.analysis import live
from minddp.ddp import DistributedDataParallel
from minddp.ladder.loop import train_step
from minddp.notebook import lesson, nodes
from minddp.runtime.compat import dynamo_reset, frames_compiled, graph_breaks


def third_step(ddp, model, data, loss_fn) -> dict:
    """Three SGD steps (lr 0.01) of ``ddp``, which wraps ``model`` (compiled or not), on ``data``'s next batches: the
    first compiles (a compiled model), the second rebuilds the buckets, the third is profiled. Returns the third's
    :func:`~minddp.notebook.nodes.node_view`, its bars the model's gradient nodes
    (:func:`~minddp.notebook.nodes.node_names` of one more forward), with ``buckets``
    (:func:`~minddp.notebook.nodes.bucket_names`), ``params`` (:func:`flat`, after the steps), ``moved`` (each
    step's largest parameter move, lr·max|g|, for :func:`rounding_bound`), and per step ``compiled`` (the frames
    Dynamo compiled in it) and ``rebuilt`` (whether ddp rebuilt its buckets in it)."""
    optimizer, moved, compiled, rebuilt = torch.optim.SGD(model.parameters(), lr=0.01), [], [], []
    for step in range(3):
        before, batch, frames, plan = flat(model), next(data), frames_compiled(), ddp.reducer.rebuilt
        with live.profiler() if step == 2 else contextlib.nullcontext() as prof:
            train_step(ddp, optimizer, batch, loss_fn)
        moved.append((flat(model) - before).abs().max().item())
        compiled.append(frames_compiled() - frames)
        rebuilt.append(ddp.reducer.rebuilt and not plan)
    with ddp.no_sync():  # a forward whose backward never runs: the names of the nodes the model records
        drawn = nodes.node_names(ddp(torch.randn_like(batch[0])))
    view = nodes.node_view(prof, drawn)
    view.update(buckets=nodes.bucket_names(ddp), params=flat(model), moved=moved, compiled=compiled, rebuilt=rebuilt)
    return view


def layer_numbers(buckets: list[list[str]]) -> list[list[int]]:
    """Each bucket of :func:`~minddp.notebook.nodes.bucket_names` as its layers' numbers, in the bucket's order
    (a name ``layers.<i>.weight`` gives ``i``).

    >>> layer_numbers([["layers.7.weight", "layers.6.weight"], ["layers.5.weight"]])
    [[7, 6], [5]]
    """
    return [[int(name.split(".")[1]) for name in bucket] for bucket in buckets]


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


def compile_at(build, model, batch, loss_fn, reference) -> dict:
    """One SGD training step (lr 0.01) of ``build(model)``: ``model`` wrapped in a DDP and compiled, the model
    first (``wrapper(torch.compile(model))``) or the wrapper (``torch.compile(wrapper(model))``).

    Returns ``line``, what happened in a line: what torch raised (:func:`~minddp.notebook.nodes.refusal`), or
    Dynamo's count of graph breaks in the step, then the compiled pieces of one more forward
    (:func:`~minddp.notebook.nodes.compiled_pieces`; under ``no_sync()``, its backward never runs), each as its
    parameters' names, in the order backward would run them. With it: ``raised``, the type of what torch raised and
    the file that raised it (``None`` if nothing); ``breaks``, that count; ``pieces``, the pieces' count;
    ``apart``, the largest |difference| between the trained parameters and ``reference`` (:func:`flat` of eager ddp
    after the same step), 0.0 when they agree to the bit (``breaks``, ``pieces`` and ``apart`` are ``None`` when
    torch raised)."""
    dynamo_reset()
    wrapped = build(model)
    try:
        train_step(wrapped, torch.optim.SGD(model.parameters(), lr=0.01), batch, loss_fn)
    except Exception as error:  # what torch raises, said in one line, with the file of torch's that raised it
        raised = (type(error).__name__, nodes.raised_in(error))
        return dict(line=nodes.refusal(error), raised=raised, breaks=None, pieces=None, apart=None)
    apart = (flat(model) - reference).abs().max().item()
    breaks = graph_breaks()
    with wrapped.no_sync():  # a forward whose backward never runs, to walk its pieces
        pieces = nodes.compiled_pieces(wrapped(torch.randn_like(batch[0])), model)
    line = f"graph breaks: {breaks}; pieces: " + ", ".join(f"[{', '.join(piece)}]" for piece in pieces)
    return dict(line=line, raised=None, breaks=breaks, pieces=len(pieces), apart=apart)


#: the two patterns, each as the code that builds it (``wrapper``: torch's DDP class or minddp's), nanoGPT's first
PATTERNS = {
    "wrapper(torch.compile(model))": lambda wrapper, model, cap, backend: wrapper(
        torch.compile(model, backend=backend), bucket_cap_mb=cap
    ),
    "torch.compile(wrapper(model))": lambda wrapper, model, cap, backend: torch.compile(
        wrapper(model, bucket_cap_mb=cap), backend=backend
    ),
}


def both_patterns(name: str, wrapper, make_model, batch, loss_fn, cap: float, backend: str) -> dict:
    """``wrapper`` (torch's DDP class or minddp's) with each of :data:`PATTERNS` at a bucket cap of ``cap`` MiB, one
    training step each (:func:`compile_at`) on a fresh ``make_model()`` (an MLP of square layers without biases) and
    ``batch``. Prints its line per pattern, begun with ``name`` (one line, "either pattern", if both read the same).

    Returns what the notebook's claims check: per pattern, ``raised``, ``breaks`` and ``pieces`` (:func:`compile_at`'s);
    ``apart``, the largest over the patterns (``None`` if one raised), against an eager ``ddp`` step of
    ``make_model()`` on ``batch``; ``bound``, how far summing in another order may leave that step
    (:func:`rounding_bound`); ``near``, ``apart`` in words (``None`` with it)."""
    reference = make_model()
    start = flat(reference)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.01)
    train_step(DistributedDataParallel(reference, bucket_cap_mb=cap), optimizer, batch, loss_fn)
    moved = (flat(reference) - start).abs().max().item()  # the step's largest move: lr·max|g|
    k = 2 * sum(p.shape[-1] for p in reference.parameters()) + batch[0].shape[0]  # 2·depth·width + rows
    bound = rounding_bound([moved], flat(reference).abs().max().item(), k=k)
    trained = flat(reference)
    outcomes = {
        pattern: compile_at(partial(build, wrapper, cap=cap, backend=backend), make_model(), batch, loss_fn, trained)
        for pattern, build in PATTERNS.items()
    }
    lines = {pattern: o["line"] for pattern, o in outcomes.items()}
    if len(set(lines.values())) == 1:
        lines = {"either pattern": lines.popitem()[1]}
    for pattern, line in lines.items():
        lesson.say(f"{name}, {pattern}: {line}")
    aparts = [o["apart"] for o in outcomes.values()]
    apart = None if None in aparts else max(aparts)
    near = f"to {apart:.1e}, within the {bound:.1e} estimated for summing in another order" if apart else "to the bit"
    near = None if apart is None else near
    per_pattern = {key: [o[key] for o in outcomes.values()] for key in ("raised", "breaks", "pieces")}
    return dict(per_pattern, apart=apart, bound=bound, near=near)
