"""``JobStep``: the finished steps of a job's runs (``ctx.step``, steps.py)."""

from django.db import models
from django.db.models.functions import Now

from .bounds import time_range
from .jobs import BackgroundJob


class JobStep(models.Model):
    """A step of a job that finished: its JSON result, stored so that a later run of the job
    returns it instead of running the step again.

    A step is named by ``name`` and ``occurrence`` (the n-th call of that name in one run, from
    1). No foreign key in the database (retention deletes jobs with plain SQL): a job's steps are
    deleted with it.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        BackgroundJob,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # the unique constraint's index serves the job's lookups
        related_name="steps",
    )
    name = models.CharField(max_length=200)
    occurrence = models.PositiveIntegerField(default=1)
    result = models.JSONField(null=True, blank=True)
    attempt = models.PositiveIntegerField(help_text="The attempt whose run finished the step.")
    finished_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "dbqueue_step"
        verbose_name = "job step"
        verbose_name_plural = "job steps"
        ordering = ["job", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name", "occurrence"], name="dbqueue_step_uniq"),
            models.CheckConstraint(
                condition=models.Q(occurrence__gte=1), name="dbqueue_step_occurrence_valid"
            ),
            time_range("dbqueue_step", "finished_at"),  # bounds.py
        ]

    def __str__(self):
        suffix = "" if self.occurrence == 1 else f" #{self.occurrence}"
        return f"{self.name}{suffix} of job #{self.job_id}"


class JobSignal(models.Model):
    """A signal sent to a job (``signal_job``): the ``seq``-th of its ``name``, consumed by the
    job's ``seq``-th ``ctx.wait_for_signal(name)``. Kept until the job is deleted, so a wait
    that is replayed returns the same payload."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(
        BackgroundJob,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # the unique constraint's index serves the job's lookups
        related_name="signals",
    )
    name = models.CharField(max_length=200)
    seq = models.PositiveIntegerField()
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "dbqueue_signal"
        verbose_name = "job signal"
        verbose_name_plural = "job signals"
        ordering = ["job", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "name", "seq"], name="dbqueue_signal_uniq"),
            time_range("dbqueue_signal", "created_at"),  # bounds.py
        ]

    def __str__(self):
        return f"{self.name} #{self.seq} to job #{self.job_id}"
