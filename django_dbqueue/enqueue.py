"""``enqueue()`` and ``enqueue_many()``: put jobs in the queue inside the caller's transaction."""

import datetime
import difflib
from dataclasses import dataclass

from django.conf import settings
from django.db import ProgrammingError, connections
from django.utils import timezone

from . import payloads, registry, schema, store, tracing, validation, waiters, wakeup
from .conf import get_settings
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
    _check_database(using)
    return using


def _check_database(using):
    connection = connections[using]
    if connection.vendor != "postgresql":
        raise UnsupportedDatabase(
            f"database {using!r} is {connection.vendor}; django-dbqueue needs PostgreSQL "
            "(it relies on FOR UPDATE SKIP LOCKED, jsonb and LISTEN/NOTIFY)."
        )


def _run_after(value):
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
    return value


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


_NO_FLOW = {"unique_key": None, "unique_while": None, "serial_key": None}


def _flow(job_type, payload, *, unique_key, unique_while, debounce, serial_key):
    """The flow-control values of one job (docs/concepts.md), validated."""
    if (
        debounce is False
        and unique_key is None
        and unique_while is None
        and serial_key is None
        and job_type.unique_key is None
        and job_type.serial_key is None
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
    }


def _prepare(
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
    run_after = _run_after(run_after)
    delay = 0.0 if delay is None else validation.seconds(delay, "delay", error=EnqueueError)
    if idempotency_key is not None:
        validation.key(idempotency_key, error=EnqueueError)
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


def enqueue(
    type,
    payload=None,
    *,
    queue=None,
    priority=None,
    run_after=None,
    delay=None,
    idempotency_key=None,
    max_attempts=None,
    using=None,
    depends_on=None,
    on_failure="cancel",
    unique_key=None,
    unique_while=None,
    debounce=False,
    serial_key=None,
):
    """Add a job of registered ``type`` with a JSON ``payload``; returns an :class:`EnqueuedJob`.

    **Transactions.** The INSERT runs on the connection of database ``using`` (default
    ``DBQUEUE["DATABASE"]``) in whatever transaction is open there. Inside
    ``transaction.atomic()`` the job commits with your other writes and disappears if they roll
    back. Workers are woken only after it commits, by a notification sent on the same connection
    as a statement of its own (coalesced per queue over a few milliseconds; see
    ``django_dbqueue.wakeup``); a rollback sends nothing. In autocommit the INSERT commits at once
    and the notification follows it. Writes made through another database alias are *not* in
    the same transaction.

    **Idempotency.** With ``idempotency_key``, at most one job with that key exists: if one does
    (in any state, until it is pruned), nothing is inserted and its id is returned with
    ``created=False``. Two transactions racing on a key: the second waits for the first to commit
    and then gets the first one's job.

    **Unique while pending or active.** With ``unique_key`` (a str or int; or the type's
    ``@job(unique_key=...)``), at most one *live* job holds the key: while one does, enqueueing
    the key again inserts nothing and returns that job with ``created=False``; once it has
    finished (or, with ``unique_while="pending"``, once it has started) a new one may be
    enqueued. ``unique_while``: ``"active"`` (default: pending, waiting or running; a retry
    keeps the key) or ``"pending"`` (not started yet: a job that started, even one waiting for
    a retry, no longer holds it). Enforced by a partial unique index, so concurrent enqueuers
    get one job. ``debounce=True`` (with ``unique_while="pending"``) also gives the waiting job
    this call's ``run_after``/``delay`` and payload. Not with ``idempotency_key``.

    **Serial key.** Jobs with the same ``serial_key`` (a str or int; or the type's
    ``@job(serial_key=...)``) never run at the same time, and start in enqueue order: a job
    waits while another of its key runs or an older one is pending, even one waiting for a retry.

    ``run_after`` (aware datetime) or ``delay`` (seconds or timedelta) schedules the job.
    ``queue``, ``priority`` (-100..100, higher first) and ``max_attempts`` default to the type's.

    **Tracing.** Inside an OpenTelemetry trace (the ``[otel]`` extra), the job records the
    active span's ``traceparent`` and its run becomes a span of the same trace.

    **Dependencies.** With ``depends_on`` (a list of ``EnqueuedJob`` or job ids) the job waits
    until every one of them is done; ``on_failure="run"`` runs it even when one dies or is
    cancelled (default: it is cancelled too). See docs/workflows.md; such a job cannot have an
    ``idempotency_key``.

    Raises ``UnknownJobType``, ``PayloadError`` (naming the offending path), ``EnqueueError`` or
    ``UnsupportedDatabase`` before anything is written.
    """
    if on_failure != "cancel" and depends_on is None:
        raise EnqueueError(f"on_failure={on_failure!r} needs depends_on")
    if depends_on is not None:
        if idempotency_key is not None:
            raise EnqueueError("a job with depends_on cannot have an idempotency_key")
        if unique_key is not None or unique_while is not None or debounce:
            raise EnqueueError(
                "a job with depends_on cannot be unique (unique_key, unique_while, debounce): "
                "it is created waiting, and its dependencies decide when it runs"
            )
        from .workflow import Workflow

        wf = Workflow()
        options = {"queue": queue, "priority": priority, "run_after": run_after}
        options.update(delay=delay, max_attempts=max_attempts, serial_key=serial_key)
        wf.add(
            type,
            payload,
            depends_on=depends_on,
            on_failure=on_failure,
            **{name: value for name, value in options.items() if value is not None},
        )
        return wf.enqueue(using=using)[0]
    conf = get_settings()
    using = database(using, conf)
    values = _prepare(
        type,
        payload,
        queue=queue,
        priority=priority,
        run_after=run_after,
        delay=delay,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        conf=conf,
        unique_key=unique_key,
        unique_while=unique_while,
        debounce=debounce,
        serial_key=serial_key,
    )
    traceparent = tracing.current_traceparent()
    if traceparent is not None:  # only inside an OpenTelemetry trace (docs/observability.md)
        values["traceparent"] = traceparent
    try:
        if values["unique_key"] is not None:
            return _enqueue_unique(using, values, debounce)
        while True:
            inserted = store.insert_job(using, **values)
            if inserted is not None:
                job_id, wake = inserted
                if waiters.wanted(wake):
                    wakeup.jobs_ready(using, (values["queue"],))
                return EnqueuedJob(job_id, True, type, values["queue"])
            existing = store.ids_by_keys(using, [idempotency_key]).get(idempotency_key)
            if existing is not None:
                return EnqueuedJob(existing, False, type, values["queue"])
            # The key's holder was deleted between the two statements: insert again.
    except ProgrammingError as exc:
        # A database never migrated (or migrated to an older release): said after the fact,
        # so that no enqueue pays a query to ask first.
        schema.raise_if_unmigrated(exc, using)
        raise


UNIQUE_TRIES = 100  # each lost round means the key's holder finished between two statements


def _enqueue_unique(using, values, debounce):
    """Insert a job holding a unique key, or return the job holding it. An insert that meets a
    holder inserts nothing (after waiting for the holder's transaction); the holder is then read
    by its key. Should it have finished in between, the insert is tried again: each round needs
    a whole job to finish between two statements, so a few rounds are the most a real
    workload sees; the bound turns a pathological one into an error instead of a spin."""
    key = values["unique_key"]
    for _ in range(UNIQUE_TRIES):
        inserted = store.insert_unique_job(using, debounce=debounce, **values)
        if inserted is not None:
            job_id, wake, created = inserted
            if waiters.wanted(wake):
                wakeup.jobs_ready(using, (values["queue"],))
            return EnqueuedJob(job_id, created, values["type"], values["queue"])
        holder = store.unique_holder(using, key)
        if holder is not None:
            job_id, job_type, queue = holder
            return EnqueuedJob(job_id, False, job_type, queue)
    raise EnqueueError(
        f"unique_key {validation.shown(key)}: its holder kept finishing between the insert and "
        f"the read {UNIQUE_TRIES} times in a row; nothing was enqueued"
    )


_SPEC_KEYS = {
    "type",
    "payload",
    "queue",
    "priority",
    "run_after",
    "delay",
    "idempotency_key",
    "max_attempts",
    "serial_key",
}


def _spec(item, index):
    if isinstance(item, dict):
        unknown = [key for key in item if key not in _SPEC_KEYS]
        if unknown:
            raise EnqueueError(
                f"jobs[{index}] has unknown keys [{', '.join(map(validation.shown, unknown))}]; "
                f"allowed: {sorted(_SPEC_KEYS)}"
            )
        if "type" not in item:
            raise EnqueueError(f"jobs[{index}] has no 'type'")
        spec = dict.fromkeys(_SPEC_KEYS)
        spec.update(item)
        return spec
    if isinstance(item, tuple | list) and len(item) in (1, 2):
        spec = dict.fromkeys(_SPEC_KEYS)
        spec["type"] = item[0]
        spec["payload"] = item[1] if len(item) == 2 else None
        return spec
    raise EnqueueError(
        f"jobs[{index}] must be a dict of enqueue() arguments or a (type, payload) pair, "
        f"got {validation.shown(item)}"
    )


def columns_of(prepared):
    """The array parameters of a batch INSERT, from ``_prepare()``'s values of each job."""
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
    }


