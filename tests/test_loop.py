"""The one training loop drives every stage as a user's script would, so each idea lives in its stage.

``train_step`` calls ``finish_gradient_synchronization()`` after *every* backward (where the method
exists) and runs the non-last micro-batches inside ``no_sync()`` (where that exists): whether a
backward syncs is then the stage's decision alone. The oracles:

* the order of the calls, recorded by a wrapper that only notes them (one process, no ranks);
* for every stage and rung (and every model answer of the exercises) on 2 ranks: the collectives
  (any dtype: the stages' own checks too) and the waits seen inside each finish that follows a
  ``no_sync()`` backward, none allowed, and the accumulated gradients, unchanged by it; the
  parameters, bit for bit those of the schedule the loop had before (finish after the last backward
  only), so calling finish inside an accumulation step changes nothing;
* ``ga``'s all_reduces are ``simple``'s divided by ``k`` because of ``ga``'s ``no_sync()``: the same
  class with a ``no_sync()`` that does nothing sends as many as ``simple``.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import toy_models
from torch.utils._python_dispatch import TorchDispatchMode

from minddp import launch
from minddp.exercises import solutions
from minddp.exercises.harness import accepted_options
from minddp.ladder import STAGES, make_optimizer, wrap
from minddp.ladder.loop import train_step
from minddp.stages import GradAccumDDP

K = 3  # micro-batches per step
STEPS = 2


class Recorded(torch.nn.Module):
    """A wrapper that only notes what the loop calls on it, in order."""

    def __init__(self, module, with_no_sync=True, log=None):
        super().__init__()
        self.module, self.log = module, log if log is not None else []
        if with_no_sync:
            self.no_sync = self._no_sync

    def forward(self, x):
        self.log.append("forward")
        out = self.module(x)
        out.register_hook(lambda g: self.log.append("backward"))
        return out

    @contextlib.contextmanager
    def _no_sync(self):
        self.log.append("no_sync:enter")
        yield
        self.log.append("no_sync:exit")

    def finish_gradient_synchronization(self):
        self.log.append("finish")


def test_the_loop_calls_finish_after_every_backward():
    for with_no_sync in (True, False):
        model = Recorded(torch.nn.Linear(2, 1), with_no_sync)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train_step(model, optimizer, [torch.ones(1, 2)] * K, lambda m, x: m(x).sum())
        quiet = ["no_sync:enter", "forward", "backward", "no_sync:exit", "finish"]
        last = ["forward", "backward", "finish"]
        expected = quiet * (K - 1) + last if with_no_sync else last * K
        assert model.log == expected, model.log


def test_the_loop_reads_the_loss_off_its_device_once_a_step(monkeypatch):
    """One host read per step, however many micro-batches (each read is a host sync on a GPU), and the mean loss
    it returns is the one read micro-batch by micro-batch (the oracle: each loss's ``.item()`` summed in order as
    Python sums floats, which a float64 sum in the same order matches to the bit)."""
    reads = []
    for name in ("item", "__float__", "tolist"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _o=original, _n=name: reads.append(_n) or _o(t, *a))
    torch.manual_seed(0)
    model, batches = torch.nn.Linear(3, 1), [torch.randn(4, 3) for _ in range(5)]

    def loss_fn(m, x):
        return m(x).pow(2).mean()

    expected = 0.0
    with torch.no_grad():
        for batch in batches:
            expected += (loss_fn(model, batch) / len(batches)).item()
    reads.clear()
    got = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batches, loss_fn)
    assert len(reads) == 1, reads
    assert got == expected and type(got) is float


# -- every stage on 2 ranks ---------------------------------------------------------------------------------


class NoOpNoSync(GradAccumDDP):
    """ga with a no_sync() that does nothing: every backward syncs."""

    @contextlib.contextmanager
    def no_sync(self):
        yield


#: (name, build(module) -> (wrapped, optimizer)) for every rung of the ladder and every model answer.
def _cases():
    def rung(stage):
        def build(module):
            wrapped = wrap(stage, module, bucket_cap_mb=0.001)  # several buckets
            return wrapped, make_optimizer(stage, wrapped, torch.optim.SGD, lr=0.1)

        return build

    def answer(cls):
        def build(module):
            wrapped = cls(module, **accepted_options(cls, {"bucket_cap_mb": 0.001}))
            return wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1)

        return build

    cases = [(stage, rung(stage)) for stage in STAGES]
    cases += [(f"answer:{like}", answer(cls)) for like, cls in solutions.STAGES.items()]
    cases.append(("ga-with-no-op-no_sync", answer(NoOpNoSync)))
    return cases


class Seen(TorchDispatchMode):
    """Every collective (any dtype) and every wait, noted in order beside the loop's calls."""

    def __init__(self):
        super().__init__()
        self.log = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func).startswith("c10d."):
            self.log.append(("collective", str(func)))
        return func(*args, **(kwargs or {}))

    def forward(self, model, batch):
        """The loop's ``loss_fn``: notes each micro-batch's start."""
        self.log.append(("forward",))
        return _loss(model, batch)

    @contextlib.contextmanager
    def on(self, wrapped, module):
        """Note forwards, each finish (and whether it changed a gradient), waits and collectives."""
        work_wait, future_wait = dist.Work.wait, torch._C.Future.wait
        finish = getattr(wrapped, "finish_gradient_synchronization", None)
        seen = self

        def noted(wait):
            def waited(self_, *args, **kwargs):
                seen.log.append(("wait",))
                return wait(self_, *args, **kwargs)

            return waited

        def finished():
            before = _gradients(wrapped, module)
            seen.log.append(("finish:begin",))
            finish()
            after = _gradients(wrapped, module)
            same = len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))
            seen.log.append(("finish:end", same))

        if finish is not None:
            wrapped.finish_gradient_synchronization = finished  # what the loop (and fsdp's callback) calls
        dist.Work.wait, torch._C.Future.wait = noted(work_wait), noted(future_wait)
        try:
            with self:
                yield
        finally:
            dist.Work.wait, torch._C.Future.wait = work_wait, future_wait
            if finish is not None:
                del wrapped.finish_gradient_synchronization


