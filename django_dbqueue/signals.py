"""Signals for alert hooks. Sent by the worker after the job's new state is committed.

All are sent with ``sender`` = the job type name and keyword arguments ``job_id``, ``job_type``,
``queue``, ``attempt`` and ``worker_id``; ``job_failed`` and ``job_dead`` add ``error`` (a dict:
class, message, traceback) and ``job_failed`` adds ``retry_in`` (seconds).
"""

from django.dispatch import Signal

job_succeeded = Signal()
job_failed = Signal()  # the attempt failed and the job will be retried
job_dead = Signal()  # the job is in the dead letters
