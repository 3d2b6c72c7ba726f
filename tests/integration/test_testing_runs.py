"""django_dbqueue.testing.run_jobs() inside Django's TestCase: the due jobs run in the test's thread
and transaction through the worker's claim, execution and acknowledgement (retries and backoff,
dead letters, workflows, publish, steps, snoozes, durable waits and signals, batch handlers,
delivery records, atomic handlers), time moves by argument, and nothing is committed."""

import datetime

from django.db import connection
from django.test import TestCase, override_settings

from django_dbqueue import (
    InvalidArgument,
    chain,
    enqueue,
    enqueue_many,
    group,
    publish,
    signal_job,
    signals,
)
from django_dbqueue.models import JobDelivery
from django_dbqueue.testing import (
    TooManyRuns,
    assert_enqueued,
    enqueued_jobs,
    refute_enqueued,
    run_jobs,
)
from tests.integration.conftest import FAST
from tests.testapp.models import Effect, Invoice, ProviderCall, StepBody
from tests.utils import job_row, scalar

HOUR = datetime.timedelta(hours=1)


def bodies(job_id):
    return list(StepBody.objects.filter(job_id=job_id).order_by("id").values_list("step", "phase"))


class RetriesAndDeadLetters(TestCase):
    def test_a_retry_runs_once_its_backoff_is_over(self):
        job = enqueue("fail-then-succeed", {"succeed_on": 3})
        ran = run_jobs()
        self.assertEqual([(r.id, r.attempt, r.outcome) for r in ran], [(job.id, 1, "retried")])
        self.assertEqual(ran.retried[0].error["message"], "transient failure 1")
        [left] = ran.left
        self.assertEqual((left.id, left.state, left.attempts), (job.id, "pending", 1))
        self.assertEqual(len(run_jobs()), 0)  # its backoff is not over: nothing is due
        ran = run_jobs(advance=HOUR)
        self.assertEqual([(r.attempt, r.outcome) for r in ran], [(2, "retried")])
        ran = run_jobs(advance=HOUR)
        self.assertEqual(
            [(r.attempt, r.outcome, r.result) for r in ran], [(3, "done", {"attempt": 3})]
        )
        row = job_row(job.id)
        self.assertEqual((row["state"], row["attempts"], len(row["errors"])), ("done", 3, 2))

    def test_a_retry_delay_the_handler_asked_for(self):
        job = enqueue("testing-retry-in", {"seconds": 600})
        self.assertEqual(run_jobs().counts, {"retried": 1})
        self.assertEqual(len(run_jobs(advance=599)), 0)
        ran = run_jobs(advance=1)
        self.assertEqual([(r.id, r.outcome, r.result) for r in ran], [(job.id, "done", 2)])

    def test_spent_attempts_end_in_the_dead_letters_with_every_error(self):
        job = enqueue("fail", {})
        outcomes = []
        for _ in range(4):
            outcomes += [r.outcome for r in run_jobs(advance=datetime.timedelta(days=1))]
        self.assertEqual(outcomes, ["retried", "retried", "dead"])
        row = job_row(job.id)
        self.assertEqual(row["state"], "dead")
        self.assertEqual(
            [e["message"] for e in row["errors"]],
            ["boom on attempt 1", "boom on attempt 2", "boom on attempt 3"],
        )
        assert_enqueued("fail", state="dead")

    def test_discard_is_dead_at_once_and_signals_are_sent(self):
        dead = []

        def on_dead(sender, **kwargs):
            dead.append((kwargs["job_id"], kwargs["error"]["class"]))

        signals.job_dead.connect(on_dead)
        self.addCleanup(signals.job_dead.disconnect, on_dead)
        job = enqueue("discard", {})
        self.assertEqual(run_jobs().counts, {"dead": 1})
        self.assertEqual(dead, [(job.id, "django_dbqueue.exceptions.DiscardJob")])

    def test_a_job_scheduled_for_tomorrow(self):
        later = enqueue("echo", {"when": "tomorrow"}, delay=datetime.timedelta(days=1))
        self.assertEqual(len(run_jobs(advance=datetime.timedelta(hours=23))), 0)
        [left] = run_jobs().left
        self.assertEqual(left.id, later.id)
        ran = run_jobs(advance=HOUR)
        self.assertEqual([(r.id, r.result) for r in ran], [(later.id, {"when": "tomorrow"})])

    def test_now_moves_the_clock_to_a_given_time(self):
        when = scalar("SELECT now()") + datetime.timedelta(days=2)
        enqueue("echo", {"at": "then"}, run_after=when)
        self.assertEqual(len(run_jobs(now=when - datetime.timedelta(seconds=1))), 0)
        self.assertEqual(run_jobs(now=when).counts, {"done": 1})
        with self.assertRaisesMessage(InvalidArgument, "is before the database's now()"):
            run_jobs(now=when - datetime.timedelta(days=3))


