from django.db import models
from django.db.models.functions import Now


class Customer(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(unique=True)

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class Invoice(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="invoices")
    number = models.CharField(max_length=64, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set once by the send-invoice-email job; NULL until the e-mail has gone out.
    emailed_at = models.DateTimeField(null=True, blank=True)
    # Set once from a CONFIRMED charge (its delivery record is "sent"): by the charge-invoice job,
    # or by shop_reconcile_charges for a charge whose outcome was unknown. NULL until then.
    paid_at = models.DateTimeField(null=True, blank=True)
    charge_id = models.CharField(max_length=64, blank=True, default="")

    def __str__(self) -> str:
        return f"Invoice {self.number}"

    @classmethod
    def mark_paid(cls, invoice_id: int, charge_id: str) -> bool:
        """Record a CONFIRMED charge: set-not-increment, database time, only the first one counts.

        Call it only when the charge's delivery record is "sent". Returns True when this call set it.
        """
        return bool(
            cls.objects.filter(pk=invoice_id, paid_at__isnull=True).update(
                paid_at=Now(), charge_id=charge_id
            )
        )


class ProviderCharge(models.Model):
    """A charge as the FAKE payment provider of shop/payments.py stores it.

    This table stands for the provider's own database, not the shop's: shop/payments.py writes it
    on a connection of its own (the "payment_provider" database alias), so a charge stays made
    even when the shop's transaction around the call rolls back, as with a real remote provider.
    """

    charge_id = models.CharField(max_length=64, unique=True)
    # Like Stripe's Idempotency-Key header: a second request with the same key gets this charge
    # back instead of charging again.
    idempotency_key = models.CharField(max_length=300, unique=True)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    customer = models.CharField(max_length=254)
    # How many charge requests carried this key (1 = the charge was requested exactly once).
    requests = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.charge_id} {self.amount} ({self.idempotency_key})"
