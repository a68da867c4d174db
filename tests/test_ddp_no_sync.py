"""``no_sync`` costs ``minddp.DistributedDataParallel`` no Python per parameter, and still syncs what torch syncs.

torch's reducer hooks are C++: in a backward that does not sync they return
at once. minddp's are Python, so a ``no_sync`` forward takes them off the
parameters and the next synced forward puts them back
(``Reducer.hooks_for``). Two things are checked on 2 ranks:

1. **counts**: how many times the reducer's Python hook runs per micro-batch:
   none in a ``no_sync`` backward, one per parameter in a synced one, and one
   per parameter in a ``no_sync`` backward too when ``find_unused_parameters``
   must record which parameters it used;
2. **the hooks stay while a sync is pending**: a synced forward, then a
   ``no_sync`` forward and an evaluation forward before the synced forward's
   backward; torch's DDP (the oracle) still syncs that backward and not the
   later one, and the next synced micro-batch finds nothing left unreduced.
   Gradients must match torch's bit for bit.
"""

from __future__ import annotations

import ddp_models
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp import DistributedDataParallel, launch
from minddp.ddp.reducer import Reducer


def _counting_hook_calls() -> tuple[list, object]:
    """Count calls of the reducer's per-parameter hook (wrapped before the wrapper registers it)."""
    calls: list = []
    original = Reducer._on_grad_ready

    def counted(self, param):
        calls.append(param)
        return original(self, param)

    Reducer._on_grad_ready = counted
    return calls, original


def counts_on_rank() -> dict:
    rank = dist.get_rank()
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    out = {}
    for find_unused in (False, True):
        calls, original = _counting_hook_calls()
        try:
            net = DistributedDataParallel(
                ddp_models.build(ddp_models.Reordered, seed=0), find_unused_parameters=find_unused
            )
        finally:
            Reducer._on_grad_ready = original
        per_micro = []
        for micro in ("sync", "no_sync", "no_sync", "sync", "no_sync", "sync"):
            before = len(calls)
            if micro == "no_sync":
                with net.no_sync():
                    net(x).sum().backward()
            else:
                net(x).sum().backward()
            per_micro.append((micro, len(calls) - before))
        out[find_unused] = per_micro
    return out


def pending_sync_on_rank() -> dict:
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data: a sync changes the gradients
    xa, xb, xc = (torch.randn(4, 6, generator=g) for _ in range(3))
    grads = {}
    for label, wrap in (("ours", DistributedDataParallel), ("torch", TorchDDP), ("local", None)):
        model = ddp_models.build(ddp_models.Reordered, seed=0)
        net = model if wrap is None else wrap(model)
        out_a = net(xa)  # its backward syncs...
        with net.no_sync() if wrap is not None else torch.enable_grad():
            out_b = net(xb)  # ...even though a no_sync forward comes before it
        with torch.no_grad():
            net(xc)  # and an evaluation forward
        out_a.pow(2).mean().backward()
        out_b.pow(2).mean().backward()  # accumulates locally, as torch
        net(xa).sum().backward()  # and a plain synced micro-batch after them
        grads[label] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads


def on_rank() -> dict:
    return {"counts": counts_on_rank(), "pending": pending_sync_on_rank()}


def test_no_python_hook_in_no_sync_backward_and_pending_sync_kept():
    results = launch(on_rank, world_size=2, backend="gloo", timeout_s=120)
    used = len(list(ddp_models.build(ddp_models.Reordered, seed=0).parameters()))  # every one gets a gradient
    for rank, r in enumerate(results):
        plain, searching = r["counts"][False], r["counts"][True]
        assert plain == [(m, used if m == "sync" else 0) for m, _ in plain], (rank, plain)
        assert searching == [(m, used) for m, _ in searching], (rank, searching)
        ours, theirs, local = r["pending"]["ours"], r["pending"]["torch"], r["pending"]["local"]
        assert ours.keys() == theirs.keys() == local.keys() and len(ours) == used
        for name in theirs:
            assert torch.equal(ours[name], theirs[name]), (rank, name)  # bit for bit: same sums, same order
        # Meaningful only if the first backward did sync (the ranks' data differ): torch's is not local.
        assert any(not torch.equal(theirs[n], local[n]) for n in theirs), rank
