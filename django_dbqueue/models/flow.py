"""Flow control's tables: ``QueueState`` (pause) and ``Limiter`` (concurrency and rate)."""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .bounds import time_range
from .fields import TimestampArrayField

# Flow control (docs/concepts/flow-control.md): a row per queue that operators pause and resume,
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
        constraints = [time_range("dbqueue_queue", "changed_at")]  # bounds.py

    def __str__(self):
        return f"{self.name} ({'paused' if self.paused else 'running'})"


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
            time_range("dbqueue_limiter", "updated_at"),  # bounds.py
            # And dbqueue_limiter_starts_range, every start within the same bounds: the
            # database's alone (migration 0030), a Q cannot say "every element".
        ]

    def __str__(self):
        return f"{self.scope} {self.name}{f' [{self.part}]' if self.part else ''}"
