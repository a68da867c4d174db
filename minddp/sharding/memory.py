"""Memory per rank, measured from the tensors a rank holds, beside the ZeRO paper's formulas.

What one rank holds during a training step, by kind, each counted from the
tensors themselves (the distinct storages behind them, so a shard that is a
view into a full parameter counts once):

* **parameters**: the module's parameters as it holds them at rest (whole
  for ``ddp``/``zero1``; shards for ``fsdp``) and any full copies a stage
  keeps beside them (``zero2``'s full parameters);
* **gradients**: their ``.grad`` once the step's gradients are synchronised,
  just before ``optimizer.step()``;
* **optimizer state**: the optimizer's state tensors just after the step
  (a ZeRO-1 optimizer's: its local optimizer's);
* **activations**: the most bytes autograd saved for backward during one
  forward (through a saved-tensor hook), without the parameters' own storage;
* **gathered**: FSDP's full parameters of the units gathered at the same time,
  at their peak.

The formulas (the notes' and the ZeRO paper's, for ``Ψ`` trainable fp32
parameters, Adam's two moments, ``N`` ranks): DDP ``16Ψ``; ZeRO-1
``8Ψ + 8Ψ/N``; ZeRO-2 ``4Ψ + 12Ψ/N``; FSDP ``16Ψ/N`` for what its units hold,
plus ``16`` bytes per parameter it leaves replicated, plus the gathered units.
:func:`formula_bytes` computes them; ``docs/sharding.md`` explains where
measured and formula part (a few step counters, the padding of uneven
chunks, DDP's gradient buckets, which are communication buffers and not counted
here).

``python -m minddp.sharding.memory`` measures ``ddp``, ``zero1``, ``zero2`` and
``fsdp`` at 2, 3 and 4 ranks and plots them; the train command prints the
same numbers for the stages it ran (:class:`Probe`).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> from minddp.ladder import build_stage
    >>> from minddp.loop import train_step
    >>> model = torch.nn.Linear(16, 16)                       # 272 parameters: 1088 bytes in fp32
    >>> wrapped = build_stage("ddp", model)
    >>> optimizer = torch.optim.AdamW(wrapped.parameters())
    >>> probe = Probe(wrapped, model, optimizer)             # before a training step
    >>> _ = train_step(wrapped, optimizer, [torch.ones(4, 16)], lambda m, b: m(b).sum())
    >>> probe.result()                                       # AdamW: 2 x 1088 + its 2 step counters
    {'parameters': 1088, 'gradients': 1088, 'optimizer': 2184, 'activations': 256, 'gathered': 0, 'psi': 272, 'replicated': 0}
"""

from __future__ import annotations

import json
import os
from argparse import ArgumentTypeError
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
    them after one step.
    """

    def __init__(self, wrapped: nn.Module, module: nn.Module, optimizer: torch.optim.Optimizer):
        self.wrapped, self.module, self.optimizer = wrapped, module, optimizer
        self.numbers = dict.fromkeys(KINDS, 0)
        self.param_storages: set[int] = set()
        self.saved: set[int] = set()
        self.saved_bytes = 0
        self.handles = [optimizer.register_step_pre_hook(self._before_step),
                        optimizer.register_step_post_hook(self._after_step)]
        self.fsdp = hasattr(wrapped, "units")        # FSDP: its own saved-tensor hook, and gathered units
        if self.fsdp:
            self._watch_fsdp()
        self.handles += [module.register_forward_pre_hook(self._forward_starts),
                         module.register_forward_hook(self._forward_ends)]
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
            if not unpacked:                  # for a moment, both the received buffer and what it unpacked into
                received = buffers.pop(unit.index, None)
                held = gathered_bytes(fsdp) + (received.untyped_storage().nbytes() if received is not None else 0)
                self.peak_gathered = max(self.peak_gathered, held)

        fsdp._pack, fsdp._start_gather, fsdp._gather = watched_pack, watched_start_gather, watched_gather

    def _saved(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.saved and storage.data_ptr() not in self.param_storages:   # set per forward
            self.saved.add(storage.data_ptr())
            self.saved_bytes += storage.nbytes()
            self.numbers["activations"] = max(self.numbers["activations"], self.saved_bytes)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        self._saved(tensor)
        return tensor

    def _forward_starts(self, module, args) -> None:
        self.saved, self.saved_bytes = set(), 0          # activations of one forward, each forward anew
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
        if self.fsdp:                             # FSDP's own methods again (the class's)
            for name in ("_pack", "_start_gather", "_gather"):
                self.wrapped.__dict__.pop(name, None)

    def result(self) -> dict[str, int]:
        """The measured bytes by kind, and ``psi`` (trainable parameters) and ``replicated`` for the formulas."""
        return {**self.numbers, **model_size(self.wrapped, self.module)}


def gathered_bytes(fsdp: nn.Module) -> int:
    """Bytes of FSDP's gathered parameters held now: all-gathers in flight and units unpacked."""
    return sum((u.gathering[0].untyped_storage().nbytes() if u.gathering is not None else 0)
               + (sum(t.untyped_storage().nbytes() for t in u.full) if u.full is not None else 0)
               for u in fsdp.units)


