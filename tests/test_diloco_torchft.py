"""minddp's ``LocalSGD`` and ``DiLoCo`` beside torchft's own (the reference), on the same task: the same
parameters, bit for bit, after several outer syncs, streaming with fragments, τ and α included.

torchft runs as its tests run it (``tests/diloco_torchft.py``: two replica groups in threads, a Manager
each, a lighthouse on loopback); minddp on 2 ranks over gloo. Both start from the same seed, train each
replica on the same batches with AdamW, and must end equal: torchft averages with ``sum / 2`` and minddp
with ``sum of halves``, the same float (halving is exact), and every other operation is the same one on
the same values. torchft is given one outer optimizer per fragment (its tests' form; one over the whole
model would also step the other fragments with their inner gradients), minddp one over the whole model,
which it steps one fragment at a time (``minddp.diloco.diloco``'s docstring). Skipped when torchft cannot be
imported (``pip install torchft``).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from diloco_torchft import build_inner, build_model, inner_step

from minddp import DiLoCo, LocalSGD, launch
from minddp.diloco import OUTER_DEFAULTS

torchft = pytest.importorskip("torchft", reason="torchft is not installed (pip install torchft)")

STEPS, SYNC_EVERY = 18, 6
#: (name, torchft's kind, minddp's DiLoCo options): plain DiLoCo, streaming without and with τ and α.
CASES = [
    ("local-sgd", "local_sgd", None),
    ("diloco", "diloco", dict(fragments=1)),
    ("streaming", "diloco", dict(fragments=3)),
    ("streaming-delay-alpha", "diloco", dict(fragments=3, fragment_sync_delay=1, fragment_update_alpha=0.5)),
]


def ours(cases: list) -> dict:
    torch.set_num_threads(1)  # as the torchft run: the same kernels, the same sums
    rank, out = dist.get_rank(), {}
    for name, _, options in cases:
        model = build_model()
        inner = build_inner(model)
        if options is None:
            rung = LocalSGD(model, inner, SYNC_EVERY)
        else:
            rung = DiLoCo(model, inner, None, SYNC_EVERY, **options)
        with rung:
            for step in range(STEPS):
                inner_step(model, inner, step, rank)
        out[name] = {"params": [p.detach().clone() for p in model.parameters()], "syncs": rung.syncs}
    return out


@pytest.fixture(scope="module")
def minddp_runs():
    return launch(ours, CASES, world_size=2, timeout_s=180)


@pytest.mark.parametrize("name, kind, options", CASES, ids=[c[0] for c in CASES])
def test_same_parameters_as_torchft(minddp_runs, name, kind, options):
    from diloco_torchft import run_torchft

    options = dict(options or {})  # minddp's fragments=3 is torchft's three layers as modules (equal sizes)
    fragments = options.get("fragments", 1)
    reference = run_torchft(kind, STEPS, SYNC_EVERY, dict(OUTER_DEFAULTS), **options)
    syncs = STEPS // SYNC_EVERY * fragments
    start = list(build_model().parameters())
    for replica, theirs in enumerate(reference):
        assert theirs["commits"] == syncs  # torchft synced as often as minddp's schedule says
        mine = minddp_runs[replica][name]
        assert mine["syncs"] == syncs
        assert all(torch.equal(a, b) for a, b in zip(mine["params"], theirs["params"])), f"{name}, replica {replica}"
        assert all(not torch.equal(a, b) for a, b in zip(mine["params"], start))  # they trained
