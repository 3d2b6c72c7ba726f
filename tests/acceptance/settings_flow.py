"""Worker settings of the flow-control acceptance tests: short leases and sweeps (from
settings_fast) and a queue with each fleet-wide rule."""

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import FAST_DBQUEUE

FLOW_DBQUEUE = {
    **FAST_DBQUEUE,
    "QUEUES": {
        **FAST_DBQUEUE["QUEUES"],
        "limited": {"global_concurrency": 3},
        "rated": {"rate_limit": {"limit": 5, "period": 1.0}},
        "pausable": {},
    },
    "POLL_INTERVAL": 2.0,  # the rules must not rely on a hot poll to make progress
}

DBQUEUE = FLOW_DBQUEUE
