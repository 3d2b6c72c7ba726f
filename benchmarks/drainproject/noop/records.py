"""A per-process buffer of ``(time, key)`` records, flushed to a file (no Django in here: the
plain loops of ``benchmarks/drain_project.py`` record their jobs with it too)."""

import os
import threading

FLUSH_EVERY = 1000


class Buffer:
    """``add()`` from any thread; ``flush()`` appends what is buffered to ``<directory>/<pid>.txt``
    (nothing is written when ``directory`` is None)."""

    def __init__(self, directory):
        self.directory = directory
        self.lock = threading.Lock()
        self.records = []

    def add(self, when, key):
        with self.lock:
            self.records.append((when, key))
            full = len(self.records) >= FLUSH_EVERY
        if full:
            self.flush()

    def flush(self):
        with self.lock:
            records, self.records = self.records, []
        if records and self.directory:
            path = os.path.join(self.directory, f"{os.getpid()}.txt")
            with open(path, "a") as out:
                out.write("".join(f"{when!r} {key}\n" for when, key in records))
