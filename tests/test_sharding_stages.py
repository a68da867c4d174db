"""``zero2`` and FSDP train exactly like one process on the global batch, and leave the gradients they promise.

Oracle 1: a single process on the global batch with the same optimizer (for
``compute_dtype``, one that casts every weight the same way for its forward,
through ``torch.func.functional_call``, and steps fp32 weights). Oracle 2:
``bucket-async`` in the same launch: at 2 ranks every sum is exact, so
``zero2`` (which averages the very same numbers, only laid out otherwise)
must equal it to the bit. Every rank starts from different weights, so only
the broadcast and the all-gathers can make the runs agree.

One launch per world size runs every case and returns what the tests check.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import toy_models

from minddp import FullyShardedDataParallel, launch
from minddp.ladder import build_stage, options_for
from minddp.ladder.loop import train_step
from minddp.sharding.fsdp import blocks_of
from minddp.sharding.shards import chunk_range, chunk_size

STEPS, ROWS = 4, 4
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
}
#: name -> (stage, units or compute dtype); the units: per Linear, per block, the whole model as one.
VARIANTS = {
    "zero2": ("zero2", None),
    "fsdp-one": ("fsdp", None),
    "fsdp-units": ("fsdp", "units"),
    "bucket-async": ("bucket-async", None),
}
CASES = [
    ("mlp", 1, "adamw"),
    ("mlp", 3, "sgd"),
    ("tied", 1, "adamw"),
    ("tied", 3, "adamw"),
    ("llama", 1, "adamw"),
    ("llama", 3, "sgd"),
]
DTYPE_CASES = [("mlp", torch.float16), ("mlp", torch.bfloat16), ("tied", torch.float16), ("llama", torch.bfloat16)]
#: At 3 ranks (uneven chunks, sums in another order) a subset, to keep the suite fast.
CASES_3 = [("mlp", 1, "adamw"), ("tied", 3, "adamw"), ("llama", 1, "adamw")]
DTYPE_CASES_3 = [("mlp", torch.bfloat16), ("tied", torch.float16)]


def cases(world: int):
    return (CASES, DTYPE_CASES) if world == 2 else (CASES_3, DTYPE_CASES_3)


def units_of(model_name: str, model):
    return torch.nn.Linear if model_name in ("mlp", "tied") else blocks_of(model)


def wrap(variant: str, model_name: str, model, compute_dtype=None):
    stage, units = VARIANTS[variant]
    if stage == "fsdp":
        return FullyShardedDataParallel(
            model, shard=units_of(model_name, model) if units else None, compute_dtype=compute_dtype
        )
    return build_stage(stage, model, **options_for(stage, bucket_cap_mb=0.001))


def full_flat(wrapped, model) -> torch.Tensor:
    """Every parameter whole, in the unwrapped model's order (the sharded stages all-gather them)."""
    full = wrapped.full_parameters() if hasattr(wrapped, "full_parameters") else dict(model.named_parameters())
    return torch.cat([full[name].detach().reshape(-1).clone() for name, _ in model.named_parameters()])


def gradient_report(wrapped, model) -> list[tuple]:
    """After finish: (name, has grad, grad dtype == param dtype, grad shape == param shape, replicated, grad)."""
    sharded = {id(s) for u in getattr(wrapped, "units", []) for s in u.shards} | {
        id(s) for s in getattr(wrapped, "shard", {}).values()
    }
    return [
        (
            name,
            p.grad is not None,
            p.grad is not None and p.grad.dtype == p.dtype,
            p.grad is not None and p.grad.shape == p.shape,
            id(p) not in sharded,
            None if p.grad is None else p.grad.detach().clone(),
        )
        for name, p in model.named_parameters()
        if p.requires_grad
    ]


def train(model_name, accum, opt_name, variant, compute_dtype=None) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = toy_models.build(model_name, 100 + rank)
    wrapped = wrap(variant, model_name, model, compute_dtype)
    optimizer = OPTIMIZERS[opt_name](model.parameters())  # after wrapping: the shards
    grads = None
    for step, batch in enumerate(toy_models.global_batches(model_name, STEPS, ROWS * world * accum)):
        micro = [toy_models.shard(toy_models.shard(batch, m, accum), rank, world) for m in range(accum)]
        if step == STEPS - 1:  # look at the gradients of the last step before the optimizer takes them
            original = optimizer.step

            def step_and_look():
                nonlocal grads
                grads = gradient_report(wrapped, model)
                original()

            optimizer.step = step_and_look
        train_step(wrapped, optimizer, micro, toy_models.loss_fn)
    return {"final": full_flat(wrapped, model), "grads": grads}


