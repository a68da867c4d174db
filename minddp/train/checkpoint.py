"""Checkpoints that lose nothing: written atomically, refused loudly when they do not fit.

A checkpoint must survive the crash it exists for, so a save (on every rank):

1. **gathers** what each rank alone knows (RNG states, comm-hook state such as PowerSGD's error
   memory, losses) onto rank 0; model and optimizer are the same everywhere, rank 0's are kept;
2. **writes** a temporary file in the same folder, flushed and ``fsync``\\ ed;
3. **renames** it over the checkpoint (``os.replace``: a reader sees the old file or the new one)
   and ``fsync``\\ s the folder;
4. meets the other ranks at a **barrier**: "the run passed step N" implies "step N is on disk".

:func:`load_checkpoint` reads a file as data only (:mod:`minddp.runtime.untrusted`: nothing in it
runs, whoever made it), and refuses, in one line naming cause and fix, a file that is not a
checkpoint, asks to run code, is truncated, or does not fit the run (parameters, world size,
:data:`MUST_MATCH` settings). What a crash leaves behind, and the tests: ``docs/reliability.md``
(Checkpoints).

Example (one rank here; under :func:`minddp.launch` every rank runs the same)::

    >>> import os, tempfile
    >>> model = torch.nn.Linear(4, 2); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> path, config = os.path.join(tempfile.mkdtemp(), "bucket.pt"), {"stage": "bucket", "world_size": 1}
    >>> save_checkpoint(path, model=model, optimizer=optimizer, step=10, config=config, extra={"losses": [0.7]})
    >>> ckpt = load_checkpoint(path, model=model, config=config)
    >>> restore(ckpt, optimizer=optimizer)      # and the RNGs; ckpt["step"] says where to go on
    >>> ckpt["step"]
    10
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from minddp.runtime.nested import map_tensors
from minddp.runtime.untrusted import NotData, load_torch_data, refusal
from minddp.train.rng import as_data, from_data, rng_state, set_rng_state

#: Marks the file as ours; bump when the layout changes. (/2: every rank's share is plain data, so the whole file
#: loads with code disallowed; /1 held numpy objects.)
FORMAT = "minddp-checkpoint/2"
#: How a file torch.save wrote begins (a zip archive's first entry); a truncated one still does, and reads as damaged.
ZIP_MAGIC = b"PK\x03\x04"
#: The fix a refusal of a file that is not a checkpoint ends with.
GIVE_A_FILE = "give a file written by python -m minddp.train --save-every"

#: Config fields a resumed run must share with the saved one: they decide the model, the data order
#: or the shape of the per-rank hook state. (``steps``, ``lr``, ``timeout``, profiling may change.)
MUST_MATCH = (
    "model",
    "dtype",
    "dataset",
    "max_seq_len",
    "seed",
    "batch_size",
    "grad_accum",
    "world_size",
    "stage",
    "hook",
    "bucket_cap_mb",
    "powersgd_rank",
    "powersgd_min_compression_rate",
    "powersgd_error_feedback",
    "powersgd_warm_start",
    "sync_every",
    "fragments",
    "fragment_delay",
)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read or does not fit this run; one line: cause and fix."""


# -- what one rank knows ----------------------------------------------------------------------------


def _to_cpu(obj: Any) -> Any:
    """Tensors (also inside a hook state) moved to the CPU, so the file loads on any machine."""
    return map_tensors(lambda t: t.detach().cpu(), obj)


def _hook_fields(hook_state: Any) -> dict | None:
    """The fields of a stateful comm hook (PowerSGD's memory), without its process group.

    A stateless hook's state is ``None``, the process group, or a
    :class:`~minddp.comm.wire.Wire` (a group, a transport and a meter): nothing
    to keep across a restart (and a group cannot be pickled).
    """
    from minddp.comm.wire import Wire

    if hook_state is None or isinstance(hook_state, (dist.ProcessGroup, Wire)):
        return None
    fields = hook_state.__getstate__()  # PowerSGDState drops its group here
    return {k: v for k, v in fields.items() if k != "process_group"} if isinstance(fields, dict) else fields


