"""The periodic jobs: ``ScheduleState`` (settings entries) and ``ScheduleEntry`` (stored ones)."""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .bounds import time_range


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
        constraints = [  # bounds.py
            time_range("dbqueue_schedule", column)
            for column in ("last_tick", "last_enqueued", "updated_at")
        ]

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
            *(  # bounds.py
                time_range("dbqueue_schedule_entry", column)
                for column in ("last_tick", "last_enqueued", "created_at", "updated_at")
            ),
        ]

    def __str__(self):
        return self.name
