"""One INFO line per successful job, on its own logger: ``django_dbqueue.jobs``.

Retries and dead letters are already logged (WARNING and ERROR, on ``django_dbqueue``); a success
was silent above DEBUG, so "did it run?" needed the admin. This receiver of ``job_succeeded``
writes one short line per success with its duration. It is connected at startup only when the
logger is enabled for INFO, so a project that silences it (``"django_dbqueue.jobs": {"level":
"WARNING"}`` in ``LOGGING``) pays nothing per job: no receiver, and the worker's signal send
returns at once.
"""

import logging

from . import signals

logger = logging.getLogger("django_dbqueue.jobs")

DISPATCH_UID = "django_dbqueue.joblog"


def log_success(
    sender, *, job_id, job_type, queue, attempt, duration=None, job_name=None, **kwargs
):
    if logger.isEnabledFor(logging.INFO):
        logger.info(
            "dbqueue done job=%s type=%s queue=%s attempt=%s in %s",
            job_id,
            job_name or job_type,
            queue,
            attempt,
            "?" if duration is None else f"{duration:.3f}s",
        )


def connect():
    """Connect the success line if ``django_dbqueue.jobs`` logs INFO now; returns whether it
    did. Called once from ``AppConfig.ready()``, after Django applied ``LOGGING``."""
    if not logger.isEnabledFor(logging.INFO):
        return False
    signals.job_succeeded.connect(log_success, dispatch_uid=DISPATCH_UID)
    return True


def disconnect():
    signals.job_succeeded.disconnect(dispatch_uid=DISPATCH_UID)
