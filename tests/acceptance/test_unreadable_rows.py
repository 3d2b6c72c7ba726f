"""Rows Python cannot read, met by real ``run_jobqueue`` processes (docs/handlers.md, "Rows
Python cannot read"). Each poison row is written by direct SQL in the same transaction as five
good jobs, so that one claim takes the six; the poison job ends dead at its first attempt with
``UnreadableJob``, the five run exactly once, none is charged another attempt, and the worker
process (or the supervisor's child) is the same one, still running, afterwards."""

import json
import re

import pytest
from django.db import connection, transaction

from django_dbqueue import enqueue, enqueue_many
from tests.acceptance.helpers import rows, wait_all_in_state, wait_for_listeners
from tests.acceptance.settings_fair import FAIR_DBQUEUE
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.poison import POISON, unbounded
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _unbounded(transactional_db):
    """The timestamps written here are refused by the table since migration 0027
    (test_bounded_rows.py): its CHECKs are dropped for each test, as an owner of the table could
    drop them, to hold the worker and the admin to coping with such rows all the same."""
    with unbounded():
        yield


FAST = "tests.acceptance.settings_fast"
UNREADABLE = "django_dbqueue.exceptions.UnreadableJob"
STARTED = re.compile(r"started worker (\d+) \(pid (\d+)\)")


def claim_of_six(kind, job_type="record", **options):
    """Five good jobs and one poisoned by ``kind``, committed together. Returns their ids."""
    with transaction.atomic():
        good = [
            j.id
            for j in enqueue_many(
                [{"type": job_type, "payload": {"n": i}, **options} for i in range(5)]
            )
        ]
        bad = enqueue(job_type, {"n": "poison"}, **options).id
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE dbqueue_job SET {POISON[kind][0]} WHERE id = %s", [bad])
    return good, bad


def poison_outcome(job_id):
    (state, attempts, errors), *_ = rows(
        "SELECT state, attempts, errors::text FROM dbqueue_job WHERE id = %s", [job_id]
    )
    return state, attempts, json.loads(errors)


def wait_dead(job_id):
    wait_until(
        lambda: poison_outcome(job_id)[0] == "dead", timeout=30, message="the poison job dead"
    )


def assert_settled(good, bad, kind):
    wait_dead(bad)
    wait_all_in_state(good, "done", timeout=30)
    state, attempts, errors = poison_outcome(bad)
    assert (state, attempts, len(errors)) == ("dead", 1, 1)
    assert errors[0]["class"] == UNREADABLE
    assert errors[0]["message"].startswith(POISON[kind][1]), errors[0]["message"]
    assert rows("SELECT count(*) FROM testapp_effect WHERE job_id = %s", [bad])[0][0] == 0
    # The five: one attempt each, run exactly once.
    assert rows("SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND attempts = 1", [good]) == [
        (5,)
    ]
    assert sorted(
        job_id
        for (job_id,) in rows("SELECT job_id FROM testapp_effect WHERE job_id = ANY(%s)", [good])
    ) == sorted(good)


@pytest.mark.parametrize("execution", ["thread", "process"])
def test_one_worker_goes_through_every_kind_of_poison_row(start_worker, settings, execution):
    settings.DBQUEUE = FAST_DBQUEUE
    worker = start_worker("--concurrency", "8", "--execution", execution, settings=FAST)
    wait_for_listeners(1)
    for kind in sorted(POISON):
        good, bad = claim_of_six(kind)
        assert_settled(good, bad, kind)
        worker.assert_alive()
    assert "Traceback" not in worker.stderr()


def test_a_supervisors_child_survives_a_poison_row_and_is_not_restarted(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE
    supervisor = start_worker("--processes", "2", "--concurrency", "8", settings=FAST)
    first = wait_until(
        lambda: len(c := STARTED.findall(supervisor.stdout())) == 2 and c,
        timeout=30,
        message="two children",
    )
    for kind in ("payload-5000-digits", "payload-too-deep", "created_at-bc"):
        good, bad = claim_of_six(kind)
        assert_settled(good, bad, kind)
    assert STARTED.findall(supervisor.stdout()) == first  # no child died and was started again
    supervisor.assert_alive()


def test_a_batch_handlers_batch_runs_without_its_poison_job(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE
    good, bad = claim_of_six("payload-5000-digits", job_type="accept-batch")
    worker = start_worker("--concurrency", "2", settings=FAST)
    wait_dead(bad)
    wait_all_in_state(good, "done", timeout=30)
    state, attempts, errors = poison_outcome(bad)
    assert (state, attempts, errors[0]["class"]) == ("dead", 1, UNREADABLE)
    # One call ran the five together (accept-batch records the size of its batch).
    assert rows(
        "SELECT worker, count(*) FROM testapp_effect WHERE job_id = ANY(%s) GROUP BY worker",
        [good],
    ) == [("batch:5", 5)]
    worker.assert_alive()


def test_the_fair_claim_fails_its_poison_row_alone(start_worker, settings):
    settings.DBQUEUE = FAIR_DBQUEUE
    worker = start_worker("--concurrency", "8", settings="tests.acceptance.settings_fair")
    wait_for_listeners(1)
    for kind in ("payload-read-as-infinity", "created_at-year-10000"):
        with transaction.atomic():
            good = [
                j.id
                for j in enqueue_many(
                    [
                        {
                            "type": "fair-work",
                            "payload": {"tenant": f"t{i % 3}"},
                            "queue": "tenants",
                        }
                        for i in range(5)
                    ]
                )
            ]
            bad = enqueue("fair-work", {"tenant": "t1"}, queue="tenants").id
            with connection.cursor() as cursor:
                cursor.execute(f"UPDATE dbqueue_job SET {POISON[kind][0]} WHERE id = %s", [bad])
        assert_settled(good, bad, kind)
        worker.assert_alive()
