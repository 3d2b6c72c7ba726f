"""The quickstart works as written: a fresh ``startproject`` built from docs/quickstart.md runs a job.

The test follows the page: ``startproject mysite``, ``startapp shop``, then every file of the page
exactly as printed (the settings block appended to ``mysite/settings.py``, the other blocks as
whole files). It changes one thing: the connection in ``DATABASES`` points at a database of its
own on the test server. Then it makes the migrations, migrates, checks, posts an invoice to the
real view through ``runserver``, and runs ``run_jobqueue --burst`` until the job is done and the
e-mail printed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

pytestmark = [pytest.mark.acceptance]

REPO_ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = REPO_ROOT / "docs" / "quickstart.md"
# A python block that starts with "# <path>" is that whole file; "# <path>: add at the end" is
# appended to the file startproject made.
FILE_BLOCK = re.compile(
    r"```python\n# (?P<path>[\w/]+\.py)(?P<append>: add at the end)?\n(?P<body>.*?)```", re.S
)
COMMANDS = [
    "django-admin startproject mysite",
    "python manage.py startapp shop",
    "python manage.py makemigrations shop",
    "python manage.py migrate",
    "python manage.py check",
    "python manage.py runserver",
    "python manage.py run_jobqueue --queues default,emails --burst",
]
CURL = re.compile(r"\$ curl -X POST (?P<fields>(?:-d \S+ )+)http://127\.0\.0\.1:8000(?P<path>/\S*)")


def doc_files(text):
    files = [(m["path"], m["body"], bool(m["append"])) for m in FILE_BLOCK.finditer(text)]
    assert {path for path, _, _ in files} == {
        "mysite/settings.py",
        "shop/models.py",
        "shop/jobs.py",
        "shop/views.py",
        "mysite/urls.py",
    }, files
    return files


def server_params():
    conf = settings.DATABASES["default"]
    params = {"host": conf.get("HOST"), "port": conf.get("PORT"), "user": conf.get("USER")}
    params["password"] = conf.get("PASSWORD")
    return {k: str(v) for k, v in params.items() if v}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def project_database():
    conf = settings.DATABASES["default"]
    test_name = conf.get("TEST", {}).get("NAME") or f"test_{conf['NAME']}"
    name = f"{test_name}_quickstart"  # per checkout, like the test database it is named after
    ident = sql.Identifier(name)
    with psycopg.connect(dbname="postgres", autocommit=True, **server_params()) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(ident))
        conn.execute(sql.SQL("create database {}").format(ident))
    yield name
    with psycopg.connect(dbname="postgres", autocommit=True, **server_params()) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(ident))


def test_the_quickstart_project_runs_a_job(tmp_path, project_database):
    text = QUICKSTART.read_text()
    for command in COMMANDS:
        assert f"$ {command}\n" in text, f"the quickstart no longer says `{command}`"
    curl = CURL.search(text)
    assert curl, "the quickstart's curl command has changed"
    fields = dict(pair.split("=", 1) for pair in re.findall(r"-d (\S+)", curl["fields"]))

    env = dict(os.environ)
    env.pop("DJANGO_SETTINGS_MODULE", None)  # pytest's; manage.py must use mysite.settings
    env.update(PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")  # this checkout's package
    project = tmp_path / "mysite"

    def run(*args, timeout=120):
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=project if project.exists() else tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, (
            f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
        return proc.stdout + proc.stderr

    run("-m", "django", "startproject", "mysite")  # django-admin startproject mysite
    run("manage.py", "startapp", "shop")
    for path, body, append in doc_files(text):
        target = project / path
        if append:
            target.write_text(target.read_text() + "\n" + body)
        else:
            target.write_text(body)
    # The one change to the page: the connection of the test server, to a database of its own.
    connection = {"NAME": project_database, **{k.upper(): v for k, v in server_params().items()}}
    with open(project / "mysite" / "settings.py", "a") as handle:
        handle.write(f"\nDATABASES['default'].update({connection!r})\n")

    run("manage.py", "makemigrations", "shop")
    run("manage.py", "migrate")
    checked = run("manage.py", "check")
    assert "System check identified no issues" in checked

    port = free_port()
    server_log = tmp_path / "runserver.log"
    with open(server_log, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
            cwd=project,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}{curl['path']}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert server.poll() is None, server_log.read_text()
                assert time.monotonic() < deadline, "runserver did not listen within 60 s"
                time.sleep(0.1)
        body = urllib.parse.urlencode(fields).encode()
        with urllib.request.urlopen(url, data=body, timeout=30) as response:
            assert response.status == 201
            answer = json.loads(response.read())
    finally:
        server.terminate()
        server.wait(timeout=30)

    worker_output = run("manage.py", "run_jobqueue", "--queues", "default,emails", "--burst")
    assert f"Subject: Invoice {answer['invoice_id']}" in worker_output
    assert f"To: {fields['email']}" in worker_output
    assert "1 succeeded, 0 retried, 0 dead" in worker_output

    with psycopg.connect(dbname=project_database, **server_params()) as conn:
        state = conn.execute(
            "select state from dbqueue_job where id = %s", [answer["job_id"]]
        ).fetchone()
        emailed = conn.execute(
            "select emailed_at is not null from shop_invoice where id = %s",
            [answer["invoice_id"]],
        ).fetchone()
    assert state == ("done",)
    assert emailed == (True,)
