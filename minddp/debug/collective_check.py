"""Debug mode's check of every collective: the same call on every rank, compared before it is sent.

Ranks that disagree on a collective do not fail cleanly: an all_reduce of 2 values on one rank and of
1 on the other hangs or aborts inside gloo; a collective one rank skips pairs every later call with
the wrong partner; a rank that left its loop leaves the others waiting. torch's process-group wrapper
(``TORCH_DISTRIBUTED_DEBUG=DETAIL``) compares a fingerprint of each call on a side channel first.
This is the same idea, on the public API of every torch from 2.6 to 2.15:

1. **wrap** (:func:`install`, once, when debug mode is on): the collectives of ``torch.distributed``
   (:data:`CHECKED`) are replaced by wrappers, so the script's own calls are checked as minddp's are;
   a collective made inside another (torch's own helpers) is not checked twice;
2. **describe** (:func:`describe`): the call as every rank must make it (op, shapes, dtypes, reduce
   op, root), and where: the script's file:line, minddp's label for its own calls, the step;
3. **compare** on the default group's store: each rank posts its call under the group's sequence
   number and reads the others' (one write, one read when they agree); a difference raises
   :class:`~minddp.debug.findings.DebugError` on every rank, naming each rank's call and line. Each
   group has its own sequence and its own lock, held from the post until the collective is sent: the
   calls of one group go out in the order they were compared, and a thread waiting on one group never
   holds up another group's;
4. **wait, bounded**: while a partner has not posted, the rank polls. A partner that left the group
   or ended its process (it posts that on its way out) is named at once: *uneven inputs* when this
   rank waits in a training step; one that is late gets a line after :data:`SAY_AFTER_S`, which says
   whether it is in debug mode at all (a rank says so when it turns debug mode on, or joins the group
   with it on) and any error that ended one of its threads; the wait ends at the store's timeout,
   never later.

The step a call is said in is the step of the wrapper it belongs to (:func:`in_step_of`): each
wrapper's :class:`~minddp.debug.watch.Watch` counts its own. A script's own call made once that step
had ended (its optimizer step checked, or the wrapper gone: a metric logged after the loop) is said
*after* it: ``(after step 3)``.

What each finding means and how to fix it: ``docs/debugging.md``. Example (one rank here; under
:func:`minddp.launch` every rank runs the same)::

    >>> describe("all_reduce", torch.ones(2, 3)).text
    'all_reduce(float32[2, 3], op=SUM)'
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import inspect
import json
import os
import sys
import sysconfig
import threading
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from minddp.debug import switch
from minddp.debug.findings import DebugError, finding
from minddp.runtime import keep
from minddp.runtime.compat import process_group_store

#: The ``torch.distributed`` functions checked (those a release lacks are skipped). Point-to-point
#: messages (send, recv) are not: their two sides are different calls by design.
CHECKED = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
    "all_reduce_coalesced",
)
#: Arguments that may differ across ranks: only the root holds a gather or scatter list, objects differ.
RANK_LOCAL = {
    "group",
    "async_op",
    "gather_list",
    "scatter_list",
    "obj",
    "object_gather_list",
    "scatter_object_input_list",
    "input_split_sizes",
    "output_split_sizes",
    "device",
    "device_ids",
    "timeout",
}
#: A rank waiting this long for a partner says so in one line (and goes on waiting, up to the store's timeout).
SAY_AFTER_S = 10.0
SLOTS = 4  # each rank's posts cycle through this many keys: a slot is reused only once every rank has read it

_TORCH = os.path.dirname(torch.__file__) + os.sep
_MINDDP = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
#: Who says a finding of debug mode (:func:`~minddp.debug.findings.finding`'s ``by``).
BY = "minddp debug"
_originals: dict[str, object] = {}
#: Per thread: .inside (a checked collective is running), .label (minddp's name for the next ones), .counter
#: (a weak reference to the wrapper's watch whose step this thread is in).
_local = threading.local()
_latest: list = [None, None]  # the watch that last began a step here (a weak reference, for other threads), its step
_registry = threading.Lock()  # guards _channels and install(), never held while waiting
_channels: dict[str, "_Channel"] = {}  # by group name: a destroyed group's channel is dropped with it
_recorders: list[tuple[str, list]] = []  # (group name, its calls) for each open :func:`recorded` block
_exit_reason: list[str] = []


@dataclasses.dataclass
class Call:
    """One collective as a rank describes it; ``op`` and ``args`` must agree across ranks."""

    op: str
    args: list  # [name, text] of each argument that must agree
    dtypes: list
    shapes: list
    where: str = ""  # file:line in the script, and minddp's label when minddp made the call
    ours: bool = False  # made by minddp (a wrapper's step), not by the script itself
    step: int | None = None
    after: bool = False  # the script's own call, made once ``step`` had ended (between steps, after the loop)
    seq: int = -1

    @property
    def text(self) -> str:
        return f"{self.op}({', '.join(t if n == 'tensor' else f'{n}={t}' for n, t in self.args)})"

    def said(self) -> str:
        step = "" if self.step is None else f" ({'after ' if self.after else ''}step {self.step})"
        return f"{self.text} at {self.where}{step}"


def describe(op: str, *args, **kwargs) -> Call:
    """Step 2: ``op`` called with these arguments, as every rank must call it (tensor positions named ``tensor``)."""
    fn = _originals.get(op) or getattr(dist, op)
    bound = _signature(fn).bind_partial(*args, **kwargs)
    bound.apply_defaults()
    group = bound.arguments.get("group")
    parts, dtypes, shapes = [], [], []
    for name, value in bound.arguments.items():
        if name in RANK_LOCAL or value is None:
            continue
        if name in ("src", "dst"):
            name, value = "root", value if group is None else dist.get_group_rank(group, value)
        elif name in ("group_src", "group_dst"):
            name = "root"
        tensors = _tensors(value)
        if tensors:
            dtypes.append([str(t.dtype).replace("torch.", "") for t in tensors])
            sizes_vary = op.startswith("all_to_all")  # each rank sends its own split sizes
            shapes.append(None if sizes_vary else [list(t.shape) for t in tensors])
            parts.append(["tensor", _tensor_text(tensors, not sizes_vary, isinstance(value, (list, tuple)))])
        elif isinstance(value, (list, tuple)):
            parts.append([name, f"{len(value)} objects"])
        else:
            parts.append([name, getattr(value, "name", None) or str(value)])
    return Call(op, parts, dtypes, shapes)


@contextlib.contextmanager
def labelled(label: str):
    """minddp's name for the collectives made inside (``DDP step 3: bucket 0 (head.weight, head.bias)``)."""
    before = relabel(label)
    try:
        yield
    finally:
        relabel(before)


