"""The slow-link rungs (``minddp.LocalSGD``, ``minddp.DiLoCo``) against independent oracles, on 2 ranks over gloo.

* H = 1, inner SGD, outer SGD(lr=1, momentum=0): DiLoCo is DDP with SGD, step by step (the ``ddp`` stage);
* outer SGD(lr=1, momentum=0) with any H: DiLoCo is parameter averaging (torch's ``PostLocalSGDOptimizer``
  around a ``PeriodicModelAverager``), and so is ``LocalSGD``, bit for bit (the same flat average);
* the pseudo-gradient goes through the comm hook: with the fp16 hook it travels in 16 bits (a metered
  ``Wire`` counts half the bytes) and the result is a single-process replay that averages it in fp16;
* a state saved mid-run, a fragment in flight, and loaded into a fresh model goes on bit for bit;
* the schedule: which fragment leaves and lands at which inner step.

torchft's own ``LocalSGD`` and ``DiLoCo`` are the oracle of ``tests/test_diloco_torchft.py``. The refusals
(item 9 of issue 50) are here too: one line each, on every rank, before anything is sent.

**Tolerances** (DiLoCo vs DDP and vs averaging are equal in exact arithmetic, not in floats; both run
in float64 so that the bound is far below any algorithmic difference). Per step DiLoCo rounds at most
four times more than its oracle (the inner step's ``θ − η·g``, the pseudo-gradient ``θ − l``, the sum
of the halves, the outer ``θ − mean``), each within u·M (u = 2⁻⁵³, M the largest |parameter|), so
each step adds at most ε = 6·u·M to the gap. A gap d at one step grows through the next step's
gradient by at most (1 + η·L) (L the gradient's Lipschitz constant, η·L ≤ 1 here: a 3-layer tanh
network, inputs of unit scale, η ≤ 0.1), so after S steps the gap is at most ε·S·2^S. That is the
tolerance: about 10⁻¹³ here, where a missed sync, a wrong sign or a wrong divisor moves the
parameters by 10⁻³ or more.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.distributed as dist
from diloco_torchft import batch, build_model, inner_step
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.distributed.optim import PostLocalSGDOptimizer

from minddp import DiLoCo, LocalSGD, launch
from minddp.comm.default_hooks import fp16_compress_hook
from minddp.comm.wire import Traffic, Wire
from minddp.diloco.fragments import split_fragments
from minddp.ladder import build_stage

U64 = 2.0**-53
PLAIN_OUTER = {"lr": 1.0, "momentum": 0.0}
#: Streaming DiLoCo as the replay below plays it: the model's three layers are its three fragments.
STREAMED, STREAMED_STEPS = {"sync_every": 6, "fragments": 3, "fragment_sync_delay": 1}, 14


def tolerance(params: list[torch.Tensor], steps: int) -> float:
    """ε·S·2^S with ε = 6·u·M (module docstring)."""
    biggest = max(p.abs().max().item() for p in params)
    return 6 * U64 * max(biggest, 1.0) * steps * 2.0**steps


def snapshot(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def sgd(model, momentum: float = 0.0):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum)


# -- on each rank -------------------------------------------------------------------------------------


@contextlib.contextmanager
def float64():
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(torch.float32)


@float64()
def ddp_equivalence(steps: int) -> dict:
    """H = 1: DiLoCo(inner SGD, outer SGD(1, 0)) and the ddp stage with the same SGD, after every step."""
    rank, out = dist.get_rank(), {"diloco": [], "ddp": []}
    model = build_model()
    inner = sgd(model)
    with DiLoCo(model, inner, torch.optim.SGD(model.parameters(), **PLAIN_OUTER), sync_every=1):
        for step in range(steps):
            inner_step(model, inner, step, rank)
            out["diloco"].append(snapshot(model))
    model = build_model()
    ddp = build_stage("ddp", model)
    optimizer = sgd(ddp)
    for step in range(steps):
        optimizer.zero_grad()
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # the ddp stage averages the gradients
        optimizer.step()
        out["ddp"].append(snapshot(model))
    return out


@float64()
def averaging_equivalence(steps: int, sync_every: int) -> dict:
    """Any H: LocalSGD, DiLoCo(outer SGD(1, 0)) and torch's PostLocalSGDOptimizer, after every step."""
    rank, out = dist.get_rank(), {}
    for name in ("local-sgd", "diloco", "torch"):
        model = build_model()
        if name == "torch":
            averager = PeriodicModelAverager(period=sync_every, warmup_steps=sync_every - 1)  # after the H-th step
            optimizer, rung = PostLocalSGDOptimizer(sgd(model, momentum=0.9), averager), None
        else:
            optimizer = sgd(model, momentum=0.9)
            outer = torch.optim.SGD(model.parameters(), **PLAIN_OUTER)
            rung = (
                LocalSGD(model, optimizer, sync_every)
                if name == "local-sgd"
                else DiLoCo(model, optimizer, outer, sync_every)
            )
        history = []
        for step in range(steps):
            inner_step(model, optimizer, step, rank)
            history.append(snapshot(model))
        out[name] = {"history": history, "syncs": None if rung is None else rung.syncs}
    return out


