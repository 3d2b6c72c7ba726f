"""Test settings with every worker timing shortened, for acceptance tests that wait on them.

Workers run with ``--settings tests.acceptance.settings_fast``. A test that enqueues jobs meant
for such a worker applies ``FAST_DBQUEUE`` in the test process too (``settings.DBQUEUE = ...``),
because a job's lease is fixed at enqueue time from the enqueuing process's settings.
"""

from tests.settings import *  # noqa: F403
from tests.settings import DBQUEUE as _BASE_DBQUEUE

FAST_DBQUEUE = {
    **_BASE_DBQUEUE,
    # A dead worker's jobs come back within ~4 s. Shorter leases were seen to expire under a
    # live worker when the shared server stalled for ~2 s (a checkpoint after a big test, other
    # suites running): correct at-least-once behaviour, but it breaks "ran exactly twice".
    "LEASE": 4.0,
    "HEARTBEAT_INTERVAL": 0.25,  # 16 beats per lease
    "SWEEP_INTERVAL": 0.2,
    "POLL_INTERVAL": 0.2,
    "BACKOFF_BASE": 0.1,  # a swept or failed job is retried almost at once
    "SHUTDOWN_GRACE": 3.0,
    "STATUS_INTERVAL": 0,
}

DBQUEUE = FAST_DBQUEUE
