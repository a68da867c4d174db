"""The slow-link rungs' task, and the same task under torchft's own ``LocalSGD`` and ``DiLoCo`` (gloo, CPU).

The task: a three-layer network of equal layers (so that minddp's split into three fragments is the
layer-by-layer split a torchft user passes as modules), MSE on batches that depend on the step and the
replica only, AdamW inside. torchft runs as its own tests run it (``local_sgd_integ_test``,
``diloco_regression_test``): two replica groups of one rank each, in threads of this process, each with a
``Manager`` on a gloo process group and one lighthouse on loopback that waits for both before every
quorum (``min_replicas=2``), synchronous quorums (DiLoCo requires them), no step-0 sync (the replicas are
built from the same seed, as torchft's ``init_sync=False`` is for).
"""

from __future__ import annotations

import threading

import torch
from torch import nn

LAYERS, WIDTH, ROWS = 3, 8, 8


def build_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(LAYERS)])


def build_inner(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=0.02)


def batch(step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Replica ``replica``'s batch at inner step ``step``: its own data, the same in every run."""
    g = torch.Generator().manual_seed(1000 * step + replica)
    x = torch.randn(ROWS, WIDTH, generator=g)
    return x, torch.sin(x.flip(1)) * 0.5


def inner_step(model: nn.Module, inner: torch.optim.Optimizer, step: int, replica: int) -> None:
    """One step of an ordinary loop; the rung under test acts in the optimizer's post-hook."""
    inner.zero_grad()
    x, y = batch(step, replica)
    torch.nn.functional.mse_loss(model(x), y).backward()
    inner.step()


def run_torchft(
    kind: str, steps: int, sync_every: int, outer: dict | None = None, fragments: int = 1, **diloco
) -> list[dict]:
    """Train ``steps`` inner steps on two replicas under torchft's ``kind`` (``local_sgd`` or ``diloco``).

    ``outer``: the outer SGD's settings, one optimizer per fragment (torchft's form); ``fragments``: 1
    (the whole model) or one per layer; ``diloco``: ``fragment_sync_delay`` and ``fragment_update_alpha``.
    Returns each replica's final parameters and the number of steps its Manager committed.
    """
    from ft_torchft import in_threads, replica_manager
    from torchft.coordination import LighthouseServer
    from torchft.local_sgd import DiLoCo, LocalSGD

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=10000)
    lock = threading.Lock()

    def replica(replica_id: int, first: bool) -> dict:
        with lock:
            model = build_model()
        inner = build_inner(model)
        pg, manager = replica_manager(
            replica_id,
            lighthouse,
            state_dict=lambda: {"model": model.state_dict()},
            load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
            min_replica_size=2,
            pg_timeout_s=30,
            timeout_s=30,
            init_sync=False,
        )
        try:
            if kind == "local_sgd":
                rung = LocalSGD(manager, model, inner, sync_every)
            else:
                modules = [model] if fragments == 1 else list(model)
                outers = [torch.optim.SGD(f.parameters(), **outer) for f in modules]
                rung = DiLoCo(manager, modules, inner, outers, sync_every, **diloco)
            with rung:
                for step in range(steps):
                    inner_step(model, inner, step, replica_id)
            return {"params": [p.detach().clone() for p in model.parameters()], "commits": manager.current_step()}
        finally:
            pg.abort()
            manager.shutdown(wait=False)

    return in_threads(replica, 2, lighthouse)  # one torch thread, as every rank of minddp's run: the same sums
