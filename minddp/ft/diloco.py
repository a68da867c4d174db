"""DiLoCo on the fault-tolerant rung: one quorum per outer sync, and a lost replica costs the survivors nothing.

The ``ft`` rung (:mod:`minddp.ft.rung`) asks the lighthouse every step who is in; DiLoCo talks only
every H inner steps, so here the quorum, the commit and the heal happen once per *outer sync*, in the
comm hook through which :class:`minddp.DiLoCo` sends its pseudo-gradient (:class:`FaultTolerantDiLoCo`):

1. **quorum** at the sync: the members are the replicas alive now; one lost during the inner steps is
   simply not among them;
2. **heal**: a member behind (a replica started again) receives from the first member at the newest
   sync everything a replica holds (:func:`replica_state`): the synced weights (torchft's "backup"),
   the outer optimizer's state (its momentum), the inner optimizer's state and the counts; its own
   weights become the synced ones;
3. **the sum**: every member adds its pseudo-gradient and a count of 1, a member healed in this sync
   adds zeros and 0 (:func:`contribution`: it trained no round, and a copy of its source's would count
   that replica twice); the mean is the sum over the count (:func:`mean_of`);
4. **should_commit**: only a committed sync returns its mean, and only then does DiLoCo restore the
   synced weights and step the outer optimizer, so the synced weights and the outer state move on every
   member or on none. A discarded sync (a member died inside the all_reduce) is tried again at once with
   a new quorum **and the same pseudo-gradient**: the survivors keep their H inner steps (torchft restores
   the synced weights instead, and the round is lost).

A replica started again (incarnation > 0) syncs first (:func:`sync_now`), before it trains: it
waits in the quorum for the survivors' next sync, is healed there and takes the outer step with them.

The same sync runs under torchft's own ``Manager`` and lighthouse (:mod:`minddp.ft.manager`): one
piece of code per idea, two engines for the quorum and the commit. Faults (:mod:`minddp.ft.faults`)
name outer syncs here: ``kill@S:R`` kills replica R at sync S after its inner steps, when its peers wait
for it in the all_reduce; ``raise@S:R`` makes that all_reduce raise. More: ``docs/fault-tolerance.md``
(*DiLoCo on the ft rung*).

Example (a coordinator and several ranks, so not run by the doctests)::

    launch_ft(ToyTask(), 6, world_size=2, faults=parse_faults("kill@2:1"), diloco={"sync_every": 4})
"""

from __future__ import annotations

import io

import torch
import torch.distributed as dist

from minddp.diloco import OUTER_DEFAULTS, DiLoCo
from minddp.diloco.state import done
from minddp.ft.client import Coordinator
from minddp.ft.rung import FaultTolerantTrainer, digest, optimizer_tensors


def sync_now(diloco: DiLoCo) -> None:
    """Sync the whole model now, between two periods, as after a period's last inner step: what a replica that
    joins does first (its sync heals it, then it takes the outer step with the others). One fragment, no delay."""
    if len(diloco.fragments) > 1 or diloco.delay or diloco.steps % diloco.sync_every or diloco.in_flight is not None:
        raise RuntimeError(
            "a replica joins at a whole-model sync between two periods: one fragment, no delay, "
            f"after a multiple of sync_every={diloco.sync_every} steps (here {diloco.steps})"
        )
    with torch.no_grad():
        diloco._send(0)  # (the rung's own two halves of a sync, as its optimizer hook calls them)
        diloco._apply(0)


def outer_sgd(model: torch.nn.Module, outer_lr: float, outer_momentum: float) -> torch.optim.SGD:
    """DiLoCo's outer optimizer with these settings (Nesterov when there is momentum)."""
    return torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)


def contribution(pseudo: torch.Tensor, joining: bool) -> torch.Tensor:
    """Step 3: what a member adds to the sum: its pseudo-gradient and a count of 1, or zeros and 0 if it joined."""
    count = torch.tensor([0.0 if joining else 1.0], dtype=pseudo.dtype, device=pseudo.device)
    return torch.cat([torch.zeros_like(pseudo) if joining else pseudo, count])


def mean_of(summed: torch.Tensor) -> torch.Tensor:
    """Step 3: the sum of the contributions over the count of members that trained the round."""
    if summed[-1] == 0:
        raise RuntimeError("no member of this sync trained its round (every one joined): nothing to average")
    return summed[:-1] / summed[-1]


