"""The comm hooks over an emulated link: what notebook 04 asserts about bytes, messages and time.

Oracles independent of timing: the link's cost model (:meth:`minddp.comm.link.LinkSpec.seconds`)
summed over the messages, whose sizes the model's parameters and buckets fix; the bucket count
(PowerSGD sends three messages a bucket, plain averaging one); the α-β algebra of the crossover
bandwidth B*, checked against the link's own prices; that the training thread's wait for every message
is seen whatever the hook chains (the count is the code's), and the bound that the exposed time
(:func:`minddp.analysis.metrics.exposed`) is link time the training thread waited through, so never more
than the link's time, on any machine.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from minddp.comm.link import GBIT, LinkSpec
from minddp.runtime.launch import launch

HOOKS = ["allreduce", "fp16", "powersgd"]
LINK = "10gbit"  # 20 µs a hop: the messages take well under a millisecond, the test stays fast


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(3)])  # each: a matrix, a vector


def _under(prof, step, *args):
    with prof:
        step(*args)


def _hooks_over_a_link(hooks: list[str]) -> dict:
    import torch.distributed as dist

    from minddp.comm.link import Link
    from minddp.comm.wire import Wire
    from minddp.ladder import wrap
    from minddp.ladder.loop import train_step
    from minddp.notebook.lesson import buckets_of, profiled_step

    g = torch.Generator().manual_seed(dist.get_rank())
    micro = [(torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)) for _ in range(2)]

    def loss_fn(m, b):
        return ((m(b[0]) - b[1]) ** 2).mean()

    out = {}
    for hook in hooks:
        link = Link(LINK)
        options = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}
        wrapped = wrap(
            "bucket-async",
            _model(),
            hook=hook,
            bucket_cap_mb=0.02,
            wire=Wire(None, link=link),
            powersgd_options=options,
        )
        opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
        for _ in range(2):  # PowerSGD compresses from the third step on
            train_step(wrapped, opt, micro, loss_fn)
        view = profiled_step(lambda prof: _under(prof, train_step, wrapped, opt, micro, loss_fn), link)
        view["sent"] = [(m["kind"], m["bytes"]) for m in link.log]
        view["buckets"] = buckets_of(wrapped)
        out[hook] = view
        link.close()
    return out


@pytest.fixture(scope="module")
def looks():
    return launch(_hooks_over_a_link, HOOKS, world_size=2)


def test_fp16_halves_the_bytes_term_and_powersgd_pays_three_messages_a_bucket(looks):
    spec, n = LinkSpec("10gbit", 10 * GBIT, 20e-6), 2
    floats = sum(p.numel() for p in _model().parameters())
    fixed = spec.seconds("all_reduce", 0, n) * 1e3  # 2 (n − 1) α, ms
    for seen in looks:
        plain, fp16, psgd = (seen[h] for h in HOOKS)
        assert sum(m for _, m in plain["sent"]) == 4 * floats and sum(m for _, m in fp16["sent"]) == 2 * floats
        assert fp16["calls"] == plain["calls"] == plain["buckets"] > 1 and psgd["calls"] == 3 * psgd["buckets"]
        # the link's time is its model summed over the messages; with the same messages, fp16's β term is half
        assert fp16["link_ms"] - fp16["calls"] * fixed == pytest.approx((plain["link_ms"] - plain["calls"] * fixed) / 2)
        assert sum(m for _, m in psgd["sent"]) < sum(m for _, m in plain["sent"]) / 4


def test_every_message_is_seen_waited_for_whatever_the_hook_chains(looks):
    """fp16 hands back a Future chained by .then (its cast back), PowerSGD one collected from several: the
    stage's wait on it is the training thread's wait for each of the bucket's messages (the ladder registers the
    hook through comm/link.waits_seen), as the plain hook's direct wait is; the count follows from the code."""
    for seen in looks:
        for hook, v in seen.items():
            assert v["waits"] == v["calls"] > 0, (hook, v["waits"], v["calls"])


def test_exposed_link_time_is_never_more_than_the_link_time(looks):
    for seen in looks:  # both ranks, every hook: a bound by construction, whatever the machine's speed
        for v in seen.values():
            assert 0 <= v["exposed_ms"] <= v["waited_ms"] + 1e-9 and v["exposed_ms"] <= v["link_ms"] + 1e-9


def test_the_crossover_bandwidth_is_where_the_links_prices_tie(looks):
    plain, psgd = looks[0]["allreduce"], looks[0]["powersgd"]
    k, m_plain = plain["calls"], sum(m for _, m in plain["sent"])
    k2, m_psgd = psgd["calls"], sum(m for _, m in psgd["sent"])
    alpha, n = 20e-6, 2
    b_star = (m_plain - m_psgd) / (n * (k2 - k) * alpha)  # the notebook's B*

    def cost(view, bandwidth):
        return sum(LinkSpec("x", bandwidth, alpha).seconds(kind, m, n) for kind, m in view["sent"])

    assert cost(psgd, b_star) == pytest.approx(cost(plain, b_star), rel=1e-9)
    assert cost(psgd, b_star / 2) < cost(plain, b_star / 2) and cost(psgd, 2 * b_star) > cost(plain, 2 * b_star)
