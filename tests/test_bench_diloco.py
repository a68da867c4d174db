"""The slow-link rungs' measurements: the convergence task, its command, and the step-time model of a period.

* ``MarkovTask``: its stationary distribution is stationary, a model that predicts the chain's own law scores
  exactly the entropy floor, one that knows nothing scores log V, and the chains it samples follow its law
  (transition counts against the probabilities, within a bound derived from the counts);
* ``python -m minddp.bench.convergence``: a small run on 2 ranks writes its curves, figures and table; the bytes
  are the model's bytes times the syncs (DDP: every step; DiLoCo with H = 10: every 10th), and a bad option is one
  line before any rank starts;
* ``minddp.costmodel.slow_link``: a period replayed on a link against the link's own formula (a message of m
  bytes on 2 ranks takes 2α + m/B), for a whole-model sync, a streamed one hidden under τ steps and DDP.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from cli_checks import usage_error

from minddp.bench import convergence
from minddp.bench.convergence import VOCAB, MarkovTask, build_student
from minddp.comm.link import parse_link
from minddp.costmodel.compute import ComputeProfile
from minddp.costmodel.slow_link import ddp_step, inner_step_seconds, per_step


@pytest.fixture(scope="module")
def task():
    return MarkovTask()


class Oracle(torch.nn.Module):
    """Predicts the chain's own next-token law (log-probabilities as logits)."""

    def __init__(self, task: MarkovTask, uniform: bool = False):
        super().__init__()
        self.task, self.uniform = task, uniform

    def forward(self, context: torch.Tensor) -> torch.Tensor:
        index = context[:, 0] * self.task.vocab + context[:, 1]
        logits = self.task.probs[index].log()
        return torch.zeros_like(logits) if self.uniform else logits


def test_the_floor_is_the_loss_of_the_chains_own_law_and_the_stationary_law_is_stationary(task):
    # float64 throughout: a few roundings of values of order 1 over 1024 * 32 terms, far below 1e-12
    assert abs(task.loss(Oracle(task)) - task.floor) < 1e-12
    assert abs(task.loss(Oracle(task, uniform=True)) - math.log(VOCAB)) < 1e-12
    assert 0 < task.floor < math.log(VOCAB)
    c = torch.arange(task.contexts)
    moved = torch.zeros(task.contexts, dtype=torch.float64)
    successors = task.successor(c.unsqueeze(1), torch.arange(task.vocab).unsqueeze(0)).reshape(-1)
    moved.index_add_(0, successors, (task.stationary.unsqueeze(1) * task.probs).reshape(-1))
    assert (moved - task.stationary).abs().max() < 1e-14 and abs(task.stationary.sum() - 1) < 1e-12


def test_the_chains_follow_the_chains_law(task):
    counts = torch.zeros(task.contexts, task.vocab)
    chains = task.chains(seed=0, replica=0, batch=512)
    for _ in range(400):  # 204,800 transitions
        context, token = next(chains)
        counts.index_put_((context[:, 0] * task.vocab + context[:, 1], token), torch.ones(len(token)), accumulate=True)
    visits = counts.sum(1, keepdim=True)
    freq, p = counts / visits.clamp_min(1), task.probs.float()
    # a frequency is the mean of n Bernoulli(p) draws (the Markov property: given the context, each next token is a
    # fresh draw), standard error sqrt(p(1-p)/n); where n·p and n·(1-p) are both 25 or more the normal law holds,
    # and 6 standard errors bound each of those cells (beyond: probability ~2e-9 a cell)
    tested = (visits * p >= 25) & (visits * (1 - p) >= 25)
    assert tested.sum() > 1000
    bound = 6 * (p * (1 - p) / visits.clamp_min(1)).sqrt()
    assert ((freq - p).abs() <= bound)[tested].all()
    wrong = p.roll(1, dims=0)  # another context's law: the check tells it apart
    assert not ((freq - wrong).abs() <= 6 * (wrong * (1 - wrong) / visits.clamp_min(1)).sqrt())[tested].all()
    assert task.loss(build_student(0)) > task.floor  # an untrained student is above the floor


def test_a_small_convergence_run_writes_its_curves_and_counts_the_bytes(tmp_path, capsys):
    out = tmp_path / "conv"
    argv = ["--configs", "ddp,diloco-h10", "--seeds", "1", "--replicas", "2", "--steps", "20", "--eval-every", "10"]
    assert convergence.main([*argv, "--out", str(out)]) == 0
    results = json.loads((out / "convergence.json").read_text())
    params = sum(p.numel() for p in build_student(0).parameters())
    ddp, diloco = results["curves"]["ddp"][0], results["curves"]["diloco-h10"][0]
    assert ddp["step"] == diloco["step"] == [0, 10, 20]
    assert ddp["bytes"] == [0, 10 * params * 4, 20 * params * 4]  # every step, the whole model in float32
    assert diloco["bytes"] == [0, params * 4, 2 * params * 4] and diloco["syncs"] == [0, 1, 2]
    assert ddp["loss"][0] == diloco["loss"][0] and all(x > results["floor"] for x in ddp["loss"])
    # each DiLoCo run's whole outer SGD is recorded (the sweep's outer_lr alone left its momentum unsaid)
    assert results["configs"]["diloco-h10"]["outer"] == convergence.outer_settings("diloco-h10")
    assert "outer" not in results["configs"]["ddp"]
    assert {p.name for p in out.iterdir()} == {"convergence.json", "table.md", "loss_vs_steps.png", "loss_vs_bytes.png"}
    assert "| diloco-h10 |" in (out / "table.md").read_text() and "| 10 |" in (out / "table.md").read_text()
    (out / "table.md").unlink()
    assert convergence.main(["--plot", str(out)]) == 0 and (out / "table.md").exists()  # drawn again from the curves


