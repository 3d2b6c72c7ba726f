"""django-dbqueue: a durable background-job queue in the PostgreSQL database Django already uses.

The public API is what ``__all__`` lists; everything else may change between releases.
"""

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
