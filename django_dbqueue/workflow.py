"""Workflows: jobs that wait for other jobs (docs/workflows.md).

``workflow()`` builds a graph of jobs; ``Workflow.enqueue()`` inserts all of them and their
dependency edges in one statement (``store.workflows.INSERT_WORKFLOW``) in the caller's transaction, so the
graph commits or rolls back as one. ``chain()`` and ``group()`` are the two common shapes built
on it. A job with dependencies starts ``waiting``; the database trigger of migration 0009 makes
it ``pending`` when its last dependency is done, or cancels it when one dies or is cancelled
(unless it was added with ``on_failure="run"``).
"""

from . import payloads, schema, store, tracing, validation, waiters, wakeup
from .conf import get_settings
from .exceptions import EnqueueError, UnknownJobType
from .jobspec import EnqueuedJob, columns_of, database, prepare, run_after_of

ON_FAILURE = ("cancel", "run")

_OPTIONS = ("queue", "priority", "run_after", "delay", "max_attempts", "serial_key", "fair_key")


class WorkflowJob:
    """A job of a :class:`Workflow` not enqueued yet: pass it in another job's ``depends_on``,
    or add dependencies with :meth:`after`."""

    __slots__ = ("depends_on", "index", "on_failure", "options", "payload", "type", "workflow")

    def __init__(self, workflow, index, type, payload, options, on_failure):
        self.workflow = workflow
        self.index = index
        self.type = type
        self.payload = payload
        self.options = options
        self.on_failure = on_failure
        self.depends_on = []

    def after(self, *dependencies):
        """This job waits for ``dependencies`` too (jobs of the same workflow, ``EnqueuedJob``
        or ids of jobs already enqueued); returns the job, for chaining."""
        self.depends_on.extend(self.workflow._reference(d, self) for d in dependencies)
        return self

    def __repr__(self):
        return f"<WorkflowJob {self.type} #{self.index} of its workflow>"


