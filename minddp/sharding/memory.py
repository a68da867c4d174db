"""Memory per rank, measured from the tensors a rank holds, beside the ZeRO paper's formulas.

:class:`Probe` counts what one rank holds during a training step, by kind (parameters, gradients,
optimizer state, activations, FSDP's gathered units), from the tensors themselves: distinct
storages, so a shard that is a view into a full parameter counts once. :func:`formula_parts` gives
the ZeRO paper's model state per rank for ``Ψ`` parameters with Adam on ``n`` ranks, in either
precision of :data:`PRECISIONS`:

1. **bytes per parameter** of each kind: fp32 ``4 + 4 + 8`` (parameter, gradient, Adam's two
   moments); bf16 compute with fp32 master weights ``2 + 2 + 12`` (16-bit parameter and
   gradient; the optimizer keeps the fp32 master copy and the two moments: the paper's ``K = 12``);
2. **what each rung shards** (divides by ``n``): ``ddp`` nothing, ``zero1`` the optimizer state,
   ``zero2`` that and the gradients, ``fsdp`` all three (its replicated parameters stay whole).

So fp32: DDP ``16Ψ``, ZeRO-1 ``8Ψ + 8Ψ/n``, ZeRO-2 ``4Ψ + 12Ψ/n``, FSDP ``16Ψ/n``; bf16 with fp32
masters: DDP ``16Ψ``, ZeRO-1 ``4Ψ + 12Ψ/n``, ZeRO-2 ``2Ψ + 14Ψ/n``, FSDP ``16Ψ/n``.
``docs/sharding.md`` (*Memory per rank*) says what each kind counts, where measured and formula
part, and why minddp's ``compute_dtype`` (like torch's autocast and FSDP2's mixed precision) keeps
the fp32 parameters as the master copy, so its model state follows the fp32 row;
``python -m minddp.bench.memory`` measures the sharded rungs at 2, 3 and 4 ranks.

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.ladder import build_stage
    >>> from minddp.ladder.loop import train_step
    >>> model = torch.nn.Linear(16, 16)                       # 272 parameters: 1088 bytes in fp32
    >>> wrapped = build_stage("ddp", model)
    >>> optimizer = torch.optim.AdamW(wrapped.parameters())
    >>> probe = Probe(wrapped, model, optimizer)             # before a training step
    >>> _ = train_step(wrapped, optimizer, [torch.ones(4, 16)], lambda m, b: m(b).sum())
    >>> probe.result()                                       # AdamW: 2 x 1088 + its 2 step counters
    {'parameters': 1088, 'gradients': 1088, 'optimizer': 2184, 'activations': 256, 'gathered': 0, 'psi': 272,
     'replicated': 0}
"""

from __future__ import annotations

import textwrap
from typing import Iterable

import torch
from torch import nn

STAGES = ("ddp", "zero1", "zero2", "fsdp")
KINDS = ("parameters", "gradients", "optimizer", "activations", "gathered")


def storage_bytes(tensors: Iterable[torch.Tensor], skip: set[int] = frozenset()) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view and what it views count once)."""
    seen, total = set(skip), 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes() > 0:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's state tensors on this rank (a ZeRO-1 optimizer: its local optimizer's)."""
    local = getattr(optimizer, "optim", optimizer)
    return storage_bytes(v for state in local.state.values() for v in state.values() if torch.is_tensor(v))


def held_parameters(wrapped: nn.Module, module: nn.Module) -> list[torch.Tensor]:
    """The parameter tensors a rank holds: the module's, and the full copies ``zero2`` keeps beside its shards."""
    return list(module.parameters()) + list(getattr(wrapped, "full", []))


