"""Rows the worker's own statements could not compute with (issue 35, migration 0027).

A lease of Infinity passed the CHECK ``lease_seconds > 0`` and made every claim that picked
the row fail ("interval out of range"), and with it the whole queue for every worker; a
run_after of -infinity did the same to every limited claim of its queue. The table now refuses
such values itself (every door refused them already): each write below is refused with the
constraint named, and the claims of the queue go on. The arithmetic of the completion and of
the hand-backs on counts written by hand stops at 0 instead of failing the CHECK on the count,
which failed every job of the statement's batch.
"""

import json

import pytest
from django.db import IntegrityError, connection, transaction

from django_dbqueue import enqueue, enqueue_many, flow, store
from django_dbqueue.conf import get_settings
from tests.utils import job_row

pytestmark = pytest.mark.django_db(transaction=True)

# Times the worker cannot read back or compute with (validation.TIMESTAMP_MIN..MAX is what is
# taken): infinite ones, Python's year 10000, BC, and year 1's first day (Python reads it in UTC,
# not in every time zone).
BAD_TIMES = [
    "infinity",
    "-infinity",
    "10000-01-01 00:00:00+00",
    "4000-01-01 00:00:00+00 BC",
    "0001-01-01 12:00:00+00",
]
BAD_LEASES = ["Infinity", "1e300", "NaN", "315360001"]