def hooked_gradients(stage: str) -> dict:
    """One backward of the MLP through each hook's reduce-scatter form; every shard's gradient, gathered whole."""
    from minddp.ladder import wrap as wrap_in_stage

    rank, world = dist.get_rank(), dist.get_world_size()
    batch = toy_models.global_batches("mlp", 1, ROWS * world)[0]
    out = {}
    for hook in ("allreduce", "fp16", "bf16", "noop"):
        model = toy_models.build("mlp", 100)
        wrapped = wrap_in_stage(stage, model, hook=hook, bucket_cap_mb=0.001)
        toy_models.loss_fn(wrapped, toy_models.shard(batch, rank, world)).backward()
        wrapped.finish_gradient_synchronization()
        grads = []
        for p in model.parameters():
            pieces = [torch.empty(chunk_size(p_full_numel(wrapped, p), world)) for _ in range(world)]
            dist.all_gather(pieces, torch.nn.functional.pad(p.grad, (0, pieces[0].numel() - p.grad.numel())))
            grads.append(torch.cat(pieces)[: p_full_numel(wrapped, p)])
        out[hook] = torch.cat(grads)
    return out


def p_full_numel(wrapped, shard) -> int:
    for unit in getattr(wrapped, "units", []):
        for s, n in zip(unit.shards, unit.numels):
            if s is shard:
                return n
    return next(full.numel() for full, s in wrapped.shard.items() if s is shard)


def rank_main(world: int) -> dict:
    out = {}
    plain, dtypes = cases(world)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for case in plain:
            for variant in VARIANTS:
                out[(variant,) + case] = train(*case, variant)
        for model_name, dtype in dtypes:
            for variant in ("fsdp-one", "fsdp-units"):
                out[(variant, model_name, dtype)] = train(model_name, 1, "sgd", variant, compute_dtype=dtype)
        out["hooks"] = {stage: hooked_gradients(stage) for stage in ("zero2", "fsdp")}
    out["warnings"] = [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]
    return out


def single_process(model_name: str, accum: int, opt_name: str, world: int, dtype=None) -> torch.Tensor:
    """The reference: rank 0's weights, the global batch; with ``dtype``, every weight cast for the forward.

    A 16-bit backward rounds the gradient it computes, so data parallelism in
    16 bits averages each rank's *rounded* gradient, by design; the reference
    then runs each rank's shard through its own backward (as
    ``test_stages_equivalence`` does for BatchNorm) and averages them in fp32.
    """
    model = toy_models.build(model_name, 100)
    optimizer = OPTIMIZERS[opt_name](model.parameters())

    def forward(x):
        if dtype is None:
            return model(x)
        cast = {n: p.to(dtype) for n, p in model.named_parameters()}
        return torch.func.functional_call(model, cast, (x.to(dtype) if x.is_floating_point() else x,))

    for batch in toy_models.global_batches(model_name, STEPS, ROWS * world * accum):
        for m in range(accum):
            micro = toy_models.shard(batch, m, accum)
            if dtype is None:
                (toy_models.loss_fn(forward, micro) / accum).backward()
            else:  # 16-bit gradients are rounded per backward: each rank's shard on its own, as DP does
                params = [p for p in model.parameters() if p.requires_grad]
                for r in range(world):
                    loss = toy_models.loss_fn(forward, toy_models.shard(micro, r, world)) / accum
                    for p, g in zip(params, torch.autograd.grad(loss, params)):  # fp32: the casts' backward
                        p.grad = g / world if p.grad is None else p.grad + g / world
        optimizer.step()
        optimizer.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"{w}ranks")
def runs(request):
    world = request.param
    return world, launch(rank_main, world, world_size=world, timeout_s=400)


