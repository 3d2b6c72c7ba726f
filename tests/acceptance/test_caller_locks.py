"""Nothing a caller's transaction does to our rows stops a worker's heartbeat, claims or
completions for its other jobs (docs/concepts/worker.md#callers-transactions), with real
``run_jobqueue`` processes.

Each test runs four long jobs on one worker (``worker1``, five threads, queues default and
emails) and starts a second one (``worker2``, queue default) that would take them back and run
them again if their leases lapsed. Then a caller's transaction, on a thread of the test, takes a lock on a row of
ours and holds it for more than two leases:

- an ORM ``select_for_update()`` of a running job;
- ``signal_job()``, ``cancel()`` or a workflow insert on a running job, followed by
  ``SET CONSTRAINTS ALL IMMEDIATE`` (Django's ``connection.check_constraints()``), which runs
  their deferred triggers, and with them the write to the running job's row, at once;
- the admin's requeue action, left open (``ATOMIC_REQUESTS``, a slow page), on a dead
  dependency of a workflow: its trigger holds a dependent that a running job's completion
  must count down.

While it holds, the worker's other jobs keep their leases (``leased_until`` moves on past the
two leases), a job only worker1 serves is claimed and run, and the others complete. After the
caller commits, the held job ends as it should. Every handler ran exactly once (one effect row
per job)."""

import datetime
import threading

import pytest
from django.contrib.admin.sites import site
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.fallback import FallbackStorage
from django.db import connection, connections, transaction
from django.test import RequestFactory

from django_dbqueue import cancel, enqueue, signal_job, workflow
from django_dbqueue.models import BackgroundJob
from tests.acceptance.helpers import effects, rows, states, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
LEASE = FAST_DBQUEUE["LEASE"]


@pytest.fixture(autouse=True)
def fast_leases(settings):
    settings.DBQUEUE = FAST_DBQUEUE  # leases are fixed at enqueue time


class Caller(threading.Thread):
    """``action()`` on a thread with a Django connection of its own, inside ``atomic()``; the
    transaction stays open until ``commit()``."""

    def __init__(self, action):
        super().__init__(daemon=True)
        self.action = action
        self.ran, self.go = threading.Event(), threading.Event()
        self.error = None
        self.start()
        assert self.ran.wait(30), "the caller's action did not run"
        if self.error is not None:
            raise self.error

    def run(self):
        try:
            with transaction.atomic():
                self.action()
                self.ran.set()
                self.go.wait(120)
        except BaseException as exc:  # re-raised by the test's thread
            self.error = exc
            self.ran.set()
        finally:
            connections["default"].close()

    def commit(self):
        self.go.set()
        self.join(30)
        assert not self.is_alive(), "the caller did not commit"
        if self.error is not None:
            raise self.error


def slow(flag, **options):
    """A job that records its run and waits until ``flag`` exists (at most 120 s)."""
    return enqueue("slow-record", {"seconds": 120, "until_file": str(flag)}, **options).id


def now():
    return rows("SELECT now()")[0][0]


def renewed_past(job_ids, moment):
    """Whether every one of ``job_ids`` is still running under its lease with ``leased_until``
    past ``moment``; fails at once when one was taken back or ended meanwhile."""
    found = rows(
        "SELECT id, state, worker_id, leased_until FROM dbqueue_job WHERE id = ANY(%s)", [job_ids]
    )
    lapsed = [row for row in found if row[1] != "running"]
    assert not lapsed, f"taken from worker1 while the caller held its lock: {lapsed}"
    return all(leased_until > moment for *_, leased_until in found)


def ran_once(job_ids):
    ran = sorted(job_id for job_id, *_ in effects(job_ids))
    return ran == sorted(job_ids)


def live_workers():
    return rows("SELECT count(*) FROM dbqueue_worker WHERE stale_at > now()")[0][0]


def run_while_held(start_worker, tmp_path, target, hold):
    """The scene of every test: ``target`` and three other long jobs run on worker1, worker2
    idles beside it; ``hold()`` (the caller's action) runs in a transaction left open for more
    than two leases. Returns ``(caller, others, worker1, worker2)`` with the caller still
    holding and the others done."""
    others_flag = tmp_path / "others"
    others = [slow(others_flag) for _ in range(3)]
    worker1 = start_worker("--concurrency", "5", "--queues", "default,emails", settings=FAST)
    wait_until(
        lambda: states([target, *others])["running"] == 4 and ran_once([target, *others]),
        timeout=30,
        message="the four jobs running on worker1",
    )
    worker2 = start_worker("--concurrency", "4", "--queues", "default", settings=FAST)
    wait_until(lambda: live_workers() == 2, timeout=30, message="worker2 in the registry")

    caller = Caller(hold)
    held_from = now()
    # The others' leases go on being renewed: past two leases from the moment the caller took
    # the lock, while it still holds it (it used to stop every renewal of the worker's: the
    # leases lapsed and worker2 took the jobs back and ran them again).
    wait_until(
        lambda: renewed_past(others, held_from + 2 * _seconds(LEASE)),
        timeout=4 * LEASE,
        message="the other jobs' leases renewed past two leases while the caller holds",
    )
    assert caller.is_alive()
    # Claims go on: a job of a queue that only worker1 serves.
    claimed = enqueue("record", queue="emails").id
    wait_all_in_state([claimed], "done", timeout=3 * LEASE)
    # Completions go on.
    others_flag.touch()
    wait_all_in_state(others, "done", timeout=3 * LEASE)
    assert caller.is_alive()
    assert ran_once([*others, claimed])
    return caller, others, worker1, worker2


