"""What the step-through notebooks share: one workload, one set of settings, one way to run a stage.

The notebooks that train the ladder's stages (02 to 06) use the offline ``small-llama`` preset on the
offline paraphrase task, 16 examples per rank per micro-batch, with :data:`SETTINGS` (3 micro-batches per
step, AdamW, 4 MiB buckets, seed 314), so that a number in one notebook means what it means in the next;
the others that train (07 to 10) each use a small model of their own (08's: ``lesson_08.Net``, SGD). A
:class:`Trainee` is one stage (wrapped by :func:`minddp.ladder.wrap`) training it on this rank, alive
between cells; three ways to look at it:

1. :meth:`Trainee.look`: one step under the profiler, read in memory (all_reduce calls and bytes,
   how many started during a backward, what the step did after the last backward);
2. :func:`race`: trainees take turns, one step each, for a few rounds; a step's time is its slowest rank's;
3. :meth:`Trainee.profile`: steps under :class:`minddp.runtime.profiling.StepProfiler`, traces on disk.

:func:`say` and friends turn results into sentences, :func:`claim` asserts one about the run, and
:func:`picture` draws a look's step. ``notebooks/README.md`` (*One workload for every notebook*) says why.

Example (inside ``%%distributed`` cells, on every rank of a notebook's cluster: not run by the
doctests, which have one rank; the notebooks run it)::

    >>> trainees = {s: Trainee(s) for s in ["single", "simple", "ga"]}     # doctest: +SKIP
    >>> looks = {s: t.look() for s, t in trainees.items()}                 # doctest: +SKIP
    >>> times = race(trainees, rounds=4)                                   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from minddp.runtime.device import current_device, message_device

ROOT = Path(__file__).resolve().parents[2]
#: Where notebook runs write their traces (``traces/`` is ignored by git).
TRACE_ROOT = ROOT / "traces" / "notebooks"


@dataclass(frozen=True)
class Settings:
    """One workload and one set of settings for every stage in every notebook."""

    model: str = "small-llama"  #: offline preset: 5 M parameters, no download
    batch_size: int = 16  #: examples per rank per micro-batch (the benchmark's small preset)
    max_seq_len: int = 64
    grad_accum: int = 3  #: micro-batches per optimizer step, for every stage (the CLI's default)
    bucket_cap_mb: float = 4.0  #: bucketed stages and torch's DDP: a few buckets of this model
    lr: float = 1e-3  #: AdamW (the CLI's 3e-3 suits its 80 k-parameter default, not this model)
    seed: int = 314  #: model init, data, shuffling (the CLI's)
    warmup: int = 1  #: untimed steps a trainee takes when built


SETTINGS = Settings()


@functools.lru_cache(maxsize=1)
def data():
    """The tokenized task (built once per process; deterministic, so every rank builds the same)."""
    from minddp.train.data import prepare_data

    return prepare_data(
        "synthetic", model=SETTINGS.model, seed=SETTINGS.seed, max_seq_len=SETTINGS.max_seq_len, say=lambda *_: None
    )


def make_model(seed: int | None = None, name: str | None = None) -> torch.nn.Module:
    """The same weights in every process that passes the same seed (default: the settings' seed), on this
    rank's device (:func:`minddp.runtime.device.current_device`: a GPU where the ranks have one, else the CPU);
    ``name``: another offline preset than the settings' (the same data)."""
    from minddp.train.models import build_model

    d = data()
    return build_model(
        name or SETTINGS.model,
        vocab_size=d.vocab_size,
        pad_token_id=d.pad_token_id,
        seed=SETTINGS.seed if seed is None else seed,
    ).to(current_device())


def describe() -> str:
    """The workload and settings in one sentence, from the objects themselves."""
    from minddp.train.models import count_parameters

    model, world = make_model(), dist.get_world_size() if dist.is_initialized() else 1
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    per_step = SETTINGS.batch_size * SETTINGS.grad_accum * world
    return (
        f"Workload: {SETTINGS.model}, {count_parameters(model) / 1e6:.1f} M parameters in {tensors} tensors "
        f"({count_parameters(model) * 4 / 2**20:.1f} MiB of float32 gradients per sync), on the offline "
        f"paraphrase task; {SETTINGS.batch_size} examples per rank per micro-batch, {SETTINGS.grad_accum} "
        f"micro-batches per optimizer step, {world} ranks: {per_step} examples per step. AdamW (lr "
        f"{SETTINGS.lr:g}), buckets of {SETTINGS.bucket_cap_mb:g} MiB, seed {SETTINGS.seed}."
    )


def cores() -> int:
    """The CPU cores this process may run on (its affinity where the system has one), shared by every rank here."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine(link: bool | str = True) -> str:
    """The machine the ranks share, in one sentence: its cores and where the ranks compute; ``link=False``
    for a run without an emulated link (no link threads share the cores), or the words that say which run has
    one (``link="in the link run"``)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    where = "on the CPU" if current_device().type == "cpu" else f"on {current_device().type} devices"
    when = f", {link}," if isinstance(link, str) else ""
    sharers = (
        f"the {world} ranks, their gloo threads and{when} each rank's emulated-link thread"
        if link
        else f"the {world} ranks and their gloo threads"
    )
    return f"This machine: {cores()} CPU cores, shared by {sharers}; the ranks compute {where}."


def step_batches(whole: bool = False, grad_accum: int | None = None):
    """This rank's micro-batches, step after step, on this rank's device; ``whole=True``: the global batch
    (every rank's shard); ``grad_accum``: micro-batches per step, if not the settings'."""
    from minddp.train.data import step_batches as batches

    rank, world = dist.get_rank(), dist.get_world_size()
    d = data()
    if whole:
        steps = batches(
            d.train,
            batch_size=SETTINGS.batch_size * world,
            grad_accum=grad_accum or SETTINGS.grad_accum,
            num_replicas=1,
            rank=0,
            seed=SETTINGS.seed,
            pad_token_id=d.pad_token_id,
        )
    else:
        steps = batches(
            d.train,
            batch_size=SETTINGS.batch_size,
            grad_accum=grad_accum or SETTINGS.grad_accum,
            num_replicas=world,
            rank=rank,
            seed=SETTINGS.seed,
            pad_token_id=d.pad_token_id,
        )
    device = current_device()
    return ([{k: v.to(device) for k, v in micro.items()} for micro in step] for step in steps)


def loss_fn(model, batch) -> torch.Tensor:
    return model(**batch).loss


class Trainee:
    """One stage training the workload on this rank; build it on every rank (module doc).

    ``stage``: a name of :data:`minddp.ladder.STAGES`, ``torch`` (torch's DDP),
    or ``single`` (no wrapper: each rank trains its own shard and never
    communicates: the no-sync limit of a step). ``hook``: a comm-hook name
    (:func:`minddp.comm.registry.make_hook`); with ``measure_error`` minddp's
    hook is wrapped in :func:`minddp.comm.measure.error_measured`. ``link``
    (a preset such as ``"1gbit"``, :mod:`minddp.comm.link`): every collective
    the stage sends through its :class:`~minddp.comm.wire.Wire` (its comm
    hook's; torch's DDP through minddp's hook of the same name) goes over that
    emulated network, and its profiled traces show the link's transfers; the
    parameter check's all_gather (:mod:`minddp.stages.checks`) calls
    ``dist.all_gather`` itself and does not.
    ``transport`` (a name of :data:`minddp.collectives.TRANSPORTS`, e.g.
    ``"ring"``): the stage's collectives are written from point-to-point
    messages, each in a range naming its collective (:func:`labelled`), so a
    look counts the bytes they really sent (``look()["sent"]``).
    ``bucket_cap_mb`` (``None``: torch's default), ``model`` (an offline
    preset) and ``grad_accum`` replace the settings' for this trainee only.
    """

    def __init__(
        self,
        stage: str,
        hook: str = "allreduce",
        powersgd_options: dict | None = None,
        measure_error: bool = False,
        warmup: int | None = None,
        link: str | None = None,
        transport: str | None = None,
        bucket_cap_mb: float | None = SETTINGS.bucket_cap_mb,
        model: str = SETTINGS.model,
        grad_accum: int = SETTINGS.grad_accum,
    ):
        from minddp.collectives import TRANSPORTS
        from minddp.comm.link import as_link
        from minddp.comm.wire import Traffic, Wire
        from minddp.ladder import make_optimizer, wrap

        self.stage, self.hook = stage, hook
        self.traffic = Traffic()
        self.link = None if stage == "single" else as_link(link)  # one emulated NIC for all of this stage's sends
        sends = labelled(TRANSPORTS[transport]) if transport is not None else None
        wire = Wire(None, transport=sends, traffic=self.traffic, link=self.link)
        self.model = wrap(
            stage,
            make_model(name=model),
            hook=hook,
            bucket_cap_mb=bucket_cap_mb,
            wire=wire,
            powersgd_options=powersgd_options,
            measure=self.traffic if measure_error else None,
        )
        # the stage's optimizer: ZeRO-1's sharded one, the shards of zero2 and fsdp (minddp.ladder.make_optimizer)
        self.optimizer = make_optimizer(stage, self.model, torch.optim.AdamW, hook=hook, wire=wire, lr=SETTINGS.lr)
        self.batches = step_batches(grad_accum=grad_accum)
        self.losses: list[float] = []  #: the global batch's loss, every step taken
        self.metered: list[dict] = []  #: the traffic meter's reading (calls, payload bytes), every step taken
        for _ in range(SETTINGS.warmup if warmup is None else warmup):
            self.step()

    def step(self, watch=None, measure: bool = True) -> float:
        """One optimizer step (:func:`minddp.ladder.loop.train_step`); returns the slowest rank's wall time, ms.

        ``watch``: a context manager (a profiler) around the training step
        only. ``measure=False`` leaves out what measures the step (a barrier
        and two small all_reduces: the time, the loss), for a step recorded
        whole in a trace; its loss is then this rank's own, and it returns
        this rank's time.
        """
        from minddp.ladder.loop import train_step

        self.traffic.reset()
        batch = next(self.batches)
        if measure:
            dist.barrier()  # every rank starts the step together
        start = time.perf_counter()
        with watch if watch is not None else contextlib.nullcontext():
            loss = torch.tensor(train_step(self.model, self.optimizer, batch, loss_fn), device=message_device())
        took = torch.tensor(time.perf_counter() - start, device=message_device())
        self.metered.append(self.traffic.snapshot())
        if not measure:
            self.losses.append(loss.item())
            return took.item() * 1e3
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
        dist.all_reduce(loss)  # shard losses -> the global batch's (equal shards)
        self.losses.append(loss.item() / dist.get_world_size())
        return took.item() * 1e3

    def look(self) -> dict:
        """Step 1 of the module doc: one step under the profiler, read in memory (every rank's view); over an
        emulated link, with the link's transfers and this rank's waits (:func:`minddp.analysis.live.step_view`)."""
        seen = profiled_step(lambda prof: self.step(watch=prof), self.link)
        seen["buckets"] = buckets_of(self.model)
        seen["row"].update(stage=self.stage, label=self.stage)
        return seen

    def profile(self, trace_dir, steps: int = 1) -> Path:
        """Step 3: one profiler warm-up step, then ``steps`` recorded ones; the trace of this rank goes to
        ``trace_dir/<stage>/rank<r>.pt.trace.json`` (rank 0 writes ``config.json`` beside it)."""
        from minddp.runtime.profiling import StepProfiler, write_json

        folder = Path(trace_dir) / self.stage
        dist.barrier()  # ranks that never talk (single) still start together: their traces overlap
        with StepProfiler(str(folder), dist.get_rank(), 1 + steps, active=steps, memory=False) as prof:
            for _ in range(1 + steps):
                self.step(measure=False)  # nothing in the trace but the training step
                prof.step()
        if self.link is not None and prof.written:
            self.link.annotate_trace(prof.written)  # the link's transfers, as ranges on a thread of their own
        if dist.get_rank() == 0:
            write_json(
                str(folder / "config.json"),
                {
                    "run_name": folder.parent.name,
                    "stage": self.stage,
                    "world_size": dist.get_world_size(),
                    "hook": self.hook,
                    "link": self.link.spec.name if self.link else None,
                    **asdict(SETTINGS),
                },
            )
        return folder

    def flat_parameters(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model.parameters()])


