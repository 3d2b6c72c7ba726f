"""django_dbqueue.testing's enqueued_jobs(), assert_enqueued() and refute_enqueued(), in Django's
TestCase (the test's transaction, nothing committed): they see every job alike, whatever wrote
it, match payloads as subsets, and say what was enqueued instead when they fail."""

import datetime
import unittest

import django
from django.db import connection
from django.test import TestCase, override_settings

from django_dbqueue import (
    InvalidArgument,
    PayloadError,
    UnknownJobType,
    chain,
    enqueue,
    enqueue_many,
    publish,
)
from django_dbqueue.testing import (
    assert_enqueued,
    enqueued_jobs,
    refute_enqueued,
    run_jobs,
)
from tests.integration.conftest import FAST
from tests.testapp import jobs


class SeesEveryWayIn(TestCase):
    def test_enqueue_and_enqueue_many(self):
        enqueue("echo", {"user": 7, "plan": {"name": "pro", "seats": 3}})
        enqueue_many([("email", {"to": "a@example.com"}), ("email", {"to": "b@example.com"})])
        found = assert_enqueued("echo", {"user": 7})
        self.assertEqual([job.payload["plan"]["seats"] for job in found], [3])
        assert_enqueued("email", count=2, queue="emails")
        assert_enqueued(jobs.email, {"to": "b@example.com"})  # by its @job function
        self.assertEqual(
            [job.payload["to"] for job in enqueued_jobs("email")],
            ["a@example.com", "b@example.com"],
        )

    def test_a_workflow_its_waiting_callback_and_a_publish(self):
        _, callback = chain(("echo", {"step": 1}), ("collect", {"step": 2}))
        assert_enqueued("echo", {"step": 1}, state="pending")
        [waiting] = assert_enqueued("collect", {"step": 2}, state="waiting")
        self.assertEqual(waiting.id, callback.id)
        published = publish("test.invoice.paid", {"invoice": 42})
        for subscriber in ("ledger-on-paid", "email-on-paid", "flaky-on-paid"):
            [found] = assert_enqueued(subscriber, {"invoice": 42})
            self.assertEqual(found.event_id, published.id)

    def test_an_sql_enqueue(self):
        with connection.cursor() as cursor:
            cursor.execute("SELECT dbqueue_enqueue('echo', '{\"from\": \"sql\"}'::jsonb)")
        assert_enqueued("echo", {"from": "sql"})

    @override_settings(DBQUEUE={**FAST, "SCHEDULE": {"hourly": {"type": "echo", "every": 3600}}})
    def test_a_periodic_tick(self):
        # The first pass of the scheduler starts the entry from now (as a worker's does); an
        # hour later its tick is due, enqueued and run.
        ran = run_jobs(types=["noop"], schedules=True)
        self.assertEqual((len(ran), enqueued_jobs("echo")), (0, []))
        ran = run_jobs(types=["noop"], schedules=True, advance=datetime.timedelta(hours=1))
        [tick] = assert_enqueued("echo")
        self.assertTrue(tick.idempotency_key.startswith("dbqueue-schedule:hourly:"))
        ran = run_jobs(schedules=True)
        self.assertEqual(ran.counts, {"done": 1})
        refute_enqueued("echo")

    @unittest.skipIf(
        django.VERSION < (6, 0),
        "django.tasks exists from Django 6.0; the Django 6.1 run of the suite covers it",
    )
    def test_a_django_task(self):
        from tests.testapp import tasks

        result = tasks.add.enqueue(2, 3)
        [found] = assert_enqueued(tasks.add, {"args": [2, 3]})
        self.assertEqual((found.id, found.name), (int(result.id), "tests.testapp.tasks.add"))
        refute_enqueued(tasks.shout)
        ran = run_jobs()
        self.assertEqual(
            [(run.name, run.outcome, run.result) for run in ran],
            [("tests.testapp.tasks.add", "done", 5)],
        )
        result.refresh()
        self.assertEqual(result.return_value, 5)


