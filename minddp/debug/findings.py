"""What a cross-rank check says on every rank: one line, ``<checker> (rank R): <cause>: <what>. Fix: <fix>``."""


class CrossRankError(RuntimeError):
    """Ranks disagree where they must not (the model, a collective, a gradient): raised on every rank."""


class DebugError(CrossRankError):
    """A bug debug mode found that would corrupt training or hang it: raised on every rank."""


class DebugWarning(UserWarning):
    """A finding of debug mode that does not corrupt the model (the same data on every rank): the run goes on."""


def finding(cause: str, what: str, fix: str, rank: int | None, by: str = "minddp") -> str:
    """The one line: who found it (``by``) on which rank, the cause, what and where (tensor or call, step), the fix."""
    return f"{by}{'' if rank is None else f' (rank {rank})'}: {cause}: {what}. Fix: {fix}"
