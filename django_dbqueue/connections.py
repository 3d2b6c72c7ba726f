"""Every database connection django-dbqueue opens itself, and what counts as losing one.

Three kinds, all built from the Django ``DATABASES`` entry of the queue's alias:

- ``Session``: a worker's own psycopg connection for its hot statements (claims, completions,
  lease extensions), prepared and optionally committed without waiting for the WAL flush; it
  also LISTENs when the worker listens for itself.
- A listener's connection (notifications.Listener): LISTEN on a connection of its own, where it
  must go elsewhere (behind PgBouncer in transaction mode, to the server directly:
  ``LISTEN_DATABASE``) and for a ``--processes`` group's listener.
- A delivery record's side connection (``side_execute``): inside an atomic handler, a delivery
  record must commit before the side effect, whatever later happens to the handler's own
  transaction.

Everything else runs on the calling thread's ordinary Django connection.
"""

import collections
import contextlib
import logging
import threading

import psycopg
from django.core.signals import request_finished
from django.db import DatabaseError, InterfaceError, OperationalError, connections

logger = logging.getLogger("django_dbqueue")

# A lost connection surfaces as OperationalError (server gone, terminated) or InterfaceError
# (the connection object is already closed): Django's wrappers on Django connections, psycopg's
# own on a worker Session. Both are worth a reconnect and a retry.
DB_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
# Any other database error (a constraint, a missing table): logged, retried slowly.
OTHER_DB_ERRORS = (DatabaseError, psycopg.Error)
# A statement of a worker's Session that waited for a lock past the session's lock_timeout:
# another transaction holds a row (or a table) it needs. Not a lost connection (it is one of
# DB_ERRORS' classes, so catch it first): what it wanted to write is tried again later.
BUSY_ERRORS = (psycopg.errors.LockNotAvailable,)


class PlannedOnce(str):
    """A statement that a worker's Session runs with a generic plan, made once per connection
    (``plan_cache_mode = force_generic_plan``, see ``Session._plan_mode``); every other
    statement is planned for each execution's own values. The two that run for every batch
    are marked so where they are written (``CLAIM_JOBS`` in store/claiming.py, ``COMPLETE_HELD_JOBS``
    in store/completion.py): planning them cost more than running them (0.5 and 0.9 ms against
    1.3 and 1.0 ms for a batch of 50 in EXPLAIN ANALYZE). Each one has a plan that fits every size of
    batch and table, which tests/integration/test_plans.py checks; a statement marked so needs
    the same. The text is the statement's own (a ``str``); anything derived from it (an
    ``EXPLAIN`` prefix, a ``replace()``) is a plain ``str`` and planned for its values."""

    __slots__ = ()


# The backend of a session, taken when it connects: its pid and start (a pid alone may be reused
# by a later backend). Read again after a lost connection (TERMINATE_LOST_BACKEND).
SESSION_BACKEND = """
SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()
"""

# After a lost connection, before RELEASE_UNKNOWN_JOBS: end the session's old backend and wait
# until it is gone. The client side may be gone while the backend still runs the last statement
# (waiting on a lock, or for its commit): a claim it commits after the release has looked is
# never released, and its jobs sit out their lease and spend an attempt. Once that backend is
# gone, its transaction has committed or rolled back, and the release's snapshot sees which.
# No row: it is gone already. A false: still there after the wait (try again).
TERMINATE_LOST_BACKEND = """
SELECT pg_terminate_backend(pid, %(wait_ms)s::bigint) FROM pg_stat_activity
WHERE pid = %(pid)s::int AND backend_start = %(started)s::timestamptz
"""

# Keys of Django's connection parameters that are not libpq connection options.
_NOT_CONNINFO = {
    "context",
    "cursor_factory",
    "prepare_threshold",
    "server_side_binding",
    "isolation_level",
    "assume_role",
    "pool",
    "autocommit",
}


def connection_params(using):
    """libpq keyword arguments for a new psycopg connection to database ``using``."""
    params = connections[using].get_connection_params()
    return {key: value for key, value in params.items() if key not in _NOT_CONNINFO}


def _assume_role(using):
    """The role Django's ``OPTIONS["assume_role"]`` switches to after connecting, or ``None``."""
    options = connections[using].settings_dict.get("OPTIONS") or {}
    return options.get("assume_role") or None