def test_sharded_stages_match_single_process_and_keep_ranks_identical(runs):
    world, per_rank = runs
    for case in cases(world)[0]:
        reference = single_process(*case, world)
        ddp_error = (per_rank[0][("bucket-async",) + case]["final"] - reference).abs().max()
        for variant in VARIANTS:
            finals = [r[(variant,) + case]["final"] for r in per_rank]
            assert all(torch.equal(finals[0], f) for f in finals[1:]), f"{variant} {case}: ranks differ"
            error = (finals[0] - reference).abs().max()
            # As tight as the DDP stages: within their own test's tolerance, or no further off than bucket-async.
            assert torch.allclose(finals[0], reference, rtol=1e-5, atol=1e-6) or error <= 1.5 * ddp_error, (
                f"{variant} {case}: {error:.3g} from single-process training (bucket-async: {ddp_error:.3g})"
            )
        if world == 2:  # two addends sum alike in any order: zero2 averages bucket-async's very numbers
            assert torch.equal(per_rank[0][("zero2",) + case]["final"], per_rank[0][("bucket-async",) + case]["final"])


def test_fsdp_compute_dtype_matches_a_single_process_casting_the_same_way(runs):
    world, per_rank = runs
    for model_name, dtype in cases(world)[1]:
        # SGD: an update in proportion to the gradient (Adam divides by the gradient's own scale, so the
        # last-bit difference of a near-zero 16-bit gradient, summed in another order, can become a whole step).
        reference = single_process(model_name, 1, "sgd", world, dtype=dtype)
        for variant in ("fsdp-one", "fsdp-units"):
            final = per_rank[0][(variant, model_name, dtype)]["final"]
            assert final.dtype == torch.float32  # the master weights stay fp32
            assert (final - reference).abs().max() <= 1e-4, (
                f"{variant} {model_name} {dtype}: {(final - reference).abs().max():.3g}"
            )


def test_gradients_after_finish_are_present_in_master_dtype_shaped_like_the_shard(runs):
    world, per_rank = runs
    keys = [k for k in per_rank[0] if isinstance(k, tuple)]
    for key in keys:
        reports = [r[key]["grads"] for r in per_rank]
        for i, (name, present, master_dtype, shaped, replicated, grad) in enumerate(reports[0]):
            assert present and master_dtype and shaped, (key, name, present, master_dtype, shaped)
            if replicated:
                assert all(torch.equal(grad, r[i][5]) for r in reports[1:]), f"{key} {name}: replicated grads differ"


def test_no_warnings(runs):
    _, per_rank = runs
    assert all(r["warnings"] == [] for r in per_rank), per_rank[0]["warnings"]


def test_sharded_stages_take_the_reduce_scatter_form_of_each_stateless_hook(runs):
    """fp16/bf16 within their precision of the global-batch gradient (as test_hooks_stages asks of the DDP
    stages); allreduce to float rounding; noop (zero2): this rank's own gradient divided by the world size
    (nothing sent, nothing added). FSDP's noop gathers nothing either, so it computes with its own shard
    repeated in place of the weights: a timing limit only, nothing to compare."""
    world, per_rank = runs
    model = toy_models.build("mlp", 100)
    batch = toy_models.global_batches("mlp", 1, ROWS * world)[0]
    toy_models.loss_fn(model, batch).backward()
    global_grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    for stage in ("zero2", "fsdp"):
        for hook, tol in (("allreduce", 1e-6), ("fp16", 2e-3), ("bf16", 2e-2)):
            got = per_rank[0]["hooks"][stage][hook]
            torch.testing.assert_close(got, global_grad, rtol=tol, atol=tol * 0.1, msg=f"{stage} {hook}")
        if stage == "fsdp":
            continue
        own = []  # each rank's chunk of its own gradient, / world
        for rank in range(world):
            local = toy_models.build("mlp", 100)
            toy_models.loss_fn(local, toy_models.shard(batch, rank, world)).backward()
            own.append([p.grad.reshape(-1) / world for p in local.parameters()])
        expected = torch.cat(
            [
                torch.cat([own[r][i][slice(*chunk_range(g.numel(), world, r))] for r in range(world)])
                for i, g in enumerate(own[0])
            ]
        )
        assert torch.equal(per_rank[0]["hooks"][stage]["noop"], expected), stage


def test_a_hook_without_a_reduce_scatter_form_is_refused_before_any_rank(capsys):
    from minddp.train import run as train

    assert train.main(["--stage", "fsdp", "--hook", "powersgd", "--steps", "1"]) == 2
    assert "has no reduce-scatter form" in capsys.readouterr().err
