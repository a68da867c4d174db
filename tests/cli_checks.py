"""For the tests of the commands: the small run they train, and what every CLI error looks like (a usage line,
then one error line)."""

from __future__ import annotations

#: A train command run small enough for a test: 4 examples x 2 micro-batches per rank, 32 tokens, 16 to evaluate.
SMALL_RUN = "--batch-size 4 --grad-accum 2 --max-seq-len 32 --eval-examples 16 --no-progress".split()


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


def refused_before_any_rank(argv: list[str], cause: str, capsys, monkeypatch) -> None:
    """``python -m minddp.train argv`` exits 2 with a usage line and one error line holding ``cause``, and starts no
    rank (its ``launch`` is replaced by one that fails the test)."""
    from minddp.train import run as train

    def no_launch(*a, **k):
        raise AssertionError("a rank was started for bad input")

    monkeypatch.setattr(train, "launch", no_launch)
    assert train.main(argv) == 2
    usage_error(capsys.readouterr().err, "train", cause)
