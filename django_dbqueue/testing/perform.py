"""``perform_job()``: one handler, called with a real ``JobContext``, its result or its error.

No row is written and no claim is made: the payload is checked as ``enqueue()`` checks it (the
same function, ``jobspec.prepare``), handed to the handler as it would read back from the
database, and the handler's return value must be one a worker can store. An atomic handler
runs in a transaction, as on a worker, so that its writes roll back with its error. Durable
steps and waits need the job's row: a handler that reaches one is told to use ``run_jobs()``.
"""

import datetime
import json

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from .. import registry, steps, validation
from ..batches import Batch
from ..conf import get_settings
from ..context import JobContext
from ..exceptions import InvalidArgument, Snooze
from ..jobspec import database, prepare
from ..outcomes import encode_result
from ..store import ClaimedRow
from .calls import HandlerCalls

_CONTEXT = {
    "id": "the job's id (default 0: no job has it)",
    "attempt": "the run's attempt, from 1 (default 1)",
    "max_attempts": "as enqueue()'s",
    "queue": "as enqueue()'s",
    "priority": "as enqueue()'s",
    "idempotency_key": "as enqueue()'s",
    "enqueued_at": "an aware datetime (default now)",
    "worker_id": 'default "perform_job"',
    "wait": "seconds it waited to be claimed (default 0.0)",
    "traceparent": "a W3C traceparent, or None",
}


class _NoRow(steps.Steps):
    """The steps of a run that has no job row to record them in."""

    __slots__ = ()

    def recorded(self, ctx):
        raise InvalidArgument(
            f"perform_job({ctx.type!r}): the handler reached a durable step or wait (ctx.step, "
            "ctx.sleep, ctx.wait_for_signal), which records in the job's row; perform_job() "
            "runs the handler without one. Enqueue the job and run it with run_jobs()"
        )

    reread = recorded


def _context(job_type_name, payload, context, using):
    unknown = sorted(set(context) - set(_CONTEXT))
    if unknown:
        raise InvalidArgument(
            f"perform_job(): unknown context {', '.join(map(repr, unknown))}; it takes "
            + "; ".join(f"{name}: {what}" for name, what in _CONTEXT.items())
        )
    values = prepare(
        job_type_name,
        payload,
        queue=context.get("queue"),
        priority=context.get("priority"),
        run_after=None,
        delay=None,
        idempotency_key=context.get("idempotency_key"),
        max_attempts=context.get("max_attempts"),
        conf=get_settings(),
    )
    attempt = context.get("attempt", 1)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidArgument(
            f"perform_job(): attempt must be an int >= 1, got {validation.shown(attempt)}"
        )
    if attempt > values["max_attempts"]:
        raise InvalidArgument(
            f"perform_job(): attempt={attempt} is past max_attempts={values['max_attempts']}"
        )
    job_id = context.get("id", 0)
    if isinstance(job_id, bool) or not isinstance(job_id, int) or not 0 <= job_id < 2**63:
        raise InvalidArgument(
            f"perform_job(): id must be an int from 0 to 2**63-1, got {validation.shown(job_id)}"
        )
    enqueued_at = context.get("enqueued_at") or timezone.now()
    if not isinstance(enqueued_at, datetime.datetime) or enqueued_at.tzinfo is None:
        raise InvalidArgument(
            "perform_job(): enqueued_at must be an aware datetime, got "
            f"{validation.shown(enqueued_at)}"
        )
    row = ClaimedRow(
        id=job_id,
        type=job_type_name,
        queue=values["queue"],
        payload=json.loads(values["payload"]),  # as the claim hands it over: read back
        attempt=attempt,
        max_attempts=values["max_attempts"],
        lease_seconds=values["lease"],
        idempotency_key=values["key"],
        priority=values["priority"],
        created_at=enqueued_at,
        wait=float(context.get("wait", 0.0)),
        traceparent=context.get("traceparent"),
    )
    ctx = JobContext(row, worker_id=context.get("worker_id", "perform_job"), using=using)
    ctx._steps = _NoRow()
    return ctx


def perform_job(type, payload=None, *, using=None, **context):
    """Call the handler of job type ``type`` (its name, or its ``@job`` function) once with a
    :class:`~django_dbqueue.JobContext` for ``payload``; return what it returned, or raise
    what it raised.

    The payload is checked by the very code ``enqueue()`` checks it with (an unknown type, a
    value JSON cannot carry, a bad queue: the same errors), and the handler receives it as a
    worker would, read back from JSON. ``context`` sets what the handler sees: ``id``
    (default 0), ``attempt`` (1), ``max_attempts``, ``queue``, ``priority``,
    ``idempotency_key``, ``enqueued_at``, ``worker_id``, ``wait``, ``traceparent``.

    The result is returned as a worker stores it (JSON, read back: a tuple comes back a list);
    one it could not store raises ``ResultError``; a ``Snooze`` the handler returned is returned
    as is. An ``atomic=True`` handler runs inside ``transaction.atomic()``, so its writes roll
    back with its error. A batch handler is called with a ``Batch`` of this one job, and its
    mark for it is returned or raised. Nothing is written to the queue; no job row exists, so
    ``ctx.step()`` and the durable waits raise ``InvalidArgument`` (use ``run_jobs()``)."""
    if not isinstance(type, str):
        from .enqueued import type_filter

        type = type_filter(type, "perform_job()")[0]
    using = database(using)
    ctx = _context(type, payload, context, using)
    job_type = registry.get(type)
    rolled_back = []  # an atomic handler's writes rolled back: its side statements run again
    with HandlerCalls(using) as calls, calls.one(lambda: bool(rolled_back)):
        if not job_type.atomic:
            result = _call(job_type, ctx)
        else:
            result = None
            try:
                with transaction.atomic(using=using):
                    result = _call(job_type, ctx)
                    if isinstance(result, Snooze):
                        raise result  # as run_handler: its writes roll back
            except BaseException as exc:
                rolled_back.append(True)
                if exc is not result:
                    raise
    if isinstance(result, Snooze):
        return result
    text = encode_result(result)
    return None if text is None else json.loads(text)


def _call(job_type, ctx):
    if job_type.batch_size:
        batch = Batch([ctx])
        job_type.func(batch)
        kind, value = batch.outcomes()[0][1:]
        if kind == "error":
            raise value
        return None if value is None else json.loads(value)
    if job_type.is_async:
        return async_to_sync(job_type.func)(ctx)
    return job_type.func(ctx)
