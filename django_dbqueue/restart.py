"""``run_jobqueue`` without ``--processes``: a worker that gives up restarts itself in place.

A worker gives up (``Worker.fatal``, exit code 3) when more handler threads are stuck in runs
past their timeout than ``HUNG_THREAD_LIMIT`` allows, or when a helper thread died. A thread
cannot be stopped, so only a new process image ends them. Under ``--processes`` or an external
supervisor, the supervisor starts that image. Alone, the command does it itself: after the
worker's graceful stop it replaces its own image with ``os.execv`` and the same command line.

What that keeps, and why it is chosen over running the worker as a supervised child:

- the pid: what an operator, systemd or a test signals or ``kill -9``'s is the worker itself;
  there is no second process to outlive it;
- the connections: the old image's are closed by the exec (libpq and Python open them
  close-on-exec), so the worker never holds more than its usual dedicated ones;
- the speed: no extra process, pipe or listener between the database and the claim loop;
- SIGTERM: SIGTERM and SIGINT are blocked across the exec (a blocked signal stays pending
  through ``execve``) and unblocked once the new image has installed its handlers, so a stop
  asked for during the restart is a graceful stop of the new image, not lost or fatal.

The new image runs under the old worker id. The old image hands it, with the worker id, the
runs it still held when it replaced itself (``held_runs``): runs past their timeout whose
failure waited for their end, runs that must not overlap a second one and were still going after
the grace, outcomes it could not write. Their threads die with the old image, so the new one
writes their ends before anything else, fenced by their lease tokens: each such run was started,
so its attempt counts (a run past its timeout as a ``TimeoutError``, a run cut short by the
restart as ``WorkerRestarted``; a finished run's outcome as it was). Meanwhile the worker
registry shows the worker ``restarting`` rather than gone (shutdown.leave_registry), so that no
sweeper takes those jobs back between the two images. Then, on its first pass, it
hands back, without spending an attempt, every other job that worker id still holds
(``Worker._recover``): those were never started (a claim whose reply was lost, a release that
failed as it stopped). docs/concepts/shutdown.md has the table of every path.

Restarts that come in quick succession wait, as the supervisor's do: nothing for the first in a
minute, then 0.5 s doubling up to 30 s.
"""

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from types import SimpleNamespace

from . import registry
from .heartbeat import given_up_record

logger = logging.getLogger("django_dbqueue")

# Set by the old image for the new one: its pid, the worker id, the recent restarts, and the file
# descriptor of an unlinked file with the runs it held (any number of them: the environment's
# size is bounded, a file's is not). Read once and taken out of the environment, so that no
# process the new image starts inherits it; the pid makes sure only an image of the same process
# takes it for its own.
ENV = "DBQUEUE_RESTARTED"
_SIGNALS = {signal.SIGTERM, signal.SIGINT}
WINDOW = 60.0  # restarts within this many seconds count towards the delay
# Seconds a new image may take from the exec to its first heartbeat (Python, Django, the app's
# imports) while the registry shows the worker restarting (presence.Presence.restarting).
STARTUP = 60.0
_taken = []  # the state taken out of the environment: [state or None]


def previous():
    """``{"worker": id, "times": [...], "held": [...]}`` left by the image this one replaced, or
    None. ``held``: the runs it still held (``held_runs``)."""
    if not _taken:
        _taken.append(_read(os.environ.pop(ENV, None)))
    return _taken[0]


def _read(raw):
    if not raw:
        return None
    try:
        state = json.loads(raw)
        if int(state["pid"]) != os.getpid():
            return None  # inherited by another process: not ours
        return {
            "worker": str(state["worker"]),
            "times": [float(t) for t in state["times"]],
            "held": _read_held(state.get("held_fd")),
        }
    except (ValueError, KeyError, TypeError):
        return None


def _read_held(fd):
    """The held runs the old image wrote to the file ``fd`` (None: none), which is closed."""
    if fd is None:
        return []
    try:
        with os.fdopen(int(fd), "rb") as file:
            held = json.loads(file.read())
        return [_held_run(run) for run in held]
    except (OSError, ValueError, KeyError, TypeError):
        logger.exception(
            "dbqueue: the runs held before the restart could not be read; the jobs they hold "
            "are handed back without spending their attempts"
        )
        return []


def _held_run(run):
    outcome = run["outcome"]
    if outcome[0] not in ("done", "failed", "spent"):
        raise ValueError(f"unknown outcome {outcome[0]!r}")
    return {
        "id": int(run["id"]),
        "token": int(run["token"]),
        "type": str(run["type"]),
        "name": str(run["name"]),
        "queue": str(run["queue"]),
        "attempt": int(run["attempt"]),
        "max_attempts": int(run["max_attempts"]),
        "outcome": outcome,
    }


