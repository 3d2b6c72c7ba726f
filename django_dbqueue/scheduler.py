"""Periodic jobs without a leader.

``DBQUEUE["SCHEDULE"]`` names entries with a cron expression or an interval (the tick arithmetic,
daylight saving included, is in ``schedule.py``). Every worker runs ``Scheduler.run_once()``
every ``SCHEDULE_INTERVAL`` seconds. Per entry, a row in ``dbqueue_schedule`` holds the last tick
enqueued. A pass reads every row in one plain SELECT (no lock, no transaction id, no commit to
flush), and only for an entry with a tick due locks its row with ``FOR UPDATE SKIP LOCKED`` (a
busy row is simply skipped: another worker is on it), enqueues the due ticks and moves the row
forward in the same transaction. Each tick's job carries the idempotency key
``dbqueue-schedule:<name>:<tick>``, so even two workers that computed the same tick make one job.
Time is the database's ``now()``.

Catch-up after downtime: ticks that came due within the last ``misfire_grace`` seconds (default
60) are on time and all enqueued; of older, missed ticks only the most recent ``catch_up``
(default 1) are enqueued, and the rest are skipped with a log line.
"""

import datetime
import logging
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.conf import settings
from django.db import transaction

from . import payloads, registry, store, validation
from .conf import get_settings
from .enqueue import enqueue
from .schedule import Schedule

__all__ = ["Schedule", "ScheduleError", "Scheduler", "parse_entry", "schedules", "status"]

logger = logging.getLogger("django_dbqueue")

MAX_ON_TIME_TICKS = 1000  # per entry and pass: a bound on work, whatever the schedule
MAX_MISSED_COUNTED = 10_000  # missed ticks counted for the log line, at most

_ENTRY_KEYS = {
    "cron",
    "every",
    "type",
    "payload",
    "queue",
    "priority",
    "catch_up",
    "misfire_grace",
    "timezone",
}


class ScheduleError(ValueError):
    """A malformed ``DBQUEUE["SCHEDULE"]`` entry; ``check_id`` says which system check it is."""

    def __init__(self, message, check_id="dbqueue.E010"):
        super().__init__(message)
        self.check_id = check_id


def parse_entry(name, entry, conf):
    """Validate one ``SCHEDULE`` entry; returns a :class:`Schedule` or raises ScheduleError."""
    validation.type_name(name, "DBQUEUE['SCHEDULE'] entry name", error=ScheduleError)
    where = f"DBQUEUE['SCHEDULE'][{name!r}]"
    if not isinstance(entry, dict):
        raise ScheduleError(f"{where} must be a dict, got {validation.shown(entry)}")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise ScheduleError(
            f"{where} has unknown keys {sorted(map(str, unknown))}; allowed: {sorted(_ENTRY_KEYS)}"
        )
    job_type = entry.get("type")
    if not isinstance(job_type, str) or registry.get(job_type) is None:
        raise ScheduleError(
            f"{where} names job type {validation.shown(job_type)}, which no @job registers",
            "dbqueue.E007",
        )
    cron, every = _timing(where, entry)
    payload = entry.get("payload", {})
    try:
        payloads.check(payload, f"{where}['payload']")
    except payloads.PayloadError as exc:
        raise ScheduleError(str(exc)) from exc
    queue = entry.get("queue")
    if queue is not None:
        validation.queue_name(queue, f"{where}['queue']", error=ScheduleError)
        if queue not in conf.QUEUES:
            raise ScheduleError(f"{where}['queue'] {queue!r} is not in DBQUEUE['QUEUES']")
    priority = entry.get("priority")
    if priority is not None:
        validation.priority(priority, f"{where}['priority']", error=ScheduleError)
    catch_up = validation.integer(
        entry.get("catch_up", 1),
        f"{where}['catch_up']",
        minimum=0,
        maximum=1000,
        error=ScheduleError,
    )
    grace = validation.seconds(
        entry.get("misfire_grace", 60.0), f"{where}['misfire_grace']", error=ScheduleError
    )
    schedule = Schedule(
        name=name,
        type=job_type,
        payload=payload,
        queue=queue,
        priority=priority,
        cron=cron,
        every=every,
        catch_up=catch_up,
        misfire_grace=grace,
        timezone=_zone(where, entry.get("timezone")),
    )
    try:
        if schedule.next_tick(datetime.datetime.now(datetime.UTC)) is None:
            raise ValueError("no tick in the next ten years")
    except Exception as exc:  # croniter accepts expressions that never fire, e.g. 30 February
        raise ScheduleError(
            f"{where}['cron'] {cron!r} never comes due: {exc}", "dbqueue.E008"
        ) from None
    return schedule