def enqueue_many(jobs, *, using=None):
    """Add many jobs in one INSERT statement; same rules as :func:`enqueue`, inside the caller's
    transaction. After the commit, one notification per queue carries that queue's job count.

    Each item is ``(type, payload)`` or a dict of ``enqueue()``'s arguments. Every item is
    validated before anything is written; an error names the item's index. Returns a list of
    :class:`EnqueuedJob` in the order given.
    """
    conf = get_settings()
    using = database(using, conf)
    try:
        items = list(jobs)
    except TypeError:
        raise EnqueueError(
            f"jobs must be an iterable of jobs, got {validation.shown(jobs)}"
        ) from None
    prepared = []
    for index, item in enumerate(items):
        spec = _spec(item, index)
        try:
            values = _prepare(**spec, conf=conf)
            if values["unique_key"] is not None:
                raise EnqueueError(
                    f"job type {values['type']!r} has a unique_key (@job(unique_key=...)); "
                    "enqueue_many() does not take unique jobs: use enqueue() for each"
                )
            prepared.append(values)
        except (EnqueueError, UnknownJobType) as exc:
            raise type(exc)(f"jobs[{index}]: {exc}") from exc
        except payloads.PayloadError as exc:
            raise payloads.PayloadError(f"jobs[{index}]: {exc}") from exc
    if not prepared:
        return []
    columns = {**columns_of(prepared), "keys": [p["key"] for p in prepared]}
    try:
        rows = store.insert_jobs(using, columns=columns, traceparent=tracing.current_traceparent())
    except ProgrammingError as exc:
        schema.raise_if_unmigrated(exc, using)
        raise
    wakeup.jobs_ready(using, (queue for _, _, queue, wake in rows if waiters.wanted(wake)))
    # RETURNING order is not guaranteed; rows without a key map back by insertion order, which
    # INSERT ... SELECT ... ORDER BY preserves for the id sequence.
    keyed = {key: job_id for job_id, key, *_ in rows if key is not None}
    unkeyed = sorted(job_id for job_id, key, *_ in rows if key is None)
    missing = [p["key"] for p in prepared if p["key"] is not None and p["key"] not in keyed]
    existing = store.ids_by_keys(using, missing) if missing else {}
    result, unkeyed_iter, seen = [], iter(unkeyed), set()
    for p in prepared:
        key = p["key"]
        if key is None:
            result.append(EnqueuedJob(next(unkeyed_iter), True, p["type"], p["queue"]))
        elif key in keyed and key not in seen:
            seen.add(key)
            result.append(EnqueuedJob(keyed[key], True, p["type"], p["queue"]))
        else:
            job_id = keyed.get(key) or existing.get(key)
            result.append(EnqueuedJob(job_id, False, p["type"], p["queue"]))
    return result