def profiled_step(step, link=None) -> dict:
    """What :meth:`Trainee.look` reads of one step: ``step(prof)`` runs it with the profiler ``prof`` around the
    training step; returns :func:`minddp.analysis.live.step_view` over ``link`` (its log and ``asked`` emptied first,
    so they hold this step's only), with ``sent`` (:func:`sent_by_collective`)."""
    from minddp.analysis import live

    if link is not None:
        link.log.clear()
        link.asked.clear()
    prof = live.profiler()
    step(prof)
    seen = live.step_view(prof, link=link)
    seen["sent"] = sent_by_collective(prof)
    return seen


#: The backends' ranges of one point-to-point send, whose input is what went out.
SEND_RANGES = ("gloo:send", "nccl:send")


def labelled(transport):
    """``transport`` (a :class:`minddp.collectives.Transport`) with each call in a profiler range
    ``minddp.transport:<collective>``, so :func:`sent_by_collective` can tell whose sends were whose."""
    from minddp.collectives import Transport

    def named(kind, run):
        def call(*args):
            with torch.profiler.record_function(f"minddp.transport:{kind}"):
                run(*args)

        return call

    return Transport(
        transport.name,
        named("all_reduce", transport.all_reduce),
        named("reduce_scatter", transport.reduce_scatter),
        named("all_gather", transport.all_gather),
    )


