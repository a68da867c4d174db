"""The ladder by name: every stage the CLI, the benchmark, the notebooks and the tests can run.

``STAGES`` maps a stage name to its wrapper class, in reading order: the six
teaching stages of :mod:`minddp.stages`, then the production ``ddp``
(:mod:`minddp.ddp`), then the sharded rungs (:mod:`minddp.sharding`):
``zero1`` (``ddp``'s wrapper, with the optimizer sharded by
:class:`~minddp.sharding.ZeroRedundancyOptimizer`, :data:`SHARDED_OPTIMIZER`;
ZeRO-1 works with any rung, as torch's pairs with torch's DDP), ``zero2`` and
``fsdp``. ``single`` (one process on the global batch, no wrapper) and
``torch`` (torch's own DDP) are the baselines (:data:`BASELINES`). The rungs for slow links,
``local-sgd`` and ``diloco`` (:mod:`minddp.diloco`, :data:`SLOW_LINKS`), sync the weights every few
steps instead of the gradients every step: they wrap the loop, not the model (:func:`slow_link`).

:func:`wrap` is the one way the train command, the benchmark and the
notebooks put a model into a stage (or torch's DDP) with a comm hook by name,
and :func:`make_optimizer` the one way they build its optimizer (after
:func:`wrap`: the sharded stages have put shards in the module by then).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> build_stage("bucket-async", torch.nn.Linear(4, 2), bucket_cap_mb=1).__class__.__name__
    'AsyncBucketDDP'
    >>> wrap("torch", torch.nn.Linear(4, 2), hook="fp16").__class__.__module__   # torch's DDP, torch's hook
    'torch.nn.parallel.distributed'
    >>> make_optimizer("zero1", torch.nn.Linear(4, 2), torch.optim.AdamW, lr=1e-3).__class__.__name__
    'ZeroRedundancyOptimizer'
"""

from __future__ import annotations

import difflib
import inspect

import torch
from torch import nn

from minddp.comm.link import as_link, waits_seen
from minddp.comm.measure import error_measured
from minddp.comm.registry import make_hook, torch_hook
from minddp.comm.send import in_launch_range
from minddp.comm.wire import Traffic, Wire
from minddp.ddp import DistributedDataParallel
from minddp.diloco import OUTER_DEFAULTS, DiLoCo, LocalSGD
from minddp.runtime import compat
from minddp.runtime.compiling import eager_under_compile, split_at_buckets
from minddp.sharding import FullyShardedDataParallel, Zero2DDP, ZeroRedundancyOptimizer
from minddp.sharding.fsdp import blocks_of
from minddp.sharding.hooks import sharded_hook
from minddp.stages import AsyncBucketDDP, AsyncHookDDP, BucketDDP, GradAccumDDP, HookDDP, SimpleDDP
from minddp.stages.bucket_plan import bucket_caps, check_bucket_cap_mb

#: Stage name -> wrapper class, in reading order.
STAGES: dict[str, type[nn.Module]] = {
    "simple": SimpleDDP,
    "ga": GradAccumDDP,
    "hook": HookDDP,
    "hook-async": AsyncHookDDP,
    "bucket": BucketDDP,
    "bucket-async": AsyncBucketDDP,
    "ddp": DistributedDataParallel,
    "zero1": DistributedDataParallel,
    "zero2": Zero2DDP,
    "fsdp": FullyShardedDataParallel,
}

#: The teaching stages (:mod:`minddp.stages`), in reading order.
TEACHING = ("simple", "ga", "hook", "hook-async", "bucket", "bucket-async")
#: Stages whose optimizer is wrapped in ``ZeroRedundancyOptimizer`` (ZeRO-1): gradients averaged whole.
SHARDED_OPTIMIZER = ("zero1",)
#: Stages whose gradients travel by reduce-scatter (their comm hooks: :func:`~minddp.sharding.hooks.sharded_hook`).
SHARDED_GRADIENTS = ("zero2", "fsdp")

#: Names that are runs but not wrappers of ours.
BASELINES = ("single", "torch")

