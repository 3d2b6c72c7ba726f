"""Periodic jobs without a leader.

``DBQUEUE["SCHEDULE"]`` names entries with a cron expression or an interval. Every worker runs
``Scheduler.run_once()`` every ``SCHEDULE_INTERVAL`` seconds. Per entry, a row in
``dbqueue_schedule`` holds the last tick enqueued; a worker locks it with ``FOR UPDATE SKIP
LOCKED`` (a busy row is simply skipped: another worker is on it), enqueues the due ticks and
moves the row forward in the same transaction. Each tick's job carries the idempotency key
``dbqueue-schedule:<name>:<tick>``, so even two workers that computed the same tick make one job.
Time is the database's ``now()``.

Catch-up after downtime: ticks that came due within the last ``misfire_grace`` seconds (default
60) are on time and all enqueued; of older, missed ticks only the most recent ``catch_up``
(default 1) are enqueued, and the rest are skipped with a log line.
"""

import datetime
import logging
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.conf import settings
from django.db import transaction

from . import payloads, registry, store
from .conf import get_settings
from .enqueue import enqueue
from .states import MAX_PRIORITY, MIN_PRIORITY

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


@dataclass(frozen=True)
class Schedule:
    name: str
    type: str
    payload: Any = field(default_factory=dict)
    queue: str | None = None
    priority: int | None = None
    cron: str | None = None
    every: float | None = None
    catch_up: int = 1
    misfire_grace: float = 60.0
    timezone: str | None = None

    def _zone(self):
        return ZoneInfo(self.timezone or settings.TIME_ZONE or "UTC")

    def ticks_between(self, start, end, limit):
        """Ticks ``t`` with ``start < t <= end``, oldest first, at most ``limit``."""
        ticks = []
        if self.every is not None:
            # Aligned to the epoch, so every worker computes the very same instants.
            step = self.every
            first = (int(start.timestamp() // step) + 1) * step
            moment = first
            while moment <= end.timestamp() and len(ticks) < limit:
                ticks.append(datetime.datetime.fromtimestamp(moment, datetime.UTC))
                moment += step
            return ticks
        it = croniter(self.cron, start.astimezone(self._zone()))
        while len(ticks) < limit:
            tick = it.get_next(datetime.datetime)
            if tick > end:
                break
            ticks.append(tick.astimezone(datetime.UTC))
        return ticks

    def ticks_before(self, end, count, after):
        """The ``count`` most recent ticks ``t`` with ``after < t <= end``, oldest first."""
        if count <= 0:
            return []
        if self.every is not None:
            last = int(end.timestamp() // self.every) * self.every
            ticks = [last - i * self.every for i in range(count)]
            return [
                datetime.datetime.fromtimestamp(t, datetime.UTC)
                for t in reversed(ticks)
                if t > after.timestamp()
            ]
        it = croniter(
            self.cron, (end + datetime.timedelta(microseconds=1)).astimezone(self._zone())
        )
        ticks = []
        while len(ticks) < count:
            tick = it.get_prev(datetime.datetime).astimezone(datetime.UTC)
            if tick <= after:
                break
            ticks.append(tick)
        return list(reversed(ticks))

    def next_tick(self, after):
        ticks = self.ticks_between(after, after + datetime.timedelta(days=3660), 1)
        return ticks[0] if ticks else None

    def key(self, tick):
        return f"dbqueue-schedule:{self.name}:{tick.astimezone(datetime.UTC).isoformat()}"


def parse_entry(name, entry, conf):
    """Validate one ``SCHEDULE`` entry; returns a :class:`Schedule` or raises ScheduleError."""
    where = f"DBQUEUE['SCHEDULE'][{name!r}]"
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ScheduleError(
            f"schedule names are non-empty strings of at most 200 characters, got {name!r}"
        )
    if not isinstance(entry, dict):
        raise ScheduleError(f"{where} must be a dict, got {entry!r}")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise ScheduleError(
            f"{where} has unknown keys {sorted(unknown)}; allowed: {sorted(_ENTRY_KEYS)}"
        )
    job_type = entry.get("type")
    if registry.get(job_type) is None:
        raise ScheduleError(
            f"{where} names job type {job_type!r}, which no @job registers", "dbqueue.E007"
        )
    if ("cron" in entry) == ("every" in entry):
        raise ScheduleError(
            f"{where} needs exactly one of 'cron' (an expression) or 'every' (seconds)",
            "dbqueue.E008",
        )
    cron, every = entry.get("cron"), entry.get("every")
    if cron is not None and (not isinstance(cron, str) or not croniter.is_valid(cron)):
        raise ScheduleError(
            f"{where}['cron'] {cron!r} is not a valid cron expression", "dbqueue.E008"
        )
    if every is not None:
        if hasattr(every, "total_seconds"):
            every = every.total_seconds()
        if isinstance(every, bool) or not isinstance(every, int | float) or every < 1:
            raise ScheduleError(
                f"{where}['every'] must be a number of seconds >= 1, got {entry['every']!r}",
                "dbqueue.E008",
            )
    payload = entry.get("payload", {})
    try:
        payloads.check(payload, f"{where}['payload']")
    except payloads.PayloadError as exc:
        raise ScheduleError(str(exc)) from exc
    queue = entry.get("queue")
    if queue is not None and queue not in conf.QUEUES:
        raise ScheduleError(f"{where}['queue'] {queue!r} is not in DBQUEUE['QUEUES']")
    priority = entry.get("priority")
    if priority is not None and (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        raise ScheduleError(
            f"{where}['priority'] must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {priority!r}"
        )
    catch_up = entry.get("catch_up", 1)
    if isinstance(catch_up, bool) or not isinstance(catch_up, int) or catch_up < 0:
        raise ScheduleError(f"{where}['catch_up'] must be an integer >= 0, got {catch_up!r}")
    grace = entry.get("misfire_grace", 60.0)
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
        raise ScheduleError(f"{where}['misfire_grace'] must be seconds >= 0, got {grace!r}")
    zone = entry.get("timezone")
    if zone is not None:
        try:
            ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ScheduleError(f"{where}['timezone'] {zone!r} is not a known time zone") from None
    schedule = Schedule(
        name=name,
        type=job_type,
        payload=payload,
        queue=queue,
        priority=priority,
        cron=cron,
        every=None if every is None else float(every),
        catch_up=catch_up,
        misfire_grace=float(grace),
        timezone=zone,
    )
    try:
        if schedule.next_tick(datetime.datetime.now(datetime.UTC)) is None:
            raise ValueError("no tick in the next ten years")
    except Exception as exc:  # croniter accepts expressions that never fire, e.g. 30 February
        raise ScheduleError(
            f"{where}['cron'] {cron!r} never comes due: {exc}", "dbqueue.E008"
        ) from None
    return schedule


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
        """One pass over every entry. Returns ``{"enqueued": n, "skipped": n}``."""
        counts = {"enqueued": 0, "skipped": 0}
        for schedule in self.schedules:
            try:
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
            horizon = now - datetime.timedelta(seconds=schedule.misfire_grace)
            on_time = schedule.ticks_between(max(last_tick, horizon), now, MAX_ON_TIME_TICKS)
            late, skipped = [], 0
            if last_tick < horizon:
                late = schedule.ticks_before(horizon, schedule.catch_up, last_tick)
                missed = schedule.ticks_between(last_tick, horizon, MAX_MISSED_COUNTED)
                skipped = len(missed) - len(late)
                if skipped:
                    logger.warning(
                        "dbqueue schedule %r: skipped %d%s missed ticks from %s to %s (catch_up=%d)",
                        schedule.name,
                        skipped,
                        "+" if len(missed) >= MAX_MISSED_COUNTED else "",
                        missed[0].isoformat(),
                        missed[-1].isoformat(),
                        schedule.catch_up,
                    )
            due = late + on_time
            for tick in due:
                enqueue(
                    schedule.type,
                    schedule.payload,
                    queue=schedule.queue,
                    priority=schedule.priority,
                    idempotency_key=schedule.key(tick),
                    using=self.using,
                )
            newest = due[-1] if due else (horizon if last_tick < horizon else None)
            if newest is not None:
                store.advance_schedule(self.using, schedule.name, newest)
            return len(due), skipped


def status(using=None):
    """``[(name, last_tick, next_tick)]`` for the status command."""
    conf = get_settings()
    using = using or conf.DATABASE
    last, now = store.schedule_state(using)
    rows = []
    for schedule in schedules(conf):
        previous = last.get(schedule.name)
        try:
            upcoming = schedule.next_tick(max(previous or now, now))
        except Exception:
            upcoming = None
        rows.append((schedule.name, previous, upcoming))
    return rows