def sent_by_collective(prof) -> dict[str, int]:
    """Bytes this rank's point-to-point sends carried, from the backend's own send ranges (the tensor it was
    handed), by the collective whose :func:`labelled` range holds them; ``{}`` when nothing went point to point."""
    from minddp.analysis.steps import ELEMENT_SIZE
    from minddp.runtime import compat

    events = compat.profiler_events(prof)
    spans = [
        (e.time_range.start, e.time_range.end, e.name.partition(":")[2])
        for e in events
        if e.name.startswith("minddp.transport:")
    ]
    sent = {}
    for e in events:
        if e.name in SEND_RANGES and e.input_shapes and e.input_shapes[0]:
            kind = next((k for a, b, k in spans if a <= e.time_range.start <= b), "other")
            size = ELEMENT_SIZE.get(str((e.input_dtypes or ["float"])[0]), 4)
            sent[kind] = sent.get(kind, 0) + math.prod(e.input_shapes[0]) * size
    return sent


def buckets_of(model) -> int | None:
    """How many gradient buckets a minddp stage sends a step (per-parameter stages: one per parameter).

    ``None`` for torch's DDP (its C++ reducer does not say; its all_reduce
    calls per synced backward are its buckets) and for no wrapper.
    """
    from minddp.ddp import DistributedDataParallel
    from minddp.stages import SimpleDDP

    if isinstance(model, DistributedDataParallel):
        return len(model.reducer.plan)
    if hasattr(model, "buckets"):
        return len(model.buckets)
    if isinstance(model, SimpleDDP):
        return sum(p.requires_grad for p in model.module.parameters())
    return None