def replica_state(model: torch.nn.Module, inner: torch.optim.Optimizer, diloco: DiLoCo) -> dict:
    """Step 2: what a joining replica is healed with: its source's weights, inner optimizer and DiLoCo state."""
    return {"model": model.state_dict(), "inner": inner.state_dict(), "diloco": diloco.state_dict()}


def load_replica_state(model: torch.nn.Module, inner: torch.optim.Optimizer, diloco: DiLoCo, state: dict) -> None:
    """Step 2 on the joining side: load ``state``; the weights become the synced ones (it trained no round)."""
    model.load_state_dict(state["model"])
    inner.load_state_dict(state["inner"])
    diloco.load_state_dict(state["diloco"])
    with torch.no_grad():
        for params, synced in zip(diloco.fragments, diloco.synced):
            for p, s in zip(params, synced):
                p.copy_(s)


def shared_tensors(diloco: DiLoCo) -> list[torch.Tensor]:
    """What every member holds alike after a sync: the synced weights and the outer optimizers' state."""
    return [s for synced in diloco.synced for s in synced] + [
        t for outer in {id(o): o for o in diloco.outer}.values() for t in optimizer_tensors(outer)
    ]


class FaultTolerantDiLoCo(FaultTolerantTrainer):
    """One replica (``slot``) of DiLoCo on minddp's coordinator: ``steps`` outer syncs of ``sync_every`` inner steps.

    Replica ``slot`` trains on its shard of every global batch of ``task`` (``world_size`` shards: a lost
    replica's shard goes untrained until it is back). The log has one entry per attempted sync.
    """

    def __init__(
        self,
        task,
        steps: int,
        coordinator: Coordinator,
        *args,
        sync_every: int,
        world_size: int,
        outer_lr: float = OUTER_DEFAULTS["lr"],
        outer_momentum: float = OUTER_DEFAULTS["momentum"],
        fragment_update_alpha: float = 0.0,
        **kwargs,
    ):
        super().__init__(task, steps, coordinator, *args, **kwargs)  # the fault plan, the bounds, the callbacks
        self.world_size = world_size
        outer = outer_sgd(self.model, outer_lr, outer_momentum)
        # no same start: every replica builds the task's seeded model, and one started again is healed
        self.diloco = DiLoCo(
            self.model, self.optimizer, outer, sync_every, fragment_update_alpha=fragment_update_alpha, same_start=False
        )
        self.diloco.register_comm_hook(None, self.sync_hook)
        self.joining = coordinator.incarnation > 0  # started again: healed at its first sync, adds nothing to it

    def train(self) -> None:
        """Inner steps on this replica's shard; every ``sync_every``-th, DiLoCo's hook runs steps 1-4."""
        if self.joining:
            sync_now(self.diloco)  # waits for the survivors' next sync, is healed there, takes the outer step
        while self.step < self.steps:
            shard = self.task.shard(self.task.global_batch(self.diloco.steps), self.slot, self.world_size)
            self.optimizer.zero_grad()
            self.task.loss(self.model, shard, self.world_size).backward()
            self.optimizer.step()  # the sync (steps 1-4) runs in its post-hook

    def sync_hook(self, state, bucket) -> torch.futures.Future:
        """DiLoCo's comm hook: the pseudo-gradient's mean over this sync's members, once a sync is committed."""
        pseudo = bucket.buffer().clone()  # every attempt sends it again: a failed one may have written into its copy
        mean = self.until_committed(lambda quorum, entry: self.average(pseudo, entry))
        self.joining = False
        return done(mean)

    def average(self, pseudo: torch.Tensor, entry: dict) -> torch.Tensor:
        """Step 3 over the group of this quorum (gloo, on the CPU by construction)."""
        summed = contribution(pseudo, self.joining)
        self.faults_before_collective()  # peers are now waiting in the all_reduce
        self.raise_if_armed()
        dist.all_reduce(summed)
        entry.update(joined=self.joining, participants=int(summed[-1]))
        return mean_of(summed)

    def wrap(self) -> None:
        """Nothing to wrap: the replica trains its model alone between syncs."""

    def state_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save({**replica_state(self.model, self.optimizer, self.diloco), "step": self.step}, buf)
        return buf.getvalue()

    def load_state_bytes(self, payload: bytes) -> None:
        state = torch.load(io.BytesIO(payload), weights_only=True)
        load_replica_state(self.model, self.optimizer, self.diloco, state)
        self.step, self.joining = state["step"], True

    def state_digest(self) -> str | None:
        """A hash of what every member must hold alike at a sync: synced weights, outer state, the count."""
        if not self.digests:
            return None
        return digest([*shared_tensors(self.diloco), torch.tensor(self.step)])
