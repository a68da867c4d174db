"""The same toy task and fault under torchft's Manager + DDP + Optimizer (gloo, CPU), as its own tests run it.

Two replica groups of one rank each, in threads of this process (torchft's
``manager_integ_test`` does the same). Replica 1 raises at step ``fail_at``
(torchft's ``InjectedFailure`` pattern) and starts again with a fresh model
and Manager, which heals it from replica 0 through torchft's checkpoint
transport. Each replica records, for every step torchft committed, how many
replicas took part: the single-process replay of those world sizes is then
the oracle for torchft as for minddp.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch


class InjectedFailure(Exception):
    pass


def run_torchft(
    task,
    steps: int,
    fail_at: int,
    fail_replica: int = 1,
    num_replicas: int = 2,
    use_ddp: bool = True,
    join_timeout_ms: int = 2000,
) -> dict:
    """``use_ddp``: torchft's DistributedDataParallel; else each gradient through ``manager.allreduce``.
    ``join_timeout_ms``: how long torchft's lighthouse waits for replicas to join a quorum."""
    from torchft import DistributedDataParallel, Optimizer
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=join_timeout_ms)
    init_lock = threading.Lock()
    # Both replicas' Managers exist, and heartbeat, before either asks for its first quorum: the lighthouse then
    # waits for both (join_timeout_ms) and step 0 has both. Else a replica built first could commit step 0 alone
    # and the other, joining at step 1, be healed from it: a survivor that never ran step 0 (seen once under load).
    built = threading.Barrier(num_replicas)
    failed = {"done": False, "at": None}

    def replica_main(replica_id: int, first: bool) -> dict:
        with init_lock:
            model = task.build_model()
        optimizer = task.build_optimizer(model)
        pg, manager = replica_manager(
            replica_id,
            lighthouse,
            state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()},
            load_state_dict=lambda sd: (
                model.load_state_dict(sd["model"]),
                optimizer.load_state_dict(sd["optim"]),
            ),
            min_replica_size=1,
            pg_timeout_s=5,
        )
        try:
            if first:
                built.wait(timeout=60)
                time.sleep(0.5)  # five heartbeat intervals (the Manager's default, 100 ms) for both to be heard
            ddp = DistributedDataParallel(manager, model) if use_ddp else model
            opt = Optimizer(manager, optimizer)
            worlds, t_commit, attempts = {}, {}, {}
            while manager.current_step() < steps:
                opt.zero_grad()  # the quorum (and a heal) happen here
                step, world = manager.current_step(), manager.num_participants()
                attempts[step] = attempts.get(step, 0) + 1
                rank = manager.participating_rank()
                loss = task.loss(ddp, task.shard(task.global_batch(step), rank, world), world)
                if replica_id == fail_replica and step == fail_at and not failed["done"]:
                    failed["done"], failed["at"] = True, time.time()
                    raise InjectedFailure(f"replica {replica_id} fails at step {step}")
                loss.backward()
                if not use_ddp:  # the Manager's own average (sum / participants)
                    for work in [manager.allreduce(p.grad) for p in model.parameters()]:
                        work.wait()
                opt.step()  # should_commit, then the step if committed
                if manager.current_step() > step:
                    worlds[step], t_commit[step] = world, time.time()
            return {
                "worlds": worlds,
                "t_commit": t_commit,
                "attempts": attempts,
                "state": {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": manager.current_step(),
                },
            }
        finally:
            pg.abort()  # as a process that died: its connections close, peers fail at once
            manager.shutdown(wait=False)

    results = in_threads(replica_main, num_replicas, lighthouse)
    return {"replicas": results, "failed_at": failed["at"]}


