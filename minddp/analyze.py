"""``python -m minddp.analyze``: the name the analysis command has always had (:mod:`minddp.analysis.__main__`)."""

import sys

from minddp.analysis.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
