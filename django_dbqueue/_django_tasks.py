"""The django.tasks backend; imported through django_dbqueue.tasks, which checks the version."""

from dataclasses import dataclass

from django.core.checks import Error
from django.db import ProgrammingError
from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import autodiscover_modules

from . import decoding, registry, schema, store, validation
from .conf import get_settings
from .enqueue import enqueue
from .exceptions import DiscardJob, UnreadableJob

JOB_TYPE = "django.tasks"
MAX_JOB_ID = 2**63 - 1  # dbqueue_job.id is bigint

# Tasks validated by a DBQueueBackend in this process: module path -> Task.
_known_tasks: dict[str, Task] = {}

_STATUS = {
    "waiting": TaskResultStatus.READY,  # a workflow job waiting for its dependencies
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DBQueueTask(Task):
    """A ``Task`` with django-dbqueue's per-task options: ``@task(max_attempts=5)`` (Django 6.1+)."""

    max_attempts: int | None = None


class DBQueueBackend(BaseTaskBackend):
    """``django.tasks`` backend storing tasks as django-dbqueue jobs.

    ``OPTIONS``: ``{"DATABASE": alias}`` (default ``DBQUEUE["DATABASE"]``).
    """

    task_class = DBQueueTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        self.database = self.options.get("DATABASE")

    @property
    def using(self):
        return self.database or get_settings().DATABASE

    def validate_task(self, task):
        super().validate_task(task)
        max_attempts = getattr(task, "max_attempts", None)
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
        ):
            from django.tasks.exceptions import InvalidTask

            raise InvalidTask(f"max_attempts must be an integer >= 1, got {max_attempts!r}")
        if task.run_after is not None:
            from django.tasks.exceptions import InvalidTask

            # A run_after out of Python's range (datetime.max at UTC-14 is year 10000) would be
            # stored, and no page nor result could read the row back.
            validation.timestamp(task.run_after, "run_after", error=InvalidTask)
        known = _known_tasks.get(task.module_path)
        # ``task.using(queue_name=..., priority=...)`` is a copy sharing the function: the task
        # as defined stays the known one (each row applies its own queue and priority to it).
        # A new function under the same path (a module reloaded) replaces it.
        if known is None or known.func is not task.func:
            _known_tasks[task.module_path] = task

    def enqueue(self, task, args, kwargs):
        """Insert the task as a job, in the transaction open on the queue's database."""
        self.validate_task(task)
        payload = {
            "task": task.module_path,
            "backend": self.alias,
            "args": normalize_json(list(args)),
            "kwargs": normalize_json(dict(kwargs)),
        }
        job = enqueue(
            JOB_TYPE,
            payload,
            queue=task.queue_name,
            priority=task.priority,
            run_after=task.run_after,
            max_attempts=getattr(task, "max_attempts", None),
            using=self.using,
        )
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id):
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not 1 <= job_id <= MAX_JOB_ID:  # no such job, and outside bigint: a DataError
            raise TaskResultDoesNotExist(result_id)
        using = self.using
        try:
            row = store.task_result_row(using, job_id, JOB_TYPE)
        except ProgrammingError as exc:
            schema.raise_if_unmigrated(exc, using)
            raise
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return _result_from_row(str(job_id), row, self.alias)

    def check(self, **kwargs):
        errors = []
        configured = get_settings().QUEUES
        for queue in sorted(self.queues):
            if queue not in configured:
                errors.append(
                    Error(
                        f"TASKS[{self.alias!r}] lists queue {queue!r}, which is not in DBQUEUE['QUEUES'].",
                        hint=f"Add {queue!r} to DBQUEUE['QUEUES']; no worker would claim its tasks.",
                        id="dbqueue.E009",
                    )
                )
        return errors


def _error_path(name):
    """Our error classes are short for builtins; TaskError wants an importable path."""
    if name == "LeaseExpired":
        return "django_dbqueue.exceptions.LeaseExpired"
    return name if "." in name else f"builtins.{name}"


def _loads(text, job_id, column):
    """A column of a task's job row decoded (None for NULL); for a value Python cannot read
    back (a row written by hand), UnreadableJob naming the job and the column, not a bare
    ValueError or RecursionError from json."""
    try:
        return decoding.json_value(text, column)
    except UnreadableJob as exc:
        raise UnreadableJob(f"job #{job_id} {column}", exc.reason) from None


# What DBQueueBackend.enqueue() stores: {"task": path, "backend": alias, "args": [...],
# "kwargs": {...}}. A row written otherwise (by hand, by a script) may hold anything.
_PAYLOAD_SHAPE = {"task": str, "backend": str, "args": list, "kwargs": dict}