def relabel(label: str | None) -> str | None:
    """Name the collectives minddp makes from now on (None: by their frame); returns the name before."""
    before = getattr(_local, "label", None)
    _local.label = label
    return before


@contextlib.contextmanager
def recorded(group=None):
    """Yields a list that holds, after the block, each call of ``group`` (default: the default group) this rank
    checked in it, in order, its ``seq`` the number a finding gives it (``collective #K``).

    >>> with recorded() as calls:
    ...     _ = dist.all_reduce(torch.ones(1))
    >>> calls    # one rank: a one-rank group's calls are not checked
    []
    """
    calls: list[Call] = []
    entry = ((dist.group.WORLD if group is None else group).group_name, calls)
    _recorders.append(entry)
    try:
        yield calls
    finally:
        _recorders.remove(entry)


def install() -> None:
    """Step 1: wrap ``torch.distributed``'s collectives (once per process; a wrapper passes through while off).

    And say this rank is in debug mode (:func:`say_on`), now if its group exists, else when it joins one.
    """
    with _registry:
        if _originals:
            say_on()
            return
        for name in CHECKED:
            fn = getattr(dist, name, None)
            if fn is not None:
                _originals[name] = fn
                setattr(dist, name, _checked(name, fn))
        _originals["destroy_process_group"] = dist.destroy_process_group
        dist.destroy_process_group = _leaving(dist.destroy_process_group)
        _originals["init_process_group"] = dist.init_process_group
        dist.init_process_group = _joining(dist.init_process_group)
        atexit.register(_at_exit)
        before, before_thread = sys.excepthook, threading.excepthook

        def note_error(kind, value, tb):
            _note_error(f"an uncaught {kind.__name__}{_first_line(value)}")
            before(kind, value, tb)

        def note_thread_error(args):
            if args.exc_type is not SystemExit:  # a thread's sys.exit() is no failure
                name = getattr(args.thread, "name", "?")
                _note_error(f"an uncaught {args.exc_type.__name__} in thread {name!r}{_first_line(args.exc_value)}")
            before_thread(args)

        sys.excepthook, threading.excepthook = note_error, note_thread_error
    say_on()


