"""The queue: ``BackgroundJob``, its workflow edges (``Dependency``) and the dead jobs' proxy."""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..states import FINISHED_STATES, MAX_PRIORITY, MIN_PRIORITY, JobState
from ..validation import MAX_SECONDS
from .bounds import time_range
from .fields import IdArrayField

# The timestamp columns of a job: each within what Python reads back (the CHECKs below).
TIMESTAMP_COLUMNS = (
    "run_after",
    "created_at",
    "started_at",
    "finished_at",
    "leased_until",
    "cancel_requested_at",
)

# When a job holds its unique key: live (pending, waiting or running) and, in the "pending"
# mode, never claimed yet. Written out again in store/jobs.py (UNIQUE_HELD_SQL); keep them equal.
UNIQUE_HELD = Q(unique_key__isnull=False, state__in=["pending", "waiting", "running"]) & (
    Q(unique_while="active") | Q(started_at__isnull=True)
)


class BackgroundJob(models.Model):
    """One unit of background work. Rows are written by ``enqueue`` and ``store`` only."""

    id = models.BigAutoField(primary_key=True)
    type = models.CharField(max_length=200, help_text="Registered job type name.")
    queue = models.CharField(max_length=100, default="default")
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    priority = models.SmallIntegerField(default=0, help_text="Higher runs first (-100..100).")
    run_after = models.DateTimeField(db_default=Now(), help_text="Not claimed before this time.")
    attempts = models.PositiveIntegerField(default=0, help_text="Claims so far.")
    max_attempts = models.PositiveIntegerField(default=10)
    lease_seconds = models.FloatField(default=60.0)
    leased_until = models.DateTimeField(null=True, blank=True)
    # NULL, not "": no worker holds it; and NULL keys stay out of the unique key index.
    worker_id = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # Random per claim: the fence of every write about this run (completion, failure, lease
    # extension, release). Kept after the run ends, so a worker can tell its own finished run.
    lease_token = models.BigIntegerField(null=True, blank=True, editable=False)
    idempotency_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001
    errors = models.JSONField(default=list, blank=True, help_text="One entry per failed attempt.")
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The W3C ``traceparent`` of the trace that enqueued the job (docs/observability.md); NULL
    # when no trace was active, which is every enqueue without OpenTelemetry.
    traceparent = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # Workflows (docs/workflows.md): how many of its dependencies a ``waiting`` job still waits
    # for, and the ids of the jobs that wait for this one (NULL for a job outside a workflow:
    # the completion and the trigger of migration 0009 then do nothing more for it). On the row
    # itself, so that a completion reads the newest list even when it had to wait for the
    # commit that added a dependent (a deferred trigger of migration 0015 appends to it at the
    # commit of the workflow's transaction; see store.workflows.INSERT_WORKFLOW and store.completion.COMPLETE_JOBS).
    waiting_on = models.PositiveIntegerField(db_default=0, default=0, editable=False)
    dependents = IdArrayField(null=True, blank=True, editable=False)
    # Cancelling (docs/concepts/cancelling.md): when a cancel was asked for, and by whom ("admin:<user>",
    # "api", cancel()'s ``by=``, or "handler" for a handler that cancelled its own job). A
    # running job that carries the mark stays running until its handler ends; whatever the
    # outcome then (success, failure, timeout, a swept lease, a shutdown), the write that ends
    # the run ends the job cancelled: never retried, never dead. NULL on every other job, so
    # the hot statements test one NULL per row and nothing more.
    cancel_requested_at = models.DateTimeField(null=True, blank=True, editable=False)
    cancelled_by = models.CharField(  # noqa: DJ001
        max_length=200, null=True, blank=True, editable=False
    )
    # Unique while active (docs/concepts/keys.md): at most one live job per ``unique_key``. With
    # ``unique_while = 'active'`` the key is held while the job is pending, waiting or running;
    # with ``'pending'`` only until its first claim (``started_at`` is set then and never
    # cleared, so a retry or a release back to pending never takes the key again). The key
    # stays on the row after that, for the admin.
    unique_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001
    unique_while = models.CharField(  # noqa: DJ001
        max_length=8, null=True, blank=True, choices=[("pending", "pending"), ("active", "active")]
    )
    # Serial key (docs/concepts/keys.md): jobs sharing it never run at the same time, and run in
    # enqueue (id) order; enforced by the claim (store.claiming.CLAIM_JOBS).
    serial_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001
    # Fair shares (docs/fairness.md): the key a fair queue's claim takes jobs round-robin by
    # (a tenant, an account), set at enqueue from ``@job(fair_key=...)`` or ``enqueue(fair_key=)``.
    # '' (store.fair.SHARED_KEY): the key enqueue() gives a fair queue's job that has none.
    # NULL: no key (SQL enqueue, publish; every plain job), claimed as a plain claim would.
    fair_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001
    # Snoozes and durable waits (docs/steps.md): how many times a handler snoozed (``Snooze``:
    # back to pending without spending an attempt; bounded by MAX_SNOOZES), and what a pending
    # job waits for ("sleep:<name>", "signal:<name>"), valid while ``wait_token`` equals
    # ``lease_token`` (the run that began the wait; any later claim changes the token, so a job
    # that went back to pending another way never shows a stale wait). ``signal_seq`` counts the
    # signals sent to the job: a wait that began before a signal it had not seen is due at once.
    snoozes = models.PositiveIntegerField(db_default=0, default=0, editable=False)
    wait_reason = models.CharField(  # noqa: DJ001
        max_length=210, null=True, blank=True, editable=False
    )
    wait_token = models.BigIntegerField(null=True, blank=True, editable=False)
    signal_seq = models.PositiveIntegerField(db_default=0, default=0, editable=False)
    # Publish and subscribe (docs/events.md): the event whose publish made this job, NULL for
    # every other job (a nullable column with no default: a plain INSERT writes nothing more).
    # No foreign key in the database: the prune deletes jobs and events with plain SQL.
    event = models.ForeignKey(
        "django_dbqueue.Event",
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # the partial index below: only the jobs of events
        null=True,
        blank=True,
        editable=False,
        related_name="jobs",
    )

    class Meta:
        db_table = "dbqueue_job"
        verbose_name = "background job"
        ordering = ["-id"]
        permissions = [
            ("requeue_backgroundjob", "Can requeue dead or cancelled jobs"),
            ("run_now_backgroundjob", "Can make a scheduled job due now"),
            ("cancel_backgroundjob", "Can cancel pending, waiting or running jobs"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=JobState.values), name="dbqueue_job_state_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(state=JobState.RUNNING, leased_until__isnull=False)
                    | (~Q(state=JobState.RUNNING) & Q(leased_until__isnull=True))
                ),
                name="dbqueue_job_running_iff_leased",
            ),
            models.CheckConstraint(
                condition=(
                    Q(state__in=FINISHED_STATES, finished_at__isnull=False)
                    | (~Q(state__in=FINISHED_STATES) & Q(finished_at__isnull=True))
                ),
                name="dbqueue_job_finished_iff_final",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=MIN_PRIORITY, priority__lte=MAX_PRIORITY),
                name="dbqueue_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1) & Q(attempts__lte=models.F("max_attempts")),
                name="dbqueue_job_attempts_bounded",
            ),
            models.CheckConstraint(
                condition=Q(lease_seconds__gt=0), name="dbqueue_job_lease_positive"
            ),
            # Every value a claim, a heartbeat, a completion or the sweeper computes with is one
            # it can compute with (migration 0027, issue 35). A lease of Infinity passed the
            # test above and made every claim that picked the row fail ("interval out of
            # range"): the queue stopped for every worker; a run_after of -infinity failed every
            # limited claim of its queue. So a lease is finite and at most
            # validation.MAX_SECONDS (NaN fails "<=" too; the doors take at most a day), and
            # every timestamp (NULL aside) is one Python reads back, in
            # validation.TIMESTAMP_MIN..MAX, which is what every door accepts.
            models.CheckConstraint(
                condition=Q(lease_seconds__lte=MAX_SECONDS), name="dbqueue_job_lease_bounded"
            ),
            *(time_range("dbqueue_job", column) for column in TIMESTAMP_COLUMNS),  # bounds.py
            # A pending job always has an attempt left: a claim can never push attempts past
            # max_attempts (which would break the CHECK above and stop the claim for everyone).
            models.CheckConstraint(
                condition=~Q(state=JobState.PENDING) | Q(attempts__lt=models.F("max_attempts")),
                name="dbqueue_job_pending_has_attempts_left",
            ),
            # A waiting job waits for at least one dependency; no other job counts any.
            models.CheckConstraint(
                condition=(
                    Q(state=JobState.WAITING, waiting_on__gt=0)
                    | (~Q(state=JobState.WAITING) & Q(waiting_on=0))
                ),
                name="dbqueue_job_waiting_iff_counting",
            ),
            # Only a running job waits for its cancellation to take effect; a requeue clears the
            # mark. (A pending job is cancelled at once, so it never carries one.)
            models.CheckConstraint(
                condition=(
                    Q(cancel_requested_at__isnull=True)
                    | Q(state__in=[JobState.RUNNING, JobState.CANCELLED])
                ),
                name="dbqueue_job_cancel_mark_running",
            ),
            # At most one job per idempotency key, whatever its state.
            models.UniqueConstraint(
                fields=["idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="dbqueue_job_idempotency_key_uniq",
            ),
            # A unique key comes with its mode, and a mode with its key.
            models.CheckConstraint(
                condition=(
                    Q(unique_key__isnull=True, unique_while__isnull=True)
                    | Q(unique_key__isnull=False, unique_while__in=["pending", "active"])
                ),
                name="dbqueue_job_unique_while_valid",
            ),
            # At most one live job per unique key (see unique_key above). The same predicate
            # is the ON CONFLICT target of store.jobs.INSERT_JOB_UNIQUE* and the live-holder lookup.
            models.UniqueConstraint(
                fields=["unique_key"],
                condition=UNIQUE_HELD,
                name="dbqueue_job_unique_key_live_uniq",
            ),
        ]
        indexes = [
            # The claim: per queue, in claim order, pending rows only.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="dbqueue_job_claim_idx",
                condition=Q(state=JobState.PENDING),
            ),
            # The fair claim (store/fair.py): per queue, the distinct keys of the pending jobs
            # (a skip scan), then per key its jobs in claim order. Only the jobs with a key: a
            # plain job (fair_key NULL) writes no entry in it.
            models.Index(
                "queue",
                "fair_key",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="dbqueue_job_fair_idx",
                condition=Q(state=JobState.PENDING, fair_key__isnull=False),
            ),
            # The sweeper: running rows by lease expiry.
            models.Index(
                fields=["leased_until"],
                name="dbqueue_job_lease_idx",
                condition=Q(state=JobState.RUNNING),
            ),
            # The status summary's count of dead letters per queue, from the index alone.
            models.Index(
                fields=["queue"],
                name="dbqueue_job_dead_queue_idx",
                condition=Q(state=JobState.DEAD),
            ),
            # The status and metrics count of jobs waiting for workflow dependencies.
            models.Index(
                fields=["queue"],
                name="dbqueue_job_waiting_idx",
                condition=Q(state=JobState.WAITING),
            ),
            # The claim's serial-key test: the other live jobs of a key, by id.
            models.Index(
                fields=["serial_key", "id"],
                name="dbqueue_job_serial_idx",
                condition=Q(serial_key__isnull=False, state__in=["pending", "running"]),
            ),
            # The failed attempts the rollup and the dashboard count (store.dashboard.FAILED_ATTEMPTS_SQL):
            # pending rows with an error history (retries, requeued jobs), by run_after. A new
            # job (no error) and every claimed one is outside it: enqueue and claim write no
            # entry; a failure that sends a job back to pending writes one.
            models.Index(
                fields=["run_after"],
                name="dbqueue_job_retried_idx",
                condition=Q(state=JobState.PENDING) & ~Q(errors=[]),
            ),
            # An event's jobs (the admin, the prune of events no job refers to).
            models.Index(
                fields=["event"],
                name="dbqueue_job_event_idx",
                condition=Q(event__isnull=False),
            ),
            # Retention and the dead-letter views: finished rows by age.
            models.Index(
                fields=["state", "finished_at"],
                name="dbqueue_job_finished_idx",
                condition=Q(state__in=FINISHED_STATES),
            ),
        ]

    def __str__(self):
        return f"{self.type} #{self.pk} ({self.state})"


class Dependency(models.Model):
    """An edge of a workflow: ``job`` runs after ``depends_on`` is done.

    ``run_on_failure``: when ``depends_on`` dies or is cancelled, ``job`` runs anyway instead of
    being cancelled. No foreign keys in the database (retention deletes jobs with plain SQL);
    the edges of a pruned job are deleted with it.
    """

    id = models.BigAutoField(primary_key=True)
    # (job, depends_on) is unique: that index serves the walk from a job to its dependencies.
    job = models.ForeignKey(
        BackgroundJob,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    # Indexed (a ForeignKey is): the trigger's walk from a finished job to its dependents.
    depends_on = models.ForeignKey(
        BackgroundJob, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    run_on_failure = models.BooleanField(default=False)

    class Meta:
        db_table = "dbqueue_dependency"
        verbose_name = "job dependency"
        verbose_name_plural = "job dependencies"
        constraints = [
            models.UniqueConstraint(fields=["job", "depends_on"], name="dbqueue_dependency_uniq"),
        ]

    def __str__(self):
        return f"#{self.job_id} after #{self.depends_on_id}"


class DeadLetter(BackgroundJob):
    """The dead jobs, as their own admin page (a proxy: same table, no schema)."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
