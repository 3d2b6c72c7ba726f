"""django-dbqueue: a durable background-job queue in the PostgreSQL database Django already uses.

The public API is what ``__all__`` lists; everything else may change between releases.
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING

# Where each name of the API lives. Imported on first use (PEP 562): importing the package, as
# Python does for any of its modules (the pytest plugin, testing/pytest_plugin.py, which every
# pytest run of a project that installs the package loads; the app's config), imports nothing
# of Django, the settings or the store until a name is asked for. ``from django_dbqueue import
# enqueue`` reads the same as ever.
_NAMES = {
    "Backoff": "backoff",
    "Batch": "batches",
    "DBQueueError": "exceptions",
    "Delivery": "deliveries",
    "DeliveryFailed": "deliveries",
    "DiscardJob": "exceptions",
    "EnqueueError": "exceptions",
    "EnqueuedJob": "enqueue",
    "InvalidArgument": "exceptions",
    "JobCancelled": "exceptions",
    "JobContext": "context",
    "JobFailed": "results",
    "JobNotFound": "results",
    "JobRegistrationError": "exceptions",
    "LeaseLost": "exceptions",
    "NotMigrated": "exceptions",
    "PayloadError": "exceptions",
    "PublishedEvent": "events",
    "RetryJob": "exceptions",
    "ScheduleError": "schedule_parser",
    "SignalTimeout": "exceptions",
    "Snooze": "exceptions",
    "UnknownDatabase": "exceptions",
    "UnknownJobType": "exceptions",
    "UnknownQueue": "flow",
    "UnreadableJob": "exceptions",
    "UnsupportedDatabase": "exceptions",
    "Workflow": "workflow",
    "WorkflowJob": "workflow",
    "await_result": "results",
    "begin_delivery": "deliveries",
    "cancel": "cancellation",
    "chain": "workflow",
    "deliver": "deliveries",
    "enqueue": "enqueue",
    "enqueue_many": "enqueue",
    "group": "workflow",
    "job": "registry",
    "pause_queue": "flow",
    "publish": "events",
    "replay_event": "events",
    "resume_queue": "flow",
    "schedule_job": "schedule_entries",
    "settle_delivery": "deliveries",
    "signal_job": "steps",
    "unschedule_job": "schedule_entries",
    "update_schedule": "schedule_entries",
    "wait_for_result": "results",
    "workflow": "workflow",
}
# Names of the API that are also the names of their modules: the import system binds a module,
# once imported, on its package (``django_dbqueue.enqueue``, the module), which would hide the
# function from ``__getattr__``; the function wins, as the eager imports made it before.
_SHADOWED = frozenset(name for name, module in _NAMES.items() if name == module)


def __getattr__(name):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_NAMES})


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return  # the submodule stays in sys.modules; the attribute is the API's function
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

if TYPE_CHECKING:  # what static analysis and editors read
    from .backoff import Backoff
    from .batches import Batch
    from .cancellation import cancel
    from .context import JobContext
    from .deliveries import Delivery, DeliveryFailed, begin_delivery, deliver, settle_delivery
    from .enqueue import EnqueuedJob, enqueue, enqueue_many
    from .events import PublishedEvent, publish, replay_event
    from .exceptions import (
        DBQueueError,
        DiscardJob,
        EnqueueError,
        InvalidArgument,
        JobCancelled,
        JobRegistrationError,
        LeaseLost,
        NotMigrated,
        PayloadError,
        RetryJob,
        SignalTimeout,
        Snooze,
        UnknownDatabase,
        UnknownJobType,
        UnreadableJob,
        UnsupportedDatabase,
    )
    from .flow import UnknownQueue, pause_queue, resume_queue
    from .registry import job
    from .results import JobFailed, JobNotFound, await_result, wait_for_result
    from .schedule_entries import schedule_job, unschedule_job, update_schedule
    from .schedule_parser import ScheduleError
    from .steps import signal_job
    from .workflow import Workflow, WorkflowJob, chain, group, workflow

__version__ = "0.1.0.dev0"

__all__ = [
    "Backoff",
    "Batch",
    "DBQueueError",
    "Delivery",
    "DeliveryFailed",
    "DiscardJob",
    "EnqueueError",
    "EnqueuedJob",
    "InvalidArgument",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobRegistrationError",
    "LeaseLost",
    "NotMigrated",
    "PayloadError",
    "PublishedEvent",
    "RetryJob",
    "ScheduleError",
    "SignalTimeout",
    "Snooze",
    "UnknownDatabase",
    "UnknownJobType",
    "UnknownQueue",
    "UnreadableJob",
    "UnsupportedDatabase",
    "Workflow",
    "WorkflowJob",
    "await_result",
    "begin_delivery",
    "cancel",
    "chain",
    "deliver",
    "enqueue",
    "enqueue_many",
    "group",
    "job",
    "pause_queue",
    "publish",
    "replay_event",
    "resume_queue",
    "schedule_job",
    "settle_delivery",
    "signal_job",
    "unschedule_job",
    "update_schedule",
    "wait_for_result",
    "workflow",
]
