"""Delivery records: exactly-once *effects* (payments, SMS, e-mail) on at-least-once delivery.

Before a side effect that must not happen twice, a handler records a delivery under a unique key,
in its own committed transaction. The database refuses a second record for the same key, so a
duplicate run of the job (a lease that expired under load, a worker that died before its
acknowledgement) learns that the effect was already attempted and skips it::

    from django_dbqueue.deliveries import deliver, DeliveryFailed

    @job("send-sms")
    def send_sms(ctx):
        with deliver(ctx, f"sms:{ctx.payload['message_id']}") as delivery:
            if not delivery.proceed:
                return  # sent before, or outcome unknown: see the admin
            try:
                reference = provider.send(..., idempotency_key=delivery.key)
            except provider.Rejected as exc:  # a definite failure: nothing was sent
                raise DeliveryFailed(str(exc)) from exc
            delivery.sent(reference)

States: ``recorded`` (outcome unknown) -> ``sent`` | ``failed``. A ``failed`` delivery may be
attempted again: the next ``deliver`` moves it back to ``recorded`` atomically, so two attempts
can never both proceed. A ``recorded`` delivery whose worker died before confirming is never
re-sent automatically: it stays unconfirmed until a person (the admin's "unconfirmed deliveries")
or the provider's own idempotency (``delivery.key``) settles it.
"""

import contextlib
import threading
from dataclasses import dataclass

import psycopg
from django.core.signals import request_finished
from django.db import connections

from . import sql
from .conf import get_settings
from .exceptions import DBQueueError
from .notifications import connection_params
from .states import DeliveryState

__all__ = ["Delivery", "DeliveryFailed", "begin_delivery", "deliver"]

_side = threading.local()


class DeliveryFailed(DBQueueError):
    """Raise inside ``deliver()`` when the provider definitely did NOT perform the effect.

    The delivery is marked ``failed`` (so a retry may attempt it again) and the exception
    propagates, so the job is retried on its backoff.
    """


def _run(using, statement, params):
    """Run on a connection whose commit is independent of any transaction the handler has open.

    Outside a transaction that is the thread's Django connection (autocommit). Inside one (an
    atomic handler), a side connection owned by this thread: a delivery record must be committed
    before the effect, whatever later happens to the handler's own transaction.
    """
    connection = connections[using]
    if not connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall()
    side = getattr(_side, using, None)
    if side is None or side.closed:
        side = psycopg.connect(**connection_params(using), autocommit=True)
        setattr(_side, using, side)
    try:
        return side.execute(statement, params).fetchall()
    except psycopg.OperationalError:
        side.close()
        raise


def close_side_connections(**kwargs):
    """Close this thread's side connections. The worker calls it when a handler thread ends;
    it is connected to ``request_finished`` for deliveries recorded inside a view's transaction."""
    for name, side in list(vars(_side).items()):
        side.close()
        delattr(_side, name)


request_finished.connect(close_side_connections, dispatch_uid="dbqueue-close-side-connections")


@dataclass
class Delivery:
    """The outcome of :func:`begin_delivery`.

    ``proceed``: True when this caller holds the record and must now perform the effect, then
    call :meth:`sent` or :meth:`failed`. False when the effect was already sent (``state ==
    "sent"``) or attempted with an unknown outcome (``state == "recorded"``): do not perform it.
    ``key`` is the delivery key; pass it to providers that accept an idempotency key.
    """

    key: str
    proceed: bool
    state: str
    provider_reference: str = ""
    error: str = ""
    using: str = "default"
    settled: bool = False

    def sent(self, reference=""):
        """Record that the provider performed the effect (``reference``: its id for it)."""
        return self._settle(DeliveryState.SENT, reference=str(reference or ""), error="")

    def failed(self, error=""):
        """Record that the effect definitely did not happen; a later attempt may try again."""
        return self._settle(DeliveryState.FAILED, reference="", error=str(error))

    @property
    def unconfirmed(self):
        """Attempted before with an unknown outcome: a person has to look."""
        return not self.proceed and self.state == DeliveryState.RECORDED

    def _settle(self, state, *, reference, error):
        if not self.proceed:
            raise DBQueueError(
                f"delivery {self.key!r} is not held by this caller (state {self.state!r}); "
                "only a delivery that begin_delivery() let proceed can be settled"
            )
        rows = _run(
            self.using,
            sql.SETTLE_DELIVERY,
            {"key": self.key, "state": state, "reference": reference, "error": error},
        )
        self.settled = True
        if rows:
            self.state, self.provider_reference, self.error = state, reference, error
        return bool(rows)


def _check_key(key):
    if not isinstance(key, str) or not key or len(key) > 300:
        raise ValueError(
            f"delivery key must be a non-empty string of at most 300 characters, got {key!r}"
        )


def begin_delivery(key, *, ctx=None, using=None):
    """Record that the effect named ``key`` is about to be performed; returns a :class:`Delivery`.

    Commits at once, in its own transaction (even inside an atomic handler). ``ctx`` (the job
    context) links the record to the job and attempt that made it.
    """
    _check_key(key)
    using = using or (ctx.using if ctx is not None else get_settings().DATABASE)
    params = {
        "key": key,
        "job_id": getattr(ctx, "id", None),
        "attempt": getattr(ctx, "attempt", 0),
    }
    if _run(using, sql.BEGIN_DELIVERY, params):
        return Delivery(key, True, DeliveryState.RECORDED, using=using)
    rows = _run(using, sql.SELECT_DELIVERY, {"key": key})
    if not rows:  # pragma: no cover - deleted between the two statements
        return begin_delivery(key, ctx=ctx, using=using)
    _, state, reference, error, _, _ = rows[0]
    return Delivery(key, False, state, provider_reference=reference, error=error, using=using)


@contextlib.contextmanager
def deliver(ctx, key, *, using=None):
    """``with deliver(ctx, key) as delivery:`` — :func:`begin_delivery` plus settling.

    Inside the block, do the effect only when ``delivery.proceed``. On leaving the block:
    normally, a held delivery not yet settled is marked ``sent``; by :class:`DeliveryFailed`, it
    is marked ``failed`` and the exception propagates (the job retries); by any other exception
    it stays ``recorded``, because whether the provider acted is unknown, and a retry will not
    send it again.
    """
    delivery = begin_delivery(key, ctx=ctx, using=using)
    try:
        yield delivery
    except DeliveryFailed as exc:
        if delivery.proceed and not delivery.settled:
            delivery.failed(str(exc) or type(exc).__name__)
        raise
    else:
        if delivery.proceed and not delivery.settled:
            delivery.sent()
