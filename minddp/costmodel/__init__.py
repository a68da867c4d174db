"""The step-time model: what a stage's step becomes on another network, another bucket cap, more ranks.

Communication costs a step only where the training thread must wait for it, so the model replays a
**profile** of one step with the waiting taken out (:mod:`.step`; read from a run's trace by
:mod:`.trace`, or built from compute timings by :mod:`.compute`) on a **link** (:mod:`minddp.comm.link`)
and predicts the step time, the exposed communication and the overlap (:func:`~.step.predict`). Its
users: ``--bucket-cap-mb auto`` (:mod:`.auto`), ``python -m minddp.model validate | project |
predict`` (:mod:`.validate`, :mod:`.project`, :mod:`.runs`), and the bucket lesson of
``notebooks/03_build_up.py`` (:mod:`.buckets`: what a bucket plan costs, links sized to a machine).
docs/scaling.md, section 3, explains the model, its validation and the projections.

Example (on one rank; a tiny run with a link, profiled, then replayed on 8 ranks)::

    >>> import os, tempfile
    >>> from minddp.costmodel.trace import tiny_run_on_link
    >>> run = tempfile.TemporaryDirectory()
    >>> path = tiny_run_on_link(run.name, "1gbit")                # bucket-async, 3 steps, its messages on 1gbit
    >>> from minddp.costmodel import predict, step_profiles
    >>> profiles = step_profiles(path, "bucket-async", world=1)
    >>> predict(profiles[0], "1gbit", world=8).row()              # timings: they depend on this machine
    {'step_ms': ..., 'compute_ms': ..., 'exposed_ms': ..., 'comm_ms': ..., 'overlap_pct': ..., ...}
"""

from minddp.costmodel.compute import ComputeProfile, from_throughput, probe, synthesize
from minddp.costmodel.step import WAITS, Message, Prediction, StepProfile, predict
from minddp.costmodel.trace import ProfileError, step_profiles, typical

__all__ = [
    "WAITS",
    "Message",
    "StepProfile",
    "Prediction",
    "predict",
    "ComputeProfile",
    "probe",
    "synthesize",
    "from_throughput",
    "ProfileError",
    "step_profiles",
    "typical",
]
