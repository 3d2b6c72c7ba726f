#!/usr/bin/env python
"""``manage.py run_jobqueue`` of the drain project, with every claim timed: ``pressure.py``'s worker.

The worker's own claim (``django_dbqueue.claiming.claim``, one call per claim of the worker's
loop, the completions that ride on it included) is wrapped before the command starts; the package
is not changed. Each call appends one line to ``$PRESSURE_CLAIMS/claims-<pid>.txt``:

    <wall-clock start, s> <duration, s> <jobs claimed> <jobs asked for> <completions that rode on it>

buffered and written at most once a second (and at exit), from the loop's thread only. A claim
that raised is not written (the worker reconnects and claims again). ``restart.py``'s restart in
place runs this very command line again, so a restarted worker is timed too.

It also registers ``pressure-chain``, the job of ``pressure.py --backlog`` and ``--queues``: it
records ``(time, key)`` like the project's ``noop`` and enqueues its successor into its own queue,
so that a backlog of N due jobs stays N while the workers drain it at full speed.

    cd benchmarks/drainproject && PRESSURE_CLAIMS=/tmp/claims python ../pressure_worker.py [run_jobqueue args]
"""

import atexit
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROJECT = REPO / "benchmarks" / "drainproject"
for path in (str(REPO), str(PROJECT)):
    if path not in sys.path:
        sys.path.insert(0, path)

FLUSH_SECONDS = 1.0
FLUSH_LINES = 5000


class ClaimLog:
    """The timed claims of this process, appended to ``<directory>/claims-<pid>.txt``."""

    def __init__(self, directory):
        self.path = os.path.join(directory, f"claims-{os.getpid()}.txt")
        self.lock = threading.Lock()
        self.lines = []
        self.flushed = time.monotonic()

    def add(self, start, seconds, got, asked, done):
        line = f"{start:.6f} {seconds:.6f} {got} {asked} {done}\n"
        with self.lock:
            self.lines.append(line)
            due = len(self.lines) >= FLUSH_LINES or time.monotonic() - self.flushed >= FLUSH_SECONDS
        if due:
            self.flush()

    def flush(self):
        with self.lock:
            lines, self.lines = self.lines, []
            self.flushed = time.monotonic()
        if lines:
            with open(self.path, "a") as out:
                out.write("".join(lines))


def time_claims(directory):
    """Wrap the worker's claim (worker.py calls ``claiming.claim`` through the module, at every
    claim, so the wrapper is what it calls)."""
    from django_dbqueue import claiming

    log = ClaimLog(directory)
    atexit.register(log.flush)
    claim = claiming.claim

    def timed_claim(w, done=None):
        start, began = time.time(), time.perf_counter()
        claimed, asked = claim(w, done)
        log.add(start, time.perf_counter() - began, claimed, asked, len(done) if done else 0)
        return claimed, asked

    claiming.claim = timed_claim
    return log


def register_chain():
    from noop.jobs import BUFFER  # the project's per-process records

    from django_dbqueue import enqueue, job

    @job("pressure-chain")
    def chain(ctx):
        """Records (now, key) and enqueues its successor into the same queue."""
        BUFFER.add(time.time(), ctx.payload["key"])
        enqueue("pressure-chain", {"key": ctx.payload["key"]}, queue=ctx.queue)

    return chain


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "drainproject.settings")
    import django

    django.setup()
    time_claims(os.environ["PRESSURE_CLAIMS"])
    register_chain()
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "run_jobqueue", *sys.argv[1:]])


if __name__ == "__main__":
    main()