class WorkflowsAndEvents(TestCase):
    def test_a_chain_releases_its_callback(self):
        first, callback = chain(("echo", {"n": 1}), ("collect", {"n": 2}))
        ran = run_jobs()
        self.assertEqual(
            [(r.id, r.outcome) for r in ran], [(first.id, "done"), (callback.id, "done")]
        )
        self.assertEqual(ran.done[1].result, {str(first.id): {"n": 1}})

    def test_a_failed_member_cancels_the_callback(self):
        *_, callback = group(("echo", {}), ("discard", {}), then=("collect", {}))
        ran = run_jobs()
        self.assertEqual(sorted(ran.counts.items()), [("dead", 1), ("done", 1)])
        self.assertEqual(job_row(callback.id)["state"], "cancelled")
        self.assertEqual(ran.left, [])

    def test_a_callback_of_jobs_enqueued_before_waits_for_them(self):
        # An edge to a job already in the table is applied at the COMMIT (a deferred trigger):
        # run_jobs() applies it first, as the commit would have.
        earlier = enqueue("echo", {"n": 1})
        callback = enqueue("collect", {}, depends_on=[earlier])
        ran = run_jobs()
        self.assertEqual([r.id for r in ran], [earlier.id, callback.id])

    def test_a_publish_runs_every_subscriber(self):
        publish("test.invoice.paid", {"invoice": 7, "flaky": True})
        ran = run_jobs()
        self.assertEqual(
            sorted((r.type, r.outcome) for r in ran),
            [("email-on-paid", "done"), ("flaky-on-paid", "retried"), ("ledger-on-paid", "done")],
        )
        self.assertEqual(run_jobs(advance=HOUR).counts, {"done": 1})

    def test_jobs_that_enqueue_jobs_run_too(self):
        enqueue("testing-signup", {"number": "INV-1"})
        ran = run_jobs()
        self.assertEqual([r.type for r in ran], ["testing-signup", "testing-charge"])
        self.assertEqual(ran.done[1].result, {"charged": "ch_INV-1_1"})


class StepsSnoozesAndWaits(TestCase):
    def test_steps_run_once_across_retries(self):
        job = enqueue("five-steps", {"fail_in": "ship"})
        self.assertEqual(run_jobs().counts, {"retried": 1})
        self.assertEqual(run_jobs(advance=HOUR).counts, {"done": 1})
        ends = [step for step, phase in bodies(job.id) if phase == "end"]
        self.assertEqual(ends, ["reserve", "charge", "wait-warehouse", "ship", "email"])
        self.assertEqual(job_row(job.id)["result"], [1, 1, 1, 2, 2])

    def test_a_snooze_spends_no_attempt(self):
        job = enqueue("snoozer", {"times": 2, "delay": 30})
        self.assertEqual(run_jobs().counts, {"snoozed": 1})
        self.assertEqual(run_jobs(advance=30).counts, {"snoozed": 1})
        ran = run_jobs(advance=30)
        self.assertEqual(
            [(r.outcome, r.attempt, r.result) for r in ran],
            [("done", 1, {"runs": 3, "attempt": 1})],
        )
        self.assertEqual(job_row(job.id)["snoozes"], 2)

    def test_a_snooze_for_no_time_stops_at_max_runs(self):
        job = enqueue("snoozer", {"forever": True})
        with self.assertRaises(TooManyRuns) as failed:
            run_jobs(max_runs=5)
        self.assertIn("run_jobs() ran 5 jobs (max_runs) and 1 are still due", str(failed.exception))
        self.assertIn(f"#{job.id} snoozer attempt 1: snoozed", str(failed.exception))

    def test_a_durable_sleep(self):
        job = enqueue("sleeper", {"seconds": 3600})
        ran = run_jobs()
        self.assertEqual(ran.counts, {"waiting": 1})
        self.assertEqual(ran.left[0].wait_reason, "sleep:nap")
        self.assertEqual(len(run_jobs(advance=3599)), 0)
        self.assertEqual(run_jobs(advance=1).counts, {"done": 1})
        self.assertEqual(
            bodies(job.id),
            [("before", "start"), ("before", "end"), ("after", "start"), ("after", "end")],
        )

    def test_a_wait_for_a_signal(self):
        job = enqueue("approver", {"timeout": 7200})
        self.assertEqual(run_jobs().counts, {"waiting": 1})
        self.assertEqual(len(run_jobs(advance=HOUR)), 0)
        self.assertEqual(signal_job(job.id, "approve", {"by": "ana"}), 1)
        # The signal reaches its job at the commit: run_jobs() applies it first.
        ran = run_jobs()
        self.assertEqual([(r.outcome, r.result) for r in ran], [("done", [{"by": "ana"}])])

    def test_a_wait_for_a_signal_that_times_out(self):
        enqueue("approver", {"timeout": 7200})
        run_jobs()
        ran = run_jobs(advance=datetime.timedelta(hours=2))
        self.assertEqual([(r.outcome, r.result) for r in ran], [("done", ["timed out"])])

    def test_an_atomic_handler_may_not_wait(self):
        enqueue("atomic-sleeper", {})
        [run] = run_jobs().dead
        self.assertIn("cannot wait inside a transaction", run.error["message"])