def run_manager_diloco(task, syncs: int, sync_every: int, fail_at: int, fail_replica: int = 1, world: int = 2):
    """minddp's DiLoCo with its syncs under torchft's Manager (:class:`minddp.ft.manager.ManagerDiLoCo`): each
    replica trains its shard of every global batch of ``task``; replica ``fail_replica`` raises at sync ``fail_at``
    before its all_reduce (its peer then waits in it) and starts again, fresh, healed at the next sync.

    The lighthouse waits for both replicas before every quorum (``min_replicas=2``): no sync is ever committed by
    two quorums of one replica each, whatever the threads' speed; the survivor's retried sync has the returning
    replica in it, healed, adding nothing. Returns each replica's log (every incarnation's attempts:
    ``(sync, members, joined, committed)``) and final state.
    """
    from torchft.coordination import LighthouseServer

    from minddp.ft.diloco import replica_state, sync_now
    from minddp.ft.manager import ManagerDiLoCo

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=30000)
    init_lock, failed = threading.Lock(), {"done": False}
    logs = {replica_id: [] for replica_id in range(world)}  # every incarnation's attempts, the failed one's too

    def fault(replica_id: int, sync: int) -> None:
        if replica_id == fail_replica and sync == fail_at and not failed["done"]:
            failed["done"] = True
            raise InjectedFailure(f"replica {replica_id} fails at sync {sync}")

    def replica_main(replica_id: int, first: bool) -> dict:
        with init_lock:
            model = task.build_model()
        inner = task.build_optimizer(model)
        pg, manager = replica_manager(
            replica_id, lighthouse, None, None, min_replica_size=1, pg_timeout_s=5, init_sync=False
        )
        rung = None
        try:
            rung = ManagerDiLoCo(
                manager,
                model,
                inner,
                None,
                sync_every,
                joining=not first,
                before_collective=lambda sync: fault(replica_id, sync),
            )
            if not first:
                sync_now(rung.diloco)  # healed at the survivor's next sync (its retry of the failed one)
            while manager.current_step() < syncs:
                shard = task.shard(task.global_batch(rung.diloco.steps), replica_id, world)
                inner.zero_grad()
                task.loss(model, shard, world).backward()
                inner.step()  # every sync_every-th: the sync, under the Manager
            return {"state": {**replica_state(model, inner, rung.diloco), "step": manager.current_step()}}
        finally:
            logs[replica_id].extend([] if rung is None else rung.log)
            pg.abort()  # as a process that died: its connections close, peers fail at once
            manager.shutdown(wait=False)

    results = in_threads(replica_main, world, lighthouse)
    return [{**result, "log": logs[replica_id]} for replica_id, result in enumerate(results)]


def in_threads(replica_main, num_replicas: int, lighthouse) -> list:
    """``replica_main(replica_id, first)`` of each replica in a thread of its own (one torch thread, as a rank);
    one that raises :class:`InjectedFailure` starts again (``first=False``), as a restarted replica group.
    The lighthouse is shut down at the end."""

    def replica(replica_id: int):
        attempts = 0
        while True:
            attempts += 1
            try:
                return replica_main(replica_id, first=attempts == 1)
            except InjectedFailure:
                if attempts > 3:
                    raise

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(max_workers=num_replicas) as pool:
            return list(pool.map(replica, range(num_replicas)))
    finally:
        torch.set_num_threads(threads)
        lighthouse.shutdown()


def replica_manager(
    replica_id: int,
    lighthouse,
    state_dict,
    load_state_dict,
    min_replica_size: int,
    pg_timeout_s: float = 5,
    timeout_s: float = 10,
    **options,
):
    """``(process group, Manager)`` of one replica group of one rank, as torchft's integration tests build them:
    gloo, its own store on loopback, the lighthouse's address, synchronous quorums; ``options`` for the Manager."""
    from torchft import Manager, ProcessGroupGloo

    store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupGloo(timeout=timedelta(seconds=pg_timeout_s))
    manager = Manager(
        pg=pg,
        min_replica_size=min_replica_size,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=str(replica_id),
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse.address(),
        use_async_quorum=False,
        timeout=timedelta(seconds=timeout_s),
        quorum_timeout=timedelta(seconds=3 * timeout_s),
        connect_timeout=timedelta(seconds=timeout_s),
        **options,
    )
    manager.minddp_store = store  # the store lives as long as the Manager
    return pg, manager


def side_by_side(runs: int, join_timeouts_ms: list[int], steps: int = 8, fail_at: int = 3) -> None:
    """The recovery (docs/fault-tolerance.md: from the fault to the commit of its step) of the test's fault under
    torchft, for each lighthouse join timeout, and under minddp (``kill@3:1``), ``runs`` times each, alternating."""
    import statistics

    from minddp.ft import ToyTask, fault_outcomes, launch_ft, parse_faults

    seen: dict[str, list[float]] = {}
    for _ in range(runs):
        for ms in join_timeouts_ms:
            out = run_torchft(ToyTask(seed=3), steps, fail_at=fail_at, use_ddp=False, join_timeout_ms=ms)
            survivor = out["replicas"][0]
            seen.setdefault(f"torchft, join_timeout_ms={ms}", []).append(
                survivor["t_commit"][fail_at] - out["failed_at"]
            )
        ours = launch_ft(
            ToyTask(seed=3),
            steps,
            world_size=2,
            faults=parse_faults(f"kill@{fail_at}:1"),
            hang_s=5.0,
            full_world_at=(fail_at,),
            rejoin_before_end=True,
            run_timeout_s=120,
        )
        seen.setdefault("minddp, kill@3:1", []).append(fault_outcomes(ours)[0].recovery_s)
    for name, values in seen.items():
        print(f"{name}: {', '.join(f'{v:.2f}' for v in values)} s (median {statistics.median(values):.2f} s)")


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description=side_by_side.__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--join-timeout-ms", type=int, nargs="+", default=[2000, 200])
    args = p.parse_args()
    side_by_side(args.runs, args.join_timeout_ms)