#: Runs with a launcher of their own that trains through a lost rank (:mod:`minddp.ft`); named, never in ``all``.
FAULT_TOLERANT = ("ft",)

#: Rungs that sync the weights every H optimizer steps, not the gradients every step (:mod:`minddp.diloco`): a
#: context manager around the loop (:func:`slow_link`), the model trained unwrapped; named, never in ``all``.
SLOW_LINKS: dict[str, type] = {"local-sgd": LocalSGD, "diloco": DiLoCo}
#: The comm hooks they send through: the stateless ones (PowerSGD's memory follows gradients step by step).
SLOW_LINK_HOOKS = ("allreduce", "fp16", "bf16", "noop")


def register_stage(name: str, cls: type[nn.Module]) -> None:
    """Add a stage to the registry the CLI and tests iterate over."""
    STAGES[name] = cls


def build_stage(name: str, module: nn.Module, process_group=None, **options) -> nn.Module:
    """Wrap ``module`` in stage ``name``, with ``options`` (keywords of its class: :func:`stage_options`).

    An option the stage does not take is refused, naming those it takes: a call site that passes the
    same options to every stage picks each stage's with :func:`options_for`. A teaching stage's comm
    hook (its default until another is registered; :func:`wrap` registers any other the same way) is
    called inside the named profiler range the trace analysis reads
    (:func:`~minddp.comm.send.in_launch_range`). A teaching stage around a compiled module
    (``torch.compile(model)``, as ``--compile`` does) is made :func:`compile_ready`: the module's
    graph is cut where its buckets end (``ddp`` and the sharded stages do that themselves).
    """
    taken = stage_options(name)
    unknown = _unknown(options, taken)
    if unknown:
        raise TypeError(
            f"stage {name!r} takes no option {unknown}: it takes {', '.join(taken) or 'none'} (to pass the same "
            "options to every stage, pick each one's with minddp.ladder.options_for)"
        )
    wrapped = STAGES[name](module, process_group=process_group, **options)
    if name in TEACHING:  # each call of its hook in the range the analysis reads (the stage's files stay plain)
        wrapped.comm_hook = waits_seen(in_launch_range(wrapped.comm_hook))  # and its waits seen over a link
    if name in TEACHING and compat.is_compiled(module):  # torch.compile(module): cut where buckets end
        compile_ready(wrapped)
    return wrapped


def stage_options(name: str) -> tuple[str, ...] | None:
    """The options stage ``name`` takes: its class's keywords after the module and ``process_group``.

    None for a class that takes any (``**kwargs``).
    """
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}: choose one of {', '.join(STAGES)}")
    parameters = list(inspect.signature(STAGES[name].__init__).parameters.values())[2:]  # after self and module
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return tuple(p.name for p in parameters if p.name != "process_group" and p.kind is not p.VAR_POSITIONAL)


def options_for(name: str, **options) -> dict:
    """Of ``options``, the ones stage ``name`` takes: one call site can pass ``bucket_cap_mb`` to every stage.

    An option no stage takes (a typo) is refused, as :func:`build_stage` refuses one its stage does not take.
    """
    every = [stage_options(stage) for stage in STAGES]
    known = sorted({option for taken in every if taken is not None for option in taken})
    unknown = _unknown(options, None if None in every else known)
    if unknown:
        raise TypeError(f"no stage takes the option {unknown}: the stages' options are {', '.join(known)}")
    taken = stage_options(name)
    return {k: v for k, v in options.items() if taken is None or k in taken}


def _unknown(options: dict, taken) -> str:
    """The names in ``options`` not in ``taken`` (None: any is), quoted, each with the taken one it is nearest."""
    if taken is None:
        return ""
    return ", ".join(
        repr(k) + "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(k, taken, n=1))
        for k in options
        if k not in taken
    )


