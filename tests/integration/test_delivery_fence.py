"""A delivery's settle is fenced by the recording it settles: attempt numbers repeat after a
requeue, so (job, attempt) cannot tell a stale run from the requeued job's new run of the same
attempt (docs/deliveries.md)."""

import threading

import pytest
from django.db import connection, connections, transaction

from django_dbqueue import enqueue, store
from django_dbqueue.connections import close_side_connections
from django_dbqueue.context import JobContext
from django_dbqueue.deliveries import begin_delivery, settle_delivery

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _close_side_connections():
    yield
    close_side_connections()


def delivery(key):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, provider_reference, error, job_id, attempt FROM dbqueue_delivery "
            "WHERE key = %s",
            [key],
        )
        return cursor.fetchone()


def claim(worker):
    """Claim the one pending job as ``worker`` would: the run's context."""
    token = store.new_token()
    (row,) = store.claim(
        "default", worker_id=worker, queues=["default"], limits=[10], limit=10, token=token
    )
    return JobContext(row, worker_id=worker, using="default")


def lose_lease_and_requeue(job_id):
    """The run's lease expires (its worker hung), the sweeper finds its attempts spent, and an
    operator requeues the dead job: attempts start again at 1."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [job_id],
        )
    swept = store.rescue_expired("default", limit=10, base=0.1, factor=2, cap=1)
    assert [(row[0], row[3]) for row in swept] == [(job_id, "dead")]
    assert store.requeue("default", [job_id]) == {job_id: "default"}


def on_its_own_connection(func):
    """Run ``func`` in a thread of its own: a run of another worker, on its own connection."""
    result = []
    thread = threading.Thread(target=lambda: (result.append(func()), connections.close_all()))
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return result[0]


def test_a_stale_run_cannot_settle_the_record_of_the_requeued_jobs_run_of_the_same_attempt():
    key = "sms:fence"
    job_id = enqueue("noop", max_attempts=1).id
    stale = claim("w-old")
    held = on_its_own_connection(lambda: begin_delivery(key, ctx=stale))
    assert held.proceed
    # Its worker hangs; a person, seeing it unconfirmed, learns from the provider that it failed.
    assert settle_delivery(key, "failed", error="provider: not delivered")
    lose_lease_and_requeue(job_id)

    fresh = claim("w-new")
    assert (fresh.id, fresh.attempt) == (stale.id, stale.attempt) == (job_id, 1)
    again = begin_delivery(key, ctx=fresh)
    assert again.proceed  # failed -> recorded, now held by the new run
    assert delivery(key) == ("recorded", "", "", job_id, 1)

    # The stale run wakes up and reports its (long lost) send: refused, the new run keeps it.
    assert on_its_own_connection(lambda: held.sent("ref-stale")) is False
    assert delivery(key) == ("recorded", "", "", job_id, 1)
    assert held.state == "recorded"

    assert again.sent("ref-fresh") is True
    assert delivery(key) == ("sent", "ref-fresh", "", job_id, 1)


def test_the_run_that_holds_its_lease_settles_its_record():
    """The other order: the run settles while it still holds the job; the requeue comes later
    and the next run finds the delivery sent."""
    key = "sms:held"
    job_id = enqueue("noop", max_attempts=1).id
    run = claim("w-old")
    held = begin_delivery(key, ctx=run)
    assert held.proceed and held.sent("ref-1") is True
    assert delivery(key) == ("sent", "ref-1", "", job_id, 1)
    lose_lease_and_requeue(job_id)
    after = begin_delivery(key, ctx=claim("w-new"))
    assert not after.proceed and after.is_sent


@pytest.mark.parametrize("use_tz", [True, False])
def test_a_recording_settles_through_another_connection_than_the_one_that_made_it(settings, use_tz):
    """Recorded on the thread's Django connection, settled inside a transaction (on the side
    connection), and the other way round: the recording's stamp reads the same on both."""
    settings.USE_TZ = use_tz
    connections.close_all()  # the next connection is set up for USE_TZ
    job_id = enqueue("noop").id
    run = claim("w-1")
    held = begin_delivery("sms:outside")
    with transaction.atomic():
        assert held.sent("ref-a") is True
        inside = begin_delivery("sms:inside", ctx=run)
    assert inside.sent("ref-b") is True
    assert delivery("sms:outside")[:2] == ("sent", "ref-a")
    assert delivery("sms:inside") == ("sent", "ref-b", "", job_id, 1)
