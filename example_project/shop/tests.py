"""The shop's own tests, written with django_dbqueue.testing (docs/testing.md).

They run in Django's TestCase: the invoice, its jobs and what the jobs do stay in the test's
transaction and are rolled back after each test. Only the fake payment provider commits (it
writes on a connection of its own, the ``payment_provider`` alias, as a remote provider would);
each test deletes the charges it made.

    python example_project/manage.py test shop
"""

import datetime
import io
import json

from django.core import mail
from django.core.management import call_command
from django.test import TestCase, override_settings

from django_dbqueue.models import JobDelivery
from django_dbqueue.testing import assert_enqueued, perform_job, refute_enqueued, run_jobs

from . import payments
from .models import Invoice, ProviderCharge
from .status import CHARGE_JOB_TYPE, JOB_TYPE

LATER = datetime.timedelta(minutes=5)  # past the charge's backoff (0.1 s) and the e-mail's


class ShopTestCase(TestCase):
    databases = {"default", payments.PROVIDER_DB}

    def create_invoice(self, *, fail=False, **fields):
        data = {"email": "ana@example.com", "amount": "19.90", **fields}
        response = self.client.post(
            "/invoices/" + ("?fail=1" if fail else ""),
            json.dumps(data),
            content_type="application/json",
        )
        self.addCleanup(self.forget_charges)
        return response

    def forget_charges(self):
        ProviderCharge.objects.using(payments.PROVIDER_DB).filter(
            customer="ana@example.com"
        ).delete()


class CreatingAnInvoice(ShopTestCase):
    def test_enqueues_its_email_and_its_charge(self):
        invoice_id = self.create_invoice().json()["invoice_id"]
        assert_enqueued(JOB_TYPE, {"invoice_id": invoice_id}, queue="emails", count=1)
        assert_enqueued(CHARGE_JOB_TYPE, {"invoice_id": invoice_id}, queue="payments", count=1)

    def test_a_rolled_back_invoice_leaves_no_job(self):
        response = self.create_invoice(fail=True)
        self.assertEqual(response.status_code, 500)
        self.assertFalse(Invoice.objects.exists())
        refute_enqueued(JOB_TYPE)
        refute_enqueued(CHARGE_JOB_TYPE)


class RunningItsJobs(ShopTestCase):
    def test_emails_once_and_charges_once(self):
        invoice_id = self.create_invoice().json()["invoice_id"]
        ran = run_jobs()
        self.assertEqual(ran.counts, {"done": 2})
        invoice = Invoice.objects.get(pk=invoice_id)
        self.assertIsNotNone(invoice.emailed_at)
        self.assertIsNotNone(invoice.paid_at)
        self.assertEqual(len(mail.outbox), 1)
        self.assertEqual(mail.outbox[0].to, ["ana@example.com"])
        charge = ProviderCharge.objects.using(payments.PROVIDER_DB).get()
        self.assertEqual((charge.charge_id, charge.requests), (invoice.charge_id, 1))
        # A second run of either job (at-least-once delivery) does nothing again.
        self.assertIsNone(perform_job(JOB_TYPE, {"invoice_id": invoice_id}, attempt=2))
        self.assertIsNone(perform_job(CHARGE_JOB_TYPE, {"invoice_id": invoice_id}, attempt=2))
        self.assertEqual(len(mail.outbox), 1)
        self.assertEqual(ProviderCharge.objects.using(payments.PROVIDER_DB).get().requests, 1)

    @override_settings(SHOP_FAKE_PROVIDER_MODE="decline")
    def test_a_declined_card_is_retried_then_dead(self):
        invoice_id = self.create_invoice().json()["invoice_id"]
        outcomes = [run.outcome for run in run_jobs(types=[CHARGE_JOB_TYPE])]
        while outcomes[-1] == "retried":
            outcomes += [run.outcome for run in run_jobs(types=[CHARGE_JOB_TYPE], advance=LATER)]
        self.assertEqual(outcomes, ["retried"] * 4 + ["dead"])
        self.assertEqual(JobDelivery.objects.get(key=f"charge:{invoice_id}").state, "failed")
        self.assertIsNone(Invoice.objects.get(pk=invoice_id).paid_at)

    @override_settings(SHOP_FAKE_PROVIDER_MODE="timeout-once")
    def test_a_lost_answer_is_not_charged_again_and_is_reconciled(self):
        invoice_id = self.create_invoice().json()["invoice_id"]
        [run] = run_jobs(types=[CHARGE_JOB_TYPE])
        self.assertEqual(
            (run.outcome, run.error["class"]), ("retried", "shop.payments.ProviderTimeout")
        )
        [run] = run_jobs(types=[CHARGE_JOB_TYPE], advance=LATER)
        self.assertEqual(run.outcome, "done")  # it did not charge again: the outcome is unknown
        delivery = JobDelivery.objects.get(key=f"charge:{invoice_id}")
        self.assertEqual(delivery.state, "recorded")
        self.assertIsNone(Invoice.objects.get(pk=invoice_id).paid_at)
        call_command("shop_reconcile_charges", "--min-age", "0", stdout=io.StringIO())
        delivery.refresh_from_db()
        self.assertEqual(delivery.state, "sent")
        self.assertIsNotNone(Invoice.objects.get(pk=invoice_id).paid_at)
        self.assertEqual(ProviderCharge.objects.using(payments.PROVIDER_DB).get().requests, 1)


class TheChargeHandlerAlone(ShopTestCase):
    @override_settings(SHOP_FAKE_PROVIDER_MODE="decline")
    def test_a_decline_is_a_definite_failure(self):
        from django_dbqueue.deliveries import DeliveryFailed

        invoice_id = self.create_invoice().json()["invoice_id"]
        with self.assertRaisesMessage(DeliveryFailed, "declined"):
            perform_job(CHARGE_JOB_TYPE, {"invoice_id": invoice_id})
        self.assertEqual(JobDelivery.objects.get(key=f"charge:{invoice_id}").state, "failed")

    def test_a_missing_invoice_goes_to_the_dead_letters(self):
        from django_dbqueue import DiscardJob

        with self.assertRaisesMessage(DiscardJob, "invoice 999999 does not exist"):
            perform_job(CHARGE_JOB_TYPE, {"invoice_id": 999999})
