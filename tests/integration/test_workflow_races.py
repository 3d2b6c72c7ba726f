"""Workflows whatever the interleaving (docs/workflows.md, "What the promise survives";
migration 0015). Each race is held open at its exact point with real sessions: a row lock the
test holds, or a transaction a thread leaves open, and a thread shown to be waiting (or not) on
a lock by pg_stat_activity. No sleeps.

1. A dependent's count of unsatisfied dependencies is exact whatever the sequence of deaths,
   requeues and completions of an ``on_failure="run"`` dependency.
2. A requeue of a dependency racing a completion, or a death, of another one of the same
   dependent ends with the dependent counted right, whichever commits first.
3. A caller's open transaction after a workflow insert on a running job, or a cancel of one,
   holds no lock on its row: the worker's heartbeat and completion go through at once; the
   write to the running row happens at the caller's COMMIT.
Plus the inputs: ``depends_on`` ids outside bigint, ``group(then=...)`` of no members."""

import threading

import psycopg
import pytest
from django.db import connections, transaction

from django_dbqueue import EnqueueError, cancel, enqueue, group, store, workflow
from django_dbqueue.connections import connection_params
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = ("race-a", "race-b", "race-d", "race-p")


@pytest.fixture(autouse=True)
def _queues_of_their_own(settings):
    """Each job of these tests on a queue of its own, so that a claim takes exactly it."""
    settings.DBQUEUE = {
        **settings.DBQUEUE,
        "QUEUES": {**settings.DBQUEUE["QUEUES"], **{queue: {} for queue in QUEUES}},
    }


ERROR = {"attempt": 1, "class": "ValueError", "message": "boom", "traceback": "", "worker": "w"}


def run(job_id):
    """Claim this job (each job of these tests has a queue of its own); returns its token."""
    queue = job_row(job_id)["queue"]
    token = store.new_token()
    rows = store.claim("default", worker_id="t", queues=[queue], limits=[1], limit=1, token=token)
    assert [row.id for row in rows] == [job_id]
    return token


def complete(job_id, token):
    assert store.complete("default", [(job_id, token, None)]) == {job_id}


def die(job_id, token):
    assert store.fail("default", job_id=job_id, token=token, error=ERROR, delay=0, dead=True)


def counted(job_id):
    row = job_row(job_id)
    return row["state"], row["waiting_on"]


def graph(on_failure):
    """a and b on queues of their own; d waits for both."""
    wf = workflow()
    a = wf.add("echo", {"a": 1}, queue="race-a")
    b = wf.add("echo", {"b": 1}, queue="race-b")
    wf.add("echo", {"d": 1}, depends_on=[a, b], on_failure=on_failure, queue="race-d")
    return [job.id for job in wf.enqueue()]


class Held:
    """A plain connection that holds a transaction open: ``lock(id)`` takes a job's row lock
    as a writer would; ``release()`` rolls back."""

    def __init__(self):
        self.conn = psycopg.connect(**connection_params("default"))

    def lock(self, job_id):
        self.conn.execute("SELECT 1 FROM dbqueue_job WHERE id = %s FOR NO KEY UPDATE", [job_id])

    def release(self):
        self.conn.rollback()
        self.conn.close()


class Session(threading.Thread):
    """``func`` on a thread with a Django connection of its own, inside ``atomic()`` when
    ``hold``: after ``func`` returns it sets ``ran`` and keeps the transaction open until
    ``commit()``. ``waits_on_lock()``: its backend is waiting for a lock right now."""

    def __init__(self, func, *, hold=False):
        super().__init__(daemon=True)
        self.func, self.hold = func, hold
        self.ran, self.go, self.done = threading.Event(), threading.Event(), threading.Event()
        self.pid = None
        self.result = self.error = None
        self.start()
        wait_until(lambda: self.pid is not None, message="the session's backend")

    def run(self):
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                self.pid = cursor.fetchone()[0]
            if self.hold:
                with transaction.atomic():
                    self.result = self.func()
                    self.ran.set()
                    self.go.wait(30)
            else:
                self.result = self.func()
                self.ran.set()
        except BaseException as exc:  # re-raised by finish()
            self.error = exc
        finally:
            self.done.set()
            connections["default"].close()

    def waits_on_lock(self):
        return scalar(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [self.pid],
        )

    def ran_or_blocked(self):
        """Wait until it has run, or is stuck on a lock; True when it ran."""
        wait_until(
            lambda: self.ran.is_set() or self.done.is_set() or self.waits_on_lock(),
            message="the session ran or waits for a lock",
        )
        return self.ran.is_set()

    def commit(self):
        self.go.set()

    def finish(self):
        self.go.set()
        self.join(30)
        assert not self.is_alive(), "the session did not finish"
        if self.error is not None:
            raise self.error
        return self.result


