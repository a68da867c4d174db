"""DiLoCo on the fault-tolerant rung (minddp.ft.diloco), on minddp's coordinator and under torchft's Manager.

One outer sync is one quorum and one commit. The oracle is a single process replaying the syncs that were
committed (``replay``: plain autograd, AdamW and SGD, no minddp code): at sync ``r`` every replica whose round
counted trains its ``H`` inner steps on its shard of the global batches ``r·H .. r·H + H − 1``, a replica healed
at that sync takes its source's inner optimizer state and the synced weights, the pseudo-gradients
(synced − local) are summed and divided by the count of replicas that trained, and the outer SGD (0.7, 0.9,
Nesterov) steps the synced weights. Two replicas: two addends sum the same in either order, so the runs must
equal the replay bit for bit.

* minddp's coordinator, 2 slots, 6 syncs of 3 inner steps: slot 1 is killed at sync 2 while slot 0 waits for it
  in the all_reduce, and started again one commit later; slot 0's all_reduce raises at sync 4. The survivor's
  sync 2 is retried alone with the same pseudo-gradient: its round counts (``replay`` trains it); the returning
  replica is healed with the synced weights, the outer momentum and the inner state, adds nothing to its first
  sync, and is its peer's equal from then on.
* torchft's ``Manager`` and ``LighthouseServer`` on loopback (``tests/ft_torchft.py``): the same task, replica 1
  fails at sync 2 before its all_reduce and starts again; the survivor's retried sync has it healed in it.

Each check is of what the design guarantees (digests of every byte, the sets of syncs), never of timings.
Skipped for torchft when it cannot be imported (``pip install torchft``; docs/fault-tolerance.md).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch

from minddp.ft import ToyTask, launch_ft, parse_faults

SYNCS, H, WORLD = 6, 3, 2
#: As tests/test_ft.py: above the longest a live rank's heartbeat may go unscheduled on a loaded 2-core machine.
HANG_S = 5.0


@pytest.fixture(scope="module")
def run():
    return launch_ft(
        ToyTask(seed=3),
        SYNCS,
        world_size=WORLD,
        faults=parse_faults("kill@2:1,raise@4:0"),
        hang_s=HANG_S,
        digests=True,
        full_world_at=(2, 4),  # each fault's sync first waits for both replicas: every fault meets a full world
        rejoin_before_end=True,
        restart_after_steps=1,  # the killed replica is back only after a sync without it
        run_timeout_s=240,
        diloco={"sync_every": H},
    )


def replay(task: ToyTask, syncs: list[tuple[list[int], list[int]]]) -> dict[int, dict]:
    """One process: ``syncs[r] = (trained, joined)``; each replica's final state, as the runs report it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks: sums that do not depend on the core count
    try:
        weights = [p.detach().clone().requires_grad_(True) for p in task.build_model().parameters()]
        outer = torch.optim.SGD(weights, lr=0.7, momentum=0.9, nesterov=True)
        replicas = {}
        for slot in range(WORLD):
            model = task.build_model()
            replicas[slot] = (model, task.build_optimizer(model))
        for r, (trained, joined) in enumerate(syncs):
            for slot in trained:
                model, inner = replicas[slot]
                for step in range(r * H, (r + 1) * H):
                    inner.zero_grad()
                    task.loss(model, task.shard(task.global_batch(step), slot, WORLD), WORLD).backward()
                    inner.step()
            for slot in joined:  # healed from the first replica at the newest sync: its inner state
                model = task.build_model()
                inner = task.build_optimizer(model)
                inner.load_state_dict(copy.deepcopy(replicas[min(trained)][1].state_dict()))
                replicas[slot] = (model, inner)
            for i, w in enumerate(weights):
                pseudo = [w.detach() - list(replicas[s][0].parameters())[i].detach() for s in sorted(trained + joined)]
                pseudo = [torch.zeros_like(p) if s in joined else p for s, p in zip(sorted(trained + joined), pseudo)]
                w.grad = sum(pseudo[1:], pseudo[0]) / len(trained)
            outer.step()
            for slot in trained + joined:
                with torch.no_grad():
                    for p, w in zip(replicas[slot][0].parameters(), weights):
                        p.copy_(w)
        return {
            slot: {"params": [w.detach() for w in weights], "inner": inner.state_dict(), "outer": outer.state_dict()}
            for slot, (_, inner) in replicas.items()
        }
    finally:
        torch.set_num_threads(threads)


