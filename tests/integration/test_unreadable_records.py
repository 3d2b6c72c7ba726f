"""Records a running job reads that Python cannot read (docs/handlers.md, "Rows Python cannot
read"): a step's recorded result, a durable sleep's record, a signal's payload, a dependency's
result, each written by direct SQL. The job is dead at its first attempt with ``UnreadableJob``
naming the record, not retried into the same wall; the step's function does not run again. A
caller waiting for a job's result gets the same named error."""

import pytest
from django.db import connection

from django_dbqueue import enqueue, job, registry, wait_for_result
from django_dbqueue.exceptions import UnreadableJob
from django_dbqueue.workflow import Workflow
from tests.utils import job_row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

DIGITS = """('{"a":' || repeat('9', 5000) || '}')::jsonb"""
TOO_MANY = "an integer of 5000 digits, more than Python reads (4300)"
UNREADABLE = "django_dbqueue.exceptions.UnreadableJob"
ran = []


@pytest.fixture(autouse=True)
def readers():
    @job("test-step-reader", max_attempts=5)
    def step_reader(ctx):
        return ctx.step("a", lambda: ran.append(ctx.id) or 1)

    @job("test-sleep-reader", max_attempts=5)
    def sleep_reader(ctx):
        ctx.sleep("nap", 0)

    @job("test-signal-reader", max_attempts=5)
    def signal_reader(ctx):
        return ctx.wait_for_signal("go")

    @job("test-deps-reader", max_attempts=5)
    def deps_reader(ctx):
        return len(ctx.dependency_results())

    ran.clear()
    yield
    for name in ("test-step-reader", "test-sleep-reader", "test-signal-reader", "test-deps-reader"):
        registry.unregister(name)


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def assert_dead_at_once(job_id, message):
    row = job_row(job_id)
    assert (row["state"], row["attempts"]) == ("dead", 1), row
    (error,) = row["errors"]
    assert error["class"] == UNREADABLE
    assert error["message"] == message


def test_a_recorded_step_python_cannot_read(start_worker):
    queued = enqueue("test-step-reader")
    sql(
        f"INSERT INTO dbqueue_step (job_id, name, occurrence, attempt, result, finished_at) "
        f"VALUES (%s, 'a', 1, 1, {DIGITS}, now())",
        [queued.id],
    )
    start_worker()
    wait_until(lambda: job_row(queued.id)["state"] != "pending", message="the job's first run")
    wait_until(lambda: job_row(queued.id)["state"] == "dead", message="the job dead")
    assert_dead_at_once(queued.id, f"recorded step 'a': {TOO_MANY}")
    assert ran == []  # the step's function was not run in its stead


def test_a_sleep_record_holding_a_time_python_cannot_read(start_worker):
    queued = enqueue("test-sleep-reader")
    sql(
        "INSERT INTO dbqueue_step (job_id, name, occurrence, attempt, result, finished_at) "
        """VALUES (%s, 'sleep:nap', 1, 1, '{"until": "10000-01-01T00:00:00+00:00"}', now())""",
        [queued.id],
    )
    start_worker()
    wait_until(lambda: job_row(queued.id)["state"] == "dead", message="the job dead")
    assert_dead_at_once(
        queued.id,
        "recorded step 'sleep:nap': its 'until' is not an aware time Python reads: "
        "'10000-01-01T00:00:00+00:00'",
    )


def test_a_signal_payload_python_cannot_read(start_worker):
    queued = enqueue("test-signal-reader")
    sql(
        f"INSERT INTO dbqueue_signal (job_id, name, seq, payload, created_at) "
        f"VALUES (%s, 'go', 1, {DIGITS}, now())",
        [queued.id],
    )
    start_worker()
    wait_until(lambda: job_row(queued.id)["state"] == "dead", message="the job dead")
    assert_dead_at_once(queued.id, f"the payload of signal 'go' #1: {TOO_MANY}")


def test_a_dependency_result_python_cannot_read(start_worker):
    flow = Workflow()
    first = flow.add("noop")
    flow.add("test-deps-reader", depends_on=[first])
    first_id, reader_id = (j.id for j in flow.enqueue())
    # The dependency finished with a result written by hand; its dependent is released.
    sql(
        f"UPDATE dbqueue_job SET state = 'done', finished_at = now(), result = {DIGITS} "
        "WHERE id = %s",
        [first_id],
    )
    sql("UPDATE dbqueue_job SET state = 'pending', waiting_on = 0 WHERE id = %s", [reader_id])
    start_worker()
    wait_until(lambda: job_row(reader_id)["state"] == "dead", message="the dependent dead")
    assert_dead_at_once(reader_id, f"the result of dependency #{first_id}: {TOO_MANY}")


def test_waiting_for_a_result_python_cannot_read_names_it():
    queued = enqueue("noop")
    sql(
        f"UPDATE dbqueue_job SET state = 'done', finished_at = now(), result = {DIGITS} "
        "WHERE id = %s",
        [queued.id],
    )
    with pytest.raises(UnreadableJob) as caught:
        wait_for_result(queued, timeout=5)
    assert str(caught.value) == f"the result of job #{queued.id}: {TOO_MANY}"
    assert (caught.value.column, caught.value.reason) == (
        f"the result of job #{queued.id}",
        TOO_MANY,
    )
