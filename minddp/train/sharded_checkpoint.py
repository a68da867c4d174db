"""Sharded checkpoints of zero1, zero2 and fsdp, through ``torch.distributed.checkpoint`` (DCP).

Gathering a sharded model onto one rank would need the memory sharding saves. Instead each rank
saves what it holds, and DCP maps who saved which part of which tensor, so a checkpoint written by
2 ranks loads at 3 (or 1):

1. **describe**: each chunk a rank holds as a ``DTensor`` (``Shard(0)`` of the flattened tensor:
   minddp's chunks are DTensor's, so no copy); whole tensors stay plain;
2. **save** (:func:`save`): model, optimizer (state by parameter name) and each rank's extras with
   ``dcp.save`` into a temporary folder, renamed to ``path`` once rank 0 has written
   ``minddp.json``;
3. **load** (:func:`load`): the same description for *this* run's ranks, filled by ``dcp.load``.

More: ``docs/sharding.md`` (Checkpoints).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> import os, tempfile
    >>> from minddp.ladder import build_stage
    >>> model = torch.nn.Linear(4, 2); wrapped = build_stage("fsdp", model)
    >>> optimizer, path = torch.optim.AdamW(wrapped.parameters()), os.path.join(tempfile.mkdtemp(), "fsdp")
    >>> save(path, wrapped, model, optimizer, step=10, config={"stage": "fsdp"}, extra={"losses": [0.7]})
    >>> step, mine = load(path, wrapped, model, optimizer)   # at any world size
    >>> step, mine["losses"]
    (10, [0.7])
"""

from __future__ import annotations

import io
import json
import os
import shutil

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

FORMAT = "minddp-sharded-checkpoint/1"
META = "minddp.json"


def sharded_sizes(wrapped: nn.Module, model: nn.Module, optimizer) -> dict[int, int]:
    """``{id(tensor): n}`` for every tensor that is this rank's chunk of a flattened tensor of ``n`` elements."""
    sizes = {id(shard): full.numel() for full, shard in getattr(wrapped, "shard", {}).items()}  # zero2
    sizes.update({id(s): n for unit in getattr(wrapped, "units", []) for s, n in zip(unit.shards, unit.numels)})
    for p, chunk in getattr(optimizer, "chunks", {}).items():  # zero1
        if not optimizer.owned_whole(p):
            sizes[id(chunk)] = p.numel()
    return sizes


def _describe(tensor: torch.Tensor, n: int | None, mesh: DeviceMesh):
    """Step 1: a chunk as a DTensor of the flattened whole; anything else as it is."""
    if n is None:
        return tensor.detach()
    return DTensor.from_local(tensor.detach(), mesh, [Shard(0)], run_check=False, shape=torch.Size([n]), stride=(1,))


def _named_optimizer_params(model: nn.Module, optimizer) -> list[tuple[str, torch.Tensor]]:
    """(parameter name, the tensor the (local) optimizer steps for it), for every one it steps."""
    names = {id(p): name for name, p in model.named_parameters()}
    local = getattr(optimizer, "optim", optimizer)
    if local is not optimizer:  # ZeRO-1: chunks of the named parameters
        return [(names[id(p)], chunk) for p, chunk in optimizer.chunks.items()]
    return [(names[id(p)], p) for group in local.param_groups for p in group["params"]]


def _state_dict(wrapped, model, optimizer, mesh) -> dict:
    sizes = sharded_sizes(wrapped, model, optimizer)
    local = getattr(optimizer, "optim", optimizer)
    model_part = {name: _describe(t, sizes.get(id(t)), mesh) for name, t in model.state_dict(keep_vars=True).items()}
    state = {}
    for name, t in _named_optimizer_params(model, optimizer):
        for key, value in local.state.get(t, {}).items():
            chunked = torch.is_tensor(value) and value.dim() >= 1 and value.shape == t.shape and id(t) in sizes
            state.setdefault(name, {})[key] = _describe(value, sizes[id(t)] if chunked else None, mesh)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"model": model_part, "optim": {"state": state, "param_groups": groups}}


def _mesh(wrapped, optimizer) -> DeviceMesh:
    wire = getattr(wrapped, "wire", None) or getattr(optimizer, "wire", None)
    group = wire.group if wire is not None else dist.group.WORLD
    device = next(iter(wrapped.parameters())).device
    return DeviceMesh.from_group(group, device.type)