def race(trainees: dict, rounds: int = 4) -> dict[str, list[float]]:
    """Step 2 of the module doc: ``rounds`` rounds, every trainee one step per round, in turn; ms per step."""
    times: dict[str, list[float]] = {name: [] for name in trainees}
    for _ in range(rounds):
        for name, trainee in trainees.items():
            times[name].append(trainee.step())
    return times


def median(values) -> float:
    return statistics.median(values)


# ------------------------------------------------------------------------------------------ sentences
def say(*parts: str) -> None:
    """Print once (rank 0 of a cluster, or the only process): the notebooks' computed prose."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(" ".join(parts))


def mib(n_bytes: float, digits: int = 1) -> str:
    return f"{n_bytes / 2**20:.{digits}f} MiB"


def say_look(looks: dict, stage: str) -> None:
    """What one profiled step of ``stage`` shows over an emulated link, in sentences: its messages, their link time,
    its exposed part and where the rest went, and the step's waited."""
    v = looks[stage]
    say(
        f"{stage}: {v['calls']} all_reduce calls a step, {v['calls_in_backward']} of them started while a "
        f"backward was running; {mib(v['bytes'])} handed to all_reduce."
    )
    if "link_ms" not in v or not v["calls"]:
        return
    if not v["waits"]:  # torch's DDP: its reducer's waits are C++, on a Future of its own chained to the link's
        row = v["row"]
        end = row["backward"][-1][1]
        blank = round(row["optimizer"][0][0] - end)  # from the last backward operator to optimizer.step()
        on_link = round(max(0.0, max(e for _, e in row["messages"]) - end))
        ran = f"the last transfer ended {on_link} ms in" if on_link else "the link was done before them"
        say(
            f"On the emulated link its messages took {v['link_ms']:.0f} ms (modeled). Of the {blank} ms between its "
            f"backward's end and its optimizer step, {ran}: the picture draws every transfer, not torch's reducer's "
            "wait for its buckets there (C++)."
        )
        return
    link, exposed = link_parts(v)
    waited = round(v["waited_ms"])  # whole ms, as the table prints it: the part after delivery is their difference
    rest = link - exposed
    said = f"On the emulated link its messages took {link} ms (modeled), {exposed} ms of them exposed"
    if rest and v["calls_in_backward"] and not v["waits_in_backward"]:  # it waits later: the backward runs between
        said += f"; through the other {rest} ms the thread ran the backward, or the stage's and the loop's lines."
    elif rest and waits_each(v):  # it waits for each message before sending the next
        said += f"; the other {rest} ms ({rest / v['calls']:.2f} ms a message on average) ran before the thread's "
        first = next(s for s, w in looks.items() if w.get("waits") and waits_each(w))  # why: said there only
        said += "wait began" + (
            ": the link starts a message as the comm hook hands it over, the wait starts after the hook returns."
            if first == stage
            else "."
        )
    else:
        said += "."
    said += f" It waited {waited} ms for its messages ({v['waits_in_backward']} of its {v['waits']} waits began"
    said += " inside a backward)"
    after = after_delivery_ms(v)
    if after >= 1:  # measured, its cause not: the link models no more than the transfer
        said += f": the {exposed} exposed and {after} ms after the link had delivered ({after / v['calls']:.2f} ms "
        said += "a message)."
    else:
        said += "."
    say(said)


