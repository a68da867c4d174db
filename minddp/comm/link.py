"""An emulated network link: every gradient collective takes at least as long as it would on a real one.

On one machine two ranks talk over loopback, where communication is nearly free and the ladder's
lessons (why buckets, why overlap) barely show. A :class:`Link` puts a network of a given speed
under the comm layer, so that a laptop shows what a 1 Gbit/s cluster, or four PCIe GPUs, would do.

1. **the cost model** (:meth:`LinkSpec.seconds`): a link is ``B``, each port's bandwidth per
   direction (bytes/s; ``β = 1/B``, the time per byte), and ``α``, the fixed cost of one hop of a ring;
   collectives are rings (an all_reduce of ``m`` bytes over ``n`` ranks makes ``2(n−1)`` hops and takes
   ``2(n−1)·α + 2(n−1)/n · m·β``);
2. **the emulation** (:meth:`Link.carry`): the real collective still runs, so every result is exact;
   the link's own thread (one NIC per rank) carries the messages one at a time and completes each
   Future no earlier than its modeled transfer has ended;
3. **in a trace** (:meth:`Link.annotate_trace`): the transfers as ``minddp.link:<collective>``
   ranges, and when the training thread first asked for each (:attr:`Link.asked`): a ``wait()`` on
   the Future :meth:`Link.carry` returned, or on the Future a comm hook returned for a bucket whose
   messages it handed over (:func:`handed_over`, :func:`waited_through`: a hook that chains
   ``.then`` or collects several Futures hands back one the link never sees).

What the model leaves out, what the emulation guarantees, the presets: ``docs/scaling.md`` §1.

Example (1 MB over 1 Gbit/s, 4 ranks: 2·3/4 · 1 MB / 125 MB/s + 6 hops · 50 µs)::

    >>> round(Link("1gbit").seconds("all_reduce", 1e6, world=4), 6)
    0.0123
    >>> import torch.distributed as dist
    >>> t = torch.ones(4)
    >>> Link("1gbit").carry(dist.all_reduce(t, async_op=True).get_future(), t, world=1).wait()
    [tensor([1., 1., 1., 1.])]
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import math
import os
import queue
import re
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from minddp.runtime import compat

#: Bytes per second of one Gbit/s.
GBIT = 1e9 / 8
#: The collectives the model knows: kind -> (hops in units of N-1, payload crossings in units of (N-1)/N).
COLLECTIVES = {"all_reduce": (2, 2), "reduce_scatter": (1, 1), "all_gather": (1, 1), "broadcast": (1, None)}


@dataclass(frozen=True)
class LinkSpec:
    """A network by its two numbers: ``bandwidth`` B (bytes/s per rank and direction; β = 1/B s per byte),
    ``latency`` α (s per hop of a ring; an all_reduce makes 2(n−1) of them)."""

    name: str
    bandwidth: float
    latency: float
    about: str = ""

    def seconds(self, kind: str, nbytes: float, world: int) -> float:
        """Modeled time of one ``kind`` collective of ``nbytes`` payload bytes over ``world`` ranks (table above)."""
        if kind not in COLLECTIVES:
            raise ValueError(f"the link models {', '.join(COLLECTIVES)}; got {kind!r}")
        if world <= 1:
            return 0.0
        hops, crossings = COLLECTIVES[kind]
        share = 1.0 if crossings is None else crossings * (world - 1) / world
        return hops * (world - 1) * self.latency + share * nbytes / self.bandwidth

    def describe(self) -> str:
        speed = (
            "unlimited"
            if math.isinf(self.bandwidth)
            else f"{self.bandwidth / GBIT:g} Gbit/s ({self.bandwidth / 1e9:g} GB/s)"
        )
        return f"{self.name}: {speed}, {self.latency * 1e6:g} µs per hop" + (f" ({self.about})" if self.about else "")


#: Named links. The numbers are nominal (what the hardware is sold as, with a typical per-hop cost), not
#: measured: docs/scaling.md says where each comes from and how far real libraries get from it.
PRESETS: dict[str, LinkSpec] = {
    "100mbit": LinkSpec("100mbit", 0.1 * GBIT, 100e-6, "Fast Ethernet between machines, TCP"),
    "1gbit": LinkSpec("1gbit", 1 * GBIT, 50e-6, "Gigabit Ethernet between machines, TCP"),
    "10gbit": LinkSpec("10gbit", 10 * GBIT, 20e-6, "10 Gbit Ethernet, TCP"),
    "100gbit-ib": LinkSpec("100gbit-ib", 100 * GBIT, 5e-6, "100 Gbit/s InfiniBand (EDR), RDMA"),
    "pcie-t4": LinkSpec("pcie-t4", 7e9, 10e-6, "T4 GPUs in one machine over PCIe 3.0 x16, no NVLink"),
    "nvlink": LinkSpec("nvlink", 200e9, 5e-6, "A100-class NVLink through NVSwitch"),
    # The links DiLoCo is for. wan: two cloud regions a continent apart; one TCP flow between instances outside a
    # placement group gets 5 Gbit/s (AWS EC2 User Guide, "Amazon EC2 instance network bandwidth"), and
    # us-east-1 <-> us-west-2 measures about 55-90 ms round trip (cloudping.co's published region matrix), so
    # ~35 ms one way, per hop. home: a home broadband line, whose upload is what a ring is limited by; the US
    # median fixed line measured 22.6 Mbit/s up and 14 ms to the nearest test server at the end of 2022 (Ookla
    # Speedtest Global Index), so two homes apart are ~20 ms one way.
    "wan": LinkSpec("wan", 5 * GBIT, 35e-3, "a WAN between datacenters: two cloud regions a continent apart"),
    "home": LinkSpec("home", 0.02 * GBIT, 20e-3, "a home broadband line (its upload: 20 Mbit/s)"),
    "loopback": LinkSpec(
        "loopback",
        math.inf,
        0.0,
        "no emulated delay: the real collective's time only; records the link's ranges, for profiling",
    ),
}

_BANDWIDTH_UNITS = {
    "gbit": GBIT,
    "gbps": GBIT,
    "mbit": GBIT / 1e3,
    "mbps": GBIT / 1e3,
    "kbit": GBIT / 1e6,
    "gb/s": 1e9,
    "mb/s": 1e6,
    "kb/s": 1e3,
    "gib/s": 2.0**30,
    "mib/s": 2.0**20,
}
_LATENCY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-zµ/]+)\s*$", re.IGNORECASE)


def _quantity(text: str, units: dict, what: str, example: str) -> float:
    m = _QUANTITY.match(text)
    unit = m.group(2).lower() if m else None
    if unit not in units:
        raise ValueError(f"link {what} {text.strip()!r} needs a number and a unit ({', '.join(units)}), e.g. {example}")
    return float(m.group(1)) * units[unit]


def parse_link(text: str | LinkSpec) -> LinkSpec:
    """A preset name (:data:`PRESETS`) or ``bandwidth,latency`` with units, e.g. ``2.5gbit,40us``, ``800MB/s,0.1ms``."""
    if isinstance(text, LinkSpec):
        return text
    name = text.strip()
    if name.lower() in PRESETS:
        return PRESETS[name.lower()]
    if "," not in name:
        raise ValueError(
            f"unknown link {name!r}: use a preset ({', '.join(PRESETS)}) or 'bandwidth,latency' such as 2.5gbit,40us"
        )
    bandwidth_text, latency_text = name.split(",", 1)
    bandwidth = _quantity(bandwidth_text, _BANDWIDTH_UNITS, "bandwidth", "2.5gbit or 800MB/s")
    latency = _quantity(latency_text, _LATENCY_UNITS, "latency", "40us or 0.1ms")
    if bandwidth <= 0 or latency < 0:
        raise ValueError(f"link {name!r}: bandwidth must be positive and latency not negative")
    return LinkSpec(name, bandwidth, latency, "custom")


def parse_links(text: str) -> list[LinkSpec]:
    """A comma list of links, where a custom link keeps its own comma: ``1gbit,100mbit,2ms`` is ``1gbit`` and
    ``100mbit,2ms`` (a token that is a latency belongs to the link before it)."""
    parts, out, i = [p.strip() for p in text.split(",") if p.strip()], [], 0
    while i < len(parts):
        latency_next = i + 1 < len(parts) and _is_latency(parts[i + 1])
        out.append(parse_link(f"{parts[i]},{parts[i + 1]}" if latency_next else parts[i]))
        i += 2 if latency_next else 1
    return out


def _is_latency(text: str) -> bool:
    m = _QUANTITY.match(text)
    return bool(m) and m.group(2).lower() in _LATENCY_UNITS


@dataclass
class _Message:
    seq: int
    kind: str
    nbytes: int
    world: int
    handed_over: float  # perf_counter() when the hook handed it to the link
    real: torch.futures.Future  # the real collective
    done: torch.futures.Future  # what the caller waits on
    logged: bool  # a profiler was running: log it for annotate_trace


class _Delivery(torch.futures.Future):
    """A Future whose ``wait()`` is the first wait for each of its messages (``(asked, seq)`` pairs: a link's
    :attr:`Link.asked` and the message's number), noted there: what :meth:`Link.carry` hands back while a
    profiler runs, and :func:`waited_through`'s."""

    def __init__(self, messages: list[tuple[dict, int]], device: torch.device | None = None):
        super().__init__(devices=_devices(device))
        self._messages = messages

    def wait(self):
        now = time.perf_counter()
        for asked, seq in self._messages:
            if seq not in asked:  # the first time the caller needed it: on both clocks
                asked[seq] = now
                with torch.profiler.record_function(f"minddp.link_wait#{seq}"):
                    pass
        return super().wait()


def _devices(device: torch.device | None) -> list[torch.device] | None:
    """What a Future completed on another thread must be told of a GPU value: its device. Completing it
    then records an event on that thread's stream, and a ``wait()`` or callback waits for that event;
    a Future told of no device hands CUDA tensors on unordered with the copies that wrote them."""
    return [device] if device is not None and device.type != "cpu" else None


_handing = threading.local()


@contextmanager
def handed_over():
    """The messages :meth:`Link.carry` logs on this thread inside the block, as ``(asked, seq)`` pairs (for
    :func:`waited_through`); nested blocks' messages are their outer block's too."""
    outer = getattr(_handing, "messages", None)
    _handing.messages = []
    try:
        yield _handing.messages
    finally:
        inner, _handing.messages = _handing.messages, outer
        if outer is not None:
            outer.extend(inner)


def waits_seen(hook):
    """``hook``, whose Future's first ``wait()`` is noted as the first wait for every message it handed over
    (:func:`handed_over`, :func:`waited_through`): what the ladder registers on a teaching stage (send.py stays
    plain, off this module)."""

    def seen(state, bucket):
        with handed_over() as messages:
            future = hook(state, bucket)
        return waited_through(future, messages, bucket.buffer().device)

    seen.__name__ = getattr(hook, "__name__", type(hook).__name__)  # the user's hook's name, in a trace and an error
    return seen


def waited_through(
    future: torch.futures.Future, messages: list, device: torch.device | None = None
) -> torch.futures.Future:
    """``future`` (a comm hook's, for a bucket whose ``messages`` it handed over: :func:`handed_over`), whose first
    ``wait()`` is noted as the first wait for each of them; ``future`` itself when there are none. ``device``:
    where the bucket lives."""
    if not messages:
        return future
    out = _Delivery(list(messages), device)

    def settle(done: torch.futures.Future) -> None:
        try:
            out.set_result(done.value())
        except Exception as exc:  # the hook's Future failed: so does this one
            out.set_exception(exc)

    future.add_done_callback(settle)
    return out


class Link:
    """One rank's emulated NIC (module doc): :meth:`carry` delays a collective's completion to the modeled time."""

    def __init__(self, spec: LinkSpec | str):
        self.spec = parse_link(spec)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._thread_id = 0
        self._start_lock = threading.Lock()
        self._free_at = 0.0  # perf_counter() at which the last modeled transfer ends
        self._seq = itertools.count()
        self.log: list[dict] = []  # transfers carried while a profiler ran (annotate_trace)
        self.asked: dict[int, float] = {}  # seq -> perf_counter() of its first wait(): a wait's start (logged messages)

    def seconds(self, kind: str, nbytes: float, world: int) -> float:
        return self.spec.seconds(kind, nbytes, world)

    def carry(
        self, real: torch.futures.Future, payload: torch.Tensor | int, world: int, kind: str = "all_reduce"
    ) -> torch.futures.Future:
        """Steps 1-3: a Future with ``real``'s value, completed no earlier than the modeled transfer's end.

        ``payload`` is the collective's tensor (its bytes are counted) or a byte
        count; ``world`` the ranks taking part. ``real`` may also be a
        collective's ``Work`` (anything whose ``wait()`` returns when it is done):
        gloo gives some collectives no Future.
        """
        nbytes = payload if isinstance(payload, int) else payload.numel() * payload.element_size()
        seq = next(self._seq)
        logged = compat.profiler_on()
        handed_over = time.perf_counter()
        if logged:  # the marker that places this message on the trace's clock (annotate_trace)
            with torch.profiler.record_function(f"minddp.link_send#{seq}"):
                pass
        device = None if isinstance(payload, int) else payload.device
        done = _Delivery([(self.asked, seq)], device) if logged else torch.futures.Future(devices=_devices(device))
        if logged and getattr(_handing, "messages", None) is not None:
            _handing.messages.append((self.asked, seq))
        self._start_thread()
        self._inbox.put(_Message(seq, kind, nbytes, world, handed_over, real, done, logged))
        return done

    # -- the NIC's thread (step 2) --------------------------------------------------------------------

    def _start_thread(self) -> None:
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                # The link thread must get the GIL back soon after its sleep ends; Python's default
                # switch interval (5 ms) would let a busy training thread hold it that long.
                sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
                thread = threading.Thread(target=self._run, name=f"minddp-link-{self.spec.name}", daemon=True)
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        self._thread_id = threading.get_native_id()
        while True:
            msg = self._inbox.get()
            if msg is None:
                return
            start = max(msg.handed_over, self._free_at)
            end = start + self.spec.seconds(msg.kind, msg.nbytes, msg.world)
            self._free_at = end
            delay = end - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                value = msg.real.wait()  # step 3
            except Exception as exc:  # the real collective failed: so does the emulated one
                msg.done.set_exception(exc)
                continue
            if msg.logged:
                self.log.append(
                    {
                        "seq": msg.seq,
                        "kind": msg.kind,
                        "bytes": msg.nbytes,
                        "ranks": msg.world,
                        "handed_over": msg.handed_over,
                        "start": start,
                        "modeled_end": end,
                        "delivered": time.perf_counter(),
                    }
                )
            msg.done.set_result(value)

    def close(self) -> None:
        """Stop the link's thread once the messages already handed over are delivered."""
        if self._thread is not None:
            self._inbox.put(None)
            self._thread.join()
            self._thread = None

    # -- traces ---------------------------------------------------------------------------------------

    def annotate_trace(self, path: str) -> int:
        """Write the logged transfers into the exported trace at ``path``; returns how many were placed.

        Each ``minddp.link_send#<n>`` marker in the trace was recorded just after
        message ``n``'s hand-over time (``perf_counter``, in the log) was read, never
        before: each marker minus hand-over is the offset between the two clocks at
        that moment plus a delay >= 0 (long when the thread was preempted in between).
        The offset is not one number: torch maps the CPU's counter onto wall time at a
        rate a few parts per million off ``perf_counter``'s, tens of microseconds over a
        run, enough to put a hand-over just inside a step before the step's start. So
        each message is placed by the lower envelope of those differences at its own
        hand-over (:func:`lower_envelope`): never after its marker, and, the two clocks
        being linear in each other, never before its true hand-over. The first and last
        messages, where a convex hull can only pass through their own (possibly late)
        markers, borrow their neighbours' offsets, no further off than the clocks'
        rates can drift apart (:data:`CLOCK_RATE_BOUND`). Transfers whose marker is not
        in the trace (outside the profiled window) are dropped from the log.
        """
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            trace = json.load(f)
        events = trace.get("traceEvents", [])
        markers = {}
        for e in events:
            if e.get("ph") == "X" and e.get("name", "").startswith("minddp.link_send#"):
                markers[int(e["name"].rpartition("#")[2])] = e
        logged, self.log = self.log, []
        asked, self.asked = self.asked, {}
        placed = [m for m in logged if m["seq"] in markers]
        if not placed:
            return 0
        offsets = lower_envelope(  # both in microseconds: the rate bound is a pure number
            [(m["handed_over"] * 1e6, markers[m["seq"]]["ts"] - m["handed_over"] * 1e6) for m in placed]
        )
        pid = markers[placed[0]["seq"]]["pid"]
        tid = self._thread_id or 1
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": tid,
                "args": {"name": f"minddp link ({self.spec.name}, emulated NIC)"},
            }
        )
        for m, offset in zip(placed, offsets):
            start_us = m["start"] * 1e6 + offset
            events.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"minddp.link:{m['kind']}",
                    "pid": pid,
                    "tid": tid,
                    "ts": start_us,
                    "dur": max(0.0, (m["delivered"] - m["start"]) * 1e6),
                    "args": {
                        "seq": m["seq"],
                        "bytes": m["bytes"],
                        "ranks": m["ranks"],
                        "link": self.spec.name,
                        "handed_over_ts": m["handed_over"] * 1e6 + offset,
                        "modeled_end_ts": m["modeled_end"] * 1e6 + offset,
                        **({"waited_ts": asked[m["seq"]] * 1e6 + offset} if m["seq"] in asked else {}),
                    },
                }
            )
        tmp = path + ".tmp"
        with opener(tmp, "wt", encoding="utf-8") as f:
            f.write(json.dumps(trace))  # (json.dump streams through the pure-Python encoder: several times slower)
        os.replace(tmp, path)
        return len(placed)

    def __repr__(self) -> str:
        return f"Link({self.spec.describe()})"


