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
- events.py: ``Event`` (published events, docs/events.md)
- steps.py: ``JobStep`` (the finished steps of a job's runs), ``JobSignal`` (signals to jobs)
- fields.py: the PostgreSQL array columns the migrations name as ``django_dbqueue.models.X``

``__all__`` is as before the split; the fields, ``UNIQUE_HELD``, ``CatchUp``, ``ScheduleEntry`` and
the states' constants are importable from here too (``X as X``).
"""

from ..states import FINISHED_STATES as FINISHED_STATES
from ..states import MAX_PRIORITY as MAX_PRIORITY
from ..states import MIN_PRIORITY as MIN_PRIORITY
from ..states import DeliveryState, JobState
from .deliveries import JobDelivery
from .events import Event
from .fields import IdArrayField as IdArrayField
from .fields import TextArrayField as TextArrayField
from .fields import TimestampArrayField as TimestampArrayField
from .flow import Limiter, QueueState
from .jobs import UNIQUE_HELD as UNIQUE_HELD
from .jobs import BackgroundJob, DeadLetter, Dependency
from .rollup import DepthSample, FinishedMinute
from .schedules import CatchUp as CatchUp
from .schedules import ScheduleEntry as ScheduleEntry
from .schedules import ScheduleState
from .steps import JobSignal, JobStep
from .workers import WorkerRecord

__all__ = [
    "BackgroundJob",
    "DeadLetter",
    "DeliveryState",
    "Dependency",
    "DepthSample",
    "Event",
    "FinishedMinute",
    "JobDelivery",
    "JobSignal",
    "JobState",
    "JobStep",
    "Limiter",
    "QueueState",
    "ScheduleState",
    "WorkerRecord",
]
