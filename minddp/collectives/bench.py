"""Moved into ``python -m minddp.bench collectives`` (all four collectives, emulated links, α-β fits).

This name stays as a shortcut for what it measured before: the hand-written
ring and naive collectives against the backend's own, over sizes::

    python -m minddp.collectives.bench                  # = python -m minddp.bench collectives \\
                                                        #   --collectives all_reduce --transports ring,naive --links none
    python -m minddp.collectives.bench --world-size 4 --max-mib 64 --out results/allreduce-bw
    python -m minddp.collectives.bench --op reduce_scatter   # also the wire's (on gloo: all_reduce + keep a chunk)

``--op reduce_scatter`` / ``all_gather`` time the sharded stages' collectives
(sizes are the whole tensor), with ``wire`` beside ring and naive: what
:meth:`minddp.comm.wire.Wire.reduce_scatter` does on gloo.

Expect the ring to lose to gloo on small messages (``2 (n - 1)`` Python-level
message round trips) and to come closer as messages grow; ``naive`` falls
behind as the world grows, since rank 0 moves ``2 (n - 1) · bytes``.
"""

from __future__ import annotations

import sys

from minddp.bench.collectives import main as collectives_main


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    op = "all_reduce"
    if "--op" in args:
        at = args.index("--op")
        op = args[at + 1] if at + 1 < len(args) else ""
        del args[at:at + 2]
    transports = "ring,naive" if op == "all_reduce" else "wire,ring,naive"
    return collectives_main(["--collectives", op, "--transports", transports, "--links", "none", *args])


if __name__ == "__main__":
    sys.exit(main())
