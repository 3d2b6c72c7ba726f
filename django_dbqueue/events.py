"""``publish()`` and ``replay_event()``: one event, one job for each of its subscribers, inside
the caller's transaction (docs/events.md).

A subscriber is a job type that names the event in ``@job(subscribes=[...])`` or is listed for
it in ``DBQUEUE["SUBSCRIPTIONS"]``. Each subscriber's job is an ordinary job of its own type
(its queue, priority, attempts, lease, backoff, retries and dead letter), with the event's
payload, that points back to the event (``event_id``) and is keyed by (event, type), so that
one event never makes two jobs of one subscriber.
"""

import json
from dataclasses import dataclass

from django.db import ProgrammingError

from . import decoding, payloads, registry, schema, store, tracing, validation, waiters, wakeup
from .conf import get_settings
from .exceptions import EnqueueError, UnreadableJob
from .jobspec import EnqueuedJob, database, prepare

__all__ = ["PublishedEvent", "publish", "replay_event", "subscribers"]


@dataclass(frozen=True, slots=True)
class PublishedEvent:
    """What ``publish()`` returns: the event's id, whether this call created it, its name, and
    the jobs made for its subscribers (for a repeated idempotency key: the jobs that refer to
    the existing event now, each with ``created=False``)."""

    id: int
    created: bool
    name: str
    jobs: tuple


def subscribers(event, conf=None):
    """The job type names that a publish of ``event`` makes a job of, in a stable order: the
    types whose ``@job(subscribes=...)`` names it, by type name, then the ones
    ``DBQUEUE["SUBSCRIPTIONS"]`` lists for it, in its order (each type once)."""
    conf = conf or get_settings()
    found = sorted(name for name, t in registry.all_types().items() if event in t.subscribes)
    listed = conf.SUBSCRIPTIONS.get(event, ()) if isinstance(conf.SUBSCRIPTIONS, dict) else ()
    return tuple(dict.fromkeys([*found, *listed]))


_subscribers_of = subscribers  # replay_event()'s argument has the same name


def _event_name(event):
    return validation.type_name(event, "event name", error=EnqueueError)


def _columns(types, payload, conf):
    """The subscribers' jobs' values (store.events), each validated as enqueue() would."""
    columns = {"types": [], "queues": [], "priorities": [], "max_attempts": []}
    columns.update(leases=[], serial_keys=[], fair_keys=[])
    payload_json = None
    for job_type in types:
        values = prepare(
            job_type,
            payload,
            queue=None,
            priority=None,
            run_after=None,
            delay=None,
            idempotency_key=None,
            max_attempts=None,
            conf=conf,
        )
        if values["unique_key"] is not None:
            raise EnqueueError(
                f"subscriber {job_type!r} has a unique_key (@job(unique_key=...)); a "
                "subscriber's job is keyed by its event instead: drop the unique_key"
            )
        payload_json = values["payload"]
        columns["types"].append(job_type)
        columns["queues"].append(values["queue"])
        columns["priorities"].append(values["priority"])
        columns["max_attempts"].append(values["max_attempts"])
        columns["leases"].append(values["lease"])
        columns["serial_keys"].append(values["serial_key"])
        columns["fair_keys"].append(values["fair_key"])
    return columns, payload_json


