"""``run_jobqueue --processes P``: a parent that keeps P worker processes running.

The parent runs no jobs and opens no database connection. It forks the children (each builds its
own ``Worker`` with its own connection), restarts a child that dies (with a growing delay when
children keep dying at once), and forwards SIGTERM/SIGINT so each child shuts down gracefully.

One listener serves the whole group: a process of its own (so that no fork ever copies a live
database connection) holds the group's only LISTEN connection and wakes, for a notification of
``n`` jobs, just enough idle workers to take them, through one pipe per worker; each worker
reports its free slots in shared memory. A group of P processes thus holds P + 1 dedicated
connections instead of 2P, and one job wakes one claim instead of P.
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
import threading
import time

from django.db import connections

from .conf import get_settings

logger = logging.getLogger("django_dbqueue")


def _forget_connections():
    # A forked child must not share the parent's sockets: drop inherited connection state.
    for connection in connections.all(initialized_only=True):
        connection.connection = None


def _child(worker_kwargs, parent_pid, slot=None, wake_fd=None, free_slots=None):
    _forget_connections()
    from .notifications import PipeWaker
    from .worker import Worker

    # Its own process group: a Ctrl-C in the terminal (or a signal to the parent's group)
    # reaches the parent only, which forwards it once. Otherwise each child would see it twice
    # and take the second as "exit at once".
    os.setpgrp()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    extra = {}
    if wake_fd is not None:
        extra["waker"] = PipeWaker(wake_fd)
        extra["report_free"] = lambda free: free_slots.__setitem__(slot, free)
    worker = Worker(**worker_kwargs, parent_pid=parent_pid, **extra)
    worker.install_signal_handlers()
    raise SystemExit(worker.run())


def _listener_main(pipes, free_slots, queues, parent_pid):
    """The group's listener process: LISTEN, and wake the workers through their pipes."""
    _forget_connections()
    os.setpgrp()
    from .conf import get_settings
    from .notifications import GroupWaker, Listener

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conf = get_settings()
    group = GroupWaker(pipes, free_slots, queues)
    failed = []
    # The workers say on their own connections that they wait for wake-ups (waiters.py), except
    # where those may go through a pooler (LISTEN_DATABASE names another alias): then this
    # listener says it for the group, on its direct connection.
    pooled = (conf.LISTEN_DATABASE or conf.DATABASE) != conf.DATABASE
    listener = Listener(
        conf.LISTEN_DATABASE or conf.DATABASE,
        conf.NOTIFY_CHANNEL,
        group.on_notify,
        stop,
        on_crash=lambda reason: (failed.append(reason), stop.set()),
        wait_queues=queues if pooled else None,
    )
    listener.start()
    while not stop.wait(0.5):
        if os.getppid() != parent_pid:
            break
    stop.set()
    listener.join(2.0)
    raise SystemExit(1 if failed else 0)


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
        listen = worker_kwargs.get("listen")
        self.group_listen = (
            get_settings().LISTEN if listen is None else listen
        ) and not worker_kwargs.get("burst")
        self.pipes = {}  # slot -> (read fd, write fd): the same pipe for every child of a slot
        self.free_slots = None
        self.listener = None
        if self.group_listen:
            self.free_slots = self.context.Array("i", processes, lock=False)
            for slot in range(processes):
                read_fd, write_fd = os.pipe()
                os.set_blocking(write_fd, False)
                self.pipes[slot] = (read_fd, write_fd)

    def _spawn(self, slot):
        args = (self.worker_kwargs, os.getpid())
        if self.group_listen:
            args += (slot, self.pipes[slot][0], self.free_slots)
        process = self.context.Process(target=_child, args=args, name=f"dbqueue-worker-{slot}")
        process.start()
        self.children[slot] = process
        self.out(f"dbqueue supervisor: started worker {slot} (pid {process.pid})")

    def _spawn_listener(self):
        queues = self.worker_kwargs.get("queues") or list(get_settings().QUEUES)
        pipes = {slot: write_fd for slot, (_, write_fd) in self.pipes.items()}
        self.listener = self.context.Process(
            target=_listener_main,
            args=(pipes, self.free_slots, queues, os.getpid()),
            name="dbqueue-listener",
        )
        self.listener.start()

    def _check_listener(self):
        if self.listener is None or self.listener.is_alive() or self.stopping:
            return
        self.out(
            f"dbqueue supervisor: listener (pid {self.listener.pid}) exited with code "
            f"{self.listener.exitcode}; restarting"
        )
        self._spawn_listener()

    def _forward(self, signum, frame):
        self.signals += 1
        self.stopping = True
        if self.listener is not None and self.listener.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.listener.pid, signal.SIGTERM)
        for process in self.children.values():
            if process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

    def run(self):
        connections.close_all()
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        if self.group_listen:
            self._spawn_listener()
        for slot in range(self.processes):
            self._spawn(slot)
        recent_deaths = []
        while True:
            self._check_listener()
            alive = False
            for slot, process in list(self.children.items()):
                process.join(timeout=0.2 / max(1, len(self.children)))
                if process.is_alive():
                    alive = True
                    continue
                if self.free_slots is not None:
                    self.free_slots[slot] = 0  # wake nobody through a dead worker's pipe
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
        if self.listener is not None:
            if self.listener.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.listener.pid, signal.SIGTERM)
            self.listener.join(5)
        self.out("dbqueue supervisor: all workers stopped")
        return 0