class Workflow:
    """A graph of jobs to enqueue together. Build it with :meth:`add`, then :meth:`enqueue`."""

    def __init__(self):
        self.jobs: list[WorkflowJob] = []

    def add(self, type, payload=None, *, depends_on=(), on_failure="cancel", **options):
        """Add a job; ``options`` are ``enqueue()``'s ``queue``, ``priority``, ``run_after``,
        ``delay``, ``max_attempts`` and ``serial_key``. ``depends_on``: jobs of this workflow,
        ``EnqueuedJob`` or ids. ``on_failure``: ``"cancel"`` (default: cancelled when a dependency dies or is
        cancelled) or ``"run"`` (runs anyway, once every dependency has finished)."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            hint = (
                " (a job of a workflow cannot have an idempotency key)"
                if "idempotency_key" in unknown
                else ""
            )
            raise EnqueueError(
                f"workflow job {type!r}: unknown option(s) {', '.join(unknown)}{hint}; "
                f"allowed: {', '.join(_OPTIONS)}"
            )
        if on_failure not in ON_FAILURE:
            raise EnqueueError(
                f"workflow job {type!r}: on_failure must be 'cancel' or 'run', "
                f"got {validation.shown(on_failure)}"
            )
        try:  # checked here, where the mistake is made (and again at enqueue, with the rest)
            run_after_of(options.get("run_after"))
        except EnqueueError as exc:
            raise EnqueueError(f"workflow job {type!r}: {exc}") from None
        job = WorkflowJob(self, len(self.jobs), type, payload, options, on_failure)
        self.jobs.append(job)
        if isinstance(depends_on, str | bytes) or not hasattr(depends_on, "__iter__"):
            raise EnqueueError(
                f"workflow job {type!r}: depends_on must be a list of jobs or ids, "
                f"got {validation.shown(depends_on)}"
            )
        job.after(*depends_on)
        return job

    def _reference(self, dependency, job):
        if isinstance(dependency, WorkflowJob):
            if dependency.workflow is not self:
                raise EnqueueError(
                    f"{job!r} depends on {dependency!r}, a job of another workflow; enqueue "
                    "that one first and pass its EnqueuedJob"
                )
            if dependency is job:
                raise EnqueueError(f"dependency cycle: {job.type} #{job.index} depends on itself")
            return dependency
        if isinstance(dependency, EnqueuedJob):
            return dependency.id
        problem = validation.job_id_problem(dependency)
        if problem is None:
            return dependency
        if problem == "range":
            raise EnqueueError(
                f"{job!r}: {validation.shown(dependency)} is not a job id (1 to 2**63-1); "
                "nothing was enqueued"
            )
        raise EnqueueError(
            f"{job!r}: a dependency must be a job of this workflow, an EnqueuedJob or a job id, "
            f"got {validation.shown(dependency)}"
        )

    def _check_cycles(self):
        """Refuse a graph with a cycle, naming the jobs on it."""
        state = {}  # index -> 1 visiting, 2 done
        for root in self.jobs:
            if root.index in state:
                continue
            stack = [(root, iter(root.depends_on))]
            path = [root]
            state[root.index] = 1
            while stack:
                node, deps = stack[-1]
                nxt = next((d for d in deps if isinstance(d, WorkflowJob)), None)
                if nxt is None:
                    state[node.index] = 2
                    stack.pop()
                    path.pop()
                elif state.get(nxt.index) == 1:
                    cycle = [*path[path.index(nxt) :], nxt]
                    raise EnqueueError(
                        "dependency cycle: "
                        + " -> ".join(f"{j.type} #{j.index}" for j in cycle)
                        + " (each waits for the next); nothing was enqueued"
                    )
                elif nxt.index not in state:
                    state[nxt.index] = 1
                    stack.append((nxt, iter(nxt.depends_on)))
                    path.append(nxt)

    @schema.explains_unmigrated
    def enqueue(self, *, using=None):
        """Insert every job and edge in one statement; returns one :class:`EnqueuedJob` per job,
        in the order added. Raises ``EnqueueError`` (naming the job) before anything is written
        for a bad argument, a cycle, or a dependency id that does not exist or is dead or
        cancelled."""
        conf = get_settings()
        using = database(using, conf)
        if not self.jobs:
            return []
        self._check_cycles()
        prepared = []
        for job in self.jobs:
            try:
                prepared.append(
                    prepare(
                        job.type,
                        job.payload,
                        queue=job.options.get("queue"),
                        priority=job.options.get("priority"),
                        run_after=job.options.get("run_after"),
                        delay=job.options.get("delay"),
                        idempotency_key=None,
                        max_attempts=job.options.get("max_attempts"),
                        conf=conf,
                        serial_key=job.options.get("serial_key"),
                        fair_key=job.options.get("fair_key"),
                    )
                )
                if prepared[-1]["unique_key"] is not None:
                    raise EnqueueError(
                        f"job type {job.type!r} has a unique_key (@job(unique_key=...)); a job "
                        "of a workflow cannot be unique"
                    )
            except (EnqueueError, UnknownJobType) as exc:
                raise type(exc)(f"workflow job #{job.index}: {exc}") from exc
            except payloads.PayloadError as exc:
                raise payloads.PayloadError(f"workflow job #{job.index}: {exc}") from exc
        edges, existing = [], set()
        for job in self.jobs:
            seen = set()
            for dep in job.depends_on:
                key = ("job", dep.index) if isinstance(dep, WorkflowJob) else ("id", dep)
                if key in seen:
                    continue  # the same dependency twice is one edge
                seen.add(key)
                run = job.on_failure == "run"
                if isinstance(dep, WorkflowJob):
                    edges.append((job.index + 1, dep.index + 1, None, run))
                else:
                    edges.append((job.index + 1, None, dep, run))
                    existing.add(dep)
        columns = columns_of(prepared)
        ids, found, wakes = store.insert_workflow(
            using,
            columns=columns,
            edges=edges,
            existing=sorted(existing),
            traceparent=tracing.current_traceparent(),
        )
        if not ids:
            missing = sorted(existing - set(found))
            failed = sorted(i for i, state in found.items() if state in ("dead", "cancelled"))
            problems = []
            if missing:
                problems.append(f"unknown job id(s) {', '.join(map(str, missing))}")
            if failed:
                problems.append(
                    "dependency job(s) "
                    + ", ".join(f"#{i} ({found[i]})" for i in failed)
                    + " will never be done (requeue them first)"
                )
            raise EnqueueError(f"workflow refused: {'; '.join(problems)}; nothing was enqueued")
        wakeup.jobs_ready(using, (queue for queue, wake in wakes if waiters.wanted(wake)))
        return [
            EnqueuedJob(job_id, True, p["type"], p["queue"])
            for (job_id, _), p in zip(ids, prepared, strict=True)
        ]


def workflow():
    """A new, empty :class:`Workflow`."""
    return Workflow()


def _add_spec(wf, spec, depends_on, where):
    if isinstance(spec, dict):
        spec = dict(spec)
        if "type" not in spec:
            raise EnqueueError(f"{where} has no 'type'")
        extra = spec.pop("depends_on", ())
        return wf.add(
            spec.pop("type"),
            spec.pop("payload", None),
            depends_on=[*depends_on, *extra],
            **spec,
        )
    if isinstance(spec, tuple | list) and len(spec) in (1, 2):
        return wf.add(spec[0], spec[1] if len(spec) == 2 else None, depends_on=depends_on)
    raise EnqueueError(
        f"{where} must be a (type, payload) pair or a dict of Workflow.add() arguments, "
        f"got {validation.shown(spec)}"
    )


def chain(*jobs, using=None):
    """Enqueue ``jobs`` so that each runs after the one before it is done; returns their
    :class:`EnqueuedJob` in order. Each is ``(type, payload)`` or a dict of
    :meth:`Workflow.add` arguments."""
    wf, previous = Workflow(), None
    for index, spec in enumerate(jobs):
        previous = _add_spec(wf, spec, [previous] if previous else [], f"chain job #{index}")
    return wf.enqueue(using=using)


def group(*jobs, then=None, using=None):
    """Enqueue ``jobs`` to run in parallel and, with ``then``, a callback that runs once after
    all of them are done (a chord); returns their :class:`EnqueuedJob`, the callback last.
    ``then`` with no ``jobs`` raises ``EnqueueError`` (the callback would not wait for
    anything); ``group()`` alone enqueues nothing and returns ``[]``."""
    if then is not None and not jobs:
        # A callback of no members would wait for nothing and run at once: almost always a list
        # that came out empty by mistake. enqueue() says so when it is meant.
        raise EnqueueError(
            "group(then=...) has no members: the callback would run at once, waiting for "
            "nothing; enqueue it directly if that is what you mean. Nothing was enqueued"
        )
    wf = Workflow()
    members = [_add_spec(wf, spec, [], f"group job #{i}") for i, spec in enumerate(jobs)]
    if then is not None:
        _add_spec(wf, then, members, "group callback")
    return wf.enqueue(using=using)
