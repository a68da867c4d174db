"""``python -m minddp.bench``: every stage against torch's DDP and the no-communication limit, in one run.

A benchmark, not a test: it measures, it asserts nothing. One run:

1. **prepare** the train command's model and data (offline default: the
   tiny Llama on synthetic paraphrase pairs) and its settings (batch 8 per
   rank, 3 micro-batches, ``bucket_cap_mb`` 0.1, AdamW);
2. **launch** the ranks (:mod:`.worker`), ``--launches`` times (3), the
   rounds shared out over the launches: in each, every configuration
   (:mod:`.configs`: each stage, torch's DDP, each with ``noop_hook``,
   PowerSGD rank 1/4 and fp16 ours vs torch's, ``gradient_as_bucket_view``
   ours vs torch's) is built once and trained in turn, alternating over
   rounds in a shuffled order so noise hits all alike; then a short
   profiled window per configuration. Fresh processes per launch, because
   a launch's luck (which cores, memory and threads its processes got)
   stays with it for all its rounds;
3. **report** (:mod:`.report`): median and spread of step time, ratio to
   torch's DDP, exposed comm, overlap %, training-thread CPU time,
   all_reduce calls/bytes, peak memory (the launches pooled, :func:`.report.pool`); ``results.md``/``.csv``/``.json``
   and ``step_times.png`` in
   ``results/bench-<date>/``, ending with the targets judged (:mod:`.targets`).

``python -m minddp.bench overhead`` (:mod:`.overhead`) measures something
else: the host CPU a DDP wrapper costs per micro-batch, ``no_sync`` and
synced apart, on a model of many tiny parameters (what a launch-bound GPU
pays for every microsecond of Python per parameter).

``--pool DIR DIR ...`` runs nothing: it reads saved runs and judges them as
one run whose rounds are all of theirs (:func:`.report.pool`), for intervals
tighter than one run can give.

Example::

    $ python -m minddp.bench                          # full run, ~7 minutes on 2 CPU cores
    $ python -m minddp.bench --quick --stages ddp,torch --variants noop
    $ python -m minddp.bench --pool results/bench-A results/bench-B
"""

from minddp.bench.configs import VARIANTS, BenchConfig, bench_configs
from minddp.bench.report import COLUMNS, markdown_table, summarize, write_outputs

__all__ = ["VARIANTS", "BenchConfig", "bench_configs", "COLUMNS", "markdown_table", "summarize", "write_outputs"]
