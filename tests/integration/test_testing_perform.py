"""django_dbqueue.testing.perform_job(): one handler, a real context, the payload checks of
enqueue(), its result or its error; in Django's TestCase."""

import datetime

from django.test import TestCase

from django_dbqueue import (
    DiscardJob,
    EnqueueError,
    InvalidArgument,
    JobContext,
    PayloadError,
    RetryJob,
    Snooze,
    UnknownJobType,
)
from django_dbqueue.deliveries import DeliveryFailed
from django_dbqueue.models import JobDelivery
from django_dbqueue.outcomes import ResultError
from django_dbqueue.testing import perform_job, refute_enqueued
from tests.testapp import jobs
from tests.testapp.models import Effect, Invoice, ProviderCall


class ResultsAndErrors(TestCase):
    def test_the_result_as_a_worker_stores_it(self):
        self.assertEqual(perform_job("echo", {"a": [1, 2]}), {"a": [1, 2]})
        self.assertEqual(perform_job(jobs.echo, {"b": 1}), {"b": 1})
        self.assertIsNone(perform_job("noop"))
        self.assertEqual(perform_job("atomic-echo", {"c": 3}), {"c": 3})
        refute_enqueued()  # nothing was enqueued, nothing written

    def test_the_handlers_error_is_raised(self):
        with self.assertRaisesMessage(ValueError, "boom on attempt 2"):
            perform_job("fail", attempt=2)
        with self.assertRaises(RetryJob) as retry:
            perform_job("testing-retry-in", {"seconds": 90})
        self.assertEqual(retry.exception.delay, 90)
        self.assertEqual(perform_job("testing-retry-in", {"seconds": 90}, attempt=2), 2)
        with self.assertRaises(DiscardJob):
            perform_job("discard")

    def test_a_result_a_worker_could_not_store(self):
        from django_dbqueue import job, registry

        @job("testing-returns-a-set")
        def returns_a_set(ctx):
            return {"ids": {1, 2}}

        self.addCleanup(registry.unregister, "testing-returns-a-set")
        with self.assertRaisesMessage(ResultError, 'result["ids"] is a builtins.set'):
            perform_job("testing-returns-a-set")

    def test_a_snooze_is_returned(self):
        snooze = perform_job("snoozer", {"forever": True, "returned": True, "delay": 30})
        self.assertIsInstance(snooze, Snooze)
        self.assertEqual(snooze.seconds, 30)

    def test_an_async_handler(self):
        Invoice.objects.create(number="P-ASYNC")
        self.assertEqual(perform_job("testing-async-orm", {"number": "P-ASYNC"}), {"invoices": 1})
        self.assertEqual(Effect.objects.get(job_id=0).worker, "async")

    def test_a_batch_handler_gets_a_batch_of_one(self):
        self.assertIsNone(perform_job("accept-batch", {"n": 1}))
        self.assertEqual(Effect.objects.get().worker, "batch:1")
        with self.assertRaisesMessage(ValueError, "planned failure of job #0"):
            perform_job("accept-batch", {"fail_first": True})


class TheContext(TestCase):
    def test_what_the_handler_sees(self):
        from django_dbqueue import job, registry

        seen = []

        @job("testing-sees-its-context", queue="emails", max_attempts=5, priority=3)
        def sees(ctx):
            seen.append(ctx)

        self.addCleanup(registry.unregister, "testing-sees-its-context")
        at = datetime.datetime(2030, 1, 2, tzinfo=datetime.UTC)
        perform_job("testing-sees-its-context", {"t": [1, 2]})
        perform_job(
            "testing-sees-its-context",
            id=41,
            attempt=5,
            idempotency_key="k-1",
            enqueued_at=at,
            worker_id="w",
        )
        first, second = seen
        self.assertIsInstance(first, JobContext)
        self.assertEqual(
            (first.id, first.attempt, first.max_attempts, first.queue, first.priority),
            (0, 1, 5, "emails", 3),
        )
        self.assertEqual(first.payload, {"t": [1, 2]})
        self.assertFalse(first.is_last_attempt)
        self.assertEqual(
            (second.id, second.attempt, second.idempotency_key, second.enqueued_at),
            (41, 5, "k-1", at),
        )
        self.assertTrue(second.is_last_attempt)
        self.assertEqual((second.worker_id, second.using), ("w", "default"))

    def test_the_checks_of_enqueue(self):
        with self.assertRaisesMessage(UnknownJobType, "unknown job type 'ecoh'"):
            perform_job("ecoh")
        with self.assertRaisesMessage(PayloadError, 'payload["when"] is a datetime'):
            perform_job("echo", {"when": datetime.datetime(2030, 1, 1)})
        with self.assertRaisesMessage(PayloadError, 'payload["t"] is a tuple'):
            perform_job("echo", {"t": (1, 2)})
        with self.assertRaisesMessage(EnqueueError, "queue 'nope' is not in DBQUEUE['QUEUES']"):
            perform_job("echo", queue="nope")
        with self.assertRaisesMessage(InvalidArgument, "attempt=4 is past max_attempts=3"):
            perform_job("fail", attempt=4)
        with self.assertRaisesMessage(InvalidArgument, "unknown context 'attempts'"):
            perform_job("echo", attempts=2)
        with self.assertRaisesMessage(InvalidArgument, "id must be an int from 0"):
            perform_job("echo", id=-1)


class InTheTestTransaction(TestCase):
    def test_an_atomic_handler_rolls_back_its_writes_with_its_error(self):
        with self.assertRaisesMessage(RuntimeError, "fails after its delivery on attempt 1"):
            perform_job("testing-atomic-charge", {"invoice": "P-1", "fail_after": [1]})
        self.assertEqual(Effect.objects.count(), 0)
        # Its delivery record is kept (a connection of its own in production).
        self.assertEqual(JobDelivery.objects.get(key="atomic-charge:P-1").state, "sent")
        self.assertEqual(
            perform_job("testing-atomic-charge", {"invoice": "P-1"}, attempt=2),
            {"delivery": "sent", "proceeded": False},
        )

    def test_charges_once_and_fails_definitely_on_a_503(self):
        with self.assertRaisesMessage(DeliveryFailed, "503 from the provider on attempt 1"):
            perform_job("testing-charge", {"invoice": "P-2", "fail": [1]})
        self.assertEqual(JobDelivery.objects.get(key="charge:P-2").state, "failed")
        self.assertEqual(
            perform_job("testing-charge", {"invoice": "P-2", "fail": [1]}, attempt=2),
            {"charged": "ch_P-2_2"},
        )
        self.assertEqual(
            perform_job("testing-charge", {"invoice": "P-2"}, attempt=3),
            {"skipped": "sent"},
        )
        self.assertEqual(ProviderCall.objects.count(), 1)

    def test_a_failed_statement_does_not_abort_the_test(self):
        Invoice.objects.create(number="P-DUP")
        with self.assertRaises(Exception) as failed:
            perform_job("testing-duplicate", {"number": "P-DUP"})
        self.assertEqual(type(failed.exception).__name__, "IntegrityError")
        self.assertEqual(Invoice.objects.count(), 1)  # the test's transaction goes on

    def test_steps_and_waits_need_run_jobs(self):
        for job_type, payload in (
            ("five-steps", {}),
            ("sleeper", {"seconds": 10}),
            ("approver", {}),
        ):
            with (
                self.subTest(job_type),
                self.assertRaisesMessage(
                    InvalidArgument, "Enqueue the job and run it with run_jobs()"
                ),
            ):
                perform_job(job_type, payload)
