"""Losing the database under a running worker: it reconnects, finishes everything, stays up.

DESIGN: "Losing the database connection makes the worker reconnect with backoff; it never exits on
a transient fault; acknowledgements that failed with the connection are retried, fenced, once it
is back, so a connection blip does not make finished work run again."
"""

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.conftest import REPO_ROOT, worker_env
from tests.acceptance.helpers import (
    enqueue_jobs,
    rows,
    terminate_backends,
    wait_all_in_state,
    wait_for_listeners,
)
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def assert_each_ran_once(job_ids, effect_rows):
    """``effect_rows``: ``[(job_id, n_runs), ...]`` for the jobs that ran at all."""
    runs = dict(effect_rows)
    assert sorted(runs) == sorted(job_ids), f"{len(set(job_ids) - set(runs))} jobs never ran"
    twice = {job_id: n for job_id, n in runs.items() if n != 1}
    assert not twice, f"jobs that ran more than once (job: runs): {twice}"


# ---------------------------------------------------------------------------------------------
# pg_terminate_backend on every session of the worker
# ---------------------------------------------------------------------------------------------
def test_worker_survives_its_connections_being_terminated(start_worker):
    # A 0.5 s poll: a handler that lost its connection mid-job fails that attempt, and the retry
    # (scheduled with backoff, no NOTIFY) is picked up by the poll.
    worker = start_worker("--concurrency", "4", "--poll-interval", "0.5")
    wait_for_listeners(1)

    job_ids, terminated = [], set()
    for _ in range(4):
        batch = enqueue_jobs("record", 60, {"sleep": 0.02})
        job_ids += batch
        # Mid-stream: some of this batch ran, most has not.
        wait_until(
            lambda batch=batch: (
                rows("SELECT count(*) FROM testapp_effect WHERE job_id = ANY(%s)", [batch])[0][0]
                >= 5
            ),
            timeout=20,
            message="the worker to be processing the batch",
        )
        killed = terminate_backends()
        assert killed, "no worker session to terminate"
        terminated |= killed

    wait_all_in_state(job_ids, "done", timeout=60, interval=0.1)
    worker.assert_alive()
    assert_each_ran_once(
        job_ids,
        rows(
            "SELECT job_id, count(*) FROM testapp_effect WHERE job_id = ANY(%s) GROUP BY job_id",
            [job_ids],
        ),
    )
    # The LISTEN came back on a new session.
    assert wait_for_listeners(1).isdisjoint(terminated)
    assert "lost the database" in worker.stderr()  # the fault was real


# ---------------------------------------------------------------------------------------------
# A real server restart, on a private PostgreSQL (never the shared one)
# ---------------------------------------------------------------------------------------------
def _pg_bindir():
    try:
        bindir = subprocess.run(
            ["pg_config", "--bindir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if os.path.exists(os.path.join(bindir, "initdb")):
            return bindir
    except (OSError, subprocess.CalledProcessError):
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a Unix socket in a temp dir (no TCP listener)."""

    def __init__(self, bindir, as_user):
        self.bindir = bindir
        self.prefix = ["runuser", "-u", as_user, "--"] if as_user else []
        self.root = Path(tempfile.mkdtemp(prefix="dbq-pg-"))  # short: socket paths are limited
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        if as_user:
            entry = pwd.getpwnam(as_user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.started = False

    def _run(self, *args, timeout=60):
        result = subprocess.run(
            [*self.prefix, os.path.join(self.bindir, args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert result.returncode == 0, (
            f"{args[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}\n"
            f"{self.log.read_text() if self.log.exists() else ''}"
        )
        return result

    def start(self):
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync")
        self._run("pg_ctl", *self._ctl_args(), "-w", "start")
        self.started = True

    def _ctl_args(self):
        options = f"-p {self.port} -k {self.root} -c listen_addresses='' -c fsync=off"
        return ["-D", str(self.data), "-l", str(self.log), "-o", options]

    def restart(self):
        self._run("pg_ctl", *self._ctl_args(), "-m", "fast", "-w", "restart")

    def stop(self):
        if self.started:
            subprocess.run(
                [
                    *self.prefix,
                    os.path.join(self.bindir, "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ],
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def url(self):
        # django-environ reads a path that decodes to an absolute path as "socket dir / name".
        return f"postgres://postgres@:{self.port}/{urllib.parse.quote(str(self.root), safe='')}/postgres"

    def query(self, sql, params=()):
        with psycopg.connect(host=str(self.root), port=self.port, user="postgres") as conn:
            return conn.execute(sql, params).fetchall()

    def django(self, code):
        """Run ``code`` in ``manage.py shell`` against this server (migrate, enqueue, ...)."""
        result = subprocess.run(
            [sys.executable, "-m", "django", "shell", "--settings", "tests.settings", "-c", code],
            cwd=REPO_ROOT,
            env=worker_env(self.url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"shell failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout


@pytest.fixture
def private_postgres():
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("no initdb found: neither `pg_config --bindir` nor /usr/lib/postgresql/*/bin")
    as_user = None
    if os.geteuid() == 0:  # initdb refuses to run as root
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' OS user to run initdb as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root and runuser is missing to run initdb as 'postgres'")
        as_user = "postgres"
    server = PrivatePostgres(bindir, as_user)
    try:
        server.start()
        yield server
    finally:
        server.stop()


ENQUEUE = (
    "from django_dbqueue import enqueue_many; "
    "print(','.join(str(j.id) for j in enqueue_many([('record', {{'sleep': 0.05}})] * {n})))"
)


def test_worker_survives_a_database_restart(start_worker, private_postgres):
    server = private_postgres
    out = server.django(
        "from django.core.management import call_command; call_command('migrate', verbosity=0); "
        + ENQUEUE.format(n=150)
    )
    job_ids = [int(i) for i in out.strip().splitlines()[-1].split(",")]
    worker = start_worker("--concurrency", "4", "--poll-interval", "0.5", database_url=server.url)

    def effect_count():
        return server.query("SELECT count(*) FROM testapp_effect")[0][0]

    wait_until(lambda: effect_count() >= 10, timeout=30, message="the worker to be busy")
    assert effect_count() < len(job_ids), "drained before the restart: make the jobs slower"
    server.restart()

    out = server.django(ENQUEUE.format(n=50))  # after the restart
    job_ids += [int(i) for i in out.strip().splitlines()[-1].split(",")]

    def done():
        return server.query(
            "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [job_ids]
        )[0][0]

    wait_until(
        lambda: done() == len(job_ids),
        timeout=60,
        interval=0.1,
        message=f"all {len(job_ids)} jobs done after the restart",
    )
    worker.assert_alive()
    assert_each_ran_once(
        job_ids, server.query("SELECT job_id, count(*) FROM testapp_effect GROUP BY job_id")
    )
    # The worker's session LISTENs again on the restarted server.
    wait_until(
        lambda: (
            server.query(
                "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' "
                "OR application_name LIKE 'dbqueue %% (LISTEN %%'"
            )[0][0]
            == 1
        ),
        timeout=20,
        message="the listener to reconnect",
    )
    assert "lost the database" in worker.stderr()  # the fault was real
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(40) == 0