def waits_each(v: dict) -> bool:
    """Whether a look's link time not exposed all lay before the thread's waits began (it waits for each message
    before sending the next: a wait ends no earlier than the link's delivery)."""
    if not v["calls"] or (v["calls_in_backward"] and not v["waits_in_backward"]):  # it waits later, or sends none
        return False
    return abs(before_waits(v["row"]) - (v["link_ms"] - v["exposed_ms"])) < 1


def before_waits(row: dict) -> float:
    """ms of a step row's link time that lay before the thread began its wait for the message (each message from
    its transfer's start to the first wait that began at or after its hand-over, or to the transfer's end)."""
    starts = sorted(s for s, _ in row.get("waits", []))
    total = 0.0
    for (s, e), sent in zip(sorted(row["messages"]), sorted(row["sent"])):
        later = [w for w in starts if w >= sent]
        total += max(0.0, min(e, later[0] if later else e) - s)
    return total


def link_parts(v: dict) -> tuple[int, int]:
    """A look's link time over an emulated link and its exposed part, in whole ms as printed (so that the printed
    rest, link time the thread did not wait through, is their difference)."""
    return round(v["link_ms"]), round(v["exposed_ms"])


def after_delivery_ms(v: dict) -> int:
    """A look's waiting after the link had delivered: waited less exposed, in whole ms as printed."""
    return round(v["waited_ms"]) - link_parts(v)[1]


def backward_less_check(v: dict) -> float:
    """ms of a look's last backward less the time the parameters-used check held the thread inside it."""
    b0, b1 = v["row"]["backward"][-1]
    return v["last_backward_ms"] - sum(max(0.0, min(e, b1) - max(s, b0)) for s, e in v["check_spans"])


def than(bucketed: float, per_gradient: float) -> str:
    """One step's time (exposed or waited) against another's, in words, at the printed precision (whole ms)."""
    return (
        "as much as"
        if round(bucketed) == round(per_gradient)
        else "more than"
        if bucketed > per_gradient
        else "less than"
    )


def look_table(looks: dict):
    """The profiled steps side by side (one row per stage), every column named with its unit; "–": not known."""
    import pandas as pd

    columns = {
        "all_reduce calls": lambda v: v["calls"],
        "link time, ms (modeled)": lambda v: round(v["link_ms"]),
        "exposed, ms": lambda v: round(v["exposed_ms"]) if v["waits"] else "–",
        "waited, ms": lambda v: round(v["waited_ms"]) if v["waits"] else "–",
        "last backward, ms": lambda v: round(v["last_backward_ms"]),
        "step, ms": lambda v: round(v["row"]["end"]),
    }
    rows = {}
    for name, v in looks.items():
        rows[name] = {}
        for column, value in columns.items():
            try:
                rows[name][column] = (
                    value(v) if v["calls"] or column.startswith(("all_", "step", "last backward")) else "–"
                )
            except KeyError:  # a look without a link
                rows[name][column] = "–"
    return pd.DataFrame.from_dict(rows, orient="index", columns=list(columns), dtype=object)


