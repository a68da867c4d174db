"""DiLoCo's fault-tolerant sync under torchft's own ``Manager`` and lighthouse, for teams that already run them.

:mod:`minddp.ft.diloco` runs each outer sync through minddp's coordinator; this module runs the same
sync through a ``torchft.Manager`` (its lighthouse's quorum, its ``should_commit``, its checkpoint
transport for the heal), with the same pieces: what a member adds (:func:`~minddp.ft.diloco.contribution`:
a replica healed in this sync adds zeros and a count of 0), what a joiner is healed with
(:func:`~minddp.ft.diloco.replica_state`: synced weights, outer and inner optimizer state, the counts,
registered as the Manager's state dict), and a discarded sync tried again with the same pseudo-gradient
(the survivors keep their round). :class:`ManagerDiLoCo`, each sync:

1. ``manager.start_quorum()``: the lighthouse's quorum; a replica behind is healed in it (torchft calls
   :meth:`ManagerDiLoCo.load_state_dict` with its source's :meth:`~ManagerDiLoCo.state_dict`);
2. ``manager.allreduce(..., reduce_op=SUM)`` of the contribution (torchft's own average would divide by
   every participant, the healed one included);
3. ``manager.should_commit()``: on a commit the mean goes back to DiLoCo, which steps the outer optimizer;
   otherwise back to 1.

The Manager must run synchronous quorums (``use_async_quorum=False``: a heal must land before the
contribution is made, as torchft's own DiLoCo requires) and be built without a state dict of its own
(``state_dict=None, load_state_dict=None``). torchft is not a dependency of minddp: this module imports
nothing of it, it is handed a Manager. ``tests/test_ft_diloco.py`` runs it under a lighthouse on loopback.

Example (a lighthouse and several replicas, so not run by the doctests)::

    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(), load_state_dict=None, state_dict=None,
                              min_replica_size=1, use_async_quorum=False, ...)
    rung = ManagerDiLoCo(manager, model, inner, None, sync_every=50, joining=restarted)
    if restarted:
        sync_now(rung.diloco)                  # healed at the others' next sync
    for batch in batches: ...                  # an ordinary loop; every 50th inner.step() syncs
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from minddp.diloco import DiLoCo
from minddp.diloco.state import done
from minddp.ft.diloco import contribution, load_replica_state, mean_of, replica_state
from minddp.ft.rung import MAX_ATTEMPTS, StepFailedAgain

#: The key of the replica's state among the Manager's state dicts.
STATE_KEY = "minddp.diloco"


class ManagerDiLoCo:
    """DiLoCo around ``model`` and ``inner``, each outer sync run by ``manager`` (steps 1-3).

    ``joining``: this replica was started again and holds nothing yet (it syncs first, with
    :func:`~minddp.ft.diloco.sync_now`, and adds nothing to that sync). ``before_collective(sync)``: called before each
    all_reduce with the number of syncs committed so far (where a test injects a failure). ``log``: one
    ``(sync, members, joined, committed)`` per attempt.
    """

    def __init__(
        self,
        manager,
        model: torch.nn.Module,
        inner: torch.optim.Optimizer,
        outer: torch.optim.Optimizer | None,
        sync_every: int,
        *,
        fragment_update_alpha: float = 0.0,
        joining: bool = False,
        before_collective: Callable[[int], None] | None = None,
    ):
        self.manager, self.model, self.inner = manager, model, inner
        self.diloco = DiLoCo(
            model, inner, outer, sync_every, fragment_update_alpha=fragment_update_alpha, same_start=False
        )
        self.diloco.register_comm_hook(None, self.sync_hook)
        self.joining, self.before_collective, self.log = joining, before_collective, []
        manager.register_state_dict_fn(STATE_KEY, self.load_state_dict, self.state_dict)

    def state_dict(self) -> dict:
        """What a joining replica is healed with (torchft sends it through its checkpoint transport)."""
        return replica_state(self.model, self.inner, self.diloco)

    def load_state_dict(self, state: dict) -> None:
        """Healed: this replica's weights become the synced ones, and it adds nothing to this sync."""
        load_replica_state(self.model, self.inner, self.diloco, state)
        self.joining = True

    def sync_hook(self, state, bucket) -> torch.futures.Future:
        """DiLoCo's comm hook: steps 1-3 until a sync is committed; its mean."""
        pseudo = bucket.buffer().clone()  # every attempt sends it again
        for _ in range(MAX_ATTEMPTS):
            self.manager.start_quorum()  # 1. (a heal happens here)
            summed = contribution(pseudo, self.joining)
            if self.before_collective is not None:
                self.before_collective(self.manager.current_step())
            self.manager.allreduce(summed, reduce_op=dist.ReduceOp.SUM).wait()  # 2. (an error: no commit below)
            joined, members = self.joining, self.manager.num_participants()
            committed = self.manager.should_commit()  # 3.
            self.log.append((self.manager.current_step() - committed, members, joined, committed))
            if committed:
                self.joining = False
                return done(mean_of(summed))
        raise StepFailedAgain(
            f"minddp.ft: outer sync {self.manager.current_step()} was discarded {MAX_ATTEMPTS} times in a row; "
            "this is no transient fault, see the Manager's log for its cause"
        )