# 1. The count is exact whatever the sequence --------------------------------------------------


def test_run_on_failure_dependency_dead_requeued_then_done_is_counted_once():
    a, b, d = graph("run")
    die(a, run(a))
    assert counted(d) == ("waiting", 1)  # a finished (dead): only b is left
    store.requeue("default", [a])
    assert counted(d) == ("waiting", 2)  # a is back: it counts again
    complete(a, run(a))
    assert counted(d) == ("waiting", 1)  # b never ran: d must not
    complete(b, run(b))
    assert counted(d) == ("pending", 0)


def test_run_on_failure_dependency_dying_twice_after_a_requeue_is_counted_once():
    a, b, d = graph("run")
    die(a, run(a))
    store.requeue("default", [a])
    die(a, run(a))
    assert counted(d) == ("waiting", 1)
    store.requeue("default", [a])  # the bulk requeue of dead letters, again
    store.requeue("default", [a])  # (a requeue of a pending job changes nothing)
    assert counted(d) == ("waiting", 2)
    die(b, run(b))
    die(a, run(a))
    assert counted(d) == ("pending", 0)  # both finished, one way or the other


def test_cancelled_dependency_of_a_run_on_failure_dependent_requeued_counts_again():
    a, b, d = graph("run")
    assert store.cancel("default", [a]) == {a}
    assert counted(d) == ("waiting", 1)
    store.requeue("default", [a])
    assert counted(d) == ("waiting", 2)
    complete(a, run(a))
    complete(b, run(b))
    assert counted(d) == ("pending", 0)


# 2. A requeue racing a completion or a death of another dependency ---------------------------


def _b_dead_d_cancelled():
    a, b, d = graph("cancel")
    token_a = run(a)
    die(b, run(b))
    assert counted(d) == ("cancelled", 0)
    return a, b, d, token_a


def _then_b_completes(b, d):
    assert counted(d) == ("waiting", 1)  # a done, b pending again
    complete(b, run(b))
    assert counted(d) == ("pending", 0)


def test_requeue_commits_between_a_completions_snapshot_and_its_commit():
    """The completion of a takes its snapshot (d cancelled), then waits for a's row lock; the
    requeue of b brings d back, counting a (running) as not done, and commits; then the
    completion goes on. It must count d down though its snapshot saw d cancelled."""
    a, b, d, token_a = _b_dead_d_cancelled()
    held = Held()
    held.lock(a)
    completion = Session(lambda: complete(a, token_a))
    try:
        assert not completion.ran_or_blocked()  # on a's row, its snapshot taken
        store.requeue("default", [b])
        assert counted(d) == ("waiting", 2)
    finally:
        held.release()
    completion.finish()
    _then_b_completes(b, d)


def test_requeue_waits_for_a_completion_that_saw_its_dependent_cancelled():
    """The completion of a commits after the requeue of b started: the requeue must see it."""
    a, b, d, token_a = _b_dead_d_cancelled()
    completion = Session(lambda: complete(a, token_a), hold=True)
    assert completion.ran_or_blocked()
    requeue = Session(lambda: store.requeue("default", [b]))
    blocked = not requeue.ran_or_blocked()
    completion.finish()
    requeue.finish()
    assert blocked, "the requeue did not wait for the completion holding d"
    _then_b_completes(b, d)


def test_requeue_and_a_death_of_another_dependency_requeue_first():
    """b's requeue brings d back (uncommitted) while a dies: d must end cancelled (a is dead and
    d's policy is cancel), not waiting for a forever."""
    a, b, d, token_a = _b_dead_d_cancelled()
    requeue = Session(lambda: store.requeue("default", [b]), hold=True)
    assert requeue.ran_or_blocked()
    death = Session(lambda: die(a, token_a))
    blocked = not death.ran_or_blocked()
    requeue.finish()
    death.finish()
    assert counted(d) == ("cancelled", 0)
    assert job_row(d)["errors"][-1]["class"] == "DependencyFailed"
    assert blocked, "the death did not wait for the requeue holding d"