def picture(looks: dict, stage: str, before: str | None = None, rows: list[str] | None = None, title: str = ""):
    """The step of ``stage`` (and the stage ``before`` it, faded, above it) on one time axis; rank 0 draws.

    ``rows``: several stages, none faded (the comparison at the end of a
    notebook). The figure is :func:`minddp.analysis.timeline.draw_steps`'s.
    """
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    from minddp.analysis.timeline import draw_steps

    names = rows if rows is not None else [n for n in (before, stage) if n is not None]
    drawn = [dict(looks[n]["row"], faded=rows is None and n != stage) for n in names]
    return draw_steps(drawn, title=title or None, width=9 if rows is None else 11)


#: A look's phases (its ``row``'s keys) as notebook 06 names them.
PHASES = {"forward": "forward", "backward": "backward", "optimizer": "update"}


def phases_of(row: dict) -> list[tuple[float, float, str]]:
    """A look's ``row``'s phases in time order, ``(start, end, kind)`` (ms): kind a key of :data:`PHASES`."""
    return sorted((a, b, kind) for kind in PHASES for a, b in row[kind])


def phase_names(phases: list[tuple[float, float, str]]) -> list[str]:
    """The name of each of :func:`phases_of`'s phases, as :func:`handed_in` and :func:`handed_picture` give them:
    ``"forward 1"``, ``"backward 1"``, ... numbered by micro-batch, and ``"update"``."""
    names, seen = [], {}
    for _, _, k in phases:
        seen[k] = seen.get(k, 0) + 1
        names.append(PHASES[k] if k == "optimizer" else f"{PHASES[k]} {seen[k]}")
    return names


def handed_in(look: dict, kind: str) -> list[str]:
    """Notebook 06: the phases of ``look``'s step in which the stage handed its collectives of ``kind`` over
    (``"calls"``: its gradient collectives; ``"gathers"``: its all-gathers of parameters), each named once, in the
    step's order: ``"forward 1"`` (the first micro-batch's forward), ``"backward 3"``, ``"update"`` (the
    optimizer's ``step()``), or ``"between phases"`` for one handed over outside every phase. What
    :func:`handed_picture` draws, in words.

    Example::

        >>> row = {"forward": [(0, 1), (3, 4)], "backward": [(1, 2), (4, 5)], "optimizer": [(6, 7)]}
        >>> handed_in({"row": row, "handed": {"calls": [4.5, 4.9], "gathers": [0.5, 6.5]}}, "calls")
        ['backward 2']
        >>> handed_in({"row": row, "handed": {"calls": [4.5, 4.9], "gathers": [0.5, 6.5]}}, "gathers")
        ['forward 1', 'update']
    """
    phases = phases_of(look["row"])
    names = phase_names(phases)
    found: list[str] = []
    for t in look["handed"][kind]:
        inside = next((i for i, (a, b, _) in enumerate(phases) if a <= t <= b), None)
        name = names[inside] if inside is not None else "between phases"
        if name not in found:
            found.append(name)
    return found


def added(values: torch.Tensor, change: float, dtype: torch.dtype) -> torch.Tensor:
    """Notebook 06: how much each of ``values`` changes when ``change`` is added to it and both are held in
    ``dtype``: ``(v + change) − v``, computed in ``dtype``, as float32; 0 where the change is lost to rounding.

    Example::

        >>> added(torch.tensor([1.0, 0.01]), 0.001, torch.bfloat16) == 0  # bf16 around 1.0: 1 - 2^-8 and 1 + 2^-7
        tensor([ True, False])
    """
    held = values.to(dtype)
    return (held + change).float() - held.float()


