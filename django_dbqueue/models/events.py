"""``Event``: one ``publish()`` (docs/events.md), the row its subscribers' jobs point back to."""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .bounds import time_range


class Event(models.Model):
    """A published event: its name, its JSON payload and the subscribers it made a job for.

    Written by ``publish()`` in the caller's transaction, with one job per subscriber in the
    same statement (store/events.py). ``idempotency_key`` is unique per event name: a publish
    that repeats one creates nothing. ``subscribers`` lists the job types that got a job, at
    publish time and by each replay since. Deleted by the sweeper's prune once no job refers to
    it and it is older than ``DONE_RETENTION``.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200, help_text="The event's name, e.g. invoice.paid.")
    payload = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=300, null=True, blank=True)  # noqa: DJ001
    subscribers = models.JSONField(
        default=list, blank=True, help_text="The job types that got a job for this event."
    )
    published_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "dbqueue_event"
        verbose_name = "event"
        ordering = ["-id"]
        constraints = [
            # At most one event per (name, idempotency key): the ON CONFLICT target of
            # store.events.PUBLISH_EVENT.
            models.UniqueConstraint(
                fields=["name", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="dbqueue_event_key_uniq",
            ),
            time_range("dbqueue_event", "published_at"),  # bounds.py
        ]
        indexes = [
            # The prune: the oldest events first.
            models.Index(fields=["published_at"], name="dbqueue_event_published_idx"),
        ]

    def __str__(self):
        return f"{self.name} #{self.pk}"