def fp16_pseudo_gradient(steps: int, sync_every: int) -> dict:
    """DiLoCo with the fp16 hook on a metered Wire: the final weights, and what the wire counted."""
    rank = dist.get_rank()
    model = build_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    traffic = Traffic()
    diloco = DiLoCo(model, inner, None, sync_every)
    diloco.register_comm_hook(Wire(None, traffic=traffic), fp16_compress_hook)
    with diloco:
        for step in range(steps):
            inner_step(model, inner, step, rank)
    return {"params": snapshot(model), "traffic": traffic.snapshot(), "sent": diloco.sent_bytes, "syncs": diloco.syncs}


def resumed(steps: int, stop: int, options: dict) -> dict:
    """Streaming DiLoCo straight through, and stopped after ``stop`` steps (a fragment in flight), saved,
    loaded into a fresh model, inner optimizer and DiLoCo, and run on: the final weights of both."""
    rank, out = dist.get_rank(), {}
    model = build_model()
    inner = torch.optim.AdamW(model.parameters(), lr=0.02)
    with DiLoCo(model, inner, None, **options) as diloco:
        for step in range(steps):
            inner_step(model, inner, step, rank)
            if step + 1 == stop:
                saved = {"model": model.state_dict(), "inner": inner.state_dict(), "diloco": diloco.state_dict()}
                saved = {k: _copied(v) for k, v in saved.items()}
                out["in_flight_when_saved"] = diloco.in_flight is not None
    out["straight"] = snapshot(model)
    model = build_model(seed=7)  # other weights: only the state makes them right
    inner = torch.optim.AdamW(model.parameters(), lr=0.02)
    with DiLoCo(model, inner, None, **options) as diloco:  # built first: its same start broadcasts rank 0's weights
        model.load_state_dict(saved["model"])  # then each replica's own (between syncs they differ)
        inner.load_state_dict(saved["inner"])
        diloco.load_state_dict(saved["diloco"])
        for step in range(stop, steps):
            inner_step(model, inner, step, rank)
    out["resumed"] = snapshot(model)
    return out


def _copied(value):
    """A deep copy of a state dict (tensors cloned), as saving it to a file and reading it back gives."""
    return copy.deepcopy(value)


def schedule(steps: int, **options) -> list[tuple]:
    """(inner step, what, fragment) of every send and every landing, from a hook that records them."""
    from minddp.comm.default_hooks import allreduce_hook

    events, step = [], [0]
    model = build_model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    diloco = DiLoCo(model, inner, None, **options)

    def recording(state, bucket):
        events.append((step[0], "sent", bucket.index()))
        return allreduce_hook(state, bucket).then(
            lambda f: events.append((step[0], "landed", bucket.index())) or f.value()
        )

    diloco.register_comm_hook(None, recording)
    with diloco:
        for s in range(steps):
            step[0] = s + 1
            inner_step(model, inner, s, dist.get_rank())
    return events


def streamed(steps: int, alpha: float) -> list[torch.Tensor]:
    """Streaming DiLoCo (3 fragments, H = 6, tau = 1, AdamW inside, the default outer SGD): the final weights."""
    model = build_model()
    inner = torch.optim.AdamW(model.parameters(), lr=0.02)
    with DiLoCo(model, inner, None, **STREAMED, fragment_update_alpha=alpha):
        for step in range(steps):
            inner_step(model, inner, step, dist.get_rank())
    return snapshot(model)


