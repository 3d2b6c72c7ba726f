"""OpenTelemetry traces: a job run continues the trace that enqueued it.

``enqueue()`` stores the active span's W3C ``traceparent`` in the job row; the worker runs the
handler inside a span that is a child of that context, so a request and the jobs it enqueued
appear in one trace. Everything here is a no-op when ``opentelemetry-api`` is not installed
(``pip install django-dbqueue[otel]``), and the enqueue binds no extra value when no trace is
active. Exporting spans is the project's business: configure an OpenTelemetry SDK as usual.
"""

from contextlib import contextmanager, nullcontext

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the [otel] extra is not installed
    trace = None

__all__ = ["current_traceparent", "job_span"]

TRACER_NAME = "django_dbqueue"
_NO_SPAN = nullcontext()

if trace is not None:
    # W3C trace context whatever the project's global propagator is: the column holds a
    # traceparent, and the worker must be able to read back what the enqueuer wrote.
    _propagator = TraceContextTextMapPropagator()
    _tracer = trace.get_tracer(TRACER_NAME)


def current_traceparent():
    """The W3C ``traceparent`` of the active span, or ``None`` (no OpenTelemetry, no trace)."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def job_span(ctx):
    """A context manager that runs a handler inside its span (or does nothing without OTel).

    The span is named ``dbqueue run <type>``, has kind CONSUMER, is a child of the enqueuer's
    trace when the job carries one, and has the attributes ``dbqueue.job.type``, ``.queue``,
    ``.id``, ``.attempt`` and ``.outcome`` (``succeeded``, ``retried`` or ``dead``; a job whose
    last attempt fails is ``dead``). An exception is recorded on the span and re-raised.
    """
    if trace is None or not _configured():
        return _NO_SPAN
    return _span(ctx)


def _configured():
    """Whether the process set a tracer provider. Until it does, the API hands out no-op spans:
    building one per job for nothing cost the drain about 15% (docs/performance.md)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


@contextmanager
def _span(ctx):
    parent = _propagator.extract({"traceparent": ctx.traceparent}) if ctx.traceparent else None
    attributes = {
        "dbqueue.job.type": ctx.type,
        "dbqueue.job.queue": ctx.queue,
        "dbqueue.job.id": ctx.id,
        "dbqueue.job.attempt": ctx.attempt,
    }
    with _tracer.start_as_current_span(
        f"dbqueue run {ctx.type}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        # Recorded below instead: the SDK's own recording calls str(exc), which can raise.
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            from .exceptions import DiscardJob

            dead = isinstance(exc, DiscardJob) or ctx.attempt >= ctx.max_attempts
            span.set_attribute("dbqueue.job.outcome", "dead" if dead else "retried")
            _record(span, exc)
            raise
        span.set_attribute("dbqueue.job.outcome", "succeeded")


def _record(span, exc):
    """Record the handler's exception on its span; a tracing failure never replaces the
    handler's own error (an exception whose ``__str__`` raises, say)."""
    try:
        span.record_exception(exc)
    except Exception:
        span.set_attribute("exception.type", type(exc).__qualname__)
    span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__qualname__))
