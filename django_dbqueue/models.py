"""The two tables: ``BackgroundJob`` (the queue) and ``JobDelivery`` (side-effect records).

The state machine's invariants live here as CHECK constraints, so that no code path (ours, a
migration, a person with psql) can leave a row the workers would misread. Indexes are partial:
each one covers only the rows its query can match, so the claim and the sweeper cost the same
with ten finished rows or ten million.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .states import FINISHED_STATES, MAX_PRIORITY, MIN_PRIORITY, DeliveryState, JobState

__all__ = [
    "BackgroundJob",
    "DeadLetter",
    "DeliveryState",
    "Dependency",
    "DepthSample",
    "FinishedMinute",
    "JobDelivery",
    "JobState",
    "Limiter",
    "QueueState",
    "ScheduleState",
    "WorkerRecord",
]


# When a job holds its unique key: live (pending, waiting or running) and, in the "pending"
# mode, never claimed yet. Written out again in sql.py (UNIQUE_HELD_SQL); keep them equal.
UNIQUE_HELD = Q(unique_key__isnull=False, state__in=["pending", "waiting", "running"]) & (
    Q(unique_while="active") | Q(started_at__isnull=True)
)


class IdArrayField(models.Field):
    """A PostgreSQL ``bigint[]`` of job ids, read and written as a list of ints or ``None``.

    Not ``django.contrib.postgres``'s ArrayField, which needs that app in INSTALLED_APPS (a
    system check error on Django 6.1): only the package's SQL reads and writes this column.
    """

    description = "list of job ids (bigint[])"

    def db_type(self, connection):
        return "bigint[]"


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
    # commit of the workflow's transaction; see sql.INSERT_WORKFLOW and sql.COMPLETE_JOBS).
    waiting_on = models.PositiveIntegerField(db_default=0, default=0, editable=False)
    dependents = IdArrayField(null=True, blank=True, editable=False)
    # Cancelling (docs/concepts.md): when a cancel was asked for, and by whom ("admin:<user>",
    # "api", cancel()'s ``by=``, or "handler" for a handler that cancelled its own job). A
    # running job that carries the mark stays running until its handler ends; whatever the
    # outcome then (success, failure, timeout, a swept lease, a shutdown), the write that ends
    # the run ends the job cancelled: never retried, never dead. NULL on every other job, so
    # the hot statements test one NULL per row and nothing more.
    cancel_requested_at = models.DateTimeField(null=True, blank=True, editable=False)
    cancelled_by = models.CharField(  # noqa: DJ001
        max_length=200, null=True, blank=True, editable=False
    )
    # Unique while active (docs/concepts.md): at most one live job per ``unique_key``. With
    # ``unique_while = 'active'`` the key is held while the job is pending, waiting or running;
    # with ``'pending'`` only until its first claim (``started_at`` is set then and never
    # cleared, so a retry or a release back to pending never takes the key again). The key
    # stays on the row after that, for the admin.
    unique_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001
    unique_while = models.CharField(  # noqa: DJ001
        max_length=8, null=True, blank=True, choices=[("pending", "pending"), ("active", "active")]
    )
    # Serial key (docs/concepts.md): jobs sharing it never run at the same time, and run in
    # enqueue (id) order; enforced by the claim (sql.CLAIM_JOBS).
    serial_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001

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
            # is the ON CONFLICT target of sql.INSERT_JOB_UNIQUE* and the live-holder lookup.
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
            # The failed attempts the rollup and the dashboard count (sql.FAILED_ATTEMPTS_SQL):
            # pending rows with an error history (retries, requeued jobs), by run_after. A new
            # job (no error) and every claimed one is outside it: enqueue and claim write no
            # entry; a failure that sends a job back to pending writes one.
            models.Index(
                fields=["run_after"],
                name="dbqueue_job_retried_idx",
                condition=Q(state=JobState.PENDING) & ~Q(errors=[]),
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


class JobDelivery(models.Model):
    """A record that an external side effect (payment, SMS, e-mail) was attempted under a key.

    The unique ``key`` lets the database refuse a second attempt at the same effect.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=300, unique=True)
    state = models.CharField(
        max_length=16, choices=DeliveryState.choices, default=DeliveryState.RECORDED
    )
    job = models.ForeignKey(
        BackgroundJob,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="deliveries",
        db_constraint=False,
        help_text="The job that recorded it (kept as an id after the job is pruned).",
    )
    attempt = models.PositiveIntegerField(default=0)
    provider_reference = models.CharField(max_length=300, blank=True, default="")
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "dbqueue_delivery"
        verbose_name = "job delivery"
        permissions = [("settle_jobdelivery", "Can mark unconfirmed deliveries sent or failed")]
        verbose_name_plural = "job deliveries"
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=DeliveryState.values), name="dbqueue_delivery_state_valid"
            ),
        ]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="dbqueue_delivery_unconf_idx",
                condition=Q(state=DeliveryState.RECORDED),
            ),
        ]

    def __str__(self):
        return f"{self.key} ({self.state})"


