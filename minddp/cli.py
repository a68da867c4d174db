"""What the command-line tools (``train``, ``bench``, ``analyze``) share: one parser, one error, one help format.

Bad input is part of the interface: every tool answers it with one line that
names the cause and the fix, and exit code 2. :class:`Parser` turns
argparse's own complaints into a :class:`UsageError` with that shape, so each
tool's ``main`` prints it the same way (:func:`fail`).

Example::

    >>> parser = Parser(prog="python -m minddp.bench")
    >>> parser.parse_args(["--nope"])
    UsageError: unrecognized arguments: --nope (see python -m minddp.bench --help)
"""

from __future__ import annotations

import argparse
import sys


class UsageError(ValueError):
    """A bad or contradictory option; the message is one line: cause and fix."""


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show each option's default, except where it is None (the help then says what None means)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` (one line) instead of printing usage and exiting."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def fail(prog: str, exc: BaseException) -> int:
    """Print ``prog: error: <one line>`` on stderr; the exit code of bad input (2)."""
    print(f"{prog}: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
    return 2
