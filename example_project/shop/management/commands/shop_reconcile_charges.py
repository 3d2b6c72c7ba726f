"""Settle card charges whose outcome is unknown, by asking the payment provider.

A ``charge-invoice`` job that timed out waiting for the provider leaves its delivery record
``charge:<invoice id>`` in ``recorded``: the provider may or may not have charged. The job's retry
does not charge again; it leaves the record for this command (or a person in the admin).

Because the record's key was the provider's idempotency key, the provider can be asked about
exactly that request (``payments.lookup(key)``):

- it has a charge under the key: the delivery becomes ``sent`` with the charge id, and the invoice
  is marked paid;
- it has none: the delivery becomes ``failed`` and a new ``charge-invoice`` job is enqueued (in the
  same transaction). Its charge is made under the same idempotency key, so even a request of the
  old attempt that reaches the provider late cannot charge a second time.

Only records unconfirmed for at least ``--min-age`` seconds are judged, so that a charge whose
worker is still waiting for the provider is left to finish.

It also marks paid every unpaid invoice whose charge IS confirmed (``sent``). That happens when an
attempt outlived the job's timeout: its worker gave it up and rolled back its ``paid_at``, but the
provider answered and the delivery record (committed on its own connection) became ``sent``,
while the retry, which had found it still ``recorded``, had already finished.

    python example_project/manage.py shop_reconcile_charges [--min-age 300] [--invoice ID] [--dry-run]
"""

from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from django.db.models.functions import Now

from django_dbqueue import enqueue
from django_dbqueue.models import DeliveryState, JobDelivery
from shop import payments
from shop.models import Invoice
from shop.status import CHARGE_JOB_TYPE, charge_delivery_key

PREFIX = "charge:"


class Command(BaseCommand):
    help = (
        "Settle unconfirmed card charges (delivery records 'charge:<invoice id>' left "
        "'recorded') by asking the payment provider under the same idempotency key: a charge "
        "found -> sent and the invoice paid; none -> failed and a new charge job."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--min-age",
            type=float,
            default=300.0,
            help="only records unconfirmed for at least this many seconds (default 300)",
        )
        parser.add_argument(
            "--invoice",
            type=int,
            action="append",
            metavar="ID",
            help="only this invoice's charge (repeatable; default: every unconfirmed charge)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="ask the provider, change nothing"
        )

    def handle(self, *args, **options) -> None:
        min_age: float = options["min_age"]
        dry_run: bool = options["dry_run"]
        if min_age < 0:
            raise CommandError("--min-age must be >= 0")
        unconfirmed = JobDelivery.objects.filter(
            key__startswith=PREFIX,
            state=DeliveryState.RECORDED,
            updated_at__lte=Now() - timedelta(seconds=min_age),
        )
        if options["invoice"]:
            unconfirmed = unconfirmed.filter(
                key__in=[charge_delivery_key(pk) for pk in options["invoice"]]
            )
        pending = list(unconfirmed.order_by("id"))
        counts = {"sent": 0, "failed": 0, "skipped": 0}
        for delivery in pending:
            counts[self.reconcile(delivery, dry_run=dry_run)] += 1
        self.stdout.write(
            f"{'would reconcile' if dry_run else 'reconciled'} {len(pending)} unconfirmed "
            f"charge(s): {counts['sent']} sent, {counts['failed']} failed, "
            f"{counts['skipped']} left alone"
        )
        repaired = self.mark_confirmed_paid(options["invoice"], dry_run=dry_run)
        if repaired:
            self.stdout.write(
                f"{'would mark' if dry_run else 'marked'} {repaired} invoice(s) paid whose "
                "charge was confirmed but not recorded on the invoice"
            )

    def mark_confirmed_paid(self, invoice_ids: list[int] | None, *, dry_run: bool) -> int:
        """Mark paid the unpaid invoices whose charge delivery is ``sent``."""
        unpaid = Invoice.objects.filter(paid_at__isnull=True)
        if invoice_ids:
            unpaid = unpaid.filter(pk__in=invoice_ids)
        ids = list(unpaid.values_list("pk", flat=True))
        marked = 0
        for start in range(0, len(ids), 1000):
            keys = {charge_delivery_key(pk): pk for pk in ids[start : start + 1000]}
            confirmed = JobDelivery.objects.filter(key__in=keys, state=DeliveryState.SENT)
            for key, reference in confirmed.values_list("key", "provider_reference"):
                if dry_run or Invoice.mark_paid(keys[key], reference):
                    self.stdout.write(f"   {key}: confirmed as {reference} -> invoice paid")
                    marked += 1
        return marked

    def reconcile(self, delivery: JobDelivery, *, dry_run: bool) -> str:
        where = f"   {delivery.key} (job {delivery.job_id}, attempt {delivery.attempt})"
        try:
            invoice_id = int(delivery.key.removeprefix(PREFIX))
        except ValueError:
            self.stderr.write(f"{where}: not an invoice charge key; left alone")
            return "skipped"
        invoice = Invoice.objects.filter(pk=invoice_id).first()
        charge = payments.lookup(delivery.key)
        if charge is not None:
            verdict = (
                f"the provider has charge {charge.id} ({charge.amount} EUR to {charge.customer}) "
                "-> sent, invoice paid"
            )
        elif invoice is not None:
            verdict = "the provider has no charge under this key -> failed, charge enqueued again"
        else:
            verdict = "the provider has no charge under this key -> failed (invoice deleted)"
        if dry_run:
            self.stdout.write(f"{where}: {verdict} (dry run)")
            return "sent" if charge is not None else "failed"

        with transaction.atomic():
            # Only a record still unconfirmed moves: a worker, the admin or another run of this
            # command may have settled it meanwhile.
            unconfirmed = JobDelivery.objects.filter(pk=delivery.pk, state=DeliveryState.RECORDED)
            if charge is not None:
                moved = unconfirmed.update(
                    state=DeliveryState.SENT,
                    provider_reference=charge.id,
                    error="",
                    updated_at=Now(),
                )
                if moved:
                    Invoice.mark_paid(invoice_id, charge.id)
            else:
                moved = unconfirmed.update(
                    state=DeliveryState.FAILED,
                    error="shop_reconcile_charges: the provider has no charge under this key",
                    updated_at=Now(),
                )
                if moved and invoice is not None:
                    # No idempotency key: the job with this invoice's key is finished, and the
                    # guarded UPDATE above already lets only one reconciliation get here.
                    enqueue(CHARGE_JOB_TYPE, {"invoice_id": invoice_id})
        if not moved:
            self.stdout.write(f"{where}: settled by someone else meanwhile; left alone")
            return "skipped"
        self.stdout.write(f"{where}: {verdict}")
        return "sent" if charge is not None else "failed"
