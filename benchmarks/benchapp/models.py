from django.db import models
from django.db.models.functions import Now


class Invoice(models.Model):
    """The domain row that the enqueue benchmark writes in the same transaction as the job."""

    number = models.CharField(max_length=32)
    customer = models.CharField(max_length=100)
    amount_cents = models.IntegerField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "bench_invoice"

    def __str__(self):
        return self.number


class CommitProbe(models.Model):
    """One row, updated to time a commit that must flush WAL (the price of durability)."""

    n = models.BigIntegerField(default=0)

    class Meta:
        db_table = "bench_commit_probe"

    def __str__(self):
        return str(self.n)
