"""Scripts whose step runs a backward or ``autograd.grad`` besides the training backward, under both DDPs.

Gradient penalties (WGAN-GP), double backward (a gradient-norm penalty),
``autograd.grad`` on the inputs only (saliency), a second loss through the
same outputs (``retain_graph=True``): each is a small 2-rank script run under
``torch.nn.parallel.DistributedDataParallel`` (the oracle) and under
``minddp.DistributedDataParallel``, compared bit for bit (every step's
gradients, which are ``None``, the final parameters); where torch raises, minddp
must raise the same error at the same step. torch's reducer hears only the
parameters' gradient hooks, so an ``autograd.grad`` that reaches no parameter
leaves the step's reduction to the backward that follows. All cases share one
launch.

Bitwise is the right bar: with 2 ranks each averaged element is ``(a + b) / 2``
whatever the bucket layout (a sum of two floats does not depend on their
order), and both scripts run the same ops on the same data in one process each.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_ddp_dropin import batch, differences
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from minddp import DistributedDataParallel, launch

STEPS = 3
EXPECTED = "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one."


def critic() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def penalty(ddp, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """WGAN-GP: the critic's output and the penalty on its input gradient (a graph for the backward)."""
    x = x.requires_grad_()
    out = ddp(x)
    (g,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    return out, (g.norm(dim=1) - 1).pow(2).mean()


def gradient_penalty(ddp, step, rank):
    out, gp = penalty(ddp, batch(step, rank))
    (out.sum() / 10 + gp).backward()


def penalty_alone(ddp, step, rank):
    """The last bias is not in the penalty's graph: torch raises at the next forward, minddp must too."""
    _, gp = penalty(ddp, batch(step, rank))
    gp.backward()


def penalty_alone_outputs_touched(ddp, step, rank):
    """The fix the find_unused error names: the outputs in the loss (times 0), so the backward goes through them."""
    out, gp = penalty(ddp, batch(step, rank))
    (gp + 0 * out.sum()).backward()


def penalty_accumulated(ddp, step, rank):
    """Two micro-batches, the first under no_sync()."""
    with ddp.no_sync():
        gradient_penalty(ddp, step, rank)
    gradient_penalty(ddp, 20 + step, rank)


def double_backward(ddp, step, rank):
    """A gradient-norm penalty: autograd.grad on the parameters with create_graph, then one backward."""
    loss = ddp(batch(step, rank)).pow(2).mean()
    grads = torch.autograd.grad(loss, list(ddp.parameters()), create_graph=True)
    (loss + 0.1 * sum(g.pow(2).sum() for g in grads)).backward()


def double_backward_alone(ddp, step, rank):
    """Only the gradient norm: the backward never goes through the outputs."""
    loss = ddp(batch(step, rank)).pow(2).mean()
    grads = torch.autograd.grad(loss, list(ddp.parameters()), create_graph=True)
    sum(g.pow(2).sum() for g in grads).backward()


def saliency_then_train(ddp, step, rank):
    """autograd.grad on the inputs of one forward (no backward after it), then an ordinary step."""
    x = batch(50 + step, rank).requires_grad_()
    torch.autograd.grad(ddp(x).sum(), x)
    ddp(batch(step, rank)).pow(2).sum().backward()


def saliency_of_the_training_forward(ddp, step, rank):
    """autograd.grad on the inputs of the training forward, before its backward."""
    x = batch(step, rank).requires_grad_()
    out = ddp(x)
    torch.autograd.grad(out.sum(), x, retain_graph=True)
    out.pow(2).sum().backward()


def two_losses(ddp, step, rank):
    """A second loss through the same outputs: as in torch only the first backward syncs, the second adds locally."""
    out = ddp(batch(step, rank))
    out.pow(2).sum().backward(retain_graph=True)
    out.abs().sum().backward()


def train(DDP, body, options=None):
    """The user script: seeded critic (different per rank), DDP, SGD with momentum; grads per step, params.

    Returns the error as ``(step, "Type: message")`` if the script raises.
    """
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = critic()
    ddp = DDP(model, **(options or {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for step in range(STEPS):
        try:
            body(ddp, step, rank)
        except RuntimeError as exc:
            return step, f"{type(exc).__name__}: {exc}"
        grads.append({n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad(set_to_none=True)
    return grads, torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def compare(body, options=None, oracle_options=None) -> list[str]:
    theirs = train(TorchDDP, body, options if oracle_options is None else oracle_options)
    ours = train(DistributedDataParallel, body, options)
    if isinstance(theirs[1], str) or isinstance(ours[1], str):
        return [] if raised_alike(theirs, ours) else [f"torch: {theirs[1]!s:.300} ours: {ours[1]!s:.300}"]
    return differences(theirs, ours)


def raised_alike(theirs, ours) -> bool:
    """Both raised torch's error at the same step."""
    return (
        isinstance(theirs[1], str)
        and isinstance(ours[1], str)
        and theirs[0] == ours[0]
        and theirs[1].startswith(EXPECTED)
        and ours[1].startswith(EXPECTED)
    )


FIND_UNUSED = {"find_unused_parameters": True}
SCRIPTS = {
    "gradient-penalty": (gradient_penalty, None),
    "gradient-penalty-find-unused": (gradient_penalty, FIND_UNUSED),
    "penalty-alone": (penalty_alone, None),
    "penalty-alone-find-unused": (penalty_alone, FIND_UNUSED),
    "penalty-alone-outputs-touched-find-unused": (penalty_alone_outputs_touched, FIND_UNUSED),
    "penalty-accumulated-no-sync": (penalty_accumulated, None),
    "double-backward": (double_backward, None),
    "double-backward-alone": (double_backward_alone, None),
    "double-backward-find-unused": (double_backward, FIND_UNUSED),
    "saliency-then-train": (saliency_then_train, None),
    "saliency-then-train-find-unused": (saliency_then_train, FIND_UNUSED),
    "saliency-of-the-training-forward": (saliency_of_the_training_forward, None),
    "two-losses-retain-graph": (two_losses, None),
    "two-losses-retain-graph-find-unused": (two_losses, FIND_UNUSED),
}
# static_graph: torch's first iteration queues its delayed all_reduce from its output sink, so an
# autograd.grad on the outputs runs it before any gradient exists and torch's ranks silently drift
# apart. static_graph only promises what the default mode computes, so the oracle is torch's default.
STATIC = {
    "gradient-penalty-static-graph": gradient_penalty,
    "saliency-then-train-static-graph": saliency_then_train,
    "double-backward-static-graph": double_backward,
}


def cases_on_rank() -> dict:
    out = {name: compare(body, options) for name, (body, options) in SCRIPTS.items()}
    out.update({name: compare(body, {"static_graph": True}, oracle_options={}) for name, body in STATIC.items()})
    ours = train(DistributedDataParallel, penalty_alone)
    out["penalty-alone-message"] = ours[1] if isinstance(ours[1], str) else "trained"
    ours = train(DistributedDataParallel, penalty_alone, FIND_UNUSED)
    out["penalty-alone-find-unused-message"] = ours[1] if isinstance(ours[1], str) else "trained"
    return out


@pytest.fixture(scope="module")
def results():
    return launch(cases_on_rank, world_size=2, timeout_s=60)


@pytest.mark.parametrize("case", [*SCRIPTS, *STATIC])
def test_script_gives_torchs_results_bit_for_bit(results, case):
    for rank, r in enumerate(results):
        assert r[case] == [], (rank, r[case])


def test_a_penalty_alone_names_the_parameter_and_the_fix(results):
    """The last layer's bias is not in the penalty's graph; the message names it, and a fix that fits the flag."""
    for r in results:
        off, on = r["penalty-alone-message"], r["penalty-alone-find-unused-message"]
        assert off.startswith(EXPECTED) and "['2.bias']" in off and "find_unused_parameters=True" in off, off
        assert on.startswith(EXPECTED) and "['2.bias']" in on and "0 * output.sum()" in on, on
        assert "\n" not in off and "\n" not in on
