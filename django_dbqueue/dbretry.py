"""What counts as a transient database fault, and how a thread gets a fresh connection."""

from django.db import DatabaseError, InterfaceError, OperationalError, connections

# A lost connection surfaces as OperationalError (server gone, terminated) or InterfaceError
# (the connection object is already closed). Both are worth a reconnect and a retry.
DB_ERRORS = (OperationalError, InterfaceError)


def reset_connection(using):
    """Drop this thread's connection to ``using`` so the next query opens a new one."""
    connection = connections[using]
    try:
        connection.close()
    except DatabaseError:
        pass
    connection.connection = None
