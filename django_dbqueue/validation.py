"""The rules every argument of django-dbqueue obeys, written once, worded once.

``enqueue``/``enqueue_many``, ``@job``, the ``SCHEDULE`` parser and the system checks all call
these. Each validator returns the (normalised) value or raises ``error`` (the caller's own class:
``EnqueueError``, ``JobRegistrationError``, ``ScheduleError``; ``ValueError`` by default) with a
message that starts with ``label``, says what the value must be and shows what it was, so the
same mistake reads the same wherever it is made.

The rules are plain Python, unit-tested without a database.
"""

import datetime
import math
import numbers
import reprlib

from .states import MAX_PRIORITY, MIN_PRIORITY

INT32_MAX = 2**31 - 1  # the integer columns (max_attempts, attempt) are PostgreSQL int4
MAX_QUEUE_NAME = 100  # dbqueue_job.queue is varchar(100)
MAX_TYPE_NAME = 200  # dbqueue_job.type and dbqueue_schedule.name are varchar(200)
MAX_KEY = 300  # dbqueue_job.idempotency_key and dbqueue_delivery.key are varchar(300)
MAX_JOB_ID = 2**63 - 1  # dbqueue_job.id is bigint
# No number of seconds handed to PostgreSQL is larger: ten years, far inside what interval and
# timestamptz arithmetic can carry, and far outside any schedule a queue is for.
MAX_SECONDS = 10 * 365 * 86400
# The timestamps every door accepts (run_after, a durable sleep's end, ...), inclusive: Python's
# own range (years 1 to 9999) less a day at each end, so that the value can still be shown in any
# time zone (UTC-14 to UTC+14) without leaving that range. PostgreSQL stores far more (4713 BC to
# 294276 AD), none of which Python reads back. The SQL doors (migration 0026) refuse the same range.
TIMESTAMP_MIN = datetime.datetime(1, 1, 2, tzinfo=datetime.UTC)  # inclusive
TIMESTAMP_MAX = datetime.datetime(9999, 12, 30, tzinfo=datetime.UTC)  # inclusive
# Handler threads of one worker process (CONCURRENCY, a queue's "concurrency", --concurrency):
# past this, threads and database connections run out long before any gain.
MAX_CONCURRENCY = 1000

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlevel = 3


