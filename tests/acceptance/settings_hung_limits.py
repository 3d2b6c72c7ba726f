"""Worker settings of tests/acceptance/test_hung_limits.py: short sweeps (from settings_fast), a
queue with a fleet-wide concurrency limit of 2, and leases of 10 s: a stopped worker's jobs stay
claimed that long after its last heartbeat, long enough for the test to look while its process
is held alive, short enough to wait for their recovery."""

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import FAST_DBQUEUE

HUNG_LIMITS_DBQUEUE = {
    **FAST_DBQUEUE,
    "QUEUES": {**FAST_DBQUEUE["QUEUES"], "limited2": {"global_concurrency": 2}},
    "LEASE": 10.0,
}

DBQUEUE = HUNG_LIMITS_DBQUEUE