def _outer_sgds_built() -> dict:
    """Each DiLoCo configuration's outer SGD as :func:`minddp.ladder.slow_link` builds it for the bench."""
    from minddp.ladder import slow_link

    built = {}
    for name, (kind, sync_every, options) in convergence.CONFIGS.items():
        if kind == "diloco":
            model = build_student(0)
            rung = slow_link(kind, model, torch.optim.AdamW(model.parameters()), sync_every, **options)
            built[name] = {k: rung.outer[0].param_groups[0][k] for k in ("lr", "momentum", "nesterov")}
            rung.close()
    return built


def test_the_recorded_outer_settings_are_the_outer_sgd_each_run_builds():
    from minddp.runtime.launch import launch

    built = launch(_outer_sgds_built, world_size=1)[0]
    assert built == {n: convergence.outer_settings(n) for n in built}
    assert built["diloco-h100-lr1"] == {"lr": 1.0, "momentum": 0.9, "nesterov": True}
    assert all(convergence.outer_settings(n) is None for n in convergence.CONFIGS if n not in built)


@pytest.mark.parametrize(
    "argv, cause",
    [
        (["--configs", "ddp,nope"], "--configs: unknown ['nope']"),
        (["--steps", "50", "--configs", "diloco-h100"], "--steps 50 is shorter than one sync of diloco-h100"),
        (["--lr", "nan"], "argument --lr: 'nan' is not a finite number"),
        (["--plot", "/nonexistent"], "--plot /nonexistent: no convergence.json there"),
    ],
)
def test_bad_convergence_options_are_one_line(argv, cause, capsys):
    assert convergence.main(argv) == 2
    usage_error(capsys.readouterr().err, "bench.convergence", cause)


@pytest.mark.parametrize(
    "argv, cause",
    [
        (["--links", "wan,nope"], "unknown link 'nope'"),
        (["--sync-every", "10", "--fragments", "3"], "--sync-every=10 is not divisible by --fragments=3"),
        (["--steps", "30", "--sync-every", "20"], "--steps 30: give a multiple of --sync-every"),
    ],
)
def test_bad_slow_link_benchmark_options_are_one_line_before_anything_runs(argv, cause, capsys):
    from minddp.bench import slow_links

    assert slow_links.main(argv) == 2
    usage_error(capsys.readouterr().err, "bench.slow_links", cause)


# -- the step-time model of a period -------------------------------------------------------------------------------


def profile(nbytes: int, step_s: float) -> ComputeProfile:
    """One micro-batch of ``step_s`` (a third forward), one gradient of ``nbytes`` ready at backward's end."""
    return ComputeProfile(nbytes=[nbytes], forward=step_s / 3, backward=2 * step_s / 3, ready=[2 * step_s / 3])


def test_a_period_on_a_link_costs_what_the_links_formula_says():
    link, m, c, h = parse_link("home"), 400_000, 0.05, 20
    transfer = 2 * link.latency + m / link.bandwidth  # a ring all_reduce on 2 ranks: 2 hops, m bytes each way
    assert inner_step_seconds(profile(m, c)) == pytest.approx(c, rel=1e-12)
    whole = per_step(profile(m, c), "home", sync_every=h)  # sent after step H, waited for at once
    assert whole["step_s"] == pytest.approx(c + transfer / h, rel=1e-9)
    assert whole["utilisation"] == pytest.approx(c / (c + transfer / h), rel=1e-9)
    # two fragments of m/2, each sent tau steps before its turn ends: hidden when tau * c covers its transfer
    half = 2 * link.latency + (m / 2) / link.bandwidth
    tau = math.ceil(half / c)
    assert tau < h // 2  # (a delay below the turn: the schedule can run)
    hidden = per_step(profile(m, c), "home", sync_every=h, fragments=[m // 2] * 2, delay=tau)
    assert hidden["utilisation"] == 1.0 and hidden["step_s"] == pytest.approx(c, rel=1e-12)
    short = per_step(profile(m, c), "home", sync_every=h, fragments=[m // 2] * 2, delay=tau - 1)
    assert short["exposed_s"] == pytest.approx(2 * (half - (tau - 1) * c) / h, rel=1e-9)  # each turn waits the rest
    ddp = ddp_step(profile(m, c), "home")  # sent at backward's end, needed right after: all of it exposed
    assert ddp["step_s"] == pytest.approx(c + transfer, rel=1e-9)