def compile_ready(stage: nn.Module) -> nn.Module:
    """A teaching stage as ``torch.compile`` should see it: call it before ``torch.compile(stage)``, or around a
    compiled module (:func:`build_stage` does).

    Its ``forward`` frames run as Python (:func:`~minddp.runtime.compiling.eager_under_compile`), and a bucketed
    stage has its module's graph cut where its buckets end (:func:`~minddp.runtime.compiling.split_at_buckets`,
    at the caps the stage planned with: :func:`~minddp.stages.bucket_plan.bucket_caps`). The stages' own files
    stay plain; ``ddp`` and ``zero2`` do this themselves.
    """
    eager_under_compile(stage)
    if isinstance(stage, BucketDDP):
        forward, caps = stage.forward, bucket_caps(stage.bucket_cap_mb)

        def cut_forward(*inputs, **kwargs):
            with split_at_buckets(stage.module, *caps):
                return forward(*inputs, **kwargs)

        stage.forward = torch.compiler.disable(cut_forward, recursive=False)  # this frame runs as Python too
    return stage


def wrap(
    stage: str,
    model: nn.Module,
    *,
    hook: str = "allreduce",
    bucket_cap_mb: float | None = None,
    gradient_as_bucket_view: bool = False,
    python_hook: bool = False,
    powersgd_options: dict | None = None,
    wire: Wire | None = None,
    link=None,
    measure: Traffic | None = None,
) -> nn.Module:
    """``model`` as ``stage`` trains it, with the comm hook ``hook`` (a :func:`make_hook` name) registered.

    * ``single``: the model itself (one process on the global batch);
    * ``torch``: torch's DDP with torch's hook of the same name; plain averaging
      stays torch's C++ default unless ``python_hook`` asks for its Python
      ``allreduce_hook``;
    * a minddp stage: the stage with minddp's hook, whose state goes through
      ``wire`` (a meter, a transport; ``None``: a plain wire on the default
      group). minddp's ``allreduce_hook`` is registered too: it is every
      stage's default, and on ``ddp`` it selects the fast built-in average.
      A teaching stage's hook is registered inside its named profiler range
      (:func:`~minddp.comm.send.in_launch_range`), as :func:`build_stage` does.

    ``link`` (a :class:`~minddp.comm.link.Link`, a preset name or
    ``bandwidth,latency``) puts an emulated network under every gradient
    collective: it rides on the wire. torch's DDP gets it through a comm hook:
    with a link, torch's reducer sends through minddp's hook of the same name
    (torch's own hooks call ``dist.all_reduce`` directly, where no wire can see
    them), each call in a ``minddp.bucket_launch`` range as the stages' are.

    The hook's state is kept as ``.minddp_hook_state`` (what a checkpoint saves:
    PowerSGD's memory). The options only matter where they apply
    (``bucket_cap_mb`` to bucketed stages and torch; ``powersgd_options`` to
    PowerSGD hooks). ``fsdp`` takes each element of the model's ``nn.ModuleList`` objects
    (a transformer's blocks) as a unit (:func:`~minddp.sharding.fsdp.blocks_of`).
    With ``measure`` (a :class:`~minddp.comm.wire.Traffic`) a minddp stage's hook is
    registered wrapped in :func:`~minddp.comm.measure.error_measured` (a hook is registered once).
    """
    if stage == "single":
        return model
    psgd = (powersgd_options or {}) if "powersgd" in hook else {}
    wire = _linked(wire, link)
    if stage == "torch":
        from torch.nn.parallel import DistributedDataParallel as TorchDDP

        check_bucket_cap_mb(bucket_cap_mb)  # torch's DDP takes 0, -1 or "25" without a word
        device = next(model.parameters()).device
        wrapped = TorchDDP(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=bucket_cap_mb,
            gradient_as_bucket_view=gradient_as_bucket_view,
        )
        if wire is not None and wire.link is not None:
            state, fn = make_hook(hook, wire, **psgd)
            wrapped.register_comm_hook(state, in_launch_range(fn))
        else:
            state, fn = torch_hook(hook, **psgd)
            if hook != "allreduce" or python_hook:
                wrapped.register_comm_hook(state, fn)
    else:
        options = options_for(
            stage, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view, shard=blocks_of(model)
        )  # each where it applies; fsdp's units: the transformer's blocks
        wrapped = build_stage(stage, model, **options)
        state, fn = sharded_hook(hook, wire) if stage in SHARDED_GRADIENTS else make_hook(hook, wire, **psgd)
        fn = fn if measure is None else error_measured(fn, measure)
        wrapped.register_comm_hook(
            state, waits_seen(in_launch_range(fn)) if stage in TEACHING else fn
        )  # as build_stage
    wrapped.minddp_hook_state = state
    return wrapped