def say_on() -> None:
    """Tell this rank's partners it is in debug mode (so a late partner is told apart from one not in it)."""
    if switch.enabled() and dist.is_initialized():
        _store().set(f"on/{dist.get_rank()}", "1")


def in_step_of(watch) -> None:
    """This thread now works in the step of ``watch``'s wrapper (:class:`~minddp.debug.watch.Watch`): say it."""
    _local.counter = _latest[0] = watch.ref
    _latest[1] = watch.step  # kept after the wrapper is gone (a rank that left its loop says its last step)


def _watch():
    """The watch of the wrapper this thread works for (else the one that began a step last); None if gone."""
    ref = getattr(_local, "counter", None) or _latest[0]
    return None if ref is None else ref()


def current_step() -> int | None:
    """The step of the wrapper this thread works for (else the wrapper that began a step last); None before any."""
    watch = _watch()
    step = _latest[1] if watch is None else watch.step
    return None if step is None or step < 0 else step


def step_ended() -> bool:
    """Has the step :func:`current_step` names ended: its optimizer step checked, or its wrapper gone?"""
    watch = _watch()
    return watch is None or watch.steps_taken > watch.step


# -- step 3: compare ---------------------------------------------------------------------------------------


def check(call: Call, group) -> None:
    """Post ``call`` under its group's next sequence number, wait for every partner's, raise on a difference.

    The caller holds the group's lock (:func:`_checked` holds it until the collective is sent).
    """
    channel = _channel(group)
    if channel is None:  # a one-rank group, or one this rank is not in
        return
    with channel.lock:
        call.seq = channel.seq
        channel.seq += 1
        for name, calls in _recorders:
            if name == channel.name:
                calls.append(call)
        channel.post(call)
        everyone = channel.gather(call)
    if any(_key(c) != _key(call) for c in everyone.values()):
        raise DebugError(_mismatch(everyone, channel))


def _checked(name: str, fn):
    @functools.wraps(fn)
    def checked(*args, **kwargs):
        if getattr(_local, "inside", False) or not switch.enabled() or not dist.is_initialized():
            return fn(*args, **kwargs)
        _local.inside = True
        try:
            try:
                call = describe(name, *args, **kwargs)
            except (TypeError, ValueError):  # arguments torch itself will refuse: let it say so
                return fn(*args, **kwargs)
            script, ours = where_called()
            call.where = " in ".join(part for part in (script, ours) if part) or "?"
            call.ours = ours is not None
            call.step = current_step()
            call.after = not call.ours and call.step is not None and step_ended()
            group = _group_of(fn, args, kwargs)
            channel = _channel(group)
            if channel is None:
                return fn(*args, **kwargs)
            with channel.lock:  # this group's calls go out in the order they were compared; other groups' meanwhile
                check(call, group)
                return fn(*args, **kwargs)
        finally:
            _local.inside = False

    return checked


#: minddp's own ``all_gather_object`` (its tensors kept until gloo lets go: :mod:`minddp.runtime.keep`), checked
#: as torch's: what debug mode's guards gather with.
checked_gather = _checked("all_gather_object", keep.all_gather_object)


def _key(call: Call) -> tuple:
    return call.op, json.dumps(call.args)


