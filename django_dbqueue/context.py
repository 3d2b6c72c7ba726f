"""``JobContext``: what a handler receives. A light object built from the claimed row."""

import json


class JobContext:
    """The claimed job, as a handler sees it.

    ``id``, ``type``, ``queue``, ``payload`` (the decoded JSON), ``attempt`` (1 on the first run),
    ``max_attempts``, ``idempotency_key`` (or ``None``), ``priority``, ``enqueued_at``,
    ``worker_id``, ``using`` (the database alias of the queue), ``wait`` (seconds from the moment
    the job came due to its claim) and ``traceparent`` (the enqueuer's W3C trace context, or
    ``None``).
    """

    __slots__ = (
        "attempt",
        "enqueued_at",
        "id",
        "idempotency_key",
        "lease_seconds",
        "max_attempts",
        "payload",
        "priority",
        "queue",
        "traceparent",
        "type",
        "using",
        "wait",
        "worker_id",
    )

    def __init__(self, row, *, worker_id, using):
        self.id = row.id
        self.type = row.type
        self.queue = row.queue
        self.payload = row.payload
        self.attempt = row.attempt
        self.max_attempts = row.max_attempts
        self.lease_seconds = row.lease_seconds
        self.idempotency_key = row.idempotency_key
        self.priority = row.priority
        self.enqueued_at = row.created_at
        self.wait = row.wait
        self.traceparent = row.traceparent
        self.worker_id = worker_id
        self.using = using

    def dependency_results(self):
        """``{dependency id: result}`` of the jobs this one waited on (docs/workflows.md): each
        one's decoded return value, ``None`` for a handler that returned nothing or for a
        dependency that failed (``on_failure="run"``). A dependency already deleted by
        retention is missing."""
        from . import store

        return {
            job_id: None if result is None else json.loads(result)
            for job_id, result in store.dependency_results(self.using, self.id).items()
        }

    @property
    def is_last_attempt(self):
        """True when a failure of this run sends the job to the dead letters."""
        return self.attempt >= self.max_attempts

    def __repr__(self):
        return f"<JobContext {self.type} #{self.id} attempt {self.attempt}/{self.max_attempts}>"
