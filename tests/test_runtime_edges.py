"""The runtime's edges found by reading (issue 48, item 5): each fails before its fix.

1. a file torch's data-only reader refuses is told by where the refusal was raised, not by its wording
   (oracle: torch's own ``torch.load(..., weights_only=True)`` on a crafted file, and the same error
   reworded as another release might word it);
2. a run's gloo/NCCL interface variables: a value the user set is kept and said, and a machine where no
   interface carries the loopback address is said too, with what to set (oracle: the environment a
   launched rank sees);
3. the descriptor ``loopback_store`` duplicates for the store is closed when the store fails to start
   (oracle: this process's open sockets, from ``/proc/self/fd``).
"""

from __future__ import annotations

import io
import os
import pickle

import pytest
import torch

from minddp import launch
from minddp.runtime import compat, loopback
from minddp.runtime.untrusted import NotData, load_torch_data


class _Runs:
    def __reduce__(self):
        return (os.mkdir, ("never-made",))


def _crafted() -> io.BytesIO:
    buf = io.BytesIO()
    torch.save({"step": 3, "payload": _Runs()}, buf)
    buf.seek(0)
    return buf


# -- 1. torch's data-only refusal, told by where it was raised --------------------------------------


def test_a_refusal_is_told_by_where_torch_raised_it_not_by_its_wording(monkeypatch):
    with pytest.raises(NotData, match=r"^it names posix\.mkdir, which a data file never needs$"):
        load_torch_data(_crafted())
    real_load = torch.load

    def reworded(*args, **kwargs):  # another release's wording: no "weights only" in it
        try:
            return real_load(*args, **kwargs)
        except pickle.UnpicklingError:
            raise pickle.UnpicklingError("the safe loader declined this archive") from None

    monkeypatch.setattr(torch, "load", reworded)
    with pytest.raises(NotData, match=r"^it names posix\.mkdir, which a data file never needs$"):
        load_torch_data(_crafted())


def test_an_unpickling_error_raised_elsewhere_is_a_damaged_file_whatever_its_words(monkeypatch):
    def damaged(*args, **kwargs):
        raise pickle.UnpicklingError("weights only load failed: truncated stream")  # not from torch's reader

    monkeypatch.setattr(torch, "load", damaged)
    with pytest.raises(pickle.UnpicklingError, match="truncated stream") as caught:
        load_torch_data(io.BytesIO(b"PK"))
    assert not isinstance(caught.value, NotData)
    assert compat.weights_only_refusal(caught.value) is None


# -- 2. the interface variables -----------------------------------------------------------------


@pytest.fixture
def fresh_lines(monkeypatch):
    """rank_env's lines said anew (each is said once per process)."""
    monkeypatch.setattr(loopback, "_said", set(), raising=False)
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)


def test_a_value_the_user_set_is_kept_and_said_once(fresh_lines, capsys):
    lo = loopback.loopback_interface()
    assert lo is not None  # this machine has one (the other case is the next test)
    env = {"NCCL_SOCKET_IFNAME": "eth9"}
    assert loopback.rank_env(env) == {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": "eth9"}
    assert loopback.rank_env(env) == {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": "eth9"}
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"minddp: the ranks' own connections use the interface set in NCCL_SOCKET_IFNAME=eth9, not the loopback "
        f"interface ({lo}): they may be reachable from the network; unset it to keep this local run on this machine"
    ]
    assert loopback.rank_env({"GLOO_SOCKET_IFNAME": lo}) == {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}
    assert capsys.readouterr().err == ""  # the loopback interface itself: nothing to say


def test_no_loopback_interface_is_said_in_one_line_naming_what_to_set(fresh_lines, capsys, monkeypatch):
    monkeypatch.setattr(loopback, "loopback_interface", lambda: None)
    assert loopback.rank_env({}) == {}
    assert loopback.rank_env({"GLOO_SOCKET_IFNAME": "lo"}) == {"GLOO_SOCKET_IFNAME": "lo"}
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines  # two distinct cases, each once, and the user's choice said
    assert lines[0] == (
        f"minddp: no network interface carries the loopback address {loopback.loopback_host()}, so gloo and NCCL "
        "bind the address this machine's name resolves to (possibly the network's); set GLOO_SOCKET_IFNAME and "
        "NCCL_SOCKET_IFNAME to the loopback interface's name (lo on Linux, lo0 on macOS)"
    )
    assert lines[1].startswith("minddp: the ranks' own connections use the interface set in GLOO_SOCKET_IFNAME=lo")
    assert lines[2].endswith("set NCCL_SOCKET_IFNAME to the loopback interface's name (lo on Linux, lo0 on macOS)")


def rank_interfaces() -> dict:
    return {name: os.environ.get(name) for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}


def test_a_launched_rank_gets_the_interface_the_user_set(fresh_lines, monkeypatch, capfd):
    # NCCL's variable: gloo (this CPU run's backend) never reads it, so any name can stand for the user's choice
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth9")
    lo = loopback.loopback_interface()
    assert launch(rank_interfaces, world_size=2) == [{"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": "eth9"}] * 2
    assert capfd.readouterr().err.count("the interface set in NCCL_SOCKET_IFNAME=eth9") == 1  # said by the launcher


# -- 3. the store's descriptor ------------------------------------------------------------------


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # the listing's own descriptor, gone by now
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts open sockets through Linux's /proc")
def test_the_stores_descriptor_is_closed_when_the_store_fails_to_start(monkeypatch):
    def fails(host, port, fd, **options):
        raise RuntimeError("the store server could not start")

    monkeypatch.setattr(compat, "store_on_socket", fails)
    before = _sockets()
    for _ in range(3):
        with pytest.raises(RuntimeError, match="could not start"):
            loopback.loopback_store(world_size=1)
    assert _sockets() == before
