"""Durable steps (ctx.step): a finished step is recorded once and replayed, never run again, on
the job's later runs; a failed one runs again; the record is fenced by the run's lease and goes
with its job under retention. In-process workers against the real database; the kill -9 proof
with real worker processes is tests/acceptance/test_steps_kill.py."""

import datetime
import json
import time

import pytest
from django.db import connection

from django_dbqueue import InvalidArgument, LeaseLost, enqueue, signal_job, store
from django_dbqueue.context import JobContext
from django_dbqueue.steps import MAX_NAME
from tests.testapp.step_jobs import STEPS
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def wait_state(job_id, state, timeout=15):
    wait_until(
        lambda: job_row(job_id)["state"] == state, timeout=timeout, message=f"job {job_id} {state}"
    )
    return job_row(job_id)


def bodies(job_id):
    """``{(step, phase): [attempt, ...]}`` of the job's step bodies."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT step, phase, attempt FROM testapp_step_body WHERE job_id = %s ORDER BY id",
            [job_id],
        )
        out = {}
        for step, phase, attempt in cursor.fetchall():
            out.setdefault((step, phase), []).append(attempt)
        return out


def steps_of(job_id):
    return [(name, n, attempt) for name, n, attempt, _, _ in store.list_steps("default", job_id)]


def test_a_retry_replays_the_finished_steps_and_reruns_the_failed_one(start_worker):
    job_id = enqueue("five-steps", {"fail_in": "ship"}).id
    start_worker()
    row = wait_state(job_id, "done")
    assert row["attempts"] == 2
    # reserve, charge, wait-warehouse finished on attempt 1: replayed, their results kept.
    assert row["result"] == [1, 1, 1, 2, 2]
    got = bodies(job_id)
    for step in ("reserve", "charge", "wait-warehouse"):
        assert got[(step, "start")] == [1] and got[(step, "end")] == [1], step
    assert got[("ship", "start")] == [1, 2] and got[("ship", "end")] == [2]
    assert got[("email", "start")] == [2] and got[("email", "end")] == [2]
    assert steps_of(job_id) == [
        ("reserve", 1, 1),
        ("charge", 1, 1),
        ("wait-warehouse", 1, 1),
        ("ship", 1, 2),
        ("email", 1, 2),
    ]


def test_a_name_called_again_in_one_run_is_a_new_step(start_worker):
    job_id = enqueue("loop-steps", {"items": [1, 2, 3], "fail_after": True}).id
    start_worker()
    row = wait_state(job_id, "done")
    assert (row["attempts"], row["result"]) == (2, [2, 4, 6])
    got = bodies(job_id)
    assert {step: got[(step, "end")] for step in ("item:1", "item:2", "item:3")} == {
        "item:1": [1],
        "item:2": [1],
        "item:3": [1],
    }
    assert steps_of(job_id) == [("item", 1, 1), ("item", 2, 1), ("item", 3, 1)]


def test_async_steps_replay_their_json_results(start_worker):
    job_id = enqueue("async-steps", {}).id
    start_worker()
    row = wait_state(job_id, "done")
    # The same JSON form on the run that ran the step and on the one that replayed it.
    assert (row["attempts"], row["result"]) == (2, [42, {"list": [1, 2]}])
    assert [s[:2] for s in steps_of(job_id)] == [("double", 1), ("sync", 1)]


def test_an_atomic_handler_s_step_rolls_back_with_it(start_worker):
    job_id = enqueue("atomic-steps", {}).id
    start_worker()
    row = wait_state(job_id, "done")
    assert row["attempts"] == 2
    # Attempt 1's body rows and its step record rolled back with its transaction.
    assert bodies(job_id) == {("write", "start"): [2], ("write", "end"): [2]}
    assert steps_of(job_id) == [("write", 1, 2)]
    assert row["result"] == {"step": "write", "attempt": 2}


def test_a_step_result_that_is_not_json_sends_the_job_to_the_dead_letters(start_worker):
    from django_dbqueue import job

    @job("step-bad-result")
    def bad(ctx):
        return ctx.step("make-set", lambda: {1, 2})

    job_id = enqueue("step-bad-result", {}).id
    start_worker()
    row = wait_state(job_id, "dead")
    assert row["attempts"] == 1  # found after its effects: not repeated
    assert "step 'make-set'" in row["errors"][-1]["message"]
    assert steps_of(job_id) == []


def _ctx(job_id, token, attempt=1, renewed=0.0):
    """A run's context as a worker makes it; ``renewed``: how many seconds ago its lease was
    last known held (None: never)."""

    class Row:
        pass

    row = Row()
    for name, value in {
        "id": job_id,
        "type": "noop",
        "queue": "default",
        "payload": {},
        "attempt": attempt,
        "max_attempts": 3,
        "lease_seconds": 60.0,
        "idempotency_key": None,
        "priority": 0,
        "created_at": None,
        "wait": 0.0,
        "traceparent": None,
    }.items():
        setattr(row, name, value)
    ctx = JobContext(row, worker_id="test", using="default")
    ctx._token = token
    ctx._renewed = None if renewed is None else time.monotonic() - renewed
    return ctx


def _hold(job_id, token):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'running', lease_token = %s, attempts = 1,"
            " leased_until = now() + interval '1 minute' WHERE id = %s",
            [token, job_id],
        )


def test_a_run_that_lost_its_lease_records_nothing_and_is_told():
    job_id = enqueue("noop", {}).id
    _hold(job_id, 111)
    calls = []
    # Another claim's token, its lease renewed just now as far as it knows: the one window in
    # which a run that lost the job still runs a step (docs/steps.md).
    stale = _ctx(job_id, token=999)
    with pytest.raises(LeaseLost, match="no longer holds the job"):
        stale.step("charge", lambda: calls.append(1) or "ok")
    assert calls == [1]  # it ran (the run did not know), but nothing was recorded
    assert steps_of(job_id) == []
    holder = _ctx(job_id, token=111)
    assert holder.step("charge", lambda: "ok") == "ok"
    assert steps_of(job_id) == [("charge", 1, 1)]
    # A later run of the holder's job replays it without calling the function.
    assert _ctx(job_id, token=111, attempt=2).step("charge", lambda: 1 / 0) == "ok"


def test_a_zombie_run_never_runs_a_step_the_run_that_overtook_it_recorded():
    """A run paused past its lease (no renewal for half a lease) reads the records again,
    fenced, before its next step: it is told it lost the job and runs nothing; the run that took
    the job over replays its own record."""
    job_id = enqueue("noop", {}).id
    _hold(job_id, 1)
    calls = []
    zombie = _ctx(job_id, token=1)
    assert zombie.step("reserve", lambda: calls.append("reserve") or 1) == 1  # loads, records
    # The pause: its lease expires and another run takes the job and records "charge".
    _hold(job_id, 2)
    assert _ctx(job_id, token=2, attempt=2).step("reserve", lambda: 1 / 0) == 1
    assert _ctx(job_id, token=2, attempt=2).step("charge", lambda: "card") == "card"
    zombie._renewed = time.monotonic() - 31  # it wakes: last renewed over half a lease ago
    with pytest.raises(LeaseLost, match="the step was not run"):
        zombie.step("charge", lambda: calls.append("charge") or "again")
    assert calls == ["reserve"]  # "charge" ran once, in the run that holds the job
    assert sorted((n, o) for n, o, _ in steps_of(job_id)) == [("charge", 1), ("reserve", 1)]


def test_a_run_whose_lease_is_in_doubt_but_held_goes_on_and_one_given_up_stops_at_once(
    django_assert_num_queries,
):
    job_id = enqueue("noop", {}).id
    _hold(job_id, 7)
    fresh, slow, unknown = (
        _ctx(job_id, 7),
        _ctx(job_id, 7, renewed=45),
        _ctx(job_id, 7, renewed=None),
    )
    assert fresh.step("a", lambda: "a") == "a"
    with django_assert_num_queries(1):  # renewed just now: the record only, no lease check
        assert fresh.step("b", lambda: "b") == "b"
    assert slow.step("a", lambda: 1 / 0) == "a"  # a recorded step replays, no check needed
    with django_assert_num_queries(2):  # in doubt: the fenced read, then the record
        assert slow.step("c", lambda: "c") == "c"
    assert unknown.step("d", lambda: "d") == "d"  # a child process that heard of no renewal
    gone = _ctx(job_id, 7)
    gone._lease_gone = True  # the heartbeat found it lost, or the watchdog gave it up
    with django_assert_num_queries(1), pytest.raises(LeaseLost, match="not run"):
        gone.step("e", lambda: 1 / 0)  # the first read of the records, no step, no record
    assert sorted(n for n, _, _ in steps_of(job_id)) == ["a", "b", "c", "d"]


def test_a_step_recorded_in_an_open_transaction_keeps_the_job_from_being_taken_over():
    """A step recorded inside transaction.atomic() (or an atomic handler) may still commit
    with the step's writes until the transaction ends: while it is open, the sweeper passes the
    job over even though its lease expired, so no other run can take it and run the step again
    beside it. Once it commits, the job is swept as any other."""
    import psycopg
    from django.db import transaction

    from django_dbqueue.store.leases import RESCUE_EXPIRED
    from tests.integration.test_waits import _params

    job_id = enqueue("noop", {}).id
    _hold(job_id, 1)
    sweep = {"limit": 100, "base": 0.1, "factor": 2.0, "cap": 1.0, "worker": None, "known": "{}"}
    zombie = _ctx(job_id, token=1)
    with psycopg.connect(**_params(), autocommit=True) as sweeper:
        with transaction.atomic():
            assert zombie.step("charge", lambda: "card") == "card"
            # Its worker stalls here: the lease runs out, and the sweeper comes round.
            sweeper.execute(
                "UPDATE dbqueue_job SET leased_until = now() - interval '1 s' WHERE id = %s",
                [job_id],
            )  # a weaker lock than the record's: does not wait for it
            assert sweeper.execute(RESCUE_EXPIRED, sweep).fetchall() == []
            assert job_row(job_id)["state"] == "running"
        # Committed: the record stands, and the expired lease is taken back now.
        assert [row[0] for row in sweeper.execute(RESCUE_EXPIRED, sweep).fetchall()] == [job_id]
    assert [n for n, _, _ in steps_of(job_id)] == ["charge"]
    assert job_row(job_id)["state"] == "pending"


def test_the_heartbeat_renews_a_run_by_its_token_not_by_its_job_id():
    """A worker can hold an old run of a job (token 1, its thread still going) beside a new
    claim of the same job (token 2), after the sweeper took the job back from a stalled worker
    and the same worker claimed it again. The heartbeat renews the new claim only; the old run
    is marked lost, so its next step raises LeaseLost rather than run."""
    import types

    from django_dbqueue.heartbeat import Heartbeat
    from django_dbqueue.inflight import Entry, Inflight

    job_id = enqueue("noop", {}).id
    _hold(job_id, 2)
    old_ctx, new_ctx = _ctx(job_id, token=1, renewed=50), _ctx(job_id, token=2, renewed=50)
    old, new = Entry(old_ctx, 1, None), Entry(new_ctx, 2, None)
    old.started = new.started = time.monotonic()
    inflight = Inflight()
    inflight.add([old, new])
    worker = types.SimpleNamespace(
        inflight=inflight,
        acks=types.SimpleNamespace(pending_keys=lambda: []),
        async_commit=False,
        cancel_requested=lambda ids: None,
    )
    assert Heartbeat(worker).beat_once("default") == (1, 1)
    assert old.lost and old_ctx._lease_gone and not new.lost
    assert time.monotonic() - new_ctx._renewed < 5 and time.monotonic() - old_ctx._renewed > 40
    with pytest.raises(LeaseLost):
        old_ctx.step("charge", lambda: 1 / 0)


def test_bad_step_arguments_are_named_before_anything_runs():
    job_id = enqueue("noop", {}).id
    _hold(job_id, 5)
    ctx = _ctx(job_id, token=5)
    with pytest.raises(InvalidArgument, match="non-empty string"):
        ctx.step("", lambda: 1)
    with pytest.raises(InvalidArgument, match="non-empty string"):
        ctx.step(7, lambda: 1)
    with pytest.raises(InvalidArgument, match=f"at most {MAX_NAME}"):
        ctx.step("x" * (MAX_NAME + 1), lambda: 1)
    with pytest.raises(TypeError, match="must be callable"):
        ctx.step("ok", "not a function")
    assert steps_of(job_id) == []
    # A None result is recorded too, and replayed as None without running.
    assert ctx.step("nothing", lambda: None) is None
    assert _ctx(job_id, token=5).step("nothing", lambda: 1 / 0) is None


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("ship\x00", "contains a NUL character (\\x00)"),
        ("ship\udcff", "contains a lone surrogate ('\\udcff' at index 4)"),
    ],
)
def test_a_name_postgresql_cannot_store_is_named_before_anything_is_written(name, problem):
    """A step, sleep, wait or signal name with a NUL or a lone surrogate (a file name read with
    surrogateescape): an InvalidArgument naming the call and the name, where the database's
    DataError or the driver's UnicodeEncodeError came before."""
    job_id = enqueue("approver", {}).id
    _hold(job_id, 5)
    ctx = _ctx(job_id, token=5)
    calls = {
        "ctx.step()": lambda: ctx.step(name, lambda: 1),
        "ctx.sleep()": lambda: ctx.sleep(name, 60),
        "ctx.sleep_until()": lambda: ctx.sleep_until(
            name, datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
        ),
        "ctx.wait_for_signal()": lambda: ctx.wait_for_signal(name),
        "signal_job()": lambda: signal_job(job_id, name, {"ok": True}),
    }
    for where, call in calls.items():
        with pytest.raises(InvalidArgument) as caught:
            call()
        message = str(caught.value)
        assert message.startswith(f"{where}: the name {name!r} "), message
        assert problem in message, message
    assert steps_of(job_id) == []
    assert scalar("SELECT count(*) FROM dbqueue_signal") == 0
    assert job_row(job_id)["signal_seq"] == 0