class BatchesAndFilters(TestCase):
    def test_a_batch_handler_gets_its_batch(self):
        enqueue_many([("accept-batch", {"n": n, "fail_first": n == 2}) for n in range(5)])
        ran = run_jobs()
        self.assertEqual(ran.counts, {"done": 4, "retried": 1})
        self.assertEqual(set(Effect.objects.values_list("worker", flat=True)), {"batch:5"})
        self.assertEqual(run_jobs(advance=HOUR).counts, {"done": 1})

    def test_types_and_queues_run_only_what_they_name(self):
        echo = enqueue("echo", {})
        failing = enqueue("fail", {})
        email = enqueue("email", {})
        due = job_row(failing.id)["run_after"]
        ran = run_jobs(types=["echo", "email"], queues=["default"])
        self.assertEqual([r.id for r in ran], [echo.id])
        self.assertEqual(job_row(failing.id)["run_after"], due)  # passed over, as it was
        self.assertEqual(ran.left, [])  # of the types it ran
        self.assertEqual([r.id for r in run_jobs(queues="emails")], [email.id])
        with self.assertRaisesMessage(InvalidArgument, "queue 'nope' is not in DBQUEUE['QUEUES']"):
            run_jobs(queues=["nope"])

    def test_serial_keys_run_in_enqueue_order(self):
        jobs = [enqueue("serial-record", {"account": "a", "label": n}) for n in range(3)]
        ran = run_jobs()
        self.assertEqual([r.id for r in ran], [j.id for j in jobs])

    @override_settings(
        DBQUEUE={
            **FAST,
            "QUEUES": {**FAST["QUEUES"], "default": {"rate_limit": {"limit": 2, "period": 60}}},
        }
    )
    def test_a_rate_limit_holds_jobs_until_its_window_reopens(self):
        jobs = [enqueue("echo", {"n": n}) for n in range(3)]
        ran = run_jobs()
        self.assertEqual([r.id for r in ran], [j.id for j in jobs[:2]])
        self.assertEqual([j.id for j in ran.left], [jobs[2].id])
        self.assertEqual(len(run_jobs(advance=59)), 0)
        self.assertEqual([r.id for r in run_jobs(advance=1)], [jobs[2].id])

    @override_settings(DBQUEUE={**FAST, "QUEUES": {**FAST["QUEUES"], "default": {"fair": True}}})
    def test_a_fair_queue_takes_its_keys_in_turn(self):
        a1, a2, a3 = (enqueue("echo", {"n": n}, fair_key="a") for n in range(3))
        b1 = enqueue("echo", {}, fair_key="b")
        self.assertEqual([r.id for r in run_jobs()], [a1.id, b1.id, a2.id, a3.id])

    def test_an_unknown_type_is_deferred(self):
        with connection.cursor() as cursor:
            cursor.execute("SELECT dbqueue_enqueue('gone-type', '{}'::jsonb)")
        [run] = run_jobs()
        self.assertEqual(run.outcome, "deferred")
        self.assertIn("no handler is registered for job type 'gone-type'", run.error["message"])