def hook_state_data(hook_state: Any) -> Any:
    """What a checkpoint keeps of a comm hook's state: its fields on the CPU, as plain data (None: stateless)."""
    return as_data(_to_cpu(_hook_fields(hook_state)))


def _rank_state(hook_state: Any, extra: dict) -> bytes:
    """This rank's share, serialised (gathering bytes keeps tensors off the collective's device)."""
    buf = io.BytesIO()
    share = {"rng": rng_state(), "hook_state": hook_state_data(hook_state), **_to_cpu(extra)}
    torch.save(share, buf)
    return buf.getvalue()


# -- saving -----------------------------------------------------------------------------------------


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the ``.<name>.tmp-<pid>`` files an earlier save of ``path`` left (its process was killed mid-save).

    Only files whose writer is gone: a save that is still running (the pid is
    alive) keeps its file. Returns the names removed.
    """
    from minddp.runtime.processes import alive

    folder, prefix = os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.tmp-"
    removed = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        pid = name[len(prefix) :]
        if name.startswith(prefix) and pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid)):
            try:
                os.remove(os.path.join(folder, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed


def atomic_write(data: bytes, path: str) -> None:
    """Steps 2-3: ``data`` lands at ``path`` completely or not at all (stale temporaries of ``path`` go first)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:  # step 2
            _write_all(f, data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # step 3
    except BaseException:
        if os.path.exists(tmp):  # a failed save must not leave litter beside the good file
            os.remove(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename is an entry in the folder: make it durable too
    finally:
        os.close(dir_fd)


def _write_all(f, data: bytes) -> None:
    f.write(data)


def save_checkpoint(
    path: str,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    config: dict,
    hook_state: Any = None,
    extra: dict | None = None,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Save the run after ``step`` optimizer steps; call on every rank (it gathers and synchronises).

    ``extra`` holds per-rank values to keep (e.g. the losses so far); they come back per rank.
    """
    distributed = dist.is_initialized()
    mine = _rank_state(hook_state, extra or {})
    if distributed:  # step 1
        shares: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(shares, mine, group=group)
        rank = dist.get_rank(group)
    else:
        shares, rank = [mine], 0
    if rank == 0:
        from minddp.runtime.hang import alone

        with alone("writing the checkpoint"):  # the other ranks wait at the barrier meanwhile
            payload = {
                "format": FORMAT,
                "step": step,
                "config": dict(config),
                "model": _to_cpu(model.state_dict()),
                "optimizer": _to_cpu(optimizer.state_dict()),
                "ranks": shares,
            }
            buf = io.BytesIO()
            torch.save(payload, buf)
            atomic_write(buf.getvalue(), path)  # steps 2-3
    if distributed:
        dist.barrier(group=group)  # step 4


# -- loading ----------------------------------------------------------------------------------------


def read_checkpoint(path: str) -> dict:
    """The checkpoint at ``path`` as saved, or :class:`CheckpointError` saying why it cannot be used.

    The format first: a file ``torch.save`` did not write is refused before it is read. Then the
    file and every rank's share are read as data (:func:`~minddp.runtime.untrusted.load_torch_data`):
    a file that asks to run code is refused, and nothing in it runs.
    A folder is a sharded stage's checkpoint (:mod:`minddp.train.sharded_checkpoint`): its ``step`` and
    ``config`` are read, and ``sharded`` is set (it loads at any world size).
    """
    if os.path.isdir(path):
        from minddp.train.sharded_checkpoint import read_meta

        try:
            return {**read_meta(path), "sharded": True}
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    if not os.path.isfile(path):
        raise CheckpointError(f"--resume {path!r}: no such file; give a checkpoint written with --save-every")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != ZIP_MAGIC:  # torch.save writes a zip archive; anything else is not ours, and is not read
        raise CheckpointError(
            f"{path!r} is not a checkpoint (not a file torch.save wrote: no zip archive); "
            "give a file written by python -m minddp.train --save-every"
        )
    try:
        ckpt = load_torch_data(path)
    except NotData as exc:
        raise CheckpointError(refusal(path, exc, GIVE_A_FILE)) from None
    except (pickle.UnpicklingError, UnicodeDecodeError) as exc:  # not a torch file at all (text, random bytes)
        raise CheckpointError(
            f"{path!r} is not a checkpoint (not a file torch.save wrote: {_first_line(exc)}); "
            "give a file written by python -m minddp.train --save-every"
        ) from None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file fails in many ways; the user needs one line
        raise CheckpointError(
            f"checkpoint {path!r} is corrupt or truncated ({_first_line(exc)}); resume from an "
            "earlier checkpoint or start afresh"
        ) from None
    if isinstance(ckpt, dict) and ckpt.get("format") == "minddp-checkpoint/1":
        raise CheckpointError(
            f"{path!r} was written by an older minddp (format minddp-checkpoint/1, whose per-rank state loads only "
            f"with code allowed); start afresh, or resume it with the minddp that wrote it"
        )
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(
            f"{path!r} is not a minddp checkpoint (expected format {FORMAT}); give a file "
            "written by python -m minddp.train --save-every"
        )
    return ckpt


def _share(ckpt: dict, path: str, rank: int) -> dict:
    """Rank ``rank``'s share of the checkpoint, read as data (its numpy values rebuilt)."""
    try:
        return from_data(load_torch_data(io.BytesIO(ckpt["ranks"][rank])))
    except NotData as exc:
        raise CheckpointError(refusal(path, exc, GIVE_A_FILE)) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def check_run(ckpt: dict, path: str, config: dict) -> None:
    """Refuse a checkpoint of another world size or another run (see :data:`MUST_MATCH`)."""
    ranks = ckpt["world_size"] if ckpt.get("sharded") else len(ckpt["ranks"])
    if "world_size" in config and ranks != config["world_size"] and not ckpt.get("sharded"):
        raise CheckpointError(
            f"checkpoint {path!r} was saved by {ranks} ranks, this run has "
            f"{config['world_size']}; resume with --world-size {ranks}"
        )
    if ckpt.get("sharded") and "powersgd" in str(config.get("hook")) and ranks != config.get("world_size", ranks):
        raise CheckpointError(
            f"checkpoint {path!r} was saved by {ranks} ranks, this run has {config['world_size']}; PowerSGD's "
            f"memory (error feedback, P and Q) is each rank's own, so resume with --world-size {ranks}"
        )
    differs = [
        f"--{k.replace('_', '-')} {ckpt['config'].get(k)!r} there, {config[k]!r} here"
        for k in MUST_MATCH
        if k in config and k != "world_size" and ckpt["config"].get(k) != config[k]
    ]
    if differs:
        raise CheckpointError(
            f"checkpoint {path!r} belongs to another run ({'; '.join(differs)}); resume with "
            "the options it was saved with"
        )


def check_model(ckpt: dict, path: str, model: nn.Module) -> None:
    """Refuse a checkpoint of another model: other parameter (or buffer) names, shapes or dtypes."""
    check_shapes(ckpt, path, {name: (tuple(t.shape), t.dtype) for name, t in model.state_dict().items()})


def check_shapes(ckpt: dict, path: str, here: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
    """:func:`check_model` against ``name -> (shape, dtype)`` (e.g. a model built on the meta device)."""
    if ckpt.get("sharded"):
        from minddp.train.sharded_checkpoint import check_shapes as check_sharded

        try:
            return check_sharded(path, here)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
    saved = ckpt["model"]
    if saved.keys() != here.keys():
        only_saved, only_here = sorted(saved.keys() - here.keys()), sorted(here.keys() - saved.keys())
        raise CheckpointError(
            f"checkpoint {path!r} holds another model: entries only in the checkpoint "
            f"{only_saved[:3]}, only in this model {only_here[:3]}; resume with the model "
            "it was saved with"
        )
    for name, (shape, dtype) in here.items():
        if tuple(saved[name].shape) != tuple(shape) or saved[name].dtype != dtype:
            raise CheckpointError(
                f"checkpoint {path!r} holds another model: {name!r} is "
                f"{list(saved[name].shape)} {saved[name].dtype} there, {list(shape)} "
                f"{dtype} here; resume with the model it was saved with"
            )


def check_contents(ckpt: dict, path: str, params: int) -> None:
    """The rest of the file is whole: an optimizer state for ``params`` parameters, every rank's share readable."""
    if ckpt.get("sharded"):  # DCP checks every piece it reads at load; here: every rank's share is there
        from minddp.train.sharded_checkpoint import saved_ranks

        missing = sorted(set(range(ckpt["world_size"])) - saved_ranks(path))
        if missing:
            raise CheckpointError(
                f"checkpoint {path!r} lacks the state of ranks {missing}; resume from an earlier "
                "checkpoint or start afresh"
            )
        return
    try:
        state = ckpt["optimizer"]
        saved_params = sum(len(g["params"]) for g in state["param_groups"])
        shares = [_share(ckpt, path, r) for r in range(len(ckpt["ranks"]))]
        missing = [r for r, share in enumerate(shares) if not {"rng", "hook_state"} <= set(share)]
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any damage inside the file: one line
        raise CheckpointError(
            f"checkpoint {path!r} is damaged inside ({_first_line(exc)}); resume from an "
            "earlier checkpoint or start afresh"
        ) from None
    if saved_params != params:
        raise CheckpointError(
            f"checkpoint {path!r} holds an optimizer for {saved_params} parameters, this model "
            f"has {params}; resume with the model it was saved with"
        )
    if missing:
        raise CheckpointError(
            f"checkpoint {path!r} lacks the state of ranks {missing}; resume from an earlier checkpoint or start afresh"
        )


def load_checkpoint(path: str, *, model: nn.Module, config: dict, rank: int = 0) -> dict:
    """Read and check ``path``; load the model weights; return the checkpoint with this rank's share.

    The returned dict has ``step``, ``optimizer`` and ``rank`` (this rank's
    ``rng``, ``hook_state`` and extras); pass it to :func:`restore`.
    """
    ckpt = read_checkpoint(path)
    check_run(ckpt, path, config)
    check_model(ckpt, path, model)
    model.load_state_dict(ckpt["model"])
    ckpt["rank"] = _share(ckpt, path, rank)
    return ckpt


def restore(ckpt: dict, *, optimizer: torch.optim.Optimizer, hook_state: Any = None) -> None:
    """Put the optimizer, this rank's hook state and RNG streams back as they were at the save."""
    optimizer.load_state_dict(ckpt["optimizer"])  # moves state to the parameters' device
    restore_hook_state(hook_state, ckpt["rank"]["hook_state"], _device_of(optimizer))
    set_rng_state(ckpt["rank"]["rng"])


def restore_hook_state(hook_state: Any, fields: Any, device: torch.device) -> None:
    """Put a comm hook's state back from what :func:`hook_state_data` saved (numpy values rebuilt), on ``device``."""
    if (fields is None) != (_hook_fields(hook_state) is None):
        raise CheckpointError(
            "the checkpoint's comm hook state does not fit this run's hook; resume with the --hook it was saved with"
        )
    if fields is not None:
        group = getattr(hook_state, "process_group", None)
        fields = map_tensors(lambda t: t.to(device), fields)
        if hasattr(hook_state, "__setstate__"):
            hook_state.__setstate__(fields)
        else:
            hook_state.__dict__.update(fields)
        if group is not None:
            hook_state.process_group = group  # keep the live group; a file cannot hold one


def _device_of(optimizer: torch.optim.Optimizer) -> torch.device:
    for group in optimizer.param_groups:
        for p in group["params"]:
            return p.device
    return torch.device("cpu")
