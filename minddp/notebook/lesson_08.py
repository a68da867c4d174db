"""Notebook 08's (``notebooks/08_debugging``) model, and the three runs it gives each bug: torch, debug mode, the fix.

Every section of the notebook breaks DDP on purpose and runs the broken script three ways on every rank:

1. :func:`torch_does`: debug mode paused (:func:`minddp.debug.disable`), what each rank of torch's DDP raised and
   after how long (:func:`torch_drifts`: a script that raises nothing, and how far its replicas ended apart);
2. :func:`minddp_says`: in debug mode, the line rank 0 raised (a ``DebugError``), and whether every rank raised it;
3. :func:`fixed`: the corrected script in debug mode: nothing said (:func:`quiet`), and the replicas agree.

The model is :class:`Net`; :func:`build` wraps it as torch's examples do (``model = DDP(model)``: ``model`` is the
wrapper, ``model.module`` the module it wraps). Everything here runs inside ``%%distributed`` cells, on every rank of
the notebook's cluster; the one example below runs on one rank (the doctests' one-process group).

    >>> model, optimizer = build()
    >>> train(model, optimizer, steps=2)
    >>> apart(model)    # one rank: no replica to differ from
    0.0
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import tempfile
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.constants import default_pg_timeout

import minddp.debug
from minddp.ddp import DistributedDataParallel
from minddp.notebook import lesson
from minddp.runtime.device import current_device
from minddp.runtime.launch import peer_gone

__all__ = [
    "DEFAULT_WAIT_S",
    "WAIT_S",
    "Net",
    "apart",
    "apart_at",
    "batch",
    "build",
    "cpp_warnings",
    "each_rank",
    "fixed",
    "gist",
    "minddp_says",
    "mismatched",
    "peer_gone",
    "quiet",
    "say_each",
    "torch_does",
    "torch_drifts",
    "torch_step",
    "torch_took",
    "train",
]

#: Under torch, the script's own collectives give up after this many seconds (torch's DDP's, after DEFAULT_WAIT_S).
WAIT_S = 3

#: torch's default timeout, in seconds, which the group torch's DDP runs on in :func:`torch_does` is given.
DEFAULT_WAIT_S = default_pg_timeout.total_seconds()

#: Each rank's seconds in :func:`torch_does`'s last run, from the script's start until it raised or finished.
torch_took: list[float] = []

#: Each rank's step in :func:`train` when :func:`torch_does`'s last run raised (None: not in ``train``).
torch_step: list[int | None] = []

_in_step: list[int | None] = [None]  # the step train() is in on this rank, for torch_does


class Net(nn.Module):
    """The notebook's model: ``encoder`` then ``head``; with ``extra``, a second head, used when ``use_extra``."""

    def __init__(self, extra: bool = False):
        super().__init__()
        self.encoder, self.head = nn.Linear(8, 16), nn.Linear(16, 4)
        self.extra = nn.Linear(16, 4) if extra else None

    def forward(self, x, use_extra: bool = False):
        h = torch.tanh(self.encoder(x))
        return self.head(h) + self.extra(h) if use_extra else self.head(h)


def build(wrapper=DistributedDataParallel, extra: bool = False, **kwargs):
    """``(model, optimizer)``: the same :class:`Net` on every rank, wrapped (``model = wrapper(Net(), **kwargs)``),
    and SGD over its parameters."""
    torch.manual_seed(0)
    model = wrapper(Net(extra).to(current_device()), **kwargs)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def batch(step: int, same_on_every_rank: bool = False):
    """``(x, y)``, 6 examples: this rank's own for ``step`` (its shard), or with ``same_on_every_rank`` every rank's."""
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(step if same_on_every_rank else 100 * step + rank)
    return torch.randn(6, 8, generator=g).to(current_device()), torch.randn(6, 4, generator=g).to(current_device())


