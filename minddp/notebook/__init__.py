"""Run notebook cells on N real ranks that keep their state between cells.

Two ways in:

* plain Python: :class:`Cluster` (``Cluster(2).start().run("...")``), returning
  one :class:`RankOutput` per rank;
* Jupyter: ``%load_ext minddp.notebook``, then ``%dist_init --world-size 2``,
  ``%%distributed`` / ``%%rank 0`` cells, ``%dist_status``, ``%dist_shutdown``
  (see :mod:`minddp.notebook.magics`).

For the step-through notebooks in ``notebooks/``: :mod:`~minddp.notebook.lesson`
(the one workload and settings every notebook trains, and ``Trainee`` to run a
stage on the ranks), :mod:`~minddp.notebook.source` (a stage's code and what
changed from the stage before, read from the package),
:mod:`~minddp.notebook.nodes` (notebook 09's step read by autograd node) and
:mod:`~minddp.notebook.refresh` (``python -m minddp.notebook.refresh``: run the
notebooks from their ``.py`` sources and save them with their outputs).

Example::

    >>> from minddp.notebook import Cluster
    >>> with Cluster(world_size=2) as cluster:
    ...     outs = cluster.run("t = torch.ones(1) * (rank + 1); dist.all_reduce(t); t.item()")
    >>> [o.value for o in outs]
    [3.0, 3.0]
"""

from minddp.notebook.cluster import CellError, Cluster, RankOutput
from minddp.notebook.magics import current_cluster, load_ipython_extension, unload_ipython_extension

__all__ = [
    "Cluster",
    "RankOutput",
    "CellError",
    "current_cluster",
    "load_ipython_extension",
    "unload_ipython_extension",
]
