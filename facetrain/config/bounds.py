"""Value ranges that several config sections share.

The upper bounds lie far beyond any real run, so an absurd value is a one-line error when the config
is checked, not an overflow (a Python int too big for a tensor size, a timedelta, a thread wait) deep
inside a rank.
"""

from __future__ import annotations

from facetrain.config.checks import Within

SEED = Within(0, 2**32, "[)")  # seeds are mixed into 64-bit generator seeds and numpy's non-negative ones
FRACTION = Within(0, 1, "[)")
PROBABILITY = Within(0, 1)
BATCH_SIZE = Within(1, 2**20)  # images a rank takes at once: 2**20 at 112x112 is ~150 GB of input
IMAGE_SIDE = Within(8, 8192)
