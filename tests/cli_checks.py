"""What every CLI error looks like, for the tests of train, bench and analyze: a usage line, then one error line."""

from __future__ import annotations


def usage_error(err: str, prog: str, fragment: str = "") -> str:
    """Assert ``err`` (stderr) is ``usage: python -m minddp.<prog> ...`` plus one ``minddp.<prog>: error: ...`` line
    holding ``fragment``, and no traceback; return the error line."""
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    usage, error = lines
    assert usage.startswith(f"usage: python -m minddp.{prog} "), err
    assert error.startswith(f"minddp.{prog}: error: ") and fragment in error, err
    assert "Traceback" not in err
    return error
