"""django.tasks on the queue (Django 6+): enqueue in transactions, results, priorities, deferral,
capability flags, signals, and the refusal to run anything but a Task bound to this backend."""

import datetime
import subprocess
import sys

import django
import pytest
from django.db import connection, transaction

from tests.utils import job_row, scalar, wait_until

pytestmark = [
    pytest.mark.skipif(
        django.VERSION < (6, 0),
        reason="django.tasks exists from Django 6.0; the Django 6.1 run of the suite covers it",
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def tasks():
    from tests.testapp import tasks as module

    return module


def test_capability_flags_are_all_true():
    from django.tasks import task_backends

    backend = task_backends["default"]
    assert (
        backend.supports_defer,
        backend.supports_priority,
        backend.supports_get_result,
        backend.supports_async_task,
    ) == (True, True, True, True)


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(tasks):
    with pytest.raises(RuntimeError), transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        assert job_row(int(result.id))["state"] == "pending"
        raise RuntimeError("rollback")
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_enqueue_run_and_get_result_after_success(tasks, start_worker):
    from django.tasks import TaskResultStatus

    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    fetched = tasks.add.get_result(result.id)
    assert (fetched.status, fetched.args, fetched.attempts) == (TaskResultStatus.READY, [2, 3], 0)
    start_worker()
    wait_until(lambda: tasks.add.get_result(result.id).is_finished, message="task finished")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert result.attempts == 1 and result.worker_ids and result.started_at and result.finished_at


def test_wait_for_result_takes_a_task_result(tasks, start_worker, settings):
    from django.tasks import TaskResultStatus

    from django_dbqueue import InvalidArgument, JobFailed, wait_for_result

    settings.DBQUEUE = {**settings.DBQUEUE, "MAX_ATTEMPTS": 1}
    result = tasks.add.enqueue(20, 22)
    failing = tasks.always_fails.enqueue()
    with pytest.raises(TimeoutError, match=rf"job #{result.id} did not finish within 0\.2s"):
        wait_for_result(result, timeout=0.2)  # nothing runs it yet
    start_worker()
    assert wait_for_result(result, timeout=20) == 42
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42
    with pytest.raises(JobFailed) as failed:
        wait_for_result(failing, timeout=20)
    assert failed.value.job_id == int(failing.id)
    other = tasks.immediate_only.enqueue()  # another backend's result: named, not waited for
    with pytest.raises(InvalidArgument, match=r"'immediate'.*not to a DBQueueBackend"):
        wait_for_result(other, timeout=1)


def test_get_result_after_death_has_every_error(tasks, start_worker):
    from django.tasks import TaskResultStatus

    result = tasks.always_fails.using(queue_name="default").enqueue()
    start_worker()
    wait_until(
        lambda: tasks.always_fails.get_result(result.id).is_finished, timeout=15, message="dead"
    )
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 10 == len(result.errors)
    assert all(
        e.exception_class is ValueError and "never works" in e.traceback for e in result.errors
    )
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_attempts_and_context(tasks, start_worker):
    result = tasks.attempts_seen.enqueue(fail_until=3)
    start_worker()
    wait_until(
        lambda: tasks.attempts_seen.get_result(result.id).is_finished, timeout=15, message="done"
    )
    result.refresh()
    assert result.return_value == 3 and result.attempts == 3 and len(result.errors) == 2


def test_max_attempts_passes_through_the_task_class(start_worker):
    from django.tasks import task

    from django_dbqueue.tasks import DBQueueTask

    limited = task(max_attempts=2)(sys.modules["tests.testapp.tasks"].always_fails.func)
    assert isinstance(limited, DBQueueTask) and limited.max_attempts == 2
    result = limited.enqueue()
    assert job_row(int(result.id))["max_attempts"] == 2


def test_priority_and_queue_are_honoured(tasks, start_worker):
    low = tasks.record_order.using(priority=-50).enqueue("low")
    high = tasks.record_order.using(priority=50).enqueue("high")
    shouted = tasks.shout.enqueue("hi")
    assert (job_row(int(shouted.id))["queue"], job_row(int(shouted.id))["priority"]) == (
        "emails",
        10,
    )
    start_worker(concurrency=1)
    wait_until(lambda: tasks.record_order.get_result(low.id).is_finished, message="low done")
    order = [
        r[0] for r in scalar("SELECT array_agg(ARRAY[worker] ORDER BY id) FROM testapp_effect")
    ]
    assert order == ["high", "low"]
    assert tasks.record_order.get_result(high.id).return_value is None


def test_a_copy_made_by_using_does_not_replace_the_known_task(tasks, start_worker):
    from django_dbqueue.tasks import resolve_task

    plain = tasks.add.enqueue(3, 4)
    moved = tasks.add.using(queue_name="emails", priority=7).enqueue(1, 2)  # enqueued last
    known = resolve_task(tasks.add.module_path, "default")
    assert known is tasks.add and known.queue_name == "default"
    assert (job_row(int(moved.id))["queue"], job_row(int(moved.id))["priority"]) == ("emails", 7)
    start_worker()
    for result, value in ((moved, 3), (plain, 7)):
        wait_until(lambda r=result: tasks.add.get_result(r.id).is_finished, message="finished")
        final = tasks.add.get_result(result.id)
        assert final.status.name == "SUCCESSFUL" and final.return_value == value, final.errors
    assert tasks.add.get_result(moved.id).task.queue_name == "emails"


def test_deferral_is_honoured(tasks, start_worker):
    from django.utils import timezone

    later = tasks.add.using(run_after=timezone.now() + datetime.timedelta(hours=1)).enqueue(1, 1)
    soon = tasks.add.using(run_after=timezone.now() + datetime.timedelta(milliseconds=300)).enqueue(
        2, 2
    )
    start_worker()
    wait_until(lambda: tasks.add.get_result(soon.id).is_finished, message="soon done")
    assert not tasks.add.get_result(later.id).is_finished


def test_async_task_runs(tasks, start_worker):
    result = tasks.async_double.enqueue(21)
    start_worker()
    wait_until(lambda: tasks.async_double.get_result(result.id).is_finished, message="async done")
    assert tasks.async_double.get_result(result.id).return_value == 42


def test_aenqueue_and_aget_result(tasks):
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    async def go():
        result = await tasks.add.aenqueue(4, 4)
        fetched = await tasks.add.aget_result(result.id)
        # The thread sync_to_async ran them on keeps its connection: close it.
        await sync_to_async(connections.close_all)()
        return fetched

    fetched = asyncio.run(go())
    assert fetched.args == [4, 4]


def test_signals_started_and_finished(tasks, start_worker):
    from django.tasks.signals import task_finished, task_started

    seen = []
    task_started.connect(
        lambda sender, task_result, **kw: seen.append(("started", task_result.status)),
        weak=False,
        dispatch_uid="s",
    )
    task_finished.connect(
        lambda sender, task_result, **kw: seen.append(("finished", task_result.status)),
        weak=False,
        dispatch_uid="f",
    )
    try:
        result = tasks.add.enqueue(1, 1)
        start_worker()
        wait_until(
            lambda: tasks.add.get_result(result.id).is_finished and len(seen) >= 2,
            message="signals",
        )
    finally:
        task_started.disconnect(dispatch_uid="s")
        task_finished.disconnect(dispatch_uid="f")
    assert seen == [("started", "RUNNING"), ("finished", "SUCCESSFUL")]


@pytest.mark.parametrize(
    "path",
    [
        "os.system",
        "tests.testapp.tasks.immediate_only",
        "tests.testapp.tasks.connection",
        "no.such.module.f",
    ],
)
def test_a_stored_path_that_is_not_a_task_of_this_backend_is_dead_never_called(path, start_worker):
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
               max_attempts, lease_seconds, errors, created_at)
               VALUES ('django.tasks', 'default', %s, 'pending', 0, now(), 0, 5, 60, '[]', now())
               RETURNING id""",
            [f'{{"task": "{path}", "backend": "default", "args": [], "kwargs": {{}}}}'],
        )
        job_id = cursor.fetchone()[0]
    start_worker()
    wait_until(lambda: job_row(job_id)["state"] == "dead", message="dead-lettered")
    row = job_row(job_id)
    assert (
        row["attempts"] == 1
        and "is not a django.tasks Task bound to a DBQueueBackend" in row["errors"][0]["message"]
    )


def insert_task_row(payload_json):
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
               max_attempts, lease_seconds, errors, created_at)
               VALUES ('django.tasks', 'default', %s, 'pending', 0, now(), 0, 5, 60, '[]', now())
               RETURNING id""",
            [payload_json],
        )
        return cursor.fetchone()[0]


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ("[1, 2]", 'its payload must be an object like {"task": '),
        ('"tests.testapp.tasks.add"', "got str 'tests.testapp.tasks.add'"),
        ("5", "got int 5"),
        ("null", "got NoneType None"),
        ('{"args": []}', "its payload has no 'task'"),
        ('{"task": 5}', "its payload['task'] must be a str, got int 5"),
        ('{"task": "tests.testapp.tasks.add", "args": {"a": 1}}', "payload['args'] must be a list"),
        ('{"task": "tests.testapp.tasks.add", "kwargs": [1]}', "payload['kwargs'] must be a JSON"),
        ('{"task": "tests.testapp.tasks.add", "backend": ["default"]}', "payload['backend'] must"),
    ],
)
def test_a_row_whose_payload_is_not_a_tasks_payload_is_dead_at_once_saying_why(
    payload, fragment, start_worker
):
    from django.tasks import task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist

    job_id = insert_task_row(payload)
    start_worker()
    wait_until(lambda: job_row(job_id)["state"] == "dead", message="dead-lettered")
    row = job_row(job_id)
    assert row["attempts"] == 1, row["errors"]  # not retried: every attempt would fail alike
    assert row["errors"][0]["class"] == "django_dbqueue.exceptions.DiscardJob"
    message = row["errors"][0]["message"]
    assert f"job {job_id} is not a django.tasks job that DBQueueBackend enqueued" in message
    assert fragment in message and "it was not run" in message
    with pytest.raises(TaskResultDoesNotExist):  # not an AttributeError from the bad row
        task_backends["default"].get_result(str(job_id))


def test_unknown_result_id():
    from django.tasks import task_backends
    from django.tasks.exceptions import TaskResultDoesNotExist

    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("999999")
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("not-a-number")
    for outside_bigint in (str(2**63), "0", "-1", "9" * 5000):  # not a DataError
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(outside_bigint)


def test_backend_check_names_queues_missing_from_dbqueue(settings):
    from django.tasks import task_backends

    settings.TASKS = {
        "default": {
            "BACKEND": "django_dbqueue.tasks.DBQueueBackend",
            "QUEUES": ["default", "reports"],
        }
    }
    errors = task_backends["default"].check()
    assert [e.id for e in errors] == ["dbqueue.E009"] and "'reports'" in errors[0].msg


def test_django_5_explains_it_needs_django_6():
    """Run on 6.x too: the message is checked by faking the version in a subprocess."""
    code = (
        "import django; django.VERSION = (5, 2, 0, 'final', 0); django.get_version = lambda: '5.2';"
        "import django_dbqueue.tasks"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert "exists from Django 6.0 on; this project runs Django 5.2" in out.stderr
