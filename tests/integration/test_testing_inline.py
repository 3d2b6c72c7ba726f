"""django_dbqueue.testing.inline(): jobs run at the commit that enqueued them, in the committing
thread; in Django's TestCase (through captureOnCommitCallbacks) and in autocommit."""

from django.db import transaction
from django.test import TestCase, TransactionTestCase

from django_dbqueue import chain, enqueue, enqueue_many, publish
from django_dbqueue.testing import assert_enqueued, inline, refute_enqueued
from tests.testapp.models import Invoice
from tests.utils import job_row


class InATestCase(TestCase):
    def test_jobs_run_when_the_captured_commit_hooks_run(self):
        with inline() as mode, self.captureOnCommitCallbacks(execute=True):
            with transaction.atomic():
                first = enqueue("echo", {"n": 1})
                enqueue_many([("echo", {"n": 2}), ("echo", {"n": 3})])
            self.assertEqual(job_row(first.id)["state"], "pending")  # not before the hooks
        self.assertEqual(len(mode.ran), 1)  # one run for the commit, not one per statement
        self.assertEqual([run.result for run in mode.runs], [{"n": 1}, {"n": 2}, {"n": 3}])
        refute_enqueued("echo")

    def test_without_the_hooks_nothing_commits_and_nothing_runs(self):
        with inline() as mode:
            job = enqueue("echo", {})
        self.assertEqual((mode.ran, job_row(job.id)["state"]), ([], "pending"))

    def test_workflows_events_and_jobs_of_jobs(self):
        with inline() as mode, self.captureOnCommitCallbacks(execute=True):
            chain(("echo", {"n": 1}), ("collect", {}))
            publish("test.invoice.paid", {"invoice": 1})
            enqueue("testing-signup", {"number": "I-1"})
        self.assertEqual(
            sorted(run.type for run in mode.runs),
            sorted(
                [
                    "echo",
                    "collect",
                    "ledger-on-paid",
                    "email-on-paid",
                    "flaky-on-paid",
                    "testing-signup",
                    "testing-charge",
                ]
            ),
        )

    def test_a_retry_is_not_due_at_the_commit(self):
        with inline() as mode, self.captureOnCommitCallbacks(execute=True):
            enqueue("fail-then-succeed", {})
        self.assertEqual([run.outcome for run in mode.runs], ["retried"])
        assert_enqueued("fail-then-succeed")


class InAutocommit(TransactionTestCase):
    def test_an_enqueue_runs_as_it_commits(self):
        with inline() as mode:
            job = enqueue("echo", {"n": 1})
            self.assertEqual(job_row(job.id)["state"], "done")  # before enqueue() returned
            Invoice.objects.create(number="I-2")  # no job touched: nothing to run
        self.assertEqual(len(mode.ran), 1)
        after = enqueue("echo", {"n": 2})  # inline mode is over
        self.assertEqual(job_row(after.id)["state"], "pending")

    def test_an_atomic_block_runs_at_its_commit_or_not_at_all(self):
        with inline() as mode:
            with transaction.atomic():
                job = enqueue("echo", {"n": 1})
                self.assertEqual(job_row(job.id)["state"], "pending")
            self.assertEqual(job_row(job.id)["state"], "done")
            try:
                with transaction.atomic():
                    enqueue("echo", {"n": 2})
                    raise RuntimeError("roll back")
            except RuntimeError:
                pass
        self.assertEqual([run.id for run in mode.runs], [job.id])
        refute_enqueued("echo")
