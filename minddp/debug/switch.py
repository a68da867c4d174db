"""Debug mode's switch: on while its checks are plugged in here (the package's docstring says why so small)."""

#: Debug mode's checks for a wrapper (:func:`minddp.debug.watch.checks_for`) while it is on; None while off.
checks = None


def enabled() -> bool:
    """Is debug mode on in this process (``MINDDP_DEBUG=1`` at import, or :func:`minddp.debug.enable`)?"""
    return checks is not None


def attach(wrapper):
    """Every wrapper's constructor calls this: debug mode's checks on ``wrapper`` while it is on (None: off)."""
    return None if checks is None else checks(wrapper)