def handed_picture(looks: dict, rows: list[str], title: str):
    """Notebook 06: the phases of each stage's looked-at step in their order, and a mark for each collective the stage
    handed over (the look's ``handed``), in the phase it was handed over in: a gradient collective (a black tick: an
    all_reduce, or on gloo the all_reduce that runs for a reduce-scatter) or an all-gather of parameters (a brown
    one). Each phase is named in its bar, as :func:`handed_in` names it.

    Order only, no lengths: each phase (forward, backward, update) is drawn one unit wide, whatever its time, and
    each kind's marks in a phase are spread evenly across it, on a line of their own (black above brown), in the order
    they were handed over, so that each kind can be counted; the order between the two kinds is not drawn. A mark
    between two phases gets a narrower slot of its own there. Rank 0 draws."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    import matplotlib.pyplot as plt

    from minddp.analysis.timeline import COLORS, legend_above

    drawn = {kind: PHASES[kind] + (" (optimizer.step())" if kind == "optimizer" else "") for kind in PHASES}
    marks = {
        "calls": ("gradient collective handed over", "black"),
        "gathers": ("all-gather of parameters handed over", "#a0522d"),
    }
    fig, ax = plt.subplots(figsize=(11, 0.8 + 0.62 * len(rows)))
    right = 0.0
    for y, name in enumerate(rows):
        row = looks[name]["row"]
        phases = phases_of(row)
        names = phase_names(phases)
        handed = sorted((t, kind) for kind in marks for t in looks[name]["handed"][kind])

        def slot(t, phases=phases):
            """2i + 1: inside phase i; 2i: before phase i (after phase i - 1)."""
            inside = next((i for i, (a, b, _) in enumerate(phases) if a <= t <= b), None)
            return 2 * inside + 1 if inside is not None else 2 * sum(b < t for _, b, _ in phases)

        in_slot: dict[int, list[str]] = {}
        for t, kind in handed:
            in_slot.setdefault(slot(t), []).append(kind)
        x = 0.0
        for k in range(2 * len(phases) + 1):
            width = 1.0 if k % 2 else (0.4 if k in in_slot else 0.0)
            if k % 2:
                kind = phases[k // 2][2]
                ax.broken_barh(
                    [(x, width)],
                    (y - 0.40, 0.40),
                    facecolors=COLORS[kind],
                    edgecolor="white",
                    linewidth=1.0,
                    label=drawn[kind],
                )
                ax.text(x + width / 2, y - 0.20, names[k // 2], ha="center", va="center", fontsize=6.5)
            for i, kind in enumerate(in_slot.get(k, [])):
                label, color = marks[kind]
                j, count = in_slot[k][:i].count(kind), in_slot[k].count(kind)  # spread within its own kind
                at = x + width * (j + 0.5) / count
                ax.plot(
                    [at],
                    [y + (0.12 if kind == "calls" else 0.30)],
                    "|",
                    color=color,
                    markersize=7,
                    mew=1.3,
                    linestyle="none",
                    label=label,
                )
            x += width
        right = max(right, x)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top
    ax.set_xlim(-0.2, right + 0.2)  # no mark on the spine
    ax.set_xticks([])
    ax.set_xlabel(
        "the step's phases in their order, each drawn the same width (no lengths); "
        "each kind's marks in a phase spread evenly across it, in the order handed over",
        fontsize=8,
    )
    handles, labels = ax.get_legend_handles_labels()
    found = dict(zip(labels, handles))  # one entry per kind, not per row
    order = [*drawn.values(), *(label for label, _ in marks.values())]
    unique = {label: found[label] for label in order if label in found}
    columns = min(len(unique), 5)
    legend_above(ax, unique, columns)
    ax.set_title(title, fontsize=9, pad=10 + 14 * -(-len(unique) // columns))
    fig.tight_layout()
    return fig


def listed(names: list[str]) -> str:
    """Names as a sentence lists them.

    >>> listed(["a"]), listed(["a", "b"]), listed(["a", "b", "c"])
    ('a', 'a and b', 'a, b and c')
    """
    return " and ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def claim(holds: bool, text: str) -> None:
    """A sentence the notebook asserts about the run it shows: printed with a tick if it holds, else the cell fails.

    So a refresh whose outputs no longer bear a sentence out stops there,
    instead of saving prose that contradicts the numbers beside it.
    """
    if not holds:
        raise AssertionError(f"this notebook's claim no longer holds for the run shown: {text}")
    say(f"✓ {text}")


def trace_dir(name: str) -> Path:
    """Where the notebook ``name`` writes its traces."""
    return TRACE_ROOT / name


def parameter_checks(run: Path, stage: str):
    """Rank 0's profiled step of ``stage`` in the run folder ``run``: its intervals (``cpu.rank_intervals``), the
    step's start and its parameter checks' all_gather ranges (µs, on the trace's clock)."""
    from minddp.analysis.cpu import rank_intervals
    from minddp.analysis.events import load_stage
    from minddp.analysis.steps import end_of

    iv = rank_intervals(load_stage(Path(run) / stage).ranks[0])
    _, s0, s1 = iv.steps[-1]
    return iv, s0, [(e["ts"], end_of(e)) for e in iv.allgathers if s0 <= e["ts"] <= s1]
