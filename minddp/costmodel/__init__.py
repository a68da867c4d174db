"""The step-time model: what a stage's step becomes on another network, another bucket cap, more ranks.

Communication costs a step only where the training thread must wait for it.
The model separates the two: a **profile** of one step with the waiting
taken out (compute time, and when each message was handed over and needed
back), and a **link** (:mod:`minddp.comm.link`: ``α``, ``β`` and the ring
cost of each collective). Replaying the one on the other predicts the step
time, the exposed communication and the overlap.

Where the profile comes from:

* :mod:`.trace`: a profiled step of a run with ``--link`` (any link;
  ``loopback`` adds no delay), read from its trace: the model's own input
  for a stage, a cap and a rank count that were run;
* :mod:`.compute`: a compute profile (measured by :func:`~.compute.probe` on
  the bare model, or given as a speed for a model's size) and the stage's
  rules: for caps, stages and rank counts that were not run.

What uses it:

* :mod:`.step`: the profile, and :func:`~.step.predict` (the replay);
* :mod:`.auto`: ``--bucket-cap-mb auto``;
* ``python -m minddp.model validate`` (:mod:`.validate`): predicted against
  measured on the emulated link, every stage, 2-4 ranks, links and caps;
* ``python -m minddp.model project`` (:mod:`.project`): 2 … 1024 ranks on
  real links, and the blog's 4 × T4 setting;
* ``python -m minddp.model predict RUN`` (:mod:`.predict`): a run's profiled
  steps replayed on other links and rank counts.

``docs/scaling.md`` explains the model, its validation and the projections.

Example (on one rank; a tiny run with a link, profiled, then replayed on 8 ranks)::

    >>> import os, tempfile
    >>> from minddp.comm.link import Link
    >>> from minddp.comm.wire import Wire
    >>> from minddp.ladder import make_optimizer, wrap
    >>> from minddp.ladder.loop import train_step
    >>> from minddp.runtime.profiling import StepProfiler
    >>> link = Link("1gbit"); wire = Wire(None, link=link)        # every message through the emulated link
    >>> model = wrap("bucket-async", torch.nn.Linear(256, 256), bucket_cap_mb=25, wire=wire)
    >>> opt = make_optimizer("bucket-async", model, torch.optim.SGD, wire=wire, lr=0.01)
    >>> run = tempfile.TemporaryDirectory()
    >>> with StepProfiler(os.path.join(run.name, "bucket-async"), 0, total_steps=3, active=2, memory=False) as prof:
    ...     for step in range(3):                                     # one warm-up step, two profiled
    ...         _ = train_step(model, opt, [torch.ones(8, 256)], lambda m, x: m(x).sum())
    ...         prof.step()
    >>> link.annotate_trace(prof.path)                            # transfers placed: one a profiled step
    2
    >>> link.close()
    >>> from minddp.costmodel import predict, step_profiles
    >>> profiles = step_profiles(prof.path, "bucket-async", world=1)
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
