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

The new image runs under the old worker id and, on its first pass, releases every job that id
still holds (``Worker._recover``): the threads that could have run them died with the old image.
Restarts that come in quick succession wait, as the supervisor's do: nothing for the first in a
minute, then 0.5 s doubling up to 30 s.
"""

import contextlib
import json
import logging
import os
import signal
import sys
import time

logger = logging.getLogger("django_dbqueue")

# Set by the old image for the new one: its pid, the worker id, the recent restarts. Read once and
# taken out of the environment, so that no process the new image starts inherits it; the pid
# makes sure only an image of the same process takes it for its own.
ENV = "DBQUEUE_RESTARTED"
_SIGNALS = {signal.SIGTERM, signal.SIGINT}
WINDOW = 60.0  # restarts within this many seconds count towards the delay
_taken = []  # the state taken out of the environment: [state or None]


def previous():
    """``{"worker": id, "times": [...]}`` left by the image this one replaced, or None."""
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
        return {"worker": str(state["worker"]), "times": [float(t) for t in state["times"]]}
    except (ValueError, KeyError, TypeError):
        return None


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
    # The first pass hands back what this worker id holds and no thread of ours runs: every
    # job the old image still held, including those whose release failed as it stopped.
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
        return
    times = [t for t in state["times"] if now - t < WINDOW] + [time.time()]
    os.environ[ENV] = json.dumps({"pid": os.getpid(), "worker": worker.worker_id, "times": times})
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()  # flush every handler; the new image configures logging afresh
    os.execv(sys.executable, sys.orig_argv)  # noqa: S606 - this very command line, no shell
