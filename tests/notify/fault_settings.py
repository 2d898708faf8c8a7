"""Settings for the delivery fault test's worker: the project's, with short backoffs.

A receiver that hangs for half a minute and then answers should be tried again within seconds
of answering, not after the production schedule's minutes.
"""

from sparkops.settings import *  # noqa: F403

SPARKOPS_NOTIFY_BACKOFF = (1.0, 2.0, 4.0)
