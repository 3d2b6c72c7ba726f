"""What a test finds in the queue: ``enqueued_jobs()``, ``assert_enqueued()``, ``refute_enqueued()``.

They read the queue's table on the test's connection (inside ``TestCase``, its uncommitted rows),
so they see every job alike, whatever wrote it: ``enqueue``, ``enqueue_many``, a workflow, a
``publish``, the scheduler, the Tasks backend, an SQL enqueue function.
"""

import difflib
import json
from dataclasses import dataclass, replace

from .. import names, payloads, registry, store, validation
from ..exceptions import InvalidArgument, UnknownJobType
from ..jobspec import database
from ..states import JobState

ENQUEUED = ("pending", "waiting")  # not started yet, or due to run again (a retry, a snooze)
SHOWN = 20  # jobs an assertion's message lists
SCANNED = 1000  # jobs an assertion reads at most


@dataclass(frozen=True)
class QueuedJob:
    """A job as a test sees it. ``name`` is the type, or for a ``django.tasks`` job the path of
    its task; ``payload``, ``errors`` and ``result`` are decoded JSON."""

    id: int
    type: str
    name: str
    queue: str
    payload: object
    state: str
    priority: int
    run_after: object
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    created_at: object
    errors: list
    result: object
    wait_reason: str | None
    event_id: int | None
    worker_id: str | None

    @classmethod
    def from_row(cls, row):
        payload = json.loads(row[3])
        return cls(
            id=row[0],
            type=row[1],
            name=names.stored(row[1], payload),
            queue=row[2],
            payload=payload,
            state=row[4],
            priority=row[5],
            run_after=row[6],
            attempts=row[7],
            max_attempts=row[8],
            idempotency_key=row[9],
            created_at=row[10],
            errors=json.loads(row[11]) if row[11] else [],
            result=None if row[12] is None else json.loads(row[12]),
            wait_reason=row[13],
            event_id=row[14],
            worker_id=row[15],
        )

    def describe(self):
        return (
            f"#{self.id} {self.name} in {self.queue!r} ({self.state}) payload={_json(self.payload)}"
        )


def _json(value):
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


# -- what a test names --------------------------------------------------------------------------