def _timing(where, entry):
    """``(cron, every)`` of an entry: exactly one is set."""
    if ("cron" in entry) == ("every" in entry):
        raise ScheduleError(
            f"{where} needs exactly one of 'cron' (an expression) or 'every' (seconds)",
            "dbqueue.E008",
        )
    cron, every = entry.get("cron"), entry.get("every")
    if cron is not None and (not isinstance(cron, str) or not croniter.is_valid(cron)):
        raise ScheduleError(
            f"{where}['cron'] {validation.shown(cron)} is not a valid cron expression",
            "dbqueue.E008",
        )
    if every is not None:
        try:
            every = validation.seconds(every, f"{where}['every']", error=ScheduleError)
        except ScheduleError as exc:
            raise ScheduleError(str(exc), "dbqueue.E008") from None
        if every < 1:
            raise ScheduleError(
                f"{where}['every'] must be at least 1 second, got {every:g}", "dbqueue.E008"
            )
    return cron, every


def _zone(where, zone):
    """The entry's time zone name: its own, else ``TIME_ZONE``, else UTC."""
    if zone is None:
        return settings.TIME_ZONE or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ScheduleError(
            f"{where}['timezone'] {validation.shown(zone)} is not a known time zone"
        ) from None
    return zone


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


class Scheduler:
    def __init__(self, using=None, *, conf=None):
        self.conf = conf or get_settings()
        self.using = using or self.conf.DATABASE
        self.schedules = schedules(self.conf)

    def run_once(self):
        """One pass over every entry. Returns ``{"enqueued": n, "skipped": n}``.

        A pass with nothing due runs one SELECT in autocommit: no row lock, no transaction id.
        """
        counts = {"enqueued": 0, "skipped": 0}
        if not self.schedules:
            return counts
        last, now = store.schedule_state(self.using)
        for schedule in self.schedules:
            try:
                if schedule.name not in last:
                    # First sight: the entry starts from now (no tick before the fleet knew it).
                    store.ensure_schedule(self.using, schedule.name)
                    continue
                if not schedule.ticks_between(last[schedule.name], now, 1):
                    continue
                enqueued, skipped = self._tick(schedule)
            except Exception:
                # One broken entry must not stop the others (nor the worker's claim loop).
                logger.exception("dbqueue schedule %r: this pass failed", schedule.name)
                continue
            counts["enqueued"] += enqueued
            counts["skipped"] += skipped
        return counts

    def _tick(self, schedule):
        with transaction.atomic(using=self.using):
            row = store.lock_schedule(self.using, schedule.name)
            if row is None:
                return 0, 0  # another worker is ticking this entry right now
            last_tick, now = row
            due = schedule.due(
                last_tick, now, limit=MAX_ON_TIME_TICKS, count_limit=MAX_MISSED_COUNTED
            )
            if due.skipped:
                logger.warning(
                    "dbqueue schedule %r: skipped %d%s missed ticks from %s to %s (catch_up=%d)",
                    schedule.name,
                    due.skipped,
                    "+" if len(due.missed) >= MAX_MISSED_COUNTED else "",
                    due.missed[0].isoformat(),
                    due.missed[-1].isoformat(),
                    schedule.catch_up,
                )
            for tick in due.ticks:
                enqueue(
                    schedule.type,
                    schedule.payload,
                    queue=schedule.queue,
                    priority=schedule.priority,
                    idempotency_key=schedule.key(tick),
                    using=self.using,
                )
            if due.advance_to is not None:
                store.advance_schedule(self.using, schedule.name, due.advance_to)
            return len(due.ticks), due.skipped


def status(using=None):
    """``[(name, last_tick, next_tick)]`` for the status command. ``next_tick`` is the tick the
    next pass runs first: a missed tick that the catch-up policy will still run, if any."""
    conf = get_settings()
    using = using or conf.DATABASE
    last, now = store.schedule_state(using)
    rows = []
    for schedule in schedules(conf):
        previous = last.get(schedule.name)
        try:
            upcoming = None
            if previous is not None:
                due = schedule.due(previous, now, limit=1, count_limit=1)
                upcoming = due.ticks[0] if due.ticks else None
            upcoming = upcoming or schedule.next_tick(max(previous or now, now))
        except Exception:
            upcoming = None
        rows.append((schedule.name, previous, upcoming))
    return rows
