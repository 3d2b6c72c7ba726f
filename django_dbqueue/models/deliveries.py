"""``JobDelivery``: the records of external side effects (deliveries.py)."""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from ..states import DeliveryState
from .bounds import time_range
from .jobs import BackgroundJob


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
            *(time_range("dbqueue_delivery", c) for c in ("created_at", "updated_at")),  # bounds.py
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
