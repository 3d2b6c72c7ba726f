"""django_dbqueue.testing in autocommit (Django's TransactionTestCase): every write commits as a
worker's would; no helper leaves a thread or a connection behind; a run stopped between a claim
and its outcome says which jobs it left running."""

import threading

from django.db import connection
from django.test import TransactionTestCase

from django_dbqueue import enqueue
from django_dbqueue.connections import connection_params
from django_dbqueue.models import JobDelivery
from django_dbqueue.testing import (
    JobsLeftRunning,
    inline,
    jobs_left_running,
    perform_job,
    run_jobs,
)
from tests.testapp.models import Effect, Invoice
from tests.utils import job_row, wait_until

BACKENDS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"


def other_connection():
    import psycopg

    return psycopg.connect(**connection_params("default"), autocommit=True)


class Commits(TransactionTestCase):
    def test_the_outcomes_commit_as_a_workers_do(self):
        done = enqueue("echo", {"n": 1})
        failing = enqueue("testing-atomic-charge", {"invoice": "T-1", "fail_after": [1]})
        ran = run_jobs()
        self.assertEqual(ran.counts, {"done": 1, "retried": 1})
        with other_connection() as other:
            states = dict(
                other.execute(
                    "SELECT id, state FROM dbqueue_job WHERE id = ANY(%s)", [[done.id, failing.id]]
                ).fetchall()
            )
            delivery = other.execute(
                "SELECT state FROM dbqueue_delivery WHERE key = 'atomic-charge:T-1'"
            ).fetchone()
        self.assertEqual(states, {done.id: "done", failing.id: "pending"})
        # The atomic handler's delivery record committed on a side connection of its own.
        self.assertEqual(delivery, ("sent",))
        self.assertEqual(Effect.objects.filter(job_id=failing.id).count(), 0)


class LeavesNothingBehind(TransactionTestCase):
    def test_no_thread_and_no_connection_outlives_a_helper(self):
        Invoice.objects.create(number="T-ASYNC")
        list(Invoice.objects.all())  # this thread's own connection is open before and after
        threads = set(threading.enumerate())
        backends = self.backends()
        enqueue("testing-async-orm", {"number": "T-ASYNC"})
        enqueue("testing-atomic-charge", {"invoice": "T-2"})  # a side connection, in production
        enqueue("approver", {"timeout": 60})
        self.assertEqual(run_jobs(advance=120).counts, {"done": 2, "waiting": 1})
        self.assertEqual(perform_job("testing-async-orm", {"number": "T-ASYNC"}), {"invoices": 1})
        self.assertEqual(
            perform_job("testing-atomic-charge", {"invoice": "T-3"})["delivery"], "sent"
        )
        with inline():
            enqueue("testing-async-orm", {"number": "T-ASYNC"})
        self.assertEqual(JobDelivery.objects.count(), 2)
        # asgiref's loop thread of an async call ends as the call returns.
        wait_until(lambda: set(threading.enumerate()) <= threads, timeout=5, message="threads")
        self.assertEqual(self.backends(), backends)

    def backends(self):
        with connection.cursor() as cursor:
            cursor.execute(BACKENDS)
            return cursor.fetchone()[0]


class SaysWhatItLeftRunning(TransactionTestCase):
    def test_a_run_stopped_after_its_claim_names_its_jobs(self):
        job = enqueue("testing-kills-its-connection", {})
        with self.assertRaises(JobsLeftRunning) as stopped:
            run_jobs()
        self.assertIn(
            f"after it claimed #{job.id} (testing-kills-its-connection) and before it wrote "
            "their outcome: they are left running under worker 'dbqueue-testing:",
            str(stopped.exception),
        )
        connection.close()  # the handler ended it
        [left] = jobs_left_running()
        self.assertEqual((left.id, left.state), (job.id, "running"))
        self.assertEqual(job_row(job.id)["worker_id"], left.worker_id)
