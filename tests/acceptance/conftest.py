"""Fixtures that run real ``run_jobqueue`` processes against the test database.

Workers are separate processes, so they only see committed data: every acceptance test uses
``django_db(transaction=True)``. A worker's stdout and stderr go to files; when a test fails they
are attached to its report. Every process started here is killed (its whole process group, so a
supervisor's children too) at teardown, before pytest-django flushes the database.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from django.db import connection

REPO_ROOT = Path(__file__).resolve().parents[2]


def database_url(settings_dict):
    """A django-environ DATABASE_URL for a Django ``settings_dict`` (the *test* database)."""
    user = urllib.parse.quote(settings_dict.get("USER") or "", safe="")
    password = settings_dict.get("PASSWORD") or ""
    auth = f"{user}:{urllib.parse.quote(password, safe='')}" if password else user
    host = settings_dict.get("HOST") or ""
    port = settings_dict.get("PORT") or ""
    name = urllib.parse.quote(settings_dict["NAME"], safe="")
    port_part = f":{port}" if port else ""
    if host.startswith("/"):
        # django-environ does not decode a url-encoded *host*; it reads a path that decodes to
        # an absolute path as "socket directory / database name".
        return f"postgres://{auth}@{port_part}/{urllib.parse.quote(host, safe='')}/{name}"
    return f"postgres://{auth}@{host or 'localhost'}{port_part}/{name}"


def worker_env(database_url_value):
    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update(
        DATABASE_URL=database_url_value,
        PYTHONPATH=str(REPO_ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


class WorkerProcess:
    """One ``python -m django run_jobqueue`` process with its output captured to files."""

    def __init__(self, name, args, *, settings, database_url_value, log_dir):
        self.name = name
        self.args = list(args)
        self.stdout_path = log_dir / f"{name}.stdout"
        self.stderr_path = log_dir / f"{name}.stderr"
        command = [
            sys.executable,
            "-m",
            "django",
            "run_jobqueue",
            "--settings",
            settings,
            *self.args,
        ]
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=worker_env(database_url_value),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own process group: teardown kills the children too
            )

    @property
    def pid(self):
        return self.process.pid

    def alive(self):
        return self.process.poll() is None

    def send(self, signum):
        os.kill(self.pid, signum)

    def stdout(self):
        return self.stdout_path.read_text(errors="replace")

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def output(self):
        return (
            f"--- {self.name} (pid {self.pid}, args {self.args}) stdout ---\n{self.stdout()}"
            f"--- {self.name} stderr ---\n{self.stderr()}"
        )

    def wait_exit(self, timeout):
        """Wait for the process to exit on its own; returns its exit code."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.name} did not exit within {timeout}s\n{self.output()}"
            ) from None

    def wait_for_output(self, text, *, stream="stderr", timeout=10.0):
        """Wait until ``text`` appears in the worker's stdout or stderr."""
        read = self.stderr if stream == "stderr" else self.stdout
        deadline = time.monotonic() + timeout
        while text not in read():
            if not self.alive():
                raise AssertionError(
                    f"worker {self.name} exited ({self.process.returncode}) before printing "
                    f"{text!r}\n{self.output()}"
                )
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"worker {self.name} did not print {text!r} within {timeout}s\n{self.output()}"
                )
            time.sleep(0.02)

    def assert_alive(self):
        assert self.alive(), (
            f"worker {self.name} exited with {self.process.returncode}\n{self.output()}"
        )

    def group_members(self):
        """Pids of live processes in this worker's process group (its session: it leads both)."""
        members = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                # Fields after "(comm)": state ppid pgrp session ...
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pid and int(fields[3]) == self.pid and fields[0] != "Z":
                members.append(int(entry.name))
        return members

    def kill(self):
        """SIGKILL the whole process group (a supervisor's children too) and reap the process."""
        if self.process.returncode is None:
            # Not reaped by us yet, so the pid and the process group it leads are still ours.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        else:
            # Already reaped: only kill what is verifiably left in its session (a child that
            # outlived its supervisor), never a group id that may have been reused.
            for pid in self.group_members():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for worker in getattr(item, "_dbqueue_workers", ()):
            try:
                report.sections.append((f"worker {worker.name} stdout", worker.stdout()))
                report.sections.append((f"worker {worker.name} stderr", worker.stderr()))
            except OSError:  # pragma: no cover - the log files vanished
                pass
    return report


@pytest.fixture
def test_database_url(transactional_db):
    """DATABASE_URL of the test database pytest-django created (not the configured one)."""
    return database_url(connection.settings_dict)


@pytest.fixture
def start_worker(request, transactional_db, test_database_url, tmp_path):
    """Factory: ``start_worker("--concurrency", "4", settings=..., database_url=...)``.

    Returns a :class:`WorkerProcess`. Every process is killed at teardown.
    """
    started = []
    request.node._dbqueue_workers = started

    def start(*args, settings="tests.settings", database_url=None, name=None):
        worker = WorkerProcess(
            name or f"worker{len(started) + 1}",
            args,
            settings=settings,
            database_url_value=database_url or test_database_url,
            log_dir=tmp_path,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