def test_requeue_and_a_death_of_another_dependency_death_first():
    a, b, d, token_a = _b_dead_d_cancelled()
    death = Session(lambda: die(a, token_a), hold=True)
    assert death.ran_or_blocked()
    requeue = Session(lambda: store.requeue("default", [b]))
    blocked = not requeue.ran_or_blocked()
    death.finish()
    requeue.finish()
    assert counted(d) == ("cancelled", 0)  # a is dead: b's requeue cannot bring d back
    assert blocked, "the requeue did not wait for the death holding d"


@pytest.mark.parametrize("requeue_first", [True, False])
def test_run_on_failure_requeue_and_a_death_of_another_dependency(requeue_first):
    a, b, d = graph("run")
    token_a = run(a)
    die(b, run(b))
    assert counted(d) == ("waiting", 1)
    requeue_b = lambda: store.requeue("default", [b])  # noqa: E731
    die_a = lambda: die(a, token_a)  # noqa: E731
    first = Session(requeue_b if requeue_first else die_a, hold=True)
    assert first.ran_or_blocked()
    second = Session(die_a if requeue_first else requeue_b)
    blocked = not second.ran_or_blocked()
    first.finish()
    second.finish()
    assert blocked, "the second did not wait for the first holding d"
    if requeue_first:
        assert counted(d) == ("waiting", 1)  # a finished (dead), b pending again
        complete(b, run(b))
    # Else a's death found both finished and released d before b's requeue could see it: a
    # dependent once released stays released (it may be running already).
    assert counted(d) == ("pending", 0)


def test_run_on_failure_requeue_held_open_while_another_dependency_completes():
    """b dead counts as finished for d; b's requeue (uncommitted) counts it again, and a's
    completion meanwhile waits for d's lock, then counts a down from the requeue's count."""
    a, b, d = graph("run")
    token_a = run(a)
    die(b, run(b))
    assert counted(d) == ("waiting", 1)
    requeue = Session(lambda: store.requeue("default", [b]), hold=True)
    assert requeue.ran_or_blocked()
    completion = Session(lambda: complete(a, token_a))
    blocked = not completion.ran_or_blocked()
    requeue.finish()
    completion.finish()
    assert blocked, "the completion did not wait for the requeue holding d"
    assert counted(d) == ("waiting", 1)  # a done, b pending again: d waits for b
    complete(b, run(b))
    assert counted(d) == ("pending", 0)


# 3. A caller's open transaction holds no running job's row -----------------------------------


def _running_job(**options):
    job = enqueue("echo", {}, queue="race-p", **options)
    return job.id, run(job.id)


def _goes_through(func):
    """``func`` (a worker's write to its running job) runs without waiting for a lock."""
    worker = Session(func)
    went = worker.ran_or_blocked()
    return worker, went


def test_workflow_on_a_running_job_leaves_its_worker_free_until_the_callers_commit():
    p, token = _running_job()
    caller = Session(lambda: enqueue("echo", {}, depends_on=[p], queue="race-d"), hold=True)
    assert caller.ran_or_blocked()
    heartbeat, went = _goes_through(lambda: store.extend_leases("default", [(p, token)]))
    try:
        assert went, "the heartbeat waits for the caller's transaction"
        assert heartbeat.finish() == {p: False}
        completion, went = _goes_through(lambda: complete(p, token))
        assert went, "the completion waits for the caller's transaction"
        completion.finish()
    finally:
        dependent = caller.finish()
    # The commit linked it to a job already done: it is pending.
    assert counted(dependent.id) == ("pending", 0)
    assert dependent.id in job_row(p)["dependents"]
    assert scalar("SELECT count(*) FROM dbqueue_link_at_commit") == 0


def test_a_completion_in_flight_at_the_callers_commit_is_seen_by_it():
    """The caller commits while the worker's completion holds the row: the commit waits for
    the completion (a moment), then reads the job done and releases the dependent."""
    p, token = _running_job()
    caller = Session(lambda: enqueue("echo", {}, depends_on=[p], queue="race-d"), hold=True)
    assert caller.ran_or_blocked()
    completion = Session(lambda: complete(p, token), hold=True)
    assert completion.ran_or_blocked()
    caller.commit()
    wait_until(caller.waits_on_lock, message="the caller's commit waits for the completion")
    completion.finish()
    dependent = caller.finish()
    assert counted(dependent.id) == ("pending", 0)


