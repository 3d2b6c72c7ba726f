"""``run_jobqueue --processes P``: a parent that keeps P worker processes running.

The parent runs no jobs and opens no database connection. It forks the children (each builds its
own ``Worker`` with its own connections), restarts a child that dies (with a growing delay when
children keep dying at once), and forwards SIGTERM/SIGINT so each child shuts down gracefully.
It exits 0 once every child has exited after a signal; a second signal is forwarded too, which
makes the children exit at once. Children run in their own process group (so a terminal's Ctrl-C
reaches them once, through the parent) and stop gracefully if the parent dies. With ``--burst``
or ``--max-jobs`` a child that exits 0 has finished and is not restarted. Under systemd use
``KillMode=mixed`` so that SIGTERM goes to the parent alone.
"""

import contextlib
import logging
import multiprocessing
import os
import signal
import time

from django.db import connections

logger = logging.getLogger("django_dbqueue")


def _child(worker_kwargs, parent_pid):
    # A forked child must not share the parent's sockets: drop inherited connection state.
    for connection in connections.all(initialized_only=True):
        connection.connection = None
    from .worker import Worker

    # Its own process group: a Ctrl-C in the terminal (or a signal to the parent's group)
    # reaches the parent only, which forwards it once. Otherwise each child would see it twice
    # and take the second as "exit at once".
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    worker = Worker(**worker_kwargs, parent_pid=parent_pid)
    worker.install_signal_handlers()
    raise SystemExit(worker.run())


class Supervisor:
    def __init__(self, processes, worker_kwargs, out=print):
        self.processes = processes
        self.worker_kwargs = worker_kwargs
        self.out = out
        self.children = {}
        self.stopping = False
        self.signals = 0
        self.restarts = 0
        self.context = multiprocessing.get_context("fork")
        self.finite = bool(worker_kwargs.get("burst") or worker_kwargs.get("max_jobs"))

    def _spawn(self, slot):
        process = self.context.Process(
            target=_child, args=(self.worker_kwargs, os.getpid()), name=f"dbqueue-worker-{slot}"
        )
        process.start()
        self.children[slot] = process
        self.out(f"dbqueue supervisor: started worker {slot} (pid {process.pid})")

    def _forward(self, signum, frame):
        self.signals += 1
        self.stopping = True
        for process in self.children.values():
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def run(self):
        connections.close_all()
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        for slot in range(self.processes):
            self._spawn(slot)
        recent_deaths = []
        while True:
            alive = False
            for slot, process in list(self.children.items()):
                process.join(timeout=0.2 / max(1, len(self.children)))
                if process.is_alive():
                    alive = True
                    continue
                if self.stopping:
                    continue
                if process.exitcode == 0 and self.finite:
                    # --burst / --max-jobs: a child that finished its work is not restarted.
                    self.out(f"dbqueue supervisor: worker {slot} (pid {process.pid}) finished")
                    del self.children[slot]
                    continue
                now = time.monotonic()
                recent_deaths = [t for t in recent_deaths if now - t < 60] + [now]
                delay = (
                    min(30.0, 0.5 * 2 ** (len(recent_deaths) - 1)) if len(recent_deaths) > 1 else 0
                )
                self.out(
                    f"dbqueue supervisor: worker {slot} (pid {process.pid}) exited with code "
                    f"{process.exitcode}; restarting{f' in {delay:g}s' if delay else ''}"
                )
                deadline = time.monotonic() + delay
                while not self.stopping and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not self.stopping:
                    self.restarts += 1
                    self._spawn(slot)
                    alive = True
            if (self.stopping or self.finite) and not alive:
                break
        self.out("dbqueue supervisor: all workers stopped")
        return 0
