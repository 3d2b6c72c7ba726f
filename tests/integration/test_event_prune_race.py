"""The sweeper's prune of events against ``replay_event()`` and a repeated ``publish()``, each
race held open with real sessions at the exact point, in both orders (docs/events.md,
"Retention").

The prune deletes an event that no job refers to. In READ COMMITTED one statement reads the
jobs with the snapshot it took when it began, also after it locked the event: a replay that
committed its job in between would leave a job whose event is gone (there is no foreign key).
The test holds the prune right after its snapshot with a ``now()`` that waits for an advisory
lock the test holds (the prune's session finds it first on its search_path); the statement the
prune runs is the package's own.
"""

import threading

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_dbqueue import EnqueueError, publish, replay_event, store
from django_dbqueue import connections as connections_module
from django_dbqueue.store import events as event_store
from django_dbqueue.sweeper import Sweeper
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

HOLD = 2842801  # the advisory lock that the held now() waits for
HELD_PATH = "dbqueue_racehold, pg_catalog, public"  # the held now() comes first


class Session(threading.Thread):
    """One real session on a connection of its own: runs ``steps`` (callables) in one
    transaction, waiting for :meth:`proceed` after each but the last, and with ``hold`` after
    the last one too, before it commits. ``result`` is the last step's, ``error`` what raised."""

    def __init__(self, *steps, hold=False, search_path=None):
        super().__init__(daemon=True)
        self.steps, self.hold, self.search_path = steps, hold, search_path
        self.pid, self.result, self.error = None, None, None
        self.started, self.worked = threading.Event(), threading.Event()
        self.go = [threading.Event() for _ in steps]

    def run(self):
        try:
            with connection.cursor() as cursor:
                if self.search_path:
                    cursor.execute(f"SET search_path = {self.search_path}")
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            self.started.set()
            with transaction.atomic():
                for number, step in enumerate(self.steps, 1):
                    self.result = step()
                    self.worked.set()
                    if number < len(self.steps) or self.hold:
                        assert self.go[number - 1].wait(30), "the test never let it go on"
                        self.worked.clear()
        except Exception as exc:  # read by the test
            self.error = exc
        finally:
            self.worked.set()
            connections.close_all()

    def proceed(self):
        """Let the session go on from the step it waits after; wait for its next one."""
        self.go[next(i for i, go in enumerate(self.go) if not go.is_set())].set()

    def commit(self):
        self.proceed()
        self.join(30)
        assert not self.is_alive(), "the session did not end"


def start(session):
    session.start()
    assert session.started.wait(30)
    return session


def waits_on(session, locktype):
    return scalar(
        "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted AND locktype = %s",
        [session.pid, locktype],
    )


def wait_for_row_lock(session, what):
    wait_until(
        lambda: scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [session.pid],
        ),
        message=what,
    )


@pytest.fixture
def held_now():
    """A schema whose ``now()`` first waits for the advisory lock HOLD, which the test takes."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE SCHEMA dbqueue_racehold")
        cursor.execute(
            "CREATE FUNCTION dbqueue_racehold.now() RETURNS timestamptz VOLATILE LANGUAGE plpgsql "
            f"AS $$ BEGIN PERFORM pg_advisory_xact_lock_shared({HOLD}); "
            "RETURN pg_catalog.now(); END $$"
        )
        cursor.execute("SELECT pg_advisory_lock(%s)", [HOLD])
    yield
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock_all()")
        cursor.execute("DROP SCHEMA dbqueue_racehold CASCADE")


def release_held_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [HOLD])


def old_event(key=None):
    """An event published two minutes ago that no job refers to: the prune's to take."""
    event = publish("test.nobody.listens", {"n": 1}, idempotency_key=key)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_event SET published_at = now() - interval '2 minutes' WHERE id = %s",
            [event.id],
        )
    return event


def prune():
    return store.prune_events("default", age=60, limit=100)


def events():
    return scalar("SELECT count(*) FROM dbqueue_event")


def dangling_jobs():
    return scalar(
        "SELECT count(*) FROM dbqueue_job AS j WHERE j.event_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM dbqueue_event AS e WHERE e.id = j.event_id)"
    )


def test_a_replay_that_commits_while_the_prune_runs_keeps_its_event(held_now):
    """The replay's transaction is open (event locked, job inserted); the prune starts and is
    held right after its snapshot; the replay commits; the prune goes on. Its snapshot does not
    see the job, but the event must stay: the job refers to it."""
    event = old_event()
    replay = start(Session(lambda: replay_event(event.id, ["late-subscriber"]), hold=True))
    assert replay.worked.wait(30) and replay.error is None
    pruning = start(Session(prune, search_path=HELD_PATH))
    wait_until(
        lambda: waits_on(pruning, "advisory"), message="the prune to hold after its snapshot"
    )
    replay.commit()
    release_held_now()
    pruning.join(30)
    assert pruning.error is None, pruning.error
    assert replay.error is None and [j.type for j in replay.result] == ["late-subscriber"]
    assert pruning.result == 0
    assert events() == 1 and dangling_jobs() == 0


def test_a_replay_held_open_makes_the_prune_skip_its_event():
    """The replay's transaction is open when the prune reaches the event: the prune skips it
    (SKIP LOCKED) without waiting; the replay commits its job."""
    event = old_event()
    replay = start(Session(lambda: replay_event(event.id, ["late-subscriber"]), hold=True))
    assert replay.worked.wait(30) and replay.error is None
    assert prune() == 0
    replay.commit()
    assert replay.error is None and len(replay.result) == 1
    assert events() == 1 and dangling_jobs() == 0


