"""zero2's reduce-scatters and FSDP's prefetched all-gathers are in flight while the rank computes: by event order.

A profiled run on 2 ranks, its collectives carried by a test link
(:class:`HeldUntilWaited`) on which a message is in flight from the moment
the stage hands it over until the stage first waits for it: both moments are
marker ranges on the training thread (``minddp.link_send#n``,
``minddp.link_wait#n``), recorded in program order on the clock of the compute
ops around them. So what the tests read is what the code guarantees, whatever
the machine's speed or the OS's scheduling:

* zero2: a bucket's reduce-scatter is handed over while backward still has
  layers to compute, and waited for only after them (a stage that waited at
  once, in the hook, would have no compute in between);
* FSDP: the next unit's all-gather is handed over before the current unit
  multiplies anything (a prefetch) and waited for only after it has (in the
  forward, and in the backward for the unit before); without prefetching the
  hand-over and the wait would be back to back;
* the analysis (``python -m minddp.analyze``) counts the gathers and, since
  the link's transfers span those windows, sees compute under communication.

Whether the bytes also move on the wire during that window is up to the OS
(gloo's threads and the ranks share the cores): the benchmark measures that
overlap (``python -m minddp.bench --stages sharded``: overlap % per
configuration) on a quiet machine.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import toy_models

from minddp import launch
from minddp.analysis import analyze_run
from minddp.analysis.cpu import bucket_timeline, rank_intervals
from minddp.analysis.events import read_trace
from minddp.comm.link import Link, LinkSpec
from minddp.ladder import make_optimizer, wrap
from minddp.ladder.loop import train_step
from minddp.runtime.profiling import StepProfiler, trace_path, write_json

STEPS = 3
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")


class HeldUntilWaited(Link):
    """A link whose every message is in flight from its hand-over to the stage's first ``wait()`` on it.

    No thread and no modeled delay: the real collective is waited for when the
    stage waits, and the transfer written into the trace (``annotate_trace``)
    spans hand-over to that wait. "In flight" is then an order of events on
    the training thread, not a race with gloo's threads. (A message nobody
    waits for directly would never complete: zero2 and FSDP wait for each.)
    """

    def __init__(self):
        super().__init__(LinkSpec("held-until-waited", bandwidth=float("inf"), latency=0.0))

    def carry(self, real, payload, world, kind="all_reduce"):
        nbytes = payload if isinstance(payload, int) else payload.numel() * payload.element_size()
        seq, link = next(self._seq), self
        handed_over = time.perf_counter()
        with torch.profiler.record_function(f"minddp.link_send#{seq}"):
            pass

        class Held(torch.futures.Future):
            def wait(self):
                if not self.done():
                    waited = time.perf_counter()
                    with torch.profiler.record_function(f"minddp.link_wait#{seq}"):
                        pass
                    value = real.wait()
                    link.log.append(
                        {
                            "seq": seq,
                            "kind": kind,
                            "bytes": nbytes,
                            "ranks": world,
                            "handed_over": handed_over,
                            "start": handed_over,
                            "modeled_end": waited,
                            "delivered": time.perf_counter(),
                        }
                    )
                    self.set_result(value)
                return super().wait()

        return Held()


def profiled(stage: str, folder: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = toy_models.build("llama", 7)
    link = HeldUntilWaited()
    wrapped = wrap(stage, model, bucket_cap_mb=0.001, link=link)
    optimizer = make_optimizer(stage, model, torch.optim.AdamW, lr=1e-3)
    with StepProfiler(os.path.join(folder, stage), rank, STEPS, active=STEPS - 1) as prof:
        for batch in toy_models.global_batches("llama", STEPS, 64 * world):
            train_step(wrapped, optimizer, [toy_models.shard(batch, rank, world)], toy_models.loss_fn)
            prof.step()
    link.annotate_trace(prof.path)
    if rank == 0:
        write_json(
            os.path.join(folder, stage, "config.json"), {"run_name": "overlap", "stage": stage, "world_size": world}
        )


def run_both(folder: str) -> None:
    for stage in ("zero2", "fsdp"):
        profiled(stage, folder)


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("overlap"))
    launch(run_both, folder, world_size=2, timeout_s=180)
    return folder


def last_step(folder: str, stage: str):
    """The last profiled step on rank 0: its events in order, its bucket rows, and each message's hand-over
    and first wait (µs from the step's start), by the sequence number of the link's markers."""
    trace = read_trace(trace_path(os.path.join(folder, stage), 0), 0)
    iv = rank_intervals(trace)
    _, s0, s1 = iv.steps[-1]
    mine = [e for e in trace.events if s0 <= e["ts"] < s1 and e.get("tid") not in iv.comm_threads]

    def markers(prefix: str) -> dict[int, float]:
        return {int(e["name"].rpartition("#")[2]): e["ts"] - s0 for e in mine if e["name"].startswith(prefix)}

    return trace, bucket_timeline(trace), markers("minddp.link_send#"), markers("minddp.link_wait#"), s0, mine


def seq_of(row: dict, sent: dict[int, float]) -> int:
    """The link message a bucket row handed over: the send marker inside its launch range."""
    (seq,) = [n for n, t in sent.items() if row["ready_us"] <= t <= row["launched_us"]]
    return seq


def test_zero2_reduce_scatters_are_in_flight_while_backward_computes(traces):
    _, rows, sent, waited, s0, events = last_step(traces, "zero2")
    backward_nodes = sorted(e["ts"] - s0 for e in events if e["name"].startswith("autograd::engine::evaluate_function"))
    scatters = [r for r in rows if r["hook"] == "reduce_scatter_hook"]
    assert len(scatters) > 1, rows
    in_flight = [
        r for r in scatters if [t for t in backward_nodes if sent[seq_of(r, sent)] < t < waited[seq_of(r, sent)]]
    ]
    # all but the last bucket leave while backward still has nodes to run, and none is waited for before them
    assert len(in_flight) >= len(scatters) - 1, (scatters, sent, waited)


def test_fsdp_prefetches_the_next_units_all_gather_before_computing(traces):
    trace, rows, sent, waited, s0, events = last_step(traces, "fsdp")
    gathers = sorted((r for r in rows if r["hook"] == "all_gather"), key=lambda r: r["order"])
    # forward: unit 0, then unit 1 prefetched; backward: unit 1 is still gathered (the backward starts with
    # the forward's last unit), and unit 0 is prefetched as soon as unit 1's backward begins
    assert [r["bucket"] for r in gathers] == [0, 1, 0], gathers
    matmuls = sorted(e["ts"] - s0 for e in events if e["name"] in MATMULS)
    # The prefetch of unit 1 is handed over before unit 0 multiplies anything (no matmul between unit 0's
    # gather and it); without prefetching, all of unit 0's forward would lie between them.
    assert not [t for t in matmuls if gathers[0]["launched_us"] < t < gathers[1]["ready_us"]]
    # Each prefetched gather is in flight (handed over, not yet waited for) while a unit computes: unit 0's
    # forward for the first, unit 1's backward for the second. A stage that waited at once would have no
    # matmul between its hand-over and its wait.
    for prefetched in gathers[1:]:
        seq = seq_of(prefetched, sent)
        assert [t for t in matmuls if sent[seq] < t < waited[seq]], (prefetched, sent[seq], waited[seq], matmuls)


def test_the_analysis_counts_all_gathers_and_sees_the_overlap(traces):
    result = analyze_run(traces)
    stages = result.stages
    assert stages.loc["fsdp", "allgather_calls_per_step"] >= 3  # 2 units forward, the first again backward
    assert stages.loc["zero2", "allgather_calls_per_step"] >= 1  # the parameters, before the forward
    # the link's transfers span hand-over to wait, which the tests above show to hold compute
    assert stages.loc["zero2", "comm_comp_overlap_pctg"] > 0 and stages.loc["fsdp", "comm_comp_overlap_pctg"] > 0
