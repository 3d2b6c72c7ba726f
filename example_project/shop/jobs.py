"""Background jobs of the shop, discovered by django_dbqueue like admin.py is by the admin.

Delivery is at least once: a job can run again after its effect happened (a worker that died
before its acknowledgement, a lease that expired under load). Database writes are made safe to
repeat (set-not-increment updates); effects outside the database, an e-mail or a card charge, go
through a delivery record (``django_dbqueue.deliveries.deliver``), which lets exactly one run
perform them and tells every later run what happened.
"""

import contextlib
import logging
import smtplib

from django.core.mail import EmailMessage, get_connection
from django.core.mail.message import make_msgid
from django.core.mail.utils import DNS_NAME
from django.db.models.functions import Now

from django_dbqueue import Backoff, DiscardJob, JobContext, job
from django_dbqueue.deliveries import Delivery, DeliveryFailed, deliver
from django_dbqueue.models import DeliveryState

from . import payments
from .models import Invoice
from .status import CHARGE_JOB_TYPE, JOB_TYPE, charge_delivery_key, email_delivery_key

logger = logging.getLogger(__name__)


def _invoice(ctx: JobContext) -> Invoice:
    invoice_id = ctx.payload["invoice_id"]
    invoice = Invoice.objects.select_related("customer").filter(pk=invoice_id).first()
    if invoice is None:
        # Retrying will not bring the invoice back: go straight to the dead letters.
        raise DiscardJob(f"invoice {invoice_id} does not exist")
    return invoice


def _log_unconfirmed(what: str, delivery: Delivery, ctx: JobContext, remedy: str) -> None:
    logger.warning(
        "%s: attempted before with an UNKNOWN outcome (delivery %r is still recorded, not sent); "
        "not doing it again (job %s, attempt %s). A person must confirm it: %s",
        what,
        delivery.key,
        ctx.id,
        ctx.attempt,
        remedy,
    )


@job(JOB_TYPE, queue="emails", max_attempts=8)
def send_invoice_email(ctx: JobContext) -> None:
    """E-mail an invoice to its customer, once.

    The send goes through the delivery record ``invoice-email:<id>``: only the run that records it
    sends, and a run after a crash between sending and confirming does not send again (the
    delivery stays unconfirmed for a person to look at). ``emailed_at`` is then set with a
    set-not-increment UPDATE guarded by ``emailed_at IS NULL``, so repeating it changes nothing.
    """
    invoice = _invoice(ctx)
    if invoice.emailed_at is not None:
        logger.info(
            "invoice %s was already e-mailed at %s; skipping", invoice.number, invoice.emailed_at
        )
        return

    # Everything that can fail before the send is done before the delivery is recorded: an error
    # inside the block (other than DeliveryFailed) leaves the outcome unknown, for a person.
    message = _invoice_email(invoice)
    with deliver(ctx, email_delivery_key(invoice.pk)) as delivery:
        if delivery.proceed:
            _send(message)
            delivery.sent(message.extra_headers["Message-ID"])

    if delivery.state == DeliveryState.SENT:
        # Database time, and only the first run sets it (also after a crash before this line).
        Invoice.objects.filter(pk=invoice.pk, emailed_at__isnull=True).update(emailed_at=Now())
        logger.info(
            "%s invoice %s to %s (message %s; job %s, attempt %s/%s)",
            "e-mailed" if delivery.proceed else "an earlier run e-mailed",
            invoice.number,
            invoice.customer.email,
            delivery.provider_reference or "-",
            ctx.id,
            ctx.attempt,
            ctx.max_attempts,
        )
    elif delivery.unconfirmed:
        _log_unconfirmed(
            f"e-mail of invoice {invoice.number}",
            delivery,
            ctx,
            "check the mail server's log, then mark the delivery sent or failed in the admin",
        )


