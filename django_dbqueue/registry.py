"""``@job``: the table from type name to handler, the only thing that decides which code a row runs.

A row names a *type*; a worker looks the type up here. Nothing stored in a row is ever imported or
called by path, so a row (or whoever can write one) cannot make a worker run arbitrary code.
"""

import inspect
from dataclasses import dataclass
from typing import Any

from . import validation
from .backoff import Backoff
from .exceptions import JobRegistrationError

_UNSET: Any = object()
MAX_LEASE = 86400.0  # seconds: a lease or timeout longer than a day is a mistake (heartbeats renew)


class JobNameTypeError(JobRegistrationError, TypeError):
    """``@job``'s first argument, the type name, is not a str (``@job(["x"])``, or a bare
    ``@job`` given the function): a ``TypeError``, and a ``JobRegistrationError`` as every
    other refusal of ``@job``."""


@dataclass(frozen=True)
class JobType:
    """A registered handler and its options. ``None`` options fall back to the settings."""

    name: str
    func: Any
    queue: str | None = None
    max_attempts: int | None = None
    lease: float | None = None
    backoff: Any = None
    timeout: float | None = None
    priority: int = 0
    atomic: bool = False
    is_async: bool = False
    global_concurrency: int | None = None  # jobs of this type running at once, fleet-wide
    rate_limit: dict | None = None  # {"limit", "period", "key"}: starts per period, fleet-wide
    # Batch handlers (docs/batches.md): up to this many claimed jobs per call, settled per job.
    batch_size: int | None = None
    # Flow control (docs/concepts/flow-control.md): callables of the payload, called at enqueue.
    unique_key: Any = None
    unique_while: str | None = None
    serial_key: Any = None
    # Fair shares (docs/fairness.md): a callable of the payload, the key a fair queue's claim
    # takes jobs round-robin by.
    fair_key: Any = None
    # Publish and subscribe (docs/events.md): the event names whose publish makes a job of it.
    subscribes: tuple = ()

    @property
    def location(self):
        return _location(self.func)

    # Resolution against the settings, done per use so override_settings works in tests.
    def get_queue(self, conf):
        return self.queue or conf.DEFAULT_QUEUE

    def get_max_attempts(self, conf):
        return self.max_attempts or conf.MAX_ATTEMPTS

    def get_lease(self, conf):
        return float(self.lease or conf.LEASE)

    def retry_delay(self, attempt, conf):
        schedule = self.backoff or Backoff(
            base=conf.BACKOFF_BASE, factor=conf.BACKOFF_FACTOR, cap=conf.BACKOFF_CAP
        )
        return max(0.0, float(schedule(attempt)))


_registry: dict[str, JobType] = {}


def retry_delay(job_type, attempt, conf):
    """Seconds before retrying after failed ``attempt``: the type's schedule, else the settings'."""
    if job_type is not None:
        return job_type.retry_delay(attempt, conf)
    return Backoff(base=conf.BACKOFF_BASE, factor=conf.BACKOFF_FACTOR, cap=conf.BACKOFF_CAP)(
        attempt
    )


def _location(func):
    func = inspect.unwrap(func)
    try:
        filename = inspect.getsourcefile(func) or "?"
        line = inspect.getsourcelines(func)[1]
    except (OSError, TypeError):
        filename, line = getattr(func, "__module__", "?"), "?"
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', func)} ({filename}:{line})"


