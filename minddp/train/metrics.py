"""The metrics file: a stage's per-step loss and its held-out evaluations, one JSON object a line.

``<trace-dir>/<run-name>/<stage>/metrics.jsonl``, beside the stage's traces and ``config.json``, is
written by the train command when the stage has finished (every stage, ``single`` and ``ft`` too), so
that loss curves can be drawn and compared without running again: ``pandas.read_json(path,
lines=True)`` reads it, as does any JSON-lines reader. Two kinds of line, in step order:

* ``{"kind": "step", "step": n, "loss": ..., "time_s": ..., "bytes": ..., "calls": ..., "outer_syncs": ...}``:
  optimizer step ``n`` (1 = the first); its training loss (the mean over the ranks of each rank's
  mean over its shard: the loss of the global batch); rank 0's wall time of the step, and the bytes
  and collectives its comm hooks sent during it (``null`` where nothing was metered: torch's DDP
  without a link, ``ft``; and for the steps before a ``--resume``); the outer syncs the slow-link
  rung has completed by the end of it (``--stage local-sgd`` and ``diloco``; ``null`` for the others);
* ``{"kind": "eval", "step": n, "loss": ..., "accuracy": ..., "examples": ...}``: the held-out
  split measured after step ``n`` (every ``--eval-every`` steps, and at the end): its mean
  cross-entropy, its accuracy, and over how many examples (``--eval-examples``).

``docs/analysis.md`` ("The metrics file") has the same table.

Example::

    >>> result = {"losses": [0.7, 0.6], "first_step": 0, "step_times_s": [0.1, 0.1], "all_reduce_bytes": [40, 0],
    ...           "all_reduce_calls": [1, 0], "metered": True, "outer_syncs": [1, 1],
    ...           "evals": [{"step": 2, "loss": 0.65, "accuracy": 0.5, "examples": 8}]}
    >>> for line in metric_lines(result):
    ...     print(line)
    {"kind": "step", "step": 1, "loss": 0.7, "time_s": 0.1, "bytes": 40, "calls": 1, "outer_syncs": 1}
    {"kind": "step", "step": 2, "loss": 0.6, "time_s": 0.1, "bytes": 0, "calls": 0, "outer_syncs": 1}
    {"kind": "eval", "step": 2, "loss": 0.65, "accuracy": 0.5, "examples": 8}
"""

from __future__ import annotations

import json

from minddp.runtime.profiling import write_text

#: The file's name in the stage's folder.
FILENAME = "metrics.jsonl"


def metric_lines(result: dict) -> list[str]:
    """The file's lines for one stage's result (what its rank 0 returned): the steps, then each evaluation
    placed after the step it followed."""
    first = result.get("first_step", 0)
    metered = result.get("metered", False)
    syncs = result.get("outer_syncs") or []
    rows = []
    for n, loss in enumerate(result["losses"], start=1):
        i = n - 1 - first  # this run's index of step n (negative: a step before the resume)
        ran = 0 <= i < len(result["step_times_s"])
        rows.append(
            {
                "kind": "step",
                "step": n,
                "loss": loss,
                "time_s": result["step_times_s"][i] if ran else None,
                "bytes": result["all_reduce_bytes"][i] if ran and metered else None,
                "calls": result["all_reduce_calls"][i] if ran and metered else None,
                "outer_syncs": syncs[i] if ran and i < len(syncs) else None,
            }
        )
    for evaluation in result.get("evals") or []:
        rows.insert(evaluation["step"] + sum(1 for r in rows if r["kind"] == "eval"), {"kind": "eval", **evaluation})
    return [json.dumps(row) for row in rows]


def write_metrics(path: str, result: dict) -> None:
    """Write the metrics file of ``result`` to ``path``, atomically (whole, or not there)."""
    write_text(path, "".join(line + "\n" for line in metric_lines(result)))
