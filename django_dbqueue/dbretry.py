"""What counts as a transient database fault, and how a thread gets a fresh connection."""

import contextlib

from django.db import DatabaseError, InterfaceError, OperationalError, connections

# A lost connection surfaces as OperationalError (server gone, terminated) or InterfaceError
# (the connection object is already closed). Both are worth a reconnect and a retry.
DB_ERRORS = (OperationalError, InterfaceError)


def reset_connection(using):
    """Drop this thread's connection to ``using`` so the next query opens a new one."""
    connection = connections[using]
    with contextlib.suppress(DatabaseError):
        connection.close()
    connection.connection = None