#: How fast the trace's clock and perf_counter() may drift apart, in seconds per second. Both count the
#: same machine's oscillator and torch maps it onto wall time with a rate measured at start: here they ran
#: about 2e-6 apart (a profile of 300 markers over 15 s); 1e-3 is 500 times that.
CLOCK_RATE_BOUND = 1e-3


def lower_envelope(points: list[tuple[float, float]], rate: float = CLOCK_RATE_BOUND) -> list[float]:
    """For each point ``(t, d)``, the lower of two bounds at its ``t``: the lower convex hull of all the points,
    and the lowest ``d_j + rate·|t − t_j|`` over them (``t`` and ``d`` in one unit).

    Never above the point's own ``d``; and when every ``d`` is a line in ``t`` whose
    slope is at most ``rate`` plus something ``>= 0``, never below that line (a hull
    of points above a line lies above it, and so does each cone of that slope). The
    hull alone passes through the first and last points, so a late ``d`` there would
    stand; the cones bring it within ``rate`` times the distance to a better point.
    :meth:`Link.annotate_trace`'s clock offsets: ``t`` a hand-over, ``d`` its marker
    minus it.

    >>> lower_envelope([(0, 5.0), (1, 9.0), (2, 7.0)], rate=10)    # steep cones: the hull
    [5.0, 6.0, 7.0]
    >>> lower_envelope([(0, 5.0), (1, 9.0), (2, 7.0)], rate=0.5)   # the last point: 5.0 + 0.5·2
    [5.0, 5.5, 6.0]
    """
    hull: list[tuple[float, float]] = []  # the lower hull, left to right (Andrew's monotone chain)
    for p in sorted(set(points)):
        if hull and hull[-1][0] == p[0]:
            continue  # same t: sorted, so the lower d is already on the hull
        while len(hull) >= 2 and _turn(hull[-2], hull[-1], p) <= 0:
            hull.pop()
        hull.append(p)
    cone = _cones(sorted(points), rate)
    starts, out = [h[0] for h in hull], []
    for t, _ in points:
        i = max(0, min(bisect.bisect_right(starts, t) - 1, len(hull) - 2))  # the hull's segment holding t
        (t0, d0), (t1, d1) = hull[i], hull[min(i + 1, len(hull) - 1)]
        on_hull = d0 if t1 == t0 else d0 + (d1 - d0) * (t - t0) / (t1 - t0)
        out.append(min(on_hull, cone(t)))
    return out