def shown(value):
    """``repr(value)`` cut short, and never failing: an int over Python's digit limit or a
    structure nested too deep for ``repr`` is described instead of raising again."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {len_digits(value)} digits"
    try:
        return _short.repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__} that cannot be shown"


def len_digits(value):
    """Decimal digits of an int, without converting it to text (which has a digit limit)."""
    value = abs(value)
    # From the bits, the count is right or one too many (10**(n-1) has n digits), up to the
    # float's rounding, which the second test corrects the other way.
    count = max(1, math.ceil(value.bit_length() * math.log10(2)))
    if count > 1 and value < 10 ** (count - 1):
        count -= 1
    elif value >= 10**count:
        count += 1
    return count


def text_problem(value):
    """What keeps a str from being stored as PostgreSQL text, or ``None``."""
    if "\x00" in value:
        return "contains a NUL character (\\x00), which PostgreSQL cannot store in text"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (
                f"contains a lone surrogate ({value[exc.start]!r} at index {exc.start}), which "
                "is not valid UTF-8"
            )
    return None


def name(value, label, *, max_length, error=ValueError):
    """A non-empty str of at most ``max_length`` characters that PostgreSQL can store."""
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise error(
            f"{label} must be a non-empty string of at most {max_length} characters, "
            f"got {shown(value)}"
        )
    problem = text_problem(value)
    if problem:
        raise error(f"{label} {shown(value)} {problem}")
    return value


MAX_BY = 200  # who cancelled, paused or resumed, for the record (cancelled_by is varchar(200))


def by(value, label="by", error=ValueError):
    """Who did an operator action, for the record: a non-empty str of at most 200 characters
    that PostgreSQL can store (no NUL, no lone surrogate: a command's undecodable argument)."""
    return name(value, label, max_length=MAX_BY, error=error)


def queue_name(value, label="queue", error=ValueError):
    return name(value, label, max_length=MAX_QUEUE_NAME, error=error)


def type_name(value, label="job type name", error=ValueError):
    return name(value, label, max_length=MAX_TYPE_NAME, error=error)


def key(value, label="idempotency_key", error=ValueError):
    return name(value, label, max_length=MAX_KEY, error=error)


# The idempotency keys of the package's own jobs begin so: an event's subscribers
# ('dbqueue:event:<id>:<type>', store/events.py) and a schedule's ticks
# ('dbqueue-schedule:<entry>:<tick>', schedule.Schedule.key). Both can be computed in advance
# (event ids are a sequence, ticks are arithmetic), so a producer that took one could make
# publish() fail, a replay skip a subscriber or its own job stand in for a periodic one. Every
# producer door refuses them: enqueue(), enqueue_many() and the SQL functions (migration 0029).
RESERVED_KEY_PREFIXES = ("dbqueue:", "dbqueue-")


class PackageKey(str):
    """An idempotency key the package makes for a job of its own (a schedule's tick): the one
    kind of key that :func:`producer_key` lets start with a reserved prefix."""

    __slots__ = ()


def producer_key(value, label="idempotency_key", error=ValueError):
    """An idempotency key a producer may use: :func:`key`'s rules, and not one of the package's
    own (:data:`RESERVED_KEY_PREFIXES`) unless it is a :class:`PackageKey`. Returns a plain str."""
    key(value, label, error=error)
    if value.startswith(RESERVED_KEY_PREFIXES) and not isinstance(value, PackageKey):
        raise error(
            f"{label} {shown(value)} starts with {shown(value[:8])}, which is reserved for the "
            "keys of the package's own jobs (an event's subscribers, a schedule's ticks); use a "
            "prefix of your own, e.g. 'invoice-email:42'"
        )
    return str(value)


UNIQUE_WHILE = ("pending", "active")


def unique_while(value, label="unique_while", error=ValueError):
    """``"pending"`` (the key is held until the job first starts) or ``"active"`` (until it
    finishes)."""
    if value not in UNIQUE_WHILE or not isinstance(value, str):
        raise error(f"{label} must be 'pending' or 'active', got {shown(value)}")
    return value


def job_key(value, label, error=ValueError):
    """A unique or serial key: a str (rules of :func:`key`) or an int, stored as text."""
    if isinstance(value, int) and not isinstance(value, bool):
        if len_digits(value) > MAX_KEY:
            raise error(f"{label} must be at most {MAX_KEY} characters, got {shown(value)}")
        value = str(value)
    if not isinstance(value, str):
        raise error(f"{label} must be a str or an int, got {type(value).__name__} {shown(value)}")
    return key(value, label, error=error)


def integer(value, label, *, minimum, maximum=INT32_MAX, error=ValueError):
    """An ``int`` (not a bool, not a float that happens to be whole) in ``minimum..maximum``."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise error(f"{label} must be an integer from {minimum} to {maximum}, got {shown(value)}")
    return int(value)


def job_id_problem(value):
    """Why ``value`` cannot be a job id (an ``int`` from 1 to 2**63-1), or ``None``: ``"type"``
    for a non-int (a bool included), ``"range"`` for an int outside the bigint ids."""
    if isinstance(value, bool) or not isinstance(value, int):
        return "type"
    return None if 1 <= value <= MAX_JOB_ID else "range"


def priority(value, label="priority", error=ValueError):
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (MIN_PRIORITY <= value <= MAX_PRIORITY)
    ):
        raise error(
            f"{label} must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (higher runs "
            f"first), got {shown(value)}"
        )
    return value


def max_attempts(value, label="max_attempts", error=ValueError):
    return integer(value, label, minimum=1, error=error)


def seconds(
    value,
    label,
    *,
    positive=False,
    maximum=MAX_SECONDS,
    timedelta=True,
    error=ValueError,
):
    """A finite number of seconds (int, float or, with ``timedelta``, a ``timedelta``) from 0
    (exclusive with ``positive``) to ``maximum``; returned as a float."""
    if timedelta and isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    what = "a number of seconds or a timedelta" if timedelta else "a number of seconds"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{label} must be {what}, got {shown(value)}")
    bound = (
        f"greater than 0 and at most {_plain(maximum)}"
        if positive
        else f"from 0 to {_plain(maximum)}"
    )
    # `not (a <= v <= b)` is also true of NaN, and inf is past any maximum: both would fail in
    # SQL (or in interval arithmetic) far from the call that passed them.
    if not (0 < value <= maximum if positive else 0 <= value <= maximum):
        raise error(f"{label} must be {what} {bound}, got {shown(value)}")
    return float(value)


def timestamp(value, label, error=ValueError):
    """An aware ``datetime`` from ``TIMESTAMP_MIN`` to ``TIMESTAMP_MAX`` (inclusive), returned as
    it is. A naive one, or one outside the range (``datetime.max`` at UTC-14 is year 10000 in UTC,
    ``datetime.min`` at UTC+14 is 1 BC), raises ``error`` naming ``label``, the value and the
    range: never an ``OverflowError`` from the conversion to UTC."""
    if not isinstance(value, datetime.datetime):
        raise error(f"{label} must be an aware datetime, got {shown(value)}")
    if value.utcoffset() is None:
        raise error(f"{label} must be an aware datetime (with its time zone), got {shown(value)}")
    # Compared as aware datetimes (their UTC instants), which cannot overflow as astimezone() can.
    if not TIMESTAMP_MIN <= value <= TIMESTAMP_MAX:
        raise error(
            f"{label} must be from {TIMESTAMP_MIN.isoformat()} to {TIMESTAMP_MAX.isoformat()} "
            f"(UTC, inclusive: what Python reads back and shows in any time zone), got "
            f"{value.isoformat()}"
        )
    return value


def _plain(number):
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


# Flow control (docs/concepts/flow-control.md): a QUEUES option or an @job keyword.
RATE_LIMIT_KEYS = ("limit", "period", "key")
MAX_RATE_KEY = 63  # a payload field name: a short identifier, as a column name would be


def concurrency_limit(value, label="global_concurrency", error=ValueError):
    """A fleet-wide number of jobs running at once: an integer of at least 1."""
    return integer(value, label, minimum=1, error=error)


def rate_key(value, label, error=ValueError):
    """A top-level payload field name: letters, digits and underscores, not starting with a
    digit (``account_id``), of at most 63 characters."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_RATE_KEY
        or not value.isascii()
        or not (value.replace("_", "a").isalnum() and not value[0].isdigit())
    ):
        raise error(
            f"{label} must be a payload field name (letters, digits and _, not starting with a "
            f"digit, at most {MAX_RATE_KEY} characters), got {shown(value)}"
        )
    return value


def rate_limit(value, label="rate_limit", error=ValueError):
    """``{"limit": N, "period": seconds, "key": field or None}``: at most N starts in any
    period-long window, per value of the payload field ``key`` when given. Returned normalised
    (every key present, the period a float)."""
    if not isinstance(value, dict):
        raise error(
            f'{label} must be a dict like {{"limit": 100, "period": 60, "key": "account_id"}} '
            f"(key optional), got {shown(value)}"
        )
    unknown = [k for k in value if k not in RATE_LIMIT_KEYS]
    if unknown:
        raise error(
            f"{label} has unknown key(s) {', '.join(map(shown, unknown))}; "
            f"its keys are {', '.join(RATE_LIMIT_KEYS)}"
        )
    for required in ("limit", "period"):
        if required not in value:
            raise error(f"{label} needs {required!r}, got {shown(value)}")
    limit = integer(value["limit"], f"{label}['limit']", minimum=1, error=error)
    period = seconds(value["period"], f"{label}['period']", positive=True, error=error)
    key = value.get("key")
    if key is not None:
        rate_key(key, f"{label}['key']", error=error)
    return {"limit": limit, "period": period, "key": key}