def model_size(wrapped: nn.Module, module: nn.Module) -> dict[str, int]:
    """``psi``: trainable parameters of the whole model (whatever each rank holds of them); ``replicated``:
    those FSDP keeps whole on every rank."""
    units = getattr(wrapped, "units", None)
    if units is not None:
        replicated = {id(p): p.numel() for _, _, p in wrapped.replicated if p.requires_grad}
        sharded = sum(n for unit in units for s, n in zip(unit.shards, unit.numels) if s.requires_grad)
        return {"psi": sharded + sum(replicated.values()), "replicated": sum(replicated.values())}
    full = getattr(wrapped, "full", None)               # zero2's full parameters (its module holds shards)
    params = full if full is not None else [p for p in module.parameters() if p.requires_grad]
    return {"psi": sum(p.numel() for p in params), "replicated": 0}


def format_summary(measured: dict[str, dict], world: int) -> str:
    """The train command's memory table: per stage, rank 0's bytes by kind (MiB) beside the formula."""
    mib = 2 ** 20
    head = (f"{'stage':<13}{'params':>9}{'grads':>9}{'optim':>9}{'state':>9}{'formula':>9}{'act':>9}"
            f"{'gathered':>10}")
    lines = ["memory per rank (MiB, rank 0, measured from the tensors on the last step)", head, "-" * len(head)]
    for stage, m in measured.items():
        kind = stage if stage in STAGES else "ddp"        # every other stage keeps DDP's full copies
        formula = formula_bytes(kind, m["psi"], world, m["replicated"] if kind == "fsdp" else 0)
        state = m["parameters"] + m["gradients"] + m["optimizer"]
        lines.append(f"{stage:<13}{m['parameters'] / mib:>9.3f}{m['gradients'] / mib:>9.3f}{m['optimizer'] / mib:>9.3f}"
                     f"{state / mib:>9.3f}{formula / mib:>9.3f}{m['activations'] / mib:>9.3f}"
                     f"{m['gathered'] / mib:>10.3f}")
    lines.append("state = params + grads + optim; formula = the ZeRO formula for it with AdamW (ddp 16Ψ, zero1 "
                 "8Ψ+8Ψ/N, zero2 4Ψ+12Ψ/N, fsdp 16Ψ/N + its replicated parameters); act = activations saved "
                 "for backward; gathered = FSDP's full units at their peak")
    return "\n".join(lines)


def formula_bytes(stage: str, psi: int, world: int, replicated: int = 0) -> float:
    """Model-state bytes per rank by the ZeRO formulas: ``Ψ`` trainable fp32 parameters with Adam, ``world`` ranks.

    ``replicated``: parameters FSDP keeps whole on every rank (outside its units), 16 bytes each.
    """
    n = world
    formulas = {"ddp": 16 * psi, "zero1": 8 * psi + 8 * psi / n, "zero2": 4 * psi + 12 * psi / n,
                "fsdp": 16 * (psi - replicated) / n + 16 * replicated}
    return formulas[stage]


# -- python -m minddp.sharding.memory ---------------------------------------------------------------------

def measure_rank(model_name: str, stages: list[str], steps: int = 2, batch: int = 8, seq: int = 32) -> dict:
    """On every rank: each stage trains ``steps`` steps of an offline model; the last step is probed."""
    import torch.distributed as dist

    from minddp.ladder import make_optimizer, wrap
    from minddp.loop import train_step
    from minddp.models import build_model

    out = {}
    g = torch.Generator().manual_seed(dist.get_rank())
    batches = [{"input_ids": torch.randint(1, 92, (batch, seq), generator=g),
                "labels": torch.randint(0, 2, (batch,), generator=g)} for _ in range(steps)]
    for stage in stages:
        model = build_model(model_name, vocab_size=92, pad_token_id=0, seed=0)
        wrapped = wrap(stage, model, bucket_cap_mb=25.0)
        optimizer = make_optimizer(stage, model, torch.optim.AdamW, lr=1e-3)
        probe = None
        for i, b in enumerate(batches):
            if i == steps - 1:
                probe = Probe(wrapped, model, optimizer)
            train_step(wrapped, optimizer, [b], lambda m, b: m(**b).loss)
        out[stage] = probe.result()
    return out


