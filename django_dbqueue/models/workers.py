"""``WorkerRecord``: the worker registry (presence.py)."""

from django.db import models
from django.db.models import Q

from .bounds import time_range
from .fields import TextArrayField

# The worker registry (presence.py, docs/operations.md#workers): a row per running worker
# process, written by that worker alone (one UPSERT per HEARTBEAT_INTERVAL, a DELETE at a clean
# stop) and deleted by any worker's sweeper once it has expired. Nothing on a job's path reads it.


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
        max_length=10,
        choices=[("running", "running"), ("stopping", "stopping"), ("restarting", "restarting")],
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
                condition=Q(state__in=["running", "stopping", "restarting"]),
                name="dbqueue_worker_state_valid",
            ),
            *(  # bounds.py
                time_range("dbqueue_worker", column)
                for column in ("started_at", "heartbeat_at", "stale_at", "expires_at")
            ),
        ]

    def __str__(self):
        return self.worker_id