def foreign_state() -> str:
    """The message of loading a DiLoCo state saved from a model with other parameter names."""
    small = torch.nn.Linear(8, 8)
    state = DiLoCo(small, torch.optim.SGD(small.parameters(), lr=0.1), None, 2).state_dict()
    model = build_model()
    diloco = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), None, 2)
    before = [s.clone() for s in diloco.synced[0]]
    try:
        diloco.load_state_dict(state)
    except ValueError as exc:
        assert all(torch.equal(a, b) for a, b in zip(before, diloco.synced[0]))  # nothing changed
        return str(exc)
    return "loaded"


def on_ranks() -> dict:
    return {
        "ddp": ddp_equivalence(steps=5),
        "averaging": averaging_equivalence(steps=7, sync_every=3),
        "fp16": fp16_pseudo_gradient(steps=6, sync_every=3),
        "resume": resumed(
            steps=14, stop=5, options=dict(sync_every=6, fragments=3, fragment_sync_delay=1, fragment_update_alpha=0.25)
        ),
        "schedule": schedule(12, sync_every=6, fragments=3, fragment_sync_delay=1),
        "foreign": foreign_state(),
        "streamed": {alpha: streamed(STREAMED_STEPS, alpha) for alpha in (0.0, 0.5)},
    }


@pytest.fixture(scope="module")
def ranks():
    return launch(on_ranks, world_size=2, timeout_s=180)


# -- the tests -----------------------------------------------------------------------------------------


def test_h1_diloco_with_plain_outer_sgd_is_ddp_step_by_step(ranks):
    for rank in ranks:
        out = rank["ddp"]
        for step, (ours, ddp) in enumerate(zip(out["diloco"], out["ddp"]), start=1):
            tol = tolerance(ddp, step)
            gap = max((a - b).abs().max().item() for a, b in zip(ours, ddp))
            assert gap <= tol, f"step {step}: DiLoCo is {gap:.3g} from DDP, above {tol:.3g}"
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["ddp"]["diloco"][-1], ranks[1]["ddp"]["diloco"][-1]))
    moved = max((a - b).abs().max().item() for a, b in zip(ranks[0]["ddp"]["ddp"][0], build_model().parameters()))
    assert moved > 1e-3  # the comparison is of weights that trained, not of the start


def test_plain_outer_sgd_is_parameter_averaging_as_torch_does_it(ranks):
    for rank in ranks:
        out = rank["averaging"]
        assert out["local-sgd"]["syncs"] == out["diloco"]["syncs"] == 2  # after steps 3 and 6 of 7
        for step, (mine, theirs) in enumerate(zip(out["local-sgd"]["history"], out["torch"]["history"]), start=1):
            assert all(torch.equal(a, b) for a, b in zip(mine, theirs)), f"local SGD differs from torch at step {step}"
        for step, (mine, theirs) in enumerate(zip(out["diloco"]["history"], out["torch"]["history"]), start=1):
            tol = tolerance(theirs, step)
            gap = max((a - b).abs().max().item() for a, b in zip(mine, theirs))
            assert gap <= tol, f"step {step}: DiLoCo(outer SGD 1, 0) is {gap:.3g} from averaging, above {tol:.3g}"
    synced = [r["averaging"]["torch"]["history"][5] for r in ranks]  # right after the second average
    apart = [r["averaging"]["torch"]["history"][4] for r in ranks]  # before it: the replicas had drifted
    assert all(torch.equal(a, b) for a, b in zip(*synced))
    assert not all(torch.equal(a, b) for a, b in zip(*apart))


def replay_fp16(steps: int, sync_every: int) -> list[torch.Tensor]:
    """One process plays both replicas: inner SGD, and at each sync the pseudo-gradients cast to fp16, halved
    and summed in fp16 (what the fp16 hook does to any bucket), then DiLoCo's outer SGD from the synced weights."""
    models = [build_model(), build_model()]
    inners = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    synced = snapshot(models[0])
    weights = [p for p in synced]
    for w in weights:
        w.requires_grad_(True)
    outer = torch.optim.SGD(weights, lr=0.7, momentum=0.9, nesterov=True)
    for step in range(steps):
        for replica, (model, inner) in enumerate(zip(models, inners)):
            inner_step(model, inner, step, replica)
        if (step + 1) % sync_every == 0:
            for i, w in enumerate(weights):
                halves = [((w.detach() - list(m.parameters())[i].detach()).half() / 2) for m in models]
                w.grad = (halves[0] + halves[1]).float()
            outer.step()
            for model in models:
                with torch.no_grad():
                    for p, w in zip(model.parameters(), weights):
                        p.copy_(w)
    return [w.detach() for w in weights]


