"""The soak's batch-handler invariant (benchmarks/soak_check.py runs it; docs/soak.md).

The producer enqueues a few ``soak-batch`` jobs at once (``enqueue_many``), each with its own
failure plan in its payload (``fail``: the attempts on which it fails). Their handler
(benchmarks/soakapp/jobs.py, ``batch_size`` ``SIZE``) receives up to ``SIZE`` of them in one
call, records a run per job in ``soak_run`` as every soak handler does, and settles each job on
its own: ``batch.fail(job, ...)`` with ``"job #<id> failed on attempt <n>, as its payload
asked"`` where the job's own plan lists its own attempt, else ``batch.succeed(job, {"job": id,
"attempt": n, "batch": size})``. So every outcome a job ends with names the job and the attempt
it was decided for, and the checker can tell a job's own outcome from a batch mate's.

- ``batch-mate``: a batch job whose error history holds a planned failure that names another job,
  another attempt than the entry's, or an attempt its own plan does not fail (it failed for a
  batch mate, or with a mate's outcome); or a ``done`` job whose result names another job or
  another attempt than the one that ended it (a mate's success written for it);
- ``batch-outcome``: a ``done`` job whose last attempt its own plan fails (it should have been
  retried), or a ``dead`` job with attempts left (nothing in the soak discards a batch job);
- ``batch-done-twice``: a batch job that reached ``done`` twice (two transitions into ``done``):
  its success written twice.

Other errors in a batch job's history (``LeaseExpired`` after a kill or a stop, a ``Requeued``
entry, a failure to record) are the faults' and the operator's, not a batch mate's: allowed.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field

TYPE = "soak-batch"
SIZE = 5  # its batch_size

PLANNED = re.compile(r"^job #(\d+) failed on attempt (\d+), as its payload asked$")

# Each batch job with its plan, its end so far and its transitions into done.
JOBS = """
SELECT j.id, j.payload -> 'fail', j.state, j.attempts, j.max_attempts, j.errors, j.result,
       (SELECT count(*) FROM soak_transition AS t WHERE t.job_id = j.id AND t.new_state = 'done')
FROM dbqueue_job AS j
WHERE j.type = %s
ORDER BY j.id
"""


def planned_failure(job_id, attempt):
    """The message of a batch job's planned failure (the handler and the checker share it)."""
    return f"job #{job_id} failed on attempt {attempt}, as its payload asked"


@dataclass(frozen=True)
class BatchJob:
    id: int
    fail: list  # the attempts its payload fails
    state: str
    attempts: int
    max_attempts: int
    errors: list  # its error history (dicts)
    result: object  # its stored result (a dict once done)
    done: int  # transitions into done


@dataclass
class BatchStats:
    jobs: int = 0
    states: collections.Counter = field(default_factory=collections.Counter)
    planned: int = 0  # planned failures written
    sizes: collections.Counter = field(default_factory=collections.Counter)  # done jobs by size


def batch_violations(jobs, stats=None):
    """``[(kind, key, text)]`` over the batch jobs (:class:`BatchJob`)."""
    stats = stats if stats is not None else BatchStats()
    out = []
    for job in jobs:
        plan = set(job.fail or ())
        stats.jobs += 1
        stats.states[job.state] += 1
        for entry in job.errors or ():
            match = PLANNED.match(str(entry.get("message", "")))
            if match is None:
                continue  # a fault's or the operator's entry, not the handler's plan
            stats.planned += 1
            named, attempt = int(match[1]), int(match[2])
            if named != job.id or attempt != entry.get("attempt") or attempt not in plan:
                out.append((
                    "batch-mate",
                    (job.id, entry.get("attempt"), "error"),
                    f"batch job {job.id} (plan {sorted(plan)}) has the failure "
                    f"{entry.get('message')!r} on its attempt {entry.get('attempt')}: not its "
                    "own plan's",
                ))  # fmt: skip
        if job.state == "done":
            result = job.result if isinstance(job.result, dict) else {}
            if result.get("job") != job.id or result.get("attempt") != job.attempts:
                out.append((
                    "batch-mate",
                    (job.id, job.attempts, "result"),
                    f"batch job {job.id} ended done on attempt {job.attempts} with the result "
                    f"{job.result!r}: not its own",
                ))  # fmt: skip
            if job.attempts in plan:
                out.append((
                    "batch-outcome",
                    (job.id, job.attempts),
                    f"batch job {job.id} ended done on attempt {job.attempts}, which its plan "
                    f"{sorted(plan)} fails",
                ))  # fmt: skip
            if isinstance(result.get("batch"), int):
                stats.sizes[result["batch"]] += 1
        if job.state == "dead" and job.attempts < job.max_attempts:
            out.append((
                "batch-outcome",
                (job.id, job.attempts),
                f"batch job {job.id} is dead after {job.attempts} of {job.max_attempts} "
                "attempts: nothing discards a batch job",
            ))  # fmt: skip
        if job.done > 1:
            out.append((
                "batch-done-twice",
                (job.id,),
                f"batch job {job.id} reached done {job.done}x: its success written twice",
            ))  # fmt: skip
    return out
