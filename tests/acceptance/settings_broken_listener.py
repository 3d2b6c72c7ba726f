"""Fast settings whose worker listener thread dies of an unexpected exception once connected.

Stands for a bug in a helper thread: the worker must not go on silently without it (polling
only), but stop and exit non-zero so that its supervisor restarts it.
"""

from django_dbqueue import notifications
from tests.acceptance.settings_fast import *  # noqa: F403


def _broken_listen(self, conn):
    raise RuntimeError("simulated bug in the listener thread")


notifications.Listener._listen = _broken_listen