def table(rows: list[dict]) -> str:
    """Markdown: one row per (world size, stage), MiB, measured model state beside the formula."""
    mib = 2 ** 20
    lines = ["| ranks | stage | parameters | gradients | optimizer | model state | formula | measured / formula "
             "| activations | gathered (peak) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        state = r["parameters"] + r["gradients"] + r["optimizer"]
        lines.append(f"| {r['world']} | {r['stage']} | {r['parameters'] / mib:.3f} | {r['gradients'] / mib:.3f} | "
                     f"{r['optimizer'] / mib:.3f} | {state / mib:.3f} | {r['formula'] / mib:.3f} | "
                     f"{state / r['formula']:.4f} | {r['activations'] / mib:.3f} | {r['gathered'] / mib:.3f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Stacked bars per (ranks, stage): parameters, gradients, optimizer state, gathered units; the formula as a tick."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 0.7 * len(rows)), 4))
    colors = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868", "gathered": "#c7c7c7"}
    for x, r in enumerate(rows):
        bottom = 0.0
        for kind, color in colors.items():
            value = r[kind] / 2 ** 20
            ax.bar(x, value, bottom=bottom, color=color, label=kind if x == 0 else None)
            bottom += value
        ax.plot([x - 0.4, x + 0.4], [r["formula"] / 2 ** 20] * 2, color="black", lw=2,
                label="formula (model state)" if x == 0 else None)
    ax.set_xticks(range(len(rows)), [f"{r['stage']}\n{r['world']} ranks" for r in rows], fontsize=7)
    ax.set_ylabel("MiB per rank")
    ax.set_title("Memory per rank, measured from the tensors")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """The CLI (module doc): 0 on success, 2 with one line on bad input."""
    from minddp.cli import Parser, UsageError, fail, number
    from minddp.launch import launch
    from minddp.models import OFFLINE_PRESETS
    parser = Parser(prog="python -m minddp.sharding.memory", examples=[
        "python -m minddp.sharding.memory                              # tiny-llama at 2, 3 and 4 ranks",
        "python -m minddp.sharding.memory --model small-llama --out results/memory   # table, JSON and plot"],
        description="Memory per rank of ddp, zero1, zero2 and fsdp, measured from the tensors, beside the ZeRO "
                    "formulas.")
    parser.add_argument("--model", metavar="NAME", default="tiny-llama",
                        help=f"an offline preset: {', '.join(OFFLINE_PRESETS)}")
    parser.add_argument("--world-sizes", metavar="LIST", default="2,3,4", help="comma list of rank counts")
    parser.add_argument("--out", metavar="DIR", default=None, help="folder for memory.md, memory.json and memory.png")
    try:
        args = parser.parse_args(argv)
        if args.model not in OFFLINE_PRESETS:
            raise UsageError(f"--model {args.model!r}: choose an offline preset ({', '.join(OFFLINE_PRESETS)})")
        try:
            worlds = [number(int, low=1)(w) for w in args.world_sizes.split(",")]
        except ArgumentTypeError as exc:
            raise UsageError(f"--world-sizes {args.world_sizes!r}: {exc}; give a comma list like 2,3,4") from None
    except UsageError as exc:
        return fail("minddp.sharding.memory", exc, parser)
    rows = []
    for world in worlds:
        per_rank = launch(measure_rank, args.model, list(STAGES), world_size=world, backend="gloo")
        for stage in STAGES:
            worst = {k: max(r[stage][k] for r in per_rank) for k in KINDS}
            rep, psi = per_rank[0][stage]["replicated"], per_rank[0][stage]["psi"]
            rows.append({"world": world, "stage": stage, **worst, "psi": psi, "replicated": rep,
                         "formula": formula_bytes(stage, psi, world, rep if stage == "fsdp" else 0)})
    print(table(rows))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "memory.md"), "w") as f:
            f.write(table(rows) + "\n")
        with open(os.path.join(args.out, "memory.json"), "w") as f:
            json.dump(rows, f, indent=1)
        plot(rows, os.path.join(args.out, "memory.png"))
        print(f"wrote {args.out}/memory.md, memory.json, memory.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