def train(model, optimizer, steps: int, **forward) -> None:
    """``steps`` correct steps on this rank's batches 0, 1, ...; ``forward``: keywords for every forward."""
    for step in range(steps):
        _in_step[0] = step
        x, y = batch(step)
        nn.functional.mse_loss(model(x, **forward), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    _in_step[0] = None


def apart(model) -> float:
    """The largest difference between a rank's parameters and rank 0's (0: the replicas agree)."""
    return apart_at(model)[0]


def apart_at(model) -> tuple[float, str]:
    """``apart(model)``, and the name (in the wrapped module) of the parameter where that largest difference is."""
    module = getattr(model, "module", model)
    names, flat = zip(*[(name, p.detach().reshape(-1)) for name, p in module.named_parameters()])
    mine = torch.cat(flat)
    rank0 = mine.clone()
    dist.broadcast(rank0, src=0)
    gaps = (mine - rank0).abs()
    at = int(gaps.argmax())
    ends = torch.tensor([t.numel() for t in flat], device=mine.device).cumsum(0)  # where each parameter ends in mine
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (gaps[at].item(), names[int((ends <= at).sum())]))
    return max(everyone)


def each_rank(value) -> list:
    """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, value)
    return everyone


def seconds(took: float) -> str:
    """``took`` seconds as the notebook prints them, to 0.01 s: "under 0.01 s" below that (rounded, 0.006 would read
    as the 0.01 s it is not), so a time and a claim about it say the same."""
    return f"{took:.2f} s" if took >= 0.01 else "under 0.01 s"


def torch_does(script, say: bool = True, level: str = "OFF") -> list[str]:
    """Run ``script(group, short)`` with debug mode paused; print (unless not ``say``) and return whether each rank
    raised, in a line
    (an error: in square brackets, not torch's words, the step of :func:`train` it was raised in if any and the seconds
    until it was raised; then its type and an excerpt: its first two sentences, any later one naming
    ``find_unused_parameters`` (torch's advice), and the line naming the parameter indices if it has one, all as
    torch wrote them; for gloo's errors, nothing
    from its guess at a cause,
    "This is typically caused by ...", on; "…" where sentences were cut); each rank's seconds until it raised (or
    finished) are left in :data:`torch_took`, and its step in :data:`torch_step`.

    ``group``: a new group for torch's DDP, with torch's default timeout (:data:`DEFAULT_WAIT_S`); ``short``: one
    whose calls give up after :data:`WAIT_S`, for the script's own collectives. A rank that fails destroys both, as a
    job's process ends when it raises: a partner waiting on it then fails at once ("Connection closed by peer", or
    reset). ``level``: torch's debug level for the run (``TORCH_DISTRIBUTED_DEBUG``'s values: OFF, its default,
    INFO, DETAIL), set before the groups are made (at DETAIL torch wraps each in its collective-comparing wrapper).
    """
    minddp.debug.disable()
    before = dist.get_debug_level()
    dist.set_debug_level(getattr(dist.DebugLevel, level))
    # the short group is made right after the other, whose making the ranks finish together
    groups = [dist.new_group(timeout=default_pg_timeout), dist.new_group(timeout=timedelta(seconds=WAIT_S))]
    _in_step[0] = step = None
    start = time.perf_counter()
    try:
        script(*groups)
        mine, took = "raised nothing", time.perf_counter() - start
    except RuntimeError as error:  # torch's and gloo's errors: the lines the docstring names
        excerpt = _excerpt(str(error))
        took, step = time.perf_counter() - start, _in_step[0]
        where = "" if step is None else f"in train()'s step {step}, "
        mine = f"[{where}{seconds(took)} from start] {type(error).__name__}: {excerpt}"  # brackets: not torch's
        for g in groups:
            dist.destroy_process_group(g)  # where this rank's process would end
        groups = []
    finally:
        minddp.debug.enable()
        dist.set_debug_level(before)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, took, step))
    for g in groups:
        dist.destroy_process_group(g)
    for r, (outcome, _, _) in enumerate(everyone if say else []):
        lesson.say(f"torch, rank {r}: {outcome}")
    torch_took[:] = [took for _, took, _ in everyone]
    torch_step[:] = [step for _, _, step in everyone]
    return [outcome for outcome, _, _ in everyone]


def _excerpt(message: str) -> str:
    r""":func:`torch_does`'s excerpt of an error ``message``: the sentences its docstring names, "…" for each cut.

    >>> _excerpt("A. B. C. See find_unused_parameters.\nParameter indices: 2 3\nOr set TORCH_DISTRIBUTED_DEBUG. D")
    'A. B. … See find_unused_parameters. Parameter indices: 2 3 …'
    >>> _excerpt("[pair.cc:553] Connection closed by peer [127.0.0.1]:1. This is typically caused by a crash. GLHF!")
    '[pair.cc:553] Connection closed by peer [127.0.0.1]:1. …'
    """
    sentences: list[str] = []  # a sentence may run over lines; a line naming the indices is one of its own
    for indices, run in itertools.groupby(message.strip().splitlines(), key=lambda line: "indices" in line):
        lines = [line.strip() for line in run]
        sentences += lines if indices else [s for s in re.split(r"(?<=\.)\s+", " ".join(lines)) if s]
    guess = next((i for i, s in enumerate(sentences) if s.startswith("This is typically caused by")), len(sentences))
    said: list[str] = []
    for i, sentence in enumerate(sentences):
        if i < guess and (i < 2 or "find_unused_parameters" in sentence or "indices" in sentence):
            said.append(sentence)
        elif not said or said[-1] != "…":
            said.append("…")  # gloo's guess at a cause, and what follows it, cut too
    return " ".join(said)


def torch_drifts(script) -> None:
    """``script(model, optimizer)`` on torch's DDP: claim that it raises nothing and the replicas end apart, saying by
    how much at most (:func:`apart_at`, after the script's last step) and in which parameter."""
    models = []

    def run(group, short):
        model, optimizer = build(torch.nn.parallel.DistributedDataParallel, process_group=group)
        models.append(model)
        script(model, optimizer)

    raised = torch_does(run, say=False)
    gap, name = apart_at(models[0])
    lesson.claim(
        raised == ["raised nothing"] * dist.get_world_size() and gap > 0,
        "torch's DDP raised nothing; the replicas' parameters "
        + (f"ended apart, the most ({gap:.3g}) in '{name}'" if gap > 0 else "agree"),
    )


def minddp_says(
    script,
    cause: str | tuple[str, ...],
    verdict: str = "debug mode stopped every rank",
    also=True,
) -> str | None:
    """Run ``script()`` in debug mode; print the ``DebugError`` rank 0 raised, alone, then whether the others raised
    the same finding (:func:`say_each`), and claim every rank raised one that contains ``cause`` (each of them, if
    several) and that ``also`` holds; return rank 0's line."""
    causes = (cause,) if isinstance(cause, str) else cause
    try:
        script()
    except minddp.debug.DebugError as finding:
        line = f"{type(finding).__name__}: {finding}"
    else:
        line = None
    said = say_each(line, "raised")
    lesson.claim(also and all(line is not None and all(c in line for c in causes) for line in said), verdict)
    return said[0]


def mismatched(script, size: int) -> None:
    """Section 4's first bug three ways, ``script(group)`` being this rank's all_reduce of ``size`` numbers on ``group``
    (None: the default group): under torch at debug level OFF, in debug mode (:func:`minddp_says`), and under torch at
    DETAIL. Prints rank 0's error of each, torch's at DETAIL cut to each rank's op and shape ("…" for each cut), and
    claims what each names: at OFF a timeout (the first rank to fail can only time out; the other then times out too
    or loses its partner) and neither op nor shape; at DETAIL, on every rank, a mismatch (not a timeout) naming each
    rank's op and shape, as debug mode does; only debug mode names the place."""
    off = torch_does(lambda group, short: script(short), say=False, level="OFF")
    lesson.say(f"torch, rank 0: {off[0]}")
    timed_out = [r for r, (s, t) in enumerate(zip(off, torch_took)) if "Timed out" in s and t >= WAIT_S]
    rest = [r for r in range(len(off)) if r not in timed_out]
    who = "every rank" if not rest else "rank " + ", ".join(map(str, timed_out))
    lesson.claim(
        len(timed_out) > 0
        and all(peer_gone(off[r]) for r in rest)
        and not any(re.search(r"all_?reduce|shape|float|\[\d+\]", s, re.I) for s in off),
        f"at OFF {who} waited to the {WAIT_S} s timeout"
        + (f", then rank {', '.join(map(str, rest))} lost its partner" if rest else "")
        + ", naming neither the all_reduce nor a shape",
    )
    ours = minddp_says(lambda: script(None), "mismatched collectives")
    detail = torch_does(lambda group, short: script(short), say=False, level="DETAIL")
    # a rank's call as torch writes it: "Rank R is running collective: CollectiveFingerPrint(..., OpType=..."
    call = r"Rank (\d+) is running collective: CollectiveFingerPrint\([^)]*?(OpType=\w+, TensorShape=\[\d*\])"
    calls = [re.findall(call, e) for e in detail]
    shown = ", but ".join(f"Rank {r} is running collective: … {op} …" for r, op in calls[0])
    lesson.say(f"torch at DETAIL, rank 0: {detail[0].split('. ')[0]}. {shown}")
    sizes = each_rank(size)
    lesson.claim(
        all("Detected mismatch between collectives" in e and "Timed out" not in e for e in detail)
        and all(
            set(cs) == {(str(r), f"OpType=ALLREDUCE, TensorShape=[{n}]") for r, n in enumerate(sizes)} for cs in calls
        )
        and all(f"rank {r} all_reduce(float32[{n}]" in ours for r, n in enumerate(sizes))
        and "<In [" in ours
        and not any("<In [" in e for e in detail),
        "at DETAIL every rank raised a mismatch, not a timeout, naming each rank's op and shape; only debug mode named "
        "the place",
    )


def say_each(line: str | None, how: str) -> list:
    """Every rank's ``line`` (None: it said nothing): rank 0's printed alone, then in a line of its own whether each
    other rank ``how`` (raised, warned) rank 0's finding (a rank's line that differs in more than where it names its
    own rank is printed); returns every rank's line."""
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, line)
    own = everyone[0]
    lesson.say(own or "minddp said nothing")
    told = []
    for r, said in enumerate(everyone[1:], start=1):
        if said is None:
            told.append(f"rank {r} said nothing")
        elif (mine := said.replace(f"(rank {r}): ", "(rank 0): ", 1)) == own:
            told.append(f"rank {r} {how} the same finding")
        elif mine.replace(f", rank {r}>", ", rank 0>") == own:  # it names the place in its own copy of the cell
            place = re.search(rf"<In \[\d+\], rank {r}>", said).group()
            told.append(f"rank {r} {how} the same finding, naming the place as `{place}`")
        else:
            told.append(f"rank {r} {how}: {said}")
    lesson.say(f"({'; '.join(told)})")
    return everyone


