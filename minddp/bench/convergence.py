"""``python -m minddp.bench.convergence``: does DiLoCo reach DDP's expected loss with H times fewer bytes?

The slow-link rungs (:mod:`minddp.diloco`) are exact where exactness exists (the tests), but whether
talking every H steps *learns as well* is an empirical claim, and this command measures it instead of
assuming it. One run:

1. **the task** (:class:`MarkovTask`): language modelling of a Markov chain over 32 tokens whose next
   token depends on the last two through a fixed random "teacher" network. Its entropy rate is known
   exactly (the *floor*: no model can go below it), and so is any model's *expected loss*: the
   cross-entropy averaged over every one of the 1024 contexts with the chain's stationary weights,
   computed in closed form (no sampled evaluation set, so no evaluation noise; nothing is held out);
2. **the runs**, on ``--replicas`` ranks over gloo (:func:`minddp.launch`), each rank one replica that
   samples its own chains: DDP at the global batch (the ``ddp`` stage), one replica alone (``single``,
   a quarter of the data with 4 replicas), local SGD and DiLoCo at several H, streaming DiLoCo, and
   DiLoCo's outer learning rate swept at the largest H (:data:`CONFIGS`). Every run trains the same
   student network with AdamW (a cosine schedule) for ``--steps`` inner steps, from the same seed,
   on the same chains; every ``--eval-every`` steps the weights the replicas *agree on* (DDP's, the
   last average of local SGD, DiLoCo's synced weights) are scored, and the bytes each replica handed
   to the all_reduce so far are read off a metered :class:`~minddp.comm.wire.Wire`;
3. **repeated** for ``--seeds`` seeds (the seed changes the student's start and every chain), so the
   spread between seeds is stated beside every difference;
4. **reports** into ``--out``: ``convergence.json`` (every curve; each DiLoCo run's outer SGD under
   ``configs``), ``loss_vs_steps.png``,
   ``loss_vs_bytes.png`` and ``table.md`` (the expected loss at the end, mean and range over the
   seeds, its gap to DDP's in percent of the loss and of the excess over the floor, bytes per
   replica and how many times fewer than DDP's).

``--plot DIR`` draws the figures and the table again from a saved ``convergence.json``.
``docs/diloco.md`` (*Convergence*) shows the result and says what it does and does not show.

Example::

    $ python -m minddp.bench.convergence --seeds 5 --out docs/diloco     # about an hour on 2 busy CPU cores
    $ python -m minddp.bench.convergence --steps 200 --seeds 1 --configs ddp,diloco-h10 --out /tmp/conv
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time

import torch
from torch import nn

#: Tokens, and how many of the last ones the next depends on: 32² = 1024 contexts.
VOCAB, CONTEXT = 32, 2

#: name -> (rung, H, options). ``ddp`` and ``single`` send nothing every H steps; the rest are
#: :func:`minddp.ladder.slow_link`'s rungs with these options.
CONFIGS: dict[str, tuple[str, int | None, dict]] = {
    "ddp": ("ddp", None, {}),
    "single": ("single", None, {}),
    **{f"local-sgd-h{h}": ("local-sgd", h, {}) for h in (10, 50, 100)},
    **{f"diloco-h{h}": ("diloco", h, {}) for h in (10, 50, 100)},
    "streaming-h100": ("diloco", 100, {"fragments": 2, "fragment_delay": 5, "fragment_alpha": 0.5}),
    **{f"diloco-h100-lr{lr:g}": ("diloco", 100, {"outer_lr": lr}) for lr in (0.3, 0.5, 1.0)},
}


def outer_settings(name: str) -> dict | None:
    """The outer SGD a ``diloco`` configuration runs (:data:`~minddp.diloco.OUTER_DEFAULTS` with its
    ``outer_lr``, as :func:`minddp.ladder.slow_link` builds it), ``None`` for the rungs without one."""
    from minddp.diloco import OUTER_DEFAULTS

    kind, _, options = CONFIGS[name]
    return {**OUTER_DEFAULTS, "lr": options.get("outer_lr", OUTER_DEFAULTS["lr"])} if kind == "diloco" else None


class MarkovTask:
    """A Markov chain of order :data:`CONTEXT` over :data:`VOCAB` tokens, its transitions a random teacher's.

    ``probs[c]`` is the next token's distribution after context ``c = a·V + b`` (the last two tokens);
    ``stationary[c]`` how often the chain is in context ``c`` in the long run; ``floor`` the chain's
    entropy rate, the lowest cross-entropy any model of the next token can have. ``temperature`` scales
    the teacher's logits (higher: a more predictable chain, a lower floor).
    """

    def __init__(self, seed: int = 99, temperature: float = 3.0, vocab: int = VOCAB):
        self.vocab, self.contexts = vocab, vocab**CONTEXT
        g = torch.Generator().manual_seed(seed)
        embed = torch.randn(vocab, 8, generator=g, dtype=torch.float64)
        hidden = torch.randn(CONTEXT * 8, 64, generator=g, dtype=torch.float64) / 4
        out = torch.randn(64, vocab, generator=g, dtype=torch.float64) / 8
        logits = torch.tanh(embed[self.context_tokens()].flatten(1) @ hidden) @ out * temperature
        self.probs = torch.softmax(logits, dim=-1)  # (contexts, vocab), float64
        self.stationary = self._stationary()
        entropy = -(self.probs * self.probs.log()).sum(1)
        self.floor = float((self.stationary * entropy).sum())
        self._cdf = self.probs.float().cumsum(1)

    def context_tokens(self) -> torch.Tensor:
        """Every context as its two tokens: row ``c`` is ``(c // V, c % V)``."""
        c = torch.arange(self.vocab**CONTEXT)
        return torch.stack([c // self.vocab, c % self.vocab], dim=1)

    def successor(self, context: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """The context after ``token`` follows ``context``: the last token, then the new one."""
        return (context % self.vocab) * self.vocab + token

    def _stationary(self) -> torch.Tensor:
        """The chain's stationary distribution over contexts (power iteration; every transition is possible)."""
        pi = torch.full((self.contexts,), 1.0 / self.contexts, dtype=torch.float64)
        c = torch.arange(self.contexts)
        targets = self.successor(c.unsqueeze(1), torch.arange(self.vocab).unsqueeze(0)).reshape(-1)
        for _ in range(10_000):
            new = torch.zeros_like(pi).index_add_(0, targets, (pi.unsqueeze(1) * self.probs).reshape(-1))
            if (new - pi).abs().max() < 1e-15:
                return new
            pi = new
        raise RuntimeError("the chain's stationary distribution did not converge")

    def loss(self, model: nn.Module) -> float:
        """The expected loss, exactly: the cross-entropy of ``model``'s predictions over the chain's long run."""
        with torch.no_grad():
            log_q = torch.log_softmax(model(self.context_tokens()).double(), dim=-1)
        return float(-(self.stationary.unsqueeze(1) * self.probs * log_q).sum())

    def chains(self, seed: int, replica: int, batch: int):
        """``batch`` chains of replica ``replica`` (started from the stationary distribution): each step, the
        contexts and the next tokens, the same for a seed and a replica in every run."""
        g = torch.Generator().manual_seed(seed * 1_000_003 + replica)
        context = torch.multinomial(self.stationary.float(), batch, replacement=True, generator=g)
        while True:
            u = torch.rand(batch, 1, generator=g)
            token = torch.searchsorted(self._cdf[context], u).squeeze(1).clamp_max(self.vocab - 1)
            yield self.context_tokens()[context], token
            context = self.successor(context, token)


def build_student(seed: int, vocab: int = VOCAB) -> nn.Module:
    """The model every run trains: the two context tokens embedded, two hidden layers of 128, the logits."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Embedding(vocab, 16),
        nn.Flatten(1),
        nn.Linear(CONTEXT * 16, 128),
        nn.ReLU(),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, vocab),
    )


def cosine(steps: int, low: float = 0.1):
    """The inner learning rate's factor at each step: from 1 down to ``low`` along a half cosine."""
    return lambda step: low + (1 - low) * 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))


# -- on every rank -----------------------------------------------------------------------------------


def agreed_weights(rung, model: nn.Module, last_average: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """The weights all replicas hold in common: DiLoCo's synced ones, local SGD's last average, else the model's."""
    if hasattr(rung, "synced"):
        return [s for fragment in rung.synced for s in fragment]
    if last_average is not None:
        return last_average
    return [p.detach() for p in model.parameters()]


def train_config(name: str, task: MarkovTask, seed: int, steps: int, batch: int, lr: float, eval_every: int) -> dict:
    """One configuration on this rank: the expected loss of the agreed weights and the payload bytes, every
    ``eval_every`` steps (rank 0's record; ``single`` trains on rank 0 only)."""
    import torch.distributed as dist

    from minddp.comm.wire import Traffic, Wire
    from minddp.ladder import slow_link, wrap

    kind, sync_every, options = CONFIGS[name]
    rank = dist.get_rank()
    if kind == "single" and rank != 0:
        return {}
    model = build_student(seed, task.vocab)
    traffic, rung, trained = Traffic(), None, model
    wire = Wire(None, traffic=traffic)
    if kind == "ddp":
        trained = wrap("ddp", model, wire=wire)
    inner = torch.optim.AdamW(model.parameters(), lr=lr)
    if kind in ("local-sgd", "diloco"):
        rung = slow_link(kind, model, inner, sync_every, wire=wire, **options)
    schedule = torch.optim.lr_scheduler.LambdaLR(inner, cosine(steps))
    evaluated = build_student(seed, task.vocab)
    chains = task.chains(seed, rank, batch)
    record = {"step": [], "loss": [], "bytes": [], "syncs": []}
    last_average, syncs = None, 0

    def score(step: int) -> None:
        with torch.no_grad():
            for target, value in zip(evaluated.parameters(), agreed_weights(rung, model, last_average)):
                target.copy_(value)
        record["step"].append(step)
        record["loss"].append(task.loss(evaluated))
        record["bytes"].append(traffic.bytes)
        record["syncs"].append(0 if rung is None else rung.syncs)

    score(0)
    for step in range(1, steps + 1):
        context, token = next(chains)
        inner.zero_grad()
        nn.functional.cross_entropy(trained(context), token).backward()
        inner.step()  # the slow-link rungs sync in its post-hook
        schedule.step()
        if kind == "local-sgd" and rung.syncs != syncs:
            syncs, last_average = rung.syncs, [p.detach().clone() for p in model.parameters()]
        if step % eval_every == 0 or step == steps:
            score(step)
    if rung is not None:
        rung.close()
    return record


def on_rank(names: list[str], seed: int, steps: int, batch: int, lr: float, eval_every: int) -> dict:
    """Every configuration in turn on this rank (one thread: the same sums on every machine)."""
    torch.set_num_threads(1)
    task = MarkovTask()
    return {name: train_config(name, task, seed, steps, batch, lr, eval_every) for name in names}


# -- in the parent -----------------------------------------------------------------------------------


def run(names: list[str], seeds: int, replicas: int, steps: int, batch: int, lr: float, eval_every: int, say) -> dict:
    """Every configuration for every seed; the curves by configuration, one per seed."""
    from minddp.runtime.launch import launch

    curves: dict[str, list[dict]] = {name: [] for name in names}
    for seed in range(seeds):
        start = time.monotonic()
        out = launch(on_rank, names, seed, steps, batch, lr, eval_every, world_size=replicas)[0]
        for name in names:
            curves[name].append(out[name])
        say(f"seed {seed}: {len(names)} runs of {steps} steps on {replicas} replicas, {time.monotonic() - start:.0f} s")
    return curves


def summary(results: dict) -> list[dict]:
    """Per configuration: the final expected loss (mean, range over seeds), its gap to DDP's, bytes per replica."""
    floor, curves = results["floor"], results["curves"]

    def final(name: str) -> list[float]:
        return [c["loss"][-1] for c in curves[name]]

    ddp = statistics.mean(final("ddp")) if "ddp" in curves else None
    ddp_bytes = statistics.mean(c["bytes"][-1] for c in curves["ddp"]) if "ddp" in curves else None
    rows = []
    for name, runs in curves.items():
        losses = final(name)
        mean, sent = statistics.mean(losses), statistics.mean(c["bytes"][-1] for c in runs)
        rows.append(
            {
                "config": name,
                "seeds": len(runs),
                "loss": mean,
                "low": min(losses),
                "high": max(losses),
                "excess": mean - floor,
                "vs_ddp_pct": None if ddp is None else 100 * (mean - ddp) / ddp,
                "excess_vs_ddp_pct": None if ddp is None else 100 * (mean - ddp) / (ddp - floor),
                "bytes": sent,
                "fewer_bytes": None if not ddp_bytes or not sent else ddp_bytes / sent,
                "syncs": runs[0]["syncs"][-1],
            }
        )
    return rows


def markdown(rows: list[dict], floor: float) -> str:
    """The table of :func:`summary` in markdown."""
    lines = [
        f"| run | expected loss (mean over seeds; min-max) | above the floor ({floor:.4f}) | vs DDP: % of loss | "
        "vs DDP: % of DDP's excess | MB payload per replica | times fewer bytes than DDP | syncs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        gap = "" if r["vs_ddp_pct"] is None else f"{r['vs_ddp_pct']:+.2f} %"
        gap_excess = "" if r["excess_vs_ddp_pct"] is None else f"{r['excess_vs_ddp_pct']:+.1f} %"
        fewer = "" if r["fewer_bytes"] is None else f"{r['fewer_bytes']:.0f}"
        lines.append(
            f"| {r['config']} | {r['loss']:.4f} ({r['low']:.4f}-{r['high']:.4f}) | {r['excess']:.4f} | {gap} | "
            f"{gap_excess} | {r['bytes'] / 1e6:.2f} | {fewer} | {r['syncs']} |"
        )
    return "\n".join(lines) + "\n"


#: How each configuration is drawn: its family's colour, its H by the line (10 solid, 50 dash-dot, 100 dashed);
#: the outer learning rates swept, in purple, dotted.
FAMILIES = {"ddp": "black", "single": "grey", "local-sgd": "tab:orange", "diloco": "tab:blue", "streaming": "tab:green"}
LINES = {None: "-", 10: "-", 50: "-.", 100: "--"}


def _style(name: str, config: dict) -> dict:
    if "outer_lr" in config:
        return {"color": "tab:purple", "linestyle": ":", "linewidth": 1.0 + config["outer_lr"]}
    family = next(f for f in sorted(FAMILIES, key=len, reverse=True) if name.startswith(f))
    return {"color": FAMILIES[family], "linestyle": "--" if family == "single" else LINES[config.get("sync_every")]}


def plot(results: dict, folder: str) -> list[str]:
    """The expected loss against inner steps and against payload bytes (mean over seeds, min-max shaded): the whole
    run on the left, its second half enlarged on the right. Each line a staircase, as in notebook 10's figure: at each
    step (or payload) the run's last score by then, so that a sync's change is drawn at its step, not as a ramp from
    the score before (no straight line through steps or payloads no score had)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, floor, configs = results["curves"], results["floor"], results["configs"]
    seeds = len(next(iter(curves.values())))
    alone = " (single: 1)" if "single" in curves else ""  # the title's replicas are not single's
    written = []
    for x_key, label, filename in (
        ("step", "inner steps (optimizer steps of each replica)", "loss_vs_steps.png"),
        ("bytes", "payload bytes each replica handed to the all_reduce (log scale)", "loss_vs_bytes.png"),
    ):
        fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
        for ax, zoom in zip(axes, (False, True)):
            ends = []
            for name, runs in curves.items():
                half = len(runs[0]["step"]) // 2 if zoom else 0
                xs = runs[0][x_key][half:]
                ys = list(zip(*[r["loss"][half:] for r in runs]))
                mean = [statistics.mean(v) for v in ys]
                style = _style(name, configs.get(name, {}))
                keep = [i for i, x in enumerate(xs) if x > 0 or x_key == "step"]  # 0 bytes: no place on a log axis
                if keep:  # (one replica alone sends nothing: no point against bytes)
                    at = [xs[i] for i in keep]
                    ax.plot(at, [mean[i] for i in keep], label=name, drawstyle="steps-post", **style)  # a staircase
                    low, high = [min(ys[i]) for i in keep], [max(ys[i]) for i in keep]
                    ax.fill_between(at, low, high, color=style["color"], alpha=0.1, step="post")
                ends.append(mean[-1])
            ax.axhline(floor, color="red", linewidth=0.8, linestyle=":", label=f"entropy floor {floor:.3f}")
            if x_key == "bytes":
                ax.set_xscale("log")
            ax.set_xlabel(label)
            ax.set_ylabel("expected loss (nats, exact)")
            if zoom:
                ax.set_ylim(floor - 0.005, max(ends) + 0.1 * (max(ends) - floor) + 0.01)
                ax.set_title("the second half, enlarged", fontsize=10)
            else:
                ax.set_ylim(floor - 0.02, floor + 0.75)
                ax.set_title(
                    f"{results['replicas']} replicas{alone}, {results['steps']} steps, batch {results['batch']} per "
                    f"replica, {seeds} seeds (line: mean; band: min-max)",
                    fontsize=10,
                )
                ax.legend(fontsize=7.5, ncol=2)
            ax.grid(alpha=0.3)
        path = os.path.join(folder, filename)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def write(results: dict, folder: str) -> list[str]:
    """``convergence.json``, the two figures and ``table.md`` in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "convergence.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=None, separators=(",", ":"))
    table = os.path.join(folder, "table.md")
    with open(table, "w") as f:
        f.write(markdown(summary(results), results["floor"]))
    return [path, table, *plot(results, folder)]


PROG = "python -m minddp.bench.convergence"


#: The examples of ``--help``.
EXAMPLES = [
    f"{PROG} --seeds 5 --out docs/diloco           # every run of docs/diloco.md (about an hour, 2 cores)",
    f"{PROG} --steps 200 --seeds 1 --configs ddp,diloco-h10 --out /tmp/conv   # a quick look",
    f"{PROG} --plot docs/diloco                    # the figures and table again from the saved curves",
]


def build_parser():
    from minddp.runtime.cli import Parser, described, number

    parser = Parser(prog=PROG, usage=f"{PROG} [options]", description=described(__doc__), examples=EXAMPLES)
    parser.add_argument(
        "--configs",
        metavar="LIST",
        default=",".join(CONFIGS),
        help="comma list of runs, of: " + ", ".join(CONFIGS) + " (default: all)",
    )
    parser.add_argument("--seeds", metavar="N", type=number(int, low=1), default=5, help="runs of each configuration")
    parser.add_argument("--replicas", metavar="N", type=number(int, low=1), default=4, help="ranks, one replica each")
    parser.add_argument("--steps", metavar="N", type=number(int, low=1), default=2000, help="inner steps of every run")
    parser.add_argument("--batch", metavar="N", type=number(int, low=1), default=32, help="chains per replica per step")
    parser.add_argument(
        "--lr",
        metavar="X",
        type=number(float, low=0, low_open=True),
        default=3e-3,
        help="AdamW's peak learning rate (a half cosine down to a tenth of it)",
    )
    parser.add_argument("--eval-every", metavar="N", type=number(int, low=1), default=50, help="steps between scores")
    parser.add_argument("--out", metavar="DIR", default="results/convergence", help="folder of the results")
    parser.add_argument("--plot", metavar="DIR", help="draw the figures and the table again from DIR/convergence.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring): 0 on success, 2 with one line on bad input."""
    from minddp.bench.report import machine
    from minddp.runtime.cli import UsageError, fail

    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    say = lambda message: print(f"minddp.bench.convergence: {message}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        args = parser.parse_args(argv)
        names = [n for n in args.configs.replace(" ", "").split(",") if n]
        unknown = [n for n in names if n not in CONFIGS]
        if unknown or not names:
            raise UsageError(f"--configs: unknown {unknown or 'empty list'}; choose among {', '.join(CONFIGS)}")
        too_long = [n for n in names if (CONFIGS[n][1] or 1) > args.steps]
        if too_long:
            raise UsageError(f"--steps {args.steps} is shorter than one sync of {too_long[0]}; give more steps")
        if args.plot and not os.path.isfile(os.path.join(args.plot, "convergence.json")):
            raise UsageError(f"--plot {args.plot}: no convergence.json there; give the --out of an earlier run")
    except UsageError as exc:
        return fail("minddp.bench.convergence", exc, parser)
    if args.plot:
        with open(os.path.join(args.plot, "convergence.json")) as f:
            results = json.load(f)
        for path in write(results, args.plot):
            say(f"wrote {path}")
        return 0
    task = MarkovTask()
    started = time.time()
    curves = run(names, args.seeds, args.replicas, args.steps, args.batch, args.lr, args.eval_every, say)
    results = {
        "floor": task.floor,
        "replicas": args.replicas,
        "steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "eval_every": args.eval_every,
        "configs": {
            n: {"rung": CONFIGS[n][0], "sync_every": CONFIGS[n][1], **CONFIGS[n][2]}
            | ({"outer": outer_settings(n)} if outer_settings(n) else {})
            for n in names
        },
        "machine": machine(),
        "command": " ".join([PROG, *argv]),
        "wall_s": round(time.time() - started, 1),
        "curves": curves,
    }
    for path in write(results, args.out):
        say(f"wrote {path}")
    print(markdown(summary(results), task.floor))
    return 0


if __name__ == "__main__":
    sys.exit(main())
