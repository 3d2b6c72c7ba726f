"""A worker thread's own connection for its hot statements: prepared, optionally async-commit.

The claim loop, the acknowledgement thread and the heartbeat each run a handful of statements
thousands of times. On a dedicated psycopg connection they are prepared once (``PREPARE``) and,
for claims, completions and lease extensions, committed with ``synchronous_commit = off``
(``ASYNC_COMMIT``): the commit returns before its WAL reaches the disk. A database crash can then
lose the last fraction of a second of claims and completions, which only means those jobs run
again, as at-least-once delivery already allows. Failures, dead letters and releases are never
written this way: they go through the ordinary, durable Django connection.

Workers should reach PostgreSQL directly (LISTEN needs that too); behind PgBouncer in
transaction mode set both settings to False.
"""

import contextlib

import psycopg

from .notifications import connection_params


class Session:
    """A lazily opened psycopg connection in autocommit; ``reset()`` drops it after a fault."""

    def __init__(self, using, *, prepare=True, async_commit=True):
        self.using = using
        self.prepare = prepare
        self.async_commit = async_commit
        self.conn = None
        self.statements = 0  # executed, for tests that pin the hot paths' query counts

    def _connect(self):
        conn = psycopg.connect(
            **connection_params(self.using),
            autocommit=True,
            prepare_threshold=0 if self.prepare else None,
        )
        if self.prepare:
            # Prepared, but planned for each execution's own arrays: a generic plan cannot know
            # that a batch holds 3 ids or 500, and was seen to pick a sequential scan of the
            # whole table for the completion join. Parsing is what the preparation saves.
            conn.execute("SET plan_cache_mode TO force_custom_plan", prepare=False)
        if self.async_commit:
            conn.execute("SET synchronous_commit TO off", prepare=False)
        self.conn = conn

    def execute(self, statement, params):
        """Run one statement; returns its rows (``[]`` when it returns none)."""
        if self.conn is None or self.conn.closed:
            self._connect()
        cursor = self.conn.execute(statement, params)
        self.statements += 1
        return cursor.fetchall() if cursor.description else []

    def reset(self):
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = None

    close = reset