def test_the_pseudo_gradient_goes_through_the_comm_hook_in_fp16(ranks):
    expected = replay_fp16(steps=6, sync_every=3)
    params = sum(p.numel() for p in build_model().parameters())
    for rank in ranks:
        out = rank["fp16"]
        assert out["syncs"] == 2
        assert out["sent"] == 2 * params * 4  # handed to the hook: fp32
        assert out["traffic"]["calls"] == 2 and out["traffic"]["by_dtype"] == {"float16": 2 * params * 2}
        assert all(torch.equal(a, b) for a, b in zip(out["params"], expected))


def replay_streaming(steps: int, alpha: float) -> list[torch.Tensor]:
    """One process plays both replicas of :func:`streamed` with plain tensors, as the papers write DiLoCo: in each
    turn of H/K steps its fragment's pseudo-gradient (synced - local) leaves tau steps before the turn ends (each
    replica's halved, the halves summed: the default hook's mean); at the end the outer SGD steps the *synced*
    weights with it, and each replica's weights become (1 - alpha) * synced + alpha * its local ones."""
    models = [build_model(), build_model()]
    inners = [torch.optim.AdamW(m.parameters(), lr=0.02) for m in models]
    layers = [[list(layer.parameters()) for layer in m] for m in models]  # [replica][fragment] -> tensors
    synced = [[p.detach().clone().requires_grad_(True) for p in fragment] for fragment in layers[0]]
    outers = [torch.optim.SGD(fragment, lr=0.7, momentum=0.9, nesterov=True) for fragment in synced]
    period, tau, in_flight = STREAMED["sync_every"] // 3, STREAMED["fragment_sync_delay"], None
    for step in range(1, steps + 1):
        for replica, (model, inner) in enumerate(zip(models, inners)):
            inner_step(model, inner, step - 1, replica)
        turn = (step - 1) // period % 3
        if step % period == period - tau:  # leaves: the mean of what each replica learnt, as a gradient
            in_flight = [
                sum((w.detach() - r[turn][i].detach()) / 2 for r in layers) for i, w in enumerate(synced[turn])
            ]
        if step % period == 0:  # lands: the outer step from the synced weights, then the mix
            for w, mean in zip(synced[turn], in_flight):
                w.grad = mean
            outers[turn].step()
            with torch.no_grad():
                for replica in layers:
                    for p, w in zip(replica[turn], synced[turn]):
                        p.copy_(w.detach().lerp(p.detach(), alpha))
    return [p.detach().clone() for p in models[0].parameters()]


def test_streaming_diloco_is_the_papers_update_sign_and_mix_included(ranks):
    # torchft's users met both bugs this checks (meta-pytorch/torchft#233): an outer step taken in the direction of
    # local - synced (away from what the replicas learnt), and the mix written as an out-of-place lerp whose result
    # was dropped (alpha had no effect). The replay writes the update as the papers do; rank 0 holds its replica.
    for alpha in (0.0, 0.5):
        expected = replay_streaming(STREAMED_STEPS, alpha)
        assert all(torch.equal(a, b) for a, b in zip(ranks[0]["streamed"][alpha], expected)), f"alpha {alpha}"
    assert not all(torch.equal(a, b) for a, b in zip(ranks[0]["streamed"][0.0], ranks[0]["streamed"][0.5]))


def test_a_state_saved_with_a_fragment_in_flight_resumes_bit_for_bit(ranks):
    for rank in ranks:
        out = rank["resume"]
        assert out["in_flight_when_saved"]  # step 5: fragment 2 sent at step 5, lands at step 6
        assert all(torch.equal(a, b) for a, b in zip(out["straight"], out["resumed"]))


def test_fragments_take_turns_each_sent_tau_steps_before_it_lands(ranks):
    # H = 6, K = 3: a turn is 2 inner steps; τ = 1: each fragment leaves at the first step of its turn and is
    # applied at the second; fragment 0 first (torchft's order), one in flight at a time
    for rank in ranks:
        sent = [e for e in rank["schedule"] if e[1] == "sent"]
        assert sent == [(2 * t + 1, "sent", t % 3) for t in range(6)]
        landed = [e for e in rank["schedule"] if e[1] == "landed"]
        assert [e[2] for e in landed] == [t % 3 for t in range(6)]
        assert all(s[0] <= land[0] <= s[0] + 1 for s, land in zip(sent, landed))  # landed before its turn ended


