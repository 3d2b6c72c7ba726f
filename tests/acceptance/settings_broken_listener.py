"""Fast settings whose worker listener thread dies of an unexpected exception once connected.

Stands for a bug in a helper thread: the worker must not go on silently without it (polling
only), but stop and exit non-zero so that its supervisor restarts it. A worker runs a listener
thread only where its LISTEN goes to another alias (``LISTEN_DATABASE``, a direct connection
beside a pooler; otherwise it listens on its own connection), so these settings give it one:
the same database under a second alias.
"""

from django_dbqueue import notifications
from tests.acceptance.settings_fast import *  # noqa: F403
from tests.acceptance.settings_fast import DATABASES, FAST_DBQUEUE

DATABASES = {**DATABASES, "direct": dict(DATABASES["default"])}
DBQUEUE = {**FAST_DBQUEUE, "LISTEN_DATABASE": "direct"}


def _broken_listen(self, conn):
    raise RuntimeError("simulated bug in the listener thread")


notifications.Listener._listen = _broken_listen
