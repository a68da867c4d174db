"""The fault-tolerant rung: the ``ddp`` stage, asked every step who is in and whether the step counts.

One training process's loop (:class:`FaultTolerantTrainer`), each idea in its own lines:

1. **quorum**: ask the coordinator (:mod:`minddp.ft.coordinator`) who trains step ``s``;
2. **a new group at the new world size** when the quorum's tag changed, the ``ddp`` stage wrapped on it;
3. **heal**: a member at an older step receives the live state from the first member at the newest step;
4. **the work**: this member's shard of the step's global batch (the survivors split a lost process's rows);
5. **should_commit**: the optimizer steps only if every member's step went through; a discarded step
   leaves parameters and optimizer state as they were, and the next quorum tries it again.

An exception in 2-4 makes this process destroy its group at once, then vote "not ok", and go back to 1; the
same step failing :data:`MAX_ATTEMPTS` times in a row is raised with its cause.
``docs/fault-tolerance.md`` (*What one step does*) tells each step in full.

Example (a coordinator and several processes, so not run by the doctests; the train command runs it)::

    $ python -m minddp.train --stage ft --world-size 3 --steps 40 --hang-timeout 3 --inject kill@5:1
"""

from __future__ import annotations

import gc
import hashlib
import io
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from minddp.comm.default_hooks import allreduce_hook
from minddp.ft.client import Coordinator, Quorum
from minddp.ft.faults import FaultPlan
from minddp.runtime.launch import leave_group

#: The same step failing this many times in a row ends the process with the last error.
MAX_ATTEMPTS = 8


class StepFailedAgain(RuntimeError):
    """One step failed :data:`MAX_ATTEMPTS` times: not a transient fault."""