def save(
    path: str, wrapped: nn.Module, model: nn.Module, optimizer, *, step: int, config: dict, extra: dict | None = None
) -> None:
    """Step 2, on every rank: the sharded state at ``path`` (a folder), with this rank's ``extra`` and its RNG."""
    from minddp.train.rng import rng_state

    state = _state_dict(wrapped, model, optimizer, _mesh(wrapped, optimizer))
    rank = dist.get_rank()
    blob = io.BytesIO()
    torch.save({"rng": rng_state(), **(extra or {})}, blob)
    state["ranks"] = {str(rank): blob.getvalue()}
    folder, name = os.path.split(os.path.abspath(path))
    tmp, old = os.path.join(folder, f".{name}.tmp"), os.path.join(folder, f".{name}.old")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # litter of a save that crashed
    dist.barrier()
    dcp.save(state, checkpoint_id=tmp)  # every rank writes its part, then rank 0 the metadata
    if rank == 0:
        with open(os.path.join(tmp, META), "w") as f:
            json.dump({"format": FORMAT, "step": step, "config": config, "world_size": dist.get_world_size()}, f)
            f.flush()
            os.fsync(f.fileno())
        # The previous checkpoint steps aside only once the new one is complete (a crash before this
        # line leaves it untouched; between the two renames, it is at .<name>.old).
        if os.path.exists(path):
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def read_meta(path: str) -> dict:
    """``minddp.json`` of a sharded checkpoint (format, step, config, world_size); ValueError if there is none."""
    try:
        with open(os.path.join(path, META)) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{path!r} is not a minddp sharded checkpoint ({type(exc).__name__}); give a folder "
            "written by python -m minddp.train --save-every with a sharded stage"
        ) from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not a minddp sharded checkpoint (format {meta.get('format')!r})")
    return meta


def check_shapes(path: str, here: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """Before any rank starts: the checkpoint holds this model (names, sizes, dtypes), else a ValueError names how.

    A chunked tensor is saved flattened, so sizes are compared by element count.
    """
    saved = {
        k[len("model.") :]: v
        for k, v in dcp.FileSystemReader(path).read_metadata().state_dict_metadata.items()
        if k.startswith("model.")
    }
    if saved.keys() != here.keys():
        only_saved, only_here = sorted(saved.keys() - here.keys()), sorted(here.keys() - saved.keys())
        raise ValueError(
            f"checkpoint {path!r} holds another model: entries only in the checkpoint {only_saved[:3]}, "
            f"only in this model {only_here[:3]}; resume with the model it was saved with"
        )
    for name, (shape, dtype) in here.items():
        info = saved[name]
        if info.size.numel() != torch.Size(shape).numel() or info.properties.dtype != dtype:
            raise ValueError(
                f"checkpoint {path!r} holds another model: {name!r} has {info.size.numel()} "
                f"{info.properties.dtype} elements there, {torch.Size(shape).numel()} {dtype} here; "
                "resume with the model it was saved with"
            )


def saved_ranks(path: str) -> set[int]:
    """The ranks whose own extras (RNG, losses) the checkpoint holds."""
    keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    return {int(k.split(".", 1)[1]) for k in keys if k.startswith("ranks.")}


def load(path: str, wrapped: nn.Module, model: nn.Module, optimizer) -> tuple[int, dict]:
    """Step 3, on every rank: model and optimizer from ``path``; returns the step and this rank's extras.

    The extras (and RNG states) are this rank's if the saving run had it,
    else rank ``r % saved world size``'s.
    """
    meta = read_meta(path)
    mesh = _mesh(wrapped, optimizer)
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = _state_dict(wrapped, model, optimizer, mesh)
    sizes = sharded_sizes(wrapped, model, optimizer)
    for name, t in _named_optimizer_params(model, optimizer):  # a fresh optimizer has no state yet
        prefix = f"optim.state.{name}."
        for key in [k[len(prefix) :] for k in saved if k.startswith(prefix)]:
            if key in state["optim"]["state"].get(name, {}):
                continue
            info = saved[f"optim.state.{name}.{key}"]
            if not isinstance(info, TensorStorageMetadata):
                state["optim"]["state"].setdefault(name, {})[key] = None
                continue
            dtype = info.properties.dtype
            if id(t) in sizes and tuple(info.size) == (sizes[id(t)],):
                value = _describe(torch.zeros(t.shape, dtype=dtype, device=t.device), sizes[id(t)], mesh)
            else:
                value = torch.zeros(tuple(info.size), dtype=dtype, device=t.device)
            state["optim"]["state"].setdefault(name, {})[key] = value
    rank = dist.get_rank()
    mine = str(rank if rank < meta["world_size"] else rank % meta["world_size"])
    state["ranks"] = {mine: b""}
    dcp.load(state, checkpoint_id=path)
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            loaded = state["model"][name]
            t.copy_(loaded.to_local() if isinstance(loaded, DTensor) else loaded)
    local = getattr(optimizer, "optim", optimizer)
    steps = _named_optimizer_params(model, optimizer)
    local_state = {
        i: {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state["optim"]["state"].get(name, {}).items()}
        for i, (name, _) in enumerate(steps)
        if name in state["optim"]["state"]
    }
    index = {id(t): i for i, (_, t) in enumerate(steps)}
    groups = [
        {**{k: v for k, v in g.items() if k != "params"}, **saved_group, "params": [index[id(p)] for p in g["params"]]}
        for g, saved_group in zip(local.param_groups, state["optim"]["param_groups"])
    ]
    local.load_state_dict({"state": local_state, "param_groups": groups})
    for group, saved_group in zip(optimizer.param_groups, state["optim"]["param_groups"]):
        group.update(saved_group)
    if hasattr(wrapped, "gather_parameters"):
        wrapped.gather_parameters()  # zero2: the full parameters from the loaded shards
    ranks = torch.load(io.BytesIO(state["ranks"][mine]), map_location="cpu", weights_only=False)
    return meta["step"], ranks
