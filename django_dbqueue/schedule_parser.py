"""Schedule entries checked and parsed: a ``DBQUEUE["SCHEDULE"]`` dict, or a stored entry's
columns, becomes a :class:`Schedule` or a :class:`ScheduleError` that names what is wrong.

The system checks, the scheduler, the code API (``schedule_entries.py``) and the admin's form
all call :func:`parse_entry`, so one mistake reads the same wherever it is made.
"""

import datetime
import difflib
import functools
import re
import zoneinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.conf import settings

from . import decoding, payloads, registry, validation
from .exceptions import DBQueueError, UnreadableJob
from .schedule import CATCH_UP_ALL, CATCH_UP_POLICIES, DEFAULT_CATCH_UP_WINDOW, Schedule

__all__ = ["ScheduleError", "entry_dict", "parse_entry", "parse_stored", "stored_entry"]

_ENTRY_KEYS = {
    "cron",
    "every",
    "type",
    "payload",
    "queue",
    "priority",
    "catch_up",
    "catch_up_window",
    "misfire_grace",
    "timezone",
}


class ScheduleError(DBQueueError, ValueError):
    """A malformed schedule entry (``DBQUEUE["SCHEDULE"]`` or a stored one): ``check_id`` says
    which system check it is, ``field`` which key of the entry is wrong (``None``: the entry)."""

    def __init__(self, message, check_id="dbqueue.E010", field=None):
        super().__init__(message)
        self.check_id = check_id
        self.field = field


def _fail(message, check_id="dbqueue.E010", field=None):
    raise ScheduleError(message, check_id, field)


def _wrong(field, check_id="dbqueue.E010"):
    """An ``error=`` class for the validation helpers that files the error under ``field``."""

    def error(message):
        return ScheduleError(message, check_id, field)

    return error


def parse_entry(name, entry, conf, where=None):
    """Validate one schedule entry; returns a :class:`Schedule` or raises ScheduleError.

    ``where`` names the entry in messages; ``DBQUEUE['SCHEDULE'][name]`` unless told."""
    where = where or f"DBQUEUE['SCHEDULE'][{name!r}]"
    validation.type_name(name, f"{where}: the entry's name", error=_wrong("name"))
    if not isinstance(entry, dict):
        _fail(f"{where} must be a dict, got {validation.shown(entry)}")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        _fail(
            f"{where} has unknown keys {sorted(map(str, unknown))}; allowed: {sorted(_ENTRY_KEYS)}"
        )
    job_type = entry.get("type")
    if not isinstance(job_type, str) or registry.get(job_type) is None:
        known = sorted(registry.all_types())
        close = difflib.get_close_matches(str(job_type), known, n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        _fail(
            f"{where} names job type {validation.shown(job_type)}, which no @job registers{hint}",
            "dbqueue.E007",
            "type",
        )
    cron, every = _timing(where, entry)
    payload = entry.get("payload", {})
    try:
        payloads.check(payload, f"{where}['payload']")
    except payloads.PayloadError as exc:
        raise ScheduleError(str(exc), field="payload") from exc
    queue = entry.get("queue")
    if queue is not None:
        validation.queue_name(queue, f"{where}['queue']", error=_wrong("queue"))
        if queue not in conf.QUEUES:
            _fail(f"{where}['queue'] {queue!r} is not in DBQUEUE['QUEUES']", field="queue")
    priority = entry.get("priority")
    if priority is not None:
        validation.priority(priority, f"{where}['priority']", error=_wrong("priority"))
    catch_up, window = _catch_up(where, entry)
    grace = validation.seconds(
        entry.get("misfire_grace", 60.0), f"{where}['misfire_grace']", error=_wrong("misfire_grace")
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
        catch_up_window=window,
    )
    try:
        if schedule.next_tick(datetime.datetime.now(datetime.UTC)) is None:
            raise ValueError("no tick in the next ten years")
    except Exception as exc:  # croniter accepts expressions that never fire, e.g. 30 February
        _fail(f"{where}['cron'] {cron!r} never comes due: {exc}", "dbqueue.E008", "cron")
    return schedule


def _timing(where, entry):
    """``(cron, every)`` of an entry: exactly one is set."""
    if ("cron" in entry) == ("every" in entry):
        _fail(
            f"{where} needs exactly one of 'cron' (an expression) or 'every' (seconds)",
            "dbqueue.E008",
            "cron",
        )
    cron, every = entry.get("cron"), entry.get("every")
    if cron is not None:
        _cron(where, cron)
    if every is not None:
        every = validation.seconds(
            every, f"{where}['every']", error=_wrong("every", "dbqueue.E008")
        )
        if every < 1:
            _fail(
                f"{where}['every'] must be at least 1 second, got {every:g}",
                "dbqueue.E008",
                "every",
            )
    return cron, every


# The five fields, named in every refusal of an expression.
_FIVE_FIELDS = "minute hour day-of-month month day-of-week, such as '0 3 * * *'"
# croniter's random field: 'R', 'R(0-29)', 'R/5' ('H', its hashed one, needs a hash_id that
# Schedule never gives, so croniter refuses it already). The letters of a name (FRI, MAR) are
# no field of their own.
_RANDOM = re.compile(r"[Rr](?:\(|/|$)")
# croniter's names for five-field expressions ("@daily" is "0 0 * * *"), accepted as those.
_NICKNAMES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)