class FaultTolerantTrainer:
    """One training process (``slot``, ``incarnation``) training ``task`` for ``steps`` committed steps."""

    def __init__(
        self,
        task,
        steps: int,
        coordinator: Coordinator,
        plan: FaultPlan | None = None,
        hang_s: float = 10.0,
        digests: bool = False,
        on_entry=None,
        on_result=None,
    ):
        self.task, self.steps, self.coordinator, self.plan = task, steps, coordinator, plan
        self.slot, self.hang_s, self.digests = coordinator.slot, hang_s, digests
        self.model = task.build_model()
        self.optimizer = task.build_optimizer(self.model)
        self.step = 0  # committed steps so far: the next step to train
        self.group_tag = None  # the quorum this process's group was built for
        self.ddp = None
        self.log: list[dict] = []  # one entry per attempted step
        self.on_entry = on_entry  # told each entry as it is made (the launcher's timeline)
        self.on_result = on_result  # handed the result while this process still beats (the launcher's copy)
        self.healed_bytes = 0
        self.raise_in_collective = None  # a ``raise@STEP:SLOT`` fault due in this step's collective

    def run(self) -> dict:
        self.coordinator.start_beating()
        self.train()
        # The result is made and handed over while the heartbeat still runs, and only then does this process say
        # it is done: a slow serialisation or teardown is neither taken for a frozen process nor loses the result.
        result = {
            "slot": self.slot,
            "incarnation": self.coordinator.incarnation,
            "step": self.step,
            "log": self.log,
            "state": self.state_bytes(),
            "healed_bytes": self.healed_bytes,
        }
        if self.on_result is not None:
            self.on_result(result)
        self.coordinator.finish()
        self.drop_group()
        return result

    def train(self) -> None:
        """``steps`` committed steps of the ``ddp`` stage: the optimizer steps only on a commit (step 5)."""
        while self.step < self.steps:
            self.until_committed(self.forward_backward, self.optimizer.step, self.drop_gradients)

    def drop_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)  # after a discarded attempt too: its gradients are dropped

    def until_committed(self, work, on_commit=None, after_attempt=None):
        """Phases 1-5 until one attempt is committed; ``work(quorum, entry)``'s value of that attempt.

        ``on_commit()`` runs once the attempt is committed, before the step count moves; ``after_attempt()``
        after every attempt, committed or not.
        """
        failures, last_error = 0, None
        while True:
            asked = time.time()
            quorum = self.coordinator.quorum(self.step)  # 1. who is in
            entry = {
                "step": quorum.max_step,
                "tag": quorum.tag,
                "members": quorum.members,
                "t_asked": asked,  # when this process asked for the quorum
                "t0": time.time(),
                "healed": False,
            }
            try:
                if quorum.tag != self.group_tag:
                    entry["healed"] = self.rebuild_group(quorum)  # 2. the new world, 3. heal
                entry["before"] = self.state_digest()
                entry["t_work"] = time.time()  # the group built, any heal and the digest done
                value = work(quorum, entry)  # 4. the work
                entry["t_worked"] = time.time()  # (before the vote)
                ok = True
            except Exception as exc:  # noqa: BLE001 - any failure of this attempt: vote no, try again
                entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                last_error, entry["t_error"] = entry["error"], time.time()
                ok = False
            if not ok:  # (out of the except block: its traceback no longer holds the group)
                self.drop_group()  # closes its connections: a peer's collective with this process fails
            entry["t_vote"] = time.time()  # (after any drop of the group)
            committed = self.coordinator.should_commit(quorum, quorum.max_step, ok)  # 5. all or nothing
            if committed:
                if on_commit is not None:
                    on_commit()
                self.step += 1
            if after_attempt is not None:
                after_attempt()
            entry.update(ok=ok, committed=committed, t1=time.time())
            if self.digests and not committed:
                entry["after_discard"] = self.state_digest()
            self.log.append(entry)
            if self.on_entry is not None:
                self.on_entry(entry)
            if committed:
                return value
            failures += 1
            if failures >= MAX_ATTEMPTS:
                raise StepFailedAgain(
                    f"minddp.ft rank {self.slot}: step {self.step} failed {failures} times in a "
                    f"row (last: {last_error}); this is no transient fault, fix its cause"
                )

    # -- 2. the group at the new world size ----------------------------------------------------------

    def rebuild_group(self, quorum: Quorum) -> bool:
        """Drop the old group and wrapper; build a gloo group of the members, heal, wrap. True if healed."""
        self.drop_group()
        store = dist.PrefixStore(f"group/{quorum.tag}", self.coordinator.store)
        dist.init_process_group(
            "gloo",
            store=store,
            rank=quorum.rank,
            world_size=quorum.world,
            timeout=timedelta(seconds=self.hang_s),
        )
        healed = self.heal(quorum)  # 3. before wrap(): DDP broadcasts rank 0's parameters when built, maybe a fresh one
        self.wrap()
        self.group_tag = quorum.tag
        return healed

    def wrap(self) -> None:
        """The ``ddp`` stage on the new group, its gradients averaged through :meth:`collective`."""
        from minddp.ladder import build_stage

        self.ddp = build_stage("ddp", self.model)
        self.ddp.register_comm_hook(None, self.collective)

    def drop_group(self) -> None:
        self.ddp, self.group_tag = None, None
        gc.collect()  # the old wrapper's gradient hooks go with it
        leave_group()

    # -- 3. heal ---------------------------------------------------------------------------------------

    def heal(self, quorum: Quorum) -> bool:
        """Members behind receive (params, optimizer state, step) from the first member at the newest step."""
        if not quorum.behind():
            return False
        source = quorum.members.index(quorum.source())
        if quorum.rank == source:
            payload = self.state_bytes()  # serialized: parameters, optimizer state, count of steps committed
            for slot in quorum.behind():
                peer = quorum.members.index(slot)
                # the group is gloo's by construction (rebuild): its messages live on the CPU
                dist.send(torch.tensor([len(payload)], dtype=torch.int64, device="cpu"), dst=peer)
                dist.send(torch.frombuffer(bytearray(payload), dtype=torch.uint8).to("cpu"), dst=peer)
            return False
        if self.slot not in quorum.behind():
            return False
        size = torch.zeros(1, dtype=torch.int64, device="cpu")
        dist.recv(size, src=source)
        payload = torch.empty(int(size), dtype=torch.uint8, device="cpu")
        dist.recv(payload, src=source)
        self.healed_bytes = int(size)
        self.load_state_bytes(payload.numpy().tobytes())
        return True

    def state_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save(
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step},
            buf,
        )
        return buf.getvalue()

    def load_state_bytes(self, payload: bytes) -> None:
        state = torch.load(io.BytesIO(payload), weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = state["step"]

    # -- 4. the work -----------------------------------------------------------------------------------

    def forward_backward(self, quorum: Quorum, entry: dict) -> float:
        """This member's shard of the global batch; backward averages the gradients over the group."""
        shard = self.task.shard(self.task.global_batch(self.step), quorum.rank, quorum.world)
        loss = self.task.loss(self.ddp, shard, quorum.world)
        self.faults_before_collective()  # peers are now waiting in the all_reduce
        loss.backward()
        entry["loss"] = float(loss.detach())
        return entry["loss"]

    def faults_before_collective(self) -> None:
        """``kill``/``stop`` now (the peers wait in the collective); ``raise`` armed for the collective itself."""
        self.fault_due("kill") or self.fault_due("stop")
        self.raise_in_collective = None if self.plan is None else self.plan.due("raise", self.step, self.slot)

    def collective(self, state, bucket):
        """The ``ddp`` stage's comm hook: plain averaging, or the injected fault ``raise@STEP:SLOT``."""
        self.raise_if_armed()
        return allreduce_hook(state, bucket)

    def raise_if_armed(self) -> None:
        """The fault ``raise@STEP:SLOT`` armed for this step's collective: raised now, once."""
        if self.raise_in_collective is not None:
            index, self.raise_in_collective = self.raise_in_collective, None
            self.plan.fire(index)

    def fault_due(self, kind: str) -> bool:
        index = None if self.plan is None else self.plan.due(kind, self.step, self.slot)
        if index is not None:
            self.plan.fire(index)
        return index is not None

    def state_digest(self) -> str | None:
        """A hash of every byte of the parameters and optimizer state (for the tests' bitwise checks)."""
        if not self.digests:
            return None
        return digest([*self.model.state_dict().values(), *optimizer_tensors(self.optimizer)])


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every value of an optimizer's state (moments, step counts), as tensors, in its order."""
    return [torch.as_tensor(v) for state in optimizer.state_dict()["state"].values() for v in state.values()]


def digest(tensors: list[torch.Tensor]) -> str:
    """A sha256 of every byte of ``tensors``, in order."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
