"""Periodic jobs (scheduler.py, schedule_entries.py): the state of the settings entries
and of the stored entries, locked one at a time to tick them."""

import dataclasses
import datetime
from dataclasses import dataclass

from django.db import connections

from ..validation import TIMESTAMP_MAX, TIMESTAMP_MIN
from ._db import _execute, _execute_no_rows

# Two kinds of entry: DBQUEUE["SCHEDULE"]'s, whose state is a row of dbqueue_schedule by name, and
# stored ones, whose definition and state share a row of dbqueue_schedule_entry (so that a worker
# that locks the row to tick it reads the definition in force, and an edit that locks it first
# is waited for: see schedule_entries.py).


def _held(column):
    """An entry's time as the scheduler reads it: held within validation.TIMESTAMP_MIN..MAX.
    The tables refuse any other (migration 0027's CHECKs, which repaired the rows of before
    the same way); in a table whose CHECKs were dropped, a time written by hand (year 200000,
    infinity) would fail the fetch of the whole reply (psycopg's typed value of it), so that
    one entry stopped every entry of the pass. Held, a last tick of year 200000 reads
    9999-12-30 (that entry ticks no more), one of 4000 BC 0001-01-02 (due: its catch-up
    policy picks what it enqueues, and the tick writes a real time); NULL stays NULL."""
    low = f"'{TIMESTAMP_MIN.isoformat()}'::timestamptz"
    high = f"'{TIMESTAMP_MAX.isoformat()}'::timestamptz"
    return (
        f"CASE WHEN {column} < {low} THEN {low} WHEN {column} > {high} THEN {high} "
        f"ELSE {column} END"
    )


# First sight of a settings entry: it starts from now (no tick before the fleet knew it).
ENSURE_SCHEDULE = """
INSERT INTO dbqueue_schedule (name, last_tick, updated_at) VALUES (%(name)s, now(), now())
ON CONFLICT (name) DO NOTHING
"""


def ensure_schedule(using, name):
    """Give a new schedule entry its row, starting from now (nothing if it has one)."""
    _execute_no_rows(using, ENSURE_SCHEDULE, {"name": name})


# One worker at a time ticks an entry: the others skip the locked row instead of waiting, and the
# tick's idempotency key still makes one job should two ever compute the same tick.
LOCK_SCHEDULE = f"""
SELECT {_held("last_tick")}, now() FROM dbqueue_schedule WHERE name::text = %(name)s::text
FOR UPDATE SKIP LOCKED
"""


def lock_schedule(using, name):
    """Inside a transaction: ``(last_tick, now)`` of a schedule entry, or ``None`` when another
    worker holds it (or it has no row)."""
    with connections[using].cursor() as cursor:
        cursor.execute(LOCK_SCHEDULE, {"name": name})
        return cursor.fetchone()


# last_enqueued: the tick of the newest job enqueued (NULL: this pass enqueued none, keep it).
ADVANCE_SCHEDULE = """
UPDATE dbqueue_schedule
SET last_tick = %(tick)s, last_enqueued = COALESCE(%(enqueued)s::timestamptz, last_enqueued),
    updated_at = now()
WHERE name::text = %(name)s::text
"""


def advance_schedule(using, name, tick, enqueued=None):
    """Move a settings entry's ``last_tick`` to ``tick``; ``enqueued``: the newest tick that made
    a job (``None``: keep the one recorded)."""
    params = {"name": name, "tick": tick, "enqueued": enqueued}
    _execute_no_rows(using, ADVANCE_SCHEDULE, params)


@dataclass(frozen=True)
class StoredEntry:
    """A ``dbqueue_schedule_entry`` row as the scheduler reads it (``payload`` is JSON text)."""

    id: int
    name: str
    last_tick: datetime.datetime
    job_type: str
    cron: str
    every: float | None
    timezone: str
    payload: str
    queue: str
    priority: int | None
    catch_up: str
    catch_up_window: float | None
    misfire_grace: float

    def definition(self):
        """Everything but the state: what a parsed entry depends on."""
        return (self.name, *dataclasses.astuple(self)[3:])


_ENTRY_COLUMNS = f"""e.id, e.name, {_held("e.last_tick")}, e.job_type, e.cron, e.every, e.timezone,
       e.payload::text, e.queue, e.priority, e.catch_up, e.catch_up_window, e.misfire_grace"""

