"""Signals for alert hooks, sent by the worker after the job's new state is committed.

The ``sender`` is the job type's handler function (so ``job_dead.connect(page_someone,
sender=send_invoice_email)`` listens to one type), or the type name when no handler is
registered. Keyword arguments: ``job_id``, ``job_type`` (the name), ``job_name`` (the type, or
for a ``django.tasks`` job the path of its task when the worker knows that task: what the logs
and the metrics call it), ``queue``, ``attempt`` and ``worker_id``; ``job_failed`` and ``job_dead`` add ``error`` (a dict: class, message, traceback)
and ``job_failed`` adds ``retry_in`` (seconds). ``job_cancelled`` (a job ended ``cancelled``
after a worker claimed it: its cancel was asked for while it ran, or its handler raised
``JobCancelled``) adds ``cancelled_by`` (``"admin:<user>"``, ``"api"``, cancel()'s ``by=``,
``"handler"``, or ``None``) and ``error`` (the run's error when it failed on its way out, the
sweeper's ``LeaseExpired`` when its worker died, else ``None``). A pending or waiting job
cancelled at once never ran: no signal. A receiver that raises is logged and does not
disturb the worker or the other receivers.

``job_started`` is sent by the handler thread just before the handler runs, with ``enqueued_at``
(the row's creation time) and ``wait`` (seconds from the moment the job was due, its
``run_after``, to the claim). ``job_succeeded``, ``job_failed``, ``job_dead`` and ``job_cancelled`` carry
``duration``: seconds the handler ran, or ``None`` when no run was timed (a lease that expired
and was swept). Receivers of ``job_started`` run on the handler thread, before the handler:
keep them quick. The others run on the worker's claim loop after the commit.
"""

import logging

from django.dispatch import Signal

logger = logging.getLogger("django_dbqueue")

job_started = Signal()  # a handler is about to run
job_succeeded = Signal()
job_failed = Signal()  # the attempt failed and the job will be retried
job_dead = Signal()  # the job is in the dead letters
job_cancelled = Signal()  # a claimed job ended cancelled (instead of done, retried or dead)


def send(signal, job_type, *, job_name=None, **kwargs):
    """Send ``signal`` for a job of type ``job_type`` (a name) to every receiver, robustly;
    ``job_name`` (names.label) defaults to the type."""
    if not signal.receivers:  # the common case: nobody listens, and this runs once per job
        return
    from . import registry

    registered = registry.get(job_type)
    sender = registered.func if registered is not None else job_type
    if not signal.has_listeners(sender):
        return
    for receiver, response in signal.send_robust(
        sender, job_type=job_type, job_name=job_name or job_type, **kwargs
    ):
        if isinstance(response, Exception):
            logger.error(
                "dbqueue: signal receiver %r raised %r for job=%s type=%s",
                receiver,
                response,
                kwargs.get("job_id"),
                job_type,
                exc_info=(type(response), response, response.__traceback__),
            )
