"""Settings for the cancellation acceptance tests whose cancel must arrive by notification.

The heartbeat, the other way a worker learns of a cancel, is slowed to 5 s here, so that a job
ending cancelled well within 2 s proves that the notification reached the worker (its own
listener, or under ``--processes`` the group's listener and the pipe to the right child).
"""

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import FAST_DBQUEUE

# PREFETCH 0: a worker claims no job ahead of a free thread, so that under --processes 2 with
# one thread each, two jobs land in two different children.
CANCEL_DBQUEUE = {**FAST_DBQUEUE, "HEARTBEAT_INTERVAL": 5.0, "LEASE": 20.0, "PREFETCH": 0}

DBQUEUE = CANCEL_DBQUEUE