def _mismatch(everyone: dict[int, Call], channel: "_Channel") -> str:
    """The one line for calls that differ: each distinct call with its ranks, how they differ, the cause."""
    calls = [everyone[r] for r in sorted(everyone)]
    distinct: dict[tuple, list[int]] = {}
    for rank, c in enumerate(calls):
        distinct.setdefault(_key(c), []).append(rank)
    said = "; ".join(
        f"{_ranks(ranks)} {calls[ranks[0]].said()}" for ranks in sorted(distinct.values(), key=lambda r: r[0])
    )
    how = next(
        (what for what, field in HOW if len({json.dumps(getattr(c, field)) for c in calls}) > 1),
        "another argument (root, reduce op or count)",
    )
    on = "" if channel.name == _world_name() else f" on group {channel.name!r}"
    left = _left_loop(calls)
    if left is not None:
        behind, ahead = left
        return finding(
            "uneven inputs",
            f"{_ranks(behind)} left the training loop after step {calls[behind[0]].step}: "
            f"{'its' if len(behind) == 1 else 'their'} collective #{calls[0].seq}{on} is "
            f"{calls[behind[0]].said()}, while {_ranks(ahead)} {'is' if len(ahead) == 1 else 'are'} in a step: "
            f"{calls[ahead[0]].said()}",
            UNEVEN_FIX,
            channel.global_rank,
            BY,
        )
    return finding(
        "mismatched collectives",
        f"collective #{calls[0].seq}{on} differs across ranks ({how}): {said}",
        "make the same collectives on every rank, in the same order, with the same op, shapes and dtypes "
        "(a collective made on some ranks only, e.g. under `if rank == 0:`, pairs with the next one of the others)",
        channel.global_rank,
        BY,
    )


HOW = [("another op", "op"), ("another dtype", "dtypes"), ("another shape", "shapes")]
UNEVEN_FIX = (
    "give every rank the same number of batches (a DistributedSampler gives each rank as many samples as the "
    "others, or stop every rank at the shortest rank's count), or train under `with model.join():`"
)


def _left_loop(calls: list[Call]) -> tuple[list[int], list[int]] | None:
    """(ranks that left their training loop, ranks still in a step), if some ranks' calls say exactly that."""
    ahead = [r for r, c in enumerate(calls) if c.ours and c.step is not None]
    behind = [r for r, c in enumerate(calls) if not c.ours]
    if not ahead or not behind or len(ahead) + len(behind) != len(calls):
        return None
    latest = max(calls[r].step for r in ahead)
    if all(calls[r].step is not None and calls[r].step < latest for r in behind):
        return behind, ahead
    return None


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


# -- step 4: the side channel and the bounded wait ------------------------------------------------------