def test_retention_and_delete_take_a_job_s_steps_and_signals_with_it(start_worker):
    kept = enqueue("five-steps", {}).id
    pruned = enqueue("five-steps", {}).id
    start_worker()
    wait_state(kept, "done")
    wait_state(pruned, "done")
    assert len(steps_of(pruned)) == len(STEPS)
    from django_dbqueue import signal_job

    signal_job(kept, "late")  # finished: refused, nothing stored
    with connection.cursor() as cursor:  # a signal row as a live job would have kept it
        cursor.execute(
            "INSERT INTO dbqueue_signal (job_id, name, seq, created_at)"
            " VALUES (%s, 'x', 1, now()), (%s, 'x', 1, now())",
            [kept, pruned],
        )
    assert store.delete_finished("default", [pruned]) == {pruned}
    assert scalar("SELECT count(*) FROM dbqueue_step WHERE job_id = %s", [pruned]) == 0
    assert scalar("SELECT count(*) FROM dbqueue_signal WHERE job_id = %s", [pruned]) == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET finished_at = now() - interval '2 days' WHERE id = %s", [kept]
        )
    assert store.prune("default", state="done", age=86400, limit=10) == 1
    assert scalar("SELECT count(*) FROM dbqueue_step WHERE job_id = %s", [kept]) == 0
    assert scalar("SELECT count(*) FROM dbqueue_signal WHERE job_id = %s", [kept]) == 0


def test_list_steps_returns_results_as_json_text(start_worker):
    job_id = enqueue("five-steps", {}).id
    start_worker()
    wait_state(job_id, "done")
    name, n, attempt, finished_at, result = store.list_steps("default", job_id)[0]
    assert (name, n, attempt) == ("reserve", 1, 1) and finished_at is not None
    assert json.loads(result) == {"step": "reserve", "attempt": 1}