def write(sql, params):
    """Run one statement in a savepoint of its own (so that a refusal leaves the test's
    connection usable); raises what PostgreSQL raised."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)


def attempt(sql, params):
    """:func:`write`, returning the IntegrityError it raised (None when it went through)."""
    try:
        write(sql, params)
    except IntegrityError as exc:
        return exc
    return None


def claim_all(queue="default", limit=20):
    token = store.new_token()
    claimed = store.claim(
        get_settings().DATABASE,
        worker_id="w-bounded",
        queues=[queue],
        limits=[limit],
        limit=limit,
        token=token,
    )
    return token, claimed


def running(job_id, **columns):
    """Make a pending job running under a lease (as a claim leaves it), then set ``columns``."""
    assignments = "".join(f", {name} = %s" for name in columns)
    write(
        "UPDATE dbqueue_job SET state = 'running', attempts = 1, started_at = now(), "
        "leased_until = now() + interval '1 minute', worker_id = 'w', lease_token = 7"
        f"{assignments} WHERE id = %s",
        [*columns.values(), job_id],
    )


@pytest.mark.parametrize("value", BAD_LEASES)
def test_a_lease_no_claim_can_compute_is_refused_and_the_queue_goes_on(value):
    jobs = [job.id for job in enqueue_many([("noop", {"n": n}) for n in range(3)])]
    refused = attempt(
        "UPDATE dbqueue_job SET lease_seconds = %s::float8 WHERE id = %s", [value, jobs[1]]
    )
    # (Before migration 0027 the write went through, and this claim failed for every job of
    # the queue: DataError, interval out of range.)
    _, claimed = claim_all()
    assert sorted(job.id for job in claimed) == jobs
    assert "dbqueue_job_lease_bounded" in str(refused)
    assert {job.lease_seconds for job in claimed} == {60.0}


@pytest.mark.parametrize("value", BAD_TIMES)
@pytest.mark.parametrize("column", ["run_after", "created_at", "started_at"])
def test_a_pending_jobs_time_outside_pythons_is_refused(column, value):
    job = enqueue("noop").id
    with pytest.raises(IntegrityError, match=f"dbqueue_job_{column}_range"):
        write(f"UPDATE dbqueue_job SET {column} = %s::timestamptz WHERE id = %s", [value, job])
    assert job_row(job)["state"] == "pending"


@pytest.mark.parametrize("value", BAD_TIMES)
@pytest.mark.parametrize("column", ["leased_until", "cancel_requested_at"])
def test_a_running_jobs_time_outside_pythons_is_refused(column, value):
    job = enqueue("noop").id
    running(job)
    with pytest.raises(IntegrityError, match=f"dbqueue_job_{column}_range"):
        write(f"UPDATE dbqueue_job SET {column} = %s::timestamptz WHERE id = %s", [value, job])


@pytest.mark.parametrize("value", BAD_TIMES)
def test_a_finished_jobs_time_outside_pythons_is_refused(value):
    job = enqueue("noop").id
    write("UPDATE dbqueue_job SET state = 'done', finished_at = now() WHERE id = %s", [job])
    with pytest.raises(IntegrityError, match="dbqueue_job_finished_at_range"):
        write("UPDATE dbqueue_job SET finished_at = %s::timestamptz WHERE id = %s", [value, job])


def test_an_insert_with_a_minus_infinite_run_after_is_refused_and_a_limited_claim_goes_on(
    settings,
):
    # dbqueue_claim_within_limits() returns now() - run_after for each job it claims: a
    # -infinity there failed every limited claim of the queue.
    settings.DBQUEUE = {**settings.DBQUEUE, "QUEUES": {"default": {"global_concurrency": 5}}}
    job = enqueue("noop").id
    refused = attempt(
        "INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,"
        " max_attempts, lease_seconds, errors, created_at)"
        " VALUES ('noop', 'default', '{}', 'pending', 0, '-infinity', 0, 3, 60, '[]', now())",
        [],
    )
    # (Before migration 0027 the row went in, and this claim failed: DataError.)
    rows = store.claim(
        get_settings().DATABASE,
        worker_id="w-limited",
        queues=["default"],
        limits=[5],
        limit=5,
        token=store.new_token(),
        flow=flow.claim_params(get_settings(), ["default"]),
    )
    assert [row.id for row in rows] == [job]
    assert "dbqueue_job_run_after_range" in str(refused)


def test_a_count_of_dependencies_written_too_low_releases_the_dependent_not_fails_the_batch():
    first, second = enqueue("noop").id, enqueue("noop").id
    dependent = enqueue("noop", depends_on=[first, second]).id
    assert job_row(dependent)["waiting_on"] == 2
    write("UPDATE dbqueue_job SET waiting_on = 1 WHERE id = %s", [dependent])
    token, claimed = claim_all()
    assert sorted(job.id for job in claimed) == [first, second]
    # Both dependencies completed in one statement: 1 - 2 stops at 0.
    done = store.complete(get_settings().DATABASE, [(first, token, None), (second, token, None)])
    assert done == {first, second}
    row = job_row(dependent)
    assert (row["state"], row["waiting_on"]) == ("pending", 0)


def test_a_hand_back_of_a_run_whose_attempts_were_written_0_stops_at_0_with_the_others():
    jobs = [job.id for job in enqueue_many([("noop", {}) for _ in range(3)])]
    token, claimed = claim_all()
    assert len(claimed) == 3
    write("UPDATE dbqueue_job SET attempts = 0 WHERE id = %s", [jobs[0]])
    released = store.release(get_settings().DATABASE, [(job_id, token) for job_id in jobs])
    assert released == set(jobs)
    assert [(job_row(j)["state"], job_row(j)["attempts"]) for j in jobs] == [("pending", 0)] * 3


@pytest.mark.parametrize("how", ["snooze", "defer_unknown_type"])
def test_a_run_handed_back_unspent_with_attempts_written_0_stops_at_0(how):
    job = enqueue("noop").id
    token, claimed = claim_all()
    assert [j.id for j in claimed] == [job]
    write("UPDATE dbqueue_job SET attempts = 0 WHERE id = %s", [job])
    database = get_settings().DATABASE
    if how == "snooze":
        ended = store.snooze(database, job_id=job, token=token, delay=1.0, counts=False, limit=5)
    else:
        error = {"class": "LookupError", "message": "x", "traceback": "", "attempt": 0}
        ended = store.defer_unknown_type(
            database, job_id=job, token=token, error=json.loads(json.dumps(error)), delay=1.0,
            grace=3600.0,
        )  # fmt: skip
    assert ended is not None
    assert (job_row(job)["state"], job_row(job)["attempts"]) == ("pending", 0)
