"""The demo's "browse it" hint works as printed, and its admin user gets in.

``dev.py demo`` keeps its database and prints a command that serves the example project on it,
with the demo venv's own Python (Django lives only in that venv), and a superuser ``admin`` with a
new password. The test does what the user would: it migrates the example project into a database
of its own, has dev.py make the admin user and the command, runs the command exactly as printed
through ``/bin/sh`` (with a bare PATH and no Django settings in the environment, so only the
printed interpreter can serve it; the test adds only the address to listen on), fetches
``/admin/login/`` and logs in with the printed password.

The test's own venv stands in for ``.venvs/demo``: it has everything the example project runs.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import dev

pytestmark = [pytest.mark.acceptance]

REPO_ROOT = Path(__file__).resolve().parents[2]


SERVER_URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
VENV = Path(sys.prefix)  # the test's own venv stands in for .venvs/demo
NAME = f"{os.environ.get('DBQUEUE_TEST_DATABASE', 'test_dbqueue')}_browse"


@pytest.fixture
def demo_url():
    """A database made (and dropped) as dev.py demo makes its own, under a per-checkout name."""
    dev.demo_database(VENV, SERVER_URL, "drop", NAME)
    assert dev.demo_database(VENV, SERVER_URL, "create", NAME) == "created"
    yield dev.with_database(SERVER_URL, NAME)
    dev.demo_database(VENV, SERVER_URL, "drop", NAME)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_printed_command_serves_the_admin_and_the_printed_password_logs_in(demo_url, tmp_path):
    venv = VENV
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    migrate = subprocess.run(
        [sys.executable, dev.DEMO_MANAGE, "migrate", "--noinput"],
        cwd=REPO_ROOT,
        env={**env, "DATABASE_URL": demo_url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stderr
    password = dev.demo_admin(venv, demo_url)
    assert password
    assert dev.demo_admin(venv, demo_url) != password  # a new one each run; the old one is gone
    password = dev.demo_admin(venv, demo_url)

    printed = dev.browse_command(venv, demo_url)
    assert printed.endswith(" runserver") and str(venv) in printed, printed
    password_in_url = urllib.parse.urlsplit(demo_url).password
    if password_in_url:  # the hint prints *** and says to put the password there
        printed = printed.replace("***", password_in_url)
    port = free_port()
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
    log_path = tmp_path / "runserver.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            ["/bin/sh", "-c", f"{printed} --noreload 127.0.0.1:{port}"],
            cwd="/",  # the printed paths are absolute: it works from any directory
            env=bare,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"the printed command exited: {log_path.read_text()}")
                assert time.monotonic() < deadline, "the server did not listen within 60 s"
                time.sleep(0.1)

        opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )
        with opener.open(f"{base}/admin/login/?next=/admin/", timeout=30) as response:
            assert response.status == 200
            page = response.read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)[1]
        form = {"csrfmiddlewaretoken": token, "next": "/admin/"}
        form.update(username=dev.DEMO_ADMIN, password=password)
        login = urllib.request.Request(
            f"{base}/admin/login/?next=/admin/", data=urllib.parse.urlencode(form).encode()
        )
        with opener.open(login, timeout=30) as response:
            home = response.read().decode()
            assert response.url == f"{base}/admin/", response.url
        assert "Site administration" in home
        assert "/admin/django_dbqueue/" in home  # the queue's pages are there to look at
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
