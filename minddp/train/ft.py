"""``python -m minddp.train --stage ft [--inject FAULTS]``: the train command's run, fault-tolerant.

:class:`TrainTask` gives the rung (:mod:`minddp.ft.rung`) the train
command's model, AdamW and the global batch of any step (the same examples
the other stages see, by step number); :func:`run_ft_stage` launches it
(:func:`minddp.ft.launch.launch_ft`), prints one line per fault, and returns
the row the summary table expects. Accuracy is measured in this process on
the final state (every rank's is the same, bit for bit). The loss of a step
is the mean of its members' weighted shard losses as they reported them (a
member killed later may not have reported its share: then the others' mean).
"""

from __future__ import annotations

import io

import torch

from minddp.ft.faults import parse_faults
from minddp.ft.launch import launch_ft


class TrainTask:
    """The train command's classifier and data, as a task of the rung."""

    def __init__(self, cfg, data):
        self.cfg, self.data = cfg, data
        self.batch = cfg.batch_size * cfg.world_size  # the global batch: the same whatever the world
        self._batches, self._next = None, None

    def build_model(self):
        from minddp.train.models import build_model

        model = build_model(self.cfg.model, self.data.vocab_size, self.data.pad_token_id, self.cfg.seed, self.cfg.dtype)
        model.train()
        return model

    def build_optimizer(self, model):
        return torch.optim.AdamW(model.parameters(), lr=self.cfg.lr)

    def global_batch(self, step: int) -> dict:
        from minddp.train.data import step_batches

        if self._next != step:  # a heal jumps ahead: start the stream at that step
            self._batches = step_batches(
                self.data.train, self.batch, 1, 1, 0, self.cfg.seed, self.data.pad_token_id, start_step=step
            )
        self._next = step + 1
        return next(self._batches)[0]

    def shard(self, batch: dict, rank: int, world: int):
        n = len(batch["labels"])
        lo, hi = rank * n // world, (rank + 1) * n // world
        return {k: v[lo:hi] for k, v in batch.items()}, n

    def loss(self, model, shard, world: int) -> torch.Tensor:
        rows, total = shard
        return model(**rows).loss * (len(rows["labels"]) * world / total)  # mean over shards = global mean

    def __getstate__(self):
        return {**self.__dict__, "_batches": None, "_next": None}


def run_ft_stage(cfg, data, folder: str, say) -> dict:
    """Train through ``cfg.inject``; one line per fault; the summary row of the train command."""
    from minddp.train.data import held_out

    hang_s = cfg.hang_timeout or 10.0
    run = launch_ft(
        TrainTask(cfg, data),
        cfg.steps,
        world_size=cfg.world_size,
        faults=parse_faults(cfg.inject),
        hang_s=hang_s,
        run_timeout_s=max(600.0, 60.0 * cfg.steps),
    )
    for line in run.report():
        say(f"fault {line}")
    committed = {}
    for slot, _, e in run.entries:
        if e["committed"]:
            committed.setdefault(e["step"], []).append(e)
    losses = [sum(e["loss"] for e in committed[s]) / len(committed[s]) for s in sorted(committed)]
    times = [min(e["t1"] for e in committed[s]) - max(e["t0"] for e in committed[s]) for s in sorted(committed)]
    any_slot = next(iter(run.results.values()))
    task = TrainTask(cfg, data)
    model = task.build_model()
    model.load_state_dict(torch.load(io.BytesIO(any_slot["state"]), weights_only=True)["model"])
    final = held_out(model, data.eval, 1, 0, torch.device("cpu"), data.pad_token_id)
    discarded = sum(1 for e in run.events if e[0] == "decision" and e[3] == "discard")
    say(
        f"stage ft: {len(committed)} steps committed, {discarded} attempt(s) discarded, "
        f"{len(run.faults)} fault(s), "
        f"{run.wall_s:.1f} s"
    )
    return {
        "stage": "ft",
        "losses": losses,
        "step_times_s": times,
        "accuracy": final["accuracy"],
        "evals": [{"step": len(losses), **final}],
        "all_reduce_calls": [],
        "all_reduce_bytes": [],
        "global_batch": task.batch,
        "ranks": cfg.world_size,
        "trace": None,
        "metered": False,
        "folder": folder,
        "bucket_cap_mb": None,
        "bucket_cap_why": None,
        "trace_errors": {},
        "memory": None,
        "faults": run.report(),
    }