def publish(event, payload=None, *, idempotency_key=None, using=None):
    """Publish ``event`` (a name such as ``"invoice.paid"``) with a JSON ``payload``: store the
    event and create one job for each of its subscribers; returns a :class:`PublishedEvent`.

    **Transactions.** Like ``enqueue()``: one statement on the connection of database ``using``
    (default ``DBQUEUE["DATABASE"]``), in whatever transaction is open there. The event and
    every subscriber's job commit with your other writes, or none of them exists after a
    rollback; workers are woken after the commit only.

    **Subscribers** are the types of ``subscribers(event)`` at the time of the call. An event
    with none is stored all the same (with no job), so that ``replay_event()`` can deliver it
    to a subscriber added later; a subscriber added later receives no old event otherwise.

    **Idempotency.** With ``idempotency_key``, at most one event of this name holds the key: a
    publish that repeats it creates nothing and returns the existing event (``created=False``)
    and its jobs. Two transactions racing on a key: the second waits for the first to commit
    and then gets the first one's event; if the first rolls back, the second creates it. The
    existing event is locked (FOR KEY SHARE) until your transaction ends, so the sweeper's
    prune leaves it meanwhile; one that the prune deleted first (its jobs were pruned and it
    is older than ``DONE_RETENTION``) frees its key, and this publish creates a new event.

    Raises ``EnqueueError`` (a bad name or key, a subscriber with a unique key),
    ``UnknownJobType`` (a subscriber listed in ``SUBSCRIPTIONS`` that no ``@job`` registers),
    ``PayloadError`` or ``UnsupportedDatabase`` before anything is written.
    """
    conf = get_settings()
    using = database(using, conf)
    _event_name(event)
    if idempotency_key is not None:
        validation.key(idempotency_key, error=EnqueueError)
    types = subscribers(event, conf)
    columns, payload_json = _columns(types, payload, conf)
    if payload_json is None:  # no subscriber: validated all the same
        payload_json = payloads.dumps({} if payload is None else payload)
    values = {
        "name": event,
        "payload": payload_json,
        "key": idempotency_key,
        "subscribers": json.dumps(list(types)),
        "traceparent": tracing.current_traceparent(),
        **columns,
    }
    for _ in range(_PUBLISH_TRIES):
        try:
            rows = store.publish_event(using, **values)
        except ProgrammingError as exc:
            schema.raise_if_unmigrated(exc, using)
            raise
        if rows:
            break
        existing = _existing(using, event, idempotency_key)
        if existing is not None:
            return existing
    else:
        raise EnqueueError(
            f"event {event!r} with idempotency_key {validation.shown(idempotency_key)} was "
            f"pruned while this publish read it, {_PUBLISH_TRIES} times; publish again"
        )
    wakeup.jobs_ready(
        using, (row[3] for row in rows if row[1] is not None and waiters.wanted(row[4]))
    )
    jobs = tuple(
        EnqueuedJob(job_id, True, t, q) for _, job_id, t, q, _ in rows if job_id is not None
    )
    return PublishedEvent(rows[0][0], True, event, jobs)


# A repeated key's event that the prune deleted between the INSERT that found it and the read
# that locks it is gone: the key is free, and the INSERT is tried again (docs/events.md).
_PUBLISH_TRIES = 3


def _existing(using, event, key):
    """The event holding ``key``, locked until the caller's commit (store.event_by_key), or
    None when the prune deleted it meanwhile."""
    rows = store.event_by_key(using, event, key)
    if not rows:
        return None
    jobs = tuple(EnqueuedJob(job_id, False, t, q) for _, job_id, t, q in rows if job_id is not None)
    return PublishedEvent(rows[0][0], False, event, jobs)


@schema.explains_unmigrated
def replay_event(event_id, subscribers=None, *, using=None):
    """Deliver an already published event to ``subscribers`` (job type names; default: every
    current subscriber of its name) that never got a job for it: each gets one, as if it had
    subscribed when the event was published. A subscriber that got its job once gets nothing
    new, also after retention deleted that job or it was cancelled: the event's
    ``subscribers`` list, which publish() and every replay extend with the types that got a
    job, is what the replay reads, under the event's row lock. Returns the jobs created (a
    list of ``EnqueuedJob``). In the caller's transaction.

    Raises ``EnqueueError`` when no event has that id (never published, or pruned), as
    ``publish()`` does for the subscribers, and ``NotMigrated`` on a database without the
    queue's tables.
    """
    conf = get_settings()
    using = database(using, conf)
    if isinstance(event_id, bool) or not isinstance(event_id, int) or event_id < 1:
        raise EnqueueError(f"event_id must be a positive int, got {validation.shown(event_id)}")
    row = store.event(using, event_id)
    if row is None:
        raise EnqueueError(f"no event has id {event_id} (never published, or pruned)")
    name, payload_text = row[0], row[1]
    if subscribers is None:
        types = _subscribers_of(name, conf)
    elif isinstance(subscribers, str) or not isinstance(subscribers, list | tuple):
        raise EnqueueError(
            f"subscribers must be a list of job type names, got {validation.shown(subscribers)}"
        )
    else:
        types = tuple(dict.fromkeys(subscribers))
    try:
        payload = decoding.json_value(payload_text, "payload")
    except UnreadableJob as exc:  # a row written by hand: no job can carry it
        raise EnqueueError(
            f"event #{event_id} ({name!r}): its stored payload cannot be read back "
            f"({exc.reason}); nothing was enqueued"
        ) from None
    columns, _ = _columns(types, payload, conf)
    rows = store.replay_event(
        using, event=event_id, traceparent=tracing.current_traceparent(), **columns
    )
    if not rows:
        raise EnqueueError(f"no event has id {event_id} (pruned while it was replayed)")
    wakeup.jobs_ready(
        using, (row[3] for row in rows if row[1] is not None and waiters.wanted(row[4]))
    )
    return [EnqueuedJob(job_id, True, t, q) for _, job_id, t, q, _ in rows if job_id is not None]