class MatchesPayloadsAsSubsets(TestCase):
    def setUp(self):
        enqueue("echo", {"user": 7, "tags": ["a", "b"], "plan": {"seats": 3, "name": "pro"}})

    def test_what_matches(self):
        for payload in (
            {},
            {"user": 7},
            {"user": 7.0},  # numbers by value
            {"plan": {"seats": 3}},  # a subset at every depth
            {"tags": ["a", "b"], "plan": {}},
        ):
            with self.subTest(payload=payload):
                assert_enqueued("echo", payload)

    def test_what_does_not(self):
        for payload, why in (
            ({"user": 8}, 'payload["user"] is 7, expected 8'),
            ({"user": True}, 'payload["user"] is 7, expected true'),
            ({"user": "7"}, 'payload["user"] is 7, expected "7"'),
            ({"tags": ["a"]}, 'payload["tags"] is ["a", "b"], expected ["a"]'),
            ({"plan": {"seats": 4}}, 'payload["plan"]["seats"] is 3, expected 4'),
            ({"missing": None}, 'payload["missing"] is missing (expected null)'),
        ):
            with self.subTest(payload=payload):
                with self.assertRaises(AssertionError) as failed:
                    assert_enqueued("echo", payload)
                self.assertIn(why, str(failed.exception))
                refute_enqueued("echo", payload)


class SaysWhatWasEnqueuedInstead(TestCase):
    def test_the_failure_lists_the_jobs_and_what_differs(self):
        first = enqueue("echo", {"user": 8})
        second = enqueue("email", {"to": "x@example.com"})
        with self.assertRaises(AssertionError) as failed:
            assert_enqueued("echo", {"user": 7}, queue="default")
        self.assertEqual(
            str(failed.exception),
            "expected a job of type 'echo' with a payload matching {\"user\": 7} in queue "
            "'default' (pending or waiting), found 0\n"
            "2 jobs are pending or waiting:\n"
            f"  #{first.id} echo in 'default' (pending) payload={{\"user\": 8}}: "
            'payload["user"] is 8, expected 7\n'
            f'  #{second.id} email in \'emails\' (pending) payload={{"to": "x@example.com"}}: '
            "its type is 'email'",
        )

    def test_a_count_that_differs_names_the_ones_found(self):
        one = enqueue("echo", {"n": 1})
        enqueue("echo", {"n": 2})
        with self.assertRaises(AssertionError) as failed:
            assert_enqueued("echo", {"n": 1}, count=2)
        self.assertTrue(
            str(failed.exception).startswith(
                "expected 2 jobs of type 'echo' with a payload matching {\"n\": 1} (pending or "
                f"waiting), found 1: #{one.id}\n2 jobs are pending or waiting:"
            ),
            str(failed.exception),
        )
        assert_enqueued("echo", count=2)
        assert_enqueued("noop", count=0)

    def test_nothing_enqueued_and_jobs_in_other_states(self):
        job = enqueue("echo", {"n": 1})
        run_jobs()
        with self.assertRaises(AssertionError) as failed:
            assert_enqueued("echo")
        self.assertEqual(
            str(failed.exception),
            "expected a job of type 'echo' (pending or waiting), found 0\n"
            "No job is pending or waiting.\n"
            "1 matching job is in other states:\n"
            f"  #{job.id} echo in 'default' (done) payload={{\"n\": 1}}",
        )
        assert_enqueued("echo", state="done")
        assert_enqueued("echo", state=["done", "dead"], count=1)

    def test_refute_lists_what_it_found(self):
        job = enqueue("echo", {"n": 1})
        refute_enqueued("echo", {"n": 2})
        refute_enqueued("noop")
        with self.assertRaises(AssertionError) as failed:
            refute_enqueued("echo")
        self.assertEqual(
            str(failed.exception),
            "expected no job of type 'echo' (pending or waiting), found 1:\n"
            f"  #{job.id} echo in 'default' (pending) payload={{\"n\": 1}}",
        )


class RefusesBadArguments(TestCase):
    def test_each_mistake_is_named(self):
        with self.assertRaisesMessage(UnknownJobType, "unknown job type 'ecoh'"):
            assert_enqueued("ecoh")
        with self.assertRaisesMessage(UnknownJobType, "Did you mean 'echo'"):
            refute_enqueued("ecoh")
        with self.assertRaisesMessage(PayloadError, 'expected payload["when"] is a datetime'):
            assert_enqueued("echo", {"when": datetime.datetime(2026, 1, 1)})
        with self.assertRaisesMessage(InvalidArgument, "count must be None (at least one)"):
            assert_enqueued("echo", count=-1)
        with self.assertRaisesMessage(InvalidArgument, "state must be a job state"):
            enqueued_jobs(state="finished")
        with self.assertRaisesMessage(InvalidArgument, "type must be a job type's name"):
            enqueued_jobs(type=42)
