"""The suite's one machine-wide choice: it runs on the CPU over gloo, on any machine.

``MINDDP_BACKEND=gloo`` makes every ``auto`` choice in minddp (the launcher, the train command
started as a subprocess, the notebook runner) pick gloo on the CPU, so a test's verdict is the
same on a laptop and on a GPU machine. Tests of the GPU path (``tests/test_gpu.py``) take the
variable away for their own launches and skip where there is no GPU.
"""

import os

os.environ["MINDDP_BACKEND"] = "gloo"