class Probe:
    """Measure the next training step of ``wrapped`` (see the module doc); :meth:`result` after it.

    It hooks in through public hooks only (module forward hooks around a
    saved-tensor hook, the optimizer's step pre- and post-hooks), and removes
    them after one step. ``activations_by``: the activations' bytes by
    (dtype, class of the innermost module running when the tensor was saved),
    of the forward that saved the most. ``gradients_between``: the most
    gradient bytes held when a forward starts, what the earlier micro-batches'
    backwards left (accumulated, unsynced, FSDP's in its units included).
    """

    def __init__(self, wrapped: nn.Module, module: nn.Module, optimizer: torch.optim.Optimizer):
        self.wrapped, self.module, self.optimizer = wrapped, module, optimizer
        self.numbers = dict.fromkeys(KINDS, 0)
        self.param_storages: set[int] = set()
        self.saved: set[int] = set()
        self.saved_bytes = 0
        self.running: list[str] = []  # class names of the modules whose forward runs now, innermost last
        self.saved_by: dict[tuple[str, str], int] = {}  # this forward's saved bytes by (dtype, module class)
        self.activations_by: dict[tuple[str, str], int] = {}
        self.gradients_between = 0
        self.handles = [
            optimizer.register_step_pre_hook(self._before_step),
            optimizer.register_step_post_hook(self._after_step),
        ]
        self.fsdp = hasattr(wrapped, "units")  # FSDP: its own saved-tensor hook, and gathered units
        if self.fsdp:
            self._watch_fsdp()
        self.handles += [
            module.register_forward_pre_hook(self._forward_starts),
            module.register_forward_hook(self._forward_ends),
        ]
        for sub in module.modules():  # which module saves each activation
            self.handles += [sub.register_forward_pre_hook(self._enter), sub.register_forward_hook(self._leave)]
        self.contexts: list = []

    def _watch_fsdp(self) -> None:
        """Read FSDP's saved tensors and gathered parameters through its own methods, wrapped for one step.

        Autograd calls only the innermost saved-tensor hook, which is FSDP's: what its ``_pack`` hands
        back unchanged (not a note of a unit's parameter) is an activation. Gathered bytes grow only
        where an all-gather starts and where a received buffer is unpacked (both held for a moment).
        """
        fsdp, buffers = self.wrapped, {}
        pack, start_gather, gather = fsdp._pack, fsdp._start_gather, fsdp._gather
        self.peak_gathered = gathered_bytes(fsdp)

        def watched_pack(tensor):
            packed = pack(tensor)
            if packed is tensor:
                self._saved(tensor)
            return packed

        def watched_start_gather(unit):
            start_gather(unit)
            if unit.gathering is not None:
                buffers[unit.index] = unit.gathering[0]
            self.peak_gathered = max(self.peak_gathered, gathered_bytes(fsdp))

        def watched_gather(unit):
            unpacked = unit.full is not None
            gather(unit)
            if not unpacked:  # for a moment, both the received buffer and what it unpacked into
                received = buffers.pop(unit.index, None)
                held = gathered_bytes(fsdp) + (received.untyped_storage().nbytes() if received is not None else 0)
                self.peak_gathered = max(self.peak_gathered, held)

        fsdp._pack, fsdp._start_gather, fsdp._gather = watched_pack, watched_start_gather, watched_gather

    def _enter(self, module, args) -> None:
        self.running.append(type(module).__name__)

    def _leave(self, module, args, output) -> None:
        self.running.pop()  # returns None: a forward hook that returns a value replaces the output

    def _saved(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.saved and storage.data_ptr() not in self.param_storages:  # set per forward
            self.saved.add(storage.data_ptr())
            self.saved_bytes += storage.nbytes()
            key = (str(tensor.dtype).removeprefix("torch."), self.running[-1] if self.running else "")
            self.saved_by[key] = self.saved_by.get(key, 0) + storage.nbytes()
            if self.saved_bytes >= self.numbers["activations"]:
                self.numbers["activations"] = self.saved_bytes
                self.activations_by = dict(self.saved_by)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self._saved(tensor)
        return tensor

    def _gradients_held(self) -> int:
        if not self.fsdp:
            return storage_bytes(p.grad for p in held_parameters(self.wrapped, self.module))
        # FSDP: its own leaves (the module may hold bf16 casts during a forward), and its units' no_sync sums
        fsdp = self.wrapped
        leaves = [s for unit in fsdp.units for s in unit.shards] + [p for _, _, p in fsdp.replicated]
        return storage_bytes([p.grad for p in leaves] + [g for unit in fsdp.units for g in unit.accumulated])

    def _forward_starts(self, module, args) -> None:
        self.gradients_between = max(self.gradients_between, self._gradients_held())
        self.saved, self.saved_bytes, self.saved_by = set(), 0, {}  # activations of one forward, each forward anew
        # a saved tensor in a parameter's storage (a weight's transpose, say) is the parameter, not an activation
        self.param_storages = {t.untyped_storage().data_ptr() for t in held_parameters(self.wrapped, self.module)}
        if not self.fsdp:
            context = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
            context.__enter__()
            self.contexts.append(context)

    def _forward_ends(self, module, args, output) -> None:
        if self.contexts:
            self.contexts.pop().__exit__(None, None, None)

    def _before_step(self, optimizer, args, kwargs) -> None:
        params = held_parameters(self.wrapped, self.module)
        self.numbers["parameters"] = storage_bytes(params)
        self.numbers["gradients"] = storage_bytes(p.grad for p in params)

    def _after_step(self, optimizer, args, kwargs) -> None:
        self.numbers["optimizer"] = optimizer_state_bytes(optimizer)
        self.numbers["gathered"] = self.peak_gathered if self.fsdp else 0
        self.close()

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.fsdp:  # FSDP's own methods again (the class's)
            for name in ("_pack", "_start_gather", "_gather"):
                self.wrapped.__dict__.pop(name, None)

    def result(self) -> dict[str, int]:
        """The measured bytes by kind, and ``psi`` (trainable parameters) and ``replicated`` for the formulas."""
        return {**self.numbers, **model_size(self.wrapped, self.module)}


def gathered_bytes(fsdp: nn.Module) -> int:
    """Bytes of FSDP's gathered parameters held now: all-gathers in flight and units unpacked."""
    return sum(
        (u.gathering[0].untyped_storage().nbytes() if u.gathering is not None else 0)
        + (sum(t.untyped_storage().nbytes() for t in u.full) if u.full is not None else 0)
        for u in fsdp.units
    )


def all_gather_buffer_bytes(sharded) -> int:
    """Bytes of the buffers the all-gathers of parameters of ``zero1`` (its optimizer), ``zero2`` or ``fsdp`` (their
    wrappers) send from and receive into at once, from the stage's plan: per bucket or unit this rank's block (the
    *send block*) and ``world`` blocks. zero1 and zero2 start every bucket's all-gather before waiting for any: all
    buckets'; fsdp waits for a unit's before it starts the next one's (in a forward or backward that runs its units
    in the order it prefetches by): its largest unit's.

    A block is this rank's chunks of the bucket or unit back to back, padded: zero1's to the longest rank's, zero2's
    and fsdp's each chunk to ``ceil(numel / world)``.
    """
    world = sharded.world
    units = getattr(sharded, "units", None)
    if units is not None:
        size = (sharded.compute_dtype or units[0].shards[0].dtype).itemsize
        return max(((world + 1) * sharded.gather_block(unit) * size for unit in units), default=0)
    return sum((world + 1) * sharded.gather_block(bucket) * bucket[0].element_size() for bucket in sharded.buckets)


def model_size(wrapped: nn.Module, module: nn.Module) -> dict[str, int]:
    """``psi``: trainable parameters of the whole model (whatever each rank holds of them); ``replicated``:
    those FSDP keeps whole on every rank."""
    units = getattr(wrapped, "units", None)
    if units is not None:
        replicated = {id(p): p.numel() for _, _, p in wrapped.replicated if p.requires_grad}
        sharded = sum(n for unit in units for s, n in zip(unit.shards, unit.numels) if s.requires_grad)
        return {"psi": sharded + sum(replicated.values()), "replicated": sum(replicated.values())}
    full = getattr(wrapped, "full", None)  # zero2's full parameters (its module holds shards)
    params = full if full is not None else [p for p in module.parameters() if p.requires_grad]
    return {"psi": sum(p.numel() for p in params), "replicated": 0}


def format_summary(measured: dict[str, dict], world: int) -> str:
    """The train command's memory table: per stage, rank 0's bytes by kind (MiB) beside the formula."""
    mib = 2**20
    head = f"{'stage':<13}{'params':>9}{'grads':>9}{'optim':>9}{'state':>9}{'formula':>9}{'act':>9}{'gathered':>10}"
    lines = ["memory per rank (MiB, rank 0, measured from the tensors on the last step)", head, "-" * len(head)]
    for stage, m in measured.items():
        kind = stage if stage in STAGES else "ddp"  # every other stage keeps DDP's full copies
        formula = formula_bytes(kind, m["psi"], world, m["replicated"])
        state = m["parameters"] + m["gradients"] + m["optimizer"]
        lines.append(
            f"{stage:<13}{m['parameters'] / mib:>9.3f}{m['gradients'] / mib:>9.3f}{m['optimizer'] / mib:>9.3f}"
            f"{state / mib:>9.3f}{formula / mib:>9.3f}{m['activations'] / mib:>9.3f}"
            f"{m['gathered'] / mib:>10.3f}"
        )
    lines += textwrap.wrap(  # a console's 120 columns
        "state = params + grads + optim; formula = the ZeRO formula for it with AdamW (ddp 16Ψ, zero1 "
        "8Ψ+8Ψ/n, zero2 4Ψ+12Ψ/n, fsdp 16Ψ/n + its replicated parameters; n ranks); act = activations saved "
        "for backward; gathered = FSDP's full units at their peak",
        120,
    )
    return "\n".join(lines)


#: Bytes per parameter of (parameters, gradients, optimizer state) with Adam: fp32 throughout, or bf16 compute
#: with fp32 master weights kept by the optimizer (the ZeRO paper's mixed precision, K = 12).
PRECISIONS = {"fp32": (4, 4, 8), "bf16-mixed": (2, 2, 12)}
#: Which kinds each rung divides among the ranks (the ZeRO paper's P_os, P_os+g, P_os+g+p).
SHARDED = {
    "ddp": (),
    "zero1": ("optimizer",),
    "zero2": ("optimizer", "gradients"),
    "fsdp": ("optimizer", "gradients", "parameters"),
}


def formula_parts(stage: str, psi: int, world: int, replicated: int = 0, precision: str = "fp32") -> dict[str, float]:
    """Model-state bytes per rank by kind, by the ZeRO formulas (module doc, steps 1-2).

    ``replicated``: parameters FSDP keeps whole on every rank (outside its units), every kind of them whole;
    the other rungs ignore it.

    Example (Ψ = 1000 parameters on 4 ranks)::

        >>> formula_parts("zero2", 1000, 4)
        {'parameters': 4000.0, 'gradients': 1000.0, 'optimizer': 2000.0}
        >>> formula_parts("zero2", 1000, 4, precision="bf16-mixed")
        {'parameters': 2000.0, 'gradients': 500.0, 'optimizer': 3000.0}
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    whole = replicated if stage == "fsdp" else 0
    return {
        kind: float(per * ((psi - whole) / world if kind in SHARDED[stage] else psi - whole) + per * whole)
        for kind, per in zip(("parameters", "gradients", "optimizer"), PRECISIONS[precision])
    }


def formula_bytes(stage: str, psi: int, world: int, replicated: int = 0, precision: str = "fp32") -> float:
    """Model-state bytes per rank by the ZeRO formulas: the sum of :func:`formula_parts`.

    ``replicated``: parameters FSDP keeps whole on every rank (outside its units), 16 bytes each.
    """
    return sum(formula_parts(stage, psi, world, replicated, precision).values())
