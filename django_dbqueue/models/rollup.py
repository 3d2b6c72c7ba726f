"""The dashboard's per-minute tables: ``DepthSample`` and ``FinishedMinute``."""

from django.db import models

from .bounds import time_range

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
            time_range("dbqueue_depth", "minute"),  # bounds.py
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
            time_range("dbqueue_finished", "minute"),  # bounds.py
        ]

    def __str__(self):
        return f"{self.queue}/{self.type} at {self.minute}"
