"""Moved into ``python -m minddp.bench collectives`` (all four collectives, emulated links, α-β fits).

This name stays as a shortcut for what it measured before: the hand-written
ring and naive all_reduces against the backend's own, over sizes::

    python -m minddp.collectives.bench                  # = python -m minddp.bench collectives \\
                                                        #   --collectives all_reduce --transports ring,naive --links none
    python -m minddp.collectives.bench --world-size 4 --max-mib 64 --out results/allreduce-bw

Expect the ring to lose to gloo on small messages (``2 (n - 1)`` Python-level
message round trips) and to come closer as messages grow; ``naive`` falls
behind as ``n`` grows, because rank 0 carries ``n`` times the ring's bytes.
The fitted busbw column is the ring model's bus bandwidth (nccl-tests'
``busbw``), comparable across world sizes and to a link's speed.
"""

from __future__ import annotations

import sys

from minddp.bench.collectives import main as collectives_main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return collectives_main(["--collectives", "all_reduce", "--transports", "ring,naive", "--links", "none", *args])


if __name__ == "__main__":
    sys.exit(main())