def connect(using, *, autocommit=True, **kwargs):
    """A new psycopg connection to ``using``, set up as Django sets up its own (``assume_role``)."""
    conn = psycopg.connect(**connection_params(using), autocommit=autocommit, **kwargs)
    role = _assume_role(using)
    if role:
        try:
            conn.execute(psycopg.sql.SQL("SET ROLE {}").format(psycopg.sql.Identifier(role)))
            if not autocommit:
                conn.commit()
        except psycopg.Error:
            conn.close()
            raise
    return conn


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


class Session:
    """A lazily opened psycopg connection in autocommit; ``reset()`` drops it after a fault.

    The claim loop runs a handful of statements thousands of times. They are prepared once
    (``prepare``); claims, completions and lease extensions ask for an asynchronous commit in the
    statement itself (see store/), failures, dead letters and releases commit durably.

    Behind PgBouncer in transaction mode set ``PREPARE`` to False, also where it keeps prepared
    statements (1.21 and newer): a preparing session SETs its plan mode, which a transaction
    pooler would leave on other clients' server connections. A session that finds its prepared
    statements gone says so and stops preparing. ``ASYNC_COMMIT`` travels with each statement
    and works through a pooler.

    With ``listen`` (a channel), the session also LISTENs, at every (re)connection: the
    notifications it receives, while a statement runs or while its owner waits on its socket
    (:meth:`listening_fileno`, :meth:`read_notifies`), are queued in ``notifies`` for the owner,
    and ``on_notify()`` is called (from whichever of those it was). One connection then serves
    both, and the backend that delivered a notification is the one that runs the claim it
    causes: it is awake, where a second connection's backend would have to be woken first.
    """

    APPLICATION_NAME = "dbqueue worker"  # unless the database's OPTIONS name one

    def __init__(
        self,
        using,
        *,
        prepare=True,
        listen=None,
        on_notify=None,
        track_backend=False,
        lock_timeout=None,
    ):
        self.using = using
        self.track_backend = track_backend  # note the backend at connect (end_lost_backends)
        # Seconds a statement may wait for a lock before it fails with BUSY_ERRORS: set on the
        # connection (SET lock_timeout) when its backend is its own, never through a pooler,
        # which would leave it on other clients' server connections.
        self.lock_timeout = lock_timeout
        self.prepare = prepare
        self.listen = listen
        self.on_notify = on_notify
        self.notifies = collections.deque()  # payloads received, for the owner to take
        self.listening = threading.Event()  # set while the connection LISTENs
        self.conn = None
        self.generic = False  # the connection's plan_cache_mode is force_generic_plan
        self.statements = 0  # executed, for tests that pin the hot paths' query counts
        # With track_backend: (pid, backend_start) of the connection's server backend, when it
        # is one of its own (not a pooler's, whose server connections serve other clients too),
        # taken with one statement per connect; and those of connections dropped since, until
        # end_lost_backends() saw them gone.
        self.backend = None
        self.lost_backends = collections.deque(maxlen=8)

    def _connect(self):
        kwargs = {"prepare_threshold": 0 if self.prepare else None}
        if self.listen is not None and "application_name" not in connection_params(self.using):
            kwargs["application_name"] = f"{self.APPLICATION_NAME} (LISTEN {self.listen})"
        conn = connect(self.using, **kwargs)
        try:
            if self.prepare:
                # Prepared, and planned for each execution's own values, except the statements
                # marked PlannedOnce (see _plan_mode): a generic plan made for statements not
                # written for it was seen to pick a sequential scan of the whole table.
                conn.execute(_PLAN_MODE[False][0], prepare=False)
            if self.listen is not None:
                conn.add_notify_handler(self._notified)
                conn.execute(
                    psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.listen)),
                    prepare=False,
                )
            if self.track_backend or self.lock_timeout:
                backend = self._own_backend(conn)
                if self.track_backend:
                    self.backend = backend
                if self.lock_timeout and backend is not None:
                    conn.execute(
                        psycopg.sql.SQL("SET lock_timeout = {}").format(
                            psycopg.sql.Literal(max(1, round(self.lock_timeout * 1000)))
                        ),
                        prepare=False,
                    )
        except BaseException:
            conn.close()
            raise
        self.conn = conn
        self.generic = False
        if self.listen is not None:
            self.listening.set()

    @staticmethod
    def _own_backend(conn):
        """``(pid, backend_start)`` of the server backend behind ``conn``, or None when the pid
        libpq was given at connection is not the backend's own: a pooler (PgBouncer) made it up,
        and its server connections serve other clients too, so they are never ended."""
        row = conn.execute(SESSION_BACKEND, prepare=False).fetchone()
        if row is None or row[0] != conn.info.backend_pid:
            return None
        return row

    def end_lost_backends(self, wait=2.0):
        """End the backends of connections this session dropped, and wait until they are gone
        (TERMINATE_LOST_BACKEND); True once none is left. False: one is still there after
        ``wait`` seconds (try again later). A backend this role may not end is let be, with a
        warning (the release that follows may then miss a claim it commits later)."""
        while self.lost_backends:
            pid, started = self.lost_backends[0]
            try:
                rows = self.execute(
                    TERMINATE_LOST_BACKEND,
                    {"pid": pid, "started": started, "wait_ms": int(wait * 1000)},
                )
            except psycopg.errors.InsufficientPrivilege as exc:
                logger.warning(
                    "dbqueue: cannot end this worker's lost database session (pid %s): %s",
                    pid,
                    exc,
                )
                rows = []
            if rows and not rows[0][0]:
                return False
            self.lost_backends.popleft()
        return True

    def _plan_mode(self, statement):
        """The settings to change before ``statement`` (``_PLAN_MODE``): none when the
        connection plans it as it should already.

        The claim and the completion (``PlannedOnce``) run for every batch, and planning
        them cost more than running them; their generic plan, made once per connection, fits
        every batch and table size. Every other statement is planned for its own values. The
        mode is switched only where one kind follows the other: two more statements in the same
        round trip, for a lease extension or a failure between claims, and twice per round trip
        for a worker whose queues have fleet-wide limits (its claim, ``CLAIM_LIMITED`` in store/claiming.py,
        runs plpgsql whose statements are planned for their values). A worker without limits that
        only claims and completes never switches. Unprepared (``PREPARE = False``), every
        execution is planned for its values anyway, and nothing is switched."""
        if not self._switches_for(statement):
            return ()
        self.generic = isinstance(statement, PlannedOnce)
        return _PLAN_MODE[self.generic]

    def _switches_for(self, statement):
        return self.prepare and isinstance(statement, PlannedOnce) is not self.generic

    def connection(self):
        """The open psycopg connection (opened now if need be)."""
        if self.conn is None or self.conn.closed:
            self._connect()
        return self.conn

    def _notified(self, notify):
        self.notifies.append(notify.payload)
        if self.on_notify is not None:
            self.on_notify()

    def listening_fileno(self):
        """The socket to wait on for notifications, or None (not listening, not connected, or
        notifications already waiting in ``notifies``, or in libpq's buffer: taken now)."""
        if self.listen is None or self.conn is None or self.conn.closed:
            return None
        self._take_buffered(self.conn.pgconn)
        return None if self.notifies else self.conn.pgconn.socket

    def read_notifies(self):
        """Take what the server sent while the connection was idle (its socket was readable).
        Raises psycopg.OperationalError when the server is gone."""
        if self.conn is None or self.conn.closed:
            return
        pgconn = self.conn.pgconn
        pgconn.consume_input()  # raises OperationalError when the peer closed the connection
        if pgconn.status == psycopg.pq.ConnStatus.BAD:
            raise psycopg.OperationalError("the session's connection was lost while idle")
        self._take_buffered(pgconn)

    def _take_buffered(self, pgconn):
        while (notify := pgconn.notifies()) is not None:
            self.notifies.append(notify.extra.decode("utf-8", "replace"))

    def execute(self, statement, params):
        """Run one statement; returns its rows (``[]`` when it returns none)."""
        if self.conn is None or self.conn.closed:
            self._connect()
        if self._switches_for(statement):
            return self.execute_pipelined([(statement, params)])[0]  # with its SETs
        with self._prepared_statements_kept():
            cursor = self.conn.execute(statement, params)
        self.statements += 1
        return cursor.fetchall() if cursor.description else []

    def execute_pipelined(self, statements):
        """Run ``[(statement, params), ...]`` in one round trip (psycopg's pipeline mode) and
        return their rows in order. In autocommit, the statements up to the pipeline's one Sync
        share one implicit transaction, which commits at the Sync: an error in one rolls back
        those before it and aborts those after it, and is raised. Callers pipeline statements
        whose effects may go together: the completion of one batch and the claim of the next."""
        if self.conn is None or self.conn.closed:
            self._connect()
        conn, cursors = self.conn, []
        try:
            with self._prepared_statements_kept(), conn.pipeline():
                for statement, params in statements:
                    for setting in self._plan_mode(statement):
                        conn.execute(setting, prepare=False)
                    cursors.append(conn.execute(statement, params))
        except BaseException:
            self.generic = None  # unknown now: the next statement sets the mode it needs
            raise
        self.statements += len(statements)
        return [cursor.fetchall() if cursor.description else [] for cursor in cursors]

    @contextlib.contextmanager
    def _prepared_statements_kept(self):
        try:
            yield
        except (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement):
            if not self.prepare:
                raise
            # Prepared statements that vanish or collide: a transaction pooler (PgBouncer in
            # transaction mode) hands this client another server connection per transaction.
            logger.error(
                "dbqueue: prepared statements do not survive on database %r (a transaction "
                "pooler such as PgBouncer?); no longer preparing. Set DBQUEUE['PREPARE'] = False "
                "for this database.",
                self.using,
            )
            self.prepare = False
            self.reset()
            raise

    def reset(self):
        self.listening.clear()
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        if self.backend is not None:
            # Closing our end does not end the backend while it runs a statement: it may still
            # commit it (end_lost_backends).
            self.lost_backends.append(self.backend)
            self.backend = None
        self.conn = None

    close = reset


