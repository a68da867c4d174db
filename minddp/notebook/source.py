"""Show a stage's own code, and what changed from the stage before, straight from the package.

The notebooks never copy code into a cell: :func:`show_source` shows the code that runs
(:func:`inspect.getsource`), so a change to :mod:`minddp.stages` shows up at their next run.
"What changed" (:func:`stage_diff`, :func:`show_diff`) is a diff of **behaviour**, not of files:

1. every method (and class attribute) of each stage is resolved as Python resolves it (the first
   class in the MRO that defines it);
2. one resolved to the same function in both stages is listed as unchanged, one in only one stage is
   shown whole, one that resolves to two functions as a unified diff;
3. a new version that calls ``super()`` is marked: the old one still runs inside it.

``notebooks/README.md`` (*How the notebooks run*) says why.

Example::

    >>> from minddp.ladder import STAGES
    >>> print(stage_diff(STAGES["hook"], STAGES["hook-async"]))
    --- HookDDP.__init__  (minddp/stages/hook.py): kept, it runs where the line marked ' ' calls it
    +++ AsyncHookDDP.__init__  (minddp/stages/hook_async.py)
    ...
    --- HookDDP._sent  (minddp/stages/hook.py)
    +++ AsyncHookDDP._sent  (minddp/stages/hook_async.py)
    ...
"""

from __future__ import annotations

import difflib
import inspect
import re
import textwrap
from pathlib import Path

from torch import nn

ROOT = Path(__file__).resolve().parents[2]


def where(obj) -> str:
    """``minddp/stages/hook.py`` for code of this repository, else the module's name."""
    try:
        return str(Path(inspect.getsourcefile(obj)).resolve().relative_to(ROOT))
    except (TypeError, ValueError):
        return getattr(obj, "__module__", "?")


def source_of(obj) -> str:
    return textwrap.dedent(inspect.getsource(obj))


def show_source(obj) -> None:
    """Display ``obj``'s source (a class, a function, a method) with where it lives."""
    _show_markdown(f"`{where(obj)}`\n\n```python\n{source_of(obj).rstrip()}\n```")


