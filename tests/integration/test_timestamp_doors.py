"""Every Python door that ends as a stored timestamp refuses one Python could not read back
(validation.TIMESTAMP_MIN to TIMESTAMP_MAX): ``datetime.max`` at UTC-14 is year 10000 in UTC,
``datetime.min`` at UTC+14 is 1 BC. The error names the argument, the value and the range (never
an ``OverflowError``), and nothing is stored; the edges of the range are stored and read back."""

import datetime

import django
import pytest
from django.db import connection

from django_dbqueue import (
    EnqueueError,
    InvalidArgument,
    Workflow,
    enqueue,
    enqueue_many,
    job,
    registry,
)
from django_dbqueue.models import BackgroundJob
from django_dbqueue.validation import TIMESTAMP_MAX, TIMESTAMP_MIN
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

WEST = datetime.timezone(datetime.timedelta(hours=-14))
EAST = datetime.timezone(datetime.timedelta(hours=14))
OUT_OF_RANGE = {
    "max-at-utc-14": datetime.datetime.max.replace(tzinfo=WEST),  # year 10000 in UTC
    "min-at-utc+14": datetime.datetime.min.replace(tzinfo=EAST),  # 1 BC in UTC
    "a-minute-past-the-max": TIMESTAMP_MAX + datetime.timedelta(minutes=1),
    "a-microsecond-before-the-min": TIMESTAMP_MIN - datetime.timedelta(microseconds=1),
}
RANGE = "from 0001-01-02T00:00:00+00:00 to 9999-12-30T00:00:00+00:00 (UTC, inclusive"


def jobs_stored():
    return scalar("SELECT count(*) FROM dbqueue_job")


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_enqueue_refuses_a_run_after_python_cannot_read_back(name):
    value = OUT_OF_RANGE[name]
    with pytest.raises(EnqueueError) as caught:
        enqueue("noop", run_after=value)
    assert (
        str(caught.value) == f"run_after must be {RANGE}: what Python reads back and shows in "
        f"any time zone), got {value.isoformat()}"
    )
    assert jobs_stored() == 0


@pytest.mark.parametrize("name", sorted(OUT_OF_RANGE))
def test_enqueue_many_refuses_it_naming_the_item_not_overflowing(name):
    value = OUT_OF_RANGE[name]
    with pytest.raises(EnqueueError, match=r"^jobs\[1\]: run_after must be from 0001-01-02"):
        enqueue_many([("noop", {}), {"type": "noop", "run_after": value}])
    assert jobs_stored() == 0


def test_a_workflow_refuses_it_at_add_naming_the_job():
    flow = Workflow()
    with pytest.raises(EnqueueError, match=r"^workflow job 'noop': run_after must be from 0001"):
        flow.add("noop", run_after=OUT_OF_RANGE["max-at-utc-14"])
    assert flow.jobs == []
    assert jobs_stored() == 0


def test_the_edges_of_the_range_are_stored_and_read_back_by_the_orm():
    low = enqueue("noop", run_after=TIMESTAMP_MIN)
    high = enqueue("noop", run_after=TIMESTAMP_MAX.astimezone(WEST))  # the same instant
    workflow_job = Workflow()
    workflow_job.add("noop", run_after=TIMESTAMP_MAX)
    (added,) = workflow_job.enqueue()
    assert BackgroundJob.objects.get(pk=low.id).run_after == TIMESTAMP_MIN
    assert BackgroundJob.objects.get(pk=high.id).run_after == TIMESTAMP_MAX
    assert job_row(added.id)["run_after"] == TIMESTAMP_MAX


@pytest.fixture
def sleeper():
    @job("test-sleep-until-far", max_attempts=1)
    def sleep_until_far(ctx):
        ctx.sleep_until("far", datetime.datetime.max.replace(tzinfo=WEST))

    yield
    registry.unregister("test-sleep-until-far")


def test_ctx_sleep_until_refuses_it_and_the_job_fails_saying_so(sleeper, start_worker):
    queued = enqueue("test-sleep-until-far")
    start_worker()
    wait_until(lambda: job_row(queued.id)["state"] == "dead", message="the job's failure")
    row = job_row(queued.id)
    (error,) = row["errors"]
    assert error["class"] == f"{InvalidArgument.__module__}.{InvalidArgument.__qualname__}"
    assert error["message"].startswith(f"ctx.sleep_until(): when must be {RANGE}")
    assert row["run_after"].year < 9999  # no sleep ending in year 10000 was stored
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dbqueue_step WHERE job_id = %s", [queued.id])
        assert cursor.fetchone()[0] == 0


@pytest.mark.skipif(
    django.VERSION < (6, 0),
    reason="django.tasks exists from Django 6.0; the Django 6.1 run of the suite covers it",
)
def test_a_tasks_run_after_is_refused_at_using():
    from django.tasks.exceptions import InvalidTask

    from tests.testapp import tasks

    with pytest.raises(InvalidTask, match=r"^run_after must be from 0001-01-02"):
        tasks.add.using(run_after=OUT_OF_RANGE["max-at-utc-14"])
    assert jobs_stored() == 0
    edge = tasks.add.using(run_after=TIMESTAMP_MAX).enqueue(1, 2)
    assert job_row(int(edge.id))["run_after"] == TIMESTAMP_MAX
