"""States and limits, importable before Django is set up."""

from django.db import models


class JobState(models.TextChoices):
    WAITING = "waiting", "waiting (on dependencies)"
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    DONE = "done", "done"
    DEAD = "dead", "dead"
    CANCELLED = "cancelled", "cancelled"


FINISHED_STATES = (JobState.DONE, JobState.DEAD, JobState.CANCELLED)

MIN_PRIORITY = -100
MAX_PRIORITY = 100


class DeliveryState(models.TextChoices):
    RECORDED = "recorded", "recorded (outcome unknown)"
    SENT = "sent", "sent"
    FAILED = "failed", "failed"