@contextlib.contextmanager
def quiet():
    """The block in debug mode, expected to say nothing: yields a list that holds, after it, the debug mode
    warnings the block raised (an error would raise through)."""
    said = []
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        yield said
    said += [str(w.message) for w in heard if issubclass(w.category, minddp.debug.DebugWarning)]


def fixed(script, fix: str, **corrected) -> None:
    """``script(model, optimizer, **corrected)`` in debug mode: claim that nothing is said and the replicas agree."""
    model, optimizer = build()
    with quiet() as said:
        script(model, optimizer, **corrected)
    lesson.claim(not said and apart(model) == 0, f"the fix: {fix}, debug mode is silent and the replicas agree")


#: A warning of torch's C++ code as it reaches stderr: ``[rank1]:[W1130 17:52:54.747494824 reducer.cpp:1529] Warning:``
_CPP_WARNING = re.compile(r"^(?:\[rank\d+\]:)?\[W\d+ [\d:.]+ ([^\]]+)\] Warning: (.*)$")


@contextlib.contextmanager
def cpp_warnings():
    """The block with this process's file descriptor 2 (where torch's C++ code writes its warnings) caught: yields a
    list that holds, after it, each C++ warning written meanwhile as ``"file:line: message"``, without the log's
    timestamp and rank prefix; whatever else was written goes on to stderr as it would have.

    >>> with cpp_warnings() as warned:
    ...     _ = os.write(2, b"[rank1]:[W1130 17:52:54.747494824 reducer.cpp:1529] Warning: none found (f())\\n")
    >>> warned
    ['reducer.cpp:1529: none found (f())']
    """
    warned: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield warned
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = []
            for line in caught.read().decode(errors="replace").splitlines():
                if match := _CPP_WARNING.match(line):
                    warned.append(f"{match[1]}: {match[2]}")
                else:
                    rest.append(line + "\n")
            if rest:
                os.write(2, "".join(rest).encode())


def gist(warning: str) -> str:
    """A warning of :func:`cpp_warnings` cut to two sentences: its first, and the one advising to turn the flag off
    ("…" for each cut), without the log's "(function ...)" tag.

    >>> gist("f.cpp:1: X was set. Y found none. If so, consider turning this flag off. Note Z. (function operator())")
    'f.cpp:1: X was set. … If so, consider turning this flag off. …'
    """
    parts = warning.removesuffix(" (function operator())").removesuffix(".").split(". ")
    advice = next(i for i, part in enumerate(parts) if "turning this flag off" in part)
    return ". ".join(parts[:1] + ["… " + parts[advice]]) + (". …" if advice + 1 < len(parts) else ".")