def _check_signature(name, func):
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise JobRegistrationError(f"@job({name!r}): cannot inspect {func!r}: {exc}") from exc
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_positional = [p for p in positional if p.default is p.empty]
    required_kwonly = [p for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    ok = (
        not required_kwonly
        and len(required_positional) <= 1
        and (len(positional) >= 1 or has_varargs)
    )
    if not ok:
        raise JobRegistrationError(
            f"@job({name!r}) handler {_location(func)} has signature {name_sig(func, sig)}; "
            "a handler takes exactly one positional argument, the job context: def handler(ctx)."
        )


def name_sig(func, sig):
    return f"{getattr(func, '__name__', func)}{sig}"


def _validate_flow_options(where, unique_key, unique_while, serial_key, fair_key=None):
    error = JobRegistrationError
    for label, value in (
        ("unique_key", unique_key),
        ("serial_key", serial_key),
        ("fair_key", fair_key),
    ):
        if value is not None and not callable(value):
            raise error(
                f"{where}: {label} must be a callable of the payload returning a str or int "
                f"(e.g. lambda payload: payload['account_id']), got {validation.shown(value)}"
            )
    if unique_while is not None:  # alone, the mode of the keys given to enqueue()
        validation.unique_while(unique_while, f"{where}: unique_while", error=error)


def _validate_subscribes(where, subscribes, unique_key):
    """The event names of ``@job(subscribes=...)``, as a tuple without repeats."""
    if subscribes is None:
        return ()
    if isinstance(subscribes, str) or not isinstance(subscribes, list | tuple):
        raise JobRegistrationError(
            f"{where}: subscribes must be a list of event names, e.g. "
            f"subscribes=['invoice.paid'], got {validation.shown(subscribes)}"
        )
    for index, event in enumerate(subscribes):
        validation.type_name(event, f"{where}: subscribes[{index}]", error=JobRegistrationError)
    if subscribes and unique_key is not None:
        raise JobRegistrationError(
            f"{where}: a subscriber cannot have a unique_key; each published event makes one "
            "job of it, keyed by the event (docs/events.md)"
        )
    return tuple(dict.fromkeys(subscribes))


def _validate_options(
    name, queue, max_attempts, lease, backoff, timeout, priority, global_concurrency, rate_limit
):
    error = JobRegistrationError
    if not isinstance(name, str):
        bare = ' (a bare @job: give the type\'s name, @job("type-name"))' if callable(name) else ""
        raise JobNameTypeError(
            "@job(name): the job type name must be a str, such as "
            f'@job("send-invoice-email"), got {type(name).__name__} {validation.shown(name)}{bare}'
        )
    validation.type_name(name, "@job type name", error=error)
    where = f"@job({name!r})"
    if queue is not None:
        validation.queue_name(queue, f"{where}: queue", error=error)
    if max_attempts is not None:
        validation.max_attempts(max_attempts, f"{where}: max_attempts", error=error)
    for label, value in (("lease", lease), ("timeout", timeout)):
        if value is not None:
            validation.seconds(
                value,
                f"{where}: {label}",
                positive=True,
                maximum=MAX_LEASE,
                timedelta=False,
                error=error,
            )
    if backoff is not None and not callable(backoff):
        raise JobRegistrationError(
            f"{where}: backoff must be callable (attempt -> seconds), e.g. Backoff(base=5), got {backoff!r}"
        )
    validation.priority(priority, f"{where}: priority", error=error)
    if global_concurrency is not None:
        validation.concurrency_limit(
            global_concurrency, f"{where}: global_concurrency", error=error
        )
    if rate_limit is not None:
        return validation.rate_limit(rate_limit, f"{where}: rate_limit", error=error)
    return None


def job(
    name,
    *,
    queue=None,
    max_attempts=None,
    lease=None,
    backoff=None,
    timeout=None,
    priority=0,
    atomic=False,
    batch_size=None,
    global_concurrency=None,
    rate_limit=None,
    unique_key=None,
    unique_while=None,
    serial_key=None,
    subscribes=None,
    fair_key=None,
):
    """Register the decorated function as the handler of job type ``name``.

    ``queue``: where ``enqueue`` puts it by default (``DBQUEUE["DEFAULT_QUEUE"]``).
    ``max_attempts``: claims before it is dead (``MAX_ATTEMPTS``). ``lease``: seconds a claim holds
    it without a heartbeat (``LEASE``). ``backoff``: ``attempt -> seconds`` retry schedule, such as
    ``Backoff(base=5, cap=600)``. ``timeout``: seconds after which the worker gives the run up and
    retries it. ``priority``: default priority, -100..100, higher first. ``atomic``: run the
    handler and the job's completion in one transaction. ``global_concurrency``: at most this
    many jobs of the type run at once across every worker. ``rate_limit``: at most
    ``{"limit": N, "period": seconds}`` starts of the type per period across every worker,
    per value of the payload field ``"key"`` when given (docs/concepts/flow-control.md).

    Flow control (docs/concepts/flow-control.md), each a callable of the payload called at enqueue and
    returning a str, an int or ``None`` (no key for that job): ``unique_key``, with
    ``unique_while`` (``"pending"`` or ``"active"``, the default) makes a second enqueue while
    one job of the key is live return that job; ``serial_key`` runs the jobs of a key one at a
    time, in enqueue order. ``enqueue()``'s own arguments override them. ``unique_while`` alone
    is the mode of the keys given to ``enqueue()``. ``fair_key``: in a queue with
    ``{"fair": True}``, the key whose jobs the claim takes round-robin with the other keys'
    (a tenant or account id; docs/fairness.md).

    ``subscribes``: event names (a list of str); each ``publish()`` of one of them makes a job
    of this type with the event's payload (docs/events.md).

    The handler takes one argument, the :class:`~django_dbqueue.JobContext`. ``async def``
    handlers are supported.

    ``batch_size``: the handler takes a :class:`~django_dbqueue.Batch` of up to this many
    claimed jobs of the type (1..1000) and settles each one on its own (docs/batches.md); a
    plain sync function, not ``atomic``.
    """
    rate_limit = _validate_options(
        name, queue, max_attempts, lease, backoff, timeout, priority, global_concurrency, rate_limit
    )
    _validate_flow_options(f"@job({name!r})", unique_key, unique_while, serial_key, fair_key)
    subscribes = _validate_subscribes(f"@job({name!r})", subscribes, unique_key)
    if not isinstance(atomic, bool):  # "yes", 1 or None would be read as a truth value
        raise JobRegistrationError(
            f"@job({name!r}): atomic must be True or False, got {validation.shown(atomic)}"
        )

    def decorator(func):
        _check_signature(name, func)
        is_async = inspect.iscoroutinefunction(inspect.unwrap(func))
        _validate_batch(name, func, batch_size, atomic=atomic, is_async=is_async)
        if atomic and is_async:
            # The ORM calls of an async handler run on asgiref's executor thread, on another
            # connection than the transaction that commits the completion: not atomic at all.
            raise JobRegistrationError(
                f"@job({name!r}): atomic=True needs a plain (sync) function; "
                f"{_location(func)} is async def, and its ORM calls would run outside the "
                "transaction that commits the job. Make the handler sync, or drop atomic=True "
                "and use delivery records or idempotent writes."
            )
        register(
            JobType(
                name=name,
                func=func,
                queue=queue,
                max_attempts=max_attempts,
                lease=None if lease is None else float(lease),
                backoff=backoff,
                timeout=None if timeout is None else float(timeout),
                priority=priority,
                atomic=atomic,
                is_async=is_async,
                batch_size=batch_size,
                global_concurrency=global_concurrency,
                rate_limit=rate_limit,
                unique_key=unique_key,
                unique_while=unique_while,
                serial_key=serial_key,
                fair_key=fair_key,
                subscribes=subscribes,
            )
        )
        return func

    return decorator


MAX_BATCH_SIZE = 1000


def _validate_batch(name, func, batch_size, *, atomic, is_async):
    if batch_size is None:
        return
    where = f"@job({name!r})"
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise JobRegistrationError(
            f"{where}: batch_size must be an int from 1 to {MAX_BATCH_SIZE} (jobs per call), "
            f"got {validation.shown(batch_size)}"
        )
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise JobRegistrationError(
            f"{where}: batch_size must be from 1 to {MAX_BATCH_SIZE} (jobs per call), got "
            f"{batch_size}"
        )
    if atomic or is_async:
        # Atomic: one transaction would commit or roll back every job of the batch together,
        # against per-job settling. Async: one job's cancel would cancel the whole batch's task.
        raise JobRegistrationError(
            f"{where}: batch_size needs a plain (sync) function without atomic=True; "
            f"{_location(func)} is {'atomic' if atomic else 'async def'}. A batch settles each "
            "job on its own (docs/batches.md)."
        )


def batch_sizes():
    """``{type name: batch_size}`` of the registered batch types (empty: none). Read by every
    claim, so kept up to date by register() and unregister() rather than computed."""
    return _batch_sizes


_batch_sizes: dict[str, int] = {}


def _index_batches():
    global _batch_sizes
    _batch_sizes = {t.name: t.batch_size for t in _registry.values() if t.batch_size}


def register(job_type):
    existing = _registry.get(job_type.name)
    if existing is not None and existing.func is not job_type.func:
        if existing.location == job_type.location:
            # The same function registered again (a module imported twice, e.g. by autoreload).
            _registry[job_type.name] = job_type
            _index_batches()
            return job_type
        raise JobRegistrationError(
            f"job type {job_type.name!r} is registered twice: by {existing.location} "
            f"and by {job_type.location}. Type names must be unique; rename one of them."
        )
    _registry[job_type.name] = job_type
    _index_batches()
    return job_type


def unregister(name):
    """Remove a type (tests, or a project that replaces a third-party handler)."""
    removed = _registry.pop(name, None)
    _index_batches()
    return removed


def get(name):
    """The ``JobType`` for ``name``, or ``None``."""
    return _registry.get(name)


def all_types():
    return dict(_registry)
