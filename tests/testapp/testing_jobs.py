"""Job types of the tests of django_dbqueue.testing (tests/integration/test_testing_*.py): what a
project's own jobs do that a test of them has to see through (the ORM in an async handler, a
delivery inside an atomic handler, a statement that fails inside a test's transaction, a job
that enqueues the next one)."""

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connection

from django_dbqueue import RetryJob, enqueue, job
from django_dbqueue.deliveries import DeliveryFailed, deliver

from .models import Effect, Invoice, ProviderCall


def _effect(ctx, worker=None):
    Effect.objects.create(job_id=ctx.id, attempt=ctx.attempt, worker=worker or ctx.worker_id, pid=0)


@job("testing-signup")
def signup(ctx):
    """Creates the invoice the payload names and enqueues its charge: a job that makes jobs."""
    invoice = Invoice.objects.create(number=ctx.payload["number"])
    enqueue("testing-charge", {"invoice": invoice.number, "fail": ctx.payload.get("fail", [])})
    return invoice.number


@job("testing-charge", max_attempts=4)
def charge(ctx):
    """Charges once through the delivery record charge:<invoice>; a 503 on the attempts the
    payload's ``fail`` lists is a definite failure (DeliveryFailed: a retry may charge); a
    ``timeout`` attempt charges and loses the answer (the record stays recorded)."""
    key = f"charge:{ctx.payload['invoice']}"
    with deliver(ctx, key) as delivery:
        if not delivery.proceed:
            return {"skipped": delivery.state}
        if ctx.attempt in ctx.payload.get("fail", []):
            raise DeliveryFailed(f"503 from the provider on attempt {ctx.attempt}")
        ProviderCall.objects.create(key=key, job_id=ctx.id, attempt=ctx.attempt)
        if ctx.attempt in ctx.payload.get("timeout", []):
            raise TimeoutError("the provider charged and its answer was lost")
        delivery.sent(f"ch_{ctx.payload['invoice']}_{ctx.attempt}")
    return {"charged": delivery.provider_reference}


@job("testing-atomic-charge", atomic=True, max_attempts=3, timeout=30)
def atomic_charge(ctx):
    """An atomic handler: its Effect row rolls back with its error; its delivery record, on a
    connection of its own in production, does not."""
    _effect(ctx)
    key = f"atomic-charge:{ctx.payload['invoice']}"
    with deliver(ctx, key) as delivery:
        if delivery.proceed:
            ProviderCall.objects.create(key=key, job_id=ctx.id, attempt=ctx.attempt)
            if ctx.attempt in ctx.payload.get("timeout", []):
                raise TimeoutError("charged, answer lost")
    if ctx.attempt in ctx.payload.get("fail_after", []):
        raise RuntimeError(f"fails after its delivery on attempt {ctx.attempt}")
    return {"delivery": delivery.state, "proceeded": delivery.proceed}


@job("testing-duplicate", max_attempts=2)
def duplicate(ctx):
    """Writes an Effect, then inserts an invoice whose number exists: an IntegrityError, which
    inside a test's transaction aborts it (a worker's autocommit statement fails alone)."""
    _effect(ctx)
    Invoice.objects.create(number=ctx.payload["number"])


@job("testing-catches-integrity")
def catches_integrity(ctx):
    """Catches the IntegrityError of a savepoint it opened itself, and goes on."""
    try:
        from django.db import transaction

        with transaction.atomic():
            Invoice.objects.create(number=ctx.payload["number"])
    except IntegrityError:
        pass
    _effect(ctx)
    return "went on"


@job("testing-async-orm")
async def async_orm(ctx):
    """The ORM from an async handler (through sync_to_async, as Django wants it)."""
    invoices = await sync_to_async(Invoice.objects.filter(number=ctx.payload["number"]).count)()
    await sync_to_async(_effect)(ctx, "async")
    return {"invoices": invoices}


@job("testing-retry-in", max_attempts=3)
def retry_in(ctx):
    """Asks to run again in ``seconds`` on its first attempt."""
    if ctx.attempt == 1:
        raise RetryJob(delay=ctx.payload["seconds"], reason="provider said later")
    return ctx.attempt


@job("testing-kills-its-connection")
def kills_its_connection(ctx):
    """Ends its own database session: whatever runs it loses the connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