# -- refusals, before anything is sent ------------------------------------------------------------------


def test_a_state_of_another_model_is_refused_before_anything_changes(ranks):
    for rank in ranks:
        assert "this state is of another model" in rank["foreign"] and "0.weight" in rank["foreign"]


def refusal(**overrides) -> str:
    """The message a DiLoCo built with ``overrides`` raises, with no process group at all: nothing was sent."""
    model = build_model()
    args = dict(model=model, inner=torch.optim.SGD(model.parameters(), lr=0.1), outer=None, sync_every=6)
    args.update(overrides)
    kwargs = {k: v for k, v in args.items() if k not in ("model", "inner", "outer", "sync_every")}
    with pytest.raises((ValueError, TypeError)) as info:
        DiLoCo(args["model"], args["inner"], args["outer"], args["sync_every"], **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "overrides, words",
    [
        (dict(sync_every=10, fragments=3), ["sync_every=10 is not divisible by fragments=3", "such as 9"]),
        (
            dict(sync_every=6, fragments=3, fragment_sync_delay=2),
            ["fragment_sync_delay=2", "below a turn's sync_every/fragments = 2 steps", "0 to 1"],
        ),
        (dict(fragment_sync_delay=-1), ["fragment_sync_delay=-1", "0 to 5"]),
        (dict(fragment_update_alpha=1.5), ["fragment_update_alpha=1.5 is outside [0, 1]"]),
        (dict(fragment_update_alpha=float("nan")), ["fragment_update_alpha=nan is outside [0, 1]"]),
        (dict(sync_every=0), ["sync_every must be a whole number", "got 0"]),
        (dict(sync_every=None), ["sync_every must be a whole number", "got None"]),
        (dict(fragments=0), ["fragments must be a whole number", "got 0"]),
        (dict(sync_every=12, fragments=12), ["fragments=12 is more than the model's 6 trainable tensors"]),
    ],
)
def test_a_bad_schedule_is_refused_in_one_line(overrides, words):
    message = refusal(**overrides)
    assert all(w in message for w in words), message


def test_an_outer_optimizer_over_other_parameters_is_refused():
    model, other = build_model(), build_model()
    assert "not the model's trainable parameters" in refusal(
        model=model, outer=torch.optim.SGD(other.parameters(), lr=1)
    )
    first = list(model)[0]
    message = refusal(model=model, outer=torch.optim.SGD(first.parameters(), lr=1))
    assert "misses 4 of the trainable parameters" in message and "never move" in message
    per_fragment = [torch.optim.SGD(m.parameters(), lr=1) for m in model]
    assert "3 outer optimizers for 2 fragments" in refusal(model=model, outer=per_fragment, fragments=2)
    swapped = per_fragment[::-1]
    assert "the outer optimizer of fragment 0 holds 2 tensor(s)" in refusal(model=model, outer=swapped, fragments=3)
    assert "not the model's" in refusal(model=model, inner=torch.optim.SGD(other.parameters(), lr=1))


def test_fragments_named_as_modules_must_partition_the_model():
    model = build_model()
    assert "exactly once" in refusal(model=model, fragments=[model[0], model[0], model[2]], sync_every=6)
    assert "exactly once" in refusal(model=model, fragments=[model[0], model[1]], sync_every=6)


def test_a_sharded_model_or_optimizer_is_refused():
    from minddp.sharding import ZeroRedundancyOptimizer

    model = build_model()
    zero = ZeroRedundancyOptimizer.__new__(ZeroRedundancyOptimizer)  # its class is what is refused: no group needed
    assert "ZeroRedundancyOptimizer shards the weights" in refusal(model=model, inner=zero)


def test_the_model_is_split_in_contiguous_runs_of_about_equal_size():
    model = build_model()  # three equal layers: one per fragment
    assert split_fragments(model, 3) == [list(layer.parameters()) for layer in model]
    big = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Linear(64, 2), torch.nn.Linear(2, 2))
    runs = split_fragments(big, 2)
    assert [len(r) for r in runs] == [1, 5]  # 512 | 64 + 128 + 2 + 4 + 2: the first weight alone is over half
    every = split_fragments(big, 6)  # as many fragments as tensors: one tensor each, in order
    assert [r[0] for r in every] == list(big.parameters())
