"""One handler call inside a test, as a worker's handler thread makes it, on the test's thread.

A worker's handler runs in autocommit on its thread's connection. A test may hold a
transaction open there (Django's ``TestCase``, pytest-django's ``db``) that nothing commits, so
three things are arranged for each call, and undone after it:

- **A savepoint.** A statement that fails inside a transaction aborts it, where in autocommit
  it failed alone. A call that leaves the test's transaction aborted (or marked by Django to be
  rolled back: a failed ORM write marks its atomic block) is rolled back to the savepoint taken
  before it, its writes with it, so that its failure is recorded and the test goes on; a call
  that leaves it usable keeps its writes (the savepoint is released).
- **Side statements** (delivery records, ``connections.side_execute``) go to the test's own
  connection instead of a side connection, which could not see the test's uncommitted jobs and
  whose commits the test could not roll back. A side statement outlives its handler's rollback
  in production; here the statements are kept and run again after a call whose writes were
  rolled back (an atomic handler that raised, or the savepoint above), so the records end as a
  worker leaves them. Inside the test's transaction ``now()`` is the same for both runs of a
  statement, so the second writes what the first wrote.
- **Durable waits** (``ctx.sleep``, ``ctx.wait_for_signal``) are refused only inside a
  transaction the run opened (an atomic handler's), not inside the test's own.

An async handler's coroutine runs through asgiref's ``async_to_sync`` (:class:`HereLoop`), so that
its ORM calls run on the test's thread and connection.

In autocommit (``TransactionTestCase``, pytest-django's ``transactional_db``) nothing of this
applies: the call runs exactly as on a worker's thread, and side statements commit on a side
connection, closed when the helper returns.
"""

import asyncio
import contextlib

import psycopg
from asgiref.sync import async_to_sync
from django.db import connections, transaction

from .. import steps, store
from ..connections import close_side_connections, side_statements_to

# Django 6.1 renamed transaction.savepoint() savepoint_create() (the old name warns).
_savepoint = getattr(transaction, "savepoint_create", None) or transaction.savepoint


def in_transaction(using):
    """Whether the calling thread's connection to ``using`` is inside a transaction (a test's)."""
    return connections[using].in_atomic_block


def _aborted(using):
    """Whether the transaction open on ``using`` is aborted (a statement failed in it)."""
    raw = connections[using].connection
    info = getattr(raw, "info", None)
    return info is not None and info.transaction_status == psycopg.pq.TransactionStatus.INERROR


class HandlerCalls:
    """The set-up of handler calls on ``using`` (see the module's doc); one per helper call.

    ``with HandlerCalls(using) as calls:`` around the helper, then ``with calls.one(rolled_back)``
    around each handler call; ``rolled_back()`` (read after the call) says whether the handler
    rolled its own writes back (an atomic handler that did not commit)."""

    def __init__(self, using):
        self.using = using
        self.inside = in_transaction(using)
        self._side = []  # the side statements of the current call, to run again after a rollback
        self._stack = contextlib.ExitStack()

    def __enter__(self):
        if self.inside:
            self._stack.enter_context(side_statements_to(self._side_statement))
            self._stack.enter_context(steps.outer_transaction(self.using))
        return self

    def __exit__(self, *exc):
        try:
            self._stack.close()
        finally:
            # An atomic handler in autocommit records its deliveries on a side connection of
            # this thread (connections.side_execute): none is left behind.
            close_side_connections()
        return False

    def _side_statement(self, using, statement, params):
        rows = store.AliasSession(using).execute(statement, params)
        self._side.append((using, statement, params))  # only what went through is run again
        return rows

    @contextlib.contextmanager
    def one(self, rolled_back=lambda: False):
        """Around one handler call (see the module's doc)."""
        self._side = []
        if not self.inside:
            yield
            return
        broken = transaction.get_rollback(using=self.using)
        savepoint = _savepoint(using=self.using)
        try:
            yield
        finally:
            # Aborted in PostgreSQL, or marked so by Django (a failed ORM write marks the
            # atomic block it ran in to be rolled back).
            if _aborted(self.using) or (transaction.get_rollback(using=self.using) and not broken):
                transaction.set_rollback(False, using=self.using)  # or Django refuses to
                transaction.savepoint_rollback(savepoint, using=self.using)
                transaction.set_rollback(broken, using=self.using)
                lost = True
            else:
                transaction.savepoint_commit(savepoint, using=self.using)
                lost = rolled_back()
            side, self._side = self._side, []
            if lost:
                for using, statement, params in side:
                    store.AliasSession(using).execute(statement, params)


class _Coroutine:
    """What :class:`HereLoop` hands ``execution.run_handler`` as the task of an async handler."""

    __slots__ = ("cancelled", "coroutine")

    def __init__(self, coroutine):
        self.coroutine = coroutine
        self.cancelled = False

    def cancel(self):
        self.cancelled = True

    async def run(self):
        if self.cancelled:
            self.coroutine.close()
            raise asyncio.CancelledError
        return await self.coroutine


class HereLoop:
    """The event loop ``execution.run_handler`` runs an async handler on, for a test: the
    coroutine runs through asgiref's ``async_to_sync``, so that the handler's thread-sensitive
    calls (``sync_to_async``: its ORM calls, ``ctx.astep``) run on the calling thread, on its
    connection, inside the test's transaction. (A worker's handler thread runs its own loop, and
    those calls on asgiref's executor thread.) asgiref's loop thread ends with each call."""

    def create_task(self, coroutine):
        return _Coroutine(coroutine)

    def call_soon_threadsafe(self, callback, *args):
        callback(*args)

    def run_until_complete(self, task):
        return async_to_sync(task.run)()
