"""The fault-tolerant rung (``--stage ft``): training that survives a lost rank, after torchft's design.

Read in this order:

* :mod:`minddp.ft.coordinator`: the lighthouse, a process of its own that
  outlives any rank: per-step quorum, and one commit-or-discard decision per step;
* :mod:`minddp.ft.client`: a rank's side of it (heartbeat, ``quorum``, ``should_commit``);
* :mod:`minddp.ft.rung`: one rank's loop: quorum, a new group at the new world
  size, heal from a peer, the ``ddp`` stage's step, commit or discard;
* :mod:`minddp.ft.launch`: starts the lighthouse and the ranks, restarts the
  ranks that die, injects faults (:mod:`minddp.ft.faults`), reports each;
* :mod:`minddp.ft.task`: what is trained (a task gives the global batch of any step);
* :mod:`minddp.ft.report`: what a run did (each fault's recovery and rejoin, the timeline, the ranks'
  bitwise checks), one definition per measure, and the words they use (slot, rank, attempt, holder).
* :mod:`minddp.ft.diloco`: DiLoCo on the rung, one quorum per outer sync (``launch_ft(..., diloco=...)``),
  and :mod:`minddp.ft.manager`: the same sync under torchft's own ``Manager`` and lighthouse.

The other stages keep the classic contract: a rank that dies ends the run.
"""

from minddp.ft.faults import Fault, parse_faults
from minddp.ft.launch import FTRun, launch_ft
from minddp.ft.report import cold_start_s, consistency, fault_outcomes
from minddp.ft.task import ToyTask

__all__ = ["FTRun", "Fault", "ToyTask", "cold_start_s", "consistency", "fault_outcomes", "launch_ft", "parse_faults"]