class ScheduleState(models.Model):
    """Where one ``DBQUEUE["SCHEDULE"]`` entry stands (see scheduler.py): ``last_tick`` is how far
    its ticks are done (enqueued or skipped; at first sight, the moment a worker first saw it),
    ``last_enqueued`` the tick of the last job it enqueued (``None``: never)."""

    name = models.CharField(max_length=200, primary_key=True)
    last_tick = models.DateTimeField()
    last_enqueued = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "dbqueue_schedule"
        verbose_name = "schedule state"

    def __str__(self):
        return f"{self.name} (last tick {self.last_tick})"


class CatchUp(models.TextChoices):
    NONE = "none", "none: skip missed ticks"
    LATEST = "latest", "latest: run the most recent missed tick"
    ALL = "all", "all: run every missed tick within the window"


class ScheduleEntry(models.Model):
    """A periodic job stored in the database, editable in the admin and from code
    (``schedule_entries.schedule_job``; docs/periodic.md). Its definition and its state share
    one row, so that the worker that locks the row to tick it reads the definition in force.
    Edit it through ``schedule_job``/``update_schedule`` or the admin: they settle the ticks due
    under the old definition first, and restart the ticks when the timing changes."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200, unique=True)
    job_type = models.CharField("job type", max_length=200)
    cron = models.CharField(
        max_length=200, blank=True, default="", help_text="A 5-field cron expression: 0 3 * * *"
    )
    every = models.FloatField(
        null=True, blank=True, help_text="Or an interval in seconds (aligned to the Unix epoch)."
    )
    timezone = models.CharField(
        max_length=64, blank=True, default="", help_text="The zone of cron; empty: TIME_ZONE."
    )
    payload = models.JSONField(default=dict, blank=True)
    queue = models.CharField(
        max_length=100, blank=True, default="", help_text="Empty: the job type's queue."
    )
    priority = models.SmallIntegerField(
        null=True, blank=True, help_text="-100 to 100; empty: the job type's."
    )
    enabled = models.BooleanField(default=True)
    catch_up = models.CharField(
        "catch-up", max_length=10, choices=CatchUp.choices, default=CatchUp.LATEST
    )
    catch_up_window = models.FloatField(
        "catch-up window",
        null=True,
        blank=True,
        help_text="Seconds, for catch-up all; empty: one day.",
    )
    misfire_grace = models.FloatField(
        default=60.0, help_text="Seconds: ticks this late are on time and always run."
    )
    last_tick = models.DateTimeField(db_default=Now(), editable=False)
    last_enqueued = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        db_table = "dbqueue_schedule_entry"
        verbose_name = "schedule entry"
        verbose_name_plural = "schedule entries"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(every__gte=1)) | (~Q(cron="") & Q(every__isnull=True)),
                name="dbqueue_schedule_entry_one_timing",
                violation_error_message="Give exactly one of cron and every (at least 1 second).",
            ),
            models.CheckConstraint(
                condition=Q(catch_up__in=CatchUp.values),
                name="dbqueue_schedule_entry_catch_up_valid",
                violation_error_message="catch-up must be none, latest or all.",
            ),
        ]

    def __str__(self):
        return self.name


# The dashboard's rollup (rollup.py, docs/observability.md#the-dashboard). Written once a minute
# by whichever worker gets there first; read by the admin's queue dashboard; pruned after
# rollup.KEEP. Neither table is read by the claim, the sweeper or anything on a job's path.


class DepthSample(models.Model):
    """The backlog of one queue at the start of one minute: the dashboard's depth history."""

    id = models.BigAutoField(primary_key=True)
    minute = models.DateTimeField()
    queue = models.CharField(max_length=100)
    due = models.IntegerField(default=0)
    scheduled = models.IntegerField(default=0)
    running = models.IntegerField(default=0)

    class Meta:
        db_table = "dbqueue_depth"
        verbose_name = "queue depth sample"
        constraints = [
            # One sample per queue and minute, however many workers try: the first one wins.
            models.UniqueConstraint(fields=["minute", "queue"], name="dbqueue_depth_minute_uniq"),
        ]

    def __str__(self):
        return f"{self.queue} at {self.minute}: {self.due} due"


