"""Periodic jobs without a leader.

Entries have a cron expression or an interval (the tick arithmetic, daylight saving included, is
in ``schedule.py``). They come from ``DBQUEUE["SCHEDULE"]`` (a row of ``dbqueue_schedule`` per
entry holds how far its ticks are done) and from the database (``dbqueue_schedule_entry``: the
definition and that state in one row; written through ``schedule_entries.py``). Every worker runs
``Scheduler.run_once()`` every ``SCHEDULE_INTERVAL`` seconds. A pass reads every row in one
plain SELECT (no lock, no transaction id, no commit to flush), and only for an entry with a tick
due locks its row with ``FOR UPDATE SKIP LOCKED`` (a busy row is simply skipped: another worker,
or an edit, is on it), enqueues the due ticks and moves the row forward in the same transaction.
Each tick's job carries the idempotency key ``dbqueue-schedule:<name>:<tick>``, so even two
workers that computed the same tick make one job. Time is the database's ``now()``.

Catch-up after downtime: ticks that came due within the last ``misfire_grace`` seconds (default
60) are on time and all enqueued; older, missed ticks follow the entry's ``catch_up`` policy
("none", "latest", the default, or "all" within ``catch_up_window``), and the rest are skipped
with a log line.
"""

import logging

from django.db import transaction
from django.db.models import TextField
from django.db.models.functions import Cast

from . import store
from .conf import get_settings
from .enqueue import enqueue
from .schedule import CATCH_UP_POLICIES, Schedule
from .schedule_parser import (
    ScheduleError,
    entry_dict,
    parse_entry,
    parse_stored,
    stored_entry,
    stored_payload,
)

__all__ = [
    "Schedule",
    "ScheduleError",
    "Scheduler",
    "entry_dict",
    "parse_entry",
    "parse_stored",
    "schedules",
    "status",
    "stored_entry",
]

logger = logging.getLogger("django_dbqueue")

MAX_ON_TIME_TICKS = 1000  # per entry and pass: a bound on work, whatever the schedule
MAX_MISSED_COUNTED = 10_000  # missed ticks counted for the log line, at most


def schedules(conf=None):
    """Every valid entry of ``DBQUEUE["SCHEDULE"]`` (invalid ones are reported by checks)."""
    conf = conf or get_settings()
    result = []
    for name, entry in (conf.SCHEDULE or {}).items():
        try:
            result.append(parse_entry(name, entry, conf))
        except ScheduleError as exc:
            logger.error("dbqueue schedule %r ignored: %s", name, exc)
    return result


def enqueue_due(schedule, last_tick, now, using):
    """Enqueue the ticks of ``schedule`` due at ``now`` since ``last_tick`` (its catch-up policy
    applied), on ``using``, inside the caller's transaction, which holds the entry's row.
    Returns ``(Due, newest tick enqueued or None)``."""
    due = schedule.due(last_tick, now, limit=MAX_ON_TIME_TICKS, count_limit=MAX_MISSED_COUNTED)
    if due.skipped:
        logger.warning(
            "dbqueue schedule %r: skipped %d%s missed ticks from %s to %s (catch_up=%s)",
            schedule.name,
            due.skipped,
            "+" if len(due.missed) >= MAX_MISSED_COUNTED else "",
            due.missed[0].isoformat(),
            due.missed[-1].isoformat(),
            _policy_name(schedule.catch_up),
        )
    for tick in due.ticks:
        enqueue(
            schedule.type,
            schedule.payload,
            queue=schedule.queue,
            priority=schedule.priority,
            idempotency_key=schedule.key(tick),
            using=using,
        )
    return due, (due.ticks[-1] if due.ticks else None)


def _policy_name(catch_up):
    names = {value: name for name, value in CATCH_UP_POLICIES.items()}
    return names.get(catch_up, catch_up)


