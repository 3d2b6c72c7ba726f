"""One job's arguments, validated into the values its INSERT binds: what ``enqueue()``,
``enqueue_many()`` and ``Workflow.enqueue()`` share, below all three.

``prepare()`` is the validation of one job (type, payload, queue, priority, timing, keys) and
``columns_of()`` the array parameters of a batch INSERT of prepared jobs; ``database()`` the alias
of an API call; ``EnqueuedJob`` what every enqueue returns.
"""

import datetime
import difflib
from dataclasses import dataclass

from django.conf import settings
from django.db import connections
from django.utils import timezone

from . import payloads, registry, validation
from .conf import SHARED_FAIR_KEY, get_settings
from .exceptions import EnqueueError, UnknownDatabase, UnknownJobType, UnsupportedDatabase


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """What ``enqueue`` returns: the job's id, and whether this call created it.

    ``created`` is False when a job with the same idempotency key already existed; ``id`` is then
    that job's id.
    """

    id: int
    created: bool
    type: str
    queue: str


def _job_type(name):
    job_type = registry.get(name) if type(name) is str else None
    if job_type is not None:
        return job_type  # a registered name is a valid one
    validation.type_name(name, "job type", error=EnqueueError)
    job_type = registry.get(name)
    if job_type is None:
        known = sorted(registry.all_types())
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownJobType(
            f"unknown job type {name!r}: no @job({name!r}) handler is registered.{hint} "
            f"Registered: {', '.join(known) or 'none'} (handlers live in <app>/jobs.py)."
        )
    return job_type


def database(using, conf=None):
    """The database alias of an API call: ``DBQUEUE["DATABASE"]`` when ``using`` is None, else
    ``using`` itself, which must be the alias (a str) of a PostgreSQL database in ``DATABASES``.
    Raises ``UnknownDatabase`` naming the value, or ``UnsupportedDatabase``."""
    if using is None:
        using = (conf or get_settings()).DATABASE
    elif type(using) is not str or using not in connections.settings:
        raise UnknownDatabase(
            f"using must be the alias (a str) of a database in DATABASES "
            f"({', '.join(map(repr, connections.settings))}), got {validation.shown(using)}"
        )
    check_database(using)
    return using


def check_database(using):
    connection = connections[using]
    if connection.vendor != "postgresql":
        raise UnsupportedDatabase(
            f"database {using!r} is {connection.vendor}; django-dbqueue needs PostgreSQL "
            "(it relies on FOR UPDATE SKIP LOCKED, jsonb and LISTEN/NOTIFY)."
        )


def run_after_of(value):
    """``run_after`` validated: None, or an aware datetime in validation.timestamp's range (a
    naive one is made aware in the default time zone when USE_TZ is off); ``EnqueueError``."""
    if value is None:
        return None
    if not isinstance(value, datetime.datetime):
        raise EnqueueError(f"run_after must be a datetime, got {value!r}")
    if timezone.is_naive(value):
        if settings.USE_TZ:
            raise EnqueueError(
                f"run_after={value!r} is a naive datetime while USE_TZ is on; pass an aware one "
                "(django.utils.timezone.now() + timedelta(...), or use delay=)"
            )
        value = timezone.make_aware(value, timezone.get_default_timezone())
    # Out of Python's range the row would be stored, and then unreadable (validation.py).
    return validation.timestamp(value, "run_after", error=EnqueueError)


def _derived_key(job_type, label, given, payload):
    """``given`` if not None, else what the type's ``@job(label=callable)`` makes of the payload;
    validated as a key, or ``None``."""
    if given is None:
        func = getattr(job_type, label)
        if func is None:
            return None
        try:
            given = func({} if payload is None else payload)
        except Exception as exc:
            raise EnqueueError(
                f"@job({job_type.name!r}) {label}(payload) raised {exc.__class__.__name__}: {exc}"
            ) from exc
        if given is None:
            return None
        label = f"@job({job_type.name!r}) {label}(payload)"
    return validation.job_key(given, label, error=EnqueueError)


_NO_FLOW = {"unique_key": None, "unique_while": None, "serial_key": None, "fair_key": None}


def _flow(job_type, payload, *, unique_key, unique_while, debounce, serial_key, fair_key=None):
    """The flow-control values of one job (docs/concepts/flow-control.md), validated; with its
    fair key (docs/fairness.md)."""
    if (
        debounce is False
        and unique_key is None
        and unique_while is None
        and serial_key is None
        and fair_key is None
        and job_type.unique_key is None
        and job_type.serial_key is None
        and getattr(job_type, "fair_key", None) is None
    ):
        return _NO_FLOW  # (read, never changed: the caller copies it into the job's values)
    if not isinstance(debounce, bool):
        raise EnqueueError(f"debounce must be True or False, got {validation.shown(debounce)}")
    unique_key = _derived_key(job_type, "unique_key", unique_key, payload)
    if unique_while is not None:
        validation.unique_while(unique_while, error=EnqueueError)
        if unique_key is None:
            raise EnqueueError(f"unique_while={unique_while!r} needs a unique_key")
    elif unique_key is not None:
        unique_while = job_type.unique_while or "active"
    if debounce and unique_while != "pending":
        raise EnqueueError(
            f"debounce=True needs unique_while='pending' (and a unique_key), got "
            f"unique_while={unique_while!r}: only a job that has not started can be pushed back"
        )
    return {
        "unique_key": unique_key,
        "unique_while": unique_while,
        "serial_key": _derived_key(job_type, "serial_key", serial_key, payload),
        "fair_key": _derived_key(job_type, "fair_key", fair_key, payload),
    }


