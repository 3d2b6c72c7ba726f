"""Fast settings with LISTEN off: a worker learns of a cancel from its heartbeat alone
(HEARTBEAT_INTERVAL 0.25 s), as behind PgBouncer in transaction mode."""

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import FAST_DBQUEUE

DBQUEUE = {**FAST_DBQUEUE, "LISTEN": False}
