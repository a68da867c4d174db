"""matplotlib backend for notebook ranks: draw off-screen, let ``plt.show()`` return at once.

A rank has no screen. With plain ``Agg``, ``plt.show()`` warns that it cannot
show anything; here it does nothing, and the figure stays open until the
worker renders every open figure to PNG at the end of the cell and sends it
to the notebook (the way the inline backend of Jupyter behaves).

Example::

    >>> import matplotlib
    >>> matplotlib.use("module://minddp.notebook.mpl_backend")
"""

from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401


def show(*args, **kwargs) -> None:
    """Nothing to do: the worker collects open figures after the cell."""