def key_lines(cls: type, lines: list[tuple[str, str, str]]) -> str:
    """The one source line of ``cls`` that does each thing in ``lines``, ``(label, method, text)``: the line of
    method ``method`` (as ``cls`` resolves it) that contains ``text``, stripped, after ``label`` and the method's
    name; headed by where ``cls`` lives. A text found in no line of its method, or in several, raises
    ``ValueError``, so a renamed line stops a notebook's refresh instead of printing another line.

    Example::

        >>> from minddp.sharding.zero2 import Zero2DDP
        >>> print(key_lines(Zero2DDP, [("part 2", "__init__", "self.comm_hook = ")]))
        The lines that do each part (minddp/sharding/zero2.py):
          part 2, in __init__:  self.comm_hook = reduce_scatter_hook
    """
    shown = []
    for label, method, text in lines:
        found = [line.strip() for line in inspect.getsource(getattr(cls, method)).splitlines() if text in line]
        if len(found) != 1:
            raise ValueError(f"{cls.__name__}.{method} has {len(found)} lines with {text!r}, not 1")
        shown.append(f"  {label}, in {method}:  {found[0]}")
    return f"The lines that do each part ({where(cls)}):\n" + "\n".join(shown)


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain_doc(obj) -> str:
    """``obj``'s docstring as Markdown: reStructuredText roles (``:class:`~a.B```) become ```B```, double
    backquotes single ones, so a reader sees the prose, not the markup."""
    text = inspect.getdoc(obj) or ""
    text = _ROLE.sub(lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`" if "~" in m.group(0) else f"`{m.group(1)}`", text)
    return text.replace("``", "`").replace("::\n", ":\n")


def show_doc(obj) -> None:
    """Display :func:`plain_doc` with where it lives."""
    _show_markdown(f"`{where(obj)}`\n\n{plain_doc(obj)}")


def resolved(cls: type) -> dict[str, tuple[type, object]]:
    """Step 1: every name the stage's own classes define -> (the class whose definition runs, that object)."""
    own = [c for c in cls.__mro__ if c not in (nn.Module, object) and not c.__module__.startswith("torch.")]
    out = {}
    for klass in reversed(own):  # later (more derived) definitions win
        for name, value in vars(klass).items():
            if name.startswith("__") and name not in ("__init__",):
                continue
            if callable(value) or isinstance(value, (property, staticmethod, classmethod, bool, int, float, str)):
                out[name] = (klass, value)
    return out


def _text(klass: type, name: str, value) -> str:
    func = getattr(value, "__func__", value)
    if isinstance(func, property):
        func = func.fget
    if inspect.isfunction(func):
        return source_of(func)
    return f"{name} = {value!r}\n"


def stage_diff(before: type, after: type, context: int | None = None) -> str:
    """Steps 1-3 as text: the unified diffs of the methods that changed, then the names that did not.

    ``context``: lines kept around each change (default: the whole method), for a rung whose methods
    are long and change in a few places; a method new in ``after`` is then shown by its first lines (its
    signature and the first line of its docstring) and its length, not whole.
    """
    a, b = resolved(before), resolved(after)
    parts, same = [], []
    for name in sorted(set(a) | set(b), key=lambda n: (n != "__init__", n)):
        if name in a and name in b and a[name][1] is b[name][1]:
            same.append(name)
            continue
        old = _text(*a[name][:1], name, a[name][1]).splitlines(keepends=True) if name in a else []
        new = _text(*b[name][:1], name, b[name][1]).splitlines(keepends=True) if name in b else []
        if old == new:  # written again, word for word (a stage that holds its own copy)
            same.append(f"{name} (same code, in {where(b[name][0])})")
            continue
        if context is not None and not old and len(new) > 3:
            new = _brief(new)
        label_a = f"{a[name][0].__name__}.{name}  ({where(a[name][0])})" if name in a else "(not in the stage before)"
        label_b = f"{b[name][0].__name__}.{name}  ({where(b[name][0])})" if name in b else "(removed)"
        reached = _super_reaches(after, b[name][0], name) if name in b else None
        extends = name in a and any(f"super().{name}(" in line for line in new)
        if extends and reached is not None and reached[1] is a[name][1]:  # extended, not replaced: nothing removed
            diff = f"--- {label_a}: kept, it runs where the line marked ' ' calls it\n+++ {label_b}\n" + "".join(
                (" " if f"super().{name}(" in line else "+") + line for line in new
            )
            diff += (
                f"# {b[name][0].__name__}.{name} calls super(): {a[name][0].__name__}.{name} still runs, inside it\n"
            )
        else:
            keep = max(len(old), len(new)) if context is None else context
            diff = "".join(difflib.unified_diff(old, new, label_a, label_b, n=keep))
            if extends and reached is not None:  # super() reaches another class's method, not ``before``'s
                diff += (
                    f"# {b[name][0].__name__}.{name} calls super(), which runs {reached[0].__name__}.{name}, "
                    f"not {a[name][0].__name__}.{name}: {after.__name__} does not derive from {before.__name__}\n"
                )
        parts.append(diff)
    unchanged = f"# unchanged: {', '.join(same)}\n" if same else ""
    return "\n".join(parts) + ("\n" if parts else "") + unchanged


def _super_reaches(cls: type, klass: type, name: str) -> tuple[type, object] | None:
    """The (class, definition) that ``super().name`` inside ``klass``'s method reaches for an instance of ``cls``."""
    mro = cls.__mro__
    for parent in mro[mro.index(klass) + 1 :]:
        if name in vars(parent):
            return parent, vars(parent)[name]
    return None


def _brief(lines: list[str]) -> list[str]:
    """A new method in a few lines: up to its signature's end and its docstring's first line, then its length."""
    head = []
    for line in lines:
        head.append(line)
        if line.rstrip().endswith(":") and not line.lstrip().startswith("@"):
            break
    after = lines[len(head) :]
    if after and after[0].lstrip().startswith(('"' * 3, "'" * 3)):
        first, quotes = after[0].rstrip(), after[0].lstrip()[:3]
        closed = len(first.lstrip()) > 3 and first.endswith(quotes)
        head.append(first + ("\n" if closed else f" ...{quotes}\n"))  # a longer docstring: its first line, closed
    indent = len(after[0]) - len(after[0].lstrip()) if after else 4
    return head + [" " * indent + f"...  # {len(lines)} lines in all\n"]


def show_diff(before: type, after: type, context: int | None = None) -> None:
    """Display :func:`stage_diff` as a highlighted diff."""
    parent = ", ".join(f"`{c.__name__}`" for c in after.__bases__)
    lineage = (
        ""
        if before in after.__mro__
        else f" (`{after.__name__}` derives from {parent}, not from `{before.__name__}`: a line removed here is "
        f"`{before.__name__}`'s and does not run in `{after.__name__}`)"
    )
    _show_markdown(
        f"What changed from `{before.__name__}` to `{after.__name__}`, method by method{lineage}:\n\n"
        f"```diff\n{stage_diff(before, after, context).rstrip()}\n```"
    )


def _show_markdown(text: str) -> None:
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display({"text/markdown": text, "text/plain": text}, raw=True)  # the source in a text-only reading too
    else:
        print(text)