class Scheduler:
    """Ticks the settings entries and the stored ones. A stored entry's parsed :class:`Schedule`
    is kept while its definition is unchanged, so a pass parses nothing in the steady state."""

    def __init__(self, using=None, *, conf=None):
        self.conf = conf or get_settings()
        self.using = using or self.conf.DATABASE
        self.schedules = schedules(self.conf)
        self._names = {schedule.name for schedule in self.schedules}
        self._parsed = {}  # stored entry id -> (definition, Schedule or None when invalid)

    def run_once(self, db=None):
        """One pass over every entry. Returns ``{"enqueued": n, "skipped": n}``.

        A pass with nothing due runs one SELECT in autocommit: no row lock, no transaction id.
        It runs on ``db`` (the worker passes its own session, so that a worker with nothing due
        never opens its Django connection); a due entry is ticked on Django's connection.
        """
        counts = {"enqueued": 0, "skipped": 0}
        last, entries, now = store.schedule_state(db or self.using)
        for schedule in self.schedules:
            if schedule.name not in last:
                # First sight: the entry starts from now (no tick before the fleet knew it).
                self._guarded(schedule.name, store.ensure_schedule, self.using, schedule.name)
                continue
            if schedule.ticks_between(last[schedule.name], now, 1):
                self._add(counts, self._guarded(schedule.name, self._tick, schedule))
        self._parsed = {e.id: self._parsed.get(e.id) for e in entries}  # forget deleted ones
        for entry in entries:
            schedule = self._stored(entry)
            if schedule is not None and self._guarded(
                entry.name, schedule.ticks_between, entry.last_tick, now, 1
            ):
                self._add(counts, self._guarded(entry.name, self._tick_stored, entry.id))
        return counts

    @staticmethod
    def _add(counts, result):
        if result is not None:
            counts["enqueued"] += result[0]
            counts["skipped"] += result[1]

    @staticmethod
    def _guarded(name, func, *args):
        try:
            return func(*args)
        except Exception:
            # One broken entry must not stop the others (nor the worker's claim loop).
            logger.exception("dbqueue schedule %r: this pass failed", name)
            return None

    def _stored(self, entry):
        """The Schedule of a stored entry, parsed once per definition; ``None`` when invalid.
        A stored row is data (anyone who can write the table wrote it): whatever its parse
        raises leaves that entry out, logged, and the pass goes on with the others."""
        cached = self._parsed.get(entry.id)
        if cached is not None and cached[0] == entry.definition():
            return cached[1]
        try:
            if entry.name in self._names:
                raise ScheduleError(f"DBQUEUE['SCHEDULE'] has an entry named {entry.name!r} too")
            schedule = parse_stored(entry, self.conf)
        except ScheduleError as exc:  # logged once per definition, not once per pass
            logger.error("dbqueue schedule entry %r ignored: %s", entry.name, exc)
            schedule = None
        except Exception as exc:  # a value the parsers did not expect: the same, with its class
            logger.error(
                "dbqueue schedule entry %r ignored: %s: %s", entry.name, type(exc).__name__, exc
            )
            schedule = None
        self._parsed[entry.id] = (entry.definition(), schedule)
        return schedule

    def _tick(self, schedule):
        with transaction.atomic(using=self.using):
            row = store.lock_schedule(self.using, schedule.name)
            if row is None:
                return 0, 0  # another worker is ticking this entry right now
            due, enqueued = enqueue_due(schedule, *row, self.using)
            if due.advance_to is not None:
                store.advance_schedule(self.using, schedule.name, due.advance_to, enqueued)
            return len(due.ticks), due.skipped

    def _tick_stored(self, entry_id):
        with transaction.atomic(using=self.using):
            locked = store.lock_schedule_entry(self.using, entry_id)
            if locked is None:
                return 0, 0  # another worker or an edit holds it, or it is disabled or gone
            entry, now = locked
            schedule = self._stored(entry)  # the definition in force, edited since the read
            if schedule is None:
                return 0, 0
            due, enqueued = enqueue_due(schedule, entry.last_tick, now, self.using)
            if due.advance_to is not None:
                store.advance_schedule_entry(self.using, entry_id, due.advance_to, enqueued)
            return len(due.ticks), due.skipped


def _upcoming(schedule, last_tick, now):
    """The tick the next pass runs first: a missed one the catch-up policy still runs, if any."""
    try:
        due = schedule.due(last_tick, now, limit=1, count_limit=1)
        return (due.ticks[0] if due.ticks else None) or schedule.next_tick(max(last_tick, now))
    except Exception:
        return None


def status(using=None):
    """Every entry for the status command and the admin, settings entries first: dicts with
    ``name``, ``source`` (``"settings"`` or ``"database"``), ``enabled``, ``last_tick`` (the
    tick of the newest job enqueued, ``None``: never), ``next_tick`` (the tick the next pass runs
    first: a missed tick that the catch-up policy will still run, if any; ``None`` for a disabled
    or invalid entry) and ``error`` (why an invalid stored entry is ignored)."""
    from .models import ScheduleEntry

    conf = get_settings()
    using = using or conf.DATABASE
    states, now = store.schedule_status(using)
    rows = []
    for schedule in schedules(conf):
        watermark, enqueued = states.get(schedule.name, (None, None))
        upcoming = _upcoming(schedule, watermark or now, now)
        rows.append(_status_row(schedule.name, "settings", True, enqueued, upcoming))
    # The payload as text, decoded here: a stored one Python cannot read (written by hand) is
    # that entry's error, not the failure of the whole page (the model's field would decode it).
    entries = (
        ScheduleEntry.objects.using(using)
        .order_by("name")
        .defer("payload")
        .annotate(payload_text=Cast("payload", TextField()))
    )
    for entry in entries:
        error, upcoming = None, None
        try:
            if entry.name in conf.SCHEDULE:
                raise ScheduleError(f"DBQUEUE['SCHEDULE'] has an entry named {entry.name!r} too")
            payload = stored_payload(entry.name, entry.payload_text)
            schedule = parse_entry(
                entry.name,
                entry_dict(entry, payload=payload),
                conf,
                where=f"schedule entry {entry.name!r}",
            )
            if entry.enabled:
                upcoming = _upcoming(schedule, entry.last_tick, now)
        except ScheduleError as exc:
            error = str(exc)
        row = _status_row(entry.name, "database", entry.enabled, entry.last_enqueued, upcoming)
        row["error"] = error
        rows.append(row)
    return rows


def _status_row(name, source, enabled, last_tick, next_tick):
    return {
        "name": name,
        "source": source,
        "enabled": enabled,
        "last_tick": last_tick,
        "next_tick": next_tick,
        "error": None,
    }
