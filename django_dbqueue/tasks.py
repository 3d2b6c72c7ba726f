"""Django's Tasks framework (``django.tasks``, Django 6.0+) as a front door onto the same queue.

::

    TASKS = {
        "default": {
            "BACKEND": "django_dbqueue.tasks.DBQueueBackend",
            "QUEUES": ["default", "emails"],   # each must also be in DBQUEUE["QUEUES"]
        }
    }

``@task`` functions enqueue rows in ``dbqueue_job`` (type ``django.tasks``) inside the caller's
transaction, exactly like :func:`django_dbqueue.enqueue`, and ``run_jobqueue`` runs them. The row
stores the task's dotted path; a worker runs it only if that path names a ``django.tasks.Task``
bound to a ``DBQueueBackend`` that the worker already knows: one defined in an installed app's
``tasks`` module, which the worker imports at start. Nothing is imported because a row names it;
any other path is dead-lettered with an error and never called.
"""

import django

if django.VERSION < (6, 0):  # pragma: no cover - exercised on Django 5.2 by a subprocess test
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(
        "django_dbqueue.tasks is the backend for Django's Tasks framework (django.tasks), which "
        f"exists from Django 6.0 on; this project runs Django {django.get_version()}. Use "
        "django_dbqueue.job and django_dbqueue.enqueue directly, or upgrade Django."
    )

from ._django_tasks import (  # imported only after the version check
    JOB_TYPE,
    DBQueueBackend,
    DBQueueTask,
    discover_tasks,
    resolve_task,
)

__all__ = ["JOB_TYPE", "DBQueueBackend", "DBQueueTask", "discover_tasks", "resolve_task"]
