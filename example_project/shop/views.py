import json
import secrets

from django.db import IntegrityError, transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from django_dbqueue import enqueue

from .forms import InvoiceForm
from .models import Customer, Invoice
from .status import (
    CHARGE_JOB_TYPE,
    JOB_TYPE,
    charge_delivery_key,
    email_delivery_key,
    invoice_jobs,
)


class SimulatedFailure(Exception):
    """Raised by POST /invoices/?fail=1 after the job was enqueued, to show the rollback."""


@csrf_exempt  # a JSON endpoint for the demo; a real shop would authenticate it
@require_http_methods(["GET", "POST"])
def invoices(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        return list_invoices(request)
    return create_invoice(request)


def create_invoice(request: HttpRequest) -> JsonResponse:
    """Create an invoice and enqueue its e-mail and its card charge in ONE transaction.

    Accepts a form post or a JSON object with `email`, `amount` and optionally `name`, `number`.
    With `?fail=1` the view raises after enqueueing: the rollback removes the invoice and the jobs.
    """
    if request.content_type == "application/json":
        try:
            data = json.loads(request.body)
        except ValueError:
            return JsonResponse({"error": "the body is not valid JSON"}, status=400)
        if not isinstance(data, dict):
            return JsonResponse({"error": "the body must be a JSON object"}, status=400)
    else:
        data = request.POST
    form = InvoiceForm(data)
    if not form.is_valid():
        return JsonResponse({"errors": form.errors.get_json_data()}, status=400)

    email = form.cleaned_data["email"]
    name = form.cleaned_data["name"] or email.split("@")[0]
    number = form.cleaned_data["number"] or (
        f"INV-{timezone.now():%Y%m%d}-{secrets.token_hex(4).upper()}"
    )
    fail = request.GET.get("fail") == "1"

    attempted: dict[str, object] = {}
    try:
        with transaction.atomic():
            customer, _ = Customer.objects.get_or_create(email=email, defaults={"name": name})
            invoice = Invoice.objects.create(
                customer=customer, number=number, amount=form.cleaned_data["amount"]
            )
            queued = enqueue(
                JOB_TYPE,
                {"invoice_id": invoice.pk},
                idempotency_key=email_delivery_key(invoice.pk),
            )
            charge = enqueue(
                CHARGE_JOB_TYPE,
                {"invoice_id": invoice.pk},
                idempotency_key=charge_delivery_key(invoice.pk),
            )
            attempted = {
                "invoice_id": invoice.pk,
                "number": number,
                "job_id": queued.id,
                "charge_job_id": charge.id,
            }
            if fail:
                raise SimulatedFailure("simulated failure after enqueue (?fail=1)")
    except SimulatedFailure as exc:
        return JsonResponse(
            {"rolled_back": True, "error": str(exc), **attempted},
            status=500,
        )
    except IntegrityError:
        return JsonResponse({"error": f"invoice number {number!r} already exists"}, status=409)

    return JsonResponse(
        {
            "invoice_id": invoice.pk,
            "number": invoice.number,
            "customer_id": customer.pk,
            "amount": str(invoice.amount),
            "job_id": queued.id,
            "job_created": queued.created,
            "charge_job_id": charge.id,
            "charge_job_created": charge.created,
        },
        status=201,
    )


def list_invoices(request: HttpRequest) -> JsonResponse:
    """The latest invoices (`?limit=`, default 20) with the state of their e-mail and charge jobs."""
    try:
        limit = max(1, min(int(request.GET.get("limit", "20")), 200))
    except ValueError:
        return JsonResponse({"error": "limit must be an integer"}, status=400)
    rows = list(Invoice.objects.select_related("customer").order_by("-id")[:limit])
    jobs = invoice_jobs(invoice.pk for invoice in rows)
    charge_jobs = invoice_jobs((invoice.pk for invoice in rows), CHARGE_JOB_TYPE)
    return JsonResponse(
        {
            "invoices": [
                {
                    "invoice_id": invoice.pk,
                    "number": invoice.number,
                    "customer": invoice.customer.email,
                    "amount": str(invoice.amount),
                    "created_at": invoice.created_at.isoformat(),
                    "emailed_at": invoice.emailed_at and invoice.emailed_at.isoformat(),
                    "paid_at": invoice.paid_at and invoice.paid_at.isoformat(),
                    "charge_id": invoice.charge_id,
                    "job": _job_json(jobs.get(invoice.pk)),
                    "charge_job": _job_json(charge_jobs.get(invoice.pk)),
                }
                for invoice in rows
            ]
        }
    )


def _job_json(job) -> dict[str, object] | None:
    if job is None:
        return None
    return {
        "id": job.id,
        "queue": job.queue,
        "state": job.state,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
    }
