"""The tables, one module per concept; every name is importable from ``django_dbqueue.models``.

The state machine's invariants live in the models as CHECK constraints, so that no code path
(ours, a migration, a person with psql) can leave a row the workers would misread. Indexes are
partial: each one covers only the rows its query can match, so the claim and the sweeper cost
the same with ten finished rows or ten million.

- jobs.py: ``BackgroundJob`` (the queue), ``Dependency`` (workflow edges), ``DeadLetter``
- deliveries.py: ``JobDelivery`` (side-effect records)
- schedules.py: ``ScheduleState``, ``ScheduleEntry`` (periodic jobs)
- flow.py: ``QueueState``, ``Limiter`` (pause, concurrency and rate limits)
- rollup.py: ``DepthSample``, ``FinishedMinute`` (the dashboard's history)
- workers.py: ``WorkerRecord`` (the worker registry)
- fields.py: the PostgreSQL array columns the migrations name as ``django_dbqueue.models.X``
"""

from ..states import FINISHED_STATES, MAX_PRIORITY, MIN_PRIORITY, DeliveryState, JobState
from .deliveries import JobDelivery
from .fields import IdArrayField, TextArrayField, TimestampArrayField
from .flow import Limiter, QueueState
from .jobs import UNIQUE_HELD, BackgroundJob, DeadLetter, Dependency
from .rollup import DepthSample, FinishedMinute
from .schedules import CatchUp, ScheduleEntry, ScheduleState
from .workers import WorkerRecord

__all__ = [
    "BackgroundJob",
    "DeadLetter",
    "DeliveryState",
    "Dependency",
    "DepthSample",
    "FinishedMinute",
    "JobDelivery",
    "JobState",
    "Limiter",
    "QueueState",
    "ScheduleState",
    "WorkerRecord",
]

# Importable here as before the split (the migrations, admin and other modules name them).
_ALSO = (
    FINISHED_STATES,
    MAX_PRIORITY,
    MIN_PRIORITY,
    UNIQUE_HELD,
    CatchUp,
    ScheduleEntry,
    IdArrayField,
    TextArrayField,
    TimestampArrayField,
)
