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

Everything a folder holds is read as data (:mod:`minddp.runtime.untrusted`): DCP writes its
``.metadata`` with ``pickle`` and reads it back with ``pickle.load``, and reads non-tensor values with
``torch.load(..., weights_only=False)``; here the metadata goes through an unpickler that knows only
DCP's own record types (:class:`DataReader`), and every value through torch's data-only reader
(:class:`DataPlanner`). :func:`read_checkpoint` reads all but the tensors before any rank starts, so a
folder that asks to run code is refused then, unread. More: ``docs/sharding.md`` (Checkpoints).

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

import dataclasses
import enum
import inspect
import io
import json
import os
import shutil
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from minddp.runtime import compat
from minddp.runtime.untrusted import NotData, load_pickle_data, load_torch_data, refusal
from minddp.train.rng import from_data

#: /2: each rank's extras are plain data (numpy's random state included), so the folder loads with code
#: disallowed; /1 held numpy objects.
FORMAT = "minddp-sharded-checkpoint/2"
META = "minddp.json"
#: The fix a refusal of a folder that is not a sharded checkpoint ends with.
GIVE_A_FOLDER = "give a folder written by python -m minddp.train --save-every with a sharded stage"


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
    """``minddp.json`` of a sharded checkpoint (format, step, config, world_size); ValueError if there is none.

    The format first (a JSON file: nothing in it runs); then everything else but the tensors is read
    as data (:func:`read_rank_extras`): a folder that asks to run code raises a ValueError, unread.
    """
    meta = _meta(path)
    try:
        read_rank_extras(path, sorted(saved_ranks(path)))  # a rank missing is check_contents's to name
    except NotData as exc:
        raise ValueError(refusal(path, exc, GIVE_A_FOLDER)) from None
    except MemoryError:
        raise
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - a damaged folder fails in many ways: one line
        first = (str(exc).splitlines() or [""])[0][:200]
        raise ValueError(
            f"checkpoint {path!r} is corrupt or truncated ({type(exc).__name__}: {first}); "
            "resume from an earlier checkpoint or start afresh"
        ) from None
    return meta


def _meta(path: str) -> dict:
    """``minddp.json`` alone, its format checked."""
    try:
        with open(os.path.join(path, META)) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"{path!r} is not a minddp sharded checkpoint ({type(exc).__name__}); {GIVE_A_FOLDER}"
        ) from None
    found = meta.get("format") if isinstance(meta, dict) else None
    if found == "minddp-sharded-checkpoint/1":
        raise ValueError(
            f"{path!r} was written by an older minddp (format {found}, whose per-rank state loads only with code "
            "allowed); start afresh, or resume it with the minddp that wrote it"
        )
    if found != FORMAT:
        raise ValueError(f"{path!r} is not a minddp sharded checkpoint (format {found!r})")
    return meta


# -- reading a folder as data ------------------------------------------------------------------------

#: Where DCP's own record types live: its ``.metadata`` may name their dataclasses and enums, nothing else there.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
#: The other globals a ``.metadata`` names: sizes, a layout by its name, the folder's path.
_METADATA_GLOBALS = {
    ("torch", "Size"),
    compat.PICKLED_LAYOUT,
    *(
        (module, cls)
        for module in ("pathlib", "pathlib._local")
        for cls in ("PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")
    ),
    ("collections", "OrderedDict"),
}


def _metadata_global(module: str, name: str) -> bool:
    """Whether DCP's ``.metadata`` may name ``module.name``: its records, torch's dtypes, a size, a path."""
    if module in _DCP_MODULES:
        found = vars(sys.modules[module]).get(name)  # a plain look-up: no import, no attribute hook
        return isinstance(found, type) and (dataclasses.is_dataclass(found) or issubclass(found, enum.Enum))
    if module == "torch" and name != "Size":
        return isinstance(vars(torch).get(name), (torch.dtype, torch.layout, torch.memory_format))
    return (module, name) in _METADATA_GLOBALS


class DataReader(dcp.FileSystemReader):
    """DCP's file reader, with its ``.metadata`` unpickled as data: DCP's record types and nothing else."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        rank = kwargs.get("rank")  # torch 2.13 may read one rank's metadata; 2.6 takes no arguments
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as f:
            metadata = load_pickle_data(f, _metadata_global)
        if not isinstance(metadata, Metadata):
            raise NotData(f"its {name} holds a {type(metadata).__name__}, not DCP's metadata")
        if getattr(metadata, "storage_meta", None) is None:  # as DCP's own reader does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class DataPlanner(DefaultLoadPlanner):
    """DCP's load planner, with every non-tensor value (DCP: ``torch.load(weights_only=False)``) read as data."""

    refused: NotData | None = None  # what a value asked to run (DCP wraps the exception; the caller re-raises this)

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            data = load_torch_data(value)
        except NotData as exc:
            self.refused = exc
            raise
        # Handed back to DCP's own placement code as a file of what was just read: plain data, written here,
        # so DCP's torch.load of it rebuilds those values and nothing else.
        plain = io.BytesIO()
        torch.save(data, plain)
        plain.seek(0)
        super().load_bytes(read_item, plain)


def _metadata(path: str) -> Metadata:
    return DataReader(path).read_metadata()


def read_rank_extras(path: str, ranks) -> dict[int, dict]:
    """The extras (RNG states, losses) of ``ranks`` as saved, read as data in this process (no group needed)."""
    state = {"ranks": {str(r): b"" for r in ranks}}
    _load(state, path, alone=True)
    return {int(r): from_data(load_torch_data(io.BytesIO(blob))) for r, blob in state["ranks"].items()}


def _load(state: dict, path: str, alone: bool = False) -> None:
    """``dcp.load`` of ``state`` from ``path``, as data; ``alone``: in this process only, without a group."""
    reader, planner = DataReader(path), DataPlanner()
    kwargs = {}
    if alone and "no_dist" in inspect.signature(dcp.load).parameters:
        kwargs["no_dist"] = True
    elif alone and dist.is_initialized():  # torch 2.6 loads alone only where no group exists
        raise RuntimeError("read_rank_extras reads alone: call it before the process group is made")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # alone: "assuming the intent is to load in a single process" (it is)
            dcp.load(state, checkpoint_id=path, storage_reader=reader, planner=planner, **kwargs)
    except CheckpointException:  # DCP wraps what its reader or planner raised (a BaseException)
        if planner.refused is not None:
            raise planner.refused from None
        raise


def check_shapes(path: str, here: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """Before any rank starts: the checkpoint holds this model (names, sizes, dtypes), else a ValueError names how.

    A chunked tensor is saved flattened, so sizes are compared by element count.
    """
    saved = {k[len("model.") :]: v for k, v in _metadata(path).state_dict_metadata.items() if k.startswith("model.")}
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
    keys = _metadata(path).state_dict_metadata
    return {int(k.split(".", 1)[1]) for k in keys if k.startswith("ranks.")}


def load(path: str, wrapped: nn.Module, model: nn.Module, optimizer) -> tuple[int, dict]:
    """Step 3, on every rank: model and optimizer from ``path``; returns the step and this rank's extras.

    The extras (and RNG states) are this rank's if the saving run had it,
    else rank ``r % saved world size``'s.
    """
    meta = _meta(path)
    mesh = _mesh(wrapped, optimizer)
    saved = _metadata(path).state_dict_metadata
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
    _load(state, path)
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
    return meta["step"], from_data(load_torch_data(io.BytesIO(state["ranks"][mine])))
