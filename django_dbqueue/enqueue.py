"""``enqueue()`` and ``enqueue_many()``: put jobs in the queue inside the caller's transaction."""

from django.db import ProgrammingError

from . import payloads, schema, store, tracing, validation, waiters, wakeup
from .conf import get_settings
from .exceptions import EnqueueError, UnknownJobType
from .jobspec import EnqueuedJob, columns_of, database, prepare
from .workflow import Workflow

__all__ = ["EnqueuedJob", "database", "enqueue", "enqueue_many"]


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
    fair_key=None,
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

    **Fair key.** In a queue with ``{"fair": True}``, the claim takes jobs round-robin by
    ``fair_key`` (a str or int; or the type's ``@job(fair_key=...)``), so that one key's backlog
    does not delay another key's job (docs/fairness.md). Elsewhere it is stored and unused.

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
        wf = Workflow()
        options = {"queue": queue, "priority": priority, "run_after": run_after}
        options.update(delay=delay, max_attempts=max_attempts, serial_key=serial_key)
        options.update(fair_key=fair_key)
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
    values = prepare(
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
        fair_key=fair_key,
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
    "fair_key",
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
            values = prepare(**spec, conf=conf)
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
