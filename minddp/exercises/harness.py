"""The rank side of the exercise checker: train a learner's stage beside two oracles and say what differs.

Runs in each rank of the checker's :class:`~minddp.notebook.Cluster` (:mod:`minddp.exercises.checker`
starts it and reads the reports). A learner's collectives go through the default process group, the
checker's own through a group of its own, so a wrong stage can only hang or fail in its own group.
For a stage (:func:`check_stage_on_rank`):

1. **reference**: train the model answer named by ``like``, counting its collectives;
2. **start**: a different seed on every rank; all must then hold rank 0's weights;
3. **steps**: driven as the ladder's loop drives any stage (``finish_gradient_synchronization()``
   after every backward, ``no_sync()`` around all but the last); every ``.grad`` after the step's
   last finish compared with the average over ranks and the usual mistakes; the step's events
   recorded in order (:class:`Events`);
4. **oracles**: the parameters against a single process (judged) and torch's DDP (reported, not judged);
   then, for ``simple`` and ``ga``, a finish with one ``.grad`` None (:func:`no_gradient_finding`);
5. **report**: one JSON line (``MARK`` + the report), even when the learner's code raised.

For a comm hook, :func:`check_hook_on_rank`. ``notebooks/README.md`` (*Exercises and their checker*)
tells each step in full.

Example::

    >>> # on every rank of a cluster (the checker sends this call; not run by the doctests):
    >>> check_stage_on_rank(MySimpleDDP, like="simple", options={}, steps=3, accum=3)   # doctest: +SKIP
    minddp.exercises.report {"rank": 0, "finding": null, ...}
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from minddp.analysis import live
from minddp.comm import measure
from minddp.comm.wire import Traffic, Wire
from minddp.exercises import solutions
from minddp.runtime import compat

TorchDispatchMode = compat.dispatch_mode_base()

MARK = "minddp.exercises.report "
#: SGD, no momentum: a gradient that is off shows in the parameters at once (Adam would hide a factor).
LR = 0.1
PER_RANK = 4  # examples per rank per micro-batch
IN, HIDDEN, OUT = 6, 16, 3


class Net(nn.Module):
    """The checker's network: three layers of different shapes, and a buffer the stage must broadcast too."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(IN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, OUT)
        self.register_buffer("shift", torch.randn(IN))

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x + self.shift)))))


def make_net(seed: int) -> Net:
    torch.manual_seed(seed)
    return Net()


def micro_batches(step: int, accum: int, rank: int, world: int) -> list[tuple[tuple, tuple]]:
    """``accum`` pairs ``(this rank's shard, the global batch)``; the same global batches on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for _ in range(accum):
        x = torch.randn(PER_RANK * world, IN, generator=g)
        y = torch.randint(0, OUT, (PER_RANK * world,), generator=g)
        out.append(((x[rank::world], y[rank::world]), (x, y)))
    return out


def loss_of(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


#: The line a rank prints as it enters each phase of a check (:class:`Progress`): the checker's runner tells a slow
#: rank, which keeps printing these, from a stuck one, which stops (checker._run).
PHASE = "minddp.exercises.phase "


class Progress:
    """Where this rank is, in words: for a report written after something went wrong, and printed as it changes."""

    def __init__(self):
        self.phase = "starting"

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, text: str) -> None:
        self._phase = text
        print(PHASE + text, flush=True)


def accepted_options(cls, options: dict) -> dict:
    """The options ``cls.__init__`` takes (``bucket_cap_mb`` goes to bucketed stages only)."""
    params = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in options.items() if k in params}


def stage_files(obj) -> set[str]:
    """Source files of the learner's code: the class's own methods (and its bases', below nn.Module)."""
    files = set()
    classes = [c for c in obj.__mro__ if c not in (nn.Module, object)] if isinstance(obj, type) else []
    functions = [f for c in classes for f in vars(c).values()] if classes else [obj]
    for f in functions:
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None) or getattr(getattr(f, "__wrapped__", None), "__code__", None)
        if code is not None:
            files.add(code.co_filename)
    return files


def where_in(exc: BaseException, files: set[str]) -> dict | None:
    """The deepest frame of ``exc``'s traceback in the learner's code: file, line and function."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename in files:
            found = {"file": frame.filename, "line": frame.lineno, "function": frame.name, "text": frame.line}
    return found


def error_report(exc: BaseException, progress: Progress, files: set[str]) -> dict:
    text = f"{type(exc).__name__}: {exc}"
    lowered = text.lower()
    return {
        "type": type(exc).__name__,
        "message": str(exc).strip().splitlines()[0] if str(exc).strip() else "",
        "phase": progress.phase,
        "where": where_in(exc, files),
        # gloo's own timeout, or a peer's connection closed by the runner releasing this rank
        "waiting": isinstance(exc, KeyboardInterrupt)
        or "timed out" in lowered
        or "timeout" in lowered
        or "connection closed" in lowered
        or "connection reset" in lowered,
        "traceback": traceback.format_exc(limit=-6),
        "sizes": getattr(exc, "collective", None),  # a collective's sizes, where it refused them (Events)
        "launched": getattr(exc, "launched", None),  # the kinds the step had launched when it raised (Events)
    }


@contextlib.contextmanager
def reporting(progress: Progress, files: set[str], report: dict):
    """Step 5: print the report whatever happens; re-raise so the runner releases waiting peers."""
    try:
        yield
    except BaseException as exc:  # noqa: BLE001 - a KeyboardInterrupt from the runner is a report too
        report["error"] = error_report(exc, progress, files)
        raise
    finally:
        print(MARK + json.dumps(report, default=str), flush=True)


# ------------------------------------------------------------------------------------------ events
#: The collectives a stage may start, by the dispatcher's op name, and the name the verdicts use (a broadcast
#: during the steps is counted too: no model answer makes one, so one there is traffic the stage adds).
COLLECTIVES = {op: kind for op, (kind, _) in compat.DISPATCHED_COLLECTIVES.items()}
#: A point-to-point message by the dispatcher's op name (a ``send``, as minddp's ring makes them): no collective,
#: counted apart so that a verdict can say what the stage made instead of one.
POINT_TO_POINT = "c10d.send.default"


#: Where torch's and minddp's own code lives: their calls are not the learner's.
_LIBRARIES = tuple(f"{folder}{os.sep}" for folder in (Path(torch.__file__).parent, Path(__file__).parents[1]))


class UngroupedWorldSize(RuntimeError):
    """A transport asked ``dist.get_world_size()`` without its ``group``."""


def _size_of_a_group(world_size, given=None):
    """``dist.get_world_size`` for a transport's run: without a group it is refused (:class:`UngroupedWorldSize`),
    and so is a group other than ``given``, the group the transport was handed (:class:`OtherGroupWorldSize`;
    ``None``: not asked).

    The checker's ranks are the whole world, so the number would come out right here; in a job whose group is a
    part of the world it is the world's, and the padding and the pieces would be cut for the wrong n."""

    def get_world_size(group=None):
        caller = inspect.currentframe().f_back.f_code.co_filename
        if caller.startswith(_LIBRARIES):  # torch's own calls (its error paths) ask without a group too
            return world_size(group)
        if group is None:
            raise UngroupedWorldSize(
                "dist.get_world_size() without group is the size of the whole world, not of the group your "
                "transport sums over (the same here, where the checker's ranks are the whole world; smaller in a "
                "job with several groups): ask dist.get_world_size(group)"
            )
        if given is not None and group is not given:
            raise OtherGroupWorldSize(
                f"dist.get_world_size({_group_name(group)}) is the size of {_group_name(group, 'its')}, not of the "
                f"group your transport was handed (the checker hands it a group of its own over the same ranks: "
                f"the same number here, not in a job with several groups): ask dist.get_world_size(group)"
            )
        return world_size(group)

    return get_world_size


def _group_name(group, article: str = "") -> str:
    """How a verdict names ``group``: ``dist.group.WORLD`` (with ``article``: the whole world) or another group."""
    if group is dist.group.WORLD:
        return "the whole world" if article else "dist.group.WORLD"
    return f"{article} group" if article else "a group of your own"


class UngroupedCollective(RuntimeError):
    """A transport called a reduce-scatter or an all-gather without its ``group`` (or handed it as the op)."""


class OtherGroupWorldSize(UngroupedWorldSize):
    """A transport asked ``dist.get_world_size`` of a group it was not handed (``dist.group.WORLD``)."""


class OtherGroupCollective(UngroupedCollective):
    """A transport called a reduce-scatter or an all-gather over a group it was not handed (``dist.group.WORLD``)."""


class DevicelessTensor(RuntimeError):
    """A transport handed a reduce-scatter or an all-gather a tensor it made without a device (``torch.empty(k)``)."""


#: Why a tensor a transport makes needs the handed tensor's device, and the fix. While a transport runs, a tensor
#: made without a device lands on the meta device (:meth:`Events.transport`): on the checker's CPU ranks the default
#: device is the gradients' own, and ``torch.empty(k)`` would pass here and fail where the gradients lie on a GPU.
DEVICELESS = (
    "a tensor your transport made without a device, torch.empty(k) or torch.zeros(k), lies on the default device, "
    "not on the device of the tensor it was handed: the same here, on the CPU, but not in a job whose gradients lie "
    "on a GPU (while your transport runs, the checker makes such tensors on the meta device, to see them): make "
    "it from the tensor you were handed, padded.new_empty(k), or pass device=tensor.device"
)


def _within_a_group(collective, name: str, group_at: int, given=None):
    """``collective`` (``dist``'s ``name``, its ``group`` at position ``group_at``) for a transport's run: without a
    group it is refused (:class:`UngroupedCollective`), and over a group other than ``given``, the one the transport
    was handed (:class:`OtherGroupCollective`; ``None``: not asked); the checker's ranks are the whole world, so the
    sum would come out right here, and over every rank of a job whose group is a part of the world. A tensor made
    without a device (on the meta device, :meth:`Events.transport`) is refused too (:class:`DevicelessTensor`)."""

    def call(*args, **kwargs):
        op = kwargs.get("op", args[2] if group_at == 3 and len(args) > 2 else None)
        if isinstance(op, dist.ProcessGroup):  # reduce_scatter_single(piece, padded, group): the group by position
            raise UngroupedCollective(
                "the group went into op: reduce_scatter_single takes (output, input, op, group), unlike "
                "all_gather_single's (output, input, group), so a group passed third is its reduce op: pass "
                "group=group by name"
            )
        handed = [t for a in (*args, *kwargs.values()) for t in (a if isinstance(a, (list, tuple)) else [a])]
        if any(isinstance(t, torch.Tensor) and t.is_meta for t in handed):
            raise DevicelessTensor(f"{name} was handed {DEVICELESS}")
        group = kwargs.get("group", args[group_at] if len(args) > group_at else None)
        if group is None:
            raise UngroupedCollective(
                f"{name} was called without group=, so it runs over the whole world, not over the group your "
                "transport sums over (the same here, where the checker's ranks are the whole world; more ranks in a "
                "job with several groups): pass group=group to both collectives"
            )
        if given is not None and group is not given:
            raise OtherGroupCollective(
                f"{name} was called with group={_group_name(group)}, so it runs over {_group_name(group, 'its')}, "
                "not over the group your transport was handed (the checker hands it a group of its own over the "
                "same ranks: the same sum here, not in a job with several groups): pass group=group to both "
                "collectives"
            )
        return collective(*args, **kwargs)

    return call