def _gradients(wrapped, module) -> list[torch.Tensor]:
    """Every gradient a stage may hold: the module's, zero2's full parameters', fsdp's accumulated ones."""
    tensors = [p.grad for p in [*module.parameters(), *getattr(wrapped, "full", [])]]
    tensors += [g for unit in getattr(wrapped, "units", []) for g in unit.accumulated]
    return [t.clone() if t is not None else torch.zeros(0) for t in tensors]


def _loop_finishes(log: list) -> list[dict]:
    """Per micro-batch: what happened inside the finish the loop called after its backward.

    The loop's finish is the last finish before the next forward (fsdp's own end-of-backward callback
    calls finish from inside the backward, earlier)."""
    steps, current = [], None
    for event in log + [("forward",)]:
        if event[0] == "forward":
            if current is not None:
                steps.append(current["last"])
            current = {"last": None, "open": None}
        elif event[0] == "finish:begin":
            current["open"] = {"collectives": 0, "waits": 0}
        elif event[0] == "finish:end":
            current["open"]["unchanged"] = event[1]
            current["last"], current["open"] = current["open"], None
        elif current is not None and current["open"] is not None:
            current["open"]["collectives" if event[0] == "collective" else "waits"] += 1
    return steps


def _every_stage_on_rank():
    rank, world = dist.get_rank(), dist.get_world_size()
    batches = toy_models.global_batches("mlp", STEPS, 4 * world * K)
    out = {}
    for name, build in _cases():
        params, total = {}, 0
        for schedule in ("loop", "before"):
            module = toy_models.build("mlp", seed=100 + rank)
            wrapped, optimizer = build(module)
            seen = Seen()
            for batch in batches:
                micro = [toy_models.shard(toy_models.shard(batch, m, K), rank, world) for m in range(K)]
                if schedule == "loop":
                    seen.log.clear()
                    with seen.on(wrapped, module):
                        train_step(wrapped, optimizer, micro, seen.forward)
                    finishes = _loop_finishes(seen.log)
                    total += sum(1 for e in seen.log if e[0] == "collective" and "allreduce" in e[1])
                else:
                    _finish_after_the_last_backward_only(wrapped, optimizer, micro)
            params[schedule] = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
        out[name] = {
            "finishes": finishes,  # the last step's
            "all_reduces_per_step": total // STEPS,
            "bitwise_as_before": torch.equal(params["loop"], params["before"]),
        }
    return out


def _loss(model, batch):
    return toy_models.loss_fn(model, batch)


def _finish_after_the_last_backward_only(model, optimizer, micro):
    """The loop's schedule before: no finish after a backward run inside no_sync()."""
    no_sync = getattr(model, "no_sync", None)
    finish = getattr(model, "finish_gradient_synchronization", None)
    for i, batch in enumerate(micro):
        last = i == len(micro) - 1
        with no_sync() if (no_sync is not None and not last) else contextlib.nullcontext():
            (_loss(model, batch) / len(micro)).backward()
        if finish is not None and (last or no_sync is None):
            finish()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@pytest.fixture(scope="module")
def every_stage():
    return launch(_every_stage_on_rank, world_size=2, timeout_s=240)


def test_finish_after_a_no_sync_backward_does_nothing_in_every_stage(every_stage):
    for rank, out in enumerate(every_stage):
        for name, r in out.items():
            if name in ("simple", "answer:simple", "ga-with-no-op-no_sync"):
                continue  # no no_sync() that works: these sync after every backward, by design
            finishes = r["finishes"]
            assert len(finishes) == K and all(f is not None for f in finishes), (name, finishes)
            for f in finishes[:-1]:  # the micro-batches run inside no_sync()
                assert f == {"collectives": 0, "waits": 0, "unchanged": True}, (rank, name, finishes)


def test_results_are_bit_for_bit_those_of_finishing_after_the_last_backward_only(every_stage):
    for out in every_stage:
        # (not the no-op no_sync: the loop before hid it by skipping its finishes, so it differs, as it should)
        same = {n: r["bitwise_as_before"] for n, r in out.items() if n != "ga-with-no-op-no_sync"}
        assert all(same.values()), same


def test_ga_sends_k_times_fewer_all_reduces_because_of_its_no_sync(every_stage):
    for out in every_stage:
        simple = out["simple"]["all_reduces_per_step"]
        assert simple == K * 6  # 6 parameter tensors in the MLP, synced after each of K backwards
        assert out["ga"]["all_reduces_per_step"] == simple // K
        assert out["answer:ga"]["all_reduces_per_step"] == simple // K
        assert out["ga-with-no-op-no_sync"]["all_reduces_per_step"] == simple  # the loop skips nothing itself
