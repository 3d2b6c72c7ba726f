"""Every execution of ``benchmarks/celery_compare.py``'s jobs and tasks, counted, on both sides.

A handler, ours or Celery's, calls :func:`started` first and :func:`finished` last. ``finished``
appends one line, ``<key> <start> <end>`` (``time.perf_counter()``, which on Linux is the
machine-wide CLOCK_MONOTONIC), to a file of its own process, ``<COUNT_DIR>/<pid>.log``: opened
once per process (again after a fork, as in Celery's prefork children) with ``O_APPEND`` and
written with one ``os.write``, so a line is whole and in the kernel's hands before the handler
returns, whatever happens to the process after. It costs both sides the same few microseconds.
``started`` also sends the start time in a UDP datagram to the harness, when it waits for one
(the wake-up workload: ``STARTS_PORT`` set).

:func:`tally` reads every file back; :func:`check` compares what ran with what was meant to run:
the keys that never ran (lost), the runs beyond the first of a key (repeated), and the keys that
ran without being expected. Nothing here imports Django or Celery: both sides' processes import
it, and so do the unit tests (``tests/unit/test_celery_count.py``).
"""

from __future__ import annotations

import collections
import os
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

COUNT_DIR = "DBQUEUE_BENCH_COUNT_DIR"  # where each process writes its lines
STARTS_PORT = "DBQUEUE_BENCH_STARTS_PORT"  # the harness's UDP port for start times, when set

_lock = threading.Lock()
_pid = None
_fd = None
_starts = None  # (socket, address) in a process that sends its start times


def _open_for_this_process():
    """The file and the datagram socket of this process, made at its first handler (and again in
    a child forked after that: the pid differs)."""
    global _pid, _fd, _starts
    with _lock:
        if _pid == os.getpid():
            return
        directory = os.environ.get(COUNT_DIR)
        if not directory:
            raise RuntimeError(f"{COUNT_DIR} is not set: the harness says where to count")
        path = os.path.join(directory, f"{os.getpid()}.log")
        _fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        port = os.environ.get(STARTS_PORT)
        _starts = None
        if port:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            _starts = (sock, ("127.0.0.1", int(port)))
        _pid = os.getpid()


def started(key):
    """The handler's first act: its start time, also sent to the harness when it asks."""
    at = time.perf_counter()
    if _pid != os.getpid():
        _open_for_this_process()
    if _starts is not None:
        sock, address = _starts
        sock.sendto(f"{key} {at!r}".encode(), address)
    return at


def finished(key, at):
    """The handler's last act: one line for this run, appended to this process's file."""
    os.write(_fd, f"{key} {at!r} {time.perf_counter()!r}\n".encode())


# --------------------------------------------------------------------------------------------
# Reading the lines back (the harness)
# --------------------------------------------------------------------------------------------
class MalformedRecord(ValueError):
    """A line that is not ``<key> <start> <end>``: the count cannot be trusted."""


@dataclass
class Tally:
    """What ran: executions per key, and each process's first start and last end."""

    runs: collections.Counter = field(default_factory=collections.Counter)
    processes: dict = field(default_factory=dict)  # pid -> [runs, first start, last end]

    @property
    def executions(self):
        return sum(self.runs.values())

    @property
    def first_start(self):
        return min(p[1] for p in self.processes.values())

    @property
    def last_end(self):
        return max(p[2] for p in self.processes.values())

    def add(self, pid, line, where):
        parts = line.split()
        try:
            key, start, end = parts
            start, end = float(start), float(end)
        except ValueError:
            raise MalformedRecord(f"{where}: {line!r} is not '<key> <start> <end>'") from None
        self.runs[key] += 1
        seen = self.processes.setdefault(pid, [0, start, end])
        seen[0] += 1
        seen[1] = min(seen[1], start)
        seen[2] = max(seen[2], end)


def tally(directory):
    """Every ``<pid>.log`` of ``directory``, read back into one :class:`Tally`."""
    result = Tally()
    for path in sorted(Path(directory).glob("*.log")):
        text = path.read_text()
        if text and not text.endswith("\n"):
            raise MalformedRecord(f"{path}: its last line is cut short: {text[-80:]!r}")
        for number, line in enumerate(text.splitlines(), 1):
            result.add(int(path.stem), line, f"{path}:{number}")
    return result


class Progress:
    """How many distinct keys have run so far, read incrementally (only the lines written since
    the last look), so that watching a drain costs the machine next to nothing. Distinct keys,
    not lines: a repeated run must not pass for the one still missing."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.offsets = {}
        self.keys = set()

    def count(self):
        for path in self.directory.glob("*.log"):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                new = f.read()
            # Only whole lines: a line being written is read at the next look.
            whole = new.rfind(b"\n") + 1
            self.keys.update(line.split(b" ", 1)[0] for line in new[:whole].splitlines())
            self.offsets[path] = self.offsets.get(path, 0) + whole
        return len(self.keys)


@dataclass(frozen=True)
class Check:
    """Expected keys against what ran."""

    expected: int
    executions: int
    lost: tuple  # expected keys that never ran (sorted, as text)
    repeated: int  # runs beyond the first, over every key
    unexpected: tuple  # keys that ran but were not expected

    @property
    def clean(self):
        return not (self.lost or self.repeated or self.unexpected)

    def describe(self):
        text = f"lost {len(self.lost)}, repeated {self.repeated}"
        if self.unexpected:
            text += f", unexpected {len(self.unexpected)}"
        if self.lost:
            text += f" (lost e.g. {', '.join(self.lost[:5])})"
        return text


def check(expected, runs):
    """Compare the ``expected`` keys (any iterable; compared as text) with ``runs``, a mapping
    of key -> number of runs (a :class:`Tally`'s ``runs``)."""
    expected = {str(key) for key in expected}
    ran = {key for key, n in runs.items() if n > 0}
    return Check(
        expected=len(expected),
        executions=sum(runs.values()),
        lost=tuple(sorted(expected - ran, key=_natural)),
        repeated=sum(n - 1 for n in runs.values() if n > 1),
        unexpected=tuple(sorted(ran - expected, key=_natural)),
    )


def _natural(key):
    return (0, int(key), "") if key.lstrip("-").isdigit() else (1, 0, key)


# --------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------
def spread(values):
    """``(median, min, max)`` of ``values``, or None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def percentile(values, q):
    """The ``q``-th percentile (1..99) of ``values``, as bench.py computes p99."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