def type_filter(value, where):
    """``(type name, task path or None)`` of what a test names a job type by: its name, its
    ``@job`` function, or a ``django.tasks`` Task (``(None, None)`` for None)."""
    if value is None:
        return None, None
    if isinstance(value, str):
        if registry.get(value) is None:
            known = sorted(registry.all_types())
            close = difflib.get_close_matches(value, known, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise UnknownJobType(
                f"{where}: unknown job type {value!r}: no @job({value!r}) handler is "
                f"registered.{hint} Registered: {', '.join(known) or 'none'}."
            )
        return value, None
    path = getattr(value, "module_path", None)
    if isinstance(path, str) and hasattr(value, "func") and hasattr(value, "backend"):
        return names.TASKS_TYPE, path  # a django.tasks Task
    if callable(value):
        for name, job_type in registry.all_types().items():
            if job_type.func is value:
                return name, None
    raise InvalidArgument(
        f"{where}: type must be a job type's name, its @job function or a django.tasks Task, "
        f"got {validation.shown(value)}"
    )


def state_filter(state, where):
    """The states to look in: ``None`` is pending or waiting (enqueued, not finished)."""
    if state is None:
        return ENQUEUED
    states = (state,) if isinstance(state, str) else state
    try:
        states = tuple(states)
    except TypeError:
        states = (state,)
    bad = [s for s in states if s not in JobState.values]
    if bad or not states:
        raise InvalidArgument(
            f"{where}: state must be a job state or a list of them "
            f"({', '.join(JobState.values)}), got {validation.shown(state)}"
        )
    return states


def queue_filter(queue, where):
    if queue is None:
        return None
    if not isinstance(queue, str):
        raise InvalidArgument(f"{where}: queue must be a queue name, got {validation.shown(queue)}")
    return queue


def expected_payload(payload, where):
    """The expected payload as stored JSON reads back (a tuple is refused, as enqueue refuses
    it); None: any payload."""
    if payload is None:
        return None
    try:
        return json.loads(payloads.dumps(payload, "payload"))
    except payloads.PayloadError as exc:
        raise type(exc)(f"{where}: the expected {exc}") from None


def payload_mismatch(expected, actual, path="payload"):
    """How ``actual`` fails to match ``expected``, or None when it matches. A dict matches a
    dict that has each of its keys with a matching value (a subset, at every depth); a list a
    list of as many matching items, in order; anything else an equal value of the same JSON
    kind (1 matches 1.0, not true)."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{path} is {_json(actual)}, expected an object with {_json(expected)}"
        for key, value in expected.items():
            if key not in actual:
                return f"{path}[{json.dumps(key)}] is missing (expected {_json(value)})"
            found = payload_mismatch(value, actual[key], f"{path}[{json.dumps(key)}]")
            if found is not None:
                return found
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{path} is {_json(actual)}, expected {_json(expected)}"
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            found = payload_mismatch(want, got, f"{path}[{index}]")
            if found is not None:
                return found
        return None
    if _kind(expected) != _kind(actual) or expected != actual:
        return f"{path} is {_json(actual)}, expected {_json(expected)}"
    return None


def _kind(value):
    if isinstance(value, bool) or value is None:
        return type(value)
    if isinstance(value, int | float):
        return float
    return type(value)


# -- the filter ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Filter:
    type: str | None
    task: str | None
    payload: object
    queue: str | None
    states: tuple

    @classmethod
    def of(cls, where, type, payload, queue, state):
        job_type, task = type_filter(type, where)
        return cls(
            job_type,
            task,
            expected_payload(payload, where),
            queue_filter(queue, where),
            state_filter(state, where),
        )

    def mismatch(self, job):
        """Why ``job`` does not match, or None."""
        if self.type is not None and job.type != self.type:
            return f"its type is {job.type!r}"
        if self.task is not None and job.name != self.task:
            return f"its task is {job.name!r}"
        if self.queue is not None and job.queue != self.queue:
            return f"its queue is {job.queue!r}"
        if self.payload is not None:
            return payload_mismatch(self.payload, job.payload)
        return None

    def describe(self):
        """What the filter asks for, after "a job": " of type 'x' ... (pending or waiting)"."""
        text = ""
        if self.task is not None:
            text += f" of task {self.task!r}"
        elif self.type is not None:
            text += f" of type {self.type!r}"
        if self.payload is not None:
            text += f" with a payload matching {_json(self.payload)}"
        if self.queue is not None:
            text += f" in queue {self.queue!r}"
        return text + f" ({' or '.join(self.states)})"


def _read(using, states, limit=SCANNED):
    rows = store.find_jobs(using, states=states, limit=limit)
    return [QueuedJob.from_row(row) for row in rows]


def _matching(using, wanted):
    """Every job that matches ``wanted`` (type, queue and state filtered by the database,
    payload here), oldest first."""
    rows = store.find_jobs(
        using,
        states=wanted.states,
        types=None if wanted.type is None else [wanted.type],
        queues=None if wanted.queue is None else [wanted.queue],
        limit=None,
    )
    jobs = [QueuedJob.from_row(row) for row in rows]
    return [job for job in jobs if wanted.mismatch(job) is None]


def enqueued_jobs(type=None, payload=None, *, queue=None, state=None, using=None):
    """The jobs matching the filters, oldest first (a list of :class:`QueuedJob`).

    ``type``: a job type's name, its ``@job`` function, or a ``django.tasks`` Task. ``payload``:
    matched as a subset (see :func:`assert_enqueued`). ``state``: a state or a list of them;
    default pending or waiting (enqueued and not finished: not started yet, or due to run
    again). Reads the test's connection, in its transaction."""
    where = "enqueued_jobs()"
    return _matching(database(using), _Filter.of(where, type, payload, queue, state))


def assert_enqueued(type=None, payload=None, *, queue=None, count=None, state=None, using=None):
    """Fail unless jobs matching the filters are in the queue: at least one, or exactly
    ``count``. Returns the matching jobs (:class:`QueuedJob`, oldest first).

    ``payload`` matches as a subset: each key given must be in the job's payload with a matching
    value, at every depth of nested objects; lists match item by item; numbers by value (1 and
    1.0), not booleans. The message of a failure lists the jobs that are enqueued instead, each
    with the first thing that differs."""
    where = "assert_enqueued()"
    count = _count(count, where)
    wanted = _Filter.of(where, type, payload, queue, state)
    using = database(using)
    matching = _matching(using, wanted)
    if (count is None and matching) or len(matching) == count:
        return matching
    found = _read(using, wanted.states)
    expected = "a job" if count is None else f"{count} job{'' if count == 1 else 's'}"
    lines = [
        f"expected {expected}{wanted.describe()}, found {len(matching)}"
        + (f": {', '.join(f'#{j.id}' for j in matching[:SHOWN])}" if matching else "")
    ]
    lines += _listing(wanted, found)
    lines += _elsewhere(wanted, using)
    raise AssertionError("\n".join(lines))


def refute_enqueued(type=None, payload=None, *, queue=None, state=None, using=None):
    """Fail if any job matching the filters (as :func:`assert_enqueued`'s) is in the queue; the
    message lists the ones found."""
    where = "refute_enqueued()"
    wanted = _Filter.of(where, type, payload, queue, state)
    matching = _matching(database(using), wanted)
    if matching:
        lines = [f"expected no job{wanted.describe()}, found {len(matching)}:"]
        lines += [f"  {job.describe()}" for job in matching[:SHOWN]]
        if len(matching) > SHOWN:
            lines.append(f"  ... and {len(matching) - SHOWN} more")
        raise AssertionError("\n".join(lines))


def _count(count, where):
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise InvalidArgument(
            f"{where}: count must be None (at least one) or an int >= 0, got "
            f"{validation.shown(count)}"
        )
    return count


def _listing(wanted, found):
    """The jobs in the states looked in, oldest first, each with what differs."""
    states = " or ".join(wanted.states)
    if not found:
        return [f"No job is {states}."]
    more = "+" if len(found) >= SCANNED else ""
    lines = [f"{len(found)}{more} job{' is' if len(found) == 1 else 's are'} {states}:"]
    for job in found[:SHOWN]:
        why = wanted.mismatch(job)
        lines.append(f"  {job.describe()}: {'matches' if why is None else why}")
    if len(found) > SHOWN:
        lines.append(f"  ... and {len(found) - SHOWN} more")
    return lines


def _elsewhere(wanted, using):
    """The jobs that match but are in other states (one that ran already, one that is dead)."""
    others = [state for state in JobState.values if state not in wanted.states]
    if not others:
        return []
    matching = _matching(using, replace(wanted, states=tuple(others)))
    if not matching:
        return []
    one = len(matching) == 1
    lines = [f"{len(matching)} matching job{' is' if one else 's are'} in other states:"]
    lines += [f"  {job.describe()}" for job in matching[:SHOWN]]
    if len(matching) > SHOWN:
        lines.append(f"  ... and {len(matching) - SHOWN} more")
    return lines
