"""``python -m minddp.model``: the step-time model's command under its first name (:mod:`minddp.costmodel`)."""

import sys

from minddp.costmodel.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