def test_a_completion_after_the_callers_commit_releases_the_dependent():
    p, token = _running_job()
    with transaction.atomic():
        dependent = enqueue("echo", {}, depends_on=[p], queue="race-d")
    assert counted(dependent.id) == ("waiting", 1)
    assert job_row(p)["dependents"] == [dependent.id]
    complete(p, token)
    assert counted(dependent.id) == ("pending", 0)


@pytest.mark.parametrize("on_failure", ["cancel", "run"])
def test_a_dependency_dying_before_the_callers_commit_settles_the_dependent(on_failure):
    p, token = _running_job()
    caller = Session(
        lambda: enqueue("echo", {}, depends_on=[p], on_failure=on_failure, queue="race-d"),
        hold=True,
    )
    assert caller.ran_or_blocked()
    death, went = _goes_through(lambda: die(p, token))
    dependent = caller.finish()
    death.finish()
    assert went
    row = job_row(dependent.id)
    if on_failure == "cancel":
        assert (row["state"], row["errors"][-1]["class"]) == ("cancelled", "DependencyFailed")
        assert f"dependency #{p} (echo) is dead" in row["errors"][-1]["message"]
    else:
        assert counted(dependent.id) == ("pending", 0)


def test_a_workflow_rolled_back_leaves_the_running_job_as_it_was():
    p, _ = _running_job()
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("echo", {}, depends_on=[p])
        raise RuntimeError("the caller's transaction fails")
    assert job_row(p)["dependents"] is None
    assert scalar("SELECT count(*) FROM dbqueue_link_at_commit") == 0


def test_cancel_of_a_running_job_leaves_its_worker_free_until_the_callers_commit():
    p, token = _running_job()
    caller = Session(lambda: cancel(p, by="ops"), hold=True)
    assert caller.ran_or_blocked()
    heartbeat, went = _goes_through(lambda: store.extend_leases("default", [(p, token)]))
    try:
        assert went, "the heartbeat waits for the caller's cancel"
        assert heartbeat.finish() == {p: False}  # not asked for yet: not committed
    finally:
        assert caller.finish() == {p: "cancelling"}
    row = job_row(p)
    assert (row["state"], row["cancelled_by"]) == ("running", "ops")
    assert row["cancel_requested_at"] is not None
    assert store.extend_leases("default", [(p, token)]) == {p: True}
    assert store.complete_ending("default", [(p, token, None)]) == {p: "ops"}
    assert scalar("SELECT count(*) FROM dbqueue_cancel_at_commit") == 0


def test_cancel_of_a_job_that_finishes_before_the_callers_commit_leaves_it_done():
    p, token = _running_job()
    caller = Session(lambda: cancel(p), hold=True)
    assert caller.ran_or_blocked()
    completion, went = _goes_through(lambda: complete(p, token))
    assert caller.finish() == {p: "cancelling"}
    completion.finish()
    assert went
    row = job_row(p)
    assert (row["state"], row["cancel_requested_at"]) == ("done", None)


def test_cancel_of_a_running_job_retried_before_the_callers_commit_cancels_it():
    p, token = _running_job()
    caller = Session(lambda: cancel(p), hold=True)
    assert caller.ran_or_blocked()
    retry, went = _goes_through(
        lambda: store.fail("default", job_id=p, token=token, error=ERROR, delay=0)
    )
    caller.finish()
    assert (went, retry.finish()) == (True, "pending")
    row = job_row(p)
    assert (row["state"], row["cancelled_by"]) == ("cancelled", "api")


# Inputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [2**63, -1, 0, 10**30])
def test_depends_on_an_id_outside_bigint_is_a_named_error_with_nothing_written(bad):
    before = scalar("SELECT count(*) FROM dbqueue_job")
    with pytest.raises(EnqueueError, match=r"is not a job id \(1 to 2\*\*63-1\)"):
        enqueue("echo", {}, depends_on=[bad])
    wf = workflow()
    with pytest.raises(EnqueueError, match="is not a job id"):
        wf.add("echo", depends_on=[bad])
    with pytest.raises(EnqueueError, match="is not a job id"):
        wf.add("echo").after(bad)
    assert scalar("SELECT count(*) FROM dbqueue_job") == before


def test_the_largest_job_id_is_accepted_as_an_unknown_one():
    with pytest.raises(EnqueueError, match=rf"unknown job id\(s\) {2**63 - 1}"):
        enqueue("echo", {}, depends_on=[2**63 - 1])


def test_group_callback_of_no_members_is_refused():
    with pytest.raises(EnqueueError, match=r"group\(then=\.\.\.\) has no members"):
        group(then=("collect", {}))
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0
    assert group() == []
