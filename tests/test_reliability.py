"""Reliability: a failing or killed rank never hangs the others, and misuse raises on every rank.

Oracles: the operating system (are the rank processes gone, by pid? is the
rendezvous port free again?), the launcher's report (which rank, which step,
which exception), and for the misuse checks the message every rank raised.
Hang bounds are the configured collective timeout (the behaviour promised),
enforced again by pytest-timeout.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
import torch
import torch.distributed as dist
from cli_checks import SMALL_RUN
from processes import run_torchrun, torchrun_args
from torch import nn

from minddp import RankError, launch
from minddp.comm.default_hooks import allreduce_hook, fp16_compress_hook
from minddp.comm.registry import make_hook
from minddp.ladder import STAGES, build_stage
from minddp.ladder.loop import train_step
from minddp.runtime.launch import report_step

#: The collective timeout of these runs. It counts from a collective's start, after start-up, so a run that
#: ends less than TIMEOUT_S after its launch cannot have waited it out. At 120 s that holds with start-up
#: on a loaded machine (tens of seconds) to spare; at 20 s, start-up alone came close to it.
TIMEOUT_S = 120


# -- failures mid-training ----------------------------------------------------------------------------


class Bomb(nn.Module):
    """Identity, except when armed: raise in forward, raise in backward, or SIGKILL this process."""

    def __init__(self):
        super().__init__()
        self.armed = None

    def forward(self, x):
        if self.armed == "forward":
            raise ValueError("boom in forward")
        if self.armed == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        return _RaiseInBackward.apply(x) if self.armed == "backward" else x


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("boom in backward")


def exploding_hook(state, bucket):
    if state["armed"]:
        raise RuntimeError("boom in comm hook")
    return allreduce_hook(None, bucket)


def fail_mid_training(where, stage, pid_dir, bad_rank=1, bad_step=2):
    rank = dist.get_rank()
    with open(os.path.join(pid_dir, f"rank{rank}"), "w") as f:
        f.write(f"{os.getpid()} {os.environ['MASTER_PORT']}")
    torch.manual_seed(0)
    bomb = Bomb()
    model = nn.Sequential(nn.Linear(4, 8), bomb, nn.Tanh(), nn.Linear(8, 1))
    ddp = build_stage(stage, model)
    hook_state = {"armed": False}
    ddp.register_comm_hook(hook_state, exploding_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        report_step(step)
        if rank == bad_rank and step == bad_step:
            if where == "hook":
                hook_state["armed"] = True
            else:
                bomb.armed = where
        batch = torch.randn(3, 4)
        train_step(ddp, optimizer, [batch], lambda m, b: m(b).pow(2).mean())
    return "finished"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT, not a listener
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "where, stage, kind",
    [
        ("kill", "bucket-async", "ProcessDied"),
        ("forward", "hook-async", "ValueError"),
        ("backward", "bucket", "ValueError"),
        ("hook", "ddp", "RuntimeError"),
    ],
)
def test_a_failing_rank_ends_the_run_naming_rank_and_step_and_leaves_nothing(where, stage, kind, tmp_path):
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(fail_mid_training, where, stage, str(tmp_path), world_size=2, timeout_s=TIMEOUT_S)
    elapsed = time.monotonic() - start
    err = info.value
    assert elapsed < TIMEOUT_S  # the others did not wait out a dead peer
    assert (err.rank, err.step, err.exc_type) == (1, 2, kind)
    assert str(err).startswith("rank 1 ") and "at step 2" in str(err).splitlines()[0]
    if kind != "ProcessDied":
        assert f"boom in {where if where != 'hook' else 'comm hook'}" in err.traceback
    pids_ports = [open(tmp_path / f"rank{r}").read().split() for r in (0, 1)]
    assert all(_gone(int(pid)) for pid, _ in pids_ports)  # no orphan rank, by pid
    assert _port_free(int(pids_ports[0][1]))  # the rendezvous port is free


def die_half_way_through_a_message(bad_rank=1):
    """Rank ``bad_rank`` writes the first half of a message to the launcher, then SIGKILLs itself (as the OOM
    killer might, mid-result); the others return."""
    if dist.get_rank() == bad_rank:
        from ft_tasks import _outbox_on_stack

        os.write(_outbox_on_stack().pipe.fileno(), (1000).to_bytes(8, "little") + b"x" * 500)
        os.kill(os.getpid(), signal.SIGKILL)
    return "finished"


@pytest.mark.timeout(150)
def test_a_rank_killed_half_way_through_its_message_is_named_and_holds_up_nothing():
    # The launcher reads each rank's pipe on its own: the cut message is dropped, the rank is reported dead.
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        launch(die_half_way_through_a_message, world_size=3, timeout_s=TIMEOUT_S)
    assert time.monotonic() - start < TIMEOUT_S  # not waited out: see TIMEOUT_S
    assert (info.value.rank, info.value.exc_type) == (1, "ProcessDied"), str(info.value)


def kill_rank1_at_step2(cfg, stage, data, folder):
    """train_rank, with rank 1 SIGKILLed in the middle of its third step."""
    from minddp.train import run as train

    real, calls = train.train_step, []

    def train_step(*args):
        calls.append(1)
        if dist.get_rank() == 1 and len(calls) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args)

    train.train_step = train_step  # the name train_rank calls
    return train.train_rank(cfg, stage, data, folder)


@pytest.mark.timeout(150)
def test_train_cli_reports_a_killed_rank_in_one_line_with_exit_1(monkeypatch, capsys, tmp_path):
    from minddp.train import run as train

    real_launch = train.launch
    monkeypatch.setattr(train, "launch", lambda fn, *a, **k: real_launch(kill_rank1_at_step2, *a, **k))
    start = time.monotonic()
    rc = train.main(
        [
            "--stage",
            "bucket-async",
            "--steps",
            "5",
            "--no-profile",
            *SMALL_RUN,
            "--timeout",
            str(TIMEOUT_S),
            "--checkpoint-dir",
            str(tmp_path),
        ]
    )
    assert rc == 1 and time.monotonic() - start < TIMEOUT_S  # not waited out: see TIMEOUT_S
    first = [line for line in capsys.readouterr().err.splitlines() if line.startswith("minddp.train:")][-1]
    assert "stage bucket-async: rank 1 died" in first and "at step 2" in first


# -- misuse: the same error on every rank ----------------------------------------------------------


def _message(fn) -> str | None:
    try:
        fn()
    except (RuntimeError, TypeError, FloatingPointError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class Wide(nn.Module):
    def __init__(self, width: int, layers: int = 1, dtype=torch.float32):
        super().__init__()
        self.net = nn.Sequential(*[nn.Linear(4 if i == 0 else width, width, dtype=dtype) for i in range(layers)])

    def forward(self, x):
        return self.net(x.to(self.net[0].weight.dtype))


def _backward(ddp, x, finish=True):
    ddp(x).pow(2).sum().backward()
    if finish:
        ddp.finish_gradient_synchronization()


def misuse_on_every_rank() -> dict:
    rank = dist.get_rank()
    x = torch.randn(2, 4)
    out = {}
    # 1. models that differ across ranks, for every stage: shape, parameter count, dtype
    for stage in STAGES:
        out[f"shape/{stage}"] = _message(lambda: build_stage(stage, Wide(4 + rank)))
    out["count"] = _message(lambda: build_stage("hook", Wide(4, layers=1 + rank)))
    out["dtype"] = _message(lambda: build_stage("bucket", Wide(4, dtype=torch.float64 if rank else torch.float32)))
    # 2. another hook or another bucket_cap_mb on one rank (the production DDP's guard)
    ddp = build_stage("ddp", Wide(4))
    ddp.register_comm_hook(None, fp16_compress_hook if rank else allreduce_hook)
    out["hooks_differ"] = _message(lambda: _backward(ddp, x))
    ddp = build_stage("ddp", Wide(64, layers=3), bucket_cap_mb=0.02 if rank else 1.0)
    out["cap_differs/ddp"] = _message(lambda: _backward(ddp, x))
    # torch's PowerSGDState has no __repr__ (its default one holds a memory address, different on
    # every rank): the same settings must pass, different ones must be named
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
    from torch_oracle import cpu_safe_torch_powersgd

    cpu_safe_torch_powersgd()
    for key, approx_rank in (("torch_state_same", 1), ("torch_state_differs", 1 + rank)):
        ddp = build_stage("ddp", Wide(4))
        ddp.register_comm_hook(
            torch_psgd.PowerSGDState(None, matrix_approximation_rank=approx_rank), torch_psgd.powerSGD_hook
        )
        out[key] = _message(lambda: _backward(ddp, x))
    # 4. NaN/Inf in one rank's gradient: off by default, raised on every rank when asked for
    bad = torch.full_like(x, float("nan")) if rank == 1 else x
    ddp = build_stage("bucket-async", Wide(4))
    out["nan_default"] = _message(lambda: _backward(ddp, bad))
    ddp = build_stage("ddp", Wide(4))
    ddp.check_finite = True
    out["nan/ddp"] = _message(lambda: _backward(ddp, bad))
    # 5. hooks on dtypes they cannot handle (complex)
    for name in ("fp16", "bf16+powersgd", "powersgd"):
        ddp = build_stage("bucket", Wide(4, dtype=torch.complex64))
        ddp.register_comm_hook(*make_hook(name, None, start_powerSGD_iter=2))
        out[f"complex/{name}"] = _message(lambda: ddp(x).abs().sum().backward())
    return out


@pytest.mark.timeout(150)
def test_misuse_raises_the_same_clear_error_on_every_rank():
    start = time.monotonic()
    per_rank = launch(misuse_on_every_rank, world_size=2, timeout_s=TIMEOUT_S)
    assert time.monotonic() - start < TIMEOUT_S  # every check answered, none waited for a timeout
    for rank, out in enumerate(per_rank):
        for stage in STAGES:
            msg = out[f"shape/{stage}"]
            assert msg and "same model across all ranks" in msg and "net.0.weight" in msg, (rank, stage, msg)
        assert "rank 1 has 4 parameters while rank 0 has 2" in out["count"]
        assert "float64" in out["dtype"] and "float32" in out["dtype"]
        assert "hook: rank 1 has 'fp16_compress_hook', rank 0 has 'allreduce_hook'" in out["hooks_differ"]
        assert out["torch_state_same"] is None
        assert (
            "matrix_approximation_rank=2" in out["torch_state_differs"]
            and "matrix_approximation_rank=1" in out["torch_state_differs"]
        )
        # ddp's first plan is one bucket, so the caps differ, not (yet) the buckets
        assert "bucket_cap_mb: rank 1 has" in out["cap_differs/ddp"]
        assert out["nan_default"] is None
        msg = out["nan/ddp"]
        assert msg and msg.startswith("FloatingPointError: minddp check_finite"), msg
        assert "contains NaN or Inf" in msg and f"on rank {rank}" in msg
        own = "own gradient was already non-finite" if rank == 1 else "another rank sent the NaN/Inf"
        assert own in msg, (rank, msg)
        for name in ("fp16", "bf16+powersgd", "powersgd"):
            msg = out[f"complex/{name}"]
            assert msg and msg.startswith("TypeError") and "complex64" in msg and "imaginary" in msg, (name, msg)


# -- under torchrun: a stuck peer is named before the process-group timeout ---------------------------


def stuck_rank1_at_step2():
    model = nn.Linear(4, 1)
    ddp = build_stage("bucket-async", model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        report_step(step)
        if dist.get_rank() == 1 and step == 2:
            time.sleep(120)  # a peer that hangs (not dies): nobody tells rank 0
        train_step(ddp, optimizer, [torch.randn(2, 4)], lambda m, b: m(b).sum())


@pytest.mark.timeout(120)
def test_under_torchrun_a_stuck_peer_is_named_within_the_timeout_with_its_step(tmp_path):
    # The hang bound is clamped to half the collective timeout (2.5 s here), so the stuck rank is named
    # before rank 0's collective times out (which would name rank 0, the one that waited).
    import textwrap

    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_reliability import stuck_rank1_at_step2
        from minddp import launch
        launch(stuck_rank1_at_step2, timeout_s=5)
    """)
    )
    args = torchrun_args(str(script))
    start = time.monotonic()
    proc = run_torchrun(args, timeout=110)
    # rank 1 sleeps 120 s after start-up: a job that ended before 100 s did not wait for it (a quiet machine
    # takes about 15 s, most of it start-up)
    assert proc.returncode != 0 and time.monotonic() - start < 100
    assert "minddp: rank 1 hung at step 2: ranks [0] have waited" in proc.stderr, proc.stderr[-3000:]
    assert "time.sleep(120)" in proc.stderr  # where rank 1 was stuck, printed by rank 1 itself