class HandlersInTheTestTransaction(TestCase):
    def test_an_atomic_handler_rolls_back_its_writes_and_records_the_failure(self):
        job = enqueue("testing-atomic-charge", {"invoice": "A-1", "fail_after": [1]})
        ran = run_jobs()
        self.assertEqual(ran.counts, {"retried": 1})
        self.assertEqual(Effect.objects.filter(job_id=job.id).count(), 0)  # rolled back
        # Its delivery record is not one of its writes: kept, as in production (where it
        # commits on a connection of its own), so the retry does not charge again.
        self.assertEqual(JobDelivery.objects.get(key="atomic-charge:A-1").state, "sent")
        ran = run_jobs(advance=HOUR)
        self.assertEqual(
            [(r.outcome, r.result) for r in ran],
            [("done", {"delivery": "sent", "proceeded": False})],
        )
        self.assertEqual(Effect.objects.filter(job_id=job.id).count(), 1)

    def test_an_unknown_outcome_is_not_charged_again(self):
        enqueue("testing-atomic-charge", {"invoice": "A-2", "timeout": [1]})
        self.assertEqual(run_jobs().counts, {"retried": 1})
        self.assertEqual(JobDelivery.objects.get(key="atomic-charge:A-2").state, "recorded")
        ran = run_jobs(advance=HOUR)
        self.assertEqual([r.result for r in ran], [{"delivery": "recorded", "proceeded": False}])

    def test_a_definite_failure_is_charged_on_the_retry(self):
        enqueue("testing-charge", {"invoice": "C-1", "fail": [1]})
        self.assertEqual(run_jobs().counts, {"retried": 1})
        self.assertEqual(JobDelivery.objects.get(key="charge:C-1").state, "failed")
        self.assertEqual(run_jobs(advance=HOUR).counts, {"done": 1})
        self.assertEqual(
            list(ProviderCall.objects.values_list("key", "attempt")), [("charge:C-1", 2)]
        )

    def test_a_failed_statement_does_not_abort_the_test(self):
        Invoice.objects.create(number="DUP")
        job = enqueue("testing-duplicate", {"number": "DUP"})
        [run] = run_jobs()
        self.assertEqual(
            (run.outcome, run.error["class"]), ("retried", "django.db.utils.IntegrityError")
        )
        # The test's transaction goes on; the run's writes went with its failed statement.
        self.assertEqual(Effect.objects.filter(job_id=job.id).count(), 0)
        caught = enqueue("testing-catches-integrity", {"number": "DUP"})
        self.assertEqual(
            [r.result for r in run_jobs(types=["testing-catches-integrity"])], ["went on"]
        )
        self.assertEqual(Effect.objects.filter(job_id=caught.id).count(), 1)

    def test_an_async_handler_sees_the_test_transaction(self):
        Invoice.objects.create(number="ASYNC-1")
        job = enqueue("testing-async-orm", {"number": "ASYNC-1"})
        [run] = run_jobs()
        self.assertEqual((run.outcome, run.result), ("done", {"invoices": 1}))
        self.assertEqual(Effect.objects.get(job_id=job.id).worker, "async")

    def test_nothing_is_committed(self):
        # Another connection sees none of it: the job, its effects, its delivery record.
        import psycopg

        from django_dbqueue.connections import connection_params

        job = enqueue("testing-charge", {"invoice": "N-1"})
        run_jobs()
        self.assertEqual(job_row(job.id)["state"], "done")
        with psycopg.connect(**connection_params("default")) as other:
            counts = other.execute(
                "SELECT (SELECT count(*) FROM dbqueue_job WHERE id = %s),"
                " (SELECT count(*) FROM dbqueue_delivery WHERE key = 'charge:N-1')",
                [job.id],
            ).fetchone()
        self.assertEqual(counts, (0, 0))


class Reports(TestCase):
    def test_what_a_report_holds(self):
        done = enqueue("echo", {"x": 1})
        failed = enqueue("fail", {})
        ran = run_jobs()
        self.assertEqual(len(ran), 2)
        self.assertEqual(ran.counts, {"done": 1, "retried": 1})
        self.assertEqual([r.id for r in ran.done], [done.id])
        self.assertEqual([r.id for r in ran.retried], [failed.id])
        self.assertEqual(ran.dead, [])
        self.assertEqual([j.id for j in ran.left], [failed.id])
        self.assertIn(
            f"#{failed.id} fail attempt 1: retried (ValueError: boom on attempt 1)", repr(ran)
        )
        refute_enqueued("echo")
        self.assertEqual([j.id for j in enqueued_jobs("fail")], [failed.id])

    def test_bad_arguments_are_named(self):
        for kwargs, message in (
            ({"advance": -1}, "advance must be a timedelta or a number of seconds from 0 to"),
            ({"advance": "1h"}, "got '1h'"),
            ({"advance": float("nan")}, "got nan"),
            ({"advance": datetime.timedelta(days=40000)}, "(100 years), got datetime.timedelta"),
            ({"now": datetime.datetime(2030, 1, 1)}, "now must be an aware datetime"),
            ({"advance": 1, "now": datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)}, "not both"),
            ({"max_runs": 0}, "max_runs must be an int >= 1, got 0"),
            ({"types": ["ecoh"]}, "unknown job type 'ecoh'"),
        ):
            with self.subTest(kwargs=kwargs), self.assertRaisesMessage(Exception, message):
                run_jobs(**kwargs)
