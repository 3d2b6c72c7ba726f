"""The queue through a real PgBouncer in transaction mode (Debian's ``pgbouncer``).

Enqueue, claims, completions, heartbeats and failures all go through the pooler; the wake-up
comes from a LISTEN on a direct connection when one is configured, else from the poll alone.
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from django.db import connection

from tests.acceptance.conftest import REPO_ROOT, worker_env
from tests.acceptance.helpers import rows, wait_all_in_state
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
SETTINGS = "tests.acceptance.settings_pgbouncer"


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def pgbouncer(monkeypatch):
    if not os.path.exists(PGBOUNCER):
        reason = "pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    params = connection.settings_dict
    port = _free_port()
    # pgbouncer refuses to run as root and drops to the postgres user, who cannot enter pytest's
    # private tmp_path: a directory of its own, open to it.
    tmp_path = Path(tempfile.mkdtemp(prefix="dbqueue-pgbouncer-"))
    tmp_path.chmod(0o777)
    ini = tmp_path / "pgbouncer.ini"
    ini.write_text(
        f"""[databases]
{params["NAME"]} = host={params.get("HOST") or "127.0.0.1"} port={params.get("PORT") or 5432} user={params.get("USER") or "postgres"}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
max_client_conn = 200
default_pool_size = 5
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
pidfile = {tmp_path}/pgbouncer.pid
logfile = {tmp_path}/pgbouncer.log
"""
    )
    ini.chmod(0o644)
    command = [PGBOUNCER, str(ini)]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "postgres"]  # it refuses to run as root
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            assert process.poll() is None, (tmp_path / "pgbouncer.log").read_text()
            return False

    wait_until(up, message="pgbouncer listening")
    monkeypatch.setenv("DBQUEUE_PGBOUNCER_PORT", str(port))
    yield port
    process.terminate()
    process.wait(10)
    shutil.rmtree(tmp_path, ignore_errors=True)


def _enqueue_through_pooler(test_database_url, job_type, count):
    """Enqueue in another process whose only database is the pooler: one transaction each."""
    code = (
        "from django.db import transaction\n"
        "from django_dbqueue import enqueue\n"
        "ids = []\n"
        f"for _ in range({count}):\n"
        "    with transaction.atomic():\n"
        f"        ids.append(enqueue({job_type!r}).id)\n"
        "print('ids=' + ','.join(map(str, ids)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "django", "shell", "--settings", SETTINGS, "-c", code],
        cwd=REPO_ROOT,
        env=worker_env(test_database_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("ids=")]
    return [int(i) for i in line[4:].split(",")]


def test_through_pgbouncer_with_listen_on_a_direct_connection(
    pgbouncer, start_worker, monkeypatch, test_database_url
):
    monkeypatch.setenv("DBQUEUE_DIRECT_LISTEN", "1")
    monkeypatch.setenv("DBQUEUE_POLL", "30")  # a wake-up within seconds can only be the notify
    worker = start_worker("--concurrency", "2", settings=SETTINGS)
    wait_until(
        lambda: rows(
            "SELECT 1 FROM pg_stat_activity WHERE datname = %s "
            "AND (query LIKE 'LISTEN %%' OR application_name LIKE 'dbqueue %% (LISTEN %%')",
            [connection.settings_dict["NAME"]],
        ),
        timeout=30,
        message="the worker's direct LISTEN",
    )
    ids = _enqueue_through_pooler(test_database_url, "record", 5)
    wait_all_in_state(ids, "done", timeout=10)
    # Failures, retries and dead letters through the pooler too.
    failing = _enqueue_through_pooler(test_database_url, "fail", 1)
    wait_all_in_state(failing, "dead", timeout=30)
    worker.assert_alive()
    assert "prepared statements do not survive" not in worker.stderr()


def test_through_pgbouncer_without_a_direct_connection_the_poll_finds_the_work(
    pgbouncer, start_worker, monkeypatch, test_database_url
):
    monkeypatch.setenv("DBQUEUE_DIRECT_LISTEN", "0")
    monkeypatch.setenv("DBQUEUE_POLL", "0.5")
    worker = start_worker("--concurrency", "2", settings=SETTINGS)
    ids = _enqueue_through_pooler(test_database_url, "record", 5)
    wait_all_in_state(ids, "done", timeout=30)
    assert not rows(
        "SELECT 1 FROM pg_stat_activity WHERE datname = %s "
        "AND (query LIKE 'LISTEN %%' OR application_name LIKE 'dbqueue %% (LISTEN %%')",
        [connection.settings_dict["NAME"]],
    )
    worker.assert_alive()
