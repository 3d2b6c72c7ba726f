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
import logging
from dataclasses import dataclass, field

import psycopg
from django.db import ProgrammingError

from . import schema, store, validation
from .exceptions import DBQueueError, InvalidArgument
from .jobspec import database
from .outcomes import text_for_record

__all__ = ["Delivery", "DeliveryFailed", "begin_delivery", "deliver", "settle_delivery"]

logger = logging.getLogger("django_dbqueue")


class DeliveryFailed(DBQueueError):
    """Raise inside ``deliver()`` when the provider definitely did NOT perform the effect.

    The delivery is marked ``failed`` (so a retry may attempt it again) and the exception
    propagates, so the job is retried on its backoff.
    """


@dataclass
class Delivery:
    """The outcome of :func:`begin_delivery`.

    ``proceed``: True when this caller holds the record and must now perform the effect, then
    call :meth:`sent` or :meth:`failed`. False when the effect was already sent (``is_sent``) or
    attempted with an unknown outcome (``unconfirmed``): do not perform it. ``key`` is the
    delivery key; pass it to providers that accept an idempotency key. ``job_id``, ``attempt``
    and ``updated_at`` say which run holds it and since when (``updated_at`` is ``None`` for a
    record this call created), so a handler can tell an attempt still in flight from a stale one.
    """

    key: str
    proceed: bool
    state: str
    provider_reference: str = ""
    error: str = ""
    job_id: int | None = None
    attempt: int = 0
    updated_at: object = None
    using: str = "default"
    settled: bool = False
    # When this caller recorded it (the row's updated_at then, in microseconds since the
    # epoch): names this recording, so that only it is settled by this caller
    # (SETTLE_DELIVERY, store/deliveries.py).
    recorded_at: int | None = field(default=None, repr=False)

    @property
    def is_sent(self):
        return self.state == "sent"

    @property
    def unconfirmed(self):
        """Attempted before with an unknown outcome: a person (or a reconciler) has to look."""
        return not self.proceed and self.state == "recorded"

    def sent(self, reference=""):
        """Record that the provider performed the effect (``reference``: its id for it).

        Returns False, and reloads ``state``, if the record was settled by someone else meanwhile.
        """
        return self._settle("sent", reference=_reference(reference), error="")

    def failed(self, error=""):
        """Record that the effect definitely did not happen; a later attempt may try again."""
        return self._settle("failed", reference="", error=text_for_record(str(error)))

    def _settle(self, state, *, reference, error):
        if not self.proceed:
            raise DBQueueError(
                f"delivery {self.key!r} is not held by this caller (state {self.state!r}); use "
                "settle_delivery() to settle an unconfirmed delivery from outside its job"
            )
        self.settled = True
        moved = store.settle_delivery(
            self.using,
            key=self.key,
            state=state,
            reference=reference,
            error=error,
            holder=True,
            job_id=self.job_id,
            attempt=self.attempt,
            recorded_at=self.recorded_at,
        )
        # Matched nothing: the record is no longer this recording's, unless a try whose reply
        # was lost moved it (None).
        current = None if moved else store.delivery(self.using, self.key)
        if current is not None:
            self.state, self.provider_reference, self.error = current[1], current[2], current[3]
            # A try that committed but lost its reply: the retry matched nothing, yet the row
            # says what this call said, for this job and attempt.
            moved = moved is None and (
                current[1],
                current[2],
                current[3],
                current[4],
                current[5],
            ) == (state, reference, error, self.job_id, self.attempt)
            if not moved:
                logger.warning(
                    "dbqueue delivery %r: not settled %s by job=%s attempt=%s: the record is no "
                    "longer this run's (a person settled it, or another run recorded it since); "
                    "it is %s",
                    self.key,
                    state,
                    self.job_id,
                    self.attempt,
                    self.state,
                )
        if moved:
            self.state, self.provider_reference, self.error = state, reference, error
        return moved


