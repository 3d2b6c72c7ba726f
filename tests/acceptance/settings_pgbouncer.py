"""Workers behind PgBouncer in transaction mode: every statement through the pooler, LISTEN on a
direct connection (``DBQUEUE_DIRECT_LISTEN=1``) or none at all (the poll only).

``DBQUEUE_PGBOUNCER_PORT`` is the port of the test's private PgBouncer; its database of the same
name as the test database leads to the test database.
"""

import os

from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import DATABASES, FAST_DBQUEUE

_direct = dict(DATABASES["default"])
DATABASES = {
    "default": {
        **_direct,
        "HOST": "127.0.0.1",
        "PORT": os.environ["DBQUEUE_PGBOUNCER_PORT"],
        "CONN_MAX_AGE": None,
    },
    "direct": _direct,
}
DBQUEUE = {
    **FAST_DBQUEUE,
    "PREPARE": False,  # PgBouncer before 1.21 keeps no prepared statements across transactions
    "POLL_INTERVAL": float(os.environ.get("DBQUEUE_POLL", "30")),
}
if os.environ.get("DBQUEUE_DIRECT_LISTEN") == "1":
    DBQUEUE["LISTEN_DATABASE"] = "direct"
else:
    DBQUEUE["LISTEN"] = False
