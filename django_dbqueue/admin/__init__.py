"""The admin: views over the same store functions the commands and the worker use.

Built for a table of millions of rows: no full ``COUNT(*)`` on a page load (counts are capped),
filter choices come from settings and the registry instead of ``SELECT DISTINCT``, and every
list is ordered along an index. Every action needs its own permission and reports what it did
and what it refused.

One module per page, each registering its model admin:

- jobs.py: ``BackgroundJobAdmin`` (and the queue dashboard, dashboard_page.py; a job's steps,
  job_steps.py: read only, no page of their own)
- dead_letters.py: ``DeadLetterAdmin``
- deliveries.py: ``JobDeliveryAdmin``
- events.py: ``EventAdmin`` (published events, read-only; a job's link to its event)
- queues.py: ``QueueStateAdmin`` (flow control)
- schedules.py: ``ScheduleEntryAdmin`` (periodic jobs)
- workers.py: ``WorkerRecordAdmin`` (the worker registry)

common.py and filters.py hold what the job lists share.
"""

from . import dead_letters, deliveries, events, jobs, queues, schedules, workers

__all__ = ["dead_letters", "deliveries", "events", "jobs", "queues", "schedules", "workers"]