def prepare(
    type,
    payload,
    *,
    queue,
    priority,
    run_after,
    delay,
    idempotency_key,
    max_attempts,
    conf,
    unique_key=None,
    unique_while=None,
    debounce=False,
    serial_key=None,
    fair_key=None,
):
    """Validate one job's arguments; returns the values its INSERT binds."""
    job_type = _job_type(type)
    flow = _flow(
        job_type,
        payload,
        unique_key=unique_key,
        unique_while=unique_while,
        debounce=debounce,
        serial_key=serial_key,
        fair_key=fair_key,
    )
    if idempotency_key is not None and flow["unique_key"] is not None:
        raise EnqueueError(
            f"pass idempotency_key or unique_key, not both (got idempotency_key="
            f"{validation.shown(idempotency_key)}, unique_key={validation.shown(flow['unique_key'])}"
            "): an idempotency key already allows one job per key in any state"
        )
    payload_json = payloads.dumps({} if payload is None else payload)
    if priority is None and max_attempts is None and (queue is None or isinstance(queue, str)):
        queue, priority, max_attempts, lease = _type_values(job_type, conf, queue)
    else:
        queue = _queue(job_type.get_queue(conf) if queue is None else queue, conf)
        priority = validation.priority(
            job_type.priority if priority is None else priority, error=EnqueueError
        )
        max_attempts = validation.max_attempts(
            job_type.get_max_attempts(conf) if max_attempts is None else max_attempts,
            error=EnqueueError,
        )
        lease = job_type.get_lease(conf)
    if run_after is not None and delay is not None:
        raise EnqueueError("pass run_after or delay, not both")
    run_after = run_after_of(run_after)
    delay = 0.0 if delay is None else validation.seconds(delay, "delay", error=EnqueueError)
    if idempotency_key is not None:
        idempotency_key = validation.producer_key(idempotency_key, error=EnqueueError)
    if flow["fair_key"] is None and (conf.QUEUES.get(queue) or {}).get("fair") is True:
        # A fair queue's job without a key takes the shared key (docs/fairness.md): a NULL key
        # would leave it out of the fair index, claimed only as a plain claim would.
        flow = {**flow, "fair_key": SHARED_FAIR_KEY}
    return {
        "type": type,
        "queue": queue,
        "payload": payload_json,
        "priority": priority,
        "run_after": run_after,
        "delay": delay,
        "max_attempts": max_attempts,
        "lease": lease,
        "key": idempotency_key,
        **flow,
    }


def _queue(queue, conf):
    queue = validation.queue_name(queue, error=EnqueueError)
    if queue not in conf.QUEUES:
        raise EnqueueError(
            f"queue {queue!r} is not in DBQUEUE['QUEUES'] ({', '.join(conf.QUEUES)}); "
            "no worker would claim it. Add it to the setting."
        )
    return queue


_TYPE_VALUES = {}  # (id(job type), queue) -> (job type, settings, its values): see _type_values


def _type_values(job_type, conf, queue=None):
    """``(queue, priority, max_attempts, lease)`` of the jobs of ``job_type`` that name neither
    a priority nor a max_attempts, on ``queue`` (a str, or None: the type's queue), validated
    once per type, queue and settings: ``get_settings()`` returns a new object when the
    settings change, and a type registered again is a new object. Only a queue in
    ``DBQUEUE["QUEUES"]`` passes the validation, so the cache holds a few entries per type."""
    cache_key = (id(job_type), queue)
    entry = _TYPE_VALUES.get(cache_key)
    if entry is not None and entry[0] is job_type and entry[1] is conf:
        return entry[2]
    values = (
        _queue(job_type.get_queue(conf) if queue is None else queue, conf),
        validation.priority(job_type.priority, error=EnqueueError),
        validation.max_attempts(job_type.get_max_attempts(conf), error=EnqueueError),
        job_type.get_lease(conf),
    )
    _TYPE_VALUES[cache_key] = (job_type, conf, values)
    return values


def columns_of(prepared):
    """The array parameters of a batch INSERT, from ``prepare()``'s values of each job."""
    return {
        "types": [p["type"] for p in prepared],
        "queues": [p["queue"] for p in prepared],
        "payloads": [p["payload"] for p in prepared],
        "priorities": [p["priority"] for p in prepared],
        "run_afters": [p["run_after"] for p in prepared],
        "delays": [p["delay"] for p in prepared],
        "max_attempts": [p["max_attempts"] for p in prepared],
        "leases": [p["lease"] for p in prepared],
        "serial_keys": [p["serial_key"] for p in prepared],
        "fair_keys": [p["fair_key"] for p in prepared],
    }
