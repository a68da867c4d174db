"""The plumbing of ``notebooks/06_sharding``: one fsdp unit gathered alone, and each stage's held sums.

So that the notebook's cells show the idea and the verdicts, these functions read the trainees (each a
:class:`minddp.notebook.lesson.Trainee`) and the :class:`minddp.sharding.memory.Probe` results of its memory step:

* :func:`one_unit`: fsdp's first unit gathered alone, as a forward gathers it, and its bytes;
* :func:`gather_buffers`: the planned all-gather buffers of zero1, zero2 and fsdp, and the send block in them;
* :func:`held_sums`: rank 0's model state at three moments of a step, plus what gathering adds for a stage
  gathering then (:data:`GATHERING`);
* :data:`ZERO2_PARTS`, :data:`FSDP_PARTS`: where :func:`minddp.notebook.source.key_lines` finds the line doing each
  part of ``zero2``'s and ``fsdp``'s code.

No time is measured here: every number is a count of bytes.
"""

from __future__ import annotations

from minddp.sharding.memory import all_gather_buffer_bytes, gathered_bytes

#: each moment of a step, and the stages gathering parameters then (zero1 in its update, zero2 in the first forward
#: after a sync, fsdp in every forward)
GATHERING = {
    "at the update": ("zero1",),
    "at a step's first forward": ("zero2", "fsdp"),
    "at a later micro-batch's forward": ("fsdp",),
}

#: (part, method, a text that the line doing it holds) for :class:`minddp.sharding.zero2.Zero2DDP`
ZERO2_PARTS = [
    ("part 1", "__init__", "self.shard[p] = nn.Parameter("),
    ("part 2", "__init__", "self.comm_hook = reduce_scatter_hook"),
    ("part 2", "_send_bucket", "flat = pack_rank_major("),
    ("part 3", "_write_back", "shard.grad = chunk"),
    ("part 4", "finish_gradient_synchronization", "self.stale = True"),
    ("part 4", "gather_parameters", "wire.all_gather(gathered, block)"),
    ("part 4", "__init__", "register_forward_pre_hook(lambda m, args, b=buckets"),
]

#: the same for :class:`minddp.sharding.fsdp.FullyShardedDataParallel`
FSDP_PARTS = [
    ("part 1", "_make_units", "compat.parameter_dict(owner)[name] = shard"),
    ("part 2", "_before_forward", "self._gather(unit)"),
    ("part 2", "_before_forward", "self._prefetch(unit, +1)"),
    ("part 2", "_before_forward", "Unshard.apply("),
    ("part 3", "_after_forward", "unit.index == self.forward_order[-1]"),
    ("part 3", "_after_forward", "self._free(unit)"),
    ("part 3", "forward", "saved_tensors_hooks(lambda t: me()._pack(t), unpack)"),
    ("part 4", "_unpack", "self._gather(unit)"),
    ("part 4", "_unpack", "if unit.index not in self.backward_seen"),
    ("part 4", "_unpack", "self._prefetch(unit, -1)"),
    ("part 5", "_unit_backward_done", "if not self.sync_this_backward"),
    ("part 5", "_unit_backward_done", "self.pending.append("),
    ("part 6", "finish_gradient_synchronization", "split_block(future.wait()"),
    ("part 6", "finish_gradient_synchronization", "shard.grad = piece.clone()"),
]


def one_unit(fsdp) -> dict[str, int]:
    """Gather ``fsdp``'s first unit alone, as a forward does, then free it. Bytes: ``idle``, gathered before it
    started (between steps: none); ``received``, the all-gather's output buffer; ``full``, the full parameters
    copied out of it (storages of their own); ``planned``, the unit's fp32 values. Every rank must call it: it
    all-gathers."""
    unit = fsdp.units[0]
    idle = gathered_bytes(fsdp)
    fsdp._start_gather(unit)
    received = unit.gathering[0].untyped_storage().nbytes()
    fsdp._gather(unit)  # wait, then copy out
    full = sum(t.untyped_storage().nbytes() for t in unit.full)
    fsdp._free(unit)
    return {"idle": idle, "received": received, "full": full, "planned": sum(unit.numels) * 4}


def gather_buffers(trainees: dict) -> tuple[dict[str, int], dict[str, int]]:
    """Per sharded stage, bytes of the buffers its all-gathers of parameters hold at once, planned by
    :func:`all_gather_buffer_bytes` (zero1's and zero2's: every bucket's; fsdp's: one unit's), and of the send
    block (the all-gathers' input) among them."""
    sharded = {"zero1": trainees["zero1"].optimizer} | {s: trainees[s].model for s in ("zero2", "fsdp")}
    buffers = {s: all_gather_buffer_bytes(x) for s, x in sharded.items()}
    sends = {s: sum(sharded[s].gather_block(b) * 4 for b in sharded[s].buckets) for s in ("zero1", "zero2")}
    sends["fsdp"] = max(sharded["fsdp"].gather_block(u) for u in sharded["fsdp"].units) * 4
    return buffers, sends


def gradients_now(trainee) -> int:
    """Gradient bytes the trainee holds between steps, in every tensor a stage may hold them in (the optimizer's
    parameters, the wrapper's, zero2's full parameters)."""
    held = {id(p): p for g in trainee.optimizer.param_groups for p in g["params"]}
    held |= {id(p): p for p in trainee.model.parameters()} | {id(p): p for p in getattr(trainee.model, "full", [])}
    return sum(p.grad.nbytes for p in held.values() if p.grad is not None)


def held_sums(trainees: dict, memory: dict, between: dict, gathering: dict) -> dict[str, dict[str, int]]:
    """Per moment of :data:`GATHERING`, per stage: rank 0's model state then (parameters and optimizer state from
    ``memory``; gradients as the Probe found them at the update, as held between steps, or as ``between``, the
    most held as a later forward starts), plus ``gathering[stage]`` where the stage gathers at that moment."""
    kept = {s: memory[s]["parameters"] + memory[s]["optimizer"] for s in trainees}
    grads = {
        "at the update": {s: memory[s]["gradients"] for s in trainees},
        "at a step's first forward": {s: gradients_now(t) for s, t in trainees.items()},
        "at a later micro-batch's forward": between,
    }
    return {
        m: {s: kept[s] + grads[m][s] + gathering[s] * (s in stages) for s in trainees}
        for m, stages in GATHERING.items()
    }