def _seconds(value):
    return datetime.timedelta(seconds=value)


def finish(target, flag, end, worker1, worker2):
    flag.touch()
    wait_all_in_state([target], end, timeout=6 * LEASE)
    assert ran_once([target]), effects([target])
    assert job_row(target)["attempts"] == 1
    for worker in (worker1, worker2):
        worker.assert_alive()
        assert "swept job=" not in worker.stderr(), worker.output()


def test_an_orm_select_for_update_of_a_running_job(start_worker, tmp_path):
    flag = tmp_path / "target"
    target = slow(flag)
    caller, *_, worker1, worker2 = run_while_held(
        start_worker,
        tmp_path,
        target,
        lambda: BackgroundJob.objects.select_for_update().get(pk=target),
    )
    caller.commit()
    finish(target, flag, "done", worker1, worker2)


def test_a_signal_whose_trigger_ran_at_set_constraints(start_worker, tmp_path):
    flag = tmp_path / "target"
    target = slow(flag)

    def hold():
        signal_job(target, "poke", {"n": 1})
        connection.check_constraints()  # SET CONSTRAINTS ALL IMMEDIATE: the trigger runs now

    caller, *_, worker1, worker2 = run_while_held(start_worker, tmp_path, target, hold)
    caller.commit()
    assert job_row(target)["signal_seq"] == 1
    finish(target, flag, "done", worker1, worker2)


def test_a_cancel_whose_trigger_ran_at_set_constraints(start_worker, tmp_path):
    flag = tmp_path / "target"
    target = slow(flag)

    def hold():
        assert cancel(target) == {target: "cancelling"}
        connection.check_constraints()

    caller, *_, worker1, worker2 = run_while_held(start_worker, tmp_path, target, hold)
    caller.commit()
    finish(target, flag, "cancelled", worker1, worker2)


def test_a_workflow_insert_on_a_running_job_whose_trigger_ran_at_set_constraints(
    start_worker, tmp_path
):
    flag = tmp_path / "target"
    target = slow(flag)
    added = []

    def hold():
        added.append(enqueue("record", {"after": target}, depends_on=[target]).id)
        connection.check_constraints()  # the link's trigger appends to the running row now

    caller, *_, worker1, worker2 = run_while_held(start_worker, tmp_path, target, hold)
    caller.commit()
    finish(target, flag, "done", worker1, worker2)
    wait_all_in_state(added, "done", timeout=3 * LEASE)  # released by the completion
    assert ran_once(added)


def test_an_open_admin_requeue_holding_a_dependent_of_a_running_job(start_worker, tmp_path):
    """The admin requeues a dead dependency of a workflow in a transaction left open: the
    workflow trigger locks the dependent it brings back to waiting. A running job of the same
    dependent finishes meanwhile; its completion, which must count that dependent down, is put
    off (not waited for) until the admin's transaction ends, and then written: once."""
    flag = tmp_path / "target"
    wf = workflow()
    target = wf.add("slow-record", {"seconds": 120, "until_file": str(flag)})
    dead = wf.add("discard", {}, queue="emails")
    wf.add("record", {"d": 1}, depends_on=[target, dead], on_failure="run")
    target, dead, dependent = (job.id for job in wf.enqueue())
    admin_user = get_user_model().objects.create_superuser("boss", "boss@example.com", "pw")
    model_admin = site._registry[BackgroundJob]

    def hold():
        request = RequestFactory().post("/admin/django_dbqueue/backgroundjob/")
        request.user = admin_user
        request.session = {}
        request._messages = FallbackStorage(request)
        model_admin.requeue(request, BackgroundJob.objects.filter(pk=dead))
        flag.touch()  # the running job finishes while the admin's transaction is open

    # The dependency dies first, on a worker of its own that runs nothing else.
    assert start_worker("--burst", "--queues", "emails", settings=FAST).wait_exit(60) == 0
    assert job_row(dead)["state"] == "dead" and job_row(dependent)["state"] == "waiting"
    caller, _, worker1, worker2 = run_while_held(start_worker, tmp_path, target, hold)
    assert job_row(target)["state"] == "running"  # its completion waits for the admin
    caller.commit()
    finish(target, flag, "done", worker1, worker2)
    wait_all_in_state([dependent], "done", timeout=6 * LEASE)  # counted down, never lost