def held_runs(worker):
    """What ``worker`` (stopped, about to be replaced) still holds of runs it started: the
    entries whose lease it keeps (a run past its timeout whose failure waits for its end, a
    run that must not overlap a second one and outlived the grace) and the outcomes it could
    not write. Each as a dict with the job's id, lease token, type, name, queue, attempt and
    max_attempts, and ``outcome``: ``["done", result]``, ``["failed", error, delay, dead]``,
    or ``["spent"]`` (a run cut short by the restart)."""
    runs, seen = [], set()

    def add(entry, outcome):
        if entry.key not in seen:
            seen.add(entry.key)
            ctx = entry.ctx
            runs.append(
                {
                    "id": ctx.id,
                    "token": entry.token,
                    "type": ctx.type,
                    "name": ctx.name,
                    "queue": ctx.queue,
                    "attempt": ctx.attempt,
                    "max_attempts": ctx.max_attempts,
                    "outcome": outcome,
                }
            )

    for entry, outcome in worker.acks.pending_outcomes():
        add(entry, outcome)
    for entry in worker.inflight.snapshot():
        if entry.started is None or not entry.holds_lease:
            continue  # never started (handed back), or not this worker's to write any more
        if entry.timeout_failure is not None:
            error, delay = entry.timeout_failure
            add(entry, ["failed", error, delay, False])
        else:
            add(entry, ["spent"])
    return runs


def _hand_over(runs):
    """An inheritable descriptor of an unlinked file holding ``runs``, for the new image (None
    when there are none)."""
    if not runs:
        return None
    with tempfile.TemporaryFile() as file:
        file.write(json.dumps(runs).encode())
        file.flush()
        fd = os.dup(file.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd


def take_over(worker, held):
    """In the new image: buffer the ends of the runs the old image ``held``, to be written
    (fenced, durably, before the first claim) by the acknowledger like any outcome. Until they
    are, their leases are renewed and the release of the jobs this worker id holds without
    knowing leaves them alone (``Worker._recover``). Returns how many."""
    for run in held:
        ctx = SimpleNamespace(
            id=run["id"],
            type=run["type"],
            name=run["name"],
            queue=run["queue"],
            attempt=run["attempt"],
            max_attempts=run["max_attempts"],
        )
        entry = SimpleNamespace(ctx=ctx, token=run["token"], key=(ctx.id, run["token"]))
        kind, *data = run["outcome"]
        if kind == "done":
            worker.acks.succeed(entry, data[0])
            continue
        if kind == "failed":
            error, delay, dead = data
        else:
            error = given_up_record(
                ctx,
                worker_id=worker.worker_id,
                cls="WorkerRestarted",
                reason="the worker restarted in place (it gave up) while this run was going",
            )
            delay = worker.retry_delay(registry.get(ctx.type), ctx.attempt)
            dead = False
        worker.acks.fail(entry, error, delay=float(delay), dead=bool(dead))
    return len(held)


def expected_within():
    """Seconds within which the new image of a restart in place starting now should announce
    itself in the worker registry: the restart's wait (:func:`delay`) and ``STARTUP``."""
    state = previous() or {"times": []}
    return delay(state["times"], time.time()) + STARTUP


def delay(times, now):
    """Seconds to wait before the next restart, given the recent restarts ``times``."""
    recent = [t for t in times if now - t < WINDOW]
    return min(30.0, 0.5 * 2 ** (len(recent) - 1)) if recent else 0.0


def resume(worker, out):
    """In the new image, once ``worker`` installed its signal handlers: take over the old
    worker's id (its jobs are released on the first pass) and let the signals through that came
    during the restart. Call before ``worker.run()``; does nothing in a first image."""
    state = previous()
    if state is None:
        return
    # The runs the old image started and still held end first (their attempts count); then the
    # first pass hands back what else this worker id holds and no thread of ours runs (never
    # started: a release that failed as the old image stopped, a claim whose reply was lost).
    if held := state["held"]:
        take_over(worker, held)
        out(
            f"dbqueue worker {worker.worker_id}: writing the ends of {len(held)} runs the "
            "image before the restart held (their attempts count): "
            + ", ".join(str(run["id"]) for run in held)
        )
    worker._reconnected = True
    # Children of the old image that ended with it (process mode's handler processes, its
    # multiprocessing resource tracker) are ours now: reap them, none of this image runs yet.
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    out(f"dbqueue worker {worker.worker_id} restarted in place (pid {os.getpid()})")
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)


def worker_id():
    """The worker id to run under: the old image's after a restart in place, else None."""
    state = previous()
    return state["worker"] if state is not None else None


def in_place(worker, out):
    """Replace this process's image with a new run of the same command. Returns only when a
    signal asked to stop before the exec (then the caller exits 0 as after any stop)."""
    state = previous() or {"times": []}
    now = time.time()
    wait = delay(state["times"], now)
    out(
        f"dbqueue worker {worker.worker_id} gave up; restarting in place (pid {os.getpid()})"
        + (f" in {wait:g}s" if wait else "")
    )
    deadline = time.monotonic() + wait
    while not worker._signals and time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    if worker._signals:  # a stop was asked for meanwhile: stop, do not restart
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        out(f"dbqueue worker {worker.worker_id}: stop asked for; not restarting")
        worker.presence.withdraw(worker.session)  # it said "restarting": gone after all
        worker.session.close()
        return
    times = [t for t in state["times"] if now - t < WINDOW] + [time.time()]
    # The runs it still holds: their threads end with this image, and the new one writes their
    # ends (take_over) before it hands back anything else.
    held_fd = _hand_over(held_runs(worker))
    os.environ[ENV] = json.dumps(
        {"pid": os.getpid(), "worker": worker.worker_id, "times": times, "held_fd": held_fd}
    )
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()  # flush every handler; the new image configures logging afresh
    os.execv(sys.executable, sys.orig_argv)  # noqa: S606 - this very command line, no shell
