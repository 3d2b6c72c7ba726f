"""A FAKE payment provider that behaves like a real one where it matters: idempotency keys.

Like Stripe's ``Idempotency-Key`` header, ``charge(..., idempotency_key=k)`` charges once per key:
a second request with the same key returns the charge made by the first instead of charging again.
``lookup(k)`` answers "did you charge under this key?", which is what a reconciliation needs.

Charges are stored in ``shop_providercharge`` (``ProviderCharge``) through the
``payment_provider`` database alias: a connection of its own, in autocommit, so a charge stays
made whatever happens to the caller's transaction, as with a remote provider.

The behaviour is chosen by ``settings.SHOP_FAKE_PROVIDER_MODE`` (from the environment variable of
the same name):

- ``ok`` (default): charge, answer.
- ``timeout-once``: the FIRST request under a key charges, then raises :class:`ProviderTimeout`, as
  if the answer was lost on the network: the provider charged, the caller never heard. A repeated
  request under the same key gets the charge back normally.
- ``decline``: refuse every new charge with :class:`CardDeclined`; nothing is charged.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import F

from .models import ProviderCharge

PROVIDER_DB = "payment_provider"
MODES = ("ok", "timeout-once", "decline")


class ProviderError(Exception):
    """Anything the provider raises."""


class CardDeclined(ProviderError):
    """A definite refusal: nothing was charged. Trying again may be answered differently."""


class ProviderTimeout(ProviderError, TimeoutError):
    """No answer: the charge may or may not have been made. Do not charge again blindly."""


class IdempotencyKeyReused(ProviderError):
    """The key was used before for a different charge (Stripe refuses this too)."""


@dataclass(frozen=True)
class Charge:
    id: str
    amount: Decimal
    customer: str
    idempotency_key: str
    created_at: datetime
    replayed: bool = False  # True when an earlier request under the same key made it

    @classmethod
    def from_row(cls, row: ProviderCharge, *, replayed: bool = False) -> "Charge":
        return cls(
            row.charge_id, row.amount, row.customer, row.idempotency_key, row.created_at, replayed
        )


def mode() -> str:
    value = getattr(settings, "SHOP_FAKE_PROVIDER_MODE", "ok") or "ok"
    if value not in MODES:
        raise ImproperlyConfigured(
            f"SHOP_FAKE_PROVIDER_MODE must be one of {', '.join(MODES)}; got {value!r}"
        )
    return value


def charge(amount: Decimal, customer: str, idempotency_key: str) -> Charge:
    """Charge ``amount`` to ``customer``, at most once per ``idempotency_key``."""
    if not idempotency_key:
        raise ValueError("the fake provider, like the real ones it stands for, wants a key")
    amount = Decimal(amount)
    current = mode()
    charges = ProviderCharge.objects.using(PROVIDER_DB)
    try:
        with transaction.atomic(using=PROVIDER_DB):
            row = charges.select_for_update().filter(idempotency_key=idempotency_key).first()
            if row is None:
                if current == "decline":
                    raise CardDeclined(f"card of {customer} declined (fake provider, mode=decline)")
                row = charges.create(
                    charge_id=f"ch_{secrets.token_hex(8)}",
                    idempotency_key=idempotency_key,
                    amount=amount,
                    customer=customer,
                )
                created = True
            else:
                if row.amount != amount or row.customer != customer:
                    raise IdempotencyKeyReused(
                        f"idempotency key {idempotency_key!r} was used for {row.amount} to "
                        f"{row.customer}, not {amount} to {customer}"
                    )
                charges.filter(pk=row.pk).update(requests=F("requests") + 1)
                created = False
    except IntegrityError:  # a concurrent request under the same key created it first
        return charge(amount, customer, idempotency_key)
    if created and current == "timeout-once":
        # Committed above: the money moved. Only the answer is lost.
        raise ProviderTimeout(
            f"no answer from the payment provider for {idempotency_key!r} "
            "(fake provider, mode=timeout-once: it charged, then the answer was lost)"
        )
    return Charge.from_row(row, replayed=not created)


def lookup(idempotency_key: str) -> Charge | None:
    """The charge made under ``idempotency_key``, or None if none was. Never charges."""
    row = ProviderCharge.objects.using(PROVIDER_DB).filter(idempotency_key=idempotency_key).first()
    return None if row is None else Charge.from_row(row, replayed=True)