class FinishedMinute(models.Model):
    """The jobs of one queue and type that finished in one minute, counted before retention
    deletes them; ``wait_histogram`` maps a bin of ``rollup.WAIT_BOUNDS`` to a count."""

    id = models.BigAutoField(primary_key=True)
    minute = models.DateTimeField()
    queue = models.CharField(max_length=100)
    type = models.CharField(max_length=200)
    done = models.IntegerField(default=0)
    dead = models.IntegerField(default=0)
    cancelled = models.IntegerField(default=0)
    failed_attempts = models.IntegerField(default=0, help_text="Errors of the jobs finished.")
    wait_histogram = models.JSONField(default=dict, blank=True)

    class Meta:
        db_table = "dbqueue_finished"
        verbose_name = "finished jobs per minute"
        constraints = [
            models.UniqueConstraint(
                fields=["minute", "queue", "type"], name="dbqueue_finished_minute_uniq"
            ),
        ]

    def __str__(self):
        return f"{self.queue}/{self.type} at {self.minute}"


# Flow control (docs/concepts.md#flow-control): a row per queue that operators pause and resume,
# and the limiter rows that the limited claim (dbqueue_claim_within_limits, migrations 0010 and
# 0016) locks and keeps its rate windows in. Neither is read by the claim of a worker with no limit configured,
# except for the pause probe (one index lookup per queue).


class QueueState(models.Model):
    """A queue's fleet-wide switch: a paused queue is not claimed by any worker."""

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False, db_default=False)
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.TextField(blank=True, default="", db_default="")

    class Meta:
        db_table = "dbqueue_queue"
        verbose_name = "queue"

    def __str__(self):
        return f"{self.name} ({'paused' if self.paused else 'running'})"


class TimestampArrayField(models.Field):
    """A PostgreSQL ``timestamptz[]``; only the limited claim's SQL reads and writes it."""

    description = "list of timestamps (timestamptz[])"

    def db_type(self, connection):
        return "timestamptz[]"


class Limiter(models.Model):
    """The lock and rate window of one limit: a queue's or a job type's (``scope``), and for a
    rate limit keyed by a payload field, one row per value of that field (``part``; "" for
    none). ``starts``: the start times of the last starts within the rate period."""

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=8, choices=[("queue", "queue"), ("type", "job type")])
    name = models.CharField(max_length=200)
    part = models.TextField(blank=True, default="", db_default="")
    starts = TimestampArrayField(default=list, db_default=models.Value("{}"), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "dbqueue_limiter"
        verbose_name = "flow limiter"
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "name", "part"], name="dbqueue_limiter_key_uniq"
            ),
            models.CheckConstraint(
                condition=Q(scope__in=["queue", "type"]), name="dbqueue_limiter_scope_valid"
            ),
        ]

    def __str__(self):
        return f"{self.scope} {self.name}{f' [{self.part}]' if self.part else ''}"


# The worker registry (presence.py, docs/operations.md#workers): a row per running worker
# process, written by that worker alone (one UPSERT per HEARTBEAT_INTERVAL, a DELETE at a clean
# stop) and deleted by any worker's sweeper once it has expired. Nothing on a job's path reads it.


class TextArrayField(models.Field):
    """A PostgreSQL ``text[]``, read as a list of strings; only presence.py's SQL writes it."""

    description = "list of strings (text[])"

    def db_type(self, connection):
        return "text[]"


class WorkerRecord(models.Model):
    """One running worker process, as it last said at its heartbeat.

    ``stale_at``: past it, the worker missed its heartbeats (killed, hung, cut off from the
    database) and is shown stale; ``expires_at``: past it, it is gone from every listing and
    the next sweep deletes the row. ``running``: jobs it held at that heartbeat (their ids are
    the running jobs whose ``worker_id`` is this row's)."""

    worker_id = models.CharField(max_length=200, primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    version = models.CharField(max_length=50)
    queues = TextArrayField(default=list)
    concurrency = models.IntegerField()
    execution = models.CharField(max_length=20, help_text="Handlers run in threads or processes.")
    group_pid = models.IntegerField(
        null=True, blank=True, help_text="The run_jobqueue --processes parent, if any."
    )
    state = models.CharField(
        max_length=10, choices=[("running", "running"), ("stopping", "stopping")]
    )
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    stale_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    running = models.IntegerField(default=0, help_text="Jobs held at the last heartbeat.")

    class Meta:
        db_table = "dbqueue_worker"
        verbose_name = "worker"
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["running", "stopping"]), name="dbqueue_worker_state_valid"
            ),
        ]

    def __str__(self):
        return self.worker_id