@contextlib.contextmanager
def _in_place_of(replacements: dict, names: dict):
    """``dist``'s functions swapped for ``replacements`` (name -> function) while it runs, in ``dist`` and under any
    name in ``names`` (a transport's globals: ``from torch.distributed import get_world_size``) bound to the
    original; restored after."""
    originals = {name: getattr(dist, name) for name in replacements}
    bound = [(key, name) for key, value in names.items() for name, f in originals.items() if value is f]
    for name, f in replacements.items():
        setattr(dist, name, f)
    names.update({key: replacements[name] for key, name in bound})
    try:
        yield
    finally:
        for name, f in originals.items():
            setattr(dist, name, f)
        names.update({key: originals[name] for key, name in bound})


class Events(TorchDispatchMode):
    """The order of what one step does, as the stage's own thread sees it: no clock, only the order.

    Four kinds of event go into ``log``, in the order they happen:

    * ``("begin", "backward2")`` / ``("end", "backward2")``, and the same for
      ``finish2``: the checker's own marks around each backward and finish;
    * ``("ready", name)``: autograd has accumulated the gradient of parameter
      ``name`` (a post-accumulate-grad hook the checker registered *before*
      the stage's own, so it fires first; none without a ``module``: a comm
      hook's probe);
    * ``("launch", kind)``: the stage started a collective (``all_reduce``,
      ``reduce_scatter``, ``all_gather``, ``broadcast``, ``reduce``) of floating-point tensors: every
      ``dist.*`` collective goes through the dispatcher on the calling
      thread, async or not;
    * ``("wait", None)``: the stage waited for a collective (``Work.wait()``,
      which a blocking ``dist.all_reduce`` calls too, or ``Future.wait()``);
      ``("wait", "resolved")`` where a callback waited on a work or Future
      already complete (no block: a callback may run at once, inside ``.then()``).

    A message is *in flight* from its launch to the first wait after it. The
    order of these events is fixed by the stage's code, not by the machine:
    a stage that waits in its hook always shows its wait before the next
    ``ready``, however fast the network.

    Each launch's ``Work`` is kept too (``works``), and each wait is matched to
    the launch it waits for (``unwaited``): ``Work.wait()`` on that work, or
    ``wait()`` on a Future its ``get_future()`` returned. A wait on any other
    Future (one chained with ``.then``, or ``torch.futures.wait_all``'s) may be
    waiting for any of the works launched before it, and counts for all of
    them. So a launch is *never waited for* only when the stage's code makes no
    wait that could be for it: a fact of the code's order, whatever the
    network's speed. A launch made inside a Wire's *transport* (notebook 06's
    ``my_all_reduce``) can be waited for only inside it: the Wire hands the
    hook a completed Future as soon as the transport returns, so a wait after
    that (the stage waiting for its bucket) is for none of the transport's own.

    The launches of the steps recorded before are kept too (``earlier``): a
    wait on one of their works, or on a Future one of them gave, is a wait
    *again* for an earlier step's collective (``waited_again``, by kind): a
    list of messages in flight never emptied, which the next finish goes
    over again. That too is the code's order, whatever the network's speed.
    """

    def __init__(self, module: nn.Module | None = None):
        super().__init__()
        self.log: list[tuple[str, str | None]] = []
        self.works: list[tuple[str, object]] = []  #: (kind, work) of each launch, in order (work None: not known)
        self.waited: set[int] = set()  #: indices into ``works`` of those a wait was seen for
        self.futures: list[tuple] = []  #: (future, index into ``works``) of each ``Work.get_future()``
        self.sealed: set[int] = set()  #: indices into ``works`` launched in a transport that has returned (class doc)
        self.earlier: list[tuple[str, list]] = []  #: (kind, [its work, its Futures]) of the steps recorded before
        self.again: set[int] = set()  #: indices into ``earlier`` of those this step waited for again
        self.flying: dict[int, set[int]] = {}  #: index into ``works`` -> storages it sends, until a wait for it
        self.written: list[tuple[str, str]] = []  #: (kind, op) of each write into a tensor still in flight
        self.read: list[tuple[str, str]] = []  #: (kind, op) of each read of a tensor still in flight
        self.in_callback = 0  #: inside a Future's callback, which runs after its work completed: no write races
        self.active = False
        self.handed: int | None = None  #: the length of the tensor a running transport was handed (``transport``)
        self.handed_shape: tuple | None = None  #: and its shape
        self.module = module
        self.on_parameters: list[str] = []  #: the parameters (not their gradients) a collective of this step sent
        #: (name, phase) of each parameter whose ``.grad`` itself a collective of this step sent, one per collective
        self.grads_sent: list[tuple[str, str]] = []
        #: where those collectives were started: "backward" (a grad hook) or "finish"
        self.parameters_sent_in: set[str] = set()
        self.current: str | None = None  #: the phase running (``phase``): "backward1", "finish2", ...
        #: (length handed, length reduce-scattered) of each reduce-scatter a transport made: how it padded before
        self.padded: list[tuple[int, int]] = []
        #: the shape of the tensor a transport last reduce-scattered: more than one dimension where it padded the
        #: tensor as handed, not flattened (``F.pad`` pads the last dimension)
        self.scattered_shape: tuple[int, ...] | None = None
        self.averaged = False  #: a transport's reduce-scatter was asked to average (``op=ReduceOp.AVG``)
        #: a transport all-gathered into a tensor other than the one it reduce-scattered (``scattered``: that one's
        #: data pointer): where the sum then is, the tensor it copies back from must be
        self.gathered_apart = False
        self.scattered: int | None = None
        #: a transport copied into the tensor it was handed from that tensor's own storage (``flat``, a view of it,
        #: not ``padded``, the new tensor ``F.pad`` returned): its own values back, the sum left where it was gathered
        self.copied_own = False
        self._handed_storage: int | None = None
        #: a transport all-gathered before its reduce-scatter: it spread pieces not yet summed, then summed those
        self.gathered_first = False
        #: (end padded, length handed, padded length) where a transport padded a tensor at one end and cut the
        #: padding off the other, so the sum came back shifted (:meth:`_note_padding_ends`); None: never
        self.pad_misplaced: tuple[str, int, int] | None = None
        self._handed_values: torch.Tensor | None = None  #: the running transport's tensor as handed, flat
        self._scatter_input: torch.Tensor | None = None  #: what its reduce-scatter was handed, as handed
        self._gather_output = None  #: the tensor its all-gather filled
        self._gathered_here = self._scattered_here = False  #: in the running transport call, so far
        for name, p in module.named_parameters() if module is not None else ():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _p, name=name: self._note("ready", name))

    def _note(self, what: str, name: str | None) -> None:
        if self.active:
            self.log.append((what, name))

    @contextlib.contextmanager
    def phase(self, name: str):
        self._note("begin", name)
        self.current = name
        try:
            yield
        finally:
            self.current = None
            self._note("end", name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = COLLECTIVES.get(str(func))
        counted = kind is not None and _carries_floats(args[_SENT_ARGUMENT[str(func)]])
        if counted:
            self._note("launch", kind)
        elif str(func) == POINT_TO_POINT:
            self._note("p2p", None)
        if self.handed is not None and str(func) == "aten.copy_.default" and self._handed_storage is not None:
            own = [
                isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == self._handed_storage for t in args[:2]
            ]
            self.copied_own = self.copied_own or all(own)
        if counted and self.handed is not None:  # inside a transport: the order of its two calls
            self._gathered_here = self._gathered_here or (kind == "all_gather" and not self._scattered_here)
            self._scattered_here = self._scattered_here or kind == "reduce_scatter"
            self.gathered_first = self.gathered_first or (kind == "reduce_scatter" and self._gathered_here)
        elif self.active and self.flying and not self.in_callback:
            self._note_writes(func, args, kwargs or {})
            self._note_reads(func, args, kwargs or {})
        try:
            out = func(*args, **(kwargs or {}))
        except RuntimeError as exc:  # what it was handed, for the verdict to say which size is off
            if counted and all(isinstance(t, torch.Tensor) for t in args[:2]):
                exc.collective = {
                    "kind": kind,
                    "output": args[0].numel(),
                    "input": args[1].numel(),
                    "handed": self.handed,  # the length of the tensor the transport was handed (None: no transport)
                    "handed_shape": self.handed_shape,  # and its shape
                    "padded_before": list(self.padded),  # how the transport padded the tensors it summed before
                    # the whole tensor's shape (a reduce-scatter's input, an all-gather's output): gloo cuts its first
                    # dimension, so a tensor padded as handed, not flattened, is refused
                    "shape": tuple(args[1 if kind == "reduce_scatter" else 0].shape),
                }
            raise
        # how a transport padded and where it gathered: read from the tensor collectives (the list ones carry lists)
        if counted and kind == "reduce_scatter" and self.handed is not None and isinstance(args[1], torch.Tensor):
            self._scatter_input = self._scatter_input if self._scatter_input is not None else args[1].detach().clone()
            self.padded.append((self.handed, args[1].numel()))
            self.scattered_shape = tuple(args[1].shape)
            self.scattered = args[1].data_ptr()
        if counted and kind == "all_gather" and self.handed is not None and self.scattered is not None:
            if isinstance(args[0], torch.Tensor):
                self.gathered_apart = self.gathered_apart or args[0].data_ptr() != self.scattered
                self._gather_output = args[0]
        if counted and self.active:
            if kind != "broadcast":  # a parameter broadcast is a copy of rank 0's, not a sum in place of a gradient
                self._note_parameters(args[_SENT_ARGUMENT[str(func)]])
            self.works.append((kind, _work_of(out)))
            self.flying[len(self.works) - 1] = _storages(args[_SENT_ARGUMENT[str(func)]])
        return out

    def _note_parameters(self, sent) -> None:
        """A collective handed a parameter itself (``dist.all_reduce(param)``), not its ``.grad``: noted by name;
        one handed a parameter's ``.grad`` (or a view of it) noted in ``grads_sent``."""
        sent_storages = _storages(sent)
        for name, p in self.module.named_parameters() if self.module is not None else ():
            if p.grad is not None and _storages(p.grad) & sent_storages:
                self.grads_sent.append((name, (self.current or "finish").rstrip("0123456789")))
            if _storages(p) & sent_storages:
                self.parameters_sent_in.add((self.current or "finish").rstrip("0123456789"))
                if name not in self.on_parameters:
                    self.on_parameters.append(name)

    def _note_writes(self, func, args: tuple, kwargs: dict) -> None:
        """An operator that writes into a tensor a launched collective still sends (no wait for it yet): the
        network may read or write it at any moment until that wait, so the outcome is a race; noted by the order
        of the calls, which the code fixes."""
        self._note_in_flight(func, compat.written_tensors(func, args, kwargs), self.written)

    def _note_reads(self, func, args: tuple, kwargs: dict) -> None:
        """An operator that reads a tensor a launched collective still sends (no wait for it yet): the network
        writes the sum into it at some moment before that wait, so what is read (the rank's own values or the sum)
        is a race; noted by the order of the calls, which the code fixes."""
        self._note_in_flight(func, compat.read_tensors(func, args, kwargs), self.read)

    def _note_in_flight(self, func, tensors, into: list) -> None:
        """(kind, op) into ``into`` for each of ``tensors`` that shares storage with a collective still in flight."""
        for tensor in tensors:
            hit = next((i for i, ptrs in self.flying.items() if _storages(tensor) & ptrs), None)
            if hit is not None:
                into.append((self.works[hit][0], str(func).rsplit(".", 1)[0]))

    def _index(self, work) -> int | None:
        return next((i for i, (_, w) in enumerate(self.works) if w is not None and w is work), None)

    def _waited_for(self, index: int | None) -> None:
        """A wait for launch ``index``; ``None``: for some launch before now, so for each of them."""
        if self.active:
            self.waited.update(({index} if index is not None else set(range(len(self.works)))) - self.sealed)
            for i in [index] if index is not None else list(self.flying):
                self.flying.pop(i, None)

    @contextlib.contextmanager
    def transport(self, tensor=None, fn=None, group=None):
        """Around a Wire's transport call: what it launched and did not wait for by its return stays unwaited;
        ``handed``: the length of the ``tensor`` it was handed, while it runs. ``dist.get_world_size`` asks for
        its group meanwhile, as do its reduce-scatters and all-gathers (``group``, the Wire's: the group it must be,
        where given), and a reduce-scatter asked to average is noted
        (``averaged``): all under their names in ``dist`` and under any name the transport ``fn``'s module bound them
        to (:func:`_in_place_of`). A tensor made meanwhile without a device lands on the meta device, not on the CPU
        that the checker's gradients share with the default device (:data:`DEVICELESS`)."""
        start, padded = len(self.works), len(self.padded)
        self.handed = tensor.numel() if isinstance(tensor, torch.Tensor) else None
        self.handed_shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else None
        self._handed_values = tensor.detach().reshape(-1).clone() if isinstance(tensor, torch.Tensor) else None
        self._handed_storage = tensor.untyped_storage().data_ptr() if isinstance(tensor, torch.Tensor) else None
        self._scatter_input = self._gather_output = None
        self._gathered_here = self._scattered_here = False
        self.scattered_shape = None
        # the list collectives too (dist.reduce_scatter, dist.all_gather): their group sits where the others' does
        scatters = [n for n in ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter") if hasattr(dist, n)]
        gathers = [n for n in ("all_gather_single", "all_gather_into_tensor", "all_gather") if hasattr(dist, n)]
        swaps = {name: _within_a_group(self._noting_average(getattr(dist, name)), name, 3, group) for name in scatters}
        swaps.update({name: _within_a_group(getattr(dist, name), name, 2, group) for name in gathers})
        swaps["get_world_size"] = _size_of_a_group(dist.get_world_size, group)
        try:
            with _in_place_of(swaps, getattr(fn, "__globals__", {})), compat.meta_device():
                yield
            self._note_padding_ends(tensor)
        except RuntimeError as exc:  # raised outside a collective, after this call padded what it reduce-scattered
            grown = [(a, b) for a, b in self.padded[padded:] if b != a]
            if grown and getattr(exc, "collective", None) is None:
                exc.collective = {"kind": "copy_back", "handed": grown[-1][0], "padded": grown[-1][1],
                                  "shape": self.scattered_shape}  # fmt: skip
            elif getattr(exc, "collective", None) is None and len(self.scattered_shape or ()) > 1:
                # a reduce-scatter refused a tensor padded as handed (seen by the swap, outside dispatch too)
                exc.collective = {"kind": "unflattened", "shape": self.scattered_shape}
            raise
        finally:
            self.handed = None
            self.sealed.update(i for i in range(start, len(self.works)) if i not in self.waited)

    def _note_padding_ends(self, tensor) -> None:
        """After a transport returned: where it padded (the handed values at the front of what its reduce-scatter was
        handed, or at the end) against where it cut the sum it copied back out of the tensor it all-gathered into.
        Padded at one end and cut at the other, the sum came back shifted by the padding (``pad_misplaced``)."""
        handed, scattered, gathered = self._handed_values, self._scatter_input, self._gather_output
        self._handed_values = self._scatter_input = self._gather_output = None
        if self.pad_misplaced or handed is None or scattered is None or not isinstance(gathered, torch.Tensor):
            return
        n, total = handed.numel(), scattered.numel()
        pad = total - n
        if pad <= 0 or gathered.numel() != total or tensor.numel() != n:
            return
        self.in_callback += 1  # the checker's own reads, not the transport's: no note of a read in flight
        try:
            flat, whole, back = scattered.reshape(-1), gathered.detach().reshape(-1), tensor.detach().reshape(-1)
            at_end = torch.equal(flat[:n], handed) and not torch.equal(flat[pad:], handed)
            at_front = torch.equal(flat[pad:], handed) and not torch.equal(flat[:n], handed)
            if torch.equal(whole[:n], whole[pad:]):
                return
            if at_front and torch.equal(back, whole[:n]):
                self.pad_misplaced = ("front", n, total)
            elif at_end and torch.equal(back, whole[pad:]):
                self.pad_misplaced = ("end", n, total)
        finally:
            self.in_callback -= 1

    def _noting_average(self, scatter):
        """``scatter`` (a reduce-scatter of ``dist``), noting ``op=ReduceOp.AVG`` in ``averaged``."""

        def reduce_scatter(output, input, op=dist.ReduceOp.SUM, *args, **kwargs):
            self.averaged = self.averaged or op == dist.ReduceOp.AVG
            if isinstance(input, torch.Tensor):  # before the call, which may refuse it (gloo cuts the first dimension)
                self.scattered_shape = tuple(input.shape)
            try:
                return scatter(output, input, op, *args, **kwargs)
            except RuntimeError as exc:  # a flat input refused outside dispatch (the shaped tensor): its sizes
                flat = isinstance(input, torch.Tensor) and isinstance(output, torch.Tensor) and input.dim() == 1
                if flat and getattr(exc, "collective", None) is None:
                    exc.collective = {"kind": "reduce_scatter", "output": output.numel(), "input": input.numel(),
                                      "handed": self.handed, "handed_shape": self.handed_shape,
                                      "padded_before": list(self.padded), "shape": tuple(input.shape)}  # fmt: skip
                raise

        return reduce_scatter

    def _again(self, waited) -> bool:
        """Whether ``waited`` (a work or a Future) is an earlier step's launch (class doc); if so, counted."""
        where = next((i for i, (_, xs) in enumerate(self.earlier) if any(x is waited for x in xs)), None)
        if where is not None and self.active:
            self.again.add(where)
        return where is not None

    @property
    def waited_again(self) -> dict[str, int]:
        """Kind -> how many of the earlier steps' launches this step waited for again (each counted once)."""
        kinds = [self.earlier[i][0] for i in sorted(self.again)]
        return {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}

    def unwaited(self) -> list[str]:
        """The kinds of the launches no wait could be for (class doc), in launch order."""
        return [kind for i, (kind, _) in enumerate(self.works) if i not in self.waited]

    @contextlib.contextmanager
    def recording(self):
        """Record one step: the dispatch mode on, ``wait()`` of works and futures noted (restored after)."""
        future = compat.future_type()
        work_wait, work_future, future_wait, future_then = (
            dist.Work.wait,
            dist.Work.get_future,
            future.wait,
            future.then,
        )
        events = self

        def then(self, callback, *args, **kwargs):
            def called_back(fut):
                events.in_callback += 1
                try:
                    return callback(fut)
                finally:
                    events.in_callback -= 1

            return future_then(self, called_back, *args, **kwargs)

        def waited_work(self, *args, **kwargs):
            events._note("wait", "resolved" if events.in_callback and self.is_completed() else None)
            index = events._index(self)
            if index is None and events._again(self):
                pass  # an earlier step's work: a wait for none of this step's
            elif index is not None or any(w is None for _, w in events.works):  # else another work: for none
                events._waited_for(index)
            return work_wait(self, *args, **kwargs)

        def future_of_work(self):
            future = work_future(self)
            if events.active:
                events.futures.append((future, events._index(self)))
            return future

        def waited_future(self, *args, **kwargs):
            events._note("wait", "resolved" if events.in_callback and self.done() else None)
            index = next((i for f, i in events.futures if f is self), None)
            if index is not None or not events._again(self):
                events._waited_for(index)
            return future_wait(self, *args, **kwargs)

        def sealing(method):
            def call(wire, *args, **kwargs):
                with (
                    events.transport(args[0] if args else None, wire.transport, wire.group)
                    if wire.transport is not None
                    else contextlib.nullcontext()
                ):
                    return method(wire, *args, **kwargs)

            return call

        sends = {name: getattr(Wire, name) for name in ("all_reduce", "reduce_scatter", "all_gather")}
        # the last step's launches (and their works' Futures) become earlier ones
        self.earlier += [
            (kind, [w, *(f for f, j in self.futures if j == i)])
            for i, (kind, w) in enumerate(self.works)
            if w is not None
        ]
        self.log, self.works, self.waited, self.futures, self.active, self.sealed = [], [], set(), [], True, set()
        self.again, self.flying, self.written, self.read, self.on_parameters = set(), {}, [], [], []
        self.parameters_sent_in, self.grads_sent = set(), []
        dist.Work.wait, dist.Work.get_future, future.wait = waited_work, future_of_work, waited_future
        future.then = then
        for name, method in sends.items():
            setattr(Wire, name, sealing(method))
        try:
            with self:
                yield self
        except BaseException as exc:
            # what the step had launched when it raised: a None met after an all_reduce is likely its result
            with contextlib.suppress(Exception):
                exc.launched = [kind for kind, _ in self.works]
            raise
        finally:
            dist.Work.wait, dist.Work.get_future, future.wait = work_wait, work_future, future_wait
            future.then = future_then
            for name, method in sends.items():
                setattr(Wire, name, method)
            self.active = False


class InitBroadcasts(TorchDispatchMode):
    """Around a stage's ``__init__``: ``made`` counts its floating-point broadcasts, ``stray`` those that sent
    none of ``module``'s own tensors (a broadcast into a copy, ``p.data.clone()``, lands nowhere in the module)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.own = _storages([*module.parameters(), *module.buffers()])
        self.made = self.stray = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if COLLECTIVES.get(str(func)) == "broadcast" and _carries_floats(sent := args[_SENT_ARGUMENT[str(func)]]):
            self.made += 1
            self.stray += not (_storages(sent) & self.own)
        return func(*args, **(kwargs or {}))


def _storages(sent) -> set[int]:
    """The addresses of the storages under a tensor or a (nested) list of them: two tensors share memory when
    they share one (a view, a slice, the tensor itself)."""
    if isinstance(sent, torch.Tensor):
        try:
            return {sent.untyped_storage().data_ptr()}
        except (RuntimeError, NotImplementedError):  # no storage (a meta or wrapper tensor): nothing to share
            return set()
    return set().union(*(_storages(x) for x in sent)) if isinstance(sent, (list, tuple)) else set()


def _group_of(boxed):
    """The ``ProcessGroup`` a collective op was handed through the dispatcher, as ``dist.*`` took it (the same
    Python object, ``ProcessGroup.unbox``); ``None`` if not known."""
    unbox = getattr(dist.ProcessGroup, "unbox", None)
    try:
        return unbox(boxed) if unbox is not None else None
    except (TypeError, RuntimeError):
        return None


def _work_of(out):
    """The ``Work`` a collective op returned through the dispatcher (its last output), as ``dist.*`` returns it:
    the same Python object (``Work.unbox``), so a later ``wait()`` on it is matched; ``None`` if not known."""
    boxed = out[-1] if isinstance(out, (tuple, list)) else out
    unbox = getattr(dist.Work, "unbox", None)
    try:
        return unbox(boxed) if unbox is not None else None
    except (TypeError, RuntimeError):
        return None


def _carries_floats(sent) -> bool:
    """Gradients are floating point; a stage's bookkeeping (the ladder's check of which parameters were
    used, ``all_gather_object``) sends integers: not counted as the stage's messages."""
    if isinstance(sent, torch.Tensor):
        return sent.is_floating_point() or sent.is_complex()
    return any(_carries_floats(item) for item in sent) if isinstance(sent, (list, tuple)) else False


def summarize(log: list, phases: list[str]) -> dict:
    """One step's log (:class:`Events`) as counts: collectives per phase and kind, and the overlap.

    ``counts``: collectives started inside each phase (``backward1``.., ``finish1``..,
    ``elsewhere``); ``kinds``: per kind of collective; ``in_flight``: the most
    messages that were in flight (launched in the same backward, no wait
    since) when a backward computed its last gradient, that is, messages
    that travelled while backward was still computing.
    """
    counts = {name: 0 for name in phases}
    counts["elsewhere"] = 0
    kinds: dict[str, int] = {}
    in_flight = p2p = 0
    current, pending, at_last_ready = None, 0, 0
    for what, name in log:
        if what == "begin":
            current, pending, at_last_ready = name, 0, 0
        elif what == "end":
            if current and current.startswith("backward"):
                in_flight = max(in_flight, at_last_ready)
            current = None
        elif what == "launch":
            counts[current or "elsewhere"] += 1
            kinds[name] = kinds.get(name, 0) + 1
            pending += 1
        elif what == "wait":
            pending = 0
        elif what == "ready":
            at_last_ready = pending  # the last ready of the backward is the one that counts
        elif what == "p2p":
            p2p += 1
    return {"counts": counts, "kinds": kinds, "in_flight": in_flight, "p2p": p2p}


# ------------------------------------------------------------------------------------------ one step
def forward_decides(step: int) -> bool:
    """Whether :func:`run_step` runs only the forwards inside ``no_sync()`` in ``step`` (even steps), their
    backwards after the with-block: torch's rule, the forward decides whether the backward syncs."""
    return step % 2 == 0


def run_step(
    model: nn.Module, optimizer, module: nn.Module, micro, progress: Progress, step: int, events: Events
) -> dict:
    """Step 3: one optimizer step as :func:`minddp.ladder.loop.train_step` drives any stage, its events recorded.

    As a user's script: the micro-batches but the last inside ``no_sync()``
    (where the stage has one: forward and backward inside it in odd steps, only
    the forward in even ones, whose backward follows the with-block: the forward
    decides whether its backward syncs), ``finish_gradient_synchronization()`` after
    every backward (where it exists), so whether a backward syncs is the
    stage's own decision. Returns the gradients after finish, the collectives
    started in each phase (``backward1``..``backwardK``, ``finish1``..), per
    kind, the messages in flight while backward computed (:func:`summarize`),
    the collectives the step never waited for (``unwaited``, :meth:`Events.unwaited`:
    by the end of the last finish, no wait that could be for them), and whether
    ``no_sync()`` left torch's flag ``require_backward_grad_sync`` off after its
    with-block (``left_off``).
    """
    k = len(micro)
    no_sync = getattr(model, "no_sync", None)
    finish = getattr(model, "finish_gradient_synchronization", None)
    names = [f"backward{i + 1}" for i in range(k)] + [f"finish{i + 1}" for i in range(k)]
    left_off = False
    decides = forward_decides(step)
    with events.recording():
        for i, (shard, _) in enumerate(micro):
            quiet = no_sync is not None and i < k - 1

            def backward(i=i):
                progress.phase = f"running the backward of step {step}, micro-batch {i + 1}"
                with events.phase(f"backward{i + 1}"):
                    loss.backward()

            if quiet:  # no_sync() runs its lines before the forward: an error there is named as entering it
                progress.phase = f"entering no_sync() in step {step}, before the forward of micro-batch {i + 1}"
            with no_sync() if quiet else contextlib.nullcontext():
                progress.phase = f"running the forward of step {step}, micro-batch {i + 1}"
                loss = loss_of(model, shard) / k
                if not decides:
                    backward()
            if decides:
                backward()
            left_off = left_off or (quiet and getattr(model, "require_backward_grad_sync", True) is False)
            if finish is not None:
                progress.phase = f"running finish_gradient_synchronization() in step {step}, after micro-batch {i + 1}"
                with events.phase(f"finish{i + 1}"):
                    finish()
    progress.phase = f"comparing the gradients of step {step} (the checker)"
    grads = grads_of(module)
    summary = summarize(events.log, names)
    summary["unwaited"] = events.unwaited()
    summary["waited_again"] = dict(events.waited_again)
    summary["written_in_flight"] = list(dict.fromkeys(events.written))
    summary["read_in_flight"] = list(dict.fromkeys(events.read))
    summary["on_parameters"] = list(events.on_parameters)
    summary["parameters_sent_in"] = sorted(events.parameters_sent_in)
    summary["grads_sent"] = list(events.grads_sent)
    summary["averaged"] = events.averaged
    summary["gathered_apart"] = events.gathered_apart
    summary["copied_own"] = events.copied_own
    summary["gathered_first"] = events.gathered_first
    summary["pad_misplaced"] = events.pad_misplaced
    progress.phase = f"stepping the optimizer in step {step}"
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"grads": grads, "left_off": left_off, "has_no_sync": no_sync is not None, **summary}