# Per mode, what the Session runs to switch to it. The generic plans are made with sequential
# scans priced out (enable_seqscan, which only prices them, never forbids them): the plan is
# made once, often while the table is small (a fresh install, a quiet hour), and must stay
# right when it holds a backlog of millions. Pricing out the sequential scan is not enough: a plan
# made on a small table can still walk a whole index with a filter. So each PlannedOnce statement
# also names its rows by an index condition (the claim's ``id = ANY(...)``, the completion's, the
# fair claim's key probes), and tests/integration/test_plans.py checks the condition is there.
# Every other statement runs with the session's own settings.
_PLAN_MODE = {
    False: ("SET plan_cache_mode TO force_custom_plan", "RESET enable_seqscan"),
    True: ("SET plan_cache_mode TO force_generic_plan", "SET enable_seqscan TO off"),
}


# Side connections of delivery records -----------------------------------------------------------

_side = threading.local()
_redirected = threading.local()  # side_statements_to(): where this thread's side statements go


@contextlib.contextmanager
def side_statements_to(execute):
    """While inside, this thread's side statements that would open a side connection (inside a
    transaction) run as ``execute(using, statement, params)`` instead. django_dbqueue.testing
    runs them in a test's own transaction: a side connection could neither see the test's
    uncommitted jobs nor have its commits rolled back with the test."""
    previous = getattr(_redirected, "execute", None)
    _redirected.execute = execute
    try:
        yield
    finally:
        _redirected.execute = previous


def side_execute(using, statement, params):
    """Run on a connection whose commit is independent of any transaction the caller has open.

    Outside a transaction that is the thread's Django connection (autocommit). Inside one (an
    atomic handler, a view's ``transaction.atomic()``), a side connection owned by this thread
    (or where ``side_statements_to()`` sends it).
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall()
    redirect = getattr(_redirected, "execute", None)
    if redirect is not None:
        return redirect(using, statement, params)
    side = getattr(_side, using, None)
    if side is None or side.closed:
        side = connect(using)
        setattr(_side, using, side)
    try:
        return side.execute(statement, params).fetchall()
    except psycopg.OperationalError:
        side.close()
        raise


def close_side_connections(**kwargs):
    """Close this thread's side connections. The worker calls it when a handler thread ends;
    it is connected to ``request_finished`` for deliveries recorded inside a view's transaction."""
    for name, side in list(vars(_side).items()):
        side.close()
        delattr(_side, name)


request_finished.connect(close_side_connections, dispatch_uid="dbqueue-close-side-connections")