def payload_problem(payload):
    """What keeps ``payload`` from being a django.tasks job's payload, or ``None``."""
    if type(payload) is not dict:
        return (
            'its payload must be an object like {"task": "app.tasks.f", "backend": '
            f'"default", "args": [], "kwargs": {{}}}}, got {type(payload).__name__} '
            f"{validation.shown(payload)}"
        )
    if "task" not in payload:
        return "its payload has no 'task' (the module path of the @task function)"
    for key, kind in _PAYLOAD_SHAPE.items():
        if key in payload and type(payload[key]) is not kind:
            return (
                f"its payload[{key!r}] must be a {'JSON object' if kind is dict else kind.__name__}"
                f", got {type(payload[key]).__name__} {validation.shown(payload[key])}"
            )
    return None


def _result_from_row(result_id, row, alias, *, task=None):
    (
        payload,
        state,
        created,
        started,
        finished,
        errors,
        value,
        worker,
        priority,
        queue,
    ) = row
    payload = _loads(payload, result_id, "payload")
    errors = _loads(errors, result_id, "errors") or []
    if payload_problem(payload) is not None:
        raise TaskResultDoesNotExist(result_id)  # not a task's row: nothing Django can show
    if task is None:
        task = resolve_task(payload.get("task", ""), alias)
        if task is None:
            raise TaskResultDoesNotExist(result_id)
    # One worker id per attempt: failed attempts are in the error history; the running or
    # successful one is the job's current worker.
    worker_ids = [e.get("worker") or "" for e in errors]
    if state in ("running", "done") and worker:
        worker_ids.append(worker)
    result = TaskResult(
        task=task.using(priority=priority, queue_name=queue),
        id=result_id,
        status=_STATUS[state],
        enqueued_at=created,
        started_at=started,
        last_attempted_at=started,
        finished_at=finished,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=alias,
        errors=[
            TaskError(
                exception_class_path=_error_path(e.get("class", "Exception")),
                traceback=e.get("traceback") or e.get("message", ""),
            )
            for e in errors
        ],
        worker_ids=worker_ids,
    )
    if state == "done":
        object.__setattr__(result, "_return_value", _loads(value, result_id, "result"))
    return result


def resolve_task(path, alias):
    """The ``Task`` a stored path names, if this worker knows it as a Task bound to a
    DBQueueBackend under ``alias``; else None.

    Only tasks already known to the process count: those validated by a DBQueueBackend when
    their module was imported (the worker imports every installed app's ``tasks`` module at
    start). Nothing is imported because a row names it.
    """
    task = _known_tasks.get(path) if isinstance(path, str) else None
    if not isinstance(task, Task) or task.backend != alias:
        return None
    if task.backend not in task_backends.settings:
        return None
    if not isinstance(task_backends[task.backend], DBQueueBackend):
        return None
    return task


def discover_tasks():
    """Import the ``tasks`` module of every installed app, registering their ``@task``s."""
    autodiscover_modules("tasks")


@registry.job(JOB_TYPE)
def run_task(ctx):
    """The handler of every ``django.tasks`` job: resolve, signal, call, signal."""
    payload = ctx.payload
    problem = payload_problem(payload)
    if problem is not None:
        # Deterministic: every attempt would fail the same way. Dead at once, saying why.
        raise DiscardJob(
            f"job {ctx.id} is not a django.tasks job that DBQueueBackend enqueued: {problem}; "
            "it was not run and nothing was imported"
        )
    alias = payload.get("backend", "default")
    task = resolve_task(payload.get("task"), alias)
    if task is None:
        raise DiscardJob(
            f"{payload.get('task')!r} is not a django.tasks Task bound to a DBQueueBackend "
            f"(alias {alias!r}) known to this worker; it was not run and nothing was imported. "
            "Define @task functions in an installed app's tasks.py (imported at worker start), "
            "bound to that backend."
        )
    backend = task_backends[alias]
    result = backend.get_result(str(ctx.id))
    object.__setattr__(result, "status", TaskResultStatus.RUNNING)
    task_started.send(type(backend), task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        value = normalize_json(value)
    except BaseException:
        final = ctx.is_last_attempt
        object.__setattr__(
            result, "status", TaskResultStatus.FAILED if final else TaskResultStatus.READY
        )
        object.__setattr__(result, "finished_at", timezone.now() if final else None)
        task_finished.send(type(backend), task_result=result)
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(type(backend), task_result=result)
    return value