def test_a_prune_that_commits_first_makes_the_replay_fail_clearly():
    """The prune deleted the event and holds its transaction open; the replay waits for the
    event's row; the prune commits: the replay raises an error that names the event, and
    leaves no job."""
    event = old_event()
    pruning = start(Session(prune, hold=True))
    assert pruning.worked.wait(30) and pruning.result == 1
    replay = start(Session(lambda: replay_event(event.id, ["late-subscriber"])))
    wait_for_row_lock(replay, "the replay to wait for the prune's lock on the event")
    pruning.commit()
    replay.join(30)
    assert isinstance(replay.error, EnqueueError)
    assert f"no event has id {event.id} (pruned while it was replayed)" in str(replay.error)
    assert events() == 0 and scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_an_event_a_repeated_publish_returned_stays_until_its_commit():
    """A publish that repeats a key gets the existing event and holds its transaction open;
    the prune skips that event, so the caller may still replay it; once the caller committed,
    the next prune takes it."""
    event = old_event(key="k")

    def publish_and_replay():
        again = publish("test.nobody.listens", {"n": 2}, idempotency_key="k")
        return again, prune_in_between()

    def prune_in_between():
        outside = Session(prune)
        start(outside).join(30)
        assert outside.error is None, outside.error
        return outside.result, replay_event(event.id, ["late-subscriber"])

    caller = start(Session(publish_and_replay))
    caller.join(30)
    assert caller.error is None, caller.error
    again, (pruned, replayed) = caller.result
    assert (again.id, again.created, pruned) == (event.id, False, 0)
    assert [j.type for j in replayed] == ["late-subscriber"]
    assert events() == 1 and dangling_jobs() == 0


def test_a_repeated_publish_after_the_prune_committed_creates_the_event_anew():
    """The prune deleted the keyed event and holds its transaction open; a publish of the key
    waits on the event's index entry; the prune commits: the publish creates a new event."""
    event = old_event(key="k")
    pruning = start(Session(prune, hold=True))
    assert pruning.worked.wait(30) and pruning.result == 1
    publisher = start(
        Session(lambda: publish("test.nobody.listens", {"n": 2}, idempotency_key="k"))
    )
    wait_for_row_lock(publisher, "the publish to wait for the prune's delete")
    pruning.commit()
    publisher.join(30)
    assert publisher.error is None, publisher.error
    assert publisher.result.created and publisher.result.id != event.id
    assert events() == 1


def test_a_repeated_publish_that_read_the_event_as_the_prune_locked_it_creates_it_anew():
    """The prune locked the keyed event (its first statement) and holds its transaction open
    before its delete: a publish of the key finds the event live (ON CONFLICT does not wait),
    then waits to lock it; the prune deletes it and commits: the publish makes a new event,
    where it would otherwise report one that no longer exists."""
    event = old_event(key="k")
    locked = []

    def lock():
        locked.extend(event_store.lock_prunable_events("default", age=60, limit=100))
        return locked

    def delete():
        return event_store.delete_unreferenced_events("default", locked)

    pruning = start(Session(lock, delete))
    assert pruning.worked.wait(30) and locked == [event.id]
    publisher = start(
        Session(lambda: publish("test.nobody.listens", {"n": 2}, idempotency_key="k"))
    )
    wait_for_row_lock(publisher, "the publish to wait for the prune's lock on the event")
    pruning.proceed()
    pruning.join(30)
    assert pruning.error is None and pruning.result == 1
    publisher.join(30)
    assert publisher.error is None, publisher.error
    assert publisher.result.created and publisher.result.id != event.id
    assert events() == 1


def test_a_workers_session_prunes_in_one_transaction_of_its_own(settings):
    """Inside a worker the sweeper runs on its Session (autocommit): the prune's two statements
    take one transaction there, and the Session is back in autocommit afterwards."""
    settings.DBQUEUE = {**settings.DBQUEUE, "DONE_RETENTION": 60}
    old_event()
    session = connections_module.Session("default")
    try:
        assert Sweeper(db=session).prune_events() == 1
        assert session.connection().autocommit and events() == 0
        idle = psycopg.pq.TransactionStatus.IDLE  # committed, not left in a transaction
        assert session.connection().info.transaction_status == idle
    finally:
        session.reset()


def test_two_repeated_publishes_that_replay_their_event_take_turns():
    """Two transactions repeat a key (each locks the event FOR KEY SHARE) and then each replays
    the event: the replays take turns (the second waits for the first's commit and makes
    nothing new) instead of each waiting for the other's share lock (a deadlock)."""
    event = old_event(key="k")

    def again():
        return publish("test.nobody.listens", {"n": 2}, idempotency_key="k")

    def replay():
        return replay_event(event.id, ["late-subscriber"])

    first, second = start(Session(again, replay)), start(Session(again, replay))
    assert first.worked.wait(30) and second.worked.wait(30)
    assert first.result.id == second.result.id == event.id
    first.proceed()
    wait_until(
        lambda: not first.is_alive() or waits_on(first, "transactionid"),
        message="the first replay to end or wait",
    )
    second.proceed()
    first.join(30)
    second.join(30)
    assert (first.error, second.error) == (None, None), (first.error, second.error)
    assert sorted(len(s.result) for s in (first, second)) == [0, 1]
    assert events() == 1 and dangling_jobs() == 0