def _cron(where, cron):
    """A cron expression of exactly five fields (or one of croniter's names for one). croniter
    also takes six and seven, reading the sixth as *seconds* (and the seventh as the year):
    ``0 0 3 * * *``, Quartz's 03:00, would tick every second of 00:00 on the 3rd."""
    fields = len(cron.split()) if isinstance(cron, str) else 0
    if fields > 5:
        _fail(
            f"{where}['cron'] {validation.shown(cron)} has {fields} fields; a cron expression "
            f"here has exactly five ({_FIVE_FIELDS}). A sixth field would be read as seconds "
            "(so the entry would tick every second) and a seventh as the year: write the "
            "minute first, as classic cron does",
            "dbqueue.E008",
            "cron",
        )
    drawn = (
        [i for f in cron.split() for i in f.split(",") if _RANDOM.match(i)]
        if isinstance(cron, str)
        else []
    )
    if drawn:
        _fail(
            f"{where}['cron'] {validation.shown(cron)} has a random field ({drawn[0]!r}): "
            "croniter draws its value anew each time the expression is read, so each pass of "
            "each worker would compute other ticks, each one a job: several per period. Write "
            "the value itself, such as '17 * * * *'",
            "dbqueue.E008",
            "cron",
        )
    named = isinstance(cron, str) and cron.strip() in _NICKNAMES
    if not isinstance(cron, str) or (fields != 5 and not named) or not croniter.is_valid(cron):
        _fail(
            f"{where}['cron'] {validation.shown(cron)} is not a valid cron expression "
            f"(five fields: {_FIVE_FIELDS})",
            "dbqueue.E008",
            "cron",
        )


def _catch_up(where, entry):
    """``(catch_up, catch_up_window)``: a count of missed ticks to run, or ``"all"``."""
    policy = entry.get("catch_up", "latest")
    if isinstance(policy, str):
        if policy not in CATCH_UP_POLICIES:
            _fail(
                f"{where}['catch_up'] must be one of {sorted(CATCH_UP_POLICIES)} or a count of "
                f"missed ticks, got {validation.shown(policy)}",
                field="catch_up",
            )
        policy = CATCH_UP_POLICIES[policy]
    else:
        policy = validation.integer(
            policy, f"{where}['catch_up']", minimum=0, maximum=1000, error=_wrong("catch_up")
        )
    window = entry.get("catch_up_window")
    if window is None:
        return policy, DEFAULT_CATCH_UP_WINDOW
    if policy != CATCH_UP_ALL:
        _fail(f"{where}['catch_up_window'] applies to catch_up 'all' only", field="catch_up_window")
    window = validation.seconds(
        window, f"{where}['catch_up_window']", error=_wrong("catch_up_window")
    )
    return policy, window


# Files of the zone directory that ZoneInfo loads but that name no IANA zone: the host's own
# zone (a link to /etc/localtime, which differs from host to host), tzcode's template for POSIX
# TZ strings, and the placeholder of an unset zone (abbreviated "-00").
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def _iana_zones():
    """The IANA zone names this Python knows (the system's database, or the tzdata package);
    read once: it walks the zone directory. Without the "posix/" and "right/" trees (the same
    zones again, and zones counting leap seconds, which ZoneInfo reads with a wrong offset)."""
    return frozenset(zoneinfo.available_timezones()) - _NOT_ZONES


