"""``python -m minddp.bench``: every stage against torch's DDP and the no-communication limit, in one run.

A benchmark, not a test: it measures, it asserts nothing. One run:

1. **prepares** the train command's model, data and settings (offline default: the tiny Llama on
   synthetic paraphrase pairs);
2. **launches** the ranks (:mod:`.worker`) ``--launches`` times, the rounds shared out over them; in
   each round every configuration (:mod:`.configs`) trains in turn, in a shuffled order, then a short
   profiled window per configuration;
3. **reports** (:mod:`.report`) step time, ratio to torch's DDP, comm cost, overlap, CPU time,
   all_reduce traffic and peak memory into ``results/bench-<date>/``, with the targets judged
   (:mod:`.targets`).

``python -m minddp.bench overhead`` (:mod:`.overhead`) measures the host CPU a wrapper costs per
micro-batch; ``--pool DIR DIR ...`` judges saved runs as one. ``docs/benchmarks.md`` has the latest
results, the caveats and the method (*Method*: why launches and turns, what each column measures).

Example::

    $ python -m minddp.bench                          # full run, ~7 minutes on 2 CPU cores
    $ python -m minddp.bench --quick --stages ddp,torch --variants noop
    $ python -m minddp.bench --pool results/bench-A results/bench-B
"""

from minddp.bench.configs import VARIANTS, BenchConfig, bench_configs
from minddp.bench.report import COLUMNS, markdown_table, summarize, write_outputs

__all__ = ["VARIANTS", "BenchConfig", "bench_configs", "COLUMNS", "markdown_table", "summarize", "write_outputs"]
