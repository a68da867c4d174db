"""The doctor's command line: the checks (:mod:`minddp.doctor`), or with ``--gpu-report`` / ``--gpu-wheels``
the GPU report (:mod:`minddp.doctor.gpu_report`)."""

from __future__ import annotations

import sys

from minddp.doctor import main as checks_main
from minddp.doctor.gpu_report import main as report_main

REPORT_FLAGS = ("--gpu-report", "--gpu-wheels")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a.split("=")[0] in REPORT_FLAGS for a in args):
        return report_main(args)
    return checks_main(args)


if __name__ == "__main__":
    sys.exit(main())
