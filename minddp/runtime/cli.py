"""What the command-line tools (``train``, ``bench``, ``analyze``) share: one parser, one error, one help format.

One style for all three, so that a user who learned one can read the others:

* **the same name means the same thing**: an option two tools share is
  defined once (the train command's :class:`minddp.train.config.TrainConfig`
  field: flag, type, metavar, help, choices) and the benchmark borrows it;
* **the same metavars**: ``N`` for a count, ``SECONDS``, ``MIB``, ``DIR``,
  ``FILE``, ``NAME``, ``LIST`` for a comma list (:data:`METAVARS`);
* **grouped help**: options in named sections, each default shown where it
  is a value (``None`` shows nothing: the help then says what it means),
  booleans as ``--x/--no-x (default: on)``;
* **examples** in every help's epilog;
* **bad input** is answered with a short usage line and one error line that
  names the cause and the fix, exit code 2, never a traceback: :class:`Parser`
  turns argparse's complaints into a :class:`UsageError`, each tool's ``main``
  prints it with :func:`fail`. Numbers are checked when parsed: ``nan`` and
  ``inf`` are refused wherever a finite number is meant (:func:`number`).

Example::

    >>> parser = Parser(prog="python -m minddp.bench", usage="python -m minddp.bench [options]")
    >>> parser.parse_args(["--nope"])
    Traceback (most recent call last):
    minddp.runtime.cli.UsageError: unrecognized arguments: --nope (see python -m minddp.bench --help)
"""

from __future__ import annotations

import argparse
import math
import sys


class UsageError(ValueError):
    """A bad or contradictory option; the message is one line: cause and fix."""


#: One metavar per kind of value, the same in every tool.
METAVARS = {
    "count": "N",
    "seconds": "SECONDS",
    "mib": "MIB",
    "dir": "DIR",
    "file": "FILE",
    "name": "NAME",
    "list": "LIST",
    "number": "X",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Show each option's default (not where it is None: the help says what None means); keep the epilog's lines."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is None or action.default is argparse.SUPPRESS or "(default" in text:
            return text
        if isinstance(action, argparse.BooleanOptionalAction):
            return f"{text} (default: {'on' if action.default else 'off'})"
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return text
        return f"{text} (default: {action.default})"

    def __init__(self, prog, **kwargs):
        kwargs.setdefault("max_help_position", 34)
        super().__init__(prog, **kwargs)


class Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` (one line) instead of printing usage and exiting.

    ``examples``: command lines (with a short comment each) for the epilog.
    """

    def __init__(self, *args, examples: list[str] | None = None, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        if examples:
            kwargs["epilog"] = "examples:\n" + "\n".join(f"  {line}" for line in examples)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")

    def short_usage(self) -> str:
        return self.format_usage().strip()


def fail(prog: str, exc: BaseException, parser: Parser | None = None) -> int:
    """Print the usage line (with a parser) and ``prog: error: <one line>`` on stderr; return 2 (bad input)."""
    if parser is not None:
        print(parser.short_usage(), file=sys.stderr)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    print(f"{prog}: error: {text}", file=sys.stderr, flush=True)
    return 2


def number(
    kind: type = float,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    zero_means: str | None = None,
):
    """An argparse ``type``: a finite ``kind`` in [low, high] (``low_open``: above low), or a one-line refusal.

    ``float("nan")`` passes every comparison as False, so ``x <= 0`` alone lets
    it through; this checks finiteness first. ``zero_means`` is said in the
    message when 0 is allowed and special (e.g. "off").
    """

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if low is not None and (value <= low if low_open else value < low):
            bound = f"above {low:g}" if low_open else f"at least {low:g}"
            extra = f" (0 = {zero_means})" if zero_means else ""
            raise argparse.ArgumentTypeError(f"must be {bound}{extra}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g}, got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def fresh_line() -> str:
    """What to print before a message that may follow a progress bar on stderr, so it starts a line of its own.

    A rank's tqdm bar leaves the cursor at the end of its line. On a terminal,
    return to the start and clear the line; in a log file (no terminal),
    start a new line. While no bar is drawn (:func:`bar_drawn` False), nothing.
    """
    if not _bar[0]:
        return ""
    try:
        return "\r\x1b[K" if sys.stderr.isatty() else "\n"
    except (AttributeError, ValueError):  # a closed or replaced stream
        return "\n"


_bar = [False]


def bar_drawn(drawn: bool) -> None:
    """Say whether a progress bar may be on stderr now (the train command's ranks draw one)."""
    _bar[0] = drawn


def described(doc: str) -> str:
    """A command's ``--help`` description: its module docstring's first line, less a leading rST ``name``: label.

    >>> described("``python -m minddp.doctor``: does this machine run minddp, and how?\\n\\nMore.")
    'does this machine run minddp, and how?'
    """
    first = doc.strip().splitlines()[0]
    return first.split(": ", 1)[1] if first.startswith("``") and "``: " in first else first
