"""How the acknowledger (acks.py) reports the outcomes it wrote: its counts, the log line of each
(a fixed vocabulary: retried, dead, deferred, cancelled, fenced, each with job id, type and
attempt) and the signals (signals.py)."""

import logging
import time

from . import signals

logger = logging.getLogger("django_dbqueue")


class Reporting:
    """Mixed into ``acks.Acknowledger``: the reports of the outcomes it wrote."""

    def _report_cancelled(self, ctx, cancelled_by, error, duration):
        self.cancelled += 1
        logger.warning(
            "dbqueue cancelled job=%s type=%s attempt=%s by %s%s",
            ctx.id,
            ctx.name,
            ctx.attempt,
            cancelled_by or "?",
            f" (its run ended with {error['class']}: {error['message']})" if error else "",
        )
        self._signal(
            signals.job_cancelled,
            ctx,
            cancelled_by=cancelled_by or None,
            error=error,
            duration=duration,
        )

    def _report_failure(self, failure, state, cancelled_by=None):
        ctx, error = failure.entry.ctx, failure.error
        if state == "cancelled":
            self._report_cancelled(ctx, cancelled_by, error, failure.duration)
        elif state == "dead":
            self.dead += 1
            logger.error(
                "dbqueue dead job=%s type=%s attempt=%s/%s: %s: %s",
                ctx.id,
                ctx.name,
                ctx.attempt,
                ctx.max_attempts,
                error["class"],
                error["message"],
            )
            self._signal(signals.job_dead, ctx, error=error, duration=failure.duration)
        elif failure.unknown_type:
            self.deferred += 1
            logger.warning(
                "dbqueue deferred job=%s type=%s attempt=%s: no handler on this worker; back to "
                "pending in %gs for a worker that has one (the attempt is not spent)",
                ctx.id,
                ctx.name,
                ctx.attempt,
                self.unknown_type_delay,
            )
        else:
            self.failed += 1
            due = time.monotonic() + failure.delay
            self.next_retry = due if self.next_retry is None else min(self.next_retry, due)
            logger.warning(
                "dbqueue retried job=%s type=%s attempt=%s/%s in %.1fs: %s: %s",
                ctx.id,
                ctx.name,
                ctx.attempt,
                ctx.max_attempts,
                failure.delay,
                error["class"],
                error["message"],
            )
            self._signal(
                signals.job_failed,
                ctx,
                error=error,
                retry_in=failure.delay,
                duration=failure.duration,
            )

    def _fenced(self, entry, what):
        self.fenced += 1
        logger.warning(
            "dbqueue fenced job=%s type=%s attempt=%s: %s discarded, the lease was lost and the "
            "job belongs to another attempt",
            entry.ctx.id,
            entry.ctx.name,
            entry.ctx.attempt,
            what,
        )

    def _signal(self, signal, ctx, **extra):
        signals.send(
            signal,
            ctx.type,
            job_name=ctx.name,
            job_id=ctx.id,
            queue=ctx.queue,
            attempt=ctx.attempt,
            worker_id=self.worker_id,
            **extra,
        )