def _cones(points: list[tuple[float, float]], rate: float):
    """``t -> min over the points of d + rate·|t − t_j|`` (the points sorted by ``t``)."""
    starts = [t for t, _ in points]
    left, low = [], float("inf")  # left[i]: min over j <= i of d_j - rate·t_j
    for t, d in points:
        low = min(low, d - rate * t)
        left.append(low)
    right, low = [0.0] * len(points), float("inf")  # right[i]: min over j >= i of d_j + rate·t_j
    for i in range(len(points) - 1, -1, -1):
        low = min(low, points[i][1] + rate * points[i][0])
        right[i] = low

    def at(t: float) -> float:
        i = bisect.bisect_right(starts, t)  # points[:i] lie at or before t
        below = left[i - 1] + rate * t if i else float("inf")
        above = right[i] - rate * t if i < len(points) else float("inf")
        return min(below, above)

    return at


def _turn(a, b, c) -> float:
    """> 0 when a, b, c turn left (counter-clockwise)."""
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def as_link(value: Link | LinkSpec | str | None) -> Link | None:
    """``None`` stays ``None``; a preset name, spec text or :class:`LinkSpec` becomes a :class:`Link`."""
    if value is None or isinstance(value, Link):
        return value
    return Link(value)


__all__ = ["GBIT", "PRESETS", "COLLECTIVES", "LinkSpec", "Link", "parse_link", "parse_links", "as_link"]