# A scheduler pass reads everything in one plain statement (no lock, no transaction id): the
# settings entries' states (always one row at least, the LEFT JOIN, so that the caller gets the
# database's now() too; id NULL) and the enabled stored entries with their definitions.
SCHEDULE_STATE = f"""
SELECT NULL::bigint, s.name, {_held("s.last_tick")}, NULL::text, NULL::text, NULL::float8, NULL::text,
       NULL::text, NULL::text, NULL::smallint, NULL::text, NULL::float8, NULL::float8, n.now
FROM (SELECT now() AS now) AS n LEFT JOIN dbqueue_schedule AS s ON true
UNION ALL
SELECT {_ENTRY_COLUMNS}, now()
FROM dbqueue_schedule_entry AS e WHERE e.enabled
"""


def schedule_state(using):
    """``({name: last_tick} of the settings entries, [StoredEntry] enabled, now)``."""
    rows = _execute(using, SCHEDULE_STATE, {})
    last = {row[1]: row[2] for row in rows if row[0] is None and row[1] is not None}
    entries = [StoredEntry(*row[:13]) for row in rows if row[0] is not None]
    return last, entries, rows[0][13]


# A stored entry that came due, locked to tick it, like LOCK_SCHEDULE. FOR UPDATE returns the
# row's newest committed version (an edit committed after the pass's read is seen here), and
# re-checks "enabled" on it: an entry disabled meanwhile returns nothing. A row an edit holds is
# skipped: the edit enqueues what came due under the old definition itself.
LOCK_SCHEDULE_ENTRY = f"""
SELECT {_ENTRY_COLUMNS}, now()
FROM dbqueue_schedule_entry AS e WHERE e.id = %(id)s::bigint AND e.enabled FOR UPDATE SKIP LOCKED
"""


def lock_schedule_entry(using, entry_id):
    """Inside a transaction: ``(StoredEntry, now)`` of an enabled stored entry, or ``None`` when
    another worker or an edit holds it (or it is gone or disabled)."""
    with connections[using].cursor() as cursor:
        cursor.execute(LOCK_SCHEDULE_ENTRY, {"id": entry_id})
        row = cursor.fetchone()
    return None if row is None else (StoredEntry(*row[:13]), row[13])


# An edit locks the row and waits for a worker that is ticking it (which then committed the ticks
# it enqueued: the edit reads the newest last_tick). Its instant is statement_timestamp(), not
# now(): a transaction that began before that worker's would otherwise settle up to a moment
# the worker already passed.
LOCK_SCHEDULE_ENTRY_FOR_EDIT = f"""
SELECT {_ENTRY_COLUMNS}, statement_timestamp(), e.enabled
FROM dbqueue_schedule_entry AS e WHERE e.id = %(id)s::bigint FOR UPDATE
"""


def lock_schedule_entry_for_edit(using, entry_id):
    """Inside a transaction: ``(StoredEntry, now, enabled)``, waiting for a worker ticking it;
    ``None`` when there is no such entry."""
    with connections[using].cursor() as cursor:
        cursor.execute(LOCK_SCHEDULE_ENTRY_FOR_EDIT, {"id": entry_id})
        row = cursor.fetchone()
    return None if row is None else (StoredEntry(*row[:13]), row[13], row[14])


ADVANCE_SCHEDULE_ENTRY = """
UPDATE dbqueue_schedule_entry
SET last_tick = %(tick)s, last_enqueued = COALESCE(%(enqueued)s::timestamptz, last_enqueued)
WHERE id = %(id)s::bigint
"""


def advance_schedule_entry(using, entry_id, tick, enqueued=None):
    params = {"id": entry_id, "tick": tick, "enqueued": enqueued}
    _execute_no_rows(using, ADVANCE_SCHEDULE_ENTRY, params)


# For the status command and the admin: every settings entry's state.
SCHEDULE_STATUS = f"""
SELECT s.name, {_held("s.last_tick")}, {_held("s.last_enqueued")}, n.now
FROM (SELECT now() AS now) AS n LEFT JOIN dbqueue_schedule AS s ON true
"""


def schedule_status(using):
    """``({name: (last_tick, last_enqueued)} of the settings entries, now)``."""
    rows = _execute(using, SCHEDULE_STATUS, {})
    return {name: (last, enqueued) for name, last, enqueued, _ in rows if name}, rows[0][3]