def _linked(wire: Wire | None, link) -> Wire | None:
    """``wire`` with ``link`` under it (a plain wire on the default group if ``wire`` is None); as is without a link."""
    if link is None:
        return wire
    return (
        Wire(None, link=as_link(link))
        if wire is None
        else Wire(wire.group, wire.transport, wire.traffic, as_link(link))
    )


def make_optimizer(
    stage: str,
    model: nn.Module,
    optimizer_class: type,
    *,
    hook: str = "allreduce",
    wire: Wire | None = None,
    link=None,
    **defaults,
):
    """The optimizer ``stage`` trains ``model`` with: ``optimizer_class(model.parameters(), **defaults)``, sharded.

    Build it after :func:`wrap`: ``zero2`` and ``fsdp`` have replaced the
    module's parameters by this rank's shards by then, so any optimizer holds
    state for the shards only. A :data:`SHARDED_OPTIMIZER` stage gets
    ``ZeroRedundancyOptimizer`` around ``optimizer_class``, its all-gathers sent
    through ``wire`` (with ``hook="noop"``: through a wire that sends nothing,
    the no-communication limit; with ``link``, over that emulated network as :func:`wrap`'s collectives).
    """
    if stage in SHARDED_OPTIMIZER:
        state, _ = sharded_hook(hook if hook == "noop" else "allreduce", _linked(wire, link))
        return ZeroRedundancyOptimizer(model.parameters(), optimizer_class, process_group=state, **defaults)
    return optimizer_class(model.parameters(), **defaults)


def slow_link(
    stage: str,
    model: nn.Module,
    optimizer,
    sync_every: int,
    *,
    outer_lr: float = OUTER_DEFAULTS["lr"],
    outer_momentum: float = OUTER_DEFAULTS["momentum"],
    fragments: int = 1,
    fragment_delay: int = 0,
    fragment_alpha: float = 0.0,
    hook: str = "allreduce",
    wire: Wire | None = None,
    link=None,
):
    """The :data:`SLOW_LINKS` rung ``stage`` around ``model`` and its (inner) ``optimizer``, its messages sent
    through the comm hook ``hook`` on ``wire`` (with ``link``, over that emulated network), as :func:`wrap`'s.

    ``diloco``'s outer optimizer is SGD with ``outer_lr`` and ``outer_momentum`` (Nesterov when there is
    momentum: the defaults are DiLoCo's); ``local-sgd`` takes no outer option.
    """
    if hook not in SLOW_LINK_HOOKS:
        raise ValueError(
            f"{stage} sends its weights or pseudo-gradients through {', '.join(SLOW_LINK_HOOKS)}, not {hook!r}: "
            "PowerSGD's error feedback and warm start follow gradients step by step; pick one of those"
        )
    if stage == "local-sgd":
        rung = LocalSGD(model, optimizer, sync_every)
    elif stage == "diloco":
        params = [p for p in model.parameters() if p.requires_grad]
        outer = torch.optim.SGD(params, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
        rung = DiLoCo(
            model,
            optimizer,
            outer,
            sync_every,
            fragments=fragments,
            fragment_sync_delay=fragment_delay,
            fragment_update_alpha=fragment_alpha,
        )
    else:
        raise ValueError(f"unknown slow-link rung {stage!r}: choose one of {', '.join(SLOW_LINKS)}")
    rung.register_comm_hook(*make_hook(hook, _linked(wire, link)))
    return rung


__all__ = [
    "STAGES",
    "BASELINES",
    "FAULT_TOLERANT",
    "SLOW_LINKS",
    "SLOW_LINK_HOOKS",
    "SHARDED_OPTIMIZER",
    "SHARDED_GRADIENTS",
    "build_stage",
    "stage_options",
    "options_for",
    "compile_ready",
    "register_stage",
    "wrap",
    "make_optimizer",
    "slow_link",
]