def assert_replayed(state: dict, expected: dict) -> None:
    """A replica's reported state (``replica_state`` and its step) equals the replay's, bit for bit."""
    assert state["step"] == SYNCS
    synced = list(state["diloco"]["synced"].values())
    params = list(state["model"].values())
    for mine, theirs in [(synced, expected["params"]), (params, expected["params"])]:
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))
    for index, slot in expected["outer"]["state"].items():
        assert torch.equal(state["diloco"]["outer"][0]["state"][index]["momentum_buffer"], slot["momentum_buffer"])
    for index, slot in expected["inner"]["state"].items():
        for name, value in slot.items():
            assert torch.equal(torch.as_tensor(state["inner"]["state"][index][name]), torch.as_tensor(value)), name


def committed_syncs(entries: list[tuple[int, dict]]) -> list[tuple[list[int], list[int]]]:
    """(trained, joined) of every committed sync, from the members' log entries."""
    syncs: dict[int, tuple[list[int], list[int]]] = {}
    for slot, e in entries:
        if e["committed"]:
            trained, joined = syncs.setdefault(e["step"], ([], []))
            (joined if e["joined"] else trained).append(slot)
    assert sorted(syncs) == list(range(SYNCS))
    return [(sorted(syncs[r][0]), sorted(syncs[r][1])) for r in range(SYNCS)]


def entries(run) -> list[tuple[int, dict]]:
    return [(slot, e) for slot, _, e in run.entries]


def final(run, slot: int) -> dict:
    return torch.load(io.BytesIO(run.results[slot]["state"]), weights_only=True)


# -- minddp's coordinator -------------------------------------------------------------------------------------


def test_every_sync_is_committed_once_and_the_lost_replica_costs_the_survivor_nothing(run):
    assert all(t is not None for t in run.fired_at), run.report()
    tags = {}
    for _, e in entries(run):
        if e["committed"]:
            tags.setdefault(e["step"], set()).add(e["tag"])
    assert sorted(tags) == list(range(SYNCS)) and all(len(t) == 1 for t in tags.values())
    survivor = [e for slot, e in entries(run) if slot == 0 and e["step"] == 2]
    assert [e["committed"] for e in survivor] == [False, True]  # the sync the kill broke, tried again at once ...
    assert survivor[-1]["members"] == [0] and survivor[-1]["participants"] == 1  # ... alone, with its own round
    assert committed_syncs(entries(run))[2] == ([0], [])


def test_the_returning_replica_is_healed_and_adds_nothing_to_its_first_sync(run):
    back = [e for slot, inc, e in run.entries if slot == 1 and inc > 0]
    assert back and back[0]["healed"]  # its first attempt received the state
    first_commit = next(e for e in back if e["committed"])
    assert first_commit["joined"] and first_commit["participants"] == 1  # the survivor's round only
    assert all(not e["joined"] for e in back[back.index(first_commit) + 1 :])


def test_members_hold_the_same_synced_weights_and_outer_state_at_every_sync(run):
    by_attempt = {}
    for slot, e in entries(run):
        if e.get("before") is not None:
            by_attempt.setdefault((e["tag"], e["step"]), {})[slot] = e["before"]
    assert any(len(d) == 2 for d in by_attempt.values())
    assert all(len(set(d.values())) == 1 for d in by_attempt.values()), by_attempt
    discarded = [e for _, e in entries(run) if not e["committed"] and e.get("before") is not None]
    assert discarded and all(e["after_discard"] == e["before"] for e in discarded)  # a discard changes nothing


def test_matches_a_single_process_replaying_the_committed_syncs(run):
    syncs = committed_syncs(entries(run))
    assert any(len(trained) == 1 for trained, _ in syncs) and any(joined for _, joined in syncs)
    expected = replay(ToyTask(seed=3), syncs)
    for slot in range(WORLD):
        assert_replayed(final(run, slot), expected[slot])


# -- torchft's Manager ------------------------------------------------------------------------------------------


def test_the_same_sync_under_torchfts_manager_and_lighthouse():
    pytest.importorskip("torchft", reason="torchft is not installed (pip install torchft)")
    from ft_torchft import run_manager_diloco

    replicas = run_manager_diloco(ToyTask(seed=3), SYNCS, H, fail_at=2)
    logs = [
        (slot, {"step": s, "joined": joined, "committed": c})
        for slot, r in enumerate(replicas)
        for s, _, joined, c in r["log"]
    ]
    syncs = committed_syncs(logs)
    assert syncs[2] == ([0], [1])  # the survivor's retried sync: its round, the returning replica healed in it
    assert [s for s, _, _, c in replicas[0]["log"] if not c] == [2]  # the one attempt the failure broke
    expected = replay(ToyTask(seed=3), syncs)
    for slot in range(WORLD):
        assert_replayed(replicas[slot]["state"], expected[slot])
