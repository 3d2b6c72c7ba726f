"""``replay_event()`` never makes a second job of one subscriber for one event (issue 35, part
4): not after retention deleted the subscriber's job, not after a cancel, and not while a
retention prune, a cancel or another replay runs beside it. Each race is held open with two
real sessions at the exact point, in both orders (docs/events.md, "Replay").

The event's ``subscribers`` list is the record of who got a job; the jobs are not (retention
deletes them). Before the fix a replay tested the jobs only: a subscriber whose job retention
had deleted got a second one, and ran again.
"""

import json

import pytest
from django.db import connection

from django_dbqueue import cancel, publish, replay_event, store
from tests.integration.test_event_prune_race import (
    Session,
    dangling_jobs,
    start,
    waits_on,
)
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PAID = "test.invoice.paid"
# The subscribers of PAID (tests/testapp/event_jobs.py), by type name.
A, B, FLAKY = "ledger-on-paid", "email-on-paid", "flaky-on-paid"
C = "late-subscriber"  # subscribes later, through SUBSCRIPTIONS


@pytest.fixture
def c_subscribes(settings):
    """Call it to make C subscribe (after the event was published)."""

    def subscribe():
        settings.DBQUEUE = {**settings.DBQUEUE, "SUBSCRIPTIONS": {PAID: [C]}}

    return subscribe


def job_of(event_id, job_type):
    return scalar(
        "SELECT id FROM dbqueue_job WHERE event_id = %s AND type = %s", [event_id, job_type]
    )


def jobs_made(event_id, job_type):
    """How many jobs of ``job_type`` exist for the event now."""
    return scalar(
        "SELECT count(*) FROM dbqueue_job WHERE event_id = %s AND type = %s", [event_id, job_type]
    )


def finish(job_id, state, age="2 days"):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = %s, attempts = 1, "
            f"finished_at = now() - interval '{age}' WHERE id = %s",
            [state, job_id],
        )


def prune_done():
    """The sweeper's retention of done jobs (DONE_RETENTION of a day)."""
    return store.prune("default", state="done", age=86400, limit=100)


def listed(event_id):
    """The event's ``subscribers`` list."""
    return json.loads(
        scalar("SELECT subscribers::text FROM dbqueue_event WHERE id = %s", [event_id])
    )


def the_issue_s_event():
    """The issue's event: A's job done and deleted by retention, B's job dead (so the event is
    kept), the flaky subscriber's done too."""
    event = publish(PAID, {"invoice_id": 35})
    finish(job_of(event.id, A), "done")
    finish(job_of(event.id, FLAKY), "done")
    finish(job_of(event.id, B), "dead")
    assert prune_done() == 2
    assert jobs_made(event.id, A) == 0 and jobs_made(event.id, B) == 1
    return event


def test_a_replay_after_retention_makes_a_job_for_the_new_subscriber_only(c_subscribes):
    event = the_issue_s_event()
    c_subscribes()
    made = replay_event(event.id)  # every current subscriber: A, B, the flaky one and C
    assert [job.type for job in made] == [C]
    assert jobs_made(event.id, A) == 0, "A's job ran and was pruned: A got its delivery"
    assert sorted(listed(event.id)) == sorted([A, B, FLAKY, C])
    assert replay_event(event.id, [A, C]) == []  # named explicitly: the same


def test_a_replay_after_a_cancelled_job_was_pruned_makes_no_second_job():
    event = publish(PAID, {"invoice_id": 36})
    a_job = job_of(event.id, A)
    assert cancel([a_job]) == {a_job: "cancelled"}
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET finished_at = now() - interval '30 days' WHERE id = %s",
            [a_job],
        )
    assert store.prune("default", state="cancelled", age=7 * 86400, limit=100) == 1
    assert replay_event(event.id, [A]) == []
    assert jobs_made(event.id, A) == 0


def test_a_replay_while_the_prune_of_a_subscribers_job_is_uncommitted(c_subscribes):
    """The prune deleted A's done job and holds its transaction open; the replay runs. Before
    the fix the replay's insert of A's key waited for the prune and, once it committed, made A
    a second job."""
    event = publish(PAID, {"invoice_id": 37})
    c_subscribes()
    finish(job_of(event.id, A), "done")
    pruning = start(Session(prune_done, hold=True))
    assert pruning.worked.wait(30) and pruning.result == 1
    replay = start(Session(lambda: replay_event(event.id)))
    wait_until(
        lambda: not replay.is_alive() or waits_on(replay, "transactionid"),
        message="the replay to end, or to wait for the prune",
    )
    pruning.commit()
    replay.join(30)
    assert (pruning.error, replay.error) == (None, None), (pruning.error, replay.error)
    assert [job.type for job in replay.result] == [C]
    assert jobs_made(event.id, A) == 0 and jobs_made(event.id, C) == 1


