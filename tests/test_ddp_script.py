"""The ``ddp`` stage as a drop-in: an ordinary torch script, the rebuilt bucket plan, bucket views.

* an ordinary DDP training script (DistributedSampler, ``loss.backward()``,
  ``optimizer.step()``, nothing else) gives torch's final parameters when
  only the DDP class is swapped: the end-of-backward callback finishes the sync;
* the bucket plan is rebuilt after iteration 1 in the order gradients really
  became ready (the oracle: hooks recording that order in a plain single
  process), identically on all ranks; the first iteration runs torch's
  one-bucket plan; buckets reach the comm hook strictly in index order, also
  under ``find_unused_parameters`` whose static plan (never rebuilt) guesses
  the order wrong;
* with ``gradient_as_bucket_view`` every ``.grad`` shares memory with its
  bucket buffer (``data_ptr``), and without it none does.
"""

from __future__ import annotations

import ddp_models
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from minddp import DistributedDataParallel, launch
from minddp.comm.default_hooks import allreduce_hook


def ordinary_script(DDP) -> torch.Tensor:
    """The seeds' training script, with the DDP class as the only parameter."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)  # different init per rank: DDP must broadcast
    model = nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 1))
    ddp_model = DDP(model)
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(100, 10, generator=g), torch.randn(100, 1, generator=g))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, batch_size=8, shuffle=False, sampler=sampler)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.MSELoss()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch_x, batch_y in loader:
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(batch_x), batch_y)
            loss.backward()
            optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def observed_ready_order(model: nn.Module, x: torch.Tensor) -> list[int]:
    """Oracle: the order autograd finishes each parameter's gradient, in one plain process."""
    params = list(model.parameters())
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p, i=i: order.append(i)) for i, p in enumerate(params)]
    model(x).sum().backward()
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    return order


def drop_in_on_rank() -> dict:
    rank = dist.get_rank()
    out = {"torch": ordinary_script(TorchDDP), "ours": ordinary_script(DistributedDataParallel)}

    # Rebuilt plan and strict launch order (each parameter its own bucket: cap ~1 byte).
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(rank))
    expected = observed_ready_order(ddp_models.build(ddp_models.Reordered, seed=0), x)
    seen: list[list[int]] = []

    def recording_hook(state, bucket):
        seen[-1].append(bucket.index())
        return allreduce_hook(state, bucket)

    runs = {}
    for label, wrap in (("ours", DistributedDataParallel), ("torch", TorchDDP)):
        model = ddp_models.build(ddp_models.Reordered, seed=rank)
        net = wrap(model, bucket_cap_mb=1e-6)
        if label == "ours":
            static = [list(b) for b in net.bucket_plan]
            net.register_comm_hook(None, recording_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(3):
            seen.append([])
            net(x * (step + 1)).sum().backward()
            opt.step()
            opt.zero_grad()
        runs[label] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        if label == "ours":
            out.update(static=static, rebuilt=[list(b) for b in net.bucket_plan], launched=seen[:3])
    # find_unused_parameters keeps its static plan (buckets filled in registration order): launches stay in order.
    net = DistributedDataParallel(
        ddp_models.build(ddp_models.Reordered, seed=rank), bucket_cap_mb=1e-6, find_unused_parameters=True
    )
    net.register_comm_hook(None, recording_hook)
    seen.clear()
    for step in range(2):
        seen.append([])
        net(x).sum().backward()
    out.update(unused_static=[list(b) for b in net.bucket_plan], unused_launched=list(seen))
    out.update(expected_order=expected, rebuilt_vs_torch=float((runs["ours"] - runs["torch"]).abs().max()))

    # gradient_as_bucket_view: .grad shares memory with a bucket buffer (through the rebuild, and zero_grad).
    for view in (False, True):
        model = ddp_models.build(ddp_models.Reordered, seed=rank)
        net = DistributedDataParallel(model, bucket_cap_mb=0.001, gradient_as_bucket_view=view)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        shares = []
        for step in range(3):
            net(x).sum().backward()
            buffers = {b.untyped_storage().data_ptr() for b in net.reducer.buffers}
            shares.append([p.grad.untyped_storage().data_ptr() in buffers for p in model.parameters()])
            opt.step()
            opt.zero_grad(set_to_none=step == 0)  # both ways of zeroing
        out[f"shares_view={view}"] = shares
    return out


def test_ordinary_script_rebuild_and_views():
    results = launch(drop_in_on_rank, world_size=2, backend="gloo", timeout_s=120)
    for rank, r in enumerate(results):
        # Drop-in: the plain script gives torch's parameters (and both ranks end identical).
        assert torch.allclose(r["ours"], r["torch"], rtol=1e-5, atol=1e-6), (rank, (r["ours"] - r["torch"]).abs().max())
        assert torch.equal(r["ours"], results[0]["ours"])
        # Rebuilt plan follows the observed ready order, which the static plan did not.
        assert [b[0] for b in r["rebuilt"]] == r["expected_order"]
        assert [b[0] for b in r["static"]] != r["expected_order"]
        assert r["rebuilt"] == results[0]["rebuilt"]
        # The first iteration is one bucket of everything, in registration order (torch 2.13's start).
        assert r["static"] == [list(range(len(r["expected_order"])))]
        # Buckets reach the hook in index order every step.
        assert r["launched"][0] == [0]
        for indices in r["launched"][1:]:
            assert indices == list(range(len(r["rebuilt"]))), r["launched"]
        # With find_unused_parameters: one bucket per parameter filled in registration order, launched
        # last-filled first, which is not the ready order; strict order still holds.
        assert [b[0] for b in r["unused_static"]] == list(reversed(range(len(r["expected_order"]))))
        assert [b[0] for b in r["unused_static"]] != r["expected_order"]
        for indices in r["unused_launched"]:
            assert indices == list(range(len(r["unused_static"]))), r["unused_launched"]
        assert r["rebuilt_vs_torch"] < 1e-6
        assert all(all(step) for step in r["shares_view=True"]), r["shares_view=True"]
        assert not any(any(step) for step in r["shares_view=False"]), r["shares_view=False"]