class _Channel:
    """One process group's posts: its sequence number, its members, the store they meet on, its lock."""

    def __init__(self, group):
        self.name = group.group_name
        self.rank, self.size = dist.get_rank(group), group.size()
        self.global_rank = dist.get_rank()
        self.global_ranks = dist.get_process_group_ranks(group)
        self.seq = 0
        self.store = _store()
        self.seen: set[str] = set()  # keys known to exist (a read of an absent key would block)
        self.last: dict[int, Call] = {}
        self.lock = threading.RLock()  # one call of this group at a time, from its post until it is sent
        say_on()  # this rank was in debug mode before it joined the group (a script's own init, unwrapped)

    def slot(self, seq: int, rank: int) -> str:
        return f"post/{self.name}/{seq % SLOTS}/{rank}"

    def post(self, call: Call) -> None:
        self.store.set(self.slot(call.seq, self.rank), json.dumps(dataclasses.asdict(call)))

    def gather(self, mine: Call) -> dict[int, Call]:
        """Every member's post for ``mine.seq``: poll until all are there, or raise naming who is missing and why."""
        got, start, pause = {self.rank: mine}, time.monotonic(), 1e-4
        next_look, said = start + 0.2, False
        while True:
            missing = [r for r in range(self.size) if r not in got]
            for rank, call in zip(missing, self._read([self.slot(mine.seq, r) for r in missing])):
                if call is not None and call.seq == mine.seq:
                    got[rank] = call
            if len(got) == self.size:
                self.last = got  # each partner's latest call, for the line about a late one
                return got
            now = time.monotonic()
            if now >= next_look:
                missing = [r for r in range(self.size) if r not in got]
                self._look(mine, missing, now - start, said)
                said = said or now - start >= SAY_AFTER_S
                next_look = now + 0.5
            time.sleep(pause)
            pause = min(pause * 2, 0.005)

    def _read(self, keys: list[str]) -> list[Call | None]:
        unknown = [k for k in keys if k not in self.seen]
        for key in unknown:
            if self.store.check([key]):
                self.seen.add(key)
        present = [k for k in keys if k in self.seen]
        values = dict(zip(present, self.store.multi_get(present))) if present else {}
        return [Call(**json.loads(values[k])) if k in values else None for k in keys]

    def _look(self, mine: Call, missing: list[int], waited: float, said: bool) -> None:
        """A partner is late: raise if it left or its process ended; say so once after SAY_AFTER_S; bound the wait."""
        for rank in missing:
            gone = _marker(self.store, f"left/{self.global_ranks[rank]}")
            if gone is not None:
                raise DebugError(self._left(mine, rank, gone))
        last = "; ".join(
            f"rank {r}'s last was #{self.last[r].seq} {self.last[r].said()}"
            if r in self.last
            else f"rank {r} made none"
            for r in missing
        )
        failed = [(r, _said(self.store, f"failed/{self.global_ranks[r]}")) for r in missing]
        last += "".join(f"; rank {r} had {what}" for r, what in failed if what is not None)
        off = [r for r in missing if not self.store.check([f"on/{self.global_ranks[r]}"])]
        if off:  # a rank says so when it turns debug mode on, or joins the group with it on (say_on)
            verb = "is" if len(off) == 1 else "are"
            last += f" ({_ranks(off)} {verb} not in debug mode: set MINDDP_DEBUG=1 for every rank)"
        what = f"{_ranks(missing)} {'has' if len(missing) == 1 else 'have'} not reached collective #{mine.seq}"
        if waited >= SAY_AFTER_S and not said:
            line = finding(
                "waiting for a collective",
                f"rank {self.rank} has waited {waited:.0f} s in {mine.said()}: {what}; {last}",
                "if a rank skipped this collective (one made under `if rank == ...:`), make it on every rank; "
                "if it is still computing, this line is only news",
                self.global_rank,
                BY,
            )
            print(line, file=sys.stderr, flush=True)
        if waited >= self.store.timeout.total_seconds():
            raise DebugError(
                finding(
                    "a collective no partner made",
                    f"{what} within the store's timeout ({self.store.timeout}), while rank {self.rank} is in "
                    f"{mine.said()}; {last}",
                    "make every collective on every rank; a rank still computing needs a longer timeout",
                    self.global_rank,
                    BY,
                )
            )

    def _left(self, mine: Call, rank: int, gone: dict) -> str:
        how = f"{gone['how']} at {gone['where']}" + ("" if gone["step"] is None else f", after step {gone['step']}")
        if mine.ours and mine.step is not None:
            return finding(
                "uneven inputs",
                f"rank {rank} left its training loop and the process group ({how}) while rank {self.rank} is in "
                f"a step: {mine.said()}",
                UNEVEN_FIX,
                self.global_rank,
                BY,
            )
        return finding(
            "a collective no partner made",
            f"rank {rank} left the process group ({how}) before collective #{mine.seq}, which rank {self.rank} makes: "
            f"{mine.said()}",
            "make every collective on every rank, and end every rank's loop at the same step",
            self.global_rank,
            BY,
        )


def _store():
    return dist.PrefixStore("minddp-debug/", process_group_store(dist.group.WORLD))


def _world_name() -> str:
    return dist.group.WORLD.group_name


def _channel(group) -> _Channel | None:
    group = dist.group.WORLD if group is None else group
    if group is c10d.GroupMember.NON_GROUP_MEMBER or group.size() < 2:
        return None
    name = group.group_name  # unique among the groups alive in this process (an id() may be reused)
    with _registry:
        channel = _channels.get(name)
        if channel is None:
            channel = _channels[name] = _Channel(group)
        return channel


def _marker(store, key: str) -> dict | None:
    said = _said(store, key)
    return None if said is None else json.loads(said)