def grads_of(module: nn.Module) -> dict:
    return {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in module.named_parameters()}


def local_micro_grads(module: nn.Module, micro) -> list[dict]:
    """Each micro-batch's gradient on this rank's shard (loss / k), from a plain copy: no hooks, no sync."""
    probe = Net()
    probe.load_state_dict(module.state_dict())
    k = len(micro)
    out = []
    for shard, _ in micro:
        probe.zero_grad(set_to_none=True)
        (loss_of(probe, shard) / k).backward()
        out.append({n: p.grad.detach().clone() for n, p in probe.named_parameters()})
    return out


def mean_over_ranks(grads: dict, group) -> dict:
    out = {}
    for name, g in grads.items():
        t = g.clone()
        dist.all_reduce(t, group=group)
        out[name] = t / dist.get_world_size(group)
    return out


def rank0_copy(grads: dict, group) -> dict:
    """Rank 0's ``grads``, on every rank of ``group`` (what a broadcast from rank 0 leaves)."""
    out = {}
    for name, g in grads.items():
        t = g.clone()
        dist.broadcast(t, src=0, group=group)
        out[name] = t
    return out


def add(a: dict, b: dict) -> dict:
    return {n: a[n] + b[n] for n in a}


def scale(a: dict, s: float) -> dict:
    return {n: a[n] * s for n in a}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` is the candidate ``b`` up to float32 rounding, and not another candidate.

    The stage and the checker compute the same local gradients (the same kernels on the same shards) and
    average them with a few float32 roundings in another order (divide before or after the sum, accumulate
    micro-batches before or after syncing): each element is off by a few ``u = 2**-24 ≈ 6e-8`` of the
    terms' magnitude, norm-wise some 1e-7 of the gradient's norm. 1e-4 is a thousand times that, and still
    far below the distance between any two candidates (a factor of the world size, a missing micro-batch:
    tens of percent), so no machine's rounding can move a gradient from one candidate to another.
    """
    return a.shape == b.shape and float((a - b).norm()) <= 1e-4 * float(b.norm()) + 1e-7


#: World sizes a learner may write as a number instead of asking for it (2: the notebooks' ranks, 4: notebook 01's);
#: each is a candidate where the check runs on another number of ranks (``checker.check``'s second world size).
#: The fp16 hook's probe (:func:`probe_result`) names any whole divisor, not only these.
HARD_CODED = (2, 4, 8)
#: The kind of the candidate that divides by ``d`` is ``HARD_CODED_KIND + str(d)``.
HARD_CODED_KIND = "hard_coded_"


def candidates(
    local: list[dict], averaged: list[dict], world: int, synced_after: list[bool], rank0: list[dict] | None = None
) -> dict[str, dict]:
    """Step 3's list of usual mistakes, each as the gradient it would leave in ``.grad``.

    ``local[i]`` is this rank's gradient of micro-batch ``i``, ``averaged[i]``
    its average over ranks, ``synced_after[i]`` whether the stage made
    collectives in micro-batch ``i``'s backward or finish (a stage without
    ``no_sync()`` syncs after each one). A sync that sums (or divides twice, or
    by a number written in the code, :data:`HARD_CODED`) compounds over those
    syncs, so those candidates follow the stage's own schedule: what was
    synced is the same on every rank, what was added since is this rank's own.
    A sync that also divides by ``k`` (the number of micro-batches, which the
    loss was already divided by) compounds the same way.
    ``rank0[i]`` is rank 0's gradient of micro-batch ``i``: a stage that broadcasts
    the gradients from rank 0 leaves their sum on every rank, whatever its schedule
    (on rank 0 that is its own, found as ``local`` first).
    """
    k = len(local)
    zero = scale(local[0], 0.0)

    def following_schedule(factor: float, summed: bool = True) -> dict:
        common, pending_local, pending_mean = zero, zero, zero
        for i in range(k):
            pending_local, pending_mean = add(pending_local, local[i]), add(pending_mean, averaged[i])
            if synced_after[i]:  # every rank now holds factor × (the sum over ranks)
                common = scale(add(common, pending_mean if summed else pending_local), factor)
                pending_local, pending_mean = zero, zero
        return add(common, pending_local)

    expected = zero
    accumulated = zero
    for i in range(k):
        expected, accumulated = add(expected, averaged[i]), add(accumulated, local[i])
    found = {
        "ok": expected,
        "local": accumulated,
        "summed": following_schedule(float(world)),
        "divided_twice": following_schedule(1.0 / world),
        # divided by the world size, but the sum went to a copy that never came back into .grad
        "unsummed": following_schedule(1.0 / world, summed=False),
    }
    if k > 1:  # divided by k too at every sync, although the loss was already divided by k (train_step)
        found["divided_by_accum"] = following_schedule(1.0 / k)
    if not all(synced_after):  # every finish divided .grad, the finishes after a backward that did not sync too
        found["divided_unsynced"] = divided_every_finish(local, averaged, world, synced_after)
    for divisor in HARD_CODED:  # the sum divided by a number written in the code, not by the world size
        if divisor != world:
            found[f"{HARD_CODED_KIND}{divisor}"] = following_schedule(world / divisor)
    if k > 1:
        earlier = zero
        for g in local[:-1]:
            earlier = add(earlier, g)
        found["incoming"] = add(earlier, averaged[-1])  # the last backward's own gradient, synced
        found["incoming_only"] = averaged[-1]  # ... and written over the accumulated one
        found["incoming_summed"] = add(earlier, scale(averaged[-1], world))
        found["last_only"] = local[-1]  # the earlier micro-batches were lost
        averaged_earlier = zero
        for g in averaged[:-1]:
            averaged_earlier = add(averaged_earlier, g)
        # a bucket sent before its last gradient was in: its other members averaged as they stood before the last
        # backward added to them; then that backward's own part added on top, or (written back later) lost
        found["sent_early"] = add(averaged_earlier, local[-1])
        found["sent_early_overwritten"] = averaged_earlier
    if rank0 is not None:  # broadcast from rank 0 instead of averaged: rank 0's own gradient everywhere
        found["rank0"] = zero
        for g in rank0:
            found["rank0"] = add(found["rank0"], g)
    return found


def divided_every_finish(local: list[dict], averaged: list[dict], world: int, synced_after: list[bool]) -> dict:
    """The gradient a stage leaves that divides every ``.grad`` by the world size in every finish: after a backward
    that did not sync, this rank's own gradient divided; after one that synced, the sum of what every rank held
    divided (the average over ranks of it). ``mine``: what this rank holds; ``mean``: the average over ranks of
    what each holds (averaging is linear, so the same sum of ``averaged``)."""
    mine = mean = scale(local[0], 0.0)
    for i in range(len(local)):
        mine, mean = add(mine, local[i]), add(mean, averaged[i])
        if synced_after[i]:
            mine = mean
        else:
            mine, mean = scale(mine, 1.0 / world), scale(mean, 1.0 / world)
    return mine


def classify(grads: dict, found: dict[str, dict]) -> dict[str, str]:
    """Each parameter's gradient named by the first candidate it equals (``other`` if none, ``none``)."""
    out = {}
    for name, g in grads.items():
        if g is None:
            out[name] = "none"
            continue
        out[name] = next((key for key, cand in found.items() if close(g, cand[name])), "other")
    return out


def largest_difference(a: dict, b: dict) -> tuple[float, str]:
    diffs = [(float((a[n] - b[n]).abs().max()), n) for n in a if a[n] is not None and b.get(n) is not None]
    return max(diffs) if diffs else (0.0, "")


# ------------------------------------------------------------------------------------------ stages
def check_stage_on_rank(stage_cls, like: str | None, options: dict, steps: int, accum: int) -> None:
    """Steps 1-5 for a stage class; the report goes to stdout (see the module doc)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    checker = dist.new_group(backend="gloo")  # the checker's collectives: never paired with the learner's
    # a transport is handed a group of its own over the same ranks, not the world's: one that sums over
    # dist.group.WORLD instead is named (OtherGroupCollective), as it would sum over a larger job's every rank
    own = dist.new_group(ranks=list(range(world))) if like == "halves" else None
    options = options if own is None else {**options, "process_group": own}
    progress = Progress()
    files = stage_files(stage_cls)
    report: dict = {
        "rank": rank,
        "world": world,
        "steps": steps,
        "accum": accum,
        "like": like,
        "finding": None,
        "reference_counts": None,
        "counts": [],
        "checked_steps": 0,
    }
    try:
        with reporting(progress, files, report):
            if like is not None:  # step 1
                progress.phase = f"training the model answer '{like}'"
                reference = solutions.STAGES[like]
                ref = train(reference, options, steps, accum, Progress(), checker, compare=False)
                report["reference_counts"] = ref["counts"]
                report["reference_kinds"], report["reference_in_flight"] = ref["kinds"], ref["in_flight"]
            # a finish that syncs every .grad (simple, ga) is also given a parameter with no gradient
            unused = like in ("simple", "ga")
            report.update(train(stage_cls, options, steps, accum, progress, checker, compare=True, unused=unused))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(checker)
        if own is not None:
            with contextlib.suppress(Exception):
                dist.destroy_process_group(own)


def train(
    stage_cls, options: dict, steps: int, accum: int, progress: Progress, checker, compare: bool, unused: bool = False
) -> dict:
    """Steps 2-4 for one class: returns counts per step, and with ``compare`` the first finding (and with
    ``unused``, under ``no_gradient``, that of :func:`no_gradient_finding` after the steps: the checker names it
    only once the steps' averages passed on every world size it checks)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict = {"counts": [], "kinds": [], "in_flight": [], "p2p": []}
    out.update(finding=None, checked_steps=0, has_no_sync=False)
    module = make_net(seed=rank)  # a different init on every rank: the broadcast must fix it
    out["tensors"] = sum(1 for p in module.parameters() if p.requires_grad)  # what one sync per tensor sends
    events = Events(module)  # its hooks before the stage's: they fire first
    progress.phase = "building your stage"
    with InitBroadcasts(module) as broadcasts:
        model = stage_cls(module, **accepted_options(stage_cls, options))
    progress.phase = "comparing the parameters after __init__ (the checker)"
    if compare:
        out["finding"] = start_finding(module, checker, broadcasts)
        if out["finding"]:
            return out
    single = make_net(seed=0)  # rank 0's init: where every rank must start
    single_opt = torch.optim.SGD(single.parameters(), lr=LR)
    reference_ddp = nn.parallel.DistributedDataParallel(make_net(seed=0), process_group=checker) if compare else None
    reference_opt = torch.optim.SGD(reference_ddp.parameters(), lr=LR) if compare else None
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(1, steps + 1):
        micro = micro_batches(step, accum, rank, world)
        if compare:
            progress.phase = f"computing the expected gradients of step {step} (the checker)"
            local = local_micro_grads(module, micro)
            averaged = [mean_over_ranks(g, checker) for g in local]
            rank0 = [rank0_copy(g, checker) for g in local]
            # the parameters as the step found them: a stage that flattened the parameters, not their .grad, and wrote
            # the averaged slices back into the gradients leaves these values there (the same on every rank)
            values = {n: p.detach().clone() for n, p in module.named_parameters()}
        record = run_step(model, optimizer, module, micro, progress, step, events)
        for key in ("counts", "kinds", "in_flight", "p2p"):
            out[key].append(record[key])
        out["has_no_sync"] = record["has_no_sync"]
        if not compare:
            continue
        progress.phase = f"comparing the gradients of step {step} (the checker)"
        out["finding"] = never_waited_finding(record["unwaited"], record["kinds"], step, checker)
        if out["finding"] is None:  # a list never emptied: named before its gradients, right or wrong
            out["finding"] = waited_again_finding(record["waited_again"], step, checker)
        if out["finding"] is None:  # a tensor written while its collective flies: its gradients are a race's
            out["finding"] = written_in_flight_finding(record["written_in_flight"], step, checker)
        if out["finding"] is None:  # a tensor read while its collective flies: what was read is a race's
            out["finding"] = read_in_flight_finding(record["read_in_flight"], step, checker)
        if out["finding"] is not None:  # its gradients are a race's outcome, or the list's: nothing more to compare
            out["checked_steps"] = step
            break
        synced = [record["counts"][f"backward{i + 1}"] + record["counts"][f"finish{i + 1}"] > 0 for i in range(accum)]
        kinds = classify(record["grads"], {**candidates(local, averaged, world, synced, rank0), "values": values})
        everyone: list = [None] * world
        mine = (kinds, record["on_parameters"], record["parameters_sent_in"], record["grads_sent"])
        dist.all_gather_object(everyone, mine, group=checker)
        out["finding"] = gradient_finding([k for k, *_ in everyone], step, record, local, averaged)
        on_parameters = sorted({name for _, names, _, _ in everyone for name in names})
        sent_in = sorted({where for _, _, places, _ in everyone for where in places})
        if out["finding"] is not None and out["finding"]["kind"] == "local" and on_parameters:
            out["finding"] = {**out["finding"], "kind": "reduced_parameters", "names": on_parameters, "in": sent_in}
        if out["finding"] is not None and out["finding"]["kind"] == "local":  # the sums went to one gradient, again
            out["finding"] = resent_finding(out["finding"], everyone[0][3]) or out["finding"]
        if out["finding"] is not None and "reduce" in record["kinds"]:  # the sum left on one rank: reduce's dst
            out["finding"] = {**out["finding"], "kind": "reduced"}
        if out["finding"] is not None and record["left_off"]:  # the cause, where the stage shows it (torch's flag)
            out["finding"] = {"kind": "left_off", "step": step, "ranks": list(range(world))}
        if out["finding"] is None:
            oracle_step(single, single_opt, micro, global_batch=True)
            oracle_step(reference_ddp, reference_opt, micro, global_batch=False)
            out["finding"], out["max_diff"] = parameter_finding(module, single, reference_ddp.module, step, checker)
        out["checked_steps"] = step
        if out["finding"]:
            break
    if compare and out["finding"] is None:  # every step right: then the transport on a tensor that is not flat
        out["finding"] = shaped_transport_finding(model, events, progress, out["checked_steps"], world)
    if compare and out["finding"] is None:  # then a no_sync() inside a no_sync()
        progress.phase = "running a no_sync() inside a no_sync() (the checker)"
        out["finding"] = nested_no_sync_finding(model, out["checked_steps"], world)
    if compare and out["finding"] is None:  # then an exception inside a no_sync()
        progress.phase = "raising an exception inside a no_sync() (the checker)"
        out["finding"] = raised_in_no_sync_finding(model, out["checked_steps"], world)
    if compare and unused and out["finding"] is None:  # then a parameter that got no gradient (kept apart)
        progress.phase = "finishing a step in which one parameter got no gradient (the checker)"
        out["no_gradient"] = no_gradient_finding(model, module, micro[-1][0], out["checked_steps"], world)
    return out


def no_gradient_finding(model, module: nn.Module, shard, step: int, world: int) -> dict | None:
    """A parameter the loss does not reach in a step (one the forward does not use, or a frozen one) keeps
    ``.grad`` None after backward; a finish that all_reduces every ``.grad`` raises on it (``no_gradient``). The
    checker's network uses every parameter, so one backward is run outside ``no_sync()`` and its last parameter's
    ``.grad`` set to None before the finish, as autograd leaves it (the same on every rank: no rank is left
    waiting). Asked of the stages that sync in their finish (``simple``, ``ga``) only."""
    finish = getattr(model, "finish_gradient_synchronization", None)
    if finish is None:
        return None
    module.zero_grad(set_to_none=True)
    loss_of(model, shard).backward()
    name, param = list(module.named_parameters())[-1]
    param.grad = None
    try:
        finish()
    except Exception as e:  # the learner's code: any error is the finding
        return {"kind": "no_gradient", "step": step, "ranks": list(range(world)), "names": [name],
                "error": type(e).__name__}  # fmt: skip
    return None


#: The shape of the tensor :func:`shaped_transport_finding` hands a transport: a weight's, of more dimensions than a
#: bucket's one, and a length (40) that 3 ranks do not divide, so the padding is cut off again. Padding by a dimension,
#: not by the length, is wrong here: by the first (-5 % n) at 2 and 3 ranks, by the last (-8 % n) at 3.
SHAPED = (5, 8)


def shaped_transport_finding(model, events: Events, progress: Progress, step: int, world: int) -> dict | None:
    """A Wire's transport (notebook 06's exercise) is handed flat buckets while the steps train; it must sum any
    tensor in place, so it is handed one of :data:`SHAPED` too, each rank's ``arange * (rank + 1)``, whose sum is
    ``arange * world * (world + 1) / 2``. An answer that copies the flat sum back unshaped (no ``.view_as``) raises
    here, under this phase; one that writes other values is ``shaped_sum``. Stages without a transport are not
    asked."""
    wire = getattr(model, "comm_state", None)
    if not isinstance(wire, Wire) or wire.transport is None:
        return None
    shape = " × ".join(map(str, SHAPED))
    progress.phase = f"summing a tensor of {shape} values, not a flat bucket, with your transport (the checker)"
    values = torch.arange(float(torch.Size(SHAPED).numel())).view(SHAPED)
    tensor = values * (dist.get_rank() + 1)
    with events.transport(tensor, wire.transport, wire.group):
        wire.transport(tensor, wire.group)
    if torch.equal(tensor, values * (world * (world + 1) // 2)):
        return None
    return {"kind": "shaped_sum", "step": step, "ranks": [dist.get_rank()], "shape": shape}


def nested_no_sync_finding(model, step: int, world: int) -> dict | None:
    """A ``no_sync()`` inside a ``no_sync()`` must leave the sync off when the inner block ends, as torch's does (it
    restores the flag's value from before the block); one that sets the flag to True turns the outer block's sync
    back on (``reopened``). Stages without ``no_sync()`` or torch's flag are not asked."""
    no_sync = getattr(model, "no_sync", None)
    if no_sync is None or not hasattr(model, "require_backward_grad_sync"):
        return None
    with no_sync():
        off = model.require_backward_grad_sync is False  # a no_sync() that never turns it off is named by the counts
        with no_sync():
            pass
        reopened = off and model.require_backward_grad_sync is not False
    return {"kind": "reopened", "step": step, "ranks": list(range(world))} if reopened else None


class _RaisedInside(Exception):
    """The exception :func:`raised_in_no_sync_finding` raises inside a ``no_sync()`` block, and catches."""


def raised_in_no_sync_finding(model, step: int, world: int) -> dict | None:
    """An exception inside a ``no_sync()`` block must still restore the flag, as torch's does (its ``finally``); a
    ``no_sync()`` that restores it only after a plain ``yield`` leaves the sync off for every later backward
    (``not_restored_on_error``). The checker's steps raise nothing inside the block, so they cannot see it. Stages
    without ``no_sync()`` or torch's flag are not asked; the flag is put back afterwards."""
    no_sync = getattr(model, "no_sync", None)
    if no_sync is None or not hasattr(model, "require_backward_grad_sync"):
        return None
    before = model.require_backward_grad_sync
    try:
        with no_sync():
            raise _RaisedInside
    except _RaisedInside:
        pass
    after = model.require_backward_grad_sync
    model.require_backward_grad_sync = before
    return None if after == before else {"kind": "not_restored_on_error", "step": step, "ranks": list(range(world))}


def never_waited_finding(unwaited: list[str], kinds: dict, step: int, checker) -> dict | None:
    """Step 3's first verdict: collectives the step never waited for (:meth:`Events.unwaited`), on any rank.

    Such a collective writes its sum into the gradients whenever the network
    delivers it, before or after the optimizer read them: whether a run's
    gradients come out right is a race. The order of the stage's calls shows it
    on every run, so the verdict names the missing wait instead of the race's
    outcome (the same on every rank: the most any rank left unwaited).
    """
    counts = {kind: unwaited.count(kind) for kind in dict.fromkeys(unwaited)}
    everyone: list = [None] * dist.get_world_size(checker)
    dist.all_gather_object(everyone, counts, group=checker)
    worst = max(everyone, key=lambda c: sum(c.values()))
    if not worst:
        return None
    return {"kind": "never_waited", "step": step, "unwaited": worst, "launched": kinds}


def waited_again_finding(waited_again: dict, step: int, checker) -> dict | None:
    """Step 3's second verdict: waits on an earlier step's collectives (:class:`Events`, ``waited_again``), on any
    rank: the stage keeps its list of messages in flight from one step to the next. The gradients may still come
    out right (the tensors written into again were replaced by ``zero_grad``), so it is named from the order."""
    everyone: list = [None] * dist.get_world_size(checker)
    dist.all_gather_object(everyone, waited_again, group=checker)
    worst = max(everyone, key=lambda c: sum(c.values()))
    if not worst:
        return None
    return {"kind": "waited_again", "step": step, "waited_again": worst}


def written_in_flight_finding(written: list, step: int, checker) -> dict | None:
    """Step 3's third verdict: a write into a tensor whose collective was launched and not yet waited for
    (:class:`Events`, ``written``), on any rank. Whether the write lands before the network reads the tensor,
    or after it wrote the sum, is a race, so it is named from the order of the calls, not from the gradients."""
    return _in_flight_finding("written_in_flight", "written", written, step, checker)


def read_in_flight_finding(read: list, step: int, checker) -> dict | None:
    """Step 3's fourth verdict: a read of a tensor whose collective was launched and not yet waited for
    (:class:`Events`, ``read``), on any rank. Whether it reads the rank's own values or the sum the network wrote
    is a race, so it is named from the order of the calls, not from the gradients."""
    return _in_flight_finding("read_in_flight", "read", read, step, checker)


def _in_flight_finding(kind: str, key: str, seen: list, step: int, checker) -> dict | None:
    """The finding ``kind`` from the (collective kind, op) pairs ``seen`` on this rank: the longest list any rank
    saw (the same verdict on every rank), under ``key``; ``None`` if no rank saw one."""
    everyone: list = [None] * dist.get_world_size(checker)
    dist.all_gather_object(everyone, seen, group=checker)
    worst = max(everyone, key=len)
    if not worst:
        return None
    return {"kind": kind, "step": step, key: [list(x) for x in worst]}


def start_finding(module: nn.Module, checker, broadcasts: InitBroadcasts) -> dict | None:
    """Step 2: every rank must hold rank 0's initial parameters and buffers after ``__init__``; a rank that
    broadcast and still holds its own parameters broadcast into copies (``broadcasts``)."""
    world = dist.get_world_size(checker)
    init0 = make_net(seed=0)
    mine = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    expected = {**dict(init0.named_parameters()), **dict(init0.named_buffers())}
    wrong = [name for name, t in mine.items() if not torch.equal(t.detach(), expected[name].detach())]
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (wrong, broadcasts.made, broadcasts.stray), group=checker)
    bad = {r: w for r, (w, _, _) in enumerate(everyone) if w}
    if not bad:
        return None
    buffers = {n for n, _ in module.named_buffers()}
    names = sorted({n for w in bad.values() for n in w})
    only_buffers = all(n in buffers for n in names)
    finding = {"kind": "buffers" if only_buffers else "broadcast", "ranks": sorted(bad), "names": names}
    if 0 not in bad and all(everyone[r][2] for r in bad):  # it broadcast, but not into the module's own tensors
        finding.update(kind="broadcast_copy", made=everyone[min(bad)][1], stray=everyone[min(bad)][2])
    return finding


def gradient_finding(everyone: list[dict], step: int, record: dict, local, averaged) -> dict | None:
    """Step 3's verdict on this step's gradients, the same on every rank (from every rank's kinds)."""
    wrong = {r: {n: k for n, k in kinds.items() if k != "ok"} for r, kinds in enumerate(everyone)}
    wrong = {r: w for r, w in wrong.items() if w}
    if not wrong:
        return None
    if set(wrong.get(0, {}).values()) == {"local"} and all(
        set(wrong.get(r, {}).values()) == {"rank0"} for r in range(1, len(everyone))
    ):  # rank 0 kept its own gradient and every other rank got it: broadcast from rank 0, not averaged
        main, names = "rank0", list(wrong[0])
    else:
        kinds = wrong[min(wrong)]
        main = max(set(kinds.values()), key=list(kinds.values()).count)
        names = [n for n, k in kinds.items() if k == main]
    finding = {"kind": main, "step": step, "ranks": sorted(wrong), "names": names, "n_params": len(everyone[0])}
    if main == "divided_twice" and record.get("averaged"):  # the second division was the reduce-scatter's op
        finding["op_avg"] = True
    if main == "unsummed" and record.get("gathered_apart"):  # the sum was gathered, elsewhere than copied from
        finding["gathered_apart"] = True
    if main == "unsummed" and record.get("copied_own"):  # the tensor's own values copied back into it
        finding["copied_own"] = True
    if record.get("gathered_first"):  # whatever the gradients look like: the two calls in the wrong order
        finding["gathered_first"] = True
    if record.get("pad_misplaced"):  # padded at one end, cut at the other: the sum shifted by the padding
        finding["pad_misplaced"] = list(record["pad_misplaced"])
    if main == "other":
        expected = averaged[0]
        for g in averaged[1:]:
            expected = add(expected, g)
        finding["largest"] = largest_difference({n: record["grads"][n] for n in names}, expected)
    return finding


def resent_finding(finding: dict, grads_sent: list[tuple[str, str]]) -> dict | None:
    """A ``local`` finding whose gradients were never sent while another gradient was sent more than once in the
    step from grad hooks alone (``grads_sent``: rank 0's (name, phase) per collective): every sum went to that one,
    as when each hook syncs the parameter a loop's lambda reads when it runs (the loop's last), not the one the hook
    was handed. Sent from finish too: None (the ``local`` verdict stands)."""
    counts: dict[str, int] = {}
    for name, _ in grads_sent:
        counts[name] = counts.get(name, 0) + 1
    again = {name: n for name, n in counts.items() if n > 1}
    if not again or any(name in counts for name in finding["names"]) or {w for _, w in grads_sent} != {"backward"}:
        return None
    return {**finding, "kind": "resent", "again": again}


def oracle_step(model: nn.Module, optimizer, micro, global_batch: bool) -> None:
    """One step of an oracle: the single process on the global batches, or torch's DDP on the shards."""
    k = len(micro)
    for i, (shard, whole) in enumerate(micro):
        ctx = model.no_sync() if (not global_batch and i < k - 1) else contextlib.nullcontext()
        with ctx:
            (loss_of(model, whole if global_batch else shard) / k).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def parameter_finding(module, single, torch_module, step: int, checker) -> tuple[dict | None, list[float]]:
    """Step 4: parameters against both oracles; a difference on any rank is a finding on all."""
    params = dict(module.named_parameters())
    d_single = largest_difference(params, dict(single.named_parameters()))
    d_torch = largest_difference(params, dict(torch_module.named_parameters()))
    scale_ = max(float(p.detach().abs().max()) for p in params.values())
    # The single process sums the global batch in one matmul, the stage in per-rank shards then an all_reduce:
    # another order, so each gradient element differs by a few float32 roundings (u = 2**-24 ≈ 6e-8) of its
    # terms; times LR = 0.1 over ``steps`` (3) SGD steps, the parameters by about 1e-7 of their scale. 1e-5 of
    # the largest parameter is a hundred times that; a wrong gradient (the sum, a lost micro-batch) moves them
    # by LR times the gradient itself, 1e-2 and more.
    bad = torch.tensor([float(d_single[0] > 1e-5 * scale_ + 1e-7)], device="cpu")  # the checker: gloo on the CPU
    dist.all_reduce(bad, op=dist.ReduceOp.MAX, group=checker)
    finding = None
    if bad.item():
        finding = {"kind": "parameters", "step": step, "largest": d_single}
    return finding, [d_single[0], d_torch[0]]


# ------------------------------------------------------------------------------------------ hooks
def check_hook_on_rank(hook, like: str, steps: int, accum: int) -> None:
    """The comm-hook check (module doc): a probe on known gradients, then training beside torch's DDP."""

    rank, world = dist.get_rank(), dist.get_world_size()
    checker = dist.new_group(backend="gloo")
    progress = Progress()
    files = stage_files(hook)
    report: dict = {"rank": rank, "world": world, "like": like, "finding": None, "steps": steps, "accum": accum}
    try:
        with reporting(progress, files, report):
            g = torch.Generator().manual_seed(7 + rank)
            values = torch.randn(1000, generator=g, device="cpu") * torch.logspace(-3, 0, 1000)  # small, large
            # g and the rounding bound's scale (fp16_error_bound) as the notebook's measure makes them
            exact, magnitude = measure.reference_average(values, checker)
            report["error_bound"] = fp16_error_bound(exact, magnitude, world)
            big = overflow_values(world, g)  # 1.5 × float16's largest value in sum: only dividing first fits
            report["large_gradient"] = large_gradient(world) if world > 1 else None
            probes = {}
            for who, fn in (("reference", solutions.HOOKS[like]), ("yours", hook)):
                progress.phase = "calling your hook on one bucket" if who == "yours" else "calling the model answer"
                fut, value, sent, blocked, left, written, elsewhere = call_hook(fn, values, checker)
                probes[who] = probe_result(fut, value, exact, *sent, local=values)
                probes[who]["other_group"] = elsewhere
                probes[who]["blocked"] = blocked
                probes[who]["written_in_flight"] = [list(w) for w in written]
                # the bucket's own float32 buffer divided by the world size (a division that missed the copy sent)
                probes[who]["buffer_divided"] = world > 1 and bool(torch.allclose(left, values / world, rtol=1e-6))
                if world > 1 and probes[who]["tensor"] is not None:  # the same on every rank: code, not data
                    progress.phase = (
                        f"calling {'your hook' if who == 'yours' else 'the model answer'} on large gradients"
                    )
                    _, value, _, _, _, _, _ = call_hook(fn, big, checker)
                    probes[who]["overflow"] = (
                        int((~torch.isfinite(value.float())).sum()) if value.shape == big.shape else 0
                    )
            report["probe"] = probes["yours"]
            report["reference_probe"] = probes["reference"]
            mine = probes["yours"]
            if mine.get("tensor") is not None:
                gathered = [torch.empty_like(mine["tensor"]) for _ in range(world)]
                dist.all_gather(gathered, mine["tensor"], group=checker)
                mine["same_on_all_ranks"] = all(torch.equal(t, gathered[0]) for t in gathered)
                del mine["tensor"]
            probes["reference"].pop("tensor", None)
            report["finding"] = hook_finding(mine, probes["reference"], world, report["error_bound"])
            if report["finding"] is None:
                progress.phase = "training with your hook"
                report.update(train_with_hook(hook, like, steps, accum, progress, checker))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group(checker)


def waited_after_launch(log: list[tuple[str, str | None]]) -> bool:
    """Whether ``log`` (:class:`Events`') holds a wait after its first launch: a hook that blocked.

    A callback's wait on a completed work or Future (``("wait", "resolved")``: its own argument, say) does not
    block, even where the callback ran at once, inside ``.then()``, because the all_reduce had already finished.
    """
    launched = [i for i, (what, _) in enumerate(log) if what == "launch"]
    return bool(launched) and any(what == "wait" and how is None for what, how in log[launched[0] :])


def call_hook(fn, values: torch.Tensor, group=None):
    """Step 1 of the hook check: ``fn(group, bucket)`` on a bucket of ``values``, its Future waited for.

    Returns the Future (or whatever the hook returned), its value, what it sent
    (bytes, dtypes), whether the hook *blocked*: waited for a collective
    it had started before it returned (:class:`Events`: the order of events,
    not a clock): ``None`` if it did not, else ``"done"`` or ``"pending"``, as its
    Future was when it returned; the bucket's own buffer as the hook left it; and
    the writes it made into a tensor its all_reduce was still sending
    (:class:`Events`: after the launch, before a wait, outside a callback:
    the code's order, whatever the network's speed); and what it did on a group
    other than ``group`` (a collective's name, or ``"get_world_size"`` for a
    world size asked of another group or of none: the default group).
    """
    from unittest import mock

    from minddp.comm.grad_bucket import GradBucket

    param = nn.Parameter(torch.zeros(values.numel(), device="cpu"))  # the checker runs on the CPU
    buffer = values.clone()  # the bucket's own: kept, to see what the hook did to it
    bucket = GradBucket(0, buffer, [param], is_last=True)
    events = Events()
    asked = []  # the group of each dist.get_world_size(...) the hook made (None: the default group)
    real_size = dist.get_world_size

    def get_world_size(group=None):
        asked.append(group)
        return real_size(group)

    with (
        live.profiler() as prof,
        SentBytes() as sent,
        events.recording(),
        mock.patch.object(dist, "get_world_size", get_world_size),
    ):
        fut = fn(group, bucket)
        until_return = list(events.log)
        done = isinstance(fut, compat.future_type()) and fut.done()
        value = fut.wait() if isinstance(fut, compat.future_type()) else fut  # torch.futures.Future's base too
    blocked = waited_after_launch(until_return)
    # SentBytes sees every dist.* collective, at the call; the profiler's backend range also sees one started
    # through a ProcessGroup object directly, but may miss one (see SentBytes): either can only undercount, so
    # the larger is what was sent
    return (
        fut,
        value,
        (max(sent.nbytes, live.backend_bytes(prof)), sent.dtypes),
        ("done" if done else "pending") if blocked else None,
        buffer,
        list(dict.fromkeys(events.written)),
        list(
            dict.fromkeys(
                [kind for kind, on in sent.groups if on is not group]
                + ["get_world_size"] * any(on is not group for on in asked)
            )
        ),
    )


def overflow_values(world: int, g: torch.Generator) -> torch.Tensor:
    """Gradients each below float16's largest value (65504) whose sum over ``world`` ranks is above it.

    Each is ``1.5 · 65504 / world`` within ±10 %, all positive: the sum over ranks is
    at least 1.35 × 65504, so a hook that sums in float16 and divides after gets
    ``inf`` whatever the order of the additions; divided first, the sum is the
    average, at most 1.65 × 65504 / world ≤ 65504 for ``world`` ≥ 2.
    """
    return large_gradient(world) * (0.9 + 0.2 * torch.rand(1000, generator=g))


#: float16's largest finite value.
FP16_MAX = 65504.0


def large_gradient(world: int) -> float:
    """The typical value of :func:`overflow_values`: ``1.5 · 65504 / world``."""
    return 1.5 * FP16_MAX / world


def probe_result(
    fut, value, exact: torch.Tensor, sent: int, sent_dtypes: list[str] = (), local: torch.Tensor | None = None
) -> dict:
    out = {
        "returned": type(fut).__name__,
        "is_future": isinstance(fut, compat.future_type()),
        "bytes": sent,
        "sent_dtypes": sorted(set(sent_dtypes)),
        "numel": exact.numel(),
        "tensor": None,
    }
    if isinstance(value, (list, tuple)):
        out["value"] = f"a {type(value).__name__} of {len(value)}"
        return out
    if not isinstance(value, torch.Tensor):
        out["value"] = type(value).__name__
        return out
    out.update(value="tensor", shape=list(value.shape), dtype=str(value.dtype).replace("torch.", ""))
    if value.shape == exact.shape:
        v = value.detach().float()
        error_sq, norm_sq = measure.squared_error(v, exact)  # the notebook's measure, on one bucket
        out["relative_error"] = Traffic(error_sq=error_sq, norm_sq=norm_sq).relative_error()
        out["summed_error"] = float((v - exact * dist.get_world_size()).norm() / exact.norm())
        out["twice_error"] = float((v - exact / dist.get_world_size()).norm() / exact.norm())
        world = dist.get_world_size()
        # divided by a number d written in the code instead of the world size: v ≈ exact · world / d, with d read
        # off the least-squares scale of v on exact, so any whole divisor is named, not only HARD_CODED's
        scale = float(v.double().flatten() @ exact.double().flatten() / exact.double().norm() ** 2)
        ratio = world / scale if scale > 0 else 0.0  # 0: no positive scale (nan, zeros, a flipped sign)
        d = round(ratio) if ratio < 1e9 else 0  # and none for a value all but zero
        out["hard_coded_errors"] = {}  # d: how far v is from world / d times the average, relative to that value
        if 1 < d != world:  # 1 is the sum, world the right answer
            out["hard_coded_errors"][str(d)] = float((v - exact * world / d).norm() / (exact * world / d).norm())
        if local is not None:  # this rank's own values, un-reduced: as handed in, or divided by the world size
            out["local_errors"] = {
                str(d): float((v - local / d).norm() / exact.norm()) for d in (1, world) if world > 1 or d == 1
            }
        out["tensor"] = v
    return out


def fp16_error_bound(exact: torch.Tensor, magnitude: torch.Tensor, world: int) -> float:
    """The largest relative error (norm-wise, as ``probe_result`` measures it) an fp16 average of ``world`` ranks
    can have, ``magnitude`` the mean of the ranks' ``|x_i|``: :func:`minddp.comm.measure.rounding_bound` (its
    derivation), over ``||exact||``. The magnitudes' own float32 rounding moves it by ~1e-7 of itself."""
    from minddp.comm.measure import rounding_bound

    m = magnitude.double()
    bound = rounding_bound(torch.float16, world, float(m.pow(2).sum()), float(m.sum()), m.numel())
    return bound / float(exact.double().norm())


def hook_finding(mine: dict, reference: dict, world: int, bound: float) -> dict | None:
    """What is wrong with the learner's fp16 hook, from its probe (``None``: nothing).

    The average is judged against ``bound`` (:func:`fp16_error_bound`, what
    float16 rounding allows), never against the model answer's own error,
    which depends on the values and on the machine. A hook that does not
    compress is told apart by what it put on the wire (bytes and dtype, seen
    by :class:`SentBytes`), not by how small its error is.
    """
    if not mine["is_future"]:
        return {"kind": "not_future", "returned": mine["returned"]}
    if mine.get("written_in_flight"):  # whatever the race's outcome made of the value: named by the code's order
        return {"kind": "hook_written_in_flight", "written": mine["written_in_flight"]}
    if mine["value"] != "tensor":
        return {"kind": "future_value", "value": mine["value"]}
    if mine["shape"] != [mine["numel"]] or mine["dtype"] != "float32":
        return {"kind": "shape", "shape": mine["shape"], "dtype": mine["dtype"]}
    # this rank's own gradients (÷1 or ÷world) are off from the average by far more than rounding (world > 1)
    for d, off in mine.get("local_errors", {}).items():
        if off < 0.01 and world > 1:
            return {"kind": "local", "divisor": int(d)}
    if not mine.get("same_on_all_ranks", True):
        return {"kind": "ranks_differ"}
    error = mine["relative_error"]
    # a sum is off from the average by world − 1 times the average: far beyond any rounding (world > 1)
    if mine["summed_error"] < 0.01 and world > 1:
        return {
            "kind": "summed",
            "error": error,
            "buffer_divided": mine.get("buffer_divided", False),
            "sent_dtypes": mine.get("sent_dtypes", []),
        }
    # divided twice: off from the average by 1 − 1/world of it, as far beyond rounding (world > 1)
    if mine.get("twice_error", 1.0) < 0.01 and world > 1:
        return {"kind": "divided_twice", "error": error}
    # divided by d, not by the world size: off by |world / d − 1| of the average, beyond rounding (d != world)
    for d, off in mine.get("hard_coded_errors", {}).items():
        if off < 0.01:
            return {"kind": f"{HARD_CODED_KIND}{d}", "error": error}
    if mine.get("overflow"):
        return {"kind": "overflow", "values": mine["overflow"], "numel": mine["numel"]}
    other = [d for d in mine.get("sent_dtypes", []) if d != "float16"]
    if other and mine["bytes"] <= reference["bytes"]:  # as few bytes, in another 16-bit type (bfloat16)
        return {"kind": "dtype", "sent_dtypes": other, "error": error, "bound": bound}
    if error > bound:
        return {"kind": "error", "error": error, "bound": bound}
    if mine.get("blocked"):
        return {"kind": "blocked", "done": mine["blocked"] == "done"}
    if mine["bytes"] > reference["bytes"]:
        return {
            "kind": "bytes",
            "bytes": mine["bytes"],
            "reference_bytes": reference["bytes"],
            "numel": mine["numel"],
            "sent_dtypes": mine.get("sent_dtypes", []),
        }
    if mine.get("other_group"):  # right numbers, but on the default group: the group it was handed had them all
        return {"kind": "other_group", "on": mine["other_group"]}
    return None


#: What each collective sends, by the dispatcher's op name: the argument that holds this rank's tensors.
_SENT_ARGUMENT = {op: argument for op, (_, argument) in compat.DISPATCHED_COLLECTIVES.items()}


class SentBytes(TorchDispatchMode):
    """The bytes (and dtypes) of every collective started on this thread while it is active.

    Every ``dist.*`` collective goes through the dispatcher as a ``c10d.*`` op
    on the calling thread, with the tensors it sends: counted there, at the
    call, this is exact and immediate. (The profiler's backend range, which
    counted before, is recorded on gloo's thread and can still be open when
    the caller's ``wait()`` returns and the profiler stops: a fast machine
    then saw 0 bytes.)
    """

    def __init__(self):
        super().__init__()
        self.nbytes, self.dtypes = 0, []
        self.groups: list[tuple[str, object]] = []  #: (kind, process group) of each collective, in order

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        where = _SENT_ARGUMENT.get(str(func))
        if where is not None:
            boxed = [a for a in args if isinstance(a, torch.ScriptObject)][:1]  # the op's process group, boxed
            self.groups.append((compat.DISPATCHED_COLLECTIVES[str(func)][0], _group_of(boxed[0]) if boxed else None))
        if where is not None and len(args) > where:
            stack = [args[where]]
            while stack:
                item = stack.pop()
                if isinstance(item, torch.Tensor):
                    self.nbytes += item.numel() * item.element_size()
                    self.dtypes.append(str(item.dtype).replace("torch.", ""))
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)
        return func(*args, **(kwargs or {}))


def train_with_hook(hook, like: str, steps: int, accum: int, progress: Progress, checker) -> dict:
    """Training: minddp's bucket-async stage with the learner's hook, torch's DDP with torch's, one process."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from minddp.stages import AsyncBucketDDP

    torch_hooks = {"fp16": default_hooks.fp16_compress_hook}
    rank, world = dist.get_rank(), dist.get_world_size()
    module = make_net(seed=rank)
    events = Events(module)
    model = AsyncBucketDDP(module, bucket_cap_mb=0.001)
    model.register_comm_hook(None, hook)
    reference = nn.parallel.DistributedDataParallel(make_net(seed=0), process_group=checker)
    reference.register_comm_hook(checker, torch_hooks[like])
    single = make_net(seed=0)
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in (model, reference, single)]
    finding, diffs = None, [0.0, 0.0]
    for step in range(1, steps + 1):
        micro = micro_batches(step, accum, rank, world)
        run_step(model, opts[0], module, micro, progress, step, events)
        oracle_step(reference, opts[1], micro, global_batch=False)
        oracle_step(single, opts[2], micro, global_batch=True)
        progress.phase = f"comparing the gradients of step {step} (the checker)"
        mine = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine, group=checker)
        if not all(torch.equal(t, everyone[0]) for t in everyone):
            finding = {"kind": "diverged", "step": step}
            break
        params = dict(module.named_parameters())
        diffs = [
            largest_difference(params, dict(single.named_parameters()))[0],
            largest_difference(params, dict(reference.module.named_parameters()))[0],
        ]
    net = sum(p.numel() for p in module.parameters())  # the verdict names the network these steps trained
    return {"finding": finding, "max_diff": diffs, "checked_steps": steps, "net_params": net}