def _zone(where, zone):
    """The entry's time zone name: its own, else ``TIME_ZONE``, else UTC."""
    if zone is None:
        return settings.TIME_ZONE or "UTC"
    if isinstance(zone, str) and (zone in _NOT_ZONES or zone.startswith(("posix/", "right/"))):
        _fail(
            f"{where}['timezone'] {validation.shown(zone)} is not an IANA time zone name (it "
            "is a file of the zone directory, not a zone: give a name such as 'Europe/Berlin' "
            "or 'UTC')",
            field="timezone",
        )
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        _fail(
            f"{where}['timezone'] {validation.shown(zone)} is not a known time zone "
            f"(an IANA name such as 'Europe/Berlin' or 'UTC'){_zone_hint(zone)}",
            field="timezone",
        )
    if zone not in _iana_zones():
        _fail(
            f"{where}['timezone'] {validation.shown(zone)} is not an IANA time zone name "
            f"(such as 'Europe/Berlin' or 'UTC'){_zone_hint(zone)}",
            field="timezone",
        )
    return zone


def _zone_hint(zone):
    """``; did you mean ...?`` with the zone names closest to ``zone``, or nothing."""
    if not isinstance(zone, str) or not zone:
        return ""
    by_lower = {name.lower(): name for name in _iana_zones()}
    if zone.lower() in by_lower:
        return f"; did you mean {by_lower[zone.lower()]!r}?"
    close = difflib.get_close_matches(zone, sorted(_iana_zones()), n=3)
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def stored_entry(
    *,
    job_type,
    cron="",
    every=None,
    timezone="",
    payload=None,
    queue="",
    priority=None,
    catch_up="latest",
    catch_up_window=None,
    misfire_grace=60.0,
):
    """The ``SCHEDULE``-style dict of a stored entry's columns (an empty text column: unset)."""
    entry = {"type": job_type, "payload": {} if payload is None else payload}
    entry["catch_up"] = catch_up
    entry["misfire_grace"] = misfire_grace
    optional = {
        "cron": cron or None,
        "every": every,
        "timezone": timezone or None,
        "queue": queue or None,
        "priority": priority,
        "catch_up_window": catch_up_window,
    }
    entry.update({key: value for key, value in optional.items() if value is not None})
    return entry


def stored_payload(name, text):
    """A stored entry's payload from its JSON text, or ScheduleError naming the entry and why
    Python cannot read it back (a row written by hand: jsonb nested deeper than Python's json
    reads, an integer of more digits than it converts)."""
    try:
        return decoding.json_value(text, "payload")
    except UnreadableJob as exc:
        raise ScheduleError(
            f"schedule entry {name!r}['payload'] cannot be read back: {exc.reason}",
            field="payload",
        ) from None


def parse_stored(row, conf):
    """The :class:`Schedule` of a ``store.StoredEntry``, or raises ScheduleError."""
    entry = stored_entry(
        job_type=row.job_type,
        cron=row.cron,
        every=row.every,
        timezone=row.timezone,
        payload=stored_payload(row.name, row.payload),
        queue=row.queue,
        priority=row.priority,
        catch_up=row.catch_up,
        catch_up_window=row.catch_up_window,
        misfire_grace=row.misfire_grace,
    )
    return parse_entry(row.name, entry, conf, where=f"schedule entry {row.name!r}")


def entry_dict(entry, payload=None):
    """The ``SCHEDULE``-style dict of a ``ScheduleEntry`` model instance (``payload``: its
    payload read otherwise, instead of the model's field: scheduler.status)."""
    return stored_entry(
        job_type=entry.job_type,
        cron=entry.cron,
        every=entry.every,
        timezone=entry.timezone,
        payload=entry.payload if payload is None else payload,
        queue=entry.queue,
        priority=entry.priority,
        catch_up=entry.catch_up,
        catch_up_window=entry.catch_up_window,
        misfire_grace=entry.misfire_grace,
    )