def _said(store, key: str) -> str | None:
    return store.get(key).decode() if store.check([key]) else None


def _joining(fn):
    """``init_process_group`` that then says this rank is in debug mode, if it is (:func:`say_on`)."""

    @functools.wraps(fn)
    def init_process_group(*args, **kwargs):
        fn(*args, **kwargs)
        say_on()

    return init_process_group


def _leaving(fn):
    """``destroy_process_group`` that first posts where and when this rank left (for partners still waiting).

    Another group's channel goes with it: a group made later starts its own sequence, whatever its name or id.
    """

    @functools.wraps(fn)
    def destroy_process_group(group=None):
        if group in (None, dist.group.WORLD) and dist.is_initialized() and _channels:
            script, ours = where_called()
            _say_left("destroy_process_group", script or ours or "?")
        elif group not in (None, dist.group.WORLD):
            with _registry:
                _channels.pop(getattr(group, "group_name", None), None)
        return fn(group)

    return destroy_process_group


def _say_left(how: str, where: str) -> None:
    with _registry:
        try:
            _store().set(f"left/{dist.get_rank()}", json.dumps({"how": how, "where": where, "step": current_step()}))
        except Exception:  # the store may be gone already (its owner ended): nobody is left to tell
            pass
        _channels.clear()


def _at_exit() -> None:
    if dist.is_initialized() and _channels:
        how = "its process ended" + (f" with {_exit_reason[-1]}" if _exit_reason else "")
        _say_left(how, "exit")


def _note_error(what: str) -> None:
    """An error no one caught, on any thread: kept for the line at exit, and told to the partners now."""
    _exit_reason.append(what)
    if switch.enabled() and dist.is_initialized():
        try:
            _store().set(f"failed/{dist.get_rank()}", what)
        except Exception:  # the store may be gone: the line at exit still says it
            pass


def _first_line(error) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f": {text}" if text else ""


# -- where a call was made -------------------------------------------------------------------------------


def where_called() -> tuple[str | None, str | None]:
    """Where the call being made now comes from: (the script's file:line, minddp's part: its label or frame).

    Frames inside torch and this module are skipped; a frame inside minddp makes the call minddp's (a
    wrapper's step); the first frame outside minddp, torch and the standard library is the script's.
    """
    frame, ours = script_frame(sys._getframe(1))
    script = _at(frame) if frame is not None else None
    if ours is None:
        return script, None
    return script, getattr(_local, "label", None) or f"minddp's {ours.f_code.co_name} ({_at(ours)})"


def script_frame(frame):
    """(the first frame from ``frame`` outward that is the script's, the first that is minddp's), either None."""
    ours = None
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH) and path not in (__file__, "<string>"):  # <string>: python -c, a fork
            if not path.startswith(_MINDDP) and not path.startswith(_STDLIB):
                return frame, ours
            if ours is None and path.startswith(_MINDDP):
                ours = frame
        frame = frame.f_back
    return None, ours


def _at(frame) -> str:
    if frame.f_code.co_filename.startswith("<"):  # a notebook cell, an interactive line: no file
        return f"{frame.f_code.co_filename}:{frame.f_lineno}"
    path = os.path.abspath(frame.f_code.co_filename)
    if path.startswith(_MINDDP):
        path = os.path.relpath(path, os.path.dirname(_MINDDP.rstrip(os.sep)))
    elif path.startswith(os.getcwd() + os.sep):
        path = os.path.relpath(path)
    return f"{path}:{frame.f_lineno}"


# -- describing a call -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature:
    return inspect.signature(fn)


def _group_of(fn, args, kwargs):
    try:
        return _signature(fn).bind_partial(*args, **kwargs).arguments.get("group")
    except TypeError:
        return None


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return []


def _tensor_text(tensors: list[torch.Tensor], with_shape: bool, as_list: bool) -> str:
    texts = [str(t.dtype).replace("torch.", "") + (str(list(t.shape)) if with_shape else "") for t in tensors]
    if not as_list:
        return texts[0]
    return f"{len(texts)} × {texts[0]}" if len(set(texts)) == 1 else "[" + ", ".join(texts) + "]"
