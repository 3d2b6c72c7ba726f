"""Which queue job belongs to which invoice (used by the invoice list and by shop_demo)."""

from collections.abc import Iterable

from django_dbqueue.models import BackgroundJob

JOB_TYPE = "send-invoice-email"
CHARGE_JOB_TYPE = "charge-invoice"


def email_delivery_key(invoice_id: int) -> str:
    """The key of an invoice's e-mail: its job's idempotency key and its delivery record's key."""
    return f"invoice-email:{invoice_id}"


def charge_delivery_key(invoice_id: int) -> str:
    """The key of an invoice's charge: its job's idempotency key, its delivery record's key, and
    the idempotency key the payment provider gets."""
    return f"charge:{invoice_id}"


def invoice_jobs(invoice_ids: Iterable[int], job_type: str = JOB_TYPE) -> dict[int, BackgroundJob]:
    """Map each invoice id to its latest job of ``job_type`` (invoices without one are left out)."""
    ids = list(invoice_ids)
    if not ids:
        return {}
    jobs = BackgroundJob.objects.filter(type=job_type, payload__invoice_id__in=ids).order_by("id")
    return {job.payload["invoice_id"]: job for job in jobs}