def _invoice_email(invoice: Invoice) -> EmailMessage:
    """The invoice e-mail, with its own Message-ID (which the delivery record keeps)."""
    return EmailMessage(
        subject=f"Invoice {invoice.number}",
        body=(
            f"Dear {invoice.customer.name},\n\n"
            f"please find invoice {invoice.number} over {invoice.amount} EUR.\n\n"
            "Thank you for shopping with us.\n"
        ),
        to=[invoice.customer.email],  # from DEFAULT_FROM_EMAIL
        headers={"Message-ID": make_msgid(domain=DNS_NAME)},
    )


def _send(message: EmailMessage) -> None:
    """Send; raise DeliveryFailed when the e-mail definitely did not go.

    Not reaching the mail server, or the server refusing the sender or the recipient, means
    nothing was sent: a retry may send. Any other error leaves the outcome unknown.
    """
    connection = get_connection(fail_silently=False)
    try:
        connection.open()
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryFailed(f"could not reach the mail server: {exc!r}") from exc
    try:
        connection.send_messages([message])
    except (smtplib.SMTPRecipientsRefused, smtplib.SMTPSenderRefused) as exc:
        raise DeliveryFailed(f"the mail server refused the e-mail: {exc!r}") from exc
    finally:
        # Closing can fail (QUIT unanswered) after the server accepted the message: it was sent.
        with contextlib.suppress(OSError, smtplib.SMTPException):
            connection.close()


@job(
    CHARGE_JOB_TYPE,
    queue="payments",
    max_attempts=5,
    # Invoice.paid_at and the job's completion commit in one transaction. The delivery record and
    # the provider's charge are committed on connections of their own, whatever this one does.
    atomic=True,
    timeout=30,
    # Demo speed, so that shop_demo sees the retry of a timed-out charge within a second. A real
    # shop would keep the default (or wait minutes): a provider in trouble needs time.
    backoff=Backoff(base=0.1, cap=0.2),
)
def charge_invoice(ctx: JobContext) -> None:
    """Charge an invoice's amount to its customer's card, exactly once.

    The charge goes through the delivery record ``charge:<id>``, whose key is also the provider's
    idempotency key. A definite decline marks it failed (the job retries, and may charge then); a
    timeout leaves it recorded, outcome unknown: the retry does NOT charge again and leaves it to
    ``manage.py shop_reconcile_charges`` (which asks the provider under the same key) or a person.
    ``paid_at`` is set only from a confirmed ("sent") charge.
    """
    invoice = _invoice(ctx)
    if invoice.paid_at is not None:
        logger.info("invoice %s was already paid at %s; skipping", invoice.number, invoice.paid_at)
        return

    with deliver(ctx, charge_delivery_key(invoice.pk)) as delivery:
        if delivery.proceed:
            try:
                charge = payments.charge(
                    amount=invoice.amount,
                    customer=invoice.customer.email,
                    idempotency_key=delivery.key,
                )
            except payments.CardDeclined as exc:
                raise DeliveryFailed(str(exc)) from exc  # nothing charged: a retry may charge
            # payments.ProviderTimeout propagates: the record stays "recorded" (unknown outcome)
            # and the job is retried; that retry finds the record and does not charge again.
            if not delivery.sent(charge.id):
                logger.error(
                    "invoice %s: charged %s, but delivery %r was settled by someone else in the "
                    "meantime; check it in the admin",
                    invoice.number,
                    charge.id,
                    delivery.key,
                )

    if delivery.state == DeliveryState.SENT:
        Invoice.mark_paid(invoice.pk, delivery.provider_reference)
        logger.info(
            "%s invoice %s: %s EUR to %s (charge %s; job %s, attempt %s/%s)",
            "charged" if delivery.proceed else "an earlier run charged",
            invoice.number,
            invoice.amount,
            invoice.customer.email,
            delivery.provider_reference,
            ctx.id,
            ctx.attempt,
            ctx.max_attempts,
        )
    elif delivery.unconfirmed:
        _log_unconfirmed(
            f"charge of invoice {invoice.number}",
            delivery,
            ctx,
            "run `manage.py shop_reconcile_charges`, which asks the provider under the same "
            "idempotency key, or settle the delivery in the admin",
        )
