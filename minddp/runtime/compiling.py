"""What ``torch.compile`` sees of a wrapper: its forward run as Python, its module compiled and cut.

1. :func:`eager_under_compile` (at construction): Dynamo runs the wrapper's ``forward`` frames as Python and
   compiles what they call, the module: no graph break of minddp's making in ``torch.compile(wrapper)``; the
   wrapper's methods marked :func:`runs_as_python` run as Python with all they call;
2. :func:`split_at_buckets` (around the module's call): while the module runs compiled, Dynamo's
   ``DDPOptimizer`` cuts its graph into pieces of at least a bucket's bytes each, as for torch's DDP, so a
   bucket is sent once the piece that produces its last gradient has run its backward, not at the end of the
   whole backward. An eager forward leaves torch as it is.

Step 1 never touches a class. Dynamo decides by code object, for the whole process: were a class's
``forward`` marked, every wrapper of that class, built before or after, would run it as Python (a later
``torch.compile(SimpleDDP(model))`` would compile differently once anything had marked ``SimpleDDP.forward``).
So a wrapper that asks is moved to its class's *eager twin* (:func:`eager_twin`: a subclass of the same name,
made once per class) whose forwards are copies of its classes' forwards, each with a code object of its own,
passed through the public ``torch.compiler.disable(..., recursive=False)``.

Torch-level mechanism (Dynamo's frame skip, the bucket sizes Dynamo reads: ``runtime/compat.py``), so it lives
in the runtime, below every wrapper, and knows none of them: ``ddp`` and ``zero2`` take both steps themselves;
the teaching stages stay plain (their files show the idea, not this) and :func:`minddp.ladder.compile_ready`
gives one both steps, called by :func:`minddp.ladder.build_stage` when the module it wraps is compiled (as
``--compile`` does).

Why, and the limits: ``docs/ddp.md`` (*Compiled*). Example::

    >>> from minddp import SimpleDDP
    >>> twin = eager_twin(SimpleDDP)                  # what eager_under_compile(SimpleDDP(model)) moves it to
    >>> twin.__name__, issubclass(twin, SimpleDDP), twin.forward is SimpleDDP.forward, eager_twin(twin) is twin
    ('SimpleDDP', True, False, True)
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch
from torch import nn

from minddp.runtime import compat

MB = 1024 * 1024  # the caps are in MiB, as every wrapper takes them


def runs_as_python(method):
    """Mark a wrapper's ``method`` to run as Python under ``torch.compile``, with all it calls (its eager twin
    passes it through ``torch.compiler.disable``): the Python Dynamo cannot trace, a graph walk, tensor hooks."""
    method.runs_as_python = True
    return method


def eager_under_compile(wrapper: nn.Module) -> None:
    """Step 1: Dynamo runs the wrapper's own ``forward`` frames as Python and compiles the frames they call."""
    wrapper.__class__ = eager_twin(type(wrapper))


@functools.cache
def eager_twin(cls: type) -> type:
    """``cls`` as ``torch.compile`` should see it: a subclass of the same name, one link per class that defines a
    ``forward`` (so each copy's ``super()`` reaches the next copy), and the methods marked :func:`runs_as_python`.

    Only minddp's forwards run as Python; a forward of a subclass of the user's is compiled, as it was.
    """
    if vars(cls).get("eager_twin_of") is not None:
        return cls
    owners = [c for c in cls.__mro__ if "forward" in vars(c) and not c.__module__.startswith("torch.")]
    twin = cls
    for owner in reversed(owners):  # the deepest first: each link is the base of the one above it
        twin = type(cls.__name__, (twin,), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        forward = _own_copy(vars(owner)["forward"], twin)
        twin.forward = torch.compiler.disable(forward, recursive=False) if _minddp(owner) else forward
    marked = {name for c in cls.__mro__ for name, f in vars(c).items() if getattr(f, "runs_as_python", False)}
    for name in marked:
        setattr(twin, name, torch.compiler.disable(getattr(cls, name)))
    twin.eager_twin_of = cls
    twin.__reduce_ex__ = _pickled_as_built  # a twin has no name to import: pickled as ``cls``, twinned when loaded
    return twin


def _pickled_as_built(wrapper: nn.Module, protocol: int):
    """``copy.deepcopy`` and ``torch.save`` of a wrapper on its eager twin: its class's own state, rebuilt by
    :func:`_built_again`."""
    return _built_again, (type(wrapper).eager_twin_of, wrapper.__getstate__())


def _built_again(cls: type, state: dict) -> nn.Module:
    """A pickled wrapper loaded: an instance of ``cls`` with ``state``, moved to its eager twin again."""
    wrapper = cls.__new__(cls)
    wrapper.__setstate__(state)
    eager_under_compile(wrapper)
    return wrapper


def _minddp(cls: type) -> bool:
    return cls.__module__.startswith("minddp.")


def _own_copy(fn: types.FunctionType, owner: type) -> types.FunctionType:
    """``fn`` with a code object of its own (Dynamo's mark on it is its alone), its ``super()`` counted from
    ``owner``."""
    cells = tuple(
        types.CellType(owner) if name == "__class__" else cell
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ())
    )
    copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, cells or None)
    copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = fn.__kwdefaults__, fn.__qualname__, fn.__doc__
    return copy


@contextlib.contextmanager
def split_at_buckets(module: nn.Module, bucket_cap_mb: float | None, first_bucket_cap_mb: float | None = None):
    """Step 2: while ``module`` runs compiled, Dynamo cuts each graph it compiles into pieces the size of the buckets.

    Compiled: ``module`` is ``torch.compile(model)``, or the wrapper is (this call is inside a compiled call).
    ``first_bucket_cap_mb``: the first bucket's (``None``: as the others); ``bucket_cap_mb=None`` (one bucket)
    cuts nothing. An eager module runs with torch untouched. (A generator, as the context it enters: Dynamo
    never compiles a generator's frame, so what decides runs as Python inside ``torch.compile(wrapper)`` too.)
    """
    if bucket_cap_mb is None:
        yield
        return
    with compat.ddp_optimizer_caps(module, int(bucket_cap_mb * MB), int((first_bucket_cap_mb or bucket_cap_mb) * MB)):
        yield
