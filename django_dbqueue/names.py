"""The name a person recognises a job by: its type, or for a job sent through ``django.tasks``
(stored under the one type ``django.tasks``, its task's path in the payload) that task's path.

Two flavours, because they answer two questions:

- :func:`label` names a job in what this process counts and logs (the metrics' ``type`` label,
  the worker's log lines and signals): the task's path only when this process already knows
  that task (a ``@task`` validated by a DBQueueBackend when its module was imported; the worker
  imports every installed app's ``tasks`` module at start), else ``django.tasks``. So a metric
  label takes one value per task defined in the code, plus ``django.tasks``: however many
  different paths rows carry, the label's cardinality stays bounded by the code.
- :func:`stored` shows a job to a person (the admin): the path as the row stores it, as text.

Neither ever imports anything: a path that no ``@task`` of this process defines is never looked
up as a module. On Django 5.2 (no ``django.tasks``) both are the type.
"""

import sys

TASKS_TYPE = "django.tasks"
_BACKEND_MODULE = "django_dbqueue._django_tasks"


def task_path(job_type, payload):
    """The task path a ``django.tasks`` job's payload stores, or ``None`` (another type, or no
    string there)."""
    if job_type != TASKS_TYPE or not isinstance(payload, dict):
        return None
    path = payload.get("task")
    return path if isinstance(path, str) and path else None


def known_tasks():
    """The task paths this process knows (sorted); empty when the backend was never imported
    (Django 5.2, or no ``django.tasks`` backend configured)."""
    module = sys.modules.get(_BACKEND_MODULE)
    return sorted(module._known_tasks) if module is not None else []


def is_known(path):
    module = sys.modules.get(_BACKEND_MODULE)
    return module is not None and path in module._known_tasks


def label(job_type, payload):
    """The bounded name of a job (see the module's doc): a known task's path, or the type."""
    path = task_path(job_type, payload)
    return path if path is not None and is_known(path) else job_type


def stored(job_type, payload):
    """The name to show a person: the stored task path of a ``django.tasks`` job, else the
    type. Text only."""
    return task_path(job_type, payload) or job_type