def settle_delivery(key, state, *, reference="", error="", using=None):
    """Settle an unconfirmed (``recorded``) delivery: ``state`` is ``"sent"`` or ``"failed"``.

    For reconcilers, webhooks and people: whoever learns the outcome of an effect whose worker
    never confirmed it. Returns True if the record moved, False if it was not ``recorded``.
    """
    _check_key(key)
    if state not in ("sent", "failed"):
        raise InvalidArgument(
            f"a delivery is settled as 'sent' or 'failed', got {validation.shown(state)}"
        )
    using = database(using)
    try:
        return bool(
            store.settle_delivery(
                using,
                key=key,
                state=state,
                reference=_reference(reference),
                error=text_for_record(str(error or "")),
                holder=False,
                job_id=None,
                attempt=0,
            )
        )
    except SCHEMA_ERRORS as exc:  # on its own connection: no transaction of the caller's
        schema.raise_if_unmigrated(exc, using, aborted=False)
        raise


# What a statement on a missing table raises: through Django's connection (outside a
# transaction), or through the thread's side connection (inside one).
SCHEMA_ERRORS = (ProgrammingError, psycopg.ProgrammingError)


MAX_REFERENCE = 300  # dbqueue_delivery.provider_reference is varchar(300)


def _reference(reference):
    """The provider's reference as stored: "" or a str of at most 300 characters PostgreSQL can
    store; else ``InvalidArgument`` before anything is written (the record stays as it was)."""
    reference = str(reference or "")
    if reference:
        validation.name(
            reference, "delivery reference", max_length=MAX_REFERENCE, error=InvalidArgument
        )
    return reference


def _check_key(key):
    validation.key(key, "delivery key", error=InvalidArgument)


def begin_delivery(key, *, ctx=None, using=None):
    """Record that the effect named ``key`` is about to be performed; returns a :class:`Delivery`.

    Commits at once, in its own transaction (even inside an atomic handler). ``ctx`` (the job
    context) links the record to the job and attempt that made it.
    """
    _check_key(key)
    using = database(ctx.using if using is None and ctx is not None else using)
    job_id, attempt = getattr(ctx, "id", None), getattr(ctx, "attempt", 0)
    try:
        recorded_at = store.begin_delivery(using, key=key, job_id=job_id, attempt=attempt)
    except SCHEMA_ERRORS as exc:  # on its own connection: no transaction of the caller's
        schema.raise_if_unmigrated(exc, using, aborted=False)
        raise
    if recorded_at is not None:
        return Delivery(
            key,
            True,
            "recorded",
            job_id=job_id,
            attempt=attempt,
            using=using,
            recorded_at=recorded_at,
        )
    row = store.delivery(using, key)
    if row is None:  # pragma: no cover - deleted between the two statements
        return begin_delivery(key, ctx=ctx, using=using)
    _, state, reference, error, job_id, attempt, _, updated_at = row
    return Delivery(
        key,
        False,
        str(state),
        provider_reference=reference,
        error=error,
        job_id=job_id,
        attempt=attempt,
        updated_at=updated_at,
        using=using,
    )


@contextlib.contextmanager
def deliver(ctx, key, *, using=None, sent_on_exit=True):
    """``with deliver(ctx, key) as delivery:`` — :func:`begin_delivery` plus settling.

    Inside the block, do the effect only when ``delivery.proceed``. On leaving the block:
    normally, a held delivery not yet settled is marked ``sent`` (unless ``sent_on_exit`` is
    False: then settle it yourself); by :class:`DeliveryFailed`, it is marked ``failed`` and the
    exception propagates (the job retries); by any other exception it stays ``recorded``,
    because whether the provider acted is unknown, and a retry will not send it again. So
    prepare everything that can fail (templates, lookups) *before* the ``with``.
    """
    delivery = begin_delivery(key, ctx=ctx, using=using)
    try:
        yield delivery
    except DeliveryFailed as exc:
        if delivery.proceed and not delivery.settled:
            delivery.failed(str(exc) or type(exc).__name__)
        raise
    else:
        if sent_on_exit and delivery.proceed and not delivery.settled:
            delivery.sent()