def test_a_prune_of_a_subscribers_job_while_a_replay_is_uncommitted(c_subscribes):
    """The other order: the replay holds the event (C's job inserted, not committed); the prune
    deletes A's done job and commits meanwhile; the replay commits. A later replay makes
    nothing: A got its job, C got its job."""
    event = publish(PAID, {"invoice_id": 38})
    c_subscribes()
    finish(job_of(event.id, A), "done")
    replay = start(Session(lambda: replay_event(event.id), hold=True))
    assert replay.worked.wait(30) and replay.error is None
    assert [job.type for job in replay.result] == [C]
    assert prune_done() == 1  # not held back by the replay: it locks the event, not the jobs
    replay.commit()
    assert replay.error is None
    assert replay_event(event.id) == []
    assert jobs_made(event.id, A) == 0 and jobs_made(event.id, C) == 1


@pytest.mark.parametrize("first", ["cancel", "replay"])
def test_a_replay_and_a_cancel_of_a_subscribers_job(c_subscribes, first):
    """A cancel of A's pending job and a replay, each held open while the other runs: A keeps
    its one job (cancelled), C gets one; once the cancelled job is pruned, a replay makes no
    job for A either."""
    event = publish(PAID, {"invoice_id": 39})
    c_subscribes()
    a_job = job_of(event.id, A)
    cancelling = Session(lambda: cancel([a_job]), hold=(first == "cancel"))
    replaying = Session(lambda: replay_event(event.id), hold=(first == "replay"))
    held, other = (cancelling, replaying) if first == "cancel" else (replaying, cancelling)
    start(held)
    assert held.worked.wait(30) and held.error is None
    start(other)
    wait_until(
        lambda: not other.is_alive() or waits_on(other, "transactionid"),
        message="the second session to end, or to wait for the first",
    )
    held.commit()
    other.join(30)
    assert (cancelling.error, replaying.error) == (None, None)
    assert cancelling.result == {a_job: "cancelled"}
    assert [job.type for job in replaying.result] == [C]
    assert jobs_made(event.id, A) == 1 and jobs_made(event.id, C) == 1
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET finished_at = now() - interval '30 days' WHERE id = %s",
            [a_job],
        )
    assert store.prune("default", state="cancelled", age=7 * 86400, limit=100) == 1
    assert replay_event(event.id) == []
    assert jobs_made(event.id, A) == 0


@pytest.mark.parametrize("first_names", [[C], None])
def test_two_replays_take_turns_and_the_second_reads_the_list_the_first_committed(
    c_subscribes, first_names
):
    """Two replays of one event, the first held open after its replay; in its transaction C's
    new job is deleted again (by any path: only the event's list still says C got one). The
    second replay waits for the event's row, then reads the list the first committed and makes
    nothing, though no job of C exists for its key to refuse. ``first_names``: the first names
    C only, or every subscriber (the second names every one)."""
    event = publish(PAID, {"invoice_id": 40})
    c_subscribes()

    def delete_cs_job():
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM dbqueue_job WHERE event_id = %s AND type = %s", [event.id, C]
            )
            return cursor.rowcount

    first = start(Session(lambda: replay_event(event.id, first_names), delete_cs_job, hold=True))
    assert first.worked.wait(30) and first.error is None
    assert [job.type for job in first.result] == [C]
    first.proceed()  # C's job deleted; the first's transaction stays open
    wait_until(lambda: first.result == 1 or first.error, message="the first to delete C's job")
    assert first.error is None
    second = start(Session(lambda: replay_event(event.id)))
    wait_until(lambda: waits_on(second, "transactionid"), message="the second to wait")
    first.commit()
    second.join(30)
    assert (first.error, second.error) == (None, None), (first.error, second.error)
    assert second.result == []
    assert jobs_made(event.id, C) == 0 and C in listed(event.id)
    assert dangling_jobs() == 0
