"""What counts as a transient database fault, and how a thread gets a fresh connection."""

import contextlib

import psycopg
from django.db import DatabaseError, InterfaceError, OperationalError, connections

# A lost connection surfaces as OperationalError (server gone, terminated) or InterfaceError
# (the connection object is already closed): Django's wrappers on Django connections, psycopg's
# own on a worker Session. Both are worth a reconnect and a retry.
DB_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
# Any other database error (a constraint, a missing table): logged, retried slowly.
OTHER_DB_ERRORS = (DatabaseError, psycopg.Error)


def reset_connection(using, session=None):
    """Drop this thread's connection to ``using`` (and ``session``) so the next query reconnects."""
    if session is not None:
        session.reset()
    connection = connections[using]
    with contextlib.suppress(DatabaseError):
        connection.close()
    connection.connection = None


def discard_connection(connection):
    """Close a Django connection a handler left inside a transaction, and clear the transaction
    state Django keeps for it, so that the thread's next job starts clean (closing alone leaves
    ``in_atomic_block`` set and every later query fails with "the connection is closed")."""
    with contextlib.suppress(DatabaseError):
        connection.close()
    connection.connection = None
    connection.in_atomic_block = False
    connection.atomic_blocks = []
    connection.savepoint_ids = []
    connection.needs_rollback = False
    connection.closed_in_transaction = False
    connection.autocommit = True
