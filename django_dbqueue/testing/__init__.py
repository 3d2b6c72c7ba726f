"""Helpers for testing a project's own jobs (docs/testing.md).

They work inside Django's ``TestCase`` (in its transaction: nothing is committed), in
``TransactionTestCase`` (in autocommit, as in production) and with pytest-django, whose
fixtures come with the package (``dbqueue``, ``dbqueue_inline``; the ``pytest11`` entry point
loads them).

- :func:`enqueued_jobs`, :func:`assert_enqueued`, :func:`refute_enqueued`: what is in the queue,
  whatever put it there (``enqueue``, ``enqueue_many``, workflows, ``publish``, schedules, the
  Tasks backend), with a payload matched as a subset and a failure that lists what was enqueued
  instead.
- :func:`run_jobs`: run the due jobs in the calling thread through the worker's own claim,
  execution and acknowledgement; time moves by argument (``advance=``, ``now=``).
- :func:`perform_job`: call one handler with a real context; its result or its error.
- :func:`inline`: jobs run at the commit that enqueued them.

No helper starts a thread, a listener or a connection that outlives its call.
"""

import importlib

# Where each name lives. Imported on first use (PEP 562), so that the pytest plugin of this
# package (pytest_plugin.py, loaded by every pytest run of a project that installs the package)
# imports none of the helpers, and nothing that might read the settings, until a test asks.
_NAMES = {
    "Inline": "inline",
    "JobsLeftRunning": "runner",
    "QueuedJob": "enqueued",
    "Ran": "report",
    "Run": "report",
    "TooManyRuns": "runner",
    "assert_enqueued": "enqueued",
    "enqueued_jobs": "enqueued",
    "inline": "inline",
    "jobs_left_running": "runner",
    "perform_job": "perform",
    "refute_enqueued": "enqueued",
    "run_jobs": "runner",
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_NAMES])
