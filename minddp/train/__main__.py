"""``python -m minddp.train``: the train command (:mod:`minddp.train.run`)."""

import sys

from minddp.train.run import main

if __name__ == "__main__":
    sys.exit(main())
